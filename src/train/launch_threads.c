/* launch_threads.c — the threads launcher: every rank of a run as a thread of this process.
 *
 * It opens one device per rank (never shared), one in-process communicator with each rank's
 * device attached to its handle, and runs the rank program on each: rank 0 on the calling thread
 * (which then also runs the caller's callbacks), the others on threads of their own. A rank that
 * fails aborts the communicator, so the others stop at their next collective instead of waiting
 * for its deadline. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "train/run.h"

typedef struct rank_slot {
    crew_rank_ctx ctx;
    int opened;                 /* ctx.device is open */
    crew_status status;
    pthread_t thread;
} rank_slot;

static void *rank_thread(void *arg)
{
    rank_slot *r = arg;
    r->status = crew_rank_main(&r->ctx);
    if (r->status) r->ctx.comm.ops->abort(r->ctx.comm.ctx, r->ctx.rank);
    return NULL;
}

/* The first real error: a rank that failed by itself, not one that was told another failed. */
static crew_status first_error(rank_slot *ranks, int n)
{
    crew_status keep = CREW_OK;
    for (int i = 0; i < n; i++) {
        if (!ranks[i].status) continue;
        if (!keep || (crew_status_code(keep) == CREW_CODE_TIMEOUT && crew_status_code(ranks[i].status) != CREW_CODE_TIMEOUT)) {
            crew_status_free(keep);
            keep = ranks[i].status;
        } else {
            crew_status_free(ranks[i].status);
        }
        ranks[i].status = CREW_OK;
    }
    return keep;
}

/* Opens rank i's device and attaches it to its communicator handle. */
static crew_status open_rank(const crew_run *run, crew_local_comm *lc, rank_slot *r, int i)
{
    crew_device_options dev = {.blas_threads = run->plan.threads_per_device};
    CREW_TRY(crew_device_open(run->plan.device_kind, i, &dev, &r->ctx.device));
    r->opened = 1;
    CREW_TRY(crew_local_comm_attach(lc, i, &r->ctx.device));
    r->ctx.comm = crew_local_comm_rank(lc, i);
    return CREW_OK;
}

crew_status crew_launch_threads(const crew_run *run, crew_run_sinks *sinks)
{
    const int n = run->plan.devices;
    crew_local_comm *lc;
    CREW_TRY(crew_local_comm_create(n, &lc));
    rank_slot *ranks = calloc((size_t)n, sizeof *ranks);
    if (!ranks) {
        crew_local_comm_free(lc);
        return CREW_OOM();
    }
    crew_status s = CREW_OK;
    for (int i = 0; i < n && !s; i++) {
        ranks[i].ctx = (crew_rank_ctx){.rank = i, .size = n, .run = run, .sinks = i == 0 ? sinks : NULL};
        s = open_rank(run, lc, &ranks[i], i);
    }
    int started = 0; /* ranks 1 .. started run on threads of their own */
    for (int i = 1; i < n && !s; i++) {
        if (pthread_create(&ranks[i].thread, NULL, rank_thread, &ranks[i]) != 0)
            s = crew_errorf(CREW_CODE_INTERNAL, "could not start the thread of rank %d", i);
        else
            started = i;
    }
    if (!s)
        rank_thread(&ranks[0]);
    else if (started)
        crew_local_comm_rank(lc, 0).ops->abort(lc, 0);
    for (int i = 1; i <= started; i++) pthread_join(ranks[i].thread, NULL);
    if (!s)
        s = first_error(ranks, n);
    else
        crew_status_free(first_error(ranks, n));
    for (int i = 0; i < n; i++)
        if (ranks[i].opened) crew_device_close(&ranks[i].ctx.device);
    free(ranks);
    crew_local_comm_free(lc);
    return s;
}
