/* cpu_math.h — an expf that the compiler vectorises. glibc's expf is a call per value, which a
 * loop cannot vectorise without -ffast-math; GELU (tanh form) and attention's softmax spent a
 * quarter of a GPT's forward pass in it and in tanhf. This is Cephes' expf: n = round(x / ln 2),
 * r = x − n·ln 2 in two parts, exp(r) by a degree-7 polynomial, times 2ⁿ built from its bits;
 * within 2 ulp of exp over the clamped range, branch-free and the same bits on every machine
 * (fmaf and rintf are exact IEEE operations). x is clamped to [−87.3, 88.3], whose exp are the
 * smallest and largest normal powers of 2 it builds: below, it returns ~1e-38 instead of a
 * denormal or 0, above, ~2e38 instead of ∞, both harmless where it is used (a softmax's terms
 * next to 1, and 1 + exp in a sigmoid's denominator). */
#ifndef CREW_CPU_MATH_H
#define CREW_CPU_MATH_H

#include <math.h>
#include <stdint.h>

static inline float cpu_expf(float x)
{
    x = x > -87.3f ? x : -87.3f; /* not fminf/fmaxf: a call each where the loop is not vectorised */
    x = x < 88.3f ? x : 88.3f;
    float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    union {
        uint32_t u;
        float f;
    } scale = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return p * scale.f;
}

#endif
