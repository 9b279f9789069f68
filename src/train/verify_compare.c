/* verify_compare.c — crew verify's comparisons: bitwise equality of two runs, the first-step
 * check against float32 summation's bound, and the full-batch trajectory against the rounding
 * reference.
 *
 * The first-step bound. At step 1 every run starts from the same weights, so the loss and the
 * gradient of (a), (b), (d) and (c) are, in exact arithmetic, the same sums of the same per-sample
 * terms: a sample's forward and backward pass do not depend on which other samples share its
 * micro-batch (batch norm aside, whose statistics are themselves such sums). Only the order, and
 * the grouping, of the sums over samples differ. Float32 summation of n terms in any order is
 * within γ(n)·Σ|t| of the exact sum, γ(n) = n·u/(1 − n·u) ≈ n·u with u = 2^-24 (Higham, Accuracy
 * and Stability of Numerical Algorithms, §4.2), so two orders are within 2·n·u·Σ|t| of each other.
 * For a parameter, n is the global batch times the positions of the layer's output that share it
 * (one for a dense layer on vectors, H×W for a convolution); for the loss, the global batch. Σ|t|
 * is not known without the terms, so it is estimated by the largest gradient value S of the
 * layer: the terms of a gradient that cancels to nothing (a bias before batch norm, whose exact
 * gradient is zero) are those of its neighbours, the layer's kernel. The bound is
 * FIRST_STEP_FACTOR·u·n·S per tensor, the largest difference of the tensor, and
 * FIRST_STEP_FACTOR·u·n·|loss| for the loss.
 *
 * FIRST_STEP_FACTOR, measured on a correct build (the two example models, a batch-norm CNN and
 * the two Keras fixtures, N = 2, 4, 8, per-device batches 8 to 64: 60 runs, step 1): the largest
 * difference over u·n·S was 0.74 (the last dense kernel of the batch-norm CNN at a global batch of
 * 16, against the reference of other blocks, 4 replicas of 4 samples: a short sum that cancels,
 * so Σ|t| is several S), the median 0.06; the bugs the check exists for move a gradient by 1e-2
 * to 1 of S, 10^3 to 10^7 times u·n. 8 is the worst case 2·n·u·Σ|t| for Σ|t| up to 4 S, and keeps
 * a margin of 10 over the largest rounding seen. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "train/verify.h"

#define UNIT_ROUNDOFF (1.0 / 16777216.0) /* u = 2^-24, float32 */
#define FIRST_STEP_FACTOR 8.0
#define ROUNDING_FACTOR 30.0
#define OTHER_BLOCKS_FACTOR 10.0

void crew_verify_values_free(crew_verify_values *v)
{
    crew_model_free(v->m);
    free(v->first_grads);
    free(v->moments);
    memset(v, 0, sizeof *v);
}

/* A model's values, downloaded: the comparisons run on the host. */
typedef struct host_values {
    float *params;  /* [n_params] */
    float *state;   /* [n_state] */
} host_values;

static void host_values_free(host_values *h)
{
    free(h->params);
    free(h->state);
    h->params = h->state = NULL;
}

static crew_status host_values_of(const crew_model *m, host_values *h)
{
    h->params = malloc((size_t)(m->n_params > 0 ? m->n_params : 1) * sizeof(float));
    h->state = malloc((size_t)(m->n_state > 0 ? m->n_state : 1) * sizeof(float));
    crew_status s = h->params && h->state ? CREW_OK : CREW_OOM();
    if (!s) s = crew_dev_download_f32(&m->be, h->params, m->params, m->n_params);
    if (!s) s = crew_dev_download_f32(&m->be, h->state, m->state, m->n_state);
    if (s) host_values_free(h);
    return s;
}

/* The host copy of one tensor. */
static const float *tensor(const host_values *h, const crew_param *p)
{
    return (p->trainable ? h->params : h->state) + p->offset;
}

/* max|a − b| over n values; infinite where a value is not finite on one side only. */
static double max_abs_diff(const float *a, const float *b, int64_t n)
{
    double diff = 0.0;
    for (int64_t k = 0; k < n; k++) {
        double d = fabs((double)a[k] - (double)b[k]);
        if (d != d && memcmp(&a[k], &b[k], sizeof(float)) != 0) return INFINITY; /* NaN */
        diff = d > diff ? d : diff;
    }
    return diff;
}

static double max_abs(const float *a, int64_t n)
{
    double m = 0.0;
    for (int64_t k = 0; k < n; k++) m = fabs((double)a[k]) > m ? fabs((double)a[k]) : m;
    return m;
}

/* max|a − b| / max|b| over one tensor of n values. */
static double tensor_rel_diff(const float *a, const float *b, int64_t n)
{
    double diff = max_abs_diff(a, b, n), scale = max_abs(b, n);
    double rel = scale > 0.0 ? diff / scale : diff;
    return rel == rel ? rel : INFINITY; /* inf / inf */
}

crew_status crew_verify_compare(const crew_verify_values *a, const crew_verify_values *b, int with_state, int *equal,
                                double *max_rel)
{
    const crew_model *m = a->m;
    host_values ha = {0}, hb = {0};
    crew_status s = host_values_of(a->m, &ha);
    if (!s) s = host_values_of(b->m, &hb);
    if (s) goto done;
    size_t n = (size_t)m->n_params;
    *equal = memcmp(ha.params, hb.params, n * sizeof(float)) == 0 &&
             memcmp(a->moments, b->moments, 2 * n * sizeof(float)) == 0 &&
             (!with_state || memcmp(ha.state, hb.state, (size_t)m->n_state * sizeof(float)) == 0);
    *max_rel = 0.0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *p = &m->layers[i]->params[j];
            if ((!p->trainable && !with_state) || !crew_param_owned(p)) continue;
            double rel = tensor_rel_diff(tensor(&ha, p), tensor(&hb, p), crew_shape_size(&p->shape));
            *max_rel = rel > *max_rel ? rel : *max_rel;
        }
    /* The moments as a whole: equal parameters with different moments would diverge later. */
    for (int i = 0; i < 2; i++) {
        double rel = tensor_rel_diff(a->moments + i * n, b->moments + i * n, (int64_t)n);
        *max_rel = rel > *max_rel ? rel : *max_rel;
    }
done:
    host_values_free(&ha);
    host_values_free(&hb);
    return s;
}

/* Terms per sample that share one value of layer l's parameters: the positions of its output
 * (1 for a dense layer on vectors, H × W for a convolution, the sequence for an embedding). */
static int64_t positions_per_sample(const crew_layer *l)
{
    int64_t c = l->out.ndim > 0 ? l->out.dim[l->out.ndim - 1] : 1;
    return c > 0 ? crew_shape_size(&l->out) / c : 1;
}

/* Records a difference against its bound; returns 1 when it is within. */
static int first_step_record(double diff, double bound, const char *label, const char *what, crew_verify_result *res)
{
    double ratio = diff == 0.0 ? 0.0 : bound > 0.0 ? diff / bound : INFINITY;
    if (ratio != ratio) ratio = INFINITY;
    if (ratio > res->first_step_ratio || !res->first_step_decided_by[0]) {
        res->first_step_ratio = ratio;
        res->first_step_diff = diff;
        res->first_step_allowed = bound;
        snprintf(res->first_step_decided_by, sizeof res->first_step_decided_by, "%s: %s", label, what);
    }
    return ratio <= 1.0;
}

/* S: layer l's largest gradient value. */
static double layer_scale(const crew_layer *l, const float *grads)
{
    double scale = 0.0;
    for (int j = 0; j < l->n_params; j++)
        if (l->params[j].trainable) {
            double s = max_abs(grads + l->params[j].offset, crew_shape_size(&l->params[j].shape));
            scale = s > scale ? s : scale;
        }
    return scale;
}

/* The first-step bound of layer l's gradient values, for a global batch of g. */
static double rounding_bound(const crew_layer *l, const float *grads, int64_t g)
{
    return FIRST_STEP_FACTOR * UNIT_ROUNDOFF * (double)g * (double)positions_per_sample(l) * layer_scale(l, grads);
}

int crew_verify_first_step(const crew_verify_values *x, const crew_verify_values *c, int64_t g, const char *label,
                           crew_verify_result *res)
{
    const crew_model *m = c->m;
    const double u = UNIT_ROUNDOFF;
    double loss_diff = fabs((double)x->first_loss - (double)c->first_loss);
    if (loss_diff != loss_diff) loss_diff = INFINITY;
    int ok = first_step_record(loss_diff, FIRST_STEP_FACTOR * u * (double)g * fabs((double)c->first_loss), label,
                               "loss", res);
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        const double bound = rounding_bound(l, c->first_grads, g);
        for (int j = 0; j < l->n_params; j++) {
            const crew_param *p = &l->params[j];
            if (!p->trainable || !crew_param_owned(p)) continue;
            double diff = max_abs_diff(x->first_grads + p->offset, c->first_grads + p->offset, crew_shape_size(&p->shape));
            char what[160];
            snprintf(what, sizeof what, "%.100s.%.40s", l->name, p->name);
            ok &= first_step_record(diff, bound, label, what, res);
        }
    }
    return ok;
}

/* One tensor's differences from (c): of (a), and of each reference (0 where it did not run). */
typedef struct tensor_spreads {
    double a, d, e, g, h;
} tensor_spreads;

/* The rounding references' values, each NULL where it did not run (crew_verify_judge). */
typedef struct references {
    const host_values *d, *e, *g, *h;
} references;

static tensor_spreads spreads_of(const crew_param *q, const host_values *a, const host_values *c, const references *r)
{
    const int64_t n = crew_shape_size(&q->shape);
    tensor_spreads t = {tensor_rel_diff(tensor(a, q), tensor(c, q), n), 0, 0, 0, 0};
    if (r->d) t.d = tensor_rel_diff(tensor(c, q), tensor(r->d, q), n);
    if (r->e) t.e = tensor_rel_diff(tensor(c, q), tensor(r->e, q), n);
    if (r->g) t.g = tensor_rel_diff(tensor(c, q), tensor(r->g, q), n);
    if (r->h) t.h = tensor_rel_diff(tensor(c, q), tensor(r->h, q), n);
    return t;
}

/* (e) against the references a bug in the replicas cannot move: each tensor's (e) spread within
 * OTHER_BLOCKS_FACTOR times the largest of theirs over the model's tensors, at least tolerance /
 * ROUNDING_FACTOR (below which it widens no bound). The whole model's largest, not the tensor's
 * own: a tensor whose gradient is rounding noise (a bias before batch norm, under Adam) wanders
 * at random in every run, and one run's figure for it may be a tenth of another's. */
static void judge_other_blocks(const crew_model *m, const host_values *a, const host_values *c, const references *r,
                               crew_verify_result *res)
{
    res->other_blocks_ok = 1;
    res->immune_spread = res->other_blocks_diff = res->other_blocks_allowed = 0.0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m->n_layers; i++)
            for (int j = 0; j < m->layers[i]->n_params; j++) {
                const crew_param *q = &m->layers[i]->params[j];
                if (!crew_param_owned(q)) continue;
                tensor_spreads t = spreads_of(q, a, c, r);
                if (pass == 0) { /* the immune references' largest */
                    double immune = t.g > t.d ? t.g : t.d;
                    if (immune > res->immune_spread) res->immune_spread = immune;
                    continue;
                }
                double allowed = OTHER_BLOCKS_FACTOR * res->immune_spread, floor = res->tolerance / ROUNDING_FACTOR;
                if (allowed < floor) allowed = floor;
                if (res->other_blocks_decided_by[0] && t.e / allowed <= res->other_blocks_diff / res->other_blocks_allowed)
                    continue;
                res->other_blocks_diff = t.e;
                res->other_blocks_allowed = allowed;
                snprintf(res->other_blocks_decided_by, sizeof res->other_blocks_decided_by, "%.100s.%.40s",
                         m->layers[i]->name, q->name);
            }
    res->other_blocks_ok = res->other_blocks_diff <= res->other_blocks_allowed;
    /* (g) an exact stand-in for (e): every parameter and state value the same bits (where each
     * layer's sums over the batch take the blocks as replicas do: dense layers; not convolutions,
     * which sum over output positions, nor a GPT's rows of tokens) */
    res->other_blocks_exact =
        memcmp(r->e->params, r->g->params, (size_t)m->n_params * sizeof *r->e->params) == 0 &&
        (!m->n_state || memcmp(r->e->state, r->g->state, (size_t)m->n_state * sizeof *r->e->state) == 0);
}

static void judge(const crew_model *m, const host_values *a, const host_values *c, const references *r,
                  crew_verify_result *res)
{
    double worst_ratio = -1.0;
    res->max_rel_diff_full_batch = res->rounding_spread = 0.0;
    if (r->e && r->g) judge_other_blocks(m, a, c, r, res);
    /* (h) an exact stand-in for (a), as (g) for (e) */
    res->own_blocks_exact = r->h && memcmp(a->params, r->h->params, (size_t)m->n_params * sizeof *a->params) == 0 &&
                            (!m->n_state || memcmp(a->state, r->h->state, (size_t)m->n_state * sizeof *a->state) == 0);
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *q = &m->layers[i]->params[j];
            if (!crew_param_owned(q)) continue;
            tensor_spreads t = spreads_of(q, a, c, r);
            double spread = t.d;
            if (t.e > spread) spread = t.e;
            if (t.g > spread) spread = t.g;
            if (t.h > spread) spread = t.h;
            double bound = res->tolerance > ROUNDING_FACTOR * spread ? res->tolerance : ROUNDING_FACTOR * spread;
            if (t.a > res->max_rel_diff_full_batch) res->max_rel_diff_full_batch = t.a;
            if (spread > res->rounding_spread) res->rounding_spread = spread;
            if (t.a / bound > worst_ratio) {
                worst_ratio = t.a / bound;
                res->decided_by_diff = t.a;
                res->decided_by_spread = spread;
                res->allowed = bound;
                snprintf(res->decided_by, sizeof res->decided_by, "%.100s.%.40s", m->layers[i]->name, q->name);
            }
        }
    res->full_batch_ok = worst_ratio <= 1.0;
}

crew_status crew_verify_judge(const crew_model *a, const crew_model *c, const crew_model *d, const crew_model *e,
                              const crew_model *g, const crew_model *h, crew_verify_result *res)
{
    host_values ha = {0}, hc = {0}, hd = {0}, he = {0}, hg = {0}, hh = {0};
    crew_status s = host_values_of(a, &ha);
    if (!s) s = host_values_of(c, &hc);
    if (!s && d) s = host_values_of(d, &hd);
    if (!s && e) s = host_values_of(e, &he);
    if (!s && g) s = host_values_of(g, &hg);
    if (!s && h) s = host_values_of(h, &hh);
    const references r = {d ? &hd : NULL, e ? &he : NULL, g ? &hg : NULL, h ? &hh : NULL};
    if (!s) judge(a, &ha, &hc, &r, res);
    host_values_free(&ha);
    host_values_free(&hc);
    host_values_free(&hd);
    host_values_free(&he);
    host_values_free(&hg);
    host_values_free(&hh);
    return s;
}
