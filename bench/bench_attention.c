/* bench_attention.c — one layer's causal self-attention, forward and backward, on a device of a
 * kind, as a transformer block runs it (backend.h's attention_forward and attention_backward).
 *
 *   bench_attention [--kind cpu] [--batch B] [--context T] [--heads H] [--head-dim D]
 *                   [--precision fp32|bf16] [--rounds R] [--cold MB] [--json]
 *
 * Defaults: one replica's share of a gpt_tiny step (16 windows of T = 128, 4 heads of 32). Each
 * round runs forward and backward 10 times and keeps the fastest of each; the median of the rounds
 * is reported, in ms and in GFLOP/s of the causal half's products (the scores and att·v each
 * 2·d·T(T+1)/2 a head, twice that backward). With --precision bf16 the products are bfloat16 GEMMs
 * (the CPU's: oneDNN calls in 32-row blocks); fp32 runs crew's own register tiles on the CPU.
 * --cold MB writes MB of another buffer before forward and again before backward, as a training
 * step's GEMMs and other layers do between two attentions: on the CPU, with the data in memory
 * rather than the cache, attention's strided reads are what its prefetching is for (at gpt_tiny's
 * share, --cold 128 took 1.6x the warm time before it). tools/bench_attention.py sets PyTorch's
 * attention beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench_cold.h"
#include "bench_machine.h"
#include "bench_stats.h"
#include "core/timer.h"

typedef struct args {
    const char *kind;
    int64_t batch, T, heads, d;
    int precision, rounds, json;
    int64_t cold_mb;
} args;

static int parse(int argc, char **argv, args *a)
{
    *a = (args){.kind = "cpu", .batch = 16, .T = 128, .heads = 4, .d = 32, .precision = CREW_PRECISION_FP32, .rounds = 5};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--kind") && v)
            a->kind = v, i++;
        else if (!strcmp(argv[i], "--batch") && v)
            a->batch = atoll(v), i++;
        else if (!strcmp(argv[i], "--context") && v)
            a->T = atoll(v), i++;
        else if (!strcmp(argv[i], "--heads") && v)
            a->heads = atoll(v), i++;
        else if (!strcmp(argv[i], "--head-dim") && v)
            a->d = atoll(v), i++;
        else if (!strcmp(argv[i], "--precision") && v && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
            a->precision = !strcmp(v, "bf16") ? CREW_PRECISION_BF16 : CREW_PRECISION_FP32, i++;
        else if (!strcmp(argv[i], "--rounds") && v)
            a->rounds = atoi(v), i++;
        else if (!strcmp(argv[i], "--cold") && v)
            a->cold_mb = atoll(v), i++;
        else if (!strcmp(argv[i], "--json"))
            a->json = 1;
        else
            return 0;
    }
    return a->batch > 0 && a->T > 0 && a->heads > 0 && a->d > 0 && a->rounds > 0 && a->cold_mb >= 0;
}


/* 1 for CREW_OK; else 0, the status released */
static int fine(crew_status s)
{
    crew_status_free(s);
    return s == CREW_OK;
}

int main(int argc, char **argv)
{
    args a;
    if (!parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench_attention [--kind cpu] [--batch B] [--context T] [--heads H] [--head-dim D]\n"
                        "                       [--precision fp32|bf16] [--rounds R] [--cold MB] [--json]\n");
        return 2;
    }
    crew_device_options o = {.precision = a.precision};
    crew_backend be;
    crew_status st = crew_device_open(a.kind, 0, &o, &be);
    if (st != CREW_OK) {
        fprintf(stderr, "bench_attention: %s\n", crew_status_message(st));
        crew_status_free(st);
        return 1;
    }
    const int64_t C = a.heads * a.d, n_qkv = a.batch * a.T * 3 * C, n_y = a.batch * a.T * C,
                  n_att = a.batch * a.heads * a.T * a.T;
    float *host = malloc((size_t)n_qkv * sizeof *host);
    float *qkv = NULL, *att = NULL, *y = NULL, *dy = NULL, *datt = NULL, *dqkv = NULL;
    int ok = host && fine(crew_dev_alloc_f32(&be, n_qkv, &qkv)) && fine(crew_dev_alloc_f32(&be, n_att, &att)) &&
             fine(crew_dev_alloc_f32(&be, n_y, &y)) && fine(crew_dev_alloc_f32(&be, n_y, &dy)) &&
             fine(crew_dev_alloc_f32(&be, n_att, &datt)) && fine(crew_dev_alloc_f32(&be, n_qkv, &dqkv));
    if (ok) { /* values of a trained model's size: U(±1) */
        uint64_t s = 1;
        for (int64_t i = 0; i < n_qkv; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            host[i] = (float)((double)(s >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
        }
        ok = fine(be.ops->upload(be.ctx, NULL, qkv, host, n_qkv, CREW_DT_F32)) &&
             fine(be.ops->upload(be.ctx, NULL, dy, host, n_y, CREW_DT_F32));
    }
    if (!ok) {
        fprintf(stderr, "bench_attention: no room for one layer's attention on %s\n", a.kind);
        return 1;
    }
    bench_cold cold;
    if (bench_cold_open(&cold, a.cold_mb)) {
        fprintf(stderr, "bench_attention: no room for --cold %lld\n", (long long)a.cold_mb);
        return 1;
    }
    double *fwd = malloc((size_t)a.rounds * sizeof *fwd), *bwd = malloc((size_t)a.rounds * sizeof *bwd);
    bench_load load;
    bench_load_start(&load);
    for (int r = 0; r < a.rounds; r++) {
        fwd[r] = bwd[r] = 1e30;
        for (int rep = 0; rep < 10; rep++) {
            bench_cold_evict(&cold);
            double t0 = crew_now();
            be.ops->attention_forward(be.ctx, qkv, att, CREW_DT_F32, NULL, y, a.batch, a.T, a.heads, a.d);
            be.ops->sync(be.ctx, NULL);
            const double f = crew_now() - t0;
            bench_cold_evict(&cold);
            double t1 = crew_now();
            be.ops->attention_backward(be.ctx, dy, qkv, att, CREW_DT_F32, datt, dqkv, a.batch, a.T, a.heads, a.d);
            be.ops->sync(be.ctx, NULL);
            double t2 = crew_now();
            if (f < fwd[r]) fwd[r] = f;
            if (t2 - t1 < bwd[r]) bwd[r] = t2 - t1;
        }
    }
    const double others = bench_load_others(&load);
    const double f_ms = 1e3 * bench_median(fwd, a.rounds), b_ms = 1e3 * bench_median(bwd, a.rounds);
    /* the causal half's products: scores and att·v, 2·d·T(T+1)/2 FLOPs each per head; backward twice */
    const double flop_fwd = 2.0 * (double)a.d * (double)a.T * (double)(a.T + 1) * (double)(a.batch * a.heads);
    printf("attention on %s (%s): %lld windows of T %lld, %lld heads of %lld; median of %d rounds%s\n", a.kind,
           a.precision == CREW_PRECISION_BF16 ? "bf16 products" : "fp32", (long long)a.batch, (long long)a.T,
           (long long)a.heads, (long long)a.d, a.rounds, a.cold_mb ? ", each call after other writes (--cold)" : "");
    printf("  forward  %8.3f ms  %6.1f GFLOP/s\n", f_ms, flop_fwd / f_ms * 1e-6);
    printf("  backward %8.3f ms  %6.1f GFLOP/s\n", b_ms, 2.0 * flop_fwd / b_ms * 1e-6);
    char say[96];
    printf("  other processes kept %s busy meanwhile\n", bench_load_say(others, say, sizeof say));
    if (a.json)
        printf("{\"forward_ms\": %.4f, \"backward_ms\": %.4f, \"flop_forward\": %.0f, \"cold_mb\": %lld, "
               "\"other_procs\": %.3f}\n", f_ms, b_ms, flop_fwd, (long long)a.cold_mb, others);
    be.ops->free(be.ctx, qkv), be.ops->free(be.ctx, att), be.ops->free(be.ctx, y), be.ops->free(be.ctx, dy);
    be.ops->free(be.ctx, datt), be.ops->free(be.ctx, dqkv);
    free(host), free(fwd), free(bwd);
    bench_cold_close(&cold);
    crew_device_close(&be);
    return 0;
}
