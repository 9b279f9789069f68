/* cpu_optim.c — optimiser updates, one pass over the flat parameter buffer. */
#include <math.h>

#include "backend/cpu/cpu_ops.h"

/* PyTorch's SGD: g += wd·p; v = μ·v + g; step = nesterov ? g + μ·v : v; p −= lr·step. */
void cpu_sgd_update(void *ctx, float *restrict param, const float *restrict grad, float *restrict velocity, int64_t n,
                    float lr, float momentum, int nesterov, float weight_decay)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i] + weight_decay * param[i];
        if (momentum != 0.0f) {
            float v = momentum * velocity[i] + g;
            velocity[i] = v;
            g = nesterov ? g + momentum * v : v;
        }
        param[i] -= lr * g;
    }
}

/* AdamW (Loshchilov & Hutter), PyTorch's form: p ·= 1 − lr·wd, then the Adam step.
 * bias_c1 = 1 − β1^t, bias_c2 = 1 − β2^t. */
void cpu_adamw_update(void *ctx, float *restrict param, const float *restrict grad, float *restrict m,
                      float *restrict v, int64_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float bias_c1, float bias_c2)
{
    (void)ctx;
    const float step = lr / bias_c1;
    const float inv_sqrt_c2 = 1.0f / sqrtf(bias_c2);
    const float decay = 1.0f - lr * weight_decay;
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * decay - step * mi / (sqrtf(vi) * inv_sqrt_c2 + eps);
    }
}
