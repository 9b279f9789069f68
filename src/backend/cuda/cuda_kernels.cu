/* cuda_kernels.cu — the CUDA backend's compute ops: one kernel (or a few) per op of backend.h,
 * each the CPU kernel's arithmetic (src/backend/cpu/) in the same order, so that results differ
 * from the CPU's only where the two libraries' exp, erf and tanh round differently, and where
 * cuBLAS sums a product in another order.
 *
 * Why these shapes: every output element is written by one thread that gathers what it needs in a
 * fixed order; nothing is scattered with atomics (col2im, the pooling gradients and the embedding
 * gradient gather from the elements that point at them), so a result never depends on which
 * thread ran first, and a GPU repeats itself bit for bit. The reductions over rows (batch-norm
 * statistics, column sums, layer-norm parameter gradients) give one thread a column and let it
 * walk the rows in order, as the CPU does: slower than a tree, the same sums. The kernels along a
 * row (the loss's softmax over a GPT's 50,257 logits, attention's softmax, layer norm) give each
 * row a warp, so that every load is coalesced (row_kernels below): their sums run in a fixed order
 * of their own, not the CPU's serial one. Built with
 * --fmad=false (CMakeLists.txt) so that a·b + c is never contracted where the CPU rounds twice;
 * where the CPU fuses on purpose (AdamW's fmaf), so does this. */
#include <math.h>
#include <stdint.h>

#include <cub/cub.cuh>
#include <cuda_bf16.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/exp_poly.h"

extern "C" {
#include "core/rng.h"
#include "core/status.h"
}

#define CREW_SQRT1_2 0.70710678118654752440f
#define CREW_INV_SQRT_2PI 0.39894228040143267794f
#define CREW_SQRT_2_OVER_PI 0.79788456080286535588f
#define CREW_GELU_CUBIC 0.044715f

/* A grid-stride loop over [0, n). */
#define FOR_EACH(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                            i += (int64_t)blockDim.x * gridDim.x)

#define LAUNCH(c, n) <<<cuda_blocks(n), CUDA_THREADS, 0, (c)->stream>>>

/* ---- row kernels: a warp per row. Lane l takes elements l, l + 32, l + 64, ... of the row in
 * order, so the warp reads 32 neighbours at a time; the lanes' partial results then meet in a
 * butterfly of shuffles, which leaves the same total, bit for bit, in every lane (each level adds
 * the same two numbers in each lane of a pair, and a + b == b + a). The order of a row's sum is
 * fixed by the warp's width alone: the same on every run, every GPU count and every row length's
 * grid, though not the CPU's serial order (the values differ from the CPU's in the last bits). */
#define ROW_LANES 32
#define LANE ((int64_t)(threadIdx.x % ROW_LANES))
#define FOR_EACH_ROW(r, rows) \
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / ROW_LANES; r < (rows); \
         r += (int64_t)gridDim.x * blockDim.x / ROW_LANES)
/* whole warps: CUDA_THREADS is a multiple of ROW_LANES, and every lane of a warp has the same r */
#define LAUNCH_ROWS(c, rows) <<<cuda_blocks((rows) * ROW_LANES), CUDA_THREADS, 0, (c)->stream>>>

__device__ static float warp_sum(float v)
{
    for (int k = ROW_LANES / 2; k > 0; k /= 2) v += __shfl_xor_sync(0xffffffffu, v, k);
    return v;
}

__device__ static float warp_max(float v)
{
    for (int k = ROW_LANES / 2; k > 0; k /= 2) {
        float o = __shfl_xor_sync(0xffffffffu, v, k);
        v = o > v ? o : v;
    }
    return v;
}

/* The largest value and its first index (the CPU's first maximum): ties go to the smaller index. */
__device__ static void warp_argmax(float *v, long long *at)
{
    for (int k = ROW_LANES / 2; k > 0; k /= 2) {
        float o = __shfl_xor_sync(0xffffffffu, *v, k);
        long long oi = __shfl_xor_sync(0xffffffffu, *at, k);
        if (o > *v || (o == *v && oi < *at)) {
            *v = o;
            *at = oi;
        }
    }
}

static cuda_ctx *enter(void *ctx)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    return c;
}

/* ------------------------------------------------------------------ elementwise */

__global__ void k_fill(float *x, float v, int64_t n) { FOR_EACH(i, n) x[i] = v; }
__global__ void k_axpby(int64_t n, float alpha, const float *x, float beta, float *y)
{
    FOR_EACH(i, n) y[i] = alpha * x[i] + beta * y[i];
}
__global__ void k_mul(int64_t n, const float *a, const float *b, float *out) { FOR_EACH(i, n) out[i] = a[i] * b[i]; }
__global__ void k_broadcast_rows(float *y, const float *bias, int64_t rows, int64_t cols)
{
    FOR_EACH(i, rows * cols) y[i] = bias[i % cols];
}
/* One thread per column, the rows in order. */
__global__ void k_col_sum(const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    FOR_EACH(j, cols) {
        float s = accumulate ? out[j] : 0.0f;
        for (int64_t r = 0; r < rows; r++) s += x[r * cols + j];
        out[j] = s;
    }
}

void cuda_fill(void *ctx, float *x, float value, int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_fill LAUNCH(c, n)(x, value, n);
    cuda_launched(c, "fill");
}

void cuda_axpby(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_axpby LAUNCH(c, n)(n, alpha, x, beta, y);
    cuda_launched(c, "axpby");
}

void cuda_mul(void *ctx, int64_t n, const float *a, const float *b, float *out)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_mul LAUNCH(c, n)(n, a, b, out);
    cuda_launched(c, "mul");
}

void cuda_broadcast_rows(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols)
{
    cuda_ctx *c = enter(ctx);
    if (rows * cols <= 0) return;
    k_broadcast_rows LAUNCH(c, rows * cols)(y, bias, rows, cols);
    cuda_launched(c, "broadcast_rows");
}

void cuda_col_sum(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    cuda_ctx *c = enter(ctx);
    if (cols <= 0) return;
    k_col_sum LAUNCH(c, cols)(x, rows, cols, out, accumulate);
    cuda_launched(c, "col_sum");
}

/* ------------------------------------------------------------------ activations, dropout */

__device__ static float sigmoid_of(float x)
{
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

__global__ void k_act_forward(crew_activation act, const float *x, float *y, int64_t n)
{
    FOR_EACH(i, n) {
        float v = x[i];
        switch (act) {
        case CREW_ACT_RELU: y[i] = v > 0.0f ? v : 0.0f; break;
        case CREW_ACT_GELU: y[i] = 0.5f * v * (1.0f + erff(v * CREW_SQRT1_2)); break;
        case CREW_ACT_GELU_TANH: {
            float u = CREW_SQRT_2_OVER_PI * (v + CREW_GELU_CUBIC * v * v * v);
            y[i] = v / (1.0f + crew_exp_poly(-2.0f * u));
            break;
        }
        case CREW_ACT_TANH: y[i] = tanhf(v); break;
        case CREW_ACT_SIGMOID: y[i] = sigmoid_of(v); break;
        default: y[i] = v; break;
        }
    }
}

__global__ void k_act_backward(crew_activation act, const float *x, const float *y, const float *dy, float *dx,
                               int64_t n)
{
    FOR_EACH(i, n) {
        float g = dy[i];
        switch (act) {
        case CREW_ACT_RELU: dx[i] = y[i] > 0.0f ? g : 0.0f; break;
        case CREW_ACT_GELU: {
            float xi = x[i], cdf = 0.5f * (1.0f + erff(xi * CREW_SQRT1_2));
            float pdf = CREW_INV_SQRT_2PI * expf(-0.5f * xi * xi);
            dx[i] = g * (cdf + xi * pdf);
            break;
        }
        case CREW_ACT_GELU_TANH: {
            float xi = x[i], u = CREW_SQRT_2_OVER_PI * (xi + CREW_GELU_CUBIC * xi * xi * xi);
            float sg = 1.0f / (1.0f + crew_exp_poly(-2.0f * u));
            float du = CREW_SQRT_2_OVER_PI * (1.0f + 3.0f * CREW_GELU_CUBIC * xi * xi);
            dx[i] = g * (sg + 2.0f * xi * sg * (1.0f - sg) * du);
            break;
        }
        case CREW_ACT_TANH: dx[i] = g * (1.0f - y[i] * y[i]); break;
        case CREW_ACT_SIGMOID: dx[i] = g * y[i] * (1.0f - y[i]); break;
        default: dx[i] = g; break;
        }
    }
}

void cuda_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_act_forward LAUNCH(c, n)(act, x, y, n);
    cuda_launched(c, "activation");
}

void cuda_act_backward(void *ctx, crew_activation act, const float *x, const float *y, const float *dy, float *dx,
                       int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_act_backward LAUNCH(c, n)(act, x, y, dy, dx, n);
    cuda_launched(c, "activation backward");
}

/* The CPU's counter-based stream (core/rng.h): the same masks for the same samples. */
__global__ void k_dropout(const float *x, float *y, float *mask, int64_t rows, int64_t cols, float rate, uint64_t key,
                          const int64_t *sample_ids)
{
    const float keep_scale = 1.0f / (1.0f - rate);
    FOR_EACH(i, rows * cols) {
        int64_t r = i / cols, j = i % cols;
        uint64_t row_key = crew_rng_key(key, (uint64_t)sample_ids[r], 0, 0);
        float m = crew_rng_uniform(row_key, (uint64_t)j) >= rate ? keep_scale : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m;
    }
}

void cuda_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols, float rate,
                          uint64_t key, const int64_t *sample_ids)
{
    cuda_ctx *c = enter(ctx);
    if (rows * cols <= 0) return;
    k_dropout LAUNCH(c, rows * cols)(x, y, mask, rows, cols, rate, key, sample_ids);
    cuda_launched(c, "dropout");
}

/* ------------------------------------------------------------------ windows: im2col, pooling */

/* The cells of a window op's input and output [batch, h, w, c], and the coordinates of cell i of
 * such an array, channel fastest (NHWC). */
static int64_t in_cells(const crew_window &g) { return g.batch * g.in_h * g.in_w * g.in_c; }
static int64_t out_cells(const crew_window &g) { return g.batch * g.out_h * g.out_w * g.in_c; }
__device__ static void cell_at(int64_t i, int64_t c, int64_t w, int64_t h, int64_t *ci, int64_t *x, int64_t *y,
                               int64_t *b)
{
    *ci = i % c;
    *x = i / c % w;
    *y = i / (c * w) % h;
    *b = i / (c * w * h);
}

/* col [batch·out_h·out_w, k_h·k_w·c]: element (row, (kh·k_w + kw)·c + ci). */
__global__ void k_im2col(const float *x, float *col, crew_window g)
{
    const int64_t c = g.in_c, width = g.k_h * g.k_w * c, n = g.batch * g.out_h * g.out_w * width;
    FOR_EACH(i, n) {
        int64_t row = i / width, e = i % width, ci = e % c, tap = e / c, kw = tap % g.k_w, kh = tap / g.k_w;
        int64_t ow = row % g.out_w, oh = row / g.out_w % g.out_h, b = row / (g.out_w * g.out_h);
        int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
        col[i] = ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w ? 0.0f : x[((b * g.in_h + ih) * g.in_w + iw) * c + ci];
    }
}

/* dx (b, ih, iw, ci) = Σ of the column entries that read it, in the CPU's order: window rows oh
 * ascending, then columns ow. */
__global__ void k_col2im(const float *col, float *dx, crew_window g)
{
    const int64_t c = g.in_c, width = g.k_h * g.k_w * c, n = g.batch * g.in_h * g.in_w * c;
    FOR_EACH(i, n) {
        int64_t ci, iw, ih, b;
        cell_at(i, c, g.in_w, g.in_h, &ci, &iw, &ih, &b);
        float s = 0.0f;
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            int64_t kh = ih - (oh * g.stride_h - g.pad_top);
            if (kh < 0 || kh >= g.k_h) continue;
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                int64_t kw = iw - (ow * g.stride_w - g.pad_left);
                if (kw < 0 || kw >= g.k_w) continue;
                int64_t row = (b * g.out_h + oh) * g.out_w + ow;
                s += col[row * width + (kh * g.k_w + kw) * c + ci];
            }
        }
        dx[i] = s;
    }
}

void cuda_im2col(void *ctx, const float *x, float *col, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    int64_t n = g->batch * g->out_h * g->out_w * g->k_h * g->k_w * g->in_c;
    if (n <= 0) return;
    k_im2col LAUNCH(c, n)(x, col, *g);
    cuda_launched(c, "im2col");
}

void cuda_col2im(void *ctx, const float *col, float *dx, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = in_cells(*g);
    if (n <= 0) return;
    k_col2im LAUNCH(c, n)(col, dx, *g);
    cuda_launched(c, "col2im");
}

/* The first in-image cell seeds the maximum; a later one wins only when strictly greater. */
__global__ void k_maxpool_forward(const float *x, float *y, int32_t *argmax, crew_window g)
{
    const int64_t c = g.in_c, n = g.batch * g.out_h * g.out_w * c;
    FOR_EACH(i, n) {
        int64_t ci, ow, oh, b;
        cell_at(i, c, g.out_w, g.out_h, &ci, &ow, &oh, &b);
        int seeded = 0;
        float best = 0.0f;
        int32_t at = -1;
        for (int64_t kh = 0; kh < g.k_h; kh++)
            for (int64_t kw = 0; kw < g.k_w; kw++) {
                int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
                if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
                int64_t cell = ((b * g.in_h + ih) * g.in_w + iw) * c + ci;
                float v = x[cell];
                if (!seeded || v > best) {
                    best = v;
                    at = (int32_t)cell;
                    seeded = 1;
                }
            }
        y[i] = seeded ? best : 0.0f;
        argmax[i] = at;
    }
}

/* dx (cell) = Σ dy[o] over the outputs o whose argmax is the cell, o ascending (the CPU's order). */
__global__ void k_maxpool_backward(const float *dy, const int32_t *argmax, float *dx, crew_window g)
{
    const int64_t c = g.in_c, n = g.batch * g.in_h * g.in_w * c;
    FOR_EACH(i, n) {
        int64_t ci, iw, ih, b;
        cell_at(i, c, g.in_w, g.in_h, &ci, &iw, &ih, &b);
        float s = 0.0f;
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            int64_t kh = ih - (oh * g.stride_h - g.pad_top);
            if (kh < 0 || kh >= g.k_h) continue;
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                int64_t kw = iw - (ow * g.stride_w - g.pad_left);
                if (kw < 0 || kw >= g.k_w) continue;
                int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * c + ci;
                if (argmax[o] == (int32_t)i) s += dy[o];
            }
        }
        dx[i] = s;
    }
}

__device__ static int64_t cells_in_window(const crew_window &g, int64_t oh, int64_t ow)
{
    int64_t n = 0;
    for (int64_t kh = 0; kh < g.k_h; kh++)
        for (int64_t kw = 0; kw < g.k_w; kw++) {
            int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
            n += ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
        }
    return n;
}

__global__ void k_avgpool_forward(const float *x, float *y, crew_window g)
{
    const int64_t c = g.in_c, n = g.batch * g.out_h * g.out_w * c;
    FOR_EACH(i, n) {
        int64_t ci, ow, oh, b;
        cell_at(i, c, g.out_w, g.out_h, &ci, &ow, &oh, &b);
        float s = 0.0f;
        for (int64_t kh = 0; kh < g.k_h; kh++)
            for (int64_t kw = 0; kw < g.k_w; kw++) {
                int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
                if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
                s += x[((b * g.in_h + ih) * g.in_w + iw) * c + ci];
            }
        int64_t cells = cells_in_window(g, oh, ow);
        y[i] = s * (cells ? 1.0f / (float)cells : 0.0f);
    }
}

__global__ void k_avgpool_backward(const float *dy, float *dx, crew_window g)
{
    const int64_t c = g.in_c, n = g.batch * g.in_h * g.in_w * c;
    FOR_EACH(i, n) {
        int64_t ci, iw, ih, b;
        cell_at(i, c, g.in_w, g.in_h, &ci, &iw, &ih, &b);
        float s = 0.0f;
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            int64_t kh = ih - (oh * g.stride_h - g.pad_top);
            if (kh < 0 || kh >= g.k_h) continue;
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                int64_t kw = iw - (ow * g.stride_w - g.pad_left);
                if (kw < 0 || kw >= g.k_w) continue;
                int64_t cells = cells_in_window(g, oh, ow);
                s += dy[((b * g.out_h + oh) * g.out_w + ow) * c + ci] * (cells ? 1.0f / (float)cells : 0.0f);
            }
        }
        dx[i] = s;
    }
}

void cuda_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = out_cells(*g);
    if (n <= 0) return;
    k_maxpool_forward LAUNCH(c, n)(x, y, argmax, *g);
    cuda_launched(c, "max pooling");
}

void cuda_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = in_cells(*g);
    if (n <= 0) return;
    k_maxpool_backward LAUNCH(c, n)(dy, argmax, dx, *g);
    cuda_launched(c, "max pooling backward");
}

void cuda_avgpool_forward(void *ctx, const float *x, float *y, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = out_cells(*g);
    if (n <= 0) return;
    k_avgpool_forward LAUNCH(c, n)(x, y, *g);
    cuda_launched(c, "average pooling");
}

void cuda_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = in_cells(*g);
    if (n <= 0) return;
    k_avgpool_backward LAUNCH(c, n)(dy, dx, *g);
    cuda_launched(c, "average pooling backward");
}

/* ------------------------------------------------------------------ batch norm (per column, rows in order) */

__global__ void k_bn_col_sum(const float *x, int64_t rows, int64_t c, double *out)
{
    FOR_EACH(j, c) {
        double s = 0.0;
        for (int64_t r = 0; r < rows; r++) s += (double)x[r * c + j];
        out[j] = s;
    }
}

__global__ void k_col_sqdev(const float *x, const float *mean, int64_t rows, int64_t c, double *out)
{
    FOR_EACH(j, c) {
        double s = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            float d = x[r * c + j] - mean[j];
            s += (double)(d * d);
        }
        out[j] = s;
    }
}

__global__ void k_bn_scale_sums(int64_t n, double alpha, const double *x, float *y)
{
    FOR_EACH(i, n) y[i] = (float)(alpha * x[i]);
}

__global__ void k_bn_forward(const float *x, const float *mean, const float *var, const float *gamma,
                             const float *beta, float eps, float *y, int64_t rows, int64_t c)
{
    FOR_EACH(i, rows * c) {
        int64_t j = i % c;
        float scale = gamma[j] / sqrtf(var[j] + eps), shift = beta[j] - mean[j] * scale;
        y[i] = x[i] * scale + shift;
    }
}

__global__ void k_bn_backward_sums(const float *dy, const float *x, const float *mean, int64_t rows, int64_t c,
                                   double *sum_dy, double *sum_dy_xmu)
{
    FOR_EACH(j, c) {
        double a = 0.0, b = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            float g = dy[r * c + j];
            a += (double)g;
            b += (double)(g * (x[r * c + j] - mean[j]));
        }
        sum_dy[j] = a;
        sum_dy_xmu[j] = b;
    }
}

__global__ void k_bn_backward(const float *dy, const float *x, const float *mean, const float *var,
                              const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                              double count, float *dx, int64_t rows, int64_t c)
{
    FOR_EACH(i, rows * c) {
        int64_t j = i % c;
        double istd = 1.0 / sqrt((double)(var[j] + eps)), k = (double)gamma[j] * istd;
        float k_dy = (float)k, k_mean = (float)(k * sum_dy[j] / count),
              k_x = (float)(k * istd * istd * sum_dy_xmu[j] / count);
        dx[i] = k_dy * dy[i] - k_mean - k_x * (x[i] - mean[j]);
    }
}

__global__ void k_bn_param_grads(const float *var, float eps, const double *sum_dy, const double *sum_dy_xmu,
                                 float *dgamma, float *dbeta, int64_t c)
{
    FOR_EACH(j, c) {
        dgamma[j] += (float)(sum_dy_xmu[j] / sqrt((double)(var[j] + eps)));
        dbeta[j] += (float)sum_dy[j];
    }
}

void cuda_bn_col_sum(void *ctx, const float *x, int64_t rows, int64_t c, double *out)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_bn_col_sum LAUNCH(cc, c)(x, rows, c, out);
    cuda_launched(cc, "batch-norm sum");
}

void cuda_col_sqdev(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, double *out)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_col_sqdev LAUNCH(cc, c)(x, mean, rows, c, out);
    cuda_launched(cc, "batch-norm deviations");
}

void cuda_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y)
{
    cuda_ctx *cc = enter(ctx);
    if (n <= 0) return;
    k_bn_scale_sums LAUNCH(cc, n)(n, alpha, x, y);
    cuda_launched(cc, "batch-norm statistics");
}

void cuda_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                     const float *beta, float eps, float *y, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows * c <= 0) return;
    k_bn_forward LAUNCH(cc, rows * c)(x, mean, var, gamma, beta, eps, y, rows, c);
    cuda_launched(cc, "batch norm");
}

void cuda_bn_backward_sums(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows, int64_t c,
                           double *sum_dy, double *sum_dy_xmu)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_bn_backward_sums LAUNCH(cc, c)(dy, x, mean, rows, c, sum_dy, sum_dy_xmu);
    cuda_launched(cc, "batch-norm backward sums");
}

void cuda_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                      const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu, double count,
                      float *dx, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows * c <= 0) return;
    k_bn_backward LAUNCH(cc, rows * c)(dy, x, mean, var, gamma, eps, sum_dy, sum_dy_xmu, count, dx, rows, c);
    cuda_launched(cc, "batch norm backward");
}

void cuda_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy, const double *sum_dy_xmu,
                         float *dgamma, float *dbeta, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_bn_param_grads LAUNCH(cc, c)(var, eps, sum_dy, sum_dy_xmu, dgamma, dbeta, c);
    cuda_launched(cc, "batch-norm parameter gradients");
}

/* ------------------------------------------------------------------ layer norm (a warp per row) */

__global__ void k_layernorm_forward(const float *x, const float *gamma, const float *beta, float eps, float *y,
                                    float *mean, float *rstd, int64_t rows, int64_t c)
{
    FOR_EACH_ROW(r, rows) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        float m = 0.0f, v = 0.0f;
        for (int64_t j = LANE; j < c; j += ROW_LANES) m += xr[j];
        m = warp_sum(m) / (float)c;
        for (int64_t j = LANE; j < c; j += ROW_LANES) v += (xr[j] - m) * (xr[j] - m);
        v = warp_sum(v) / (float)c;
        float s = 1.0f / sqrtf(v + eps);
        for (int64_t j = LANE; j < c; j += ROW_LANES) yr[j] = (xr[j] - m) * s * gamma[j] + beta[j];
        if (LANE == 0) {
            mean[r] = m;
            rstd[r] = s;
        }
    }
}

/* Each lane reads and writes only its own elements of the row, so dx may be dy (backend.h). */
__global__ void k_layernorm_dx(const float *dy, const float *x, const float *gamma, const float *mean,
                               const float *rstd, float *dx, int64_t rows, int64_t c)
{
    FOR_EACH_ROW(r, rows) {
        const float *dyr = dy + r * c, *xr = x + r * c;
        float *dxr = dx + r * c;
        float m = mean[r], s = rstd[r], mean_g = 0.0f, mean_gx = 0.0f;
        for (int64_t j = LANE; j < c; j += ROW_LANES) {
            float xhat = (xr[j] - m) * s, g = dyr[j] * gamma[j];
            mean_g += g;
            mean_gx += g * xhat;
        }
        mean_g = warp_sum(mean_g) / (float)c;
        mean_gx = warp_sum(mean_gx) / (float)c;
        for (int64_t j = LANE; j < c; j += ROW_LANES) {
            float xhat = (xr[j] - m) * s;
            dxr[j] = s * (dyr[j] * gamma[j] - mean_g - xhat * mean_gx);
        }
    }
}

/* dgamma, dbeta: a thread per column, the rows in order (the CPU's accumulation order). */
__global__ void k_layernorm_params(const float *dy, const float *x, const float *mean, const float *rstd,
                                   float *dgamma, float *dbeta, int64_t rows, int64_t c)
{
    FOR_EACH(j, c) {
        float g = dgamma[j], b = dbeta[j];
        for (int64_t r = 0; r < rows; r++) {
            float xhat = (x[r * c + j] - mean[r]) * rstd[r];
            g += dy[r * c + j] * xhat;
            b += dy[r * c + j];
        }
        dgamma[j] = g;
        dbeta[j] = b;
    }
}

void cuda_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps, float *y,
                            float *mean, float *rstd, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows <= 0) return;
    k_layernorm_forward LAUNCH_ROWS(cc, rows)(x, gamma, beta, eps, y, mean, rstd, rows, c);
    cuda_launched(cc, "layer norm");
}

void cuda_layernorm_backward(void *ctx, const float *dy, const float *x, const float *gamma, const float *mean,
                             const float *rstd, float *dx, float *dgamma, float *dbeta, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows <= 0) return;
    /* the parameters' gradients first: dx may be written over dy (backend.h) */
    k_layernorm_params LAUNCH(cc, c)(dy, x, mean, rstd, dgamma, dbeta, rows, c);
    k_layernorm_dx LAUNCH_ROWS(cc, rows)(dy, x, gamma, mean, rstd, dx, rows, c);
    cuda_launched(cc, "layer norm backward");
}

/* ------------------------------------------------------------------ causal self-attention */

/* att's two element types (backend.h): float32, or bfloat16 rounded to nearest even */
__device__ static inline void store_att(float *p, float v) { *p = v; }
__device__ static inline void store_att(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ static inline float load_att(const float *p) { return *p; }
__device__ static inline float load_att(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

/* Row (b, h, t) of the scores becomes softmax over s ≤ t in att, zeros above the diagonal. The
 * exponentials go back into the scores first (scores == att for float32 att, in place), so that a
 * bfloat16 att rounds the float32 quotient, as the CPU does. */
template <typename A>
__global__ void k_causal_softmax(float *scores, A *att, int64_t rows, int64_t T)
{
    FOR_EACH_ROW(i, rows) {
        int64_t t = i % T;
        float *row = scores + i * T;
        A *out = att + i * T;
        float mx = row[0]; /* a maximum is exact in any order */
        for (int64_t s = LANE; s <= t; s += ROW_LANES) mx = row[s] > mx ? row[s] : mx;
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int64_t s = LANE; s <= t; s += ROW_LANES) {
            float e = crew_exp_poly(row[s] - mx);
            row[s] = e;
            sum += e;
        }
        float inv = 1.0f / warp_sum(sum);
        for (int64_t s = LANE; s <= t; s += ROW_LANES) store_att(&out[s], row[s] * inv);
        for (int64_t s = t + 1 + LANE; s < T; s += ROW_LANES) store_att(&out[s], 0.0f);
    }
}

/* Through the softmax, row by row: ds = att ⊙ (datt − Σ_s att·datt), 0 above the diagonal. */
template <typename A>
__global__ void k_softmax_backward_rows(const A *att, float *datt, int64_t rows, int64_t T)
{
    FOR_EACH_ROW(i, rows) {
        int64_t t = i % T;
        const A *ar = att + i * T;
        float *dr = datt + i * T;
        float dot = 0.0f;
        for (int64_t s = LANE; s <= t; s += ROW_LANES) dot += load_att(&ar[s]) * dr[s];
        dot = warp_sum(dot);
        for (int64_t s = LANE; s <= t; s += ROW_LANES) dr[s] = load_att(&ar[s]) * (dr[s] - dot);
        for (int64_t s = t + 1 + LANE; s < T; s += ROW_LANES) dr[s] = 0.0f;
    }
}

/* Per sample, the heads as one strided batch of GEMMs: head h of qkv starts h·d columns in (the
 * matrices of a batch are d apart), of att T·T apart, of y d apart. A bfloat16 att is read by its
 * two products as it is (cuda_gemm_typed: bfloat16 GEMMs). */
void cuda_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
                            int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    cuda_ctx *c = enter(ctx);
    const int64_t C = heads * d, ld = 3 * C, sq = heads * T * T, rows = batch * heads * T;
    const float scale = 1.0f / sqrtf((float)d);
    const int a16 = att_type == CREW_DT_BF16;
    float *s = a16 ? scores : (float *)att;
    for (int64_t b = 0; b < batch; b++) {
        const float *q = qkv + b * T * ld, *k = q + C;
        cuda_gemm_strided(c, 0, 1, T, T, d, scale, q, ld, d, k, ld, d, 0.0f, s + b * sq, T, T * T, heads);
    }
    if (a16)
        k_causal_softmax<__nv_bfloat16> LAUNCH_ROWS(c, rows)(s, (__nv_bfloat16 *)att, rows, T);
    else
        k_causal_softmax<float> LAUNCH_ROWS(c, rows)(s, s, rows, T);
    cuda_launched(c, "attention softmax");
    const size_t esize = crew_dtype_size(att_type);
    for (int64_t b = 0; y && b < batch; b++) { /* y NULL: the probabilities alone */
        const float *v = qkv + b * T * ld + 2 * C;
        const void *ab = (const char *)att + (size_t)(b * sq) * esize;
        cuda_gemm_typed(c, 0, 0, T, d, T, 1.0f, ab, att_type, T, T * T, v, CREW_DT_F32, ld, d, 0.0f, y + b * T * C, C,
                        d, heads);
    }
}

void cuda_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
                             float *datt, float *dqkv, int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    cuda_ctx *c = enter(ctx);
    const int64_t C = heads * d, ld = 3 * C, sq = heads * T * T, rows = batch * heads * T;
    const float scale = 1.0f / sqrtf((float)d);
    const size_t esize = crew_dtype_size(att_type);
    for (int64_t b = 0; b < batch; b++) {
        const float *v = qkv + b * T * ld + 2 * C, *dyb = dy + b * T * C;
        const void *a = (const char *)att + (size_t)(b * sq) * esize;
        float *da = datt + b * sq, *dv = dqkv + b * T * ld + 2 * C;
        cuda_gemm_strided(c, 0, 1, T, T, d, 1.0f, dyb, C, d, v, ld, d, 0.0f, da, T, T * T, heads); /* dy·vᵀ */
        cuda_gemm_typed(c, 1, 0, T, d, T, 1.0f, a, att_type, T, T * T, dyb, CREW_DT_F32, C, d, 0.0f, dv, ld, d,
                        heads); /* attᵀ·dy */
    }
    if (att_type == CREW_DT_BF16)
        k_softmax_backward_rows<__nv_bfloat16> LAUNCH_ROWS(c, rows)((const __nv_bfloat16 *)att, datt, rows, T);
    else
        k_softmax_backward_rows<float> LAUNCH_ROWS(c, rows)((const float *)att, datt, rows, T);
    cuda_launched(c, "attention softmax backward");
    for (int64_t b = 0; b < batch; b++) {
        const float *q = qkv + b * T * ld, *k = q + C, *da = datt + b * sq;
        float *dq = dqkv + b * T * ld, *dk = dq + C;
        cuda_gemm_strided(c, 0, 0, T, d, T, scale, da, T, T * T, k, ld, d, 0.0f, dq, ld, d, heads); /* ds·k/√d */
        cuda_gemm_strided(c, 1, 0, T, d, T, scale, da, T, T * T, q, ld, d, 0.0f, dk, ld, d, heads); /* dsᵀ·q/√d */
    }
}

/* ------------------------------------------------------------------ embedding */

__device__ static int valid_id(float id, int64_t vocab)
{
    return id >= 0.0f && id < (float)vocab && id == (float)(int64_t)id;
}

__global__ void k_embedding_forward(const float *ids, const float *table, int64_t vocab, float *y, int64_t rows,
                                    int64_t dim)
{
    FOR_EACH(i, rows * dim) {
        int64_t r = i / dim, j = i % dim;
        y[i] = valid_id(ids[r], vocab) ? table[(int64_t)ids[r] * dim + j] : 0.0f;
    }
}

__global__ void k_embedding_bad(const float *ids, int64_t vocab, int64_t rows, long long *bad)
{
    FOR_EACH(r, rows) bad[r] = !valid_id(ids[r], vocab);
}

/* dtable (v, j) += dy (r, j) for every row r of id v, r ascending: the CPU's order of the adds. */
/* The gradient of the table, as the CPU adds it (every row r in order: dtable[ids[r]] += dy[r]),
 * without walking every row for every entry of a 50K-token table: the rows are sorted by id with
 * a stable radix sort (CUB), so each id's rows stay in ascending order, and the thread of (the
 * first row of an id's run, column j) adds the run's rows into that id's entry one by one: the
 * CPU's additions in the CPU's order. Invalid ids sort last, under the key `vocab`, and are
 * skipped, as forward rejected them. */
__global__ void k_embedding_keys(const float *ids, int64_t vocab, int64_t rows, int *keys, int *order)
{
    FOR_EACH(r, rows) {
        keys[r] = valid_id(ids[r], vocab) ? (int)ids[r] : (int)vocab;
        order[r] = (int)r;
    }
}

__global__ void k_embedding_runs(const int *keys, const int *order, const float *dy, float *dtable, int64_t vocab,
                                 int64_t rows, int64_t dim)
{
    FOR_EACH(i, rows * dim) {
        const int64_t p = i / dim, j = i % dim;
        const int key = keys[p];
        if (key >= vocab || (p > 0 && keys[p - 1] == key)) continue; /* an invalid id, or inside a run */
        float s = dtable[(int64_t)key * dim + j];
        for (int64_t q = p; q < rows && keys[q] == key; q++) s += dy[(int64_t)order[q] * dim + j];
        dtable[(int64_t)key * dim + j] = s;
    }
}

/* The sort's buffers in one allocation, grown as needed: keys and rows, in and out, and CUB's own. */
static int embedding_scratch(cuda_ctx *c, int64_t rows, int end_bit, int **keys, int **order, int **keys_out,
                             int **order_out, void **temp, size_t *temp_bytes)
{
    *temp_bytes = 0;
    cub::DeviceRadixSort::SortPairs(NULL, *temp_bytes, (const int *)NULL, (int *)NULL, (const int *)NULL, (int *)NULL,
                                    (int)rows, 0, end_bit, c->stream);
    const size_t ints = 4 * (size_t)rows, bytes = ints * sizeof(int) + *temp_bytes + 256;
    if (bytes > c->sort_bytes) {
        cuda_free(c, c->sort_buf);
        c->sort_buf = NULL;
        c->sort_bytes = 0;
        crew_status s = cuda_alloc(c, CREW_DT_F32, (int64_t)((bytes + 3) / 4), &c->sort_buf);
        if (s) {
            crew_status_free(s);
            cuda_note(c, cudaErrorMemoryAllocation, "embedding backward's sort");
            return 0;
        }
        c->sort_bytes = bytes;
    }
    int *base = (int *)c->sort_buf;
    *keys = base, *order = base + rows, *keys_out = base + 2 * rows, *order_out = base + 3 * rows;
    *temp = (void *)(((uintptr_t)(base + ints) + 255) & ~(uintptr_t)255);
    return 1;
}

crew_status cuda_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                   int64_t rows, int64_t dim, int64_t *bad)
{
    cuda_ctx *c = enter(ctx);
    *bad = 0;
    if (rows <= 0) return cuda_take_pending(c);
    CREW_TRY(cuda_count_reserve(c, rows));
    if (dim > 0) k_embedding_forward LAUNCH(c, rows * dim)(ids, table, vocab, y, rows, dim);
    k_embedding_bad LAUNCH(c, rows)(ids, vocab, rows, c->d_count);
    cuda_launched(c, "embedding");
    return cuda_count_flags(c, rows, bad, "embedding");
}

void cuda_embedding_backward(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab, int64_t rows,
                             int64_t dim)
{
    cuda_ctx *c = enter(ctx);
    if (vocab * dim <= 0 || rows <= 0) return;
    if (rows >= INT32_MAX || vocab >= INT32_MAX) {
        cuda_note(c, cudaErrorInvalidValue, "embedding backward of 2^31 rows or ids");
        return;
    }
    int end_bit = 1;
    while (end_bit < 32 && ((int64_t)1 << end_bit) <= vocab) end_bit++; /* keys 0 .. vocab */
    int *keys, *order, *keys_out, *order_out;
    void *temp;
    size_t temp_bytes;
    if (!embedding_scratch(c, rows, end_bit, &keys, &order, &keys_out, &order_out, &temp, &temp_bytes)) return;
    k_embedding_keys LAUNCH(c, rows)(ids, vocab, rows, keys, order);
    cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_out, order, order_out, (int)rows, 0,
                                                    end_bit, c->stream);
    cuda_note(c, e, "embedding backward's sort");
    k_embedding_runs LAUNCH(c, rows * dim)(keys_out, order_out, dy, dtable, vocab, rows, dim);
    cuda_launched(c, "embedding backward");
}

/* ------------------------------------------------------------------ loss (a warp per row) */

/* The row's largest logit and its first index, lane by lane and then across the warp. */
__device__ static float row_argmax(const float *z, int64_t classes, long long *best)
{
    float zmax = z[0];
    long long at = 0; /* the CPU starts from z[0] too */
    for (int64_t j = LANE; j < classes; j += ROW_LANES)
        if (z[j] > zmax) {
            zmax = z[j];
            at = j;
        }
    warp_argmax(&zmax, &at);
    *best = at;
    return zmax;
}

__global__ void k_softmax_xent(const float *logits, const int32_t *labels, int64_t rows, int64_t classes, float scale,
                               float *row_loss, float *dlogits, long long *right)
{
    FOR_EACH_ROW(r, rows) {
        const float *z = logits + r * classes;
        float *dz = dlogits + r * classes;
        const int32_t y = labels[r];
        const float zy = z[y]; /* every lane, before any writes dz, which may be z */
        long long best;
        const float zmax = row_argmax(z, classes, &best);
        float sum = 0.0f;
        for (int64_t j = LANE; j < classes; j += ROW_LANES) {
            float e = expf(z[j] - zmax);
            dz[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        const float inv = scale / sum;
        for (int64_t j = LANE; j < classes; j += ROW_LANES) { /* each lane its own elements */
            float d = dz[j] * inv;
            if (j == y) d -= scale;
            dz[j] = d;
        }
        if (LANE == 0) {
            row_loss[r] = logf(sum) - (zy - zmax);
            right[r] = best == y;
        }
    }
}

__global__ void k_softmax(const float *logits, float *probs, int64_t rows, int64_t classes)
{
    FOR_EACH_ROW(r, rows) {
        const float *z = logits + r * classes;
        float *p = probs + r * classes;
        float zmax = z[0];
        for (int64_t j = LANE; j < classes; j += ROW_LANES) zmax = z[j] > zmax ? z[j] : zmax;
        zmax = warp_max(zmax);
        float sum = 0.0f;
        for (int64_t j = LANE; j < classes; j += ROW_LANES) sum += (p[j] = expf(z[j] - zmax));
        sum = warp_sum(sum);
        for (int64_t j = LANE; j < classes; j += ROW_LANES) p[j] /= sum;
    }
}

crew_status cuda_softmax_xent(void *ctx, const float *logits, const int32_t *labels, int64_t rows, int64_t classes,
                              float scale, float *row_loss, float *dlogits, int64_t *correct)
{
    cuda_ctx *c = enter(ctx);
    *correct = 0;
    if (rows <= 0) return cuda_take_pending(c);
    CREW_TRY(cuda_count_reserve(c, rows));
    k_softmax_xent LAUNCH_ROWS(c, rows)(logits, labels, rows, classes, scale, row_loss, dlogits, c->d_count);
    cuda_launched(c, "softmax cross-entropy");
    return cuda_count_flags(c, rows, correct, "softmax cross-entropy");
}

void cuda_softmax(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes)
{
    cuda_ctx *c = enter(ctx);
    if (rows <= 0) return;
    k_softmax LAUNCH_ROWS(c, rows)(logits, probs, rows, classes);
    cuda_launched(c, "softmax");
}

/* ------------------------------------------------------------------ optimisers (cpu_optim.c's arithmetic) */

__global__ void k_sgd(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                      int nesterov, float weight_decay)
{
    FOR_EACH(i, n) {
        float g = grad[i] + weight_decay * param[i];
        if (momentum != 0.0f) {
            float v = momentum * velocity[i] + g;
            velocity[i] = v;
            g = nesterov ? g + momentum * v : v;
        }
        param[i] -= lr * g;
    }
}

__global__ void k_adamw(float *param, const float *grad, float *m, float *v, int64_t n, crew_adamw_consts k)
{
    const float w = k.one_minus_beta1, neg_step = -k.step_size;
    const int small = w < 0.5f;
    FOR_EACH(i, n) {
        float g = grad[i];
        float mi = small ? fmaf(w, g - m[i], m[i]) : fmaf(w - 1.0f, g - m[i], g);
        float vi = fmaf(k.one_minus_beta2 * g, g, v[i] * k.beta2);
        m[i] = mi;
        v[i] = vi;
        float p = param[i] * k.decay;
        param[i] = p + neg_step * mi / (sqrtf(vi) / k.bias_c2_sqrt + k.eps);
    }
}

void cuda_sgd_update(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                     int nesterov, float weight_decay)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_sgd LAUNCH(c, n)(param, grad, velocity, n, lr, momentum, nesterov, weight_decay);
    cuda_launched(c, "SGD update");
}

void cuda_adamw_update(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                       const crew_adamw_consts *k)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_adamw LAUNCH(c, n)(param, grad, m, v, n, *k);
    cuda_launched(c, "AdamW update");
}
