/* test_gradcheck.c — every layer's backward pass against central finite differences of the
 * model's loss, plus the loss itself, dropout's batch-split invariance and softmax fusion.
 *
 * Each case is a tiny model: a dense layer first (so the gradient flowing into the layer under
 * test, its dx, is checked through that dense layer's kernel and bias), the layer under test,
 * then flatten/dense down to a few logits with softmax cross-entropy (the GPT case is a whole
 * language model instead: token ids in, logits and a label at every position). The analytic
 * gradient is one forward + loss + backward with scale = 1/rows (the loss is the batch mean); the
 * numeric one is (L(p + h) − L(p − h)) / (p⁺ − p⁻) for each parameter, or 64 of them drawn at
 * random from a bigger tensor. p⁺ and p⁻ are the float32 values actually stored (p ± h rounded),
 * so the rounding of the perturbation itself is no error source; L is summed in double.
 *
 * Step h = 1e-2. The model computes in float32, so L carries a rounding noise of a few
 * 1e-7 (L ≈ 1); the finite difference divides that by 2h, giving ~1e-5 of noise at h = 1e-2
 * (and ~1e-4 at 1e-3). The truncation error of the central difference is h²·L'''/6 ≈ 2e-5 for
 * these smooth, O(1)-scaled nets. 1e-2 balances the two; smaller h makes noise dominate.
 * Kinks (relu at 0, max pooling's switch of arg-max) are kept > 2h away by construction. Where a
 * case's curvature makes the truncation large (the GPT: layer norms over a residual stream of
 * small σ), it extrapolates the differences at h and h/2 instead (gc_case.richardson).
 *
 * Tolerance: |a − n| ≤ ATOL + RTOL·max(|a|, |n|) with RTOL 1e-2, ATOL 1e-4. The gradients here
 * are up to ~1 (5 behind batch norm); observed errors are ≤ 7e-5 absolute, except through the
 * normalisations, whose 1/σ curvature gives truncation errors of ~1e-3 relative. The worst
 * value uses 0.37 of this tolerance (each case prints its own figure), a 2.7x margin; halving
 * both constants would leave almost none, while a wrong factor, sign, index or missing term —
 * an error of O(|a|) — fails at once (each of those, planted in a kernel, was caught).
 *
 * A model's buffers are device memory: inputs, labels, sample ids and perturbed parameters go
 * up, activations, gradients and statistics come down, only by upload and download
 * (model_values.h), so the test runs unchanged on the guarded backend (make guard). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"
#include "io/model_file.h"
#include "model_values.h"
#include "nn/model.h"

#define H 1e-2
#define RTOL 1e-2
#define ATOL 1e-4
#define MAX_CHECKED 64  /* values checked per tensor */
#define SEED 20240611u

enum { INPUT_UNIFORM = 0, INPUT_AWAY_FROM_ZERO, INPUT_PERMUTED, INPUT_IDS };

typedef struct gc_case {
    const char *name;
    int64_t shape[3];
    int ndim;
    crew_layer_spec layers[5]; /* up to the first with type 0 */
    int64_t rows;
    int input;          /* INPUT_*: how act[0] is filled */
    float input_scale;  /* uniform inputs in ±scale [1] */
    int identity_first; /* set layer 0's square kernel to the identity (kinks stay put) */
    int training;
    int64_t vocab;      /* INPUT_IDS: ids in [0, vocab) */
    const char *zero;   /* "<layer>.<param>" whose gradient must vanish (a bias before batch norm) */
    float jitter;       /* every parameter moves off its initialiser by U(±jitter) [0.1] */
    int richardson;     /* numeric gradient: Richardson extrapolation of the differences at h and h/2 */
} gc_case;

static int64_t sample_ids[64]; /* row r of every pass is sample 1000 + 7r (main) */

static float *host_buf(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) abort();
    return p;
}

/* A pass over the first rows of m's batch; their sample ids go to the device (m->sample_ids). */
static crew_pass make_pass(crew_model *m, int64_t rows, int training)
{
    mv_upload_as(m, m->sample_ids, sample_ids, rows, CREW_DT_I64);
    return (crew_pass){.be = &m->be, .rows = rows, .training = training, .seed = SEED, .step = 3,
                       .sample_ids = m->sample_ids, .total_rows = (double)rows};
}

/* ------------------------------------------------------------------ building a case */

/* Moves every trainable value off its initialiser (zero biases, unit gammas) by U(±0.1), or
 * U(±jitter) where a case says, so no gradient is checked only at a special point. */
static void jitter_params(crew_model *m, uint64_t key, float jitter)
{
    crew_rng r = crew_rng_make(key);
    float *params = mv_params(m);
    const float a = jitter > 0.0f ? jitter : 0.1f;
    for (int64_t i = 0; i < m->n_params; i++) params[i] += 2.0f * a * crew_rng_next_uniform(&r) - a;
    mv_upload(m, m->params, params, m->n_params);
    free(params);
}

static void set_identity_kernel(crew_model *m, crew_layer *l)
{
    crew_param *k = &l->params[0];
    int64_t in = k->shape.dim[0], out = k->shape.dim[1];
    float *value = host_buf(in * out);
    for (int64_t i = 0; i < in; i++)
        for (int64_t j = 0; j < out; j++) value[i * out + j] = i == j ? 1.0f : 0.0f;
    mv_upload(m, k->value, value, in * out);
    free(value);
}

/* Per (row, channel) of an image, a random permutation of evenly spaced values in [-1, 1]: any
 * two values of one window differ by ≥ 2/(H·W − 1) ≥ 0.042 (H·W ≤ 49), while perturbing the
 * identity kernel before them by h moves two values against each other by ≤ 2h = 0.02 (the
 * bias and the diagonal keep the order), so max pooling never switches its arg-max. */
static void fill_permuted(float *x, const int64_t *shape, int64_t rows, crew_rng *r)
{
    int64_t hw = shape[0] * shape[1], c = shape[2];
    int64_t *perm = malloc((size_t)hw * sizeof *perm);
    for (int64_t b = 0; b < rows; b++)
        for (int64_t ch = 0; ch < c; ch++) {
            for (int64_t i = 0; i < hw; i++) perm[i] = i;
            for (int64_t i = hw - 1; i > 0; i--) {
                int64_t j = (int64_t)crew_rng_next_below(r, (uint64_t)i + 1), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            for (int64_t i = 0; i < hw; i++)
                x[(b * hw + i) * c + ch] = -1.0f + 2.0f * (float)perm[i] / (float)(hw - 1);
        }
    free(perm);
}

static void fill_input(crew_model *m, const gc_case *c, uint64_t key)
{
    crew_rng r = crew_rng_make(key);
    int64_t n = c->rows * crew_shape_size(&m->input);
    float *x = host_buf(n), scale = c->input_scale > 0.0f ? c->input_scale : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float u = crew_rng_next_uniform(&r);
        switch (c->input) {
        case INPUT_AWAY_FROM_ZERO: /* |x| in [0.3, 1] */
            x[i] = (0.3f + 0.7f * u) * (crew_rng_next_uniform(&r) < 0.5f ? -1.0f : 1.0f);
            break;
        case INPUT_IDS: /* the last id never occurs: its table row must get no gradient */
            x[i] = (float)crew_rng_next_below(&r, (uint64_t)c->vocab - 1);
            break;
        default: x[i] = scale * (2.0f * u - 1.0f); break;
        }
    }
    if (c->input == INPUT_PERMUTED) fill_permuted(x, c->shape, c->rows, &r);
    /* a label at every position: one per row for a classifier, [rows, T] for a language model */
    int64_t classes = crew_model_classes(m), n_labels = c->rows * crew_model_positions(m);
    int32_t *labels = malloc((size_t)n_labels * sizeof *labels);
    if (!labels) abort();
    for (int64_t i = 0; i < n_labels; i++) labels[i] = (int32_t)crew_rng_next_below(&r, (uint64_t)classes);
    mv_upload(m, m->act[0], x, n);
    mv_upload_as(m, m->labels, labels, n_labels, CREW_DT_I32);
    free(x);
    free(labels);
}

static crew_model *build_case(const gc_case *c)
{
    crew_model *m = NULL;
    crew_status s = crew_model_create(c->shape, c->ndim, &m);
    for (int i = 0; !s && i < 5 && c->layers[i].type; i++) s = crew_model_add(m, &c->layers[i]);
    if (!s) s = crew_model_init_params(m, SEED);
    if (!s) s = crew_model_reserve(m, c->rows);
    CHECK_MSG(s == CREW_OK, "%s: building the model: %s", c->name, crew_status_message(s));
    if (s) {
        crew_status_free(s);
        crew_model_free(m);
        return NULL;
    }
    jitter_params(m, SEED + 1, c->jitter);
    if (c->identity_first) set_identity_kernel(m, m->layers[0]);
    fill_input(m, c, SEED + 2);
    return m;
}

/* ------------------------------------------------------------------ the check */

/* Mean loss of the current parameters; NaN when a pass fails (and the failure is recorded). */
static double eval_loss(crew_model *m, const crew_pass *p)
{
    double sum = NAN, correct;
    crew_status s = crew_model_forward(m, p);
    if (!s) s = crew_model_loss(m, p, 1.0f / (float)p->rows, &sum, &correct);
    CHECK_MSG(s == CREW_OK, "forward: %s", crew_status_message(s));
    crew_status_free(s);
    return s ? NAN : sum / (double)p->rows;
}

/* Analytic gradient of the mean loss into grad [n_params]. */
static int analytic_grads(crew_model *m, const crew_pass *p, float *grad)
{
    if (isnan(eval_loss(m, p))) return 0;
    crew_status s = crew_model_backward(m, p, NULL, NULL);
    CHECK_MSG(s == CREW_OK, "backward: %s", crew_status_message(s));
    crew_status_free(s);
    if (s) return 0;
    s = crew_dev_download_f32(&m->be, grad, m->grads, m->n_params);
    int ok = s == CREW_OK;
    CHECK_OK(s);
    return ok;
}

/* Up to MAX_CHECKED distinct indices of [0, n) (all of them when n is small). */
static int64_t pick_indices(int64_t n, int64_t *idx, crew_rng *r)
{
    int64_t *all = malloc((size_t)n * sizeof *all);
    for (int64_t i = 0; i < n; i++) all[i] = i;
    int64_t k = n < MAX_CHECKED ? n : MAX_CHECKED;
    for (int64_t i = 0; i < k; i++) { /* partial Fisher-Yates */
        int64_t j = i + (int64_t)crew_rng_next_below(r, (uint64_t)(n - i)), t = all[i];
        all[i] = all[j];
        all[j] = t;
        idx[i] = all[i];
    }
    free(all);
    return k;
}

typedef struct gc_stats {
    int64_t checked;
    double max_abs_err, max_grad;
    double worst; /* largest |a − n| / (ATOL + RTOL·max(|a|, |n|)): must stay ≤ 1 */
} gc_stats;

/* The central difference (L(v + h) − L(v − h)) / (v⁺ − v⁻) of the loss in one parameter value,
 * which is left as it was (orig). */
static double difference(crew_model *m, const crew_pass *p, float *v, float orig, double h)
{
    float up = orig + (float)h, dn = orig - (float)h;
    mv_set(m, v, up);
    double lp = eval_loss(m, p);
    mv_set(m, v, dn);
    double lm = eval_loss(m, p);
    mv_set(m, v, orig);
    return (lp - lm) / ((double)up - (double)dn);
}

/* Compares one tensor's analytic gradient with central differences (MAX_CHECKED values at most)
 * and accumulates the statistics. richardson: (4·D(h/2) − D(h)) / 3 instead of D(h), which
 * cancels the h² truncation term (as the whole-model checks below do) at the price of about twice
 * D(h/2)'s rounding noise. */
static void check_tensor(crew_model *m, const crew_pass *p, const crew_layer *l, const crew_param *t,
                         const float *analytic, const char *name, const char *zero, int richardson, crew_rng *r,
                         gc_stats *st)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", l->name, t->name);
    int want_zero = zero && strcmp(zero, full) == 0;
    int64_t idx[MAX_CHECKED], k = pick_indices(crew_shape_size(&t->shape), idx, r);
    double worst = 0.0, max_num = 0.0;
    int64_t worst_i = -1;
    double worst_a = 0.0, worst_n = 0.0;
    for (int64_t q = 0; q < k; q++) {
        float *v = t->value + idx[q], orig = mv_get(m, v);
        double num = difference(m, p, v, orig, H), a = analytic[t->offset + idx[q]];
        if (richardson) num = (4.0 * difference(m, p, v, orig, H / 2) - num) / 3.0;
        double err = fabs(a - num), ratio = err / (ATOL + RTOL * fmax(fabs(a), fabs(num)));
        if (!(ratio <= worst)) worst = ratio, worst_i = idx[q], worst_a = a, worst_n = num;
        max_num = fmax(max_num, fabs(num));
        st->max_abs_err = fmax(st->max_abs_err, err);
        st->max_grad = fmax(st->max_grad, fabs(a));
    }
    st->checked += k;
    st->worst = fmax(st->worst, worst);
    CHECK_MSG(worst <= 1.0, "%s: layer %d (%s) %s[%lld]: analytic %.7g, numeric %.7g (%.1fx the tolerance)", name,
              l->index, l->name, t->name, (long long)worst_i, worst_a, worst_n, worst);
    /* A tensor whose gradient is all zeros would make the comparison vacuous — unless zero is
     * the point (e.g. a bias followed by batch norm, whose mean subtraction cancels it). */
    if (want_zero)
        CHECK_MSG(max_num <= ATOL, "%s: %s: numeric gradient up to %g, expected zero", name, full, max_num);
    else
        CHECK_MSG(max_num > 10 * ATOL, "%s: %s: every numeric gradient is below %g", name, full, 10 * ATOL);
}

/* Checks every trainable tensor of m at the current input (case c: its name, zero and
 * richardson); prints one summary line. */
static void gradcheck_model(crew_model *m, const crew_pass *p, const gc_case *c)
{
    const char *name = c->name;
    float *analytic = host_buf(m->n_params), *again = host_buf(m->n_params);
    gc_stats st = {0};
    crew_rng r = crew_rng_make(SEED + 3);
    /* Backward overwrites the gradients (the trainer accumulates micro-batches itself): a second
     * pass over the same batch must give the same bits, not twice the gradient. */
    int ok = analytic_grads(m, p, analytic) && analytic_grads(m, p, again);
    CHECK_MSG(!ok || memcmp(analytic, again, (size_t)m->n_params * sizeof(float)) == 0,
              "%s: a second backward pass changed the gradients (accumulated instead of overwriting?)", name);
    /* A tied parameter (lm_head's table) is its owner's values and gradient, which the owner's
     * check covers: both layers' contributions are in that one gradient. */
    if (ok)
        for (int i = 0; i < m->n_compute; i++)
            for (int j = 0; j < m->layers[i]->n_params; j++)
                if (m->layers[i]->params[j].trainable && crew_param_owned(&m->layers[i]->params[j]))
                    check_tensor(m, p, m->layers[i], &m->layers[i]->params[j], analytic, name, c->zero,
                                 c->richardson, &r, &st);
    printf("%-26s %4lld values  max |grad| %-7.3g max |a-n| %-9.3g %.2f of the tolerance\n", name,
           (long long)st.checked, st.max_grad, st.max_abs_err, st.worst);
    free(analytic);
    free(again);
}

static void run_case(const gc_case *c)
{
    crew_model *m = build_case(c);
    if (!m) return;
    crew_pass p = make_pass(m, c->rows, c->training);
    gradcheck_model(m, &p, c);
    crew_model_free(m);
}

/* ------------------------------------------------------------------ the cases */

#define DENSE(u) {.type = CREW_LAYER_DENSE, .units = (u)}
#define DENSE_ACT(u, a) {.type = CREW_LAYER_DENSE, .units = (u), .activation = (a)}
#define FLAT {.type = CREW_LAYER_FLATTEN}
#define ACT(a) {.type = CREW_LAYER_ACTIVATION, .activation = (a)}
#define CONV(f, kh, kw, sh, sw, pad, nb, a)                                                                   \
    {.type = CREW_LAYER_CONV2D, .filters = (f), .kernel = {(kh), (kw)}, .strides = {(sh), (sw)}, .padding = (pad), \
     .no_bias = (nb), .activation = (a)}
#define POOL(t, ph, pw, sh, sw, pad) {.type = (t), .pool = {(ph), (pw)}, .strides = {(sh), (sw)}, .padding = (pad)}
#define MAXP CREW_LAYER_MAX_POOL2D
#define AVGP CREW_LAYER_AVG_POOL2D
#define VALID CREW_PAD_VALID
#define SAME CREW_PAD_SAME
#define BLOCK(h, n) {.type = CREW_LAYER_TRANSFORMER_BLOCK, .heads = (h), .blocks = (n)}

/* name, input axes, rows: the fields every case sets */
#define CASE(nm, nd, r) .name = (nm), .ndim = (nd), .rows = (r)

static const gc_case cases[] = {
    /* dense: fused activation; a 2-axis input (dense over the last axis) without bias */
    {CASE("dense", 1, 4), .shape = {5}, .layers = {DENSE_ACT(4, CREW_ACT_TANH), DENSE(3)}},
    {CASE("dense nobias 2d", 2, 3), .shape = {3, 4},
     .layers = {{.type = CREW_LAYER_DENSE, .units = 5, .no_bias = 1}, FLAT, DENSE(3)}},
    /* conv2d: a dense over channels first, so the conv's dx is checked through it */
    {CASE("conv 3x3 same s1", 3, 2), .shape = {5, 5, 2},
     .layers = {DENSE(2), CONV(3, 3, 3, 1, 1, SAME, 0, 0), FLAT, DENSE(3)}},
    {CASE("conv 3x3 valid s1 nobias", 3, 2), .shape = {5, 6, 2},
     .layers = {DENSE(2), CONV(3, 3, 3, 1, 1, VALID, 1, CREW_ACT_TANH), FLAT, DENSE(3)}},
    {CASE("conv 3x3 same s2", 3, 2), .shape = {5, 6, 2},
     .layers = {DENSE(3), CONV(2, 3, 3, 2, 2, SAME, 0, 0), FLAT, DENSE(3)}},
    {CASE("conv 3x3 valid s2", 3, 2), .shape = {6, 6, 2},
     .layers = {DENSE(2), CONV(2, 3, 3, 2, 2, VALID, 0, 0), FLAT, DENSE(3)}},
    {CASE("conv 2x2 valid s2", 3, 2), .shape = {5, 5, 2},
     .layers = {DENSE(2), CONV(3, 2, 2, 2, 2, VALID, 0, 0), FLAT, DENSE(3)}},
    {CASE("conv 2x2 same s1 nobias", 3, 2), .shape = {4, 5, 2},
     .layers = {DENSE(2), CONV(2, 2, 2, 1, 1, SAME, 1, 0), FLAT, DENSE(3)}},
    {CASE("conv 2x3 same s(2,1)", 3, 2), .shape = {5, 5, 1},
     .layers = {DENSE(2), CONV(2, 2, 3, 2, 1, SAME, 0, 0), FLAT, DENSE(3)}},
    /* max pooling: identity dense first and well-separated inputs (no ties, no arg-max switch) */
    {CASE("maxpool 2x2 valid", 3, 2), .shape = {4, 4, 2}, .input = INPUT_PERMUTED, .identity_first = 1,
     .layers = {DENSE(2), POOL(MAXP, 2, 2, 0, 0, VALID), FLAT, DENSE(3)}},
    {CASE("maxpool 3x3/2 same", 3, 2), .shape = {5, 5, 2}, .input = INPUT_PERMUTED, .identity_first = 1,
     .layers = {DENSE(2), POOL(MAXP, 3, 3, 2, 2, SAME), FLAT, DENSE(3)}},
    {CASE("maxpool 2x2 same odd", 3, 2), .shape = {5, 5, 2}, .input = INPUT_PERMUTED, .identity_first = 1,
     .layers = {DENSE(2), POOL(MAXP, 2, 2, 0, 0, SAME), FLAT, DENSE(3)}},
    {CASE("maxpool 3x3/1 overlap", 3, 2), .shape = {5, 4, 2}, .input = INPUT_PERMUTED, .identity_first = 1,
     .layers = {DENSE(2), POOL(MAXP, 3, 3, 1, 1, VALID), FLAT, DENSE(3)}},
    {CASE("maxpool 2x2/3 gaps", 3, 2), .shape = {7, 7, 1}, .input = INPUT_PERMUTED, .identity_first = 1,
     .layers = {DENSE(1), POOL(MAXP, 2, 2, 3, 3, VALID), FLAT, DENSE(3)}},
    /* average pooling: padding excluded from the count */
    {CASE("avgpool 2x2 valid", 3, 2), .shape = {4, 4, 2},
     .layers = {DENSE(2), POOL(AVGP, 2, 2, 0, 0, VALID), FLAT, DENSE(3)}},
    {CASE("avgpool 3x3/2 same", 3, 2), .shape = {5, 5, 2},
     .layers = {DENSE(2), POOL(AVGP, 3, 3, 2, 2, SAME), FLAT, DENSE(3)}},
    {CASE("avgpool 2x2 same odd", 3, 2), .shape = {5, 5, 2},
     .layers = {DENSE(2), POOL(AVGP, 2, 2, 0, 0, SAME), FLAT, DENSE(3)}},
    {CASE("avgpool 3x3/1 same", 3, 2), .shape = {4, 4, 2},
     .layers = {DENSE(2), POOL(AVGP, 3, 3, 1, 1, SAME), FLAT, DENSE(3)}},
    {CASE("global avgpool", 3, 3), .shape = {3, 4, 2},
     .layers = {DENSE(3), {.type = CREW_LAYER_GLOBAL_AVG_POOL2D}, DENSE(3)}},
    {CASE("flatten", 3, 3), .shape = {2, 3, 2}, .layers = {DENSE(3), FLAT, DENSE(3)}},
    /* activations; relu's inputs stay >= 0.2 away from its kink (identity dense, |x| >= 0.3, |b| <= 0.1) */
    {CASE("relu", 1, 4), .shape = {6}, .input = INPUT_AWAY_FROM_ZERO, .identity_first = 1,
     .layers = {DENSE_ACT(6, CREW_ACT_RELU), DENSE(3)}},
    {CASE("gelu", 1, 4), .shape = {6}, .input_scale = 2.0f, .layers = {DENSE(6), ACT(CREW_ACT_GELU), DENSE(3)}},
    {CASE("tanh", 1, 4), .shape = {6}, .input_scale = 2.0f, .layers = {DENSE(6), ACT(CREW_ACT_TANH), DENSE(3)}},
    {CASE("sigmoid", 1, 4), .shape = {6}, .input_scale = 2.0f,
     .layers = {DENSE(6), ACT(CREW_ACT_SIGMOID), DENSE(3)}},
    /* two activations in a row: the second must not write over the first's output, which the
     * first's backward reads */
    {CASE("tanh then sigmoid", 1, 4), .shape = {6}, .input_scale = 2.0f,
     .layers = {DENSE(6), ACT(CREW_ACT_TANH), ACT(CREW_ACT_SIGMOID), DENSE(3)}},
    /* dropout, training: every evaluation uses the same seed/step/sample ids, so one mask */
    {CASE("dropout", 1, 4), .shape = {8}, .training = 1,
     .layers = {DENSE(8), {.type = CREW_LAYER_DROPOUT, .rate = 0.4f}, DENSE(3)}},
    /* batch norm, training: batch statistics over rows x 6 positions */
    {CASE("batch norm", 3, 4), .shape = {2, 3, 2}, .training = 1, .zero = "dense.bias",
     .layers = {DENSE(3), {.type = CREW_LAYER_BATCH_NORM}, FLAT, DENSE(4)}},
    {CASE("batch norm first", 3, 3), .shape = {2, 2, 3}, .training = 1,
     .layers = {{.type = CREW_LAYER_BATCH_NORM, .epsilon = 1e-2f}, FLAT, DENSE(3)}},
    {CASE("layer norm", 2, 3), .shape = {3, 4}, .layers = {DENSE(5), {.type = CREW_LAYER_LAYER_NORM}, FLAT, DENSE(3)}},
    {CASE("layer norm first", 2, 3), .shape = {3, 4}, .layers = {{.type = CREW_LAYER_LAYER_NORM}, FLAT, DENSE(3)}},
    /* ...and behind parameter-free layers: backward passes it no dx there either (it writes its
     * spare buffer); dropout active, its mask fixed by seed, step and sample ids */
    {CASE("layer norm after dropout", 2, 3), .shape = {3, 4}, .training = 1,
     .layers = {{.type = CREW_LAYER_DROPOUT, .rate = 0.25f}, {.type = CREW_LAYER_LAYER_NORM}, FLAT, DENSE(3)}},
    {CASE("layer norm after tanh", 2, 3), .shape = {3, 4}, .input_scale = 2.0f,
     .layers = {ACT(CREW_ACT_TANH), FLAT, {.type = CREW_LAYER_LAYER_NORM}, DENSE(3)}},
    /* embedding: 15 ids from a vocabulary of 7, so ids repeat and their gradients add up */
    {CASE("embedding", 1, 3), .shape = {5}, .input = INPUT_IDS, .vocab = 7,
     .layers = {{.type = CREW_LAYER_EMBEDDING, .vocab = 7, .dim = 3}, FLAT, DENSE(4)}},
    /* Transformer blocks, jittered by ±0.3: GPT-2's N(0, 0.02²) kernels moved by ±0.1 give
     * scores q·k/√d of ~1e-2, an almost uniform softmax, and q and k gradients of ~1e-4 (ATOL's
     * size: unchecked in effect); at ±0.3 they are 6e-3 to 0.1, and every tensor's largest
     * numeric gradient is over 40x the 1e-3 that check_tensor asks of it. */
    /* ...on a float input [T, C], the dense over C before it checking the block's dx */
    {CASE("transformer block", 2, 2), .shape = {5, 8}, .jitter = 0.3f,
     .layers = {DENSE(8), BLOCK(2, 1), FLAT, DENSE(3)}},
    {CASE("transformer block 3 heads", 2, 2), .shape = {4, 6}, .jitter = 0.3f,
     .layers = {DENSE(6), BLOCK(3, 1), FLAT, DENSE(3)}},
    /* ...with residual dropout, training: both branches masked, the masks fixed by seed and step */
    {CASE("transformer block dropout", 2, 2), .shape = {5, 8}, .jitter = 0.3f, .training = 1,
     .layers = {DENSE(8), {.type = CREW_LAYER_TRANSFORMER_BLOCK, .heads = 2, .blocks = 1, .rate = 0.2f}, FLAT,
                DENSE(3)}},
    /* ...and a whole GPT: token + position embedding, two blocks, the final layer norm and the
     * lm_head tied to the embedding's wte (whose gradient has both layers' parts), a label at
     * every position (the loss their mean); 10 ids from a vocabulary of 11, so the last id's
     * row of wte gets the lm_head's part alone. Five layer norms over a residual stream of
     * σ ≈ 0.25 (wte + wpe) make the h² truncation error of wte's and wpe's differences 0.41 of
     * the tolerance at h = 1e-2 (measured: it scales as h², 1.7 at 2e-2, 0.15 at 5e-3);
     * Richardson's extrapolation leaves 0.18, mostly noise. */
    {CASE("gpt", 1, 2), .shape = {5}, .input = INPUT_IDS, .vocab = 11, .jitter = 0.3f, .richardson = 1,
     .layers = {{.type = CREW_LAYER_GPT_EMBEDDING, .vocab = 11, .dim = 8}, BLOCK(2, 2), BLOCK(2, 2),
                {.type = CREW_LAYER_LAYER_NORM, .epsilon = 1e-5f}, {.type = CREW_LAYER_LM_HEAD}}},
};

static const gc_case *find_case(const char *name)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(cases[i].name, name) == 0) return &cases[i];
    abort();
}

static void test_layers(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* ------------------------------------------------------------------ layer-specific checks */

/* The embedding case: ids repeat (so the FD check above covered accumulation) and the row of
 * the id that never occurs gets exactly zero gradient. */
static void test_embedding_rows(void)
{
    const gc_case *c = find_case("embedding");
    crew_model *m = build_case(c);
    if (!m) return;
    int64_t n = c->rows * c->shape[0], count[8] = {0};
    float *ids = mv_download(m, m->act[0], n);
    for (int64_t i = 0; i < n; i++) count[(int)ids[i]]++;
    free(ids);
    int repeated = 0;
    for (int v = 0; v < c->vocab; v++) repeated |= count[v] > 1;
    CHECK(repeated && count[c->vocab - 1] == 0);
    crew_pass p = make_pass(m, c->rows, 0);
    float *g = host_buf(m->n_params);
    if (analytic_grads(m, &p, g)) {
        const crew_param *t = &m->layers[0]->params[0];
        int64_t dim = t->shape.dim[1];
        int zero = 1, used_nonzero = 0;
        for (int64_t j = 0; j < dim; j++) {
            zero &= g[t->offset + (c->vocab - 1) * dim + j] == 0.0f;
            used_nonzero |= g[t->offset + j] != 0.0f || g[t->offset + dim + j] != 0.0f;
        }
        CHECK_MSG(zero, "embedding: the unused id's row has a nonzero gradient");
        CHECK(used_nonzero);
    }
    free(g);
    crew_model_free(m);
}

/* The GPT case's tied table: the lm_head's kernel is the embedding's wte (its value and gradient,
 * no room of its own: counted once), the row of the id that never occurs gets the lm_head's part
 * of the gradient alone (nonzero: every token has some probability), and the same model from a
 * model file's gpt block (src/io/model_file_gpt.c: the lm_head tied by name) is the same layers
 * and, from the same seed, the same parameters and loss, bit for bit. */
static void test_gpt_tied(void)
{
    const gc_case *c = find_case("gpt");
    crew_model *m = build_case(c);
    if (!m) return;
    const crew_layer *emb = m->layers[0], *head = m->layers[m->n_layers - 1];
    const crew_param *wte = &emb->params[0], *kernel = &head->params[0];
    CHECK(head->spec.type == CREW_LAYER_LM_HEAD && kernel->tied && !crew_param_owned(kernel) && wte->shared);
    CHECK(kernel->value == wte->value && kernel->grad == wte->grad && kernel->offset == wte->offset);
    int64_t owned = 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++)
            if (crew_param_owned(&m->layers[i]->params[j])) owned += crew_shape_size(&m->layers[i]->params[j].shape);
    CHECK_MSG(owned == m->n_params, "gpt: %lld parameters owned, %lld in the buffer", (long long)owned,
              (long long)m->n_params);
    CHECK(crew_model_positions(m) == c->shape[0] && crew_model_classes(m) == c->vocab);
    crew_pass p = make_pass(m, c->rows, 0);
    float *g = host_buf(m->n_params);
    if (analytic_grads(m, &p, g)) {
        const int64_t dim = wte->shape.dim[1], unused = (c->vocab - 1) * dim;
        double norm = 0.0;
        for (int64_t j = 0; j < dim; j++) norm += fabs(g[wte->offset + unused + j]);
        CHECK_MSG(norm > 1e-3, "gpt: the unused id's row of wte has gradient %g: the lm_head's part is missing",
                  norm);
    }
    free(g);

    static const char json[] =
        "{\"layers\": [{\"type\": \"gpt\", \"layers\": 2, \"heads\": 2, \"width\": 8, \"context\": 5, \"vocab\": 11}]}";
    crew_model *f = NULL, *a = NULL;
    CHECK_OK(crew_model_parse_json(json, sizeof json - 1, "gpt block", &f));
    crew_status s = crew_model_create(c->shape, c->ndim, &a);
    for (int i = 0; !s && i < 5; i++) s = crew_model_add(a, &c->layers[i]);
    CHECK_OK(s);
    if (f && a) {
        CHECK(f->n_layers == a->n_layers);
        for (int i = 0; i < f->n_layers && i < a->n_layers; i++) {
            const crew_layer *x = f->layers[i], *y = a->layers[i];
            CHECK_MSG(x->spec.type == y->spec.type && x->spec.heads == y->spec.heads &&
                          x->spec.blocks == y->spec.blocks && x->n_params == y->n_params,
                      "gpt block: layer %d is %s, built by hand %s", i, x->name, y->name);
        }
        CHECK_OK(crew_model_init_params(f, SEED));
        CHECK_OK(crew_model_init_params(a, SEED));
        CHECK_MSG(mv_equal(f, a), "gpt block: the file's model has other parameters than the same layers added");
        CHECK_OK(crew_model_reserve(f, c->rows));
        CHECK_OK(crew_model_reserve(a, c->rows));
        fill_input(f, c, SEED + 2);
        fill_input(a, c, SEED + 2);
        crew_pass pf = make_pass(f, c->rows, 0), pa = make_pass(a, c->rows, 0);
        double lf = eval_loss(f, &pf), la = eval_loss(a, &pa);
        CHECK_MSG(lf == la && isfinite(lf), "gpt block: loss %.17g, the same layers added %.17g", lf, la);
    }
    crew_model_free(f);
    crew_model_free(a);
    crew_model_free(m);
}

/* Batch norm in training: the moving statistics follow Keras (moving = 0.99·moving + 0.01·batch,
 * biased variance), and they never enter the training-mode output, so the loss checked above
 * is a function of the trainable parameters alone. */
static void test_batch_norm_moving_stats(void)
{
    const gc_case *c = find_case("batch norm");
    crew_model *m = build_case(c);
    if (!m) return;
    crew_layer *bn = m->layers[1];
    float *mm = mv_tensor(m, &bn->params[2]), *mv = mv_tensor(m, &bn->params[3]);
    int64_t ch = bn->in.dim[bn->in.ndim - 1], n = c->rows * crew_shape_size(&bn->in) / ch;
    CHECK(strcmp(bn->params[2].name, "moving_mean") == 0 && mm[0] == 0.0f && mv[0] == 1.0f);
    free(mm);
    free(mv);
    crew_pass p = make_pass(m, c->rows, 1);
    double l1 = eval_loss(m, &p);
    /* the statistics that pass left, and its layer's input */
    mm = mv_tensor(m, &bn->params[2]);
    mv = mv_tensor(m, &bn->params[3]);
    float *x = mv_download(m, m->act[1], n * ch);
    for (int64_t j = 0; j < ch; j++) { /* batch statistics of the layer's input, in double */
        double mean = 0.0, var = 0.0;
        for (int64_t r = 0; r < n; r++) mean += x[r * ch + j] / (double)n;
        for (int64_t r = 0; r < n; r++) var += pow(x[r * ch + j] - mean, 2) / (double)n;
        CHECK_MSG(fabs(mm[j] - 0.01 * mean) <= 1e-6 && fabs(mv[j] - (0.99 + 0.01 * var)) <= 1e-6,
                  "batch norm channel %lld: moving mean %.9g var %.9g, want %.9g %.9g", (long long)j, mm[j], mv[j],
                  0.01 * mean, 0.99 + 0.01 * var);
        mm[j] = 5.0f + (float)j; /* nonsense statistics: training mode must not see them */
        mv[j] = 0.01f;
    }
    mv_upload(m, bn->params[2].value, mm, ch);
    mv_upload(m, bn->params[3].value, mv, ch);
    free(mm);
    free(mv);
    free(x);
    double l2 = eval_loss(m, &p);
    CHECK_MSG(l1 == l2, "batch norm: training loss %.17g changed to %.17g with other moving statistics", l1, l2);
    p.training = 0; /* ...while inference uses them */
    CHECK(eval_loss(m, &p) != l1);
    crew_model_free(m);
}

/* Dropout in training: the mask (work[0]) holds 0 or 1/(1 − rate), and the output is x·mask. */
static void test_dropout_mask(void)
{
    const gc_case *c = find_case("dropout");
    crew_model *m = build_case(c);
    if (!m) return;
    crew_pass p = make_pass(m, c->rows, 1);
    eval_loss(m, &p);
    const crew_layer *d = m->layers[1];
    int64_t n = c->rows * crew_shape_size(&d->in), dropped = 0, wrong = 0;
    float keep = 1.0f / (1.0f - d->spec.rate);
    float *masks = mv_download(m, d->work[0], n), *x = mv_download(m, m->act[1], n), *y = mv_download(m, m->act[2], n);
    for (int64_t i = 0; i < n; i++) {
        float mask = masks[i];
        dropped += mask == 0.0f;
        wrong += (mask != 0.0f && mask != keep) || y[i] != x[i] * mask;
    }
    free(masks);
    free(x);
    free(y);
    CHECK_MSG(wrong == 0, "dropout: %lld values are not x·mask with mask in {0, %g}", (long long)wrong, keep);
    /* 32 values at rate 0.4: 12.8 dropped on average; [3, 24] holds with probability > 0.9999. */
    CHECK_MSG(dropped >= 3 && dropped <= 24, "dropout: %lld of %lld values dropped at rate 0.4", (long long)dropped,
              (long long)n);
    crew_model_free(m);
}


/* Dropout's mask depends on (seed, step, sample id, position) only: four samples run as one batch
 * and as two batches of two give bitwise-equal outputs. Dropout is the first layer so that
 * nothing else (a GEMM blocked differently for 2 and 4 rows) can differ. */
static void dropout_output(crew_model *m, const float *x, const int64_t *ids, int64_t rows, uint64_t seed,
                           int64_t step, float *y)
{
    int64_t n = crew_shape_size(&m->input);
    crew_pass p = {.be = &m->be, .rows = rows, .training = 1, .seed = seed, .step = step,
                   .sample_ids = m->sample_ids, .total_rows = (double)rows};
    mv_upload(m, m->act[0], x, rows * n);
    mv_upload_as(m, m->sample_ids, ids, rows, CREW_DT_I64);
    CHECK_OK(crew_model_forward(m, &p));
    CHECK_OK(crew_dev_download_f32(&m->be, y, m->act[1], rows * n));
}

static void test_dropout_batch_split(void)
{
    enum { N = 16, ROWS = 4 };
    crew_model *m = NULL;
    crew_status s = crew_model_create((int64_t[]){N}, 1, &m);
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DROPOUT, .rate = 0.5f});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 3});
    if (!s) s = crew_model_init_params(m, SEED);
    if (!s) s = crew_model_reserve(m, ROWS);
    CHECK_MSG(s == CREW_OK, "dropout model: %s", crew_status_message(s));
    if (s) {
        crew_status_free(s);
        crew_model_free(m);
        return;
    }
    float x[ROWS * N], whole[ROWS * N], split[ROWS * N], other[ROWS * N];
    crew_rng r = crew_rng_make(99);
    for (int i = 0; i < ROWS * N; i++) x[i] = 0.5f + crew_rng_next_uniform(&r); /* never 0 */
    const int64_t ids[ROWS] = {40, 7, 1234567, 3};
    dropout_output(m, x, ids, ROWS, SEED, 11, whole);
    dropout_output(m, x, ids, 2, SEED, 11, split);
    dropout_output(m, x + 2 * N, ids + 2, 2, SEED, 11, split + 2 * N);
    CHECK_MSG(memcmp(whole, split, sizeof whole) == 0, "dropout: one batch of 4 and two of 2 differ");
    /* Reversed order within the batch: each sample keeps its own mask. */
    float xr[ROWS * N];
    const int64_t ids_r[ROWS] = {3, 1234567, 7, 40};
    for (int b = 0; b < ROWS; b++) memcpy(xr + b * N, x + (ROWS - 1 - b) * N, sizeof(float) * N);
    dropout_output(m, xr, ids_r, ROWS, SEED, 11, other);
    int same = 1;
    for (int b = 0; b < ROWS; b++) same &= memcmp(other + b * N, whole + (ROWS - 1 - b) * N, sizeof(float) * N) == 0;
    CHECK_MSG(same, "dropout: a sample's mask changed with its row in the batch");
    /* ...and the mask does change with the step, the seed and the sample id. */
    dropout_output(m, x, ids, ROWS, SEED, 12, other);
    CHECK(memcmp(whole, other, sizeof whole) != 0);
    dropout_output(m, x, ids, ROWS, SEED + 1, 11, other);
    CHECK(memcmp(whole, other, sizeof whole) != 0);
    const int64_t ids2[ROWS] = {41, 7, 1234567, 3};
    dropout_output(m, x, ids2, ROWS, SEED, 11, other);
    CHECK(memcmp(whole, other, N * sizeof(float)) != 0 && memcmp(whole + N, other + N, 3 * N * sizeof(float)) == 0);
    crew_model_free(m);
}

/* Softmax cross-entropy on its own: the logits' gradient against central differences of the
 * summed loss, with logits of ±80 (exp(160) overflows float32: a kernel that skipped the max
 * subtraction would return inf/NaN). Scale 1 here: a row loss of ~160 has an ulp of 1.5e-5,
 * which the finite difference turns into ≤ 1e-3 of noise, against gradients of O(1). */
typedef struct xent_dev {
    float *z, *loss, *dz; /* logits [rows, classes], row losses [rows], d loss / d logits */
    int32_t *labels;      /* [rows] */
} xent_dev;

/* The loss of logits z (host) against the labels in d: z goes to the device, the row losses and
 * the logits' gradient come back into loss and dz; returns the summed loss. */
static double xent_sum(const crew_backend *be, const xent_dev *d, const float *z, int64_t rows, int64_t classes,
                       float *loss, float *dz)
{
    int64_t correct;
    CHECK_OK(crew_dev_upload_f32(be, d->z, z, rows * classes));
    CHECK_OK(be->ops->sync(be->ctx, NULL));
    CHECK_OK(be->ops->softmax_xent(be->ctx, d->z, d->labels, rows, classes, 1.0f, d->loss, d->dz, &correct));
    CHECK_OK(crew_dev_download_f32(be, loss, d->loss, rows));
    CHECK_OK(crew_dev_download_f32(be, dz, d->dz, rows * classes));
    double sum = 0.0;
    for (int64_t r = 0; r < rows; r++) sum += loss[r];
    return sum;
}

static void test_softmax_xent(void)
{
    enum { ROWS = 4, CLASSES = 4 };
    crew_backend be;
    crew_status s = crew_device_open("cpu", 0, NULL, &be);
    int opened = s == CREW_OK;
    CHECK_OK(s);
    if (!opened) return;
    const int64_t size[4] = {ROWS * CLASSES, ROWS, ROWS * CLASSES, ROWS};
    void *buf[4] = {NULL};
    for (int i = 0; i < 4; i++) CHECK_OK(be.ops->alloc(be.ctx, i < 3 ? CREW_DT_F32 : CREW_DT_I32, size[i], &buf[i]));
    const xent_dev dev = {.z = buf[0], .loss = buf[1], .dz = buf[2], .labels = buf[3]};
    float z[ROWS * CLASSES] = {0.3f, -1.2f, 2.0f, 0.7f,   80.0f, -80.0f, 0.0f, 3.0f,
                               -80.0f, 80.0f, 80.0f, -80.0f, 80.0f, 79.5f, -80.0f, 80.0f};
    const int32_t labels[ROWS] = {2, 1, 2, 3};
    float loss[ROWS], dz[ROWS * CLASSES], scratch[ROWS * CLASSES];
    CHECK_OK(be.ops->upload(be.ctx, NULL, dev.labels, labels, ROWS, CREW_DT_I32));
    CHECK_OK(be.ops->sync(be.ctx, NULL));
    xent_sum(&be, &dev, z, ROWS, CLASSES, loss, dz);
    int finite = 1;
    for (int i = 0; i < ROWS * CLASSES; i++) finite &= isfinite(dz[i]);
    for (int r = 0; r < ROWS; r++) finite &= isfinite(loss[r]);
    CHECK_MSG(finite, "softmax cross-entropy: non-finite loss or gradient with logits of +-80");
    CHECK_MSG(fabs(loss[1] - (160.0 + log1p(exp(-77.0)))) < 1e-4, "row loss %.9g, want 160", loss[1]);
    CHECK_MSG(fabs(loss[2] - log(2.0)) < 1e-6, "row loss %.9g, want log 2", loss[2]);
    int bad = 0;
    for (int i = 0; i < ROWS * CLASSES; i++) {
        float orig = z[i], up = orig + (float)H, dn = orig - (float)H;
        z[i] = up;
        double lp = xent_sum(&be, &dev, z, ROWS, CLASSES, loss, scratch);
        z[i] = dn;
        double lm = xent_sum(&be, &dev, z, ROWS, CLASSES, loss, scratch);
        z[i] = orig;
        double num = (lp - lm) / ((double)up - (double)dn);
        if (fabs(dz[i] - num) > ATOL + RTOL * fmax(fabs(dz[i]), fabs(num))) {
            bad++;
            fprintf(stderr, "softmax xent: dlogit %d analytic %.7g numeric %.7g\n", i, dz[i], num);
        }
    }
    CHECK(bad == 0);
    for (int i = 0; i < 4; i++) be.ops->free(be.ctx, buf[i]);
    crew_device_close(&be);
}

/* A softmax as the last layer (on its own or as dense's activation) is fused into the loss: it
 * is not among the computed layers, the loss sees raw logits, and gradients still check out. */
static void test_softmax_fused(void)
{
    const crew_layer_spec tail[2] = {{.type = CREW_LAYER_DENSE, .units = 3, .activation = CREW_ACT_SOFTMAX},
                                     {.type = CREW_LAYER_ACTIVATION, .activation = CREW_ACT_SOFTMAX}};
    for (int variant = 0; variant < 2; variant++) {
        gc_case c = {CASE(variant ? "softmax layer fused" : "dense(softmax) fused", 1, 3), .shape = {5},
                     .layers = {DENSE_ACT(4, CREW_ACT_TANH)}};
        if (variant) c.layers[1] = (crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 3};
        c.layers[1 + variant] = tail[variant];
        crew_model *m = build_case(&c);
        if (!m) continue;
        CHECK(m->n_layers == 4 && m->n_compute == 3 && crew_model_classes(m) == 3);
        crew_pass p = make_pass(m, c.rows, 0);
        CHECK_OK(crew_model_forward(m, &p)); /* the logits before the loss, which may write over them */
        float *logits = mv_download(m, m->act[m->n_compute], c.rows * 3);
        double mean = eval_loss(m, &p), want = 0.0;
        int32_t *labels = mv_labels(m, c.rows);
        for (int64_t r = 0; r < c.rows; r++) { /* cross-entropy of the raw logits, in double */
            const float *zr = logits + r * 3;
            double zmax = fmax(zr[0], fmax(zr[1], zr[2]));
            want += (log(exp(zr[0] - zmax) + exp(zr[1] - zmax) + exp(zr[2] - zmax)) + zmax - zr[labels[r]]) / 3.0;
        }
        free(logits);
        free(labels);
        CHECK_MSG(fabs(mean - want) < 1e-6, "%s: loss %.9g, want %.9g from the logits", c.name, mean, want);
        gradcheck_model(m, &p, &c);
        crew_model_free(m);
    }
    /* Anything after a softmax is refused: it could not be fused. */
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){5}, 1, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 3,
                                                  .activation = CREW_ACT_SOFTMAX}));
    CHECK_ERR(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 2}), "softmax");
    crew_model_free(m);
}

/* ------------------------------------------------------------------ whole model files */

/* The example models and Keras-produced files, loaded as a user would, with dropout active (its
 * mask fixed by seed, step and ids). A big net with relu and max pooling has kinks everywhere,
 * so a per-value difference quotient crosses some of them; instead the check is directional:
 * along a unit direction d over all parameters, (L(p + h·d) − L(p − h·d)) / 2h must equal g·d.
 * Each parameter then moves by ~h/√n, far too little to cross more than a handful of kinks, and
 * the signal stays large. Directions: d ∝ g (checks |g|), and d ∝ sign(g)·|g|·u with u uniform
 * in [0, 1] per value (weights every component differently, so an error in any large component
 * shows up), and the latter restricted to each tensor in turn (so no tensor hides behind another;
 * with a step of h/4 there, and h/2 along whole-model directions). Each difference is a
 * Richardson extrapolation of central differences at the step and half of it. */
static double directional_once(crew_model *m, const crew_pass *p, const float *d, double h)
{
    float *saved = mv_params(m), *moved = host_buf(m->n_params);
    for (int64_t i = 0; i < m->n_params; i++) moved[i] = saved[i] + (float)(h * d[i]);
    mv_upload(m, m->params, moved, m->n_params);
    double lp = eval_loss(m, p);
    for (int64_t i = 0; i < m->n_params; i++) moved[i] = saved[i] - (float)(h * d[i]);
    mv_upload(m, m->params, moved, m->n_params);
    double lm = eval_loss(m, p);
    mv_upload(m, m->params, saved, m->n_params);
    free(saved);
    free(moved);
    return (lp - lm) / (2.0 * h);
}

/* Richardson extrapolation of two central differences cancels their h² truncation term, which
 * the curvature of a whole net (and of batch norm over few rows) makes large. */
static double directional(crew_model *m, const crew_pass *p, const float *d, double h)
{
    return (4.0 * directional_once(m, p, d, h / 2) - directional_once(m, p, d, h)) / 3.0;
}

/* Normalises d over [lo, hi) (zero elsewhere) and returns g·d. */
static double unit_direction(float *d, const float *g, int64_t n, int64_t lo, int64_t hi)
{
    double norm = 0.0, dot = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (i < lo || i >= hi) d[i] = 0.0f;
        norm += (double)d[i] * d[i];
    }
    norm = sqrt(norm);
    for (int64_t i = 0; i < n; i++) {
        d[i] = norm > 0 ? (float)(d[i] / norm) : 0.0f;
        dot += (double)g[i] * d[i];
    }
    return dot;
}

static void check_direction(crew_model *m, const crew_pass *p, const float *g, float *d, int64_t lo, int64_t hi,
                            double h, const char *name, const char *what, double *worst)
{
    double a = unit_direction(d, g, m->n_params, lo, hi);
    if (a == 0.0) return;
    double n = directional(m, p, d, h);
    double ratio = fabs(a - n) / (ATOL + RTOL * fmax(fabs(a), fabs(n)));
    *worst = fmax(*worst, ratio);
    CHECK_MSG(ratio <= 1.0, "%s: along %s: analytic %.7g, numeric %.7g", name, what, a, n);
}

static void check_file_model(crew_model *m, const crew_pass *p, const char *name)
{
    float *g = host_buf(m->n_params), *d = host_buf(m->n_params);
    double worst = 0.0;
    int directions = 0;
    crew_rng r = crew_rng_make(SEED + 5);
    if (analytic_grads(m, p, g)) {
        memcpy(d, g, (size_t)m->n_params * sizeof(float));
        check_direction(m, p, g, d, 0, m->n_params, H / 2, name, "the gradient", &worst);
        for (int k = 0; k < 2; k++) {
            for (int64_t i = 0; i < m->n_params; i++) d[i] = g[i] * crew_rng_next_uniform(&r);
            check_direction(m, p, g, d, 0, m->n_params, H / 2, name, "a randomly weighted gradient", &worst);
        }
        directions = 3;
        for (int i = 0; i < m->n_compute; i++)
            for (int j = 0; j < m->layers[i]->n_params; j++) {
                const crew_param *t = &m->layers[i]->params[j];
                /* Confined to a few values (a bias, a gamma), a direction moves each of them far
                 * enough to shift thousands of relu inputs across zero at once; those tensors are
                 * covered by the per-layer cases above and the PyTorch reference test. */
                if (!t->trainable || crew_shape_size(&t->shape) < 256) continue;
                char what[160];
                snprintf(what, sizeof what, "%s.%s alone", m->layers[i]->name, t->name);
                for (int64_t q = 0; q < m->n_params; q++) d[q] = g[q] * crew_rng_next_uniform(&r);
                /* A small tensor moves each of its values further: a shorter step keeps off kinks. */
                check_direction(m, p, g, d, t->offset, t->offset + crew_shape_size(&t->shape), H / 4, name, what,
                                &worst);
                directions++;
            }
    }
    printf("%-34s %3d directions  %.2f of the tolerance\n", name, directions, worst);
    free(g);
    free(d);
}

static void test_model_files(void)
{
    static const char *files[] = {"../examples/fashion_mlp.json", "../examples/fashion_cnn.json",
                                  "fixtures/keras/fashion_mlp.json", "fixtures/keras/small_cnn.json",
                                  "fixtures/keras/token_model.json"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        crew_model *m = NULL;
        CHECK_OK(crew_model_load_file(files[f], &m));
        if (!m) continue;
        gc_case c = {.name = files[f], .rows = 8, .training = 1};
        c.ndim = m->input.ndim;
        for (int i = 0; i < c.ndim; i++) c.shape[i] = m->input.dim[i];
        if (m->layers[0]->spec.type == CREW_LAYER_EMBEDDING) {
            c.input = INPUT_IDS;
            c.vocab = m->layers[0]->spec.vocab;
        }
        CHECK_OK(crew_model_init_params(m, SEED));
        CHECK_OK(crew_model_reserve(m, c.rows));
        jitter_params(m, SEED + f, 0.0f);
        fill_input(m, &c, SEED + 100 + f);
        crew_pass p = make_pass(m, c.rows, 1);
        check_file_model(m, &p, files[f]);
        crew_model_free(m);
    }
}

int main(void)
{
    for (int i = 0; i < 64; i++) sample_ids[i] = 1000 + 7 * i;
    test_model_files();
    test_layers();
    test_embedding_rows();
    test_gpt_tied();
    test_batch_norm_moving_stats();
    test_dropout_mask();
    test_dropout_batch_split();
    test_softmax_xent();
    test_softmax_fused();
    return check_report();
}
