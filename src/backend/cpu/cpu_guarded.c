/* cpu_guarded.c — the CPU backend behind device memory that host code cannot touch ("cpu-guarded").
 *
 * What it proves. Code above backend.h may do arithmetic on device addresses and hand them to
 * ops, but never load or store through them: a GPU's memory is not the host's. With the plain CPU
 * backend such a slip works by accident. Here it cannot:
 *
 * - Every device address points into a PROT_NONE reservation that is never made accessible, so
 *   host code reading or writing through one dies by SIGSEGV at the faulting line. The values
 *   live in a second, read-write mapping of the same size that only this file knows about.
 * - Every op looks each pointer operand up in the table of allocations, checks that the elements
 *   it touches lie inside one allocation, and runs the plain CPU kernel (crew_cpu_ops) on the
 *   storage addresses. An operand outside device memory (a host buffer handed to a device op, a
 *   slice running past its buffer's end) skips the op and becomes the device's pending error,
 *   returned by the next call that returns a crew_status, as a GPU reports a faulting kernel.
 * - A queue keeps its uploads until it is synced or waited on, so a missing queue_wait (compute
 *   reading before the copy) or a host buffer reused before the sync (the copy sending the new
 *   bytes) gives wrong values instead of passing by luck, as on a GPU with a copy stream.
 *
 * Threads: one rank's thread drives the backend, and its communication thread calls host_alias
 * (or, for "cpu-remote", upload, download and sync of the compute queue, comm_staged.c).
 * The allocation table and the pending error are under one mutex; queues belong to the rank's
 * thread alone. Everything lives in the context: no global mutable state. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_ops.h"
#include "core/status.h"

/* One device allocation. Addresses are compared as integers: the reservations are separate
 * objects, which C does not let pointers be ordered across. */
typedef struct region {
    uintptr_t dev;  /* start of the PROT_NONE reservation: the device address handed out */
    char *store;    /* the read-write mapping that holds the values */
    size_t bytes;   /* bytes asked for: the extent ops may touch (less than mapped) */
    size_t mapped;  /* whole pages, the size of both mappings */
} region;

/* An upload waiting for its queue to be synced or waited on. */
typedef struct deferred_upload {
    char *dst;          /* storage address */
    const void *host;   /* read only when the copy happens, as a GPU's DMA would */
    size_t bytes;
} deferred_upload;

struct crew_queue {
    deferred_upload *uploads;
    size_t count, cap;
    struct crew_queue *next; /* the context's live queues, for destroy */
};

typedef struct guard_ctx {
    crew_backend cpu;        /* the plain CPU backend whose kernels do the work */
    pthread_mutex_t lock;    /* guards regions and pending */
    region *regions;         /* sorted by dev */
    size_t n_regions, cap_regions;
    crew_status pending;     /* the first failure since the last call that returned one */
    crew_queue *queues;
    int64_t in_use, peak;    /* memory_used: bytes rounded up to 64, as the plain CPU backend counts (under lock) */
    int remote;              /* the "cpu-remote" table: no host_alias, a stand-in convolution library */
    int conv_library;        /* configured to run its convolutions by that stand-in (cpu_conv_direct.c) */
} guard_ctx;

static const char *dtype_name(crew_dtype t)
{
    switch (t) {
    case CREW_DT_F32: return "float32";
    case CREW_DT_F64: return "float64";
    case CREW_DT_I32: return "int32";
    case CREW_DT_I64: return "int64";
    case CREW_DT_BF16: return "bfloat16";
    }
    return "?";
}

/* ------------------------------------------------------------------ the pending error */

/* Keeps s as the pending error unless one is already pending: the first failure is the cause,
 * later ones are often its consequences. */
static void keep_error(guard_ctx *g, crew_status s)
{
    if (!s) return;
    pthread_mutex_lock(&g->lock);
    if (!g->pending) {
        g->pending = s;
        s = CREW_OK;
    }
    pthread_mutex_unlock(&g->lock);
    crew_status_free(s);
}

static crew_status take_error(guard_ctx *g)
{
    keep_error(g, cpu_take_failure(g->cpu.ctx)); /* the plain backend's kernels' (cpu_gemm.c) */
    pthread_mutex_lock(&g->lock);
    crew_status s = g->pending;
    g->pending = CREW_OK;
    pthread_mutex_unlock(&g->lock);
    return s;
}

/* What a status-returning call returns: its own failure s goes through the pending slot, so that
 * an earlier failure still comes out first. */
static crew_status settle(guard_ctx *g, crew_status s)
{
    keep_error(g, s);
    return take_error(g);
}

/* ------------------------------------------------------------------ the allocation table */

/* The index of the last region starting at or below a, or -1. Caller holds the lock. */
static ptrdiff_t region_below(const guard_ctx *g, uintptr_t a)
{
    size_t lo = 0, hi = g->n_regions; /* binary search for the first region starting above a */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->regions[mid].dev <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

/* The storage address of [p, p + bytes) when it lies inside one allocation, else NULL. An empty
 * range may sit at its allocation's end. */
static void *translate(guard_ctx *g, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    void *s = NULL;
    pthread_mutex_lock(&g->lock);
    ptrdiff_t i = region_below(g, a);
    if (i >= 0) {
        const region *r = &g->regions[i];
        size_t off = (size_t)(a - r->dev);
        if (off <= r->bytes && bytes <= r->bytes - off) s = r->store + off;
    }
    pthread_mutex_unlock(&g->lock);
    return s;
}

/* n elements of type t in bytes; 0 when that overflows (callers have n > 0, so 0 means "too big"). */
static size_t byte_count(int64_t n, crew_dtype t)
{
    size_t size = crew_dtype_size(t);
    return (uint64_t)n > SIZE_MAX / size ? 0 : (size_t)n * size;
}

static crew_status insert_region(guard_ctx *g, region r)
{
    pthread_mutex_lock(&g->lock);
    if (g->n_regions == g->cap_regions) {
        size_t cap = g->cap_regions ? 2 * g->cap_regions : 64;
        region *grown = realloc(g->regions, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g->lock);
            return CREW_OOM();
        }
        g->regions = grown;
        g->cap_regions = cap;
    }
    size_t at = (size_t)(region_below(g, r.dev) + 1);
    memmove(g->regions + at + 1, g->regions + at, (g->n_regions - at) * sizeof *g->regions);
    g->regions[at] = r;
    g->n_regions++;
    pthread_mutex_unlock(&g->lock);
    return CREW_OK;
}

/* Takes the region starting exactly at p out of the table into *out; 0 when there is none. */
static int remove_region(guard_ctx *g, const void *p, region *out)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g->lock);
    ptrdiff_t i = region_below(g, a);
    int found = i >= 0 && g->regions[i].dev == a;
    if (found) {
        *out = g->regions[i];
        g->n_regions--;
        memmove(g->regions + i, g->regions + i + 1, (g->n_regions - (size_t)i) * sizeof *g->regions);
    }
    pthread_mutex_unlock(&g->lock);
    return found;
}

static void unmap_region(const region *r)
{
    munmap((void *)r->dev, r->mapped);
    munmap(r->store, r->mapped);
}

/* ------------------------------------------------------------------ operands */

/* One op's operands on their way to storage addresses: the first bad one fails the whole op. */
typedef struct op_call {
    guard_ctx *g;
    const char *op;
    void *cpu;  /* the plain backend's context, for its kernels */
    int ok;
} op_call;

static op_call begin(void *ctx, const char *op)
{
    guard_ctx *g = ctx;
    return (op_call){g, op, g->cpu.ctx, 1};
}

/* The storage address of operand `name`: n elements of type t from device address p. An op that
 * touches none (n <= 0) gets p as it is, whatever it is. A bad operand fails the op, keeps the
 * error as pending and returns p (the op will not run). */
static void *operand(op_call *c, const char *name, const void *p, int64_t n, crew_dtype t)
{
    if (!c->ok || n <= 0) return (void *)p;
    size_t bytes = byte_count(n, t);
    void *s = bytes ? translate(c->g, p, bytes) : NULL;
    if (s) return s;
    c->ok = 0;
    keep_error(c->g, crew_errorf(CREW_CODE_INTERNAL,
                                 "cpu-guarded: %s: operand '%s' (%p, %lld %s) is not inside one device allocation "
                                 "(host memory passed to a device op, or past its end)",
                                 c->op, name, p, (long long)n, dtype_name(t)));
    return (void *)p;
}

/* Typed front doors, so that the compiler still checks each operand's element type. */
static void *f32(op_call *c, const char *name, const float *p, int64_t n)
{
    return operand(c, name, p, n, CREW_DT_F32);
}

static void *i32(op_call *c, const char *name, const int32_t *p, int64_t n)
{
    return operand(c, name, p, n, CREW_DT_I32);
}

static void *i64(op_call *c, const char *name, const int64_t *p, int64_t n)
{
    return operand(c, name, p, n, CREW_DT_I64);
}

static void *f64(op_call *c, const char *name, const double *p, int64_t n)
{
    return operand(c, name, p, n, CREW_DT_F64);
}

/* ---- extents: how many elements an op touches, from its sizes. Saturating: a product that
 * overflows becomes INT64_MAX, which no allocation holds, so the operand is reported. */

static int64_t times(int64_t a, int64_t b)
{
    if (a <= 0 || b <= 0) return 0;
    return a > INT64_MAX / b ? INT64_MAX : a * b;
}

static int64_t times3(int64_t a, int64_t b, int64_t c) { return times(times(a, b), c); }

/* A row-major rows × cols matrix stored with leading dimension ld ends at (rows-1)·ld + cols. */
static int64_t matrix_extent(int64_t rows, int64_t cols, int64_t ld)
{
    if (rows <= 0 || cols <= 0) return 0;
    int64_t before_last = times(rows - 1, ld);
    return before_last > INT64_MAX - cols ? INT64_MAX : before_last + cols;
}

/* Window ops: the image [batch, in_h, in_w, in_c], the pooled output [batch, out_h, out_w, in_c]
 * (and its argmax), the im2col matrix [batch·out_h·out_w, k_h·k_w·in_c]. */
static int64_t image_extent(const crew_window *w) { return times(times3(w->batch, w->in_h, w->in_w), w->in_c); }
static int64_t pooled_extent(const crew_window *w) { return times(times3(w->batch, w->out_h, w->out_w), w->in_c); }
static int64_t columns_extent(const crew_window *w)
{
    return times(times3(w->batch, w->out_h, w->out_w), times3(w->k_h, w->k_w, w->in_c));
}

/* ------------------------------------------------------------------ lifecycle, memory */

static void drop_queue(crew_queue *q)
{
    free(q->uploads);
    free(q);
}

static void guard_destroy(void *ctx)
{
    guard_ctx *g = ctx;
    if (!g) return;
    while (g->queues) {
        crew_queue *q = g->queues;
        g->queues = q->next;
        drop_queue(q);
    }
    for (size_t i = 0; i < g->n_regions; i++) unmap_region(&g->regions[i]);
    free(g->regions);
    crew_status_free(g->pending);
    crew_cpu_ops.destroy(g->cpu.ctx);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

static crew_status guard_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    *out = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = n < 0 ? 0 : byte_count(n ? n : 1, t);
    if (!bytes || bytes > SIZE_MAX - page)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu-guarded: cannot allocate %lld elements", (long long)n);
    region r = {.bytes = bytes, .mapped = (bytes + page - 1) / page * page};
    /* The reservation only claims addresses (MAP_NORESERVE: no memory is committed for it). */
    void *dev = mmap(NULL, r.mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *store = mmap(NULL, r.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    crew_status s = CREW_OK;
    if (dev == MAP_FAILED || store == MAP_FAILED)
        s = crew_errorf(CREW_CODE_OUT_OF_MEMORY, "cpu-guarded: out of memory for %lld elements (%zu bytes)",
                        (long long)n, r.mapped);
    r.dev = (uintptr_t)dev;
    r.store = store;
    if (!s) s = insert_region(ctx, r);
    if (s) {
        if (dev != MAP_FAILED) munmap(dev, r.mapped);
        if (store != MAP_FAILED) munmap(store, r.mapped);
        return s;
    }
    guard_ctx *g = ctx;
    pthread_mutex_lock(&g->lock);
    g->in_use += (int64_t)((bytes + 63) / 64 * 64);
    if (g->in_use > g->peak) g->peak = g->in_use;
    pthread_mutex_unlock(&g->lock);
    *out = dev; /* anonymous mappings come zero-filled */
    return CREW_OK;
}

static void guard_memory_used(void *ctx, int64_t *in_use, int64_t *peak)
{
    guard_ctx *g = ctx;
    pthread_mutex_lock(&g->lock);
    *in_use = g->in_use;
    *peak = g->peak;
    pthread_mutex_unlock(&g->lock);
}

/* Uploads into a buffer being freed are dropped: the copy would land in unmapped memory, and no
 * one can read the buffer any more (cudaFree too waits for them, and then the values are gone). */
static void drop_uploads_into(guard_ctx *g, const region *r)
{
    for (crew_queue *q = g->queues; q; q = q->next) {
        size_t kept = 0;
        for (size_t i = 0; i < q->count; i++) {
            uintptr_t d = (uintptr_t)q->uploads[i].dst, lo = (uintptr_t)r->store;
            if (d < lo || d >= lo + r->mapped) q->uploads[kept++] = q->uploads[i];
        }
        q->count = kept;
    }
}

static void guard_free(void *ctx, void *p)
{
    guard_ctx *g = ctx;
    if (!p) return;
    region r;
    if (!remove_region(g, p, &r)) {
        keep_error(g, crew_errorf(CREW_CODE_INTERNAL,
                                  "cpu-guarded: free: %p is not the start of a device allocation (host memory, an "
                                  "interior pointer, or freed twice)", p));
        return;
    }
    pthread_mutex_lock(&g->lock);
    g->in_use -= (int64_t)((r.bytes + 63) / 64 * 64);
    pthread_mutex_unlock(&g->lock);
    drop_uploads_into(g, &r);
    unmap_region(&r);
}

/* Staging buffers are plain host memory. */
static crew_status guard_host_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    return crew_cpu_ops.host_alloc(((guard_ctx *)ctx)->cpu.ctx, t, n, out);
}

static void guard_host_free(void *ctx, void *p) { crew_cpu_ops.host_free(((guard_ctx *)ctx)->cpu.ctx, p); }

/* ------------------------------------------------------------------ transfers and queues */

static crew_status defer_upload(crew_queue *q, char *dst, const void *host, size_t bytes)
{
    if (q->count == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 16;
        deferred_upload *grown = realloc(q->uploads, cap * sizeof *grown);
        if (!grown) return CREW_OOM();
        q->uploads = grown;
        q->cap = cap;
    }
    q->uploads[q->count++] = (deferred_upload){dst, host, bytes};
    return CREW_OK;
}

/* Runs q's uploads in the order they were enqueued. */
static void flush_uploads(crew_queue *q)
{
    for (size_t i = 0; i < q->count; i++) memmove(q->uploads[i].dst, q->uploads[i].host, q->uploads[i].bytes);
    q->count = 0;
}

static crew_status guard_upload(void *ctx, crew_queue *q, void *dst, const void *host, int64_t n, crew_dtype t)
{
    op_call c = begin(ctx, "upload");
    char *s = operand(&c, "dst", dst, n, t);
    crew_status st = CREW_OK;
    if (c.ok && n > 0) {
        /* On the compute queue the copy happens now; on another, when that queue is synced or
         * waited on, reading host then: a caller that reuses host earlier sends the new bytes. */
        if (q)
            st = defer_upload(q, s, host, byte_count(n, t));
        else
            memmove(s, host, byte_count(n, t));
    }
    return settle(c.g, st);
}

static crew_status guard_download(void *ctx, void *host, const void *src, int64_t n, crew_dtype t)
{
    op_call c = begin(ctx, "download");
    const char *s = operand(&c, "src", src, n, t);
    if (c.ok && n > 0) memmove(host, s, byte_count(n, t));
    return settle(c.g, CREW_OK);
}

static crew_status guard_queue_create(void *ctx, crew_queue **out)
{
    guard_ctx *g = ctx;
    *out = calloc(1, sizeof **out);
    if (!*out) return CREW_OOM();
    (*out)->next = g->queues;
    g->queues = *out;
    return CREW_OK;
}

/* Pending uploads are dropped, not run: a caller that needed them should have synced. */
static void guard_queue_destroy(void *ctx, crew_queue *q)
{
    guard_ctx *g = ctx;
    if (!q) return;
    for (crew_queue **at = &g->queues; *at; at = &(*at)->next)
        if (*at == q) {
            *at = q->next;
            break;
        }
    drop_queue(q);
}

/* Work on `waiter` must see everything enqueued on `on`: its uploads land now. The compute queue
 * (NULL) never holds anything back. */
static crew_status guard_queue_wait(void *ctx, crew_queue *waiter, crew_queue *on)
{
    (void)waiter;
    if (on) flush_uploads(on);
    return take_error(ctx);
}

static crew_status guard_sync(void *ctx, crew_queue *q)
{
    if (q) flush_uploads(q);
    return take_error(ctx);
}

/* For the in-process communicator: the storage behind [p, p+n), or NULL for anything else. It is
 * a question, not an op: a NULL answer is no failure of the device. */
static void *guard_host_alias(void *ctx, const void *p, int64_t n, crew_dtype t)
{
    if (n < 0) return NULL;
    size_t bytes = byte_count(n, t);
    if (n > 0 && !bytes) return NULL;
    return translate(ctx, p, bytes);
}

/* ------------------------------------------------------------------ reductions */

static crew_status guard_sum(void *ctx, const float *x, int64_t n, double *out)
{
    op_call c = begin(ctx, "sum");
    const float *sx = f32(&c, "x", x, n);
    return settle(c.g, c.ok ? crew_cpu_ops.sum(c.cpu, sx, n, out) : CREW_OK);
}

static crew_status guard_sum_squares(void *ctx, const float *x, int64_t n, double *out)
{
    op_call c = begin(ctx, "sum_squares");
    const float *sx = f32(&c, "x", x, n);
    return settle(c.g, c.ok ? crew_cpu_ops.sum_squares(c.cpu, sx, n, out) : CREW_OK);
}

static crew_status guard_sum_squares_lanes(void *ctx, const float *x, int64_t n, double *lanes)
{
    op_call c = begin(ctx, "sum_squares_lanes");
    const float *sx = f32(&c, "x", x, n);
    return settle(c.g, c.ok ? crew_cpu_ops.sum_squares_lanes(c.cpu, sx, n, lanes) : CREW_OK);
}

static crew_status guard_all_finite(void *ctx, const float *x, int64_t n, int *out)
{
    op_call c = begin(ctx, "all_finite");
    const float *sx = f32(&c, "x", x, n);
    return settle(c.g, c.ok ? crew_cpu_ops.all_finite(c.cpu, sx, n, out) : CREW_OK);
}

static crew_status guard_hash(void *ctx, const void *x, int64_t n, crew_dtype t, uint64_t *out)
{
    op_call c = begin(ctx, "hash");
    const void *sx = operand(&c, "x", x, n, t);
    return settle(c.g, c.ok ? crew_cpu_ops.hash(c.cpu, sx, n, t, out) : CREW_OK);
}

/* ------------------------------------------------------------------ compute
 * Each wrapper names its operands with their extents, then runs the plain kernel if all are
 * inside device memory. */

static void guard_copy(void *ctx, float *dst, const float *src, int64_t n)
{
    op_call c = begin(ctx, "copy");
    float *sd = f32(&c, "dst", dst, n);
    const float *ss = f32(&c, "src", src, n);
    if (c.ok) crew_cpu_ops.copy(c.cpu, sd, ss, n);
}

static void guard_fill(void *ctx, float *x, float value, int64_t n)
{
    op_call c = begin(ctx, "fill");
    float *sx = f32(&c, "x", x, n);
    if (c.ok) crew_cpu_ops.fill(c.cpu, sx, value, n);
}

static void guard_gemm(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *cm, int64_t ldc)
{
    op_call c = begin(ctx, "gemm");
    /* op(a) is [m, k] and op(b) [k, n]; a transposed operand is stored with rows and columns swapped. */
    const float *sa = f32(&c, "a", a, trans_a ? matrix_extent(k, m, lda) : matrix_extent(m, k, lda));
    const float *sb = f32(&c, "b", b, trans_b ? matrix_extent(n, k, ldb) : matrix_extent(k, n, ldb));
    float *sc = f32(&c, "c", cm, matrix_extent(m, n, ldc));
    if (c.ok) crew_cpu_ops.gemm(c.cpu, trans_a, trans_b, m, n, k, alpha, sa, lda, sb, ldb, beta, sc, ldc);
}

/* an operand of either float type (gemm_typed's, attention's probabilities) */
static int float_type_ok(op_call *c, const char *name, crew_dtype t)
{
    if (t == CREW_DT_F32 || t == CREW_DT_BF16 || !c->ok) return c->ok;
    c->ok = 0;
    keep_error(c->g, crew_errorf(CREW_CODE_INTERNAL, "cpu-guarded: %s: operand '%s' must be float32 or bfloat16, "
                                 "got %s", c->op, name, dtype_name(t)));
    return 0;
}

static void guard_gemm_typed(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const void *a, crew_dtype a_type, int64_t lda, const void *b, crew_dtype b_type,
                             int64_t ldb, float beta, float *cm, int64_t ldc)
{
    op_call c = begin(ctx, "gemm_typed");
    const void *sa = float_type_ok(&c, "a", a_type)
                         ? operand(&c, "a", a, trans_a ? matrix_extent(k, m, lda) : matrix_extent(m, k, lda), a_type)
                         : a;
    const void *sb = float_type_ok(&c, "b", b_type)
                         ? operand(&c, "b", b, trans_b ? matrix_extent(n, k, ldb) : matrix_extent(k, n, ldb), b_type)
                         : b;
    float *sc = f32(&c, "c", cm, matrix_extent(m, n, ldc));
    if (c.ok)
        crew_cpu_ops.gemm_typed(c.cpu, trans_a, trans_b, m, n, k, alpha, sa, a_type, lda, sb, b_type, ldb, beta, sc, ldc);
}

static void guard_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const void *a, crew_dtype a_type, int64_t lda,
                            const float *b, int64_t ldb, const float *bias, float *cm, int64_t ldc)
{
    op_call c = begin(ctx, "gemm_bias");
    const void *sa = float_type_ok(&c, "a", a_type) ? operand(&c, "a", a, matrix_extent(m, k, lda), a_type) : a;
    const float *sb = f32(&c, "b", b, matrix_extent(k, n, ldb));
    const float *sbias = bias ? f32(&c, "bias", bias, n) : NULL;
    float *sc = f32(&c, "c", cm, matrix_extent(m, n, ldc));
    if (c.ok) crew_cpu_ops.gemm_bias(c.cpu, m, n, k, sa, a_type, lda, sb, ldb, sbias, sc, ldc);
}

static void guard_to_bf16(void *ctx, const float *x, crew_bf16 *y, int64_t n)
{
    op_call c = begin(ctx, "to_bf16");
    const float *sx = f32(&c, "x", x, n);
    crew_bf16 *sy = operand(&c, "y", y, n, CREW_DT_BF16);
    if (c.ok) crew_cpu_ops.to_bf16(c.cpu, sx, sy, n);
}

static void guard_axpby(void *ctx, int64_t n, float alpha, const float *x, float beta, float *y)
{
    op_call c = begin(ctx, "axpby");
    const float *sx = f32(&c, "x", x, n);
    float *sy = f32(&c, "y", y, n);
    if (c.ok) crew_cpu_ops.axpby(c.cpu, n, alpha, sx, beta, sy);
}

static void guard_mul(void *ctx, int64_t n, const float *a, const float *b, float *out)
{
    op_call c = begin(ctx, "mul");
    const float *sa = f32(&c, "a", a, n);
    const float *sb = f32(&c, "b", b, n);
    float *so = f32(&c, "out", out, n);
    if (c.ok) crew_cpu_ops.mul(c.cpu, n, sa, sb, so);
}

static void guard_broadcast_rows(void *ctx, float *y, const float *bias, int64_t rows, int64_t cols)
{
    op_call c = begin(ctx, "broadcast_rows");
    float *sy = f32(&c, "y", y, times(rows, cols));
    const float *sb = f32(&c, "bias", bias, cols);
    if (c.ok) crew_cpu_ops.broadcast_rows(c.cpu, sy, sb, rows, cols);
}

static void guard_col_sum(void *ctx, const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    op_call c = begin(ctx, "col_sum");
    const float *sx = f32(&c, "x", x, times(rows, cols));
    float *so = f32(&c, "out", out, cols);
    if (c.ok) crew_cpu_ops.col_sum(c.cpu, sx, rows, cols, so, accumulate);
}

static void guard_act_forward(void *ctx, crew_activation act, const float *x, float *y, int64_t n)
{
    op_call c = begin(ctx, "act_forward");
    const float *sx = f32(&c, "x", x, n);
    float *sy = f32(&c, "y", y, n);
    if (c.ok) crew_cpu_ops.act_forward(c.cpu, act, sx, sy, n);
}

static void guard_act_backward(void *ctx, crew_activation act, const float *x, const float *y, const float *dy,
                               float *dx, int64_t n)
{
    op_call c = begin(ctx, "act_backward");
    const float *sx = f32(&c, "x", x, n);
    const float *sy = f32(&c, "y", y, n);
    const float *sdy = f32(&c, "dy", dy, n);
    float *sdx = f32(&c, "dx", dx, n);
    if (c.ok) crew_cpu_ops.act_backward(c.cpu, act, sx, sy, sdy, sdx, n);
}

static void guard_act_forward_slope(void *ctx, crew_activation act, const float *x, float *y, float *slope,
                                    int64_t n)
{
    op_call c = begin(ctx, "act_forward_slope");
    const float *sx = f32(&c, "x", x, n);
    float *sy = f32(&c, "y", y, n);
    float *ss = f32(&c, "slope", slope, n);
    if (c.ok) crew_cpu_ops.act_forward_slope(c.cpu, act, sx, sy, ss, n);
}

static void guard_im2col(void *ctx, const float *x, float *col, const crew_window *w)
{
    op_call c = begin(ctx, "im2col");
    const float *sx = f32(&c, "x", x, image_extent(w));
    float *scol = f32(&c, "col", col, columns_extent(w));
    if (c.ok) crew_cpu_ops.im2col(c.cpu, sx, scol, w);
}

static void guard_col2im(void *ctx, const float *col, float *dx, const crew_window *w)
{
    op_call c = begin(ctx, "col2im");
    const float *scol = f32(&c, "col", col, columns_extent(w));
    float *sdx = f32(&c, "dx", dx, image_extent(w));
    if (c.ok) crew_cpu_ops.col2im(c.cpu, scol, sdx, w);
}

static void guard_maxpool_forward(void *ctx, const float *x, float *y, int32_t *argmax, const crew_window *w,
                                  int relu_in)
{
    op_call c = begin(ctx, "maxpool_forward");
    const float *sx = f32(&c, "x", x, image_extent(w));
    float *sy = f32(&c, "y", y, pooled_extent(w));
    int32_t *sa = i32(&c, "argmax", argmax, pooled_extent(w));
    if (c.ok) crew_cpu_ops.maxpool_forward(c.cpu, sx, sy, sa, w, relu_in);
}

static void guard_maxpool_backward(void *ctx, const float *dy, const int32_t *argmax, float *dx, const crew_window *w)
{
    op_call c = begin(ctx, "maxpool_backward");
    const float *sdy = f32(&c, "dy", dy, pooled_extent(w));
    const int32_t *sa = i32(&c, "argmax", argmax, pooled_extent(w));
    float *sdx = f32(&c, "dx", dx, image_extent(w));
    if (c.ok) crew_cpu_ops.maxpool_backward(c.cpu, sdy, sa, sdx, w);
}

static void guard_avgpool_forward(void *ctx, const float *x, float *y, const crew_window *w)
{
    op_call c = begin(ctx, "avgpool_forward");
    const float *sx = f32(&c, "x", x, image_extent(w));
    float *sy = f32(&c, "y", y, pooled_extent(w));
    if (c.ok) crew_cpu_ops.avgpool_forward(c.cpu, sx, sy, w);
}

static void guard_avgpool_backward(void *ctx, const float *dy, float *dx, const crew_window *w)
{
    op_call c = begin(ctx, "avgpool_backward");
    const float *sdy = f32(&c, "dy", dy, pooled_extent(w));
    float *sdx = f32(&c, "dx", dx, image_extent(w));
    if (c.ok) crew_cpu_ops.avgpool_backward(c.cpu, sdy, sdx, w);
}

static void guard_dropout_forward(void *ctx, const float *x, float *y, float *mask, int64_t rows, int64_t cols,
                                  float rate, uint64_t key, const int64_t *sample_ids)
{
    op_call c = begin(ctx, "dropout_forward");
    const float *sx = f32(&c, "x", x, times(rows, cols));
    float *sy = f32(&c, "y", y, times(rows, cols));
    float *sm = f32(&c, "mask", mask, times(rows, cols));
    const int64_t *sid = i64(&c, "sample_ids", sample_ids, rows);
    if (c.ok) crew_cpu_ops.dropout_forward(c.cpu, sx, sy, sm, rows, cols, rate, key, sid);
}

/* ---- normalisation: tensors [rows, ch], per-channel vectors [ch], per-row statistics [rows] */

static void guard_bn_col_sum(void *ctx, const float *x, int64_t rows, int64_t ch, double *out)
{
    op_call c = begin(ctx, "bn_col_sum");
    const float *sx = f32(&c, "x", x, times(rows, ch));
    double *so = f64(&c, "out", out, ch);
    if (c.ok) crew_cpu_ops.bn_col_sum(c.cpu, sx, rows, ch, so);
}

static void guard_col_sqdev(void *ctx, const float *x, const float *mean, int64_t rows, int64_t ch, double *out)
{
    op_call c = begin(ctx, "col_sqdev");
    const float *sx = f32(&c, "x", x, times(rows, ch));
    const float *sm = f32(&c, "mean", mean, ch);
    double *so = f64(&c, "out", out, ch);
    if (c.ok) crew_cpu_ops.col_sqdev(c.cpu, sx, sm, rows, ch, so);
}

static void guard_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y)
{
    op_call c = begin(ctx, "bn_scale_sums");
    const double *sx = f64(&c, "x", x, n);
    float *sy = f32(&c, "y", y, n);
    if (c.ok) crew_cpu_ops.bn_scale_sums(c.cpu, n, alpha, sx, sy);
}

static void guard_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                             const float *beta, float eps, float *y, int64_t rows, int64_t ch)
{
    op_call c = begin(ctx, "bn_forward");
    const float *sx = f32(&c, "x", x, times(rows, ch));
    const float *sm = f32(&c, "mean", mean, ch);
    const float *sv = f32(&c, "var", var, ch);
    const float *sg = f32(&c, "gamma", gamma, ch);
    const float *sb = f32(&c, "beta", beta, ch);
    float *sy = f32(&c, "y", y, times(rows, ch));
    if (c.ok) crew_cpu_ops.bn_forward(c.cpu, sx, sm, sv, sg, sb, eps, sy, rows, ch);
}

static void guard_bn_backward_sums(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows,
                                   int64_t ch, double *sum_dy, double *sum_dy_xmu)
{
    op_call c = begin(ctx, "bn_backward_sums");
    const float *sdy = f32(&c, "dy", dy, times(rows, ch));
    const float *sx = f32(&c, "x", x, times(rows, ch));
    const float *sm = f32(&c, "mean", mean, ch);
    double *s1 = f64(&c, "sum_dy", sum_dy, ch);
    double *s2 = f64(&c, "sum_dy_xmu", sum_dy_xmu, ch);
    if (c.ok) crew_cpu_ops.bn_backward_sums(c.cpu, sdy, sx, sm, rows, ch, s1, s2);
}

static void guard_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                              const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                              double count, float *dx, int64_t rows, int64_t ch)
{
    op_call c = begin(ctx, "bn_backward");
    const float *sdy = f32(&c, "dy", dy, times(rows, ch));
    const float *sx = f32(&c, "x", x, times(rows, ch));
    const float *sm = f32(&c, "mean", mean, ch);
    const float *sv = f32(&c, "var", var, ch);
    const float *sg = f32(&c, "gamma", gamma, ch);
    const double *s1 = f64(&c, "sum_dy", sum_dy, ch);
    const double *s2 = f64(&c, "sum_dy_xmu", sum_dy_xmu, ch);
    float *sdx = f32(&c, "dx", dx, times(rows, ch));
    if (c.ok) crew_cpu_ops.bn_backward(c.cpu, sdy, sx, sm, sv, sg, eps, s1, s2, count, sdx, rows, ch);
}

static void guard_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy,
                                 const double *sum_dy_xmu, float *dgamma, float *dbeta, int64_t ch)
{
    op_call c = begin(ctx, "bn_param_grads");
    const float *sv = f32(&c, "var", var, ch);
    const double *s1 = f64(&c, "sum_dy", sum_dy, ch);
    const double *s2 = f64(&c, "sum_dy_xmu", sum_dy_xmu, ch);
    float *sdg = f32(&c, "dgamma", dgamma, ch);
    float *sdb = f32(&c, "dbeta", dbeta, ch);
    if (c.ok) crew_cpu_ops.bn_param_grads(c.cpu, sv, eps, s1, s2, sdg, sdb, ch);
}

static void guard_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                                    float *y, float *mean, float *rstd, int64_t rows, int64_t ch)
{
    op_call c = begin(ctx, "layernorm_forward");
    const float *sx = f32(&c, "x", x, times(rows, ch));
    const float *sg = f32(&c, "gamma", gamma, ch);
    const float *sb = f32(&c, "beta", beta, ch);
    float *sy = f32(&c, "y", y, times(rows, ch));
    float *sm = f32(&c, "mean", mean, rows);
    float *sr = f32(&c, "rstd", rstd, rows);
    if (c.ok) crew_cpu_ops.layernorm_forward(c.cpu, sx, sg, sb, eps, sy, sm, sr, rows, ch);
}

static void guard_layernorm_backward(void *ctx, const float *dy, const float *x, const float *gamma,
                                     const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                                     int64_t rows, int64_t ch)
{
    op_call c = begin(ctx, "layernorm_backward");
    const float *sdy = f32(&c, "dy", dy, times(rows, ch));
    const float *sx = f32(&c, "x", x, times(rows, ch));
    const float *sg = f32(&c, "gamma", gamma, ch);
    const float *sm = f32(&c, "mean", mean, rows);
    const float *sr = f32(&c, "rstd", rstd, rows);
    float *sdx = f32(&c, "dx", dx, times(rows, ch));
    float *sdg = f32(&c, "dgamma", dgamma, ch);
    float *sdb = f32(&c, "dbeta", dbeta, ch);
    if (c.ok) crew_cpu_ops.layernorm_backward(c.cpu, sdy, sx, sg, sm, sr, sdx, sdg, sdb, rows, ch);
}

/* ---- attention */

static void guard_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores,
                                    float *y, int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    op_call c = begin(ctx, "attention_forward");
    int64_t bt = times(batch, T), ch = times(heads, d), sq = times(times(batch, heads), times(T, T));
    const float *sqkv = f32(&c, "qkv", qkv, times(bt, times(3, ch)));
    void *satt = float_type_ok(&c, "att", att_type) ? operand(&c, "att", att, sq, att_type) : att;
    float *sscores = att_type == CREW_DT_BF16 ? f32(&c, "scores", scores, sq) : scores;
    float *sy = y ? f32(&c, "y", y, times(bt, ch)) : NULL; /* NULL: the probabilities alone */
    if (c.ok) crew_cpu_ops.attention_forward(c.cpu, sqkv, satt, att_type, sscores, sy, batch, T, heads, d);
}

static void guard_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att,
                                     crew_dtype att_type, float *datt, float *dqkv, int64_t batch, int64_t T,
                                     int64_t heads, int64_t d)
{
    op_call c = begin(ctx, "attention_backward");
    int64_t bt = times(batch, T), ch = times(heads, d), sq = times(times(batch, heads), times(T, T));
    const float *sdy = f32(&c, "dy", dy, times(bt, ch));
    const float *sqkv = f32(&c, "qkv", qkv, times(bt, times(3, ch)));
    const void *satt = float_type_ok(&c, "att", att_type) ? operand(&c, "att", att, sq, att_type) : att;
    float *sdatt = f32(&c, "datt", datt, sq);
    float *sdqkv = f32(&c, "dqkv", dqkv, times(bt, times(3, ch)));
    if (c.ok) crew_cpu_ops.attention_backward(c.cpu, sdy, sqkv, satt, att_type, sdatt, sdqkv, batch, T, heads, d);
}

/* ---- embedding and loss */

static crew_status guard_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                           int64_t rows, int64_t dim, int64_t *bad)
{
    op_call c = begin(ctx, "embedding_forward");
    const float *sids = f32(&c, "ids", ids, rows);
    const float *st = f32(&c, "table", table, times(vocab, dim));
    float *sy = f32(&c, "y", y, times(rows, dim));
    return settle(c.g, c.ok ? crew_cpu_ops.embedding_forward(c.cpu, sids, st, vocab, sy, rows, dim, bad) : CREW_OK);
}

static void guard_embedding_backward(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab,
                                     int64_t rows, int64_t dim)
{
    op_call c = begin(ctx, "embedding_backward");
    const float *sids = f32(&c, "ids", ids, rows);
    const float *sdy = f32(&c, "dy", dy, times(rows, dim));
    float *sdt = f32(&c, "dtable", dtable, times(vocab, dim));
    if (c.ok) crew_cpu_ops.embedding_backward(c.cpu, sids, sdy, sdt, vocab, rows, dim);
}

static crew_status guard_softmax_xent(void *ctx, const float *logits, const int32_t *labels, int64_t rows,
                                      int64_t classes, float scale, float *row_loss, float *dlogits, int64_t *correct)
{
    op_call c = begin(ctx, "softmax_xent");
    const float *sz = f32(&c, "logits", logits, times(rows, classes));
    const int32_t *sl = i32(&c, "labels", labels, rows);
    float *sr = f32(&c, "row_loss", row_loss, rows);
    float *sdz = f32(&c, "dlogits", dlogits, times(rows, classes));
    return settle(c.g, c.ok ? crew_cpu_ops.softmax_xent(c.cpu, sz, sl, rows, classes, scale, sr, sdz, correct)
                            : CREW_OK);
}

static void guard_softmax(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes)
{
    op_call c = begin(ctx, "softmax");
    const float *sz = f32(&c, "logits", logits, times(rows, classes));
    float *sp = f32(&c, "probs", probs, times(rows, classes));
    if (c.ok) crew_cpu_ops.softmax(c.cpu, sz, sp, rows, classes);
}

/* ---- optimisers */

static void guard_sgd_update(void *ctx, float *param, const float *grad, float *velocity, int64_t n, float lr,
                             float momentum, int nesterov, float weight_decay)
{
    op_call c = begin(ctx, "sgd_update");
    float *sp = f32(&c, "param", param, n);
    const float *sg = f32(&c, "grad", grad, n);
    /* Without momentum the kernel never touches velocity, and the optimiser allocates none. */
    float *sv = f32(&c, "velocity", velocity, momentum != 0.0f ? n : 0);
    if (c.ok) crew_cpu_ops.sgd_update(c.cpu, sp, sg, sv, n, lr, momentum, nesterov, weight_decay);
}

static void guard_adamw_update(void *ctx, float *param, const float *grad, float *m, float *v, int64_t n,
                               const crew_adamw_consts *k)
{
    op_call c = begin(ctx, "adamw_update");
    float *sp = f32(&c, "param", param, n);
    const float *sg = f32(&c, "grad", grad, n);
    float *sm = f32(&c, "m", m, n);
    float *sv = f32(&c, "v", v, n);
    if (c.ok)
        crew_cpu_ops.adamw_update(c.cpu, sp, sg, sm, sv, n, k);
}

static void guard_adam_direction(void *ctx, const float *grad, float *m, float *v, float *u, int64_t n,
                                 const crew_adamw_consts *k)
{
    op_call c = begin(ctx, "adam_direction");
    const float *sg = f32(&c, "grad", grad, n);
    float *sm = f32(&c, "m", m, n);
    float *sv = f32(&c, "v", v, n);
    float *su = u == grad ? (float *)sg : f32(&c, "u", u, n); /* in place: the same host view */
    if (c.ok) crew_cpu_ops.adam_direction(c.cpu, sg, sm, sv, su, n, k);
}

static crew_status guard_configure(void *ctx, const crew_device_options *o)
{
    guard_ctx *g = ctx;
    if (o->conv_library && !g->remote)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cpu-guarded has no convolution library (cpu-remote has a "
                           "stand-in for a GPU's)");
    g->conv_library = o->conv_library != 0;
    crew_device_options plain = *o;
    plain.conv_library = 0; /* the plain CPU backend has none: the stand-in is this file's */
    return crew_cpu_ops.configure(g->cpu.ctx, &plain);
}

/* ---- cpu-remote's stand-in convolution library (cpu_conv_direct.c) */

static int64_t conv_out_extent(const crew_window *w, int64_t out_c)
{
    return times(times3(w->batch, w->out_h, w->out_w), out_c);
}

static int64_t kernel_extent(const crew_window *w, int64_t out_c)
{
    return times(times3(w->k_h, w->k_w, w->in_c), out_c);
}

static int guard_conv_supported(void *ctx, const crew_window *w, int64_t out_c)
{
    guard_ctx *g = ctx;
    return g->conv_library && out_c > 0 && cpu_conv_direct_supported(w);
}

static void guard_conv_forward(void *ctx, const float *x, const float *kernel, float *y, const crew_window *w,
                               int64_t out_c)
{
    op_call c = begin(ctx, "conv_forward");
    const float *sx = f32(&c, "x", x, image_extent(w));
    const float *sk = f32(&c, "kernel", kernel, kernel_extent(w, out_c));
    float *sy = f32(&c, "y", y, conv_out_extent(w, out_c));
    if (c.ok) cpu_conv_direct_forward(sx, sk, sy, w, out_c);
}

static void guard_conv_backward_data(void *ctx, const float *dy, const float *kernel, float *dx, const crew_window *w,
                                     int64_t out_c)
{
    op_call c = begin(ctx, "conv_backward_data");
    const float *sdy = f32(&c, "dy", dy, conv_out_extent(w, out_c));
    const float *sk = f32(&c, "kernel", kernel, kernel_extent(w, out_c));
    float *sdx = f32(&c, "dx", dx, image_extent(w));
    if (c.ok) cpu_conv_direct_backward_data(sdy, sk, sdx, w, out_c);
}

static void guard_conv_backward_filter(void *ctx, const float *x, const float *dy, float *dkernel,
                                       const crew_window *w, int64_t out_c)
{
    op_call c = begin(ctx, "conv_backward_filter");
    const float *sx = f32(&c, "x", x, image_extent(w));
    const float *sdy = f32(&c, "dy", dy, conv_out_extent(w, out_c));
    float *sdk = f32(&c, "dkernel", dkernel, kernel_extent(w, out_c));
    if (c.ok) cpu_conv_direct_backward_filter(sx, sdy, sdk, w, out_c);
}

static void guard_conv_taps_forward(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                                    const crew_window *w, int64_t out_c)
{
    op_call c = begin(ctx, "conv_taps_forward");
    const float *sx = f32(&c, "x", x, image_extent(w));
    const float *sk = f32(&c, "kernel", kernel, kernel_extent(w, out_c));
    const float *sb = bias ? f32(&c, "bias", bias, out_c) : NULL;
    float *sy = f32(&c, "y", y, conv_out_extent(w, out_c));
    if (c.ok) crew_cpu_ops.conv_taps_forward(c.cpu, sx, sk, sb, sy, w, out_c);
}

static void guard_conv_taps_filter_grad(void *ctx, const float *x, const float *dy, float *dkernel,
                                        const crew_window *w, int64_t out_c)
{
    op_call c = begin(ctx, "conv_taps_filter_grad");
    const float *sx = f32(&c, "x", x, image_extent(w));
    const float *sdy = f32(&c, "dy", dy, conv_out_extent(w, out_c));
    float *sdk = f32(&c, "dkernel", dkernel, kernel_extent(w, out_c));
    if (c.ok) crew_cpu_ops.conv_taps_filter_grad(c.cpu, sx, sdy, sdk, w, out_c);
}

/* the pooled output of a convolution's output: [batch, out_h/2, out_w/2, out_c] */
static int64_t taps_pooled_extent(const crew_window *w, int64_t out_c)
{
    return times(times3(w->batch, w->out_h / 2, w->out_w / 2), out_c);
}

static void guard_conv_taps_pool_forward(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                                         int32_t *argmax, const crew_window *w, int64_t out_c)
{
    op_call c = begin(ctx, "conv_taps_pool_forward");
    const float *sx = f32(&c, "x", x, image_extent(w));
    const float *sk = f32(&c, "kernel", kernel, kernel_extent(w, out_c));
    const float *sb = bias ? f32(&c, "bias", bias, out_c) : NULL;
    float *sy = f32(&c, "y", y, taps_pooled_extent(w, out_c));
    int32_t *sa = i32(&c, "argmax", argmax, taps_pooled_extent(w, out_c));
    if (c.ok) crew_cpu_ops.conv_taps_pool_forward(c.cpu, sx, sk, sb, sy, sa, w, out_c);
}

static void guard_conv_taps_pool_grads(void *ctx, const float *x, const float *dy, const int32_t *argmax,
                                       float *dkernel, float *dbias, const crew_window *w, int64_t out_c)
{
    op_call c = begin(ctx, "conv_taps_pool_grads");
    const float *sx = f32(&c, "x", x, image_extent(w));
    const float *sdy = f32(&c, "dy", dy, taps_pooled_extent(w, out_c));
    const int32_t *sa = i32(&c, "argmax", argmax, taps_pooled_extent(w, out_c));
    float *sdk = f32(&c, "dkernel", dkernel, kernel_extent(w, out_c));
    float *sdb = dbias ? f32(&c, "dbias", dbias, out_c) : NULL;
    if (c.ok) crew_cpu_ops.conv_taps_pool_grads(c.cpu, sx, sdy, sa, sdk, sdb, w, out_c);
}

/* Both tables: the guarded one, and "cpu-remote", the same device without host_alias (a GPU's
 * case: its replicas take part through host copies, comm_staged.c). */
#define GUARDED_OPS(kind, alias, ...) \
    { \
        .name = kind, \
        .host_alias = alias, \
        __VA_ARGS__ \
    .destroy = guard_destroy, \
    .alloc = guard_alloc, \
    .free = guard_free, \
    .host_alloc = guard_host_alloc, \
    .memory_used = guard_memory_used, \
    .host_free = guard_host_free, \
    .upload = guard_upload, \
    .download = guard_download, \
    .queue_create = guard_queue_create, \
    .queue_destroy = guard_queue_destroy, \
    .queue_wait = guard_queue_wait, \
    .sync = guard_sync, \
    .sum = guard_sum, \
    .sum_squares = guard_sum_squares, \
    .sum_squares_lanes = guard_sum_squares_lanes, \
    .all_finite = guard_all_finite, \
    .hash = guard_hash, \
    .copy = guard_copy, \
    .fill = guard_fill, \
    .gemm = guard_gemm, \
    .gemm_typed = guard_gemm_typed, \
    .gemm_bias = guard_gemm_bias, \
    .to_bf16 = guard_to_bf16, \
    .axpby = guard_axpby, \
    .mul = guard_mul, \
    .broadcast_rows = guard_broadcast_rows, \
    .col_sum = guard_col_sum, \
    .act_forward = guard_act_forward, \
    .act_backward = guard_act_backward, \
    .act_forward_slope = guard_act_forward_slope, \
    .im2col = guard_im2col, \
    .col2im = guard_col2im, \
    .conv_taps_forward = guard_conv_taps_forward, \
    .conv_taps_filter_grad = guard_conv_taps_filter_grad, \
    .conv_taps_pool_forward = guard_conv_taps_pool_forward, \
    .conv_taps_pool_grads = guard_conv_taps_pool_grads, \
    .maxpool_forward = guard_maxpool_forward, \
    .maxpool_backward = guard_maxpool_backward, \
    .avgpool_forward = guard_avgpool_forward, \
    .avgpool_backward = guard_avgpool_backward, \
    .dropout_forward = guard_dropout_forward, \
    .bn_col_sum = guard_bn_col_sum, \
    .col_sqdev = guard_col_sqdev, \
    .bn_scale_sums = guard_bn_scale_sums, \
    .bn_forward = guard_bn_forward, \
    .bn_backward_sums = guard_bn_backward_sums, \
    .bn_backward = guard_bn_backward, \
    .bn_param_grads = guard_bn_param_grads, \
    .layernorm_forward = guard_layernorm_forward, \
    .layernorm_backward = guard_layernorm_backward, \
    .attention_forward = guard_attention_forward, \
    .attention_backward = guard_attention_backward, \
    .embedding_forward = guard_embedding_forward, \
    .embedding_backward = guard_embedding_backward, \
    .softmax_xent = guard_softmax_xent, \
    .softmax = guard_softmax, \
    .sgd_update = guard_sgd_update, \
    .adamw_update = guard_adamw_update, \
    .adam_direction = guard_adam_direction, \
    .configure = guard_configure, \
    }

static const crew_backend_ops guarded_ops = GUARDED_OPS("cpu-guarded", guard_host_alias, );
static const crew_backend_ops remote_ops =
    GUARDED_OPS("cpu-remote", NULL, .conv_supported = guard_conv_supported, .conv_forward = guard_conv_forward,
                .conv_backward_data = guard_conv_backward_data, .conv_backward_filter = guard_conv_backward_filter, );

static crew_status create(int blas_threads, const crew_backend_ops *ops, crew_backend *out)
{
    memset(out, 0, sizeof *out);
    guard_ctx *g = calloc(1, sizeof *g);
    if (!g) return CREW_OOM();
    if (pthread_mutex_init(&g->lock, NULL) != 0) {
        free(g);
        return crew_errorf(CREW_CODE_INTERNAL, "cpu-guarded: cannot create a mutex");
    }
    crew_status s = crew_cpu_backend_create(blas_threads, &g->cpu);
    if (s) {
        pthread_mutex_destroy(&g->lock);
        free(g);
        return crew_error_prefix(s, "cpu-guarded: ");
    }
    g->remote = ops == &remote_ops;
    out->ops = ops;
    out->ctx = g;
    return CREW_OK;
}

crew_status crew_cpu_guarded_backend_create(int blas_threads, crew_backend *out)
{
    return create(blas_threads, &guarded_ops, out);
}

crew_status crew_cpu_remote_backend_create(int blas_threads, crew_backend *out)
{
    return create(blas_threads, &remote_ops, out);
}
