/* comm_worker.h — a replica's communication thread.
 *
 * Gradient buckets are all-reduced while the backward pass goes on, so the collectives run on
 * a thread of their own, one per replica. The collectives that can overlap the replica's work go
 * through its worker's queue, in submission order (bucket all-reduces, synchronised batch-norm
 * sums during forward and backward): every replica submits the same sequence, so the collectives
 * match up across replicas without further coordination. The replica makes the blocking ones
 * between steps (metrics, evaluation, drift check) itself, only when its queue is empty, so one
 * communicator is never used by two threads of the same rank at once. */
#ifndef CREW_COMM_COMM_WORKER_H
#define CREW_COMM_COMM_WORKER_H

#include <pthread.h>

#include "comm/comm.h"

typedef struct crew_comm_request {
    void *buf;                  /* the buffer reduced in place, or the output of an ordered reduce */
    int64_t n;
    float *const *parts;        /* when k > 1: k float32 inputs summed in (rank, index) order into buf */
    int k;
    /* optimizer sharding: [size + 1] this rank receives only buf[bounds[rank] .. bounds[rank + 1])
     * of the ordered sum of parts (crew_reduce_scatter_ordered); NULL: all of it */
    const int64_t *bounds;
    /* 1: not a reduction but the all-gather of the ranges `bounds` of buf (float32; ZeRO-3's units) */
    int gather;
    crew_comm_type type;
    crew_reduce_op op;
    /* filled by the worker */
    int done;
    crew_status status;
    double started, finished;   /* crew_now() */
    struct crew_comm_request *next;
} crew_comm_request;

typedef struct crew_comm_worker {
    crew_comm comm;
    double timeout_s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    crew_comm_request *head, *tail;
    int stop, running;
    double busy_s;              /* time spent in collectives since the last take_busy */
} crew_comm_worker;

crew_status crew_comm_worker_start(crew_comm_worker *w, crew_comm comm, double timeout_s);
/* Runs the collective a request describes on the calling thread (what the worker does with each
 * queued request; a replica may do it itself when its queue is empty). */
crew_status crew_comm_request_run(const crew_comm *comm, const crew_comm_request *r, double timeout_s);
/* Queues an all-reduce of req->buf (n elements); returns at once. req must live until waited. */
void crew_comm_worker_submit(crew_comm_worker *w, crew_comm_request *req);
/* Waits for req; returns its status (the caller owns it). */
crew_status crew_comm_worker_wait(crew_comm_worker *w, crew_comm_request *req);
/* Submit and wait. */
crew_status crew_comm_worker_allreduce(crew_comm_worker *w, void *buf, int64_t n, crew_comm_type t,
                                       crew_reduce_op op);
/* Seconds spent inside collectives since the previous call. */
double crew_comm_worker_take_busy(crew_comm_worker *w);
void crew_comm_worker_stop(crew_comm_worker *w);

#endif
