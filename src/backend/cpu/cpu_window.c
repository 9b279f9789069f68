/* cpu_window.c — im2col/col2im for convolution and max/average pooling, NHWC.
 * Loops run with the channel axis innermost, where memory is contiguous. */
#include <float.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

/* The input cell under window position (oh, ow) and kernel tap (kh, kw), or -1 outside. */
static inline int64_t window_cell(const crew_window *g, int64_t b, int64_t oh, int64_t ow, int64_t kh,
                                  int64_t kw)
{
    int64_t ih = oh * g->stride_h - g->pad_top + kh;
    int64_t iw = ow * g->stride_w - g->pad_left + kw;
    if (ih < 0 || ih >= g->in_h || iw < 0 || iw >= g->in_w) return -1;
    return (b * g->in_h + ih) * g->in_w + iw;
}

void cpu_im2col(void *ctx, const float *x, float *col, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                float *dst = col + ((b * g->out_h + oh) * g->out_w + ow) * g->k_h * g->k_w * c;
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++, dst += c) {
                        int64_t cell = window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0)
                            memset(dst, 0, (size_t)c * sizeof(float));
                        else
                            memcpy(dst, x + cell * c, (size_t)c * sizeof(float));
                    }
            }
}

void cpu_col2im(void *ctx, const float *col, float *dx, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c;
    memset(dx, 0, (size_t)(g->batch * g->in_h * g->in_w * c) * sizeof(float));
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const float *src = col + ((b * g->out_h + oh) * g->out_w + ow) * g->k_h * g->k_w * c;
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++, src += c) {
                        int64_t cell = window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0) continue;
                        float *d = dx + cell * c;
                        for (int64_t i = 0; i < c; i++) d[i] += src[i];
                    }
            }
}

void cpu_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * c;
                for (int64_t i = 0; i < c; i++) {
                    y[o + i] = -FLT_MAX;
                    argmax[o + i] = -1;
                }
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++) {
                        int64_t cell = window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0) continue;
                        const float *src = x + cell * c;
                        for (int64_t i = 0; i < c; i++)
                            if (src[i] > y[o + i] || argmax[o + i] < 0) {
                                y[o + i] = src[i];
                                argmax[o + i] = (int32_t)(cell * c + i);
                            }
                    }
            }
}

void cpu_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g)
{
    (void)ctx;
    const int64_t n_in = g->batch * g->in_h * g->in_w * g->in_c;
    const int64_t n_out = g->batch * g->out_h * g->out_w * g->in_c;
    memset(dx, 0, (size_t)n_in * sizeof(float));
    for (int64_t i = 0; i < n_out; i++)
        if (argmax[i] >= 0) dx[argmax[i]] += dy[i];
}

static int64_t window_count(const crew_window *g, int64_t oh, int64_t ow)
{
    int64_t n = 0;
    for (int64_t kh = 0; kh < g->k_h; kh++)
        for (int64_t kw = 0; kw < g->k_w; kw++) n += window_cell(g, 0, oh, ow, kh, kw) >= 0;
    return n;
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
                        int64_t cell = window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0) continue;
                        const float *src = x + cell * c;
                        for (int64_t i = 0; i < c; i++) dst[i] += src[i];
                    }
                int64_t n = window_count(g, oh, ow);
                float inv = n ? 1.0f / (float)n : 0.0f;
                for (int64_t i = 0; i < c; i++) dst[i] *= inv;
            }
}

void cpu_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *g)
{
    (void)ctx;
    const int64_t c = g->in_c;
    memset(dx, 0, (size_t)(g->batch * g->in_h * g->in_w * c) * sizeof(float));
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const float *src = dy + ((b * g->out_h + oh) * g->out_w + ow) * c;
                int64_t n = window_count(g, oh, ow);
                float inv = n ? 1.0f / (float)n : 0.0f;
                for (int64_t kh = 0; kh < g->k_h; kh++)
                    for (int64_t kw = 0; kw < g->k_w; kw++) {
                        int64_t cell = window_cell(g, b, oh, ow, kh, kw);
                        if (cell < 0) continue;
                        float *d = dx + cell * c;
                        for (int64_t i = 0; i < c; i++) d[i] += src[i] * inv;
                    }
            }
}
