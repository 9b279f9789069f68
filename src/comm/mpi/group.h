/* group.h — a process group over MPI, and its one way of talking: an exchange of messages with
 * every other process, non-blocking and polled against a deadline, so that a process that never
 * answers is named instead of waited for. Inside src/comm/mpi/ only: it includes mpi.h. */
#ifndef CREW_COMM_MPI_GROUP_H
#define CREW_COMM_MPI_GROUP_H

#include <mpi.h>
#include <stddef.h>

#include "crew.h"

#define CREW_GROUP_HOST_MAX 64

/* The requests of one exchange, kept between exchanges so that a collective allocates nothing. */
typedef struct crew_group_requests {
    MPI_Request *req;           /* [n] */
    int *peer;                  /* [n] the process each request talks to */
    int *is_recv;               /* [n] */
    int *done;                  /* [cap] MPI_Testsome's indices */
    MPI_Status *statuses;       /* [cap] its statuses, unread: MPICH's header makes GCC take
                                   MPI_STATUSES_IGNORE for an array of none and warn */
    int n, cap;
} crew_group_requests;

struct crew_process_group {
    MPI_Comm comm;              /* a duplicate of the caller's, with errors returned, not fatal */
    int rank, size;
    char (*hosts)[CREW_GROUP_HOST_MAX]; /* [size] every process's host name */
    /* Poisoned after a failed exchange: every later one fails at once with the same message.
     * Touched by one thread of the process at a time, as every MPI call here. */
    int failed;
    char failure[320];
    crew_group_requests pending;
};

/* Tags: one per kind of exchange, so that a stray message can never be taken for another kind. */
enum {
    CREW_TAG_HOSTS = 101, CREW_TAG_AGREE, CREW_TAG_RECORD,
    CREW_TAG_BROADCAST = 201, CREW_TAG_REDUCE, CREW_TAG_GATHER, CREW_TAG_BARRIER,
};

/* One exchange: for every process q other than this one, sends send_bytes[q] bytes from send[q]
 * and receives recv_bytes[q] bytes into recv[q] (0 bytes: nothing either way). Returns when all
 * have completed, or fails when timeout_s passes, naming the processes not heard from
 * ("MPI rank 1 (host h, replicas 2-3)"; replicas_per_process 0 leaves the replicas out), and
 * poisons the group. */
crew_status crew_group_exchange(struct crew_process_group *g, const void *const *send, const size_t *send_bytes,
                                void *const *recv, const size_t *recv_bytes, int tag, double timeout_s,
                                int replicas_per_process, const char *what);

/* buf[n] (floats, or doubles with f64) summed over the processes in place by MPI's own
 * all-reduce (MPI_Iallreduce, polled against timeout_s): the fast path, whose order of the sums
 * is the library's. A process that never joins cannot be named (an MPI collective does not say
 * who is missing): the error says so, and the group is poisoned. */
crew_status crew_group_allreduce_sum(struct crew_process_group *g, void *buf, int64_t n, int f64, double timeout_s,
                                     const char *what);

#endif
