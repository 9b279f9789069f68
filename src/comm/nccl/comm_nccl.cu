/* comm_nccl.cu — comm.h's table over NCCL, for ranks that each own a GPU (comm_nccl.h).
 *
 * Every collective runs on the rank's communication stream, which first waits for the work
 * enqueued so far on the rank's compute stream (a gradient bucket is complete when its
 * collective is called); the calling thread then polls it against the deadline, and the compute
 * stream waits for it before anything enqueued later, so the results are in place for the
 * optimizer whatever thread enqueues it.
 *
 * The ordered sums (the default): slice p of the n values, [n·p/P, n·(p+1)/P), belongs to rank
 * p. Each rank sends every rank its slice of each of its k inputs (one NCCL group of sends and
 * receives: an all-to-all); rank p sums the P·k pieces it received in (rank, input) order with
 * k_ordered_sum, which adds exactly as comm_local.c's ordered_range and reduce_range do (the first
 * piece copied, the others added one by one in float or double, AVG a multiplication by 1/P), so
 * the results are theirs bit for bit; then each rank sends its slice to every other (an
 * all-gather of unequal pieces, as sends and receives). Which rank sums which slice does not
 * change a bit of the result, only who does the work. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/body/reduce.h"

extern "C" {
#include "comm/comm_nccl.h"
#include "core/status.h"
#include "core/timer.h"
}

static_assert(sizeof(ncclUniqueId) == CREW_NCCL_ID_BYTES, "crew_nccl_id must hold an ncclUniqueId");

typedef struct nccl_rank {
    struct crew_nccl_clique *q;
    int local, rank;            /* index in the clique; rank in the run */
    int gpu;
    ncclComm_t comm;
    cudaStream_t compute;       /* the rank's backend's compute stream (not ours) */
    cudaStream_t stream;        /* the collectives' */
    cudaEvent_t ready, done;    /* compute → stream, stream → compute */
    void *scratch;              /* the received pieces of an ordered sum */
    size_t scratch_bytes;
    float *unit;                /* [1] the barrier's all-reduce */
    uint64_t calls;             /* collectives started, under q->mu (the missing ranks' report) */
    int aborted;                /* under q->mu */
} nccl_rank;

struct crew_nccl_clique {
    int world, first, n, unordered;
    nccl_rank *ranks;           /* [n] */
    pthread_mutex_t mu;
    int failed;                 /* a collective failed or timed out: every rank stops */
    char failure[320];
};

/* ------------------------------------------------------------------ errors and waiting */

static size_t type_bytes(crew_comm_type t) { return t == CREW_COMM_F64 ? 8 : 4; }
static ncclDataType_t nccl_type(crew_comm_type t) { return t == CREW_COMM_F64 ? ncclFloat64 : ncclFloat32; }

/* Aborts r's communicator once (NCCL frees what it holds and ends what it enqueued). Only the
 * thread using r's handle does it: NCCL's calls on a communicator must not overlap its abort. */
static void abort_own(nccl_rank *r)
{
    pthread_mutex_lock(&r->q->mu);
    int first = !r->aborted && r->comm;
    r->aborted = 1;
    pthread_mutex_unlock(&r->q->mu);
    if (first) ncclCommAbort(r->comm);
}

/* Poisons the clique with its first failure (the other ranks of this process see it at their next
 * poll and stop), aborts r's communicator, and returns the failure as r's error. */
static crew_status fail(nccl_rank *r, crew_code code, const char *why)
{
    crew_nccl_clique *q = r->q;
    pthread_mutex_lock(&q->mu);
    if (!q->failed) {
        q->failed = 1;
        snprintf(q->failure, sizeof q->failure, "%s", why);
    }
    crew_status s = crew_errorf(code, "rank %d: %s", r->rank, q->failure);
    pthread_mutex_unlock(&q->mu);
    abort_own(r);
    return s;
}

static int clique_failed(crew_nccl_clique *q)
{
    pthread_mutex_lock(&q->mu);
    int failed = q->failed;
    pthread_mutex_unlock(&q->mu);
    return failed;
}

static crew_status nccl_failed(nccl_rank *r, ncclResult_t res, const char *what)
{
    char why[320];
    const char *last = r->comm ? ncclGetLastError(r->comm) : NULL;
    snprintf(why, sizeof why, "NCCL %s failed on cuda:%d: %s%s%s", what, r->gpu, ncclGetErrorString(res),
             last && *last ? ": " : "", last ? last : "");
    return fail(r, CREW_CODE_IO, why);
}

/* The ranks of this process that have not started collective number `call`, "1, 3", or a note
 * that the one missing is in another process. */
static void missing(nccl_rank *r, uint64_t call, double timeout_s, const char *what, char *buf, size_t len)
{
    crew_nccl_clique *q = r->q;
    char who[160] = "";
    size_t used = 0;
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < q->n && used < sizeof who; i++)
        if (q->ranks[i].calls < call)
            used += (size_t)snprintf(who + used, sizeof who - used, used ? ", %d" : "%d", q->ranks[i].rank);
    pthread_mutex_unlock(&q->mu);
    if (used)
        snprintf(buf, len, "NCCL %s: rank%s %s did not arrive within %gs", what, strchr(who, ',') ? "s" : "", who,
                 timeout_s);
    else
        snprintf(buf, len, "NCCL %s: a rank outside this process's %d-%d did not arrive within %gs", what, q->first,
                 q->first + q->n - 1, timeout_s);
}

static void relax(int spins)
{
    if (spins < 1000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 100000}; /* 0.1 ms */
        nanosleep(&ts, NULL);
    }
}

/* One look while waiting: CREW_OK to wait on, or the clique's failure, or the deadline passed. */
static crew_status still_waiting(nccl_rank *r, double until, double timeout_s, uint64_t call, const char *what)
{
    if (clique_failed(r->q)) return fail(r, CREW_CODE_TIMEOUT, "another rank's collective failed");
    if (crew_now() <= until) return CREW_OK;
    char why[320];
    missing(r, call, timeout_s, what, why, sizeof why);
    return fail(r, CREW_CODE_TIMEOUT, why);
}

/* Waits until NCCL has taken the calls just made (a non-blocking communicator answers
 * ncclInProgress while it is still connecting or enqueuing). */
static crew_status taken(nccl_rank *r, ncclResult_t res, double until, double timeout_s, uint64_t call, const char *what)
{
    for (int spins = 0; res == ncclInProgress; spins++) {
        CREW_TRY(still_waiting(r, until, timeout_s, call, what));
        relax(spins);
        ncclCommGetAsyncError(r->comm, &res);
    }
    return res == ncclSuccess ? CREW_OK : nccl_failed(r, res, what);
}

/* Begins collective number r->calls + 1: the communication stream after the compute stream. */
static crew_status begin(nccl_rank *r, uint64_t *call)
{
    crew_nccl_clique *q = r->q;
    pthread_mutex_lock(&q->mu);
    int failed = q->failed;
    *call = ++r->calls;
    pthread_mutex_unlock(&q->mu);
    if (failed) return fail(r, CREW_CODE_TIMEOUT, "the NCCL communicator failed before");
    cudaSetDevice(r->gpu);
    cudaError_t e = cudaEventRecord(r->ready, r->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(r->stream, r->ready, 0);
    if (e != cudaSuccess) {
        char why[160];
        snprintf(why, sizeof why, "cuda:%d: ordering a collective after the compute stream: %s", r->gpu,
                 cudaGetErrorString(e));
        return fail(r, CREW_CODE_IO, why);
    }
    return CREW_OK;
}

/* Waits for everything enqueued on the communication stream, at most until `until`; then the
 * compute stream waits for it too. */
static crew_status finish(nccl_rank *r, double until, double timeout_s, uint64_t call, const char *what)
{
    cudaError_t e = cudaEventRecord(r->done, r->stream);
    for (int spins = 0; e == cudaSuccess; spins++) {
        cudaError_t ready = cudaEventQuery(r->done);
        if (ready == cudaSuccess) break;
        if (ready != cudaErrorNotReady) {
            e = ready;
            break;
        }
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(r->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) return nccl_failed(r, st, what);
        CREW_TRY(still_waiting(r, until, timeout_s, call, what));
        relax(spins);
    }
    cudaGetLastError(); /* cudaErrorNotReady is this thread's last error now: not the next launch's */
    if (e == cudaSuccess) e = cudaStreamWaitEvent(r->compute, r->done, 0);
    if (e != cudaSuccess) {
        char why[200];
        snprintf(why, sizeof why, "cuda:%d: NCCL %s: %s", r->gpu, what, cudaGetErrorString(e));
        return fail(r, CREW_CODE_IO, why);
    }
    return CREW_OK;
}

/* ------------------------------------------------------------------ the ordered sums */

/* out[i] = parts[0][i] + parts[1][i] + ... in that order (rows pieces of len values), then × inv
 * for a mean: comm_local.c's arithmetic, one thread per value (backend/body/reduce.h). */
__device__ static float ordered_sum(const float *parts, int64_t rows, int64_t len, int avg, float inv, int64_t i)
{
    return crew_body_ordered_sum_f32(parts, rows, len, avg, inv, i);
}
__device__ static double ordered_sum(const double *parts, int64_t rows, int64_t len, int avg, double inv, int64_t i)
{
    return crew_body_ordered_sum_f64(parts, rows, len, avg, inv, i);
}

template <typename T>
__global__ void k_ordered_sum(const T *parts, int64_t rows, int64_t len, T *out, int avg, T inv)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = ordered_sum(parts, rows, len, avg, inv, i);
}

static void launch_sum(nccl_rank *r, const void *parts, int64_t rows, int64_t len, void *out, crew_comm_type t,
                       crew_reduce_op op)
{
    if (len <= 0) return;
    int64_t blocks = (len + 255) / 256;
    unsigned grid = (unsigned)(blocks > 65535 * 8 ? 65535 * 8 : blocks);
    const int P = r->q->world, avg = op == CREW_REDUCE_AVG;
    cudaGetLastError(); /* so that the check after the launch sees this launch's error only */
    if (t == CREW_COMM_F64)
        k_ordered_sum<double><<<grid, 256, 0, r->stream>>>((const double *)parts, rows, len, (double *)out, avg,
                                                           1.0 / (double)P);
    else
        k_ordered_sum<float><<<grid, 256, 0, r->stream>>>((const float *)parts, rows, len, (float *)out, avg,
                                                          1.0f / (float)P);
}

static crew_status reserve(nccl_rank *r, size_t bytes)
{
    if (bytes <= r->scratch_bytes) return CREW_OK;
    if (r->scratch) {
        cudaStreamSynchronize(r->stream); /* the old pieces may still be read */
        cudaFree(r->scratch);
        r->scratch = NULL;
        r->scratch_bytes = 0;
    }
    if (cudaMalloc(&r->scratch, bytes) != cudaSuccess) {
        cudaGetLastError();
        return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "rank %d: no room on cuda:%d for the %zu bytes of an ordered sum",
                           r->rank, r->gpu, bytes);
    }
    r->scratch_bytes = bytes;
    return CREW_OK;
}

/* One exchange of an ordered reduction. Rank p's piece of input j is in[j] + lo[p] .. hi[p]
 * (elements); this rank's sum of every rank's pieces lands at mine. */
typedef struct pieces {
    const void *const *in;
    int k;
    const int64_t *lo, *hi;     /* [P] */
    void *mine;
} pieces;

static crew_status reduce_pieces(nccl_rank *r, const pieces *pc, crew_comm_type t, crew_reduce_op op, double until,
                                 double timeout_s, uint64_t call, const char *what)
{
    const int P = r->q->world, me = r->rank;
    const size_t sz = type_bytes(t);
    const int64_t len = pc->hi[me] - pc->lo[me];
    CREW_TRY(reserve(r, (size_t)P * (size_t)pc->k * (size_t)(len > 0 ? len : 1) * sz));
    ncclResult_t res = ncclGroupStart();
    for (int p = 0; p < P && (res == ncclSuccess || res == ncclInProgress); p++) {
        const int64_t m = pc->hi[p] - pc->lo[p];
        for (int j = 0; j < pc->k && m > 0 && (res == ncclSuccess || res == ncclInProgress); j++)
            res = ncclSend((const char *)pc->in[j] + (size_t)pc->lo[p] * sz, (size_t)m, nccl_type(t), p, r->comm,
                           r->stream);
    }
    for (int p = 0; p < P && len > 0 && (res == ncclSuccess || res == ncclInProgress); p++)
        for (int j = 0; j < pc->k && (res == ncclSuccess || res == ncclInProgress); j++)
            res = ncclRecv((char *)r->scratch + ((size_t)p * (size_t)pc->k + (size_t)j) * (size_t)len * sz,
                           (size_t)len, nccl_type(t), p, r->comm, r->stream);
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess || res == ncclInProgress) res = end;
    CREW_TRY(taken(r, res, until, timeout_s, call, what));
    launch_sum(r, r->scratch, (int64_t)P * pc->k, len, pc->mine, t, op);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        char why[160];
        snprintf(why, sizeof why, "cuda:%d: the ordered sum of a %s: %s", r->gpu, what, cudaGetErrorString(e));
        return fail(r, CREW_CODE_IO, why);
    }
    return CREW_OK;
}

/* Every rank's range [lo[p], hi[p]) of buf into every rank's buf: sends and receives, this rank's
 * own range staying where it is. */
static crew_status gather_ranges(nccl_rank *r, void *buf, const int64_t *lo, const int64_t *hi, crew_comm_type t,
                                 double until, double timeout_s, uint64_t call, const char *what)
{
    const int P = r->q->world, me = r->rank;
    const size_t sz = type_bytes(t);
    ncclResult_t res = ncclGroupStart();
    for (int p = 0; p < P && (res == ncclSuccess || res == ncclInProgress); p++) {
        if (p == me) continue;
        if (hi[me] > lo[me])
            res = ncclSend((const char *)buf + (size_t)lo[me] * sz, (size_t)(hi[me] - lo[me]), nccl_type(t), p,
                           r->comm, r->stream);
        if (hi[p] > lo[p] && (res == ncclSuccess || res == ncclInProgress))
            res = ncclRecv((char *)buf + (size_t)lo[p] * sz, (size_t)(hi[p] - lo[p]), nccl_type(t), p, r->comm,
                           r->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess || res == ncclInProgress) res = end;
    return taken(r, res, until, timeout_s, call, what);
}

/* Slices of n values: [n·p/P, n·(p+1)/P), into lo and hi [P]. */
static int64_t *even_slices(int P, int64_t n, int64_t **hi)
{
    int64_t *lo = (int64_t *)malloc(2 * (size_t)P * sizeof *lo);
    if (!lo) return NULL;
    *hi = lo + P;
    for (int p = 0; p < P; p++) {
        lo[p] = n * p / P;
        (*hi)[p] = n * (p + 1) / P;
    }
    return lo;
}

/* The ordered all-reduce of k inputs into out (n values), or of buf in place (k = 1). */
static crew_status ordered_allreduce(nccl_rank *r, const void *const *in, int k, void *out, int64_t n,
                                     crew_comm_type t, crew_reduce_op op, double timeout_s, const char *what)
{
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    int64_t *hi, *lo = even_slices(r->q->world, n, &hi);
    if (!lo) return CREW_OOM();
    const size_t sz = type_bytes(t);
    pieces pc = {in, k, lo, hi, (char *)out + (size_t)lo[r->rank] * sz};
    crew_status s = reduce_pieces(r, &pc, t, op, until, timeout_s, call, what);
    if (!s) s = gather_ranges(r, out, lo, hi, t, until, timeout_s, call, what);
    free(lo);
    if (!s) s = finish(r, until, timeout_s, call, what);
    return s;
}

/* ------------------------------------------------------------------ the table */

static nccl_rank *rank_of(void *ctx) { return (nccl_rank *)ctx; }

static crew_status nccl_allreduce(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, crew_reduce_op op,
                                  double timeout_s)
{
    (void)rank;
    nccl_rank *r = rank_of(ctx);
    if (r->q->world == 1 || n <= 0) return CREW_OK;
    if (!r->q->unordered) {
        const void *in[1] = {buf};
        return ordered_allreduce(r, in, 1, buf, n, t, op, timeout_s, "all-reduce");
    }
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    ncclResult_t res = ncclAllReduce(buf, buf, (size_t)n, nccl_type(t), op == CREW_REDUCE_AVG ? ncclAvg : ncclSum,
                                     r->comm, r->stream);
    CREW_TRY(taken(r, res, until, timeout_s, call, "all-reduce"));
    return finish(r, until, timeout_s, call, "all-reduce");
}

static crew_status nccl_allreduce_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                          double timeout_s)
{
    (void)rank;
    nccl_rank *r = rank_of(ctx);
    if (n <= 0) return CREW_OK;
    if (!r->q->unordered || r->q->world == 1)
        return ordered_allreduce(r, (const void *const *)in, k, out, n, CREW_COMM_F32, CREW_REDUCE_SUM, timeout_s,
                                 "all-reduce");
    /* The fast path: this rank's k inputs in order, then NCCL's all-reduce of the sums. */
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    CREW_TRY(reserve(r, (size_t)k * (size_t)n * sizeof(float)));
    cudaError_t e = cudaSuccess;
    for (int j = 0; j < k && e == cudaSuccess; j++)
        e = cudaMemcpyAsync((float *)r->scratch + (size_t)j * (size_t)n, in[j], (size_t)n * sizeof(float),
                            cudaMemcpyDeviceToDevice, r->stream);
    if (e == cudaSuccess) {
        launch_sum(r, r->scratch, k, n, out, CREW_COMM_F32, CREW_REDUCE_SUM);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
        char why[160];
        snprintf(why, sizeof why, "cuda:%d: summing a replica's micro-batches: %s", r->gpu, cudaGetErrorString(e));
        return fail(r, CREW_CODE_IO, why);
    }
    ncclResult_t res = ncclAllReduce(out, out, (size_t)n, ncclFloat32, ncclSum, r->comm, r->stream);
    CREW_TRY(taken(r, res, until, timeout_s, call, "all-reduce"));
    return finish(r, until, timeout_s, call, "all-reduce");
}

static crew_status nccl_reduce_scatter_ordered(void *ctx, int rank, float *const *in, int k, float *out, int64_t n,
                                               const int64_t *bounds, double timeout_s)
{
    (void)rank;
    (void)n;
    nccl_rank *r = rank_of(ctx);
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    pieces pc = {(const void *const *)in, k, bounds, bounds + 1, out + bounds[r->rank]};
    crew_status s = reduce_pieces(r, &pc, CREW_COMM_F32, CREW_REDUCE_SUM, until, timeout_s, call, "reduce-scatter");
    return s ? s : finish(r, until, timeout_s, call, "reduce-scatter");
}

static crew_status nccl_allgather_ranges(void *ctx, int rank, float *buf, int64_t n, const int64_t *bounds,
                                         double timeout_s)
{
    (void)rank;
    (void)n;
    nccl_rank *r = rank_of(ctx);
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    crew_status s = gather_ranges(r, buf, bounds, bounds + 1, CREW_COMM_F32, until, timeout_s, call, "all-gather");
    return s ? s : finish(r, until, timeout_s, call, "all-gather");
}

static crew_status nccl_reduce_scatter(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                       crew_reduce_op op, double timeout_s)
{
    (void)rank;
    nccl_rank *r = rank_of(ctx);
    const int P = r->q->world;
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    int64_t *bounds = (int64_t *)malloc(((size_t)P + 1) * sizeof *bounds);
    if (!bounds) return CREW_OOM();
    for (int p = 0; p <= P; p++) bounds[p] = n * p; /* rank p's chunk of every rank's send */
    const void *in[1] = {send};
    pieces pc = {in, 1, bounds, bounds + 1, recv};
    crew_status s = reduce_pieces(r, &pc, t, op, until, timeout_s, call, "reduce-scatter");
    free(bounds);
    return s ? s : finish(r, until, timeout_s, call, "reduce-scatter");
}

static crew_status nccl_broadcast(void *ctx, int rank, void *buf, int64_t n, crew_comm_type t, int root,
                                  double timeout_s)
{
    (void)rank;
    nccl_rank *r = rank_of(ctx);
    if (root < 0 || root >= r->q->world)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "broadcast: root %d is not a rank of %d", root, r->q->world);
    if (r->q->world == 1 || n <= 0) return CREW_OK;
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    ncclResult_t res = ncclBroadcast(buf, buf, (size_t)n, nccl_type(t), root, r->comm, r->stream);
    CREW_TRY(taken(r, res, until, timeout_s, call, "broadcast"));
    return finish(r, until, timeout_s, call, "broadcast");
}

static crew_status nccl_allgather(void *ctx, int rank, const void *send, void *recv, int64_t n, crew_comm_type t,
                                  double timeout_s)
{
    (void)rank;
    nccl_rank *r = rank_of(ctx);
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    ncclResult_t res = ncclAllGather(send, recv, (size_t)n, nccl_type(t), r->comm, r->stream);
    CREW_TRY(taken(r, res, until, timeout_s, call, "all-gather"));
    return finish(r, until, timeout_s, call, "all-gather");
}

static crew_status nccl_barrier(void *ctx, int rank, double timeout_s)
{
    (void)rank;
    nccl_rank *r = rank_of(ctx);
    if (r->q->world == 1) return CREW_OK;
    const double until = crew_now() + timeout_s;
    uint64_t call;
    CREW_TRY(begin(r, &call));
    ncclResult_t res = ncclAllReduce(r->unit, r->unit, 1, ncclFloat32, ncclSum, r->comm, r->stream);
    CREW_TRY(taken(r, res, until, timeout_s, call, "barrier"));
    return finish(r, until, timeout_s, call, "barrier");
}

/* May come from another thread than the one using the handle: it poisons the clique, and each
 * rank's own thread aborts its communicator at its next poll. */
static void nccl_abort(void *ctx, int rank)
{
    crew_nccl_clique *q = rank_of(ctx)->q;
    pthread_mutex_lock(&q->mu);
    if (!q->failed) {
        q->failed = 1;
        snprintf(q->failure, sizeof q->failure, "rank %d stopped", rank);
    }
    pthread_mutex_unlock(&q->mu);
}

static const crew_comm_ops nccl_ops = {
    /* .name */ "nccl",
    /* .allreduce */ nccl_allreduce,
    /* .broadcast */ nccl_broadcast,
    /* .allgather */ nccl_allgather,
    /* .reduce_scatter */ nccl_reduce_scatter,
    /* .allreduce_ordered */ nccl_allreduce_ordered,
    /* .reduce_scatter_ordered */ nccl_reduce_scatter_ordered,
    /* .allgather_ranges */ nccl_allgather_ranges,
    /* .barrier */ nccl_barrier,
    /* .send: pipelines keep the host path (docs/GPU.md) */ NULL,
    /* .recv */ NULL,
    /* .abort */ nccl_abort,
};

/* ------------------------------------------------------------------ lifecycle */

extern "C" crew_status crew_nccl_id_new(crew_nccl_id *out)
{
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess)
        return crew_errorf(CREW_CODE_IO, "NCCL could not make a unique id: %s", ncclGetErrorString(res));
    memcpy(out->bytes, &id, sizeof id);
    return CREW_OK;
}

extern "C" crew_comm crew_nccl_clique_rank(crew_nccl_clique *q, int i)
{
    crew_comm c = {&nccl_ops, &q->ranks[i], q->ranks[i].rank, q->world};
    return c;
}

extern "C" void crew_nccl_clique_free(crew_nccl_clique *q)
{
    if (!q) return;
    /* A clean end: finalize every communicator (non-blocking, together, since one thread holds
     * them all), wait a while for it, then destroy; a failed one is aborted. */
    pthread_mutex_lock(&q->mu);
    int clean = !q->failed;
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n && clean; i++) {
        nccl_rank *r = &q->ranks[i];
        if (!r->comm) continue;
        cudaSetDevice(r->gpu);
        cudaStreamSynchronize(r->stream);
        ncclResult_t res = ncclCommFinalize(r->comm);
        if (res != ncclSuccess && res != ncclInProgress) clean = 0;
    }
    const double until = crew_now() + 30.0;
    int finalizing = 0; /* a finalize still running: NCCL's own thread works on the communicator */
    for (int i = 0; i < q->n && clean; i++) {
        ncclResult_t st = ncclInProgress;
        for (int spins = 0; st == ncclInProgress && crew_now() < until; spins++) {
            if (ncclCommGetAsyncError(q->ranks[i].comm, &st) != ncclSuccess) break;
            if (st == ncclInProgress) relax(spins);
        }
        finalizing |= st == ncclInProgress;
        if (st != ncclSuccess) clean = 0;
    }
    for (int i = 0; i < q->n; i++) {
        nccl_rank *r = &q->ranks[i];
        cudaSetDevice(r->gpu);
        /* after a finalize that never ended the communicators are left as they are (leaked): aborting
         * one under NCCL's finalize would race it */
        if (r->comm && !r->aborted && !finalizing) {
            if (clean)
                ncclCommDestroy(r->comm);
            else
                ncclCommAbort(r->comm);
        }
        if (r->stream) cudaStreamDestroy(r->stream);
        if (r->ready) cudaEventDestroy(r->ready);
        if (r->done) cudaEventDestroy(r->done);
        cudaFree(r->scratch);
        cudaFree(r->unit);
    }
    pthread_mutex_destroy(&q->mu);
    free(q->ranks);
    free(q);
}

/* The rank's stream, events and scratch on its GPU. */
static crew_status open_rank(nccl_rank *r, const crew_backend *device)
{
    void *stream = crew_cuda_backend_stream(device, &r->gpu);
    if (!stream)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "rank %d: NCCL needs a CUDA device, not %s", r->rank,
                           device->ops ? device->ops->name : "none");
    r->compute = (cudaStream_t)stream;
    cudaSetDevice(r->gpu);
    cudaError_t e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc((void **)&r->unit, sizeof(float));
    if (e == cudaSuccess) e = cudaMemset(r->unit, 0, sizeof(float));
    if (e != cudaSuccess)
        return crew_errorf(CREW_CODE_IO, "rank %d: cuda:%d: setting up NCCL's stream: %s", r->rank, r->gpu,
                           cudaGetErrorString(e));
    return CREW_OK;
}

/* NCCL refuses two ranks on one GPU (it may hang): say so first. */
static crew_status distinct_gpus(const crew_nccl_clique *q)
{
    for (int i = 0; i < q->n; i++)
        for (int j = 0; j < i; j++)
            if (q->ranks[i].gpu == q->ranks[j].gpu)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "ranks %d and %d are both on cuda:%d: NCCL needs a GPU "
                                   "of its own for every rank (more replicas than GPUs communicate through the host: "
                                   "--comm host)", q->ranks[j].rank, q->ranks[i].rank, q->ranks[i].gpu);
    return CREW_OK;
}

/* Opens every rank's communicator in one NCCL group, then waits for all of them. */
static crew_status init_comms(crew_nccl_clique *q, const crew_nccl_id *id, double timeout_s)
{
    ncclUniqueId uid;
    memcpy(&uid, id->bytes, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t res = ncclGroupStart();
    for (int i = 0; i < q->n && (res == ncclSuccess || res == ncclInProgress); i++) {
        cudaSetDevice(q->ranks[i].gpu);
        res = ncclCommInitRankConfig(&q->ranks[i].comm, q->world, uid, q->ranks[i].rank, &config);
    }
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess || res == ncclInProgress) res = end;
    if (res != ncclSuccess && res != ncclInProgress)
        return crew_errorf(CREW_CODE_IO, "NCCL could not open the communicator of ranks %d-%d: %s", q->first,
                           q->first + q->n - 1, ncclGetErrorString(res));
    const double until = crew_now() + timeout_s;
    for (int i = 0; i < q->n; i++) {
        ncclResult_t st = ncclInProgress;
        for (int spins = 0; st == ncclInProgress; spins++) {
            if (!q->ranks[i].comm || ncclCommGetAsyncError(q->ranks[i].comm, &st) != ncclSuccess) st = ncclInternalError;
            if (st != ncclInProgress) break;
            if (crew_now() > until)
                return crew_errorf(CREW_CODE_TIMEOUT, "NCCL: the communicator of %d ranks was not complete after %gs "
                                   "(this process has ranks %d-%d): a process of the run never joined", q->world,
                                   timeout_s, q->first, q->first + q->n - 1);
            relax(spins);
        }
        if (st != ncclSuccess)
            return crew_errorf(CREW_CODE_IO, "NCCL could not open rank %d's communicator on cuda:%d: %s",
                               q->ranks[i].rank, q->ranks[i].gpu, ncclGetErrorString(st));
    }
    return CREW_OK;
}

extern "C" crew_status crew_nccl_clique_create(const crew_nccl_id *id, int world, int first, int n,
                                               const crew_backend *devices, int unordered, double timeout_s,
                                               crew_nccl_clique **out)
{
    *out = NULL;
    crew_nccl_clique *q = (crew_nccl_clique *)calloc(1, sizeof *q);
    if (!q) return CREW_OOM();
    q->ranks = (nccl_rank *)calloc((size_t)n, sizeof *q->ranks);
    if (!q->ranks) {
        free(q);
        return CREW_OOM();
    }
    pthread_mutex_init(&q->mu, NULL);
    q->world = world;
    q->first = first;
    q->n = n;
    q->unordered = unordered;
    crew_status s = CREW_OK;
    for (int i = 0; i < n && !s; i++) {
        q->ranks[i].q = q;
        q->ranks[i].local = i;
        q->ranks[i].rank = first + i;
        s = open_rank(&q->ranks[i], &devices[i]);
    }
    if (!s) s = distinct_gpus(q);
    if (!s) s = init_comms(q, id, timeout_s);
    if (s) {
        pthread_mutex_lock(&q->mu);
        q->failed = 1; /* abort whatever was opened */
        pthread_mutex_unlock(&q->mu);
        crew_nccl_clique_free(q);
        return s;
    }
    *out = q;
    return CREW_OK;
}

extern "C" void crew_nccl_describe(char *buf, size_t len)
{
    int v = 0;
    if (!len) return;
    if (ncclGetVersion(&v) != ncclSuccess || v <= 0) {
        snprintf(buf, len, "unknown version");
        return;
    }
    /* NCCL_VERSION(X, Y, Z) = X·10000 + Y·100 + Z since 2.9 */
    snprintf(buf, len, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}
