/* test_comm_staged.c — the staged communicator (comm_staged.c), which lets devices the host cannot
 * reach (GPUs) take part in the in-process communicator through host copies: 3 ranks, each on a
 * guarded CPU device (device memory that traps any host access, so the staging may only upload
 * and download), run every collective and point-to-point messages through staged handles over one
 * in-process communicator of host buffers, and each checks its device's results, bitwise, against
 * the sums in rank order (then each rank's inputs in order) that it computes itself. The
 * reduce-scatter leaves the rest of its output as it was. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "thread_check.h"
#include "comm/comm.h"
#include "core/status.h"

#define RANKS 3
#define N 1001
#define TIMEOUT_S 30.0

/* Input j of rank r, element i: magnitudes that make the order of a float sum matter. */
static float value(int r, int j, int64_t i)
{
    static const float scale[] = {1e-3f, 1.0f, 1e3f, 7.0f};
    return (float)((r * 5 + j * 3 + 1) % 11) * scale[(i + r + j) % 4] / 3.0f;
}

typedef struct worker {
    int rank;
    crew_backend be;
    crew_comm comm;
} worker;

static float *dev(worker *w, const float *host, int64_t n)
{
    float *d = NULL;
    EXPECT_OK(crew_dev_alloc_f32(&w->be, n, &d));
    if (d && host) EXPECT_OK(crew_dev_upload_f32(&w->be, d, host, n));
    return d;
}

static int equal_on_device(worker *w, const float *d, const float *want, int64_t n)
{
    float *got = malloc((size_t)n * sizeof *got);
    EXPECT_OK(crew_dev_download_f32(&w->be, got, d, n));
    int same = memcmp(got, want, (size_t)n * sizeof *got) == 0;
    free(got);
    return same;
}

static void *run(void *arg)
{
    worker *w = arg;
    const int r = w->rank;
    float *h = malloc(RANKS * N * sizeof *h), *want = malloc(RANKS * N * sizeof *want);

    /* all-reduce: Σ over ranks in order */
    for (int64_t i = 0; i < N; i++) {
        h[i] = value(r, 0, i);
        float acc = value(0, 0, i);
        for (int q = 1; q < RANKS; q++) acc += value(q, 0, i);
        want[i] = acc;
    }
    float *buf = dev(w, h, N);
    EXPECT_OK(crew_allreduce(&w->comm, buf, N, CREW_COMM_F32, CREW_REDUCE_SUM, TIMEOUT_S));
    EXPECT(equal_on_device(w, buf, want, N), "rank %d: staged all-reduce", r);

    /* the ordered all-reduce of 2 inputs per rank, out = in[1] */
    float *in[2];
    for (int j = 0; j < 2; j++) {
        for (int64_t i = 0; i < N; i++) h[i] = value(r, j, i);
        in[j] = dev(w, h, N);
    }
    for (int64_t i = 0; i < N; i++) {
        float acc = value(0, 0, i);
        for (int q = 0; q < RANKS; q++)
            for (int j = q ? 0 : 1; j < 2; j++) acc += value(q, j, i);
        want[i] = acc;
    }
    EXPECT_OK(w->comm.ops->allreduce_ordered(w->comm.ctx, r, in, 2, in[1], N, TIMEOUT_S));
    EXPECT(equal_on_device(w, in[1], want, N), "rank %d: staged ordered all-reduce", r);

    /* the ordered reduce-scatter: this rank's range of the sums; the rest of out as it was */
    const int64_t bounds[RANKS + 1] = {0, 400, 640, N};
    for (int64_t i = 0; i < N; i++) h[i] = -1.0f;
    float *out = dev(w, h, N);
    for (int j = 0; j < 2; j++) {
        for (int64_t i = 0; i < N; i++) h[i] = value(r, j, i);
        EXPECT_OK(crew_dev_upload_f32(&w->be, in[j], h, N));
    }
    float *mine = malloc(N * sizeof *mine);
    for (int64_t i = 0; i < N; i++) mine[i] = i >= bounds[r] && i < bounds[r + 1] ? want[i] : -1.0f;
    EXPECT_OK(crew_reduce_scatter_ordered(&w->comm, in, 2, out, N, bounds, TIMEOUT_S));
    EXPECT(equal_on_device(w, out, mine, N), "rank %d: staged ordered reduce-scatter", r);
    /* ...and every rank's range into every rank */
    EXPECT_OK(crew_allgather_ranges(&w->comm, out, N, bounds, TIMEOUT_S));
    EXPECT(equal_on_device(w, out, want, N), "rank %d: staged all-gather of ranges", r);

    /* broadcast from the last rank */
    for (int64_t i = 0; i < N; i++) h[i] = r == RANKS - 1 ? value(r, 2, i) : 0.0f, want[i] = value(RANKS - 1, 2, i);
    EXPECT_OK(crew_dev_upload_f32(&w->be, buf, h, N));
    EXPECT_OK(crew_broadcast(&w->comm, buf, N, CREW_COMM_F32, RANKS - 1, TIMEOUT_S));
    EXPECT(equal_on_device(w, buf, want, N), "rank %d: staged broadcast", r);

    /* all-gather: rank q's N values at q·N */
    for (int64_t i = 0; i < N; i++) h[i] = value(r, 3, i);
    EXPECT_OK(crew_dev_upload_f32(&w->be, buf, h, N));
    float *all = dev(w, NULL, RANKS * N);
    for (int q = 0; q < RANKS; q++)
        for (int64_t i = 0; i < N; i++) want[q * N + i] = value(q, 3, i);
    EXPECT_OK(w->comm.ops->allgather(w->comm.ctx, r, buf, all, N, CREW_COMM_F32, TIMEOUT_S));
    EXPECT(equal_on_device(w, all, want, RANKS * N), "rank %d: staged all-gather", r);

    /* point to point round the ring, sends first (buffered) */
    const int next = (r + 1) % RANKS, prev = (r + RANKS - 1) % RANKS;
    for (int64_t i = 0; i < N; i++) h[i] = value(r, 1, i) + 1.0f;
    EXPECT_OK(crew_dev_upload_f32(&w->be, buf, h, N));
    EXPECT_OK(crew_send(&w->comm, buf, N, CREW_COMM_F32, next, 5, TIMEOUT_S));
    float *got = dev(w, NULL, N);
    EXPECT_OK(crew_recv(&w->comm, got, N, CREW_COMM_F32, prev, 5, TIMEOUT_S));
    for (int64_t i = 0; i < N; i++) want[i] = value(prev, 1, i) + 1.0f;
    EXPECT(equal_on_device(w, got, want, N), "rank %d: staged message from rank %d", r, prev);

    EXPECT_OK(crew_barrier(&w->comm, TIMEOUT_S));
    crew_dev_free(&w->be, buf);
    crew_dev_free(&w->be, in[0]);
    crew_dev_free(&w->be, in[1]);
    crew_dev_free(&w->be, out);
    crew_dev_free(&w->be, all);
    crew_dev_free(&w->be, got);
    free(mine);
    free(h);
    free(want);
    return NULL;
}

int main(void)
{
    crew_local_comm *lc = NULL;
    CHECK_OK(crew_local_comm_create(RANKS, &lc));
    worker w[RANKS] = {{0}};
    crew_staged_comm *st[RANKS] = {0};
    pthread_t th[RANKS];
    int ready = lc != NULL;
    for (int r = 0; r < RANKS && ready; r++) {
        w[r] = (worker){.rank = r};
        CHECK_OK(crew_cpu_guarded_backend_create(1, &w[r].be));
        CHECK_OK(crew_local_comm_attach(lc, r, NULL)); /* the communicator's buffers: host memory */
        CHECK_OK(crew_staged_comm_create(crew_local_comm_rank(lc, r), &w[r].be, &st[r]));
        ready = w[r].be.ops && st[r];
        if (ready) w[r].comm = crew_staged_comm_rank(st[r]);
    }
    if (ready) {
        for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, run, &w[r]);
        for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
    }
    for (int r = 0; r < RANKS; r++) {
        crew_staged_comm_free(st[r]);
        crew_device_close(&w[r].be);
    }
    crew_local_comm_free(lc);
    CHECK_MSG(atomic_load(&thread_failures) == 0, "%d checks failed in the ranks' threads", atomic_load(&thread_failures));
    printf("%d ranks on guarded devices through host copies: every collective as the in-process one\n", RANKS);
    return check_report();
}
