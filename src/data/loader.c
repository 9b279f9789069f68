/* loader.c — producer threads, a ring of `prefetch` steps of one rank's micro-batches, and the rank
 * taking them. One mutex guards the ring; the work (gathering, normalising, augmenting a
 * micro-batch) runs outside it. Inline (no producers) the rank's take fills its micro-batch. */
#include "data/loader.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/status.h"
#include "core/thread_name.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/sampler.h"

enum { SLOT_EMPTY, SLOT_FILLING, SLOT_READY, SLOT_TAKEN, SLOT_RELEASED };

typedef struct slot {
    float *x;        /* [batch × sample size] */
    int32_t *y;      /* [batch, label positions] */
    int64_t *ids;    /* [batch] */
    int state;
} slot;

typedef struct ring_step {
    int epoch;
    int64_t step;    /* the step it holds, or -1 */
    int released;    /* micro-batches handed out and given back */
    slot *slots;     /* [count]: the range's micro-batches */
} ring_step;

struct crew_loader {
    const crew_dataset *d;
    crew_loader_options o;
    int64_t batch, global, n, steps_per_epoch, sample_size;
    int micro;                   /* micro-batches per step, all ranks' */
    int first, count;            /* this loader's: [first, first + count) */
    uint64_t seed;
    /* Production runs on from epoch to epoch, so the pipeline never drains at an epoch's end.
     * Two epochs' orders are kept: the one being taken and the one being prepared. */
    int64_t *perm[2];            /* [max(n, steps_per_epoch × global)] order of epoch perm_epoch[b] */
    int perm_epoch[2];
    int64_t remaining[2];        /* micro-batches of that epoch not yet taken */
    int started;
    int claim_epoch;             /* the next micro-batch to claim */
    int64_t claim_step;
    int claim_index;             /* in [0, count): slot index, micro-batch first + claim_index */
    int filling;                 /* producers at work outside the lock */
    ring_step *ring;             /* [prefetch] */
    pthread_mutex_t mu;
    pthread_cond_t changed;      /* a slot became ready, a step was freed, an epoch began */
    int stop;
    int joined;                  /* the producers have been joined (crew_loader_shutdown) */
    pthread_t *threads;
    int n_threads;
    float *scratch;              /* inline: the augmentation's sample buffer */
};

int64_t crew_loader_steps_per_epoch(const crew_loader *l) { return l->steps_per_epoch; }

/* The epoch's order, with the last global batch filled up from its start when padding. */
static void order_epoch(crew_loader *l, int64_t *perm, int epoch)
{
    crew_epoch_order(l->seed, l->o.order_epoch ? l->o.order_epoch(l->o.order_user, l->o.order_rank, epoch) : epoch, l->n,
                     perm);
    for (int64_t i = l->n; i < l->steps_per_epoch * l->global; i++) perm[i] = perm[i - l->n];
}

/* Moves the claim point to the next epoch once the epoch two back is fully taken (its order
 * buffer is then free). Returns 0 when that must wait. */
static int advance_epoch(crew_loader *l)
{
    int next = l->claim_epoch + 1, b = next % 2;
    if (l->perm_epoch[b] >= 0 && l->remaining[b] > 0) return 0;
    order_epoch(l, l->perm[b], next);
    l->perm_epoch[b] = next;
    l->remaining[b] = l->steps_per_epoch * l->count;
    l->claim_epoch = next;
    l->claim_step = 0;
    l->claim_index = 0;
    return 1;
}

/* Claims the next micro-batch to fill, or returns NULL when there is none to claim now. */
static slot *claim(crew_loader *l, int *epoch, int64_t *step, int *index)
{
    if (!l->started) return NULL;
    if (l->claim_step >= l->steps_per_epoch && !advance_epoch(l)) return NULL;
    int64_t g = (int64_t)l->claim_epoch * l->steps_per_epoch + l->claim_step; /* a step count over epochs */
    ring_step *rs = &l->ring[g % l->o.prefetch];
    if (rs->epoch != l->claim_epoch || rs->step != l->claim_step) {
        if (rs->step >= 0 && rs->released < l->count) return NULL; /* still in use */
        rs->epoch = l->claim_epoch;
        rs->step = l->claim_step;
        rs->released = 0;
        for (int i = 0; i < l->count; i++) rs->slots[i].state = SLOT_EMPTY;
    }
    *epoch = l->claim_epoch;
    *step = l->claim_step;
    *index = l->claim_index;
    rs->slots[l->claim_index].state = SLOT_FILLING;
    if (++l->claim_index == l->count) {
        l->claim_index = 0;
        l->claim_step++;
    }
    return &rs->slots[*index];
}

/* slot_index: in [0, count); the micro-batch is first + slot_index of the step. */
static void fill(crew_loader *l, slot *sl, int epoch, int64_t step, int slot_index, float *scratch)
{
    const int64_t *ids = l->perm[epoch % 2] + step * l->global + (int64_t)(l->first + slot_index) * l->batch;
    if (l->o.reverse_rows)
        for (int64_t r = 0; r < l->batch; r++) sl->ids[r] = ids[l->batch - 1 - r];
    else
        memcpy(sl->ids, ids, (size_t)l->batch * sizeof *ids);
    crew_dataset_gather(l->d, sl->ids, l->batch, sl->x, sl->y);
    if (crew_augment_active(&l->o.augment))
        for (int64_t r = 0; r < l->batch; r++)
            crew_augment_sample(&l->o.augment, &l->d->sample, sl->x + r * l->sample_size, scratch, l->seed, epoch,
                                sl->ids[r]);
}

static void *producer(void *arg)
{
    crew_loader *l = arg;
    crew_thread_name("loader", l->first / (l->count > 0 ? l->count : 1)); /* the rank it serves */
    float *scratch = malloc((size_t)l->sample_size * sizeof(float));
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        int epoch, index;
        int64_t step;
        slot *sl = scratch ? claim(l, &epoch, &step, &index) : NULL;
        if (!sl) {
            pthread_cond_wait(&l->changed, &l->mu);
            continue;
        }
        l->filling++;
        pthread_mutex_unlock(&l->mu);
        fill(l, sl, epoch, step, index, scratch);
        pthread_mutex_lock(&l->mu);
        l->filling--;
        sl->state = SLOT_READY;
        pthread_cond_broadcast(&l->changed);
    }
    pthread_mutex_unlock(&l->mu);
    free(scratch);
    return NULL;
}

static void *slot_alloc(const crew_loader *l, size_t bytes)
{
    return l->o.slot_alloc ? l->o.slot_alloc(l->o.slot_user, bytes) : malloc(bytes);
}

static void slot_free(const crew_loader *l, void *p)
{
    if (!p) return;
    if (l->o.slot_free)
        l->o.slot_free(l->o.slot_user, p);
    else
        free(p);
}

static crew_status alloc_ring(crew_loader *l)
{
    l->ring = calloc((size_t)l->o.prefetch, sizeof *l->ring);
    if (!l->ring) return CREW_OOM();
    for (int i = 0; i < l->o.prefetch; i++) {
        ring_step *rs = &l->ring[i];
        rs->step = -1;
        rs->slots = calloc((size_t)l->count, sizeof *rs->slots);
        if (!rs->slots) return CREW_OOM();
        for (int j = 0; j < l->count; j++) {
            slot *s = &rs->slots[j];
            s->x = slot_alloc(l, (size_t)(l->batch * l->sample_size) * sizeof *s->x);
            s->y = slot_alloc(l, (size_t)(l->batch * l->d->label_positions) * sizeof *s->y);
            s->ids = slot_alloc(l, (size_t)l->batch * sizeof *s->ids);
            if (!s->x || !s->y || !s->ids) return CREW_OOM();
        }
    }
    return CREW_OK;
}

crew_status crew_loader_create(const crew_dataset *d, const crew_loader_options *o, const crew_loader_range *range,
                               uint64_t seed, crew_loader **out)
{
    *out = NULL;
    int64_t batch = range->batch;
    int micro = range->micro;
    if (batch < 1 || micro < 1 || range->first < 0 || range->count < 1 || range->first + range->count > micro)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "loader: micro-batches [%d, %d) of %d of %lld samples is not a "
                           "range of a step", range->first, range->first + range->count, micro, (long long)batch);
    if (o->threads < 0 || o->threads > 256)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "loader threads must be in [0 (inline), 256], got %d",
                           o->threads);
    if (o->prefetch < 1 || o->prefetch > 4096) /* the run's depth is at most 1024, plus a step held (run.h) */
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "prefetch depth must be in [1, 4096], got %d", o->prefetch);
    if (o->augment.crop_padding < 0 || o->augment.crop_padding > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crop padding must be in [0, 1024], got %d", o->augment.crop_padding);
    crew_loader *l = calloc(1, sizeof *l);
    if (!l) return CREW_OOM();
    l->d = d;
    l->o = *o;
    l->batch = batch;
    l->micro = micro;
    l->first = range->first;
    l->count = range->count;
    l->global = batch * micro;
    l->seed = seed;
    l->n = crew_dataset_size(d);
    l->sample_size = crew_shape_size(&d->sample);
    l->perm_epoch[0] = l->perm_epoch[1] = -1;
    l->steps_per_epoch = o->pad_last ? (l->n + l->global - 1) / l->global : l->n / l->global;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->changed, NULL);
    crew_status s = l->steps_per_epoch < 1 ? crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the dataset holds fewer samples "
                                                         "than one global batch of %lld", (long long)l->global)
                                           : CREW_OK;
    if (!s) {
        int64_t total = l->steps_per_epoch * l->global;
        for (int b = 0; b < 2; b++) l->perm[b] = malloc((size_t)(total > l->n ? total : l->n) * sizeof *l->perm[b]);
        if (!l->perm[0] || !l->perm[1]) s = CREW_OOM();
    }
    if (!s) s = alloc_ring(l);
    if (!s && o->threads == 0 && !(l->scratch = malloc((size_t)l->sample_size * sizeof *l->scratch))) s = CREW_OOM();
    if (!s && o->threads > 0 && !(l->threads = calloc((size_t)o->threads, sizeof *l->threads))) s = CREW_OOM();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    int err = o->n_cpus > 0 ? crew_cpu_bind_attr(&attr, o->cpus, o->n_cpus) : 0;
    for (int i = 0; !s && i < o->threads; i++) {
        if (!err) err = pthread_create(&l->threads[i], &attr, producer, l);
        if (err) /* the threads started so far are joined by crew_loader_free */
            s = crew_errorf(CREW_CODE_INTERNAL, "could not start loader thread %d%s: %s", i,
                            o->n_cpus > 0 ? " on its rank's cores" : "", strerror(err));
        else
            l->n_threads++;
    }
    pthread_attr_destroy(&attr);
    if (s) {
        crew_loader_free(l);
        return s;
    }
    *out = l;
    return CREW_OK;
}

crew_status crew_loader_start_epoch(crew_loader *l, int epoch, int64_t first)
{
    pthread_mutex_lock(&l->mu);
    if (l->started) { /* every replica calls this at every epoch; production already runs ahead */
        pthread_mutex_unlock(&l->mu);
        return CREW_OK;
    }
    int b = epoch % 2;
    order_epoch(l, l->perm[b], epoch);
    l->perm_epoch[b] = epoch;
    l->remaining[b] = (l->steps_per_epoch - first) * l->count;
    l->claim_epoch = epoch;
    l->claim_step = first;
    l->claim_index = 0;
    l->started = 1;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
    return CREW_OK;
}

/* The ring step and slot of micro-batch `index` of a step, or NULL when index is not the loader's. */
static slot *slot_of(crew_loader *l, int epoch, int64_t step, int index, ring_step **rs)
{
    *rs = &l->ring[((int64_t)epoch * l->steps_per_epoch + step) % l->o.prefetch];
    return index >= l->first && index < l->first + l->count ? &(*rs)->slots[index - l->first] : NULL;
}

/* Inline: the caller fills the micro-batch itself, into its step's place in the ring (which the
 * step before in that place must have left), with the epoch's order made when first needed. The
 * lock only guards the state a shutdown from another thread reads. */
static crew_status take_inline(crew_loader *l, ring_step *rs, slot *sl, int epoch, int64_t step, int index)
{
    pthread_mutex_lock(&l->mu);
    crew_status s = CREW_OK;
    if (l->stop)
        s = crew_errorf(CREW_CODE_CANCELLED, "the loader was stopped");
    else if ((rs->epoch != epoch || rs->step != step) && rs->step >= 0 && rs->released < l->count)
        s = crew_errorf(CREW_CODE_INTERNAL, "loader: micro-batch %d of step %lld (epoch %d) needs the place in the ring "
                        "of step %lld (epoch %d), whose micro-batches were not all released", index,
                        (long long)step + 1, epoch + 1, (long long)rs->step + 1, rs->epoch + 1);
    else if (rs->epoch == epoch && rs->step == step && sl->state != SLOT_EMPTY)
        s = crew_errorf(CREW_CODE_INTERNAL, "loader: micro-batch %d of step %lld (epoch %d) is taken twice", index,
                        (long long)step + 1, epoch + 1);
    if (!s && (rs->epoch != epoch || rs->step != step)) {
        rs->epoch = epoch;
        rs->step = step;
        rs->released = 0;
        for (int i = 0; i < l->count; i++) rs->slots[i].state = SLOT_EMPTY;
    }
    if (!s) sl->state = SLOT_FILLING;
    pthread_mutex_unlock(&l->mu);
    if (s) return s;
    const int b = epoch % 2;
    if (l->perm_epoch[b] != epoch) { /* only this thread reads or writes the orders inline */
        order_epoch(l, l->perm[b], epoch);
        l->perm_epoch[b] = epoch;
    }
    fill(l, sl, epoch, step, index - l->first, l->scratch);
    pthread_mutex_lock(&l->mu);
    sl->state = SLOT_TAKEN;
    pthread_mutex_unlock(&l->mu);
    return CREW_OK;
}

crew_status crew_loader_take(crew_loader *l, int epoch, int64_t step, int index, crew_loader_batch *out,
                             double *wait_s)
{
    double t0 = crew_now();
    ring_step *rs;
    slot *sl = slot_of(l, epoch, step, index, &rs);
    if (!sl)
        return crew_errorf(CREW_CODE_INTERNAL, "loader: micro-batch %d is not one of [%d, %d) it serves", index, l->first,
                           l->first + l->count);
    if (l->o.threads == 0) {
        crew_status s = take_inline(l, rs, sl, epoch, step, index);
        *wait_s = crew_now() - t0;
        if (!s) *out = (crew_loader_batch){sl->x, sl->y, sl->ids};
        return s;
    }
    struct timespec deadline;
    if (l->o.timeout_s > 0) crew_deadline_after(l->o.timeout_s, &deadline);
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    while (!(rs->epoch == epoch && rs->step == step && sl->state == SLOT_READY) && !l->stop && rc != ETIMEDOUT)
        rc = l->o.timeout_s > 0 ? pthread_cond_timedwait(&l->changed, &l->mu, &deadline)
                                : pthread_cond_wait(&l->changed, &l->mu);
    int stopped = l->stop, ready = rs->epoch == epoch && rs->step == step && sl->state == SLOT_READY;
    if (!stopped && ready) sl->state = SLOT_TAKEN;
    pthread_mutex_unlock(&l->mu);
    *wait_s = crew_now() - t0;
    if (stopped) return crew_errorf(CREW_CODE_CANCELLED, "the loader was stopped");
    if (!ready)
        return crew_errorf(CREW_CODE_TIMEOUT, "loader: micro-batch %d of step %lld (epoch %d) was not ready within %g s",
                           index, (long long)step + 1, epoch + 1, l->o.timeout_s);
    *out = (crew_loader_batch){sl->x, sl->y, sl->ids};
    return CREW_OK;
}

void crew_loader_release(crew_loader *l, int epoch, int64_t step, int index)
{
    ring_step *rs;
    slot *sl = slot_of(l, epoch, step, index, &rs);
    if (!sl) return;
    pthread_mutex_lock(&l->mu);
    if (sl->state == SLOT_TAKEN && rs->epoch == epoch && rs->step == step) {
        sl->state = SLOT_RELEASED;
        l->remaining[epoch % 2]--;
        if (++rs->released == l->count) pthread_cond_broadcast(&l->changed); /* the ring step can be refilled */
    }
    pthread_mutex_unlock(&l->mu);
}

void crew_loader_shutdown(crew_loader *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->changed);
    int join = !l->joined;
    l->joined = 1;
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; join && i < l->n_threads; i++) pthread_join(l->threads[i], NULL);
}

void crew_loader_free(crew_loader *l)
{
    if (!l) return;
    crew_loader_shutdown(l);
    for (int i = 0; l->ring && i < l->o.prefetch; i++) {
        for (int j = 0; l->ring[i].slots && j < l->count; j++) {
            slot_free(l, l->ring[i].slots[j].x);
            slot_free(l, l->ring[i].slots[j].y);
            slot_free(l, l->ring[i].slots[j].ids);
        }
        free(l->ring[i].slots);
    }
    free(l->ring);
    free(l->threads);
    free(l->scratch);
    free(l->perm[0]);
    free(l->perm[1]);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->changed);
    free(l);
}

crew_status crew_bench_loader(const crew_dataset *d, int threads, int prefetch, const crew_augment_options *augment,
                              int64_t batch, int64_t steps, double *samples_per_s)
{
    crew_loader_options lo = {.threads = threads, .prefetch = prefetch, .augment = crew_augment_of(augment, 0.0)};
    return crew_loader_benchmark(d, &lo, batch, steps, samples_per_s);
}

crew_status crew_loader_benchmark(const crew_dataset *d, const crew_loader_options *o, int64_t batch, int64_t steps,
                                  double *samples_per_s)
{
    crew_loader *l;
    crew_loader_range one = {.batch = batch, .micro = 1, .first = 0, .count = 1};
    CREW_TRY(crew_loader_create(d, o, &one, 1, &l));
    crew_status s = CREW_OK;
    double start = crew_now(), wait;
    int64_t done = 0;
    for (int epoch = 0; !s && done < steps; epoch++) {
        s = crew_loader_start_epoch(l, epoch, 0);
        for (int64_t k = 0; !s && k < crew_loader_steps_per_epoch(l) && done < steps; k++, done++) {
            crew_loader_batch b;
            s = crew_loader_take(l, epoch, k, 0, &b, &wait);
            if (!s) crew_loader_release(l, epoch, k, 0);
        }
    }
    double took = crew_now() - start;
    *samples_per_s = took > 0 ? (double)(done * batch) / took : 0.0;
    crew_loader_free(l);
    return s;
}
