/* bench_cold.h — a benchmark's calls timed with their data out of the cache, as in training, where
 * other layers' work runs between two calls of an op: before each call, every cache line of
 * another buffer is written.
 *
 *   bench_cold cold;
 *   if (bench_cold_open(&cold, mb)) ... no room ...   // mb 0: nothing written, the calls warm
 *   bench_cold_evict(&cold); t0 = now(); op(); ...
 *   bench_cold_close(&cold);
 */
#ifndef CREW_BENCH_COLD_H
#define CREW_BENCH_COLD_H

#include <stdint.h>
#include <stdlib.h>

typedef struct bench_cold {
    float *other;
    int64_t n; /* floats */
} bench_cold;

/* 0, or -1 when there is no room for mb MiB */
static inline int bench_cold_open(bench_cold *c, int64_t mb)
{
    c->n = mb * (1 << 20) / (int64_t)sizeof(float);
    c->other = c->n ? calloc((size_t)c->n, sizeof *c->other) : NULL;
    return c->n && !c->other ? -1 : 0;
}

static inline void bench_cold_evict(bench_cold *c)
{
    for (int64_t i = 0; i < c->n; i += 64 / (int64_t)sizeof(float)) c->other[i] += 1.0f;
}

static inline void bench_cold_close(bench_cold *c)
{
    free(c->other);
    c->other = NULL;
    c->n = 0;
}

#endif
