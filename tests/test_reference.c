/* test_reference.c — crew against PyTorch on the example models, a Keras-written model and a GPT.
 *
 * tools/make_reference.py built each network in PyTorch (float32, one thread) and recorded, for
 * one batch of 8 samples, the logits, the mean softmax cross-entropy, the gradient of every
 * parameter, and the loss before each of 10 SGD steps (lr 0.05, momentum 0.9) on that batch,
 * into tests/fixtures/reference/<name>.safetensors. Dropout there uses crew's own mask, so both
 * sides drop the same values. This test loads the same model file into crew, starts from the
 * same parameters, and checks it computes the same numbers.
 *
 * Tolerances. Both sides compute in float32 but sum in different orders (crew's GEMM library,
 * oneDNN or OpenBLAS, against PyTorch's kernels), so results differ by rounding: roughly ulp(1) = 1.2e-7 times the growth of
 * a sum of n terms (sqrt(n) when errors cancel, n at worst). Each tensor is judged as a whole:
 *     err = max_i |crew_i - torch_i| / max_i |torch_i|
 * so values that are tiny next to the rest of their tensor (where cancellation makes any
 * element-wise relative error meaningless) are held to the tensor's own scale.
 * - logits, loss, gradients: err <= 1e-5 (REF_TOL). The longest sums are the first dense layer
 *   (784 terms) and the CNN's first kernel gradient, a sum over 8 samples x 28 x 28 positions =
 *   6272 terms. Measured (torch 2.15): at most 1.3e-6 with oneDNN 2.6.3 (1.2e-6 with OpenBLAS
 *   0.3.21), on grad/conv2d.kernel; about 5e-7 for the MLPs. So 1e-5 holds with a margin of 8 and needs no loosening.
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

/* Forward, mean loss and backward over the batch, as crew_model_fit does for one step; the logits
 * into `logits` (when not NULL) before the loss, which may write its gradient over them. */
static crew_status gradient_pass(crew_model *m, int64_t step, double *loss, float *logits)
{
    crew_pass p = {.be = &m->be, .rows = REF_BATCH, .training = 1, .seed = REF_SEED, .step = step,
                   .sample_ids = m->sample_ids, .total_rows = REF_BATCH};
    CREW_TRY(crew_model_forward(m, &p));
    if (logits) CREW_TRY(crew_dev_download_f32(&m->be, logits, m->act[m->n_compute], REF_BATCH * crew_model_classes(m)));
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
    int64_t classes = crew_model_classes(m);
    float *got = malloc((size_t)(REF_BATCH * classes) * sizeof *got);
    if (!got) abort();
    crew_status s = gradient_pass(m, 0, &loss, got);
    CHECK_MSG(s == CREW_OK, "%s: %s", r->name, crew_status_message(s));
    crew_status_free(s);
    if (s) {
        free(got);
        return;
    }
    float *want = fixture_tensor(r, "logits", CREW_ST_F32, REF_BATCH * classes);
    if (want) compare(r, "logits", got, want, REF_BATCH * classes, REF_TOL);
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
        crew_status s = gradient_pass(m, t, &loss, NULL);
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

/* ---------------------------------------------------------------- GPT (tools/gpt_reference.py)
 *
 * tests/fixtures/gpt_ref: a 2-block GPT (width 32, 4 heads, context 16, vocabulary 64) built in
 * PyTorch as GPT-2 is (tied LM head, tanh GELU), its starting weights in crew's names and layouts
 * (weights.safetensors), and for one batch of 4 windows: the logits, the loss (mean over all 64
 * positions), every gradient (grad.<name>; the tied table's holds both of its uses), the loss
 * before each of 10 torch.optim.AdamW steps (lr 1e-3, weight decay 0.1 on every parameter) and
 * the parameters after them (final.<name>). crew must match within 1e-5 of each tensor's scale,
 * the 10 losses within 1e-5 relative. Measured (torch 2.15): gradients 4.8e-7 with oneDNN 2.6.3
 * (block_0.ln1_gamma; 5.0e-7 with OpenBLAS 0.3.21), losses 1.2e-7; the parameters after 10 steps: printed. */

#define GPT_BATCH 4
#define GPT_STEPS 10
#define GPT_TOL 1e-5
/* Parameters after 10 steps. The key third of attn_bias has a gradient that is 0 in exact
 * arithmetic (adding b to every key adds q·b to a whole softmax row), so both sides hold rounding
 * noise of ~1e-10 there, and AdamW divides it by its own √v into steps of about lr: those entries
 * move by noise, differently on each side, and are held only to that (check_gpt_params). Every
 * other tensor within 1e-5 of its scale, as the gradients (measured 3.6e-6, mlp_proj_kernel); a
 * wrong update rule is off by 1e-2 or more. */
#define GPT_FINAL_TOL 1e-5

static void check_gpt_params(ref_run *r, const char *prefix, int grads, double tol)
{
    crew_named_param params[64];
    int n = crew_model_named_params(r->m, params, 64);
    CHECK_MSG(n == 28, "gpt_ref: %d parameters, the fixture 28", n);
    for (int i = 0; i < n && i < 64; i++) {
        const crew_param *p = params[i].param;
        int64_t count = crew_shape_size(&p->shape);
        char key[sizeof params[i].name + 8];
        snprintf(key, sizeof key, "%s.%.*s", prefix, (int)sizeof params[i].name - 1, params[i].name);
        float *want = fixture_tensor(r, key, CREW_ST_F32, count);
        float *got = malloc((size_t)count * sizeof *got);
        if (want && got) {
            CHECK_OK(crew_dev_download_f32(&r->m->be, got, grads ? p->grad : p->value, count));
            if (!grads && strcmp(p->name, "attn_bias") == 0) {
                /* q | k | v: the key third's updates are noise on both sides (GPT_FINAL_TOL), so it
                 * is held only to AdamW's largest move, lr a step; q and v to the tolerance */
                int64_t c = count / 3;
                char part[sizeof key + 8];
                snprintf(part, sizeof part, "%s[q]", key);
                compare(r, part, got, want, c, tol);
                snprintf(part, sizeof part, "%s[v]", key);
                compare(r, part, got + 2 * c, want + 2 * c, c, tol);
                double moved = 0.0;
                for (int64_t k = c; k < 2 * c; k++)
                    moved = fmax(moved, fabs((double)got[k] - (double)want[k]));
                CHECK_MSG(moved <= 2.0 * GPT_STEPS * 1e-3, "%s[k]: differs by %.3g, more than 2 x 10 AdamW steps of lr",
                          key, moved);
            } else {
                compare(r, key, got, want, count, tol);
            }
        }
        free(want);
        free(got);
    }
}

static int gpt_load_batch(ref_run *r)
{
    crew_model *m = r->m;
    int64_t T = m->input.dim[0], n = GPT_BATCH * T;
    float *x = fixture_tensor(r, "x", CREW_ST_F32, n), *yf = fixture_tensor(r, "y", CREW_ST_F32, n);
    int32_t *y = malloc((size_t)n * sizeof *y);
    int ok = x && yf && y && crew_model_positions(m) == T;
    for (int64_t i = 0; ok && i < n; i++) y[i] = (int32_t)yf[i];
    if (ok) {
        static const int64_t ids[GPT_BATCH] = {0, 1, 2, 3};
        CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, m->act[0], x, n, CREW_DT_F32));
        CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, m->labels, y, n, CREW_DT_I32));
        CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, m->sample_ids, ids, GPT_BATCH, CREW_DT_I64));
        CHECK_OK(m->be.ops->sync(m->be.ctx, NULL));
    }
    free(x);
    free(yf);
    free(y);
    return ok;
}

/* as gradient_pass, the logits [n values] into `logits` when not NULL */
static crew_status gpt_pass(crew_model *m, double *loss, float *logits, int64_t n)
{
    crew_pass p = {.be = &m->be, .rows = GPT_BATCH, .training = 1, .seed = 1, .sample_ids = m->sample_ids,
                   .total_rows = GPT_BATCH};
    CREW_TRY(crew_model_forward(m, &p));
    if (logits) CREW_TRY(crew_dev_download_f32(&m->be, logits, m->act[m->n_compute], n));
    double correct = 0.0;
    CREW_TRY(crew_model_loss(m, &p, 1.0f / GPT_BATCH, loss, &correct));
    *loss /= GPT_BATCH;
    return crew_model_backward(m, &p, NULL, NULL);
}

static void run_gpt_case(void)
{
    ref_run r = {.name = "gpt_ref"};
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/gpt_ref/expected.safetensors", source_dir());
    crew_status s = crew_st_read(path, &r.f);
    snprintf(path, sizeof path, "%s/tests/fixtures/gpt_ref/model.json", source_dir());
    if (!s) s = crew_model_load_file(path, &r.m);
    crew_compile_options opts;
    if (!s) crew_model_default_compile(r.m, &opts); /* the file's AdamW */
    if (!s) s = crew_model_compile(r.m, &opts);
    if (!s) s = crew_model_reserve(r.m, GPT_BATCH);
    snprintf(path, sizeof path, "%s/tests/fixtures/gpt_ref/weights.safetensors", source_dir());
    if (!s) s = crew_model_load_weights(r.m, path);
    if (!s) s = crew_optimizer_init(&r.opt, &r.m->compile.optimizer, &r.m->be, r.m->n_params);
    r.has_opt = !s;
    CHECK_MSG(s == CREW_OK, "gpt_ref: %s (regenerate with python3 tools/gpt_reference.py --out tests/fixtures/gpt_ref)",
              crew_status_message(s));
    crew_status_free(s);
    float *losses = s ? NULL : fixture_tensor(&r, "losses", CREW_ST_F32, GPT_STEPS);
    if (losses && gpt_load_batch(&r)) {
        double worst_loss = 0.0;
        const int64_t n = GPT_BATCH * crew_shape_size(&r.m->layers[r.m->n_compute - 1]->out);
        float *got = malloc((size_t)n * sizeof *got);
        if (!got) abort();
        for (int t = 0; t < GPT_STEPS; t++) {
            double loss = 0.0;
            s = gpt_pass(r.m, &loss, t == 0 ? got : NULL, n);
            CHECK_MSG(s == CREW_OK, "gpt_ref: step %d: %s", t, crew_status_message(s));
            crew_status_free(s);
            if (s) break;
            if (t == 0) { /* logits, loss and gradients at the starting weights */
                float *want = fixture_tensor(&r, "logits", CREW_ST_F32, n);
                if (want) compare(&r, "logits", got, want, n, GPT_TOL);
                free(want);
                check_gpt_params(&r, "grad", 1, GPT_TOL);
            }
            double e = fabs(loss - (double)losses[t]) / fabs((double)losses[t]);
            if (!(e <= worst_loss)) worst_loss = e;
            CHECK_MSG(e <= GPT_TOL, "gpt_ref: AdamW step %d: loss %.8g, torch %.8g, relative error %.3g exceeds %.0e", t,
                      loss, (double)losses[t], e, GPT_TOL);
            CHECK_OK(crew_optimizer_step(&r.opt, &r.m->be, r.m->params, r.m->grads, r.m->compile.optimizer.lr, NULL));
        }
        printf("%-18s worst logits/gradient error: %.3g (%s); worst of 10 AdamW losses: %.3g\n", r.name, r.worst,
               r.worst_tensor, worst_loss);
        r.worst = 0.0;
        check_gpt_params(&r, "final", 0, GPT_FINAL_TOL);
        printf("%-18s worst parameter error after 10 AdamW steps: %.3g (%s)\n", r.name, r.worst, r.worst_tensor);
        free(got);
    }
    free(losses);
    if (r.has_opt) crew_optimizer_release(&r.opt, &r.m->be);
    crew_model_free(r.m);
    crew_st_free(&r.f);
}

int main(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
    run_gpt_case();
    return check_report();
}
