/* backend.h — the one door from everything above to a device's memory and computation.
 *
 * A backend is a table of functions plus a context (ggml's shape): memory, transfers, queues,
 * GEMM and the fused ops the layers need. One backend instance is one device, owned by one rank
 * (src/train/rank.h), never shared: the CPU backend creates a context per instance, as a CUDA
 * backend holds one stream, cuBLAS handle and device per instance.
 *
 * Device memory. alloc returns device addresses: code above the backend may do arithmetic on them
 * (a tensor's rows, a parameter's slice of the flat buffer) and pass them to ops, but never read
 * or write through them. Values cross between host and device only by upload and download, and
 * questions about device values (a sum, a hash, "all finite?") are asked through the synchronous
 * reductions below. The CPU backend's device memory happens to be host memory; the guarded CPU
 * backend (cpu_guarded.c, device kind "cpu-guarded") makes every device address trap on host
 * access, which is how the test suite proves that nothing above this file relies on it.
 *
 * Queues and errors. Work is ordered on queues (a CUDA stream on a GPU); NULL names the device's
 * compute queue, on which every compute op and copy runs. Transfers may go on another queue
 * (queue_create), so that copies overlap compute; queue_wait orders two queues, sync waits for
 * one. Compute ops return nothing: they are enqueued, and a failure inside one (a kernel fault
 * on a GPU, an operand outside device memory in the guarded backend) is kept by the backend as
 * its pending error, the first one winning, and returned (then cleared) by the next call that
 * returns a crew_status: upload, download, queue_wait, sync, a reduction, embedding_forward,
 * softmax_xent. That is how CUDA reports an asynchronous error at the next synchronising call.
 * The CPU backend runs everything at once and never fails a compute op.
 *
 * All sizes are element counts; float arrays are float32 row-major. Images are NHWC.
 * "Accumulate" ops add into their output, the others overwrite. */
#ifndef CREW_BACKEND_H
#define CREW_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"

/* The element types of device and staging buffers. BF16: bfloat16 (float32's top 16 bits, as
 * uint16_t; core/bf16.h), the storage of activations kept in --precision bf16. */
typedef enum crew_dtype { CREW_DT_F32 = 1, CREW_DT_F64, CREW_DT_I32, CREW_DT_I64, CREW_DT_BF16 } crew_dtype;

static inline size_t crew_dtype_size(crew_dtype t)
{
    return t == CREW_DT_F64 || t == CREW_DT_I64 ? 8 : t == CREW_DT_BF16 ? 2 : 4;
}

/* The bits of one bfloat16 value (float32's top 16: core/bf16.h), in CREW_DT_BF16 buffers. */
typedef uint16_t crew_bf16;

/* An ordered stream of work on one device; NULL is the device's compute queue. */
typedef struct crew_queue crew_queue;

/* Geometry of a 2-D window op (convolution or pooling) over an NHWC batch. */
/* The most taps (k_h·k_w·in_c) a convolution may have to run by conv_taps_forward: a 3x3 window
 * over 3 channels. */
#define CREW_CONV_TAPS_MAX 27

typedef struct crew_window {
    int64_t batch;
    int64_t in_h, in_w, in_c;   /* input  [batch, in_h, in_w, in_c] */
    int64_t out_h, out_w;       /* output [batch, out_h, out_w, out_c] */
    int64_t k_h, k_w;           /* window */
    int64_t stride_h, stride_w;
    int64_t pad_top, pad_left;  /* zero padding before the first row/column */
} crew_window;

/* One AdamW step's scalars, computed in double by the optimiser (crew_adamw_consts_at) and
 * rounded to float once, so that every backend applies the same numbers. */
typedef struct crew_adamw_consts {
    float decay;           /* 1 − lr·weight_decay */
    float one_minus_beta1; /* the weight of m's lerp towards the gradient */
    float beta2, one_minus_beta2;
    float step_size;       /* lr / (1 − β1ᵗ) */
    float bias_c2_sqrt;    /* √(1 − β2ᵗ) */
    float eps;
} crew_adamw_consts;

struct crew_device_options; /* below: what a device is opened with */

/* sum_squares's order, the same on every device (sum_squares_lanes below): the buffer in chunks
 * of CREW_SQ_CHUNK values from its start; in a chunk, lane k of CREW_SQ_LANES adds the squares (in
 * double) of the values whose place in the chunk is k mod CREW_SQ_LANES, in order, and the chunk's
 * sum is its lanes' fixed pairwise tree (crew_sq_lanes_fold); the buffer's sum is its chunks' sums
 * added in order. Sixteen chains of adds, not one, so a CPU's loop is not held up by each add's
 * latency; chunks, so that a GPU sums them side by side; and the order depends on nothing but each
 * value's place, so a buffer cut anywhere and summed piece after piece gives the same bits.
 * The state carried between the pieces: the lanes of the chunk under way, the sum of the chunks
 * done, and how many values of the chunk under way are in (an integer, exact in a double). */
#define CREW_SQ_LANES 16
#define CREW_SQ_CHUNK 4096
enum { CREW_SQ_TOTAL = CREW_SQ_LANES, CREW_SQ_FILLED, CREW_SQ_STATE };
#ifdef __CUDACC__
#define CREW_SQ_FN static inline __host__ __device__
#else
#define CREW_SQ_FN static inline
#endif
CREW_SQ_FN double crew_sq_lanes_fold(const double *lanes)
{
    double l[CREW_SQ_LANES];
    for (int k = 0; k < CREW_SQ_LANES; k++) l[k] = lanes[k];
    for (int width = CREW_SQ_LANES / 2; width >= 1; width /= 2)
        for (int k = 0; k < width; k++) l[k] += l[k + width];
    return l[0];
}
/* The sum of squares a state stands for: the chunks done, then the one under way (0 when none) */
CREW_SQ_FN double crew_sq_state_sum(const double *state) { return state[CREW_SQ_TOTAL] + crew_sq_lanes_fold(state); }

typedef struct crew_backend_ops {
    const char *name;           /* the backend's name, for messages: "cpu", "cpu-guarded" */

    /* ---- lifecycle: frees the context. Every buffer and queue must have been freed first. */
    void (*destroy)(void *ctx);

    /* ---- memory. Device buffers come zero-filled; n = 0 gives a buffer of one element. Host
     * staging buffers are host memory the device copies from and to fastest (page-locked on a
     * GPU). free takes what alloc returned (NULL: nothing). */
    crew_status (*alloc)(void *ctx, crew_dtype t, int64_t n, void **out);
    void (*free)(void *ctx, void *p);
    crew_status (*host_alloc)(void *ctx, crew_dtype t, int64_t n, void **out);
    void (*host_free)(void *ctx, void *p);
    /* The bytes of the device's buffers (alloc's, not host_alloc's) as allocated (the CPU kinds
     * round each up to 64 bytes, as the memory planner counts them): those held now, and the most
     * held at once since the device was opened. The planner's figures are checked against it. */
    void (*memory_used)(void *ctx, int64_t *in_use, int64_t *peak);

    /* ---- transfers of n elements of type t.
     * upload: host → device, ordered on q (NULL: the compute queue). host must stay as it is
     *   until q has been synced: the copy may happen at any moment until then.
     * download: device → host, after all work enqueued on the compute queue; blocks until the
     *   values are in host. Returns the device's pending error, if any. */
    crew_status (*upload)(void *ctx, crew_queue *q, void *dst, const void *host, int64_t n, crew_dtype t);
    crew_status (*download)(void *ctx, void *host, const void *src, int64_t n, crew_dtype t);
    /* in_place: the device address at which this device's ops read n elements of type t of host
     *   staging memory (host_alloc's) where they lie, instead of an upload: a micro-batch the loader
     *   prepared becomes the model's input without a copy. host must stay as it is until the ops
     *   that read it have run. NULL in the table where the device cannot read host memory (a GPU)
     *   or must not (the guarded backend, whose ops take only its own allocations). */
    void *(*in_place)(void *ctx, void *host, int64_t n, crew_dtype t);

    /* ---- queues.
     * queue_wait: work enqueued on `waiter` from now on runs after all work enqueued on `on` so
     *   far (a CUDA event recorded on `on` and waited for by `waiter`).
     * sync: blocks until everything enqueued on q has run. download and the reductions wait for
     *   the compute queue only, never for another queue.
     * queue_destroy: uploads still pending on q may never happen; sync it first. */
    crew_status (*queue_create)(void *ctx, crew_queue **out);
    void (*queue_destroy)(void *ctx, crew_queue *q);
    crew_status (*queue_wait)(void *ctx, crew_queue *waiter, crew_queue *on);
    crew_status (*sync)(void *ctx, crew_queue *q);

    /* ---- for communicators of the same device kind only (the in-process communicator reads
     * and writes every rank's buffers from its threads): the host address of n elements of type
     * t at device address p. NULL in the table when the device's memory is not host-visible (a
     * GPU: its communicator is NCCL). The guarded backend returns NULL for a range that is not
     * inside one of its allocations; the plain CPU backend cannot tell, and returns p. Training
     * code never calls it; the layering test (tests/check_layers.sh) checks that only src/comm
     * does. May be called from any thread. */
    void *(*host_alias)(void *ctx, const void *p, int64_t n, crew_dtype t);

    /* ---- synchronous reductions: they wait for the compute queue and bring one figure back to
     * the host, so code above never reads device memory to ask a question about it. */
    /* *out = x[0] + x[1] + ... + x[n-1], summed in that order in double, so that a loss is the
     * same bits on every device (its n is a micro-batch's rows: a GPU may run it serially) */
    crew_status (*sum)(void *ctx, const float *x, int64_t n, double *out);
    /* *out = Σ x², in double, in the order above (CREW_SQ_CHUNK): the same bits on every device */
    crew_status (*sum_squares)(void *ctx, const float *x, int64_t n, double *out);
    /* sum_squares in parts: continues state [CREW_SQ_STATE] (host memory; zeros to begin) over
     * x[0 .. n), in the order above (CREW_SQ_CHUNK); crew_sq_state_sum(state) then gives
     * sum_squares's bits, so a buffer cut anywhere and summed piece after piece through the same
     * state gives the whole buffer's (the ranks of a sharded gradient hand the state on: the
     * clipping norm of ZeRO-2/3). NULL where the device has none: the caller then refuses. */
    crew_status (*sum_squares_lanes)(void *ctx, const float *x, int64_t n, double *state);
    /* *out = 1 when no value is NaN or infinite */
    crew_status (*all_finite)(void *ctx, const float *x, int64_t n, int *out);
    /* A 64-bit hash of the bytes of n elements (the drift check): equal bytes give equal hashes
     * on every device of the same kind. The CPU backends use XXH3-64. */
    crew_status (*hash)(void *ctx, const void *x, int64_t n, crew_dtype t, uint64_t *out);

    /* ---- compute: everything below is enqueued on the compute queue. */
    void (*copy)(void *ctx, float *dst, const float *src, int64_t n); /* the ranges may overlap */
    void (*fill)(void *ctx, float *x, float value, int64_t n);

    /* ---- linear algebra
     * c[m, n] = alpha * op(a) · op(b) + beta * c;  op(a) is [m, k], op(b) is [k, n]. */
    void (*gemm)(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc);
    /* The same with each operand float32 or bfloat16, as a_type and b_type say (CREW_DT_F32,
     * CREW_DT_BF16): a bfloat16 GEMM (float operands rounded, float32 sums) when either is bfloat16
     * or the device runs in bf16, else float32. A bfloat16 operand gives the bits gemm gives on a
     * device opened in bf16 for its values widened to float (test_backend_ops holds every backend
     * to it): --precision bf16 keeps the activations that only GEMMs read in bfloat16, at half
     * their bytes, without changing a bit of the run. */
    void (*gemm_typed)(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const void *a, crew_dtype a_type, int64_t lda, const void *b, crew_dtype b_type, int64_t ldb,
                       float beta, float *c, int64_t ldc);
    /* A layer's forward product: c[m, n] = a[m, k] · b[k, n] + bias, the row bias[n] added to every
     * row of the finished sum (a GEMM library's epilogue: oneDNN's matmul bias, cuBLAS's beta = 1
     * over rows of bias), so no pass seeds c first; bias NULL: the product alone (gemm's beta = 0).
     * a is float32 or bfloat16 (a_type), b float32, with gemm_typed's rule: a bfloat16 product when
     * a is bfloat16 or the device runs in bf16. */
    void (*gemm_bias)(void *ctx, int64_t m, int64_t n, int64_t k, const void *a, crew_dtype a_type, int64_t lda,
                      const float *b, int64_t ldb, const float *bias, float *c, int64_t ldc);
    /* y[i] = x[i] rounded to bfloat16 (to nearest, ties to even; core/bf16.h), i < n */
    void (*to_bf16)(void *ctx, const float *x, crew_bf16 *y, int64_t n);
    /* y = alpha x + beta y, computed as written for every beta (0 · NaN is NaN, unlike BLAS's
     * beta = 0); every caller runs it with y == x or a finite y */
    void (*axpby)(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y);
    void (*mul)(void *ctx, int64_t n, const float *a, const float *b, float *out);          /* out = a * b */

    /* ---- rows × columns: x [rows, cols] */
    /* y[r,c] = b[c]: the bias of a product gemm_bias does not make (a convolution library's, which
     * accumulates on top of it), and gemm_bias's own on a GPU (then a GEMM with beta = 1). */
    void (*broadcast_rows)(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols);
    void (*col_sum)(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate);

    /* ---- activations, elementwise over n values. backward gets the forward input x and output y.
     * forward may run in place (y == x), and then backward gets x == y: relu, tanh and sigmoid
     * take their derivative from y (crew_model_layer_in_place). backward may also write dx over
     * dy (dx == dy; a transformer block does), element by element. */
    void (*act_forward)(void *ctx, crew_activation act, const float *x, float *y, int64_t n);
    void (*act_backward)(void *ctx, crew_activation act, const float *x, const float *y,
                         const float *dy, float *dx, int64_t n);
    /* y = act(x) and slope = act'(x) in one pass, for a layer whose backward is then the product
     * dx = dy · slope (mul): the GELUs' derivative reads x alone, and act_backward's dx is that
     * very product, so mul gives its bits, while the exponential forward and backward both take
     * is computed once (a transformer block's GELU backward took 4.5% of its step on an AVX2 CPU).
     * slope may be x (written over it, as the block does) or y may be; x is read before either is
     * written. For the other activations slope is their derivative too, without that promise:
     * relu's and sigmoid's act_backward multiply in another order or pass dy through. */
    void (*act_forward_slope)(void *ctx, crew_activation act, const float *x, float *y, float *slope, int64_t n);

    /* ---- convolution as GEMM: col [batch*out_h*out_w, k_h*k_w*in_c] */
    void (*im2col)(void *ctx, const float *x, float *col, const crew_window *g);
    void (*col2im)(void *ctx, const float *col, float *dx, const crew_window *g); /* overwrites dx */

    /* ---- pooling (out_c == in_c). Max pooling: the first maximum in window order wins a tie
     * (row-major over the window), and padding never wins. Average pooling divides by the window cells inside the
     * image (padding excluded, as Keras and count_include_pad=False). argmax: [batch*out_h*out_w*c]
     * relu_in 1: pools relu(x), the relu layer before it folded in (crew_model_layer_passes): the
     * window of relu(x)'s maximum and first arg-max, and argmax −1 where that maximum is not
     * positive, so that backward sends nothing back where relu's backward would send 0. */
    void (*maxpool_forward)(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *g, int relu_in);
    void (*maxpool_backward)(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *g);
    void (*avgpool_forward)(void *ctx, const float *x, float *y, const crew_window *g);
    void (*avgpool_backward)(void *ctx, const float *dy, float *dx, const crew_window *g);

    /* ---- dropout: row r of x [rows, cols] is sample sample_ids[r] (device, [rows]); element j is
     * kept when uniform(crew_rng_key(key, sample, 0, 0), j) >= rate, then scaled by 1/(1-rate);
     * the layer makes key from (seed, step, layer). mask holds the scale (0 or 1/(1-rate)) for
     * the backward pass. */
    void (*dropout_forward)(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                            float rate, uint64_t key, const int64_t *sample_ids);

    /* ---- normalisation over the last axis of x [rows, c].
     * Batch norm is split in reductions and applications so that the reductions can be
     * all-reduced across replicas (synchronised batch norm) between them.
     * Its three reductions (bn_col_sum, col_sqdev, bn_backward_sums) give doubles [c], summed in
     * double, and synchronised batch norm all-reduces them as doubles. They run over every
     * position of every sample, tens of thousands of rows, of values mostly of one sign (x,
     * (x − mean)²), and the error of such a float32 sum grows with its length while barely
     * changing with its order: N replicas summing N shorter pieces drifted from one replica
     * summing all of it far beyond rounding (measured: a batch-norm CNN's step-1 loss 7e-6 apart,
     * its weights 10% apart after 8 AdamW steps), which crew verify's reversed-rows reference
     * cannot see. In double, N replicas' statistics and one replica's round to the same floats. */
    /* out[c] = Σ_r x[r,c] */
    void (*bn_col_sum)(void *ctx, const float *x, int64_t rows, int64_t c, double *out);
    /* out[c] = Σ_r (x[r,c] − mean[c])² */
    void (*col_sqdev)(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, double *out);
    /* y[i] = (float)(alpha · x[i]), i < n: a statistic from its sum */
    void (*bn_scale_sums)(void *ctx, int64_t n, double alpha, const double *x, float *y);
    void (*bn_forward)(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                       const float *beta, float eps, float *y, int64_t rows, int64_t c);
    /* sum_dy[c] = Σ dy, sum_dy_xmu[c] = Σ dy·(x − mean) */
    void (*bn_backward_sums)(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows,
                             int64_t c, double *sum_dy, double *sum_dy_xmu);
    /* dx from the sums over `count` rows in all. */
    void (*bn_backward)(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                        const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                        double count, float *dx, int64_t rows, int64_t c);
    /* accumulates dgamma, dbeta [c] from the local sums */
    void (*bn_param_grads)(void *ctx, const float *var, float eps, const double *sum_dy,
                           const double *sum_dy_xmu, float *dgamma, float *dbeta, int64_t c);
    /* mean, rstd: [rows] saved for backward */
    void (*layernorm_forward)(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                              float *y, float *mean, float *rstd, int64_t rows, int64_t c);
    void (*layernorm_backward)(void *ctx, const float *dy, const float *x, const float *gamma,
                               const float *mean, const float *rstd, float *dx, float *dgamma,
                               float *dbeta, int64_t rows, int64_t c); /* accumulates dgamma, dbeta */

    /* ---- causal multi-head self-attention (a transformer block's core) over qkv [batch, T, 3C]:
     * q | k | v along the last axis, head h in columns [h·d, (h+1)·d) of each (C = heads · d).
     * forward: att [batch, heads, T, T] = softmax over s ≤ t of q_t·k_s / √d, 0 for s > t (kept
     *   for backward); y [batch, T, C] = att · v, the heads side by side.
     * backward: dqkv [batch, T, 3C] (overwritten) from dy [batch, T, C]; datt [batch, heads, T, T]
     *   is scratch. Each sample is computed on its own, in a fixed order.
     * att_type is att's element type. F32: the scores are computed in att itself (scores may be
     *   NULL). BF16 (--precision bf16 stores them so, at half the memory: they are a GPT block's
     *   largest activation): the scores and their softmax are computed in float32 in scores
     *   [batch, heads, T, T] (forward's scratch: the block passes its datt), then att keeps them
     *   rounded to bfloat16, and the two products that read att (y = att·v, dv = attᵀ·dy) are
     *   bfloat16 GEMMs whatever the device's precision; backward's softmax reads the rounded
     *   values. On a device opened in bf16 that is the F32 path's arithmetic exactly: its GEMMs
     *   round att to the same values, so y, and dqkv from the same att values, are the same bits
     *   (test_backend_ops holds every backend to it).
     * forward with y NULL computes att alone (a block that recomputes its probabilities in
     * backward rather than keep them: the same bits as the full forward's att). */
    void (*attention_forward)(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
                              int64_t batch, int64_t T, int64_t heads, int64_t head_dim);
    void (*attention_backward)(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
                               float *datt, float *dqkv, int64_t batch, int64_t T, int64_t heads, int64_t head_dim);

    /* ---- embedding: ids [rows] hold integer token ids as float (-0 is 0); table [vocab, dim];
     * y [rows, dim]. Synchronous: *bad receives the number of ids outside [0, vocab) or not
     * integers, whose rows become zeros. */
    crew_status (*embedding_forward)(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                     int64_t rows, int64_t dim, int64_t *bad);
    void (*embedding_backward)(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab,
                               int64_t rows, int64_t dim); /* accumulates; skips ids forward rejected */

    /* ---- loss: softmax cross-entropy on logits [rows, classes], labels [rows] (device int32).
     * Writes the per-row loss [rows] and d(mean loss · scale)/d logits [rows, classes].
     * Synchronous: *correct receives the number of rows whose arg-max equals the label.
     * dlogits may be logits (written over them: a model keeps no second buffer as wide as a GPT's
     * logits), and softmax's probs may be logits; either way, the same bits. */
    crew_status (*softmax_xent)(void *ctx, const float *logits, const int32_t *labels, int64_t rows,
                                int64_t classes, float scale, float *row_loss, float *dlogits, int64_t *correct);
    void (*softmax)(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes);

    /* ---- optimiser updates over n parameters */
    void (*sgd_update)(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr,
                       float momentum, int nesterov, float weight_decay);
    void (*adamw_update)(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                         const crew_adamw_consts *k);
    /* Adam's moments as adamw_update advances them, and the direction they give into u (which may
     * be grad itself): u = (m / (1 − β1ᵗ)) / (√v / √(1 − β2ᵗ) + eps), with k.step_size = 1 / (1 − β1ᵗ);
     * k.decay is not used. LAMB's first half (optim/optimizer.c). */
    void (*adam_direction)(void *ctx, const float *grad, float *m, float *v, float *u, int64_t n,
                           const crew_adamw_consts *k);

    /* ---- convolution by the device's own library (cuDNN on a GPU), asked for with
     * crew_device_options.conv. conv_supported: 1 when the library runs this geometry with
     * out_c filters here, deterministically (the same bits run after run); 0 when it cannot (the
     * padding is not the same on both sides, no deterministic algorithm, not asked for), and the
     * layer runs im2col + GEMM. x [batch, in_h, in_w, in_c]; kernel [k_h, k_w, in_c, out_c] (the
     * layer's layout); y and dy [batch, out_h, out_w, out_c]. conv_forward adds into y (the layer
     * seeds it with the bias, as its GEMM does); the backward ops overwrite dx and dkernel. NULL in
     * the table of a device without such a library. */
    int (*conv_supported)(void *ctx, const crew_window *g, int64_t out_c);
    void (*conv_forward)(void *ctx, const float *x, const float *kernel, float *y, const crew_window *g,
                         int64_t out_c);
    void (*conv_backward_data)(void *ctx, const float *dy, const float *kernel, float *dx, const crew_window *g,
                               int64_t out_c);
    void (*conv_backward_filter)(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                                 int64_t out_c);

    /* ---- convolution of few taps, k_h·k_w·in_c ≤ CREW_CONV_TAPS_MAX (a first layer over one or
     * three channels), summed directly where im2col + GEMM would spend its time on passes over y
     * for a k that small (cpu_conv_taps.c says why and in what order). Layouts as the library's
     * ops above. conv_taps_forward writes y = bias (NULL: none) + the window's taps · kernel;
     * conv_taps_filter_grad overwrites dkernel with Σ over the batch's output positions of
     * taps ⊗ dy, each sample's sum on its own, added in sample order (with the device's
     * sum_block, in blocks of that many samples). NULL in the table of a device without them:
     * the layer runs im2col + GEMM. */
    void (*conv_taps_forward)(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                              const crew_window *g, int64_t out_c);
    void (*conv_taps_filter_grad)(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                                  int64_t out_c);
    /* The same convolution, then relu, then a 2x2 max pool whose windows tile the convolution's
     * output (out_h and out_w even), in one pass that never writes the convolution's output:
     * y [batch, out_h/2, out_w/2, out_c] and argmax as maxpool_forward with relu_in gives them
     * from conv_taps_forward's output (argmax indexes that output). conv_taps_pool_grads overwrites
     * dkernel and dbias (NULL: none) from the pooled gradient dy and argmax with the bits that
     * maxpool_backward, conv_taps_filter_grad and col_sum (over the output positions) give,
     * without writing the gradient of the convolution's output. NULL where the device has no
     * such loops: the layers run one after the other. */
    void (*conv_taps_pool_forward)(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                                   int32_t *argmax, const crew_window *g, int64_t out_c);
    void (*conv_taps_pool_grads)(void *ctx, const float *x, const float *dy, const int32_t *argmax, float *dkernel,
                                 float *dbias, const crew_window *g, int64_t out_c);

    /* ---- what the device was opened with beyond its index (crew_device_options: the precision of
     * every GEMM, attention's products included, and the convolutions' library). bf16 rounds the
     * GEMMs' operands to bfloat16 and accumulates in float32. An error for what the device does not
     * have; NULL: it has only the defaults. crew_device_open calls it. */
    crew_status (*configure)(void *ctx, const struct crew_device_options *o);
} crew_backend_ops;

typedef struct crew_backend {
    const crew_backend_ops *ops;
    void *ctx;
} crew_backend;

/* ---- conveniences over the table, for the common float32 case */

static inline crew_status crew_dev_alloc_f32(const crew_backend *be, int64_t n, float **out)
{
    void *p = NULL;
    crew_status s = be->ops->alloc(be->ctx, CREW_DT_F32, n, &p);
    *out = (float *)p;
    return s;
}

static inline void crew_dev_free(const crew_backend *be, void *p)
{
    if (p) be->ops->free(be->ctx, p);
}

static inline crew_status crew_dev_upload_f32(const crew_backend *be, float *dst, const float *host, int64_t n)
{
    return be->ops->upload(be->ctx, NULL, dst, host, n, CREW_DT_F32);
}

static inline crew_status crew_dev_download_f32(const crew_backend *be, float *host, const float *src, int64_t n)
{
    return be->ops->download(be->ctx, host, src, n, CREW_DT_F32);
}

/* n floats from one device to another (they may be of different kinds): through host memory. */
crew_status crew_dev_transfer_f32(const crew_backend *dst_be, float *dst, const crew_backend *src_be,
                                  const float *src, int64_t n);

/* ---- device kinds (registry.c): `--devices KIND:N` picks a kind by name. */

typedef struct crew_device_options {
    int blas_threads;           /* CPU kinds: OpenBLAS threads of the device's GEMMs [1] */
    crew_precision precision;   /* of its GEMMs [fp32] (configure) */
    int conv_library;           /* 1: convolutions by the device's library where it has one (cuDNN) [0] */
    /* The sums over a batch's rows, taken in blocks of this many rows, each block summed on its own
     * and added to the sum of those before, in order: the grouping that other blocks of the batch
     * give, as replicas of them would (crew verify's reference of other blocks without the
     * replicas). They are the GEMMs whose a is transposed and b is not (a layer's weight gradient,
     * xᵀ·dy, sums over k = its rows) and the column sums [0: whole] */
    int64_t sum_block;
} crew_device_options;

typedef struct crew_device_kind {
    const char *name;           /* "cpu" */
    const char *about;          /* one line, for lists and --version */
    /* Devices of this kind available to this process: CPU cores for the CPU kinds. */
    int (*available)(void);
    /* Opens device `index` (0-based) of this kind as a new backend instance. */
    crew_status (*open)(int index, const crew_device_options *o, crew_backend *out);
    /* The bytes of device `index`'s own memory (a GPU's: free now, cudaMemGetInfo), for the memory
     * planner; NULL for a kind whose devices share the host's memory (the CPU kinds). */
    int64_t (*memory_bytes)(int index);
    /* 1 when ranks on devices of this kind can talk through NCCL (cuda, in a build with NCCL). */
    int nccl;
    /* The name of its devices' convolution library ("cuDNN": cuda, in a build with cuDNN); NULL
     * for a kind without one. */
    const char *conv_library;
    /* 1: the library may be faster than im2col + GEMM, so --conv auto measures the two per layer
     * shape (cuDNN); 0: only a run that asks for it uses it (cpu-remote's stand-in, slow by design,
     * there for tests: cpu_conv_direct.c). */
    int conv_auto;
    /* 1: its devices run a first convolution with its relu and pool in one pass (conv_taps_pool_*,
     * the CPU kinds), so a run keeps no buffer for that convolution's output (crew_act_storage) */
    int conv_one_pass;
} crew_device_kind;

/* The kinds built in, in order; *n receives their count. */
const crew_device_kind *crew_device_kinds(int *n);
/* The kind called name, or NULL. */
const crew_device_kind *crew_device_kind_find(const char *name);
/* CREW_OK for a kind built in; else a CREW_CODE_INVALID_ARGUMENT error listing the kinds. */
crew_status crew_device_kind_check(const char *name);
/* Opens device `index` of the named kind (NULL: "cpu"); an unknown kind is a
 * CREW_CODE_INVALID_ARGUMENT error listing the kinds built in. */
crew_status crew_device_open(const char *kind, int index, const crew_device_options *o, crew_backend *out);
/* Destroys the backend instance (accepts a zeroed one). */
void crew_device_close(crew_backend *be);

/* The two CPU backends (cpu_backend.c, cpu_guarded.c). blas_threads is the OpenBLAS thread count
 * of their GEMMs (1 keeps results independent of the machine; docs/ARCHITECTURE.md, determinism).
 * A build configured with -DCREW_GUARD=ON opens the guarded one for kind "cpu" too, so that the
 * whole test suite runs on it (make guard). */
crew_status crew_cpu_backend_create(int blas_threads, crew_backend *out);
crew_status crew_cpu_guarded_backend_create(int blas_threads, crew_backend *out);
/* The guarded backend without host_alias ("cpu-remote"): a device the host cannot reach, as a
 * GPU is, so that its communication path (comm_staged.c) runs and is tested on the CPU. */
crew_status crew_cpu_remote_backend_create(int blas_threads, crew_backend *out);

#ifdef CREW_HAVE_CUDA
/* The CUDA backend (src/backend/cuda/, a build with the CUDA toolkit): GPU `index` of those this
 * process sees, its own stream and cuBLAS handle; and how many it sees (0 without a driver). */
crew_status crew_cuda_backend_create(int index, crew_backend *out);
int crew_cuda_device_count(void);
int64_t crew_cuda_device_memory(int index); /* its memory free now in bytes (else its total), 0 when it cannot tell */
/* For a communicator that enqueues on the rank's GPU itself (NCCL, src/comm/nccl/): the backend's
 * compute stream (a cudaStream_t) and its GPU in *gpu; NULL when `be` is not a CUDA backend. */
void *crew_cuda_backend_stream(const crew_backend *be, int *gpu);
#endif

#endif
