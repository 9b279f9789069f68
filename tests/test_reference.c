/* test_reference.c — crew against PyTorch on the example models and a Keras-written model.
 *
 * tools/make_reference.py built each network in PyTorch (float32, one thread) and recorded, for
 * one batch of 8 samples, the logits, the mean softmax cross-entropy, the gradient of every
 * parameter, and the loss before each of 10 SGD steps (lr 0.05, momentum 0.9) on that batch,
 * into tests/fixtures/reference/<name>.safetensors. Dropout there uses crew's own mask, so both
 * sides drop the same values. This test loads the same model file into crew, starts from the
 * same parameters, and checks it computes the same numbers.
 *
 * Tolerances. Both sides compute in float32 but sum in different orders (OpenBLAS against
 * PyTorch's kernels), so results differ by rounding: roughly ulp(1) = 1.2e-7 times the growth of
 * a sum of n terms (sqrt(n) when errors cancel, n at worst). Each tensor is judged as a whole:
 *     err = max_i |crew_i - torch_i| / max_i |torch_i|
 * so values that are tiny next to the rest of their tensor (where cancellation makes any
 * element-wise relative error meaningless) are held to the tensor's own scale.
 * - logits, loss, gradients: err <= 1e-5 (REF_TOL). The longest sums are the first dense layer
 *   (784 terms) and the CNN's first kernel gradient, a sum over 8 samples x 28 x 28 positions =
 *   6272 terms. Measured (OpenBLAS 0.3.21, torch 2.15): at most 1.2e-6, on grad/conv2d.kernel;
 *   about 5e-7 for the MLPs. So 1e-5 holds with a margin of 8 and needs no loosening.
 * - the 10 SGD losses: |crew - torch| / |torch| <= 1e-4 per step (REF_SGD_TOL). Rounding
 *   differences feed back through every update, and SGD at lr 0.05 with momentum 0.9 on one
 *   batch is chaotic (the loss jumps about), so they roughly double each step: measured 6e-6 at
 *   step 10 for fashion_mlp, under 1e-6 for the others. The fixture keeps the loss away from 0
 *   (each image appears twice, under two labels) so a relative error stays meaningful.
 * A wrong layout, a wrong dropout mask or a wrong gradient formula gives errors of 1e-2 to 1
 * (a dropout mask drawn with the wrong step: 0.8 on the logits). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/status.h"
#include "io/safetensors.h"
#include "nn/model.h"
#include "optim/optimizer.h"

#define REF_TOL 1e-5
#define REF_SGD_TOL 1e-4
#define REF_BATCH 8
#define REF_STEPS 10
#define REF_SEED 1 /* crew_pass.seed: keys the dropout masks */
#define REF_LR 0.05f
#define REF_MOMENTUM 0.9f

typedef struct ref_case {
    const char *name;       /* tests/fixtures/reference/<name>.safetensors */
    const char *model_file; /* relative to the source directory */
} ref_case;

/* The same table as MODELS in tools/make_reference.py. */
static const ref_case CASES[] = {
    {"fashion_mlp", "examples/fashion_mlp.json"},
    {"fashion_cnn", "examples/fashion_cnn.json"},
    {"keras_fashion_mlp", "tests/fixtures/keras/fashion_mlp.json"},
};

/* One model's run: its fixture, the model, and the worst error seen so far. */
typedef struct ref_run {
    const char *name;
    crew_st_file f;
    crew_model *m;
    crew_optimizer opt;     /* the model's SGD state, on its device */
    int has_opt;
    double worst;
    char worst_tensor[160];
} ref_run;

static const char *source_dir(void)
{
    const char *d = getenv("CREW_SOURCE_DIR");
    return d && d[0] ? d : ".."; /* ctest runs tests in tests/ */
}

/* max |a - b| / max |b|: the error of a tensor relative to its own scale; infinite on NaN. */
static double tensor_error(const float *a, const float *b, int64_t n)
{
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        if (d > diff) diff = d;
        if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    }
    return diff / (scale > 1e-30 ? scale : 1e-30);
}

static void compare(ref_run *r, const char *tensor, const float *crew, const float *torch, int64_t n, double tol)
{
    double e = tensor_error(crew, torch, n);
    CHECK_MSG(e <= tol, "%s: tensor '%s': max|crew - torch| / max|torch| = %.3g exceeds %.0e", r->name, tensor, e,
              tol);
    if (!(e <= r->worst)) {
        r->worst = e;
        snprintf(r->worst_tensor, sizeof r->worst_tensor, "%s", tensor);
    }
}

/* A copy of the fixture's tensor `name` (the file's bytes may be unaligned), checked to be of
 * dtype `dtype` with `count` elements; NULL (and a failed check naming it) otherwise. */
static void *fixture_tensor(const ref_run *r, const char *name, crew_st_dtype dtype, int64_t count)
{
    const crew_st_tensor *t = crew_st_find(&r->f, name);
    CHECK_MSG(t != NULL, "%s: the fixture has no tensor '%s'", r->name, name);
    if (!t) return NULL;
    CHECK_MSG(t->dtype == dtype && t->count == count, "%s: tensor '%s' is %s with %lld values; expected %s with %lld",
              r->name, name, crew_st_dtype_name(t->dtype), (long long)t->count, crew_st_dtype_name(dtype),
              (long long)count);
    if (t->dtype != dtype || t->count != count) return NULL;
    void *copy = malloc((size_t)count * 4 + 1);
    if (copy) memcpy(copy, t->data, (size_t)count * 4);
    return copy;
}

/* The dropout masks are keyed by layer index: check the script counted layers as crew does.
 * Metadata "dropout_layers" is "name:index,name:index" (empty without dropout). */
static void check_dropout_indices(ref_run *r)
{
    const char *list = crew_st_metadata(&r->f, "dropout_layers");
    CHECK_MSG(list != NULL, "%s: the fixture's metadata lacks 'dropout_layers'", r->name);
    int seen = 0;
    for (const char *p = list; p && *p;) {
        char name[64];
        int index = -1, used = 0;
        int ok = sscanf(p, "%63[^:]:%d%n", name, &index, &used) == 2;
        CHECK_MSG(ok, "%s: metadata 'dropout_layers' is malformed: '%s'", r->name, list);
        if (!ok) return;
        int match = index >= 0 && index < r->m->n_layers && strcmp(r->m->layers[index]->name, name) == 0 &&
                    r->m->layers[index]->spec.type == CREW_LAYER_DROPOUT;
        CHECK_MSG(match, "%s: the reference put dropout layer '%s' at index %d; crew's layer there differs", r->name,
                  name, index);
        seen++;
        p += used;
        if (*p == ',') p++;
    }
    int dropouts = 0;
    for (int i = 0; i < r->m->n_layers; i++) dropouts += r->m->layers[i]->spec.type == CREW_LAYER_DROPOUT;
    CHECK_MSG(seen == dropouts, "%s: crew has %d dropout layers, the reference %d", r->name, dropouts, seen);
}

/* Copies every "init/<param>" into the model; the fixture must name exactly crew's parameters. */
static int load_init(ref_run *r)
{
    crew_named_param params[64];
    int n = crew_model_named_params(r->m, params, 64);
    CHECK_MSG(n <= 64, "%s: %d parameters; the test handles 64", r->name, n);
    if (n > 64) return 0;
    int fixture_inits = 0;
    for (int i = 0; i < r->f.n_tensors; i++) fixture_inits += strncmp(r->f.tensors[i].name, "init/", 5) == 0;
    CHECK_MSG(fixture_inits == n, "%s: the fixture holds %d init/ tensors, crew's model %d parameters", r->name,
              fixture_inits, n);
    int ok = fixture_inits == n;
    for (int i = 0; i < n; i++) {
        const crew_param *p = params[i].param;
        char key[sizeof params[i].name + 8];
        snprintf(key, sizeof key, "init/%.*s", (int)sizeof params[i].name - 1, params[i].name);
        float *v = fixture_tensor(r, key, CREW_ST_F32, crew_shape_size(&p->shape));
        if (!v) {
            ok = 0;
            continue;
        }
        CHECK_OK(crew_dev_upload_f32(&r->m->be, p->value, v, crew_shape_size(&p->shape)));
        free(v);
    }
    r->m->initialized = 1;
    return ok;
}

/* Puts x and y into the model's input and label buffers. */
static int load_batch(ref_run *r)
{
    crew_model *m = r->m;
    int64_t in = crew_shape_size(&m->input);
    float *x = fixture_tensor(r, "x", CREW_ST_F32, REF_BATCH * in);
    int32_t *y = fixture_tensor(r, "y", CREW_ST_I32, REF_BATCH);
    int ok = x && y;
    for (int i = 0; ok && i < REF_BATCH; i++) {
        ok = y[i] >= 0 && y[i] < crew_model_classes(m);
        CHECK_MSG(ok, "%s: label %d of the fixture is %d, outside [0, %lld)", r->name, i, y[i],
                  (long long)crew_model_classes(m));
    }
    if (ok) {
        static const int64_t ids[REF_BATCH] = {0, 1, 2, 3, 4, 5, 6, 7}; /* the samples, for dropout masks */
        CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, m->act[0], x, REF_BATCH * in, CREW_DT_F32));
        CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, m->labels, y, REF_BATCH, CREW_DT_I32));
        CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, m->sample_ids, ids, REF_BATCH, CREW_DT_I64));
        CHECK_OK(m->be.ops->sync(m->be.ctx, NULL));
    }
    free(x);
    free(y);
    return ok;
}

/* Forward, mean loss and backward over the batch, as crew_model_fit does for one step. */
static crew_status gradient_pass(crew_model *m, int64_t step, double *loss)
{
    crew_pass p = {.be = &m->be, .rows = REF_BATCH, .training = 1, .seed = REF_SEED, .step = step,
                   .sample_ids = m->sample_ids, .total_rows = REF_BATCH};
    CREW_TRY(crew_model_forward(m, &p));
    double correct = 0.0;
    CREW_TRY(crew_model_loss(m, &p, 1.0f / REF_BATCH, loss, &correct));
    *loss /= REF_BATCH;
    return crew_model_backward(m, &p, NULL, NULL);
}

/* Logits, loss and every gradient at the starting parameters (dropout step 0). */
static void check_gradients(ref_run *r)
{
    crew_model *m = r->m;
    double loss = 0.0;
    crew_status s = gradient_pass(m, 0, &loss);
    CHECK_MSG(s == CREW_OK, "%s: %s", r->name, crew_status_message(s));
    crew_status_free(s);
    if (s) return;
    int64_t classes = crew_model_classes(m);
    float *want = fixture_tensor(r, "logits", CREW_ST_F32, REF_BATCH * classes);
    float *got = malloc((size_t)(REF_BATCH * classes) * sizeof *got);
    if (want && got) {
        CHECK_OK(crew_dev_download_f32(&m->be, got, m->act[m->n_compute], REF_BATCH * classes));
        compare(r, "logits", got, want, REF_BATCH * classes, REF_TOL);
    }
    free(want);
    free(got);
    float *want_loss = fixture_tensor(r, "loss", CREW_ST_F32, 1);
    float got_loss = (float)loss;
    if (want_loss) compare(r, "loss", &got_loss, want_loss, 1, REF_TOL);
    free(want_loss);

    crew_named_param params[64];
    int n = crew_model_named_params(m, params, 64);
    for (int i = 0; i < n && i < 64; i++) {
        const crew_param *p = params[i].param;
        if (!p->trainable) continue;
        int64_t count = crew_shape_size(&p->shape);
        char key[sizeof params[i].name + 8];
        snprintf(key, sizeof key, "grad/%.*s", (int)sizeof params[i].name - 1, params[i].name);
        float *g_want = fixture_tensor(r, key, CREW_ST_F32, count);
        float *g_got = malloc((size_t)count * sizeof *g_got);
        if (g_want && g_got) {
            CHECK_OK(crew_dev_download_f32(&m->be, g_got, p->grad, count));
            compare(r, key, g_got, g_want, count, REF_TOL);
        }
        free(g_want);
        free(g_got);
    }
}

/* 10 SGD steps on the batch; step t draws dropout masks with step = t. */
static void check_sgd(ref_run *r)
{
    crew_model *m = r->m;
    float *want = fixture_tensor(r, "sgd_losses", CREW_ST_F32, REF_STEPS);
    if (!want) return;
    double worst = 0.0;
    for (int t = 0; t < REF_STEPS; t++) {
        double loss = 0.0;
        crew_status s = gradient_pass(m, t, &loss);
        CHECK_MSG(s == CREW_OK, "%s: SGD step %d: %s", r->name, t, crew_status_message(s));
        crew_status_free(s);
        if (s) break;
        double e = fabs(loss - (double)want[t]) / fabs((double)want[t]);
        if (!(e <= worst)) worst = e;
        CHECK_MSG(e <= REF_SGD_TOL, "%s: tensor 'sgd_losses' step %d: crew %.8g, torch %.8g, relative error %.3g exceeds %.0e",
                  r->name, t, loss, (double)want[t], e, REF_SGD_TOL);
        CHECK_OK(crew_optimizer_step(&r->opt, &m->be, m->params, m->grads, REF_LR, NULL));
    }
    printf("%-18s worst over 10 SGD losses: %.3g\n", r->name, worst);
    free(want);
}

static int open_case(ref_run *r, const ref_case *c)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/reference/%s.safetensors", source_dir(), c->name);
    crew_status s = crew_st_read(path, &r->f);
    CHECK_MSG(s == CREW_OK, "%s: %s (regenerate with python3 tools/make_reference.py)", c->name,
              crew_status_message(s));
    crew_status_free(s);
    if (s) return 0;
    snprintf(path, sizeof path, "%s/%s", source_dir(), c->model_file);
    s = crew_model_load_file(path, &r->m);
    crew_compile_options opts = {.loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY,
                                 .optimizer = {.type = CREW_OPT_SGD, .lr = REF_LR, .momentum = REF_MOMENTUM}};
    if (!s) s = crew_model_layout(r->m);
    if (!s) s = crew_model_compile(r->m, &opts);
    if (!s) s = crew_model_reserve(r->m, REF_BATCH);
    if (!s) s = crew_optimizer_init(&r->opt, &r->m->compile.optimizer, &r->m->be, r->m->n_params);
    r->has_opt = !s;
    CHECK_MSG(s == CREW_OK, "%s: %s", c->name, crew_status_message(s));
    crew_status_free(s);
    return s == CREW_OK;
}

static void run_case(const ref_case *c)
{
    ref_run r = {.name = c->name};
    if (open_case(&r, c)) {
        check_dropout_indices(&r);
        if (load_init(&r) && load_batch(&r)) {
            check_gradients(&r);
            printf("%-18s worst logits/loss/gradient error: %.3g (%s)\n", c->name, r.worst, r.worst_tensor);
            check_sgd(&r);
        }
    }
    if (r.has_opt) crew_optimizer_release(&r.opt, &r.m->be);
    crew_model_free(r.m);
    crew_st_free(&r.f);
}

int main(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
    return check_report();
}
