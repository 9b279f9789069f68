/* comm_worker.c — a FIFO of all-reduce requests served by one thread per replica. */
#include "comm/comm_worker.h"

#include <string.h>

#include "core/status.h"
#include "core/thread_name.h"
#include "core/timer.h"

crew_status crew_comm_request_run(const crew_comm *comm, const crew_comm_request *r, double timeout_s)
{
    if (r->gather) return crew_allgather_ranges(comm, r->buf, r->n, r->bounds, timeout_s);
    if (r->bounds) return crew_reduce_scatter_ordered(comm, r->parts, r->k, r->buf, r->n, r->bounds, timeout_s);
    if (r->k > 1) return comm->ops->allreduce_ordered(comm->ctx, comm->rank, r->parts, r->k, r->buf, r->n, timeout_s);
    return crew_allreduce(comm, r->buf, r->n, r->type, r->op, timeout_s);
}

static void *worker_main(void *arg)
{
    crew_comm_worker *w = arg;
    crew_thread_name("comm", w->comm.rank);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->head) break; /* stopping with nothing left */
        crew_comm_request *r = w->head;
        w->head = r->next;
        if (!w->head) w->tail = NULL;
        pthread_mutex_unlock(&w->mu);
        r->started = crew_now();
        crew_status s = crew_comm_request_run(&w->comm, r, w->timeout_s);
        double finished = crew_now();
        pthread_mutex_lock(&w->mu);
        r->status = s;
        r->finished = finished;
        r->done = 1;
        w->busy_s += finished - r->started;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

crew_status crew_comm_worker_start(crew_comm_worker *w, crew_comm comm, double timeout_s)
{
    memset(w, 0, sizeof *w);
    w->comm = comm;
    w->timeout_s = timeout_s;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        return crew_errorf(CREW_CODE_INTERNAL, "rank %d: could not start the communication thread", comm.rank);
    }
    w->running = 1;
    return CREW_OK;
}

void crew_comm_worker_submit(crew_comm_worker *w, crew_comm_request *req)
{
    req->done = 0;
    req->status = CREW_OK;
    req->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->tail)
        w->tail->next = req;
    else
        w->head = req;
    w->tail = req;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

crew_status crew_comm_worker_wait(crew_comm_worker *w, crew_comm_request *req)
{
    pthread_mutex_lock(&w->mu);
    while (!req->done) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    crew_status s = req->status;
    req->status = CREW_OK;
    return s;
}

crew_status crew_comm_worker_allreduce(crew_comm_worker *w, void *buf, int64_t n, crew_comm_type t,
                                       crew_reduce_op op)
{
    crew_comm_request req = {.buf = buf, .n = n, .type = t, .op = op};
    crew_comm_worker_submit(w, &req);
    return crew_comm_worker_wait(w, &req);
}

double crew_comm_worker_take_busy(crew_comm_worker *w)
{
    pthread_mutex_lock(&w->mu);
    double b = w->busy_s;
    w->busy_s = 0.0;
    pthread_mutex_unlock(&w->mu);
    return b;
}

void crew_comm_worker_stop(crew_comm_worker *w)
{
    if (!w->running) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    w->running = 0;
}
