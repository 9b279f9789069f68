/* cuda_backend.cu — the CUDA backend's table: memory, transfers, queues, the synchronous
 * reductions, GEMM through cuBLAS, and the device kind's entry points (registry.c).
 *
 * Determinism (docs/ARCHITECTURE.md): cuBLAS in its default (fp32, no TF32) math mode on one
 * stream gives the same bits run after run on one GPU; every reduction here runs over a fixed
 * grid in a fixed order, with no atomics, so it does too. sum() adds in order in double on one
 * thread, as backend.h asks of every device, so a loss is the same bits as on the CPU. The hash of
 * the drift check is the CPU's XXH3-64 over the bytes brought to the host.
 *
 * Errors: a kernel or copy that fails is kept as the context's pending error (cuda_note) and
 * returned, naming the GPU, by the next call that returns a crew_status, as backend.h asks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <cuda_bf16.h>

#include "backend/body/elementwise.h"
#include "backend/body/reduce.h"
#include "backend/cuda/cuda_internal.h"
#ifdef CREW_HAVE_CUDNN
#include <cudnn.h>
#endif

extern "C" {
#include "core/status.h"
}

/* ------------------------------------------------------------------ errors */

void cuda_enter(cuda_ctx *c) { cudaSetDevice(c->device); }

void cuda_note(cuda_ctx *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    pthread_mutex_lock(&c->mu);
    if (c->pending == cudaSuccess) {
        c->pending = e;
        c->pending_what = what;
    }
    pthread_mutex_unlock(&c->mu);
}

void cuda_launched(cuda_ctx *c, const char *what) { cuda_note(c, cudaGetLastError(), what); }

crew_status cuda_take_pending(cuda_ctx *c)
{
    pthread_mutex_lock(&c->mu);
    cudaError_t e = c->pending;
    const char *what = c->pending_what;
    c->pending = cudaSuccess;
    pthread_mutex_unlock(&c->mu);
    if (e == cudaSuccess) return CREW_OK;
    return crew_errorf(e == cudaErrorMemoryAllocation ? CREW_CODE_OUT_OF_MEMORY : CREW_CODE_IO,
                       "cuda:%d: %s failed: %s (%s)", c->device, what ? what : "an operation", cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

/* A synchronous call's own error, with the pending one first (it happened first). */
static crew_status check(cuda_ctx *c, cudaError_t e, const char *what)
{
    cuda_note(c, e, what);
    return cuda_take_pending(c);
}

/* ------------------------------------------------------------------ lifecycle */

static void cuda_destroy(void *ctx)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c) return;
    cuda_enter(c);
    cudaStreamSynchronize(c->stream);
    cuda_conv_close(c);
    for (int i = 0; i < 2; i++) cuda_free(c, c->bf16_ops[i]);
    cuda_free(c, c->sort_buf);
    cudaFree(c->d_partial);
    cudaFree(c->d_sq);
    cudaFree(c->d_count);
    cudaFree(c->d_move);
    cudaFreeHost(c->h_result);
    cudaFreeHost(c->h_count);
    cudaFreeHost(c->h_hash);
    if (c->blas) cublasDestroy(c->blas);
    if (c->done) cudaEventDestroy(c->done);
    if (c->stream) cudaStreamDestroy(c->stream);
    pthread_mutex_destroy(&c->mu);
    free(c->blocks);
    free(c);
}

/* ------------------------------------------------------------------ memory */

static size_t slot_of(const cuda_ctx *c, const void *p)
{
    return (size_t)(((uintptr_t)p >> 8) * 0x9e3779b97f4a7c15ULL % c->cap);
}

/* Under c->mu. */
static int remember(cuda_ctx *c, void *p, size_t bytes)
{
    if (2 * (c->n_blocks + 1) > c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        cuda_block *grown = (cuda_block *)calloc(cap, sizeof *grown);
        if (!grown) return 0;
        cuda_block *old = c->blocks;
        size_t old_cap = c->cap;
        c->blocks = grown;
        c->cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].p) {
                size_t s = slot_of(c, old[i].p);
                while (c->blocks[s].p) s = (s + 1) % c->cap;
                c->blocks[s] = old[i];
            }
        free(old);
    }
    size_t s = slot_of(c, p);
    while (c->blocks[s].p) s = (s + 1) % c->cap;
    c->blocks[s] = cuda_block{p, bytes};
    c->n_blocks++;
    c->in_use += (int64_t)bytes;
    if (c->in_use > c->peak) c->peak = c->in_use;
    return 1;
}

/* Under c->mu: the block's bytes, removed from the table (0: not one of ours). */
static size_t forget(cuda_ctx *c, void *p)
{
    if (!c->cap) return 0;
    size_t s = slot_of(c, p);
    while (c->blocks[s].p && c->blocks[s].p != p) s = (s + 1) % c->cap;
    if (!c->blocks[s].p) return 0;
    size_t bytes = c->blocks[s].bytes;
    c->blocks[s].p = NULL;
    c->n_blocks--;
    c->in_use -= (int64_t)bytes;
    /* re-insert the rest of the cluster, so that lookups past the hole still find them */
    for (size_t t = (s + 1) % c->cap; c->blocks[t].p; t = (t + 1) % c->cap) {
        cuda_block b = c->blocks[t];
        c->blocks[t].p = NULL;
        size_t u = slot_of(c, b.p);
        while (c->blocks[u].p) u = (u + 1) % c->cap;
        c->blocks[u] = b;
    }
    return bytes;
}

/* 256-byte granules, as cudaMalloc aligns them (the memory planner's 64 for the CPU kinds). */
static size_t rounded_bytes(crew_dtype t, int64_t n) { return ((size_t)n * crew_dtype_size(t) + 255) & ~(size_t)255; }

crew_status cuda_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    *out = NULL;
    if (n < 0 || (uint64_t)n > ((uint64_t)1 << 60))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cuda:%d: cannot allocate %lld elements", c->device,
                           (long long)n);
    if (n == 0) n = 1;
    cuda_enter(c);
    size_t bytes = rounded_bytes(t, n);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cuda:%d: out of device memory for %lld elements (%zu bytes; %zu "
                           "of %zu free)", c->device, (long long)n, bytes, free_b, total_b);
    }
    /* zero-filled, and ready before any queue uses it (an upload may come on the copy queue) */
    e = cudaMemsetAsync(p, 0, bytes, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    pthread_mutex_lock(&c->mu);
    int ok = remember(c, p, bytes);
    pthread_mutex_unlock(&c->mu);
    if (e != cudaSuccess || !ok) {
        cudaFree(p);
        return ok ? check(c, e, "zeroing a new buffer") : CREW_OOM();
    }
    *out = p;
    return CREW_OK;
}

void cuda_free(void *ctx, void *p)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!p) return;
    cuda_enter(c);
    pthread_mutex_lock(&c->mu);
    forget(c, p);
    pthread_mutex_unlock(&c->mu);
    cuda_note(c, cudaFree(p), "cudaFree");
}

static crew_status cuda_host_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    *out = NULL;
    if (n < 0 || (uint64_t)n > ((uint64_t)1 << 60))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cuda:%d: cannot allocate %lld host elements", c->device,
                           (long long)n);
    if (n == 0) n = 1;
    cuda_enter(c);
    size_t bytes = rounded_bytes(t, n);
    void *p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cuda:%d: out of page-locked host memory for %zu bytes", c->device,
                           bytes);
    }
    memset(p, 0, bytes);
    *out = p;
    return CREW_OK;
}

static void cuda_host_free(void *ctx, void *p)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!p) return;
    cuda_enter(c);
    cuda_note(c, cudaFreeHost(p), "cudaFreeHost");
}

static void cuda_memory_used(void *ctx, int64_t *in_use, int64_t *peak)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    pthread_mutex_lock(&c->mu);
    *in_use = c->in_use;
    *peak = c->peak;
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ transfers and queues */

static cudaStream_t stream_of(cuda_ctx *c, crew_queue *q) { return q ? q->stream : c->stream; }

static crew_status cuda_upload(void *ctx, crew_queue *q, void *dst, const void *host, int64_t n, crew_dtype t)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n <= 0) return cuda_take_pending(c);
    cuda_enter(c);
    return check(c, cudaMemcpyAsync(dst, host, (size_t)n * crew_dtype_size(t), cudaMemcpyHostToDevice, stream_of(c, q)),
                 "upload");
}

static crew_status cuda_download(void *ctx, void *host, const void *src, int64_t n, crew_dtype t)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    cudaError_t e = n > 0 ? cudaMemcpyAsync(host, src, (size_t)n * crew_dtype_size(t), cudaMemcpyDeviceToHost, c->stream)
                          : cudaSuccess;
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return check(c, e, "download");
}

static crew_status cuda_queue_create(void *ctx, crew_queue **out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    *out = NULL;
    cuda_enter(c);
    crew_queue *q = (crew_queue *)calloc(1, sizeof *q);
    if (!q) return CREW_OOM();
    cudaError_t e = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        if (q->stream) cudaStreamDestroy(q->stream);
        free(q);
        return check(c, e, "creating a stream");
    }
    *out = q;
    return CREW_OK;
}

static void cuda_queue_destroy(void *ctx, crew_queue *q)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!q) return;
    cuda_enter(c);
    cudaEventDestroy(q->done);
    cudaStreamDestroy(q->stream);
    free(q);
}

static crew_status cuda_queue_wait(void *ctx, crew_queue *waiter, crew_queue *on)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    cudaEvent_t ev = on ? on->done : c->done;
    cudaError_t e = cudaEventRecord(ev, stream_of(c, on));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_of(c, waiter), ev, 0);
    return check(c, e, "ordering two queues");
}

static crew_status cuda_sync(void *ctx, crew_queue *q)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    return check(c, cudaStreamSynchronize(stream_of(c, q)), "sync");
}

/* ------------------------------------------------------------------ synchronous reductions */

/* Σ x in order, in double, on one thread: what backend.h asks of sum() on every device. */
__global__ void k_sum_serial(const float *x, int64_t n, double *out) { *out = crew_body_sum_serial(x, n); }

/* sum_squares in backend.h's order (CREW_SQ_CHUNK), the CPU's bits: the state lives at d_sq.
 * k_sq_piece: values of the chunk under way, a thread (of CREW_SQ_LANES) a lane, then thread 0
 * moves the count on (and closes a full chunk). k_sq_chunks: whole chunks side by side, a block a
 * chunk, its lanes' tree into sums[block]; k_sq_add adds them onto the total in order. */
__global__ void k_sq_piece(const float *x, int64_t n, double *state)
{
    const int64_t at = (int64_t)state[CREW_SQ_FILLED];
    state[threadIdx.x] = crew_body_sq_lane(x, n, at, threadIdx.x, state[threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == 0) crew_body_sq_close(state, n);
}

__global__ void k_sq_chunks(const float *x, double *sums)
{
    __shared__ double lane[CREW_SQ_LANES];
    lane[threadIdx.x] = crew_body_sq_lane(x + (int64_t)blockIdx.x * CREW_SQ_CHUNK, CREW_SQ_CHUNK, 0, threadIdx.x, 0.0);
    __syncthreads();
    if (threadIdx.x == 0) sums[blockIdx.x] = crew_sq_lanes_fold(lane);
}

__global__ void k_sq_add(const double *sums, int64_t count, double *state) { crew_body_sq_add(sums, count, state); }

__global__ void k_add_partials(const double *partial, int count, double *out)
{
    *out = crew_body_add_partials(partial, count);
}

/* 1.0 in *out when any value's exponent bits are all ones (NaN, ±inf), else 0.0. */
__global__ void k_nonfinite_partial(const float *x, int64_t n, double *partial)
{
    __shared__ int bad[CUDA_THREADS];
    int64_t lo, hi;
    crew_body_stretch(n, CUDA_PARTIALS, blockIdx.x, &lo, &hi);
    bad[threadIdx.x] = crew_body_nonfinite_thread(x, lo, hi, threadIdx.x, blockDim.x);
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) bad[threadIdx.x] |= bad[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = bad[0];
}

/* The figure at d_partial[CUDA_PARTIALS] to the host. */
static crew_status fetch_result(cuda_ctx *c, const char *what, double *out)
{
    cuda_launched(c, what);
    cudaError_t e = cudaMemcpyAsync(c->h_result, c->d_partial + CUDA_PARTIALS, sizeof(double), cudaMemcpyDeviceToHost,
                                    c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    crew_status s = check(c, e, what);
    if (!s) *out = *c->h_result;
    return s;
}

static crew_status cuda_sum(void *ctx, const float *x, int64_t n, double *out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    k_sum_serial<<<1, 1, 0, c->stream>>>(x, n, c->d_partial + CUDA_PARTIALS);
    return fetch_result(c, "sum", out);
}

/* The state to the device, the pieces (the chunk under way, whole chunks CUDA_SQ_CHUNKS at a time,
 * the tail), the state back: a piece that ends on a chunk's end closes it. */
static crew_status cuda_sum_squares_lanes(void *ctx, const float *x, int64_t n, double *state)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    double *d_sq = c->d_sq, *d_sums = c->d_sq + CREW_SQ_STATE;
    cudaError_t e = cudaMemcpyAsync(d_sq, state, CREW_SQ_STATE * sizeof(double), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return check(c, e, "sum of squares");
    int64_t i = 0, at = (int64_t)state[CREW_SQ_FILLED];
    if (at > 0 && n > 0) {
        const int64_t m = CREW_SQ_CHUNK - at < n ? CREW_SQ_CHUNK - at : n;
        k_sq_piece<<<1, CREW_SQ_LANES, 0, c->stream>>>(x, m, d_sq);
        i = m;
    }
    while (n - i >= CREW_SQ_CHUNK) {
        const int64_t chunks = (n - i) / CREW_SQ_CHUNK < CUDA_SQ_CHUNKS ? (n - i) / CREW_SQ_CHUNK : CUDA_SQ_CHUNKS;
        k_sq_chunks<<<(unsigned)chunks, CREW_SQ_LANES, 0, c->stream>>>(x + i, d_sums);
        k_sq_add<<<1, 1, 0, c->stream>>>(d_sums, chunks, d_sq);
        i += chunks * CREW_SQ_CHUNK;
    }
    if (i < n) k_sq_piece<<<1, CREW_SQ_LANES, 0, c->stream>>>(x + i, n - i, d_sq);
    cuda_launched(c, "sum of squares");
    e = cudaMemcpyAsync(state, d_sq, CREW_SQ_STATE * sizeof(double), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return check(c, e, "sum of squares");
}

static crew_status cuda_sum_squares(void *ctx, const float *x, int64_t n, double *out)
{
    double state[CREW_SQ_STATE] = {0.0};
    CREW_TRY(cuda_sum_squares_lanes(ctx, x, n, state));
    *out = crew_sq_state_sum(state);
    return CREW_OK;
}

static crew_status cuda_all_finite(void *ctx, const float *x, int64_t n, int *out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    k_nonfinite_partial<<<CUDA_PARTIALS, CUDA_THREADS, 0, c->stream>>>(x, n, c->d_partial);
    k_add_partials<<<1, 1, 0, c->stream>>>(c->d_partial, CUDA_PARTIALS, c->d_partial + CUDA_PARTIALS);
    double bad = 0.0;
    crew_status s = fetch_result(c, "finiteness check", &bad);
    if (!s) *out = bad == 0.0;
    return s;
}

/* The CPU's XXH3-64 over the bytes, brought to the host: equal bytes, equal hashes, on every
 * device of every kind (the drift check runs every so many steps, not every step). */
static crew_status cuda_hash(void *ctx, const void *x, int64_t n, crew_dtype t, uint64_t *out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    size_t bytes = (size_t)n * crew_dtype_size(t);
    if (bytes > c->hash_cap) {
        cudaFreeHost(c->h_hash);
        c->h_hash = NULL;
        c->hash_cap = 0;
        if (cudaMallocHost(&c->h_hash, bytes) != cudaSuccess) {
            cudaGetLastError();
            return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cuda:%d: no page-locked memory to hash %zu bytes", c->device,
                               bytes);
        }
        c->hash_cap = bytes;
    }
    cudaError_t e = bytes ? cudaMemcpyAsync(c->h_hash, x, bytes, cudaMemcpyDeviceToHost, c->stream) : cudaSuccess;
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    crew_status s = check(c, e, "hash");
    if (!s) *out = (uint64_t)XXH3_64bits(c->h_hash, bytes);
    return s;
}

/* ------------------------------------------------------------------ counts (embedding, loss) */

crew_status cuda_count_reserve(cuda_ctx *c, int64_t rows)
{
    if ((size_t)rows <= c->count_cap) return CREW_OK;
    cudaFree(c->d_count);
    c->d_count = NULL;
    c->count_cap = 0;
    if (cudaMalloc(&c->d_count, (size_t)rows * sizeof(long long)) != cudaSuccess) {
        cudaGetLastError();
        return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cuda:%d: no device memory for %lld row flags", c->device,
                           (long long)rows);
    }
    c->count_cap = (size_t)rows;
    return CREW_OK;
}

__global__ void k_count(const long long *flags, int64_t rows, long long *out) { *out = crew_body_count(flags, rows); }

crew_status cuda_count_flags(cuda_ctx *c, int64_t rows, int64_t *out, const char *what)
{
    k_count<<<1, 1, 0, c->stream>>>(c->d_count, rows, (long long *)(c->d_partial + CUDA_PARTIALS));
    cuda_launched(c, what);
    cudaError_t e = cudaMemcpyAsync(c->h_count, c->d_partial + CUDA_PARTIALS, sizeof(long long), cudaMemcpyDeviceToHost,
                                    c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    crew_status s = check(c, e, what);
    if (!s) *out = (int64_t)*c->h_count;
    return s;
}

/* ------------------------------------------------------------------ copies and GEMM */

static void cuda_copy(void *ctx, float *dst, const float *src, int64_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n <= 0 || dst == src) return;
    cuda_enter(c);
    size_t bytes = (size_t)n * sizeof(float);
    int overlap = dst < src + n && src < dst + n;
    if (!overlap) {
        cuda_note(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
        return;
    }
    /* memmove's meaning through a buffer of the context's */
    if (bytes > c->move_cap) {
        cudaStreamSynchronize(c->stream);
        cudaFree(c->d_move);
        c->d_move = NULL;
        c->move_cap = 0;
        cudaError_t e = cudaMalloc((void **)&c->d_move, bytes);
        if (e != cudaSuccess) {
            cuda_note(c, e, "copy (overlapping ranges)");
            return;
        }
        c->move_cap = bytes;
    }
    cuda_note(c, cudaMemcpyAsync(c->d_move, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
    cuda_note(c, cudaMemcpyAsync(dst, c->d_move, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
}

/* Row-major C = α op(A)·op(B) + β C is column-major Cᵀ = α op(B)ᵀ·op(A)ᵀ + β Cᵀ: cuBLAS gets the
 * operands swapped, each with its own transpose flag, and the same leading dimensions. */
/* to nearest, ties to even: core/bf16.h's rounding (crew_body_bf16_of), NaNs and all */
__global__ void k_to_bf16(const float *x, crew_bf16 *y, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        crew_body_to_bf16(x, y, i);
}

/* Operand `which` (0: a, 1: b) of a GEMM in bf16: every value its `count` matrices of rows × cols
 * (leading dimension ld, stride apart) span, rounded into the context's buffer, where the same
 * offsets address them; NULL when there is no room (noted as the pending error). */
static const __nv_bfloat16 *rounded_operand(cuda_ctx *c, int which, const float *x, int64_t rows, int64_t cols,
                                            int64_t ld, int64_t stride, int64_t count)
{
    const int64_t span = (count - 1) * stride + (rows - 1) * ld + cols;
    if (span > c->bf16_cap[which]) {
        cuda_free(c, c->bf16_ops[which]);
        c->bf16_ops[which] = NULL;
        c->bf16_cap[which] = 0;
        crew_status s = cuda_alloc(c, CREW_DT_F32, (span + 1) / 2, &c->bf16_ops[which]);
        if (s) {
            crew_status_free(s);
            cuda_note(c, cudaErrorMemoryAllocation, "a bfloat16 GEMM's operands");
            return NULL;
        }
        c->bf16_cap[which] = span;
    }
    __nv_bfloat16 *y = (__nv_bfloat16 *)c->bf16_ops[which];
    k_to_bf16<<<cuda_blocks(span), CUDA_THREADS, 0, c->stream>>>(x, (crew_bf16 *)y, span);
    cuda_launched(c, "rounding a GEMM's operands to bfloat16");
    return y;
}

void cuda_gemm_typed(cuda_ctx *c, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                     crew_dtype a_type, int64_t lda, int64_t stride_a, const void *b, crew_dtype b_type, int64_t ldb,
                     int64_t stride_b, float beta, float *out, int64_t ldc, int64_t stride_c, int64_t count)
{
    if (m <= 0 || n <= 0 || count <= 0) return;
    /* configure's sum_block: the batch's rows in blocks, as replicas of those blocks would compute
     * them (cpu_gemm.c): a GEMM of a's rows block by block, a sum over them (aᵀ·b) each block's
     * product added to the sum so far */
    if (c->sum_block > 0 && !ta && m > c->sum_block) {
        const size_t ea = crew_dtype_size(a_type);
        const int64_t saved = c->sum_block;
        c->sum_block = 0;
        for (int64_t m0 = 0; m0 < m; m0 += saved)
            cuda_gemm_typed(c, ta, tb, m - m0 < saved ? m - m0 : saved, n, k, alpha, (const char *)a + (size_t)(m0 * lda) * ea,
                            a_type, lda, stride_a, b, b_type, ldb, stride_b, beta, out + m0 * ldc, ldc, stride_c, count);
        c->sum_block = saved;
        return;
    }
    if (c->sum_block > 0 && k > c->sum_block && ta && !tb) {
        const size_t ea = crew_dtype_size(a_type), eb = crew_dtype_size(b_type);
        for (int64_t k0 = 0; k0 < k; k0 += c->sum_block) {
            const int64_t kb = k - k0 < c->sum_block ? k - k0 : c->sum_block;
            const char *ak = (const char *)a + (size_t)(ta ? k0 * lda : k0) * ea;
            const char *bk = (const char *)b + (size_t)(tb ? k0 : k0 * ldb) * eb;
            const int64_t saved = c->sum_block;
            c->sum_block = 0;
            cuda_gemm_typed(c, ta, tb, m, n, kb, alpha, ak, a_type, lda, stride_a, bk, b_type, ldb, stride_b,
                            k0 ? 1.0f : beta, out, ldc, stride_c, count);
            c->sum_block = saved;
        }
        return;
    }
    cublasStatus_t st;
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int a16 = a_type == CREW_DT_BF16, b16 = b_type == CREW_DT_BF16;
    if (c->bf16 || a16 || b16) { /* the CPU's bf16: operands rounded to nearest even, bfloat16 GEMM, float32 sums */
        const __nv_bfloat16 *ra = a16 ? (const __nv_bfloat16 *)a
                                      : rounded_operand(c, 0, (const float *)a, ta ? k : m, ta ? m : k, lda, stride_a,
                                                        count);
        const __nv_bfloat16 *rb = b16 ? (const __nv_bfloat16 *)b
                                      : rounded_operand(c, 1, (const float *)b, tb ? n : k, tb ? k : n, ldb, stride_b,
                                                        count);
        if (!ra || !rb) return;
        st = cublasGemmStridedBatchedEx(c->blas, opb, opa, (int)n, (int)m, (int)k, &alpha, rb, CUDA_R_16BF, (int)ldb,
                                        stride_b, ra, CUDA_R_16BF, (int)lda, stride_a, &beta, out, CUDA_R_32F, (int)ldc,
                                        stride_c, (int)count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else if (count == 1)
        st = cublasSgemm(c->blas, opb, opa, (int)n, (int)m, (int)k, &alpha, (const float *)b, (int)ldb,
                         (const float *)a, (int)lda, &beta, out, (int)ldc);
    else
        st = cublasSgemmStridedBatched(c->blas, opb, opa, (int)n, (int)m, (int)k, &alpha, (const float *)b, (int)ldb,
                                       stride_b, (const float *)a, (int)lda, stride_a, &beta, out, (int)ldc, stride_c,
                                       (int)count);
    if (st != CUBLAS_STATUS_SUCCESS) cuda_note(c, cudaErrorUnknown, "cuBLAS sgemm");
}

void cuda_gemm_strided(cuda_ctx *c, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                       float *out, int64_t ldc, int64_t stride_c, int64_t count)
{
    cuda_gemm_typed(c, ta, tb, m, n, k, alpha, a, CREW_DT_F32, lda, stride_a, b, CREW_DT_F32, ldb, stride_b, beta, out,
                    ldc, stride_c, count);
}

static void cuda_gemm(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c_out,
                      int64_t ldc)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    cuda_gemm_strided(c, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c_out, ldc, 0, 1);
}

static void cuda_gemm_typed_op(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const void *a, crew_dtype a_type, int64_t lda, const void *b, crew_dtype b_type,
                               int64_t ldb, float beta, float *c_out, int64_t ldc)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    cuda_gemm_typed(c, trans_a, trans_b, m, n, k, alpha, a, a_type, lda, 0, b, b_type, ldb, 0, beta, c_out, ldc, 0, 1);
}

static void cuda_to_bf16(void *ctx, const float *x, crew_bf16 *y, int64_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_enter(c);
    if (n <= 0) return;
    k_to_bf16<<<cuda_blocks(n), CUDA_THREADS, 0, c->stream>>>(x, y, n);
    cuda_launched(c, "to_bf16");
}

static crew_status cuda_configure(void *ctx, const crew_device_options *o)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (o->precision != CREW_PRECISION_FP32 && o->precision != CREW_PRECISION_BF16)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cuda:%d: unknown precision %d", c->device, (int)o->precision);
    if (o->sum_block < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cuda:%d: sums in blocks of %lld terms", c->device,
                           (long long)o->sum_block);
    c->bf16 = o->precision == CREW_PRECISION_BF16;
    c->sum_block = o->sum_block;
    if (o->conv_library && !c->conv) return cuda_conv_open(c);
    return CREW_OK;
}

/* ------------------------------------------------------------------ the table */

/* The table: the compute ops are cuda_kernels.cu's (cuda_kernel_ops), the rest this file's and
 * cuda_conv.cu's. Built once, before main, by name rather than by position. */
static crew_backend_ops make_cuda_ops(void)
{
    crew_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.destroy = cuda_destroy;
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.host_alloc = cuda_host_alloc;
    o.host_free = cuda_host_free;
    o.memory_used = cuda_memory_used;
    o.upload = cuda_upload;
    o.download = cuda_download;
    o.queue_create = cuda_queue_create;
    o.queue_destroy = cuda_queue_destroy;
    o.queue_wait = cuda_queue_wait;
    o.sync = cuda_sync;
    /* .host_alias: a GPU's memory is not the host's; its communicator stages through the host */
    /* .in_place: its kernels read device memory only; the loader's micro-batches are uploaded */
    o.sum = cuda_sum;
    o.sum_squares = cuda_sum_squares;
    o.sum_squares_lanes = cuda_sum_squares_lanes;
    o.all_finite = cuda_all_finite;
    o.hash = cuda_hash;
    o.copy = cuda_copy;
    o.gemm = cuda_gemm;
    o.gemm_typed = cuda_gemm_typed_op;
    o.to_bf16 = cuda_to_bf16;
    o.conv_supported = cuda_conv_supported;
    o.conv_forward = cuda_conv_forward;
    o.conv_backward_data = cuda_conv_backward_data;
    o.conv_backward_filter = cuda_conv_backward_filter;
    o.configure = cuda_configure;
    cuda_kernel_ops(&o);
    return o;
}

static const crew_backend_ops cuda_ops = make_cuda_ops();

/* ------------------------------------------------------------------ the device kind */

extern "C" int crew_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver, or no GPU: none here */
        return 0;
    }
    return n;
}

/* What the planner may count on: the GPU's memory free now (cudaMemGetInfo, after this process's
 * context and whatever other processes hold), else its total. The calling thread's current GPU is
 * put back as it was. */
extern "C" int64_t crew_cuda_device_memory(int index)
{
    int n = crew_cuda_device_count(), before = 0;
    cudaDeviceProp p;
    if (n < 1 || cudaGetDeviceProperties(&p, index % n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    size_t free_b = 0, total_b = 0;
    const int had = cudaGetDevice(&before) == cudaSuccess;
    if (cudaSetDevice(index % n) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = 0;
    if (had) cudaSetDevice(before);
    cudaGetLastError();
    return free_b > 0 ? (int64_t)free_b : (int64_t)p.totalGlobalMem;
}

extern "C" crew_status crew_cuda_backend_create(int index, crew_backend *out)
{
    memset(out, 0, sizeof *out);
    int n = crew_cuda_device_count();
    if (n < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "this machine has no CUDA GPU visible (no driver, or "
                           "CUDA_VISIBLE_DEVICES hides them)");
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return CREW_OOM();
    /* More replicas than GPUs share them round-robin, each with a stream of its own: what the tests
     * of the ordered reduction on one GPU need (--devices cuda:2 on one GPU). */
    c->device = index % n;
    pthread_mutex_init(&c->mu, NULL);
    cuda_enter(c);
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->d_partial, (CUDA_PARTIALS + 1) * sizeof(double));
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->d_sq, (CREW_SQ_STATE + CUDA_SQ_CHUNKS) * sizeof(double));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&c->h_result, sizeof(double));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&c->h_count, sizeof(long long));
    crew_status s = e == cudaSuccess ? CREW_OK : check(c, e, "opening the GPU");
    if (!s && (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
               /* fp32 products in fp32: no TF32 unless a user asks for it (docs/ARCHITECTURE.md) */
               cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS))
        s = crew_errorf(CREW_CODE_IO, "cuda:%d: cuBLAS could not start", index);
    if (s) {
        cuda_destroy(c);
        return s;
    }
    out->ops = &cuda_ops;
    out->ctx = c;
    return CREW_OK;
}

extern "C" void *crew_cuda_backend_stream(const crew_backend *be, int *gpu)
{
    if (!be || be->ops != &cuda_ops) return NULL;
    const cuda_ctx *c = (const cuda_ctx *)be->ctx;
    if (gpu) *gpu = c->device;
    return (void *)c->stream;
}

extern "C" void crew_cuda_describe(char *buf, size_t len)
{
    if (!len) return;
    int runtime = 0, driver = 0, blas_major = 0, blas_minor = 0, blas_patch = 0;
    cudaRuntimeGetVersion(&runtime);
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    cublasGetProperty(MAJOR_VERSION, &blas_major);
    cublasGetProperty(MINOR_VERSION, &blas_minor);
    cublasGetProperty(PATCH_LEVEL, &blas_patch);
    int n = crew_cuda_device_count();
    char d[24] = "none";
    if (driver) snprintf(d, sizeof d, "%d.%d", driver / 1000, driver % 1000 / 10);
    char dnn[32] = "";
#ifdef CREW_HAVE_CUDNN
    size_t v = cudnnGetVersion(); /* major·10000 + minor·100 + patch since cuDNN 9 */
    snprintf(dnn, sizeof dnn, ", cuDNN %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
#endif
    size_t used = (size_t)snprintf(buf, len, "runtime %d.%d, driver %s, cuBLAS %d.%d.%d%s; ", runtime / 1000,
                                   runtime % 1000 / 10, d, blas_major, blas_minor, blas_patch, dnn);
    if (used < len && n == 0) snprintf(buf + used, len - used, "no GPU visible");
    for (int i = 0; i < n && used < len; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        used += (size_t)snprintf(buf + used, len - used, "%scuda:%d %s (%.1f GiB, compute %d.%d)", i ? ", " : "", i,
                                 p.name, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
    }
}
