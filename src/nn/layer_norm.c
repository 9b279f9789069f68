/* layer_norm.c — batch normalisation and layer normalisation over the last (channel) axis.
 *
 * Batch norm, training: statistics over every position of every sample in the micro-batch —
 * or, with pass->sync_sum set, over all replicas (synchronised batch norm): each reduction is
 * summed across replicas before it is used. Inference uses the moving statistics, updated
 * Keras's way: moving = momentum·moving + (1 − momentum)·batch (biased variance).
 * work[0] holds [mean | var], floats [C] each; work[1] the sums they come from and the backward
 * pass's, doubles [C] each (backend.h says why): [Σx | Σ(x − mean)² | Σdy | Σdy·(x − mean)]. */
#include "core/status.h"
#include "nn/layer.h"

enum { BN_GAMMA, BN_BETA, BN_MOVING_MEAN, BN_MOVING_VAR };

static int64_t channels(const crew_layer *l) { return l->in.dim[l->in.ndim - 1]; }
static int64_t positions(const crew_layer *l, int64_t rows) { return rows * (crew_shape_size(&l->in) / channels(l)); }

static float bn_eps(const crew_layer *l) { return l->spec.epsilon > 0.0f ? l->spec.epsilon : 1e-3f; }

static crew_status bn_build(crew_layer *l)
{
    float mom = l->spec.momentum;
    if (mom != 0.0f && !(mom > 0.0f && mom < 1.0f))
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'momentum' must be in (0, 1), got %g", (double)mom);
    if (l->spec.epsilon < 0.0f)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'epsilon' must be positive, got %g", (double)l->spec.epsilon);
    int64_t c = channels(l);
    l->out = l->in;
    crew_layer_declare(l, "gamma", crew_shape1(c), 1, CREW_INIT_ONES, 0, 0);
    crew_layer_declare(l, "beta", crew_shape1(c), 1, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare(l, "moving_mean", crew_shape1(c), 0, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare(l, "moving_variance", crew_shape1(c), 0, CREW_INIT_ONES, 0, 0);
    return CREW_OK;
}

/* Per-channel, so the same for every batch size. */
static void bn_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    (void)rows;
    n[0] = 2 * channels(l);                 /* mean | var */
    n[1] = 4 * channels(l) * 2;             /* the four sums, doubles of two 4-byte elements each */
    n[2] = channels(l);                     /* backward: gamma, kept (crew_layer_value_kept) */
}

static double *bn_sums(const crew_layer *l) { return (double *)(void *)l->work[1]; }

static crew_status sync(const crew_pass *p, double *buf, int64_t n)
{
    return p->sync_sum ? p->sync_sum(p->sync_user, buf, n) : CREW_OK;
}

static crew_status bn_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    void *ctx = p->be->ctx;
    int64_t c = channels(l), rows = positions(l, p->rows);
    float *mean = l->work[0], *var = mean + c;
    if (!p->training) {
        o->bn_forward(ctx, x, l->params[BN_MOVING_MEAN].value, l->params[BN_MOVING_VAR].value,
                      l->params[BN_GAMMA].value, l->params[BN_BETA].value, bn_eps(l), y, rows, c);
        return CREW_OK;
    }
    double total = (p->sync_sum ? p->total_rows : (double)p->rows) * (double)(crew_shape_size(&l->in) / c);
    double *sum = bn_sums(l), *sqdev = sum + c;
    o->bn_col_sum(ctx, x, rows, c, sum);
    CREW_TRY(sync(p, sum, c));
    o->bn_scale_sums(ctx, c, 1.0 / total, sum, mean);
    o->col_sqdev(ctx, x, mean, rows, c, sqdev);
    CREW_TRY(sync(p, sqdev, c));
    o->bn_scale_sums(ctx, c, 1.0 / total, sqdev, var);
    o->bn_forward(ctx, x, mean, var, l->params[BN_GAMMA].value, l->params[BN_BETA].value, bn_eps(l), y, rows, c);
    float mom = l->spec.momentum > 0.0f ? l->spec.momentum : 0.99f;
    o->axpby(ctx, c, 1.0f - mom, mean, mom, l->params[BN_MOVING_MEAN].value);
    o->axpby(ctx, c, 1.0f - mom, var, mom, l->params[BN_MOVING_VAR].value);
    return CREW_OK;
}

static crew_status bn_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                               const float *dy, float *dx)
{
    (void)y;
    if (!p->training)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "batch normalization: backward pass in inference mode");
    const crew_backend_ops *o = p->be->ops;
    void *ctx = p->be->ctx;
    int64_t c = channels(l), rows = positions(l, p->rows);
    float *mean = l->work[0], *var = mean + c;
    double *sum_dy = bn_sums(l) + 2 * c, *sum_dy_xmu = sum_dy + c;
    o->bn_backward_sums(ctx, dy, x, mean, rows, c, sum_dy, sum_dy_xmu);
    /* dx below reads gamma after its gradient is written (layer.h) */
    const float *gamma = crew_layer_value_kept(l, p, BN_GAMMA, l->work[2]);
    /* Parameter gradients take this replica's share; the gradient all-reduce adds the rest. */
    o->fill(ctx, l->params[BN_GAMMA].grad, 0.0f, c);
    o->fill(ctx, l->params[BN_BETA].grad, 0.0f, c);
    o->bn_param_grads(ctx, var, bn_eps(l), sum_dy, sum_dy_xmu, l->params[BN_GAMMA].grad, l->params[BN_BETA].grad, c);
    if (!dx) return CREW_OK;
    CREW_TRY(sync(p, sum_dy, 2 * c)); /* both sums, side by side, in one all-reduce */
    double total = (p->sync_sum ? p->total_rows : (double)p->rows) * (double)(crew_shape_size(&l->in) / c);
    o->bn_backward(ctx, dy, x, mean, var, gamma, bn_eps(l), sum_dy, sum_dy_xmu, total, dx,
                   rows, c);
    return CREW_OK;
}

/* ---- layer norm: per position, over the channel axis. work[0]: mean, work[1]: rstd, both
 * [positions]; work[2]: a dx buffer when the caller needs none (the kernel writes one); work[3]:
 * backward's copy of gamma, which the kernel reads while it sums gamma's gradient (layer.h). */

static float ln_eps(const crew_layer *l) { return l->spec.epsilon > 0.0f ? l->spec.epsilon : 1e-3f; }

static crew_status ln_build(crew_layer *l)
{
    if (l->spec.epsilon < 0.0f)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'epsilon' must be positive, got %g", (double)l->spec.epsilon);
    int64_t c = channels(l);
    l->out = l->in;
    crew_layer_declare(l, "gamma", crew_shape1(c), 1, CREW_INIT_ONES, 0, 0);
    crew_layer_declare(l, "beta", crew_shape1(c), 1, CREW_INIT_ZEROS, 0, 0);
    return CREW_OK;
}

/* The spare dx buffer (work[2]) is for a backward call without dx, which the model makes when
 * nothing upstream needs the input gradient (needs_input_grad 0: no earlier layer has trainable
 * parameters, wherever this layer sits): the kernel computes dx together with the parameter
 * gradients and has to write it somewhere. */
static void ln_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    n[0] = positions(l, rows); /* mean */
    n[1] = positions(l, rows); /* rstd */
    if (!l->needs_input_grad) n[2] = rows * crew_shape_size(&l->in);
    n[3] = channels(l);
}

static crew_status ln_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    p->be->ops->layernorm_forward(p->be->ctx, x, l->params[0].value, l->params[1].value, ln_eps(l), y, l->work[0],
                                  l->work[1], positions(l, p->rows), channels(l));
    return CREW_OK;
}

static crew_status ln_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                               const float *dy, float *dx)
{
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    int64_t c = channels(l);
    const float *gamma = crew_layer_value_kept(l, p, 0, l->work[3]);
    o->fill(p->be->ctx, l->params[0].grad, 0.0f, c);
    o->fill(p->be->ctx, l->params[1].grad, 0.0f, c);
    if (!dx) dx = l->work[2];
    if (!dx) return crew_errorf(CREW_CODE_INTERNAL, "layer normalization: no buffer for the input gradient");
    o->layernorm_backward(p->be->ctx, dy, x, gamma, l->work[0], l->work[1], dx, l->params[0].grad,
                          l->params[1].grad, positions(l, p->rows), c);
    return CREW_OK;
}

/* the copy of gamma is backward's alone */
const crew_layer_ops crew_batch_norm_ops = {.build = bn_build,
                                            .workspace = bn_workspace,
                                            .forward = bn_forward,
                                            .backward = bn_backward,
                                            .release = crew_layer_free_work,
                                            .scratch = 1u << 2};
/* the spare input gradient and the copy of gamma are backward's alone */
const crew_layer_ops crew_layer_norm_ops = {.build = ln_build,
                                            .workspace = ln_workspace,
                                            .forward = ln_forward,
                                            .backward = ln_backward,
                                            .release = crew_layer_free_work,
                                            .scratch = 1u << 2 | 1u << 3};
