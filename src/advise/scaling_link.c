/* scaling_link.c — a link between two replicas measured as training uses it: two threads, each
 * with a replica's communication thread, all-reduce a buffer of the gradients' size (submit to the
 * worker, wait for it), and one value for the latency. Between CPU replicas the buffers are host
 * memory and the link is shared memory; between devices the host cannot reach (GPUs) the buffers
 * are device memory and the link is NCCL, or the staged path through host copies, whichever a run
 * on that kind would take. A device's host↔device copies are measured on their own too. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "advise/scaling.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
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

/* Both ranks' all-reduces, rank 1 on a thread of its own; α and β from rank 0's. */
static crew_status bench_pair(bench_rank r[2], int64_t bytes, crew_link *out)
{
    if (pthread_create(&r[1].thread, NULL, bench_thread, &r[1]) != 0)
        return crew_errorf(CREW_CODE_INTERNAL, "could not start the benchmark's second thread");
    bench_thread(&r[0]);
    pthread_join(r[1].thread, NULL);
    crew_status s = r[0].status ? r[0].status : r[1].status;
    if (r[0].status && r[1].status) crew_status_free(r[1].status);
    if (!s) fit_link(&r[0], bytes, out);
    return s;
}

static crew_status check_bytes(int64_t bytes, const char *what)
{
    if (bytes >= 4 && bytes <= ((int64_t)1 << 34)) return CREW_OK;
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the %s benchmark takes 4 B to 16 GiB, got %lld", what,
                       (long long)bytes);
}

crew_status crew_scale_measure_shared_memory(int64_t bytes, crew_link *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_measure_shared_memory: NULL argument");
    CREW_TRY(check_bytes(bytes, "shared-memory"));
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
    if (!s) s = bench_pair(r, bytes, out);
    if (!s) snprintf(out->name, sizeof out->name, "shared memory");
    for (int i = 0; i < 2; i++) free(r[i].buf);
    crew_local_comm_free(lc);
    return s;
}

/* Two devices of a kind the host cannot reach, and the handles a run would give their ranks. */
typedef struct device_pair {
    crew_backend dev[2];
    crew_local_comm *lc;
    crew_staged_comm *staged[2];
    crew_nccl_clique *nccl;
} device_pair;

static void pair_close(device_pair *p)
{
#ifdef CREW_HAVE_NCCL
    crew_nccl_clique_free(p->nccl);
#endif
    for (int i = 0; i < 2; i++) {
        crew_staged_comm_free(p->staged[i]);
        crew_device_close(&p->dev[i]);
    }
    crew_local_comm_free(p->lc);
}

/* The ranks' handles: NCCL where the kind has it and each rank has a GPU of its own (as --comm auto
 * picks it), else staged handles over the in-process communicator. */
static crew_status pair_comms(device_pair *p, const char *kind, crew_comm comm[2], crew_link *out)
{
    const crew_device_kind *k = crew_device_kind_find(kind);
#ifdef CREW_HAVE_NCCL
    if (k->nccl && k->available() >= 2) {
        crew_nccl_id id;
        CREW_TRY(crew_nccl_id_new(&id));
        CREW_TRY(crew_nccl_clique_create(&id, 2, 0, 2, p->dev, 0, TIMEOUT_S, &p->nccl));
        for (int i = 0; i < 2; i++) comm[i] = crew_nccl_clique_rank(p->nccl, i);
        snprintf(out->name, sizeof out->name, "NCCL between %s:0 and %s:1", kind, kind);
        return CREW_OK;
    }
#endif
    CREW_TRY(crew_local_comm_create(2, &p->lc));
    for (int i = 0; i < 2; i++) {
        CREW_TRY(crew_local_comm_attach(p->lc, i, NULL)); /* the staged copies are host memory */
        CREW_TRY(crew_staged_comm_create(crew_local_comm_rank(p->lc, i), &p->dev[i], &p->staged[i]));
        comm[i] = crew_staged_comm_rank(p->staged[i]);
    }
    snprintf(out->name, sizeof out->name, "host copies between %s:0 and %s:%d", kind, kind,
             k->available() > 1 ? 1 : 0);
    return CREW_OK;
}

crew_status crew_scale_measure_device_link(const char *kind, int64_t bytes, crew_link *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_measure_device_link: NULL argument");
    CREW_TRY(check_bytes(bytes, "device link"));
    device_pair p;
    memset(&p, 0, sizeof p);
    crew_status s = CREW_OK;
    for (int i = 0; i < 2 && !s; i++) s = crew_device_open(kind, i, NULL, &p.dev[i]);
    if (!s && !crew_comm_needs_staging(&p.dev[0])) { /* a CPU kind: its replicas share memory */
        pair_close(&p);
        return crew_scale_measure_shared_memory(bytes, out);
    }
    bench_rank r[2];
    memset(r, 0, sizeof r);
    crew_comm comm[2];
    if (!s) s = pair_comms(&p, kind, comm, out);
    for (int i = 0; i < 2 && !s; i++) {
        r[i].comm = comm[i];
        r[i].n = bytes / (int64_t)sizeof(float);
        s = crew_dev_alloc_f32(&p.dev[i], r[i].n, &r[i].buf);
    }
    if (!s) s = bench_pair(r, bytes, out);
    for (int i = 0; i < 2; i++) crew_dev_free(&p.dev[i], r[i].buf);
    pair_close(&p);
    return s ? crew_error_prefix(s, "measuring the link between two %s devices: ", kind) : CREW_OK;
}

/* α and β of one direction's copies from their times: [one value, the full size][repeat]. */
static void fit_copies(double times[2][REPEATS], int64_t bytes, crew_link *out)
{
    double lat = crew_scale_median(times[0], REPEATS), full = crew_scale_median(times[1], REPEATS);
    out->alpha_s = lat;
    out->bytes_per_s = full > lat ? (double)bytes / (full - lat) : (double)bytes / 1e-7;
}

crew_status crew_scale_measure_copies(const char *kind, int64_t bytes, crew_link *up, crew_link *down)
{
    if (!up || !down) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_measure_copies: NULL argument");
    CREW_TRY(check_bytes(bytes, "copy"));
    crew_backend be;
    CREW_TRY(crew_device_open(kind, 0, NULL, &be));
    const int64_t n = bytes / (int64_t)sizeof(float);
    void *host = NULL;
    float *dev = NULL;
    double times[2][2][REPEATS]; /* [up, down][one value, the full size][repeat] */
    crew_status s = be.ops->host_alloc(be.ctx, CREW_DT_F32, n, &host);
    if (!s) s = crew_dev_alloc_f32(&be, n, &dev);
    for (int size = 0; size < 2 && !s; size++) {
        const int64_t m = size ? n : 1;
        for (int r = -WARMUP; r < REPEATS && !s; r++) {
            double t0 = crew_now();
            s = be.ops->upload(be.ctx, NULL, dev, host, m, CREW_DT_F32);
            if (!s) s = be.ops->sync(be.ctx, NULL);
            double t1 = crew_now();
            if (!s) s = be.ops->download(be.ctx, host, dev, m, CREW_DT_F32);
            if (r >= 0) {
                times[0][size][r] = t1 - t0;
                times[1][size][r] = crew_now() - t1;
            }
        }
    }
    if (!s) {
        fit_copies(times[0], bytes, up);
        fit_copies(times[1], bytes, down);
        snprintf(up->name, sizeof up->name, "host to %s:0", kind);
        snprintf(down->name, sizeof down->name, "%s:0 to host", kind);
    }
    crew_dev_free(&be, dev);
    if (host) be.ops->host_free(be.ctx, host);
    crew_device_close(&be);
    return s ? crew_error_prefix(s, "measuring the copies of %s:0: ", kind) : CREW_OK;
}
