/* layer_dense.c — y = x·W + b over the last axis. W: kernel [in, units] (Keras layout). */
#include "core/status.h"
#include "nn/layer.h"

static crew_status dense_build(crew_layer *l)
{
    if (l->spec.units <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'units' must be a positive integer, got %lld",
                           (long long)l->spec.units);
    int64_t in = l->in.dim[l->in.ndim - 1];
    l->out = l->in;
    l->out.dim[l->out.ndim - 1] = l->spec.units;
    crew_shape k = {2, {in, l->spec.units}};
    crew_layer_declare(l, "kernel", k, 1, CREW_INIT_GLOROT_UNIFORM, in, l->spec.units);
    if (!l->spec.no_bias) crew_layer_declare(l, "bias", crew_shape1(l->spec.units), 1, CREW_INIT_ZEROS, 0, 0);
    return CREW_OK;
}

/* Rows of the GEMM: every position along the leading axes is one row. */
static int64_t gemm_rows(const crew_layer *l, int64_t rows)
{
    return rows * (crew_shape_size(&l->in) / l->in.dim[l->in.ndim - 1]);
}

static crew_status dense_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    int64_t m = gemm_rows(l, p->rows), k = l->in.dim[l->in.ndim - 1], n = l->spec.units;
    o->gemm_bias(p->be->ctx, m, n, k, x, CREW_DT_F32, k, l->params[0].value, n,
                 l->spec.no_bias ? NULL : l->params[1].value, y, n);
    return CREW_OK;
}

static crew_status dense_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                  const float *dy, float *dx)
{
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    int64_t m = gemm_rows(l, p->rows), k = l->in.dim[l->in.ndim - 1], n = l->spec.units;
    /* dx first: under ZeRO-3 the gradients are written over the values (nn/layer.h) */
    if (dx) o->gemm(p->be->ctx, 0, 1, m, k, n, 1.0f, dy, n, l->params[0].value, n, 0.0f, dx, k); /* dy·Wᵀ */
    o->gemm(p->be->ctx, 1, 0, k, n, m, 1.0f, x, k, dy, n, 0.0f, l->params[0].grad, n); /* dW = xᵀ·dy */
    if (!l->spec.no_bias) o->col_sum(p->be->ctx, dy, m, n, l->params[1].grad, 0);
    return CREW_OK;
}

/* No workspace: the GEMMs read x and dy in place. */
const crew_layer_ops crew_dense_ops = {.build = dense_build,
                                       .forward = dense_forward,
                                       .backward = dense_backward,
                                       .release = crew_layer_free_work};
