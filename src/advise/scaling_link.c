/* scaling_link.c — this machine's shared memory measured as a link: two threads, each with a
 * replica's communication thread, all-reduce a buffer of the gradients' size as training does
 * (submit to the worker, wait for it), and one value for the latency. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "advise/scaling.h"
#include "comm/comm.h"
#include "core/status.h"
#include "core/timer.h"
#include "comm/comm_worker.h"

#define WARMUP 3
#define REPEATS 25
#define TIMEOUT_S 30.0

typedef struct bench_rank {
    crew_comm comm;
    float *buf;
    int64_t n;
    double times[2][REPEATS];    /* [one value, the full buffer][repeat] */
    crew_status status;
    pthread_t thread;
} bench_rank;

static crew_status bench(bench_rank *b)
{
    crew_comm_worker w;
    CREW_TRY(crew_comm_worker_start(&w, b->comm, TIMEOUT_S));
    crew_status s = CREW_OK;
    for (int size = 0; size < 2 && !s; size++) {
        int64_t n = size ? b->n : 1;
        for (int r = -WARMUP; r < REPEATS && !s; r++) {
            double t0 = crew_now();
            s = crew_comm_worker_allreduce(&w, b->buf, n, CREW_COMM_F32, CREW_REDUCE_SUM);
            if (r >= 0) b->times[size][r] = crew_now() - t0;
        }
    }
    crew_comm_worker_stop(&w);
    return s;
}

static void *bench_thread(void *arg)
{
    bench_rank *b = arg;
    b->status = bench(b);
    if (b->status) b->comm.ops->abort(b->comm.ctx, b->comm.rank);
    return NULL;
}

/* α and β from rank 0's medians: T(1 value) = α, T(S) = α + S/β (2(N − 1)/N = 1 for N = 2). */
static void fit_link(bench_rank *r0, int64_t bytes, crew_link *out)
{
    double lat = crew_scale_median(r0->times[0], REPEATS);
    double full = crew_scale_median(r0->times[1], REPEATS);
    out->alpha_s = lat;
    out->bytes_per_s = full > lat ? (double)bytes / (full - lat) : (double)bytes / 1e-7;
}

crew_status crew_scale_measure_shared_memory(int64_t bytes, crew_link *out)
{
    if (!out || bytes < 4 || bytes > ((int64_t)1 << 34))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the shared-memory benchmark takes 4 B to 16 GiB, got %lld",
                           (long long)bytes);
    crew_local_comm *lc;
    CREW_TRY(crew_local_comm_create(2, &lc));
    bench_rank r[2];
    memset(r, 0, sizeof r);
    crew_status s = CREW_OK;
    for (int i = 0; i < 2 && !s; i++) {
        r[i].comm = crew_local_comm_rank(lc, i);
        r[i].n = bytes / (int64_t)sizeof(float);
        if (!(r[i].buf = calloc((size_t)r[i].n, sizeof(float)))) s = CREW_OOM();
    }
    if (!s && pthread_create(&r[1].thread, NULL, bench_thread, &r[1]) != 0)
        s = crew_errorf(CREW_CODE_INTERNAL, "could not start the benchmark's second thread");
    if (!s) {
        bench_thread(&r[0]);
        pthread_join(r[1].thread, NULL);
        s = r[0].status ? r[0].status : r[1].status;
        if (r[0].status && r[1].status) crew_status_free(r[1].status);
    }
    if (!s) fit_link(&r[0], bytes, out);
    for (int i = 0; i < 2; i++) free(r[i].buf);
    crew_local_comm_free(lc);
    return s;
}
