/* comm_mpi.c — the communicator across processes: threads within a process, MPI between them.
 *
 * Every collective has three phases. The T ranks of a process post their buffers (host addresses
 * of their device memory) and meet (crew_local_comm_lead); then local rank 0, the process's
 * leader, alone talks to the other processes' leaders and writes every local rank's result; then
 * they all leave. Only leaders call MPI, one thread per process at a time.
 *
 * The ordered all-reduce keeps the determinism contract across processes. Its inputs are the
 * L = T·k buffers of every process (T ranks, k micro-batches each), and its sum runs over
 * process 0's L inputs in order, then process 1's, and so on: global rank order, the order one
 * replica accumulating every micro-batch would add them in. It costs what a ring costs:
 *   1. all-to-all: process p receives every process's L inputs restricted to its chunk p of the
 *      n elements (n/P each);
 *   2. each process sums its chunk in that order;
 *   3. all-gather of the summed chunks.
 * With k = 1 and T = 1 each process sends and receives 2(P − 1)/P of the buffer, as a ring; with
 * L inputs per process, the all-to-all carries L times more (the order forbids adding a process's
 * inputs together before the others' are in). MPI_Allreduce would be faster to write but its
 * reduction order is the library's, and the bits would change with the process count.
 *
 * Plain all-reduce (the gradient buckets, the step's metrics) is the same algorithm with k = 1;
 * reduce-scatter is its first two phases with chunks aligned to the ranks' regions.
 *
 * Unordered (crew_mpi_comm_set_unordered, --allreduce fast): each process sums its own inputs in
 * order, then MPI_Iallreduce across the processes; as fast as the MPI library, whose order of the
 * sums (so the last bits) is its own and may change with the process count. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_mpi.h"
#include "comm/mpi/group.h"
#include "core/status.h"
#include "core/timer.h"

/* The leader waits for MPI up to the deadline; the other ranks wait for the leader that long and
 * a little more, so that the leader's message (naming the missing process) is the one they see. */
#define FOLLOWER_GRACE_S 2.0

/* A point-to-point message sent and not yet known to be delivered: its copy of the sender's
 * buffer (a header, then the values) and the requests sending it, a header and the values'
 * pieces. */
typedef struct outgoing {
    void *copy;
    MPI_Request *req;           /* [n_req] */
    int n_req;
} outgoing;

/* A local rank's sends in flight, tested and freed at its next send and at the end. */
typedef struct outbox {
    outgoing *items;            /* [n] */
    int n, cap;
    double timeout_s;           /* of the latest send: how long the end waits for those in flight */
} outbox;

struct crew_mpi_comm {
    struct crew_process_group *g;
    crew_local_comm *lc;
    int T;                      /* ranks per process */
    int unordered;              /* 1: across processes, MPI's own all-reduce (crew_mpi_comm_set_unordered) */
    int P, p;                   /* processes of the communicator; this one's place among them */
    int *procs;                 /* [P] each one's rank in the group */
    int id;                     /* crew_mpi_comm_create_subset's: its tags' offset */
    crew_group_requests reqs;   /* the leader's exchanges */
    outbox *out_box;            /* [T] each local rank's sends in flight */
    int tag_ub;                 /* MPI's largest tag */
    const char *unit;           /* what its errors call a rank (crew_mpi_comm_name_ranks) */
    /* the leader's scratch, grown on demand */
    void *pack;                 /* what this process sends: every peer's chunk of its inputs */
    void *in;                   /* what it receives: its chunk of every process's inputs */
    void *out;                  /* the summed result: [n] */
    size_t pack_cap, in_cap, out_cap;
    const void **send;          /* [P] per-peer pointers and sizes of one exchange */
    void **recv;
    size_t *send_bytes, *recv_bytes;
    int64_t *bounds;            /* [P + 1] the chunks of the current collective */
    char *tokens;               /* [P] the barrier's received bytes (receive buffers may not overlap) */
    /* each local rank's own: the host addresses of its ordered all-reduce's inputs, grown on demand */
    float ***parts;             /* [T] */
    int *parts_cap;             /* [T] */
};

/* What a local rank posts for the leader. */
typedef struct post {
    void *buf;                  /* allreduce, broadcast: in and out; reduce-scatter, allgather: out */
    const void *send;           /* reduce-scatter, allgather: the rank's input */
    float **parts;              /* allreduce_ordered: its k inputs */
    int k;
} post;

typedef struct job {
    struct crew_mpi_comm *mc;
    int64_t n;                  /* elements per rank: of buf (allreduce), of recv (reduce-scatter), of send (allgather) */
    crew_comm_type t;
    crew_reduce_op op;
    int root;                   /* broadcast: global rank */
    double timeout_s;
    const char *what;
} job;

static size_t elem(crew_comm_type t) { return t == CREW_COMM_F64 ? 8 : 4; }

static int grow(void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return 1;
    void *q = realloc(*p, bytes);
    if (!q) return 0;
    *p = q;
    *cap = bytes;
    return 1;
}

static crew_status exchange(struct crew_mpi_comm *mc, int tag, const job *j)
{
    return crew_group_exchange(mc->g, &mc->reqs, mc->P, mc->procs, mc->send, mc->send_bytes, (void *const *)mc->recv,
                               mc->recv_bytes, tag + CREW_TAG_COMM_STRIDE * mc->id, j->timeout_s, mc->T, mc->unit,
                               j->what);
}

static void clear_plan(struct crew_mpi_comm *mc)
{
    memset(mc->send_bytes, 0, (size_t)mc->P * sizeof *mc->send_bytes);
    memset(mc->recv_bytes, 0, (size_t)mc->P * sizeof *mc->recv_bytes);
}

/* Input l (0 ≤ l < L) of this process: local rank l / k's input l % k. */
static const char *input(void *const *posted, int k, int l)
{
    const post *ps = posted[l / k];
    return ps->parts ? (const char *)ps->parts[l % k] : (const char *)(ps->send ? ps->send : ps->buf);
}

/* acc[0..m) = Σ over processes q < P, then inputs l, of src(q, l)[0..m), in that order (a left fold:
 * the first term is copied, each later one added), then × scale when scale ≠ 1; process `self`'s
 * inputs are this process's own (from lo on), the others' are in mc->in. P = 1, self = 0: this
 * process's inputs alone (the fast path's local sum). A block of FOLD_BLOCK
 * values at a time, so that acc stays in cache while every input passes over it: the same bits as
 * one pass per input over the whole chunk, at one read of each input and one write of acc. */
#define FOLD_BLOCK 2048
#define DEFINE_FOLD(name, T)                                                                              \
    static void name(const struct crew_mpi_comm *mc, int P, int self, void *const *posted, int L, int k,  \
                     int64_t lo, int64_t m, T *acc, T scale)                                              \
    {                                                                                                     \
        for (int64_t b = 0; b < m; b += FOLD_BLOCK) {                                                     \
            const int64_t nb = m - b < FOLD_BLOCK ? m - b : FOLD_BLOCK;                                   \
            T *out = acc + b;                                                                             \
            int first = 1;                                                                                \
            for (int q = 0; q < P; q++)                                                                   \
                for (int l = 0; l < L; l++) {                                                             \
                    const T *src = (q == self ? (const T *)input(posted, k, l) + lo                       \
                                               : (const T *)mc->in + ((size_t)q * (size_t)L + (size_t)l) * (size_t)m) + b; \
                    if (first)                                                                            \
                        memcpy(out, src, (size_t)nb * sizeof(T));                                         \
                    else                                                                                  \
                        for (int64_t i = 0; i < nb; i++) out[i] += src[i];                                \
                    first = 0;                                                                            \
                }                                                                                         \
            if (scale != (T)1)                                                                            \
                for (int64_t i = 0; i < nb; i++) out[i] *= scale;                                         \
        }                                                                                                 \
    }
DEFINE_FOLD(fold_f32, float)
DEFINE_FOLD(fold_f64, double)

/* Phases 1 and 2: this process's chunk [bounds[p], bounds[p+1]) of the ordered sum of every
 * process's L inputs, into mc->out (at offset 0). */
static crew_status reduce_chunk(struct crew_mpi_comm *mc, void *const *posted, int k, const int64_t *bounds,
                                const job *j)
{
    const int L = mc->T * k;
    const size_t es = elem(j->t);
    const int64_t lo = bounds[mc->p], m = bounds[mc->p + 1] - lo;
    size_t pack_bytes = 0;
    for (int q = 0; q < mc->P; q++)
        if (q != mc->p) pack_bytes += (size_t)L * (size_t)(bounds[q + 1] - bounds[q]) * es;
    if (!grow(&mc->pack, &mc->pack_cap, pack_bytes + 1) || !grow(&mc->in, &mc->in_cap, (size_t)mc->P * L * m * es + 1) ||
        !grow(&mc->out, &mc->out_cap, (size_t)m * es + 1))
        return CREW_OOM();
    clear_plan(mc);
    char *at = mc->pack;
    for (int q = 0; q < mc->P; q++) {
        if (q == mc->p) continue;
        const int64_t qlo = bounds[q], qm = bounds[q + 1] - qlo;
        mc->send_bytes[q] = (size_t)L * (size_t)qm * es;
        if (L == 1) { /* one input: its chunk q is contiguous already, send it where it lies */
            mc->send[q] = input(posted, k, 0) + (size_t)qlo * es;
        } else {
            mc->send[q] = at;
            for (int l = 0; l < L; l++, at += (size_t)qm * es)
                memcpy(at, input(posted, k, l) + (size_t)qlo * es, (size_t)qm * es);
        }
        mc->recv[q] = (char *)mc->in + (size_t)q * L * m * es;
        mc->recv_bytes[q] = (size_t)L * (size_t)m * es;
    }
    CREW_TRY(exchange(mc, CREW_TAG_REDUCE, j));
    const int avg = j->op == CREW_REDUCE_AVG;
    const int ranks = mc->P * mc->T;
    if (j->t == CREW_COMM_F32)
        fold_f32(mc, mc->P, mc->p, posted, L, k, lo, m, mc->out, avg ? 1.0f / (float)ranks : 1.0f);
    else
        fold_f64(mc, mc->P, mc->p, posted, L, k, lo, m, mc->out, avg ? 1.0 / (double)ranks : 1.0);
    return CREW_OK;
}

/* Phase 3: every process's summed chunk into local rank 0's buffer, then into every local rank's. */
static crew_status gather_chunks(struct crew_mpi_comm *mc, void *const *posted, const int64_t *bounds, const job *j)
{
    const size_t es = elem(j->t);
    char *full = ((post *)posted[0])->buf;
    clear_plan(mc);
    for (int q = 0; q < mc->P; q++) {
        if (q == mc->p) continue;
        mc->send[q] = mc->out;
        mc->send_bytes[q] = (size_t)(bounds[mc->p + 1] - bounds[mc->p]) * es;
        mc->recv[q] = full + (size_t)bounds[q] * es;
        mc->recv_bytes[q] = (size_t)(bounds[q + 1] - bounds[q]) * es;
    }
    CREW_TRY(exchange(mc, CREW_TAG_GATHER, j));
    memcpy(full + (size_t)bounds[mc->p] * es, mc->out, (size_t)(bounds[mc->p + 1] - bounds[mc->p]) * es);
    for (int t = 1; t < mc->T; t++) memcpy(((post *)posted[t])->buf, full, (size_t)j->n * es);
    return CREW_OK;
}

/* mc->bounds: process q's chunk starts at q · per_process · n / divisor. */
static const int64_t *set_bounds(struct crew_mpi_comm *mc, int64_t n, int64_t per_process, int64_t divisor)
{
    for (int q = 0; q <= mc->P; q++) mc->bounds[q] = n * q * per_process / divisor;
    return mc->bounds;
}

/* The fast path: this process's T·k inputs summed in order (the fold over one process), then MPI's
 * own all-reduce across the processes, in place, and the result to every rank. */
static crew_status lead_allreduce_unordered(struct crew_mpi_comm *mc, void *const *posted, int k, const job *j)
{
    const size_t es = elem(j->t);
    const int L = mc->T * k;
    char *first = ((post *)posted[0])->buf;
    /* one input that is also the output (a plain all-reduce of one replica): MPI works in place */
    char *sum = L == 1 && input(posted, k, 0) == first ? first : NULL;
    if (!sum) {
        if (!grow(&mc->out, &mc->out_cap, (size_t)j->n * es + 1)) return CREW_OOM();
        sum = mc->out;
        if (j->t == CREW_COMM_F32)
            fold_f32(mc, 1, 0, posted, L, k, 0, j->n, (float *)sum, 1.0f);
        else
            fold_f64(mc, 1, 0, posted, L, k, 0, j->n, (double *)sum, 1.0);
    }
    CREW_TRY(crew_group_allreduce_sum(mc->g, sum, j->n, j->t == CREW_COMM_F64, j->timeout_s, j->what));
    if (j->op == CREW_REDUCE_AVG) {
        const int ranks = mc->P * mc->T;
        if (j->t == CREW_COMM_F32)
            for (int64_t i = 0; i < j->n; i++) ((float *)sum)[i] *= 1.0f / (float)ranks;
        else
            for (int64_t i = 0; i < j->n; i++) ((double *)sum)[i] *= 1.0 / (double)ranks;
    }
    for (int t = 0; t < mc->T; t++)
        if (((post *)posted[t])->buf != sum) memcpy(((post *)posted[t])->buf, sum, (size_t)j->n * es);
    return CREW_OK;
}

static crew_status lead_allreduce(void *user, void *const *posted)
{
    const job *j = user;
    struct crew_mpi_comm *mc = j->mc;
    int k = ((post *)posted[0])->parts ? ((post *)posted[0])->k : 1;
    for (int t = 1; t < mc->T; t++)
        if ((((post *)posted[t])->parts ? ((post *)posted[t])->k : 1) != k)
            return crew_errorf(CREW_CODE_INTERNAL, "%s: the ranks of MPI rank %d passed different numbers of inputs",
                               j->what, mc->p);
    if (mc->unordered) return lead_allreduce_unordered(mc, posted, k, j);
    const int64_t *bounds = set_bounds(mc, j->n, 1, mc->P); /* n/P each */
    CREW_TRY(reduce_chunk(mc, posted, k, bounds, j));
    return gather_chunks(mc, posted, bounds, j);
}

static crew_status run(struct crew_mpi_comm *mc, int rank, post *mine, crew_local_leader_fn fn, job *j)
{
    j->mc = mc;
    return crew_local_comm_lead(mc->lc, rank - mc->p * mc->T, mine, fn, j, j->timeout_s,
                                j->timeout_s + FOLLOWER_GRACE_S, j->what);
}

static crew_status host(struct crew_mpi_comm *mc, int rank, const void *p, int64_t n, crew_comm_type t,
                        const char *what, void **out)
{
    return crew_local_comm_host(mc->lc, rank - mc->p * mc->T, p, n, t, what, out);
}

static crew_status mpi_allreduce(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, crew_reduce_op op,
                                 double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    post mine = {0};
    CREW_TRY(host(mc, rank, buf, n, t, "all-reduce", &mine.buf));
    job j = {.n = n, .t = t, .op = op, .timeout_s = timeout_s, .what = "all-reduce"};
    return run(mc, rank, &mine, lead_allreduce, &j);
}

static crew_status mpi_allreduce_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                         double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    if (k < 1) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "all-reduce: %d inputs on rank %d", k, rank);
    const int local = rank - mc->p * mc->T;
    if (k > mc->parts_cap[local]) { /* the rank's own slot: no other thread touches it before the meeting */
        float **grown = realloc(mc->parts[local], (size_t)k * sizeof *grown);
        if (!grown) return CREW_OOM();
        mc->parts[local] = grown;
        mc->parts_cap[local] = k;
    }
    float **parts = mc->parts[local];
    post mine = {.parts = parts, .k = k};
    crew_status s = CREW_OK;
    for (int i = 0; i < k && !s; i++) s = host(mc, rank, in[i], n, CREW_COMM_F32, "all-reduce", (void **)&parts[i]);
    if (!s) s = host(mc, rank, out, n, CREW_COMM_F32, "all-reduce", &mine.buf);
    job j = {.n = n, .t = CREW_COMM_F32, .op = CREW_REDUCE_SUM, .timeout_s = timeout_s, .what = "all-reduce"};
    if (!s) s = run(mc, rank, &mine, lead_allreduce, &j);
    return s;
}

static crew_status lead_reduce_scatter(void *user, void *const *posted)
{
    const job *j = user;
    struct crew_mpi_comm *mc = j->mc;
    const int64_t *bounds = set_bounds(mc, j->n, mc->T, 1); /* process q's ranks' regions */
    CREW_TRY(reduce_chunk(mc, posted, 1, bounds, j));
    for (int t = 0; t < mc->T; t++)
        memcpy(((post *)posted[t])->buf, (char *)mc->out + (size_t)t * (size_t)j->n * elem(j->t),
               (size_t)j->n * elem(j->t));
    return CREW_OK;
}

static crew_status mpi_reduce_scatter(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                      crew_reduce_op op, double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    post mine = {0};
    int64_t size = (int64_t)mc->P * mc->T;
    CREW_TRY(host(mc, rank, send, n * size, t, "reduce-scatter", (void **)&mine.send));
    CREW_TRY(host(mc, rank, recv, n, t, "reduce-scatter", &mine.buf));
    job j = {.n = n, .t = t, .op = op, .timeout_s = timeout_s, .what = "reduce-scatter"};
    return run(mc, rank, &mine, lead_reduce_scatter, &j);
}

static crew_status lead_broadcast(void *user, void *const *posted)
{
    const job *j = user;
    struct crew_mpi_comm *mc = j->mc;
    const size_t bytes = (size_t)j->n * elem(j->t);
    const int from = j->root / mc->T, root_local = j->root % mc->T;
    char *src = ((post *)posted[from == mc->p ? root_local : 0])->buf;
    clear_plan(mc);
    if (from == mc->p) {
        for (int q = 0; q < mc->P; q++)
            if (q != mc->p) {
                mc->send[q] = src;
                mc->send_bytes[q] = bytes;
            }
    } else {
        mc->recv[from] = src;
        mc->recv_bytes[from] = bytes;
    }
    CREW_TRY(exchange(mc, CREW_TAG_BROADCAST, j));
    for (int t = 0; t < mc->T; t++)
        if (((post *)posted[t])->buf != src) memcpy(((post *)posted[t])->buf, src, bytes);
    return CREW_OK;
}

static crew_status mpi_broadcast(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int root,
                                 double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    if (root < 0 || root >= mc->P * mc->T)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "broadcast: root %d is not a rank of %d", root, mc->P * mc->T);
    post mine = {0};
    CREW_TRY(host(mc, rank, buf, n, t, "broadcast", &mine.buf));
    job j = {.n = n, .t = t, .root = root, .timeout_s = timeout_s, .what = "broadcast"};
    return run(mc, rank, &mine, lead_broadcast, &j);
}

static crew_status lead_allgather(void *user, void *const *posted)
{
    const job *j = user;
    struct crew_mpi_comm *mc = j->mc;
    const size_t bytes = (size_t)j->n * elem(j->t), block = (size_t)mc->T * bytes;
    char *all = ((post *)posted[0])->buf; /* [P·T·n]: local rank 0's receive buffer */
    for (int t = 0; t < mc->T; t++) memmove(all + (size_t)mc->p * block + (size_t)t * bytes, ((post *)posted[t])->send, bytes);
    clear_plan(mc);
    for (int q = 0; q < mc->P; q++) {
        if (q == mc->p) continue;
        mc->send[q] = all + (size_t)mc->p * block;
        mc->send_bytes[q] = block;
        mc->recv[q] = all + (size_t)q * block;
        mc->recv_bytes[q] = block;
    }
    CREW_TRY(exchange(mc, CREW_TAG_GATHER, j));
    for (int t = 1; t < mc->T; t++) memcpy(((post *)posted[t])->buf, all, (size_t)mc->P * block);
    return CREW_OK;
}

static crew_status mpi_allgather(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                 double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    post mine = {0};
    CREW_TRY(host(mc, rank, send, n, t, "all-gather", (void **)&mine.send));
    CREW_TRY(host(mc, rank, recv, n * mc->P * mc->T, t, "all-gather", &mine.buf));
    job j = {.n = n, .t = t, .timeout_s = timeout_s, .what = "all-gather"};
    return run(mc, rank, &mine, lead_allgather, &j);
}

static crew_status lead_barrier(void *user, void *const *posted)
{
    (void)posted;
    const job *j = user;
    struct crew_mpi_comm *mc = j->mc;
    static const char token = 1;
    clear_plan(mc);
    for (int q = 0; q < mc->P; q++) {
        if (q == mc->p) continue;
        mc->send[q] = &token;
        mc->send_bytes[q] = 1;
        mc->recv[q] = mc->tokens + q;
        mc->recv_bytes[q] = 1;
    }
    return exchange(mc, CREW_TAG_BARRIER, j);
}

static crew_status mpi_barrier(void *ctx, int rank, double timeout_s)
{
    post mine = {0};
    job j = {.timeout_s = timeout_s, .what = "barrier"};
    return run(ctx, rank, &mine, lead_barrier, &j);
}

static void mpi_abort(void *ctx, int rank)
{
    struct crew_mpi_comm *mc = ctx;
    char why[64];
    snprintf(why, sizeof why, "rank %d failed", rank);
    crew_local_comm_fail(mc->lc, rank - mc->p * mc->T, why);
}

/* ---- point to point (pipeline stages). Between two ranks of one process: the in-process
 * communicator's mailboxes. Across processes: a send copies the values behind a header (sender,
 * receiver, tag, count, type) and posts MPI_Isend of both, in pieces of at most P2P_PIECE bytes,
 * and returns at once, as the in-process send does; the copy is freed once MPI says the send is
 * complete (tested at the rank's next send, and waited for at the end). The MPI tag says which
 * local ranks talk (CREW_TAG_P2P + (id·T + receiver)·T + sender), so that a receiving thread
 * meets only its own messages, in the order sent (MPI never reorders messages of one source and
 * tag). A receive probes for the header (MPI_Improbe, polled against the deadline, one call at a
 * time under the group's lock), checks it against what it expects, then receives the values. */

#define P2P_PIECE ((size_t)1 << 30)
#define P2P_SPIN_S 300e-6
#define P2P_MAX_NAP_NS 200000L

typedef struct p2p_header {
    int32_t sender, receiver, tag, type;
    int64_t n;
} p2p_header;

static void group_lock(struct crew_mpi_comm *mc) { pthread_mutex_lock(&mc->g->lock); }
static void group_unlock(struct crew_mpi_comm *mc) { pthread_mutex_unlock(&mc->g->lock); }

/* The MPI tag of a message from local rank `from` to local rank `to`, or an error when MPI's
 * tags do not reach it (MPI promises 32767; Open MPI and MPICH give far more). */
static crew_status p2p_tag(const struct crew_mpi_comm *mc, int to, int from, int *tag)
{
    long long t = CREW_TAG_P2P + ((long long)mc->id * mc->T + to) * mc->T + from;
    if (t > mc->tag_ub)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "point-to-point across processes: %d ranks per process need MPI "
                           "tags up to %lld, this MPI stops at %d", mc->T, t, mc->tag_ub);
    *tag = (int)t;
    return CREW_OK;
}

/* Polls until every request of req[n] is complete (*done = 1), or the deadline passes (*done = 0). */
static crew_status poll_requests(struct crew_mpi_comm *mc, int n, MPI_Request *req, double deadline, int *done,
                                 const char *what)
{
    long nap = 1000;
    const double spin_until = crew_now() + P2P_SPIN_S;
    for (;;) {
        int flag = 0;
        group_lock(mc);
        int rc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
        group_unlock(mc);
        if (rc != MPI_SUCCESS) return crew_group_mpi_error(mc->g, rc, what);
        if (flag || crew_now() >= deadline) {
            *done = flag;
            return CREW_OK;
        }
        if (crew_now() >= spin_until) {
            struct timespec ts = {0, nap};
            nanosleep(&ts, NULL);
            if (nap < P2P_MAX_NAP_NS) nap *= 2;
        }
    }
}

/* Frees the sends of `box` that are complete; with wait_s > 0, waits that long for the others,
 * and leaves any still open to the process's end (MPI may read their copies until then). */
static crew_status reap(struct crew_mpi_comm *mc, outbox *box, double wait_s)
{
    const double deadline = crew_now() + wait_s;
    int kept = 0;
    crew_status s = CREW_OK;
    for (int i = 0; i < box->n; i++) {
        outgoing *o = &box->items[i];
        int done = 0;
        if (!s) s = poll_requests(mc, o->n_req, o->req, wait_s > 0 ? deadline : 0.0, &done, "send");
        if (done) {
            free(o->copy);
            free(o->req);
        } else {
            box->items[kept++] = *o;
        }
    }
    box->n = kept;
    return s;
}

/* The local rank and process of global rank g. */
static int local_of(const struct crew_mpi_comm *mc, int g) { return g % mc->T; }
static int process_of(const struct crew_mpi_comm *mc, int g) { return g / mc->T; }

static crew_status p2p_check(const struct crew_mpi_comm *mc, int rank, int peer, const char *what)
{
    if (peer < 0 || peer >= mc->P * mc->T || peer == rank)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s on rank %d: peer %d is not another rank of %d", what, rank,
                           peer, mc->P * mc->T);
    return CREW_OK;
}

/* Where a message between `rank` and `peer` goes: within this process (local: the in-process
 * communicator's handle of local rank `me` takes it), or over MPI with tag mtag from or into the
 * host address of buf. */
typedef struct route {
    int me, peer_local, peer_process, local, mtag;
    void *host;
} route;

static crew_status p2p_route(struct crew_mpi_comm *mc, int rank, int peer, const void *buf, int64_t n, crew_comm_type t,
                             int sending, route *r)
{
    const char *what = sending ? "send" : "receive";
    CREW_TRY(p2p_check(mc, rank, peer, what));
    *r = (route){.me = local_of(mc, rank), .peer_local = local_of(mc, peer), .peer_process = process_of(mc, peer)};
    r->local = r->peer_process == mc->p;
    if (r->local) return CREW_OK;
    CREW_TRY(sending ? p2p_tag(mc, r->peer_local, r->me, &r->mtag) : p2p_tag(mc, r->me, r->peer_local, &r->mtag));
    return host(mc, rank, buf, n, t, what, &r->host);
}

static crew_status mpi_send(void *ctx, int rank, const void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                            double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    route r;
    CREW_TRY(p2p_route(mc, rank, peer, buf, n, t, 1, &r));
    if (r.local) {
        crew_comm l = crew_local_comm_rank(mc->lc, r.me);
        return l.ops->send(l.ctx, r.me, buf, n, t, r.peer_local, tag, timeout_s);
    }
    const int me = r.me, to = r.peer_process, mtag = r.mtag;
    const void *from = r.host;
    outbox *box = &mc->out_box[me];
    CREW_TRY(reap(mc, box, 0.0));
    if (box->n == box->cap) {
        int cap = box->cap ? 2 * box->cap : 8;
        outgoing *grown = realloc(box->items, (size_t)cap * sizeof *grown);
        if (!grown) return CREW_OOM();
        box->items = grown;
        box->cap = cap;
    }
    const size_t bytes = (size_t)n * elem(t);
    const int pieces = (int)((bytes + P2P_PIECE - 1) / P2P_PIECE);
    outgoing o = {.copy = malloc(sizeof(p2p_header) + bytes), .req = calloc((size_t)pieces + 1, sizeof(MPI_Request)),
                  .n_req = pieces + 1};
    if (!o.copy || !o.req) {
        free(o.copy);
        free(o.req);
        return CREW_OOM();
    }
    p2p_header h = {.sender = rank, .receiver = peer, .tag = tag, .type = (int32_t)t, .n = n};
    memcpy(o.copy, &h, sizeof h);
    char *values = (char *)o.copy + sizeof h;
    if (bytes) memcpy(values, from, bytes);
    int rc = MPI_SUCCESS;
    group_lock(mc);
    rc = MPI_Isend(o.copy, (int)sizeof h, MPI_BYTE, mc->procs[to], mtag, mc->g->comm, &o.req[0]);
    for (int i = 0; i < pieces && rc == MPI_SUCCESS; i++) {
        size_t off = (size_t)i * P2P_PIECE, len = bytes - off < P2P_PIECE ? bytes - off : P2P_PIECE;
        rc = MPI_Isend(values + off, (int)len, MPI_BYTE, mc->procs[to], mtag, mc->g->comm, &o.req[1 + i]);
    }
    group_unlock(mc);
    if (rc != MPI_SUCCESS) return crew_group_mpi_error(mc->g, rc, "send"); /* its copy stays: MPI may read it */
    box->items[box->n++] = o;
    box->timeout_s = timeout_s;
    return CREW_OK;
}

/* A failed receive: the reason poisons this process's ranks and the group, so that nothing else
 * waits for the run. */
static crew_status recv_failed(struct crew_mpi_comm *mc, int me, const char *why)
{
    crew_local_comm_fail(mc->lc, me, why);
    return crew_group_fail(mc->g, why);
}

static crew_status mpi_recv(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                            double timeout_s)
{
    struct crew_mpi_comm *mc = ctx;
    route r;
    CREW_TRY(p2p_route(mc, rank, peer, buf, n, t, 0, &r));
    if (r.local) {
        crew_comm l = crew_local_comm_rank(mc->lc, r.me);
        return l.ops->recv(l.ctx, r.me, buf, n, t, r.peer_local, tag, timeout_s);
    }
    const int me = r.me, from = r.peer_process, mtag = r.mtag;
    void *into = r.host;
    const double deadline = crew_now() + timeout_s;
    const double spin_until = crew_now() + P2P_SPIN_S;
    long nap = 1000;
    p2p_header h;
    char why[400], who[160];
    for (;;) {
        int flag = 0, failed = 0;
        MPI_Message msg;
        MPI_Status st;
        group_lock(mc);
        int rc = MPI_Improbe(mc->procs[from], mtag, mc->g->comm, &flag, &msg, &st);
        if (rc == MPI_SUCCESS && flag) rc = MPI_Mrecv(&h, (int)sizeof h, MPI_BYTE, &msg, &st);
        failed = mc->g->failed;
        if (failed) snprintf(why, sizeof why, "receive on rank %d from rank %d: %s", rank, peer, mc->g->failure);
        group_unlock(mc);
        if (rc != MPI_SUCCESS) return crew_group_mpi_error(mc->g, rc, "receive");
        if (flag) break;
        if (failed) return crew_errorf(CREW_CODE_TIMEOUT, "%s", why);
        char local_why[256];
        if (crew_local_comm_failed(mc->lc, local_why, sizeof local_why))
            return crew_errorf(CREW_CODE_TIMEOUT, "receive on rank %d from rank %d: %s", rank, peer, local_why);
        if (crew_now() >= deadline) {
            crew_group_name(mc->g, mc->procs[from], who, sizeof who);
            snprintf(why, sizeof why, "receive on rank %d: rank %d (%s) sent nothing to rank %d within %g s (message %d)",
                     rank, peer, who, rank, timeout_s, tag);
            return recv_failed(mc, me, why);
        }
        if (crew_now() >= spin_until) {
            struct timespec ts = {0, nap};
            nanosleep(&ts, NULL);
            if (nap < P2P_MAX_NAP_NS) nap *= 2;
        }
    }
    if (h.sender != peer || h.receiver != rank || h.tag != tag || h.n != n || h.type != (int32_t)t) {
        snprintf(why, sizeof why, "receive on rank %d from rank %d: expected message %d of %lld values, got message %d "
                 "of %lld from rank %d to rank %d", rank, peer, tag, (long long)n, h.tag, (long long)h.n, h.sender,
                 h.receiver);
        recv_failed(mc, me, why);
        return crew_errorf(CREW_CODE_INTERNAL, "%s", why);
    }
    const size_t bytes = (size_t)n * elem(t);
    const int pieces = (int)((bytes + P2P_PIECE - 1) / P2P_PIECE);
    if (!pieces) return CREW_OK;
    MPI_Request *req = calloc((size_t)pieces, sizeof *req);
    if (!req) return CREW_OOM();
    int rc = MPI_SUCCESS, done = 0;
    group_lock(mc);
    for (int i = 0; i < pieces && rc == MPI_SUCCESS; i++) {
        size_t off = (size_t)i * P2P_PIECE, len = bytes - off < P2P_PIECE ? bytes - off : P2P_PIECE;
        rc = MPI_Irecv((char *)into + off, (int)len, MPI_BYTE, mc->procs[from], mtag, mc->g->comm, &req[i]);
    }
    group_unlock(mc);
    crew_status s = rc == MPI_SUCCESS ? poll_requests(mc, pieces, req, deadline, &done, "receive")
                                      : crew_group_mpi_error(mc->g, rc, "receive");
    if (!s && !done) {
        crew_group_name(mc->g, mc->procs[from], who, sizeof who);
        snprintf(why, sizeof why, "receive on rank %d: the values of message %d from rank %d (%s) did not arrive within "
                 "%g s", rank, tag, peer, who, timeout_s);
        s = recv_failed(mc, me, why);
    }
    if (done) free(req); /* else open requests may still write: left to the process's end */
    return s;
}

static const crew_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .allreduce_ordered = mpi_allreduce_ordered,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .abort = mpi_abort,
};

crew_status crew_mpi_comm_create_subset(const crew_process_group *g, crew_local_comm *lc, int local_size,
                                        const int *members, int n_members, int id, crew_mpi_comm **out)
{
    *out = NULL;
    if (id < 0 || id >= CREW_TAG_COMM_IDS || n_members < 1 || local_size < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "MPI communicator: id %d (0 to %d), %d processes, %d ranks each",
                           id, CREW_TAG_COMM_IDS - 1, n_members, local_size);
    int self = -1;
    for (int q = 0; q < n_members; q++) {
        if (members[q] < 0 || members[q] >= g->size)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "MPI communicator %d: process %d is not one of %d", id,
                               members[q], g->size);
        if (members[q] == g->rank) self = q;
    }
    if (self < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "MPI communicator %d: MPI rank %d is not among its processes", id,
                           g->rank);
    struct crew_mpi_comm *mc = calloc(1, sizeof *mc);
    if (!mc) return CREW_OOM();
    mc->g = (struct crew_process_group *)g; /* its failure state changes as it talks */
    mc->lc = lc;
    mc->T = local_size;
    mc->P = n_members;
    mc->p = self;
    mc->id = id;
    mc->unit = "replica";
    mc->procs = calloc((size_t)mc->P, sizeof *mc->procs);
    mc->send = calloc((size_t)mc->P, sizeof *mc->send);
    mc->recv = calloc((size_t)mc->P, sizeof *mc->recv);
    mc->send_bytes = calloc((size_t)mc->P, sizeof *mc->send_bytes);
    mc->recv_bytes = calloc((size_t)mc->P, sizeof *mc->recv_bytes);
    mc->bounds = calloc((size_t)mc->P + 1, sizeof *mc->bounds);
    mc->tokens = calloc((size_t)mc->P, 1);
    mc->parts = calloc((size_t)local_size, sizeof *mc->parts);
    mc->parts_cap = calloc((size_t)local_size, sizeof *mc->parts_cap);
    mc->out_box = calloc((size_t)local_size, sizeof *mc->out_box);
    if (!mc->procs || !mc->send || !mc->recv || !mc->send_bytes || !mc->recv_bytes || !mc->bounds || !mc->tokens ||
        !mc->parts || !mc->parts_cap || !mc->out_box) {
        crew_mpi_comm_free(mc);
        return CREW_OOM();
    }
    memcpy(mc->procs, members, (size_t)n_members * sizeof *members);
    int *ub = NULL, flag = 0;
    pthread_mutex_lock(&mc->g->lock);
    MPI_Comm_get_attr(mc->g->comm, MPI_TAG_UB, &ub, &flag);
    pthread_mutex_unlock(&mc->g->lock);
    mc->tag_ub = flag && ub ? *ub : 32767;
    *out = mc;
    return CREW_OK;
}

crew_status crew_mpi_comm_create(const crew_process_group *g, crew_local_comm *lc, int local_size, crew_mpi_comm **out)
{
    int *all = malloc((size_t)g->size * sizeof *all);
    if (!all) return CREW_OOM();
    for (int q = 0; q < g->size; q++) all[q] = q;
    crew_status s = crew_mpi_comm_create_subset(g, lc, local_size, all, g->size, 0, out);
    free(all);
    return s;
}

crew_comm crew_mpi_comm_rank(crew_mpi_comm *mc, int local_rank)
{
    return (crew_comm){&mpi_ops, mc, mc->p * mc->T + local_rank, mc->P * mc->T};
}

void crew_mpi_comm_name_ranks(crew_mpi_comm *mc, const char *unit)
{
    if (mc) mc->unit = unit;
}

void crew_mpi_comm_set_unordered(crew_mpi_comm *mc, int on)
{
    if (mc) mc->unordered = on != 0 && mc->P == mc->g->size; /* MPI's all-reduce spans every process */
}

void crew_mpi_comm_free(crew_mpi_comm *mc)
{
    if (!mc) return;
    pthread_mutex_lock(&mc->g->lock);
    const int failed = mc->g->failed;
    pthread_mutex_unlock(&mc->g->lock);
    for (int t = 0; mc->out_box && t < mc->T; t++) {
        outbox *box = &mc->out_box[t];
        /* The receivers take what was sent before they finish; a poisoned group's may never be. */
        crew_status_free(reap(mc, box, failed || box->timeout_s <= 0 ? 0.0 : box->timeout_s));
        free(box->items); /* any still open are left to the process's end, with their copies */
    }
    free(mc->out_box);
    crew_group_requests_free(&mc->reqs);
    free(mc->procs);
    free(mc->pack);
    free(mc->in);
    free(mc->out);
    free(mc->send);
    free(mc->recv);
    free(mc->send_bytes);
    free(mc->recv_bytes);
    free(mc->bounds);
    free(mc->tokens);
    for (int t = 0; mc->parts && t < mc->T; t++) free(mc->parts[t]);
    free(mc->parts);
    free(mc->parts_cap);
    free(mc);
}
