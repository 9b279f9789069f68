/* optim.h — the optimisers' updates, one parameter at a time (backend.h's sgd_update,
 * adamw_update and adam_direction). body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_OPTIM_H
#define CREW_BACKEND_BODY_OPTIM_H

#include "backend/body/body.h"

/* PyTorch's SGD: g += wd·p; v = μ·v + g; step = nesterov ? g + μ·v : v; p −= lr·step. */
CREW_BODY void crew_body_sgd(float *param, const float *grad, float *velocity, float lr, float momentum, int nesterov,
                             float weight_decay, int64_t i)
{
    float g = grad[i] + weight_decay * param[i];
    if (momentum != 0.0f) {
        float v = momentum * velocity[i] + g;
        velocity[i] = v;
        g = nesterov ? g + momentum * v : v;
    }
    param[i] -= lr * g;
}

/* AdamW (Loshchilov & Hutter) in torch.optim.AdamW's own arithmetic, op for op, so that the same
 * gradients give PyTorch's weights to the last bit or close to it:
 *   p ·= 1 − lr·wd;  m = lerp(m, g, 1 − β1);  v = v·β2 + (1 − β2)·g·g;
 *   p += −step_size · m / (√v / √(1 − β2ᵗ) + eps)
 * torch's CPU kernels (its AVX2/AVX-512 builds) fuse two of these into one rounding: the lerp for a
 * weight below ½, m + w·(g − m), and the addcmul, v·β2 + ((1 − β2)·g)·g. fmaf does the same on
 * every machine, with or without FMA hardware (and on a GPU), so crew's result does not depend on
 * the compiler. What is left between the two is torch's vector sqrt, which is not always correctly
 * rounded (1 ulp off for about a fifth of inputs, measured on torch 2.15 AVX-512); crew's sqrtf is.
 * k by value: the constants are the loop's, never aliased by the arrays it writes. */
CREW_BODY void crew_body_adam_moments(float g, float *m, float *v, const crew_adamw_consts *k, int64_t i)
{
    const float w = k->one_minus_beta1;
    const int small = w < 0.5f;
    m[i] = small ? fmaf(w, g - m[i], m[i]) : fmaf(w - 1.0f, g - m[i], g);
    v[i] = fmaf(k->one_minus_beta2 * g, g, v[i] * k->beta2);
}

CREW_BODY void crew_body_adamw(float *param, const float *grad, float *m, float *v, crew_adamw_consts k, int64_t i)
{
    crew_body_adam_moments(grad[i], m, v, &k, i);
    float p = param[i] * k.decay;
    param[i] = p + -k.step_size * m[i] / (sqrtf(v[i]) / k.bias_c2_sqrt + k.eps);
}

/* Adam's direction (LAMB's first half): the moments as crew_body_adamw advances them, and
 * u = step_size · m / (√v / √(1 − β2ᵗ) + eps) with step_size = 1 / (1 − β1ᵗ). u may be grad. */
CREW_BODY void crew_body_adam_direction(const float *grad, float *m, float *v, float *u, crew_adamw_consts k,
                                        int64_t i)
{
    crew_body_adam_moments(grad[i], m, v, &k, i);
    u[i] = k.step_size * m[i] / (sqrtf(v[i]) / k.bias_c2_sqrt + k.eps);
}

#endif
