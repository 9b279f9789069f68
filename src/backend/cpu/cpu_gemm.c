/* cpu_gemm.c — the CPU backend's GEMM: OpenBLAS's sgemm, in float32 or with its operands rounded
 * to bfloat16 first (--precision bf16).
 *
 * bfloat16 products are exact in float32 (8-bit significands), so rounding the operands and
 * running sgemm gives what a GPU's bfloat16 tensor cores compute up to the order of the float32
 * sums: the numerics of mixed precision, to study and test on the CPU. It is slower than float32
 * here (a pass over both operands, and Debian's OpenBLAS has no bfloat16 GEMM), so it is for
 * checking a bf16 run before a GPU, not for speed. */
#include <cblas.h>
#include <stdlib.h>

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

void cpu_gemm(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
              int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cpu_ctx *x = ctx;
    if (x && x->bf16 && m > 0 && n > 0 && k > 0) {
        /* op(a) is [m, k]: a holds m × k, or k × m when transposed; likewise b */
        const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
        const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
        const float *ra = rounded(&x->round_a, &x->cap_a, a, a_rows, a_cols, lda);
        const float *rb = ra ? rounded(&x->round_b, &x->cap_b, b, b_rows, b_cols, ldb) : NULL;
        if (!ra || !rb) {
            x->out_of_memory = 1;
            return;
        }
        a = ra, lda = a_cols;
        b = rb, ldb = b_cols;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c,
                (blasint)ldc);
}

crew_status cpu_configure(void *ctx, const crew_device_options *o)
{
    cpu_ctx *x = ctx;
    if (o->precision != CREW_PRECISION_FP32 && o->precision != CREW_PRECISION_BF16)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: unknown precision %d", (int)o->precision);
    if (o->conv_library)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the CPU has no convolution library: its convolutions are "
                           "im2col + OpenBLAS");
    x->bf16 = o->precision == CREW_PRECISION_BF16;
    return CREW_OK;
}

crew_status cpu_take_failure(void *ctx)
{
    cpu_ctx *x = ctx;
    if (!x || !x->out_of_memory) return CREW_OK;
    x->out_of_memory = 0;
    return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cpu backend: no memory for the bfloat16 copies of a GEMM's operands");
}

void cpu_gemm_free(cpu_ctx *c)
{
    free(c->round_a);
    free(c->round_b);
}
