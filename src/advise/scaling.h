/* scaling.h — the scaling advisor's internals: statistics shared by the trials (scaling_trial.c),
 * the link benchmark (scaling_link.c) and the cost model (scaling.c).
 *
 * The cost model of one optimizer step on N replicas, each with the same per-device batch B
 * (the global batch grows with N):
 *
 *   step(N) = compute + data + sync(N) + (1 − h) · allreduce(N) + [N > 1] · α
 *   allreduce(N) = α + 2(N − 1)/N · S / β          (ring all-reduce of the S gradient bytes)
 *   sync(N) = σ · E[max of N standard normals]      (the slowest replica sets the pace)
 *
 * compute: one replica's forward, backward, update and bookkeeping per step (it does not change
 * with N: every replica works on its own B samples); data: its wait for batches; h: the share of
 * the all-reduce hidden behind the backward pass; σ: the robust spread of a step's compute; the
 * last α: the small all-reduce of the step's metrics. On this machine the replicas also share
 * `cores` CPU cores: beyond them they take turns, and compute grows by N / cores. */
#ifndef CREW_ADVISE_SCALING_H
#define CREW_ADVISE_SCALING_H

#include <stdint.h>

#include "crew.h"

/* Median of v[0..n) (reorders v); NaN when n is 0. */
double crew_scale_median(double *v, int64_t n);
/* 1.4826 × the median absolute deviation: σ for normal data, robust to a few outliers (reorders v). */
double crew_scale_robust_sigma(double *v, int64_t n);
/* E[max of n independent standard normals]: 0 for 1, 0.564 for 2, 1.029 for 4, ... */
double crew_scale_expected_max(int n);

#endif
