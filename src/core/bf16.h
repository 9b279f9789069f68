/* bf16.h — float32 to bfloat16 precision, kept in a float.
 *
 * bfloat16 is float32's sign, its 8 exponent bits and the top 7 of its 23 mantissa bits: the same
 * range, 2^-8 relative precision. crew_bf16_round gives the float32 whose low 16 bits are zero
 * nearest to x, ties to even (what cuBLAS, cuDNN and PyTorch's conversions do); a value beyond
 * bfloat16's largest finite one rounds to infinity, NaN stays NaN. crew_bf16_bits gives the same
 * value as the 16 bits a bfloat16 buffer (CREW_DT_BF16) stores, crew_bf16_widen turns them back
 * into the float exactly. Header only: the CPU backend's GEMM operands and bfloat16 activations
 * in --precision bf16, and the tests, use it. */
#ifndef CREW_CORE_BF16_H
#define CREW_CORE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float crew_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        u |= 0x00400000u; /* a quiet NaN, whatever its payload's low bits */
    } else {
        u += 0x7fffu + ((u >> 16) & 1u); /* to nearest, ties to even; a carry moves the exponent */
    }
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline uint16_t crew_bf16_bits(float x)
{
    float r = crew_bf16_round(x);
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    return (uint16_t)(u >> 16);
}

static inline float crew_bf16_widen(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
