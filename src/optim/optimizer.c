/* optimizer.c — SGD (momentum, Nesterov), AdamW, and the layer-wise LAMB and LARS over the flat
 * buffers; clipping by global norm; the learning-rate schedules (constant, step, cosine) with
 * linear warmup. */
#include "optim/optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

const char *crew_optimizer_name(crew_optimizer_type type)
{
    switch (type) {
    case CREW_OPT_SGD: return "sgd";
    case CREW_OPT_ADAMW: return "adamw";
    case CREW_OPT_LAMB: return "lamb";
    case CREW_OPT_LARS: return "lars";
    }
    return "unknown";
}

int crew_optimizer_layerwise(const crew_optimizer_spec *spec)
{
    return spec->type == CREW_OPT_LAMB || spec->type == CREW_OPT_LARS;
}

crew_status crew_optimizer_spec_check(crew_optimizer_spec *s)
{
    if (s->type < CREW_OPT_SGD || s->type > CREW_OPT_LARS)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: unknown type %d", (int)s->type);
    if (s->type == CREW_OPT_ADAMW || s->type == CREW_OPT_LAMB) {
        if (s->beta1 == 0.0) s->beta1 = 0.9;
        if (s->beta2 == 0.0) s->beta2 = 0.999;
        if (s->eps == 0.0f) s->eps = s->type == CREW_OPT_LAMB ? 1e-6f : 1e-8f;
    }
    if (s->type == CREW_OPT_LARS && s->trust == 0.0f) s->trust = 1e-3f;
    if (!(s->trust >= 0.0f && isfinite(s->trust)))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'trust' must be positive, got %g", (double)s->trust);
    if (!(s->lr > 0.0f && isfinite(s->lr)))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'lr' must be positive, got %g", (double)s->lr);
    if (!(s->momentum >= 0.0f && s->momentum < 1.0f))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'momentum' must be in [0, 1), got %g",
                           (double)s->momentum);
    if (s->nesterov && s->momentum == 0.0f)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'nesterov' needs a momentum above 0");
    if (!(s->beta1 >= 0.0 && s->beta1 < 1.0) || !(s->beta2 >= 0.0 && s->beta2 < 1.0))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: keys 'beta1' and 'beta2' must be in [0, 1)");
    if (!(s->eps >= 0.0f)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'eps' must be >= 0");
    if (!(s->weight_decay >= 0.0f))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'weight_decay' must be >= 0, got %g",
                           (double)s->weight_decay);
    if (!(s->clip_norm >= 0.0f))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'clip_norm' must be >= 0, got %g",
                           (double)s->clip_norm);
    if (s->warmup_steps < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "schedule: key 'warmup_steps' must be >= 0");
    if (s->base_batch < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: key 'base_batch' must be >= 0");
    switch (s->schedule) {
    case CREW_SCHED_CONSTANT: break;
    case CREW_SCHED_STEP:
        if (s->step_size <= 0)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "schedule: key 'step_size' must be a positive integer");
        if (s->gamma == 0.0f) s->gamma = 0.1f;
        if (!(s->gamma > 0.0f && s->gamma <= 1.0f))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "schedule: key 'gamma' must be in (0, 1]");
        break;
    case CREW_SCHED_COSINE:
        if (!(s->min_lr >= 0.0f && s->min_lr <= s->lr))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "schedule: key 'min_lr' must be in [0, lr]");
        break;
    default: return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "schedule: unknown type %d", (int)s->schedule);
    }
    if (s->scaling < CREW_SCALE_NONE || s->scaling > CREW_SCALE_SQRT)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "optimizer: unknown lr scaling rule %d", (int)s->scaling);
    return CREW_OK;
}

int crew_optimizer_slots(const crew_optimizer_spec *spec)
{
    return spec->type == CREW_OPT_ADAMW || spec->type == CREW_OPT_LAMB ? 2 : spec->momentum > 0.0f ? 1 : 0;
}

crew_status crew_optimizer_set_tensors(crew_optimizer *opt, const int64_t *bounds, int n)
{
    free(opt->bounds);
    opt->n_tensors = 0;
    if (!(opt->bounds = malloc(((size_t)n + 1) * sizeof *opt->bounds))) return CREW_OOM();
    memcpy(opt->bounds, bounds, ((size_t)n + 1) * sizeof *bounds);
    opt->n_tensors = n;
    return CREW_OK;
}

crew_status crew_optimizer_init(crew_optimizer *opt, const crew_optimizer_spec *spec, const crew_backend *be,
                                int64_t n)
{
    memset(opt, 0, sizeof *opt);
    opt->spec = *spec;
    opt->n = n;
    for (int i = 0; i < crew_optimizer_slots(spec); i++) {
        crew_status s = crew_dev_alloc_f32(be, n, &opt->slot[i]);
        if (s) {
            crew_optimizer_release(opt, be);
            return crew_error_prefix(s, "optimizer: %lld values of state: ", (long long)n);
        }
    }
    return CREW_OK;
}

void crew_optimizer_release(crew_optimizer *opt, const crew_backend *be)
{
    for (int i = 0; i < 2; i++) {
        crew_dev_free(be, opt->slot[i]);
        opt->slot[i] = NULL;
    }
    free(opt->bounds);
    opt->bounds = NULL;
    opt->n_tensors = 0;
}

crew_status crew_optimizer_copy(crew_optimizer *dst, const crew_backend *dst_be, const crew_optimizer *src,
                                const crew_backend *src_be)
{
    if (dst->n != src->n || dst->spec.type != src->spec.type || !dst->slot[0] != !src->slot[0] ||
        !dst->slot[1] != !src->slot[1])
        return crew_errorf(CREW_CODE_INTERNAL, "optimizer state of %lld values cannot be copied into one of %lld",
                           (long long)src->n, (long long)dst->n);
    for (int i = 0; i < 2; i++)
        if (src->slot[i]) CREW_TRY(crew_dev_transfer_f32(dst_be, dst->slot[i], src_be, src->slot[i], src->n));
    dst->t = src->t;
    return CREW_OK;
}

float crew_lr_at(const crew_lr_plan *p, int64_t step)
{
    if (step < p->warmup_steps) {
        double f = (double)(step + 1) / (double)p->warmup_steps;
        return (float)(p->start_lr + (p->peak_lr - p->start_lr) * f);
    }
    int64_t t = step - p->warmup_steps;
    switch (p->schedule) {
    case CREW_SCHED_STEP: return (float)(p->peak_lr * pow(p->gamma, (double)(t / p->step_size)));
    case CREW_SCHED_COSINE: {
        int64_t span = p->total_steps - p->warmup_steps;
        double f = span > 0 ? (double)t / (double)span : 1.0;
        if (f > 1.0) f = 1.0;
        return (float)(p->min_lr + (p->peak_lr - p->min_lr) * 0.5 * (1.0 + cos(M_PI * f)));
    }
    default: return p->peak_lr;
    }
}

/* The step's constants in double, from the model file's numbers, each rounded to float once: what
 * torch.optim.AdamW does with Python floats. In float, 1 − 0.999f is 0.0009999871 (1.3e-5 off), and
 * the error grew with t through powf; the weights drifted away from PyTorch's for no reason. */
void crew_adamw_consts_at(const crew_optimizer_spec *s, float lr, int64_t t, crew_adamw_consts *k)
{
    double c1 = 1.0 - pow(s->beta1, (double)t), c2 = 1.0 - pow(s->beta2, (double)t);
    *k = (crew_adamw_consts){
        .decay = (float)(1.0 - (double)lr * (double)s->weight_decay),
        .one_minus_beta1 = (float)(1.0 - s->beta1),
        .beta2 = (float)s->beta2,
        .one_minus_beta2 = (float)(1.0 - s->beta2),
        .step_size = (float)((double)lr / c1),
        .bias_c2_sqrt = (float)sqrt(c2),
        .eps = s->eps,
    };
}

crew_status crew_optimizer_step(crew_optimizer *opt, const crew_backend *be, float *params, float *grads, float lr,
                                double *grad_norm)
{
    return crew_optimizer_step_range(opt, be, params, grads, opt->n, 0, lr, grad_norm);
}

/* Checks the range, then clips. The norm costs a pass over every gradient: only when clipping or
 * the caller needs it. It runs over all n whatever the range, so that a shard clips by the same
 * factor, to the bit, as the whole buffer would. */
static crew_status clip(crew_optimizer *opt, const crew_backend *be, float *grads, int64_t n, int64_t lo,
                        double *grad_norm, int whole)
{
    const crew_backend_ops *o = be->ops;
    const crew_optimizer_spec *s = &opt->spec;
    if (lo < 0 || lo + opt->n > n)
        return crew_errorf(CREW_CODE_INTERNAL, "optimizer: the range [%lld, %lld) lies outside the %lld parameters",
                           (long long)lo, (long long)(lo + opt->n), (long long)n);
    if (s->clip_norm > 0.0f || grad_norm) {
        double sq = 0.0;
        CREW_TRY(o->sum_squares(be->ctx, grads, n, &sq));
        double norm = sqrt(sq);
        if (grad_norm) *grad_norm = norm;
        if (s->clip_norm > 0.0f && norm > s->clip_norm) {
            const int64_t from = whole ? 0 : lo, count = whole ? n : opt->n;
            o->axpby(be->ctx, count, (float)(s->clip_norm / norm), grads + from, 0.0f, grads + from);
        }
    }
    return CREW_OK;
}

crew_status crew_optimizer_layerwise_begin(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                           int64_t n, int64_t lo, float lr, double *grad_norm)
{
    (void)lr;
    const crew_optimizer_spec *s = &opt->spec;
    if (!crew_optimizer_layerwise(s) || !opt->bounds || opt->bounds[opt->n_tensors] != n)
        return crew_errorf(CREW_CODE_INTERNAL, "optimizer: %s has no tensors for its %lld parameters",
                           crew_optimizer_name(s->type), (long long)n);
    /* LARS's norms are over the clipped gradients of the whole tensors (a shard has them all when
     * clipping): it clips every one, the bits the shard that owns them clips them to. */
    CREW_TRY(clip(opt, be, grads, n, lo, grad_norm, s->type == CREW_OPT_LARS));
    opt->t++;
    if (s->type != CREW_OPT_LAMB || opt->n == 0) return CREW_OK;
    /* LAMB's update, in the gradient's place: Adam's direction, then weight decay added to it */
    crew_adamw_consts k;
    crew_adamw_consts_at(s, 1.0f, opt->t, &k); /* step_size = 1 / (1 − β1ᵗ) */
    be->ops->adam_direction(be->ctx, grads + lo, opt->slot[0], opt->slot[1], grads + lo, opt->n, &k);
    if (s->weight_decay > 0.0f) be->ops->axpby(be->ctx, opt->n, s->weight_decay, params + lo, 1.0f, grads + lo);
    return CREW_OK;
}

/* The trust ratio of a tensor from its squared norms: LAMB ‖w‖ / ‖u‖, LARS η‖w‖ / (‖g‖ + wd‖w‖ +
 * eps), 1 when either norm is 0 (a tensor at zero, or one the step does not move), as Keras's
 * Lamb and apex's LARC. In double, rounded to float once with the learning rate. */
static double trust_ratio(const crew_optimizer_spec *s, double ww, double gg)
{
    if (!(ww > 0.0 && gg > 0.0)) return 1.0;
    double w = sqrt(ww), g = sqrt(gg);
    if (s->type == CREW_OPT_LAMB) return w / g;
    return (double)s->trust * w / (g + (double)s->weight_decay * w + (double)s->eps);
}

crew_status crew_optimizer_layerwise_end(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                         int64_t n, int64_t lo, float lr)
{
    const crew_backend_ops *o = be->ops;
    const crew_optimizer_spec *s = &opt->spec;
    const int64_t hi = lo + opt->n;
    for (int j = 0; j < opt->n_tensors; j++) {
        const int64_t a = opt->bounds[j], b = opt->bounds[j + 1];
        const int64_t from = a > lo ? a : lo, to = b < hi ? b : hi;
        if (from >= to) continue; /* not this shard's */
        double ww = 0.0, gg = 0.0;
        CREW_TRY(o->sum_squares(be->ctx, params + a, b - a, &ww));
        CREW_TRY(o->sum_squares(be->ctx, grads + a, b - a, &gg));
        const double ratio = trust_ratio(s, ww, gg);
        if (s->type == CREW_OPT_LAMB) {
            o->axpby(be->ctx, to - from, (float)(-(double)lr * ratio), grads + from, 1.0f, params + from);
            continue;
        }
        /* LARS (apex's LARC): g = ratio · (g + wd·w), then SGD with momentum on it */
        if (s->weight_decay > 0.0f) o->axpby(be->ctx, to - from, s->weight_decay, params + from, 1.0f, grads + from);
        o->axpby(be->ctx, to - from, (float)ratio, grads + from, 0.0f, grads + from);
        o->sgd_update(be->ctx, params + from, grads + from, opt->slot[0] ? opt->slot[0] + (from - lo) : NULL, to - from,
                      lr, s->momentum, s->nesterov, 0.0f);
    }
    return CREW_OK;
}

static void update_values(crew_optimizer *opt, const crew_backend *be, float *params, float *grads, float lr);

crew_status crew_optimizer_step_range(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                      int64_t n, int64_t lo, float lr, double *grad_norm)
{
    const crew_optimizer_spec *s = &opt->spec;
    if (crew_optimizer_layerwise(s)) {
        if (lo != 0 || opt->n != n)
            return crew_errorf(CREW_CODE_INTERNAL, "optimizer: a shard of %s steps in two halves around a gather",
                               crew_optimizer_name(s->type));
        CREW_TRY(crew_optimizer_layerwise_begin(opt, be, params, grads, n, lo, lr, grad_norm));
        return crew_optimizer_layerwise_end(opt, be, params, grads, n, lo, lr);
    }
    CREW_TRY(clip(opt, be, grads, n, lo, grad_norm, 0));
    update_values(opt, be, params + lo, grads + lo, lr);
    return CREW_OK;
}

crew_status crew_optimizer_step_shard(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                      float lr, double norm)
{
    const crew_optimizer_spec *s = &opt->spec;
    if (crew_optimizer_layerwise(s))
        return crew_errorf(CREW_CODE_INTERNAL, "optimizer: %s's shard needs whole tensors", crew_optimizer_name(s->type));
    if (s->clip_norm > 0.0f && !(norm >= 0.0))
        return crew_errorf(CREW_CODE_INTERNAL, "optimizer: a shard clipped without the gradient's norm");
    if (s->clip_norm > 0.0f && norm > s->clip_norm) /* the factor, and so the bits, of clip() */
        be->ops->axpby(be->ctx, opt->n, (float)(s->clip_norm / norm), grads, 0.0f, grads);
    update_values(opt, be, params, grads, lr);
    return CREW_OK;
}

/* The elementwise update of opt->n values (after clipping), counted. */
static void update_values(crew_optimizer *opt, const crew_backend *be, float *params, float *grads, float lr)
{
    const crew_backend_ops *o = be->ops;
    const crew_optimizer_spec *s = &opt->spec;
    opt->t++;
    if (s->type == CREW_OPT_SGD) {
        o->sgd_update(be->ctx, params, grads, opt->slot[0], opt->n, lr, s->momentum, s->nesterov, s->weight_decay);
    } else {
        crew_adamw_consts k;
        crew_adamw_consts_at(s, lr, opt->t, &k);
        o->adamw_update(be->ctx, params, grads, opt->slot[0], opt->slot[1], opt->n, &k);
    }
}
