/* test_backend_guard.c — the guarded CPU backend (cpu_guarded.c), the device kind that proves
 * nothing above backend.h touches device memory from the host:
 *   - a host read or write through a device address dies by SIGSEGV (in a forked child);
 *   - values cross only by upload and download, for every element type;
 *   - its ops give bitwise the plain CPU backend's results (the same code runs on both);
 *   - an operand outside device memory (host memory, one element past the end) skips the op and
 *     is reported, naming op and operand, by the next status-returning call, once;
 *   - an upload on a queue lands only when that queue is synced or waited on;
 *   - host_alias reaches the values, and only for ranges inside one allocation;
 *   - host_alias from one thread while another allocates and frees (the table's mutex).
 * Nothing here depends on timing. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "core/rng.h"

/* The plain and the guarded backend. */
static crew_backend cpu, gd;

static void fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t key)
{
    crew_rng r = crew_rng_make(key);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * crew_rng_next_uniform(&r);
}

static float *dev_f32(const crew_backend *be, int64_t n)
{
    float *p = NULL;
    CHECK_OK(crew_dev_alloc_f32(be, n, &p));
    if (!p) abort();
    return p;
}

/* A device copy of host[n]. */
static float *dev_from(const crew_backend *be, const float *host, int64_t n)
{
    float *p = dev_f32(be, n);
    CHECK_OK(crew_dev_upload_f32(be, p, host, n));
    return p;
}

/* 1 when the device's n floats at p are bitwise want[n]. */
static int device_holds(const crew_backend *be, const float *p, const float *want, int64_t n)
{
    float *got = malloc((size_t)n * sizeof *got);
    if (!got) abort();
    crew_status s = crew_dev_download_f32(be, got, p, n);
    int same = !s && memcmp(got, want, (size_t)n * sizeof *got) == 0;
    crew_status_free(s);
    free(got);
    return same;
}

/* Expects s to be an error whose message contains needle; frees it. */
static void expect_error(crew_status s, const char *needle, int line)
{
    CHECK_MSG(s != CREW_OK, "line %d: expected an error containing '%s'", line, needle);
    if (s)
        CHECK_MSG(strstr(crew_status_message(s), needle) != NULL, "line %d: message '%s' lacks '%s'", line,
                  crew_status_message(s), needle);
    crew_status_free(s);
}
#define EXPECT_ERROR(expr, needle) expect_error((expr), (needle), __LINE__)

/* ------------------------------------------------------------------ (a) host access traps */

/* Sanitizers install their own SIGSEGV handler and exit through it; the children put the
 * default back (which they honour), so that they die by the signal itself. */
static void read_float(void *p)
{
    volatile float v = *(volatile float *)p;
    (void)v;
}

static void write_float(void *p) { *(volatile float *)p = 1.0f; }

/* Runs touch(p) in a child; the signal it died of, or 0 when it lived through it. */
static int death_signal(void (*touch)(void *), void *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* an expected crash leaves no core file behind */
        signal(SIGSEGV, SIG_DFL);
        touch(p);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

static void check_host_access_traps(void)
{
    enum { N = 100 };
    float values[N];
    fill_uniform(values, N, -1.0f, 1.0f, 1);
    float *d = dev_from(&gd, values, N);
    CHECK_MSG(death_signal(read_float, d) == SIGSEGV, "reading through a device pointer did not trap");
    CHECK_MSG(death_signal(read_float, d + N - 1) == SIGSEGV, "reading its last element did not trap");
    CHECK_MSG(death_signal(write_float, d + 7) == SIGSEGV, "writing through a device pointer did not trap");
    CHECK(device_holds(&gd, d, values, N)); /* and the parent's values are intact */
    crew_dev_free(&gd, d);
}

/* ------------------------------------------------------------------ (b) transfers per dtype */

static void check_round_trip(crew_dtype t, int64_t n)
{
    size_t bytes = (size_t)n * crew_dtype_size(t);
    unsigned char *in = malloc(bytes), *out = malloc(bytes);
    if (!in || !out) abort();
    for (size_t i = 0; i < bytes; i++) in[i] = (unsigned char)(i * 131u + 7u); /* every bit pattern, NaNs too */
    memset(out, 0, bytes);
    void *d = NULL;
    CHECK_OK(gd.ops->alloc(gd.ctx, t, n, &d));
    CHECK_OK(gd.ops->upload(gd.ctx, NULL, d, in, n, t));
    CHECK_OK(gd.ops->download(gd.ctx, out, d, n, t));
    CHECK_MSG(memcmp(in, out, bytes) == 0, "dtype %d: round trip differs", (int)t);
    gd.ops->free(gd.ctx, d);
    free(in);
    free(out);
}

static void check_transfers(void)
{
    const crew_dtype types[] = {CREW_DT_F32, CREW_DT_F64, CREW_DT_I32, CREW_DT_I64};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_round_trip(types[i], 1);
        check_round_trip(types[i], 1537); /* spans pages */
    }
    /* Buffers come zero-filled; an empty one is still a buffer. */
    float zeros[16] = {0};
    float *d = dev_f32(&gd, 16);
    CHECK(device_holds(&gd, d, zeros, 16));
    crew_dev_free(&gd, d);
    float *empty = dev_f32(&gd, 0);
    CHECK(empty != NULL);
    CHECK_OK(crew_dev_upload_f32(&gd, empty, zeros, 0));
    crew_dev_free(&gd, empty);
    crew_dev_free(&gd, NULL);
    void *p = &p;
    CHECK_ERR(gd.ops->alloc(gd.ctx, CREW_DT_F32, -1, &p), "cannot allocate");
    CHECK(p == NULL);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
}

/* ------------------------------------------------------------------ (c) the same results as cpu
 * Each runner does one op on the backend it is given, on buffers of exactly the size the op
 * touches (so an extent rule too strict fails here, one too loose in check_bounds), and brings
 * the results back into out. */

/* c [5, 7] = 0.75 op(a) [5, 3] · op(b) [3, 7] + 0.5 c, every operand with a leading dimension
 * wider than its rows. out: c with ldc 8, GEMM_C floats. */
enum { GEMM_C = (5 - 1) * 8 + 7 };

static void run_gemm(const crew_backend *be, int ta, int tb, float *out)
{
    enum { M = 5, N = 7, K = 3 };
    int64_t lda = ta ? M + 2 : K + 1, ldb = tb ? K + 2 : N + 2, ldc = N + 1;
    int64_t na = ta ? (K - 1) * lda + M : (M - 1) * lda + K;
    int64_t nb = tb ? (N - 1) * ldb + K : (K - 1) * ldb + N;
    int64_t nc = (M - 1) * ldc + N;
    float ha[64], hb[64], hc[64];
    fill_uniform(ha, na, -1.0f, 1.0f, 10);
    fill_uniform(hb, nb, -1.0f, 1.0f, 11);
    fill_uniform(hc, nc, -1.0f, 1.0f, 12);
    float *a = dev_from(be, ha, na), *b = dev_from(be, hb, nb), *c = dev_from(be, hc, nc);
    be->ops->gemm(be->ctx, ta, tb, M, N, K, 0.75f, a, lda, b, ldb, 0.5f, c, ldc);
    CHECK_OK(crew_dev_download_f32(be, out, c, nc));
    crew_dev_free(be, a);
    crew_dev_free(be, b);
    crew_dev_free(be, c);
}

static void run_axpby(const crew_backend *be, float *out)
{
    enum { N = 37 };
    float hx[N], hy[N];
    fill_uniform(hx, N, -2.0f, 2.0f, 20);
    fill_uniform(hy, N, -2.0f, 2.0f, 21);
    float *x = dev_from(be, hx, N), *y = dev_from(be, hy, N);
    be->ops->axpby(be->ctx, N, 0.7f, x, -1.3f, y);
    CHECK_OK(crew_dev_download_f32(be, out, y, N));
    crew_dev_free(be, x);
    crew_dev_free(be, y);
}

enum { XENT_ROWS = 6, XENT_CLASSES = 5 };

/* out: row_loss [rows], dlogits [rows, classes], then the count of correct rows */
static void run_softmax_xent(const crew_backend *be, float *out)
{
    float hz[XENT_ROWS * XENT_CLASSES];
    int32_t hl[XENT_ROWS] = {0, 4, 2, 2, 1, 3};
    fill_uniform(hz, XENT_ROWS * XENT_CLASSES, -3.0f, 3.0f, 30);
    float *z = dev_from(be, hz, XENT_ROWS * XENT_CLASSES);
    float *loss = dev_f32(be, XENT_ROWS), *dz = dev_f32(be, XENT_ROWS * XENT_CLASSES);
    void *labels = NULL;
    CHECK_OK(be->ops->alloc(be->ctx, CREW_DT_I32, XENT_ROWS, &labels));
    CHECK_OK(be->ops->upload(be->ctx, NULL, labels, hl, XENT_ROWS, CREW_DT_I32));
    int64_t correct = -1;
    CHECK_OK(be->ops->softmax_xent(be->ctx, z, labels, XENT_ROWS, XENT_CLASSES, 0.25f, loss, dz, &correct));
    CHECK_OK(crew_dev_download_f32(be, out, loss, XENT_ROWS));
    CHECK_OK(crew_dev_download_f32(be, out + XENT_ROWS, dz, XENT_ROWS * XENT_CLASSES));
    out[XENT_ROWS * (XENT_CLASSES + 1)] = (float)correct;
    crew_dev_free(be, z);
    crew_dev_free(be, loss);
    crew_dev_free(be, dz);
    crew_dev_free(be, labels);
}

/* 2 images of 5×5×3, 2×2 windows with stride 2; the last column and row of windows hang over the
 * edge (padding excluded). */
static const crew_window pool = {.batch = 2, .in_h = 5, .in_w = 5, .in_c = 3, .out_h = 3, .out_w = 3,
                                 .k_h = 2, .k_w = 2, .stride_h = 2, .stride_w = 2};
enum { POOL_IN = 2 * 5 * 5 * 3, POOL_OUT = 2 * 3 * 3 * 3 };

/* out: y [POOL_OUT], then argmax [POOL_OUT] as its int32 bits */
static void run_maxpool(const crew_backend *be, float *out)
{
    float hx[POOL_IN];
    fill_uniform(hx, POOL_IN, -1.0f, 1.0f, 40);
    float *x = dev_from(be, hx, POOL_IN), *y = dev_f32(be, POOL_OUT);
    void *argmax = NULL;
    CHECK_OK(be->ops->alloc(be->ctx, CREW_DT_I32, POOL_OUT, &argmax));
    be->ops->maxpool_forward(be->ctx, x, y, argmax, &pool, 1); /* of relu(x): the fold's path */
    CHECK_OK(crew_dev_download_f32(be, out, y, POOL_OUT));
    CHECK_OK(be->ops->download(be->ctx, out + POOL_OUT, argmax, POOL_OUT, CREW_DT_I32));
    crew_dev_free(be, x);
    crew_dev_free(be, y);
    crew_dev_free(be, argmax);
}

enum { DROP_ROWS = 4, DROP_COLS = 33, DROP_N = DROP_ROWS * DROP_COLS };

/* out: y, then mask */
static void run_dropout(const crew_backend *be, float *out)
{
    float hx[DROP_N];
    int64_t ids[DROP_ROWS] = {7, 3, 100, 2};
    fill_uniform(hx, DROP_N, -1.0f, 1.0f, 50);
    float *x = dev_from(be, hx, DROP_N), *y = dev_f32(be, DROP_N), *mask = dev_f32(be, DROP_N);
    void *sample_ids = NULL;
    CHECK_OK(be->ops->alloc(be->ctx, CREW_DT_I64, DROP_ROWS, &sample_ids));
    CHECK_OK(be->ops->upload(be->ctx, NULL, sample_ids, ids, DROP_ROWS, CREW_DT_I64));
    be->ops->dropout_forward(be->ctx, x, y, mask, DROP_ROWS, DROP_COLS, 0.3f, 1234, sample_ids);
    CHECK_OK(crew_dev_download_f32(be, out, y, DROP_N));
    CHECK_OK(crew_dev_download_f32(be, out + DROP_N, mask, DROP_N));
    crew_dev_free(be, x);
    crew_dev_free(be, y);
    crew_dev_free(be, mask);
    crew_dev_free(be, sample_ids);
}

/* The reductions that answer questions about device values. out: sum, sum of squares, finite, hash */
static void run_reductions(const crew_backend *be, float *out)
{
    enum { N = 300 };
    float hx[N];
    fill_uniform(hx, N, -1.0f, 1.0f, 60);
    float *x = dev_from(be, hx, N);
    double sum = 0, sq = 0;
    int finite = 0;
    uint64_t hash = 0;
    CHECK_OK(be->ops->sum(be->ctx, x, N, &sum));
    CHECK_OK(be->ops->sum_squares(be->ctx, x, N, &sq));
    CHECK_OK(be->ops->all_finite(be->ctx, x, N, &finite));
    CHECK_OK(be->ops->hash(be->ctx, x, N, CREW_DT_F32, &hash));
    memcpy(out, &sum, sizeof sum);
    memcpy(out + 2, &sq, sizeof sq);
    out[4] = (float)finite;
    memcpy(out + 5, &hash, sizeof hash);
    crew_dev_free(be, x);
}

/* Every other op once, on buffers of exactly the size it touches, chained so that each sees
 * sensible inputs. An extent rule too strict shows as the sync's error, naming op and operand. */
typedef struct op_run {
    const crew_backend *be;
    float *out;          /* where the next result is downloaded */
    void *owned[64];
    int n_owned;
} op_run;

/* n floats on the device: uniform in [-1, 1) from key, or zeros for key 0. */
static float *buf(op_run *r, int64_t n, uint64_t key)
{
    float host[256] = {0};
    if (n > 256 || r->n_owned == 64) abort();
    if (key) fill_uniform(host, n, -1.0f, 1.0f, key);
    float *d = dev_from(r->be, host, n);
    r->owned[r->n_owned++] = d;
    return d;
}

static void keep(op_run *r, const float *d, int64_t n)
{
    CHECK_OK(crew_dev_download_f32(r->be, r->out, d, n));
    r->out += n;
}

/* Returns how many floats it wrote to out. */
static int64_t run_every_other_op(const crew_backend *be, float *out)
{
    enum { R = 3, C = 5, RC = R * C, V = 4, D = 3 };
    const crew_backend_ops *o = be->ops;
    void *ctx = be->ctx;
    op_run r = {.be = be, .out = out};
    float *a = buf(&r, RC, 1), *b = buf(&r, RC, 2), *dy = buf(&r, RC, 3), *y = buf(&r, RC, 0), *dx = buf(&r, RC, 0);

    o->copy(ctx, y, a, RC);
    keep(&r, y, RC);
    o->fill(ctx, y, 0.5f, RC);
    keep(&r, y, RC);
    o->mul(ctx, RC, a, b, y);
    keep(&r, y, RC);
    o->broadcast_rows(ctx, y, buf(&r, C, 4), R, C);
    keep(&r, y, RC);
    float *sums = buf(&r, C, 5);
    o->col_sum(ctx, a, R, C, sums, 1);
    keep(&r, sums, C);
    for (crew_activation act = CREW_ACT_NONE; act <= CREW_ACT_SIGMOID; act++) {
        o->act_forward(ctx, act, a, y, RC);
        o->act_backward(ctx, act, a, y, dy, dx, RC);
        keep(&r, y, RC);
        keep(&r, dx, RC);
    }

    /* convolution columns: one 4×4×2 image, 2×2 windows, stride 1, padding 1 on top and left */
    const crew_window conv = {.batch = 1, .in_h = 4, .in_w = 4, .in_c = 2, .out_h = 4, .out_w = 4,
                              .k_h = 2, .k_w = 2, .stride_h = 1, .stride_w = 1, .pad_top = 1, .pad_left = 1};
    float *img = buf(&r, 32, 6), *col = buf(&r, 16 * 8, 0), *dimg = buf(&r, 32, 0);
    o->im2col(ctx, img, col, &conv);
    o->col2im(ctx, col, dimg, &conv);
    keep(&r, col, 16 * 8);
    keep(&r, dimg, 32);

    float *px = buf(&r, POOL_IN, 7), *py = buf(&r, POOL_OUT, 0), *pdy = buf(&r, POOL_OUT, 8);
    float *pdx = buf(&r, POOL_IN, 0);
    void *argmax = NULL;
    CHECK_OK(o->alloc(ctx, CREW_DT_I32, POOL_OUT, &argmax));
    r.owned[r.n_owned++] = argmax;
    o->maxpool_forward(ctx, px, py, argmax, &pool, 0);
    o->maxpool_backward(ctx, pdy, argmax, pdx, &pool);
    keep(&r, pdx, POOL_IN);
    o->avgpool_forward(ctx, px, py, &pool);
    o->avgpool_backward(ctx, pdy, pdx, &pool);
    keep(&r, py, POOL_OUT);
    keep(&r, pdx, POOL_IN);

    /* batch norm and layer norm over [R, C] */
    float *mean = buf(&r, C, 9), *var = buf(&r, C, 0), *gamma = buf(&r, C, 10), *beta = buf(&r, C, 11);
    float *dg = buf(&r, C, 0), *db = buf(&r, C, 0);
    /* batch norm's sums are doubles: C of them in the room of 2 C floats, each its own allocation */
    double *sum = (double *)(void *)buf(&r, 2 * C, 0), *sq = (double *)(void *)buf(&r, 2 * C, 0);
    double *s1 = (double *)(void *)buf(&r, 2 * C, 0), *s2 = (double *)(void *)buf(&r, 2 * C, 0);
    o->bn_col_sum(ctx, a, R, C, sum);
    o->bn_scale_sums(ctx, C, 1.0 / R, sum, mean);
    o->col_sqdev(ctx, a, mean, R, C, sq);
    o->bn_scale_sums(ctx, C, 1.0 / R, sq, var);
    keep(&r, mean, C);
    keep(&r, (const float *)(const void *)sq, 2 * C);
    o->bn_forward(ctx, a, mean, var, gamma, beta, 1e-3f, y, R, C);
    o->bn_backward_sums(ctx, dy, a, mean, R, C, s1, s2);
    o->bn_backward(ctx, dy, a, mean, var, gamma, 1e-3f, s1, s2, R, dx, R, C);
    o->bn_param_grads(ctx, var, 1e-3f, s1, s2, dg, db, C);
    keep(&r, var, C);
    keep(&r, y, RC);
    keep(&r, dx, RC);
    keep(&r, dg, C);
    keep(&r, db, C);
    float *row_mean = buf(&r, R, 0), *rstd = buf(&r, R, 0);
    o->layernorm_forward(ctx, a, gamma, beta, 1e-3f, y, row_mean, rstd, R, C);
    o->layernorm_backward(ctx, dy, a, gamma, row_mean, rstd, dx, dg, db, R, C);
    keep(&r, y, RC);
    keep(&r, row_mean, R);
    keep(&r, rstd, R);
    keep(&r, dx, RC);
    keep(&r, dg, C);
    keep(&r, db, C);

    /* embedding: the middle id is outside the vocabulary */
    const float host_ids[R] = {2, 5, 1};
    float *ids = buf(&r, R, 0), *table = buf(&r, V * D, 12), *ey = buf(&r, R * D, 0), *dtable = buf(&r, V * D, 0);
    CHECK_OK(crew_dev_upload_f32(be, ids, host_ids, R));
    int64_t bad = -1;
    CHECK_OK(o->embedding_forward(ctx, ids, table, V, ey, R, D, &bad));
    o->embedding_backward(ctx, ids, ey, dtable, V, R, D);
    keep(&r, ey, R * D);
    keep(&r, dtable, V * D);
    *r.out++ = (float)bad;

    o->softmax(ctx, a, y, R, C);
    keep(&r, y, RC);

    /* optimisers: SGD with Nesterov momentum, SGD without (and no velocity), AdamW */
    float *param = buf(&r, RC, 13), *velocity = buf(&r, RC, 0), *m = buf(&r, RC, 0), *v = buf(&r, RC, 0);
    o->sgd_update(ctx, param, b, velocity, RC, 0.1f, 0.9f, 1, 0.01f);
    o->sgd_update(ctx, param, b, NULL, RC, 0.1f, 0.0f, 0, 0.0f);
    keep(&r, param, RC);
    keep(&r, velocity, RC);
    const crew_adamw_consts k = {.decay = 0.9999f, .one_minus_beta1 = 0.1f, .beta2 = 0.999f, .one_minus_beta2 = 0.001f,
                                 .step_size = 0.1f, .bias_c2_sqrt = 0.0316f, .eps = 1e-8f};
    o->adamw_update(ctx, param, b, m, v, RC, &k);
    keep(&r, param, RC);
    keep(&r, m, RC);
    keep(&r, v, RC);

    CHECK_OK(o->sync(ctx, NULL));
    for (int i = 0; i < r.n_owned; i++) o->free(ctx, r.owned[i]);
    return r.out - out;
}

static void check_same_as_cpu(void)
{
    enum { MAX = 2 * DROP_N };
    float want[MAX], got[MAX];
#define SAME(call, n, what)                                                                         \
    do {                                                                                            \
        memset(want, 0, sizeof want);                                                               \
        memset(got, 0xff, sizeof got);                                                              \
        call(&cpu, want);                                                                           \
        call(&gd, got);                                                                             \
        CHECK_MSG(memcmp(want, got, (size_t)(n) * sizeof(float)) == 0, "%s differs from cpu", what); \
    } while (0)
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            memset(want, 0, sizeof want);
            memset(got, 0xff, sizeof got);
            run_gemm(&cpu, ta, tb, want);
            run_gemm(&gd, ta, tb, got);
            CHECK_MSG(memcmp(want, got, GEMM_C * sizeof(float)) == 0, "gemm ta=%d tb=%d differs", ta, tb);
        }
    SAME(run_axpby, 37, "axpby");
    SAME(run_softmax_xent, XENT_ROWS * (XENT_CLASSES + 1) + 1, "softmax_xent");
    SAME(run_maxpool, 2 * POOL_OUT, "maxpool_forward");
    SAME(run_dropout, 2 * DROP_N, "dropout_forward");
    SAME(run_reductions, 7, "sum, sum_squares, all_finite, hash");
#undef SAME
    enum { EVERY = 4096 };
    float *every_want = calloc(EVERY, sizeof(float)), *every_got = calloc(EVERY, sizeof(float));
    if (!every_want || !every_got) abort();
    int64_t n_want = run_every_other_op(&cpu, every_want), n_got = run_every_other_op(&gd, every_got);
    CHECK(n_want == n_got && n_want <= EVERY);
    CHECK_MSG(memcmp(every_want, every_got, (size_t)n_want * sizeof(float)) == 0, "the other ops differ from cpu");
    free(every_want);
    free(every_got);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
}

/* ------------------------------------------------------------------ (d, e) bad operands */

static void check_host_operands(void)
{
    enum { N = 8 };
    float host_x[N] = {1, 2, 3, 4, 5, 6, 7, 8}, old[N] = {9, 9, 9, 9, 9, 9, 9, 9};
    float *y = dev_from(&gd, old, N);

    /* A host input: the op is skipped, the next sync names op and operand, once. */
    gd.ops->axpby(gd.ctx, N, 2.0f, host_x, 0.0f, y);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "cpu-guarded: axpby: operand 'x'");
    CHECK(device_holds(&gd, y, old, N));
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));

    /* A host output is not written either; the error comes out of the next download. */
    float host_c[N];
    memcpy(host_c, old, sizeof host_c);
    gd.ops->gemm(gd.ctx, 0, 0, 2, 4, 2, 1.0f, y, 2, y, 4, 0.0f, host_c, 4);
    float back[N];
    EXPECT_ERROR(crew_dev_download_f32(&gd, back, y, N), "gemm: operand 'c'");
    CHECK(memcmp(host_c, old, sizeof host_c) == 0);
    CHECK(memcmp(back, old, sizeof back) == 0); /* the download itself still happened */
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));

    /* The first failure wins; both are gone after one report. */
    gd.ops->fill(gd.ctx, host_x, 0.0f, N);
    gd.ops->copy(gd.ctx, y, host_x, N);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "fill: operand 'x'");
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
    CHECK(host_x[0] == 1.0f && device_holds(&gd, y, old, N));

    /* A status-returning op reports its own bad operand at once. */
    double sum = -1.0;
    EXPECT_ERROR(gd.ops->sum(gd.ctx, host_x, N, &sum), "sum: operand 'x'");
    CHECK(sum == -1.0);
    int64_t correct = 0;
    EXPECT_ERROR(gd.ops->softmax_xent(gd.ctx, y, (const int32_t *)host_x, 2, 4, 1.0f, y, y, &correct),
                 "softmax_xent: operand 'labels'");
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
    crew_dev_free(&gd, y);
}

static void check_bounds(void)
{
    enum { N = 10 };
    float zeros[N] = {0}, ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    float *x = dev_f32(&gd, N);

    gd.ops->fill(gd.ctx, x, 1.0f, N + 1);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "fill: operand 'x'");
    CHECK(device_holds(&gd, x, zeros, N));
    gd.ops->fill(gd.ctx, x + 1, 1.0f, N);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "fill: operand 'x'");
    gd.ops->fill(gd.ctx, x + 1, 1.0f, N - 1);
    gd.ops->fill(gd.ctx, x, 1.0f, 1);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
    CHECK(device_holds(&gd, x, ones, N));
    gd.ops->fill(gd.ctx, x + N, 2.0f, 0); /* nothing touched: not an error */
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));

    float back[N + 1];
    EXPECT_ERROR(crew_dev_download_f32(&gd, back, x, N + 1), "download: operand 'src'");
    EXPECT_ERROR(crew_dev_upload_f32(&gd, x, ones, N + 1), "upload: operand 'dst'");
    double sum;
    EXPECT_ERROR(gd.ops->sum(gd.ctx, x + 1, N, &sum), "sum: operand 'x'");

    /* gemm's extent follows the leading dimension: c [2, 4] with ldc 5 ends at 5 + 4 = 9. */
    float *c = dev_f32(&gd, 8);
    gd.ops->gemm(gd.ctx, 0, 0, 2, 4, 1, 1.0f, x, 1, x, 4, 0.0f, c, 5);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "gemm: operand 'c' (");
    /* Transposed, a [k, m] = [3, 2] with lda 3 ends at 2·3 + 2 = 8 <= N; lda 5 ends at 12 > N. */
    float *b = dev_f32(&gd, 3 * 4);
    gd.ops->gemm(gd.ctx, 1, 0, 2, 4, 3, 1.0f, x, 3, b, 4, 0.0f, c, 4);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
    gd.ops->gemm(gd.ctx, 1, 0, 2, 4, 3, 1.0f, x, 5, b, 4, 0.0f, c, 4);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "gemm: operand 'a'");
    /* b^T: [n, k] = [4, 3] with ldb 3 is 12 floats, one more than 11. */
    float *b11 = dev_f32(&gd, 11);
    gd.ops->gemm(gd.ctx, 1, 1, 2, 4, 3, 1.0f, x, 3, b11, 3, 0.0f, c, 4);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "gemm: operand 'b'");
    crew_dev_free(&gd, b);
    crew_dev_free(&gd, b11);

    /* Window ops: an input one element short. */
    float *img = dev_f32(&gd, POOL_IN - 1), *y = dev_f32(&gd, POOL_OUT);
    gd.ops->avgpool_forward(gd.ctx, img, y, &pool);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "avgpool_forward: operand 'x'");
    crew_dev_free(&gd, img);
    crew_dev_free(&gd, y);
    crew_dev_free(&gd, c);
    crew_dev_free(&gd, x);
}

/* ------------------------------------------------------------------ (f) deferred uploads */

static void check_deferred_uploads(void)
{
    enum { N = 6 };
    float a[N] = {1, 2, 3, 4, 5, 6}, b[N] = {10, 20, 30, 40, 50, 60}, c[N] = {-1, -2, -3, -4, -5, -6};
    float staging[N];
    float *d = dev_from(&gd, a, N);
    crew_queue *q = NULL;
    CHECK_OK(gd.ops->queue_create(gd.ctx, &q));

    /* Ordered by queue_wait: compute work (and download) sees the copy only after it. */
    CHECK_OK(gd.ops->upload(gd.ctx, q, d, b, N, CREW_DT_F32));
    CHECK_MSG(device_holds(&gd, d, a, N), "an upload on a queue landed before the queue was waited on");
    CHECK_OK(gd.ops->queue_wait(gd.ctx, NULL, q));
    CHECK(device_holds(&gd, d, b, N));

    /* Ordered by sync, with the host buffer read when the copy happens. */
    memcpy(staging, c, sizeof staging);
    CHECK_OK(gd.ops->upload(gd.ctx, q, d, staging, N, CREW_DT_F32));
    CHECK(device_holds(&gd, d, b, N));
    CHECK_OK(gd.ops->sync(gd.ctx, NULL)); /* the compute queue's sync does not flush q */
    CHECK(device_holds(&gd, d, b, N));
    CHECK_OK(gd.ops->sync(gd.ctx, q));
    CHECK(device_holds(&gd, d, c, N));

    /* A host buffer reused before the sync sends the new bytes; uploads land in order. */
    memcpy(staging, a, sizeof staging);
    CHECK_OK(gd.ops->upload(gd.ctx, q, d, staging, N, CREW_DT_F32));
    CHECK_OK(gd.ops->upload(gd.ctx, q, d + 2, b, 2, CREW_DT_F32));
    memcpy(staging, b, sizeof staging);
    CHECK_OK(gd.ops->sync(gd.ctx, q));
    float want[N] = {10, 20, 10, 20, 50, 60};
    CHECK(device_holds(&gd, d, want, N));

    /* Waiting the other way round (compute waited on by q) flushes nothing of q's. */
    crew_queue *q2 = NULL;
    CHECK_OK(gd.ops->queue_create(gd.ctx, &q2));
    CHECK_OK(gd.ops->upload(gd.ctx, q, d, a, N, CREW_DT_F32));
    CHECK_OK(gd.ops->queue_wait(gd.ctx, q, NULL));
    CHECK_OK(gd.ops->queue_wait(gd.ctx, q, q2));
    CHECK(device_holds(&gd, d, want, N));
    CHECK_OK(gd.ops->queue_wait(gd.ctx, q2, q)); /* q2's work must see q's upload */
    CHECK(device_holds(&gd, d, a, N));

    /* Destroying a queue drops its pending uploads; freeing their target drops them too. */
    CHECK_OK(gd.ops->upload(gd.ctx, q, d, c, N, CREW_DT_F32));
    gd.ops->queue_destroy(gd.ctx, q);
    CHECK(device_holds(&gd, d, a, N));
    float *e = dev_f32(&gd, N);
    CHECK_OK(gd.ops->upload(gd.ctx, q2, e, c, N, CREW_DT_F32));
    CHECK_OK(gd.ops->upload(gd.ctx, q2, d, b, N, CREW_DT_F32));
    crew_dev_free(&gd, e);
    CHECK_OK(gd.ops->sync(gd.ctx, q2));
    CHECK(device_holds(&gd, d, b, N));

    /* A bad destination is caught when enqueued, not when flushed. */
    EXPECT_ERROR(gd.ops->upload(gd.ctx, q2, staging, a, N, CREW_DT_F32), "upload: operand 'dst'");
    CHECK_OK(gd.ops->sync(gd.ctx, q2));
    gd.ops->queue_destroy(gd.ctx, q2);
    gd.ops->queue_destroy(gd.ctx, NULL);
    crew_dev_free(&gd, d);
}

/* ------------------------------------------------------------------ (g) host_alias */

static void check_host_alias(void)
{
    enum { N = 12 };
    float v[N];
    fill_uniform(v, N, -1.0f, 1.0f, 70);
    float *d = dev_from(&gd, v, N);
    float *alias = gd.ops->host_alias(gd.ctx, d, N, CREW_DT_F32);
    CHECK(alias != NULL && alias != d);
    if (alias) {
        CHECK(memcmp(alias, v, sizeof v) == 0);
        alias[3] = 42.0f;
        v[3] = 42.0f;
        CHECK(device_holds(&gd, d, v, N));
        CHECK(gd.ops->host_alias(gd.ctx, d + 1, N - 1, CREW_DT_F32) == alias + 1);
    }
    CHECK(gd.ops->host_alias(gd.ctx, v, N, CREW_DT_F32) == NULL);
    CHECK(gd.ops->host_alias(gd.ctx, d, N + 1, CREW_DT_F32) == NULL);
    CHECK(gd.ops->host_alias(gd.ctx, d + 1, N, CREW_DT_F32) == NULL);
    CHECK(gd.ops->host_alias(gd.ctx, d, N / 2 + 1, CREW_DT_F64) == NULL);
    CHECK(gd.ops->host_alias(gd.ctx, d, N / 2, CREW_DT_F64) == (void *)alias);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL)); /* a NULL answer is no device failure */
    crew_dev_free(&gd, d);
}

/* ------------------------------------------------------------------ (h) free */

static void check_free(void)
{
    enum { N = 4 };
    float v[N] = {1, 2, 3, 4}, host[N];
    float *d = dev_from(&gd, v, N);
    gd.ops->free(gd.ctx, d + 1);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "free");
    CHECK(device_holds(&gd, d, v, N)); /* still allocated */
    gd.ops->free(gd.ctx, host);
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "not the start of a device allocation");
    gd.ops->free(gd.ctx, d);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
    CHECK(gd.ops->host_alias(gd.ctx, d, N, CREW_DT_F32) == NULL);
    gd.ops->free(gd.ctx, d); /* twice */
    EXPECT_ERROR(gd.ops->sync(gd.ctx, NULL), "free");
}

/* ------------------------------------------------------------------ (i) host_alias across threads */

enum { ALIAS_N = 64, ROUNDS = 2000 };

typedef struct alias_job {
    const float *d;
    int bad;  /* lookups that failed or read the wrong values */
} alias_job;

static void *alias_loop(void *arg)
{
    alias_job *j = arg;
    for (int i = 0; i < ROUNDS; i++) {
        const float *a = gd.ops->host_alias(gd.ctx, j->d + i % ALIAS_N, 1, CREW_DT_F32);
        j->bad += !a || *a != (float)(i % ALIAS_N);
    }
    return NULL;
}

static void check_threads(void)
{
    float v[ALIAS_N];
    for (int i = 0; i < ALIAS_N; i++) v[i] = (float)i;
    alias_job job = {dev_from(&gd, v, ALIAS_N), 0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, alias_loop, &job) == 0);
    /* Meanwhile this thread reshapes the table around the buffer the other one reads. */
    float *live[8] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int slot = i % 8;
        crew_dev_free(&gd, live[slot]);
        live[slot] = dev_f32(&gd, 1 + i % 37);
    }
    pthread_join(t, NULL);
    CHECK_MSG(job.bad == 0, "%d host_alias lookups went wrong", job.bad);
    for (int i = 0; i < 8; i++) crew_dev_free(&gd, live[i]);
    crew_dev_free(&gd, (void *)job.d);
    CHECK_OK(gd.ops->sync(gd.ctx, NULL));
}

int main(void)
{
    CHECK_OK(crew_cpu_backend_create(1, &cpu));
    CHECK_OK(crew_device_open("cpu-guarded", 0, NULL, &gd));
    CHECK(gd.ops && strcmp(gd.ops->name, "cpu-guarded") == 0);
    if (!gd.ops || !cpu.ops) return check_report();

    check_host_access_traps();
    check_transfers();
    check_same_as_cpu();
    check_host_operands();
    check_bounds();
    check_deferred_uploads();
    check_host_alias();
    check_free();
    check_threads();

    /* destroy takes care of what is left: a buffer and a queue with an upload pending. */
    float left[4] = {1, 2, 3, 4};
    float *d = dev_f32(&gd, 4);
    crew_queue *q = NULL;
    CHECK_OK(gd.ops->queue_create(gd.ctx, &q));
    CHECK_OK(gd.ops->upload(gd.ctx, q, d, left, 4, CREW_DT_F32));
    crew_device_close(&gd);
    crew_device_close(&cpu);
    return check_report();
}
