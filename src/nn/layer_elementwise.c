/* layer_elementwise.c — layers that act on each value alone: flatten, activation, dropout. */
#include "core/rng.h"
#include "core/status.h"
#include "nn/layer.h"

static int64_t values(const crew_layer *l, const crew_pass *p) { return p->rows * crew_shape_size(&l->in); }

/* ---- flatten: [H, W, C] → [H·W·C]; NHWC order, as Keras. */

static crew_status flatten_build(crew_layer *l)
{
    l->out = crew_shape1(crew_shape_size(&l->in));
    return CREW_OK;
}

static crew_status copy_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    p->be->ops->copy(p->be->ctx, y, x, values(l, p));
    return CREW_OK;
}

static crew_status copy_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                 const float *dy, float *dx)
{
    (void)x;
    (void)y;
    if (dx) p->be->ops->copy(p->be->ctx, dx, dy, values(l, p));
    return CREW_OK;
}

/* ---- activation */

static crew_status activation_build(crew_layer *l)
{
    if (l->spec.activation < CREW_ACT_NONE || l->spec.activation > CREW_ACT_GELU_TANH)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'activation' has an unknown value %d", (int)l->spec.activation);
    l->out = l->in;
    return CREW_OK;
}

static crew_status activation_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    if (l->spec.activation == CREW_ACT_SOFTMAX) {
        int64_t c = l->in.dim[l->in.ndim - 1];
        p->be->ops->softmax(p->be->ctx, x, y, values(l, p) / c, c);
        return CREW_OK;
    }
    p->be->ops->act_forward(p->be->ctx, l->spec.activation, x, y, values(l, p));
    return CREW_OK;
}

static crew_status activation_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                       const float *dy, float *dx)
{
    if (!dx) return CREW_OK;
    if (l->spec.activation == CREW_ACT_SOFTMAX)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "softmax is supported only as the last layer, fused into the cross-entropy loss");
    p->be->ops->act_backward(p->be->ctx, l->spec.activation, x, y, dy, dx, values(l, p));
    return CREW_OK;
}

/* ---- dropout: the mask of each value is a function of (seed, step, layer, sample, position),
 * so it does not depend on which replica or micro-batch the sample landed in. work[0]: mask. */

static crew_status dropout_build(crew_layer *l)
{
    if (!(l->spec.rate >= 0.0f && l->spec.rate < 1.0f))
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'rate' must be in [0, 1), got %g", (double)l->spec.rate);
    l->out = l->in;
    return CREW_OK;
}

/* The mask [rows, in], kept from forward for backward. */
static void dropout_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    n[0] = rows * crew_shape_size(&l->in);
}

static crew_status dropout_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    if (!p->training || l->spec.rate == 0.0f) return copy_forward(l, p, x, y);
    uint64_t key = crew_rng_key(p->seed, CREW_STREAM_DROPOUT, (uint64_t)p->step, (uint64_t)l->index);
    p->be->ops->dropout_forward(p->be->ctx, x, y, l->work[0], p->rows, crew_shape_size(&l->in), l->spec.rate,
                                key, p->sample_ids);
    return CREW_OK;
}

static crew_status dropout_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                    const float *dy, float *dx)
{
    if (!dx) return CREW_OK;
    if (!p->training || l->spec.rate == 0.0f) return copy_backward(l, p, x, y, dy, dx);
    p->be->ops->mul(p->be->ctx, values(l, p), dy, l->work[0], dx);
    return CREW_OK;
}

const crew_layer_ops crew_flatten_ops = {.build = flatten_build,
                                         .forward = copy_forward,
                                         .backward = copy_backward,
                                         .release = crew_layer_free_work};
const crew_layer_ops crew_activation_ops = {.build = activation_build,
                                            .forward = activation_forward,
                                            .backward = activation_backward,
                                            .release = crew_layer_free_work};
const crew_layer_ops crew_dropout_ops = {.build = dropout_build,
                                         .workspace = dropout_workspace,
                                         .forward = dropout_forward,
                                         .backward = dropout_backward,
                                         .release = crew_layer_free_work};
