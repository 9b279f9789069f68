/* cpu_conv_direct.c — convolution by direct sums: the "library" of the cpu-remote test kind.
 *
 * Why it exists: a GPU's convolutions may run by its library (cuDNN) instead of the layer's
 * im2col + GEMM, chosen per layer (--conv). Everything around that choice (the plan, the device
 * options, the layers' flags, checkpoints, resume, N replicas equal to one) is host code that
 * must be tested where CI runs, without a GPU. cpu-remote stands in for a GPU already (memory the
 * host cannot reach); these three passes give it a second way to convolve, with other sums in
 * another order than im2col + GEMM, so that a test can tell which way a layer ran. It is slow by
 * design and never offered to --conv auto (crew_device_kind.conv_auto).
 *
 * Like cuDNN (cuda_conv.cu) it pads both sides alike, so it runs only the geometries whose
 * output size with the top and left padding on both sides is the layer's
 * (cpu_conv_direct_supported): a layer of another geometry falls back to im2col, as on a GPU.
 *
 * Layouts as the layer's: x [batch, in_h, in_w, in_c], kernel [k_h, k_w, in_c, out_c],
 * y and dy [batch, out_h, out_w, out_c]. Sums run in float, in the loops' fixed order. */
#include "backend/body/window.h"
#include "backend/cpu/cpu_ops.h"

int cpu_conv_direct_supported(const crew_window *g)
{
    return (g->in_h + 2 * g->pad_top - g->k_h) / g->stride_h + 1 == g->out_h &&
           (g->in_w + 2 * g->pad_left - g->k_w) / g->stride_w + 1 == g->out_w;
}

/* x's row and column under output (oh, ow) and window cell (i, j); -1 in the padding */
static int64_t in_row(const crew_window *g, int64_t oh, int64_t i)
{
    int64_t r = crew_window_row(g, oh, i);
    return r >= 0 && r < g->in_h ? r : -1;
}

static int64_t in_col(const crew_window *g, int64_t ow, int64_t j)
{
    int64_t c = crew_window_col(g, ow, j);
    return c >= 0 && c < g->in_w ? c : -1;
}

/* y += x ⋆ kernel: each output's sum over the window, channels innermost */
void cpu_conv_direct_forward(const float *x, const float *kernel, float *y, const crew_window *g, int64_t out_c)
{
    const int64_t C = g->in_c;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                float *yo = y + ((b * g->out_h + oh) * g->out_w + ow) * out_c;
                for (int64_t f = 0; f < out_c; f++) {
                    float acc = 0.0f;
                    for (int64_t i = 0; i < g->k_h; i++) {
                        int64_t r = in_row(g, oh, i);
                        for (int64_t j = 0; r >= 0 && j < g->k_w; j++) {
                            int64_t c = in_col(g, ow, j);
                            if (c < 0) continue;
                            const float *xi = x + ((b * g->in_h + r) * g->in_w + c) * C;
                            const float *ki = kernel + (i * g->k_w + j) * C * out_c + f;
                            for (int64_t ch = 0; ch < C; ch++) acc += xi[ch] * ki[ch * out_c];
                        }
                    }
                    yo[f] += acc;
                }
            }
}

/* dx = dy ⋆ kernelᵀ: each input cell's sum over the outputs whose windows cover it */
void cpu_conv_direct_backward_data(const float *dy, const float *kernel, float *dx, const crew_window *g,
                                   int64_t out_c)
{
    const int64_t C = g->in_c;
    for (int64_t n = 0; n < g->batch * g->in_h * g->in_w * C; n++) dx[n] = 0.0f;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const float *dyo = dy + ((b * g->out_h + oh) * g->out_w + ow) * out_c;
                for (int64_t i = 0; i < g->k_h; i++) {
                    int64_t r = in_row(g, oh, i);
                    for (int64_t j = 0; r >= 0 && j < g->k_w; j++) {
                        int64_t c = in_col(g, ow, j);
                        if (c < 0) continue;
                        float *dxi = dx + ((b * g->in_h + r) * g->in_w + c) * C;
                        const float *ki = kernel + (i * g->k_w + j) * C * out_c;
                        for (int64_t ch = 0; ch < C; ch++) {
                            float acc = 0.0f;
                            for (int64_t f = 0; f < out_c; f++) acc += dyo[f] * ki[ch * out_c + f];
                            dxi[ch] += acc;
                        }
                    }
                }
            }
}

/* dkernel = Σ over the batch and the outputs of x's window cell × dy (overwritten) */
void cpu_conv_direct_backward_filter(const float *x, const float *dy, float *dkernel, const crew_window *g,
                                     int64_t out_c)
{
    const int64_t C = g->in_c;
    for (int64_t n = 0; n < g->k_h * g->k_w * C * out_c; n++) dkernel[n] = 0.0f;
    for (int64_t i = 0; i < g->k_h; i++)
        for (int64_t j = 0; j < g->k_w; j++)
            for (int64_t ch = 0; ch < C; ch++) {
                float *dk = dkernel + ((i * g->k_w + j) * C + ch) * out_c;
                for (int64_t b = 0; b < g->batch; b++)
                    for (int64_t oh = 0; oh < g->out_h; oh++) {
                        int64_t r = in_row(g, oh, i);
                        for (int64_t ow = 0; r >= 0 && ow < g->out_w; ow++) {
                            int64_t c = in_col(g, ow, j);
                            if (c < 0) continue;
                            const float xv = x[((b * g->in_h + r) * g->in_w + c) * C + ch];
                            const float *dyo = dy + ((b * g->out_h + oh) * g->out_w + ow) * out_c;
                            for (int64_t f = 0; f < out_c; f++) dk[f] += xv * dyo[f];
                        }
                    }
            }
}
