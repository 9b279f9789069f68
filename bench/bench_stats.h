/* bench_stats.h — the median the benchmarks report (over rounds or repeated runs), one definition
 * for all of them. */
#ifndef CREW_BENCH_STATS_H
#define CREW_BENCH_STATS_H

#include <stdlib.h>

/* qsort's order of doubles, ascending */
static inline int bench_cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The median of v[0 .. n), n >= 1: the middle value, or the mean of the two middle ones. Sorts v. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
