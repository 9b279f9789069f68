/* comm_staged.c — a rank's communicator handle for a device whose memory the host cannot reach
 * (a GPU: no host_alias), over a communicator of host buffers (the in-process one, or MPI's).
 *
 * Every collective brings this rank's inputs to the host (download, which waits for the device's
 * compute queue, so a gradient bucket is complete), runs the inner communicator's collective on
 * host copies, and puts the results back on the device (upload on the compute queue, synced before
 * the copy is freed). The sums are the inner communicator's, in its order, so N replicas on GPUs
 * compute the same bits as one GPU accumulating N micro-batches: the determinism contract holds,
 * at the price of two copies each way per collective. It is how crew trains on several GPUs, or
 * several replicas on one, before an NCCL communicator replaces it on the fast path.
 *
 * The host copies are made per call (malloc), so two threads of one rank (the rank's and its
 * communication thread) never share one. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/status.h"

typedef struct staged {
    crew_comm inner;
    const crew_backend *device;
} staged;

static crew_dtype dtype_of(crew_comm_type t) { return t == CREW_COMM_F64 ? CREW_DT_F64 : CREW_DT_F32; }
static size_t size_of(crew_comm_type t) { return t == CREW_COMM_F64 ? 8 : 4; }

/* A host copy of n values of the device buffer p (NULL p or n 0: an empty one). */
static crew_status to_host(const staged *s, const void *p, int64_t n, crew_comm_type t, void **out)
{
    *out = malloc((size_t)(n > 0 ? n : 1) * size_of(t));
    if (!*out) return CREW_OOM();
    if (n <= 0 || !p) return CREW_OK;
    crew_status st = s->device->ops->download(s->device->ctx, *out, p, n, dtype_of(t));
    if (st) {
        free(*out);
        *out = NULL;
    }
    return st;
}

/* n values of the host copy h into the device buffer p, done before h may be freed. */
static crew_status to_device(const staged *s, void *p, const void *h, int64_t n, crew_comm_type t)
{
    if (n <= 0) return CREW_OK;
    CREW_TRY(s->device->ops->upload(s->device->ctx, NULL, p, h, n, dtype_of(t)));
    return s->device->ops->sync(s->device->ctx, NULL);
}

/* The inner handle's call, then the result back to the device. */
#define STAGED(s) ((const staged *)(s))

static crew_status staged_allreduce(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, crew_reduce_op op,
                                    double timeout_s)
{
    const staged *s = STAGED(ctx);
    void *h = NULL;
    CREW_TRY(to_host(s, buf, n, t, &h));
    crew_status st = crew_allreduce(&s->inner, h, n, t, op, timeout_s);
    if (!st) st = to_device(s, buf, h, n, t);
    free(h);
    return st;
}

static crew_status staged_broadcast(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int root,
                                    double timeout_s)
{
    const staged *s = STAGED(ctx);
    void *h = NULL;
    CREW_TRY(to_host(s, rank == root ? buf : NULL, n, t, &h)); /* the others' values are overwritten */
    crew_status st = crew_broadcast(&s->inner, h, n, t, root, timeout_s);
    if (!st && rank != root) st = to_device(s, buf, h, n, t);
    free(h);
    return st;
}

static crew_status staged_allgather(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                    double timeout_s)
{
    const staged *s = STAGED(ctx);
    void *hs = NULL, *hr = NULL;
    CREW_TRY(to_host(s, send, n, t, &hs));
    crew_status st = to_host(s, NULL, n * s->inner.size, t, &hr);
    if (!st) st = s->inner.ops->allgather(s->inner.ctx, s->inner.rank, hs, hr, n, t, timeout_s);
    if (!st) st = to_device(s, recv, hr, n * s->inner.size, t);
    free(hs);
    free(hr);
    return st;
}

static crew_status staged_reduce_scatter(void *ctx, int rank, const void *send, void *recv, int64_t n,
                                         crew_comm_type t, crew_reduce_op op, double timeout_s)
{
    const staged *s = STAGED(ctx);
    void *hs = NULL, *hr = NULL;
    CREW_TRY(to_host(s, send, n * s->inner.size, t, &hs));
    crew_status st = to_host(s, NULL, n, t, &hr);
    if (!st) st = s->inner.ops->reduce_scatter(s->inner.ctx, s->inner.rank, hs, hr, n, t, op, timeout_s);
    if (!st) st = to_device(s, recv, hr, n, t);
    free(hs);
    free(hr);
    return st;
}

/* The k inputs' host copies, and out's: one of them when out is one of the inputs, else its own
 * (downloaded: a reduce-scatter leaves the rest of out as it was). */
static crew_status ordered_inputs(const staged *s, float *const *in, int k, const float *out, int64_t n, float **h,
                                  float **h_out)
{
    crew_status st = CREW_OK;
    *h_out = NULL;
    for (int j = 0; j < k && !st; j++) {
        st = to_host(s, in[j], n, CREW_COMM_F32, (void **)&h[j]);
        if (in[j] == out) *h_out = h[j];
    }
    if (!st && !*h_out) st = to_host(s, out, n, CREW_COMM_F32, (void **)h_out);
    return st;
}

static void free_inputs(float **h, int k, float *h_out)
{
    int own = 1;
    for (int j = 0; j < k; j++) {
        own &= h[j] != h_out;
        free(h[j]);
    }
    if (own) free(h_out);
}

static crew_status staged_ordered(const staged *s, float *const *in, int k, float *out, int64_t n,
                                  const int64_t *bounds, double timeout_s)
{
    float **h = calloc((size_t)(k > 0 ? k : 1), sizeof *h), *h_out = NULL;
    if (!h) return CREW_OOM();
    crew_status st = ordered_inputs(s, in, k, out, n, h, &h_out);
    if (!st)
        st = bounds ? crew_reduce_scatter_ordered(&s->inner, h, k, h_out, n, bounds, timeout_s)
                    : s->inner.ops->allreduce_ordered(s->inner.ctx, s->inner.rank, h, k, h_out, n, timeout_s);
    if (!st && bounds) { /* only this rank's range changed */
        const int64_t lo = bounds[s->inner.rank], hi = bounds[s->inner.rank + 1];
        st = to_device(s, out + lo, h_out + lo, hi - lo, CREW_COMM_F32);
    } else if (!st) {
        st = to_device(s, out, h_out, n, CREW_COMM_F32);
    }
    free_inputs(h, k, h_out);
    free(h);
    return st;
}

static crew_status staged_allreduce_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                            double timeout_s)
{
    return staged_ordered(STAGED(ctx), in, k, out, n, NULL, timeout_s);
}

static crew_status staged_reduce_scatter_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                                 const int64_t *bounds, double timeout_s)
{
    return staged_ordered(STAGED(ctx), in, k, out, n, bounds, timeout_s);
}

static crew_status staged_allgather_ranges(void *ctx, int rank, float *buf, int64_t n, const int64_t *bounds,
                                           double timeout_s)
{
    const staged *s = STAGED(ctx);
    float *h = NULL;
    CREW_TRY(to_host(s, buf, n, CREW_COMM_F32, (void **)&h));
    crew_status st = crew_allgather_ranges(&s->inner, h, n, bounds, timeout_s);
    if (!st) st = to_device(s, buf, h, n, CREW_COMM_F32);
    free(h);
    return st;
}

static crew_status staged_barrier(void *ctx, int rank, double timeout_s)
{
    return crew_barrier(&STAGED(ctx)->inner, timeout_s);
}

static crew_status staged_send(void *ctx, int rank, const void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                               double timeout_s)
{
    const staged *s = STAGED(ctx);
    void *h = NULL;
    CREW_TRY(to_host(s, buf, n, t, &h));
    crew_status st = crew_send(&s->inner, h, n, t, peer, tag, timeout_s); /* buffered: h is free again */
    free(h);
    return st;
}

static crew_status staged_recv(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                               double timeout_s)
{
    const staged *s = STAGED(ctx);
    void *h = NULL;
    CREW_TRY(to_host(s, NULL, n, t, &h));
    crew_status st = crew_recv(&s->inner, h, n, t, peer, tag, timeout_s);
    if (!st) st = to_device(s, buf, h, n, t);
    free(h);
    return st;
}

static void staged_abort(void *ctx, int rank)
{
    const staged *s = STAGED(ctx);
    s->inner.ops->abort(s->inner.ctx, s->inner.rank);
}

static const crew_comm_ops staged_ops = {
    .name = "staged",
    .allreduce = staged_allreduce,
    .broadcast = staged_broadcast,
    .allgather = staged_allgather,
    .reduce_scatter = staged_reduce_scatter,
    .allreduce_ordered = staged_allreduce_ordered,
    .reduce_scatter_ordered = staged_reduce_scatter_ordered,
    .allgather_ranges = staged_allgather_ranges,
    .barrier = staged_barrier,
    .send = staged_send,
    .recv = staged_recv,
    .abort = staged_abort,
};

int crew_comm_needs_staging(const crew_backend *device) { return device && !device->ops->host_alias; }

crew_status crew_staged_comm_create(crew_comm inner, const crew_backend *device, crew_staged_comm **out)
{
    staged *s = calloc(1, sizeof *s);
    *out = (crew_staged_comm *)s;
    if (!s) return CREW_OOM();
    s->inner = inner;
    s->device = device;
    return CREW_OK;
}

crew_comm crew_staged_comm_rank(crew_staged_comm *st)
{
    const staged *s = (const staged *)st;
    return (crew_comm){&staged_ops, st, s->inner.rank, s->inner.size};
}

void crew_staged_comm_free(crew_staged_comm *st) { free(st); }
