/* bench_rows.c — the CPU backend's passes outside GEMM that a transformer block runs, at one
 * replica's share of a gpt_tiny step (16 windows of 128 tokens, width 128, vocabulary 256), each
 * alone on one thread (docs/PERFORMANCE.md, "Wider vectors in the row kernels").
 *
 *   bench_rows [--tokens N] [--width C] [--rounds K] [--runs R] [--cold MB]
 *
 * The ops, through the backend's table as a run calls them:
 *   gelu+slope    act_forward_slope, GELU's tanh form and its slope, over [N, 4C]
 *   gelu product  mul, d after GELU times the slope, over [N, 4C]
 *   ln forward    layernorm_forward over [N, C]
 *   ln backward   layernorm_backward over [N, C]
 *   residual      axpby over [N, C]
 *   xent          softmax_xent over [N, 256] (the loss and its gradient)
 * K rounds [7] of R calls each [20], alternating the ops' order; per op the median over rounds of a
 * round's fastest call, in µs and ns a value, and a hash of its outputs, so that two builds (a
 * compiler flag, a loop rewritten) run with the same arguments can be compared for time and checked
 * for the same bits. --cold MB writes MB of another buffer before every call (bench_cold.h), so that
 * the ops find their data in memory, as in training. Pin it where the figure should come from
 * (taskset). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench_backend.h"
#include "bench_cold.h"
#include "bench_machine.h"
#include "bench_stats.h"
#include "core/timer.h"
#include "crew.h"

#define MAX_ROUNDS 99
#define N_OPS 6
#define VOCAB 256

typedef struct buffers {
    int64_t n, c;               /* tokens, width */
    float *x, *y, *slope, *d4, *prod; /* [n, 4c] */
    float *h, *hy, *dh, *dhx, *res;  /* [n, c] */
    float *gamma, *beta, *dgamma, *dbeta; /* [c] */
    float *mean, *rstd;        /* [n] */
    float *logits, *dlogits, *row_loss; /* [n, VOCAB], [n] */
    int32_t *labels;           /* [n] */
} buffers;

static float *values(int64_t n, uint64_t seed, float lo, float hi)
{
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v[i] = lo + (hi - lo) * (float)(s >> 40) / (float)(1ull << 24);
    }
    return v;
}

static int make(buffers *b, int64_t n, int64_t c)
{
    b->n = n, b->c = c;
    b->x = values(4 * n * c, 1, -4, 4), b->y = values(4 * n * c, 2, 0, 1), b->slope = values(4 * n * c, 3, 0, 1);
    b->d4 = values(4 * n * c, 4, -1, 1), b->prod = values(4 * n * c, 18, 0, 0);
    b->h = values(n * c, 5, -3, 3), b->hy = values(n * c, 6, 0, 1), b->dh = values(n * c, 7, -1, 1);
    b->dhx = values(n * c, 8, 0, 1), b->res = values(n * c, 19, -1, 1);
    b->gamma = values(c, 9, 0.5f, 1.5f), b->beta = values(c, 10, -0.5f, 0.5f);
    b->dgamma = values(c, 11, 0, 0), b->dbeta = values(c, 12, 0, 0);
    b->mean = values(n, 13, 0, 0), b->rstd = values(n, 14, 0, 0);
    b->logits = values(n * VOCAB, 15, -6, 6), b->dlogits = values(n * VOCAB, 16, 0, 0);
    b->row_loss = values(n, 17, 0, 0);
    b->labels = malloc((size_t)n * sizeof *b->labels);
    if (!b->x || !b->y || !b->slope || !b->d4 || !b->prod || !b->res || !b->h || !b->hy || !b->dh || !b->dhx || !b->gamma || !b->beta ||
        !b->dgamma || !b->dbeta || !b->mean || !b->rstd || !b->logits || !b->dlogits || !b->row_loss || !b->labels)
        return -1;
    for (int64_t i = 0; i < n; i++) b->labels[i] = (int32_t)((i * 7919) % VOCAB);
    return 0;
}

static void release(buffers *b)
{
    float *all[] = {b->x, b->y, b->slope, b->d4, b->prod, b->res, b->h, b->hy, b->dh, b->dhx, b->gamma, b->beta,
                    b->dgamma, b->dbeta, b->mean, b->rstd, b->logits, b->dlogits, b->row_loss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(b->labels);
}

static const char *const names[N_OPS] = {"gelu+slope", "gelu product", "ln forward", "ln backward", "residual",
                                         "xent"};

/* values an op writes a call (for ns a value) */
static int64_t op_values(int op, const buffers *b)
{
    return op <= 1 ? 4 * b->n * b->c : op == 5 ? b->n * VOCAB : b->n * b->c;
}

/* One call of op. Each writes buffers of its own and reads inputs no call writes, so every call
 * does the same work on the same values and the last one's outputs are the op's bits; the residual
 * alone adds into its output, which then depends on the count of calls too (the same for two builds
 * run with the same --rounds and --runs). */
static crew_status run(const crew_backend *be, int op, buffers *b)
{
    void *ctx = be->ctx;
    const int64_t n = b->n, c = b->c;
    int64_t correct;
    switch (op) {
    case 0: be->ops->act_forward_slope(ctx, CREW_ACT_GELU_TANH, b->x, b->y, b->slope, 4 * n * c); break;
    case 1: be->ops->mul(ctx, 4 * n * c, b->d4, b->x, b->prod); break;
    case 2: be->ops->layernorm_forward(ctx, b->h, b->gamma, b->beta, 1e-5f, b->hy, b->mean, b->rstd, n, c); break;
    case 3:
        memset(b->dgamma, 0, (size_t)c * sizeof *b->dgamma); /* layernorm_backward accumulates them */
        memset(b->dbeta, 0, (size_t)c * sizeof *b->dbeta);
        be->ops->layernorm_backward(ctx, b->dh, b->h, b->gamma, b->mean, b->rstd, b->dhx, b->dgamma, b->dbeta, n, c);
        break;
    case 4: be->ops->axpby(ctx, n * c, 1.0f, b->h, 1.0f, b->res); break; /* res grows by h a call */
    default: return be->ops->softmax_xent(ctx, b->logits, b->labels, n, VOCAB, 1.0f / (float)n, b->row_loss,
                                          b->dlogits, &correct);
    }
    return CREW_OK;
}

static uint32_t hash(const float *v, int64_t n, uint32_t h)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        h = (h ^ u) * 16777619u;
    }
    return h;
}

static uint32_t op_hash(int op, const buffers *b)
{
    const int64_t n = b->n, c = b->c;
    uint32_t h = 2166136261u;
    switch (op) {
    case 0: return hash(b->slope, 4 * n * c, hash(b->y, 4 * n * c, h));
    case 1: return hash(b->prod, 4 * n * c, h);
    case 2: return hash(b->rstd, n, hash(b->mean, n, hash(b->hy, n * c, h)));
    case 3: return hash(b->dbeta, c, hash(b->dgamma, c, hash(b->dhx, n * c, h)));
    case 4: return hash(b->res, n * c, h);
    default: return hash(b->row_loss, n, hash(b->dlogits, n * VOCAB, h));
    }
}

int main(int argc, char **argv)
{
    int64_t tokens = 16 * 128, width = 128;
    int rounds = 7, runs = 20;
    int64_t cold_mb = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--tokens") && v)
            tokens = atoll(v), i++;
        else if (!strcmp(argv[i], "--width") && v)
            width = atoll(v), i++;
        else if (!strcmp(argv[i], "--rounds") && v)
            rounds = atoi(v), i++;
        else if (!strcmp(argv[i], "--runs") && v)
            runs = atoi(v), i++;
        else if (!strcmp(argv[i], "--cold") && v)
            cold_mb = atoll(v), i++;
        else {
            fprintf(stderr, "usage: bench_rows [--tokens N] [--width C] [--rounds K] [--runs R] [--cold MB]\n");
            return 2;
        }
    }
    if (tokens < 1 || tokens > (1 << 24) || width < 1 || width > (1 << 16) || rounds < 1 || rounds > MAX_ROUNDS ||
        runs < 1 || cold_mb < 0) {
        fprintf(stderr, "bench_rows: --tokens 1 to 2^24, --width 1 to 65536, --rounds 1 to %d, --runs 1 or more, "
                "--cold 0 or more\n", MAX_ROUNDS);
        return 2;
    }
    crew_backend be;
    if (bench_open_cpu("bench_rows", &be)) return 1;
    buffers b;
    if (make(&b, tokens, width)) {
        fprintf(stderr, "bench_rows: out of memory for %lld tokens of width %lld\n", (long long)tokens,
                (long long)width);
        return 1;
    }
    bench_cold cold;
    if (bench_cold_open(&cold, cold_mb)) {
        fprintf(stderr, "bench_rows: out of memory for --cold %lld\n", (long long)cold_mb);
        return 1;
    }
    bench_load load;
    bench_load_start(&load);
    double best[N_OPS][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < N_OPS; k++) {
            const int op = r % 2 ? N_OPS - 1 - k : k;
            best[op][r] = 1e30;
            for (int j = 0; j < runs; j++) {
                bench_cold_evict(&cold);
                const double t0 = crew_now();
                const crew_status s = run(&be, op, &b);
                const double dt = crew_now() - t0;
                if (s) {
                    fprintf(stderr, "bench_rows: %s: %s\n", names[op], crew_status_message(s));
                    return 1;
                }
                if (dt < best[op][r]) best[op][r] = dt;
            }
        }
    printf("The CPU backend's passes outside GEMM, one thread, %lld tokens of width %lld: median of %d rounds of "
           "the fastest of %d calls%s\n\n",
           (long long)tokens, (long long)width, rounds, runs, cold_mb ? ", each after other writes (--cold)" : "");
    printf("| op | values | us a call | ns a value | bits (hash) |\n|---|--:|--:|--:|---|\n");
    for (int op = 0; op < N_OPS; op++) {
        const double t = bench_median(best[op], rounds);
        printf("| %s | %lld | %.1f | %.3f | %08x |\n", names[op], (long long)op_values(op, &b), 1e6 * t,
               1e9 * t / (double)op_values(op, &b), op_hash(op, &b));
    }
    char say[96];
    printf("\nother processes used %s meanwhile\n", bench_load_say(bench_load_others(&load), say, sizeof say));
    release(&b);
    bench_cold_close(&cold);
    be.ops->destroy(be.ctx);
    return 0;
}
