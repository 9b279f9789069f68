/* reduce.h — the bodies of the reductions: backend.h's sum (in order, in double), sum_squares (in
 * backend.h's chunks, CREW_SQ_CHUNK), all_finite (a fixed grid of blocks on a GPU), the counting
 * ops' sum of per-row flags, and the ordered sum of the NCCL communicator
 * (src/comm/nccl/comm_nccl.cu: comm_local.c's arithmetic). body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_REDUCE_H
#define CREW_BACKEND_BODY_REDUCE_H

#include "backend/body/body.h"

/* The fixed grid of the GPU's block reductions (all_finite): CREW_BODY_PARTIALS
 * blocks of CREW_BODY_THREADS threads, whatever n, so the order of every sum is the same on every
 * run. Block b takes the stretch [lo, hi) of x (crew_body_stretch); its thread t the stretch's
 * elements lo + t, lo + t + threads, ...; the threads' partials meet in a tree in shared memory
 * (width threads/2, then /4, ...: part[t] += part[t + w]), and one thread adds the blocks' in block
 * order (crew_body_add_partials). */
#define CREW_BODY_PARTIALS 256
#define CREW_BODY_THREADS 256

/* Σ x in order, in double: backend.h's sum, the CPU's loop and the GPU's one thread. */
CREW_BODY double crew_body_sum_serial(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i];
    return s;
}

CREW_BODY double crew_body_square(float x) { return (double)x * (double)x; }

/* NaN and ±inf: the floats whose exponent bits are all ones (an integer test, which vectorises). */
CREW_BODY int crew_body_nonfinite(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7f800000u) == 0x7f800000u;
}

CREW_BODY void crew_body_stretch(int64_t n, int64_t blocks, int64_t b, int64_t *lo, int64_t *hi)
{
    const int64_t per = (n + blocks - 1) / blocks;
    *lo = b * per;
    *hi = *lo + per < n ? *lo + per : n;
}

/* ---- sum_squares in backend.h's order (CREW_SQ_CHUNK), as a GPU runs it: a thread a lane.
 * Lane k's sum continued from acc over x[0 .. n), whose first value is at place `at` of its chunk:
 * the squares of the values at places k, k + 16, ... of the chunk, in order (n stays in the chunk). */
CREW_BODY double crew_body_sq_lane(const float *x, int64_t n, int64_t at, int64_t k, double acc)
{
    for (int64_t j = ((k - at) % CREW_SQ_LANES + CREW_SQ_LANES) % CREW_SQ_LANES; j < n; j += CREW_SQ_LANES)
        acc += crew_body_square(x[j]);
    return acc;
}

/* After a piece of n values of the chunk under way: the count moves on, and a chunk that is full
 * adds its lanes' tree to the total and starts the next from zero. */
CREW_BODY void crew_body_sq_close(double *state, int64_t n)
{
    const int64_t filled = (int64_t)state[CREW_SQ_FILLED] + n;
    if (filled < CREW_SQ_CHUNK) {
        state[CREW_SQ_FILLED] = (double)filled;
        return;
    }
    state[CREW_SQ_TOTAL] += crew_sq_lanes_fold(state);
    for (int k = 0; k < CREW_SQ_LANES; k++) state[k] = 0.0;
    state[CREW_SQ_FILLED] = 0.0;
}

/* Whole chunks' sums onto the total, in order */
CREW_BODY void crew_body_sq_add(const double *sums, int64_t count, double *state)
{
    for (int64_t c = 0; c < count; c++) state[CREW_SQ_TOTAL] += sums[c];
}

/* Thread t's partial of a stretch: whether any value is not finite. */
CREW_BODY int crew_body_nonfinite_thread(const float *x, int64_t lo, int64_t hi, int64_t t, int64_t threads)
{
    int bad = 0;
    for (int64_t i = lo + t; i < hi; i += threads) bad |= crew_body_nonfinite(x[i]);
    return bad;
}

CREW_BODY double crew_body_add_partials(const double *partial, int count)
{
    double s = 0.0;
    for (int i = 0; i < count; i++) s += partial[i];
    return s;
}

/* The per-row flags of a counting op (embedding's bad ids, the loss's right answers), in order. */
CREW_BODY long long crew_body_count(const long long *flags, int64_t rows)
{
    long long s = 0;
    for (int64_t i = 0; i < rows; i++) s += flags[i];
    return s;
}

/* The ordered sum at value i of rows pieces of len values (parts [rows, len]): parts[0][i] +
 * parts[1][i] + ... in that order, then × inv (1/P, in the sum's type) for a mean. comm_local.c's
 * all-reduce adds the ranks' buffers in the same order a block at a time, and multiplies by
 * (T)1/(T)P: the same bits. One function per type (C has no templates). */
#define CREW_BODY_ORDERED_SUM(name, T)                                                           \
    CREW_BODY T name(const T *parts, int64_t rows, int64_t len, int avg, T inv, int64_t i)       \
    {                                                                                            \
        T acc = parts[i];                                                                        \
        for (int64_t p = 1; p < rows; p++) acc += parts[p * len + i];                            \
        return avg ? acc * inv : acc;                                                            \
    }
CREW_BODY_ORDERED_SUM(crew_body_ordered_sum_f32, float)
CREW_BODY_ORDERED_SUM(crew_body_ordered_sum_f64, double)
#undef CREW_BODY_ORDERED_SUM

#endif
