/* layer_conv2d.c — 2-D convolution as im2col + one GEMM over the whole batch.
 * x [H, W, C] → y [OH, OW, F]; kernel [KH, KW, C, F] (Keras layout), so with im2col rows ordered
 * (kh, kw, c) the kernel is already the [KH·KW·C, F] matrix of the GEMM. work[0]: the columns. */
#include "nn/window_geometry.h"

static crew_status conv_geometry(const crew_layer *l, int64_t rows, crew_window *g)
{
    int s_h = l->spec.strides[0] ? l->spec.strides[0] : 1, s_w = l->spec.strides[1] ? l->spec.strides[1] : 1;
    CREW_TRY(crew_window_plan(&l->in, l->spec.kernel[0], l->spec.kernel[1], s_h, s_w, l->spec.padding, g));
    g->batch = rows;
    return CREW_OK;
}

static crew_status conv_build(crew_layer *l)
{
    if (l->spec.filters <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'filters' must be a positive integer, got %lld",
                           (long long)l->spec.filters);
    crew_window g = {0};
    CREW_TRY(conv_geometry(l, 1, &g));
    l->out = crew_shape3(g.out_h, g.out_w, l->spec.filters);
    int64_t fan_in = g.k_h * g.k_w * g.in_c, fan_out = g.k_h * g.k_w * l->spec.filters;
    crew_shape k = {4, {g.k_h, g.k_w, g.in_c, l->spec.filters}};
    crew_layer_declare(l, "kernel", k, 1, CREW_INIT_GLOROT_UNIFORM, fan_in, fan_out);
    if (!l->spec.no_bias) crew_layer_declare(l, "bias", crew_shape1(l->spec.filters), 1, CREW_INIT_ZEROS, 0, 0);
    return CREW_OK;
}

/* The im2col columns [rows·OH·OW, KH·KW·C]: one row per output position, as long as a column
 * of the kernel. Read from the shapes build set (out [OH, OW, F], kernel [KH, KW, C, F]) rather
 * than from conv_geometry, which returns a status: for a built layer the numbers are the same. */
static void conv_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    const crew_shape *k = &l->params[0].shape;
    n[0] = rows * l->out.dim[0] * l->out.dim[1] * k->dim[0] * k->dim[1] * k->dim[2];
}

static crew_status conv_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    crew_window g = {0};
    CREW_TRY(conv_geometry(l, p->rows, &g));
    int64_t m = g.batch * g.out_h * g.out_w, k = g.k_h * g.k_w * g.in_c, n = l->spec.filters;
    o->im2col(p->be->ctx, x, l->work[0], &g);
    if (!l->spec.no_bias) o->broadcast_rows(p->be->ctx, y, l->params[1].value, m, n);
    o->gemm(p->be->ctx, 0, 0, m, n, k, 1.0f, l->work[0], k, l->params[0].value, n, l->spec.no_bias ? 0.0f : 1.0f, y, n);
    return CREW_OK;
}

/* Uses the columns the forward pass left in work[0], then reuses work[0] for their gradient. */
static crew_status conv_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                 const float *dy, float *dx)
{
    (void)x;
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    crew_window g = {0};
    CREW_TRY(conv_geometry(l, p->rows, &g));
    int64_t m = g.batch * g.out_h * g.out_w, k = g.k_h * g.k_w * g.in_c, n = l->spec.filters;
    o->gemm(p->be->ctx, 1, 0, k, n, m, 1.0f, l->work[0], k, dy, n, 0.0f, l->params[0].grad, n);
    if (!l->spec.no_bias) o->col_sum(p->be->ctx, dy, m, n, l->params[1].grad, 0);
    if (dx) {
        o->gemm(p->be->ctx, 0, 1, m, k, n, 1.0f, dy, n, l->params[0].value, n, 0.0f, l->work[0], k);
        o->col2im(p->be->ctx, l->work[0], dx, &g);
    }
    return CREW_OK;
}

const crew_layer_ops crew_conv2d_ops = {conv_build, conv_workspace, conv_forward, conv_backward,
                                        crew_layer_free_work};
