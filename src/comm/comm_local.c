/* comm_local.c — the in-process communicator: one thread per rank, shared memory.
 *
 * A collective is: every rank posts its buffer pointers and meets at a barrier; then each rank
 * works on its own chunk of the elements, reading every rank's buffer and writing the result
 * into every rank's buffer (nobody else touches that chunk); then a second barrier. For each
 * element the sum runs over ranks 0, 1, ..., size-1 in that order, whichever thread does it:
 * results are bitwise the same as one rank summing the contributions in rank order.
 *
 * The barrier has a deadline; when it passes, the message names the ranks that never arrived,
 * and the communicator is poisoned so every other rank stops waiting too.
 *
 * Buffers are device memory of each rank's device: a rank posts the host address of its buffer
 * (its device's host_alias), which the other ranks' threads then read and write. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/cpu.h"
#include "core/status.h"
#include "core/timer.h"

/* How long a rank arriving at a barrier watches for the last one before it sleeps. Waking a
 * sleeping thread costs tens of microseconds (more in a VM, where it takes an interrupt between
 * cores), and a step meets at two or more barriers per collective: the MLP's 2-replica step spent
 * about 0.5 ms of its 4 ms in one small all-reduce before there was a watch at all. 50 us still
 * left the 2-replica MLP (a 1.4 ms step, four barriers) sleeping and waking at some of them: 200
 * us made it 5-7% faster (three paired rounds on 2 cores, docs/PERFORMANCE.md), the CNN the same
 * within the noise, and a longer watch gained nothing more. It is skipped when there are more
 * ranks than cores, where a watching rank would hold the core of the one it waits for. */
#define SPIN_S 200e-6

struct crew_local_comm {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int spin;                /* 1: ranks watch briefly before sleeping (no more ranks than cores) */
    _Atomic uint64_t generation; /* barriers completed; read without mu while watching */
    int arrived;             /* ranks waiting at the current barrier */
    unsigned char *here;     /* [size] 1 when rank r is at the current barrier */
    _Atomic int failed_rank; /* -1, or a rank that aborted or timed out */
    char failure[256];       /* why the communicator is poisoned */
    void **buf;              /* [size] buffers posted for the current collective (host addresses) */
    float *const **parts;    /* [size] allreduce_ordered: each rank's k inputs */
    const void **send;       /* [size] */
    const crew_backend **device; /* [size] the device each rank's buffers live on; NULL: host memory */
    float ***aliases;        /* [size] each rank's own array of the host addresses of its k inputs */
    int *alias_cap;          /* [size] */
    /* Point-to-point: one FIFO of sent, not yet received messages per (sender, receiver) pair,
     * [size × size] (made at the first send, under mu). */
    struct p2p_msg **head, **tail;
};

/* A message sent and not yet received: a copy of the sender's buffer. */
typedef struct p2p_msg {
    struct p2p_msg *next;
    int tag;
    int64_t n;
    crew_comm_type type;
    unsigned char data[];
} p2p_msg;

static size_t type_size(crew_comm_type t) { return t == CREW_COMM_F64 ? 8 : 4; }

static void abort_rank(struct crew_local_comm *c, int rank, const char *why);

/* The host address of rank's buffer p of n elements. A buffer that is not the rank's device memory
 * fails the collective and poisons the communicator, so the others stop at once instead of waiting
 * for the deadline. */
static crew_status resolve(struct crew_local_comm *c, int rank, const void *p, int64_t n, crew_comm_type t,
                           const char *what, void **out)
{
    const crew_backend *d = c->device[rank];
    *out = (void *)p;
    if (!d || n <= 0) return CREW_OK;
    *out = d->ops->host_alias(d->ctx, p, n, t == CREW_COMM_F64 ? CREW_DT_F64 : CREW_DT_F32);
    if (*out) return CREW_OK;
    crew_status s = crew_errorf(CREW_CODE_INTERNAL, "%s on rank %d: the buffer %p of %lld values is not memory of "
                                "the rank's device (%s)", what, rank, p, (long long)n, d->ops->name);
    abort_rank(c, rank, crew_status_message(s));
    return s;
}

/* Lists the ranks missing from the barrier, "1, 3", into buf. Called with mu held. */
static void missing_ranks(const struct crew_local_comm *c, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < c->size && used < len; r++)
        if (!c->here[r]) used += (size_t)snprintf(buf + used, len - used, used ? ", %d" : "%d", r);
}

static crew_status barrier(struct crew_local_comm *c, int rank, double timeout_s, const char *what)
{
    pthread_mutex_lock(&c->mu);
    if (c->failed_rank >= 0) {
        crew_status s = crew_errorf(CREW_CODE_TIMEOUT, "%s on rank %d: %s", what, rank, c->failure);
        pthread_mutex_unlock(&c->mu);
        return s;
    }
    uint64_t gen = c->generation;
    c->here[rank] = 1;
    if (++c->arrived == c->size) {
        c->arrived = 0;
        memset(c->here, 0, (size_t)c->size);
        c->generation++;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return CREW_OK;
    }
    if (c->spin) { /* watch for the last rank, then sleep as before */
        pthread_mutex_unlock(&c->mu);
        double until = crew_now() + SPIN_S;
        for (int i = 1; c->generation == gen && c->failed_rank < 0; i++) {
            if (i % 64 == 0 && crew_now() > until) break;
            crew_cpu_relax();
        }
        pthread_mutex_lock(&c->mu);
    }
    struct timespec deadline;
    crew_deadline_after(timeout_s, &deadline);
    int rc = 0;
    while (c->generation == gen && c->failed_rank < 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
    crew_status s = CREW_OK;
    if (c->generation == gen) {
        if (c->failed_rank < 0) {
            char missing[128];
            missing_ranks(c, missing, sizeof missing);
            snprintf(c->failure, sizeof c->failure, "rank %s did not arrive within %g s", missing, timeout_s);
            c->failed_rank = rank;
            pthread_cond_broadcast(&c->cv);
        }
        s = crew_errorf(CREW_CODE_TIMEOUT, "%s on rank %d: %s", what, rank, c->failure);
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

static void chunk(int64_t n, int size, int rank, int64_t *lo, int64_t *hi)
{
    *lo = n * rank / size;
    *hi = n * (rank + 1) / size;
}

/* out[i] = op over ranks (in rank order) of in_q[i], for i in [lo, hi). Works through a block
 * at a time in a local buffer, so each pass is a plain vector loop; every element is still
 * summed in rank order, the same bits as a scalar loop. */
#define REDUCE_BLOCK 2048

#define DEFINE_REDUCE(name, T)                                                                         \
    static void name(void *const *in, int size, int64_t lo, int64_t hi, crew_reduce_op op, void *const *out, \
                     int n_out, int64_t out_shift)                                                       \
    {                                                                                                    \
        T acc[REDUCE_BLOCK];                                                                             \
        const T inv = (T)1 / (T)size;                                                                    \
        for (int64_t b = lo; b < hi; b += REDUCE_BLOCK) {                                                \
            int64_t n = hi - b < REDUCE_BLOCK ? hi - b : REDUCE_BLOCK;                                   \
            memcpy(acc, (const T *)in[0] + b, (size_t)n * sizeof(T));                                    \
            for (int q = 1; q < size; q++) {                                                             \
                const T *src = (const T *)in[q] + b;                                                     \
                for (int64_t i = 0; i < n; i++) acc[i] += src[i];                                        \
            }                                                                                            \
            if (op == CREW_REDUCE_AVG)                                                                   \
                for (int64_t i = 0; i < n; i++) acc[i] *= inv;                                           \
            for (int q = 0; q < n_out; q++) memcpy((T *)out[q] + b - out_shift, acc, (size_t)n * sizeof(T)); \
        }                                                                                                \
    }

DEFINE_REDUCE(reduce_f32, float)
DEFINE_REDUCE(reduce_f64, double)

static void reduce_range(void *const *in, int size, int64_t lo, int64_t hi, crew_comm_type t, crew_reduce_op op,
                         void *const *out, int n_out, int64_t out_shift)
{
    if (t == CREW_COMM_F32)
        reduce_f32(in, size, lo, hi, op, out, n_out, out_shift);
    else
        reduce_f64(in, size, lo, hi, op, out, n_out, out_shift);
}

static crew_status local_allreduce(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, crew_reduce_op op,
                                   double timeout_s)
{
    struct crew_local_comm *c = ctx;
    if (c->size == 1) return CREW_OK; /* a sum or mean over one rank is the buffer itself */
    CREW_TRY(resolve(c, rank, buf, n, t, "all-reduce", &c->buf[rank]));
    CREW_TRY(barrier(c, rank, timeout_s, "all-reduce"));
    int64_t lo, hi;
    chunk(n, c->size, rank, &lo, &hi);
    reduce_range(c->buf, c->size, lo, hi, t, op, c->buf, c->size, 0);
    return barrier(c, rank, timeout_s, "all-reduce");
}

static crew_status local_broadcast(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int root,
                                   double timeout_s)
{
    struct crew_local_comm *c = ctx;
    if (root < 0 || root >= c->size)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "broadcast: root %d is not a rank of %d", root, c->size);
    if (c->size == 1) return CREW_OK;
    CREW_TRY(resolve(c, rank, buf, n, t, "broadcast", &c->buf[rank]));
    CREW_TRY(barrier(c, rank, timeout_s, "broadcast"));
    if (rank != root) memcpy(c->buf[rank], c->buf[root], (size_t)n * type_size(t));
    return barrier(c, rank, timeout_s, "broadcast");
}

static crew_status local_allgather(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                   double timeout_s)
{
    struct crew_local_comm *c = ctx;
    size_t bytes = (size_t)n * type_size(t);
    void *mine, *into;
    CREW_TRY(resolve(c, rank, send, n, t, "all-gather", &mine));
    CREW_TRY(resolve(c, rank, recv, n * c->size, t, "all-gather", &into));
    c->send[rank] = mine;
    CREW_TRY(barrier(c, rank, timeout_s, "all-gather"));
    for (int q = 0; q < c->size; q++) memcpy((char *)into + (size_t)q * bytes, c->send[q], bytes);
    return barrier(c, rank, timeout_s, "all-gather");
}

static crew_status local_reduce_scatter(void *ctx, int rank, const void *send, void *recv, int64_t n,
                                        crew_comm_type t, crew_reduce_op op, double timeout_s)
{
    struct crew_local_comm *c = ctx;
    void *mine;
    CREW_TRY(resolve(c, rank, send, n * c->size, t, "reduce-scatter", &mine));
    CREW_TRY(resolve(c, rank, recv, n, t, "reduce-scatter", &c->buf[rank]));
    c->send[rank] = mine;
    CREW_TRY(barrier(c, rank, timeout_s, "reduce-scatter"));
    void *out[1] = {c->buf[rank]};
    reduce_range((void *const *)c->send, c->size, (int64_t)rank * n, (int64_t)(rank + 1) * n, t, op, out, 1,
                 (int64_t)rank * n);
    return barrier(c, rank, timeout_s, "reduce-scatter");
}

/* Posts rank's k inputs and its output (host addresses) for an ordered sum. */
static crew_status post_ordered(struct crew_local_comm *c, int rank, float *const *in, int k, float *out, int64_t n,
                                const char *what)
{
    if (k > c->alias_cap[rank]) { /* the rank's own slot: no other thread touches it before the barrier */
        float **grown = realloc(c->aliases[rank], (size_t)k * sizeof *grown);
        if (!grown) {
            abort_rank(c, rank, "out of memory");
            return CREW_OOM();
        }
        c->aliases[rank] = grown;
        c->alias_cap[rank] = k;
    }
    for (int j = 0; j < k; j++)
        CREW_TRY(resolve(c, rank, in[j], n, CREW_COMM_F32, what, (void **)&c->aliases[rank][j]));
    c->parts[rank] = c->aliases[rank];
    return resolve(c, rank, out, n, CREW_COMM_F32, what, &c->buf[rank]);
}

/* Elements [lo, hi) summed over every rank's k inputs in (rank, index) order, into the outputs
 * of ranks [first, last). */
static void ordered_range(const struct crew_local_comm *c, int k, int64_t lo, int64_t hi, int first, int last)
{
    float acc[REDUCE_BLOCK];
    for (int64_t b = lo; b < hi; b += REDUCE_BLOCK) {
        int64_t m = hi - b < REDUCE_BLOCK ? hi - b : REDUCE_BLOCK;
        memcpy(acc, c->parts[0][0] + b, (size_t)m * sizeof(float));
        for (int q = 0; q < c->size; q++)
            for (int j = q == 0 ? 1 : 0; j < k; j++) {
                const float *src = c->parts[q][j] + b;
                for (int64_t i = 0; i < m; i++) acc[i] += src[i];
            }
        for (int q = first; q < last; q++) memcpy((float *)c->buf[q] + b, acc, (size_t)m * sizeof(float));
    }
}

static crew_status local_allreduce_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                           double timeout_s)
{
    struct crew_local_comm *c = ctx;
    CREW_TRY(post_ordered(c, rank, in, k, out, n, "all-reduce"));
    CREW_TRY(barrier(c, rank, timeout_s, "all-reduce"));
    int64_t lo, hi;
    chunk(n, c->size, rank, &lo, &hi);
    ordered_range(c, k, lo, hi, 0, c->size);
    return barrier(c, rank, timeout_s, "all-reduce");
}

/* The same sums, each rank computing and receiving only its own range: what an all-reduce writes
 * into every rank's buffer, written into one. */
static crew_status local_reduce_scatter_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                                const int64_t *bounds, double timeout_s)
{
    struct crew_local_comm *c = ctx;
    CREW_TRY(post_ordered(c, rank, in, k, out, n, "reduce-scatter"));
    CREW_TRY(barrier(c, rank, timeout_s, "reduce-scatter"));
    ordered_range(c, k, bounds[rank], bounds[rank + 1], rank, rank + 1);
    return barrier(c, rank, timeout_s, "reduce-scatter");
}

/* Each rank copies every other rank's range of buf into its own. */
static crew_status local_allgather_ranges(void *ctx, int rank, float *buf, int64_t n, const int64_t *bounds,
                                          double timeout_s)
{
    struct crew_local_comm *c = ctx;
    if (c->size == 1) return CREW_OK;
    CREW_TRY(resolve(c, rank, buf, n, CREW_COMM_F32, "all-gather", &c->buf[rank]));
    CREW_TRY(barrier(c, rank, timeout_s, "all-gather"));
    float *mine = c->buf[rank];
    for (int q = 0; q < c->size; q++)
        if (q != rank && bounds[q + 1] > bounds[q])
            memcpy(mine + bounds[q], (const float *)c->buf[q] + bounds[q], (size_t)(bounds[q + 1] - bounds[q]) * sizeof(float));
    return barrier(c, rank, timeout_s, "all-gather");
}

static crew_status local_barrier(void *ctx, int rank, double timeout_s)
{
    return barrier(ctx, rank, timeout_s, "barrier");
}

static void abort_rank(struct crew_local_comm *c, int rank, const char *why)
{
    pthread_mutex_lock(&c->mu);
    if (c->failed_rank < 0) {
        c->failed_rank = rank;
        snprintf(c->failure, sizeof c->failure, "rank %d failed and left the run%s%.200s", rank, why ? ": " : "",
                 why ? why : "");
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void local_abort(void *ctx, int rank) { abort_rank(ctx, rank, NULL); }

int crew_local_comm_failed(crew_local_comm *lc, char *why, size_t len)
{
    if (atomic_load(&lc->failed_rank) < 0) return 0;
    pthread_mutex_lock(&lc->mu);
    snprintf(why, len, "%s", lc->failure);
    pthread_mutex_unlock(&lc->mu);
    return 1;
}

crew_status crew_comm_no_p2p(const crew_comm *c)
{
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "rank %d: the %s communicator has no point-to-point sends (a "
                       "pipeline's stages need them)", c->rank, c->ops->name);
}

/* ---- for communicators layered over this one (comm_mpi.c) */

crew_status crew_local_comm_host(crew_local_comm *lc, int rank, const void *p, int64_t n, crew_comm_type t,
                                 const char *what, void **out)
{
    return resolve(lc, rank, p, n, t, what, out);
}

void crew_local_comm_fail(crew_local_comm *lc, int rank, const char *why) { abort_rank(lc, rank, why); }

crew_status crew_local_comm_lead(crew_local_comm *lc, int rank, void *mine, crew_local_leader_fn leader, void *user,
                                 double timeout_s, double wait_s, const char *what)
{
    lc->buf[rank] = mine;
    if (lc->size > 1) CREW_TRY(barrier(lc, rank, timeout_s, what));
    if (rank == 0) {
        crew_status s = leader(user, lc->buf);
        if (s) {
            abort_rank(lc, 0, crew_status_message(s));
            return s;
        }
    }
    return lc->size > 1 ? barrier(lc, rank, rank == 0 ? timeout_s : wait_s, what) : CREW_OK;
}

/* ---- point to point. A send copies the buffer into the receiver's mailbox and returns at once
 * (buffered, as MPI's eager sends): two neighbouring pipeline stages may both send before either
 * receives without a deadlock. A receive takes the oldest message from that sender, waiting for
 * it at most timeout_s; its tag and size must be the ones expected, so a schedule that lost step
 * with its neighbour fails at once, naming both, instead of mixing up micro-batches. */

static crew_status p2p_check(const struct crew_local_comm *c, int rank, int peer, const char *what)
{
    if (peer < 0 || peer >= c->size || peer == rank)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s on rank %d: peer %d is not another rank of %d", what, rank,
                           peer, c->size);
    return CREW_OK;
}

static crew_status local_send(void *ctx, int rank, const void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                              double timeout_s)
{
    (void)timeout_s; /* a buffered send never waits */
    struct crew_local_comm *c = ctx;
    CREW_TRY(p2p_check(c, rank, peer, "send"));
    void *from;
    CREW_TRY(resolve(c, rank, buf, n, t, "send", &from));
    size_t bytes = (size_t)n * type_size(t);
    p2p_msg *msg = malloc(sizeof *msg + bytes);
    if (!msg) {
        abort_rank(c, rank, "out of memory");
        return CREW_OOM();
    }
    msg->next = NULL;
    msg->tag = tag;
    msg->n = n;
    msg->type = t;
    if (bytes) memcpy(msg->data, from, bytes);
    pthread_mutex_lock(&c->mu);
    crew_status s = CREW_OK;
    if (c->failed_rank >= 0) {
        s = crew_errorf(CREW_CODE_TIMEOUT, "send on rank %d: %s", rank, c->failure);
    } else if (!c->head && (!(c->head = calloc((size_t)c->size * (size_t)c->size, sizeof *c->head)) ||
                            !(c->tail = calloc((size_t)c->size * (size_t)c->size, sizeof *c->tail)))) {
        s = CREW_OOM();
    } else {
        size_t box = (size_t)rank * (size_t)c->size + (size_t)peer;
        if (c->tail[box])
            c->tail[box]->next = msg;
        else
            c->head[box] = msg;
        c->tail[box] = msg;
        msg = NULL;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    free(msg);
    return s;
}

static crew_status local_recv(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                              double timeout_s)
{
    struct crew_local_comm *c = ctx;
    CREW_TRY(p2p_check(c, rank, peer, "receive"));
    void *into;
    CREW_TRY(resolve(c, rank, buf, n, t, "receive", &into));
    size_t box = (size_t)peer * (size_t)c->size + (size_t)rank;
    struct timespec deadline;
    crew_deadline_after(timeout_s, &deadline);
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    while ((!c->head || !c->head[box]) && c->failed_rank < 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
    p2p_msg *msg = c->head ? c->head[box] : NULL;
    crew_status s = CREW_OK;
    if (msg) {
        if (!(c->head[box] = msg->next)) c->tail[box] = NULL;
    } else if (c->failed_rank >= 0) {
        s = crew_errorf(CREW_CODE_TIMEOUT, "receive on rank %d from rank %d: %s", rank, peer, c->failure);
    } else {
        snprintf(c->failure, sizeof c->failure, "rank %d sent nothing to rank %d within %g s (message %d)", peer, rank,
                 timeout_s, tag);
        c->failed_rank = rank;
        pthread_cond_broadcast(&c->cv);
        s = crew_errorf(CREW_CODE_TIMEOUT, "receive on rank %d: %s", rank, c->failure);
    }
    pthread_mutex_unlock(&c->mu);
    if (!msg) return s;
    if (msg->tag != tag || msg->n != n || msg->type != t) {
        s = crew_errorf(CREW_CODE_INTERNAL, "receive on rank %d from rank %d: expected message %d of %lld values, got "
                        "message %d of %lld", rank, peer, tag, (long long)n, msg->tag, (long long)msg->n);
        abort_rank(c, rank, crew_status_message(s));
    } else if (n) {
        memcpy(into, msg->data, (size_t)n * type_size(t));
    }
    free(msg);
    return s;
}

static const crew_comm_ops local_ops = {
    .name = "local",
    .allreduce = local_allreduce,
    .broadcast = local_broadcast,
    .allgather = local_allgather,
    .reduce_scatter = local_reduce_scatter,
    .allreduce_ordered = local_allreduce_ordered,
    .reduce_scatter_ordered = local_reduce_scatter_ordered,
    .allgather_ranges = local_allgather_ranges,
    .barrier = local_barrier,
    .send = local_send,
    .recv = local_recv,
    .abort = local_abort,
};

crew_status crew_local_comm_create(int size, crew_local_comm **out)
{
    *out = NULL;
    if (size < 1 || size > 4096)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "communicator: size must be in [1, 4096], got %d", size);
    struct crew_local_comm *c = calloc(1, sizeof *c);
    if (!c) return CREW_OOM();
    c->size = size;
    c->failed_rank = -1;
    c->spin = size <= crew_cpu_cores();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->here = calloc((size_t)size, 1);
    c->buf = calloc((size_t)size, sizeof *c->buf);
    c->send = calloc((size_t)size, sizeof *c->send);
    c->parts = calloc((size_t)size, sizeof *c->parts);
    c->device = calloc((size_t)size, sizeof *c->device);
    c->aliases = calloc((size_t)size, sizeof *c->aliases);
    c->alias_cap = calloc((size_t)size, sizeof *c->alias_cap);
    if (!c->here || !c->buf || !c->send || !c->parts || !c->device || !c->aliases || !c->alias_cap) {
        crew_local_comm_free(c);
        return CREW_OOM();
    }
    *out = c;
    return CREW_OK;
}

crew_status crew_local_comm_attach(crew_local_comm *lc, int rank, const crew_backend *device)
{
    if (rank < 0 || rank >= lc->size)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "communicator: rank %d is not one of %d", rank, lc->size);
    if (device && !device->ops->host_alias)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "rank %d: the in-process communicator needs device memory that "
                           "host threads can reach, and device kind '%s' has none", rank, device->ops->name);
    lc->device[rank] = device;
    return CREW_OK;
}

crew_comm crew_local_comm_rank(crew_local_comm *lc, int rank)
{
    return (crew_comm){&local_ops, lc, rank, lc->size};
}

void crew_local_comm_free(crew_local_comm *c)
{
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->here);
    free(c->buf);
    free(c->send);
    free(c->parts);
    free(c->device);
    for (int r = 0; c->aliases && r < c->size; r++) free(c->aliases[r]);
    free(c->aliases);
    free(c->alias_cap);
    for (size_t b = 0; c->head && b < (size_t)c->size * (size_t)c->size; b++)
        for (p2p_msg *m = c->head[b], *next; m; m = next) {
            next = m->next;
            free(m);
        }
    free(c->head);
    free(c->tail);
    free(c);
}
