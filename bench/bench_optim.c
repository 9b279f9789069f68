/* bench_optim.c — the CPU's AdamW update against the same update with torch's division by the bias
 * correction everywhere (docs/PERFORMANCE.md, "AdamW's one division").
 *
 *   bench_optim [--params N,N,...] [--runs R] [--rounds K]
 *
 * For each parameter count (default: the 2-replica MLP's shard, 134656; the MLP's 269322; the
 * CNN's 421642; 4M), K rounds [5] of: the CPU backend's adamw_update (up to 2^18 values √v times the
 * reciprocal of √(1 − β2ᵗ) in double, optim.h; beyond, the division: cpu_optim.c) and a loop of
 * crew_body_adamw (√v divided by it, as torch and the CUDA kernel do) over the same warm buffers, R times each [200], alternating which goes first. It
 * prints each one's median µs a call, the ratio, and whether the two left the same bits (they must:
 * the reciprocal's product rounds to the quotient). One thread, pinned where the caller pins it
 * (taskset). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/body/optim.h"
#include "bench_backend.h"
#include "bench_machine.h"
#include "bench_stats.h"
#include "core/timer.h"
#include "crew.h"

#define MAX_ROUNDS 99

/* The update with the division, as the CPU ran it before (the same flags: this file is built as the
 * library is). */
static void adamw_divide(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, int64_t n,
                         const crew_adamw_consts *k)
{
    const crew_adamw_consts kc = *k;
    for (int64_t i = 0; i < n; i++) crew_body_adamw(p, g, m, v, kc, i);
}

typedef struct buffers {
    float *p, *g, *m, *v;
} buffers;

static int make(buffers *b, int64_t n)
{
    b->p = malloc((size_t)n * sizeof(float));
    b->g = malloc((size_t)n * sizeof(float));
    b->m = malloc((size_t)n * sizeof(float));
    b->v = malloc((size_t)n * sizeof(float));
    if (!b->p || !b->g || !b->m || !b->v) return -1;
    for (int64_t i = 0; i < n; i++) { /* a trained net's magnitudes: no zeros, no subnormals */
        b->p[i] = 0.05f * (float)((i * 7919) % 2001 - 1000) / 1000.0f;
        b->g[i] = 1e-3f * (float)((i * 104729) % 2001 - 1000) / 1000.0f + 1e-6f;
        b->m[i] = 0.5f * b->g[i];
        b->v[i] = b->g[i] * b->g[i] + 1e-9f;
    }
    return 0;
}

static void release(buffers *b)
{
    free(b->p), free(b->g), free(b->m), free(b->v);
}

static int parse_list(const char *s, int64_t *out, int max)
{
    int n = 0;
    for (const char *at = s; *at && n < max;) {
        char *end;
        long long v = strtoll(at, &end, 10);
        if (end == at || v < 1 || v > (1LL << 30)) return -1;
        out[n++] = v;
        at = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    int64_t sizes[16] = {134656, 269322, 421642, 4 << 20};
    int n_sizes = 4, runs = 200, rounds = 5;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--params") && v) {
            n_sizes = parse_list(v, sizes, 16);
            i++;
        } else if (!strcmp(argv[i], "--runs") && v) {
            runs = atoi(v), i++;
        } else if (!strcmp(argv[i], "--rounds") && v) {
            rounds = atoi(v), i++;
        } else {
            fprintf(stderr, "usage: bench_optim [--params N,N,...] [--runs R] [--rounds K]\n");
            return 2;
        }
    }
    if (n_sizes < 1 || runs < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_optim: --params takes counts of 1 or more, --runs 1 or more, --rounds 1 to %d\n",
                MAX_ROUNDS);
        return 2;
    }
    crew_backend be;
    if (bench_open_cpu("bench_optim", &be)) return 1;
    /* step 10 of β2 0.999: √(1 − β2ᵗ) ≈ 0.0998, far from 1, as in the first thousands of steps */
    const crew_adamw_consts k = {0.99999f, 0.1f, 0.999f, 0.001f, 0.0015f, 0.0998f, 1e-8f};
    bench_load load;
    bench_load_start(&load);
    printf("AdamW update, one thread: the CPU backend's (the reciprocal in double up to 262144 values) against "
           "the division everywhere (torch's, the CUDA kernel's); median of %d rounds of %d calls\n\n", rounds, runs);
    printf("| parameters | backend (us) | division (us) | division / backend | same bits |\n");
    printf("|--:|--:|--:|--:|---|\n");
    int status = 0;
    for (int z = 0; z < n_sizes; z++) {
        const int64_t n = sizes[z];
        buffers a, b;
        if (make(&a, n) || make(&b, n)) {
            fprintf(stderr, "bench_optim: out of memory for %lld parameters\n", (long long)n);
            return 1;
        }
        double t_rc[MAX_ROUNDS], t_div[MAX_ROUNDS], ratio[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            for (int turn = 0; turn < 2; turn++) {
                const int rc = (turn == 0) == (r % 2 == 0);
                double t0 = crew_now();
                for (int j = 0; j < runs; j++)
                    if (rc)
                        be.ops->adamw_update(be.ctx, a.p, a.g, a.m, a.v, n, &k);
                    else
                        adamw_divide(b.p, b.g, b.m, b.v, n, &k);
                double each = (crew_now() - t0) / runs;
                if (rc)
                    t_rc[r] = each;
                else
                    t_div[r] = each;
            }
        for (int r = 0; r < rounds; r++) ratio[r] = t_div[r] / t_rc[r];
        int same = !memcmp(a.p, b.p, (size_t)n * sizeof(float)) && !memcmp(a.m, b.m, (size_t)n * sizeof(float)) &&
                   !memcmp(a.v, b.v, (size_t)n * sizeof(float));
        status |= !same;
        printf("| %lld | %.1f | %.1f | %.2fx | %s |\n", (long long)n, 1e6 * bench_median(t_rc, rounds),
               1e6 * bench_median(t_div, rounds), bench_median(ratio, rounds), same ? "yes" : "NO");
        release(&a);
        release(&b);
    }
    char say[96];
    printf("\nother processes used %s meanwhile\n", bench_load_say(bench_load_others(&load), say, sizeof say));
    be.ops->destroy(be.ctx);
    return status;
}
