/* step.c — a replica's micro-batches, gradient accumulation in a fixed order, and gradient
 * buckets all-reduced while the backward pass continues. */
#include "train/step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"

#define BYTES_PER_MB (1024.0 * 1024.0)

static crew_status alloc_buffers(crew_stepper *s)
{
    crew_model *m = s->m;
    int k = s->accumulation;
    if (k > 1 && s->replicas == 1) CREW_TRY(crew_dev_alloc_f32(&m->be, m->n_params, &s->acc));
    if (k > 1 && s->replicas > 1) {
        if (!(s->saved = calloc((size_t)k - 1, sizeof *s->saved))) return CREW_OOM();
        for (int j = 0; j < k - 1; j++) CREW_TRY(crew_dev_alloc_f32(&m->be, m->n_params, &s->saved[j]));
    }
    return CREW_OK;
}

int64_t crew_bucket_values(double bucket_mb)
{
    int64_t per = (int64_t)(bucket_mb * BYTES_PER_MB / sizeof(float));
    return per < 1 ? 1 : per;
}

double crew_one_bucket_mb(int64_t n_params)
{
    double kib = ceil((double)(n_params > 0 ? n_params : 1) * sizeof(float) / 1024.0);
    return kib / 1024.0;
}

double crew_hosts_bucket_mb(int64_t n_params)
{
    const double mb = crew_one_bucket_mb((n_params + CREW_HOSTS_BUCKETS - 1) / CREW_HOSTS_BUCKETS);
    return mb < CREW_HOSTS_BUCKET_MIN_MB ? CREW_HOSTS_BUCKET_MIN_MB : mb > CREW_DEFAULT_BUCKET_MB ? CREW_DEFAULT_BUCKET_MB : mb;
}

int crew_bucket_count(int64_t n_params, double bucket_mb)
{
    int64_t per = crew_bucket_values(bucket_mb);
    return n_params > 0 ? (int)((n_params + per - 1) / per) : 0;
}

crew_status crew_stepper_init(crew_stepper *s, crew_model *m, crew_comm_worker *worker, int rank, int replicas,
                              int64_t batch, int accumulation, double bucket_mb, int sync_bn)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->worker = worker;
    s->rank = rank;
    s->replicas = replicas;
    s->batch = batch;
    s->accumulation = accumulation;
    s->global_batch = (int64_t)replicas * accumulation * batch;
    s->sync_bn = sync_bn && replicas > 1;
    CREW_TRY(alloc_buffers(s));
    int64_t per = crew_bucket_values(bucket_mb), n = m->n_params;
    s->n_buckets = crew_bucket_count(n, bucket_mb);
    s->lo = calloc((size_t)s->n_buckets + 1, sizeof *s->lo);
    s->hi = calloc((size_t)s->n_buckets + 1, sizeof *s->hi);
    s->reqs = calloc((size_t)s->n_buckets + 1, sizeof *s->reqs);
    s->parts = calloc(((size_t)s->n_buckets + 1) * (size_t)accumulation, sizeof *s->parts);
    if (!s->lo || !s->hi || !s->reqs || !s->parts) return CREW_OOM();
    for (int b = 0; b < s->n_buckets; b++) { /* bucket 0 ends the buffer: its gradients finish first */
        s->hi[b] = n - (int64_t)b * per;
        s->lo[b] = s->hi[b] - per > 0 ? s->hi[b] - per : 0;
    }
    return CREW_OK;
}

void crew_stepper_release(crew_stepper *s)
{
    if (s->m) {
        const crew_backend *be = &s->m->be;
        crew_dev_free(be, s->acc);
        for (int j = 0; s->saved && j < s->accumulation - 1; j++) crew_dev_free(be, s->saved[j]);
    }
    free(s->saved);
    free(s->lo);
    free(s->hi);
    free(s->reqs);
    free(s->parts);
    free(s->bucket_bounds);
    crew_status_free(s->measure_status);
    memset(s, 0, sizeof *s);
}

void crew_shard_bounds(int64_t n_params, int ranks, int64_t *bounds)
{
    for (int r = 0; r < ranks; r++) {
        int64_t at = n_params * r / ranks;
        bounds[r] = at - at % CREW_SHARD_ALIGN;
    }
    bounds[ranks] = n_params;
}

crew_status crew_stepper_shard(crew_stepper *s, const int64_t *bounds)
{
    const int w = s->replicas + 1;
    s->bucket_bounds = calloc((size_t)(s->n_buckets + 1) * (size_t)w, sizeof *s->bucket_bounds);
    if (!s->bucket_bounds) return CREW_OOM();
    for (int b = 0; b < s->n_buckets; b++)
        for (int r = 0; r < w; r++) { /* the shard's part of the bucket, clamped to it */
            int64_t at = bounds[r] < s->lo[b] ? s->lo[b] : bounds[r] > s->hi[b] ? s->hi[b] : bounds[r];
            s->bucket_bounds[(size_t)b * w + r] = at - s->lo[b];
        }
    return CREW_OK;
}

/* Bucket b's all-reduce: its range of the final gradient, or with k > 1 every micro-batch's
 * gradient in order (the last is the model's own buffer), summed into that range. Returns 0 when a
 * test seam says the bucket is not to be reduced (hooks.h). */
static int fill_request(crew_stepper *s, int b, crew_comm_request *r)
{
    const int k = s->accumulation;
    memset(r, 0, sizeof *r);
    r->buf = s->final + s->lo[b];
    r->n = s->hi[b] - s->lo[b];
    r->type = CREW_COMM_F32;
    r->op = CREW_REDUCE_SUM;
    if (k > 1 || s->bucket_bounds) {
        float **parts = s->parts + (size_t)b * k;
        for (int j = 0; j < k - 1; j++) parts[j] = s->saved[j] + s->lo[b];
        parts[k - 1] = s->m->grads + s->lo[b];
        r->parts = parts;
        r->k = k;
    }
    if (s->bucket_bounds) r->bounds = s->bucket_bounds + (size_t)b * (size_t)(s->replicas + 1);
    return s->hooks && s->hooks->bucket ? s->hooks->bucket(s->hooks_user, s->who, b, s->n_buckets, r) : 1;
}

/* With a single bucket (every model under --bucket-mb) the all-reduce can only start once the
 * backward pass is over, so the communication thread would overlap nothing: the replica runs it
 * itself after backward (reduce_single), saving the two thread hand-offs per step. */
static int single_bucket(const crew_stepper *s) { return s->n_buckets == 1; }

static void launch_ready_buckets(crew_stepper *s, int64_t done_from)
{
    if (!s->worker || single_bucket(s)) return;
    while (s->launched < s->n_buckets && s->lo[s->launched] >= done_from) {
        int b = s->launched++;
        if (fill_request(s, b, &s->reqs[b])) {
            crew_comm_worker_submit(s->worker, &s->reqs[b]);
            continue;
        }
        s->reqs[b].done = 1; /* a seam left it out: as if reduced at once */
        s->reqs[b].status = CREW_OK;
        s->reqs[b].started = s->reqs[b].finished = crew_now();
    }
}

/* The single bucket, on the replica's own thread: its queue is empty (batch-norm sums are waited
 * for where they are made), so the communicator is not in use by the worker. All of it is
 * exposed: nothing ran beside it. */
static crew_status reduce_single(crew_stepper *s, crew_step_times *times)
{
    double t0 = crew_now();
    crew_status st = CREW_OK;
    if (fill_request(s, 0, &s->reqs[0])) st = crew_comm_request_run(&s->worker->comm, &s->reqs[0], s->worker->timeout_s);
    times->comm_exposed_s += crew_now() - t0;
    return st;
}

/* Gradients in [lo, done_from) are final for the current micro-batch: set them aside or add them
 * up, and start the buckets they complete. */
static void grads_ready(void *user, int64_t lo)
{
    crew_stepper *s = user;
    crew_model *m = s->m;
    const crew_backend_ops *o = m->be.ops;
    int64_t n = s->done_from - lo;
    if (n <= 0) return;
    int last = s->micro == s->accumulation - 1;
    if (s->measure && !s->measure_status) { /* before the range is added up or reduced: this micro-batch's own */
        double part = 0.0;
        s->measure_status = o->sum_squares(m->be.ctx, m->grads + lo, n, &part);
        s->sq_small += part;
    }
    if (s->acc) { /* one replica: the running sum, in micro-batch order */
        if (s->micro == 0)
            o->copy(m->be.ctx, s->acc + lo, m->grads + lo, n);
        else if (!s->hooks || !s->hooks->accumulates || s->hooks->accumulates(s->hooks_user, s->who, s->micro))
            o->axpby(m->be.ctx, n, 1.0f, m->grads + lo, 1.0f, s->acc + lo);
    } else if (s->saved && !last) { /* several replicas: kept apart for the ordered all-reduce */
        o->copy(m->be.ctx, s->saved[s->micro] + lo, m->grads + lo, n);
    }
    s->done_from = lo;
    if (last) launch_ready_buckets(s, lo);
}

/* Waits for every bucket; the first error wins, the others are freed. */
static crew_status wait_buckets(crew_stepper *s, crew_step_times *times, double backward_end)
{
    crew_status first = CREW_OK;
    double busy = 0.0;
    for (int b = 0; b < s->launched; b++) {
        crew_status st = crew_comm_worker_wait(s->worker, &s->reqs[b]);
        if (st && !first)
            first = st;
        else
            crew_status_free(st);
        busy += s->reqs[b].finished - s->reqs[b].started;
    }
    double exposed = crew_now() - backward_end;
    times->comm_exposed_s += exposed;
    times->comm_hidden_s += busy > exposed ? busy - exposed : 0.0;
    return first;
}

crew_status crew_stepper_backward(crew_stepper *s, crew_model *view, int micro, const crew_pass *p)
{
    s->micro = micro;
    s->done_from = s->m->n_params;
    CREW_TRY(crew_model_backward(view, p, grads_ready, s));
    grads_ready(s, 0); /* leading layers without parameters: nothing left, but flush the buckets */
    return CREW_OK;
}

void crew_stepper_begin(crew_stepper *s, int measure)
{
    s->final = s->acc ? s->acc : s->m->grads;
    s->launched = 0;
    s->measure = measure;
    s->sq_small = 0.0;
    crew_status_free(s->measure_status);
    s->measure_status = CREW_OK;
}

void crew_stepper_hooks(crew_stepper *s, const crew_rank_hooks *hooks, void *user, crew_hook_rank *who)
{
    s->hooks = hooks;
    s->hooks_user = user;
    s->who = who;
}

crew_status crew_stepper_finish(crew_stepper *s, crew_status st, crew_step_times *times, float **grad)
{
    s->micro = s->accumulation - 1;
    if (s->worker && single_bucket(s)) {
        if (!st) st = reduce_single(s, times);
    } else if (s->worker) {
        if (!st) launch_ready_buckets(s, 0); /* any left (no-op when the pass completed them all) */
        crew_status w = wait_buckets(s, times, crew_now());
        if (!st)
            st = w;
        else
            crew_status_free(w);
    }
    *grad = s->final;
    if (!st && s->measure_status) {
        st = s->measure_status;
        s->measure_status = CREW_OK;
    }
    return st;
}
