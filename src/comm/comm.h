/* comm.h — the communicator: collectives between the replicas of a run.
 *
 * A table of functions plus a context, as NCCL's communicator: the in-process implementation
 * (comm_local.c: one thread per replica, shared memory) is the first; MPI and NCCL implement
 * the same table. Nothing above this interface may assume threads.
 *
 * Every collective is called by all ranks with the same arguments (except the buffer), takes a
 * deadline in seconds, and returns an error naming the ranks that did not arrive when it passes.
 * Buffers hold `n` elements of the given type and are device memory of the rank's device, as
 * NCCL's are: the rank program stages host values (metrics, hashes) through device memory. Sums
 * run in rank order, so a result never depends on which rank finished first: the determinism
 * contract of docs/ARCHITECTURE.md. */
#ifndef CREW_COMM_COMM_H
#define CREW_COMM_COMM_H

#include <stdint.h>

#include "backend/backend.h"
#include "crew.h"

typedef enum crew_comm_type { CREW_COMM_F32 = 1, CREW_COMM_F64 } crew_comm_type;
typedef enum crew_reduce_op { CREW_REDUCE_SUM = 1, CREW_REDUCE_AVG } crew_reduce_op;

typedef struct crew_comm_ops {
    const char *name;
    crew_status (*allreduce)(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, crew_reduce_op op,
                             double timeout_s);
    crew_status (*broadcast)(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int root,
                             double timeout_s);
    /* recv: [size · n], rank r's send lands at recv + r·n */
    crew_status (*allgather)(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                             double timeout_s);
    /* send: [size · n]; rank r receives the reduction of every rank's chunk r into recv [n] */
    crew_status (*reduce_scatter)(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                  crew_reduce_op op, double timeout_s);
    /* out = Σ over ranks r, then over j < k, of in_r[j] (float32, n each), summed in exactly that
     * order, on every rank; every rank passes the same k, and out may be one of its in[j]. A replica
     * accumulating k micro-batches contributes each one separately, so the sum is the one a single
     * replica accumulating all of them in order would compute, bit for bit. */
    crew_status (*allreduce_ordered)(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                     double timeout_s);
    /* Optimizer sharding (ZeRO stage 1). reduce_scatter_ordered: allreduce_ordered's sums, but rank
     * r computes and receives only out[bounds[r] .. bounds[r + 1]) (bounds: [size + 1], from 0 to n,
     * the same on every rank); the rest of out is left as it was. allgather_ranges: every rank's
     * range [bounds[r], bounds[r + 1]) of buf into every rank's buf. NULL in a communicator without
     * them: crew_reduce_scatter_ordered and crew_allgather_ranges then use allreduce_ordered and
     * broadcasts, the same bits with more traffic. */
    crew_status (*reduce_scatter_ordered)(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                          const int64_t *bounds, double timeout_s);
    crew_status (*allgather_ranges)(void *ctx, int rank, float *buf, int64_t n, const int64_t *bounds,
                                    double timeout_s);
    crew_status (*barrier)(void *ctx, int rank, double timeout_s);
    /* Point to point (pipeline stages): send hands n values to rank `peer` and may return before
     * peer receives them (the buffer is free again on return); recv waits at most timeout_s for the
     * oldest message from `peer`, whose tag and count must be the ones given. Messages between two
     * ranks arrive in the order sent. NULL in a communicator without them (crew_send says so). */
    crew_status (*send)(void *ctx, int rank, const void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                        double timeout_s);
    crew_status (*recv)(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                        double timeout_s);
    /* Marks this rank as failed so that the others stop waiting for it at once. */
    void (*abort)(void *ctx, int rank);
} crew_comm_ops;

/* One rank's handle. */
typedef struct crew_comm {
    const crew_comm_ops *ops;
    void *ctx;
    int rank, size;
} crew_comm;

static inline crew_status crew_allreduce(const crew_comm *c, void *buf, int64_t n, crew_comm_type t,
                                         crew_reduce_op op, double timeout_s)
{
    return c->ops->allreduce(c->ctx, c->rank, buf, n, t, op, timeout_s);
}
static inline crew_status crew_broadcast(const crew_comm *c, void *buf, int64_t n, crew_comm_type t, int root,
                                         double timeout_s)
{
    return c->ops->broadcast(c->ctx, c->rank, buf, n, t, root, timeout_s);
}
static inline crew_status crew_barrier(const crew_comm *c, double timeout_s)
{
    return c->ops->barrier(c->ctx, c->rank, timeout_s);
}

static inline crew_status crew_reduce_scatter_ordered(const crew_comm *c, float *const *in, int k, float *out,
                                                      int64_t n, const int64_t *bounds, double timeout_s)
{
    if (!c->ops->reduce_scatter_ordered) return c->ops->allreduce_ordered(c->ctx, c->rank, in, k, out, n, timeout_s);
    return c->ops->reduce_scatter_ordered(c->ctx, c->rank, in, k, out, n, bounds, timeout_s);
}
/* Through broadcasts where the communicator has no allgather_ranges (each range from its rank). */
crew_status crew_allgather_ranges(const crew_comm *c, float *buf, int64_t n, const int64_t *bounds, double timeout_s);

crew_status crew_comm_no_p2p(const crew_comm *c);
static inline crew_status crew_send(const crew_comm *c, const void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                                    double timeout_s)
{
    if (!c->ops->send) return crew_comm_no_p2p(c);
    return c->ops->send(c->ctx, c->rank, buf, n, t, peer, tag, timeout_s);
}
static inline crew_status crew_recv(const crew_comm *c, void *buf, int64_t n, crew_comm_type t, int peer, int tag,
                                    double timeout_s)
{
    if (!c->ops->recv) return crew_comm_no_p2p(c);
    return c->ops->recv(c->ctx, c->rank, buf, n, t, peer, tag, timeout_s);
}

/* The in-process communicator for `size` threads: one shared context, one handle per rank. Each
 * rank's thread reads and writes the other ranks' buffers, so their memory must be reachable
 * from the host: a rank's buffers are memory of the device attached to it (through the device's
 * host_alias; the CPU kinds have one), or plain host memory for a rank without a device (the
 * advisor's probes). */
typedef struct crew_local_comm crew_local_comm;
crew_status crew_local_comm_create(int size, crew_local_comm **out);
/* Before the rank's first collective: its buffers are memory of `device` from now on. A device
 * whose memory the host cannot reach (no host_alias) is refused: it needs its own communicator. */
crew_status crew_local_comm_attach(crew_local_comm *lc, int rank, const crew_backend *device);
crew_comm crew_local_comm_rank(crew_local_comm *lc, int rank);
void crew_local_comm_free(crew_local_comm *lc);

/* A rank's handle for a device whose memory the host cannot reach (no host_alias: a GPU), over
 * `inner`, a handle of a communicator of host buffers (in-process with this rank attached as host
 * memory, or MPI's over such a one): every collective downloads the rank's inputs from `device`,
 * runs inner's on host copies and uploads the results (comm_staged.c). The same sums in the same
 * order as inner's; device and the staged handle must outlive the handle's use. */
typedef struct crew_staged_comm crew_staged_comm;
/* 1 when the in-process communicator cannot reach the device's memory (it has no host_alias), so
 * that its ranks need staged handles. */
int crew_comm_needs_staging(const crew_backend *device);
crew_status crew_staged_comm_create(crew_comm inner, const crew_backend *device, crew_staged_comm **out);
crew_comm crew_staged_comm_rank(crew_staged_comm *st);
void crew_staged_comm_free(crew_staged_comm *st);

/* For a communicator layered over this one (comm_mpi.c: the threads of a process, then MPI
 * between processes). Each rank of the process posts `mine` and meets the others; then rank 0
 * alone runs leader(user, posted) with every rank's posted pointer ([size]) while the others wait
 * for it, at most wait_s; then all return. A leader that fails poisons the communicator with its
 * message, so the others fail too and name it. */
typedef crew_status (*crew_local_leader_fn)(void *user, void *const *posted);
crew_status crew_local_comm_lead(crew_local_comm *lc, int rank, void *mine, crew_local_leader_fn leader, void *user,
                                 double timeout_s, double wait_s, const char *what);
/* The host address of rank's buffer p of n values (its device's host_alias), as a collective of
 * this communicator would read it; a buffer outside the rank's device memory poisons it. */
crew_status crew_local_comm_host(crew_local_comm *lc, int rank, const void *p, int64_t n, crew_comm_type t,
                                 const char *what, void **out);
/* Poisons the communicator: every rank waiting or arriving fails with `why`. */
void crew_local_comm_fail(crew_local_comm *lc, int rank, const char *why);
/* 1, with the reason in why, when the communicator is poisoned (a rank aborted or timed out): for
 * a layered communicator's own waits (comm_mpi.c's point-to-point), so that they stop too. */
int crew_local_comm_failed(crew_local_comm *lc, char *why, size_t len);

#endif
