/* bench_machine.h — how much of the machine other processes used while a benchmark ran, so that a
 * figure taken on a shared machine can be recognised (as tools/bench_compare.py's "other procs").
 *
 *   bench_load l;
 *   bench_load_start(&l);
 *   ... measure ...
 *   double cores = bench_load_others(&l); // CPU cores' worth that other processes kept busy
 *   char say[96];
 *   printf("other processes used %s\n", bench_load_say(cores, say, sizeof say));
 *
 * A run shorter than BENCH_LOAD_MIN_S gets -1 (unknown): /proc/stat counts each core's time in
 * ticks of 1/CLK_TCK s (10 ms), so over a few milliseconds one tick more or less reads as whole
 * cores (bench_optim at --runs 5 once printed 325.6 cores); over a quarter of a second a tick is
 * 0.04 of a core.
 */
#ifndef CREW_BENCH_MACHINE_H
#define CREW_BENCH_MACHINE_H

#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define BENCH_LOAD_MIN_S 0.25

typedef struct bench_load {
    double busy_s, own_s, wall_s;
} bench_load;

/* CPU seconds the whole machine has spent busy since boot (/proc/stat), or -1. */
static inline double bench_busy_cpu_s(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {0};
    int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                     &v[7]);
    fclose(f);
    if (got != 8) return -1;
    /* user nice system idle iowait irq softirq steal: all but idle and iowait */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

static inline double bench_own_cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
           1e-6 * (double)u.ru_stime.tv_usec;
}

static inline double bench_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void bench_load_start(bench_load *l)
{
    l->busy_s = bench_busy_cpu_s();
    l->own_s = bench_own_cpu_s();
    l->wall_s = bench_wall_s();
}

/* Cores' worth of CPU that other processes used since bench_load_start; -1 when unknown (no
 * /proc/stat, or a run too short to tell). */
static inline double bench_load_others(const bench_load *l)
{
    double busy = bench_busy_cpu_s(), own = bench_own_cpu_s(), wall = bench_wall_s();
    if (busy < 0 || l->busy_s < 0 || wall - l->wall_s < BENCH_LOAD_MIN_S) return -1;
    double others = (busy - l->busy_s - (own - l->own_s)) / (wall - l->wall_s);
    return others > 0 ? others : 0;
}

/* bench_load_others' figure in words: "0.03 cores", or why there is none. */
static inline const char *bench_load_say(double cores, char *buf, size_t n)
{
    if (cores < 0)
        snprintf(buf, n, "an unknown number of cores (a run under %.2g s is too short to tell)", BENCH_LOAD_MIN_S);
    else
        snprintf(buf, n, "%.2f cores", cores);
    return buf;
}

#endif
