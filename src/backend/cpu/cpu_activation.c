/* cpu_activation.c — elementwise activations and dropout: the formulas of
 * backend/body/activation.h, which the CUDA kernels run too, each activation in a loop of its own
 * (the switch outside, so that every loop vectorises). */
#include "backend/cpu/cpu_wide_vectors.h" /* first: the pragma must precede the bodies */

#include <string.h>

#include "backend/body/activation.h"
#include "backend/cpu/cpu_ops.h"

#define GELU_BLOCK 256

void cpu_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n)
{
    (void)ctx;
    switch (act) {
    case CREW_ACT_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = crew_act_relu(x[i]);
        break;
    case CREW_ACT_GELU:
        for (int64_t i = 0; i < n; i++) y[i] = crew_act_gelu(x[i]);
        break;
    case CREW_ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = crew_act_gelu_tanh(x[i]);
        break;
    case CREW_ACT_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
        break;
    case CREW_ACT_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = crew_act_sigmoid(x[i]);
        break;
    default: /* linear; softmax never reaches here (fused into the loss) */
        for (int64_t i = 0; i < n; i++) y[i] = x[i];
        break;
    }
}

void cpu_act_backward(void *ctx, crew_activation act, const float *x, const float *y, const float *dy,
                      float *dx, int64_t n)
{
    (void)ctx;
    switch (act) {
    case CREW_ACT_RELU:
        for (int64_t i = 0; i < n; i++) dx[i] = crew_act_relu_grad(y[i], dy[i]);
        break;
    case CREW_ACT_GELU:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * crew_act_gelu_slope(x[i]);
        break;
    case CREW_ACT_GELU_TANH:
        /* in blocks through a local buffer: dx may be dy (backend.h), and a loop whose output may
         * alias an input runs unvectorised, exp and all; the slope's loop reads only x */
        for (int64_t i0 = 0; i0 < n; i0 += GELU_BLOCK) {
            float g[GELU_BLOCK];
            int64_t m = n - i0 < GELU_BLOCK ? n - i0 : GELU_BLOCK;
            const float *xb = x + i0;
            for (int64_t i = 0; i < m; i++) g[i] = crew_act_gelu_tanh_slope(xb[i]);
            for (int64_t i = 0; i < m; i++) dx[i0 + i] = dy[i0 + i] * g[i];
        }
        break;
    case CREW_ACT_TANH:
        for (int64_t i = 0; i < n; i++) dx[i] = crew_act_tanh_grad(y[i], dy[i]);
        break;
    case CREW_ACT_SIGMOID:
        for (int64_t i = 0; i < n; i++) dx[i] = crew_act_sigmoid_grad(y[i], dy[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i];
        break;
    }
}

/* In blocks through local buffers, as GELU's backward: slope (or y) may be x, and a loop whose
 * output may alias its input runs unvectorised. The GELUs' loops call the forward and the slope
 * of backend/body/activation.h on the same x, and the compiler computes their common terms (u,
 * the exponential) once: the same operations on the same values, so the same bits as the two
 * computed apart (-ffp-contract is off in ISO C). */
void cpu_act_forward_slope(void *ctx, crew_activation act, const float *x, float *y, float *slope, int64_t n)
{
    (void)ctx;
    for (int64_t i0 = 0; i0 < n; i0 += GELU_BLOCK) {
        float yb[GELU_BLOCK], g[GELU_BLOCK];
        const int64_t m = n - i0 < GELU_BLOCK ? n - i0 : GELU_BLOCK;
        const float *xb = x + i0;
        switch (act) {
        case CREW_ACT_GELU_TANH:
            for (int64_t i = 0; i < m; i++) {
                yb[i] = crew_act_gelu_tanh(xb[i]);
                g[i] = crew_act_gelu_tanh_slope(xb[i]);
            }
            break;
        case CREW_ACT_GELU:
            for (int64_t i = 0; i < m; i++) {
                yb[i] = crew_act_gelu(xb[i]);
                g[i] = crew_act_gelu_slope(xb[i]);
            }
            break;
        default:
            for (int64_t i = 0; i < m; i++) {
                yb[i] = crew_act_forward_of(act, xb[i]);
                g[i] = crew_act_slope_of(act, xb[i]);
            }
            break;
        }
        memcpy(y + i0, yb, (size_t)m * sizeof *yb);
        memcpy(slope + i0, g, (size_t)m * sizeof *g);
    }
}

void cpu_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                         float rate, uint64_t key, const int64_t *sample_ids)
{
    (void)ctx;
    const float keep_scale = crew_dropout_keep_scale(rate);
    for (int64_t r = 0; r < rows; r++) {
        const uint64_t row_key = crew_dropout_row_key(key, sample_ids[r]);
        for (int64_t j = 0; j < cols; j++) {
            float m = crew_dropout_mask(row_key, j, rate, keep_scale);
            mask[r * cols + j] = m;
            y[r * cols + j] = x[r * cols + j] * m;
        }
    }
}
