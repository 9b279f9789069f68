/* cpu_backend.c — the CPU backend's table: memory, transfers, queues, GEMM (cpu_gemm.c: oneDNN's
 * or OpenBLAS's), simple vector ops and reductions. Everything but GEMM is plain C loops that the
 * compiler vectorises.
 *
 * One instance is one CPU device with a context of its own (its GEMMs' thread count, precision and
 * scratch). Everything runs at once on the calling thread, so queues are
 * tokens with nothing to order, and no op is ever pending or failed. */
#include <stdio.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "backend/body/elementwise.h"
#include "backend/body/reduce.h"
#include "backend/cpu/cpu_ops.h"
#include "core/status.h"

struct crew_queue {
    int unused;
};

static void cpu_destroy(void *ctx)
{
    if (ctx) {
        cpu_gemm_free(ctx);
        free(((cpu_ctx *)ctx)->taps);
        free(((cpu_ctx *)ctx)->head_t);
    }
    free(ctx);
}

/* Memory is 64-byte aligned so vector loads never straddle cache lines. A device buffer keeps its
 * size in the 64 bytes before it, for the accounting (memory_used). */
#define HEADER 64

static size_t rounded_bytes(crew_dtype t, int64_t n) { return ((size_t)n * crew_dtype_size(t) + 63) & ~(size_t)63; }

static crew_status cpu_host_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    (void)ctx;
    *out = NULL;
    if (n < 0 || (uint64_t)n > (SIZE_MAX - 128) / 8)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: cannot allocate %lld elements", (long long)n);
    if (n == 0) n = 1;
    size_t bytes = rounded_bytes(t, n);
    void *p = aligned_alloc(64, bytes);
    if (!p)
        return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cpu backend: out of memory for %lld elements (%zu bytes)",
                           (long long)n, bytes);
    memset(p, 0, bytes);
    *out = p;
    return CREW_OK;
}

static void cpu_host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static crew_status cpu_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    cpu_ctx *c = ctx;
    *out = NULL;
    if (n < 0 || (uint64_t)n > (SIZE_MAX - 128) / 8)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: cannot allocate %lld elements", (long long)n);
    if (n == 0) n = 1;
    size_t bytes = rounded_bytes(t, n);
    unsigned char *p = aligned_alloc(64, HEADER + bytes);
    if (!p)
        return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cpu backend: out of memory for %lld elements (%zu bytes)",
                           (long long)n, bytes);
    memset(p + HEADER, 0, bytes);
    memcpy(p, &bytes, sizeof bytes);
    if (c) {
        int64_t now = atomic_fetch_add(&c->in_use, (int64_t)bytes) + (int64_t)bytes;
        int64_t peak = atomic_load(&c->peak);
        while (now > peak && !atomic_compare_exchange_weak(&c->peak, &peak, now)) {
        }
    }
    *out = p + HEADER;
    return CREW_OK;
}

static void cpu_free(void *ctx, void *p)
{
    cpu_ctx *c = ctx;
    if (!p) return;
    unsigned char *base = (unsigned char *)p - HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    if (c) atomic_fetch_sub(&c->in_use, (int64_t)bytes);
    free(base);
}

static void cpu_memory_used(void *ctx, int64_t *in_use, int64_t *peak)
{
    cpu_ctx *c = ctx;
    *in_use = c ? atomic_load(&c->in_use) : 0;
    *peak = c ? atomic_load(&c->peak) : 0;
}

static crew_status cpu_upload(void *ctx, crew_queue *q, void *dst, const void *host, int64_t n, crew_dtype t)
{
    (void)ctx;
    (void)q;
    if (n > 0 && dst != host) memmove(dst, host, (size_t)n * crew_dtype_size(t));
    return CREW_OK;
}

static crew_status cpu_download(void *ctx, void *host, const void *src, int64_t n, crew_dtype t)
{
    CREW_TRY(cpu_take_failure(ctx));
    return cpu_upload(ctx, NULL, host, src, n, t);
}

static crew_status cpu_queue_create(void *ctx, crew_queue **out)
{
    (void)ctx;
    *out = calloc(1, sizeof **out);
    return *out ? CREW_OK : CREW_OOM();
}

static void cpu_queue_destroy(void *ctx, crew_queue *q)
{
    (void)ctx;
    free(q);
}

static crew_status cpu_queue_wait(void *ctx, crew_queue *waiter, crew_queue *on)
{
    (void)ctx;
    (void)waiter;
    (void)on;
    return CREW_OK;
}

static crew_status cpu_sync(void *ctx, crew_queue *q)
{
    (void)q;
    return cpu_take_failure(ctx);
}

/* The CPU device's memory is the host's. */
static void *cpu_host_alias(void *ctx, const void *p, int64_t n, crew_dtype t)
{
    (void)ctx;
    (void)n;
    (void)t;
    return (void *)p;
}

/* The CPU's device memory is host memory, and its ops run when called: the loader's slot is read
 * where it lies. */
static void *cpu_in_place(void *ctx, void *host, int64_t n, crew_dtype t)
{
    (void)ctx;
    (void)n;
    (void)t;
    return host;
}

static crew_status cpu_sum(void *ctx, const float *x, int64_t n, double *out)
{
    (void)ctx;
    *out = crew_body_sum_serial(x, n);
    return CREW_OK;
}

/* backend.h's order (CREW_SQ_CHUNK): sixteen running sums a chunk, their tree into the chunks'
 * running total. The sixteen chains of adds, instead of one, matter: their add-after-add latency
 * made a norm cost a step's fifth on a small model (the noise scale takes one a micro-batch;
 * clipping and LAMB's trust ratios their own). */
static crew_status cpu_sum_squares_lanes(void *ctx, const float *x, int64_t n, double *state)
{
    (void)ctx;
    double lane[CREW_SQ_LANES]; /* a local copy the compiler keeps in registers */
    memcpy(lane, state, sizeof lane);
    double total = state[CREW_SQ_TOTAL];
    int64_t at = (int64_t)state[CREW_SQ_FILLED], i = 0; /* at: the next value's place in its chunk */
    while (i < n) {
        int64_t m = CREW_SQ_CHUNK - at < n - i ? CREW_SQ_CHUNK - at : n - i; /* to the chunk's end, or x's */
        for (; m > 0 && at % CREW_SQ_LANES; m--) lane[at++ % CREW_SQ_LANES] += crew_body_square(x[i++]);
        for (; m >= CREW_SQ_LANES; m -= CREW_SQ_LANES, i += CREW_SQ_LANES, at += CREW_SQ_LANES)
            for (int k = 0; k < CREW_SQ_LANES; k++) lane[k] += crew_body_square(x[i + k]);
        for (; m > 0; m--) lane[at++ % CREW_SQ_LANES] += crew_body_square(x[i++]);
        if (at == CREW_SQ_CHUNK) {
            total += crew_sq_lanes_fold(lane);
            memset(lane, 0, sizeof lane);
            at = 0;
        }
    }
    memcpy(state, lane, sizeof lane);
    state[CREW_SQ_TOTAL] = total;
    state[CREW_SQ_FILLED] = (double)at;
    return CREW_OK;
}

static crew_status cpu_sum_squares(void *ctx, const float *x, int64_t n, double *out)
{
    double state[CREW_SQ_STATE] = {0.0};
    CREW_TRY(cpu_sum_squares_lanes(ctx, x, n, state));
    *out = crew_sq_state_sum(state);
    return CREW_OK;
}

static crew_status cpu_all_finite(void *ctx, const float *x, int64_t n, int *out)
{
    (void)ctx;
    /* An OR over integer tests vectorises; a float sum (x·0) would be a serial dependency chain. */
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= crew_body_nonfinite(x[i]);
    *out = !bad;
    return CREW_OK;
}

static crew_status cpu_hash(void *ctx, const void *x, int64_t n, crew_dtype t, uint64_t *out)
{
    (void)ctx;
    *out = (uint64_t)XXH3_64bits(x, (size_t)n * crew_dtype_size(t));
    return CREW_OK;
}

static void cpu_copy(void *ctx, float *dst, const float *src, int64_t n)
{
    (void)ctx;
    if (n > 0 && dst != src) memmove(dst, src, (size_t)n * sizeof(float));
}

static void cpu_fill(void *ctx, float *x, float value, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) crew_body_fill(x, value, i);
}

static void cpu_axpby(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) crew_body_axpby(alpha, x, beta, y, i);
}

static void cpu_mul(void *ctx, int64_t n, const float *a, const float *b, float *out)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) crew_body_mul(a, b, out, i);
}

/* a row at a time (crew_body_broadcast_rows is the element's) */
static void cpu_broadcast_rows(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) memcpy(y + r * cols, bias, (size_t)cols * sizeof(float));
}

/* rows outer, columns inner: crew_body_col_sum's adds, in its order, for every column */
static void cpu_col_sum(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    const cpu_ctx *c = ctx;
    if (c && c->sum_block > 0 && rows > c->sum_block) { /* configure's sum_block: verify's reference, not fast */
        for (int64_t j = 0; j < cols; j++) crew_body_col_sum_blocked(x, rows, cols, out, accumulate, c->sum_block, j);
        return;
    }
    if (!accumulate) memset(out, 0, (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        for (int64_t c = 0; c < cols; c++) out[c] += row[c];
    }
}

const crew_backend_ops crew_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .memory_used = cpu_memory_used,
    .upload = cpu_upload,
    .download = cpu_download,
    .queue_create = cpu_queue_create,
    .queue_destroy = cpu_queue_destroy,
    .queue_wait = cpu_queue_wait,
    .sync = cpu_sync,
    .host_alias = cpu_host_alias,
    .in_place = cpu_in_place,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .sum_squares_lanes = cpu_sum_squares_lanes,
    .all_finite = cpu_all_finite,
    .hash = cpu_hash,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .gemm = cpu_gemm,
    .gemm_typed = cpu_gemm_typed,
    .gemm_bias = cpu_gemm_bias,
    .to_bf16 = cpu_to_bf16,
    .axpby = cpu_axpby,
    .mul = cpu_mul,
    .broadcast_rows = cpu_broadcast_rows,
    .col_sum = cpu_col_sum,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .act_forward_slope = cpu_act_forward_slope,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .conv_taps_forward = cpu_conv_taps_forward,
    .conv_taps_filter_grad = cpu_conv_taps_filter_grad,
    .conv_taps_pool_forward = cpu_conv_taps_pool_forward,
    .conv_taps_pool_grads = cpu_conv_taps_pool_grads,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .dropout_forward = cpu_dropout_forward,
    .bn_col_sum = cpu_bn_col_sum,
    .col_sqdev = cpu_col_sqdev,
    .bn_scale_sums = cpu_bn_scale_sums,
    .bn_forward = cpu_bn_forward,
    .bn_backward_sums = cpu_bn_backward_sums,
    .bn_backward = cpu_bn_backward,
    .bn_param_grads = cpu_bn_param_grads,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .softmax_xent = cpu_softmax_xent,
    .softmax = cpu_softmax,
    .sgd_update = cpu_sgd_update,
    .adamw_update = cpu_adamw_update,
    .adam_direction = cpu_adam_direction,
    .configure = cpu_configure,
};

crew_status crew_cpu_backend_create(int blas_threads, crew_backend *out)
{
    memset(out, 0, sizeof *out);
    if (blas_threads < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: blas threads must be >= 1, got %d",
                           blas_threads);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return CREW_OOM();
    c->blas_threads = blas_threads;
    cpu_gemm_library_threads(blas_threads);
    out->ops = &crew_cpu_ops;
    out->ctx = c;
    return CREW_OK;
}
