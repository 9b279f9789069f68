/* cpu_ops.h — the CPU backend's functions, one file per family, gathered in cpu_backend.c. */
#ifndef CREW_CPU_OPS_H
#define CREW_CPU_OPS_H

#include <stdatomic.h>

#include "backend/backend.h"

/* One CPU device's context: it remembers the BLAS thread count it was opened with, counts its
 * memory, and in --precision bf16 keeps the rounded copies of the GEMMs' operands. */
typedef struct cpu_ctx {
    int blas_threads;
    /* memory_used: the rank's thread allocates, its communication thread may too */
    _Atomic int64_t in_use, peak;
    int bf16;                   /* GEMM operands rounded to bfloat16 (configure) */
    int64_t sum_block;          /* GEMMs' k and column sums' rows in blocks of this many (configure); 0: whole */
    float *round_a, *round_b;   /* their copies, grown as needed; the rank's thread alone computes */
    size_t cap_a, cap_b;
    float *widen[2];            /* bfloat16 activations widened to float for an op (cpu_widened) */
    size_t cap_widen[2];
    float *taps;                /* a sample with its padding, for the convolutions of few taps (cpu_conv_taps.c) */
    size_t cap_taps;
    float *head_t;              /* one head's kᵀ or vᵀ [d, T], for attention's tiles (cpu_attention.c) */
    size_t cap_head_t;
    float *block_sum;           /* one block's product of a sum in blocks (sum_block), before it joins the sum */
    size_t cap_block_sum;
    struct cpu_matmuls *matmuls; /* oneDNN's matmul primitives made for gemm_bias (cpu_matmul.c); NULL: none yet */
    int out_of_memory;          /* a GEMM found no room for its copies (or a convolution of few taps for
                                   its padded sample): the next sync, download or
                                   softmax_xent fails (the CPU runs every op at once and has no other
                                   way to fail one) */
    int gemm_status;            /* the first failed sgemm's or matmul's status (oneDNN's dnnl_status_t),
                                   reported the same way; 0: none */
    const char *gemm_failed;    /* which of the two failed: "sgemm" or "matmul" */
} cpu_ctx;

/* cpu_gemm.c: c[m, n] = alpha · op(a) · op(b) + beta · c (backend.h), in the device's precision */
void cpu_gemm(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
              int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* the same with operand a (b) rounded to bfloat16 first when round_a (round_b) is 1, whatever the
 * device's precision (an operand already in bfloat16's values needs no rounding) */
void cpu_gemm_rounding(void *ctx, int round_a, int round_b, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc);
/* n bfloat16 values as floats, in the context's buffer `slot` (0 or 1; valid until its next use);
 * NULL when there is no room (out_of_memory is set) */
float *cpu_widened(cpu_ctx *c, int slot, const crew_bf16 *x, int64_t n);
void cpu_gemm_typed(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                    crew_dtype a_type, int64_t lda, const void *b, crew_dtype b_type, int64_t ldb, float beta, float *c,
                    int64_t ldc);
/* c[m, n] = a · b + bias, the bias added to the finished sum (backend.h's gemm_bias) */
void cpu_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const void *a, crew_dtype a_type, int64_t lda,
                   const float *b, int64_t ldb, const float *bias, float *c, int64_t ldc);
/* cpu_matmul.c (oneDNN builds): the same in float32 by oneDNN's matmul primitive, made once per shape
 * and kept in the context; returns oneDNN's status (0: done) */
int cpu_matmul_bias(cpu_ctx *x, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                    int64_t ldb, const float *bias, float *c, int64_t ldc);
void cpu_matmul_free(struct cpu_matmuls *mm);
void cpu_to_bf16(void *ctx, const float *x, crew_bf16 *y, int64_t n);
crew_status cpu_configure(void *ctx, const crew_device_options *o);
/* The failure a GEMM left (out_of_memory), then cleared; CREW_OK without one. */
crew_status cpu_take_failure(void *ctx);
void cpu_gemm_free(cpu_ctx *c);
/* cpu_gemm_library.c: the build's GEMM library told the thread count a new device asks for
 * (OpenBLAS keeps one for the process; oneDNN's is set before each GEMM) */
void cpu_gemm_library_threads(int threads);


/* cpu_backend.c: the table itself, for backends that wrap it (cpu_guarded.c) */
extern const crew_backend_ops crew_cpu_ops;

/* cpu_window.c */
void cpu_im2col(void *ctx, const float *x, float *col, const crew_window *g);
void cpu_col2im(void *ctx, const float *col, float *dx, const crew_window *g);
/* cpu_conv_taps.c: convolutions of few taps, directly (backend.h) */
void cpu_conv_taps_forward(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                           const crew_window *g, int64_t out_c);
void cpu_conv_taps_filter_grad(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                               int64_t out_c);
void cpu_conv_taps_pool_forward(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                                int32_t *argmax, const crew_window *g, int64_t out_c);
void cpu_conv_taps_pool_grads(void *ctx, const float *x, const float *dy, const int32_t *argmax, float *dkernel,
                              float *dbias, const crew_window *g, int64_t out_c);
void cpu_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g, int relu_in);
void cpu_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g);
void cpu_avgpool_forward(void *ctx, const float *x, float *y, const crew_window *g);
void cpu_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *g);

/* cpu_conv_direct.c: cpu-remote's stand-in for a GPU's convolution library (backend.h, conv_*),
 * over host memory; supported: the geometries a library that pads both sides alike runs */
int cpu_conv_direct_supported(const crew_window *g);
void cpu_conv_direct_forward(const float *x, const float *kernel, float *y, const crew_window *g, int64_t out_c);
void cpu_conv_direct_backward_data(const float *dy, const float *kernel, float *dx, const crew_window *g,
                                   int64_t out_c);
void cpu_conv_direct_backward_filter(const float *x, const float *dy, float *dkernel, const crew_window *g,
                                     int64_t out_c);

/* cpu_activation.c */
void cpu_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n);
void cpu_act_backward(void *ctx, crew_activation act, const float *x, const float *y, const float *dy,
                      float *dx, int64_t n);
void cpu_act_forward_slope(void *ctx, crew_activation act, const float *x, float *y, float *slope, int64_t n);
void cpu_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                         float rate, uint64_t key, const int64_t *sample_ids);

/* cpu_norm.c */
void cpu_bn_col_sum(void *ctx, const float *x, int64_t rows, int64_t c, double *out);
void cpu_col_sqdev(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, double *out);
void cpu_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y);
void cpu_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                    const float *beta, float eps, float *y, int64_t rows, int64_t c);
void cpu_bn_backward_sums(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows,
                          int64_t c, double *sum_dy, double *sum_dy_xmu);
void cpu_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                     const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                     double count, float *dx, int64_t rows, int64_t c);
void cpu_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy,
                        const double *sum_dy_xmu, float *dgamma, float *dbeta, int64_t c);
void cpu_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                           float *y, float *mean, float *rstd, int64_t rows, int64_t c);
void cpu_layernorm_backward(void *ctx, const float *dy, const float *x, const float *gamma,
                            const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                            int64_t rows, int64_t c);

/* cpu_attention.c. Rows of the score matrix per block of the causal products where they are GEMMs
 * (bfloat16 products): a row's scores are the GEMM of its block (rows t0 .. t0 + 32, columns up to
 * the block's end), and a GEMM library's bits for a row may depend on the call's shape (oneDNN's
 * do), so a check that recomputes them (test_kernel_bodies) uses the same blocks. In float32 the
 * products are cpu_attention_tiles.c's, and such a check calls cpu_attention_scores. */
#define CPU_ATTENTION_BLOCK 32
/* out [T, T] = f · x·yᵀ over the causal part (rows t, columns s ≤ t, and what shares their tiles),
 * as cpu_attention_forward computes a head's scores (f = 1/√d, x = q, y = k) and its backward
 * d att (f = 1, x = dy, y = v) in float32; x and y [T, d] with leading dimensions ldx and ldy,
 * yt [d, T] scratch. */
void cpu_attention_scores(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t T, int64_t d, float f,
                          float *yt, float *out);
void cpu_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
                           int64_t batch, int64_t T, int64_t heads, int64_t head_dim);
void cpu_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
                            float *datt, float *dqkv, int64_t batch, int64_t T, int64_t heads, int64_t head_dim);

/* cpu_attention_tiles.c: one head's products in register tiles, each sum ascending over its index
 * (that file says which terms a causal range leaves out). out[t, s] = f · Σ_k x[t, k] · yt[k, s]
 * for rows [t0, t1), columns s ≤ t (and those sharing their vectors, below n); out[t, c] = f ·
 * Σ_{s ≤ t} a[t, s] · v[s, c] for rows [t0, t1), c < width; out[s, c] = f · Σ_{t ≥ s} a[t, s] ·
 * v[t, c] for s, t < n, c < width; xt [cols, rows] = xᵀ. */
void cpu_att_rows_dot(const float *x, int64_t ldx, const float *yt, int64_t ldy, int64_t k_n, float f, float *out,
                      int64_t ldo, int64_t t0, int64_t t1, int64_t n);
void cpu_att_rows_mul(const float *a, int64_t lda, const float *v, int64_t ldv, int64_t width, float f, float *out,
                      int64_t ldo, int64_t t0, int64_t t1);
void cpu_att_cols_mul(const float *a, int64_t lda, const float *v, int64_t ldv, int64_t width, float f, float *out,
                      int64_t ldo, int64_t n);
void cpu_att_transpose(const float *x, int64_t ldx, int64_t rows, int64_t cols, float *xt);

/* cpu_loss.c */
crew_status cpu_softmax_xent(void *ctx, const float *logits, const int32_t *labels, int64_t rows, int64_t classes,
                             float scale, float *row_loss, float *dlogits, int64_t *correct);
void cpu_softmax(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes);
crew_status cpu_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                  int64_t rows, int64_t dim, int64_t *bad);
void cpu_embedding_backward(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab,
                            int64_t rows, int64_t dim);

/* cpu_optim.c */
void cpu_sgd_update(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr,
                    float momentum, int nesterov, float weight_decay);
void cpu_adamw_update(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                      const crew_adamw_consts *k);
void cpu_adam_direction(void *ctx, const float *grad, float *m, float *v, float *u, int64_t n,
                        const crew_adamw_consts *k);

#endif
