/* test_backend_ops.c — every backend op, one by one, on every device kind built in
 * (crew_device_kinds: "cpu" and "cpu-guarded" today), against naive reference loops written here
 * in double precision (or against values worked out by hand, for the optimisers).
 *
 * The CPU kernels are the reference every other backend is held to: each check passes on "cpu"
 * within the tolerance stated next to it, and every other kind runs the same check against the
 * same reference. A tolerance is a table of rows by kind, and a kind without a row of its own is
 * held to the first row, the CPU's; so a CUDA backend runs here unchanged, and where its kernels
 * round differently (fused multiply-adds, another order of sums) the looser figure it needs goes
 * in a row of its own next to the check, with the reason.
 *
 * Device memory: every check builds its inputs on the host, uploads them into device buffers
 * from the backend's alloc, runs the op on device addresses, checks that sync(ctx, NULL) returns
 * CREW_OK (a failed compute op surfaces there), downloads the outputs and compares them on the
 * host. Nothing here reads or writes through a device address: the "cpu-guarded" kind traps any
 * host access to device memory, so passing on it proves that the test keeps to the device seam.
 * A host array handed to upload stays unchanged until the next sync, as backend.h asks.
 *
 * Tolerances: the kernels compute in float32, so a result built from K products carries a
 * rounding error of about K·2^-24 relative to the magnitude of its terms. The problems here have
 * K ≤ 60 and terms of magnitude ≤ 1, so 1e-5 relative (+1e-6 absolute near zero) leaves a margin
 * of ~3x over the worst case while still catching any wrong index, which errs by O(1).
 * Ops that only move or pick values (transfers, copy, fill, im2col, max pooling, embedding rows)
 * must be exact, and so must what backend.h defines bit for bit: sum (in order, in double),
 * all_finite, and the hash of equal bytes. Where the terms of a result may cancel (the
 * normalisation ops), its tolerance is relative to the size of the terms, not of the result
 * (first_mismatch_of_sum). */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "nn/window_geometry.h"
#include "optim/optimizer.h"

#define RTOL 1e-5
#define ATOL 1e-6

/* ------------------------------------------------------------------ the device under test */

typedef struct device {
    const crew_device_kind *kind; /* its name leads every failure message */
    crew_backend be;
} device;

/* The message of a failed check, formatted only when one fails (CHECK_MSG evaluates its
 * arguments only then), so that the kind can lead every message. */
static const char *say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *say(const char *fmt, ...)
{
    static char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

/* CHECK_MSG and CHECK_OK with the device kind in front of the message. */
#define EXPECT(d, cond, ...) CHECK_MSG(cond, "[%s] %s", (d)->kind->name, say(__VA_ARGS__))
#define EXPECT_OK(d, expr)                                                                         \
    do {                                                                                           \
        crew_status expect_s_ = (expr);                                                            \
        CHECK_MSG(expect_s_ == CREW_OK, "[%s] %s: %s", (d)->kind->name, #expr,                     \
                  crew_status_message(expect_s_));                                                 \
        crew_status_free(expect_s_);                                                               \
    } while (0)
/* Every check ends its ops with this: a failure the backend kept for later fails here. */
#define EXPECT_SYNCED(d) EXPECT_OK(d, (d)->be.ops->sync((d)->be.ctx, NULL))

/* ------------------------------------------------------------------ tolerances by kind */

/* A tolerance for one check: the first row is the CPU's; a table ends with a row of kind NULL. */
typedef struct tolerance {
    const char *kind;
    double rtol, atol;
} tolerance;

static tolerance tol_for(const device *d, const tolerance *rows)
{
    for (const tolerance *t = rows; t->kind; t++)
        if (strcmp(t->kind, d->kind->name) == 0) return *t;
    return rows[0];
}

static int close_to(double got, double want, tolerance t)
{
    return fabs(got - want) <= t.atol + t.rtol * fmax(fabs(got), fabs(want));
}

/* Index of the first element of got[n] not within tolerance of want[n], or -1. */
static int64_t first_mismatch(const float *got, const double *want, int64_t n, tolerance t)
{
    for (int64_t i = 0; i < n; i++)
        if (!close_to(got[i], want[i], t)) return i;
    return -1;
}

static int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ------------------------------------------------------------------ host and device buffers */

/* Host arrays come zeroed; a failed allocation ends the test (it is no finding about the op). */
static void *hbuf(crew_dtype t, int64_t n)
{
    void *p = calloc((size_t)(n > 0 ? n : 1), crew_dtype_size(t));
    if (!p) abort();
    return p;
}

static float *fbuf(int64_t n) { return hbuf(CREW_DT_F32, n); }
static double *dbuf(int64_t n) { return hbuf(CREW_DT_F64, n); }

/* Frees a NULL-terminated list of host arrays or of device buffers. */
static void host_free_list(void *const *p)
{
    for (; *p; p++) free(*p);
}

static void dev_free_list(const device *d, void *const *p)
{
    for (; *p; p++) crew_dev_free(&d->be, *p);
}

#define HOST_FREE(...) host_free_list((void *const[]){__VA_ARGS__, NULL})
#define DEV_FREE(d, ...) dev_free_list(d, (void *const[]){__VA_ARGS__, NULL})

/* n elements of device memory, zero-filled by the contract; at least one, since backend.h does not
 * say what an allocation of none gives (a GPU's may be NULL) and the checks of empty ranges need
 * an address to pass. */
static void *dev_alloc(const device *d, crew_dtype t, int64_t n)
{
    void *p = NULL;
    crew_status s = d->be.ops->alloc(d->be.ctx, t, n > 0 ? n : 1, &p);
    if (s || !p) {
        fprintf(stderr, "[%s] alloc of %lld elements failed: %s\n", d->kind->name, (long long)n,
                crew_status_message(s));
        abort();
    }
    return p;
}

/* A new device buffer holding host[n], uploaded on the compute queue. */
static void *dev_copy_of(const device *d, crew_dtype t, const void *host, int64_t n)
{
    void *p = dev_alloc(d, t, n);
    EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, p, host, n, t));
    return p;
}

static float *dev_f32(const device *d, const float *h, int64_t n) { return dev_copy_of(d, CREW_DT_F32, h, n); }
static int32_t *dev_i32(const device *d, const int32_t *h, int64_t n) { return dev_copy_of(d, CREW_DT_I32, h, n); }
static int64_t *dev_i64(const device *d, const int64_t *h, int64_t n) { return dev_copy_of(d, CREW_DT_I64, h, n); }
static double *dev_f64(const device *d, const double *h, int64_t n) { return dev_copy_of(d, CREW_DT_F64, h, n); }
static float *dev_zeros_f32(const device *d, int64_t n) { return dev_alloc(d, CREW_DT_F32, n); }

/* Downloads dev[n] into host (after everything on the compute queue). */
static void fetch(const device *d, void *host, const void *dev, int64_t n, crew_dtype t)
{
    EXPECT_OK(d, d->be.ops->download(d->be.ctx, host, dev, n, t));
}

/* dev[n] downloaded into a fresh host array, which the caller frees. */
static void *host_copy_of(const device *d, crew_dtype t, const void *dev, int64_t n)
{
    void *h = hbuf(t, n);
    fetch(d, h, dev, n, t);
    return h;
}

static float *host_f32(const device *d, const float *p, int64_t n) { return host_copy_of(d, CREW_DT_F32, p, n); }
static int32_t *host_i32(const device *d, const int32_t *p, int64_t n) { return host_copy_of(d, CREW_DT_I32, p, n); }
static double *host_f64(const device *d, const double *p, int64_t n) { return host_copy_of(d, CREW_DT_F64, p, n); }

/* Doubles as floats, in a fresh host array (for comparisons made in float terms). */
static float *f32_of(const double *x, int64_t n)
{
    float *y = fbuf(n);
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static void fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t key)
{
    crew_rng r = crew_rng_make(key);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * crew_rng_next_uniform(&r);
}

/* ------------------------------------------------------------------ transfers, copy, fill */

/* values[n] uploaded into the middle of a buffer of n + 4 elements: the two elements on either
 * side stay zero (a fresh buffer is zero-filled; an upload writes n elements, not bytes or more),
 * a download of the whole buffer and one of the middle at a device offset give the bytes back. */
static void check_round_trip(const device *d, crew_dtype t, const void *values, int64_t n, const char *what)
{
    size_t size = crew_dtype_size(t);
    char *dev = dev_alloc(d, t, n + 4);
    EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, dev + 2 * size, values, n, t));
    char *all = host_copy_of(d, t, dev, n + 4), *middle = host_copy_of(d, t, dev + 2 * size, n);
    char *zeros = hbuf(t, 2);
    EXPECT(d, memcmp(middle, values, n * size) == 0, "%s: the round trip changed the bytes", what);
    EXPECT(d, memcmp(all + 2 * size, values, n * size) == 0, "%s: the whole buffer lacks the values", what);
    EXPECT(d, memcmp(all, zeros, 2 * size) == 0 && memcmp(all + (n + 2) * size, zeros, 2 * size) == 0,
           "%s: the neighbours of the upload are not zero", what);
    HOST_FREE(all, middle, zeros);
    DEV_FREE(d, dev);
}

/* Values each type must carry bit for bit: signed zeros, subnormals, extremes, NaN, integers
 * beyond what a float or a double holds. */
static void test_round_trips(const device *d)
{
    const float f32[] = {1.0f / 3.0f, -0.0f, FLT_MIN / 4.0f, FLT_MAX, -INFINITY, NAN};
    const double f64[] = {1.0 / 3.0, 1e300, -0x1p-1074, -0.0, DBL_MAX, (double)FLT_MAX * 4.0};
    const int32_t i32[] = {INT32_MIN, INT32_MAX, -1, 0, 16777217};
    const int64_t i64[] = {INT64_MIN, INT64_MAX, ((int64_t)1 << 53) + 1, -1, 0};
    check_round_trip(d, CREW_DT_F32, f32, 6, "f32");
    check_round_trip(d, CREW_DT_F64, f64, 6, "f64");
    check_round_trip(d, CREW_DT_I32, i32, 5, "i32");
    check_round_trip(d, CREW_DT_I64, i64, 5, "i64");
    EXPECT_SYNCED(d);
}

/* copy and fill on slices at device offsets: they write exactly their n elements. */
static void test_copy_fill(const device *d)
{
    enum { N = 10 };
    const crew_backend *be = &d->be;
    float src[N], want[N];
    fill_uniform(src, N, -1.0f, 1.0f, 1);
    float *src_d = dev_f32(d, src, N), *dst_d = dev_zeros_f32(d, N);
    be->ops->fill(be->ctx, dst_d, -2.5f, N);
    be->ops->fill(be->ctx, dst_d + N - 3, 0.5f, 3);
    be->ops->copy(be->ctx, dst_d + 2, src_d + 1, 5);
    be->ops->fill(be->ctx, dst_d, 99.0f, 0); /* n = 0: nothing */
    be->ops->copy(be->ctx, dst_d, src_d, 0);
    EXPECT_SYNCED(d);
    for (int i = 0; i < N; i++) want[i] = i < 2 ? -2.5f : i < 7 ? src[i - 1] : 0.5f;
    float *got = host_f32(d, dst_d, N);
    EXPECT(d, memcmp(got, want, sizeof want) == 0, "copy/fill: %g %g %g ... %g", got[0], got[2], got[6], got[N - 1]);
    HOST_FREE(got);
    DEV_FREE(d, src_d, dst_d);
}

/* Host staging buffers (host_alloc): host memory, which the test writes and reads directly (on
 * "cpu-guarded" a device address there would trap), the source of an upload and the target of a
 * download, on the compute queue and on a transfer queue; each dtype's width. Exact. */
static void check_staging(const device *d, crew_dtype t, int64_t n)
{
    const crew_backend *be = &d->be;
    size_t size = crew_dtype_size(t);
    void *from = NULL, *to = NULL;
    EXPECT_OK(d, be->ops->host_alloc(be->ctx, t, n, &from));
    EXPECT_OK(d, be->ops->host_alloc(be->ctx, t, n, &to));
    EXPECT(d, from && to, "host_alloc of %lld elements of dtype %d gave NULL", (long long)n, (int)t);
    if (!from || !to) {
        if (from) be->ops->host_free(be->ctx, from);
        if (to) be->ops->host_free(be->ctx, to);
        return;
    }
    unsigned char *bytes = from, *zeros = hbuf(t, 1);
    for (size_t i = 0; i < (size_t)n * size; i++) bytes[i] = (unsigned char)crew_rng_u64(1100 + (uint64_t)t, i);
    memset(to, 0xA5, (size_t)n * size);
    char *dev = dev_alloc(d, t, n + 2); /* the upload lands at element 1: both neighbours stay zero */
    EXPECT_OK(d, be->ops->upload(be->ctx, NULL, dev + size, from, n, t));
    EXPECT_SYNCED(d);
    EXPECT_OK(d, be->ops->download(be->ctx, to, dev + size, n, t));
    EXPECT(d, memcmp(to, from, (size_t)n * size) == 0, "dtype %d: staging → device → staging changed the bytes",
           (int)t);
    char *all = host_copy_of(d, t, dev, n + 2);
    EXPECT(d, memcmp(all, zeros, size) == 0 && memcmp(all + (n + 1) * size, zeros, size) == 0,
           "dtype %d: an upload from staging wrote outside its %lld elements", (int)t, (long long)n);
    /* On a transfer queue: the staging buffer stays as it is until the queue is waited on. */
    crew_queue *q = NULL;
    EXPECT_OK(d, be->ops->queue_create(be->ctx, &q));
    if (q) {
        for (size_t i = 0; i < (size_t)n * size; i++) bytes[i] ^= 0x5A;
        EXPECT_OK(d, be->ops->upload(be->ctx, q, dev + size, from, n, t));
        EXPECT_OK(d, be->ops->queue_wait(be->ctx, NULL, q));
        EXPECT_OK(d, be->ops->download(be->ctx, to, dev + size, n, t));
        EXPECT(d, memcmp(to, from, (size_t)n * size) == 0,
               "dtype %d: an upload from staging on a transfer queue did not land", (int)t);
        EXPECT_OK(d, be->ops->sync(be->ctx, q));
        be->ops->queue_destroy(be->ctx, q);
    }
    EXPECT_SYNCED(d);
    be->ops->host_free(be->ctx, from);
    be->ops->host_free(be->ctx, to);
    HOST_FREE(zeros, all);
    DEV_FREE(d, dev);
}

static void test_host_staging(const device *d)
{
    check_staging(d, CREW_DT_F32, 1000);
    check_staging(d, CREW_DT_F64, 37);
    check_staging(d, CREW_DT_I32, 5);
    check_staging(d, CREW_DT_I64, 1);
    d->be.ops->host_free(d->be.ctx, NULL); /* NULL: nothing */
    EXPECT_SYNCED(d);
}

/* crew_dev_transfer_f32 (registry.c) goes through a host buffer in slices of its TRANSFER_SLICE
 * floats, a power of two no larger than 1 << 20 (this file cannot see it). The lengths here run
 * past 1 << 20 by a few, so that the last slice is a partial one, and 1 << 20 itself is a whole
 * number of slices. */
enum { TRANSFER_BIG = 1 << 20 };

/* n floats from src_off in a buffer on `from` to dst_off in a buffer on `to`, both buffers 3
 * elements longer than the range needs: the range arrives exact and in place (values that tell
 * positions apart: a slice landing at the wrong offset, or read from the wrong one, shows), and
 * every element around it keeps the -1 it held. */
static void check_transfer(const device *to, const device *from, int64_t n, int64_t src_off, int64_t dst_off)
{
    int64_t src_len = src_off + n + 3, dst_len = dst_off + n + 3;
    float *src = fbuf(src_len);
    for (int64_t i = 0; i < src_len; i++) src[i] = (float)i + 0.25f; /* exact below 2^22 */
    float *src_d = dev_f32(from, src, src_len), *dst_d = dev_zeros_f32(to, dst_len);
    to->be.ops->fill(to->be.ctx, dst_d, -1.0f, dst_len);
    EXPECT_SYNCED(from);
    EXPECT_SYNCED(to);
    EXPECT_OK(to, crew_dev_transfer_f32(&to->be, dst_d + dst_off, &from->be, src_d + src_off, n));
    EXPECT_SYNCED(to);
    float *got = host_f32(to, dst_d, dst_len);
    int64_t bad = -1;
    for (int64_t i = 0; i < dst_len && bad < 0; i++) {
        float want = i >= dst_off && i < dst_off + n ? src[src_off + i - dst_off] : -1.0f;
        if (memcmp(&got[i], &want, sizeof want) != 0) bad = i;
    }
    EXPECT(to, bad < 0, "transfer of %lld floats from %s (offset %lld) to here (offset %lld): dst[%lld] = %.9g",
           (long long)n, from->kind->name, (long long)src_off, (long long)dst_off, (long long)bad,
           bad < 0 ? 0.0 : got[bad]);
    HOST_FREE(src, got);
    DEV_FREE(from, src_d);
    DEV_FREE(to, dst_d);
}

/* Between this device and one of another kind ("cpu-guarded" for "cpu", "cpu" for the others),
 * both ways: 1 << 20 floats and a few more, the same at offsets, 1 << 20 exactly, twice that and
 * one more, a few, none. */
static void test_transfer(const device *d)
{
    device other = {crew_device_kind_find(strcmp(d->kind->name, "cpu") == 0 ? "cpu-guarded" : "cpu"), {0}};
    if (!other.kind) return;
    const crew_device_options o = {.blas_threads = 1};
    EXPECT_OK(d, crew_device_open(other.kind->name, 0, &o, &other.be));
    if (!other.be.ops) return;
    for (int way = 0; way < 2; way++) {
        const device *to = way ? d : &other, *from = way ? &other : d;
        check_transfer(to, from, TRANSFER_BIG + 5, 0, 0);
        check_transfer(to, from, TRANSFER_BIG + 3, 5, 2);
        check_transfer(to, from, TRANSFER_BIG, 0, 1);
        check_transfer(to, from, 2 * TRANSFER_BIG + 1, 1, 0);
        check_transfer(to, from, 10, 3, 7);
        check_transfer(to, from, 0, 3, 1);
    }
    crew_device_close(&other.be);
}

/* ------------------------------------------------------------------ queues and host_alias */

/* A transfer queue ordered against the compute queue both ways: an op enqueued after
 * queue_wait(NULL, q) reads what q uploaded, and an upload on q after queue_wait(q, NULL) lands
 * after the op enqueued before it read the buffer. */
static void test_queues(const device *d)
{
    enum { N = 64 };
    const crew_backend *be = &d->be;
    float old[N], fresh[N], newer[N];
    fill_uniform(old, N, -1.0f, 1.0f, 2);
    fill_uniform(fresh, N, 2.0f, 3.0f, 3);
    fill_uniform(newer, N, 4.0f, 5.0f, 4);
    float *buf_d = dev_f32(d, old, N), *seen_d = dev_zeros_f32(d, N);
    EXPECT_SYNCED(d);
    crew_queue *q = NULL;
    EXPECT_OK(d, be->ops->queue_create(be->ctx, &q));
    if (!q) {
        DEV_FREE(d, buf_d, seen_d);
        return;
    }
    EXPECT_OK(d, be->ops->upload(be->ctx, q, buf_d, fresh, N, CREW_DT_F32));
    EXPECT_OK(d, be->ops->queue_wait(be->ctx, NULL, q));
    be->ops->copy(be->ctx, seen_d, buf_d, N);
    EXPECT_OK(d, be->ops->queue_wait(be->ctx, q, NULL));
    EXPECT_OK(d, be->ops->upload(be->ctx, q, buf_d, newer, N, CREW_DT_F32));
    EXPECT_OK(d, be->ops->sync(be->ctx, q));
    EXPECT_SYNCED(d);
    float *seen = host_f32(d, seen_d, N), *now = host_f32(d, buf_d, N);
    EXPECT(d, memcmp(seen, fresh, sizeof fresh) == 0, "the op after queue_wait(NULL, q) read %g, want %g", seen[0],
           fresh[0]);
    EXPECT(d, memcmp(now, newer, sizeof newer) == 0, "the second upload on q left %g, want %g", now[0], newer[0]);
    be->ops->queue_destroy(be->ctx, q);
    HOST_FREE(seen, now);
    DEV_FREE(d, buf_d, seen_d);
}

/* Kinds whose device memory is host-visible: host_alias must give an address there. */
static int host_visible(const device *d)
{
    return strcmp(d->kind->name, "cpu") == 0 || strcmp(d->kind->name, "cpu-guarded") == 0;
}

/* What the in-process communicator relies on: reading through the alias gives the uploaded
 * values (at an offset too), and what it writes there is what download sees. */
static void test_host_alias(const device *d)
{
    enum { N = 16 };
    const crew_backend *be = &d->be;
    float v[N];
    fill_uniform(v, N, -1.0f, 1.0f, 5);
    float *buf_d = dev_f32(d, v, N);
    EXPECT_SYNCED(d); /* the alias reads memory at once: the upload must have landed */
    if (!be->ops->host_alias) { /* a device the host cannot reach (a GPU, cpu-remote): none in its table */
        EXPECT(d, !host_visible(d), "host-visible memory without host_alias");
        DEV_FREE(d, buf_d);
        return;
    }
    float *alias = be->ops->host_alias(be->ctx, buf_d, N, CREW_DT_F32);
    float *tail = be->ops->host_alias(be->ctx, buf_d + 4, N - 4, CREW_DT_F32);
    if (host_visible(d)) EXPECT(d, alias && tail, "host_alias gave NULL on host-visible memory");
    if (alias && tail) {
        EXPECT(d, memcmp(alias, v, sizeof v) == 0, "reading through host_alias: %g, want %g", alias[0], v[0]);
        EXPECT(d, memcmp(tail, v + 4, sizeof(float) * (N - 4)) == 0, "host_alias at an offset: %g, want %g", tail[0],
               v[4]);
        alias[3] = 42.0f;
        tail[N - 5] = -7.0f;
        float *got = host_f32(d, buf_d, N);
        EXPECT(d, got[3] == 42.0f && got[N - 1] == -7.0f, "writes through host_alias: download gives %g and %g",
               got[3], got[N - 1]);
        HOST_FREE(got);
    }
    DEV_FREE(d, buf_d);
}

/* ------------------------------------------------------------------ reductions */

static double dev_sum(const device *d, const float *x_d, int64_t n)
{
    double out = NAN;
    EXPECT_OK(d, d->be.ops->sum(d->be.ctx, x_d, n, &out));
    return out;
}

static double dev_sum_squares(const device *d, const float *x_d, int64_t n)
{
    double out = NAN;
    EXPECT_OK(d, d->be.ops->sum_squares(d->be.ctx, x_d, n, &out));
    return out;
}

static int dev_all_finite(const device *d, const float *x_d, int64_t n)
{
    int out = -1;
    EXPECT_OK(d, d->be.ops->all_finite(d->be.ctx, x_d, n, &out));
    return out;
}

static uint64_t dev_hash(const device *d, const void *x_d, int64_t n, crew_dtype t)
{
    uint64_t out = 0;
    EXPECT_OK(d, d->be.ops->hash(d->be.ctx, x_d, n, t, &out));
    return out;
}

static double sequential_sum(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i];
    return s;
}

/* sum is defined in order and in double (a loss sum must not depend on the device), so it is held
 * bitwise to the sequential loop on every kind. The values span 2^±40, so additions in double
 * round: the first check proves that the data tell the order of additions apart. */
static void test_sum(const device *d)
{
    enum { N = 4099 };
    float *x = fbuf(N);
    crew_rng r = crew_rng_make(81);
    for (int i = 0; i < N; i++) { /* two statements: C leaves the order of two calls in one open */
        float u = 2.0f * crew_rng_next_uniform(&r) - 1.0f;
        x[i] = ldexpf(u, (int)crew_rng_next_below(&r, 81) - 40);
    }
    double want = sequential_sum(x, N), reversed = 0.0;
    for (int i = N - 1; i >= 0; i--) reversed += (double)x[i];
    EXPECT(d, !same_bits(want, reversed), "the test data sum to the same bits in both orders");
    float *x_d = dev_f32(d, x, N);
    double got = dev_sum(d, x_d, N), got_tail = dev_sum(d, x_d + 7, N - 7), want_tail = sequential_sum(x + 7, N - 7);
    EXPECT(d, same_bits(got, want), "sum %.17g, want %.17g", got, want);
    EXPECT(d, same_bits(got_tail, want_tail), "sum at an offset %.17g, want %.17g", got_tail, want_tail);
    EXPECT(d, same_bits(dev_sum(d, x_d, 0), 0.0), "the sum of nothing is not +0");
    EXPECT_SYNCED(d);
    HOST_FREE(x);
    DEV_FREE(d, x_d);
}

/* Many small values: a float accumulator would drift by ~1e-3 relative here; double in any order
 * stays within ~1e-16·sqrt(n) of the sequential sum. */
static const tolerance sum_squares_tol[] = {{"cpu", 1e-12, 0.0}, {NULL, 0, 0}};

static void test_sum_squares(const device *d)
{
    enum { N = 1000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i + 1) * (i % 2 ? -1.0f : 1.0f);
    float *x_d = dev_f32(d, x, N);
    /* Σ i² = n(n+1)(2n+1)/6 = 333,833,500: exact in double in any order, not in float. */
    double exact = dev_sum_squares(d, x_d, N);
    EXPECT(d, exact == 333833500.0, "sum_squares of ±1..1000: %.17g", exact);
    EXPECT(d, dev_sum_squares(d, x_d, 0) == 0.0, "sum_squares of nothing is not 0");
    int64_t n = 1 << 20;
    float *y = fbuf(n);
    fill_uniform(y, n, -1.0f, 1.0f, 41);
    double want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)y[i] * y[i];
    float *y_d = dev_f32(d, y, n);
    double got = dev_sum_squares(d, y_d, n);
    EXPECT(d, close_to(got, want, tol_for(d, sum_squares_tol)), "sum_squares %.17g, want %.17g", got, want);
    if (d->be.ops->sum_squares_lanes) { /* in pieces cut anywhere, through one state: sum_squares's bits */
        const int64_t cuts[] = {0, 16 * 1001, 16 * 1002 + 5, CREW_SQ_CHUNK * 7, CREW_SQ_CHUNK * 7 + 3,
                                n / 2 + 11, n - 5, n};
        double state[CREW_SQ_STATE] = {0.0};
        for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof *cuts); c++)
            EXPECT_OK(d, d->be.ops->sum_squares_lanes(d->be.ctx, y_d + cuts[c], cuts[c + 1] - cuts[c], state));
        double pieces = crew_sq_state_sum(state);
        EXPECT(d, pieces == got, "sum_squares_lanes in pieces %.17g, sum_squares %.17g", pieces, got);
    }
    EXPECT_SYNCED(d);
    HOST_FREE(y);
    DEV_FREE(d, x_d, y_d);
}

/* NaN (either sign), +inf and -inf are each caught anywhere, including the first and the last
 * element; a prefix that stops before one is finite; extremes and subnormals are finite. */
static void test_all_finite(const device *d)
{
    enum { N = 37 };
    float x[N];
    fill_uniform(x, N, -1e30f, 1e30f, 31);
    x[5] = FLT_MAX;
    x[6] = -FLT_MAX;
    x[7] = FLT_MIN / 4.0f; /* subnormal */
    float *x_d = dev_f32(d, x, N);
    EXPECT(d, dev_all_finite(d, x_d, N) == 1, "all finite: not seen as finite");
    EXPECT(d, dev_all_finite(d, x_d, 0) == 1, "nothing: not seen as finite");
    static const float specials[] = {NAN, -NAN, INFINITY, -INFINITY};
    const int64_t where[] = {0, 17, N - 1};
    for (int s = 0; s < 4; s++)
        for (int w = 0; w < 3; w++) {
            /* one element replaced on the device, then restored from x, which never changes */
            EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, x_d + where[w], &specials[s], 1, CREW_DT_F32));
            EXPECT(d, dev_all_finite(d, x_d, N) == 0, "all_finite missed special %d at %lld", s, (long long)where[w]);
            EXPECT(d, dev_all_finite(d, x_d, where[w]) == 1, "a prefix before special %d at %lld is not finite", s,
                   (long long)where[w]);
            EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, x_d + where[w], &x[where[w]], 1, CREW_DT_F32));
        }
    /* inf and -inf together must not cancel into a finite sum */
    static const float pair[] = {INFINITY, -INFINITY};
    EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, x_d + 3, pair, 2, CREW_DT_F32));
    EXPECT(d, dev_all_finite(d, x_d, N) == 0, "+inf and -inf together seen as finite");
    EXPECT_SYNCED(d);
    DEV_FREE(d, x_d);
}

/* n random elements of type t in two buffers hash equal; one bit flipped in the last byte of the
 * last element changes the hash (a hash of n bytes instead of n elements would miss it), and the
 * first n - 1 elements still hash equal. */
static void check_hash(const device *d, crew_dtype t, int64_t n)
{
    size_t size = crew_dtype_size(t);
    unsigned char *h = hbuf(t, n), *last = hbuf(t, 1);
    for (size_t i = 0; i < (size_t)n * size; i++) h[i] = (unsigned char)crew_rng_u64(90 + (uint64_t)t, i);
    char *a_d = dev_copy_of(d, t, h, n), *b_d = dev_copy_of(d, t, h, n);
    uint64_t a = dev_hash(d, a_d, n, t), b = dev_hash(d, b_d, n, t);
    EXPECT(d, a == b, "dtype %d, n %lld: equal contents hash %016llx and %016llx", (int)t, (long long)n,
           (unsigned long long)a, (unsigned long long)b);
    memcpy(last, h + (size_t)(n - 1) * size, size);
    last[size - 1] ^= 0x80;
    EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, b_d + (size_t)(n - 1) * size, last, 1, t));
    EXPECT(d, dev_hash(d, b_d, n, t) != a, "dtype %d, n %lld: a flipped bit left the hash as it was", (int)t,
           (long long)n);
    EXPECT(d, dev_hash(d, b_d, n - 1, t) == dev_hash(d, a_d, n - 1, t),
           "dtype %d, n %lld: equal first n - 1 elements hash differently", (int)t, (long long)n);
    EXPECT_SYNCED(d);
    HOST_FREE(h, last);
    DEV_FREE(d, a_d, b_d);
}

/* The drift check compares hashes across ranks: equal values hash equal on another device of the
 * same kind (index 1 where the kind has two). */
static void check_hash_across_devices(const device *d)
{
    enum { N = 333 };
    device other = {d->kind, {0}};
    const crew_device_options o = {.blas_threads = 1};
    EXPECT_OK(d, crew_device_open(d->kind->name, d->kind->available() > 1 ? 1 : 0, &o, &other.be));
    if (!other.be.ops) return;
    float x[N];
    fill_uniform(x, N, -1.0f, 1.0f, 95);
    float *x_d = dev_f32(d, x, N), *x_other = dev_f32(&other, x, N);
    uint64_t here = dev_hash(d, x_d, N, CREW_DT_F32), there = dev_hash(&other, x_other, N, CREW_DT_F32);
    EXPECT(d, here == there, "equal values hash %016llx on one device and %016llx on another",
           (unsigned long long)here, (unsigned long long)there);
    DEV_FREE(d, x_d);
    DEV_FREE(&other, x_other);
    crew_device_close(&other.be);
}

static void test_hash(const device *d)
{
    const crew_dtype types[] = {CREW_DT_F32, CREW_DT_F64, CREW_DT_I32, CREW_DT_I64};
    const int64_t sizes[] = {1, 37, 1000};
    for (int t = 0; t < 4; t++)
        for (int s = 0; s < 3; s++) check_hash(d, types[t], sizes[s]);
    check_hash_across_devices(d);
}

/* ------------------------------------------------------------------ gemm */

static const tolerance gemm_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};

/* op(A) is [m, k]: A is stored [m, lda] untransposed or [k, lda] transposed. */
static double at(const float *a, int64_t ld, int trans, int64_t r, int64_t c)
{
    return trans ? a[c * ld + r] : a[r * ld + c];
}

static void gemm_reference(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, const float *b, int64_t ldb, float beta, const float *c, int64_t ldc,
                           double *want)
{
    for (int64_t i = 0; i < m * ldc; i++) want[i] = c[i]; /* padding must stay as it was */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < k; p++) s += at(a, lda, ta, i, p) * at(b, ldb, tb, p, j);
            want[i * ldc + j] = alpha * s + beta * (double)c[i * ldc + j];
        }
}

static void check_gemm(const device *d, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, float beta)
{
    const crew_backend *be = &d->be;
    /* Leading dimensions wider than the matrices: a kernel that ignored lda/ldb/ldc would read
     * or write the padding columns. */
    int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 4;
    int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
    float *a = fbuf(a_rows * lda), *b = fbuf(b_rows * ldb), *c = fbuf(m * ldc);
    double *want = dbuf(m * ldc);
    fill_uniform(a, a_rows * lda, -1.0f, 1.0f, 11 + (uint64_t)ta);
    fill_uniform(b, b_rows * ldb, -1.0f, 1.0f, 13 + (uint64_t)tb);
    fill_uniform(c, m * ldc, -1.0f, 1.0f, 17);
    gemm_reference(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, want);
    float *a_d = dev_f32(d, a, a_rows * lda), *b_d = dev_f32(d, b, b_rows * ldb), *c_d = dev_f32(d, c, m * ldc);
    be->ops->gemm(be->ctx, ta, tb, m, n, k, alpha, a_d, lda, b_d, ldb, beta, c_d, ldc);
    EXPECT_SYNCED(d);
    float *got = host_f32(d, c_d, m * ldc);
    int64_t bad = first_mismatch(got, want, m * ldc, tol_for(d, gemm_tol));
    EXPECT(d, bad < 0, "gemm ta=%d tb=%d m=%lld n=%lld k=%lld: c[%lld] = %.9g, want %.9g", ta, tb, (long long)m,
           (long long)n, (long long)k, (long long)bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    HOST_FREE(a, b, c, want, got);
    DEV_FREE(d, a_d, b_d, c_d);
}

/* A GEMM the library refuses (a leading dimension shorter than a row) fails the device's next sync
 * with a message naming the library, and only that one: the CPU kinds of a oneDNN build, whose
 * sgemm checks its arguments and returns a status (cpu_gemm.c). OpenBLAS's prints instead and
 * returns nothing, and a GPU's cuBLAS call is not made with such arguments by any layer. */
static void check_gemm_refused(const device *d)
{
    char blas[256];
    crew_blas_describe(blas, sizeof blas);
    if (strncmp(blas, "oneDNN", 6) || strncmp(d->kind->name, "cpu", 3)) return;
    const crew_backend *be = &d->be;
    float *a_d = dev_zeros_f32(d, 8), *c_d = dev_zeros_f32(d, 4);
    be->ops->gemm(be->ctx, 0, 0, 2, 2, 4, 1.0f, a_d, 1, a_d, 2, 0.0f, c_d, 2); /* lda 1 < k 4 */
    crew_status st = be->ops->sync(be->ctx, NULL);
    EXPECT(d, st && strstr(crew_status_message(st), "oneDNN's sgemm failed with status 2 (invalid arguments)"),
           "a refused GEMM: %s", st ? crew_status_message(st) : "no error at the next sync");
    crew_status_free(st);
    EXPECT_SYNCED(d); /* reported once */
    DEV_FREE(d, a_d, c_d);
}

/* --precision bf16 (configure): the same GEMM on a second device of the kind whose operands
 * are rounded to bfloat16, against the reference of the rounded operands (their products exact,
 * summed in float32: the fp32 tolerance), and so far from the float32 reference that a device
 * ignoring the precision fails. */
static const tolerance gemm_bf16_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};

static void check_gemm_bf16(const device *fp32, int ta, int tb, int64_t m, int64_t n, int64_t k)
{
    device dv = {fp32->kind, {0}}, *d = &dv;
    const crew_device_options o = {.blas_threads = 1, .precision = CREW_PRECISION_BF16};
    EXPECT_OK(d, crew_device_open(d->kind->name, 0, &o, &d->be));
    if (!d->be.ops) return;
    int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n, a_n = m * k, b_n = k * n;
    float *a = fbuf(a_n), *b = fbuf(b_n), *c = fbuf(m * ldc), *ra = fbuf(a_n), *rb = fbuf(b_n);
    double *want = dbuf(m * ldc), *want32 = dbuf(m * ldc);
    fill_uniform(a, a_n, -1.0f, 1.0f, 21 + (uint64_t)ta);
    fill_uniform(b, b_n, -1.0f, 1.0f, 23 + (uint64_t)tb);
    fill_uniform(c, m * ldc, -1.0f, 1.0f, 27);
    for (int64_t i = 0; i < a_n; i++) ra[i] = crew_bf16_round(a[i]);
    for (int64_t i = 0; i < b_n; i++) rb[i] = crew_bf16_round(b[i]);
    gemm_reference(ta, tb, m, n, k, 1.25f, ra, lda, rb, ldb, 0.5f, c, ldc, want);
    gemm_reference(ta, tb, m, n, k, 1.25f, a, lda, b, ldb, 0.5f, c, ldc, want32);
    float *a_d = dev_f32(d, a, a_n), *b_d = dev_f32(d, b, b_n), *c_d = dev_f32(d, c, m * ldc);
    d->be.ops->gemm(d->be.ctx, ta, tb, m, n, k, 1.25f, a_d, lda, b_d, ldb, 0.5f, c_d, ldc);
    EXPECT_SYNCED(d);
    float *got = host_f32(d, c_d, m * ldc);
    int64_t bad = first_mismatch(got, want, m * ldc, tol_for(d, gemm_bf16_tol));
    EXPECT(d, bad < 0, "gemm in bf16 ta=%d tb=%d m=%lld n=%lld k=%lld: c[%lld] = %.9g, want %.9g", ta, tb, (long long)m,
           (long long)n, (long long)k, (long long)bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    float *as_fp32 = fbuf(m * ldc);
    for (int64_t i = 0; i < m * ldc; i++) as_fp32[i] = (float)want32[i];
    EXPECT(d, first_mismatch(as_fp32, want, m * ldc, tol_for(d, gemm_bf16_tol)) >= 0,
           "the bf16 and fp32 references agree: the case cannot tell the precisions apart");
    HOST_FREE(a, b, c, ra, rb, want, want32, got, as_fp32);
    DEV_FREE(d, a_d, b_d, c_d);
    crew_device_close(&d->be);
}

/* gemm_typed (backend.h): an operand held in bfloat16 gives the bits gemm gives on a device opened
 * in bf16 for its values widened to float, on a device opened in fp32 (d) and on one opened in bf16
 * alike; float32 operands on d give gemm's bits on d. Leading dimensions wider than the matrices. */
static void check_gemm_typed(const device *d, int ta, int tb, int a16, int b16, int64_t m, int64_t n, int64_t k)
{
    device bv = {d->kind, {0}}, *bf = &bv;
    const crew_device_options o = {.blas_threads = 1, .precision = CREW_PRECISION_BF16};
    EXPECT_OK(bf, crew_device_open(bf->kind->name, 0, &o, &bf->be));
    if (!bf->be.ops) return;
    const int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 3, ldc = n + 1;
    const int64_t a_n = (ta ? k : m) * lda, b_n = (tb ? n : k) * ldb;
    float *a = fbuf(a_n), *b = fbuf(b_n), *c = fbuf(m * ldc);
    crew_bf16 *a_bits = hbuf(CREW_DT_BF16, a_n), *b_bits = hbuf(CREW_DT_BF16, b_n);
    fill_uniform(a, a_n, -1.0f, 1.0f, 31 + (uint64_t)ta);
    fill_uniform(b, b_n, -1.0f, 1.0f, 37 + (uint64_t)tb);
    fill_uniform(c, m * ldc, -1.0f, 1.0f, 41);
    for (int64_t i = 0; i < a_n; i++) a_bits[i] = crew_bf16_bits(a[i]);
    for (int64_t i = 0; i < b_n; i++) b_bits[i] = crew_bf16_bits(b[i]);
    if (a16)
        for (int64_t i = 0; i < a_n; i++) a[i] = crew_bf16_widen(a_bits[i]);
    if (b16)
        for (int64_t i = 0; i < b_n; i++) b[i] = crew_bf16_widen(b_bits[i]);
    const crew_dtype at = a16 ? CREW_DT_BF16 : CREW_DT_F32, bt = b16 ? CREW_DT_BF16 : CREW_DT_F32;
    /* the wanted bits: plain gemm on the bf16 device when an operand is bfloat16, else on d */
    const int any16 = a16 || b16;
    const device *ref = any16 ? bf : d;
    float *want;
    {
        float *a_d = dev_f32(ref, a, a_n), *b_d = dev_f32(ref, b, b_n), *c_d = dev_f32(ref, c, m * ldc);
        ref->be.ops->gemm(ref->be.ctx, ta, tb, m, n, k, 0.75f, a_d, lda, b_d, ldb, 1.5f, c_d, ldc);
        EXPECT_SYNCED(ref);
        want = host_f32(ref, c_d, m * ldc);
        DEV_FREE(ref, a_d, b_d, c_d);
    }
    for (int on_bf = 0; on_bf <= any16; on_bf++) {
        const device *t = on_bf ? bf : d;
        void *a_d = a16 ? dev_copy_of(t, CREW_DT_BF16, a_bits, a_n) : dev_f32(t, a, a_n);
        void *b_d = b16 ? dev_copy_of(t, CREW_DT_BF16, b_bits, b_n) : dev_f32(t, b, b_n);
        float *c_d = dev_f32(t, c, m * ldc);
        t->be.ops->gemm_typed(t->be.ctx, ta, tb, m, n, k, 0.75f, a_d, at, lda, b_d, bt, ldb, 1.5f, c_d, ldc);
        EXPECT_SYNCED(t);
        float *got = host_f32(t, c_d, m * ldc);
        EXPECT(t, memcmp(got, want, sizeof(float) * (size_t)(m * ldc)) == 0,
               "gemm_typed a %s, b %s, ta=%d tb=%d m=%lld n=%lld k=%lld on a device opened in %s: not gemm's bits",
               a16 ? "bf16" : "f32", b16 ? "bf16" : "f32", ta, tb, (long long)m, (long long)n, (long long)k,
               on_bf ? "bf16" : "fp32");
        HOST_FREE(got);
        DEV_FREE(t, a_d, b_d, c_d);
    }
    HOST_FREE(a, b, c, a_bits, b_bits, want);
    crew_device_close(&bf->be);
}

/* to_bf16: core/bf16.h's bits, for ties both ways, the largest values (which round to infinity),
 * infinities, NaN, zeros of both signs and subnormals. */
static void test_to_bf16(const device *d)
{
    enum { N = 4099 };
    float *x = fbuf(N);
    fill_uniform(x, N, -3.0f, 3.0f, 51);
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7f8000u, 0x7f800000u, 0xff800000u,
                                0x7fc00001u, 0x80000000u, 0x00000001u, 0x00418000u};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) memcpy(&x[i], &special[i], sizeof x[i]);
    float *x_d = dev_f32(d, x, N);
    crew_bf16 *y_d = dev_alloc(d, CREW_DT_BF16, N);
    d->be.ops->to_bf16(d->be.ctx, x_d, y_d, N);
    EXPECT_SYNCED(d);
    crew_bf16 *y = host_copy_of(d, CREW_DT_BF16, y_d, N);
    int64_t bad = -1;
    for (int64_t i = 0; i < N && bad < 0; i++) {
        crew_bf16 want = crew_bf16_bits(x[i]);
        int nan = (want & 0x7f80u) == 0x7f80u && (want & 0x7fu); /* any NaN is a NaN */
        if (nan ? !((y[i] & 0x7f80u) == 0x7f80u && (y[i] & 0x7fu)) : y[i] != want) bad = i;
    }
    EXPECT(d, bad < 0, "to_bf16: x[%lld] = %.9g gave 0x%04x, want 0x%04x", (long long)bad, bad < 0 ? 0.0 : x[bad],
           bad < 0 ? 0u : y[bad], bad < 0 ? 0u : crew_bf16_bits(x[bad]));
    HOST_FREE(x, y);
    DEV_FREE(d, x_d, y_d);
}

/* crew_device_options.sum_block (crew verify's reference of other blocks without replicas): on a
 * device opened with it, a GEMM over the rows (op(a) = a) is the same GEMM block of rows by block,
 * a sum over the rows (aᵀ·b) the first block's GEMM (with the caller's beta), then each other
 * block's product on its own (beta = 0) added to the sum before, as the ordered all-reduce adds a
 * replica's (not the library's beta = 1, whose bits are its own); a column sum each block's sum
 * added to those before; and the other GEMMs are whole. Bit for bit against those pieces run on d
 * (opened whole). */
static void check_sum_block(const device *d)
{
    device bv = {d->kind, {0}}, *bl = &bv;
    const int64_t block = 3, m = 8, n = 5, k = 7;
    const crew_device_options o = {.blas_threads = 1, .sum_block = block};
    EXPECT_OK(bl, crew_device_open(bl->kind->name, 0, &o, &bl->be));
    if (!bl->be.ops) return;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int64_t lda = ta ? m : k, ldb = tb ? k : n, a_n = m * k, b_n = k * n;
            float *a = fbuf(a_n), *b = fbuf(b_n), *c = fbuf(m * n);
            fill_uniform(a, a_n, -1.0f, 1.0f, 51 + (uint64_t)ta);
            fill_uniform(b, b_n, -1.0f, 1.0f, 53 + (uint64_t)tb);
            fill_uniform(c, m * n, -1.0f, 1.0f, 57);
            float *a_b = dev_f32(bl, a, a_n), *b_b = dev_f32(bl, b, b_n), *c_b = dev_f32(bl, c, m * n);
            bl->be.ops->gemm(bl->be.ctx, ta, tb, m, n, k, 1.0f, a_b, lda, b_b, ldb, 0.5f, c_b, n);
            EXPECT_SYNCED(bl);
            float *got = host_f32(bl, c_b, m * n);
            float *a_d = dev_f32(d, a, a_n), *b_d = dev_f32(d, b, b_n), *c_d = dev_f32(d, c, m * n);
            if (!ta) /* the rows block by block */
                for (int64_t m0 = 0; m0 < m; m0 += block)
                    d->be.ops->gemm(d->be.ctx, ta, tb, m - m0 < block ? m - m0 : block, n, k, 1.0f, a_d + m0 * lda, lda, b_d,
                                    ldb, 0.5f, c_d + m0 * n, n);
            else if (!tb) { /* the sum over k's rows block by block: each block's product, then added */
                float *part = dev_f32(d, c, m * n);
                for (int64_t k0 = 0; k0 < k; k0 += block) {
                    d->be.ops->gemm(d->be.ctx, 1, 0, m, n, k - k0 < block ? k - k0 : block, 1.0f, a_d + k0 * lda, lda,
                                    b_d + k0 * ldb, ldb, k0 ? 0.0f : 0.5f, k0 ? part : c_d, n);
                    if (k0) d->be.ops->axpby(d->be.ctx, m * n, 1.0f, part, 1.0f, c_d);
                }
                DEV_FREE(d, part);
            }
            else /* aᵀ·bᵀ sums over no rows of the batch: whole */
                d->be.ops->gemm(d->be.ctx, ta, tb, m, n, k, 1.0f, a_d, lda, b_d, ldb, 0.5f, c_d, n);
            EXPECT_SYNCED(d);
            float *want = host_f32(d, c_d, m * n);
            EXPECT(d, memcmp(got, want, (size_t)(m * n) * sizeof(float)) == 0,
                   "gemm ta=%d tb=%d on a device summing in blocks of %lld rows is not its blocks' GEMMs", ta, tb,
                   (long long)block);
            HOST_FREE(a, b, c, got, want);
            DEV_FREE(bl, a_b, b_b, c_b);
            DEV_FREE(d, a_d, b_d, c_d);
        }
    /* column sums: rows 0-2, 3-5, 6-7 each from zero, added in order (after out when accumulating) */
    const int64_t rows = 8, cols = 4;
    float *x = fbuf(rows * cols), *out0 = fbuf(cols);
    fill_uniform(x, rows * cols, -1.0f, 1.0f, 61);
    fill_uniform(out0, cols, -1.0f, 1.0f, 63);
    for (int acc = 0; acc < 2; acc++) {
        float want[4];
        for (int64_t j = 0; j < cols; j++) {
            float s = acc ? out0[j] : 0.0f;
            for (int64_t r0 = 0; r0 < rows; r0 += block) {
                float part = 0.0f;
                for (int64_t r = r0; r < rows && r < r0 + block; r++) part += x[r * cols + j];
                s = r0 == 0 && !acc ? part : s + part;
            }
            want[j] = s;
        }
        float *x_b = dev_f32(bl, x, rows * cols), *o_b = dev_f32(bl, out0, cols);
        bl->be.ops->col_sum(bl->be.ctx, x_b, rows, cols, o_b, acc);
        EXPECT_SYNCED(bl);
        float *got = host_f32(bl, o_b, cols);
        EXPECT(d, memcmp(got, want, sizeof want) == 0, "col_sum (accumulate %d) in blocks of %lld rows", acc,
               (long long)block);
        HOST_FREE(got);
        DEV_FREE(bl, x_b, o_b);
    }
    HOST_FREE(x, out0);
    crew_device_close(&bl->be);
}

/* gemm_bias (backend.h): c = a · b + bias on d, against the double reference (the padding columns of
 * c left alone, bias NULL: the product alone, k = 0: the bias itself); a bfloat16 a gives the bits
 * of its widened values on a device opened in bf16, and a float32 a on that device is near the
 * rounded operands' reference; on a device summing in blocks of rows it is its blocks' products.
 * (Not that a row's bits are the same whatever rows share the call: a library's are not always,
 * docs/ARCHITECTURE.md, and equal runs make equal calls.) */
static int64_t first_mismatch_of_sum(const float *got, const double *want, const double *mag, int64_t n,
                                     tolerance t);

/* want, and in mag the sum of the terms' sizes (the float sum's error grows with them, not with
 * the result: first_mismatch_of_sum) */
static void gemm_bias_reference(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                                int64_t ldb, const float *bias, const float *c, int64_t ldc, double *want, double *mag)
{
    for (int64_t i = 0; i < m * ldc; i++) want[i] = c[i], mag[i] = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0, size = bias ? fabs(bias[j]) : 0.0;
            for (int64_t p = 0; p < k; p++) {
                double t = (double)a[i * lda + p] * b[p * ldb + j];
                s += t, size += fabs(t);
            }
            want[i * ldc + j] = s + (bias ? bias[j] : 0.0);
            mag[i * ldc + j] = size;
        }
}

/* c_d [m, ldc] holding c on d, gemm_bias run on it, back on the host */
static float *run_gemm_bias(const device *d, int64_t m, int64_t n, int64_t k, const void *a, crew_dtype at,
                            int64_t lda, const float *b, int64_t ldb, const float *bias, const float *c, int64_t ldc)
{
    void *a_d = dev_copy_of(d, at, a, m * lda);
    float *b_d = dev_f32(d, b, k * ldb), *bias_d = bias ? dev_f32(d, bias, n) : NULL, *c_d = dev_f32(d, c, m * ldc);
    d->be.ops->gemm_bias(d->be.ctx, m, n, k, a_d, at, lda, b_d, ldb, bias_d, c_d, ldc);
    EXPECT_SYNCED(d);
    float *got = host_f32(d, c_d, m * ldc);
    DEV_FREE(d, a_d, b_d, c_d);
    if (bias_d) DEV_FREE(d, bias_d);
    return got;
}

static void check_gemm_bias(const device *d, int64_t m, int64_t n, int64_t k, int with_bias)
{
    const int64_t lda = k + 3, ldb = n + 2, ldc = n + 1;
    float *a = fbuf(m * lda), *b = fbuf((k ? k : 1) * ldb), *bias = fbuf(n), *c = fbuf(m * ldc);
    double *want = dbuf(m * ldc), *mag = dbuf(m * ldc);
    fill_uniform(a, m * lda, -1.0f, 1.0f, 71);
    fill_uniform(b, (k ? k : 1) * ldb, -1.0f, 1.0f, 73);
    fill_uniform(bias, n, -1.0f, 1.0f, 79);
    fill_uniform(c, m * ldc, -9.0f, 9.0f, 83); /* what c held before: no part of the answer */
    const float *bp = with_bias ? bias : NULL;
    gemm_bias_reference(m, n, k, a, lda, b, ldb, bp, c, ldc, want, mag);
    float *got = run_gemm_bias(d, m, n, k, a, CREW_DT_F32, lda, b, ldb, bp, c, ldc);
    int64_t bad = first_mismatch_of_sum(got, want, mag, m * ldc, tol_for(d, gemm_tol));
    EXPECT(d, bad < 0, "gemm_bias m=%lld n=%lld k=%lld bias %d: c[%lld] = %.9g, want %.9g", (long long)m, (long long)n,
           (long long)k, with_bias, (long long)bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    HOST_FREE(a, b, bias, c, want, mag, got);
}

static void check_gemm_bias_bf16(const device *d, int64_t m, int64_t n, int64_t k)
{
    device bv = {d->kind, {0}}, *bf = &bv;
    const crew_device_options o = {.blas_threads = 1, .precision = CREW_PRECISION_BF16};
    EXPECT_OK(bf, crew_device_open(bf->kind->name, 0, &o, &bf->be));
    if (!bf->be.ops) return;
    const int64_t lda = k + 1, ldb = n, ldc = n;
    float *a = fbuf(m * lda), *b = fbuf(k * ldb), *bias = fbuf(n), *c = fbuf(m * ldc), *ra = fbuf(m * lda),
          *rb = fbuf(k * ldb);
    crew_bf16 *a_bits = hbuf(CREW_DT_BF16, m * lda);
    double *want = dbuf(m * ldc), *mag = dbuf(m * ldc);
    fill_uniform(a, m * lda, -1.0f, 1.0f, 87);
    fill_uniform(b, k * ldb, -1.0f, 1.0f, 89);
    fill_uniform(bias, n, -1.0f, 1.0f, 97);
    fill_uniform(c, m * ldc, -1.0f, 1.0f, 101);
    for (int64_t i = 0; i < m * lda; i++) a_bits[i] = crew_bf16_bits(a[i]), ra[i] = crew_bf16_round(a[i]);
    for (int64_t i = 0; i < k * ldb; i++) rb[i] = crew_bf16_round(b[i]);
    /* float32 operands on the bf16 device: the rounded operands' product */
    gemm_bias_reference(m, n, k, ra, lda, rb, ldb, bias, c, ldc, want, mag);
    float *got = run_gemm_bias(bf, m, n, k, a, CREW_DT_F32, lda, b, ldb, bias, c, ldc);
    int64_t bad = first_mismatch_of_sum(got, want, mag, m * ldc, tol_for(d, gemm_bf16_tol));
    EXPECT(bf, bad < 0, "gemm_bias in bf16 m=%lld n=%lld k=%lld: c[%lld] = %.9g, want %.9g", (long long)m,
           (long long)n, (long long)k, (long long)bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    /* a held in bfloat16, on either device: those bits */
    for (int on_bf = 0; on_bf < 2; on_bf++) {
        const device *t = on_bf ? bf : d;
        float *typed = run_gemm_bias(t, m, n, k, a_bits, CREW_DT_BF16, lda, b, ldb, bias, c, ldc);
        EXPECT(t, memcmp(typed, got, sizeof(float) * (size_t)(m * ldc)) == 0,
               "gemm_bias with a in bfloat16 m=%lld n=%lld k=%lld on a device opened in %s: not the bits of its "
               "values in bf16", (long long)m, (long long)n, (long long)k, on_bf ? "bf16" : "fp32");
        HOST_FREE(typed);
    }
    HOST_FREE(a, b, bias, c, ra, rb, a_bits, want, mag, got);
    crew_device_close(&bf->be);
}

static void check_gemm_bias_blocks(const device *d)
{
    device bv = {d->kind, {0}}, *bl = &bv;
    const int64_t block = 3, m = 8, n = 5, k = 7;
    const crew_device_options o = {.blas_threads = 1, .sum_block = block};
    EXPECT_OK(bl, crew_device_open(bl->kind->name, 0, &o, &bl->be));
    if (!bl->be.ops) return;
    float *a = fbuf(m * k), *b = fbuf(k * n), *bias = fbuf(n), *c = fbuf(m * n);
    fill_uniform(a, m * k, -1.0f, 1.0f, 103);
    fill_uniform(b, k * n, -1.0f, 1.0f, 107);
    fill_uniform(bias, n, -1.0f, 1.0f, 109);
    fill_uniform(c, m * n, -1.0f, 1.0f, 113);
    float *got = run_gemm_bias(bl, m, n, k, a, CREW_DT_F32, k, b, n, bias, c, n);
    for (int64_t r0 = 0; r0 < m; r0 += block) {
        int64_t rows = m - r0 < block ? m - r0 : block;
        float *want = run_gemm_bias(d, rows, n, k, a + r0 * k, CREW_DT_F32, k, b, n, bias, c + r0 * n, n);
        EXPECT(d, memcmp(got + r0 * n, want, sizeof(float) * (size_t)(rows * n)) == 0,
               "gemm_bias on a device summing in blocks of %lld rows: rows %lld.. are not their block's product",
               (long long)block, (long long)r0);
        HOST_FREE(want);
    }
    HOST_FREE(a, b, bias, c, got);
    crew_device_close(&bl->be);
}

static void test_gemm(const device *d)
{
    check_sum_block(d);
    check_gemm_bf16(d, 0, 0, 6, 5, 33);
    check_gemm_bf16(d, 1, 1, 4, 7, 19);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm_typed(d, ta, tb, 1, 0, 7, 5, 19);
            check_gemm_typed(d, ta, tb, 0, 1, 3, 9, 17);
        }
    check_gemm_typed(d, 0, 1, 1, 1, 6, 6, 11);
    check_gemm_typed(d, 1, 0, 0, 0, 5, 4, 9);
    test_to_bf16(d);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(d, ta, tb, 5, 7, 3, 1.0f, 0.0f);
            check_gemm(d, ta, tb, 9, 2, 13, 1.5f, 0.5f);
            check_gemm(d, ta, tb, 1, 11, 6, -0.75f, 1.0f);
            check_gemm(d, ta, tb, 4, 3, 0, 1.0f, 0.5f); /* nothing summed: c = beta·c */
            check_gemm(d, ta, tb, 4, 3, 0, 1.0f, 0.0f);
        }
    check_gemm_refused(d);
    /* gemm_bias: the models' forward products' shapes in small (a dense layer's 784 inputs, a
     * transformer's 128 and 512, a convolution's 288) and odd ones */
    check_gemm_bias(d, 7, 5, 9, 1);
    check_gemm_bias(d, 37, 33, 128, 1);
    check_gemm_bias(d, 21, 19, 512, 1);
    check_gemm_bias(d, 6, 17, 784, 1);
    check_gemm_bias(d, 50, 64, 288, 1);
    check_gemm_bias(d, 9, 12, 40, 0);
    check_gemm_bias(d, 4, 3, 0, 1); /* nothing summed: the bias */
    check_gemm_bias_bf16(d, 6, 9, 33);
    check_gemm_bias_blocks(d);
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

/* im2col then GEMM against a direct convolution (K ≤ 27 products). */
static const tolerance conv_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};
/* <im2col(x), c> against <x, col2im(c)>: each dx value sums at most k_h·k_w float terms, so the
 * difference is bounded relative to the sum of magnitudes (atol unused). */
static const tolerance col2im_tol[] = {{"cpu", 1e-5, 0.0}, {NULL, 0, 0}};

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

static void check_conv(const device *d, const conv_case *cc, int index)
{
    const crew_backend *be = &d->be;
    crew_window g;
    EXPECT_OK(d, plan(cc, &g));
    EXPECT(d, g.out_h == cc->want_oh && g.out_w == cc->want_ow && g.pad_top == cc->want_pt && g.pad_left == cc->want_pl,
           "conv case %d: geometry out (%lld, %lld) pad (%lld, %lld), want (%lld, %lld) pad (%lld, %lld)", index,
           (long long)g.out_h, (long long)g.out_w, (long long)g.pad_top, (long long)g.pad_left,
           (long long)cc->want_oh, (long long)cc->want_ow, (long long)cc->want_pt, (long long)cc->want_pl);
    if (g.out_h != cc->want_oh || g.out_w != cc->want_ow) return;
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, kk = cc->k_h * cc->k_w * cc->c;
    int64_t rows = cc->batch * g.out_h * g.out_w, ny = rows * cc->f;
    float *x = fbuf(nx), *w = fbuf(kk * cc->f), *col = fbuf(rows * kk);
    double *want = dbuf(ny);
    fill_uniform(x, nx, -1.0f, 1.0f, 100 + (uint64_t)index);
    fill_uniform(w, kk * cc->f, -1.0f, 1.0f, 200 + (uint64_t)index);
    fill_uniform(col, rows * kk, 5.0f, 6.0f, 7); /* garbage: padded taps must be overwritten with 0 */
    conv_reference(cc, x, w, want);
    float *x_d = dev_f32(d, x, nx), *w_d = dev_f32(d, w, kk * cc->f), *col_d = dev_f32(d, col, rows * kk);
    float *y_d = dev_zeros_f32(d, ny);
    be->ops->im2col(be->ctx, x_d, col_d, &g);
    be->ops->gemm(be->ctx, 0, 0, rows, cc->f, kk, 1.0f, col_d, kk, w_d, cc->f, 0.0f, y_d, cc->f);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, ny);
    int64_t bad = first_mismatch(y, want, ny, tol_for(d, conv_tol));
    EXPECT(d, bad < 0, "conv case %d: y[%lld] = %.9g, want %.9g", index, (long long)bad, bad < 0 ? 0.0 : y[bad],
           bad < 0 ? 0.0 : want[bad]);
    HOST_FREE(x, w, col, y, want);
    DEV_FREE(d, x_d, w_d, col_d, y_d);
}

/* col2im is the adjoint (transpose) of im2col: <im2col(x), c> = <x, col2im(c)> for all x, c. */
static void check_col2im_adjoint(const device *d, const conv_case *cc, int index)
{
    const crew_backend *be = &d->be;
    crew_window g;
    EXPECT_OK(d, plan(cc, &g));
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, ncol = cc->batch * g.out_h * g.out_w * cc->k_h * cc->k_w * cc->c;
    float *x = fbuf(nx), *c = fbuf(ncol), *garbage = fbuf(nx);
    fill_uniform(x, nx, -1.0f, 1.0f, 300 + (uint64_t)index);
    fill_uniform(c, ncol, -1.0f, 1.0f, 400 + (uint64_t)index);
    fill_uniform(garbage, nx, 9.0f, 10.0f, 8); /* col2im overwrites, so this must vanish */
    float *x_d = dev_f32(d, x, nx), *c_d = dev_f32(d, c, ncol), *dx_d = dev_f32(d, garbage, nx);
    float *col_d = dev_zeros_f32(d, ncol);
    be->ops->im2col(be->ctx, x_d, col_d, &g);
    be->ops->col2im(be->ctx, c_d, dx_d, &g);
    EXPECT_SYNCED(d);
    float *col = host_f32(d, col_d, ncol), *dx = host_f32(d, dx_d, nx);
    double lhs = 0.0, rhs = 0.0, mag = 0.0;
    for (int64_t i = 0; i < ncol; i++) {
        lhs += (double)col[i] * c[i];
        mag += fabs((double)col[i] * c[i]);
    }
    for (int64_t i = 0; i < nx; i++) rhs += (double)x[i] * dx[i];
    EXPECT(d, fabs(lhs - rhs) <= tol_for(d, col2im_tol).rtol * mag,
           "col2im case %d: <im2col(x), c> = %.12g but <x, col2im(c)> = %.12g", index, lhs, rhs);
    HOST_FREE(x, c, garbage, col, dx);
    DEV_FREE(d, x_d, c_d, dx_d, col_d);
}

/* The device's convolution library (conv_*: cuDNN on a GPU), on a second device of the kind opened
 * with conv_library, for every case it supports: the forward pass (adding into a seeded y) against
 * the direct convolution; the backward passes against their own direct sums in double:
 *   dx[b, ih, iw, c] = Σ dy[b, oh, ow, f] · w[kh, kw, c, f] over the windows that read (ih, iw),
 *   dw[kh, kw, c, f] = Σ x[b, ih, iw, c] · dy[b, oh, ow, f] over every window position.
 * Kinds without a library (cpu, cpu-guarded) have nothing to run; cpu-remote runs its stand-in
 * (direct sums, cpu_conv_direct.c). */
static const tolerance conv_library_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};

static void conv_backward_reference(const conv_case *cc, const float *x, const float *w, const float *dy, double *dx,
                                    double *dw)
{
    const int64_t nx = cc->batch * cc->h * cc->w * cc->c, nw = cc->k_h * cc->k_w * cc->c * cc->f;
    for (int64_t i = 0; i < nx; i++) dx[i] = 0.0;
    for (int64_t i = 0; i < nw; i++) dw[i] = 0.0;
    for (int64_t b = 0; b < cc->batch; b++)
        for (int64_t oh = 0; oh < cc->want_oh; oh++)
            for (int64_t ow = 0; ow < cc->want_ow; ow++)
                for (int64_t kh = 0; kh < cc->k_h; kh++)
                    for (int64_t kw = 0; kw < cc->k_w; kw++) {
                        int64_t ih = oh * cc->s_h - cc->want_pt + kh, iw = ow * cc->s_w - cc->want_pl + kw;
                        if (ih < 0 || ih >= cc->h || iw < 0 || iw >= cc->w) continue;
                        for (int64_t c = 0; c < cc->c; c++)
                            for (int64_t f = 0; f < cc->f; f++) {
                                double g = dy[((b * cc->want_oh + oh) * cc->want_ow + ow) * cc->f + f];
                                int64_t xi = ((b * cc->h + ih) * cc->w + iw) * cc->c + c,
                                        wi = ((kh * cc->k_w + kw) * cc->c + c) * cc->f + f;
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                    }
}

static void check_conv_library(const device *plain, const conv_case *cc, int index)
{
    if (!plain->be.ops->conv_supported) return;
    device dv = {plain->kind, {0}}, *d = &dv;
    const crew_device_options o = {.blas_threads = 1, .conv_library = 1};
    EXPECT_OK(d, crew_device_open(d->kind->name, 0, &o, &d->be));
    crew_window g;
    EXPECT_OK(d, plan(cc, &g));
    if (!d->be.ops || !d->be.ops->conv_supported(d->be.ctx, &g, cc->f)) { /* e.g. padding one-sided */
        crew_device_close(&d->be);
        return;
    }
    const crew_backend_ops *ops = d->be.ops;
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, nw = cc->k_h * cc->k_w * cc->c * cc->f;
    int64_t ny = cc->batch * g.out_h * g.out_w * cc->f;
    float *x = fbuf(nx), *w = fbuf(nw), *dy = fbuf(ny), *seed = fbuf(ny);
    double *want = dbuf(ny), *want_dx = dbuf(nx), *want_dw = dbuf(nw);
    fill_uniform(x, nx, -1.0f, 1.0f, 500 + (uint64_t)index);
    fill_uniform(w, nw, -1.0f, 1.0f, 600 + (uint64_t)index);
    fill_uniform(dy, ny, -1.0f, 1.0f, 700 + (uint64_t)index);
    fill_uniform(seed, ny, -1.0f, 1.0f, 800 + (uint64_t)index);
    conv_reference(cc, x, w, want);
    for (int64_t i = 0; i < ny; i++) want[i] += seed[i];
    conv_backward_reference(cc, x, w, dy, want_dx, want_dw);
    float *x_d = dev_f32(d, x, nx), *w_d = dev_f32(d, w, nw), *dy_d = dev_f32(d, dy, ny), *y_d = dev_f32(d, seed, ny);
    const int64_t ng = nx > nw ? nx : nw;
    float *garbage = fbuf(ng); /* dx and dw are overwritten, so this must vanish */
    fill_uniform(garbage, ng, 9.0f, 10.0f, 9);
    float *dx_d = dev_f32(d, garbage, nx), *dw_d = dev_f32(d, garbage, nw);
    ops->conv_forward(d->be.ctx, x_d, w_d, y_d, &g, cc->f);
    ops->conv_backward_data(d->be.ctx, dy_d, w_d, dx_d, &g, cc->f);
    ops->conv_backward_filter(d->be.ctx, x_d, dy_d, dw_d, &g, cc->f);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, ny), *dx = host_f32(d, dx_d, nx), *dw = host_f32(d, dw_d, nw);
    const tolerance t = tol_for(d, conv_library_tol);
    int64_t by = first_mismatch(y, want, ny, t), bx = first_mismatch(dx, want_dx, nx, t),
            bw = first_mismatch(dw, want_dw, nw, t);
    EXPECT(d, by < 0, "conv library case %d: y[%lld] = %.9g, want %.9g", index, (long long)by, by < 0 ? 0.0 : y[by],
           by < 0 ? 0.0 : want[by]);
    EXPECT(d, bx < 0, "conv library case %d: dx[%lld] = %.9g, want %.9g", index, (long long)bx,
           bx < 0 ? 0.0 : dx[bx], bx < 0 ? 0.0 : want_dx[bx]);
    EXPECT(d, bw < 0, "conv library case %d: dw[%lld] = %.9g, want %.9g", index, (long long)bw,
           bw < 0 ? 0.0 : dw[bw], bw < 0 ? 0.0 : want_dw[bw]);
    HOST_FREE(x, w, dy, seed, garbage, want, want_dx, want_dw, y, dx, dw);
    DEV_FREE(d, x_d, w_d, dy_d, y_d, dx_d, dw_d);
    crew_device_close(&d->be);
}

/* Convolutions of few taps (conv_taps_*, where the kind has them), in the order cpu_conv_taps.c
 * documents, worked out here in float: y = bias + Σ_t tap_t·w_t (t ascending, a padded tap 0), and
 * dw's each sample's positions summed from 0, row-major, the samples' sums added in order (or per
 * block of `block` samples, each block's sum added to those before). bf16: taps, w and dy rounded
 * first. */
static void conv_taps_expected(const conv_case *cc, const crew_window *g, const float *x, const float *w,
                               const float *bias, const float *dy, int bf16, int64_t block, float *y, float *dw)
{
    const int64_t taps = cc->k_h * cc->k_w * cc->c, nw = taps * cc->f;
    float *part = fbuf(nw), *sum = fbuf(nw), tv[CREW_CONV_TAPS_MAX];
    for (int64_t i = 0; i < nw; i++) dw[i] = 0.0f;
    for (int64_t i = 0; i < nw; i++) sum[i] = 0.0f;
    for (int64_t b = 0; b < cc->batch; b++) {
        for (int64_t i = 0; i < nw; i++) part[i] = 0.0f;
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                for (int64_t kh = 0; kh < cc->k_h; kh++)
                    for (int64_t kw = 0; kw < cc->k_w; kw++)
                        for (int64_t c = 0; c < cc->c; c++) {
                            int64_t ih = oh * cc->s_h - g->pad_top + kh, iw = ow * cc->s_w - g->pad_left + kw;
                            int inside = ih >= 0 && ih < cc->h && iw >= 0 && iw < cc->w;
                            float v = inside ? x[((b * cc->h + ih) * cc->w + iw) * cc->c + c] : 0.0f;
                            tv[(kh * cc->k_w + kw) * cc->c + c] = bf16 ? crew_bf16_round(v) : v;
                        }
                const int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * cc->f;
                for (int64_t f = 0; f < cc->f; f++) {
                    float acc = (bf16 ? crew_bf16_round(w[f]) : w[f]) * tv[0];
                    for (int64_t t = 1; t < taps; t++) {
                        const float wt = w[t * cc->f + f];
                        acc = acc + (bf16 ? crew_bf16_round(wt) : wt) * tv[t];
                    }
                    y[o + f] = bias ? bias[f] + acc : acc;
                    const float d = bf16 ? crew_bf16_round(dy[o + f]) : dy[o + f];
                    for (int64_t t = 0; t < taps; t++) part[t * cc->f + f] = part[t * cc->f + f] + d * tv[t];
                }
            }
        float *into = block ? sum : dw;
        for (int64_t i = 0; i < nw; i++) into[i] = into[i] + part[i];
        if (block && ((b + 1) % block == 0 || b + 1 == cc->batch)) {
            for (int64_t i = 0; i < nw; i++) dw[i] = dw[i] + sum[i];
            for (int64_t i = 0; i < nw; i++) sum[i] = 0.0f;
        }
    }
    HOST_FREE(part, sum);
}

/* Against the direct sums in double (within conv_tol) and, bit for bit, against the documented
 * order; with and without a bias; on devices summing in blocks of 2 samples and in bfloat16. */
static void check_conv_taps(const device *plain, const conv_case *cc, int index)
{
    if (!plain->be.ops->conv_taps_forward) return;
    for (int mode = 0; mode < 3; mode++) { /* plain, sum_block 2, bf16 */
        device dv = {plain->kind, {0}}, *d = &dv;
        const crew_device_options o = {.blas_threads = 1, .sum_block = mode == 1 ? 2 : 0,
                                       .precision = mode == 2 ? CREW_PRECISION_BF16 : CREW_PRECISION_FP32};
        EXPECT_OK(d, crew_device_open(d->kind->name, 0, &o, &d->be));
        if (!d->be.ops) return;
        crew_window g;
        EXPECT_OK(d, plan(cc, &g));
        const int64_t nx = cc->batch * cc->h * cc->w * cc->c, nw = cc->k_h * cc->k_w * cc->c * cc->f;
        const int64_t ny = cc->batch * g.out_h * g.out_w * cc->f;
        float *x = fbuf(nx), *w = fbuf(nw), *bias = fbuf(cc->f), *dy = fbuf(ny), *garbage = fbuf(ny > nw ? ny : nw);
        float *exp_y = fbuf(ny), *exp_dw = fbuf(nw);
        double *want = dbuf(ny), *want_dx = dbuf(nx), *want_dw = dbuf(nw);
        fill_uniform(x, nx, -1.0f, 1.0f, 900 + (uint64_t)index);
        fill_uniform(w, nw, -1.0f, 1.0f, 910 + (uint64_t)index);
        fill_uniform(bias, cc->f, -1.0f, 1.0f, 920 + (uint64_t)index);
        fill_uniform(dy, ny, -1.0f, 1.0f, 930 + (uint64_t)index);
        fill_uniform(garbage, ny > nw ? ny : nw, 9.0f, 10.0f, 9); /* y and dw are overwritten */
        conv_reference(cc, x, w, want);
        conv_backward_reference(cc, x, w, dy, want_dx, want_dw);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bb = with_bias ? bias : NULL;
            conv_taps_expected(cc, &g, x, w, bb, dy, mode == 2, mode == 1 ? 2 : 0, exp_y, exp_dw);
            float *x_d = dev_f32(d, x, nx), *w_d = dev_f32(d, w, nw), *b_d = dev_f32(d, bias, cc->f);
            float *dy_d = dev_f32(d, dy, ny), *y_d = dev_f32(d, garbage, ny), *dw_d = dev_f32(d, garbage, nw);
            d->be.ops->conv_taps_forward(d->be.ctx, x_d, w_d, with_bias ? b_d : NULL, y_d, &g, cc->f);
            d->be.ops->conv_taps_filter_grad(d->be.ctx, x_d, dy_d, dw_d, &g, cc->f);
            EXPECT_SYNCED(d);
            float *y = host_f32(d, y_d, ny), *dw = host_f32(d, dw_d, nw);
            const char *m = mode == 0 ? "" : mode == 1 ? " (sums in blocks of 2 samples)" : " (bf16)";
            EXPECT(d, !memcmp(y, exp_y, (size_t)ny * sizeof *y) && !memcmp(dw, exp_dw, (size_t)nw * sizeof *dw),
                   "conv taps case %d%s, bias %d: not the documented order's bits", index, m, with_bias);
            if (mode < 2) {
                for (int64_t i = 0; i < ny && with_bias; i++) y[i] -= bias[i % cc->f];
                const tolerance t = tol_for(d, conv_tol);
                int64_t by = first_mismatch(y, want, ny, t), bw = first_mismatch(dw, want_dw, nw, t);
                EXPECT(d, by < 0, "conv taps case %d%s: y[%lld] = %.9g, want %.9g", index, m, (long long)by,
                       by < 0 ? 0.0 : y[by], by < 0 ? 0.0 : want[by]);
                EXPECT(d, bw < 0, "conv taps case %d%s: dw[%lld] = %.9g, want %.9g", index, m, (long long)bw,
                       bw < 0 ? 0.0 : dw[bw], bw < 0 ? 0.0 : want_dw[bw]);
            }
            HOST_FREE(y, dw);
            DEV_FREE(d, x_d, w_d, b_d, dy_d, y_d, dw_d);
        }
        HOST_FREE(x, w, bias, dy, garbage, exp_y, exp_dw, want, want_dx, want_dw);
        crew_device_close(&d->be);
    }
}

/* Cases for the taps only: filters that fill no whole vector, one and a half of them, and more
 * than a group (cpu_conv_taps.c's 128); 27 taps (3x3 over 3 channels). */
static const conv_case taps_cases[] = {
    {3, 6, 5, 1, 37, 3, 3, 1, 1, CREW_PAD_SAME, 6, 5, 1, 1},
    {2, 7, 7, 3, 150, 3, 3, 2, 2, CREW_PAD_SAME, 4, 4, 1, 1},
    {5, 4, 4, 1, 7, 2, 2, 1, 1, CREW_PAD_VALID, 3, 3, 0, 0},
};

/* conv_taps_pool_* (where the kind has them) against the ops they stand for, bit for bit:
 * conv_taps_forward then maxpool_forward of relu(x) (y and arg-max), and maxpool_backward then
 * conv_taps_filter_grad and col_sum over the output positions (dkernel, dbias); on devices summing
 * in blocks of 3 (samples for the kernel, output positions for the bias: a block edge falls
 * between a window's two columns) and in bf16. Cases whose output tiles into 2x2 windows. */
static void check_conv_taps_pool(const device *plain, const conv_case *cc, int index)
{
    if (!plain->be.ops->conv_taps_pool_forward) return;
    for (int mode = 0; mode < 3; mode++) {
        device dv = {plain->kind, {0}}, *d = &dv;
        const crew_device_options o = {.blas_threads = 1, .sum_block = mode == 1 ? 3 : 0,
                                       .precision = mode == 2 ? CREW_PRECISION_BF16 : CREW_PRECISION_FP32};
        EXPECT_OK(d, crew_device_open(d->kind->name, 0, &o, &d->be));
        if (!d->be.ops) return;
        const crew_backend_ops *ops = d->be.ops;
        crew_window g, pg;
        EXPECT_OK(d, plan(cc, &g));
        const crew_shape conv_out = crew_shape3(g.out_h, g.out_w, cc->f);
        EXPECT_OK(d, crew_window_plan(&conv_out, 2, 2, 2, 2, CREW_PAD_VALID, &pg));
        pg.batch = cc->batch;
        const int64_t nx = cc->batch * cc->h * cc->w * cc->c, nw = cc->k_h * cc->k_w * cc->c * cc->f;
        const int64_t ny = cc->batch * g.out_h * g.out_w * cc->f, np = ny / 4;
        float *x = fbuf(nx), *w = fbuf(nw), *bias = fbuf(cc->f), *dy = fbuf(np);
        fill_uniform(x, nx, -1.0f, 1.0f, 940 + (uint64_t)index);
        fill_uniform(w, nw, -1.0f, 1.0f, 950 + (uint64_t)index);
        fill_uniform(bias, cc->f, -0.5f, 0.5f, 960 + (uint64_t)index);
        fill_uniform(dy, np, -1.0f, 1.0f, 970 + (uint64_t)index);
        float *x_d = dev_f32(d, x, nx), *w_d = dev_f32(d, w, nw), *b_d = dev_f32(d, bias, cc->f);
        float *dy_d = dev_f32(d, dy, np), *conv_d = dev_zeros_f32(d, ny), *y_want = dev_zeros_f32(d, np);
        float *y_d = dev_zeros_f32(d, np), *dw_want = dev_zeros_f32(d, nw), *db_want = dev_zeros_f32(d, cc->f);
        float *dw_d = dev_zeros_f32(d, nw), *db_d = dev_zeros_f32(d, cc->f);
        int32_t *am_want = dev_alloc(d, CREW_DT_I32, np), *am_d = dev_alloc(d, CREW_DT_I32, np);
        ops->conv_taps_forward(d->be.ctx, x_d, w_d, b_d, conv_d, &g, cc->f);
        ops->maxpool_forward(d->be.ctx, conv_d, y_want, am_want, &pg, 1);
        ops->maxpool_backward(d->be.ctx, dy_d, am_want, conv_d, &pg);
        ops->conv_taps_filter_grad(d->be.ctx, x_d, conv_d, dw_want, &g, cc->f);
        ops->col_sum(d->be.ctx, conv_d, ny / cc->f, cc->f, db_want, 0);
        ops->conv_taps_pool_forward(d->be.ctx, x_d, w_d, b_d, y_d, am_d, &g, cc->f);
        ops->conv_taps_pool_grads(d->be.ctx, x_d, dy_d, am_d, dw_d, db_d, &g, cc->f);
        EXPECT_SYNCED(d);
        float *y = host_f32(d, y_d, np), *yw = host_f32(d, y_want, np), *dw = host_f32(d, dw_d, nw);
        float *dww = host_f32(d, dw_want, nw), *db = host_f32(d, db_d, cc->f), *dbw = host_f32(d, db_want, cc->f);
        int32_t *am = host_i32(d, am_d, np), *amw = host_i32(d, am_want, np);
        int none = 0;
        for (int64_t i = 0; i < np; i++) none += amw[i] < 0;
        const char *m = mode == 0 ? "" : mode == 1 ? " (sums in blocks of 3)" : " (bf16)";
        EXPECT(d, !memcmp(y, yw, (size_t)np * sizeof *y) && !memcmp(am, amw, (size_t)np * sizeof *am),
               "conv taps pool case %d%s: y or arg-max not the two ops'", index, m);
        EXPECT(d, !memcmp(dw, dww, (size_t)nw * sizeof *dw) && !memcmp(db, dbw, (size_t)cc->f * sizeof *db),
               "conv taps pool case %d%s: dkernel or dbias not the three ops' (%g, %g)", index, m, dw[0], dww[0]);
        EXPECT(d, none > 0 && none < np, "conv taps pool case %d: %d of %lld windows send nothing back", index, none,
               (long long)np);
        HOST_FREE(x, w, bias, dy, y, yw, dw, dww, db, dbw, am, amw);
        DEV_FREE(d, x_d, w_d, b_d, dy_d, conv_d, y_want, y_d, dw_want, db_want, dw_d, db_d, am_want, am_d);
        crew_device_close(&d->be);
    }
}

/* Convolutions whose output tiles into 2x2 windows, for the one pass with relu and pool. */
static const conv_case taps_pool_cases[] = {
    {5, 6, 6, 1, 37, 3, 3, 1, 1, CREW_PAD_SAME, 6, 6, 1, 1},
    {3, 8, 4, 3, 20, 3, 3, 1, 1, CREW_PAD_SAME, 8, 4, 1, 1},
    {2, 9, 9, 2, 16, 2, 2, 1, 1, CREW_PAD_VALID, 8, 8, 0, 0},
    {4, 7, 7, 3, 150, 3, 3, 2, 2, CREW_PAD_SAME, 4, 4, 1, 1},
};

static void test_convolution(const device *d)
{
    for (int i = 0; i < (int)(sizeof conv_cases / sizeof conv_cases[0]); i++) {
        check_conv(d, &conv_cases[i], i);
        check_col2im_adjoint(d, &conv_cases[i], i);
        check_conv_library(d, &conv_cases[i], i);
        check_conv_taps(d, &conv_cases[i], i);
    }
    for (int i = 0; i < (int)(sizeof taps_cases / sizeof taps_cases[0]); i++)
        check_conv_taps(d, &taps_cases[i], 100 + i);
    for (int i = 0; i < (int)(sizeof taps_pool_cases / sizeof taps_pool_cases[0]); i++)
        check_conv_taps_pool(d, &taps_pool_cases[i], 200 + i);
}

/* ------------------------------------------------------------------ pooling */

/* Max pooling forward and its arg-max are exact; backward sums at most k_h·k_w gradients. */
static const tolerance maxpool_backward_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};
/* Average pooling: sums of at most 9 terms, divided by the cell count. */
static const tolerance avgpool_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};

/* The naive max pooling: y and arg-max (first maximum in window order, padding never wins) and
 * the gradient routed to the arg-max. */
static void maxpool_reference(const conv_case *cc, const crew_window *g, const float *x, const float *dy,
                              double *want_y, int32_t *want_argmax, double *want_dx)
{
    for (int64_t b = 0; b < cc->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++)
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
                    int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * cc->c + c;
                    want_y[o] = best;
                    want_argmax[o] = (int32_t)where;
                    if (where >= 0) want_dx[where] += dy[o];
                }
}

/* relu_in 0: negative inputs, so that a kernel that let the zero padding win would be caught.
 * relu_in 1 (the relu before the pool folded in): inputs of both signs, against the naive pool of
 * relu(x), whose outputs that are not positive send no gradient back (relu's backward). */
static void check_maxpool(const device *d, const conv_case *cc, int index, int relu_in)
{
    const crew_backend *be = &d->be;
    crew_window g;
    EXPECT_OK(d, plan(cc, &g));
    EXPECT(d, g.out_h == cc->want_oh && g.out_w == cc->want_ow && g.pad_top == cc->want_pt && g.pad_left == cc->want_pl,
           "pool case %d: geometry differs from the hand-worked one", index);
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, ny = cc->batch * g.out_h * g.out_w * cc->c;
    float *x = fbuf(nx), *xr = fbuf(nx), *dy = fbuf(ny), *garbage = fbuf(nx);
    double *want_y = dbuf(ny), *want_dx = dbuf(nx);
    int32_t *want_argmax = hbuf(CREW_DT_I32, ny);
    if (relu_in)
        fill_uniform(x, nx, -1.0f, 0.1f, 700 + (uint64_t)index); /* windows of both kinds */
    else
        fill_uniform(x, nx, -2.0f, -1.0f, 500 + (uint64_t)index);
    fill_uniform(dy, ny, -1.0f, 1.0f, 600 + (uint64_t)index);
    fill_uniform(garbage, nx, 3.0f, 4.0f, 9);
    for (int64_t i = 0; i < nx; i++) xr[i] = relu_in && !(x[i] > 0.0f) ? 0.0f : x[i];
    maxpool_reference(cc, &g, xr, dy, want_y, want_argmax, want_dx);
    if (relu_in) { /* relu's backward: nothing back through an output of 0 */
        for (int64_t i = 0; i < nx; i++) want_dx[i] = 0.0;
        for (int64_t o = 0; o < ny; o++)
            if (want_y[o] > 0.0)
                want_dx[want_argmax[o]] += dy[o];
            else
                want_argmax[o] = -1;
    }
    float *x_d = dev_f32(d, x, nx), *dy_d = dev_f32(d, dy, ny), *dx_d = dev_f32(d, garbage, nx);
    float *y_d = dev_zeros_f32(d, ny);
    int32_t *argmax_d = dev_alloc(d, CREW_DT_I32, ny);
    be->ops->maxpool_forward(be->ctx, x_d, y_d, argmax_d, &g, relu_in);
    be->ops->maxpool_backward(be->ctx, dy_d, argmax_d, dx_d, &g);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, ny), *dx = host_f32(d, dx_d, nx);
    int32_t *argmax = host_i32(d, argmax_d, ny);
    int wrong_y = 0, zeros = 0;
    for (int64_t o = 0; o < ny; o++) {
        wrong_y += y[o] != want_y[o] || argmax[o] != want_argmax[o];
        zeros += want_argmax[o] < 0;
    }
    EXPECT(d, wrong_y == 0, "maxpool case %d%s: %d outputs or arg-maxes differ from the naive loop", index,
           relu_in ? " of relu(x)" : "", wrong_y);
    EXPECT(d, !relu_in || ny < 8 || (zeros > 0 && zeros < ny),
           "maxpool case %d of relu(x): %d of %lld windows without a positive value, the test sees only one side",
           index, zeros, (long long)ny);
    int64_t bad = first_mismatch(dx, want_dx, nx, tol_for(d, maxpool_backward_tol));
    EXPECT(d, bad < 0, "maxpool case %d%s backward: dx[%lld] = %.9g, want %.9g", index, relu_in ? " of relu(x)" : "",
           (long long)bad, bad < 0 ? 0.0 : dx[bad], bad < 0 ? 0.0 : want_dx[bad]);
    HOST_FREE(x, xr, dy, garbage, want_y, want_dx, want_argmax, y, dx, argmax);
    DEV_FREE(d, x_d, dy_d, dx_d, y_d, argmax_d);
}

/* The naive average pooling: the mean over the window cells inside the image (padding is not
 * counted), and each output's gradient shared among those cells. */
static void avgpool_reference(const conv_case *cc, const crew_window *g, const float *x, const float *dy,
                              double *want_y, double *want_dx)
{
    for (int64_t b = 0; b < cc->batch; b++)
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++)
                for (int64_t c = 0; c < cc->c; c++) {
                    int64_t o = ((b * g->out_h + oh) * g->out_w + ow) * cc->c + c;
                    double s = 0.0;
                    int n = 0;
                    for (int pass = 0; pass < 2; pass++)
                        for (int64_t kh = 0; kh < cc->k_h; kh++)
                            for (int64_t kw = 0; kw < cc->k_w; kw++) {
                                int64_t ih = oh * cc->s_h - cc->want_pt + kh, iw = ow * cc->s_w - cc->want_pl + kw;
                                if (ih < 0 || ih >= cc->h || iw < 0 || iw >= cc->w) continue;
                                int64_t i = ((b * cc->h + ih) * cc->w + iw) * cc->c + c;
                                if (pass == 0) {
                                    s += x[i];
                                    n++;
                                } else {
                                    want_dx[i] += dy[o] / n;
                                }
                            }
                    want_y[o] = s / n;
                }
}

static void check_avgpool(const device *d, const conv_case *cc, int index)
{
    const crew_backend *be = &d->be;
    crew_window g;
    EXPECT_OK(d, plan(cc, &g));
    int64_t nx = cc->batch * cc->h * cc->w * cc->c, ny = cc->batch * g.out_h * g.out_w * cc->c;
    float *x = fbuf(nx), *dy = fbuf(ny), *garbage = fbuf(nx);
    double *want_y = dbuf(ny), *want_dx = dbuf(nx);
    fill_uniform(x, nx, -1.0f, 0.1f, 700 + (uint64_t)index); /* windows of both kinds */
    fill_uniform(dy, ny, -1.0f, 1.0f, 800 + (uint64_t)index);
    fill_uniform(garbage, nx, 3.0f, 4.0f, 10);
    avgpool_reference(cc, &g, x, dy, want_y, want_dx);
    float *x_d = dev_f32(d, x, nx), *dy_d = dev_f32(d, dy, ny), *dx_d = dev_f32(d, garbage, nx);
    float *y_d = dev_zeros_f32(d, ny);
    be->ops->avgpool_forward(be->ctx, x_d, y_d, &g);
    be->ops->avgpool_backward(be->ctx, dy_d, dx_d, &g);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, ny), *dx = host_f32(d, dx_d, nx);
    tolerance t = tol_for(d, avgpool_tol);
    int64_t bad = first_mismatch(y, want_y, ny, t);
    EXPECT(d, bad < 0, "avgpool case %d: y[%lld] = %.9g, want %.9g", index, (long long)bad, bad < 0 ? 0.0 : y[bad],
           bad < 0 ? 0.0 : want_y[bad]);
    bad = first_mismatch(dx, want_dx, nx, t);
    EXPECT(d, bad < 0, "avgpool case %d backward: dx[%lld] = %.9g, want %.9g", index, (long long)bad,
           bad < 0 ? 0.0 : dx[bad], bad < 0 ? 0.0 : want_dx[bad]);
    HOST_FREE(x, dy, garbage, want_y, want_dx, y, dx);
    DEV_FREE(d, x_d, dy_d, dx_d, y_d);
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

static void test_pooling(const device *d)
{
    for (int i = 0; i < (int)(sizeof pool_cases / sizeof pool_cases[0]); i++) {
        for (int relu_in = 0; relu_in <= 1; relu_in++) check_maxpool(d, &pool_cases[i], i, relu_in);
        check_avgpool(d, &pool_cases[i], i);
    }
}

/* ------------------------------------------------------------------ softmax and loss */

/* A row of 6 exponentials summed in float: its sum is 1 within a few ulps of 1. */
static const tolerance softmax_row_sum_tol[] = {{"cpu", 0.0, 1e-6}, {NULL, 0, 0}};
static const tolerance softmax_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};

static void test_softmax(const device *d)
{
    enum { ROWS = 4, CLASSES = 6 };
    const crew_backend *be = &d->be;
    float z[ROWS * CLASSES];
    fill_uniform(z, ROWS * CLASSES, -3.0f, 3.0f, 21);
    /* Large logits: a softmax without the max subtraction overflows expf. */
    const float big[CLASSES] = {80.0f, -80.0f, 0.0f, 1000.0f, -1000.0f, 999.0f};
    memcpy(z + 2 * CLASSES, big, sizeof big);
    for (int j = 0; j < CLASSES; j++) z[3 * CLASSES + j] = 88.5f; /* all equal: uniform */
    float *z_d = dev_f32(d, z, ROWS * CLASSES), *p_d = dev_zeros_f32(d, ROWS * CLASSES);
    be->ops->softmax(be->ctx, z_d, p_d, ROWS, CLASSES);
    EXPECT_SYNCED(d);
    float *p = host_f32(d, p_d, ROWS * CLASSES);
    for (int r = 0; r < ROWS; r++) {
        double sum = 0.0, zmax = -INFINITY, denom = 0.0;
        for (int j = 0; j < CLASSES; j++) zmax = fmax(zmax, z[r * CLASSES + j]);
        for (int j = 0; j < CLASSES; j++) denom += exp((double)z[r * CLASSES + j] - zmax);
        double want[CLASSES];
        for (int j = 0; j < CLASSES; j++) {
            sum += p[r * CLASSES + j];
            want[j] = exp((double)z[r * CLASSES + j] - zmax) / denom;
        }
        EXPECT(d, close_to(sum, 1.0, tol_for(d, softmax_row_sum_tol)), "softmax row %d sums to %.9g", r, sum);
        int64_t bad = first_mismatch(p + r * CLASSES, want, CLASSES, tol_for(d, softmax_tol));
        EXPECT(d, bad < 0, "softmax row %d: p[%lld] = %.9g, want %.9g", r, (long long)bad,
               bad < 0 ? 0.0 : p[r * CLASSES + bad], bad < 0 ? 0.0 : want[bad]);
    }
    be->ops->softmax(be->ctx, z_d, z_d, ROWS, CLASSES); /* probs over the logits: the same bits */
    EXPECT_SYNCED(d);
    float *in_place = host_f32(d, z_d, ROWS * CLASSES);
    EXPECT(d, !memcmp(in_place, p, sizeof(float) * ROWS * CLASSES), "softmax over its logits differs");
    HOST_FREE(p, in_place);
    DEV_FREE(d, z_d, p_d);
}

static const tolerance xent_loss_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};
static const tolerance xent_grad_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};

enum { XENT_ROWS = 3, XENT_CLASSES = 4 };
/* Row 0's arg-max is class 2; row 1's is class 0 (logit 80); row 2 ties, and the first maximum
 * (class 0) wins. */
static const float xent_logits[XENT_ROWS * XENT_CLASSES] = {0.5f, -1.0f, 2.0f, 0.0f, 80.0f, -80.0f,
                                                            0.0f, 3.0f, 1.0f, 1.0f, 1.0f, 1.0f};

/* The loss and the gradient of (mean loss · scale) of each row against the double reference. */
static void check_xent_values(const device *d, const int32_t *labels, float scale, const float *loss,
                              const float *dz)
{
    const float *z = xent_logits;
    for (int r = 0; r < XENT_ROWS; r++) {
        double zmax = -INFINITY, denom = 0.0;
        for (int j = 0; j < XENT_CLASSES; j++) zmax = fmax(zmax, z[r * XENT_CLASSES + j]);
        for (int j = 0; j < XENT_CLASSES; j++) denom += exp((double)z[r * XENT_CLASSES + j] - zmax);
        double want_loss = log(denom) + zmax - z[r * XENT_CLASSES + labels[r]];
        EXPECT(d, close_to(loss[r], want_loss, tol_for(d, xent_loss_tol)), "xent row %d: loss %.9g, want %.9g", r,
               loss[r], want_loss);
        for (int j = 0; j < XENT_CLASSES; j++) {
            double want = scale * (exp((double)z[r * XENT_CLASSES + j] - zmax) / denom - (j == labels[r]));
            EXPECT(d, close_to(dz[r * XENT_CLASSES + j], want, tol_for(d, xent_grad_tol)),
                   "xent row %d: dlogit %d = %.9g, want %.9g", r, j, dz[r * XENT_CLASSES + j], want);
        }
    }
}

/* softmax_xent over the first `rows` rows with these labels; returns its correct count. */
static int64_t run_xent(const device *d, const float *z_d, const int32_t *labels, int64_t rows, float scale,
                        float *loss_d, float *dz_d)
{
    int32_t *labels_d = dev_i32(d, labels, XENT_ROWS);
    int64_t correct = -1;
    EXPECT_OK(d, d->be.ops->softmax_xent(d->be.ctx, z_d, labels_d, rows, XENT_CLASSES, scale, loss_d, dz_d, &correct));
    EXPECT_SYNCED(d);
    DEV_FREE(d, labels_d);
    return correct;
}

static void test_softmax_xent(const device *d)
{
    const int32_t labels[XENT_ROWS] = {2, 1, 3}, all_right[XENT_ROWS] = {2, 0, 0};
    const float scale = 0.25f;
    float *z_d = dev_f32(d, xent_logits, XENT_ROWS * XENT_CLASSES);
    float *loss_d = dev_zeros_f32(d, XENT_ROWS), *dz_d = dev_zeros_f32(d, XENT_ROWS * XENT_CLASSES);
    int64_t correct = run_xent(d, z_d, labels, XENT_ROWS, scale, loss_d, dz_d);
    EXPECT(d, correct == 1, "xent: %lld rows correct, want 1 (row 0)", (long long)correct);
    float *loss = host_f32(d, loss_d, XENT_ROWS), *dz = host_f32(d, dz_d, XENT_ROWS * XENT_CLASSES);
    check_xent_values(d, labels, scale, loss, dz);
    correct = run_xent(d, z_d, all_right, XENT_ROWS, scale, loss_d, dz_d);
    EXPECT(d, correct == 3, "xent: %lld rows correct, want 3 (the tie goes to the first maximum)", (long long)correct);
    correct = run_xent(d, z_d, labels, 0, scale, loss_d, dz_d);
    EXPECT(d, correct == 0, "xent over no rows: %lld correct", (long long)correct);
    /* dlogits over the logits (backend.h; a model's loss does it): the same bits */
    float *zin_d = dev_f32(d, xent_logits, XENT_ROWS * XENT_CLASSES), *loss2_d = dev_zeros_f32(d, XENT_ROWS);
    correct = run_xent(d, zin_d, labels, XENT_ROWS, scale, loss2_d, zin_d);
    EXPECT(d, correct == 1, "xent in place: %lld rows correct, want 1", (long long)correct);
    float *loss2 = host_f32(d, loss2_d, XENT_ROWS), *dz2 = host_f32(d, zin_d, XENT_ROWS * XENT_CLASSES);
    int same = !memcmp(loss2, loss, sizeof(float) * XENT_ROWS);
    same &= !memcmp(dz2, dz, sizeof(float) * XENT_ROWS * XENT_CLASSES);
    EXPECT(d, same, "xent with dlogits over the logits differs from xent into another buffer");
    HOST_FREE(loss, dz, loss2, dz2);
    DEV_FREE(d, z_d, loss_d, dz_d, zin_d, loss2_d);
}

/* ------------------------------------------------------------------ col_sum */

/* Sums of 7 rows in float against double. */
static const tolerance col_sum_tol[] = {{"cpu", RTOL, ATOL}, {NULL, 0, 0}};

enum { COL_SUM_ROWS = 7, COL_SUM_COLS = 5 };

/* out_d set to start, then col_sum over the first `rows` rows of x_d, against want. */
static void check_col_sum(const device *d, const float *x_d, float *out_d, const float *start, int rows,
                          int accumulate, const double *want, const char *what)
{
    enum { COLS = COL_SUM_COLS };
    EXPECT_OK(d, d->be.ops->upload(d->be.ctx, NULL, out_d, start, COLS, CREW_DT_F32));
    d->be.ops->col_sum(d->be.ctx, x_d, rows, COLS, out_d, accumulate);
    EXPECT_SYNCED(d);
    float *out = host_f32(d, out_d, COLS);
    /* over no rows nothing is summed: exact */
    int64_t bad = first_mismatch(out, want, COLS, rows ? tol_for(d, col_sum_tol) : (tolerance){NULL, 0, 0});
    EXPECT(d, bad < 0, "%s: out[%lld] = %.9g, want %.9g", what, (long long)bad, bad < 0 ? 0.0 : out[bad],
           bad < 0 ? 0.0 : want[bad]);
    HOST_FREE(out);
}

static void test_col_sum(const device *d)
{
    enum { ROWS = COL_SUM_ROWS, COLS = COL_SUM_COLS };
    float x[ROWS * COLS], start[COLS];
    fill_uniform(x, ROWS * COLS, -1.0f, 1.0f, 51);
    double sums[COLS] = {0}, added[COLS], kept[COLS], zeros[COLS] = {0};
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) sums[c] += x[r * COLS + c];
    for (int c = 0; c < COLS; c++) {
        start[c] = 100.0f + (float)c;
        added[c] = sums[c] + start[c];
        kept[c] = start[c];
    }
    float *x_d = dev_f32(d, x, ROWS * COLS), *out_d = dev_zeros_f32(d, COLS);
    check_col_sum(d, x_d, out_d, start, ROWS, 0, sums, "col_sum");            /* start overwritten */
    check_col_sum(d, x_d, out_d, start, ROWS, 1, added, "col_sum accumulate"); /* start kept and added to */
    /* zero rows: accumulate leaves out alone, overwrite gives zeros */
    check_col_sum(d, x_d, out_d, start, 0, 1, kept, "col_sum of no rows, accumulate");
    check_col_sum(d, x_d, out_d, start, 0, 0, zeros, "col_sum of no rows");
    DEV_FREE(d, x_d, out_d);
}

/* ------------------------------------------------------------------ axpby, mul, broadcast_rows */

/* axpby: two float products and a sum, of terms ≤ 1.5 in magnitude: a few ulps of the terms,
 * under 4e-7 absolute even where they cancel, and so 1e-6 relative or absolute. */
static const tolerance axpby_tol[] = {{"cpu", 1e-6, 1e-6}, {NULL, 0, 0}};
/* mul: the product of two floats is exact in double, and IEEE float multiplication rounds it
 * once, so every kind gives the reference's bits (the data hold no subnormals to flush). */
static const tolerance mul_tol[] = {{"cpu", 0.0, 0.0}, {NULL, 0, 0}};

enum { VEC_N = 41, VEC_LO = 2, VEC_M = VEC_N - 5 }; /* ops on [VEC_LO, VEC_LO + VEC_M) of VEC_N */

/* y[VEC_LO..] = α·x[1..] + β·y[VEC_LO..] over VEC_M elements: y outside the slice keeps y0. */
static void check_axpby(const device *d, float alpha, float beta, const float *y0, const char *what)
{
    float x[VEC_N];
    double want[VEC_N];
    fill_uniform(x, VEC_N, -1.0f, 1.0f, 1201);
    for (int i = 0; i < VEC_N; i++) want[i] = y0[i];
    for (int i = 0; i < VEC_M; i++) want[VEC_LO + i] = (double)alpha * x[1 + i] + (double)beta * y0[VEC_LO + i];
    float *x_d = dev_f32(d, x, VEC_N), *y_d = dev_f32(d, y0, VEC_N);
    d->be.ops->axpby(d->be.ctx, VEC_M, alpha, x_d + 1, beta, y_d + VEC_LO);
    d->be.ops->axpby(d->be.ctx, 0, alpha, x_d, beta, y_d); /* n = 0: nothing */
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, VEC_N);
    int64_t bad = first_mismatch(y, want, VEC_N, tol_for(d, axpby_tol));
    EXPECT(d, bad < 0, "%s (alpha %g, beta %g): y[%lld] = %.9g, want %.9g", what, alpha, beta, (long long)bad,
           bad < 0 ? 0.0 : y[bad], bad < 0 ? 0.0 : want[bad]);
    HOST_FREE(y);
    DEV_FREE(d, x_d, y_d);
}

/* axpby with β = 0 on a y holding NaN and ±inf. What the CPU kernel does: it computes α·x + β·y
 * for every element, β = 0 included, and 0·NaN and 0·inf are NaN, so y keeps its NaN and
 * turns its infinities into NaN; it does not take BLAS's convention, under which β = 0 means y
 * is not read and y becomes α·x whatever it held. backend.h does not say which (its callers,
 * src/nn/layer_norm.c and src/optim/optimizer.c, use β = 0 only in place, x == y, where either
 * gives NaN for NaN). So a poisoned element may come out NaN (the CPU) or α·x (BLAS), nothing
 * else; and the finite elements beside them must be α·x: a NaN must not leak into a neighbour. */
static void check_axpby_poisoned_y(const device *d)
{
    const float alpha = -0.75f;
    float x[VEC_N], y0[VEC_N];
    fill_uniform(x, VEC_N, -1.0f, 1.0f, 1202);
    fill_uniform(y0, VEC_N, -1.0f, 1.0f, 1203);
    const int poisoned[] = {0, 7, 8, 20, VEC_N - 1};
    const float poison[] = {NAN, -NAN, INFINITY, -INFINITY, NAN};
    for (int p = 0; p < 5; p++) y0[poisoned[p]] = poison[p];
    float *x_d = dev_f32(d, x, VEC_N), *y_d = dev_f32(d, y0, VEC_N);
    d->be.ops->axpby(d->be.ctx, VEC_N, alpha, x_d, 0.0f, y_d);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, VEC_N);
    int wrong_finite = 0, wrong_poisoned = 0, kept_nan = 0;
    for (int i = 0; i < VEC_N; i++) {
        double want = (double)alpha * x[i];
        int is_poisoned = !isfinite(y0[i]);
        if (!is_poisoned)
            wrong_finite += !close_to(y[i], want, tol_for(d, axpby_tol));
        else if (isnan(y[i]))
            kept_nan++;
        else
            wrong_poisoned += !close_to(y[i], want, tol_for(d, axpby_tol));
    }
    EXPECT(d, wrong_finite == 0, "axpby beta 0 beside NaN/inf in y: %d finite elements are not alpha*x",
           wrong_finite);
    EXPECT(d, wrong_poisoned == 0, "axpby beta 0 over NaN/inf in y: %d of them are neither NaN nor alpha*x",
           wrong_poisoned);
    EXPECT(d, kept_nan == 0 || kept_nan == 5,
           "axpby beta 0: %d of the 5 NaN/inf elements of y came out NaN, the others alpha*x (one rule for all)",
           kept_nan);
    HOST_FREE(y);
    DEV_FREE(d, x_d, y_d);
}

/* In place, x == y (how batch norm divides its sums by the count, and the optimiser clips). */
static void check_axpby_in_place(const device *d, float alpha, float beta)
{
    float v[VEC_N];
    double want[VEC_N];
    fill_uniform(v, VEC_N, -1.0f, 1.0f, 1204);
    for (int i = 0; i < VEC_N; i++) want[i] = ((double)alpha + beta) * v[i];
    float *v_d = dev_f32(d, v, VEC_N);
    d->be.ops->axpby(d->be.ctx, VEC_N, alpha, v_d, beta, v_d);
    EXPECT_SYNCED(d);
    float *got = host_f32(d, v_d, VEC_N);
    int64_t bad = first_mismatch(got, want, VEC_N, tol_for(d, axpby_tol));
    EXPECT(d, bad < 0, "axpby in place (alpha %g, beta %g): y[%lld] = %.9g, want %.9g", alpha, beta,
           (long long)bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
    HOST_FREE(got);
    DEV_FREE(d, v_d);
}

static void test_axpby(const device *d)
{
    float y0[VEC_N];
    fill_uniform(y0, VEC_N, -1.0f, 1.0f, 1205);
    check_axpby(d, 1.5f, -0.5f, y0, "axpby");
    check_axpby(d, 1.0f, 1.0f, y0, "axpby accumulate"); /* the micro-batch gradient sum */
    check_axpby(d, 0.01f, 0.99f, y0, "axpby moving average");
    check_axpby(d, 0.25f, 0.0f, y0, "axpby beta 0");
    check_axpby(d, 0.0f, -1.0f, y0, "axpby alpha 0");
    check_axpby_in_place(d, 1.0f / 7.0f, 0.0f);
    check_axpby_in_place(d, 0.5f, 0.25f);
    check_axpby_poisoned_y(d);
}

/* out = a·b out of place on slices at offsets (out outside the slice keeps its garbage), and in
 * place (out == a). */
static void test_mul(const device *d)
{
    float a[VEC_N], b[VEC_N], garbage[VEC_N];
    double want[VEC_N], want_in_place[VEC_N];
    fill_uniform(a, VEC_N, -2.0f, 2.0f, 1211);
    fill_uniform(b, VEC_N, -2.0f, 2.0f, 1212);
    fill_uniform(garbage, VEC_N, 5.0f, 6.0f, 1213);
    for (int i = 0; i < VEC_N; i++) {
        want[i] = i >= VEC_LO && i < VEC_LO + VEC_M ? (float)((double)a[i + 1] * b[i + 3 - VEC_LO]) : garbage[i];
        want_in_place[i] = (float)((double)a[i] * b[i]);
    }
    float *a_d = dev_f32(d, a, VEC_N), *b_d = dev_f32(d, b, VEC_N), *out_d = dev_f32(d, garbage, VEC_N);
    d->be.ops->mul(d->be.ctx, VEC_M, a_d + VEC_LO + 1, b_d + 3, out_d + VEC_LO);
    d->be.ops->mul(d->be.ctx, 0, a_d, b_d, out_d); /* n = 0: nothing */
    d->be.ops->mul(d->be.ctx, VEC_N, a_d, b_d, a_d);
    EXPECT_SYNCED(d);
    float *out = host_f32(d, out_d, VEC_N), *in_place = host_f32(d, a_d, VEC_N);
    int64_t bad = first_mismatch(out, want, VEC_N, tol_for(d, mul_tol));
    EXPECT(d, bad < 0, "mul: out[%lld] = %.9g, want %.9g", (long long)bad, bad < 0 ? 0.0 : out[bad],
           bad < 0 ? 0.0 : want[bad]);
    bad = first_mismatch(in_place, want_in_place, VEC_N, tol_for(d, mul_tol));
    EXPECT(d, bad < 0, "mul in place: a[%lld] = %.9g, want %.9g", (long long)bad, bad < 0 ? 0.0 : in_place[bad],
           bad < 0 ? 0.0 : want_in_place[bad]);
    HOST_FREE(out, in_place);
    DEV_FREE(d, a_d, b_d, out_d);
}

/* y [rows, cols] = bias in every row, at an offset inside a buffer of garbage, from a bias at an
 * offset: exact, and nothing outside the rows × cols is written. */
static void test_broadcast_rows(const device *d)
{
    enum { ROWS = 5, COLS = 7, PAD = 3, LEN = ROWS * COLS + 2 * PAD };
    float bias[COLS + 1], garbage[LEN], want[LEN];
    fill_uniform(bias, COLS + 1, -1.0f, 1.0f, 1221);
    fill_uniform(garbage, LEN, 5.0f, 6.0f, 1222);
    for (int i = 0; i < LEN; i++)
        want[i] = i >= PAD && i < PAD + ROWS * COLS ? bias[1 + (i - PAD) % COLS] : garbage[i];
    float *bias_d = dev_f32(d, bias, COLS + 1), *y_d = dev_f32(d, garbage, LEN);
    d->be.ops->broadcast_rows(d->be.ctx, y_d + PAD, bias_d + 1, ROWS, COLS);
    d->be.ops->broadcast_rows(d->be.ctx, y_d, bias_d, 0, COLS); /* no rows: nothing */
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, LEN);
    int wrong = 0;
    for (int i = 0; i < LEN; i++) wrong += memcmp(&y[i], &want[i], sizeof want[i]) != 0;
    EXPECT(d, wrong == 0, "broadcast_rows: %d of %d elements differ (y[%d] = %.9g, want %.9g)", wrong, LEN, PAD,
           y[PAD], want[PAD]);
    HOST_FREE(y);
    DEV_FREE(d, bias_d, y_d);
}

/* ------------------------------------------------------------------ normalisation */

/* Reference loops for one group of n values normalised together: a channel's column over the
 * rows for batch norm, one row over its c channels for layer norm. Both are the same function of
 * the group (src/nn/layer_norm.c): mean, biased variance, r = 1/sqrt(var + eps), xhat =
 * (x − mean)·r, y = gamma·xhat + beta. */
typedef struct norm_stats {
    double mean, var, rstd;
} norm_stats;

static norm_stats norm_stats_of(int64_t n, const double *x, double eps)
{
    double m = 0.0, v = 0.0;
    for (int64_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (int64_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    v /= (double)n;
    return (norm_stats){m, v, 1.0 / sqrt(v + eps)};
}

/* L = Σ_j g_j·xhat_j(x) with g = dy·gamma: the part of Σ dy·y that depends on x. */
static double norm_loss(int64_t n, const double *x, const double *g, double eps)
{
    norm_stats s = norm_stats_of(n, x, eps);
    double l = 0.0;
    for (int64_t j = 0; j < n; j++) l += g[j] * (x[j] - s.mean) * s.rstd;
    return l;
}

/* dx = dL/dx from first principles: with ∂mean/∂x_i = 1/n, ∂var/∂x_i = 2(x_i − mean)/n (the
 * deviations sum to zero) and so ∂r/∂x_i = −r³(x_i − mean)/n, the Jacobian of the normalised
 * values is ∂xhat_j/∂x_i = r·(δ_ij − 1/n) − r·xhat_i·xhat_j/n, and dx_i = Σ_j g_j·∂xhat_j/∂x_i,
 * summed here term by term over the whole n × n Jacobian (the kernels use a factored form).
 * mag_i receives the size of the three pieces that factored form adds, r·(|g_i| + Σ|g|/n +
 * |xhat_i|·Σ|g·xhat|/n): float rounding errs relative to it, not to dx_i, which may cancel to 0. */
static void norm_grad_reference(int64_t n, const double *x, const double *g, double eps, double *dx, double *mag)
{
    norm_stats s = norm_stats_of(n, x, eps);
    double abs_g = 0.0, abs_gx = 0.0;
    for (int64_t j = 0; j < n; j++) {
        abs_g += fabs(g[j]);
        abs_gx += fabs(g[j] * (x[j] - s.mean) * s.rstd);
    }
    for (int64_t i = 0; i < n; i++) {
        double xhat_i = (x[i] - s.mean) * s.rstd, sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            double xhat_j = (x[j] - s.mean) * s.rstd;
            sum += g[j] * (s.rstd * ((i == j) - 1.0 / (double)n) - s.rstd * xhat_i * xhat_j / (double)n);
        }
        dx[i] = sum;
        mag[i] = s.rstd * (fabs(g[i]) + abs_g / (double)n + fabs(xhat_i) * abs_gx / (double)n);
    }
}

/* The reference checks itself: central differences of norm_loss in double (h = 1e-5: truncation
 * ~h²·r³ and rounding ~1e-16·|L|/h, both far below 1e-6 of the gradient's size). */
static int norm_grad_agrees_with_differences(int64_t n, double *x, const double *g, double eps, const double *dx,
                                             const double *mag)
{
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = norm_loss(n, x, g, eps);
        x[i] = keep - h;
        double down = norm_loss(n, x, g, eps);
        x[i] = keep;
        if (fabs((up - down) / (2.0 * h) - dx[i]) > 1e-6 * (mag[i] + 1.0)) return 0;
    }
    return 1;
}

/* Index of the first element of got[n] farther from want[n] than atol + rtol·max(|want|, mag[i]):
 * for results whose terms may cancel, mag[i] is the size of those terms. -1 when none. */
static int64_t first_mismatch_of_sum(const float *got, const double *want, const double *mag, int64_t n,
                                     tolerance t)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= t.atol + t.rtol * fmax(fabs(want[i]), mag[i]))) return i;
    return -1;
}

/* got[n] against want[n] within tol, sizes mag[n] (first_mismatch_of_sum), for output `what` of
 * op `op` on shape `shape`. */
static void expect_match(const device *d, const float *got, const double *want, const double *mag, int64_t n,
                         const tolerance *tol, const char *op, const char *shape, const char *what)
{
    tolerance t = tol_for(d, tol);
    int64_t bad = first_mismatch_of_sum(got, want, mag, n, t);
    EXPECT(d, bad < 0, "%s (%s): %s[%lld] = %.9g, want %.9g (terms of size %.3g)", op, shape, what, (long long)bad,
           bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad], bad < 0 ? 0.0 : mag[bad]);
}

/* Batch norm's tolerances, all relative to the size of the terms (mag): each result is a sum
 * over at most 7 rows, or a few float operations per element, each term carrying ≤ 4 roundings
 * of 2^-24: under 2e-6 of its size, so 1e-5 leaves a margin of 5x. */
static const tolerance col_sqdev_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
/* y = x·scale + shift in the CPU kernel, shift = beta − mean·scale: x·scale and mean·scale cancel */
static const tolerance bn_forward_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
static const tolerance bn_sums_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
static const tolerance bn_param_grads_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
/* dx: about 8 float operations on the sums per element, and the sums' own rounding to float */
static const tolerance bn_backward_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};

typedef struct bn_case {
    int64_t rows, c;
} bn_case;

/* A few channels; and more than 256 over few rows (the CPU kernels work on 256 channels at a
 * time: a chunk's offset must not be lost). */
static const bn_case bn_cases[] = {{7, 5}, {3, 300}, {1, 4}};

/* The four batch-norm ops of one training step, as src/nn/layer_norm.c runs them, each from
 * inputs made on the host (so that one op's error does not hide in another's): the batch
 * statistics in double, rounded to float, feed col_sqdev, bn_forward and the backward ops;
 * the backward sums feed bn_backward and bn_param_grads. Outputs start as garbage (the ops that
 * overwrite must) or as start values (bn_param_grads accumulates). */
static void check_batch_norm(const device *d, const bn_case *bc, int index)
{
    const crew_backend *be = &d->be;
    const int64_t rows = bc->rows, c = bc->c, n = rows * c;
    const float eps = 1e-3f; /* the layer's default */
    float *x = fbuf(n), *dy = fbuf(n), *gamma = fbuf(c), *beta = fbuf(c), *garbage = fbuf(n + 2 * c), *start = fbuf(2 * c);
    float *mean_f = fbuf(c), *var_f = fbuf(c);
    double *sums_in = dbuf(2 * c), *garbage_d = dbuf(2 * c); /* sums: sum_dy | sum_dy_xmu */
    double *col = dbuf(rows), *g = dbuf(rows), *dx_col = dbuf(rows), *mag_col = dbuf(rows);
    double *want_sqdev = dbuf(c), *mag_sqdev = dbuf(c), *want_y = dbuf(n), *mag_y = dbuf(n);
    double *want_sums = dbuf(2 * c), *mag_sums = dbuf(2 * c), *want_grads = dbuf(2 * c), *mag_grads = dbuf(2 * c);
    double *want_dx = dbuf(n), *mag_dx = dbuf(n), *want_colsum = dbuf(c), *mag_colsum = dbuf(c);
    fill_uniform(x, n, -1.0f, 1.0f, 1300 + (uint64_t)index);
    for (int64_t r = 0; r < rows; r++) /* channel means away from zero, and not all the same */
        for (int64_t j = 0; j < c; j++) x[r * c + j] += 0.5f * (float)(j % 5) - 1.0f;
    fill_uniform(dy, n, -1.0f, 1.0f, 1400 + (uint64_t)index);
    fill_uniform(gamma, c, 0.5f, 1.5f, 1500 + (uint64_t)index);
    fill_uniform(beta, c, -0.5f, 0.5f, 1600 + (uint64_t)index);
    fill_uniform(garbage, n + 2 * c, 5.0f, 6.0f, 1700); /* enough for y, dx and the two sums */
    for (int64_t j = 0; j < 2 * c; j++) garbage_d[j] = garbage[j];
    fill_uniform(start, 2 * c, -1.0f, 1.0f, 1800 + (uint64_t)index);
    int reference_ok = 1;
    for (int64_t j = 0; j < c; j++) {
        for (int64_t r = 0; r < rows; r++) {
            col[r] = x[r * c + j];
            g[r] = (double)dy[r * c + j] * gamma[j];
        }
        norm_stats s = norm_stats_of(rows, col, eps);
        mean_f[j] = (float)s.mean;
        var_f[j] = (float)s.var;
        /* col_sqdev and bn_forward: of the mean and variance they are given */
        double m = mean_f[j], scale = gamma[j] / sqrt((double)var_f[j] + eps);
        double sum_dy = 0.0, sum_dy_xmu = 0.0, abs_dy = 0.0, abs_dy_xmu = 0.0, dgamma = 0.0, abs_dgamma = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            double xr = x[r * c + j], dyr = dy[r * c + j], xhat = (xr - s.mean) * s.rstd;
            want_sqdev[j] += (xr - m) * (xr - m);
            want_colsum[j] += xr;
            mag_colsum[j] += fabs(xr);
            want_y[r * c + j] = (xr - m) * scale + beta[j];
            mag_y[r * c + j] = fabs(xr * scale) + fabs(m * scale) + fabs(beta[j]);
            sum_dy += dyr;
            abs_dy += fabs(dyr);
            sum_dy_xmu += dyr * (xr - m);
            abs_dy_xmu += fabs(dyr * (xr - m));
            dgamma += dyr * xhat; /* dL/dgamma = Σ dy·xhat, from y = gamma·xhat + beta */
            abs_dgamma += fabs(dyr * xhat);
        }
        mag_sqdev[j] = want_sqdev[j];
        want_sums[j] = sum_dy, want_sums[c + j] = sum_dy_xmu;
        mag_sums[j] = abs_dy, mag_sums[c + j] = abs_dy_xmu;
        sums_in[j] = sum_dy, sums_in[c + j] = sum_dy_xmu;
        want_grads[j] = start[j] + dgamma, want_grads[c + j] = start[c + j] + sum_dy;
        mag_grads[j] = fabs(start[j]) + abs_dgamma, mag_grads[c + j] = fabs(start[c + j]) + abs_dy;
        /* dx over the whole batch: the mean and variance are functions of every row */
        norm_grad_reference(rows, col, g, eps, dx_col, mag_col);
        reference_ok &= norm_grad_agrees_with_differences(rows, col, g, eps, dx_col, mag_col);
        for (int64_t r = 0; r < rows; r++) want_dx[r * c + j] = dx_col[r], mag_dx[r * c + j] = mag_col[r];
    }
    EXPECT(d, reference_ok, "batch norm case %d: the reference dx disagrees with finite differences", index);

    float *x_d = dev_f32(d, x, n), *dy_d = dev_f32(d, dy, n), *gamma_d = dev_f32(d, gamma, c);
    float *beta_d = dev_f32(d, beta, c), *mean_d = dev_f32(d, mean_f, c), *var_d = dev_f32(d, var_f, c);
    double *sums_in_d = dev_f64(d, sums_in, 2 * c), *sqdev_d = dev_f64(d, garbage_d, c);
    double *sums_d = dev_f64(d, garbage_d, 2 * c), *colsum_d = dev_f64(d, garbage_d, c);
    float *grads_d = dev_f32(d, start, 2 * c), *y_d = dev_f32(d, garbage, n);
    float *dx_d = dev_f32(d, garbage, n), *dx_split_d = dev_f32(d, garbage, n);
    be->ops->bn_col_sum(be->ctx, x_d, rows, c, colsum_d);
    be->ops->col_sqdev(be->ctx, x_d, mean_d, rows, c, sqdev_d);
    be->ops->bn_forward(be->ctx, x_d, mean_d, var_d, gamma_d, beta_d, eps, y_d, rows, c);
    be->ops->bn_backward_sums(be->ctx, dy_d, x_d, mean_d, rows, c, sums_d, sums_d + c);
    be->ops->bn_param_grads(be->ctx, var_d, eps, sums_in_d, sums_in_d + c, grads_d, grads_d + c, c);
    be->ops->bn_backward(be->ctx, dy_d, x_d, mean_d, var_d, gamma_d, eps, sums_in_d, sums_in_d + c, (double)rows,
                         dx_d, rows, c);
    /* Synchronised batch norm: two replicas' rows, each from the sums over all of them and their
     * count (not its own rows), give the full batch's dx between them. */
    int64_t half = rows / 2;
    be->ops->bn_backward(be->ctx, dy_d, x_d, mean_d, var_d, gamma_d, eps, sums_in_d, sums_in_d + c, (double)rows,
                         dx_split_d, half, c);
    be->ops->bn_backward(be->ctx, dy_d + half * c, x_d + half * c, mean_d, var_d, gamma_d, eps, sums_in_d,
                         sums_in_d + c, (double)rows, dx_split_d + half * c, rows - half, c);
    EXPECT_SYNCED(d);
    double *sqdev_64 = host_f64(d, sqdev_d, c), *sums_64 = host_f64(d, sums_d, 2 * c), *colsum_64 = host_f64(d, colsum_d, c);
    float *sqdev = f32_of(sqdev_64, c), *sums = f32_of(sums_64, 2 * c), *colsum = f32_of(colsum_64, c);
    float *y = host_f32(d, y_d, n), *grads = host_f32(d, grads_d, 2 * c), *dx = host_f32(d, dx_d, n);
    float *dx_split = host_f32(d, dx_split_d, n);
    char shape[48];
    snprintf(shape, sizeof shape, "rows %lld, c %lld", (long long)rows, (long long)c);
    expect_match(d, colsum, want_colsum, mag_colsum, c, bn_sums_tol, "bn_col_sum", shape, "out");
    expect_match(d, sqdev, want_sqdev, mag_sqdev, c, col_sqdev_tol, "col_sqdev", shape, "out");
    expect_match(d, y, want_y, mag_y, n, bn_forward_tol, "bn_forward", shape, "y");
    expect_match(d, sums, want_sums, mag_sums, c, bn_sums_tol, "bn_backward_sums", shape, "sum_dy");
    expect_match(d, sums + c, want_sums + c, mag_sums + c, c, bn_sums_tol, "bn_backward_sums", shape, "sum_dy_xmu");
    expect_match(d, grads, want_grads, mag_grads, c, bn_param_grads_tol, "bn_param_grads", shape, "dgamma");
    expect_match(d, grads + c, want_grads + c, mag_grads + c, c, bn_param_grads_tol, "bn_param_grads", shape,
                 "dbeta");
    expect_match(d, dx, want_dx, mag_dx, n, bn_backward_tol, "bn_backward", shape, "dx");
    expect_match(d, dx_split, want_dx, mag_dx, n, bn_backward_tol, "bn_backward in two calls (replicas)", shape,
                 "dx");
    HOST_FREE(x, dy, gamma, beta, garbage, start, mean_f, var_f, sums_in, garbage_d, sqdev_64, sums_64, colsum_64, col, g, dx_col, mag_col, want_sqdev,
              mag_sqdev, want_y, mag_y, want_sums, mag_sums, want_grads, mag_grads, want_dx, mag_dx, sqdev, y, sums,
              grads, dx, dx_split, want_colsum, mag_colsum, colsum);
    DEV_FREE(d, x_d, dy_d, gamma_d, beta_d, mean_d, var_d, sums_in_d, grads_d, sqdev_d, y_d, sums_d, dx_d,
             dx_split_d, colsum_d);
}

/* Batch norm's reductions over many rows of one sign are accurate to a few float roundings of the
 * result, whatever the length (backend.h: they may not add row after row in float32, whose error
 * over 2^17 rows of values near 1 is about 2^17 · 2^-24 / 2 = 4e-3 relative at worst, and in
 * practice ~1e-5, far beyond the 4 · 2^-24 = 2.4e-7 held here). */
static void check_batch_norm_long_sums(const device *d)
{
    enum { ROWS = 1 << 17, C = 3 };
    float *x = fbuf(ROWS * C), *dy = fbuf(ROWS * C), mean[C] = {0};
    fill_uniform(x, ROWS * C, 0.9f, 1.1f, 2100);
    fill_uniform(dy, ROWS * C, 0.5f, 1.5f, 2200);
    double want_sum[C] = {0}, want_sq[C] = {0}, want_dy[C] = {0}, want_dy_xmu[C] = {0};
    for (int64_t r = 0; r < ROWS; r++)
        for (int j = 0; j < C; j++) want_sum[j] += x[r * C + j];
    for (int j = 0; j < C; j++) mean[j] = (float)(want_sum[j] / ROWS) - 0.5f; /* (x − mean) of one sign too */
    for (int64_t r = 0; r < ROWS; r++)
        for (int j = 0; j < C; j++) {
            double xm = (double)(x[r * C + j] - mean[j]);
            want_sq[j] += xm * xm;
            want_dy[j] += dy[r * C + j];
            want_dy_xmu[j] += (double)dy[r * C + j] * xm;
        }
    float *x_d = dev_f32(d, x, ROWS * C), *dy_d = dev_f32(d, dy, ROWS * C), *mean_d = dev_f32(d, mean, C);
    const double five[C] = {5, 5, 5}; /* garbage the ops must overwrite */
    double *out_d = dev_f64(d, five, C), *sq_d = dev_f64(d, five, C), *s1_d = dev_f64(d, five, C);
    double *s2_d = dev_f64(d, five, C);
    d->be.ops->bn_col_sum(d->be.ctx, x_d, ROWS, C, out_d);
    d->be.ops->col_sqdev(d->be.ctx, x_d, mean_d, ROWS, C, sq_d);
    d->be.ops->bn_backward_sums(d->be.ctx, dy_d, x_d, mean_d, ROWS, C, s1_d, s2_d);
    EXPECT_SYNCED(d);
    double *out = host_f64(d, out_d, C), *sq = host_f64(d, sq_d, C), *s1 = host_f64(d, s1_d, C), *s2 = host_f64(d, s2_d, C);
    const double bound = 4.0 / 16777216.0;
    for (int j = 0; j < C; j++) {
        const struct { const char *op; double got, want; } r[] = {{"bn_col_sum", out[j], want_sum[j]},
                                                                  {"col_sqdev", sq[j], want_sq[j]},
                                                                  {"bn_backward_sums sum_dy", s1[j], want_dy[j]},
                                                                  {"bn_backward_sums sum_dy_xmu", s2[j], want_dy_xmu[j]}};
        for (int i = 0; i < 4; i++)
            EXPECT(d, fabs(r[i].got - r[i].want) <= bound * fabs(r[i].want),
                   "%s over %d rows of one sign: %.9g, want %.9g (relative error %.3g, more than 4 roundings)", r[i].op,
                   ROWS, r[i].got, r[i].want, fabs(r[i].got - r[i].want) / fabs(r[i].want));
    }
    HOST_FREE(x, dy, out, sq, s1, s2);
    DEV_FREE(d, x_d, dy_d, mean_d, out_d, sq_d, s1_d, s2_d);
}

/* Over no rows the reductions that overwrite give zeros (exact), and the others touch nothing. */
static void check_batch_norm_no_rows(const device *d)
{
    enum { C = 6 };
    float garbage[C];
    fill_uniform(garbage, C, 5.0f, 6.0f, 1900);
    double five[4 * C];
    for (int i = 0; i < 4 * C; i++) five[i] = 5.0;
    float *x_d = dev_f32(d, garbage, C), *mean_d = dev_f32(d, garbage, C);
    double *out_d = dev_f64(d, five, 4 * C); /* Σx | Σ(x − mean)² | Σdy | Σdy·(x − mean) */
    d->be.ops->bn_col_sum(d->be.ctx, x_d, 0, C, out_d);
    d->be.ops->col_sqdev(d->be.ctx, x_d, mean_d, 0, C, out_d + C);
    d->be.ops->bn_backward_sums(d->be.ctx, x_d, x_d, mean_d, 0, C, out_d + 2 * C, out_d + 3 * C);
    EXPECT_SYNCED(d);
    double *out = host_f64(d, out_d, 4 * C);
    int zero = 1;
    for (int i = 0; i < 4 * C; i++) zero &= out[i] == 0.0;
    EXPECT(d, zero, "bn_col_sum / col_sqdev / bn_backward_sums over no rows: %g %g %g %g, want 0", out[0], out[C],
           out[2 * C], out[3 * C]);
    HOST_FREE(out);
    DEV_FREE(d, x_d, mean_d, out_d);
}

/* A statistic from its sum: alpha·x in double, rounded to float once. */
static void check_bn_scale_sums(const device *d)
{
    enum { N = 5 };
    const double x[N] = {1.0, -3.0, 1e30, 1.0 / 3.0, 0.0}, alpha = 1.0 / 7.0;
    float garbage[N] = {9, 9, 9, 9, 9};
    double *x_d = dev_f64(d, x, N);
    float *y_d = dev_f32(d, garbage, N);
    d->be.ops->bn_scale_sums(d->be.ctx, N, alpha, x_d, y_d);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, N);
    for (int i = 0; i < N; i++)
        EXPECT(d, y[i] == (float)(alpha * x[i]), "bn_scale_sums[%d] = %.9g, want %.9g", i, y[i], (float)(alpha * x[i]));
    HOST_FREE(y);
    DEV_FREE(d, x_d, y_d);
}

static void test_batch_norm(const device *d)
{
    for (int i = 0; i < (int)(sizeof bn_cases / sizeof bn_cases[0]); i++) check_batch_norm(d, &bn_cases[i], i);
    check_batch_norm_long_sums(d);
    check_bn_scale_sums(d);
    check_batch_norm_no_rows(d);
}

/* Layer norm's tolerances, relative to the size of the terms (mag), as batch norm's: the mean and
 * variance are float sums of c = 37 terms in the CPU kernel (≤ 37·2^-24 = 2.2e-6 of their size),
 * y and dx a few float operations more. */
static const tolerance ln_mean_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
static const tolerance ln_rstd_tol[] = {{"cpu", RTOL, 0.0}, {NULL, 0, 0}};
static const tolerance ln_forward_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
static const tolerance ln_backward_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
static const tolerance ln_param_grads_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};

/* Per row over c channels: y, and the mean and rstd saved for backward, against the double
 * reference; backward from the saved statistics (the reference's, rounded to float), dx against
 * the first-principles gradient, dgamma and dbeta accumulated onto start values. Rows have
 * different offsets (a kernel that mixed rows' statistics would show), and one is constant
 * (0.5 throughout: its mean is exact, its variance 0, y is beta, rstd 1/sqrt(eps)). */
static void test_layer_norm(const device *d)
{
    enum { ROWS = 6, C = 37, N = ROWS * C, CONSTANT_ROW = 4 };
    const crew_backend *be = &d->be;
    const float eps = 1e-3f;
    float x[N], dy[N], gamma[C], beta[C], garbage[N], start[2 * C], stats_f[2 * ROWS]; /* mean | rstd */
    double want_y[N], mag_y[N], want_stats[2 * ROWS], mag_stats[2 * ROWS], want_dx[N], mag_dx[N];
    double want_grads[2 * C] = {0}, mag_grads[2 * C] = {0}, row[C], g[C];
    fill_uniform(x, N, -1.0f, 1.0f, 2001);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < C; j++) x[r * C + j] = r == CONSTANT_ROW ? 0.5f : x[r * C + j] + 0.4f * (float)(r - 2);
    fill_uniform(dy, N, -1.0f, 1.0f, 2002);
    fill_uniform(gamma, C, 0.5f, 1.5f, 2003);
    fill_uniform(beta, C, -0.5f, 0.5f, 2004);
    fill_uniform(garbage, N, 5.0f, 6.0f, 2005);
    fill_uniform(start, 2 * C, -1.0f, 1.0f, 2006);
    for (int j = 0; j < 2 * C; j++) want_grads[j] = start[j], mag_grads[j] = fabs(start[j]);
    int reference_ok = 1;
    for (int r = 0; r < ROWS; r++) {
        double abs_x = 0.0;
        for (int j = 0; j < C; j++) {
            row[j] = x[r * C + j];
            g[j] = (double)dy[r * C + j] * gamma[j];
            abs_x += fabs(row[j]);
        }
        norm_stats s = norm_stats_of(C, row, eps);
        want_stats[r] = s.mean, mag_stats[r] = abs_x / C;
        want_stats[ROWS + r] = s.rstd, mag_stats[ROWS + r] = s.rstd;
        stats_f[r] = (float)s.mean, stats_f[ROWS + r] = (float)s.rstd;
        for (int j = 0; j < C; j++) {
            double xhat = (row[j] - s.mean) * s.rstd, dyr = dy[r * C + j];
            want_y[r * C + j] = gamma[j] * xhat + beta[j];
            /* the float mean errs by ~C·2^-24 of Σ|x|/C, which y sees times gamma·rstd */
            mag_y[r * C + j] = fabs(gamma[j]) * s.rstd * (fabs(row[j] - s.mean) + abs_x / C) + fabs(beta[j]);
            want_grads[j] += dyr * xhat; /* dgamma = Σ dy·xhat, dbeta = Σ dy, over the rows */
            mag_grads[j] += fabs(dyr * xhat);
            want_grads[C + j] += dyr;
            mag_grads[C + j] += fabs(dyr);
        }
        norm_grad_reference(C, row, g, eps, want_dx + r * C, mag_dx + r * C);
        reference_ok &= norm_grad_agrees_with_differences(C, row, g, eps, want_dx + r * C, mag_dx + r * C);
    }
    EXPECT(d, reference_ok, "layer norm: the reference dx disagrees with finite differences");

    float *x_d = dev_f32(d, x, N), *dy_d = dev_f32(d, dy, N), *gamma_d = dev_f32(d, gamma, C);
    float *beta_d = dev_f32(d, beta, C), *stats_in_d = dev_f32(d, stats_f, 2 * ROWS);
    float *y_d = dev_f32(d, garbage, N), *stats_d = dev_f32(d, garbage, 2 * ROWS), *dx_d = dev_f32(d, garbage, N);
    float *grads_d = dev_f32(d, start, 2 * C);
    be->ops->layernorm_forward(be->ctx, x_d, gamma_d, beta_d, eps, y_d, stats_d, stats_d + ROWS, ROWS, C);
    be->ops->layernorm_backward(be->ctx, dy_d, x_d, gamma_d, stats_in_d, stats_in_d + ROWS, dx_d, grads_d,
                                grads_d + C, ROWS, C);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, N), *stats = host_f32(d, stats_d, 2 * ROWS), *dx = host_f32(d, dx_d, N);
    float *grads = host_f32(d, grads_d, 2 * C);
    const char *shape = "rows 6, c 37";
    expect_match(d, y, want_y, mag_y, N, ln_forward_tol, "layernorm_forward", shape, "y");
    expect_match(d, stats, want_stats, mag_stats, ROWS, ln_mean_tol, "layernorm_forward", shape, "mean");
    expect_match(d, stats + ROWS, want_stats + ROWS, mag_stats + ROWS, ROWS, ln_rstd_tol, "layernorm_forward", shape,
                 "rstd");
    expect_match(d, dx, want_dx, mag_dx, N, ln_backward_tol, "layernorm_backward", shape, "dx");
    expect_match(d, grads, want_grads, mag_grads, C, ln_param_grads_tol, "layernorm_backward", shape, "dgamma");
    expect_match(d, grads + C, want_grads + C, mag_grads + C, C, ln_param_grads_tol, "layernorm_backward", shape,
                 "dbeta");
    /* the constant row's mean is exact in any order of summation */
    EXPECT(d, stats[CONSTANT_ROW] == 0.5f, "layernorm_forward of a row of 0.5: mean %.9g", stats[CONSTANT_ROW]);
    HOST_FREE(y, stats, dx, grads);
    DEV_FREE(d, x_d, dy_d, gamma_d, beta_d, stats_in_d, y_d, stats_d, dx_d, grads_d);
}

/* ------------------------------------------------------------------ attention */

/* Causal multi-head self-attention (backend.h) against a reference written from the definition,
 * in double, one (sample, head, position) at a time: scores q_t·k_s/√d for s ≤ t only, their
 * softmax, y_t = Σ_s att·v_s; backward by the chain rule through each of those, term by term. */
typedef struct attn_case {
    int64_t batch, T, heads, d;
    float q_scale; /* q drawn from U(±q_scale), k and v from U(±1) */
} attn_case;

static const attn_case attn_cases[] = {
    {2, 7, 3, 5, 1.0f},   /* several samples and heads, head_dim neither T nor a power of 2 */
    {3, 1, 2, 4, 1.0f},   /* T = 1: att is 1, y = v, and dq = dk = 0 (the softmax of one score) */
    {2, 6, 1, 8, 1.0f},   /* one head: C = d */
    {1, 1, 1, 1, 1.0f},   /* the smallest: every size 1 */
    {2, 9, 2, 4, 200.0f}, /* scores past 88, where expf overflows float: the row's max must come off */
    {1, 40, 2, 4, 1.0f},  /* T past the CPU's 32-row blocks of the causal products, not a multiple of them */
    {2, 64, 2, 32, 1.0f}, /* gpt_tiny's head width: the CPU's register tiles whole, rows and columns */
    {1, 70, 2, 48, 1.0f}, /* tiles with a remainder of rows, one vector past a pair, rows past whole strips */
};

/* The sizes of one case's arrays. */
typedef struct attn_sizes {
    int64_t C, n_qkv, n_att, n_y;
} attn_sizes;

static attn_sizes attn_sizes_of(const attn_case *ac)
{
    int64_t C = ac->heads * ac->d;
    return (attn_sizes){C, ac->batch * ac->T * 3 * C, ac->batch * ac->heads * ac->T * ac->T, ac->batch * ac->T * C};
}

/* Index into qkv [batch, T, 3C] of element i of head h of part (0 q, 1 k, 2 v) at position t. */
static int64_t qkv_index(const attn_case *ac, int64_t b, int64_t t, int part, int64_t h, int64_t i)
{
    int64_t C = ac->heads * ac->d;
    return (b * ac->T + t) * 3 * C + part * C + h * ac->d + i;
}

/* Index into att [batch, heads, T, T], and into y or dy [batch, T, C]. */
static int64_t att_index(const attn_case *ac, int64_t b, int64_t h, int64_t t, int64_t s)
{
    return ((b * ac->heads + h) * ac->T + t) * ac->T + s;
}

static int64_t y_index(const attn_case *ac, int64_t b, int64_t t, int64_t h, int64_t i)
{
    return (b * ac->T + t) * ac->heads * ac->d + h * ac->d + i;
}

/* Forward in double from qkv. mag_att and mag_y (either may be NULL) receive the size of what
 * float rounding errs relative to: an att value is exp(score − logsumexp), so its relative error
 * is the absolute error of the exponent, which is relative to the scores' terms Σ|q·k|/√d (its
 * own and the row maximum's); y's is Σ_s mag_att·|v|. Returns the largest score. */
static double attention_ref_forward(const attn_case *ac, const double *qkv, double *att, double *y, double *mag_att,
                                    double *mag_y)
{
    const int64_t T = ac->T, d = ac->d;
    const double rs = 1.0 / sqrt((double)d);
    double *score = dbuf(T), *terms = dbuf(T), max_score = -INFINITY;
    for (int64_t b = 0; b < ac->batch; b++)
        for (int64_t h = 0; h < ac->heads; h++)
            for (int64_t t = 0; t < T; t++) {
                double mx = -INFINITY, big = 0.0, z = 0.0;
                for (int64_t s = 0; s <= t; s++) {
                    score[s] = terms[s] = 0.0;
                    for (int64_t i = 0; i < d; i++) {
                        double p = qkv[qkv_index(ac, b, t, 0, h, i)] * qkv[qkv_index(ac, b, s, 1, h, i)];
                        score[s] += p * rs;
                        terms[s] += fabs(p) * rs;
                    }
                    mx = fmax(mx, score[s]);
                    big = fmax(big, terms[s]);
                }
                max_score = fmax(max_score, mx);
                for (int64_t s = 0; s <= t; s++) z += exp(score[s] - mx);
                for (int64_t s = 0; s < T; s++) {
                    int64_t a = att_index(ac, b, h, t, s);
                    att[a] = s <= t ? exp(score[s] - mx) / z : 0.0;
                    if (mag_att) mag_att[a] = att[a] * (1.0 + terms[s <= t ? s : 0] + big);
                }
                for (int64_t i = 0; i < d; i++) {
                    double sum = 0.0, mag = 0.0;
                    for (int64_t s = 0; s <= t; s++) {
                        int64_t a = att_index(ac, b, h, t, s);
                        double v = qkv[qkv_index(ac, b, s, 2, h, i)];
                        sum += att[a] * v;
                        if (mag_att) mag += mag_att[a] * fabs(v);
                    }
                    y[y_index(ac, b, t, h, i)] = sum;
                    if (mag_y) mag_y[y_index(ac, b, t, h, i)] = mag;
                }
            }
    free(score);
    free(terms);
    return max_score;
}

/* Backward in double: with datt_ts = dy_t·v_s, the softmax's ds_ts = att_ts·(datt_ts − Σ_s' att_ts'·datt_ts'),
 * dq_t = Σ_s ds_ts·k_s/√d, dk_s = Σ_t ds_ts·q_t/√d, dv_s = Σ_t att_ts·dy_t, over s ≤ t. The
 * difference inside ds cancels (its row sums to 0; all of it when T = 1), so mag receives the size
 * of the terms instead: M_ts = Σ_i |dy·v| in place of datt, att·(M + Σ att·M) in place of |ds|. */
static void attention_ref_backward(const attn_case *ac, const double *qkv, const double *att, const double *dy,
                                   double *dqkv, double *mag)
{
    const int64_t T = ac->T, d = ac->d;
    const double rs = 1.0 / sqrt((double)d);
    attn_sizes z = attn_sizes_of(ac);
    double *ds = dbuf(T * T), *mds = dbuf(T * T);
    memset(dqkv, 0, sizeof(double) * (size_t)z.n_qkv);
    memset(mag, 0, sizeof(double) * (size_t)z.n_qkv);
    for (int64_t b = 0; b < ac->batch; b++)
        for (int64_t h = 0; h < ac->heads; h++) {
            for (int64_t t = 0; t < T; t++) {
                double dot = 0.0, mdot = 0.0;
                for (int64_t s = 0; s <= t; s++) {
                    double da = 0.0, m = 0.0;
                    for (int64_t i = 0; i < d; i++) {
                        double p = dy[y_index(ac, b, t, h, i)] * qkv[qkv_index(ac, b, s, 2, h, i)];
                        da += p;
                        m += fabs(p);
                    }
                    ds[t * T + s] = da;
                    mds[t * T + s] = m;
                    dot += att[att_index(ac, b, h, t, s)] * da;
                    mdot += att[att_index(ac, b, h, t, s)] * m;
                }
                for (int64_t s = 0; s <= t; s++) {
                    double a = att[att_index(ac, b, h, t, s)];
                    ds[t * T + s] = a * (ds[t * T + s] - dot);
                    mds[t * T + s] = a * (mds[t * T + s] + mdot);
                }
            }
            for (int64_t t = 0; t < T; t++)
                for (int64_t s = 0; s <= t; s++) {
                    double a = att[att_index(ac, b, h, t, s)];
                    for (int64_t i = 0; i < d; i++) {
                        int64_t qi = qkv_index(ac, b, t, 0, h, i), ki = qkv_index(ac, b, s, 1, h, i);
                        int64_t vi = qkv_index(ac, b, s, 2, h, i);
                        double dyi = dy[y_index(ac, b, t, h, i)];
                        dqkv[qi] += ds[t * T + s] * qkv[ki] * rs;
                        mag[qi] += mds[t * T + s] * fabs(qkv[ki]) * rs;
                        dqkv[ki] += ds[t * T + s] * qkv[qi] * rs;
                        mag[ki] += mds[t * T + s] * fabs(qkv[qi]) * rs;
                        dqkv[vi] += a * dyi;
                        mag[vi] += a * fabs(dyi);
                    }
                }
        }
    free(ds);
    free(mds);
}

/* L = Σ dy·y(qkv): the reference backward is its gradient. */
static double attention_ref_loss(const attn_case *ac, const double *qkv, const double *dy)
{
    attn_sizes z = attn_sizes_of(ac);
    double *att = dbuf(z.n_att), *y = dbuf(z.n_y), l = 0.0;
    attention_ref_forward(ac, qkv, att, y, NULL, NULL);
    for (int64_t j = 0; j < z.n_y; j++) l += dy[j] * y[j];
    HOST_FREE(att, y);
    return l;
}

/* The reference checks itself: central differences of attention_ref_loss in double. h = 1e-6:
 * truncation h²·L'''/6 stays below 1e-8 even where q is scaled by 200 (L''' ~ (200/√d)³·|k|³),
 * rounding ~1e-16·|L|/h ≈ 1e-9; both far below 1e-6 of the gradient's terms. */
static int attention_grad_agrees_with_differences(const attn_case *ac, double *qkv, const double *dy,
                                                  const double *dqkv, const double *mag)
{
    const double h = 1e-6;
    attn_sizes z = attn_sizes_of(ac);
    for (int64_t j = 0; j < z.n_qkv; j++) {
        double keep = qkv[j];
        qkv[j] = keep + h;
        double up = attention_ref_loss(ac, qkv, dy);
        qkv[j] = keep - h;
        double down = attention_ref_loss(ac, qkv, dy);
        qkv[j] = keep;
        if (fabs((up - down) / (2.0 * h) - dqkv[j]) > 1e-6 * (mag[j] + 1.0)) return 0;
    }
    return 1;
}

/* att, y and dqkv relative to the size of their terms (mag, first_mismatch_of_sum). A score is a
 * sum of d ≤ 48 products, an att value a few float operations more on it and the row's sum of
 * T ≤ 70 exponentials, y and each piece of dqkv a sum over T or d terms, the softmax's backward one
 * dot over T more: at worst ~150 roundings of 2^-24, 9e-6 of the terms, and in practice (roundings
 * that do not all fall one way) a few times less, so 1e-5 holds while a wrong index, scale or mask
 * errs by O(1). */
static const tolerance attn_forward_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};
static const tolerance attn_backward_tol[] = {{"cpu", RTOL, 1e-7}, {NULL, 0, 0}};

/* backend.h: "each sample is computed on its own, in a fixed order". Sample b run alone (batch
 * 1, at device offsets into the same inputs) must give the bits of sample b in the batch. */
static void check_attention_per_sample(const device *d, const attn_case *ac, const float *qkv_d, const float *att_d,
                                       const float *dy_d, const float *att, const float *y, const float *dqkv,
                                       const char *shape)
{
    const crew_backend *be = &d->be;
    attn_sizes z = attn_sizes_of(ac);
    const int64_t T = ac->T, H = ac->heads, C = z.C, sq = H * T * T;
    float *att1_d = dev_zeros_f32(d, sq), *y1_d = dev_zeros_f32(d, T * C), *datt1_d = dev_zeros_f32(d, sq);
    float *dqkv1_d = dev_zeros_f32(d, T * 3 * C);
    float *att1 = fbuf(sq), *y1 = fbuf(T * C), *dqkv1 = fbuf(T * 3 * C);
    int same = 1;
    for (int64_t b = 0; b < ac->batch; b++) {
        be->ops->attention_forward(be->ctx, qkv_d + b * T * 3 * C, att1_d, CREW_DT_F32, NULL, y1_d, 1, T, H, ac->d);
        be->ops->attention_backward(be->ctx, dy_d + b * T * C, qkv_d + b * T * 3 * C, att_d + b * sq, CREW_DT_F32,
                                    datt1_d, dqkv1_d, 1, T, H, ac->d);
        EXPECT_SYNCED(d);
        fetch(d, att1, att1_d, sq, CREW_DT_F32);
        fetch(d, y1, y1_d, T * C, CREW_DT_F32);
        fetch(d, dqkv1, dqkv1_d, T * 3 * C, CREW_DT_F32);
        same &= memcmp(att1, att + b * sq, sizeof(float) * (size_t)sq) == 0;
        same &= memcmp(y1, y + b * T * C, sizeof(float) * (size_t)(T * C)) == 0;
        same &= memcmp(dqkv1, dqkv + b * T * 3 * C, sizeof(float) * (size_t)(T * 3 * C)) == 0;
    }
    EXPECT(d, same, "attention (%s): a sample run alone differs from the same sample in the batch", shape);
    HOST_FREE(att1, y1, dqkv1);
    DEV_FREE(d, att1_d, y1_d, datt1_d, dqkv1_d);
}

/* The case's inputs: qkv (q scaled by q_scale) and dy, as check_attention draws them. */
static void attention_inputs(const attn_case *ac, float *qkv, float *dy)
{
    attn_sizes z = attn_sizes_of(ac);
    uint64_t key = 3001 + 16 * (uint64_t)(ac - attn_cases);
    fill_uniform(qkv, z.n_qkv, -1.0f, 1.0f, key);
    for (int64_t b = 0; b < ac->batch; b++)
        for (int64_t t = 0; t < ac->T; t++)
            for (int64_t j = 0; j < z.C; j++) qkv[(b * ac->T + t) * 3 * z.C + j] *= ac->q_scale;
    fill_uniform(dy, z.n_y, -1.0f, 1.0f, key + 1);
}

/* One case: forward into att and y prefilled with garbage (the op overwrites them, the masked
 * half of att included, which must be exactly 0); backward from the reference's att rounded to
 * float (so that it is checked on its own, as layer norm's from the reference's statistics), into
 * garbage-filled dqkv and datt (overwritten; datt is scratch and not compared). */
static void check_attention(const device *d, const attn_case *ac)
{
    const crew_backend *be = &d->be;
    attn_sizes z = attn_sizes_of(ac);
    char shape[96];
    snprintf(shape, sizeof shape, "batch %lld, T %lld, heads %lld, head_dim %lld, q in +-%g", (long long)ac->batch,
             (long long)ac->T, (long long)ac->heads, (long long)ac->d, (double)ac->q_scale);
    /* garbage prefills every output: as long as the longest of them (att's [T, T] blocks outgrow qkv's
     * [T, 3C] once T > 3C / heads) */
    const int64_t n_garbage = z.n_att > z.n_qkv ? z.n_att : z.n_qkv;
    float *qkv = fbuf(z.n_qkv), *dy = fbuf(z.n_y), *att_f = fbuf(z.n_att), *garbage = fbuf(n_garbage);
    double *qkv_r = dbuf(z.n_qkv), *dy_r = dbuf(z.n_y), *want_att = dbuf(z.n_att), *mag_att = dbuf(z.n_att);
    double *want_y = dbuf(z.n_y), *mag_y = dbuf(z.n_y), *want_dqkv = dbuf(z.n_qkv), *mag_dqkv = dbuf(z.n_qkv);
    attention_inputs(ac, qkv, dy);
    fill_uniform(garbage, n_garbage, 5.0f, 6.0f, 3001 + 16 * (uint64_t)(ac - attn_cases) + 2);
    for (int64_t j = 0; j < z.n_qkv; j++) qkv_r[j] = qkv[j];
    for (int64_t j = 0; j < z.n_y; j++) dy_r[j] = dy[j];
    double max_score = attention_ref_forward(ac, qkv_r, want_att, want_y, mag_att, mag_y);
    attention_ref_backward(ac, qkv_r, want_att, dy_r, want_dqkv, mag_dqkv);
    /* the reference checks itself on the small cases (two reference passes per input: at the
     * tile-sized ones, 20,000 inputs of a 500,000-product pass, minutes under the sanitizers) */
    if (attn_sizes_of(ac).n_qkv <= 2048)
        EXPECT(d, attention_grad_agrees_with_differences(ac, qkv_r, dy_r, want_dqkv, mag_dqkv),
               "attention (%s): the reference dqkv disagrees with finite differences", shape);
    if (ac->q_scale > 1.0f)
        EXPECT(d, max_score > 89.0, "attention (%s): the largest score is %.3g, which expf does not overflow on",
               shape, max_score);
    for (int64_t j = 0; j < z.n_att; j++) att_f[j] = (float)want_att[j];

    float *qkv_d = dev_f32(d, qkv, z.n_qkv), *dy_d = dev_f32(d, dy, z.n_y), *att_in_d = dev_f32(d, att_f, z.n_att);
    float *att_d = dev_f32(d, garbage, z.n_att), *y_d = dev_f32(d, garbage, z.n_y);
    float *datt_d = dev_f32(d, garbage, z.n_att), *dqkv_d = dev_f32(d, garbage, z.n_qkv);
    be->ops->attention_forward(be->ctx, qkv_d, att_d, CREW_DT_F32, NULL, y_d, ac->batch, ac->T, ac->heads, ac->d);
    be->ops->attention_backward(be->ctx, dy_d, qkv_d, att_in_d, CREW_DT_F32, datt_d, dqkv_d, ac->batch, ac->T,
                                ac->heads, ac->d);
    EXPECT_SYNCED(d);
    float *att = host_f32(d, att_d, z.n_att), *y = host_f32(d, y_d, z.n_y), *dqkv = host_f32(d, dqkv_d, z.n_qkv);
    expect_match(d, att, want_att, mag_att, z.n_att, attn_forward_tol, "attention_forward", shape, "att");
    expect_match(d, y, want_y, mag_y, z.n_y, attn_forward_tol, "attention_forward", shape, "y");
    expect_match(d, dqkv, want_dqkv, mag_dqkv, z.n_qkv, attn_backward_tol, "attention_backward", shape, "dqkv");
    int64_t unmasked = 0;
    for (int64_t bh = 0; bh < ac->batch * ac->heads; bh++)
        for (int64_t t = 0; t < ac->T; t++)
            for (int64_t s = t + 1; s < ac->T; s++) unmasked += att[(bh * ac->T + t) * ac->T + s] != 0.0f;
    EXPECT(d, unmasked == 0, "attention_forward (%s): %lld values above the diagonal are not 0", shape,
           (long long)unmasked);
    /* y NULL: the probabilities alone (backward's recompute), the same bits */
    float *att_only_d = dev_f32(d, garbage, z.n_att);
    be->ops->attention_forward(be->ctx, qkv_d, att_only_d, CREW_DT_F32, NULL, NULL, ac->batch, ac->T, ac->heads, ac->d);
    EXPECT_SYNCED(d);
    float *att_only = host_f32(d, att_only_d, z.n_att);
    EXPECT(d, !memcmp(att_only, att, sizeof(float) * (size_t)z.n_att),
           "attention_forward (%s) without y: the probabilities differ from the full forward's", shape);
    HOST_FREE(att_only);
    DEV_FREE(d, att_only_d);
    /* a NaN in every q of sample 0's head 0 (its scores NaN): the zeros above the diagonal hold, and
     * the NaN reaches every probability on and below it (a softmax that hid it would let a loss look
     * finite over a broken forward) */
    float *qkv_nan = fbuf(z.n_qkv);
    memcpy(qkv_nan, qkv, sizeof(float) * (size_t)z.n_qkv);
    for (int64_t t = 0; t < ac->T; t++) qkv_nan[t * 3 * ac->heads * ac->d] = NAN;
    float *qkv_nan_d = dev_f32(d, qkv_nan, z.n_qkv), *att_nan_d = dev_f32(d, garbage, z.n_att);
    be->ops->attention_forward(be->ctx, qkv_nan_d, att_nan_d, CREW_DT_F32, NULL, y_d, ac->batch, ac->T, ac->heads,
                               ac->d);
    EXPECT_SYNCED(d);
    float *att_nan = host_f32(d, att_nan_d, z.n_att);
    int64_t zero_above = 0, nan_below = 0;
    for (int64_t t = 0; t < ac->T; t++) {
        for (int64_t s = 0; s <= t; s++) nan_below += isnan(att_nan[t * ac->T + s]) != 0;
        for (int64_t s = t + 1; s < ac->T; s++) {
            const float v = att_nan[t * ac->T + s];
            zero_above += v == 0.0f && !signbit(v);
        }
    }
    EXPECT(d, zero_above == ac->T * (ac->T - 1) / 2,
           "attention_forward (%s), NaN scores: %lld of %lld values above the diagonal are +0", shape,
           (long long)zero_above, (long long)(ac->T * (ac->T - 1) / 2));
    EXPECT(d, nan_below == ac->T * (ac->T + 1) / 2,
           "attention_forward (%s), NaN scores: %lld of %lld probabilities on and below the diagonal are NaN",
           shape, (long long)nan_below, (long long)(ac->T * (ac->T + 1) / 2));
    HOST_FREE(qkv_nan, att_nan);
    DEV_FREE(d, qkv_nan_d, att_nan_d);
    if (ac->batch > 1) check_attention_per_sample(d, ac, qkv_d, att_in_d, dy_d, att, y, dqkv, shape);
    HOST_FREE(qkv, dy, att_f, garbage, qkv_r, dy_r, want_att, mag_att, want_y, mag_y, want_dqkv, mag_dqkv);
    HOST_FREE(att, y, dqkv);
    DEV_FREE(d, qkv_d, dy_d, att_in_d, att_d, y_d, datt_d, dqkv_d);
}

/* bfloat16's rounding of q, k, v, dy and the softmax's output, ≤ 2^-8 each, a few of them on
 * every term: 1/64 of the terms' size. A wrong index, scale or mask errs by O(1). */
static const tolerance attn_bf16_tol[] = {{"cpu", 1.0 / 64.0, 1e-6}, {NULL, 0, 0}};

/* att kept in bfloat16 (backend.h) on a second device of the kind opened in bf16, against the
 * float32 att path on that device: att must be its values rounded to bfloat16, y its bits, and
 * dqkv, from the same att values (the float32 path's att given the bfloat16 ones, widened), its
 * bits; then y and dqkv near the reference in double (bfloat16's tolerance; the reference's
 * backward from the same att values). Garbage in every output first: each is overwritten. */
static void check_attention_bf16(const device *fp32, const attn_case *ac)
{
    device dv = {fp32->kind, {0}}, *d = &dv;
    const crew_device_options o = {.blas_threads = 1, .precision = CREW_PRECISION_BF16};
    EXPECT_OK(d, crew_device_open(d->kind->name, 0, &o, &d->be));
    if (!d->be.ops) return;
    const crew_backend *be = &d->be;
    attn_sizes z = attn_sizes_of(ac);
    const int64_t B = ac->batch, T = ac->T, H = ac->heads, hd = ac->d;
    char shape[96];
    snprintf(shape, sizeof shape, "bf16 att, batch %lld, T %lld, heads %lld, head_dim %lld, q in +-%g", (long long)B,
             (long long)T, (long long)H, (long long)hd, (double)ac->q_scale);
    const int64_t n_garbage = z.n_att > z.n_qkv ? z.n_att : z.n_qkv; /* as long as the longest output */
    float *qkv = fbuf(z.n_qkv), *dy = fbuf(z.n_y), *garbage = fbuf(n_garbage), *widened = fbuf(z.n_att);
    uint16_t *garbage16 = hbuf(CREW_DT_BF16, z.n_att);
    attention_inputs(ac, qkv, dy);
    fill_uniform(garbage, n_garbage, 5.0f, 6.0f, 3999);
    for (int64_t j = 0; j < z.n_att; j++) garbage16[j] = crew_bf16_bits(garbage[j]);

    float *qkv_d = dev_f32(d, qkv, z.n_qkv), *dy_d = dev_f32(d, dy, z.n_y);
    float *att32_d = dev_f32(d, garbage, z.n_att), *y32_d = dev_f32(d, garbage, z.n_y);
    float *scores_d = dev_f32(d, garbage, z.n_att), *y16_d = dev_f32(d, garbage, z.n_y);
    float *datt_d = dev_f32(d, garbage, z.n_att), *dqkv32_d = dev_f32(d, garbage, z.n_qkv);
    float *dqkv16_d = dev_f32(d, garbage, z.n_qkv);
    void *att16_d = dev_copy_of(d, CREW_DT_BF16, garbage16, z.n_att);
    be->ops->attention_forward(be->ctx, qkv_d, att32_d, CREW_DT_F32, NULL, y32_d, B, T, H, hd);
    be->ops->attention_forward(be->ctx, qkv_d, att16_d, CREW_DT_BF16, scores_d, y16_d, B, T, H, hd);
    EXPECT_SYNCED(d);
    float *att32 = host_f32(d, att32_d, z.n_att), *y32 = host_f32(d, y32_d, z.n_y), *y16 = host_f32(d, y16_d, z.n_y);
    uint16_t *att16 = host_copy_of(d, CREW_DT_BF16, att16_d, z.n_att);
    int64_t off = -1;
    for (int64_t j = 0; j < z.n_att && off < 0; j++)
        if (att16[j] != crew_bf16_bits(att32[j])) off = j;
    EXPECT(d, off < 0, "attention_forward (%s): att[%lld] = %.9g is not the float32 path's %.9g rounded", shape,
           (long long)off, off < 0 ? 0.0 : (double)crew_bf16_widen(att16[off]), off < 0 ? 0.0 : (double)att32[off]);
    EXPECT(d, memcmp(y16, y32, sizeof(float) * (size_t)z.n_y) == 0,
           "attention_forward (%s): y differs from the float32 path's on the same device", shape);
    void *only16_d = dev_copy_of(d, CREW_DT_BF16, garbage16, z.n_att); /* y NULL: the probabilities alone */
    be->ops->attention_forward(be->ctx, qkv_d, only16_d, CREW_DT_BF16, scores_d, NULL, B, T, H, hd);
    EXPECT_SYNCED(d);
    crew_bf16 *only16 = host_copy_of(d, CREW_DT_BF16, only16_d, z.n_att);
    EXPECT(d, !memcmp(only16, att16, sizeof(crew_bf16) * (size_t)z.n_att),
           "attention_forward (%s) without y: the probabilities differ from the full forward's", shape);
    HOST_FREE(only16);
    DEV_FREE(d, only16_d);

    for (int64_t j = 0; j < z.n_att; j++) widened[j] = crew_bf16_widen(att16[j]);
    float *widened_d = dev_f32(d, widened, z.n_att);
    be->ops->attention_backward(be->ctx, dy_d, qkv_d, widened_d, CREW_DT_F32, datt_d, dqkv32_d, B, T, H, hd);
    be->ops->attention_backward(be->ctx, dy_d, qkv_d, att16_d, CREW_DT_BF16, datt_d, dqkv16_d, B, T, H, hd);
    EXPECT_SYNCED(d);
    float *dqkv32 = host_f32(d, dqkv32_d, z.n_qkv), *dqkv16 = host_f32(d, dqkv16_d, z.n_qkv);
    EXPECT(d, memcmp(dqkv16, dqkv32, sizeof(float) * (size_t)z.n_qkv) == 0,
           "attention_backward (%s): dqkv differs from the float32 path's from the same att values", shape);

    double *qkv_r = dbuf(z.n_qkv), *dy_r = dbuf(z.n_y), *att_r = dbuf(z.n_att), *mag_att = dbuf(z.n_att);
    double *want_y = dbuf(z.n_y), *mag_y = dbuf(z.n_y), *want_dqkv = dbuf(z.n_qkv), *mag_dqkv = dbuf(z.n_qkv);
    for (int64_t j = 0; j < z.n_qkv; j++) qkv_r[j] = qkv[j];
    for (int64_t j = 0; j < z.n_y; j++) dy_r[j] = dy[j];
    attention_ref_forward(ac, qkv_r, att_r, want_y, mag_att, mag_y);
    expect_match(d, y16, want_y, mag_y, z.n_y, attn_bf16_tol, "attention_forward", shape, "y");
    for (int64_t j = 0; j < z.n_att; j++) att_r[j] = widened[j];
    attention_ref_backward(ac, qkv_r, att_r, dy_r, want_dqkv, mag_dqkv);
    expect_match(d, dqkv16, want_dqkv, mag_dqkv, z.n_qkv, attn_bf16_tol, "attention_backward", shape, "dqkv");
    HOST_FREE(qkv, dy, garbage, widened, garbage16, att32, y32, y16, att16, dqkv32, dqkv16);
    HOST_FREE(qkv_r, dy_r, att_r, mag_att, want_y, mag_y, want_dqkv, mag_dqkv);
    DEV_FREE(d, qkv_d, dy_d, att32_d, y32_d, scores_d, y16_d, datt_d, dqkv32_d, dqkv16_d, att16_d, widened_d);
    crew_device_close(&d->be);
}

static void test_attention(const device *d)
{
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) {
        check_attention(d, &attn_cases[i]);
        check_attention_bf16(d, &attn_cases[i]);
    }
}

/* ------------------------------------------------------------------ optimisers */

/* The updates are a few float operations per step on values ≤ 1. */
static const tolerance sgd_tol[] = {{"cpu", 1e-6, 1e-7}, {NULL, 0, 0}};
static const tolerance adamw_p_tol[] = {{"cpu", 1e-6, 1e-7}, {NULL, 0, 0}};
static const tolerance adamw_m_tol[] = {{"cpu", 1e-6, 1e-9}, {NULL, 0, 0}};
/* v's 3e-5: 1 − 0.999f is 0.000999987 in float32, 1.3e-5 away from the exact 0.001. */
static const tolerance adamw_v_tol[] = {{"cpu", 3e-5, 1e-10}, {NULL, 0, 0}};

/* One parameter (twice), gradients 0.5, -0.25, 1.0 in steps 1..3, lr 0.1, starting at 1.0. The
 * expected values follow torch.optim.SGD step by step (worked out by hand, checked in double):
 *   d = g + wd·p;  buf = d (step 1) or μ·buf + d;  d = nesterov ? d + μ·buf : buf;  p −= lr·d. */
static void check_sgd(const device *d, float momentum, int nesterov, float wd, const double want[3], const char *what)
{
    const float p0[2] = {1.0f, 1.0f}, grads[6] = {0.5f, 0.5f, -0.25f, -0.25f, 1.0f, 1.0f};
    float *p_d = dev_f32(d, p0, 2), *g_d = dev_f32(d, grads, 6), *v_d = dev_zeros_f32(d, 2);
    for (int t = 0; t < 3; t++) {
        d->be.ops->sgd_update(d->be.ctx, p_d, g_d + 2 * t, v_d, 2, 0.1f, momentum, nesterov, wd);
        EXPECT_SYNCED(d);
        float p[2];
        fetch(d, p, p_d, 2, CREW_DT_F32);
        EXPECT(d, close_to(p[0], want[t], tol_for(d, sgd_tol)) && p[1] == p[0], "%s step %d: p = %.9g, want %.9g",
               what, t + 1, p[0], want[t]);
    }
    DEV_FREE(d, p_d, g_d, v_d);
}

static void test_sgd(const device *d)
{
    check_sgd(d, 0.0f, 0, 0.01f, (const double[]){0.949, 0.973051, 0.872077949}, "sgd");
    check_sgd(d, 0.9f, 0, 0.01f, (const double[]){0.949, 0.927151, 0.806559749}, "sgd momentum");
    check_sgd(d, 0.9f, 1, 0.01f, (const double[]){0.9031, 0.90757411, 0.698189208191}, "sgd nesterov");
    /* wd 0: buf = 0.5, p = 0.95; buf = 0.45 − 0.25 = 0.2, p = 0.93; buf = 0.18 + 1 = 1.18, p = 0.812 */
    check_sgd(d, 0.9f, 0, 0.0f, (const double[]){0.95, 0.93, 0.812}, "sgd momentum, no decay");
}

typedef struct adamw_case {
    float lr;
    double b1, b2;
    float eps, wd, p0;
    double want_p[3], want_m[3], want_v[3];
    const char *what;
} adamw_case;

/* torch.optim.AdamW: p ·= 1 − lr·wd; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
 * p −= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps). Values from that formula in double. */
static const adamw_case adamw_cases[] = {
    {0.1f, 0.9, 0.999, 1e-8f, 0.01f, 1.0f, {0.899000002, 0.871467298706, 0.804784672376}, {0.05, 0.02, 0.118},
     {0.00025, 0.00031225, 0.00131193775}, "adamw"},
    {0.01f, 0.8, 0.99, 1e-3f, 0.1f, -2.0f, {-2.00798003992, -2.00807809442, -2.01297938452}, {0.1, 0.03, 0.224},
     {0.0025, 0.0031, 0.013069}, "adamw eps 1e-3"},
};

static void check_adamw(const device *d, const adamw_case *ac)
{
    const float grads[3] = {0.5f, -0.25f, 1.0f};
    float *p_d = dev_f32(d, &ac->p0, 1), *g_d = dev_f32(d, grads, 3), *m_d = dev_zeros_f32(d, 1);
    float *v_d = dev_zeros_f32(d, 1);
    for (int t = 1; t <= 3; t++) {
        const crew_optimizer_spec spec = {
            .type = CREW_OPT_ADAMW, .lr = ac->lr, .beta1 = ac->b1, .beta2 = ac->b2, .eps = ac->eps, .weight_decay = ac->wd};
        crew_adamw_consts k;
        crew_adamw_consts_at(&spec, ac->lr, t, &k);
        d->be.ops->adamw_update(d->be.ctx, p_d, g_d + t - 1, m_d, v_d, 1, &k);
        EXPECT_SYNCED(d);
        float p, m, v;
        fetch(d, &p, p_d, 1, CREW_DT_F32);
        fetch(d, &m, m_d, 1, CREW_DT_F32);
        fetch(d, &v, v_d, 1, CREW_DT_F32);
        EXPECT(d, close_to(p, ac->want_p[t - 1], tol_for(d, adamw_p_tol)), "%s step %d: p = %.9g, want %.9g",
               ac->what, t, p, ac->want_p[t - 1]);
        EXPECT(d, close_to(m, ac->want_m[t - 1], tol_for(d, adamw_m_tol)) &&
                      close_to(v, ac->want_v[t - 1], tol_for(d, adamw_v_tol)),
               "%s step %d: m = %.9g v = %.9g, want %.9g %.9g", ac->what, t, m, v, ac->want_m[t - 1],
               ac->want_v[t - 1]);
    }
    DEV_FREE(d, p_d, g_d, m_d, v_d);
}

/* Adam's direction (LAMB's first half) leaves the moments adamw_update leaves and writes
 * m / (1 − β1ᵗ) / (√(v / (1 − β2ᵗ)) + eps), in double here; in place over the gradient too. */
static void check_adam_direction(const device *d, const adamw_case *ac)
{
    const float grads[3] = {0.5f, -0.25f, 1.0f};
    float *m_d = dev_zeros_f32(d, 1), *v_d = dev_zeros_f32(d, 1), *u_d = dev_zeros_f32(d, 1);
    double m = 0.0, v = 0.0;
    for (int t = 1; t <= 3; t++) {
        const crew_optimizer_spec spec = {.type = CREW_OPT_LAMB, .lr = 1.0f, .beta1 = ac->b1, .beta2 = ac->b2,
                                          .eps = ac->eps};
        crew_adamw_consts k;
        crew_adamw_consts_at(&spec, 1.0f, t, &k);
        float *g_d = dev_f32(d, grads + t - 1, 1);
        const int in_place = t == 2;
        d->be.ops->adam_direction(d->be.ctx, g_d, m_d, v_d, in_place ? g_d : u_d, 1, &k);
        EXPECT_SYNCED(d);
        float u, mf, vf;
        fetch(d, &u, in_place ? g_d : u_d, 1, CREW_DT_F32);
        fetch(d, &mf, m_d, 1, CREW_DT_F32);
        fetch(d, &vf, v_d, 1, CREW_DT_F32);
        double g = grads[t - 1];
        m = ac->b1 * m + (1 - ac->b1) * g;
        v = ac->b2 * v + (1 - ac->b2) * g * g;
        double want = m / (1 - pow(ac->b1, t)) / (sqrt(v / (1 - pow(ac->b2, t))) + ac->eps);
        EXPECT(d, close_to(u, want, tol_for(d, adamw_p_tol)) && close_to(mf, m, tol_for(d, adamw_m_tol)) &&
                      close_to(vf, v, tol_for(d, adamw_v_tol)),
               "%s, adam_direction step %d%s: u = %.9g m = %.9g v = %.9g, want %.9g %.9g %.9g", ac->what, t,
               in_place ? " (in place)" : "", u, mf, vf, want, m, v);
        DEV_FREE(d, g_d);
    }
    DEV_FREE(d, m_d, v_d, u_d);
}

static void test_adamw(const device *d)
{
    for (size_t i = 0; i < sizeof adamw_cases / sizeof adamw_cases[0]; i++) check_adamw(d, &adamw_cases[i]);
    for (size_t i = 0; i < sizeof adamw_cases / sizeof adamw_cases[0]; i++) check_adam_direction(d, &adamw_cases[i]);
}

/* ------------------------------------------------------------------ elementwise ops */

/* float against double for each function; backward multiplies by dy and loses a little more in
 * the derivatives built from y (1 − y², y(1 − y)). */
static const tolerance act_forward_tol[] = {{"cpu", 1e-5, 1e-6}, {NULL, 0, 0}};
static const tolerance act_backward_tol[] = {{"cpu", 1e-4, 1e-6}, {NULL, 0, 0}};

static void act_reference(crew_activation act, double v, double *f, double *df)
{
    switch (act) {
    case CREW_ACT_RELU: *f = v > 0 ? v : 0, *df = v > 0; break;
    case CREW_ACT_GELU:
        *f = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        *df = 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
        break;
    case CREW_ACT_GELU_TANH: { /* 0.5·v·(1 + tanh u), u = √(2/π)(v + 0.044715v³); du/dv = √(2/π)(1 + 3·0.044715v²) */
        double k = sqrt(2.0 / M_PI), u = k * (v + 0.044715 * v * v * v), t = tanh(u);
        *f = 0.5 * v * (1.0 + t);
        *df = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
        break;
    }
    case CREW_ACT_TANH: *f = tanh(v), *df = 1.0 - *f * *f; break;
    case CREW_ACT_SIGMOID: *f = 1.0 / (1.0 + exp(-v)), *df = *f * (1.0 - *f); break;
    default: *f = v, *df = 1.0; break;
    }
}

static void check_activation(const device *d, crew_activation act, const float *x, const float *dy,
                             const float *x_d, const float *dy_d, float *y_d, float *dx_d, int n)
{
    d->be.ops->act_forward(d->be.ctx, act, x_d, y_d, n);
    d->be.ops->act_backward(d->be.ctx, act, x_d, y_d, dy_d, dx_d, n);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, n), *dx = host_f32(d, dx_d, n);
    int bad_y = -1, bad_dx = -1;
    for (int i = 0; i < n; i++) {
        double f, df;
        act_reference(act, x[i], &f, &df);
        if (bad_y < 0 && !close_to(y[i], f, tol_for(d, act_forward_tol))) bad_y = i;
        if (bad_dx < 0 && !close_to(dx[i], df * dy[i], tol_for(d, act_backward_tol))) bad_dx = i;
    }
    EXPECT(d, bad_y < 0, "activation %d: y at x = %.9g is %.9g", (int)act, bad_y < 0 ? 0.0 : x[bad_y],
           bad_y < 0 ? 0.0 : y[bad_y]);
    EXPECT(d, bad_dx < 0, "activation %d: dx at x = %.9g is %.9g", (int)act, bad_dx < 0 ? 0.0 : x[bad_dx],
           bad_dx < 0 ? 0.0 : dx[bad_dx]);
    HOST_FREE(y, dx);
}

/* act_backward with dx == dy, as the transformer block runs GELU's backward (layer_transformer.c:
 * its d-before-GELU buffer is both): elementwise, so it must give the bits of dx apart from dy. */
static void check_activation_backward_over_dy(const device *d, crew_activation act, const float *x, const float *dy,
                                              int n)
{
    const crew_backend *be = &d->be;
    float *x_d = dev_f32(d, x, n), *y_d = dev_zeros_f32(d, n), *dy_d = dev_f32(d, dy, n), *dx_d = dev_zeros_f32(d, n);
    float *v_d = dev_f32(d, dy, n);
    be->ops->act_forward(be->ctx, act, x_d, y_d, n);
    be->ops->act_backward(be->ctx, act, x_d, y_d, dy_d, dx_d, n);
    be->ops->act_backward(be->ctx, act, x_d, y_d, v_d, v_d, n);
    EXPECT_SYNCED(d);
    float *dx = host_f32(d, dx_d, n), *v = host_f32(d, v_d, n);
    EXPECT(d, memcmp(dx, v, sizeof(float) * (size_t)n) == 0, "activation %d: backward with dx == dy differs",
           (int)act);
    HOST_FREE(dx, v);
    DEV_FREE(d, x_d, y_d, dy_d, dx_d, v_d);
}

/* act_forward_slope with the slope written over x, as a transformer block keeps GELU's: y is
 * act_forward's, bit for bit, and the slope is the derivative; for the GELUs dy · slope (mul, over
 * dy as the block runs it) is act_backward's dx bit for bit, the promise backend.h makes. */
static void check_activation_slope(const device *d, crew_activation act, const float *x, const float *dy, int n)
{
    const crew_backend *be = &d->be;
    float *x_d = dev_f32(d, x, n), *y_d = dev_zeros_f32(d, n), *dy_d = dev_f32(d, dy, n), *dx_d = dev_zeros_f32(d, n);
    float *s_d = dev_f32(d, x, n), *ys_d = dev_zeros_f32(d, n), *v_d = dev_f32(d, dy, n);
    be->ops->act_forward(be->ctx, act, x_d, y_d, n);
    be->ops->act_backward(be->ctx, act, x_d, y_d, dy_d, dx_d, n);
    be->ops->act_forward_slope(be->ctx, act, s_d, ys_d, s_d, n);
    be->ops->mul(be->ctx, n, v_d, s_d, v_d);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, n), *dx = host_f32(d, dx_d, n), *ys = host_f32(d, ys_d, n);
    float *slope = host_f32(d, s_d, n), *v = host_f32(d, v_d, n);
    const int exact = act == CREW_ACT_GELU || act == CREW_ACT_GELU_TANH;
    int bad_y = -1, bad_slope = -1, bad_dx = -1;
    for (int i = n - 1; i >= 0; i--) {
        double f, df;
        act_reference(act, x[i], &f, &df);
        if (memcmp(&y[i], &ys[i], sizeof y[i]) != 0) bad_y = i;
        if (!close_to(slope[i], df, tol_for(d, act_backward_tol))) bad_slope = i;
        if (exact && memcmp(&dx[i], &v[i], sizeof dx[i]) != 0) bad_dx = i;
    }
    EXPECT(d, bad_y < 0, "activation %d with its slope: y at x = %.9g is %.9g, act_forward's %.9g", (int)act,
           bad_y < 0 ? 0.0 : x[bad_y], bad_y < 0 ? 0.0 : ys[bad_y], bad_y < 0 ? 0.0 : y[bad_y]);
    EXPECT(d, bad_slope < 0, "activation %d: slope at x = %.9g is %.9g", (int)act, bad_slope < 0 ? 0.0 : x[bad_slope],
           bad_slope < 0 ? 0.0 : slope[bad_slope]);
    EXPECT(d, bad_dx < 0, "activation %d: dy times the slope at x = %.9g is %.9g, act_backward's %.9g", (int)act,
           bad_dx < 0 ? 0.0 : x[bad_dx], bad_dx < 0 ? 0.0 : v[bad_dx], bad_dx < 0 ? 0.0 : dx[bad_dx]);
    HOST_FREE(y, dx, ys, slope, v);
    DEV_FREE(d, x_d, y_d, dy_d, dx_d, s_d, ys_d, v_d);
}

static void test_activations(const device *d)
{
    enum { N = 64 };
    float x[N], dy[N];
    fill_uniform(x, N, -4.0f, 4.0f, 61);
    fill_uniform(dy, N, -1.0f, 1.0f, 62);
    x[0] = 0.0f;
    x[1] = -30.0f; /* sigmoid and tanh saturate without overflow */
    x[2] = 30.0f;
    float *x_d = dev_f32(d, x, N), *dy_d = dev_f32(d, dy, N), *y_d = dev_zeros_f32(d, N), *dx_d = dev_zeros_f32(d, N);
    const crew_activation acts[] = {CREW_ACT_NONE, CREW_ACT_RELU, CREW_ACT_GELU, CREW_ACT_TANH, CREW_ACT_SIGMOID,
                                    CREW_ACT_GELU_TANH};
    for (int a = 0; a < 6; a++) check_activation(d, acts[a], x, dy, x_d, dy_d, y_d, dx_d, N);
    DEV_FREE(d, x_d, dy_d, y_d, dx_d);
    check_activation_backward_over_dy(d, CREW_ACT_GELU_TANH, x, dy, N);
    for (int a = 0; a < 6; a++) check_activation_slope(d, acts[a], x, dy, N);
}

/* backend.h: act_forward may run in place (y == x), and then act_backward gets x == y; relu, tanh
 * and sigmoid take their derivative from y. So in place must give the bits of out of place, y and
 * dx alike (exact: the same float operations on the same values). A kernel that took tanh's or
 * sigmoid's derivative from x would read y there and differ; one that tested relu's x >= 0
 * would pass the gradient of the negative inputs, whose y is 0. */
static void check_activation_in_place(const device *d, crew_activation act, const float *x, const float *x_d,
                                      const float *dy_d, int n)
{
    const crew_backend *be = &d->be;
    float *y_d = dev_zeros_f32(d, n), *dx_d = dev_zeros_f32(d, n), *v_d = dev_f32(d, x, n);
    float *dv_d = dev_zeros_f32(d, n);
    be->ops->act_forward(be->ctx, act, x_d, y_d, n);
    be->ops->act_backward(be->ctx, act, x_d, y_d, dy_d, dx_d, n);
    be->ops->act_forward(be->ctx, act, v_d, v_d, n);
    be->ops->act_backward(be->ctx, act, v_d, v_d, dy_d, dv_d, n);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, n), *dx = host_f32(d, dx_d, n), *v = host_f32(d, v_d, n), *dv = host_f32(d, dv_d, n);
    int bad_y = -1, bad_dx = -1;
    for (int i = n - 1; i >= 0; i--) {
        if (memcmp(&y[i], &v[i], sizeof y[i]) != 0) bad_y = i;
        if (memcmp(&dx[i], &dv[i], sizeof dx[i]) != 0) bad_dx = i;
    }
    EXPECT(d, bad_y < 0, "activation %d in place: y at x = %.9g is %.9g, out of place %.9g", (int)act,
           bad_y < 0 ? 0.0 : x[bad_y], bad_y < 0 ? 0.0 : v[bad_y], bad_y < 0 ? 0.0 : y[bad_y]);
    EXPECT(d, bad_dx < 0, "activation %d in place: dx at x = %.9g is %.9g, out of place %.9g", (int)act,
           bad_dx < 0 ? 0.0 : x[bad_dx], bad_dx < 0 ? 0.0 : dv[bad_dx], bad_dx < 0 ? 0.0 : dx[bad_dx]);
    HOST_FREE(y, dx, v, dv);
    DEV_FREE(d, y_d, dx_d, v_d, dv_d);
}

static void test_activations_in_place(const device *d)
{
    enum { N = 64 };
    float x[N], dy[N];
    fill_uniform(x, N, -4.0f, 4.0f, 63);
    fill_uniform(dy, N, -1.0f, 1.0f, 64);
    x[0] = 0.0f;
    x[1] = -0.0f;
    x[2] = -30.0f;
    x[3] = 30.0f;
    float *x_d = dev_f32(d, x, N), *dy_d = dev_f32(d, dy, N);
    const crew_activation acts[] = {CREW_ACT_RELU, CREW_ACT_TANH, CREW_ACT_SIGMOID};
    for (int a = 0; a < 3; a++) check_activation_in_place(d, acts[a], x, x_d, dy_d, N);
    DEV_FREE(d, x_d, dy_d);
}

/* Dropout, with the sample ids in device memory: each mask value is 0 or 1/(1 − rate) and y is x
 * times it exactly; a sample's mask depends on the sample, not on its row (sample 7 in rows 0
 * and 3); about 1 − rate of the values are kept. */
static void test_dropout(const device *d)
{
    enum { ROWS = 4, COLS = 500 };
    const float rate = 0.25f, scale = 1.0f / (1.0f - rate);
    const int64_t samples[ROWS] = {7, 2, 11, 7};
    float *x = fbuf(ROWS * COLS);
    fill_uniform(x, ROWS * COLS, -1.0f, 1.0f, 65);
    float *x_d = dev_f32(d, x, ROWS * COLS), *y_d = dev_zeros_f32(d, ROWS * COLS);
    float *mask_d = dev_zeros_f32(d, ROWS * COLS);
    int64_t *samples_d = dev_i64(d, samples, ROWS);
    d->be.ops->dropout_forward(d->be.ctx, x_d, y_d, mask_d, ROWS, COLS, rate, crew_rng_key(5, 9, 0, 0), samples_d);
    EXPECT_SYNCED(d);
    float *y = host_f32(d, y_d, ROWS * COLS), *mask = host_f32(d, mask_d, ROWS * COLS);
    int odd = 0, kept = 0;
    for (int i = 0; i < ROWS * COLS; i++) {
        odd += (mask[i] != 0.0f && mask[i] != scale) || y[i] != x[i] * mask[i];
        kept += mask[i] != 0.0f;
    }
    EXPECT(d, odd == 0, "dropout: %d values are not 0 or x/(1 - rate)", odd);
    EXPECT(d, memcmp(mask, mask + 3 * COLS, sizeof(float) * COLS) == 0, "dropout: sample 7's mask depends on its row");
    /* 2000 values kept with p = 0.75, 500 of them twice over (sample 7): mean 1500, sd 24, so
     * ±100 is over 4 sd (and the key is fixed: the count is the same on every run) */
    EXPECT(d, kept > 1400 && kept < 1600, "dropout kept %d of %d at rate %.2f", kept, ROWS * COLS, rate);
    HOST_FREE(x, y, mask);
    DEV_FREE(d, x_d, y_d, mask_d, samples_d);
}

/* ------------------------------------------------------------------ embedding */

enum { EMB_VOCAB = 4, EMB_DIM = 3 };

/* embedding_forward of `rows` ids into a y prefilled with garbage (rejected rows must become
 * zeros, not stay as they were); returns the bad count and leaves y downloaded in `y`. */
static int64_t run_embedding(const device *d, const float *ids_d, const float *table_d, int64_t rows, float *y)
{
    float *garbage = fbuf(rows * EMB_DIM);
    fill_uniform(garbage, rows * EMB_DIM, 5.0f, 6.0f, 73);
    float *y_d = dev_f32(d, garbage, rows * EMB_DIM);
    int64_t bad = -1;
    EXPECT_OK(d, d->be.ops->embedding_forward(d->be.ctx, ids_d, table_d, EMB_VOCAB, y_d, rows, EMB_DIM, &bad));
    EXPECT_SYNCED(d);
    fetch(d, y, y_d, rows * EMB_DIM, CREW_DT_F32);
    HOST_FREE(garbage);
    DEV_FREE(d, y_d);
    return bad;
}

static int rows_are_zero(const float *y, int from, int to)
{
    int zeros = 1;
    for (int j = from * EMB_DIM; j < to * EMB_DIM; j++) zeros &= y[j] == 0.0f;
    return zeros;
}

static void test_embedding_ids(const device *d)
{
    enum { ROWS = 7 };
    float table[EMB_VOCAB * EMB_DIM], y[ROWS * EMB_DIM], dy[ROWS * EMB_DIM], dtable[EMB_VOCAB * EMB_DIM];
    fill_uniform(table, EMB_VOCAB * EMB_DIM, -1.0f, 1.0f, 71);
    fill_uniform(dy, ROWS * EMB_DIM, -1.0f, 1.0f, 72);
    const float ids[ROWS] = {3.0f, 0.0f, 3.0f, -1.0f, 4.0f, 1.5f, NAN};
    /* -0 is id 0; ±inf and 1e10 are out of range (and must not be cast to an integer first) */
    const float more_ids[5] = {2.0f, -0.0f, INFINITY, -INFINITY, 1e10f};
    float *table_d = dev_f32(d, table, EMB_VOCAB * EMB_DIM), *ids_d = dev_f32(d, ids, ROWS);
    float *more_d = dev_f32(d, more_ids, 5), *dy_d = dev_f32(d, dy, ROWS * EMB_DIM);
    float *dtable_d = dev_zeros_f32(d, EMB_VOCAB * EMB_DIM);
    int64_t bad = run_embedding(d, ids_d, table_d, ROWS, y);
    EXPECT(d, bad == 4, "embedding: %lld bad ids, want 4", (long long)bad);
    EXPECT(d, memcmp(y, table + 3 * EMB_DIM, sizeof(float) * EMB_DIM) == 0 &&
                  memcmp(y + EMB_DIM, table, sizeof(float) * EMB_DIM) == 0,
           "embedding: rows 0 and 1 are not table rows 3 and 0");
    EXPECT(d, rows_are_zero(y, 3, ROWS), "embedding: the rows of bad ids are not zeros");
    bad = run_embedding(d, more_d, table_d, 5, y);
    EXPECT(d, bad == 3, "embedding: %lld of 2, -0, inf, -inf, 1e10 bad, want 3", (long long)bad);
    EXPECT(d, memcmp(y, table + 2 * EMB_DIM, sizeof(float) * EMB_DIM) == 0 &&
                  memcmp(y + EMB_DIM, table, sizeof(float) * EMB_DIM) == 0 && rows_are_zero(y, 2, 5),
           "embedding: ids 2 and -0 did not give table rows 2 and 0, or the others are not zeros");
    EXPECT(d, run_embedding(d, ids_d, table_d, 0, y) == 0, "embedding of no rows: bad is not 0");
    /* Backward over every row: the rows whose id forward rejected add nothing. */
    d->be.ops->embedding_backward(d->be.ctx, ids_d, dy_d, dtable_d, EMB_VOCAB, ROWS, EMB_DIM);
    EXPECT_SYNCED(d);
    fetch(d, dtable, dtable_d, EMB_VOCAB * EMB_DIM, CREW_DT_F32);
    int wrong = 0;
    for (int j = 0; j < EMB_DIM; j++) {
        wrong += dtable[3 * EMB_DIM + j] != dy[j] + dy[2 * EMB_DIM + j]; /* id 3 twice: accumulated */
        wrong += dtable[j] != dy[EMB_DIM + j];
        wrong += dtable[EMB_DIM + j] != 0.0f || dtable[2 * EMB_DIM + j] != 0.0f;
    }
    EXPECT(d, wrong == 0, "embedding backward: %d values differ", wrong);
    DEV_FREE(d, table_d, ids_d, more_d, dy_d, dtable_d);
}

/* ------------------------------------------------------------------ every check on every kind */

static void run_checks(const device *d)
{
    test_round_trips(d);
    test_copy_fill(d);
    test_host_staging(d);
    test_transfer(d);
    test_queues(d);
    test_host_alias(d);
    test_sum(d);
    test_sum_squares(d);
    test_all_finite(d);
    test_hash(d);
    test_gemm(d);
    test_convolution(d);
    test_pooling(d);
    test_softmax(d);
    test_softmax_xent(d);
    test_col_sum(d);
    test_axpby(d);
    test_mul(d);
    test_broadcast_rows(d);
    test_batch_norm(d);
    test_layer_norm(d);
    test_attention(d);
    test_sgd(d);
    test_adamw(d);
    test_activations(d);
    test_activations_in_place(d);
    test_dropout(d);
    test_embedding_ids(d);
}

static void run_kind(const crew_device_kind *kind)
{
    device d = {kind, {0}};
    const crew_device_options o = {.blas_threads = 1}; /* results independent of the machine */
    int passed = check_passed_, failed = check_failed_;
    EXPECT_OK(&d, crew_device_open(kind->name, 0, &o, &d.be));
    if (d.be.ops) run_checks(&d);
    crew_device_close(&d.be);
    printf("%s: %d passed, %d failed\n", kind->name, check_passed_ - passed, check_failed_ - failed);
}

/* Without arguments: every kind built in that has a device here (a kind with none, a GPU kind on
 * a machine without a GPU, says so and is left out). With a kind's name: that kind alone, and
 * ctest's skip (exit 77) when it has no device here, so the summary shows it as skipped, never as
 * passed (tests/CMakeLists.txt: test_backend_ops_cuda). */
int main(int argc, char **argv)
{
    int n = 0;
    const crew_device_kind *kinds = crew_device_kinds(&n);
    if (argc > 1) {
        const crew_device_kind *k = crew_device_kind_find(argv[1]);
        if (!k) {
            fprintf(stderr, "test_backend_ops: this build has no device kind '%s'\n", argv[1]);
            return 2;
        }
        if (k->available() < 1) {
            printf("skipped: no %s device here\n", k->name);
            return 77;
        }
        run_kind(k);
        return check_report();
    }
    for (int i = 0; i < n; i++) {
        if (kinds[i].available() < 1) {
            printf("%s: no device here, left out (test_backend_ops %s runs it where there is one)\n", kinds[i].name,
                   kinds[i].name);
            continue;
        }
        run_kind(&kinds[i]);
    }
    return check_report();
}
