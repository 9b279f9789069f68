/* fit.c — a fit as the caller sees it: prepared once (the options resolved, the plan worked out, a
 * resumed run's checkpoint loaded), then run by a launcher that starts one rank program per device
 * (run.h). Rank 0's sinks receive everything the run produces: the monitor's records, the result,
 * and at the end the trained values, copied into the caller's model.
 *
 * Micro-batch m of a step holds rows [m·B, (m+1)·B) of the step's global batch; rank r owns
 * micro-batches r·k … r·k+k−1 (k = accumulation). Its gradient is summed locally in that order,
 * then across ranks in rank order, so the result equals one replica accumulating all of them in
 * order, bit for bit (docs/ARCHITECTURE.md, determinism). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "core/options.h"
#include "core/status.h"
#include "core/timer.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/step.h"
#include "train/train.h"

#define DEFAULT_TIMEOUT_S 300.0
#define DEFAULT_DRIFT_EVERY 100

struct crew_fit {
    crew_model *m;
    crew_fit_options opts;      /* the caller's over the defaults, a resumed run's plan settings in place */
    crew_run run;
    crew_optimizer start_opt;   /* a resumed run's optimizer state, on m's device */
    int has_start_opt;
    char resume_note[1024];
    int ran;
};

/* Loads the newest usable checkpoint and takes its plan: the global batch, per-device batch,
 * seed, length and learning-rate plan stay; only the devices (and so the accumulation) change. */
static crew_status resume(crew_fit *f)
{
    crew_fit_options *o = &f->opts;
    crew_run *run = &f->run;
    crew_model *m = f->m;
    if (!o->checkpoint_dir) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "resume: no checkpoint directory given");
    CREW_TRY(crew_optimizer_init(&f->start_opt, &m->compile.optimizer, &m->be, m->n_params));
    f->has_start_opt = 1;
    crew_checkpoint_state st;
    CREW_TRY(crew_checkpoint_resume(o->checkpoint_dir, m, &f->start_opt, &st, f->resume_note, sizeof f->resume_note));
    CREW_TRY(crew_plan_resumed(m, run->train, o, &st, &run->plan));
    run->lr = st.lr;
    run->start_step = st.step;
    return CREW_OK;
}

static void resolve_knobs(crew_run *run)
{
    const crew_fit_options *o = run->opts;
    run->timeout_s = o->collective_timeout_s > 0 ? o->collective_timeout_s : DEFAULT_TIMEOUT_S;
    run->bucket_mb = run->plan.bucket_mb > 0 ? run->plan.bucket_mb : CREW_DEFAULT_BUCKET_MB;
    run->sync_bn = o->sync_batch_norm < 0 ? run->plan.devices > 1 : o->sync_batch_norm;
    run->drift_every = o->drift_check_every < 0 ? 0 : o->drift_check_every ? o->drift_check_every : DEFAULT_DRIFT_EVERY;
    if (run->plan.devices == 1) run->drift_every = 0; /* one replica cannot drift from itself */
    run->hooks = (crew_fit_hooks){0};
}

/* What process 0 of a group tells the others before a run: whether it could prepare it, and the
 * plan it made (a resumed run's comes from the checkpoint, which only process 0 reads). */
typedef struct shared_plan {
    int ok;
    char error[400];
    crew_fit_plan plan;
    crew_lr_plan lr;
    int64_t start_step;
} shared_plan;

/* Every process learns whether every other could prepare, and takes process 0's plan. s is this
 * process's own outcome so far; a failure anywhere fails every process, naming where. */
static crew_status share_plan(crew_fit *f, crew_status s)
{
    const crew_process_group *g = f->opts.group;
    int n = crew_group_size(g);
    shared_plan mine = {.ok = s == CREW_OK}, *all = calloc((size_t)n, sizeof *all);
    if (!all) {
        crew_status_free(s);
        return CREW_OOM();
    }
    if (s) snprintf(mine.error, sizeof mine.error, "%s", crew_status_message(s));
    else mine = (shared_plan){.ok = 1, .plan = f->run.plan, .lr = f->run.lr, .start_step = f->run.start_step};
    double timeout = f->opts.collective_timeout_s > 0 ? f->opts.collective_timeout_s : DEFAULT_TIMEOUT_S;
    crew_status e = crew_group_allgather_bytes(g, &mine, all, sizeof mine, timeout, "sharing the plan");
    for (int q = 0; q < n && !e && !s; q++)
        if (!all[q].ok) {
            all[q].error[sizeof all[q].error - 1] = '\0';
            s = crew_errorf(CREW_CODE_BAD_INPUT, "MPI rank %d could not prepare the run: %s", q, all[q].error);
        }
    if (!e && !s && crew_group_rank(g) != 0) {
        f->run.plan = all[0].plan;
        f->run.lr = all[0].lr;
        f->run.start_step = all[0].start_step;
        /* The settings the loader and the ranks read from the options (augmentation, padding,
         * batch-norm sync, ...) follow the plan too, as a resume on process 0 made them do. */
        crew_checkpoint_state st = {.plan = all[0].plan, .has_options = 1};
        e = crew_resume_options(&f->opts, &st);
        resolve_knobs(&f->run);
    }
    free(all);
    if (s) {
        crew_status_free(e);
        return s;
    }
    return e;
}

static crew_status prepare(crew_fit *f, const crew_dataset *train, const crew_fit_options *opts)
{
    crew_model *m = f->m;
    crew_model_default_fit(m, &f->opts);
    CREW_TRY(crew_options_take(&f->opts, sizeof f->opts, opts, "crew_fit_options"));
    const int processes = crew_group_size(f->opts.group);
    if (processes > 1) {
        /* devices counts this process's replicas; the plan counts the run's. Only process 0 reads
         * a checkpoint: the others plan afresh and take process 0's plan, and their replicas
         * start from rank 0's values (the starting point's broadcast, rank.c). */
        const int span = f->opts.pipeline_processes > 1 ? f->opts.pipeline_processes : 1;
        if (span > 1) { /* each replica's pipeline spans `span` processes */
            if (f->opts.devices != 1)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "a pipeline spanning %d processes per replica: devices "
                                   "must be 1 (the replica those processes share), got %d", span, f->opts.devices);
            if (processes % span)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%d processes cannot hold replicas of %d processes each: "
                                   "give a multiple of %d processes", processes, span, span);
            f->opts.devices = processes / span;
        } else {
            if (f->opts.devices < 1 || f->opts.devices > 1024 / processes)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "devices per process must be in [1, %d] with %d "
                                   "processes, got %d", 1024 / processes, processes, f->opts.devices);
            f->opts.devices *= processes;
        }
        if (crew_group_rank(f->opts.group) != 0) f->opts.resume = 0;
    }
    if (!m->compiled) {
        crew_compile_options c;
        crew_model_default_compile(m, &c);
        CREW_TRY(crew_model_compile(m, &c));
    }
    crew_run *run = &f->run;
    run->train = train;
    run->opts = &f->opts;
    run->start = m;
    if (f->opts.resume) {
        CREW_TRY(resume(f));
        run->start_opt = &f->start_opt;
    } else {
        CREW_TRY(crew_plan_fit_resolved(m, train, &f->opts, &run->plan));
        run->lr = crew_lr_plan_of(&run->plan, &m->compile.optimizer);
        if (!m->initialized) CREW_TRY(crew_model_init_params(m, run->plan.seed));
    }
    run->plan.processes = processes;
    resolve_knobs(run);
    return CREW_OK;
}

crew_status crew_fit_prepare(crew_model *m, const crew_dataset *train, const crew_fit_options *opts, crew_fit **out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_fit_prepare: NULL argument");
    *out = NULL;
    if (!m || !train || !opts) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_fit_prepare: NULL argument");
    crew_fit *f = calloc(1, sizeof *f);
    if (!f) return CREW_OOM();
    f->m = m;
    crew_status s = prepare(f, train, opts);
    /* f->opts.group is the caller's once its options were taken (NULL before, so that a caller
     * whose options were refused shares nothing; every process refuses the same options). */
    if (crew_group_size(f->opts.group) > 1) s = share_plan(f, s);
    if (s) {
        crew_fit_free(f);
        return s;
    }
    *out = f;
    return CREW_OK;
}

const crew_fit_plan *crew_fit_get_plan(const crew_fit *f) { return &f->run.plan; }

const char *crew_fit_resume_note(const crew_fit *f) { return f->resume_note; }

crew_fit_hooks *crew_fit_hooks_of(crew_fit *f) { return &f->run.hooks; }

void crew_fit_free(crew_fit *f)
{
    if (!f) return;
    if (f->has_start_opt) crew_optimizer_release(&f->start_opt, &f->m->be);
    free(f);
}

static crew_status open_monitor(const crew_fit *f, crew_fit_result *result, crew_monitor **out)
{
    const crew_fit_options *o = &f->opts;
    /* Only process 0 of a group writes the run's record; the others' monitors see nothing. */
    int writer = crew_group_rank(o->group) == 0;
    crew_monitor_config mc = {.run_dir = writer ? o->run_dir : NULL, .append = o->resume,
                              /* a pipeline's stages differ by design: no straggler verdicts between them */
                              .straggler_threshold = f->run.plan.stages > 1 ? 1e30 : o->straggler_threshold,
                              .straggler_window = o->straggler_window, .loss_spike_z = o->loss_spike_z,
                              .noise_scale_every = f->run.plan.noise_scale_every,
                              .on_event = writer ? o->on_event : NULL, .user = o->user};
    CREW_TRY(crew_monitor_open(&mc, &f->run.plan, out));
    if (o->resume)
        CREW_TRY(crew_monitor_event(*out, CREW_EVENT_INFO, f->run.start_step, -1, NAN, "%s", result->resume_note));
    return CREW_OK;
}

crew_status crew_fit_run(crew_fit *f, crew_fit_result *result)
{
    if (!f || !result) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_fit_run: NULL argument");
    memset(result, 0, sizeof *result);
    result->test_loss = result->test_accuracy = result->test_bits = NAN;
    result->stages = 1;
    result->bubble_fraction = NAN;
    result->bottleneck_stage = -1;
    if (f->ran) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_fit_run: a prepared fit runs once");
    f->ran = 1;
    if (f->opts.resume) {
        result->resumed_from_step = f->run.start_step;
        snprintf(result->resume_note, sizeof result->resume_note, "%s", f->resume_note);
    }
    /* On the heap: a rank 0 that never returns keeps a pointer to the sinks, so they stay (leaked)
     * when it is left behind. */
    crew_run_sinks *sinks = calloc(1, sizeof *sinks);
    if (!sinks) return CREW_OOM();
    *sinks = (crew_run_sinks){.model = f->m, .result = result, .last_checkpoint_time = crew_now()};
    pthread_mutex_init(&sinks->lock, NULL);
    crew_status s = open_monitor(f, result, &sinks->monitor);
    if (s) {
        crew_monitor_close(sinks->monitor);
        pthread_mutex_destroy(&sinks->lock);
        free(sinks);
        return s;
    }
    double start = crew_now();
    s = crew_launch_threads(&f->run, sinks);
    result->wall_s = crew_now() - start;
    result->samples_per_s =
        sinks->train_s > 0 ? (double)result->steps * (double)f->run.plan.global_batch / sinks->train_s : 0;
    if (sinks->monitor_lost) /* rank 0 stopped half-way through writing the record: leave it alone */
        return crew_error_prefix(s, "%s", "metrics.jsonl was left as it was (rank 0 stopped while writing it); ");
    /* The summary is written even when the run failed: it says how far it got. */
    crew_status fin = crew_monitor_finish(sinks->monitor, result);
    result->events = crew_monitor_events(sinks->monitor);
    crew_monitor_close(sinks->monitor);
    sinks->monitor = NULL;
    if (!sinks->rank0_left) { /* else its thread may still wait for the lock the launcher holds */
        pthread_mutex_destroy(&sinks->lock);
        free(sinks);
    }
    if (!s) return fin;
    crew_status_free(fin);
    return s;
}

crew_status crew_model_fit(crew_model *m, const crew_dataset *train, const crew_fit_options *opts,
                           crew_fit_result *result)
{
    if (!m || !train || !opts || !result) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_fit: NULL argument");
    memset(result, 0, sizeof *result);
    result->test_loss = result->test_accuracy = result->test_bits = NAN;
    result->stages = 1;
    result->bubble_fraction = NAN;
    result->bottleneck_stage = -1;
    crew_fit *f;
    CREW_TRY(crew_fit_prepare(m, train, opts, &f));
    crew_status s = crew_fit_run(f, result);
    crew_fit_free(f);
    return s;
}
