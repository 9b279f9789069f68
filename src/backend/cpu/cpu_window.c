/* cpu_window.c — im2col/col2im for convolution and max/average pooling, NHWC.
 * Loops run with the channel axis innermost, where memory is contiguous, and the backward ops
 * scatter in the order of the window positions; the index math (which input cell a tap reads, how
 * many cells a window has inside the image) is backend/body/window.h's, whose gathering bodies the
 * CUDA kernels run and tests/test_kernel_bodies.c holds to these loops bit for bit. */
#include <string.h>

#include "backend/body/window.h"
#include "backend/cpu/cpu_ops.h"

/* The taps of one kernel row are neighbours in the input whatever the stride: for output column
 * ow, tap kw reads input column iw0 + kw. Those inside the image form one run, kw in [*lo, *hi)
 * (empty when *lo >= *hi), so a row of the columns is one copy between two stretches of padding
 * instead of k_w separately bounds-checked taps. */
static inline int64_t tap_run(const crew_window *g, int64_t ow, int64_t *lo, int64_t *hi)
{
    int64_t iw0 = crew_window_col(g, ow, 0);
    *lo = iw0 < 0 ? -iw0 : 0;
    *hi = g->in_w - iw0 < g->k_w ? g->in_w - iw0 : g->k_w;
    return iw0;
}

void cpu_im2col(void *ctx, const float *x, float *col, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c, row_len = g->k_w * c;
    float *dst = col;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                int64_t lo, hi, iw0 = tap_run(g, ow, &lo, &hi);
                for (int64_t kh = 0; kh < g->k_h; kh++, dst += row_len) {
                    int64_t ih = crew_window_row(g, oh, kh);
                    if (ih < 0 || ih >= g->in_h || lo >= hi) {
                        for (int64_t i = 0; i < row_len; i++) dst[i] = 0.0f;
                        continue;
                    }
                    /* Loops, not memcpy: with few channels (the first layer) a call per run costs more. */
                    const float *src = x + ((b * g->in_h + ih) * g->in_w + iw0 + lo) * c;
                    for (int64_t i = 0; i < lo * c; i++) dst[i] = 0.0f;
                    for (int64_t i = 0, n = (hi - lo) * c; i < n; i++) dst[lo * c + i] = src[i];
                    for (int64_t i = hi * c; i < row_len; i++) dst[i] = 0.0f;
                }
            }
}

void cpu_col2im(void *ctx, const float *col, float *dx, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c, row_len = g->k_w * c;
    memset(dx, 0, (size_t)crew_window_in_cells(g) * sizeof(float));
    const float *src = col;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                int64_t lo, hi, iw0 = tap_run(g, ow, &lo, &hi);
                for (int64_t kh = 0; kh < g->k_h; kh++, src += row_len) {
                    int64_t ih = crew_window_row(g, oh, kh);
                    if (ih < 0 || ih >= g->in_h || lo >= hi) continue;
                    float *d = dx + ((b * g->in_h + ih) * g->in_w + iw0 + lo) * c;
                    for (int64_t i = 0, n = (hi - lo) * c; i < n; i++) d[i] += src[lo * c + i];
                }
            }
}

/* Windows that tile the input exactly (stride = kernel, no padding, no cells left over: every
 * pooling of the examples) hold each input cell once: one pass writes every dx, the window's
 * gradient where its maximum was and 0 elsewhere, instead of zeroing dx and then adding into it.
 * 0.0f + dy is what the zeroed sum held, so the bits are the same (-0 included). */
static int tiles_input(const crew_window *g)
{
    return g->stride_h == g->k_h && g->stride_w == g->k_w && g->pad_top == 0 && g->pad_left == 0 &&
           g->out_h * g->k_h == g->in_h && g->out_w * g->k_w == g->in_w;
}

/* 2x2 windows that tile the input (Keras's default pooling, every one of the examples): a window's
 * four cells are two neighbours in each of two input rows, so one loop over the channels takes
 * all four, the maximum and arg-max in registers, where the general loop makes a pass over y and
 * argmax per cell (twice as long on the demo CNN). The same comparisons in the same order (the
 * window row-major, a later cell winning only when strictly greater), so the same outputs. */
static inline void maxpool_2x2_rows(const float *x, float *y, int32_t *argmax, const crew_window *g, int relu_in)
{
    const int64_t c = g->in_c, row = g->in_w * c;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * c;
                const int64_t first = ((b * g->in_h + 2 * oh) * g->in_w + 2 * ow) * c;
                const int64_t cell[4] = {first, first + c, first + row, first + row + c};
                for (int64_t i = 0; i < c; i++) {
                    float best = relu_in ? crew_act_relu(x[first + i]) : x[first + i];
                    int32_t at = (int32_t)(first + i);
                    for (int k = 1; k < 4; k++) {
                        const float v = relu_in ? crew_act_relu(x[cell[k] + i]) : x[cell[k] + i];
                        const int gt = v > best;
                        best = gt ? v : best;
                        at = gt ? (int32_t)(cell[k] + i) : at;
                    }
                    y[o + i] = best;
                    argmax[o + i] = relu_in && !(best > 0.0f) ? -1 : at;
                }
            }
}

/* One output pixel's c channels over its window. Branch-free inner loop (select instead of if),
 * so it vectorises: with random data a branch on "greater" mispredicts half the time. The first
 * in-image cell of the window seeds the max. relu_in is a constant at each call, so each variant
 * is a loop of its own. */
static inline void maxpool_pixel(const float *x, float *yo, int32_t *ao, const crew_window *g, int64_t b, int64_t oh,
                                 int64_t ow, int relu_in)
{
    const int64_t c = g->in_c;
    int seeded = 0;
    for (int64_t kh = 0; kh < g->k_h; kh++)
        for (int64_t kw = 0; kw < g->k_w; kw++) {
            int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
            if (cell < 0) continue;
            const float *src = x + cell * c;
            const int32_t base = (int32_t)(cell * c);
            if (!seeded) {
                for (int64_t i = 0; i < c; i++) {
                    yo[i] = relu_in ? crew_act_relu(src[i]) : src[i];
                    ao[i] = base + (int32_t)i;
                }
                seeded = 1;
                continue;
            }
            for (int64_t i = 0; i < c; i++) {
                const float v = relu_in ? crew_act_relu(src[i]) : src[i];
                int gt = v > yo[i];
                yo[i] = gt ? v : yo[i];
                ao[i] = gt ? base + (int32_t)i : ao[i];
            }
        }
    if (!seeded) /* a window entirely in the padding: impossible with TF's rules */
        for (int64_t i = 0; i < c; i++) {
            yo[i] = 0.0f;
            ao[i] = -1;
        }
    if (relu_in) /* where relu's backward would send 0 back, nothing goes back */
        for (int64_t i = 0; i < c; i++) ao[i] = yo[i] > 0.0f ? ao[i] : -1;
}

void cpu_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g, int relu_in)
{
    (void)ctx;
    if (tiles_input(g) && g->k_h == 2 && g->k_w == 2) {
        if (relu_in)
            maxpool_2x2_rows(x, y, argmax, g, 1);
        else
            maxpool_2x2_rows(x, y, argmax, g, 0);
        return;
    }
    const int64_t c = g->in_c;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * c;
                if (relu_in)
                    maxpool_pixel(x, y + o, argmax + o, g, b, oh, ow, 1);
                else
                    maxpool_pixel(x, y + o, argmax + o, g, b, oh, ow, 0);
            }
}

void cpu_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g)
{
    (void)ctx;
    const int64_t n_in = crew_window_in_cells(g), n_out = crew_window_out_cells(g), c = g->in_c;
    if (!tiles_input(g)) {
        memset(dx, 0, (size_t)n_in * sizeof(float));
        for (int64_t i = 0; i < n_out; i++)
            if (argmax[i] >= 0) dx[argmax[i]] += dy[i];
        return;
    }
    const int two = g->k_h == 2 && g->k_w == 2, row = (int)(g->in_w * c);
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * c;
                const float *dyo = dy + o;
                const int32_t *ao = argmax + o;
                if (two) { /* the four cells in one loop, as the forward pass (maxpool_2x2_rows) */
                    const int32_t first = (int32_t)(((b * g->in_h + 2 * oh) * g->in_w + 2 * ow) * c);
                    float *d = dx + first;
                    for (int32_t i = 0; i < (int32_t)c; i++) {
                        const int32_t a = ao[i] - first;
                        const float g0 = 0.0f + dyo[i];
                        d[i] = a == i ? g0 : 0.0f;
                        d[i + c] = a == i + (int32_t)c ? g0 : 0.0f;
                        d[i + row] = a == i + row ? g0 : 0.0f;
                        d[i + row + c] = a == i + row + (int32_t)c ? g0 : 0.0f;
                    }
                    continue;
                }
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++) {
                        const int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
                        float *d = dx + cell * c;
                        const int32_t base = (int32_t)(cell * c);
                        for (int64_t i = 0; i < c; i++) d[i] = ao[i] == base + (int32_t)i ? 0.0f + dyo[i] : 0.0f;
                    }
            }
}

void cpu_avgpool_forward(void *ctx, const float *x, float *y, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                float *dst = y + ((b * g->out_h + oh) * g->out_w + ow) * c;
                memset(dst, 0, (size_t)c * sizeof(float));
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++) {
                        int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0) continue;
                        const float *src = x + cell * c;
                        for (int64_t i = 0; i < c; i++) dst[i] += src[i];
                    }
                const float inv = crew_avgpool_scale(g, oh, ow);
                for (int64_t i = 0; i < c; i++) dst[i] *= inv;
            }
}

void cpu_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c;
    memset(dx, 0, (size_t)crew_window_in_cells(g) * sizeof(float));
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const float *src = dy + ((b * g->out_h + oh) * g->out_w + ow) * c;
                const float inv = crew_avgpool_scale(g, oh, ow);
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++) {
                        int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0) continue;
                        float *d = dx + cell * c;
                        for (int64_t i = 0; i < c; i++) d[i] += src[i] * inv;
                    }
            }
}
