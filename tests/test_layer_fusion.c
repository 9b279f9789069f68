/* test_layer_fusion.c — the layers a model runs as one (nn/model.h): a flatten handing its input
 * through, a relu folded into the max pool after it, and a first convolution of few taps taking in
 * that relu and pool (crew_model_layer_absorbs), against the same layers run one after the other.
 *
 * A CNN of the demo's shape trains one step (forward, loss, backward) on three CPU devices that
 * differ only in what their tables offer:
 *   - the CPU as it is: the convolution, relu and pool in one pass (conv_taps_pool_*), with no
 *     buffer for the convolution's output (crew_act_storage.conv_one_pass, as a run on it);
 *   - without that pass: crew_conv2d_pool_forward/backward's fallback, the convolution by taps,
 *     then the pool of relu(x), backward the pool's dx written over the convolution's output;
 *   - without the taps either: the convolution by im2col + GEMM (other sums: compared within a
 *     tolerance; the first two bit for bit, the logits, the loss and every gradient).
 * The same model with a dropout between the relu and the pool (nothing folds, nothing is taken in)
 * is the reference of the first two's values within the tolerance, so a fold that computed
 * something else bit for bit in both would still be caught. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "model_values.h"
#include "nn/model.h"

#define ROWS 5
#define TOL 1e-5

typedef struct outcome {
    float *logits, *grads;
    double loss;
    int64_t n_logits, n_params;
    int absorbs, unkept; /* unkept: the first convolution's output has no buffer */
} outcome;

/* which table: 0 the CPU's, 1 without conv_taps_pool_*, 2 without conv_taps_* too */
static crew_backend_ops tables[3];

static crew_model *cnn(int dropout_between)
{
    crew_model *m = NULL;
    crew_status s = crew_model_create((int64_t[]){10, 12, 1}, 3, &m);
    const crew_layer_spec layers[] = {
        {.type = CREW_LAYER_CONV2D, .filters = 20, .kernel = {3, 3}, .padding = CREW_PAD_SAME,
         .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_DROPOUT, .rate = 0.0f},
        {.type = CREW_LAYER_MAX_POOL2D},
        {.type = CREW_LAYER_CONV2D, .filters = 6, .kernel = {3, 3}, .padding = CREW_PAD_SAME,
         .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_MAX_POOL2D},
        {.type = CREW_LAYER_FLATTEN},
        {.type = CREW_LAYER_DENSE, .units = 4},
    };
    for (size_t i = 0; !s && i < sizeof layers / sizeof *layers; i++)
        if (i != 1 || dropout_between) s = crew_model_add(m, &layers[i]);
    CHECK_OK(s);
    return m;
}

static outcome run(int table, int dropout_between)
{
    outcome r = {0};
    crew_backend be = {0};
    const crew_device_options o = {.blas_threads = 1};
    CHECK_OK(crew_device_open("cpu", 0, &o, &be));
    if (!be.ops) return r;
    tables[table] = *be.ops;
    if (table >= 1) tables[table].conv_taps_pool_forward = NULL, tables[table].conv_taps_pool_grads = NULL;
    if (table >= 2) tables[table].conv_taps_forward = NULL, tables[table].conv_taps_filter_grad = NULL;
    be.ops = &tables[table];
    crew_model *m = cnn(dropout_between);
    if (!m) return r;
    m->be = be;
    m->has_backend = 1;
    /* as a run on the CPU kinds keeps its activations: no buffer for the output the one pass never
     * writes (the fallback's device keeps one) */
    const crew_act_storage store = {.conv_one_pass = table == 0};
    crew_model_set_storage(m, &store);
    CHECK_OK(crew_model_init_params(m, 11));
    CHECK_OK(crew_model_reserve(m, ROWS));
    r.unkept = m->act[1] == NULL;
    /* the same weights whatever the layers' indices (the dropout shifts those the initialiser keys on) */
    float *w = malloc((size_t)m->n_params * sizeof *w);
    if (!w) abort();
    for (int64_t i = 0; i < m->n_params; i++) w[i] = (float)((i * 7919) % 1000) / 2000.0f - 0.25f;
    mv_upload(m, m->params, w, m->n_params);
    free(w);
    r.absorbs = crew_model_layer_absorbs(m, 0);
    const int64_t in = ROWS * crew_shape_size(&m->input);
    float x[ROWS * 10 * 12];
    int32_t y[ROWS];
    int64_t ids[ROWS];
    for (int64_t i = 0; i < in; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int64_t i = 0; i < ROWS; i++) y[i] = (int32_t)(i % 4), ids[i] = i;
    mv_upload(m, m->act[0], x, in);
    mv_upload_as(m, m->labels, y, ROWS, CREW_DT_I32);
    mv_upload_as(m, m->sample_ids, ids, ROWS, CREW_DT_I64);
    crew_pass p = {.be = &m->be, .rows = ROWS, .training = 1, .seed = 3, .step = 1, .sample_ids = m->sample_ids,
                   .total_rows = ROWS};
    double correct = 0.0;
    CHECK_OK(crew_model_forward(m, &p));
    r.n_logits = ROWS * crew_model_classes(m);
    r.logits = mv_download(m, m->act[m->n_compute], r.n_logits);
    CHECK_OK(crew_model_loss(m, &p, 1.0f / ROWS, &r.loss, &correct));
    CHECK_OK(crew_model_backward(m, &p, NULL, NULL));
    r.n_params = m->n_params;
    r.grads = mv_download(m, m->grads, m->n_params);
    crew_model_free(m);
    crew_device_close(&be);
    return r;
}

/* max |a − b| / max |b| over the whole array */
static double rel_diff(const float *a, const float *b, int64_t n)
{
    double d = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0.0 ? d / scale : d;
}

int main(void)
{
    outcome one_pass = run(0, 0), fallback = run(1, 0), im2col = run(2, 0), apart = run(0, 1);
    CHECK_MSG(one_pass.absorbs && fallback.absorbs && !apart.absorbs,
              "the first convolution takes in its relu and pool: %d, %d; not with a dropout between: %d",
              one_pass.absorbs, fallback.absorbs, apart.absorbs);
    CHECK_MSG(one_pass.unkept && !fallback.unkept && !apart.unkept,
              "the first convolution's output unkept in the one pass only: %d, %d, %d", one_pass.unkept,
              fallback.unkept, apart.unkept);
    if (!one_pass.logits || !fallback.logits || !im2col.logits || !apart.logits) return check_report();
    CHECK_MSG(!memcmp(one_pass.logits, fallback.logits, (size_t)one_pass.n_logits * sizeof(float)) &&
                  one_pass.loss == fallback.loss,
              "the one pass's logits or loss are not the layers' one after the other");
    CHECK_MSG(!memcmp(one_pass.grads, fallback.grads, (size_t)one_pass.n_params * sizeof(float)),
              "the one pass's gradients are not the layers' one after the other, bit for bit (%.3g apart)",
              rel_diff(one_pass.grads, fallback.grads, one_pass.n_params));
    const double dl = rel_diff(one_pass.logits, apart.logits, one_pass.n_logits);
    const double dg = rel_diff(one_pass.grads, apart.grads, one_pass.n_params);
    const double di = rel_diff(im2col.grads, apart.grads, one_pass.n_params);
    CHECK_MSG(dl <= TOL && dg <= TOL && di <= TOL,
              "against the layers apart: logits %.3g, gradients %.3g (one pass), %.3g (im2col)", dl, dg, di);
    CHECK_MSG(fabs(one_pass.loss - apart.loss) <= TOL * fabs(apart.loss), "loss %.9g against %.9g apart",
              one_pass.loss, apart.loss);
    free(one_pass.logits), free(one_pass.grads), free(fallback.logits), free(fallback.grads);
    free(im2col.logits), free(im2col.grads), free(apart.logits), free(apart.grads);
    return check_report();
}
