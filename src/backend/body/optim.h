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

/* √v / √(1 − β2ᵗ), torch's division, as a product in double with the divisor's reciprocal
 * (rc = 1 / (double)bias_c2_sqrt, once per update): the same float for every float √v, so a CPU
 * loop computes crew_body_adamw's bits with one division and one square root an element instead of
 * two divisions and a root, which share one divider (the bottleneck of a loop whose arrays are in
 * cache; cpu_optim.c says where the CPU uses it). Why it is exact: the
 * product is within 2^-52 (relative) of the true quotient q = a/c, while a q of two 24-bit floats
 * that is not a rounding midpoint m of float lies at least 2^-49 from every one (a − m·c is a
 * non-zero multiple of the product of m's and c's last places), and q is never a midpoint (a 25-bit
 * odd significand times c's needs more than a's 24 bits); so rounding the product to float rounds
 * q. test_kernel_bodies checks it against the division over every significand of a binade. */
CREW_BODY float crew_body_div_rc(float a, double rc) { return (float)((double)a * rc); }
CREW_BODY float crew_body_adam_denom_rc(float v, double rc) { return crew_body_div_rc(sqrtf(v), rc); }

/* crew_body_adamw with rc = 1 / (double)k.bias_c2_sqrt: the same bits (above) */
CREW_BODY void crew_body_adamw_rc(float *param, const float *grad, float *m, float *v, crew_adamw_consts k, double rc,
                                  int64_t i)
{
    crew_body_adam_moments(grad[i], m, v, &k, i);
    float p = param[i] * k.decay;
    param[i] = p + -k.step_size * m[i] / (crew_body_adam_denom_rc(v[i], rc) + k.eps);
}

/* Adam's direction (LAMB's first half): the moments as crew_body_adamw advances them, and
 * u = step_size · m / (√v / √(1 − β2ᵗ) + eps) with step_size = 1 / (1 − β1ᵗ). u may be grad. */
CREW_BODY void crew_body_adam_direction(const float *grad, float *m, float *v, float *u, crew_adamw_consts k,
                                        int64_t i)
{
    crew_body_adam_moments(grad[i], m, v, &k, i);
    u[i] = k.step_size * m[i] / (sqrtf(v[i]) / k.bias_c2_sqrt + k.eps);
}

/* crew_body_adam_direction with rc = 1 / (double)k.bias_c2_sqrt: the same bits */
CREW_BODY void crew_body_adam_direction_rc(const float *grad, float *m, float *v, float *u, crew_adamw_consts k,
                                           double rc, int64_t i)
{
    crew_body_adam_moments(grad[i], m, v, &k, i);
    u[i] = k.step_size * m[i] / (crew_body_adam_denom_rc(v[i], rc) + k.eps);
}

#endif
