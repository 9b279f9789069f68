/* bench_gemm.c — the CPU's two GEMM libraries side by side at the example models' shapes: oneDNN's
 * sgemm (the x86-64 build's) against OpenBLAS's (the other builds'), row-major float32, in
 * alternating rounds so that a busy or drifting machine weighs on both alike.
 *
 *   bench_gemm [--threads T] [--rounds R] [--model mlp|cnn|gpt] [--json]
 *
 * Each shape is a GEMM one training step of examples/fashion_mlp.json (batch 128),
 * fashion_cnn.json (batch 64) or gpt_tiny.json (16 windows of 128 tokens) runs, `count` times a
 * step: forward y = x·W, the input's gradient dy·Wᵀ, the weight's gradient xᵀ·dy, and gpt_tiny's
 * per-head attention products. Prints GFLOP/s per shape and library, the ratio, each model's GEMM
 * time a step by either library, and with --json one line of the figures (tools/bench_gemm.py adds
 * PyTorch's GEMM at the same shapes). Built only where both libraries are (bench/CMakeLists.txt). */
#include <cblas.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_machine.h"
#include "core/timer.h"

void omp_set_num_threads(int threads); /* oneDNN's threads are OpenMP's (cpu_gemm.c) */

typedef struct shape {
    const char *model, *name;
    int trans_a, trans_b;
    int64_t m, n, k;
    int count; /* times a training step runs it */
} shape;

static const shape shapes[] = {
    /* fashion_mlp: 784 → 256 → 256 → 10, 128 samples */
    {"mlp", "dense1 y=xW", 0, 0, 128, 256, 784, 1},
    {"mlp", "dense1 dW=xT.dy", 1, 0, 784, 256, 128, 1},
    {"mlp", "dense2 y=xW", 0, 0, 128, 256, 256, 1},
    {"mlp", "dense2 dx=dy.WT", 0, 1, 128, 256, 256, 1},
    {"mlp", "dense2 dW=xT.dy", 1, 0, 256, 256, 128, 1},
    {"mlp", "dense3 y=xW", 0, 0, 128, 10, 256, 1},
    {"mlp", "dense3 dx=dy.WT", 0, 1, 128, 256, 10, 1},
    {"mlp", "dense3 dW=xT.dy", 1, 0, 256, 10, 128, 1},
    /* fashion_cnn: im2col GEMMs of 64 samples (28² and 14² positions), then dense 3136 → 128 → 10 */
    {"cnn", "conv1 y=cols.W", 0, 0, 50176, 32, 9, 1},
    {"cnn", "conv1 dW=colsT.dy", 1, 0, 9, 32, 50176, 1},
    {"cnn", "conv2 y=cols.W", 0, 0, 12544, 64, 288, 1},
    {"cnn", "conv2 dcols=dy.WT", 0, 1, 12544, 288, 64, 1},
    {"cnn", "conv2 dW=colsT.dy", 1, 0, 288, 64, 12544, 1},
    {"cnn", "dense1 y=xW", 0, 0, 64, 128, 3136, 1},
    {"cnn", "dense1 dx=dy.WT", 0, 1, 64, 3136, 128, 1},
    {"cnn", "dense1 dW=xT.dy", 1, 0, 3136, 128, 64, 1},
    /* gpt_tiny: 4 blocks of width 128, 4 heads of 32, 2048 tokens a step, vocabulary 256 */
    {"gpt", "qkv y=xW", 0, 0, 2048, 384, 128, 4},
    {"gpt", "qkv dx=dy.WT", 0, 1, 2048, 128, 384, 4},
    {"gpt", "qkv dW=xT.dy", 1, 0, 128, 384, 2048, 4},
    {"gpt", "proj y=xW", 0, 0, 2048, 128, 128, 4},
    {"gpt", "proj dx=dy.WT", 0, 1, 2048, 128, 128, 4},
    {"gpt", "proj dW=xT.dy", 1, 0, 128, 128, 2048, 4},
    {"gpt", "fc y=xW", 0, 0, 2048, 512, 128, 4},
    {"gpt", "fc dx=dy.WT", 0, 1, 2048, 128, 512, 4},
    {"gpt", "fc dW=xT.dy", 1, 0, 128, 512, 2048, 4},
    {"gpt", "fc2 y=xW", 0, 0, 2048, 128, 512, 4},
    {"gpt", "fc2 dx=dy.WT", 0, 1, 2048, 512, 128, 4},
    {"gpt", "fc2 dW=xT.dy", 1, 0, 512, 128, 2048, 4},
    {"gpt", "head y=x.EmbT", 0, 1, 2048, 256, 128, 1},
    {"gpt", "head dx=dy.Emb", 0, 0, 2048, 128, 256, 1},
    {"gpt", "head dEmb=dyT.x", 1, 0, 256, 128, 2048, 1},
    /* per (sample, head), whole: the layer skips the causal mask's blocks, so it runs less */
    {"gpt", "att a=q.kT", 0, 1, 128, 128, 32, 256},
    {"gpt", "att y=a.v", 0, 0, 128, 32, 128, 256},
    {"gpt", "att da=dy.vT", 0, 1, 128, 128, 32, 256},
    {"gpt", "att dv=aT.dy", 1, 0, 128, 32, 128, 256},
    {"gpt", "att dq=ds.k", 0, 0, 128, 32, 128, 256},
    {"gpt", "att dk=dsT.q", 1, 0, 128, 32, 128, 256},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

enum { ONEDNN, OPENBLAS, N_LIBS };
static const char *const lib_names[N_LIBS] = {"oneDNN", "OpenBLAS"};

static void run_gemm(int lib, const shape *s, const float *a, const float *b, float *c)
{
    const int64_t lda = s->trans_a ? s->m : s->k, ldb = s->trans_b ? s->k : s->n;
    if (lib == ONEDNN)
        dnnl_sgemm(s->trans_a ? 'T' : 'N', s->trans_b ? 'T' : 'N', s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 1.0f, c, s->n);
    else
        cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans,
                    (blasint)s->m, (blasint)s->n, (blasint)s->k, 1.0f, a, (blasint)lda, b, (blasint)ldb, 1.0f, c,
                    (blasint)s->n);
}

/* Seconds a call, over enough calls to fill about 20 ms. */
static double time_calls(int lib, const shape *s, const float *a, const float *b, float *c)
{
    const double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
    int reps = (int)(20e-3 * 100e9 / flops); /* at about 100 GFLOP/s */
    if (reps < 3) reps = 3;
    double t0 = crew_now();
    for (int r = 0; r < reps; r++) run_gemm(lib, s, a, b, c);
    return (crew_now() - t0) / reps;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static float *filled(size_t n, unsigned seed)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; x && i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
    return x;
}

int main(int argc, char **argv)
{
    int threads = 1, rounds = 5, json = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: bench_gemm [--threads T] [--rounds R] [--model mlp|cnn|gpt] [--json]\n");
            return 2;
        }
    }
    if (threads < 1 || rounds < 1 || rounds > 99) {
        fprintf(stderr, "bench_gemm: --threads and --rounds (1 to 99) must be positive\n");
        return 2;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const dnnl_version_t *v = dnnl_version();
    printf("oneDNN %d.%d.%d against %s (%s), %d thread%s each, the median of %d alternating rounds\n\n", v->major,
           v->minor, v->patch, openblas_get_config(), openblas_get_corename(), threads, threads == 1 ? "" : "s",
           rounds);
    printf("%-5s %-18s %6s %5s %6s %6s %10s %10s %8s\n", "model", "GEMM", "m", "n", "k", "a step", "oneDNN",
           "OpenBLAS", "ratio");
    bench_load load;
    bench_load_start(&load);
    double step_s[3][N_LIBS] = {{0}};
    const char *models[3] = {"mlp", "cnn", "gpt"};
    double gflops[N_SHAPES][N_LIBS] = {{0}};
    for (size_t i = 0; i < N_SHAPES; i++) {
        const shape *s = &shapes[i];
        if (only && strcmp(only, s->model)) continue;
        float *a = filled((size_t)(s->m * s->k), 1), *b = filled((size_t)(s->k * s->n), 2),
              *c = filled((size_t)(s->m * s->n), 3);
        if (!a || !b || !c) {
            fprintf(stderr, "bench_gemm: out of memory\n");
            return 1;
        }
        double t[N_LIBS][99];
        for (int lib = 0; lib < N_LIBS; lib++) run_gemm(lib, s, a, b, c); /* warm: JIT, buffers, caches */
        for (int r = 0; r < rounds; r++)
            for (int j = 0; j < N_LIBS; j++) { /* which goes first alternates too */
                int lib = (r + j) % N_LIBS;
                t[lib][r] = time_calls(lib, s, a, b, c);
            }
        double med[N_LIBS];
        for (int lib = 0; lib < N_LIBS; lib++) {
            qsort(t[lib], (size_t)rounds, sizeof t[lib][0], cmp_double);
            med[lib] = t[lib][rounds / 2];
            gflops[i][lib] = 2.0 * (double)s->m * (double)s->n * (double)s->k / med[lib] / 1e9;
            for (int mdl = 0; mdl < 3; mdl++)
                if (!strcmp(models[mdl], s->model)) step_s[mdl][lib] += med[lib] * s->count;
        }
        printf("%-5s %-18s %6lld %5lld %6lld %6d %7.1f GF %7.1f GF %7.2fx\n", s->model, s->name, (long long)s->m,
               (long long)s->n, (long long)s->k, s->count, gflops[i][ONEDNN], gflops[i][OPENBLAS],
               med[OPENBLAS] / med[ONEDNN]);
        free(a);
        free(b);
        free(c);
    }
    printf("\nGEMM time a training step (ms), and OpenBLAS's over oneDNN's:\n");
    for (int mdl = 0; mdl < 3; mdl++)
        if (step_s[mdl][ONEDNN] > 0)
            printf("  %-4s oneDNN %7.2f  OpenBLAS %7.2f  %5.2fx\n", models[mdl], 1e3 * step_s[mdl][ONEDNN],
                   1e3 * step_s[mdl][OPENBLAS], step_s[mdl][OPENBLAS] / step_s[mdl][ONEDNN]);
    double others = bench_load_others(&load);
    char say[96];
    printf("other processes kept %s busy meanwhile\n", bench_load_say(others, say, sizeof say));
    if (json) {
        printf("{\"threads\":%d,\"rounds\":%d,\"other_cores\":%.3f,\"shapes\":[", threads, rounds, others);
        int first = 1;
        for (size_t i = 0; i < N_SHAPES; i++) {
            const shape *s = &shapes[i];
            if (only && strcmp(only, s->model)) continue;
            printf("%s{\"model\":\"%s\",\"name\":\"%s\",\"trans_a\":%d,\"trans_b\":%d,\"m\":%lld,\"n\":%lld,\"k\":%lld,"
                   "\"count\":%d,\"%s\":%.2f,\"%s\":%.2f}",
                   first ? "" : ",", s->model, s->name, s->trans_a, s->trans_b, (long long)s->m, (long long)s->n,
                   (long long)s->k, s->count, lib_names[ONEDNN], gflops[i][ONEDNN], lib_names[OPENBLAS],
                   gflops[i][OPENBLAS]);
            first = 0;
        }
        printf("]}\n");
    }
    return 0;
}
