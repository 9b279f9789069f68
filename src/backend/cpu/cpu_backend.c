/* cpu_backend.c — the CPU backend's table: memory, GEMM through OpenBLAS, simple vector ops.
 * Everything but GEMM is plain C loops that the compiler vectorises. */
#include <cblas.h>
#include <stdio.h>
#include <strings.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/status.h"

/* Memory is 64-byte aligned so vector loads never straddle cache lines. */
static float *cpu_alloc(void *ctx, int64_t n)
{
    (void)ctx;
    if (n <= 0) n = 1;
    size_t bytes = ((size_t)n * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void cpu_copy(void *ctx, float *dst, const float *src, int64_t n)
{
    (void)ctx;
    if (n > 0 && dst != src) memmove(dst, src, (size_t)n * sizeof(float));
}

static void cpu_fill(void *ctx, float *x, float value, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) x[i] = value;
}

static void cpu_gemm(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc)
{
    (void)ctx;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c,
                (blasint)ldc);
}

static void cpu_axpby(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) y[i] = alpha * x[i] + beta * y[i];
}

static void cpu_mul(void *ctx, int64_t n, const float *a, const float *b, float *out)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

static double cpu_sum_squares(void *ctx, const float *x, int64_t n)
{
    (void)ctx;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static int cpu_all_finite(void *ctx, const float *x, int64_t n)
{
    (void)ctx;
    /* NaN and ±inf are the floats whose exponent bits are all ones. An OR over integer tests
     * vectorises; a float sum (x·0) would be a serial dependency chain. */
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u); /* the bits, without breaking the aliasing rules */
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

static void cpu_broadcast_rows(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) memcpy(y + r * cols, bias, (size_t)cols * sizeof(float));
}

static void cpu_col_sum(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    (void)ctx;
    if (!accumulate) memset(out, 0, (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        for (int64_t c = 0; c < cols; c++) out[c] += row[c];
    }
}

static const crew_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .gemm = cpu_gemm,
    .axpby = cpu_axpby,
    .mul = cpu_mul,
    .sum_squares = cpu_sum_squares,
    .all_finite = cpu_all_finite,
    .broadcast_rows = cpu_broadcast_rows,
    .col_sum = cpu_col_sum,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .dropout_forward = cpu_dropout_forward,
    .col_sqdev = cpu_col_sqdev,
    .bn_forward = cpu_bn_forward,
    .bn_backward_sums = cpu_bn_backward_sums,
    .bn_backward = cpu_bn_backward,
    .bn_param_grads = cpu_bn_param_grads,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .softmax_xent = cpu_softmax_xent,
    .softmax = cpu_softmax,
    .sgd_update = cpu_sgd_update,
    .adamw_update = cpu_adamw_update,
};

crew_status crew_cpu_backend_create(int blas_threads, crew_backend *out)
{
    if (blas_threads < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu backend: blas threads must be >= 1, got %d",
                           blas_threads);
    /* OpenBLAS keeps one process-wide thread count; every replica asks for the same value. */
    openblas_set_num_threads(blas_threads);
    out->ops = &cpu_ops;
    out->ctx = NULL;
    return CREW_OK;
}

void crew_blas_describe(char *buf, size_t len)
{
    /* Which OpenBLAS build, and which of its kernels it picked for this CPU (DYNAMIC_ARCH builds
     * choose at load time): what a speed figure or a bug report needs to be read. */
    if (len) snprintf(buf, len, "%s, kernels for %s", openblas_get_config(), openblas_get_corename());
}

/* OpenBLAS kernel families (DYNAMIC_ARCH core names) that predate AVX2 and FMA. A build that does
 * not know a newer CPU model falls back to one of these: Debian 12's OpenBLAS 0.3.21 gives an Intel
 * Xeon of family 6 model 207 (Emerald Rapids) its Prescott (SSE3) kernels, and crew then trained
 * the example MLP 7.6x and the CNN 1.75x slower than with OPENBLAS_CORETYPE=SkylakeX (measured;
 * docs/PERFORMANCE.md). */
static const char *const pre_avx2_cores[] = {
    "Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Core2", "Penryn", "Dunnington", "Nehalem",
    "Sandybridge", "Atom", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Bulldozer",
    "Piledriver", "Steamroller", "Nano", "Unknown",
};

int crew_blas_check(char *buf, size_t len)
{
    if (len) buf[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
    const char *core = openblas_get_corename();
    if (!core || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    int old = 0;
    for (size_t i = 0; i < sizeof pre_avx2_cores / sizeof pre_avx2_cores[0]; i++)
        old |= strcasecmp(core, pre_avx2_cores[i]) == 0;
    if (!old) return 0;
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const char *want = avx512 ? "SkylakeX" : "Haswell", *forced = getenv("OPENBLAS_CORETYPE");
    if (len && forced && *forced)
        snprintf(buf, len, "OpenBLAS runs its %s kernels, as OPENBLAS_CORETYPE=%s asks, older than this CPU (it has "
                 "AVX2%s): matrix products may be several times slower than they could be; set "
                 "OPENBLAS_CORETYPE=%s or unset it", core, forced, avx512 ? " and AVX-512" : "", want);
    else if (len)
        snprintf(buf, len, "OpenBLAS runs its %s kernels, older than this CPU (it has AVX2%s): matrix products may "
                 "be several times slower than they could be. This OpenBLAS does not know the CPU model; set "
                 "OPENBLAS_CORETYPE=%s before starting crew", core, avx512 ? " and AVX-512" : "", want);
    return 1;
#else
    (void)buf;
    return 0;
#endif
}

void crew_backend_destroy(crew_backend *be)
{
    if (be) be->ops = NULL;
}
