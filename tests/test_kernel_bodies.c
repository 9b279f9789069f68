/* test_kernel_bodies.c — the CUDA kernels' code, run on the CPU.
 *
 * Every CUDA kernel of crew calls a body in src/backend/body/ for each of its indices (body.h);
 * the CPU backend calls the same bodies, or the same index helpers and formulas from loops of its
 * own shape. This test needs no GPU and no nvcc: for each kernel it runs the kernel's body over
 * the kernel's whole index space, in the gather form the kernel uses, on random inputs (a fixed
 * seed), and holds the result to the CPU backend's op on the same inputs, bit for bit (memcmp):
 * odd sizes, padding on one side, strides 1 to 3, windows larger than their stride, one channel
 * and odd counts of them, rows and columns that are not multiples of 32, ids that are invalid,
 * repeated and unsorted. A failure names the kernel, the geometry and the first differing index.
 *
 * The kernels along a row (a warp per row: softmax cross-entropy, softmax, layer norm, attention's
 * softmax and its backward) sum in the warp's order, which the CPU keeps too (cpu_lanes.h): the
 * test emulates the warp (each of 32 lanes' strided partial from the shared lane pieces, then the
 * xor butterfly of the kernels' shuffles) and holds the CPU's results to it bit for bit. So is
 * sum_squares (backend.h's chunks: a block a chunk, a thread a lane), also cut into pieces anywhere;
 * all_finite's fixed grid (256 blocks of 256 threads and a tree in shared memory) is emulated the
 * same way. What only a GPU can test is what is left in the .cu files: launch
 * geometry, the shuffles and shared memory themselves, streams, and the libraries (cuBLAS, CUB's
 * sort, cuDNN, NCCL), and where a GPU's expf, erff, tanhf, logf round differently from glibc's.
 *
 * The planted case shows that the bit-for-bit check catches a wrong index: im2col's body compiled
 * a second time here with its window column off by one must fail the same check that the real
 * body passes (check_planted). */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/body/activation.h"
#include "backend/body/attention.h"
#include "backend/body/elementwise.h"
#include "backend/body/loss.h"
#include "backend/body/norm.h"
#include "backend/body/optim.h"
#include "backend/body/reduce.h"
#include "backend/body/window.h"
#include "backend/cpu/cpu_ops.h"
#include "check.h"
#include "comm/comm.h"
#include "core/bf16.h"
#include "core/rng.h"

/* The planted case: im2col's body again, as planted_im2col, with the window's column one too far
 * to the right (the tap kw + 1 for kw). Only this copy, in this file, carries the wrong index. */
#undef CREW_BACKEND_BODY_IM2COL_H
#define crew_body_im2col planted_im2col
#define crew_window_cell(g, b, oh, ow, kh, kw) crew_window_cell((g), (b), (oh), (ow), (kh), (kw) + 1)
#include "backend/body/im2col.h"
#undef crew_window_cell
#undef crew_body_im2col

static crew_backend be; /* the CPU backend: its device memory is host memory */
static crew_rng rng;

/* ------------------------------------------------------------------ the kernels covered */

/* Every __global__ kernel of crew (grep -n __global__ -r src): 48. */
static const char *const all_kernels[] = {
    "k_fill", "k_axpby", "k_mul", "k_broadcast_rows", "k_bias_rows", "k_col_sum", "k_act_forward", "k_act_backward",
    "k_act_forward_slope", "k_dropout",
    "k_im2col", "k_col2im", "k_maxpool_forward", "k_maxpool_backward", "k_avgpool_forward", "k_avgpool_backward",
    "k_bn_col_sum", "k_col_sqdev", "k_bn_scale_sums", "k_bn_forward", "k_bn_backward_sums", "k_bn_backward",
    "k_bn_param_grads", "k_layernorm_forward", "k_layernorm_dx", "k_layernorm_params", "k_causal_softmax",
    "k_softmax_backward_rows", "k_embedding_forward", "k_embedding_bad", "k_embedding_keys", "k_embedding_runs",
    "k_softmax_xent", "k_softmax", "k_sgd", "k_adamw", "k_adam_direction", "k_sum_serial", "k_sq_piece",
    "k_sq_chunks", "k_sq_add", "k_add_partials", "k_nonfinite_partial", "k_count", "k_to_bf16", "k_to_filter", "k_from_filter", "k_ordered_sum",
};
#define N_KERNELS ((int)(sizeof all_kernels / sizeof all_kernels[0]))
static int covered[N_KERNELS];

static void cover(const char *kernel)
{
    for (int i = 0; i < N_KERNELS; i++)
        if (!strcmp(all_kernels[i], kernel)) {
            covered[i] = 1;
            return;
        }
    CHECK_MSG(0, "%s is not one of crew's kernels", kernel);
}

/* ------------------------------------------------------------------ inputs and comparisons */

/* A geometry's name for the messages, formatted into one of two buffers that take turns (a name
 * holds until the second call after it). */
static const char *named(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *named(const char *fmt, ...)
{
    static char bufs[2][256];
    static int turn;
    char *buf = bufs[turn++ % 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return buf;
}

static float *floats(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) abort();
    return p;
}

static void uniform(float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * crew_rng_next_uniform(&rng);
}

/* small integers (-2 .. 2): ties everywhere, for the maxima's tie rules */
static void ties(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)crew_rng_next_below(&rng, 5) - 2.0f;
}

static float *copy_of(const float *x, int64_t n)
{
    float *p = floats(n);
    memcpy(p, x, (size_t)n * sizeof *p);
    return p;
}

/* 1 when the n elements of `size` bytes are the same bits; else a failure naming the first. */
static int same_bits(const char *kernel, const char *geometry, const void *got, const void *want, size_t size,
                     int64_t n)
{
    const unsigned char *a = got, *b = want;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + (size_t)i * size, b + (size_t)i * size, size)) {
            double va = size == 8 ? *(const double *)(a + i * 8) : size == 4 ? *(const float *)(a + i * 4) : 0.0;
            double vb = size == 8 ? *(const double *)(b + i * 8) : size == 4 ? *(const float *)(b + i * 4) : 0.0;
            CHECK_MSG(0, "%s (%s): the body differs from the CPU's op at index %lld of %lld (%.9g, not %.9g)",
                      kernel, geometry, (long long)i, (long long)n, va, vb);
            return 0;
        }
    CHECK(1);
    return 1;
}

#define SAME_F(k, geo, got, want, n) same_bits(k, geo, got, want, sizeof(float), n)
#define SAME_D(k, geo, got, want, n) same_bits(k, geo, got, want, sizeof(double), n)

/* ------------------------------------------------------------------ the warp's order, emulated */

/* The kernels' butterfly (cuda_kernels.cu, warp_sum, warp_max, warp_argmax): at each level k =
 * 16, 8, 4, 2, 1 every lane l combines its value with lane l ^ k's, all at once. One lane: none. */
static float butterfly_sum(float *v, int lanes)
{
    for (int k = lanes / 2; k > 0; k /= 2) {
        float w[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) w[l] = v[l] + v[l ^ k];
        memcpy(v, w, (size_t)lanes * sizeof *v);
    }
    for (int l = 1; l < lanes; l++) /* a + b == b + a: every lane holds the same total */
        if (memcmp(&v[l], &v[0], sizeof *v)) CHECK_MSG(0, "the butterfly left lane %d another sum than lane 0", l);
    return v[0];
}

static float butterfly_max(float *v, int lanes)
{
    for (int k = lanes / 2; k > 0; k /= 2) {
        float w[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) w[l] = crew_lane_max_of(v[l ^ k], v[l]);
        memcpy(v, w, (size_t)lanes * sizeof *v);
    }
    return v[0];
}

static float butterfly_argmax(float *v, long long *at, int lanes)
{
    for (int k = lanes / 2; k > 0; k /= 2) {
        float w[CREW_BODY_LANES];
        long long wa[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) {
            int take = crew_xent_argmax_takes(v[l ^ k], at[l ^ k], v[l], at[l]);
            w[l] = take ? v[l ^ k] : v[l];
            wa[l] = take ? at[l ^ k] : at[l];
        }
        memcpy(v, w, (size_t)lanes * sizeof *v);
        memcpy(at, wa, (size_t)lanes * sizeof *at);
    }
    return v[0];
}

/* ------------------------------------------------------------------ elementwise, to_bf16, transposes */

static void check_elementwise(void)
{
    const int64_t sizes[] = {1, 7, 1000, 4099};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        const char *geo = named("n %lld", (long long)n);
        float *x = floats(n), *y0 = floats(n), *a = floats(n), *b = floats(n);
        uniform(x, n, -3, 3);
        uniform(y0, n, -3, 3);
        float *got = floats(n), *want = floats(n);
        for (int64_t i = 0; i < n; i++) crew_body_fill(got, -1.25f, i);
        be.ops->fill(be.ctx, want, -1.25f, n);
        SAME_F("k_fill", geo, got, want, n);
        memcpy(got, y0, (size_t)n * sizeof *got);
        memcpy(want, y0, (size_t)n * sizeof *want);
        for (int64_t i = 0; i < n; i++) crew_body_axpby(0.7f, x, -1.3f, got, i);
        be.ops->axpby(be.ctx, n, 0.7f, x, -1.3f, want);
        SAME_F("k_axpby", geo, got, want, n);
        uniform(a, n, -2, 2);
        uniform(b, n, -2, 2);
        for (int64_t i = 0; i < n; i++) crew_body_mul(a, b, got, i);
        be.ops->mul(be.ctx, n, a, b, want);
        SAME_F("k_mul", geo, got, want, n);
        free(x), free(y0), free(a), free(b), free(got), free(want);
    }
    cover("k_fill"), cover("k_axpby"), cover("k_mul");

    const int64_t shapes[][2] = {{1, 1}, {3, 33}, {65, 31}, {17, 100}, {2, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        const char *geo = named("%lld x %lld", (long long)rows, (long long)cols);
        float *x = floats(n), *bias = floats(cols), *got = floats(n), *want = floats(n);
        uniform(x, n, -1, 1);
        uniform(bias, cols, -1, 1);
        for (int64_t i = 0; i < n; i++) crew_body_broadcast_rows(got, bias, cols, i);
        be.ops->broadcast_rows(be.ctx, want, bias, rows, cols);
        SAME_F("k_broadcast_rows", geo, got, want, n);
        { /* into rows 3 apart wider than the block: gemm_bias of no terms leaves the bias there */
            const int64_t ld = cols + 3;
            float *c_got = floats(rows * ld), *c_want = floats(rows * ld);
            uniform(c_got, rows * ld, -1, 1);
            memcpy(c_want, c_got, (size_t)(rows * ld) * sizeof *c_got);
            for (int64_t i = 0; i < n; i++) crew_body_bias_rows(c_got, ld, bias, cols, i);
            be.ops->gemm_bias(be.ctx, rows, cols, 0, x, CREW_DT_F32, 1, x, cols, bias, c_want, ld);
            SAME_F("k_bias_rows", geo, c_got, c_want, rows * ld);
            free(c_got), free(c_want);
        }
        for (int acc = 0; acc <= 1; acc++) {
            uniform(got, cols, -5, 5);
            memcpy(want, got, (size_t)cols * sizeof *got);
            for (int64_t j = 0; j < cols; j++) crew_body_col_sum(x, rows, cols, got, acc, j);
            be.ops->col_sum(be.ctx, x, rows, cols, want, acc);
            SAME_F("k_col_sum", geo, got, want, cols);
        }
        free(x), free(bias), free(got), free(want);
    }
    cover("k_broadcast_rows"), cover("k_bias_rows"), cover("k_col_sum");
}

static void check_to_bf16(void)
{
    /* every class of value: random over many exponents, the ties of the rounding (the low 16 bits
     * 0x8000, either parity), values that round up into the next exponent and to infinity, ±0,
     * denormals, ±inf, quiet and signalling NaNs of both signs and several payloads */
    enum { N = 4096 };
    float *x = floats(N);
    uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u, 0xff800000u,
                          0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fff8000u,
                          0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
                          0xbf808000u, 0x3fffffffu, 0x00008000u, 0x00018000u};
    const int n_special = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) {
        uint32_t u = i < n_special ? special[i]
                     : i % 3 ? (uint32_t)crew_rng_u64(rng.key, rng.counter++)
                             : (((uint32_t)crew_rng_u64(rng.key, rng.counter++)) & 0xffff0000u) | 0x8000u;
        memcpy(&x[i], &u, sizeof u);
    }
    crew_bf16 got[N], want[N], core[N];
    for (int64_t i = 0; i < N; i++) crew_body_to_bf16(x, got, i);
    be.ops->to_bf16(be.ctx, x, want, N);
    for (int i = 0; i < N; i++) core[i] = crew_bf16_bits(x[i]);
    same_bits("k_to_bf16", "every class of float", got, want, sizeof got[0], N);
    same_bits("k_to_bf16", "against core/bf16.h", got, core, sizeof got[0], N);
    int widen_ok = 1;
    for (int i = 0; i < N; i++) {
        float a = crew_body_bf16_widen(got[i]), b = crew_bf16_widen(got[i]);
        widen_ok &= memcmp(&a, &b, sizeof a) == 0;
    }
    CHECK_MSG(widen_ok, "crew_body_bf16_widen differs from core/bf16.h's crew_bf16_widen");
    free(x);
    cover("k_to_bf16");
}

/* No CPU op transposes a kernel (the CPU has no cuDNN): the bodies are held to their definition,
 * filter[f][r] = kernel[r][f], and to each other (from_filter undoes to_filter). */
static void check_filters(void)
{
    const int64_t shapes[][2] = {{1, 1}, {27, 8}, {9, 33}, {3 * 3 * 5, 7}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t khkwc = shapes[s][0], f_count = shapes[s][1], n = khkwc * f_count;
        const char *geo = named("khkwc %lld, %lld filters", (long long)khkwc, (long long)f_count);
        float *kernel = floats(n), *filter = floats(n), *want = floats(n), *back = floats(n);
        uniform(kernel, n, -1, 1);
        for (int64_t i = 0; i < n; i++) crew_body_to_filter(kernel, filter, khkwc, f_count, i);
        for (int64_t r = 0; r < khkwc; r++)
            for (int64_t f = 0; f < f_count; f++) want[f * khkwc + r] = kernel[r * f_count + f];
        same_bits("k_to_filter", geo, filter, want, sizeof(float), n);
        for (int64_t i = 0; i < n; i++) crew_body_from_filter(filter, back, khkwc, f_count, i);
        same_bits("k_from_filter", geo, back, kernel, sizeof(float), n);
        free(kernel), free(filter), free(want), free(back);
    }
    cover("k_to_filter"), cover("k_from_filter");
}

/* ------------------------------------------------------------------ reductions */

/* all_finite as the GPU computes it: CREW_BODY_PARTIALS blocks, each its threads' flags (the
 * bodies), the tree of cuda_backend.cu's k_nonfinite_partial (width threads/2, /4, ...), then the
 * blocks' in block order. */
static int emulated_nonfinite(const float *x, int64_t n)
{
    double bad_partial[CREW_BODY_PARTIALS];
    for (int b = 0; b < CREW_BODY_PARTIALS; b++) {
        int64_t lo, hi;
        crew_body_stretch(n, CREW_BODY_PARTIALS, b, &lo, &hi);
        int bad[CREW_BODY_THREADS];
        for (int t = 0; t < CREW_BODY_THREADS; t++)
            bad[t] = crew_body_nonfinite_thread(x, lo, hi, t, CREW_BODY_THREADS);
        for (int w = CREW_BODY_THREADS / 2; w > 0; w /= 2)
            for (int t = 0; t < w; t++) bad[t] |= bad[t + w];
        bad_partial[b] = bad[0];
    }
    return crew_body_add_partials(bad_partial, CREW_BODY_PARTIALS) != 0.0; /* cuda_all_finite's test */
}

/* cuda_backend.cu's k_sq_piece: a thread a lane over the piece, then thread 0 closes */
static void emulate_sq_piece(const float *x, int64_t n, double *state)
{
    const int64_t at = (int64_t)state[CREW_SQ_FILLED];
    for (int k = 0; k < CREW_SQ_LANES; k++) state[k] = crew_body_sq_lane(x, n, at, k, state[k]);
    crew_body_sq_close(state, n);
}

/* cuda_sum_squares_lanes as its host code drives the kernels: the chunk under way, whole chunks
 * `batch` at a time (k_sq_chunks: a block a chunk, its lanes' tree; then k_sq_add), the tail */
static void emulate_sum_squares_lanes(const float *x, int64_t n, double *state, int64_t batch)
{
    int64_t i = 0, at = (int64_t)state[CREW_SQ_FILLED];
    if (at > 0 && n > 0) {
        i = CREW_SQ_CHUNK - at < n ? CREW_SQ_CHUNK - at : n;
        emulate_sq_piece(x, i, state);
    }
    double *sums = malloc((size_t)batch * sizeof *sums);
    while (n - i >= CREW_SQ_CHUNK) {
        const int64_t chunks = (n - i) / CREW_SQ_CHUNK < batch ? (n - i) / CREW_SQ_CHUNK : batch;
        for (int64_t c = 0; c < chunks; c++) {
            double lane[CREW_SQ_LANES];
            for (int k = 0; k < CREW_SQ_LANES; k++)
                lane[k] = crew_body_sq_lane(x + i + c * CREW_SQ_CHUNK, CREW_SQ_CHUNK, 0, k, 0.0);
            sums[c] = crew_sq_lanes_fold(lane);
        }
        crew_body_sq_add(sums, chunks, state);
        i += chunks * CREW_SQ_CHUNK;
    }
    free(sums);
    if (i < n) emulate_sq_piece(x + i, n - i, state);
}

static void check_reductions(void)
{
    const int64_t sizes[] = {0, 1, 255, 257, CREW_SQ_CHUNK, CREW_SQ_CHUNK + 1, 65536 + 17, 200000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        const char *geo = named("n %lld", (long long)n);
        float *x = floats(n);
        uniform(x, n, -4, 4);
        double got = crew_body_sum_serial(x, n), want = -1;
        CHECK_OK(be.ops->sum(be.ctx, x, n, &want));
        SAME_D("k_sum_serial", geo, &got, &want, 1);
        /* sum_squares: the GPU's kernels in backend.h's order, the CPU's bits; and both in pieces
         * cut anywhere (the ranks of a sharded gradient), the whole's bits */
        int finite = -1;
        double cpu_sq = -1, state[CREW_SQ_STATE] = {0};
        emulate_sum_squares_lanes(x, n, state, CREW_BODY_PARTIALS);
        const double gpu_sq = crew_sq_state_sum(state);
        CHECK_OK(be.ops->sum_squares(be.ctx, x, n, &cpu_sq));
        SAME_D("k_sq_chunks", geo, &gpu_sq, &cpu_sq, 1);
        int64_t cuts[] = {0, n / 3, n / 3 + 1, n / 3 + 17, n / 2, n / 2, n - 1, n};
        for (int c = 1; c < (int)(sizeof cuts / sizeof *cuts); c++) /* in order, within x */
            cuts[c] = cuts[c] < cuts[c - 1] ? cuts[c - 1] : cuts[c] > n ? n : cuts[c];
        double cpu_state[CREW_SQ_STATE] = {0};
        memset(state, 0, sizeof state);
        for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof *cuts); c++) {
            CHECK_OK(be.ops->sum_squares_lanes(be.ctx, x + cuts[c], cuts[c + 1] - cuts[c], cpu_state));
            emulate_sum_squares_lanes(x + cuts[c], cuts[c + 1] - cuts[c], state, 3); /* small batches too */
        }
        const double cpu_pieces = crew_sq_state_sum(cpu_state), gpu_pieces = crew_sq_state_sum(state);
        SAME_D("k_sq_piece", geo, &cpu_pieces, &cpu_sq, 1);
        SAME_D("k_sq_add", geo, &gpu_pieces, &cpu_sq, 1);
        CHECK_OK(be.ops->all_finite(be.ctx, x, n, &finite));
        CHECK_MSG(finite == 1 && !emulated_nonfinite(x, n), "k_nonfinite_partial (%s): finite data", geo);
        if (n > 0) { /* a NaN, an infinity, at the first, the last and a middle element */
            const float bad[] = {NAN, -INFINITY};
            const int64_t at[] = {0, n - 1, n / 2 + 1 < n ? n / 2 + 1 : 0};
            for (int k = 0; k < 2; k++)
                for (int p = 0; p < 3; p++) {
                    float keep = x[at[p]];
                    x[at[p]] = bad[k];
                    CHECK_OK(be.ops->all_finite(be.ctx, x, n, &finite));
                    CHECK_MSG(finite == 0 && emulated_nonfinite(x, n), "k_nonfinite_partial (%s): %g at %lld", geo,
                              bad[k], (long long)at[p]);
                    x[at[p]] = keep;
                }
        }
        free(x);
    }
    cover("k_sum_serial"), cover("k_sq_piece"), cover("k_sq_chunks"), cover("k_sq_add"), cover("k_add_partials"),
        cover("k_nonfinite_partial");
}

/* ---- the ordered sum (NCCL's k_ordered_sum) against the in-process communicator's (comm_local.c):
 * P ranks on threads, each its own buffer of random values; the body sums the same buffers laid out
 * as NCCL's scratch does, parts [P·k, len] in (rank, input) order. */
enum { MAX_RANKS = 5, MAX_K = 3 };

typedef struct sum_job {
    crew_comm comm;
    crew_status status;
    int64_t n;
    crew_comm_type t;
    crew_reduce_op op;
    int k;                  /* 0: allreduce of buf (in and out); else allreduce_ordered of in[0..k) into out */
    void *buf;
    float *in[MAX_K], *out;
} sum_job;

static void *sum_run(void *arg)
{
    sum_job *j = arg;
    const crew_comm *c = &j->comm;
    j->status = j->k ? c->ops->allreduce_ordered(c->ctx, c->rank, j->in, j->k, j->out, j->n, 60)
                     : crew_allreduce(c, j->buf, j->n, j->t, j->op, 60);
    return NULL;
}

static void run_ranks(sum_job *jobs, int P)
{
    crew_local_comm *lc;
    CHECK_OK(crew_local_comm_create(P, &lc));
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < P; r++) {
        jobs[r].comm = crew_local_comm_rank(lc, r);
        pthread_create(&th[r], NULL, sum_run, &jobs[r]);
    }
    for (int r = 0; r < P; r++) {
        pthread_join(th[r], NULL);
        CHECK_OK(jobs[r].status);
    }
    crew_local_comm_free(lc);
}

static void check_ordered_sum(void)
{
    const int ranks[] = {2, 3, 5};
    const int64_t n = 1001;
    for (size_t s = 0; s < sizeof ranks / sizeof ranks[0]; s++) {
        const int P = ranks[s];
        for (int type = 0; type < 2; type++)
            for (int avg = 0; avg <= 1; avg++) {
                const char *geo = named("%d ranks, %s, %s", P, type ? "f64" : "f32", avg ? "mean" : "sum");
                const size_t esize = type ? sizeof(double) : sizeof(float);
                unsigned char *parts = malloc((size_t)(P * n) * esize), *got = malloc((size_t)n * esize);
                sum_job jobs[MAX_RANKS];
                memset(jobs, 0, sizeof jobs);
                for (int r = 0; r < P; r++) {
                    jobs[r].buf = malloc((size_t)n * esize);
                    for (int64_t i = 0; i < n; i++) {
                        float v = (float)(crew_rng_next_uniform(&rng) * 2 - 1) * (float)(r + 1);
                        if (type)
                            ((double *)jobs[r].buf)[i] = (double)v / 3.0;
                        else
                            ((float *)jobs[r].buf)[i] = v;
                    }
                    memcpy(parts + (size_t)(r * n) * esize, jobs[r].buf, (size_t)n * esize);
                    jobs[r].n = n, jobs[r].t = type ? CREW_COMM_F64 : CREW_COMM_F32;
                    jobs[r].op = avg ? CREW_REDUCE_AVG : CREW_REDUCE_SUM;
                }
                run_ranks(jobs, P);
                for (int64_t i = 0; i < n; i++) {
                    if (type)
                        ((double *)got)[i] = crew_body_ordered_sum_f64((const double *)parts, P, n, avg, 1.0 / P, i);
                    else
                        ((float *)got)[i] = crew_body_ordered_sum_f32((const float *)parts, P, n, avg, 1.0f / P, i);
                }
                for (int r = 0; r < P; r++) {
                    same_bits("k_ordered_sum", geo, got, jobs[r].buf, esize, n);
                    free(jobs[r].buf);
                }
                free(parts), free(got);
            }
        /* allreduce_ordered: k inputs a rank, summed in (rank, input) order */
        const int k = 1 + (int)s % MAX_K;
        const char *geo = named("%d ranks x %d inputs, ordered", P, k);
        float *parts = floats(P * k * n), *got = floats(n);
        sum_job jobs[MAX_RANKS];
        memset(jobs, 0, sizeof jobs);
        for (int r = 0; r < P; r++) {
            for (int j = 0; j < k; j++) {
                jobs[r].in[j] = floats(n);
                uniform(jobs[r].in[j], n, -1, 1);
                memcpy(parts + (r * k + j) * n, jobs[r].in[j], (size_t)n * sizeof(float));
            }
            jobs[r].out = floats(n), jobs[r].k = k, jobs[r].n = n;
        }
        run_ranks(jobs, P);
        for (int64_t i = 0; i < n; i++) got[i] = crew_body_ordered_sum_f32(parts, (int64_t)P * k, n, 0, 1.0f, i);
        for (int r = 0; r < P; r++) {
            SAME_F("k_ordered_sum", geo, got, jobs[r].out, n);
            for (int j = 0; j < k; j++) free(jobs[r].in[j]);
            free(jobs[r].out);
        }
        free(parts), free(got);
    }
    cover("k_ordered_sum");
}

/* ------------------------------------------------------------------ activations, dropout */

static void check_activations(void)
{
    const crew_activation acts[] = {CREW_ACT_RELU, CREW_ACT_GELU, CREW_ACT_GELU_TANH, CREW_ACT_TANH,
                                    CREW_ACT_SIGMOID, CREW_ACT_NONE};
    const char *names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "linear"};
    const int64_t sizes[] = {1, 255, 257, 1000};
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const int64_t n = sizes[s];
            const char *geo = named("%s, n %lld", names[a], (long long)n);
            float *x = floats(n), *y = floats(n), *got = floats(n), *dy = floats(n);
            uniform(x, n, -8, 8);
            const float extremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 1e-30f, -90.0f, 89.0f};
            for (int64_t i = 0; i < n && i < 7; i++) x[i * 37 % n] = extremes[i];
            for (int64_t i = 0; i < n; i++) crew_body_act_forward(acts[a], x, got, i);
            be.ops->act_forward(be.ctx, acts[a], x, y, n);
            SAME_F("k_act_forward", geo, got, y, n);
            uniform(dy, n, -2, 2);
            float *want = copy_of(dy, n);
            for (int64_t i = 0; i < n; i++) crew_body_act_backward(acts[a], x, y, dy, got, i);
            be.ops->act_backward(be.ctx, acts[a], x, y, want, want, n); /* dx over dy, as backend.h allows */
            SAME_F("k_act_backward", geo, got, want, n);
            /* the slope written over x, as a transformer block keeps it */
            float *slope_want = floats(n), *slope = copy_of(x, n);
            for (int64_t i = 0; i < n; i++) crew_body_act_forward_slope(acts[a], x, got, slope_want, i);
            be.ops->act_forward_slope(be.ctx, acts[a], slope, want, slope, n);
            SAME_F("k_act_forward_slope", geo, got, want, n);
            SAME_F("k_act_forward_slope", geo, slope_want, slope, n);
            free(x), free(y), free(got), free(dy), free(want), free(slope_want), free(slope);
        }
    cover("k_act_forward"), cover("k_act_backward"), cover("k_act_forward_slope");
}

static void check_dropout(void)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 31}, {7, 33}, {16, 100}};
    const float rates[] = {0.0f, 0.1f, 0.5f, 0.9f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t q = 0; q < sizeof rates / sizeof rates[0]; q++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
            const char *geo = named("%lld x %lld, rate %.1f", (long long)rows, (long long)cols, rates[q]);
            int64_t *ids = malloc((size_t)rows * sizeof *ids);
            for (int64_t r = 0; r < rows; r++) ids[r] = (int64_t)crew_rng_next_below(&rng, 5) * 1000 + 7 - r % 2;
            const uint64_t key = crew_rng_u64(rng.key, rng.counter++);
            float *x = floats(n), *y = floats(n), *mask = floats(n), *gy = floats(n), *gmask = floats(n);
            uniform(x, n, -1, 1);
            const float keep = crew_dropout_keep_scale(rates[q]);
            for (int64_t i = 0; i < n; i++) crew_body_dropout(x, gy, gmask, cols, rates[q], keep, key, ids, i);
            be.ops->dropout_forward(be.ctx, x, y, mask, rows, cols, rates[q], key, ids);
            SAME_F("k_dropout", geo, gmask, mask, n);
            SAME_F("k_dropout", geo, gy, y, n);
            free(ids), free(x), free(y), free(mask), free(gy), free(gmask);
        }
    cover("k_dropout");
}

/* ------------------------------------------------------------------ windows */

typedef struct window_case {
    int64_t batch, in_h, in_w, c, k_h, k_w, s_h, s_w, pad_top, pad_bottom, pad_left, pad_right;
} window_case;

static crew_window window_of(const window_case *w)
{
    crew_window g;
    g.batch = w->batch, g.in_h = w->in_h, g.in_w = w->in_w, g.in_c = w->c;
    g.k_h = w->k_h, g.k_w = w->k_w, g.stride_h = w->s_h, g.stride_w = w->s_w;
    g.pad_top = w->pad_top, g.pad_left = w->pad_left;
    g.out_h = (w->in_h + w->pad_top + w->pad_bottom - w->k_h) / w->s_h + 1;
    g.out_w = (w->in_w + w->pad_left + w->pad_right - w->k_w) / w->s_w + 1;
    return g;
}

/* batch, in h w c, window h w, stride h w, padding top bottom left right */
static const window_case window_cases[] = {
    {1, 5, 5, 1, 3, 3, 1, 1, 1, 1, 1, 1},   /* "same", one channel */
    {2, 7, 6, 3, 3, 2, 2, 3, 1, 0, 0, 1},   /* strides 2 and 3, padding on one side each */
    {1, 4, 4, 5, 2, 2, 2, 2, 0, 0, 0, 0},   /* pooling's tiling (the CPU's one-pass max-pool gradient) */
    {2, 5, 7, 3, 2, 2, 2, 2, 0, 0, 0, 0},   /* the same windows with a row and a column left over */
    {3, 9, 8, 2, 5, 4, 3, 2, 2, 1, 1, 2},   /* windows larger than the stride */
    {1, 7, 5, 7, 1, 1, 3, 2, 0, 0, 0, 0},   /* 1x1 taps that skip cells: col2im's zeros */
    {2, 2, 2, 3, 2, 2, 1, 1, 2, 2, 2, 2},   /* windows wholly in the padding */
    {1, 6, 3, 1, 4, 3, 1, 3, 0, 1, 2, 0},   /* taller than wide, padding bottom and left */
    {2, 28, 28, 3, 3, 3, 1, 1, 1, 1, 1, 1}, /* a first conv layer */
    {1, 11, 13, 33, 3, 3, 2, 2, 0, 1, 0, 1} /* TensorFlow's "same" at stride 2: the extra row at the bottom */
};

static void describe(char *buf, size_t len, const window_case *w, const crew_window *g)
{
    snprintf(buf, len, "%lldx%lldx%lldx%lld, %lldx%lld window, stride %lldx%lld, pad %lld/%lld/%lld/%lld -> %lldx%lld",
             (long long)w->batch, (long long)w->in_h, (long long)w->in_w, (long long)w->c, (long long)w->k_h,
             (long long)w->k_w, (long long)w->s_h, (long long)w->s_w, (long long)w->pad_top, (long long)w->pad_bottom,
             (long long)w->pad_left, (long long)w->pad_right, (long long)g->out_h, (long long)g->out_w);
}

static void check_windows(void)
{
    for (size_t w = 0; w < sizeof window_cases / sizeof window_cases[0]; w++) {
        const crew_window g = window_of(&window_cases[w]);
        char geo[200];
        describe(geo, sizeof geo, &window_cases[w], &g);
        const int64_t n_in = crew_window_in_cells(&g), n_out = crew_window_out_cells(&g);
        const int64_t n_col = crew_window_col_size(&g);
        float *x = floats(n_in), *col = floats(n_col), *want_col = floats(n_col);
        uniform(x, n_in, -1, 1);
        for (int64_t i = 0; i < n_col; i++) crew_body_im2col(x, col, &g, i);
        be.ops->im2col(be.ctx, x, want_col, &g);
        SAME_F("k_im2col", geo, col, want_col, n_col);

        float *dx = floats(n_in), *want_dx = floats(n_in);
        uniform(col, n_col, -1, 1);
        uniform(dx, n_in, 5, 6); /* overwritten: stale values must not show */
        for (int64_t i = 0; i < n_in; i++) crew_body_col2im(col, dx, &g, i);
        be.ops->col2im(be.ctx, col, want_dx, &g);
        SAME_F("k_col2im", geo, dx, want_dx, n_in);

        for (int variant = 0; variant < 4; variant++) { /* random values, then many ties; each of x, of relu(x) */
            const int tied = variant % 2, relu_in = variant / 2;
            const char *geo2 = named("%s%s%s", geo, tied ? ", tied values" : "", relu_in ? ", of relu(x)" : "");
            if (tied) ties(x, n_in);
            if (variant == 2) uniform(x, n_in, -1, 1);
            if (!tied && n_in > 3) x[n_in / 3] = NAN; /* a NaN never wins, but seeds a window it starts */
            float *y = floats(n_out), *want_y = floats(n_out), *dy = floats(n_out);
            int32_t *am = malloc((size_t)n_out * sizeof *am), *want_am = malloc((size_t)n_out * sizeof *am);
            for (int64_t i = 0; i < n_out; i++) crew_body_maxpool_forward(x, y, am, &g, relu_in, i);
            be.ops->maxpool_forward(be.ctx, x, want_y, want_am, &g, relu_in);
            SAME_F("k_maxpool_forward", geo2, y, want_y, n_out);
            same_bits("k_maxpool_forward", geo2, am, want_am, sizeof *am, n_out);
            uniform(dy, n_out, -1, 1);
            for (int64_t i = 0; i < n_in; i++) crew_body_maxpool_backward(dy, want_am, dx, &g, i);
            be.ops->maxpool_backward(be.ctx, dy, want_am, want_dx, &g);
            SAME_F("k_maxpool_backward", geo2, dx, want_dx, n_in);

            for (int64_t i = 0; i < n_out; i++) crew_body_avgpool_forward(x, y, &g, i);
            be.ops->avgpool_forward(be.ctx, x, want_y, &g);
            SAME_F("k_avgpool_forward", geo2, y, want_y, n_out);
            for (int64_t i = 0; i < n_in; i++) crew_body_avgpool_backward(dy, dx, &g, i);
            be.ops->avgpool_backward(be.ctx, dy, want_dx, &g);
            SAME_F("k_avgpool_backward", geo2, dx, want_dx, n_in);
            free(y), free(want_y), free(dy), free(am), free(want_am);
        }
        free(x), free(col), free(want_col), free(dx), free(want_dx);
    }
    cover("k_im2col"), cover("k_col2im"), cover("k_maxpool_forward"), cover("k_maxpool_backward");
    cover("k_avgpool_forward"), cover("k_avgpool_backward");
}

/* The planted off-by-one: the same check as k_im2col's must fail on every geometry with the
 * window's column one too far right, while the real body passes it (check_windows). */
static void check_planted(void)
{
    int caught = 0, cases = 0;
    for (size_t w = 0; w < sizeof window_cases / sizeof window_cases[0]; w++) {
        const crew_window g = window_of(&window_cases[w]);
        const int64_t n_in = crew_window_in_cells(&g), n_col = crew_window_col_size(&g);
        float *x = floats(n_in), *col = floats(n_col), *want = floats(n_col);
        uniform(x, n_in, 1, 2); /* no zeros: a tap read from the wrong cell always shows */
        for (int64_t i = 0; i < n_col; i++) planted_im2col(x, col, &g, i);
        be.ops->im2col(be.ctx, x, want, &g);
        int64_t first = -1;
        for (int64_t i = 0; i < n_col && first < 0; i++)
            if (memcmp(&col[i], &want[i], sizeof col[i])) first = i;
        cases++;
        caught += first >= 0;
        if (first < 0) {
            char geo[200];
            describe(geo, sizeof geo, &window_cases[w], &g);
            CHECK_MSG(0, "planted im2col (column off by one) passed the bit-for-bit check on %s", geo);
        }
        free(x), free(col), free(want);
    }
    CHECK(caught == cases);
    printf("planted off-by-one in im2col's window column: caught on %d of %d geometries\n", caught, cases);
}

/* ------------------------------------------------------------------ batch norm */

static void check_batch_norm(void)
{
    const int64_t shapes[][2] = {{1, 1}, {7, 3}, {33, 65}, {100, 300}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], c = shapes[s][1], n = rows * c;
        const char *geo = named("%lld rows x %lld channels", (long long)rows, (long long)c);
        float *x = floats(n), *dy = floats(n), *mean = floats(c), *var = floats(c), *gamma = floats(c),
              *beta = floats(c);
        uniform(x, n, -2, 3);
        uniform(dy, n, -1, 1);
        uniform(mean, c, -0.5f, 0.5f);
        uniform(var, c, 0.1f, 2);
        uniform(gamma, c, 0.5f, 1.5f);
        uniform(beta, c, -0.5f, 0.5f);
        double *got = malloc((size_t)c * sizeof *got), *want = malloc((size_t)c * sizeof *want);
        double *got2 = malloc((size_t)c * sizeof *got), *want2 = malloc((size_t)c * sizeof *want);
        for (int64_t j = 0; j < c; j++) crew_body_bn_col_sum(x, rows, c, got, j);
        be.ops->bn_col_sum(be.ctx, x, rows, c, want);
        SAME_D("k_bn_col_sum", geo, got, want, c);
        for (int64_t j = 0; j < c; j++) crew_body_col_sqdev(x, mean, rows, c, got, j);
        be.ops->col_sqdev(be.ctx, x, mean, rows, c, want);
        SAME_D("k_col_sqdev", geo, got, want, c);
        float *fgot = floats(n + 2 * c), *fwant = floats(n + 2 * c); /* n, or dgamma and dbeta */
        for (int64_t i = 0; i < c; i++) crew_body_bn_scale_sums(1.0 / (double)rows, want, fgot, i);
        be.ops->bn_scale_sums(be.ctx, c, 1.0 / (double)rows, want, fwant);
        SAME_F("k_bn_scale_sums", geo, fgot, fwant, c);
        for (int64_t i = 0; i < n; i++) crew_body_bn_forward(x, mean, var, gamma, beta, 1e-5f, fgot, c, i);
        be.ops->bn_forward(be.ctx, x, mean, var, gamma, beta, 1e-5f, fwant, rows, c);
        SAME_F("k_bn_forward", geo, fgot, fwant, n);
        for (int64_t j = 0; j < c; j++) crew_body_bn_backward_sums(dy, x, mean, rows, c, got, got2, j);
        be.ops->bn_backward_sums(be.ctx, dy, x, mean, rows, c, want, want2);
        SAME_D("k_bn_backward_sums", geo, got, want, c);
        SAME_D("k_bn_backward_sums", geo, got2, want2, c);
        const double count = (double)rows * 1.5; /* a synchronised batch norm's count over replicas */
        for (int64_t i = 0; i < n; i++)
            crew_body_bn_backward(dy, x, mean, var, gamma, 1e-5f, want, want2, count, fgot, c, i);
        be.ops->bn_backward(be.ctx, dy, x, mean, var, gamma, 1e-5f, want, want2, count, fwant, rows, c);
        SAME_F("k_bn_backward", geo, fgot, fwant, n);
        uniform(fgot, 2 * c, -1, 1);
        memcpy(fwant, fgot, (size_t)(2 * c) * sizeof *fgot);
        for (int64_t j = 0; j < c; j++) crew_body_bn_param_grads(var, 1e-5f, want, want2, fgot, fgot + c, j);
        be.ops->bn_param_grads(be.ctx, var, 1e-5f, want, want2, fwant, fwant + c, c);
        SAME_F("k_bn_param_grads", geo, fgot, fwant, 2 * c);
        free(x), free(dy), free(mean), free(var), free(gamma), free(beta), free(got), free(want), free(got2),
            free(want2), free(fgot), free(fwant);
    }
    cover("k_bn_col_sum"), cover("k_col_sqdev"), cover("k_bn_scale_sums"), cover("k_bn_forward");
    cover("k_bn_backward_sums"), cover("k_bn_backward"), cover("k_bn_param_grads");
}

/* ------------------------------------------------------------------ layer norm (a warp per row) */

/* k_layernorm_forward: the lanes' partials, the butterfly, the lanes' outputs */
static void emulate_layernorm_forward(const float *x, const float *gamma, const float *beta, float eps, float *y,
                                      float *mean, float *rstd, int64_t rows, int64_t c)
{
    const int lanes = CREW_BODY_LANES;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float v[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) v[l] = crew_ln_lane_sum(xr, c, l, lanes);
        const float m = butterfly_sum(v, lanes) / (float)c;
        for (int l = 0; l < lanes; l++) v[l] = crew_ln_lane_sqdev(xr, c, m, l, lanes);
        const float s = crew_ln_rstd(butterfly_sum(v, lanes) / (float)c, eps);
        for (int l = 0; l < lanes; l++) crew_ln_lane_forward(xr, gamma, beta, m, s, y + r * c, c, l, lanes);
        mean[r] = m;
        rstd[r] = s;
    }
}

static void emulate_layernorm_dx(const float *dy, const float *x, const float *gamma, const float *mean,
                                 const float *rstd, float *dx, int64_t rows, int64_t c)
{
    const int lanes = CREW_BODY_LANES;
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * c, *xr = x + r * c;
        float g[CREW_BODY_LANES], gx[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++)
            crew_ln_lane_grad_sums(dyr, xr, gamma, mean[r], rstd[r], c, l, lanes, &g[l], &gx[l]);
        const float mean_g = butterfly_sum(g, lanes) / (float)c, mean_gx = butterfly_sum(gx, lanes) / (float)c;
        for (int l = 0; l < lanes; l++)
            crew_ln_lane_dx(dyr, xr, gamma, mean[r], rstd[r], mean_g, mean_gx, dx + r * c, c, l, lanes);
    }
}

static void check_layer_norm(void)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 31}, {5, 32}, {7, 33}, {4, 768}, {2, 1000}};
    const float eps = 1e-5f;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], c = shapes[s][1], n = rows * c;
        const char *geo = named("%lld rows x %lld", (long long)rows, (long long)c);
        float *x = floats(n), *gamma = floats(c), *beta = floats(c), *dy = floats(n);
        uniform(x, n, -2, 3);
        uniform(gamma, c, 0.5f, 1.5f);
        uniform(beta, c, -0.5f, 0.5f);
        uniform(dy, n, -1, 1);
        float *y = floats(n), *mean = floats(rows), *rstd = floats(rows);
        float *ey = floats(n), *emean = floats(rows), *erstd = floats(rows);
        be.ops->layernorm_forward(be.ctx, x, gamma, beta, eps, y, mean, rstd, rows, c);
        emulate_layernorm_forward(x, gamma, beta, eps, ey, emean, erstd, rows, c);
        SAME_F("k_layernorm_forward", geo, ey, y, n);
        SAME_F("k_layernorm_forward", geo, emean, mean, rows);
        SAME_F("k_layernorm_forward", geo, erstd, rstd, rows);

        /* backward: dgamma, dbeta a column at a time, rows in order; dx by the warp */
        float *dx = floats(n), *dg = floats(2 * c), *edx = floats(n), *edg = floats(2 * c);
        uniform(dg, 2 * c, -1, 1);
        memcpy(edg, dg, (size_t)(2 * c) * sizeof *dg);
        be.ops->layernorm_backward(be.ctx, dy, x, gamma, mean, rstd, dx, dg, dg + c, rows, c);
        for (int64_t j = 0; j < c; j++) crew_body_layernorm_params(dy, x, mean, rstd, edg, edg + c, rows, c, j);
        SAME_F("k_layernorm_params", geo, edg, dg, 2 * c);
        emulate_layernorm_dx(dy, x, gamma, mean, rstd, edx, rows, c);
        SAME_F("k_layernorm_dx", geo, edx, dx, n);
        free(x), free(gamma), free(beta), free(dy), free(y), free(mean), free(rstd), free(ey), free(emean),
            free(erstd), free(dx), free(dg), free(edx), free(edg);
    }
    cover("k_layernorm_forward"), cover("k_layernorm_dx"), cover("k_layernorm_params");
}

/* ------------------------------------------------------------------ loss (a warp per row) */

/* k_softmax_xent and k_softmax: a warp per row */
static void emulate_softmax_xent(const float *logits, const int32_t *labels, int64_t rows, int64_t classes,
                                 float scale, float *row_loss, float *dlogits, int64_t *correct)
{
    const int lanes = CREW_BODY_LANES;
    int64_t right = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *z = logits + r * classes;
        float *dz = dlogits + r * classes;
        const int32_t y = labels[r];
        const float zy = z[y];
        float v[CREW_BODY_LANES];
        long long at[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) v[l] = crew_xent_lane_argmax(z, classes, l, lanes, &at[l]);
        const float zmax = butterfly_argmax(v, at, lanes);
        const long long best = at[0];
        for (int l = 0; l < lanes; l++) v[l] = crew_xent_lane_exp(z, dz, classes, zmax, l, lanes);
        const float sum = butterfly_sum(v, lanes);
        for (int l = 0; l < lanes; l++) crew_xent_lane_grad(dz, classes, y, crew_xent_inv(scale, sum), scale, l, lanes);
        row_loss[r] = crew_xent_loss(sum, zy, zmax);
        right += best == y;
    }
    *correct = right;
}

static void emulate_softmax(const float *logits, float *probs, int64_t rows, int64_t classes)
{
    const int lanes = CREW_BODY_LANES;
    for (int64_t r = 0; r < rows; r++) {
        const float *z = logits + r * classes;
        float *p = probs + r * classes;
        float v[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) v[l] = crew_softmax_lane_max(z, classes, l, lanes);
        const float zmax = butterfly_max(v, lanes);
        for (int l = 0; l < lanes; l++) v[l] = crew_softmax_lane_exp(z, p, classes, zmax, l, lanes);
        const float sum = butterfly_sum(v, lanes);
        for (int l = 0; l < lanes; l++) crew_softmax_lane_div(p, classes, sum, l, lanes);
    }
}

static void check_loss(void)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 10}, {5, 31}, {4, 32}, {6, 33}, {3, 1000}, {1, 50257}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tied = 0; tied <= 1; tied++)
            for (int in_place = 0; in_place <= 1; in_place++) {
                const int64_t rows = shapes[s][0], classes = shapes[s][1], n = rows * classes;
                const char *geo = named("%lld rows x %lld classes%s%s", (long long)rows, (long long)classes,
                         tied ? ", tied logits" : "", in_place ? ", dlogits over the logits" : "");
                float *z = floats(n);
                if (tied)
                    ties(z, n);
                else
                    uniform(z, n, -10, 10);
                int32_t *labels = malloc((size_t)rows * sizeof *labels);
                for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)crew_rng_next_below(&rng, (uint64_t)classes);
                if (rows > 1) z[classes + labels[1]] = 20; /* a row its label wins */
                const float scale = 1.0f / (float)rows;
                float *cz = copy_of(z, n), *loss = floats(rows), *dz = in_place ? cz : floats(n);
                float *ez = copy_of(z, n), *eloss = floats(rows), *edz = in_place ? ez : floats(n);
                int64_t correct = -1, ecorrect = -2;
                CHECK_OK(be.ops->softmax_xent(be.ctx, cz, labels, rows, classes, scale, loss, dz, &correct));
                emulate_softmax_xent(ez, labels, rows, classes, scale, eloss, edz, &ecorrect);
                SAME_F("k_softmax_xent", geo, edz, dz, n);
                SAME_F("k_softmax_xent", geo, eloss, loss, rows);
                CHECK_MSG(ecorrect == correct, "k_softmax_xent (%s): the warp counts %lld right, the CPU %lld", geo,
                          (long long)ecorrect, (long long)correct);
                float *p = floats(n), *ep = floats(n);
                be.ops->softmax(be.ctx, z, p, rows, classes);
                emulate_softmax(z, ep, rows, classes);
                SAME_F("k_softmax", geo, ep, p, n);
                free(z), free(labels), free(cz), free(loss), free(ez), free(eloss), free(p), free(ep);
                if (!in_place) free(dz), free(edz);
            }
    cover("k_softmax_xent"), cover("k_softmax");
}

/* ------------------------------------------------------------------ attention's softmax (a warp per row) */

/* k_causal_softmax over rows = batch·heads·T rows of T scores (row i is t = i % T), into float32
 * att or (att16) bfloat16 */
static void emulate_causal_softmax(float *scores, float *att, crew_bf16 *att16, int64_t rows, int64_t T)
{
    const int lanes = CREW_BODY_LANES;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t t = i % T;
        float *row = scores + i * T, v[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) v[l] = crew_att_lane_max(row, t, l, lanes);
        const float mx = butterfly_max(v, lanes);
        for (int l = 0; l < lanes; l++) v[l] = crew_att_lane_exp(row, t, mx, l, lanes);
        const float inv = 1.0f / butterfly_sum(v, lanes);
        for (int64_t s = 0; s < T; s++) {
            const float p = s <= t ? crew_att_prob(row[s], inv) : 0.0f;
            if (att16)
                att16[i * T + s] = crew_body_bf16_of(p);
            else
                att[i * T + s] = p;
        }
    }
}

static void emulate_softmax_backward(const void *att, int bf16, float *datt, int64_t rows, int64_t T)
{
    const int lanes = CREW_BODY_LANES;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t t = i % T;
        const void *ar = (const char *)att + (size_t)(i * T) * (bf16 ? sizeof(crew_bf16) : sizeof(float));
        float *dr = datt + i * T, v[CREW_BODY_LANES];
        for (int l = 0; l < lanes; l++) v[l] = crew_att_lane_dot(ar, bf16, dr, t, l, lanes);
        const float dot = butterfly_sum(v, lanes);
        for (int l = 0; l < lanes; l++) crew_att_lane_grad(ar, bf16, dr, t, T, dot, l, lanes);
    }
}

/* The op's ds for every (sample, head), into ds [batch, heads, T, T]: datt is the op's scratch,
 * which the CPU reuses from one head to the next, so the backward runs a head at a time on that
 * head's columns of qkv and dy (its ds depends on nothing else), its datt then holding the head's
 * ds alone. Each head's dq, dk and dv must be the whole call's bits for its columns. */
static void ds_by_head(const char *geo, const float *qkv, const float *dy, const void *att, crew_dtype type,
                       const float *dqkv, float *ds, int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    const int64_t C = heads * d, ld = 3 * C;
    const size_t elem = type == CREW_DT_BF16 ? sizeof(crew_bf16) : sizeof(float);
    float *qkv1 = floats(T * 3 * d), *dy1 = floats(T * d), *datt1 = floats(T * T), *dqkv1 = floats(T * 3 * d);
    int64_t differ = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            for (int64_t t = 0; t < T; t++) {
                for (int64_t j = 0; j < 3; j++)
                    memcpy(qkv1 + t * 3 * d + j * d, qkv + (b * T + t) * ld + j * C + h * d, (size_t)d * sizeof(float));
                memcpy(dy1 + t * d, dy + (b * T + t) * C + h * d, (size_t)d * sizeof(float));
            }
            const int64_t at = (b * heads + h) * T * T;
            be.ops->attention_backward(be.ctx, dy1, qkv1, (const char *)att + (size_t)at * elem, type, datt1, dqkv1, 1,
                                       T, 1, d);
            memcpy(ds + at, datt1, (size_t)(T * T) * sizeof(float));
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < 3; j++)
                    differ += memcmp(dqkv1 + t * 3 * d + j * d, dqkv + (b * T + t) * ld + j * C + h * d,
                                     (size_t)d * sizeof(float)) != 0;
        }
    CHECK_MSG(differ == 0, "attention_backward (%s): %lld rows of a head's dq, dk, dv differ between the head alone "
              "and the whole call", geo, (long long)differ);
    free(qkv1), free(dy1), free(datt1), free(dqkv1);
}

static void check_attention(void)
{
    /* the last two: whole vectors of columns and tiles of rows on every width (with 70, rows whose
     * strips of 32 pass T) */
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 5, 2, 3}, {1, 33, 1, 4}, {1, 64, 2, 8}, {2, 7, 3, 5},
                                 {1, 70, 1, 2}, {2, 64, 2, 32}, {1, 70, 2, 48}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int a16 = 0; a16 <= 1; a16++) {
            const int64_t batch = shapes[s][0], T = shapes[s][1], heads = shapes[s][2], d = shapes[s][3];
            const int64_t C = heads * d, ld = 3 * C, sq = heads * T * T, rows = batch * heads * T, n = batch * sq;
            const char *geo = named("batch %lld, T %lld, %lld heads of %lld, att %s", (long long)batch, (long long)T,
                     (long long)heads, (long long)d, a16 ? "bf16" : "f32");
            float *qkv = floats(batch * T * ld), *dy = floats(batch * T * C), *y = floats(batch * T * C);
            uniform(qkv, batch * T * ld, -2, 2);
            uniform(dy, batch * T * C, -1, 1);
            const crew_dtype type = a16 ? CREW_DT_BF16 : CREW_DT_F32;
            void *att = a16 ? (void *)malloc((size_t)n * sizeof(crew_bf16)) : (void *)floats(n);
            float *scores = floats(n), *datt = floats(n), *dqkv = floats(batch * T * ld);
            be.ops->attention_forward(be.ctx, qkv, att, type, scores, y, batch, T, heads, d);
            be.ops->attention_backward(be.ctx, dy, qkv, att, type, datt, dqkv, batch, T, heads, d);
            /* the kernels' inputs, as the CPU computes them: the scores q·kᵀ/√d, and dy·vᵀ, by its
             * register tiles (float32), or by the same GEMMs with the same arguments, a block of
             * rows at a time up to the block's last column (bfloat16 att; the rest is masked, and a
             * row's bits may depend on the GEMM's shape) */
            const float scale = 1.0f / sqrtf((float)d);
            float *raw = floats(n), *da = floats(n), *head_t = floats(T * d);
            for (int64_t b = 0; b < batch; b++)
                for (int64_t h = 0; h < heads; h++) {
                    const float *q = qkv + b * T * ld + h * d, *k = q + C, *v = q + 2 * C;
                    const float *dyh = dy + b * T * C + h * d;
                    const int64_t at = (b * heads + h) * T * T;
                    if (!a16) {
                        cpu_attention_scores(q, ld, k, ld, T, d, scale, head_t, raw + at);
                        cpu_attention_scores(dyh, C, v, ld, T, d, 1.0f, head_t, da + at);
                        continue;
                    }
                    for (int64_t t0 = 0; t0 < T; t0 += CPU_ATTENTION_BLOCK) {
                        const int64_t t1 = t0 + CPU_ATTENTION_BLOCK < T ? t0 + CPU_ATTENTION_BLOCK : T;
                        float *raw_t = raw + at + t0 * T, *da_t = da + at + t0 * T;
                        be.ops->gemm(be.ctx, 0, 1, t1 - t0, t1, d, scale, q + t0 * ld, ld, k, ld, 0.0f, raw_t, T);
                        be.ops->gemm(be.ctx, 0, 1, t1 - t0, t1, d, 1.0f, dyh + t0 * C, C, v, ld, 0.0f, da_t, T);
                    }
                }
            const float *catt = a16 ? NULL : att;
            float *wide = floats(n), *ewide = floats(n), *sc = copy_of(raw, n), *eatt = floats(n);
            crew_bf16 *eatt16 = a16 ? malloc((size_t)n * sizeof *eatt16) : NULL;
            for (int64_t i = 0; i < n; i++) wide[i] = a16 ? crew_body_bf16_widen(((crew_bf16 *)att)[i]) : catt[i];
            memcpy(sc, raw, (size_t)n * sizeof *sc);
            emulate_causal_softmax(sc, eatt, eatt16, rows, T);
            for (int64_t i = 0; i < n; i++) ewide[i] = a16 ? crew_body_bf16_widen(eatt16[i]) : eatt[i];
            SAME_F("k_causal_softmax", geo, ewide, wide, n);
            float *eds = copy_of(da, n), *ds = floats(n);
            emulate_softmax_backward(a16 ? (const void *)att : (const void *)catt, a16, eds, rows, T);
            ds_by_head(geo, qkv, dy, att, type, dqkv, ds, batch, T, heads, d);
            SAME_F("k_softmax_backward_rows", geo, eds, ds, n);
            free(eds), free(ds);
            free(qkv), free(dy), free(y), free(att), free(scores), free(datt), free(dqkv), free(raw), free(da),
                free(head_t), free(wide), free(ewide), free(sc), free(eatt), free(eatt16);
        }
    cover("k_causal_softmax"), cover("k_softmax_backward_rows");
}

/* ------------------------------------------------------------------ embedding */

static void check_embedding(void)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 9, 5}, {100, 64, 33}, {3, 40, 2}}; /* vocab, rows, dim */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t vocab = shapes[s][0], rows = shapes[s][1], dim = shapes[s][2];
        const char *geo = named("vocab %lld, %lld rows of %lld", (long long)vocab, (long long)rows, (long long)dim);
        float *ids = floats(rows), *table = floats(vocab * dim), *dy = floats(rows * dim);
        const float invalid[] = {-1.0f, (float)vocab, 2.5f, NAN, 1e30f, -0.0f, (float)vocab + 0.5f};
        for (int64_t r = 0; r < rows; r++) /* unsorted, repeated (few ids), and every kind of invalid one */
            ids[r] = r % 4 == 3 ? invalid[r / 4 % 7]
                                : (float)crew_rng_next_below(&rng, (uint64_t)(vocab < 6 ? vocab : 6));
        uniform(table, vocab * dim, -1, 1);
        uniform(dy, rows * dim, -1, 1);
        float *y = floats(rows * dim), *ey = floats(rows * dim);
        long long *flags = malloc((size_t)rows * sizeof *flags);
        int64_t bad = -1;
        CHECK_OK(be.ops->embedding_forward(be.ctx, ids, table, vocab, y, rows, dim, &bad));
        for (int64_t i = 0; i < rows * dim; i++) crew_body_embedding_forward(ids, table, vocab, ey, dim, i);
        SAME_F("k_embedding_forward", geo, ey, y, rows * dim);
        for (int64_t r = 0; r < rows; r++) crew_body_embedding_bad(ids, vocab, flags, r);
        CHECK_MSG(crew_body_count(flags, rows) == bad, "k_embedding_bad, k_count (%s): %lld bad ids, the CPU %lld",
                  geo, crew_body_count(flags, rows), (long long)bad);
        /* backward: the keys, CUB's stable radix sort (a stable counting sort here), the runs */
        int *keys = malloc((size_t)rows * sizeof *keys), *order = malloc((size_t)rows * sizeof *order);
        int *skeys = malloc((size_t)rows * sizeof *keys), *sorder = malloc((size_t)rows * sizeof *order);
        for (int64_t r = 0; r < rows; r++) crew_body_embedding_keys(ids, vocab, keys, order, r);
        int64_t at = 0;
        for (int key = 0; key <= vocab; key++)
            for (int64_t r = 0; r < rows; r++)
                if (keys[r] == key) skeys[at] = key, sorder[at++] = order[r];
        CHECK(at == rows);
        float *dt = floats(vocab * dim);
        uniform(dt, vocab * dim, -1, 1);
        float *edt = copy_of(dt, vocab * dim);
        be.ops->embedding_backward(be.ctx, ids, dy, dt, vocab, rows, dim);
        for (int64_t i = 0; i < rows * dim; i++) crew_body_embedding_runs(skeys, sorder, dy, edt, vocab, rows, dim, i);
        SAME_F("k_embedding_runs", geo, edt, dt, vocab * dim);
        free(ids), free(table), free(dy), free(y), free(ey), free(flags), free(keys), free(order), free(skeys),
            free(sorder), free(dt), free(edt);
    }
    /* the loss's right answers are counted by k_count too (check_loss) */
    cover("k_embedding_forward"), cover("k_embedding_bad"), cover("k_count"), cover("k_embedding_keys");
    cover("k_embedding_runs");
}

/* ------------------------------------------------------------------ optimisers */

static void check_optimisers(void)
{
    /* 300000: past the count up to which the CPU's AdamW multiplies by the reciprocal (cpu_optim.c) */
    const int64_t sizes[] = {1, 17, 1000, 300000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *p0 = floats(n), *g = floats(n), *v0 = floats(n), *m0 = floats(n);
        uniform(p0, n, -1, 1);
        uniform(g, n, -0.1f, 0.1f);
        uniform(v0, n, 0, 0.01f);
        uniform(m0, n, -0.05f, 0.05f);
        const float moms[] = {0.0f, 0.9f}, decays[] = {0.0f, 0.01f};
        for (int mi = 0; mi < 2; mi++)
            for (int nesterov = 0; nesterov <= 1; nesterov++)
                for (int di = 0; di < 2; di++) {
                    const char *geo = named("n %lld, momentum %.1f, nesterov %d, weight decay %.2f", (long long)n,
                             moms[mi], nesterov, decays[di]);
                    float *p = copy_of(p0, n), *vel = copy_of(m0, n), *ep = copy_of(p0, n), *evel = copy_of(m0, n);
                    be.ops->sgd_update(be.ctx, p, g, vel, n, 0.1f, moms[mi], nesterov, decays[di]);
                    for (int64_t i = 0; i < n; i++) crew_body_sgd(ep, g, evel, 0.1f, moms[mi], nesterov, decays[di], i);
                    SAME_F("k_sgd", geo, ep, p, n);
                    SAME_F("k_sgd", geo, evel, vel, n);
                    free(p), free(vel), free(ep), free(evel);
                }
        /* AdamW: both branches of its lerp (a weight below ½ and not) */
        const crew_adamw_consts ks[] = {{0.999f, 0.1f, 0.999f, 0.001f, 0.01f, 0.0447f, 1e-8f},
                                        {1.0f, 0.75f, 0.95f, 0.05f, 0.3f, 0.5f, 1e-6f}};
        for (int k = 0; k < 2; k++) {
            const char *geo = named("n %lld, 1 - beta1 %.2f", (long long)n, ks[k].one_minus_beta1);
            float *p = copy_of(p0, n), *m = copy_of(m0, n), *v = copy_of(v0, n);
            float *ep = copy_of(p0, n), *em = copy_of(m0, n), *ev = copy_of(v0, n);
            be.ops->adamw_update(be.ctx, p, g, m, v, n, &ks[k]);
            for (int64_t i = 0; i < n; i++) crew_body_adamw(ep, g, em, ev, ks[k], i);
            SAME_F("k_adamw", geo, ep, p, n);
            SAME_F("k_adamw", geo, em, m, n);
            SAME_F("k_adamw", geo, ev, v, n);
            free(p), free(m), free(v), free(ep), free(em), free(ev);
            /* LAMB's direction, into its own buffer and in place over the gradient */
            for (int in_place = 0; in_place <= 1; in_place++) {
                const char *g2 = named("%s, %s", geo, in_place ? "in place" : "apart");
                float *gd = copy_of(g, n), *u = in_place ? gd : floats(n), *ge = copy_of(g, n);
                float *ue = in_place ? ge : floats(n);
                m = copy_of(m0, n), v = copy_of(v0, n), em = copy_of(m0, n), ev = copy_of(v0, n);
                be.ops->adam_direction(be.ctx, gd, m, v, u, n, &ks[k]);
                for (int64_t i = 0; i < n; i++) crew_body_adam_direction(ge, em, ev, ue, ks[k], i);
                SAME_F("k_adam_direction", g2, ue, u, n);
                SAME_F("k_adam_direction", g2, em, m, n);
                SAME_F("k_adam_direction", g2, ev, v, n);
                if (!in_place) free(u), free(ue);
                free(gd), free(ge), free(m), free(v), free(em), free(ev);
            }
        }
        free(p0), free(g), free(v0), free(m0);
    }
    cover("k_sgd"), cover("k_adamw"), cover("k_adam_direction");
}

/* crew_body_div_rc: a float divided by c as a double product with 1 / c is the float quotient
 * (optim.h's argument), for the bias corrections AdamW divides by and for other divisors. A quotient
 * a·2^k / c is the quotient of a and c times 2^k, so the significands of one binade of a cover every
 * normal a: all 2^23 of them for the first divisors, a sample for the rest. */
static void check_adam_reciprocal(void)
{
    float cs[64];
    int n = 0;
    cs[n++] = 1.0f;
    const double beta2s[] = {0.999, 0.99, 0.95};
    const int ts[] = {1, 2, 3, 4, 5, 7, 10, 100, 1000, 5000, 20000};
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < (int)(sizeof ts / sizeof *ts); t++) cs[n++] = (float)sqrt(1.0 - pow(beta2s[b], ts[t]));
    while (n < 64) cs[n++] = 0.03f + 0.97f * (float)crew_rng_next_uniform(&rng);
    int64_t wrong = 0;
    for (int i = 0; i < n; i++) {
        const double rc = 1.0 / (double)cs[i];
        const uint32_t count = i < 8 ? 1u << 23 : 1u << 16;
        for (uint32_t j = 0; j < count; j++) {
            uint32_t bits = 0x3f800000u | (i < 8 ? j : (uint32_t)crew_rng_next_below(&rng, 1u << 23));
            float a, want, got;
            memcpy(&a, &bits, 4);
            want = a / cs[i];
            got = crew_body_div_rc(a, rc);
            if (memcmp(&want, &got, 4) && wrong++ == 0)
                fprintf(stderr, "crew_body_div_rc: %.9g / %.9g is %.9g, the product %.9g\n", a, cs[i], want, got);
        }
    }
    CHECK(wrong == 0);
}

int main(void)
{
    CHECK_OK(crew_cpu_backend_create(1, &be));
    rng = crew_rng_make(crew_rng_key(20261204, 30, 4, 0));
    check_elementwise();
    check_to_bf16();
    check_filters();
    check_reductions();
    check_ordered_sum();
    check_activations();
    check_dropout();
    check_windows();
    check_planted();
    check_batch_norm();
    check_layer_norm();
    check_loss();
    check_attention();
    check_embedding();
    check_optimisers();
    check_adam_reciprocal();
    be.ops->destroy(be.ctx);

    int count = 0;
    for (int i = 0; i < N_KERNELS; i++) count += covered[i];
    printf("kernel bodies run on the CPU: %d of %d kernels:", count, N_KERNELS);
    for (int i = 0; i < N_KERNELS; i++)
        if (covered[i]) printf(" %s", all_kernels[i]);
    printf("\nnot covered:");
    for (int i = 0; i < N_KERNELS; i++)
        if (!covered[i]) printf(" %s", all_kernels[i]);
    printf(count == N_KERNELS ? " none\n" : "\n");
    CHECK(count >= 33);
    return check_report();
}
