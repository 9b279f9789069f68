/* cuda_internal.h — what the CUDA backend's two files share (C++, nvcc only): its context, the
 * pending-error rule, and the compute ops' launchers (cuda_kernels.cu) that cuda_backend.cu puts
 * in the table.
 *
 * One context is one GPU with one compute stream and one cuBLAS handle on it, owned by one rank
 * (backend.h); nothing here is global. Every entry point first makes the context's GPU current on
 * the calling thread (cudaSetDevice is per thread), so a rank's communication thread may call in
 * too. */
#ifndef CREW_BACKEND_CUDA_INTERNAL_H
#define CREW_BACKEND_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>

extern "C" {
#include "backend/backend.h"
}
#include "backend/body/reduce.h"

/* Device buffers' sizes, for memory_used: an open-addressing table keyed by address. */
typedef struct cuda_block {
    void *p;
    size_t bytes;
} cuda_block;

typedef struct cuda_ctx {
    int device;
    cudaStream_t stream;        /* the compute queue */
    cudaEvent_t done;           /* recorded on it by queue_wait */
    cublasHandle_t blas;
    int bf16;                   /* GEMMs on bfloat16 tensor cores, float32 accumulation (configure) */
    int64_t sum_block;          /* GEMMs' k and column sums' rows in blocks of this many (configure); 0: whole */
    struct cuda_conv *conv;     /* cuDNN's convolutions (cuda_conv.cu), when asked for; NULL: none */
    void *bf16_ops[2];          /* bf16: a GEMM's two operands rounded to bfloat16, grown as needed */
    int64_t bf16_cap[2];        /* their sizes, in bfloat16 values */
    void *sort_buf;             /* embedding backward's sort of the rows by id (cuda_kernels.cu) */
    size_t sort_bytes;
    pthread_mutex_t mu;         /* the pending error and the block table */
    cudaError_t pending;        /* the first failure of an enqueued op (cudaSuccess: none) */
    const char *pending_what;
    cuda_block *blocks;         /* [cap] */
    size_t n_blocks, cap;
    int64_t in_use, peak;
    /* scratch of the synchronous reductions and counts: device and pinned host */
    double *d_partial;          /* [CUDA_PARTIALS + 1] */
    double *d_sq;               /* [CREW_SQ_STATE + CUDA_SQ_CHUNKS]: sum_squares's state, then chunks' sums */
    double *h_result;           /* [1] pinned */
    long long *d_count;         /* [count_cap] per-row flags of the counting ops */
    long long *h_count;         /* [1] pinned */
    size_t count_cap;
    float *d_move;              /* copy()'s buffer for overlapping ranges */
    size_t move_cap;
    void *h_hash;               /* hash()'s pinned staging */
    size_t hash_cap;
} cuda_ctx;

struct crew_queue {
    cudaStream_t stream;
    cudaEvent_t done;
};

/* Blocks of the fixed-shape reductions: a fixed grid, so the order of every sum is the same on
 * every run (no atomics); backend/body/reduce.h, whose bodies they run, fixes it. CUDA_THREADS is
 * every launch's block size too. */
#define CUDA_PARTIALS CREW_BODY_PARTIALS
#define CUDA_THREADS CREW_BODY_THREADS
/* sum_squares's whole chunks summed side by side per launch (16M values) */
#define CUDA_SQ_CHUNKS 4096

/* Keeps the first failure of an enqueued op (the launch's error, or an earlier kernel's that
 * surfaced with it) to be returned by the next call that returns a crew_status. */
void cuda_note(cuda_ctx *c, cudaError_t e, const char *what);
/* After a launch: cudaGetLastError into the pending error. */
void cuda_launched(cuda_ctx *c, const char *what);
/* Makes the context's GPU current on this thread. */
void cuda_enter(cuda_ctx *c);

static inline unsigned cuda_blocks(int64_t n)
{
    int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

/* ---- the compute ops (cuda_kernels.cu, backend.h's signatures): their entries of the table */
void cuda_kernel_ops(crew_backend_ops *ops);

/* For the kernels file: a row-major GEMM on the context's stream (cuda_backend.cu), strided over
 * `count` matrices (count 1: one GEMM). */
void cuda_gemm_strided(cuda_ctx *c, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                       float *out, int64_t ldc, int64_t stride_c, int64_t count);
/* The same with each operand's element type (CREW_DT_F32 or CREW_DT_BF16, a bfloat16 activation
 * taken as it is): a bfloat16 GEMM, float operands rounded, when either is bfloat16 or the device
 * runs in bf16; else float32. */
void cuda_gemm_typed(cuda_ctx *c, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                     crew_dtype a_type, int64_t lda, int64_t stride_a, const void *b, crew_dtype b_type, int64_t ldb,
                     int64_t stride_b, float beta, float *out, int64_t ldc, int64_t stride_c, int64_t count);
/* The per-row flags of a counting op summed in order into *out (synchronous): rows flags at c->d_count. */
crew_status cuda_count_flags(cuda_ctx *c, int64_t rows, int64_t *out, const char *what);
/* c->d_count holds at least rows flags afterwards. */
crew_status cuda_count_reserve(cuda_ctx *c, int64_t rows);
/* The pending error (then cleared) as a status naming the GPU, or CREW_OK. */
crew_status cuda_take_pending(cuda_ctx *c);
/* Device buffers as the table's alloc and free make them (counted in memory_used). */
crew_status cuda_alloc(void *ctx, crew_dtype t, int64_t n, void **out);
void cuda_free(void *ctx, void *p);

/* ---- cuDNN's convolutions (cuda_conv.cu): the table's conv_* ops, and their state's lifecycle.
 * cuda_conv_open makes the state (the cuDNN handle on the context's stream); without cuDNN in the
 * build it says so. */
crew_status cuda_conv_open(cuda_ctx *c);
void cuda_conv_close(cuda_ctx *c);
int cuda_conv_supported(void *ctx, const crew_window *g, int64_t out_c);
void cuda_conv_forward(void *ctx, const float *x, const float *kernel, float *y, const crew_window *g, int64_t out_c);
void cuda_conv_backward_data(void *ctx, const float *dy, const float *kernel, float *dx, const crew_window *g,
                             int64_t out_c);
void cuda_conv_backward_filter(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                               int64_t out_c);

#endif
