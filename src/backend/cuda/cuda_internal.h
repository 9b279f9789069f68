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
 * every run (no atomics). */
#define CUDA_PARTIALS 256
#define CUDA_THREADS 256

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

/* ---- the compute ops (cuda_kernels.cu), in backend.h's order and signatures */
void cuda_fill(void *ctx, float *x, float value, int64_t n);
void cuda_axpby(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y);
void cuda_mul(void *ctx, int64_t n, const float *a, const float *b, float *out);
void cuda_broadcast_rows(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols);
void cuda_col_sum(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate);
void cuda_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n);
void cuda_act_backward(void *ctx, crew_activation act, const float *x, const float *y, const float *dy, float *dx,
                       int64_t n);
void cuda_im2col(void *ctx, const float *x, float *col, const crew_window *g);
void cuda_col2im(void *ctx, const float *col, float *dx, const crew_window *g);
void cuda_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g);
void cuda_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g);
void cuda_avgpool_forward(void *ctx, const float *x, float *y, const crew_window *g);
void cuda_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *g);
void cuda_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols, float rate,
                          uint64_t key, const int64_t *sample_ids);
void cuda_bn_col_sum(void *ctx, const float *x, int64_t rows, int64_t c, double *out);
void cuda_col_sqdev(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, double *out);
void cuda_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y);
void cuda_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                     const float *beta, float eps, float *y, int64_t rows, int64_t c);
void cuda_bn_backward_sums(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows, int64_t c,
                           double *sum_dy, double *sum_dy_xmu);
void cuda_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                      const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu, double count,
                      float *dx, int64_t rows, int64_t c);
void cuda_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy, const double *sum_dy_xmu,
                         float *dgamma, float *dbeta, int64_t c);
void cuda_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps, float *y,
                            float *mean, float *rstd, int64_t rows, int64_t c);
void cuda_layernorm_backward(void *ctx, const float *dy, const float *x, const float *gamma, const float *mean,
                             const float *rstd, float *dx, float *dgamma, float *dbeta, int64_t rows, int64_t c);
void cuda_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
                            int64_t batch, int64_t T, int64_t heads, int64_t head_dim);
void cuda_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
                             float *datt, float *dqkv, int64_t batch, int64_t T, int64_t heads, int64_t head_dim);
crew_status cuda_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                   int64_t rows, int64_t dim, int64_t *bad);
void cuda_embedding_backward(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab, int64_t rows,
                             int64_t dim);
crew_status cuda_softmax_xent(void *ctx, const float *logits, const int32_t *labels, int64_t rows, int64_t classes,
                              float scale, float *row_loss, float *dlogits, int64_t *correct);
void cuda_softmax(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes);
void cuda_sgd_update(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                     int nesterov, float weight_decay);
void cuda_adamw_update(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                       const crew_adamw_consts *k);

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
