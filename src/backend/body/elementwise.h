/* elementwise.h — the bodies of the simple vector ops (backend.h's fill, axpby, mul,
 * broadcast_rows, col_sum, to_bf16) and of the convolution kernel's two layouts (cuDNN's filter
 * transposes, cuda_conv.cu). body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_ELEMENTWISE_H
#define CREW_BACKEND_BODY_ELEMENTWISE_H

#include "backend/body/body.h"

CREW_BODY void crew_body_fill(float *x, float v, int64_t i) { x[i] = v; }

CREW_BODY void crew_body_axpby(float alpha, const float *x, float beta, float *y, int64_t i)
{
    y[i] = alpha * x[i] + beta * y[i];
}

CREW_BODY void crew_body_mul(const float *a, const float *b, float *out, int64_t i) { out[i] = a[i] * b[i]; }

/* y [rows, cols] = bias in every row; the CPU copies a row at a time */
CREW_BODY void crew_body_broadcast_rows(float *y, const float *bias, int64_t cols, int64_t i) { y[i] = bias[i % cols]; }

/* The same into a [rows, cols] block of c whose rows lie ldc apart (the other columns untouched):
 * a GPU's gemm_bias, which then adds the product with beta = 1 (the CPU's adds the bias after the
 * product: for k = 0 it leaves the bias, these values) */
CREW_BODY void crew_body_bias_rows(float *c, int64_t ldc, const float *bias, int64_t cols, int64_t i)
{
    c[(i / cols) * ldc + i % cols] = bias[i % cols];
}

/* Column j's sum over the rows in order, onto out[j] (accumulate) or from 0. The CPU walks rows
 * outer, columns inner (contiguous): the same adds in the same order for every column. */
CREW_BODY void crew_body_col_sum(const float *x, int64_t rows, int64_t cols, float *out, int accumulate, int64_t j)
{
    float s = accumulate ? out[j] : 0.0f;
    for (int64_t r = 0; r < rows; r++) s += x[r * cols + j];
    out[j] = s;
}

/* The same with the rows in blocks of `block` (crew_device_options.sum_block): each block's sum
 * from zero, added to those before in order (after out[j] when accumulating), as the sums of
 * replicas of each block would be. */
CREW_BODY void crew_body_col_sum_blocked(const float *x, int64_t rows, int64_t cols, float *out, int accumulate,
                                         int64_t block, int64_t j)
{
    float s = accumulate ? out[j] : 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        float p = 0.0f;
        for (int64_t r = r0; r < rows && r < r0 + block; r++) p += x[r * cols + j];
        s = r0 == 0 && !accumulate ? p : s + p;
    }
    out[j] = s;
}

/* float32 to bfloat16's bits, to nearest, ties to even; a NaN stays a quiet NaN of the same sign
 * and top payload bits; beyond bfloat16's largest finite value, infinity. The rounding of
 * core/bf16.h (crew_bf16_bits), which is host code only: here for a GPU to compute the same bits
 * (cuda_bf16.h's __float2bfloat16_rn gives every NaN one canonical pattern instead);
 * tests/test_kernel_bodies.c holds the two to each other over every class of value. */
CREW_BODY uint16_t crew_body_bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bfloat16's bits widened to the float they stand for (exact) */
CREW_BODY float crew_body_bf16_widen(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

CREW_BODY void crew_body_to_bf16(const float *x, crew_bf16 *y, int64_t i) { y[i] = crew_body_bf16_of(x[i]); }

/* A convolution kernel's two layouts: the layer's [KH, KW, C, F] (rows r < khkwc = KH·KW·C, F
 * columns) and cuDNN's [F, KH, KW, C]. to_filter writes filter[f][r] = kernel[r][f] at filter's
 * index i, from_filter the inverse at kernel's index i. */
CREW_BODY void crew_body_to_filter(const float *kernel, float *filter, int64_t khkwc, int64_t f_count, int64_t i)
{
    const int64_t f = i / khkwc, r = i % khkwc;
    filter[i] = kernel[r * f_count + f];
}

CREW_BODY void crew_body_from_filter(const float *filter, float *kernel, int64_t khkwc, int64_t f_count, int64_t i)
{
    const int64_t r = i / f_count, f = i % f_count;
    kernel[i] = filter[f * khkwc + r];
}

#endif
