/* cuda_kernels.cu — the CUDA backend's compute ops: one kernel (or a few) per op of backend.h,
 * each the CPU kernel's arithmetic (src/backend/cpu/) in the same order, so that results differ
 * from the CPU's only where the two libraries' exp, erf and tanh round differently, and where
 * cuBLAS sums a product in another order. The arithmetic is not written here: every kernel calls
 * the body of its element (or of its lane, for the row kernels) in src/backend/body/, which the
 * CPU backend calls too and tests/test_kernel_bodies.c runs on the CPU over every index; what is
 * left here is the launch geometry, the grid-stride loops and the warps' shuffles.
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
#include "backend/body/activation.h"
#include "backend/body/attention.h"
#include "backend/body/elementwise.h"
#include "backend/body/loss.h"
#include "backend/body/norm.h"
#include "backend/body/optim.h"
#include "backend/body/window.h"

extern "C" {
#include "core/status.h"
}

/* A grid-stride loop over [0, n). */
#define FOR_EACH(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                            i += (int64_t)blockDim.x * gridDim.x)

#define LAUNCH(c, n) <<<cuda_blocks(n), CUDA_THREADS, 0, (c)->stream>>>

/* ---- row kernels: a warp per row. Lane l takes elements l, l + 32, l + 64, ... of the row in
 * order, so the warp reads 32 neighbours at a time; the lanes' partial results then meet in a
 * butterfly of shuffles, which leaves the same total, bit for bit, in every lane (each level adds
 * the same two numbers in each lane of a pair, and a + b == b + a). The order of a row's sum is
 * fixed by the warp's width alone: the same on every run, every GPU count and every row length's
 * grid, and the CPU's (backend/cpu/cpu_lanes.h keeps the 32 partials and folds them the same way). */
#define ROW_LANES CREW_BODY_LANES
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
    for (int k = ROW_LANES / 2; k > 0; k /= 2) v = crew_lane_max_of(__shfl_xor_sync(0xffffffffu, v, k), v);
    return v;
}

/* The largest value and its first index (the CPU's first maximum): ties go to the smaller index. */
__device__ static void warp_argmax(float *v, long long *at)
{
    for (int k = ROW_LANES / 2; k > 0; k /= 2) {
        float o = __shfl_xor_sync(0xffffffffu, *v, k);
        long long oi = __shfl_xor_sync(0xffffffffu, *at, k);
        if (crew_xent_argmax_takes(o, oi, *v, *at)) {
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

__global__ void k_fill(float *x, float v, int64_t n) { FOR_EACH(i, n) crew_body_fill(x, v, i); }
__global__ void k_axpby(int64_t n, float alpha, const float *x, float beta, float *y)
{
    FOR_EACH(i, n) crew_body_axpby(alpha, x, beta, y, i);
}
__global__ void k_mul(int64_t n, const float *a, const float *b, float *out)
{
    FOR_EACH(i, n) crew_body_mul(a, b, out, i);
}
__global__ void k_broadcast_rows(float *y, const float *bias, int64_t rows, int64_t cols)
{
    FOR_EACH(i, rows * cols) crew_body_broadcast_rows(y, bias, cols, i);
}
__global__ void k_bias_rows(float *c, int64_t ldc, const float *bias, int64_t rows, int64_t cols)
{
    FOR_EACH(i, rows * cols) crew_body_bias_rows(c, ldc, bias, cols, i);
}
/* One thread per column, the rows in order. */
__global__ void k_col_sum(const float *x, int64_t rows, int64_t cols, float *out, int accumulate, int64_t block)
{
    if (block > 0 && rows > block)
        FOR_EACH(j, cols) crew_body_col_sum_blocked(x, rows, cols, out, accumulate, block, j);
    else
        FOR_EACH(j, cols) crew_body_col_sum(x, rows, cols, out, accumulate, j);
}

static void cuda_fill(void *ctx, float *x, float value, int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_fill LAUNCH(c, n)(x, value, n);
    cuda_launched(c, "fill");
}

static void cuda_axpby(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_axpby LAUNCH(c, n)(n, alpha, x, beta, y);
    cuda_launched(c, "axpby");
}

static void cuda_mul(void *ctx, int64_t n, const float *a, const float *b, float *out)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_mul LAUNCH(c, n)(n, a, b, out);
    cuda_launched(c, "mul");
}

static void cuda_broadcast_rows(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols)
{
    cuda_ctx *c = enter(ctx);
    if (rows * cols <= 0) return;
    k_broadcast_rows LAUNCH(c, rows * cols)(y, bias, rows, cols);
    cuda_launched(c, "broadcast_rows");
}

/* The bias in every row, then cuBLAS adds the product to it with beta = 1: its epilogue computes
 * alpha · sum + beta · c, the bias joining the finished sum as backend.h asks. */
static void cuda_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const void *a, crew_dtype a_type, int64_t lda,
                           const float *b, int64_t ldb, const float *bias, float *out, int64_t ldc)
{
    cuda_ctx *c = enter(ctx);
    if (m <= 0 || n <= 0) return;
    if (bias) {
        k_bias_rows LAUNCH(c, m * n)(out, ldc, bias, m, n);
        cuda_launched(c, "gemm_bias's bias");
    }
    cuda_gemm_typed(c, 0, 0, m, n, k, 1.0f, a, a_type, lda, 0, b, CREW_DT_F32, ldb, 0, bias ? 1.0f : 0.0f, out, ldc, 0,
                    1);
}

static void cuda_col_sum(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    cuda_ctx *c = enter(ctx);
    if (cols <= 0) return;
    k_col_sum LAUNCH(c, cols)(x, rows, cols, out, accumulate, c->sum_block);
    cuda_launched(c, "col_sum");
}

/* ------------------------------------------------------------------ activations, dropout */

__global__ void k_act_forward(crew_activation act, const float *x, float *y, int64_t n)
{
    FOR_EACH(i, n) crew_body_act_forward(act, x, y, i);
}

__global__ void k_act_backward(crew_activation act, const float *x, const float *y, const float *dy, float *dx,
                               int64_t n)
{
    FOR_EACH(i, n) crew_body_act_backward(act, x, y, dy, dx, i);
}

__global__ void k_act_forward_slope(crew_activation act, const float *x, float *y, float *slope, int64_t n)
{
    FOR_EACH(i, n) crew_body_act_forward_slope(act, x, y, slope, i);
}

static void cuda_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_act_forward LAUNCH(c, n)(act, x, y, n);
    cuda_launched(c, "activation");
}

static void cuda_act_backward(void *ctx, crew_activation act, const float *x, const float *y, const float *dy,
                              float *dx, int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_act_backward LAUNCH(c, n)(act, x, y, dy, dx, n);
    cuda_launched(c, "activation backward");
}

static void cuda_act_forward_slope(void *ctx, crew_activation act, const float *x, float *y, float *slope, int64_t n)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_act_forward_slope LAUNCH(c, n)(act, x, y, slope, n);
    cuda_launched(c, "activation and its slope");
}

/* The CPU's counter-based stream (core/rng.h): the same masks for the same samples. */
__global__ void k_dropout(const float *x, float *y, float *mask, int64_t rows, int64_t cols, float rate, uint64_t key,
                          const int64_t *sample_ids)
{
    const float keep_scale = crew_dropout_keep_scale(rate);
    FOR_EACH(i, rows * cols) crew_body_dropout(x, y, mask, cols, rate, keep_scale, key, sample_ids, i);
}

static void cuda_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                                 float rate, uint64_t key, const int64_t *sample_ids)
{
    cuda_ctx *c = enter(ctx);
    if (rows * cols <= 0) return;
    k_dropout LAUNCH(c, rows * cols)(x, y, mask, rows, cols, rate, key, sample_ids);
    cuda_launched(c, "dropout");
}

/* ------------------------------------------------------------------ windows: im2col, pooling */

/* A thread per output element, each its body (backend/body/window.h: the gathering form of the
 * backward ops explained there). */
__global__ void k_im2col(const float *x, float *col, crew_window g)
{
    const int64_t n = crew_window_col_size(&g);
    FOR_EACH(i, n) crew_body_im2col(x, col, &g, i);
}

__global__ void k_col2im(const float *col, float *dx, crew_window g)
{
    const int64_t n = crew_window_in_cells(&g);
    FOR_EACH(i, n) crew_body_col2im(col, dx, &g, i);
}

static void cuda_im2col(void *ctx, const float *x, float *col, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = crew_window_col_size(g);
    if (n <= 0) return;
    k_im2col LAUNCH(c, n)(x, col, *g);
    cuda_launched(c, "im2col");
}

static void cuda_col2im(void *ctx, const float *col, float *dx, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = crew_window_in_cells(g);
    if (n <= 0) return;
    k_col2im LAUNCH(c, n)(col, dx, *g);
    cuda_launched(c, "col2im");
}

__global__ void k_maxpool_forward(const float *x, float *y, int32_t *argmax, crew_window g, int relu_in)
{
    const int64_t n = crew_window_out_cells(&g);
    FOR_EACH(i, n) crew_body_maxpool_forward(x, y, argmax, &g, relu_in, i);
}

__global__ void k_maxpool_backward(const float *dy, const int32_t *argmax, float *dx, crew_window g)
{
    const int64_t n = crew_window_in_cells(&g);
    FOR_EACH(i, n) crew_body_maxpool_backward(dy, argmax, dx, &g, i);
}

__global__ void k_avgpool_forward(const float *x, float *y, crew_window g)
{
    const int64_t n = crew_window_out_cells(&g);
    FOR_EACH(i, n) crew_body_avgpool_forward(x, y, &g, i);
}

__global__ void k_avgpool_backward(const float *dy, float *dx, crew_window g)
{
    const int64_t n = crew_window_in_cells(&g);
    FOR_EACH(i, n) crew_body_avgpool_backward(dy, dx, &g, i);
}

static void cuda_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g,
                                 int relu_in)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = crew_window_out_cells(g);
    if (n <= 0) return;
    k_maxpool_forward LAUNCH(c, n)(x, y, argmax, *g, relu_in);
    cuda_launched(c, "max pooling");
}

static void cuda_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = crew_window_in_cells(g);
    if (n <= 0) return;
    k_maxpool_backward LAUNCH(c, n)(dy, argmax, dx, *g);
    cuda_launched(c, "max pooling backward");
}

static void cuda_avgpool_forward(void *ctx, const float *x, float *y, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = crew_window_out_cells(g);
    if (n <= 0) return;
    k_avgpool_forward LAUNCH(c, n)(x, y, *g);
    cuda_launched(c, "average pooling");
}

static void cuda_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *g)
{
    cuda_ctx *c = enter(ctx);
    const int64_t n = crew_window_in_cells(g);
    if (n <= 0) return;
    k_avgpool_backward LAUNCH(c, n)(dy, dx, *g);
    cuda_launched(c, "average pooling backward");
}

/* ------------------------------------------------------------------ batch norm (per column, rows in order) */

__global__ void k_bn_col_sum(const float *x, int64_t rows, int64_t c, double *out)
{
    FOR_EACH(j, c) crew_body_bn_col_sum(x, rows, c, out, j);
}

__global__ void k_col_sqdev(const float *x, const float *mean, int64_t rows, int64_t c, double *out)
{
    FOR_EACH(j, c) crew_body_col_sqdev(x, mean, rows, c, out, j);
}

__global__ void k_bn_scale_sums(int64_t n, double alpha, const double *x, float *y)
{
    FOR_EACH(i, n) crew_body_bn_scale_sums(alpha, x, y, i);
}

__global__ void k_bn_forward(const float *x, const float *mean, const float *var, const float *gamma,
                             const float *beta, float eps, float *y, int64_t rows, int64_t c)
{
    FOR_EACH(i, rows * c) crew_body_bn_forward(x, mean, var, gamma, beta, eps, y, c, i);
}

__global__ void k_bn_backward_sums(const float *dy, const float *x, const float *mean, int64_t rows, int64_t c,
                                   double *sum_dy, double *sum_dy_xmu)
{
    FOR_EACH(j, c) crew_body_bn_backward_sums(dy, x, mean, rows, c, sum_dy, sum_dy_xmu, j);
}

__global__ void k_bn_backward(const float *dy, const float *x, const float *mean, const float *var,
                              const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                              double count, float *dx, int64_t rows, int64_t c)
{
    FOR_EACH(i, rows * c) crew_body_bn_backward(dy, x, mean, var, gamma, eps, sum_dy, sum_dy_xmu, count, dx, c, i);
}

__global__ void k_bn_param_grads(const float *var, float eps, const double *sum_dy, const double *sum_dy_xmu,
                                 float *dgamma, float *dbeta, int64_t c)
{
    FOR_EACH(j, c) crew_body_bn_param_grads(var, eps, sum_dy, sum_dy_xmu, dgamma, dbeta, j);
}

static void cuda_bn_col_sum(void *ctx, const float *x, int64_t rows, int64_t c, double *out)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_bn_col_sum LAUNCH(cc, c)(x, rows, c, out);
    cuda_launched(cc, "batch-norm sum");
}

static void cuda_col_sqdev(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, double *out)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_col_sqdev LAUNCH(cc, c)(x, mean, rows, c, out);
    cuda_launched(cc, "batch-norm deviations");
}

static void cuda_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y)
{
    cuda_ctx *cc = enter(ctx);
    if (n <= 0) return;
    k_bn_scale_sums LAUNCH(cc, n)(n, alpha, x, y);
    cuda_launched(cc, "batch-norm statistics");
}

static void cuda_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                            const float *beta, float eps, float *y, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows * c <= 0) return;
    k_bn_forward LAUNCH(cc, rows * c)(x, mean, var, gamma, beta, eps, y, rows, c);
    cuda_launched(cc, "batch norm");
}

static void cuda_bn_backward_sums(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows,
                                  int64_t c, double *sum_dy, double *sum_dy_xmu)
{
    cuda_ctx *cc = enter(ctx);
    if (c <= 0) return;
    k_bn_backward_sums LAUNCH(cc, c)(dy, x, mean, rows, c, sum_dy, sum_dy_xmu);
    cuda_launched(cc, "batch-norm backward sums");
}

static void cuda_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                             const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                             double count, float *dx, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows * c <= 0) return;
    k_bn_backward LAUNCH(cc, rows * c)(dy, x, mean, var, gamma, eps, sum_dy, sum_dy_xmu, count, dx, rows, c);
    cuda_launched(cc, "batch norm backward");
}

static void cuda_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy, const double *sum_dy_xmu,
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
        const float m = warp_sum(crew_ln_lane_sum(xr, c, LANE, ROW_LANES)) / (float)c;
        const float v = warp_sum(crew_ln_lane_sqdev(xr, c, m, LANE, ROW_LANES)) / (float)c;
        const float s = crew_ln_rstd(v, eps);
        crew_ln_lane_forward(xr, gamma, beta, m, s, y + r * c, c, LANE, ROW_LANES);
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
        const float m = mean[r], s = rstd[r];
        float sum_g, sum_gx;
        crew_ln_lane_grad_sums(dyr, xr, gamma, m, s, c, LANE, ROW_LANES, &sum_g, &sum_gx);
        const float mean_g = warp_sum(sum_g) / (float)c, mean_gx = warp_sum(sum_gx) / (float)c;
        crew_ln_lane_dx(dyr, xr, gamma, m, s, mean_g, mean_gx, dx + r * c, c, LANE, ROW_LANES);
    }
}

/* dgamma, dbeta: a thread per column, the rows in order (the CPU's accumulation order). */
__global__ void k_layernorm_params(const float *dy, const float *x, const float *mean, const float *rstd,
                                   float *dgamma, float *dbeta, int64_t rows, int64_t c)
{
    FOR_EACH(j, c) crew_body_layernorm_params(dy, x, mean, rstd, dgamma, dbeta, rows, c, j);
}

static void cuda_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                                   float *y, float *mean, float *rstd, int64_t rows, int64_t c)
{
    cuda_ctx *cc = enter(ctx);
    if (rows <= 0) return;
    k_layernorm_forward LAUNCH_ROWS(cc, rows)(x, gamma, beta, eps, y, mean, rstd, rows, c);
    cuda_launched(cc, "layer norm");
}

static void cuda_layernorm_backward(void *ctx, const float *dy, const float *x, const float *gamma, const float *mean,
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

/* att's two element types (backend.h): float32, or bfloat16 rounded to nearest even (the CPU's
 * rounding, crew_body_bf16_of) */
__device__ static inline void store_att(float *p, float v) { *p = v; }
__device__ static inline void store_att(__nv_bfloat16 *p, float v) { *p = __ushort_as_bfloat16(crew_body_bf16_of(v)); }

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
        const float mx = warp_max(crew_att_lane_max(row, t, LANE, ROW_LANES));
        const float inv = 1.0f / warp_sum(crew_att_lane_exp(row, t, mx, LANE, ROW_LANES));
        for (int64_t s = LANE; s <= t; s += ROW_LANES) store_att(&out[s], crew_att_prob(row[s], inv));
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
        const int bf16 = sizeof(A) == sizeof(crew_bf16);
        const float dot = warp_sum(crew_att_lane_dot(ar, bf16, dr, t, LANE, ROW_LANES));
        crew_att_lane_grad(ar, bf16, dr, t, T, dot, LANE, ROW_LANES);
    }
}

/* Per sample, the heads as one strided batch of GEMMs: head h of qkv starts h·d columns in (the
 * matrices of a batch are d apart), of att T·T apart, of y d apart. A bfloat16 att is read by its
 * two products as it is (cuda_gemm_typed: bfloat16 GEMMs). */
static void cuda_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
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

static void cuda_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
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

__global__ void k_embedding_forward(const float *ids, const float *table, int64_t vocab, float *y, int64_t rows,
                                    int64_t dim)
{
    FOR_EACH(i, rows * dim) crew_body_embedding_forward(ids, table, vocab, y, dim, i);
}

__global__ void k_embedding_bad(const float *ids, int64_t vocab, int64_t rows, long long *bad)
{
    FOR_EACH(r, rows) crew_body_embedding_bad(ids, vocab, bad, r);
}

/* The gradient of the table as the CPU adds it: the rows sorted by id (a stable radix sort, CUB,
 * between these two kernels), then a thread per (run of an id's rows, column): backend/body/loss.h. */
__global__ void k_embedding_keys(const float *ids, int64_t vocab, int64_t rows, int *keys, int *order)
{
    FOR_EACH(r, rows) crew_body_embedding_keys(ids, vocab, keys, order, r);
}

__global__ void k_embedding_runs(const int *keys, const int *order, const float *dy, float *dtable, int64_t vocab,
                                 int64_t rows, int64_t dim)
{
    FOR_EACH(i, rows * dim) crew_body_embedding_runs(keys, order, dy, dtable, vocab, rows, dim, i);
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

static crew_status cuda_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
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

static void cuda_embedding_backward(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab,
                                    int64_t rows, int64_t dim)
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
    float zmax = crew_xent_lane_argmax(z, classes, LANE, ROW_LANES, best);
    warp_argmax(&zmax, best);
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
        const float sum = warp_sum(crew_xent_lane_exp(z, dz, classes, zmax, LANE, ROW_LANES));
        crew_xent_lane_grad(dz, classes, y, crew_xent_inv(scale, sum), scale, LANE, ROW_LANES);
        if (LANE == 0) {
            row_loss[r] = crew_xent_loss(sum, zy, zmax);
            right[r] = best == y;
        }
    }
}

__global__ void k_softmax(const float *logits, float *probs, int64_t rows, int64_t classes)
{
    FOR_EACH_ROW(r, rows) {
        const float *z = logits + r * classes;
        float *p = probs + r * classes;
        const float zmax = warp_max(crew_softmax_lane_max(z, classes, LANE, ROW_LANES));
        const float sum = warp_sum(crew_softmax_lane_exp(z, p, classes, zmax, LANE, ROW_LANES));
        crew_softmax_lane_div(p, classes, sum, LANE, ROW_LANES);
    }
}

static crew_status cuda_softmax_xent(void *ctx, const float *logits, const int32_t *labels, int64_t rows,
                                     int64_t classes, float scale, float *row_loss, float *dlogits, int64_t *correct)
{
    cuda_ctx *c = enter(ctx);
    *correct = 0;
    if (rows <= 0) return cuda_take_pending(c);
    CREW_TRY(cuda_count_reserve(c, rows));
    k_softmax_xent LAUNCH_ROWS(c, rows)(logits, labels, rows, classes, scale, row_loss, dlogits, c->d_count);
    cuda_launched(c, "softmax cross-entropy");
    return cuda_count_flags(c, rows, correct, "softmax cross-entropy");
}

static void cuda_softmax(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes)
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
    FOR_EACH(i, n) crew_body_sgd(param, grad, velocity, lr, momentum, nesterov, weight_decay, i);
}

__global__ void k_adamw(float *param, const float *grad, float *m, float *v, int64_t n, crew_adamw_consts k)
{
    FOR_EACH(i, n) crew_body_adamw(param, grad, m, v, k, i);
}

__global__ void k_adam_direction(const float *grad, float *m, float *v, float *u, int64_t n, crew_adamw_consts k)
{
    FOR_EACH(i, n) crew_body_adam_direction(grad, m, v, u, k, i);
}

static void cuda_sgd_update(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr,
                            float momentum, int nesterov, float weight_decay)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_sgd LAUNCH(c, n)(param, grad, velocity, n, lr, momentum, nesterov, weight_decay);
    cuda_launched(c, "SGD update");
}

static void cuda_adamw_update(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                              const crew_adamw_consts *k)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_adamw LAUNCH(c, n)(param, grad, m, v, n, *k);
    cuda_launched(c, "AdamW update");
}

static void cuda_adam_direction(void *ctx, const float *grad, float *m, float *v, float *u, int64_t n,
                                const crew_adamw_consts *k)
{
    cuda_ctx *c = enter(ctx);
    if (n <= 0) return;
    k_adam_direction LAUNCH(c, n)(grad, m, v, u, n, *k);
    cuda_launched(c, "Adam direction (LAMB)");
}

/* ------------------------------------------------------------------ the table's compute ops */

void cuda_kernel_ops(crew_backend_ops *o)
{
    o->fill = cuda_fill;
    o->axpby = cuda_axpby;
    o->mul = cuda_mul;
    o->broadcast_rows = cuda_broadcast_rows;
    o->gemm_bias = cuda_gemm_bias;
    o->col_sum = cuda_col_sum;
    o->act_forward = cuda_act_forward;
    o->act_backward = cuda_act_backward;
    o->act_forward_slope = cuda_act_forward_slope;
    o->im2col = cuda_im2col;
    o->col2im = cuda_col2im;
    o->maxpool_forward = cuda_maxpool_forward;
    o->maxpool_backward = cuda_maxpool_backward;
    o->avgpool_forward = cuda_avgpool_forward;
    o->avgpool_backward = cuda_avgpool_backward;
    o->dropout_forward = cuda_dropout_forward;
    o->bn_col_sum = cuda_bn_col_sum;
    o->col_sqdev = cuda_col_sqdev;
    o->bn_scale_sums = cuda_bn_scale_sums;
    o->bn_forward = cuda_bn_forward;
    o->bn_backward_sums = cuda_bn_backward_sums;
    o->bn_backward = cuda_bn_backward;
    o->bn_param_grads = cuda_bn_param_grads;
    o->layernorm_forward = cuda_layernorm_forward;
    o->layernorm_backward = cuda_layernorm_backward;
    o->attention_forward = cuda_attention_forward;
    o->attention_backward = cuda_attention_backward;
    o->embedding_forward = cuda_embedding_forward;
    o->embedding_backward = cuda_embedding_backward;
    o->softmax_xent = cuda_softmax_xent;
    o->softmax = cuda_softmax;
    o->sgd_update = cuda_sgd_update;
    o->adamw_update = cuda_adamw_update;
    o->adam_direction = cuda_adam_direction;
}
