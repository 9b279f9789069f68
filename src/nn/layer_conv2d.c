/* layer_conv2d.c — 2-D convolution as im2col + GEMM, a chunk of samples at a time, or by the
 * device's convolution library (cuDNN) where the run chose it for the layer (--conv, per layer),
 * or, with few taps (a first layer: k_h·k_w·in_c ≤ CREW_CONV_TAPS_MAX), by the device's direct
 * loops where it has them (the CPU kinds: cpu_conv_taps.c), whose GEMM would have a k of 9.
 * x [H, W, C] → y [OH, OW, F]; kernel [KH, KW, C, F] (Keras layout), so with im2col rows ordered
 * (kh, kw, c) the kernel is already the [KH·KW·C, F] matrix of the GEMM. work[0]: the columns of
 * one chunk.
 *
 * Why chunks: the columns of a whole batch are KH·KW times the input (14 MB for the second conv of
 * examples/fashion_cnn.json at 64 samples). Written and read back three times a step, they left
 * the cache and made the layer memory-bound, and replicas sharing a last-level cache slowed each
 * other down. A chunk's columns (about CONV_CHUNK_FLOATS) stay in cache; the backward pass
 * rebuilds them from x instead of keeping the forward pass's. The chunk size depends only on the
 * layer's shapes, never on the machine or the number of replicas, so the order of the kernel
 * gradient's sums (chunk by chunk) is the same wherever it runs. */
#include "nn/window_geometry.h"

#define CONV_CHUNK_FLOATS (256 * 1024) /* 1 MB of columns */

static crew_status conv_build(crew_layer *l)
{
    if (l->spec.filters <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'filters' must be a positive integer, got %lld",
                           (long long)l->spec.filters);
    crew_window g = {0};
    CREW_TRY(crew_conv2d_window(l, 1, &g));
    l->out = crew_shape3(g.out_h, g.out_w, l->spec.filters);
    int64_t fan_in = g.k_h * g.k_w * g.in_c, fan_out = g.k_h * g.k_w * l->spec.filters;
    crew_shape k = {4, {g.k_h, g.k_w, g.in_c, l->spec.filters}};
    crew_layer_declare(l, "kernel", k, 1, CREW_INIT_GLOROT_UNIFORM, fan_in, fan_out);
    if (!l->spec.no_bias) crew_layer_declare(l, "bias", crew_shape1(l->spec.filters), 1, CREW_INIT_ZEROS, 0, 0);
    return CREW_OK;
}

/* Columns of one sample [OH·OW, KH·KW·C]: one row per output position, as long as a column of
 * the kernel. Read from the shapes build set (out [OH, OW, F], kernel [KH, KW, C, F]) rather than
 * from crew_conv2d_window, which returns a status: for a built layer the numbers are the same. */
static int64_t conv_sample_cols(const crew_layer *l)
{
    const crew_shape *k = &l->params[0].shape;
    return l->out.dim[0] * l->out.dim[1] * k->dim[0] * k->dim[1] * k->dim[2];
}

/* Samples per chunk: as many as fit CONV_CHUNK_FLOATS of columns, at least one, at most rows. */
static int64_t conv_chunk(const crew_layer *l, int64_t rows)
{
    int64_t per = conv_sample_cols(l), c = per > 0 ? CONV_CHUNK_FLOATS / per : rows;
    if (c < 1) c = 1;
    return c < rows ? c : rows;
}

static void conv_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    n[0] = conv_chunk(l, rows) * conv_sample_cols(l);
}

/* The device's convolution library (cuDNN) runs the whole batch, for a layer the run chose it for
 * (crew_fit_plan.conv_choice), where it runs the geometry. */
static int by_library(const crew_layer *l, const crew_pass *p, const crew_window *g)
{
    const crew_backend_ops *o = p->be->ops;
    return l->conv_by_library && o->conv_supported && o->conv_supported(p->be->ctx, g, l->spec.filters);
}

/* Few taps (a first layer): summed directly where the device can (backend.h's conv_taps_*), the
 * whole batch at once, without columns. */
static int by_taps(const crew_layer *l, const crew_pass *p, const crew_window *g)
{
    return p->be->ops->conv_taps_forward && g->k_h * g->k_w * g->in_c <= CREW_CONV_TAPS_MAX && !by_library(l, p, g);
}

static crew_status conv_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    crew_window g = {0};
    CREW_TRY(crew_conv2d_window(l, p->rows, &g));
    if (by_taps(l, p, &g)) {
        o->conv_taps_forward(p->be->ctx, x, l->params[0].value, l->spec.no_bias ? NULL : l->params[1].value, y, &g,
                             l->spec.filters);
        return CREW_OK;
    }
    if (by_library(l, p, &g)) {
        if (!l->spec.no_bias)
            o->broadcast_rows(p->be->ctx, y, l->params[1].value, p->rows * g.out_h * g.out_w, l->spec.filters);
        else
            o->fill(p->be->ctx, y, 0.0f, p->rows * g.out_h * g.out_w * l->spec.filters);
        o->conv_forward(p->be->ctx, x, l->params[0].value, y, &g, l->spec.filters);
        return CREW_OK;
    }
    const int64_t k = g.k_h * g.k_w * g.in_c, n = l->spec.filters, chunk = conv_chunk(l, p->rows);
    const int64_t x_per = g.in_h * g.in_w * g.in_c, y_per = g.out_h * g.out_w * n;
    for (int64_t r0 = 0; r0 < p->rows; r0 += chunk) {
        g.batch = p->rows - r0 < chunk ? p->rows - r0 : chunk;
        int64_t m = g.batch * g.out_h * g.out_w;
        o->im2col(p->be->ctx, x + r0 * x_per, l->work[0], &g);
        o->gemm_bias(p->be->ctx, m, n, k, l->work[0], CREW_DT_F32, k, l->params[0].value, n,
                     l->spec.no_bias ? NULL : l->params[1].value, y + r0 * y_per, n);
    }
    return CREW_OK;
}

/* Chunk by chunk, what `part` asks: GRADS, the chunk's share of the bias gradient, the columns
 * rebuilt from x and their share of the kernel gradient (unless the taps wrote it); DX, the
 * columns' gradient in the same buffer, scattered into dx. Rows are added in the same order as in
 * one pass over the batch, so the sums' bits do not depend on the chunks. */
enum { CONV_GRADS = 1, CONV_DX = 2 };
static void conv_backward_chunks(crew_layer *l, const crew_pass *p, crew_window g, const float *x, const float *dy,
                                 float *dx, int taps, int part)
{
    const crew_backend_ops *o = p->be->ops;
    const int64_t k = g.k_h * g.k_w * g.in_c, n = l->spec.filters, chunk = conv_chunk(l, p->rows);
    const int64_t x_per = g.in_h * g.in_w * g.in_c, y_per = g.out_h * g.out_w * n;
    for (int64_t r0 = 0; r0 < p->rows; r0 += chunk) {
        g.batch = p->rows - r0 < chunk ? p->rows - r0 : chunk;
        int64_t m = g.batch * g.out_h * g.out_w;
        const float *dy_c = dy + r0 * y_per;
        if (part & CONV_GRADS) {
            if (!l->spec.no_bias) o->col_sum(p->be->ctx, dy_c, m, n, l->params[1].grad, r0 > 0);
            if (!taps) {
                o->im2col(p->be->ctx, x + r0 * x_per, l->work[0], &g);
                o->gemm(p->be->ctx, 1, 0, k, n, m, 1.0f, l->work[0], k, dy_c, n, r0 ? 1.0f : 0.0f, l->params[0].grad,
                        n);
            }
        }
        if (part & CONV_DX) {
            o->gemm(p->be->ctx, 0, 1, m, k, n, 1.0f, dy_c, n, l->params[0].value, n, 0.0f, l->work[0], k);
            o->col2im(p->be->ctx, l->work[0], dx + r0 * x_per, &g);
        }
    }
}

/* The gradients and dx; dx before the kernel's gradient where that is written over the kernel
 * (ZeRO-3, layer.h): then the chunks twice, dx's pass first. */
static crew_status conv_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                 const float *dy, float *dx)
{
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    crew_window g = {0};
    CREW_TRY(crew_conv2d_window(l, p->rows, &g));
    if (by_library(l, p, &g)) {
        if (dx) o->conv_backward_data(p->be->ctx, dy, l->params[0].value, dx, &g, l->spec.filters);
        if (!l->spec.no_bias)
            o->col_sum(p->be->ctx, dy, p->rows * g.out_h * g.out_w, l->spec.filters, l->params[1].grad, 0);
        o->conv_backward_filter(p->be->ctx, x, dy, l->params[0].grad, &g, l->spec.filters);
        return CREW_OK;
    }
    const int taps = by_taps(l, p, &g), over = l->params[0].grad == l->params[0].value;
    const int64_t n = l->spec.filters;
    if (taps) { /* the kernel's gradient directly; columns only for dx, when a layer below needs it */
        if (dx) conv_backward_chunks(l, p, g, x, dy, dx, taps, CONV_DX | CONV_GRADS);
        else if (!l->spec.no_bias) o->col_sum(p->be->ctx, dy, p->rows * g.out_h * g.out_w, n, l->params[1].grad, 0);
        o->conv_taps_filter_grad(p->be->ctx, x, dy, l->params[0].grad, &g, n);
        return CREW_OK;
    }
    if (dx && over) {
        conv_backward_chunks(l, p, g, x, dy, dx, taps, CONV_DX);
        conv_backward_chunks(l, p, g, x, dy, dx, taps, CONV_GRADS);
    } else {
        conv_backward_chunks(l, p, g, x, dy, dx, taps, dx ? CONV_GRADS | CONV_DX : CONV_GRADS);
    }
    return CREW_OK;
}

/* ---- a convolution that takes in the relu and the 2x2 max pool after it (crew_model_layer_absorbs):
 * by the device's one pass where it has one and the layer runs by taps, else the layers one after
 * the other. y is the pool's output and its arg-max the pool's work[0]; conv_out the convolution's
 * own output buffer, which the fallback computes through. */
crew_status crew_conv2d_pool_forward(crew_layer *conv, crew_layer *pool, const crew_pass *p, const float *x,
                                     float *conv_out, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    crew_window g = {0};
    CREW_TRY(crew_conv2d_window(conv, p->rows, &g));
    if (o->conv_taps_pool_forward && by_taps(conv, p, &g)) {
        const float *bias = conv->spec.no_bias ? NULL : conv->params[1].value;
        o->conv_taps_pool_forward(p->be->ctx, x, conv->params[0].value, bias, y, (int32_t *)pool->work[0], &g,
                                  conv->spec.filters);
        return CREW_OK;
    }
    if (!conv_out) /* a run on a kind that said it had the one pass (crew_act_storage.conv_one_pass) */
        return crew_errorf(CREW_CODE_INTERNAL, "the device has no one pass for this convolution, its relu and pool, and "
                           "its output has no buffer");
    CREW_TRY(conv->ops->forward(conv, p, x, conv_out));
    return pool->ops->forward(pool, p, conv_out, y);
}

/* dy: the gradient of the pool's output. The fallback writes the pool's dx over conv_out, whose
 * values nothing reads any more (the pool keeps its arg-max, the relu is folded into it, and the
 * convolution's backward reads x), then runs the convolution's backward on it. */
crew_status crew_conv2d_pool_backward(crew_layer *conv, crew_layer *pool, const crew_pass *p, const float *x,
                                      float *conv_out, const float *dy)
{
    const crew_backend_ops *o = p->be->ops;
    crew_window g = {0};
    CREW_TRY(crew_conv2d_window(conv, p->rows, &g));
    if (o->conv_taps_pool_grads && by_taps(conv, p, &g)) {
        o->conv_taps_pool_grads(p->be->ctx, x, dy, (const int32_t *)pool->work[0], conv->params[0].grad,
                                conv->spec.no_bias ? NULL : conv->params[1].grad, &g, conv->spec.filters);
        return CREW_OK;
    }
    if (!conv_out) return crew_errorf(CREW_CODE_INTERNAL, "the convolution's output has no buffer for the pool's dx");
    CREW_TRY(pool->ops->backward(pool, p, conv_out, NULL, dy, conv_out));
    return conv->ops->backward(conv, p, x, NULL, conv_out, NULL);
}

/* the columns: backward rebuilds them from x, chunk by chunk */
const crew_layer_ops crew_conv2d_ops = {.build = conv_build,
                                        .workspace = conv_workspace,
                                        .forward = conv_forward,
                                        .backward = conv_backward,
                                        .release = crew_layer_free_work,
                                        .scratch = 1u << 0};
