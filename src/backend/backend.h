/* backend.h — the one door from layers to computation.
 *
 * A backend is a table of functions plus a context pointer (ggml's shape): memory, GEMM and the
 * handful of fused ops the layers need. Layers call these and never include BLAS or CUDA
 * headers, so a CUDA backend is a second table, tested op by op against the CPU one.
 *
 * All sizes are element counts; all arrays are float32 row-major and live in the backend's
 * memory (alloc). Images are NHWC. "Accumulate" ops add into their output, the others overwrite.
 */
#ifndef CREW_BACKEND_H
#define CREW_BACKEND_H

#include <stdint.h>

#include "crew.h"

/* Geometry of a 2-D window op (convolution or pooling) over an NHWC batch. */
typedef struct crew_window {
    int64_t batch;
    int64_t in_h, in_w, in_c;   /* input  [batch, in_h, in_w, in_c] */
    int64_t out_h, out_w;       /* output [batch, out_h, out_w, out_c] */
    int64_t k_h, k_w;           /* window */
    int64_t stride_h, stride_w;
    int64_t pad_top, pad_left;  /* zero padding before the first row/column */
} crew_window;

typedef struct crew_backend_ops {
    const char *name;

    /* ---- memory */
    float *(*alloc)(void *ctx, int64_t n);                       /* zero-filled, NULL on failure */
    void (*free)(void *ctx, void *p);
    void (*upload)(void *ctx, float *dst, const float *host, int64_t n);
    void (*download)(void *ctx, float *host, const float *src, int64_t n);
    void (*copy)(void *ctx, float *dst, const float *src, int64_t n);
    void (*fill)(void *ctx, float *x, float value, int64_t n);

    /* ---- linear algebra
     * c[m, n] = alpha * op(a) · op(b) + beta * c;  op(a) is [m, k], op(b) is [k, n]. */
    void (*gemm)(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc);
    void (*axpby)(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y); /* y = a x + b y */
    void (*mul)(void *ctx, int64_t n, const float *a, const float *b, float *out);          /* out = a * b */
    double (*sum_squares)(void *ctx, const float *x, int64_t n);
    int (*all_finite)(void *ctx, const float *x, int64_t n);                                /* 1 if no NaN/inf */

    /* ---- rows × columns: x [rows, cols] */
    /* y[r,c] = b[c]: a layer preloads its bias, then accumulates the GEMM on top (beta = 1), which
     * saves the pass that zeroes C for beta = 0 and a separate pass adding the bias. */
    void (*broadcast_rows)(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols);
    void (*col_sum)(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate);

    /* ---- activations, elementwise over n values. backward gets the forward input x and output y.
     * forward may run in place (y == x), and then backward gets x == y: relu, tanh and sigmoid
     * take their derivative from y (crew_model_layer_in_place). */
    void (*act_forward)(void *ctx, crew_activation act, const float *x, float *y, int64_t n);
    void (*act_backward)(void *ctx, crew_activation act, const float *x, const float *y,
                         const float *dy, float *dx, int64_t n);

    /* ---- convolution as GEMM: col [batch*out_h*out_w, k_h*k_w*in_c] */
    void (*im2col)(void *ctx, const float *x, float *col, const crew_window *g);
    void (*col2im)(void *ctx, const float *col, float *dx, const crew_window *g); /* overwrites dx */

    /* ---- pooling (out_c == in_c). Max pooling: the first maximum in window order wins a tie
     * (row-major over the window), and padding never wins. Average pooling divides by the window cells inside the
     * image (padding excluded, as Keras and count_include_pad=False). argmax: [batch*out_h*out_w*c] */
    void (*maxpool_forward)(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g);
    void (*maxpool_backward)(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g);
    void (*avgpool_forward)(void *ctx, const float *x, float *y, const crew_window *g);
    void (*avgpool_backward)(void *ctx, const float *dy, float *dx, const crew_window *g);

    /* ---- dropout: row r of x [rows, cols] is sample sample_ids[r]; element j is kept when
     * uniform(key(seed, step, sample), j) >= rate, then scaled by 1/(1-rate). mask holds the
     * scale (0 or 1/(1-rate)) for the backward pass. */
    void (*dropout_forward)(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                            float rate, uint64_t key, const int64_t *sample_ids);

    /* ---- normalisation over the last axis of x [rows, c].
     * Batch norm is split in reductions and applications so that the reductions can be
     * all-reduced across replicas (synchronised batch norm) between them. */
    void (*col_sqdev)(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, float *out);
    void (*bn_forward)(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                       const float *beta, float eps, float *y, int64_t rows, int64_t c);
    /* sum_dy[c] = Σ dy, sum_dy_xmu[c] = Σ dy·(x − mean) */
    void (*bn_backward_sums)(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows,
                             int64_t c, float *sum_dy, float *sum_dy_xmu);
    /* dx from the sums over `count` rows in all; accumulates dgamma, dbeta from the local sums. */
    void (*bn_backward)(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                        const float *gamma, float eps, const float *sum_dy, const float *sum_dy_xmu,
                        double count, float *dx, int64_t rows, int64_t c);
    void (*bn_param_grads)(void *ctx, const float *var, float eps, const float *sum_dy,
                           const float *sum_dy_xmu, float *dgamma, float *dbeta, int64_t c);
    /* mean, rstd: [rows] saved for backward */
    void (*layernorm_forward)(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                              float *y, float *mean, float *rstd, int64_t rows, int64_t c);
    void (*layernorm_backward)(void *ctx, const float *dy, const float *x, const float *gamma,
                               const float *mean, const float *rstd, float *dx, float *dgamma,
                               float *dbeta, int64_t rows, int64_t c); /* accumulates dgamma, dbeta */

    /* ---- embedding: ids [rows] hold integer token ids as float; table [vocab, dim] */
    /* returns the number of ids outside [0, vocab) or not integers; their rows become zeros */
    int64_t (*embedding_forward)(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                 int64_t rows, int64_t dim);
    void (*embedding_backward)(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab,
                               int64_t rows, int64_t dim); /* accumulates; skips ids forward rejected */

    /* ---- loss: softmax cross-entropy on logits [rows, classes], labels [rows].
     * Writes the per-row loss and d(mean loss · scale)/d logits; counts rows whose arg-max equals
     * the label into *correct. */
    void (*softmax_xent)(void *ctx, const float *logits, const int32_t *labels, int64_t rows,
                         int64_t classes, float scale, float *row_loss, float *dlogits, int64_t *correct);
    void (*softmax)(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes);

    /* ---- optimiser updates over n parameters */
    void (*sgd_update)(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr,
                       float momentum, int nesterov, float weight_decay);
    void (*adamw_update)(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float bias_c1, float bias_c2);
} crew_backend_ops;

typedef struct crew_backend {
    const crew_backend_ops *ops;
    void *ctx;
} crew_backend;

/* The CPU backend. blas_threads is the OpenBLAS thread count used by its GEMMs (1 keeps
 * results independent of the machine; see docs/ARCHITECTURE.md, determinism). */
crew_status crew_cpu_backend_create(int blas_threads, crew_backend *out);
void crew_backend_destroy(crew_backend *be);

#endif
