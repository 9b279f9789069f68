/* verify.c — N replicas against one replica, three ways (see crew_model_verify in crew.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "train/train.h"

#define DEFAULT_TOLERANCE 1e-3

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

/* max over tensors of max|a − b| / max|b|; *equal = every value bitwise the same. */
static double compare(const crew_model *a, const crew_model *b, int *equal)
{
    double worst = 0.0;
    *equal = memcmp(a->params, b->params, (size_t)a->n_params * sizeof(float)) == 0 &&
             memcmp(a->state, b->state, (size_t)a->n_state * sizeof(float)) == 0;
    for (int i = 0; i < a->n_layers; i++)
        for (int j = 0; j < a->layers[i]->n_params; j++) {
            const crew_param *pa = &a->layers[i]->params[j], *pb = &b->layers[i]->params[j];
            int64_t n = crew_shape_size(&pa->shape);
            double diff = 0.0, scale = 0.0;
            for (int64_t k = 0; k < n; k++) {
                double d = fabs((double)pa->value[k] - (double)pb->value[k]);
                diff = d > diff ? d : diff;
                scale = fabs((double)pb->value[k]) > scale ? fabs((double)pb->value[k]) : scale;
            }
            double rel = scale > 0.0 ? diff / scale : diff;
            worst = rel > worst ? rel : worst;
        }
    return worst;
}

static crew_status run_one(const crew_model *tmpl, const crew_dataset *train, const crew_fit_options *base,
                           int devices, int64_t batch, loss_log *log, crew_model **out)
{
    crew_model *m;
    CREW_TRY(crew_model_clone(tmpl, &m));
    m->compile = tmpl->compile;
    crew_fit_options o = *base;
    o.devices = devices;
    o.batch_per_device = batch;
    o.on_step = log_step;
    o.user = log;
    crew_fit_result r;
    crew_status s = crew_model_compile(m, &m->compile);
    if (!s) s = crew_model_fit(m, train, &o, &r);
    if (s) {
        crew_model_free(m);
        return s;
    }
    *out = m;
    return CREW_OK;
}

crew_status crew_model_verify(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                              crew_verify_result *res)
{
    if (!m || !train || !opts || !res) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_verify: NULL argument");
    float *losses = res->losses;
    memset(res, 0, sizeof *res);
    res->losses = losses;
    crew_fit_options base;
    crew_model_default_fit(m, &base);
    int n = opts->devices > 0 ? opts->devices : 2;
    if (opts->batch_per_device > 0) base.batch_per_device = opts->batch_per_device;
    if (opts->seed) base.seed = opts->seed;
    base.max_steps = opts->steps > 0 ? opts->steps : 20;
    base.epochs = 1000000;
    base.global_batch = opts->global_batch > 0 ? opts->global_batch : n * base.batch_per_device;
    base.devices = n;
    if (!m->compiled) {
        crew_compile_options c;
        crew_model_default_compile(m, &c);
        CREW_TRY(crew_model_compile(m, &c));
    }
    crew_fit_plan plan;
    CREW_TRY(crew_model_plan_fit(m, train, &base, &plan)); /* checks the combination once, up front */
    if (!m->initialized) CREW_TRY(crew_model_init_params(m, base.seed));
    res->devices = n;
    res->steps = plan.total_steps;
    res->global_batch = plan.global_batch;
    res->tolerance = opts->tolerance > 0 ? opts->tolerance : DEFAULT_TOLERANCE;

    crew_model *a = NULL, *b = NULL, *c = NULL;
    loss_log la = {losses, res->steps, 0}, lb = {losses, res->steps, 1}, lc = {losses, res->steps, 2};
    crew_status s = run_one(m, train, &base, n, base.batch_per_device, &la, &a);
    if (!s) s = run_one(m, train, &base, 1, base.batch_per_device, &lb, &b);
    if (!s) s = run_one(m, train, &base, 1, plan.global_batch, &lc, &c);
    if (!s) {
        int equal_b, equal_c;
        res->max_rel_diff_accum = compare(a, b, &equal_b);
        res->max_rel_diff_full_batch = compare(a, c, &equal_c);
        res->bitwise_equal = equal_b;
        res->pass = equal_b && res->max_rel_diff_full_batch <= res->tolerance;
    }
    crew_model_free(a);
    crew_model_free(b);
    crew_model_free(c);
    return s;
}
