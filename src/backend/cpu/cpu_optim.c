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

/* AdamW (Loshchilov & Hutter) in torch.optim.AdamW's own arithmetic, op for op, so that the same
 * gradients give PyTorch's weights to the last bit or close to it:
 *   p ·= 1 − lr·wd;  m = lerp(m, g, 1 − β1);  v = v·β2 + (1 − β2)·g·g;
 *   p += −step_size · m / (√v / √(1 − β2ᵗ) + eps)
 * torch's CPU kernels (its AVX2/AVX-512 builds) fuse two of these into one rounding: the lerp for a
 * weight below ½, m + w·(g − m), and the addcmul, v·β2 + ((1 − β2)·g)·g. fmaf does the same on
 * every machine, with or without FMA hardware, so crew's result does not depend on the compiler.
 * What is left between the two is torch's vector sqrt, which is not always correctly rounded
 * (1 ulp off for about a fifth of inputs, measured on torch 2.15 AVX-512); crew's sqrtf is. */
void cpu_adamw_update(void *ctx, float *restrict param, const float *restrict grad, float *restrict m,
                      float *restrict v, int64_t n, const crew_adamw_consts *k)
{
    (void)ctx;
    const float decay = k->decay, w = k->one_minus_beta1, beta2 = k->beta2, w2 = k->one_minus_beta2;
    const float neg_step = -k->step_size, c2_sqrt = k->bias_c2_sqrt, eps = k->eps;
    const int small = w < 0.5f;
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = small ? fmaf(w, g - m[i], m[i]) : fmaf(w - 1.0f, g - m[i], g);
        float vi = fmaf(w2 * g, g, v[i] * beta2);
        m[i] = mi;
        v[i] = vi;
        float p = param[i] * decay;
        param[i] = p + neg_step * mi / (sqrtf(vi) / c2_sqrt + eps);
    }
}
