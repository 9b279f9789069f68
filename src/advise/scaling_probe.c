/* scaling_probe.c — how fast replicas compute in lockstep on this machine, relative to one alone.
 *
 * A replica's step is single-threaded GEMMs plus memory-bound passes over its parameters (the
 * optimizer's update), and every step ends at a collective where all replicas meet. On an ideal
 * machine N replicas on N cores would each step as fast as one alone. Real machines fall short:
 * SMT siblings or a virtual machine's vCPUs share execution units, the cores share memory
 * bandwidth and the last-level cache, other processes take their turn, and in lockstep a delay of
 * any one replica delays them all. CPU-time accounting sees none of this, so the probe measures
 * work done: rounds of a replica-like mix (a dense layer's GEMM and an AdamW-like pass over
 * `stream_values` values), each round about `round_s` long and ending at a barrier of the
 * in-process communicator, on `threads` threads at once, against the same rounds on one thread
 * before and after (their mean, in case the machine's load drifted). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "advise/scaling.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/status.h"
#include "core/timer.h"
#include "comm/comm_worker.h"

#define MAX_PROBE_THREADS 1024
#define BARRIER_TIMEOUT_S 60.0
/* A dense layer's GEMM of a typical size: 128 rows, 784 inputs, 256 outputs (1.3 MB). */
#define PM 128
#define PN 256
#define PK 784

typedef struct probe_work {
    const crew_backend *be;
    int64_t stream;       /* values per array of the streaming pass */
    int units;            /* mix units per round */
    float *a, *b, *c, *s;
} probe_work;

typedef struct runner {
    probe_work w;
    crew_comm comm;       /* rounds end at its barrier */
    double seconds;
    int64_t rounds;
    crew_status status;
    pthread_t thread;
} runner;

/* An AdamW-like pass: reads four arrays, writes three. */
static void stream_pass(float *p, float *g, float *m, float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        m[i] = 0.9f * m[i] + 0.1f * g[i];
        v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
        p[i] -= 1e-3f * m[i] / (v[i] + 1e-8f);
    }
}

static void mix_unit(const probe_work *w)
{
    w->be->ops->gemm(w->be->ctx, 0, 0, PM, PN, PK, 1.0f, w->a, PK, w->b, PN, 0.0f, w->c, PN);
    stream_pass(w->s, w->s + w->stream, w->s + 2 * w->stream, w->s + 3 * w->stream, w->stream);
}

static crew_status work_init(probe_work *w, const crew_backend *be, int64_t stream)
{
    memset(w, 0, sizeof *w);
    w->be = be;
    w->stream = stream;
    w->units = 1;
    w->a = calloc(PM * PK, sizeof(float));
    w->b = calloc(PK * PN, sizeof(float));
    w->c = calloc(PM * PN, sizeof(float));
    w->s = calloc((size_t)(4 * stream), sizeof(float));
    return w->a && w->b && w->c && w->s ? CREW_OK : CREW_OOM();
}

static void work_free(probe_work *w)
{
    free(w->a);
    free(w->b);
    free(w->c);
    free(w->s);
}

/* Rounds until rank 0's clock says stop. Like a training step, a round ends with two small
 * all-reduces through the replica's communication thread (training's gradient and metrics
 * all-reduces, less the gradients' bytes, which the link's α and β account for). */
static void *run_rounds(void *arg)
{
    runner *r = arg;
    crew_comm_worker w;
    r->status = crew_comm_worker_start(&w, r->comm, BARRIER_TIMEOUT_S);
    if (r->status) {
        r->comm.ops->abort(r->comm.ctx, r->comm.rank);
        return NULL;
    }
    double start = crew_now();
    int stop = 0;
    while (!stop && !r->status) {
        for (int u = 0; u < r->w.units; u++) mix_unit(&r->w);
        double grad = 0.0, flag = r->comm.rank == 0 && crew_now() - start >= r->seconds;
        r->status = crew_comm_worker_allreduce(&w, &grad, 1, CREW_COMM_F64, CREW_REDUCE_SUM);
        if (!r->status) r->status = crew_comm_worker_allreduce(&w, &flag, 1, CREW_COMM_F64, CREW_REDUCE_SUM);
        stop = flag > 0; /* every rank stops at the same round */
        r->rounds++;
    }
    if (r->status) r->comm.ops->abort(r->comm.ctx, r->comm.rank);
    crew_comm_worker_stop(&w);
    return NULL;
}

/* n threads in lockstep for `seconds`: rounds per second. */
static crew_status lockstep(const crew_backend *be, const probe_work *proto, int n, double seconds, double *rate)
{
    crew_local_comm *lc;
    CREW_TRY(crew_local_comm_create(n, &lc));
    runner *r = calloc((size_t)n, sizeof *r);
    crew_status s = r ? CREW_OK : CREW_OOM();
    int ready = 0, started = 1;
    for (; !s && ready < n; ready++) {
        s = work_init(&r[ready].w, be, proto->stream);
        r[ready].w.units = proto->units;
        r[ready].comm = crew_local_comm_rank(lc, ready);
        r[ready].seconds = seconds;
    }
    double t0 = crew_now();
    for (int i = 1; !s && i < n; i++, started++)
        if (pthread_create(&r[i].thread, NULL, run_rounds, &r[i]) != 0)
            s = crew_errorf(CREW_CODE_INTERNAL, "the compute probe could not start thread %d of %d", i, n);
    if (!s) run_rounds(&r[0]);
    else if (started > 1) r[0].comm.ops->abort(r[0].comm.ctx, 0);
    for (int i = 1; i < started; i++) pthread_join(r[i].thread, NULL);
    double took = crew_now() - t0;
    for (int i = 0; i < n && r && !s; i++) s = r[i].status, r[i].status = CREW_OK;
    if (!s) *rate = took > 0 ? (double)r[0].rounds / took : 0.0;
    for (int i = 0; r && i < n; i++) crew_status_free(r[i].status);
    for (int i = 0; r && i < ready; i++) work_free(&r[i].w);
    free(r);
    crew_local_comm_free(lc);
    return s;
}

/* Mix units per round so that a round takes about round_s on one thread. */
static crew_status calibrate(probe_work *w, double round_s)
{
    double t0 = crew_now();
    int done = 0;
    while (crew_now() - t0 < 0.02 || done < 3) mix_unit(w), done++;
    double unit = (crew_now() - t0) / done;
    double units = unit > 0 ? round_s / unit : 1.0;
    w->units = units < 1 ? 1 : units > 100000 ? 100000 : (int)(units + 0.5);
    return CREW_OK;
}

crew_status crew_scale_probe_parallel(int threads, double seconds, int64_t stream_values, double round_s, double *speed)
{
    if (!speed || threads < 1 || threads > MAX_PROBE_THREADS || !(seconds > 0.0) || seconds > 60.0 ||
        stream_values < 1 || stream_values > ((int64_t)1 << 30) || !(round_s > 0.0) || round_s > 10.0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the compute probe takes 1 to %d threads for up to 60 s, rounds "
                           "of up to 10 s over 1 to 2^30 values; got %d threads, %g s, rounds of %g s over %lld",
                           MAX_PROBE_THREADS, threads, seconds, round_s, (long long)stream_values);
    crew_backend be;
    /* The plain CPU backend on host memory, whatever the build: this measures the CPU itself. One
     * BLAS thread per replica, as training runs them. */
    CREW_TRY(crew_cpu_backend_create(1, &be));
    probe_work proto;
    double before = 0, together = 0, after = 0;
    crew_status s = work_init(&proto, &be, stream_values);
    if (!s) s = calibrate(&proto, round_s);
    if (!s) s = lockstep(&be, &proto, 1, seconds / 4, &before);
    if (!s) s = lockstep(&be, &proto, threads, seconds / 2, &together);
    if (!s) s = lockstep(&be, &proto, 1, seconds / 4, &after);
    work_free(&proto);
    crew_device_close(&be);
    CREW_TRY(s);
    double alone = 0.5 * (before + after);
    *speed = alone > 0 ? together / alone : 1.0;
    if (*speed > 1.0) *speed = 1.0;
    return CREW_OK;
}
