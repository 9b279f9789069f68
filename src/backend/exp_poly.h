/* exp_poly.h — an expf that the compiler vectorises, and that a GPU computes to the same bits.
 * glibc's expf is a call per value, which a loop cannot vectorise without -ffast-math; GELU (tanh
 * form) and attention's softmax spent a quarter of a GPT's forward pass in it and in tanhf, and
 * the loss half of its time. This is Cephes' expf: n = round(x / ln 2), r = x − n·ln 2 in two
 * parts, exp(r) by a degree-7 polynomial, times 2ⁿ built from its bits; within 2 ulp of exp over
 * the clamped range, branch-free and the same bits on every machine (fmaf and rintf are exact IEEE
 * operations). x is clamped to [−87.3, 88.3], whose exp are the smallest and largest normal powers
 * of 2 it builds: below, it returns ~1e-38 instead of a denormal or 0, above, ~2e38 instead of ∞,
 * both harmless where it is used (a softmax's terms next to 1, and 1 + exp in a sigmoid's
 * denominator). A NaN stays NaN: the clamps compare so that it passes them (a NaN attention score
 * used to become exp(−87.3), and the softmax's probabilities finite), and 2ⁿ is built by adding
 * 1.5·2²³ to n and reading n off the float's low bits instead of converting n to an integer, which
 * is undefined for a NaN in C; for every other x the two give the same bits.
 * The CUDA backend calls it too (GELU's tanh form, attention's softmax, the loss's softmaxes), so
 * that a GPU's values are the CPU's there: every operation in it is IEEE-exact or correctly
 * rounded on both. */
#ifndef CREW_BACKEND_EXP_POLY_H
#define CREW_BACKEND_EXP_POLY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CREW_EXP_FN static inline __host__ __device__
#else
#define CREW_EXP_FN static inline
#endif

CREW_EXP_FN float crew_exp_poly(float x)
{
    x = x < -87.3f ? -87.3f : x; /* not fminf/fmaxf: a call each where the loop is not vectorised */
    x = x > 88.3f ? 88.3f : x;   /* (a NaN is neither: it goes on) */
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
    /* n is an integer in [−126, 127]: n + 1.5·2²³ is exact, its low bits n + 0x400000 */
    const float shifted = n + 12582912.0f;
    uint32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
