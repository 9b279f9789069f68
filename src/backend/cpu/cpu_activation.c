/* cpu_activation.c — elementwise activations and dropout. */
#include <math.h>

#include "backend/exp_poly.h"
#include "backend/cpu/cpu_ops.h"
#include "core/rng.h"

static inline float sigmoidf(float x)
{
    /* Never exponentiates a large positive number. */
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

#define CREW_SQRT1_2 0.70710678118654752440f
#define CREW_INV_SQRT_2PI 0.39894228040143267794f
#define CREW_SQRT_2_OVER_PI 0.79788456080286535588f
#define CREW_GELU_CUBIC 0.044715f
#define GELU_BLOCK 256

void cpu_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n)
{
    (void)ctx;
    switch (act) {
    case CREW_ACT_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case CREW_ACT_GELU:
        for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * CREW_SQRT1_2));
        break;
    case CREW_ACT_GELU_TANH:
        /* 0.5·(1 + tanh u) is σ(2u): one exp instead of tanhf (whose expm1f took 40% of a GPT's
         * forward pass), with no cancellation, and crew_exp_poly vectorises */
        for (int64_t i = 0; i < n; i++) {
            float u = CREW_SQRT_2_OVER_PI * (x[i] + CREW_GELU_CUBIC * x[i] * x[i] * x[i]);
            y[i] = x[i] / (1.0f + crew_exp_poly(-2.0f * u));
        }
        break;
    case CREW_ACT_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
        break;
    case CREW_ACT_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = sigmoidf(x[i]);
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
    case CREW_ACT_RELU: /* y > 0 exactly where x > 0; y, since the model may have written it over x */
        for (int64_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        break;
    case CREW_ACT_GELU:
        for (int64_t i = 0; i < n; i++) {
            float cdf = 0.5f * (1.0f + erff(x[i] * CREW_SQRT1_2));
            float pdf = CREW_INV_SQRT_2PI * expf(-0.5f * x[i] * x[i]);
            dx[i] = dy[i] * (cdf + x[i] * pdf);
        }
        break;
    case CREW_ACT_GELU_TANH: /* d/dx of x·σ(2u), u = √(2/π)(x + 0.044715x³): σ + 2x·σ(1 − σ)·u' */
        /* in blocks through a local buffer: dx may be dy (backend.h), and a loop whose output may
         * alias an input runs unvectorised, exp and all; the derivative's loop reads only x */
        for (int64_t i0 = 0; i0 < n; i0 += GELU_BLOCK) {
            float g[GELU_BLOCK];
            int64_t m = n - i0 < GELU_BLOCK ? n - i0 : GELU_BLOCK;
            const float *xb = x + i0;
            for (int64_t i = 0; i < m; i++) {
                float xi = xb[i], u = CREW_SQRT_2_OVER_PI * (xi + CREW_GELU_CUBIC * xi * xi * xi);
                float sg = 1.0f / (1.0f + crew_exp_poly(-2.0f * u));
                float du = CREW_SQRT_2_OVER_PI * (1.0f + 3.0f * CREW_GELU_CUBIC * xi * xi);
                g[i] = sg + 2.0f * xi * sg * (1.0f - sg) * du;
            }
            for (int64_t i = 0; i < m; i++) dx[i0 + i] = dy[i0 + i] * g[i];
        }
        break;
    case CREW_ACT_TANH:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        break;
    case CREW_ACT_SIGMOID:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i];
        break;
    }
}

void cpu_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                         float rate, uint64_t key, const int64_t *sample_ids)
{
    (void)ctx;
    const float keep_scale = 1.0f / (1.0f - rate);
    for (int64_t r = 0; r < rows; r++) {
        /* The mask of a sample depends on the sample alone, not on its row in this batch. */
        uint64_t row_key = crew_rng_key(key, (uint64_t)sample_ids[r], 0, 0);
        for (int64_t j = 0; j < cols; j++) {
            float m = crew_rng_uniform(row_key, (uint64_t)j) >= rate ? keep_scale : 0.0f;
            mask[r * cols + j] = m;
            y[r * cols + j] = x[r * cols + j] * m;
        }
    }
}
