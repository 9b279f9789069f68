/* test_backend_cpu.c — the CPU backend's ops, one by one, against naive reference loops written
 * here in double precision (or against values worked out by hand, for the optimisers).
 *
 * Tolerances: the kernels compute in float32, so a result built from K products carries a
 * rounding error of about K·2^-24 relative to the magnitude of its terms. The problems here have
 * K ≤ 60 and terms of magnitude ≤ 1, so 1e-5 relative (+1e-6 absolute near zero) leaves a margin
 * of ~3x over the worst case while still catching any wrong index, which errs by O(1).
 * Ops that only move or pick values (im2col, max pooling, col sums of few rows) must be exact. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/rng.h"
#include "nn/window_geometry.h"

#define RTOL 1e-5
#define ATOL 1e-6

static crew_backend be;

static float *fbuf(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) abort();
    return p;
}

static void fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t key)
{
    crew_rng r = crew_rng_make(key);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * crew_rng_next_uniform(&r);
}

static int close_to(double got, double want, double rtol, double atol)
{
    return fabs(got - want) <= atol + rtol * fmax(fabs(got), fabs(want));
}

/* Index of the first element of got[n] not within tolerance of want[n], or -1. */
static int64_t first_mismatch(const float *got, const double *want, int64_t n, double rtol, double atol)
{
    for (int64_t i = 0; i < n; i++)
        if (!close_to(got[i], want[i], rtol, atol)) return i;
    return -1;
}

/* ------------------------------------------------------------------ gemm */

/* op(A) is [m, k]: A is stored [m, lda] untransposed or [k, lda] transposed. */
static double at(const float *a, int64_t ld, int trans, int64_t r, int64_t c)
{
    return trans ? a[c * ld + r] : a[r * ld + c];
}

static void check_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, float beta)
{
    /* Leading dimensions wider than the matrices: a kernel that ignored lda/ldb/ldc would read
     * or write the padding columns. */
    int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 4;
    int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
    float *a = fbuf(a_rows * lda), *b = fbuf(b_rows * ldb), *c = fbuf(m * ldc);
    double *want = calloc((size_t)(m * ldc), sizeof(double));
    fill_uniform(a, a_rows * lda, -1.0f, 1.0f, 11 + (uint64_t)ta);
    fill_uniform(b, b_rows * ldb, -1.0f, 1.0f, 13 + (uint64_t)tb);
    fill_uniform(c, m * ldc, -1.0f, 1.0f, 17);
    for (int64_t i = 0; i < m * ldc; i++) want[i] = c[i]; /* padding must stay as it was */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < k; p++) s += at(a, lda, ta, i, p) * at(b, ldb, tb, p, j);
            want[i * ldc + j] = alpha * s + beta * (double)c[i * ldc + j];
        }
    be.ops->gemm(be.ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    int64_t bad = first_mismatch(c, want, m * ldc, RTOL, ATOL);
    CHECK_MSG(bad < 0, "gemm ta=%d tb=%d m=%lld n=%lld k=%lld: c[%lld] = %.9g, want %.9g", ta, tb, (long long)m,
              (long long)n, (long long)k, (long long)bad, bad < 0 ? 0.0 : c[bad], bad < 0 ? 0.0 : want[bad]);
    free(a);
    free(b);
    free(c);
    free(want);
}

static void test_gemm(void)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 5, 7, 3, 1.0f, 0.0f);
            check_gemm(ta, tb, 9, 2, 13, 1.5f, 0.5f);
            check_gemm(ta, tb, 1, 11, 6, -0.75f, 1.0f);
        }
}

/* ------------------------------------------------------------------ convolution */

typedef struct conv_case {
    int64_t batch, h, w, c, f;
    int k_h, k_w, s_h, s_w;
    crew_padding pad;
    int64_t want_oh, want_ow, want_pt, want_pl; /* TensorFlow's sizes, worked out by hand */
} conv_case;

static const conv_case conv_cases[] = {
    {2, 5, 5, 2, 3, 3, 3, 1, 1, CREW_PAD_SAME, 5, 5, 1, 1},
    {2, 5, 6, 2, 3, 3, 3, 1, 1, CREW_PAD_VALID, 3, 4, 0, 0},
    {2, 5, 6, 3, 2, 3, 3, 2, 2, CREW_PAD_SAME, 3, 3, 1, 0},   /* pad totals 2 (h) and 1 (w) */
    {1, 6, 6, 2, 4, 3, 3, 2, 2, CREW_PAD_VALID, 2, 2, 0, 0},  /* last row/column unused */
    {2, 4, 5, 2, 3, 2, 2, 1, 1, CREW_PAD_SAME, 4, 5, 0, 0},   /* odd cell at the bottom/right */
    {3, 5, 5, 1, 2, 2, 3, 2, 1, CREW_PAD_SAME, 3, 5, 0, 1},
};

static crew_status plan(const conv_case *cc, crew_window *g)
{
    crew_shape in = crew_shape3(cc->h, cc->w, cc->c);
    crew_status s = crew_window_plan(&in, cc->k_h, cc->k_w, cc->s_h, cc->s_w, cc->pad, g);
    g->batch = cc->batch;
    return s;
}

/* Direct convolution: 7 nested loops, padding taken from the hand-worked case. */
static void conv_reference(const conv_case *cc, const float *x, const float *w, double *y)
{
    for (int64_t b = 0; b < cc->batch; b++)
        for (int64_t oh = 0; oh < cc->want_oh; oh++)
            for (int64_t ow = 0; ow < cc->want_ow; ow++)
                for (int64_t f = 0; f < cc->f; f++) {
                    double s = 0.0;
                    for (int64_t kh = 0; kh < cc->k_h; kh++)
                        for (int64_t kw = 0; kw < cc->k_w; kw++)
                            for (int64_t c = 0; c < cc->c; c++) {
                                int64_t ih = oh * cc->s_h - cc->want_pt + kh, iw = ow * cc->s_w - cc->want_pl + kw;
                                if (ih < 0 || ih >= cc->h || iw < 0 || iw >= cc->w) continue;
                                s += (double)x[((b * cc->h + ih) * cc->w + iw) * cc->c + c] *
                                     (double)w[((kh * cc->k_w + kw) * cc->c + c) * cc->f + f];
                            }
                    y[((b * cc->want_oh + oh) * cc->want_ow + ow) * cc->f + f] = s;
                }
}

static void check_conv(const conv_case *cc, int index)
{
    crew_window g;
    CHECK_OK(plan(cc, &g));
    CHECK_MSG(g.out_h == cc->want_oh && g.out_w == cc->want_ow && g.pad_top == cc->want_pt &&
                  g.pad_left == cc->want_pl,
              "conv case %d: geometry out (%lld, %lld) pad (%lld, %lld), want (%lld, %lld) pad (%lld, %lld)", index,
              (long long)g.out_h, (long long)g.out_w, (long long)g.pad_top, (long long)g.pad_left,
              (long long)cc->want_oh, (long long)cc->want_ow, (long long)cc->want_pt, (long long)cc->want_pl);
    if (g.out_h != cc->want_oh || g.out_w != cc->want_ow) return;
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, kk = cc->k_h * cc->k_w * cc->c;
    int64_t rows = cc->batch * g.out_h * g.out_w, ny = rows * cc->f;
    float *x = fbuf(nx), *w = fbuf(kk * cc->f), *col = fbuf(rows * kk), *y = fbuf(ny);
    double *want = calloc((size_t)ny, sizeof(double));
    fill_uniform(x, nx, -1.0f, 1.0f, 100 + (uint64_t)index);
    fill_uniform(w, kk * cc->f, -1.0f, 1.0f, 200 + (uint64_t)index);
    fill_uniform(col, rows * kk, 5.0f, 6.0f, 7); /* garbage: padded taps must be overwritten with 0 */
    be.ops->im2col(be.ctx, x, col, &g);
    be.ops->gemm(be.ctx, 0, 0, rows, cc->f, kk, 1.0f, col, kk, w, cc->f, 0.0f, y, cc->f);
    conv_reference(cc, x, w, want);
    int64_t bad = first_mismatch(y, want, ny, RTOL, ATOL);
    CHECK_MSG(bad < 0, "conv case %d: y[%lld] = %.9g, want %.9g", index, (long long)bad, bad < 0 ? 0.0 : y[bad],
              bad < 0 ? 0.0 : want[bad]);
    free(x);
    free(w);
    free(col);
    free(y);
    free(want);
}

/* col2im is the adjoint (transpose) of im2col: <im2col(x), c> = <x, col2im(c)> for all x, c. */
static void check_col2im_adjoint(const conv_case *cc, int index)
{
    crew_window g;
    CHECK_OK(plan(cc, &g));
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, ncol = cc->batch * g.out_h * g.out_w * cc->k_h * cc->k_w * cc->c;
    float *x = fbuf(nx), *col = fbuf(ncol), *c = fbuf(ncol), *dx = fbuf(nx);
    fill_uniform(x, nx, -1.0f, 1.0f, 300 + (uint64_t)index);
    fill_uniform(c, ncol, -1.0f, 1.0f, 400 + (uint64_t)index);
    fill_uniform(dx, nx, 9.0f, 10.0f, 8); /* col2im overwrites, so this must vanish */
    be.ops->im2col(be.ctx, x, col, &g);
    be.ops->col2im(be.ctx, c, dx, &g);
    double lhs = 0.0, rhs = 0.0, mag = 0.0;
    for (int64_t i = 0; i < ncol; i++) {
        lhs += (double)col[i] * c[i];
        mag += fabs((double)col[i] * c[i]);
    }
    for (int64_t i = 0; i < nx; i++) rhs += (double)x[i] * dx[i];
    /* Each dx value sums at most k_h·k_w float terms; bound the error by the sum of magnitudes. */
    CHECK_MSG(fabs(lhs - rhs) <= 1e-5 * mag, "col2im case %d: <im2col(x), c> = %.12g but <x, col2im(c)> = %.12g",
              index, lhs, rhs);
    free(x);
    free(col);
    free(c);
    free(dx);
}

static void test_convolution(void)
{
    for (int i = 0; i < (int)(sizeof conv_cases / sizeof conv_cases[0]); i++) {
        check_conv(&conv_cases[i], i);
        check_col2im_adjoint(&conv_cases[i], i);
    }
}

/* ------------------------------------------------------------------ pooling */

static void check_maxpool(const conv_case *cc, int index)
{
    crew_window g;
    CHECK_OK(plan(cc, &g));
    CHECK(g.out_h == cc->want_oh && g.out_w == cc->want_ow && g.pad_top == cc->want_pt && g.pad_left == cc->want_pl);
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, ny = cc->batch * g.out_h * g.out_w * cc->c;
    float *x = fbuf(nx), *y = fbuf(ny), *dy = fbuf(ny), *dx = fbuf(nx);
    double *want_dx = calloc((size_t)nx, sizeof(double));
    int32_t *argmax = calloc((size_t)ny, sizeof(int32_t));
    /* Negative inputs: a kernel that let the zero padding win would be caught. */
    fill_uniform(x, nx, -2.0f, -1.0f, 500 + (uint64_t)index);
    fill_uniform(dy, ny, -1.0f, 1.0f, 600 + (uint64_t)index);
    fill_uniform(dx, nx, 3.0f, 4.0f, 9);
    be.ops->maxpool_forward(be.ctx, x, y, argmax, &g);
    be.ops->maxpool_backward(be.ctx, dy, argmax, dx, &g);
    int wrong_y = 0;
    for (int64_t b = 0; b < cc->batch; b++)
        for (int64_t oh = 0; oh < g.out_h; oh++)
            for (int64_t ow = 0; ow < g.out_w; ow++)
                for (int64_t c = 0; c < cc->c; c++) {
                    double best = -INFINITY;
                    int64_t where = -1;
                    for (int64_t kh = 0; kh < cc->k_h; kh++)
                        for (int64_t kw = 0; kw < cc->k_w; kw++) {
                            int64_t ih = oh * cc->s_h - cc->want_pt + kh, iw = ow * cc->s_w - cc->want_pl + kw;
                            if (ih < 0 || ih >= cc->h || iw < 0 || iw >= cc->w) continue;
                            int64_t i = ((b * cc->h + ih) * cc->w + iw) * cc->c + c;
                            if (x[i] > best) best = x[i], where = i;
                        }
                    int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * cc->c + c;
                    wrong_y += y[o] != best || argmax[o] != where;
                    if (where >= 0) want_dx[where] += dy[o];
                }
    CHECK_MSG(wrong_y == 0, "maxpool case %d: %d outputs or arg-maxes differ from the naive loop", index, wrong_y);
    int64_t bad = first_mismatch(dx, want_dx, nx, RTOL, ATOL);
    CHECK_MSG(bad < 0, "maxpool case %d backward: dx[%lld] = %.9g, want %.9g", index, (long long)bad,
              bad < 0 ? 0.0 : dx[bad], bad < 0 ? 0.0 : want_dx[bad]);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(want_dx);
    free(argmax);
}

static void check_avgpool(const conv_case *cc, int index)
{
    crew_window g;
    CHECK_OK(plan(cc, &g));
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, ny = cc->batch * g.out_h * g.out_w * cc->c;
    float *x = fbuf(nx), *y = fbuf(ny), *dy = fbuf(ny), *dx = fbuf(nx);
    double *want_y = calloc((size_t)ny, sizeof(double)), *want_dx = calloc((size_t)nx, sizeof(double));
    fill_uniform(x, nx, -1.0f, 1.0f, 700 + (uint64_t)index);
    fill_uniform(dy, ny, -1.0f, 1.0f, 800 + (uint64_t)index);
    fill_uniform(dx, nx, 3.0f, 4.0f, 10);
    be.ops->avgpool_forward(be.ctx, x, y, &g);
    be.ops->avgpool_backward(be.ctx, dy, dx, &g);
    for (int64_t b = 0; b < cc->batch; b++)
        for (int64_t oh = 0; oh < g.out_h; oh++)
            for (int64_t ow = 0; ow < g.out_w; ow++)
                for (int64_t c = 0; c < cc->c; c++) {
                    double s = 0.0;
                    int n = 0; /* cells inside the image: padding is not counted */
                    for (int pass = 0; pass < 2; pass++)
                        for (int64_t kh = 0; kh < cc->k_h; kh++)
                            for (int64_t kw = 0; kw < cc->k_w; kw++) {
                                int64_t ih = oh * cc->s_h - cc->want_pt + kh, iw = ow * cc->s_w - cc->want_pl + kw;
                                if (ih < 0 || ih >= cc->h || iw < 0 || iw >= cc->w) continue;
                                int64_t i = ((b * cc->h + ih) * cc->w + iw) * cc->c + c;
                                int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * cc->c + c;
                                if (pass == 0) {
                                    s += x[i];
                                    n++;
                                } else {
                                    want_dx[i] += dy[o] / n;
                                }
                            }
                    want_y[((b * g.out_h + oh) * g.out_w + ow) * cc->c + c] = s / n;
                }
    int64_t bad = first_mismatch(y, want_y, ny, RTOL, ATOL);
    CHECK_MSG(bad < 0, "avgpool case %d: y[%lld] = %.9g, want %.9g", index, (long long)bad, bad < 0 ? 0.0 : y[bad],
              bad < 0 ? 0.0 : want_y[bad]);
    bad = first_mismatch(dx, want_dx, nx, RTOL, ATOL);
    CHECK_MSG(bad < 0, "avgpool case %d backward: dx[%lld] = %.9g, want %.9g", index, (long long)bad,
              bad < 0 ? 0.0 : dx[bad], bad < 0 ? 0.0 : want_dx[bad]);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(want_y);
    free(want_dx);
}

/* Pool windows: f (filters) is unused; the cases cover valid, same, stride < pool (overlap),
 * stride > pool (gaps) and a window bigger than the padded-away border. */
static const conv_case pool_cases[] = {
    {2, 4, 4, 3, 0, 2, 2, 2, 2, CREW_PAD_VALID, 2, 2, 0, 0},
    {2, 5, 5, 2, 0, 3, 3, 2, 2, CREW_PAD_SAME, 3, 3, 1, 1},
    {1, 5, 5, 2, 0, 2, 2, 2, 2, CREW_PAD_SAME, 3, 3, 0, 0},   /* padding at the bottom/right only */
    {2, 5, 4, 2, 0, 3, 3, 1, 1, CREW_PAD_VALID, 3, 2, 0, 0},  /* overlapping windows */
    {1, 7, 7, 1, 0, 2, 2, 3, 3, CREW_PAD_VALID, 2, 2, 0, 0},  /* stride > pool: skipped cells */
    {1, 4, 4, 2, 0, 3, 3, 1, 1, CREW_PAD_SAME, 4, 4, 1, 1},
};

static void test_pooling(void)
{
    for (int i = 0; i < (int)(sizeof pool_cases / sizeof pool_cases[0]); i++) {
        check_maxpool(&pool_cases[i], i);
        check_avgpool(&pool_cases[i], i);
    }
}

/* ------------------------------------------------------------------ softmax and loss */

static void test_softmax(void)
{
    enum { ROWS = 4, CLASSES = 6 };
    float z[ROWS * CLASSES], p[ROWS * CLASSES];
    fill_uniform(z, ROWS * CLASSES, -3.0f, 3.0f, 21);
    /* Large logits: a softmax without the max subtraction overflows expf. */
    const float big[CLASSES] = {80.0f, -80.0f, 0.0f, 1000.0f, -1000.0f, 999.0f};
    memcpy(z + 2 * CLASSES, big, sizeof big);
    for (int j = 0; j < CLASSES; j++) z[3 * CLASSES + j] = 88.5f; /* all equal: uniform */
    be.ops->softmax(be.ctx, z, p, ROWS, CLASSES);
    for (int r = 0; r < ROWS; r++) {
        double sum = 0.0, zmax = -INFINITY, denom = 0.0;
        for (int j = 0; j < CLASSES; j++) zmax = fmax(zmax, z[r * CLASSES + j]);
        for (int j = 0; j < CLASSES; j++) denom += exp((double)z[r * CLASSES + j] - zmax);
        double want[CLASSES];
        for (int j = 0; j < CLASSES; j++) {
            sum += p[r * CLASSES + j];
            want[j] = exp((double)z[r * CLASSES + j] - zmax) / denom;
        }
        CHECK_MSG(fabs(sum - 1.0) <= 1e-6, "softmax row %d sums to %.9g", r, sum);
        int64_t bad = first_mismatch(p + r * CLASSES, want, CLASSES, RTOL, 1e-7);
        CHECK_MSG(bad < 0, "softmax row %d: p[%lld] = %.9g, want %.9g", r, (long long)bad,
                  bad < 0 ? 0.0 : p[r * CLASSES + bad], bad < 0 ? 0.0 : want[bad]);
    }
}

static void test_softmax_xent(void)
{
    enum { ROWS = 3, CLASSES = 4 };
    const float z[ROWS * CLASSES] = {0.5f, -1.0f, 2.0f, 0.0f, 80.0f, -80.0f, 0.0f, 3.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    const int32_t labels[ROWS] = {2, 1, 3};
    const float scale = 0.25f;
    float loss[ROWS], dz[ROWS * CLASSES];
    int64_t correct = -1;
    be.ops->softmax_xent(be.ctx, z, labels, ROWS, CLASSES, scale, loss, dz, &correct);
    for (int r = 0; r < ROWS; r++) {
        double zmax = -INFINITY, denom = 0.0;
        for (int j = 0; j < CLASSES; j++) zmax = fmax(zmax, z[r * CLASSES + j]);
        for (int j = 0; j < CLASSES; j++) denom += exp((double)z[r * CLASSES + j] - zmax);
        double want_loss = log(denom) + zmax - z[r * CLASSES + labels[r]];
        CHECK_MSG(close_to(loss[r], want_loss, RTOL, ATOL), "xent row %d: loss %.9g, want %.9g", r, loss[r],
                  want_loss);
        for (int j = 0; j < CLASSES; j++) {
            double want = scale * (exp((double)z[r * CLASSES + j] - zmax) / denom - (j == labels[r]));
            CHECK_MSG(close_to(dz[r * CLASSES + j], want, RTOL, 1e-7), "xent row %d: dlogit %d = %.9g, want %.9g",
                      r, j, dz[r * CLASSES + j], want);
        }
    }
    /* Row 0's arg-max is its label; row 1's is not; row 2 ties, and the first maximum (0) wins. */
    CHECK(correct == 1);
}

/* ------------------------------------------------------------------ reductions */

static void test_all_finite(void)
{
    enum { N = 37 };
    float x[N];
    fill_uniform(x, N, -1e30f, 1e30f, 31);
    x[5] = FLT_MAX;
    x[6] = -FLT_MAX;
    x[7] = FLT_MIN / 4.0f; /* subnormal */
    CHECK(be.ops->all_finite(be.ctx, x, N) == 1);
    CHECK(be.ops->all_finite(be.ctx, x, 0) == 1);
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY};
    const int64_t where[] = {0, 17, N - 1};
    for (int s = 0; s < 4; s++)
        for (int w = 0; w < 3; w++) {
            float saved = x[where[w]];
            x[where[w]] = specials[s];
            CHECK_MSG(be.ops->all_finite(be.ctx, x, N) == 0, "all_finite missed special %d at %lld", s,
                      (long long)where[w]);
            CHECK(be.ops->all_finite(be.ctx, x, where[w]) == 1); /* stops before it */
            x[where[w]] = saved;
        }
    /* inf and -inf together must not cancel into a finite sum */
    x[3] = INFINITY;
    x[4] = -INFINITY;
    CHECK(be.ops->all_finite(be.ctx, x, N) == 0);
}

static void test_sum_squares(void)
{
    enum { N = 1000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i + 1) * (i % 2 ? -1.0f : 1.0f);
    /* Σ i² = n(n+1)(2n+1)/6 = 333,833,500: exact in double, not in float. */
    CHECK(be.ops->sum_squares(be.ctx, x, N) == 333833500.0);
    CHECK(be.ops->sum_squares(be.ctx, x, 0) == 0.0);
    /* Many small values: a float accumulator would drift by ~1e-3 relative here. */
    int64_t n = 1 << 20;
    float *y = fbuf(n);
    fill_uniform(y, n, -1.0f, 1.0f, 41);
    double want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)y[i] * y[i];
    double got = be.ops->sum_squares(be.ctx, y, n);
    CHECK_MSG(fabs(got - want) <= 1e-12 * want, "sum_squares %.17g, want %.17g", got, want);
    free(y);
}

static void test_col_sum(void)
{
    enum { ROWS = 7, COLS = 5 };
    float x[ROWS * COLS], out[COLS];
    fill_uniform(x, ROWS * COLS, -1.0f, 1.0f, 51);
    double want[COLS] = {0};
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) want[c] += x[r * COLS + c];
    for (int c = 0; c < COLS; c++) out[c] = 100.0f + (float)c; /* overwritten */
    be.ops->col_sum(be.ctx, x, ROWS, COLS, out, 0);
    int64_t bad = first_mismatch(out, want, COLS, RTOL, ATOL);
    CHECK_MSG(bad < 0, "col_sum: out[%lld] = %.9g, want %.9g", (long long)bad, bad < 0 ? 0.0 : out[bad],
              bad < 0 ? 0.0 : want[bad]);
    for (int c = 0; c < COLS; c++) {
        out[c] = 100.0f + (float)c; /* kept and added to */
        want[c] += 100.0 + c;
    }
    be.ops->col_sum(be.ctx, x, ROWS, COLS, out, 1);
    bad = first_mismatch(out, want, COLS, RTOL, ATOL);
    CHECK_MSG(bad < 0, "col_sum accumulate: out[%lld] = %.9g, want %.9g", (long long)bad, bad < 0 ? 0.0 : out[bad],
              bad < 0 ? 0.0 : want[bad]);
    /* zero rows: overwrite gives zeros, accumulate leaves out alone */
    be.ops->col_sum(be.ctx, x, 0, COLS, out, 1);
    CHECK(out[0] == (float)want[0]);
    be.ops->col_sum(be.ctx, x, 0, COLS, out, 0);
    CHECK(out[0] == 0.0f && out[COLS - 1] == 0.0f);
}

/* ------------------------------------------------------------------ optimisers */

/* One parameter, gradients 0.5, -0.25, 1.0 in steps 1..3, lr 0.1, starting at 1.0. The expected
 * values follow torch.optim.SGD step by step (worked out by hand, checked in double):
 *   d = g + wd·p;  buf = d (step 1) or μ·buf + d;  d = nesterov ? d + μ·buf : buf;  p −= lr·d. */
static void check_sgd(float momentum, int nesterov, float wd, const double want[3], const char *what)
{
    const float grads[3] = {0.5f, -0.25f, 1.0f};
    float p[2] = {1.0f, 1.0f}, v[2] = {0.0f, 0.0f};
    for (int t = 0; t < 3; t++) {
        float g[2] = {grads[t], grads[t]};
        be.ops->sgd_update(be.ctx, p, g, v, 2, 0.1f, momentum, nesterov, wd);
        CHECK_MSG(close_to(p[0], want[t], 1e-6, 1e-7) && p[1] == p[0], "%s step %d: p = %.9g, want %.9g", what,
                  t + 1, p[0], want[t]);
    }
}

static void test_sgd(void)
{
    check_sgd(0.0f, 0, 0.01f, (const double[]){0.949, 0.973051, 0.872077949}, "sgd");
    check_sgd(0.9f, 0, 0.01f, (const double[]){0.949, 0.927151, 0.806559749}, "sgd momentum");
    check_sgd(0.9f, 1, 0.01f, (const double[]){0.9031, 0.90757411, 0.698189208191}, "sgd nesterov");
    /* wd 0: buf = 0.5, p = 0.95; buf = 0.45 − 0.25 = 0.2, p = 0.93; buf = 0.18 + 1 = 1.18, p = 0.812 */
    check_sgd(0.9f, 0, 0.0f, (const double[]){0.95, 0.93, 0.812}, "sgd momentum, no decay");
}

/* torch.optim.AdamW: p ·= 1 − lr·wd; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
 * p −= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps). Values from that formula in double. */
static void check_adamw(float lr, float b1, float b2, float eps, float wd, float p0, const double want_p[3],
                        const double want_m[3], const double want_v[3], const char *what)
{
    const float grads[3] = {0.5f, -0.25f, 1.0f};
    float p[1] = {p0}, m[1] = {0.0f}, v[1] = {0.0f};
    for (int t = 1; t <= 3; t++) {
        float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
        be.ops->adamw_update(be.ctx, p, &grads[t - 1], m, v, 1, lr, b1, b2, eps, wd, c1, c2);
        CHECK_MSG(close_to(p[0], want_p[t - 1], 1e-6, 1e-7), "%s step %d: p = %.9g, want %.9g", what, t, p[0],
                  want_p[t - 1]);
        /* v's 3e-5: 1 − 0.999f is 0.000999987 in float32, 1.3e-5 away from the exact 0.001. */
        CHECK_MSG(close_to(m[0], want_m[t - 1], 1e-6, 1e-9) && close_to(v[0], want_v[t - 1], 3e-5, 1e-10),
                  "%s step %d: m = %.9g v = %.9g, want %.9g %.9g", what, t, m[0], v[0], want_m[t - 1],
                  want_v[t - 1]);
    }
}

static void test_adamw(void)
{
    check_adamw(0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, (const double[]){0.899000002, 0.871467298706, 0.804784672376},
                (const double[]){0.05, 0.02, 0.118}, (const double[]){0.00025, 0.00031225, 0.00131193775}, "adamw");
    check_adamw(0.01f, 0.8f, 0.99f, 1e-3f, 0.1f, -2.0f,
                (const double[]){-2.00798003992, -2.00807809442, -2.01297938452}, (const double[]){0.1, 0.03, 0.224},
                (const double[]){0.0025, 0.0031, 0.013069}, "adamw eps 1e-3");
}

/* ------------------------------------------------------------------ small elementwise ops */

static void test_activations(void)
{
    enum { N = 64 };
    float x[N], y[N], dy[N], dx[N];
    fill_uniform(x, N, -4.0f, 4.0f, 61);
    fill_uniform(dy, N, -1.0f, 1.0f, 62);
    x[0] = 0.0f;
    x[1] = -30.0f; /* sigmoid and tanh saturate without overflow */
    x[2] = 30.0f;
    const crew_activation acts[] = {CREW_ACT_NONE, CREW_ACT_RELU, CREW_ACT_GELU, CREW_ACT_TANH, CREW_ACT_SIGMOID};
    for (int a = 0; a < 5; a++) {
        be.ops->act_forward(be.ctx, acts[a], x, y, N);
        be.ops->act_backward(be.ctx, acts[a], x, y, dy, dx, N);
        int bad_y = -1, bad_dx = -1;
        for (int i = 0; i < N; i++) {
            double v = x[i], f, d;
            switch (acts[a]) {
            case CREW_ACT_RELU: f = v > 0 ? v : 0, d = v > 0; break;
            case CREW_ACT_GELU:
                f = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
                d = 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
                break;
            case CREW_ACT_TANH: f = tanh(v), d = 1.0 - f * f; break;
            case CREW_ACT_SIGMOID: f = 1.0 / (1.0 + exp(-v)), d = f * (1.0 - f); break;
            default: f = v, d = 1.0; break;
            }
            if (bad_y < 0 && !close_to(y[i], f, 1e-5, 1e-6)) bad_y = i;
            if (bad_dx < 0 && !close_to(dx[i], d * dy[i], 1e-4, 1e-6)) bad_dx = i;
        }
        CHECK_MSG(bad_y < 0, "activation %d: y at x = %.9g is %.9g", (int)acts[a], bad_y < 0 ? 0.0 : x[bad_y],
                  bad_y < 0 ? 0.0 : y[bad_y]);
        CHECK_MSG(bad_dx < 0, "activation %d: dx at x = %.9g is %.9g", (int)acts[a], bad_dx < 0 ? 0.0 : x[bad_dx],
                  bad_dx < 0 ? 0.0 : dx[bad_dx]);
    }
}

static void test_embedding_ids(void)
{
    enum { VOCAB = 4, DIM = 3, ROWS = 7 };
    float table[VOCAB * DIM], y[ROWS * DIM], dtable[VOCAB * DIM] = {0}, dy[ROWS * DIM];
    fill_uniform(table, VOCAB * DIM, -1.0f, 1.0f, 71);
    fill_uniform(dy, ROWS * DIM, -1.0f, 1.0f, 72);
    const float ids[ROWS] = {3.0f, 0.0f, 3.0f, -1.0f, 4.0f, 1.5f, NAN};
    CHECK(be.ops->embedding_forward(be.ctx, ids, table, VOCAB, y, ROWS, DIM) == 4);
    CHECK(memcmp(y, table + 3 * DIM, sizeof(float) * DIM) == 0 && memcmp(y + DIM, table, sizeof(float) * DIM) == 0);
    int zeros = 1;
    for (int j = 3 * DIM; j < ROWS * DIM; j++) zeros &= y[j] == 0.0f;
    CHECK(zeros);
    /* Backward over every row: the rows whose id forward rejected add nothing. */
    be.ops->embedding_backward(be.ctx, ids, dy, dtable, VOCAB, ROWS, DIM);
    for (int j = 0; j < DIM; j++) {
        CHECK(dtable[3 * DIM + j] == dy[j] + dy[2 * DIM + j]); /* id 3 twice: accumulated */
        CHECK(dtable[j] == dy[DIM + j]);
        CHECK(dtable[DIM + j] == 0.0f && dtable[2 * DIM + j] == 0.0f);
    }
}

int main(void)
{
    CHECK_OK(crew_cpu_backend_create(1, &be));
    test_gemm();
    test_convolution();
    test_pooling();
    test_softmax();
    test_softmax_xent();
    test_all_finite();
    test_sum_squares();
    test_col_sum();
    test_sgd();
    test_adamw();
    test_activations();
    test_embedding_ids();
    crew_backend_destroy(&be);
    return check_report();
}
