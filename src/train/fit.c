/* fit.c — the training loop: N replicas, each on its own thread with its own copy of the model,
 * each taking its slice of every global batch; gradients summed across replicas in rank order;
 * identical optimizer steps everywhere. Rank 0 runs on the caller's thread and reports progress
 * through the caller's callbacks.
 *
 * Micro-batch m of a step holds rows [m·B, (m+1)·B) of the step's global batch; replica r owns
 * micro-batches r·k … r·k+k−1 (k = accumulation). Its gradient is summed locally in that order,
 * then across replicas in rank order, so the result equals one replica accumulating all of
 * them in order, bit for bit (docs/ARCHITECTURE.md, determinism). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/checkpoint.h"
#include "train/loop.h"

#define DEFAULT_TIMEOUT_S 300.0
#define DEFAULT_BUCKET_MB 25.0
#define DEFAULT_DRIFT_EVERY 100

static void *replica_thread(void *arg)
{
    replica *r = arg;
    r->status = crew_replica_train(r);
    if (r->status) r->comm.ops->abort(r->comm.ctx, r->rank);
    return NULL;
}

static crew_status prepare_replica(replica *r, crew_model *m, const crew_fit_plan *p)
{
    r->m = m;
    CREW_TRY(crew_model_reserve(m, p->batch_per_device));
    r->metrics = calloc((size_t)p->devices * CREW_METRIC_FIELDS, sizeof *r->metrics);
    r->times = calloc((size_t)p->devices, sizeof *r->times);
    if (!r->metrics || !r->times) return CREW_OOM();
    if (!m->compiled || m->opt.n != m->n_params) CREW_TRY(crew_model_compile(m, &m->compile));
    return CREW_OK;
}

static void release_replica(replica *r, int owns_model)
{
    if (!r->m) return;
    crew_comm_worker_stop(&r->worker);
    crew_stepper_release(&r->stepper);
    free(r->metrics);
    free(r->times);
    if (owns_model) crew_model_free(r->m);
}

/* The first real error: a rank that failed by itself, not one that was told another failed. */
static crew_status first_error(replica *reps, int n)
{
    crew_status keep = CREW_OK;
    for (int i = 0; i < n; i++) {
        if (!reps[i].status) continue;
        if (!keep || (crew_status_code(keep) == CREW_CODE_TIMEOUT && crew_status_code(reps[i].status) != CREW_CODE_TIMEOUT)) {
            crew_status_free(keep);
            keep = reps[i].status;
        } else {
            crew_status_free(reps[i].status);
        }
        reps[i].status = CREW_OK;
    }
    return keep;
}

/* Loads the newest usable checkpoint and takes its plan: the global batch, per-device batch,
 * seed, length and learning-rate plan stay; only the devices (and so the accumulation) change. */
static crew_status resume(crew_model *m, fit_run *run)
{
    crew_fit_options *o = &run->resolved;
    crew_fit_result *res = run->result;
    if (!o->checkpoint_dir) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "resume: no checkpoint directory given");
    crew_checkpoint_state st;
    CREW_TRY(crew_checkpoint_resume(o->checkpoint_dir, m, &st, res->resume_note, sizeof res->resume_note));
    CREW_TRY(crew_resume_options(o, &st));
    o->resume = 0; /* plan_fit must not look for a checkpoint again: this one is loaded */
    crew_status s = crew_model_plan_fit(m, run->train, o, &run->plan);
    o->resume = 1;
    CREW_TRY(s);
    if (run->plan.steps_per_epoch != st.plan.steps_per_epoch)
        return crew_errorf(CREW_CODE_BAD_INPUT, "cannot resume: the checkpoint's run had %lld steps per epoch, this "
                           "dataset gives %lld (a different dataset?)", (long long)st.plan.steps_per_epoch,
                           (long long)run->plan.steps_per_epoch);
    run->lr = st.lr;
    run->start_step = st.step;
    res->resumed_from_step = st.step;
    return CREW_OK;
}

static void resolve_knobs(fit_run *run)
{
    const crew_fit_options *opts = run->opts;
    run->timeout_s = opts->collective_timeout_s > 0 ? opts->collective_timeout_s : DEFAULT_TIMEOUT_S;
    run->bucket_mb = opts->bucket_mb > 0 ? opts->bucket_mb : DEFAULT_BUCKET_MB;
    run->sync_bn = opts->sync_batch_norm < 0 ? run->plan.devices > 1 : opts->sync_batch_norm;
    run->drift_every = opts->drift_check_every < 0 ? 0 : opts->drift_check_every ? opts->drift_check_every : DEFAULT_DRIFT_EVERY;
    if (run->plan.devices == 1) run->drift_every = 0; /* one replica cannot drift from itself */
    run->faults = (crew_fit_faults){.slow_rank = -1, .stall_rank = -1, .corrupt_rank = -1};
    if (opts->faults) run->faults = *opts->faults;
    run->last_checkpoint_time = crew_now();
}

static crew_status setup(crew_model *m, fit_run *run, const crew_fit_options *opts)
{
    run->resolved = *opts;
    run->opts = &run->resolved;
    if (!m->compiled) {
        crew_compile_options c;
        crew_model_default_compile(m, &c);
        CREW_TRY(crew_model_compile(m, &c));
    }
    CREW_TRY(crew_cpu_backend_create(opts->threads_per_device, &m->be));
    if (opts->resume) {
        CREW_TRY(resume(m, run));
    } else {
        CREW_TRY(crew_model_plan_fit(m, run->train, opts, &run->plan));
        run->lr = crew_lr_plan_of(&run->plan, &m->compile.optimizer);
        if (!m->initialized) CREW_TRY(crew_model_init_params(m, run->plan.seed));
    }
    resolve_knobs(run);
    crew_monitor_config mc = {.run_dir = opts->run_dir, .append = opts->resume,
                              .straggler_threshold = opts->straggler_threshold,
                              .straggler_window = opts->straggler_window, .loss_spike_z = opts->loss_spike_z,
                              .on_event = opts->on_event, .user = opts->user};
    CREW_TRY(crew_monitor_open(&mc, &run->plan, &run->monitor));
    if (opts->resume)
        CREW_TRY(crew_monitor_event(run->monitor, CREW_EVENT_INFO, run->start_step, -1, NAN, "%s", run->result->resume_note));
    return CREW_OK;
}

/* Starts the replicas (rank 0 on this thread), waits for them, and fills the run's timings. */
static crew_status run_replicas(crew_model *m, fit_run *run)
{
    const int n = run->plan.devices;
    const crew_fit_options *o = run->opts;
    crew_loader_options lo = {.threads = o->loader_threads > 0 ? o->loader_threads : 1,
                              .prefetch = o->prefetch > 0 ? o->prefetch : 2,
                              .augment = o->augment,
                              .pad_last = o->pad_last_batch,
                              .reverse_rows = o->reverse_batch_rows};
    CREW_TRY(crew_loader_create(run->train, &lo, run->plan.batch_per_device, n * run->plan.accumulation,
                                run->plan.seed, &run->loader));
    crew_local_comm *lc;
    crew_status ls = crew_local_comm_create(n, &lc);
    if (ls) {
        crew_loader_free(run->loader);
        return ls;
    }
    replica *reps = calloc((size_t)n, sizeof *reps);
    if (!reps) {
        crew_local_comm_free(lc);
        crew_loader_free(run->loader);
        return CREW_OOM();
    }
    crew_status s = CREW_OK;
    int prepared = 0;
    for (int i = 0; i < n && !s; i++, prepared++) {
        reps[i] = (replica){.rank = i, .comm = crew_local_comm_rank(lc, i), .run = run};
        crew_model *rm = m;
        if (i > 0) s = crew_model_clone(m, &rm);
        if (!s) {
            if (i > 0) rm->compile = m->compile;
            s = prepare_replica(&reps[i], rm, &run->plan);
        }
    }
    double start = crew_now();
    int started = 0;
    for (int i = 1; i < n && !s; i++, started++)
        if (pthread_create(&reps[i].thread, NULL, replica_thread, &reps[i]) != 0)
            s = crew_errorf(CREW_CODE_INTERNAL, "could not start the thread of replica %d", i);
    if (!s)
        replica_thread(&reps[0]);
    else if (started)
        reps[0].comm.ops->abort(reps[0].comm.ctx, 0);
    for (int i = 1; i <= started; i++) pthread_join(reps[i].thread, NULL);
    if (!s)
        s = first_error(reps, n);
    else
        crew_status_free(first_error(reps, n));
    crew_fit_result *result = run->result;
    result->wall_s = crew_now() - start;
    result->samples_per_s = run->train_s > 0 ? (double)result->steps * (double)run->plan.global_batch / run->train_s : 0;
    for (int i = 0; i < prepared; i++) release_replica(&reps[i], i > 0);
    free(reps);
    crew_local_comm_free(lc);
    crew_loader_free(run->loader);
    run->loader = NULL;
    return s;
}

crew_status crew_model_fit(crew_model *m, const crew_dataset *train, const crew_fit_options *opts,
                           crew_fit_result *result)
{
    if (!m || !train || !opts || !result) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_fit: NULL argument");
    memset(result, 0, sizeof *result);
    result->test_loss = result->test_accuracy = NAN;
    fit_run run = {.train = train, .result = result};
    crew_status st = setup(m, &run, opts);
    if (st) {
        crew_monitor_close(run.monitor);
        return st;
    }
    crew_status s = run_replicas(m, &run);
    /* The summary is written even when the run failed: it says how far it got. */
    crew_status fin = crew_monitor_finish(run.monitor, result);
    result->events = crew_monitor_events(run.monitor);
    crew_monitor_close(run.monitor);
    if (!s) return fin;
    crew_status_free(fin);
    return s;
}
