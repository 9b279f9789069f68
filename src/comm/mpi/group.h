/* group.h — a process group over MPI, and its one way of talking: an exchange of messages with
 * every other process, non-blocking and polled against a deadline, so that a process that never
 * answers is named instead of waited for. Inside src/comm/mpi/ only: it includes mpi.h. */
#ifndef CREW_COMM_MPI_GROUP_H
#define CREW_COMM_MPI_GROUP_H

#include <mpi.h>
#include <pthread.h>
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
    /* Every MPI call of the process's crew threads is made under this lock, one call at a time
     * (MPI_THREAD_SERIALIZED): several communicators over one group (a pipeline's run and stage
     * communicators) have leaders on different threads, and point-to-point sends come from any
     * rank's thread. Held for one call, never while waiting. It also guards the failure state. */
    pthread_mutex_t lock;
    /* Poisoned after a failed exchange: every later one fails at once with the same message. */
    int failed;
    char failure[320];
    crew_group_requests pending; /* the group's own exchanges (agreement, host names, records) */
};

/* Tags: one per kind of exchange, so that a stray message can never be taken for another kind.
 * A communicator over the group adds CREW_TAG_COMM_STRIDE × its id to its collectives' tags, so
 * that two communicators exchanging at once (a pipeline's stages) never meet each other's
 * messages; point-to-point messages have tags from CREW_TAG_P2P on (comm_mpi.c). */
enum {
    CREW_TAG_HOSTS = 101, CREW_TAG_AGREE, CREW_TAG_RECORD,
    CREW_TAG_BROADCAST = 201, CREW_TAG_REDUCE, CREW_TAG_GATHER, CREW_TAG_BARRIER,
    CREW_TAG_COMM_STRIDE = 8, CREW_TAG_COMM_IDS = 96, /* ids 0 .. 95: tags 201 .. 971 */
    CREW_TAG_P2P = 1024,
};

/* One exchange between this process and `peers` others: entry q is process procs[q] (NULL: q;
 * this process's own entry has 0 bytes), to which it sends send_bytes[q] bytes from send[q] and
 * from which it receives recv_bytes[q] bytes into recv[q] (0 bytes: nothing either way). Returns
 * when all have completed, or fails when timeout_s passes, naming the processes not heard from
 * ("MPI rank 1 (host h, replicas 2-3)": entry q holds the ranks q · ranks_per_process on, each
 * called a `unit`, "replica" when NULL; 0 leaves them out), and poisons the group. reqs: the
 * caller's, kept between exchanges so that a collective allocates nothing, and one per thread
 * that exchanges at the same time. */
crew_status crew_group_exchange(struct crew_process_group *g, crew_group_requests *reqs, int peers, const int *procs,
                                const void *const *send, const size_t *send_bytes, void *const *recv,
                                const size_t *recv_bytes, int tag, double timeout_s, int ranks_per_process,
                                const char *unit, const char *what);
void crew_group_requests_free(crew_group_requests *reqs);

/* Poisons the group with a message (the first one stays), under its lock: the failure of a wait
 * outside the exchanges (comm_mpi.c's point-to-point). Returns it as a CREW_CODE_TIMEOUT error. */
crew_status crew_group_fail(struct crew_process_group *g, const char *why);
/* The error of a failed MPI call, which also poisons the group. */
crew_status crew_group_mpi_error(struct crew_process_group *g, int rc, const char *what);
/* "MPI rank 1, host h" of process q. */
int crew_group_name(const struct crew_process_group *g, int q, char *buf, size_t len);

/* buf[n] (floats, or doubles with f64) summed over the processes in place by MPI's own
 * all-reduce (MPI_Iallreduce, polled against timeout_s): the fast path, whose order of the sums
 * is the library's. A process that never joins cannot be named (an MPI collective does not say
 * who is missing): the error says so, and the group is poisoned. */
crew_status crew_group_allreduce_sum(struct crew_process_group *g, void *buf, int64_t n, int f64, double timeout_s,
                                     const char *what);

#endif
