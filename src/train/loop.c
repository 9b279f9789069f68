/* loop.c — one replica's training loop: epochs, steps, the finiteness check and the update, the
 * per-step metrics every replica shares, the replica drift check, and rank 0's reports.
 *
 * The metrics of a step travel as one all-reduce of a [replicas × METRIC_FIELDS] matrix of
 * doubles in which each replica fills its own row (the others are zero, so the sum is a gather).
 * Nothing here assumes the replicas share memory: the same code runs over MPI. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/checkpoint.h"
#include "train/loop.h"

enum { M_LOSS, M_CORRECT, M_STOP, M_TIMES, METRIC_FIELDS = CREW_METRIC_FIELDS };
_Static_assert(M_TIMES + CREW_STEP_TIMES_FIELDS == CREW_METRIC_FIELDS, "metric row layout");

/* The stepper's source of micro-batches: the loader, at this step of the epoch. */
typedef struct batch_source {
    crew_loader *loader;
    int epoch;
    int64_t epoch_step;
} batch_source;

static crew_status next_batch(void *user, int index, float *x, int32_t *y, int64_t *ids, double *wait_s)
{
    batch_source *b = user;
    return crew_loader_next(b->loader, b->epoch, b->epoch_step, index, x, y, ids, wait_s);
}

/* A small all-reduce of doubles (step metrics, evaluation sums, drift hashes), made by the
 * replica's own thread rather than handed to its communication thread: the replica would only
 * wait for it, and the two hand-offs cost two thread wake-ups each time (about 30 us idle, more
 * with every core busy). It is called only when none of the replica's requests is queued or in
 * flight (the step's buckets have all been waited for), so the communicator is still used by one
 * thread of the rank at a time and the collectives keep the same order on every rank. */
static crew_status reduce_f64(replica *r, double *v, int64_t n)
{
    if (!r->has_worker) return CREW_OK;
    return crew_allreduce(&r->comm, v, n, CREW_COMM_F64, CREW_REDUCE_SUM, r->run->timeout_s);
}

/* Rank 0 turns a failed collective into a hang event before the error ends the run. */
static crew_status phase_error(replica *r, crew_status s, int64_t step, const char *phase)
{
    if (!s) return s;
    s = crew_error_prefix(s, "step %lld, %s: ", (long long)step, phase);
    if (r->rank == 0 && crew_status_code(s) == CREW_CODE_TIMEOUT && r->run->monitor)
        crew_status_free(crew_monitor_event(r->run->monitor, CREW_EVENT_HANG, step, -1, NAN, "%s",
                                            crew_status_message(s)));
    return s;
}

/* Test faults that make a replica late or absent. */
static crew_status inject_stall(replica *r, int64_t step)
{
    const crew_fit_faults *f = &r->run->faults;
    if (f->stall_step != step || f->stall_rank != r->rank) return CREW_OK;
    struct timespec ts = {(time_t)(r->run->timeout_s + 2.0), 0};
    nanosleep(&ts, NULL);
    /* A timeout, like the others' errors: the run's error is then rank 0's report of the missing replica. */
    return crew_errorf(CREW_CODE_TIMEOUT, "replica %d stalled on purpose at step %lld (test fault)", r->rank,
                       (long long)step);
}

/* Non-finite gradients are the same on every replica (they were all-reduced), so every replica
 * takes the same decision without talking. */
static crew_status check_finite(replica *r, float *grad, int64_t step, int *skip)
{
    crew_model *m = r->m;
    if (r->run->faults.nan_step == step) grad[0] = NAN;
    *skip = 0;
    if (m->be.ops->all_finite(m->be.ctx, grad, m->n_params)) return CREW_OK;
    int stop = r->run->opts->on_nan == CREW_ON_NAN_STOP;
    if (r->rank == 0)
        CREW_TRY(crew_monitor_event(r->run->monitor, stop ? CREW_EVENT_NAN : CREW_EVENT_SKIPPED_UPDATE, step, -1, NAN,
                                    "step %lld: the gradients hold NaN or infinity; %s", (long long)step,
                                    stop ? "stopping before the update" : "this update is skipped"));
    if (stop)
        return crew_errorf(CREW_CODE_NUMERIC, "step %lld: the gradients hold NaN or infinity; stopped before the update "
                           "(--on-nan skip would skip such steps instead)", (long long)step);
    *skip = 1;
    return CREW_OK;
}

/* Hashes each tensor (parameters and state) of every replica with XXH3 and compares them. */
static crew_status check_drift(replica *r, int64_t step)
{
    crew_model *m = r->m;
    const crew_fit_faults *f = &r->run->faults;
    if (f->corrupt_step == step && f->corrupt_rank == r->rank) m->params[0] += 1e-3f;
    crew_named_param names[256];
    int t = crew_model_named_params(m, names, 256);
    if (t > 256) t = 256;
    int n = r->comm.size;
    double *h = calloc((size_t)n * (size_t)t * 2, sizeof *h);
    if (!h) return CREW_OOM();
    for (int i = 0; i < t; i++) {
        const crew_param *p = names[i].param;
        /* Batch-norm moving statistics are the same everywhere only when the batch statistics are
         * synchronised; otherwise each replica's follow its own micro-batches, by design. */
        if (!p->trainable && !r->run->sync_bn) continue; /* both halves stay 0 on every replica */
        XXH64_hash_t x = XXH3_64bits(p->value, (size_t)crew_shape_size(&p->shape) * sizeof(float));
        h[((size_t)r->rank * t + i) * 2] = (double)(uint32_t)(x >> 32); /* halves are exact in a double */
        h[((size_t)r->rank * t + i) * 2 + 1] = (double)(uint32_t)x;
    }
    crew_status s = phase_error(r, reduce_f64(r, h, (int64_t)n * t * 2), step, "replica drift check");
    for (int i = 0; i < t && !s; i++)
        for (int q = 1; q < n; q++) {
            const double *a = h + (size_t)i * 2, *b = h + ((size_t)q * t + i) * 2;
            if (a[0] == b[0] && a[1] == b[1]) continue;
            s = crew_errorf(CREW_CODE_DIVERGED, "step %lld: replicas diverged: tensor '%s' differs between replica 0 "
                            "and replica %d", (long long)step, names[i].name, q);
            if (r->rank == 0)
                crew_status_free(crew_monitor_event(r->run->monitor, CREW_EVENT_DIVERGENCE, step, q, NAN, "%s",
                                                    crew_status_message(s)));
            break;
        }
    free(h);
    return s;
}

/* Rank 0: everyone's row into a step record for the monitor and the caller. */
static crew_status report_step(replica *r, int epoch, int64_t epoch_step, int64_t step, double step_s,
                               double epoch_start, int skipped, double *loss, double *correct)
{
    const fit_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    int n = r->comm.size;
    *loss = *correct = 0.0;
    for (int q = 0; q < n; q++) {
        const double *row = r->metrics + (size_t)q * METRIC_FIELDS;
        *loss += row[M_LOSS];
        *correct += row[M_CORRECT];
        memcpy(&r->times[q], row + M_TIMES, sizeof r->times[q]);
    }
    if (r->rank != 0) return CREW_OK;
    float lr = crew_lr_at(&run->lr, step - 1);
    crew_step_record rec = {step, epoch, crew_unix_now(), (float)(*loss / (double)p->global_batch),
                            (float)(*correct / (double)p->global_batch), lr, p->global_batch, step_s, skipped, n,
                            r->times};
    CREW_TRY(crew_monitor_step(run->monitor, &rec));
    if (!run->opts->on_step) return CREW_OK;
    const crew_step_times *t = &r->times[0];
    crew_step_info info = {step, p->total_steps, epoch, epoch_step + 1, p->steps_per_epoch, rec.loss, rec.accuracy,
                           lr, step_s, crew_now() - epoch_start, t->data_s, t->forward_s, t->backward_s,
                           t->comm_exposed_s, t->comm_hidden_s, t->optimizer_s};
    run->opts->on_step(run->opts->user, &info);
    return CREW_OK;
}

typedef struct step_result {
    double loss, correct;
    int stop, skipped;
} step_result;

/* One optimizer step; `step` is 1-based. */
static crew_status train_step(replica *r, int epoch, int64_t epoch_step, int64_t step, double epoch_start,
                              step_result *out)
{
    fit_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    crew_model *m = r->m;
    double t0 = crew_now();
    CREW_TRY(inject_stall(r, step));
    crew_step_totals tot = {0};
    crew_step_times times = {0};
    float *grad;
    batch_source src = {run->loader, epoch, epoch_step};
    crew_status s = crew_stepper_gradients(&r->stepper, p->seed, step - 1, next_batch, &src, &grad, &tot, &times);
    CREW_TRY(phase_error(r, s, step, "forward/backward and gradient all-reduce"));
    double t1 = crew_now();
    CREW_TRY(check_finite(r, grad, step, &out->skipped));
    if (!out->skipped) crew_optimizer_step(&m->opt, &m->be, m->params, grad, crew_lr_at(&run->lr, step - 1), NULL);
    times.optimizer_s = crew_now() - t1;
    memset(r->metrics, 0, (size_t)r->comm.size * METRIC_FIELDS * sizeof *r->metrics);
    double *row = r->metrics + (size_t)r->rank * METRIC_FIELDS;
    row[M_LOSS] = tot.loss_sum;
    row[M_CORRECT] = tot.correct;
    row[M_STOP] = r->rank == 0 && run->opts->cancel && *run->opts->cancel;
    memcpy(row + M_TIMES, &times, sizeof times);
    CREW_TRY(phase_error(r, reduce_f64(r, r->metrics, (int64_t)r->comm.size * METRIC_FIELDS), step, "metrics all-reduce"));
    out->stop = r->metrics[M_STOP] > 0; /* rank 0's row */
    if (run->drift_every > 0 && step % run->drift_every == 0) CREW_TRY(check_drift(r, step));
    return report_step(r, epoch, epoch_step, step, crew_now() - t0, epoch_start, out->skipped, &out->loss, &out->correct);
}

/* Every replica evaluates its share of the test set; the sums are all-reduced. */
static crew_status evaluate_shared(replica *r, const crew_dataset *d, int64_t step, float *loss, float *acc)
{
    int64_t n = crew_dataset_size(d), size = r->comm.size;
    int64_t lo = n * r->rank / size, hi = n * (r->rank + 1) / size;
    double sums[2] = {0.0, 0.0};
    int64_t correct = 0;
    /* Evaluation reuses the training batch size: the activations are already sized for it. */
    CREW_TRY(crew_eval_range(r->m, d, lo, hi, r->run->plan.batch_per_device, &sums[0], &correct));
    sums[1] = (double)correct;
    CREW_TRY(phase_error(r, reduce_f64(r, sums, 2), step, "evaluation"));
    *loss = (float)(sums[0] / (double)n);
    *acc = (float)(sums[1] / (double)n);
    return CREW_OK;
}

static crew_status finish_epoch(replica *r, crew_epoch_info *info, int64_t step)
{
    fit_run *run = r->run;
    crew_fit_result *res = run->result;
    if (run->opts->test) CREW_TRY(evaluate_shared(r, run->opts->test, step, &info->test_loss, &info->test_accuracy));
    if (r->rank != 0) return CREW_OK;
    res->epochs = info->epoch + 1;
    res->train_loss = info->train_loss;
    res->train_accuracy = info->train_accuracy;
    res->test_loss = info->test_loss;
    res->test_accuracy = info->test_accuracy;
    CREW_TRY(crew_monitor_epoch(run->monitor, info));
    if (run->opts->on_epoch) run->opts->on_epoch(run->opts->user, info);
    return CREW_OK;
}

/* Rank 0 saves a checkpoint when one is due: every N steps, every so many seconds, when the
 * caller cancels, and at the end of the run. The others go on to the next step and wait for it
 * at the first collective. */
static crew_status maybe_checkpoint(replica *r, int64_t step, int stopping)
{
    fit_run *run = r->run;
    const crew_fit_options *o = run->opts;
    if (r->rank != 0 || !o->checkpoint_dir) return CREW_OK;
    int due = stopping || step == run->plan.total_steps || (o->checkpoint_every > 0 && step % o->checkpoint_every == 0) ||
              (o->checkpoint_every_s > 0 && crew_now() - run->last_checkpoint_time >= o->checkpoint_every_s);
    if (!due) return CREW_OK;
    crew_checkpoint_state st = {.step = step, .plan = run->plan, .lr = run->lr};
    CREW_TRY(crew_checkpoint_write(o->checkpoint_dir, r->m, &st, o->keep_checkpoints, run->result->last_checkpoint,
                                   sizeof run->result->last_checkpoint));
    run->last_checkpoint_time = crew_now();
    return CREW_OK;
}

static crew_status run_epoch(replica *r, int epoch, int64_t *step, int *stopped)
{
    fit_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    CREW_TRY(crew_loader_start_epoch(run->loader, epoch, *step - (int64_t)epoch * p->steps_per_epoch));
    double start = crew_now(), loss = 0.0, correct = 0.0;
    int64_t steps = 0;
    /* A resumed run enters its first epoch where the checkpoint left it. */
    for (int64_t es = *step - (int64_t)epoch * p->steps_per_epoch; es < p->steps_per_epoch && *step < p->total_steps && !*stopped;
         es++) {
        step_result sr = {0};
        CREW_TRY(train_step(r, epoch, es, *step + 1, start, &sr));
        ++*step;
        loss += sr.loss;
        correct += sr.correct;
        steps++;
        if (r->rank == 0) run->result->skipped_updates += sr.skipped;
        *stopped = sr.stop;
        CREW_TRY(maybe_checkpoint(r, *step, *stopped));
    }
    crew_epoch_info info = {.epoch = epoch, .epochs = p->epochs, .steps = steps, .test_loss = NAN, .test_accuracy = NAN};
    info.wall_s = crew_now() - start;
    if (r->rank == 0) run->train_s += info.wall_s;
    double samples = (double)steps * (double)p->global_batch;
    info.train_loss = steps ? (float)(loss / samples) : NAN;
    info.train_accuracy = steps ? (float)(correct / samples) : NAN;
    info.samples_per_s = info.wall_s > 0.0 ? samples / info.wall_s : 0.0;
    return finish_epoch(r, &info, *step);
}

static crew_status broadcast_start(replica *r)
{
    crew_model *m = r->m;
    double t = (double)m->opt.t;
    const double timeout = r->run->timeout_s;
    CREW_TRY(crew_broadcast(&r->comm, m->params, m->n_params, CREW_COMM_F32, 0, timeout));
    CREW_TRY(crew_broadcast(&r->comm, m->state, m->n_state, CREW_COMM_F32, 0, timeout));
    for (int i = 0; i < 2; i++)
        if (m->opt.slot[i]) CREW_TRY(crew_broadcast(&r->comm, m->opt.slot[i], m->opt.n, CREW_COMM_F32, 0, timeout));
    CREW_TRY(crew_broadcast(&r->comm, &t, 1, CREW_COMM_F64, 0, timeout));
    m->opt.t = (int64_t)t;
    return CREW_OK;
}

crew_status crew_replica_train(replica *r)
{
    crew_model *m = r->m;
    fit_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    /* Replica 0's parameters, state and optimizer state are the run's starting point. */
    CREW_TRY(phase_error(r, broadcast_start(r), run->start_step, "broadcast of the starting point"));
    if (p->devices > 1) {
        CREW_TRY(crew_comm_worker_start(&r->worker, r->comm, run->timeout_s));
        r->has_worker = 1;
    }
    CREW_TRY(crew_stepper_init(&r->stepper, m, r->has_worker ? &r->worker : NULL, r->rank, p->devices,
                               p->batch_per_device, p->accumulation, run->bucket_mb, run->sync_bn));
    if (run->faults.slow_rank == r->rank) r->stepper.delay_s = run->faults.slow_s;
    int64_t step = run->start_step;
    int stopped = 0;
    for (int epoch = (int)(step / p->steps_per_epoch); epoch < p->epochs && step < p->total_steps && !stopped; epoch++)
        CREW_TRY(run_epoch(r, epoch, &step, &stopped));
    if (r->rank == 0) run->result->steps = step;
    return CREW_OK;
}
