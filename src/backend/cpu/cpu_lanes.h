/* cpu_lanes.h — a GPU warp's order of a row's sums, on the CPU.
 *
 * The row kernels (softmax cross-entropy, softmax, layer norm, attention's softmax and its
 * backward) run a warp per row on a GPU: lane l of CREW_BODY_LANES takes elements l, l + 32,
 * l + 64, ... in order, and the lanes' partials meet in a butterfly of shuffles (cuda_kernels.cu,
 * warp_sum). The CPU sums its rows in that order too: it keeps the 32 partials side by side, adds
 * a row 32 elements at a time into them (a loop the compiler vectorises, where a serial sum waits
 * on each add's latency), and folds them as the butterfly does. So a row's sum has the same bits on
 * the CPU as on a GPU, and tests/test_kernel_bodies.c holds the CPU's row kernels to an emulation
 * of the warp, bit for bit.
 *
 * The fold: at each level k = 16, 8, 4, 2, 1 lane l < k takes lane l + k's value, as lane l does
 * with lane l ^ k's in the butterfly. Lane 0's total is the warp's (every lane's, for a sum:
 * a + b == b + a). */
#ifndef CREW_BACKEND_CPU_LANES_H
#define CREW_BACKEND_CPU_LANES_H

#include <stdint.h>

#include "backend/body/body.h"
#include "backend/body/loss.h"

#define CPU_LANES CREW_BODY_LANES

/* How many of the 32 lanes take an element of the strip of a row of n that starts at j0. */
static inline int64_t cpu_lanes_width(int64_t n, int64_t j0) { return n - j0 < CPU_LANES ? n - j0 : CPU_LANES; }

static inline void cpu_lanes_zero(float p[CPU_LANES])
{
    for (int l = 0; l < CPU_LANES; l++) p[l] = 0.0f;
}

/* p[l] += term(x[j], arg) for j = l, l + 32, ... below n: each lane's partial of the terms of
 * x[0 .. n), in its order. term is a constant where called, so the compiler inlines it. */
static inline void cpu_lanes_add_terms(float p[CPU_LANES], const float *x, int64_t n, float (*term)(float, float),
                                       float arg)
{
    if (n % CPU_LANES == 0) { /* whole strips: a constant width, the partials kept in registers */
        for (int64_t j0 = 0; j0 < n; j0 += CPU_LANES)
            for (int l = 0; l < CPU_LANES; l++) p[l] += term(x[j0 + l], arg);
        return;
    }
    for (int64_t j0 = 0; j0 < n; j0 += CPU_LANES) {
        const int64_t w = cpu_lanes_width(n, j0);
        for (int64_t l = 0; l < w; l++) p[l] += term(x[j0 + l], arg);
    }
}

static inline float cpu_lanes_value(float x, float unused)
{
    (void)unused;
    return x;
}

/* p[l] += x[j] for j = l, l + 32, ... below n: each lane's partial of x[0 .. n), in its order */
static inline void cpu_lanes_add(float p[CPU_LANES], const float *x, int64_t n)
{
    cpu_lanes_add_terms(p, x, n, cpu_lanes_value, 0.0f);
}

/* warp_sum's total of the partials (p is spent) */
static inline float cpu_lanes_sum(float p[CPU_LANES])
{
    for (int k = CPU_LANES / 2; k > 0; k /= 2)
        for (int l = 0; l < k; l++) p[l] = p[l] + p[l + k];
    return p[0];
}

/* warp_max's lane 0 (p is spent) */
static inline float cpu_lanes_max(float p[CPU_LANES])
{
    for (int k = CPU_LANES / 2; k > 0; k /= 2)
        for (int l = 0; l < k; l++) p[l] = crew_lane_max_of(p[l + k], p[l]);
    return p[0];
}

/* The largest of x[0 .. n) as the warp finds it: every lane starts from x[0] (the lane pieces'
 * crew_softmax_lane_max, crew_att_lane_max) and keeps a later element only when it is greater */
static inline float cpu_lanes_row_max(const float *x, int64_t n)
{
    float p[CPU_LANES];
    for (int l = 0; l < CPU_LANES; l++) p[l] = x[0];
    for (int64_t j0 = 0; j0 < n; j0 += CPU_LANES) {
        const int64_t w = cpu_lanes_width(n, j0);
        for (int64_t l = 0; l < w; l++) p[l] = x[j0 + l] > p[l] ? x[j0 + l] : p[l];
    }
    return cpu_lanes_max(p);
}

#endif
