/* verify.c — N replicas against one replica, three ways (see crew_model_verify in crew.h).
 *
 * Why the full-batch comparison is judged against a rounding reference. (a) and (c) differ only in
 * the order of float sums, but training amplifies such differences, and Adam-type optimizers most
 * of all: they divide each gradient by its own running magnitude, so a weight whose gradient is
 * nearly zero (the sum of terms that cancel) moves by up to the learning rate in a direction that
 * rounding decides. After 20 steps of the example CNN the largest relative difference of a tensor
 * ranged from 4e-5 to 5e-2 depending only on the batch size, so a fixed tolerance passed or failed
 * by luck; a bias before batch norm, whose gradient is zero but for rounding, differs by 100% of
 * its own tiny scale. (d), run (c) again with each batch's samples in reverse order (the same
 * mathematics, another order of every sum over samples), measures what rounding alone does to
 * this run, tensor by tensor, and each tensor is held to its own bound: max(tolerance,
 * ROUNDING_FACTOR × its (c)-(d) difference), so a tensor of pure rounding noise excuses only
 * itself. A real error (a micro-batch missing or counted twice, a wrong average) moves weights by
 * O(1e-2) to O(1) of their scale from the first step on, far beyond it.
 *
 * The factor, measured: both example models, N = 2, 4, 8, per-device batches 16, 32, 64, 20 steps:
 * 126 tensor comparisons. The ratio of (a)-(c) to (c)-(d) has a median of 0.86 and a 90th
 * percentile of 2.6, but a long tail (171 on a tensor whose differences were both under 1e-5);
 * where (a)-(c) exceeded the 1e-3 floor, the largest ratio was 11.2 (a conv bias, N = 8, batch
 * 16): one reversed run is a noisy estimate of another order's rounding. Hence 30. (A first
 * version nudged the weights by one ulp instead: that moves the values but keeps every order of
 * summation, so it underestimated the noise of sums that cancel, and a Keras batch-norm model
 * failed.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "core/status.h"
#include "train/hooks.h"
#include "train/train.h"

#define DEFAULT_TOLERANCE 1e-3
#define ROUNDING_FACTOR 30.0

typedef struct loss_log {
    float *losses;  /* [steps × 3] */
    int64_t steps;
    int column;
} loss_log;

static void log_step(void *user, const crew_step_info *info)
{
    loss_log *l = user;
    if (l->losses && info->step >= 1 && info->step <= l->steps) l->losses[(info->step - 1) * 3 + l->column] = info->loss;
}

/* A model's values, downloaded: the comparisons below run on the host. */
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

/* max|a − b| / max|b| over one tensor of n values; infinite where a value is not finite on one
 * side only. */
static double tensor_rel_diff(const float *a, const float *b, int64_t n)
{
    double diff = 0.0, scale = 0.0;
    for (int64_t k = 0; k < n; k++) {
        double d = fabs((double)a[k] - (double)b[k]);
        if (d != d && memcmp(&a[k], &b[k], sizeof(float)) != 0) return INFINITY; /* NaN */
        diff = d > diff ? d : diff;
        scale = fabs((double)b[k]) > scale ? fabs((double)b[k]) : scale;
    }
    double rel = scale > 0.0 ? diff / scale : diff;
    return rel == rel ? rel : INFINITY; /* inf / inf */
}

/* max over tensors of tensor_rel_diff; *equal = every value bitwise the same. */
static double compare(const crew_model *m, const host_values *a, const host_values *b, int *equal)
{
    double worst = 0.0;
    *equal = memcmp(a->params, b->params, (size_t)m->n_params * sizeof(float)) == 0 &&
             memcmp(a->state, b->state, (size_t)m->n_state * sizeof(float)) == 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *p = &m->layers[i]->params[j];
            double rel = tensor_rel_diff(tensor(a, p), tensor(b, p), crew_shape_size(&p->shape));
            worst = rel > worst ? rel : worst;
        }
    return worst;
}

static void judge(const crew_model *m, const host_values *a, const host_values *c, const host_values *d,
                  crew_verify_result *res)
{
    double worst_ratio = -1.0;
    res->max_rel_diff_full_batch = res->rounding_spread = 0.0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *p = &m->layers[i]->params[j];
            int64_t n = crew_shape_size(&p->shape);
            double diff = tensor_rel_diff(tensor(a, p), tensor(c, p), n);
            double spread = d ? tensor_rel_diff(tensor(c, p), tensor(d, p), n) : 0.0;
            double bound = res->tolerance > ROUNDING_FACTOR * spread ? res->tolerance : ROUNDING_FACTOR * spread;
            if (diff > res->max_rel_diff_full_batch) res->max_rel_diff_full_batch = diff;
            if (spread > res->rounding_spread) res->rounding_spread = spread;
            if (diff / bound > worst_ratio) {
                worst_ratio = diff / bound;
                res->decided_by_diff = diff;
                res->decided_by_spread = spread;
                res->allowed = bound;
                snprintf(res->decided_by, sizeof res->decided_by, "%s.%s", m->layers[i]->name, p->name);
            }
        }
    res->full_batch_ok = worst_ratio <= 1.0;
}

crew_status crew_verify_judge(const crew_model *a, const crew_model *c, const crew_model *d, crew_verify_result *res)
{
    host_values ha = {0}, hc = {0}, hd = {0};
    crew_status s = host_values_of(a, &ha);
    if (!s) s = host_values_of(c, &hc);
    if (!s && d) s = host_values_of(d, &hd);
    if (!s) judge(a, &ha, &hc, d ? &hd : NULL, res);
    host_values_free(&ha);
    host_values_free(&hc);
    host_values_free(&hd);
    return s;
}

static crew_status run_one(const crew_model *tmpl, const crew_dataset *train, const crew_fit_options *base,
                           int devices, int64_t batch, int reverse_rows, loss_log *log, crew_model **out)
{
    crew_model *m;
    CREW_TRY(crew_model_clone(tmpl, NULL, &m));
    crew_fit_options o = *base;
    o.devices = devices;
    o.batch_per_device = batch;
    o.on_step = log_step;
    o.user = log;
    crew_fit *f = NULL;
    crew_fit_result r;
    crew_status s = crew_fit_prepare(m, train, &o, &f);
    if (!s) {
        crew_fit_hooks_of(f)->reverse_batch_rows = reverse_rows;
        s = crew_fit_run(f, &r);
    }
    crew_fit_free(f);
    if (s) {
        crew_model_free(m);
        return s;
    }
    *out = m;
    return CREW_OK;
}

/* (d): the full-batch run again with each batch's samples in reverse order. */
static crew_status rounding_run(const crew_model *tmpl, const crew_dataset *train, const crew_fit_options *base,
                                int64_t global_batch, crew_model **d)
{
    loss_log none = {NULL, 0, 0};
    return run_one(tmpl, train, base, 1, global_batch, 1, &none, d);
}

void crew_verify_options_init(crew_verify_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
}

static int has_batch_norm(const crew_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i]->spec.type == CREW_LAYER_BATCH_NORM) return 1;
    return 0;
}

crew_status crew_model_verify(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                              crew_verify_result *res)
{
    if (!m || !train || !opts || !res) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_verify: NULL argument");
    float *losses = res->losses;
    memset(res, 0, sizeof *res);
    res->losses = losses;
    crew_verify_options given;
    crew_verify_options_init(&given);
    CREW_TRY(crew_options_take(&given, sizeof given, opts, "crew_verify_options"));
    opts = &given;
    crew_fit_options base;
    crew_model_default_fit(m, &base);
    if (opts->device_kind) base.device_kind = opts->device_kind;
    int n = opts->devices > 0 ? opts->devices : 2;
    if (opts->batch_per_device > 0) base.batch_per_device = opts->batch_per_device;
    if (opts->seed) base.seed = opts->seed;
    base.max_steps = opts->steps > 0 ? opts->steps : 20;
    base.epochs = 1000000;
    const int processes = crew_group_size(opts->group), lead = crew_group_rank(opts->group) == 0;
    const int total = n * processes; /* N: (a)'s replicas over every process */
    base.global_batch = opts->global_batch > 0 ? opts->global_batch : total * base.batch_per_device;
    base.devices = total;
    if (!m->compiled) {
        crew_compile_options c;
        crew_model_default_compile(m, &c);
        CREW_TRY(crew_model_compile(m, &c));
    }
    crew_fit_plan plan;
    CREW_TRY(crew_model_plan_fit(m, train, &base, &plan)); /* checks the combination once, up front */
    if (!m->initialized) CREW_TRY(crew_model_init_params(m, base.seed));
    res->devices = total;
    res->steps = plan.total_steps;
    res->global_batch = plan.global_batch;
    res->tolerance = opts->tolerance > 0 ? opts->tolerance : DEFAULT_TOLERANCE;
    res->fixed_tolerance = opts->tolerance > 0;
    res->batch_norm_synced = total > 1 && has_batch_norm(m);

    crew_model *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    loss_log la = {losses, res->steps, 0}, lb = {losses, res->steps, 1}, lc = {losses, res->steps, 2};
    crew_fit_options across = base; /* (a): this process's n replicas of the run's N */
    across.group = opts->group;
    crew_status s = run_one(m, train, &across, n, base.batch_per_device, 0, &la, &a);
    if (!s && !lead) { /* the references and the verdict are process 0's */
        res->pass = 1;
        crew_model_free(a);
        return CREW_OK;
    }
    if (!s) s = run_one(m, train, &base, 1, base.batch_per_device, 0, &lb, &b);
    if (!s) s = run_one(m, train, &base, 1, plan.global_batch, 0, &lc, &c);
    if (!s && !res->fixed_tolerance) s = rounding_run(m, train, &base, plan.global_batch, &d);
    host_values ha = {0}, hb = {0};
    if (!s) s = host_values_of(a, &ha);
    if (!s) s = host_values_of(b, &hb);
    if (!s) res->max_rel_diff_accum = compare(a, &ha, &hb, &res->bitwise_equal);
    host_values_free(&ha);
    host_values_free(&hb);
    if (!s) s = crew_verify_judge(a, c, d, res);
    if (!s) res->pass = (res->bitwise_equal || res->batch_norm_synced) && res->full_batch_ok;
    crew_model_free(d);
    crew_model_free(a);
    crew_model_free(b);
    crew_model_free(c);
    return s;
}
