/* test_comm_local.c — the in-process communicator: every collective against a sequential
 * reference, bitwise; a missed deadline names the rank that did not arrive, and is not declared
 * before the deadline has passed; an abort releases the others (with the abort's message, long
 * before their own deadline).
 *
 * Nothing here depends on how fast the machine is: the collectives that must succeed have a
 * deadline of 120 s, which no loaded machine comes near, and the times measured around the
 * failures are held only to bounds a loaded machine cannot break (a wait ends no earlier than its
 * deadline; it ends, and within 60 s). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "core/timer.h"

enum { N = 1001, MAXR = 4 }; /* N not divisible by the rank counts: chunks are uneven */

typedef struct job {
    crew_comm comm;
    float data[N];
    float gathered[MAXR * N];
    float scattered[N];
    float bcast[3];
    double metric;
    crew_status status;
    int stall;          /* this rank never calls the collective */
    double deadline_s;  /* of every collective */
} job;

enum { GENEROUS_S = 120 }; /* the deadline of collectives that must succeed */

static float value(int rank, int i) { return (float)((rank + 1) * 0.1 + i * 1e-3) * (i % 3 ? 1.0f : -1.0f); }

static void *run(void *arg)
{
    job *j = arg;
    int r = j->comm.rank, size = j->comm.size;
    for (int i = 0; i < N; i++) j->data[i] = value(r, i);
    j->metric = r + 1.0;
    if (j->stall) return NULL;
    const double dl = j->deadline_s;
    crew_status s = crew_allreduce(&j->comm, j->data, N, CREW_COMM_F32, CREW_REDUCE_SUM, dl);
    if (!s) s = crew_allreduce(&j->comm, &j->metric, 1, CREW_COMM_F64, CREW_REDUCE_AVG, dl);
    float mine[N], send[MAXR * N];
    for (int i = 0; i < N; i++) mine[i] = value(r, i);
    if (!s) s = j->comm.ops->allgather(j->comm.ctx, r, mine, j->gathered, N, CREW_COMM_F32, dl);
    int chunk = N / size;
    for (int i = 0; i < chunk * size; i++) send[i] = value(r, i);
    if (!s) s = j->comm.ops->reduce_scatter(j->comm.ctx, r, send, j->scattered, chunk, CREW_COMM_F32, CREW_REDUCE_SUM, dl);
    for (int i = 0; i < 3; i++) j->bcast[i] = (float)r;
    if (!s) s = crew_broadcast(&j->comm, j->bcast, 3, CREW_COMM_F32, size - 1, dl);
    if (!s) s = crew_barrier(&j->comm, dl);
    j->status = s;
    return NULL;
}

static void check_size(int size)
{
    crew_local_comm *lc;
    CHECK_OK(crew_local_comm_create(size, &lc));
    job *jobs = calloc((size_t)size, sizeof *jobs);
    pthread_t t[MAXR];
    for (int r = 0; r < size; r++) {
        jobs[r].comm = crew_local_comm_rank(lc, r);
        jobs[r].deadline_s = GENEROUS_S;
        pthread_create(&t[r], NULL, run, &jobs[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
    int chunk = N / size;
    for (int r = 0; r < size; r++) {
        CHECK_OK(jobs[r].status);
        int sum_ok = 1, gather_ok = 1, scatter_ok = 1;
        for (int i = 0; i < N; i++) {
            float ref = value(0, i); /* the sequential sum in rank order */
            for (int q = 1; q < size; q++) ref += value(q, i);
            sum_ok &= memcmp(&ref, &jobs[r].data[i], sizeof ref) == 0;
            for (int q = 0; q < size; q++) gather_ok &= jobs[r].gathered[q * N + i] == value(q, i);
        }
        for (int i = 0; i < chunk; i++) {
            float ref = value(0, r * chunk + i);
            for (int q = 1; q < size; q++) ref += value(q, r * chunk + i);
            scatter_ok &= memcmp(&ref, &jobs[r].scattered[i], sizeof ref) == 0;
        }
        CHECK_MSG(sum_ok, "size %d rank %d: all-reduce differs from the rank-order sum", size, r);
        CHECK_MSG(gather_ok, "size %d rank %d: all-gather", size, r);
        CHECK_MSG(scatter_ok, "size %d rank %d: reduce-scatter", size, r);
        CHECK(jobs[r].metric == (size + 1) / 2.0);
        CHECK(jobs[r].bcast[0] == (float)(size - 1) && jobs[r].bcast[2] == (float)(size - 1));
    }
    free(jobs);
    crew_local_comm_free(lc);
}

/* Rank 2 of 3 never arrives: the others fail at the deadline of 1 s, naming it (and the deadline).
 * They must not give up before it: rank 2 might only be late. The upper bound is one no loaded
 * machine comes near. */
static void check_deadline(void)
{
    const double deadline = 1.0;
    crew_local_comm *lc;
    CHECK_OK(crew_local_comm_create(3, &lc));
    job *jobs = calloc(3, sizeof *jobs);
    pthread_t t[3];
    double start = crew_now();
    for (int r = 0; r < 3; r++) {
        jobs[r].comm = crew_local_comm_rank(lc, r);
        jobs[r].stall = r == 2;
        jobs[r].deadline_s = deadline;
        pthread_create(&t[r], NULL, run, &jobs[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(t[r], NULL);
    double took = crew_now() - start;
    for (int r = 0; r < 2; r++) {
        CHECK(crew_status_code(jobs[r].status) == CREW_CODE_TIMEOUT);
        const char *msg = jobs[r].status ? crew_status_message(jobs[r].status) : "";
        CHECK_MSG(strstr(msg, "rank 2 did not arrive within 1 s"), "%s", msg);
        crew_status_free(jobs[r].status);
    }
    /* 0.9: the deadline is on the realtime clock, this measurement on the monotonic one */
    CHECK_MSG(took >= 0.9 * deadline, "a deadline of %g s declared missed after %.2f s", deadline, took);
    CHECK_MSG(took < 60.0, "a deadline of %g s took %.1f s to be declared missed", deadline, took);
    free(jobs);
    crew_local_comm_free(lc);
}

/* A rank that aborts releases the others at once: rank 1 waits at a barrier with a deadline of
 * 600 s and fails with the abort's message, not a missed deadline; that it came back within 60 s
 * shows it did not wait for its deadline. */
static void *abort_run(void *arg)
{
    job *j = arg;
    if (j->comm.rank == 0) {
        j->comm.ops->abort(j->comm.ctx, 0);
        return NULL;
    }
    j->status = crew_barrier(&j->comm, 600.0);
    return NULL;
}

static void check_abort(void)
{
    crew_local_comm *lc;
    CHECK_OK(crew_local_comm_create(2, &lc));
    job jobs[2] = {{.comm = crew_local_comm_rank(lc, 0)}, {.comm = crew_local_comm_rank(lc, 1)}};
    pthread_t t[2];
    double start = crew_now();
    for (int r = 0; r < 2; r++) pthread_create(&t[r], NULL, abort_run, &jobs[r]);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    double took = crew_now() - start;
    CHECK(jobs[1].status != CREW_OK);
    const char *msg = jobs[1].status ? crew_status_message(jobs[1].status) : "";
    CHECK_MSG(strstr(msg, "rank 0 failed") && !strstr(msg, "did not arrive"), "%s", msg);
    CHECK_MSG(took < 60.0, "released after %.1f s", took);
    crew_status_free(jobs[1].status);
    crew_local_comm_free(lc);
}

int main(void)
{
    for (int size = 1; size <= MAXR; size++) check_size(size);
    check_deadline();
    check_abort();
    crew_local_comm *lc = NULL;
    CHECK_ERR(crew_local_comm_create(0, &lc), "size must be");
    return check_report();
}
