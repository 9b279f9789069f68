/* fault_hooks.h — the faults tests make happen on purpose, so that the detectors and the guard can
 * be seen catching them: a slow, stalled, frozen or corrupted rank, NaN gradients, a host read of
 * device memory, uploads left unordered. They act through the rank program's test seams
 * (src/train/hooks.h), so a real run carries none of them.
 *
 *   crew_fit_faults f = crew_no_faults();
 *   f.stall_rank = 1, f.stall_step = 3;
 *   fault_hooks_set(fit, &f);                  // the fit keeps a copy of f
 *
 * Ranks are the run's global ranks (replica · stages + stage). */
#ifndef CREW_TESTS_FAULT_HOOKS_H
#define CREW_TESTS_FAULT_HOOKS_H

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "core/status.h"
#include "train/hooks.h"

typedef struct crew_fit_faults {
    int slow_rank;             /* this rank sleeps slow_s after each step's passes (-1: none) */
    double slow_s;
    int stall_rank;            /* this rank stops arriving at collectives from stall_step on (-1: none) */
    int64_t stall_step;        /* 1-based; 0: never */
    int freeze_rank;           /* this rank stops for good at the start of freeze_step, and its thread
                                  never returns (-1: none) */
    int64_t freeze_step;       /* 1-based; 0: never */
    int corrupt_rank;          /* this rank's first parameter changes before the drift check of
                                  corrupt_step (-1: none) */
    int64_t corrupt_step;
    int64_t nan_step;          /* the gradients of this step become NaN (all ranks); 0: never */
    int host_touch_step;       /* at this step rank 0 reads a parameter straight from device memory,
                                  as a bug would: the guarded backend must trap it; 0: never */
    int skip_copy_wait;        /* 1: a micro-batch's uploads are not ordered before the compute that
                                  reads them, as a bug would: the guarded backend's results change */
} crew_fit_faults;

static inline crew_fit_faults crew_no_faults(void)
{
    return (crew_fit_faults){.slow_rank = -1, .stall_rank = -1, .freeze_rank = -1, .corrupt_rank = -1};
}

static inline void fault_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A late rank (it sleeps past the deadline, then fails by itself with a timeout, like the others'
 * errors, so that the run's error is the report of the missing rank), a frozen one, a host read. */
static inline crew_status fault_step_begins(void *user, crew_hook_rank *r, int64_t step)
{
    const crew_fit_faults *f = user;
    if (f->stall_step == step && f->stall_rank == r->rank) {
        fault_sleep(r->timeout_s + 2.0);
        return crew_errorf(CREW_CODE_TIMEOUT, "%s %d stalled on purpose at step %lld (test fault)",
                           r->stages > 1 ? "rank" : "replica", r->rank, (long long)step);
    }
    if (f->freeze_step == step && f->freeze_rank == r->rank)
        for (;;) fault_sleep(3600.0); /* as a thread stopped by a debugger or stuck in a driver */
    if (f->host_touch_step == step && r->sink) { /* traps on the guarded backend; reads a value on the plain one */
        volatile float v = r->m->params[0];
        (void)v;
    }
    return CREW_OK;
}

static inline void fault_passes_done(void *user, crew_hook_rank *r, crew_step_times *t)
{
    const crew_fit_faults *f = user;
    if (f->slow_rank != r->rank || f->slow_s <= 0) return;
    fault_sleep(f->slow_s); /* a deliberately slow replica, for the straggler detector */
    t->backward_s += f->slow_s;
}

static inline crew_status fault_gradient(void *user, crew_hook_rank *r, int64_t step, float **grad)
{
    const crew_fit_faults *f = user;
    if (f->nan_step == step && r->m->n_params) r->be->ops->fill(r->be->ctx, *grad, NAN, 1);
    return CREW_OK;
}

/* One rank's first parameter moves by 1e-3, through the backend as any write. */
static inline crew_status fault_before_drift(void *user, crew_hook_rank *r, int64_t step)
{
    const crew_fit_faults *f = user;
    if (f->corrupt_step != step || f->corrupt_rank != r->rank || !r->m->n_params) return CREW_OK;
    float v;
    CREW_TRY(crew_dev_download_f32(r->be, &v, r->m->params, 1));
    v += 1e-3f;
    return crew_dev_upload_f32(r->be, r->m->params, &v, 1);
}

static inline int fault_unordered_uploads(void *user, crew_hook_rank *r)
{
    (void)r;
    return ((const crew_fit_faults *)user)->skip_copy_wait;
}

static const crew_rank_hooks crew_fault_hooks = {
    .step_begins = fault_step_begins,
    .passes_done = fault_passes_done,
    .gradient = fault_gradient,
    .before_drift = fault_before_drift,
    .unordered_uploads = fault_unordered_uploads,
};

/* The faults into a prepared fit. A rank the launcher left behind (a stalled or frozen one, by
 * design) goes on calling the hooks after crew_fit_run has returned, so the hooks read a copy that
 * lives as long as the process and is never written again: not the caller's struct, whose stack
 * the next test reuses. The copies stay reachable (a list), so no leak is reported. Returns 0
 * when there was no memory for the copy (the fit then runs without faults). */
typedef struct fault_copy {
    crew_fit_faults faults;
    struct fault_copy *next;
} fault_copy;

static inline int fault_hooks_set(crew_fit *f, const crew_fit_faults *faults)
{
    static fault_copy *kept; /* main thread only: each copy is made before the ranks that read it start */
    fault_copy *c = malloc(sizeof *c);
    if (!c) return 0;
    c->faults = *faults;
    c->next = kept;
    kept = c;
    crew_fit_hooks *h = crew_fit_hooks_of(f);
    h->rank = &crew_fault_hooks;
    h->rank_user = &c->faults;
    return 1;
}

#endif
