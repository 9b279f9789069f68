/* cpu_gemm.c — the CPU backend's GEMM: oneDNN's sgemm (OpenBLAS's where the build chose it, see
 * CMakeLists.txt's CREW_GEMM), in float32 or with its operands rounded to bfloat16 first
 * (--precision bf16); and the bfloat16 activations a bf16 run keeps.
 *
 * bfloat16 products are exact in float32 (8-bit significands), so rounding the operands and
 * running sgemm gives what a GPU's bfloat16 tensor cores compute up to the order of the float32
 * sums: the numerics of mixed precision, to study and test on the CPU. It is slower than float32
 * here (a pass over both operands), so it is for checking a bf16 run before a GPU, not for speed. */
#if CREW_GEMM_ONEDNN
#include <dnnl.h>
#else
#include <cblas.h>
#endif
#include <stdlib.h>

#include "backend/body/elementwise.h"
#include "backend/cpu/cpu_ops.h"
#include "core/bf16.h"
#include "core/status.h"

/* The [rows, cols] block of x (leading dimension ld), rounded to bfloat16, contiguous in *buf
 * (grown as needed); NULL when there is no room. */
static const float *rounded(float **buf, size_t *cap, const float *x, int64_t rows, int64_t cols, int64_t ld)
{
    size_t need = (size_t)rows * (size_t)cols;
    if (need > *cap) {
        float *grown = realloc(*buf, (need ? need : 1) * sizeof *grown);
        if (!grown) return NULL;
        *buf = grown;
        *cap = need;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *src = x + r * ld;
        float *dst = *buf + r * cols;
        for (int64_t j = 0; j < cols; j++) dst[j] = crew_bf16_round(src[j]);
    }
    return *buf;
}

#if CREW_GEMM_ONEDNN
/* OpenMP's (oneDNN's threads are libgomp's): the thread count of the calling thread's next
 * parallel region, and so of its next sgemm. Declared here, as the OpenMP API has it, because
 * crew itself is not compiled as OpenMP code. */
void omp_set_num_threads(int threads);
#endif

/* c[m, n] = alpha · op(a)[m, k] · op(b)[k, n] + beta · c, row-major, in float32 by the build's
 * GEMM library, with the device's thread count. A failure (oneDNN refuses arguments or finds no
 * scratch memory) is the device's pending error (cpu_take_failure). */
static void sgemm(cpu_ctx *x, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
#if CREW_GEMM_ONEDNN
    if (k <= 0) { /* nothing summed: c = beta · c, as BLAS has it (beta 0 clears, NaNs too) */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    /* set on every call: a context's GEMMs may run on another thread than the last (evaluation,
     * a communication thread's caller), and the count is per thread */
    omp_set_num_threads(x ? x->blas_threads : 1);
    dnnl_status_t st =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (st != dnnl_success && x && !x->gemm_status) x->gemm_status = (int)st, x->gemm_failed = "sgemm";
#else
    (void)x;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)m,
                (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
#endif
}

void cpu_gemm(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
              int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cpu_ctx *x = ctx;
    const int bf16 = x && x->bf16;
    cpu_gemm_rounding(ctx, bf16, bf16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cpu_gemm_rounding(void *ctx, int round_a, int round_b, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc)
{
    cpu_ctx *x = ctx;
    if (x && (round_a || round_b) && m > 0 && n > 0 && k > 0) {
        /* op(a) is [m, k]: a holds m × k, or k × m when transposed; likewise b */
        const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
        const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
        const float *ra = round_a ? rounded(&x->round_a, &x->cap_a, a, a_rows, a_cols, lda) : a;
        const float *rb = ra && round_b ? rounded(&x->round_b, &x->cap_b, b, b_rows, b_cols, ldb) : b;
        if (!ra || !rb) {
            x->out_of_memory = 1;
            return;
        }
        if (round_a) a = ra, lda = a_cols;
        if (round_b) b = rb, ldb = b_cols;
    }
    /* configure's sum_block: the batch's rows in blocks, as replicas of those blocks would compute
     * them. A GEMM of a's rows (op(a) = a: the rows of the batch) runs block by block; a sum over
     * them (aᵀ·b: a weight gradient) computes each block's product, op(a)'s columns and op(b)'s
     * rows k0 .. k0 + kb, on its own, as a replica would, and adds it to the sum of those before,
     * as the ordered all-reduce does. Not by the library's beta = 1: how a library folds c into its
     * sums is its own (oneDNN's AVX2 kernels, at 128 terms a block, gave other bits than a product
     * and an add), and these sums must be the replicas' bits on every library. */
    const int64_t rows_block = x ? x->sum_block : 0;
    if (rows_block > 0 && !trans_a && m > rows_block) {
        for (int64_t m0 = 0; m0 < m; m0 += rows_block)
            sgemm(x, 0, trans_b, m - m0 < rows_block ? m - m0 : rows_block, n, k, alpha, a + m0 * lda, lda, b, ldb, beta,
                  c + m0 * ldc, ldc);
        return;
    }
    if (!(rows_block > 0 && k > rows_block && trans_a && !trans_b)) {
        sgemm(x, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    /* the first block as the first replica computes it (with the caller's beta); each other one
     * into block_sum, then added */
    sgemm(x, 1, 0, m, n, rows_block, alpha, a, lda, b, ldb, beta, c, ldc);
    const size_t need = (size_t)m * (size_t)n;
    if (need > x->cap_block_sum) {
        float *grown = realloc(x->block_sum, need * sizeof *grown);
        if (!grown) {
            x->out_of_memory = 1;
            return;
        }
        x->block_sum = grown;
        x->cap_block_sum = need;
    }
    for (int64_t k0 = rows_block; k0 < k; k0 += rows_block) {
        const int64_t kb = k - k0 < rows_block ? k - k0 : rows_block;
        sgemm(x, 1, 0, m, n, kb, alpha, a + k0 * lda, lda, b + k0 * ldb, ldb, 0.0f, x->block_sum, n);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = c[i * ldc + j] + x->block_sum[i * n + j];
    }
}

/* c[m, n] = a[m, k] · b[k, n] + bias in float32, the bias added to the finished sum: oneDNN's
 * matmul with the bias in its kernel (cpu_matmul.c), or the library's sgemm and then the bias,
 * which is the same order. Without a bias, sgemm with beta = 0. */
static void sgemm_bias(cpu_ctx *x, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                       int64_t ldb, const float *bias, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
#if CREW_GEMM_ONEDNN
    if (bias && k > 0) {
        int st = cpu_matmul_bias(x, m, n, k, a, lda, b, ldb, bias, c, ldc);
        if (st && !x->gemm_status) x->gemm_status = st, x->gemm_failed = "matmul";
        return;
    }
#endif
    sgemm(x, 0, 0, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    if (!bias) return;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] += bias[j];
}

void cpu_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const void *a, crew_dtype a_type, int64_t lda,
                   const float *b, int64_t ldb, const float *bias, float *c, int64_t ldc)
{
    cpu_ctx *x = ctx;
    const int a16 = a_type == CREW_DT_BF16;
    const float *fa = a, *fb = b;
    if (a16 && m > 0 && k > 0 && !(fa = cpu_widened(x, 0, a, (m - 1) * lda + k))) return;
    if ((x->bf16 || a16) && m > 0 && n > 0 && k > 0) { /* gemm_typed's rule: a bfloat16 product */
        if (!a16 && (fa = rounded(&x->round_a, &x->cap_a, fa, m, k, lda))) lda = k;
        if ((fb = rounded(&x->round_b, &x->cap_b, b, k, n, ldb))) ldb = n;
        if (!fa || !fb) {
            x->out_of_memory = 1;
            return;
        }
    }
    /* configure's sum_block: the batch's rows block by block, as gemm's */
    const int64_t block = x->sum_block > 0 && m > x->sum_block ? x->sum_block : m;
    for (int64_t m0 = 0; m0 < m; m0 += block)
        sgemm_bias(x, m - m0 < block ? m - m0 : block, n, k, fa + m0 * lda, lda, fb, ldb, bias, c + m0 * ldc, ldc);
}

crew_status cpu_configure(void *ctx, const crew_device_options *o)
{
    cpu_ctx *x = ctx;
    if (o->precision != CREW_PRECISION_FP32 && o->precision != CREW_PRECISION_BF16)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: unknown precision %d", (int)o->precision);
    if (o->conv_library)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the CPU has no convolution library: its convolutions are "
                           "im2col + OpenBLAS");
    if (o->sum_block < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: sums in blocks of %lld terms", (long long)o->sum_block);
    x->bf16 = o->precision == CREW_PRECISION_BF16;
    x->sum_block = o->sum_block;
    return CREW_OK;
}

crew_status cpu_take_failure(void *ctx)
{
    cpu_ctx *x = ctx;
    if (x && x->gemm_status) {
        int st = x->gemm_status;
        x->gemm_status = 0;
        return crew_errorf(st == 1 ? CREW_CODE_OUT_OF_MEMORY : CREW_CODE_INTERNAL,
                           "cpu backend: oneDNN's %s failed with status %d (%s)", x->gemm_failed, st,
                           st == 1 ? "out of memory" : st == 2 ? "invalid arguments" : "see dnnl_types.h");
    }
    if (!x || !x->out_of_memory) return CREW_OK;
    x->out_of_memory = 0;
    return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cpu backend: no memory for bfloat16 copies (a GEMM's operands "
                       "rounded, or bfloat16 activations widened), a convolution's padded sample, or a block's "
                       "product of a sum in blocks (crew verify's references)");
}

float *cpu_widened(cpu_ctx *c, int slot, const crew_bf16 *x, int64_t n)
{
    if ((size_t)n > c->cap_widen[slot]) {
        float *grown = realloc(c->widen[slot], (size_t)(n ? n : 1) * sizeof *grown);
        if (!grown) {
            c->out_of_memory = 1;
            return NULL;
        }
        c->widen[slot] = grown;
        c->cap_widen[slot] = (size_t)n;
    }
    for (int64_t i = 0; i < n; i++) c->widen[slot][i] = crew_bf16_widen(x[i]);
    return c->widen[slot];
}

/* A bfloat16 operand widened to float is exact, and already rounded: sgemm on the widened values
 * with the other operand rounded is the bfloat16 GEMM (backend.h). */
void cpu_gemm_typed(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                    crew_dtype a_type, int64_t lda, const void *b, crew_dtype b_type, int64_t ldb, float beta, float *c,
                    int64_t ldc)
{
    cpu_ctx *x = ctx;
    const int a16 = a_type == CREW_DT_BF16, b16 = b_type == CREW_DT_BF16;
    const float *fa = a, *fb = b;
    if (a16 && m > 0 && k > 0) /* the span of its rows: (rows − 1)·ld + cols values */
        fa = cpu_widened(x, 0, a, ((trans_a ? k : m) - 1) * lda + (trans_a ? m : k));
    if (b16 && k > 0 && n > 0)
        fb = cpu_widened(x, 1, b, ((trans_b ? n : k) - 1) * ldb + (trans_b ? k : n));
    if (!fa || !fb) return; /* out_of_memory is the device's pending error */
    const int bf16 = x->bf16 || a16 || b16;
    cpu_gemm_rounding(ctx, bf16 && !a16, bf16 && !b16, trans_a, trans_b, m, n, k, alpha, fa, lda, fb, ldb, beta, c, ldc);
}

void cpu_to_bf16(void *ctx, const float *x, crew_bf16 *y, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) crew_body_to_bf16(x, y, i); /* core/bf16.h's rounding */
}

void cpu_gemm_free(cpu_ctx *c)
{
    free(c->round_a);
    free(c->round_b);
    free(c->widen[0]);
    free(c->widen[1]);
    free(c->block_sum);
#if CREW_GEMM_ONEDNN
    cpu_matmul_free(c->matmuls);
#endif
}
