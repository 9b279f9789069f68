/* loop.c — one rank's training loop: epochs, steps, the finiteness check and the update, the
 * per-step metrics every rank shares, the replica drift check, and rank 0's reports.
 *
 * The metrics of a step travel as one all-reduce of a [ranks × METRIC_FIELDS] matrix of doubles
 * in which each rank fills its own row (the others are zero, so the sum is a gather). Nothing here
 * assumes that ranks share memory, nor that device memory is the host's: the same code runs over
 * MPI and on a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/rank.h"

enum { M_LOSS, M_CORRECT, M_FLAGS, M_TIMES, METRIC_FIELDS = CREW_METRIC_FIELDS };
/* M_FLAGS, a sum of: rank 0 asks to stop after this step, rank 0 writes a checkpoint after it
 * (with sharding every rank helps), this rank's shard of the gradients is not finite. */
enum { FLAG_STOP = 1, FLAG_CHECKPOINT = 2, FLAG_NONFINITE = 4 };
_Static_assert(M_TIMES + CREW_STEP_TIMES_FIELDS == CREW_METRIC_FIELDS, "metric row layout");

/* The stepper's source of micro-batches: this rank's loader, at this step of the epoch. */
typedef struct batch_source {
    crew_rank *r;
    int epoch;
    int64_t epoch_step;
} batch_source;

/* Micro-batch `index` from the loader's host memory into the replica's input, labels and sample
 * ids, on the rank's copy queue; the compute queue waits for it, and the loader's slot is given
 * back once the copies are done. */
static crew_status next_batch(void *user, int index, double *wait_s)
{
    batch_source *b = user;
    crew_rank *r = b->r;
    crew_model *m = r->m;
    const crew_backend_ops *o = r->be->ops;
    void *ctx = r->be->ctx;
    int64_t rows = r->run->plan.batch_per_device, values = rows * crew_shape_size(&m->input);
    const crew_planted_bug plant = r->run->hooks.plant;
    int64_t step = b->epoch_step;
    if (plant == CREW_PLANT_WRONG_LOADER_SLOT && r->rank == 1 && step + 1 < r->run->plan.steps_per_epoch)
        step++; /* planted bug */
    crew_loader_batch lb;
    CREW_TRY(crew_error_prefix(crew_loader_take(r->loader, b->epoch, step, index, &lb, wait_s), "replica %d, ",
                               r->rank));
    const int64_t *ids = lb.ids;
    if (plant == CREW_PLANT_DROPOUT_BY_ROW) { /* planted bug: the row stands in for the sample */
        for (int64_t k = 0; k < rows && k < r->plant_rows_n; k++) r->plant_rows[k] = k;
        ids = r->plant_rows;
    }
    /* The input is what a backward pass still reads after its loss (the first layer's weight
     * gradient, an embedding's ids); labels and sample ids are done with once the loss, which
     * waits for the device, is in. With two input buffers the copy goes to the one the micro-batch
     * before last read, after its passes (ordered at the end of the previous call), so that it
     * overlaps the last micro-batch's; with one, after everything enqueued so far. */
    crew_status s = CREW_OK;
    if (r->input_alt)
        crew_model_set_input(m, r->uploads++ % 2 ? r->input_alt : r->input_own);
    else
        s = o->queue_wait(ctx, r->copy_q, NULL);
    if (!s) s = o->upload(ctx, r->copy_q, m->act[0], lb.x, values, CREW_DT_F32);
    if (!s) s = o->upload(ctx, r->copy_q, m->labels, lb.y, rows * crew_model_positions(m), CREW_DT_I32);
    if (!s) s = o->upload(ctx, r->copy_q, m->sample_ids, ids, rows, CREW_DT_I64);
    int skip = r->run->hooks.faults.skip_copy_wait; /* test fault: the bug the guard must expose */
    if (!s && !skip) s = o->queue_wait(ctx, NULL, r->copy_q);
    if (!s && !skip) s = o->sync(ctx, r->copy_q); /* the loader may refill the slot from here on */
    if (!s && r->input_alt) s = o->queue_wait(ctx, r->copy_q, NULL); /* the next copy: after these passes */
    crew_loader_release(r->loader, b->epoch, step, index);
    return s;
}

/* Rank 0 turns a failed collective into a hang event before the error ends the run. */
static crew_status phase_error(crew_rank *r, crew_status s, int64_t step, const char *phase)
{
    if (!s) return s;
    s = crew_error_prefix(s, "step %lld, %s: ", (long long)step, phase);
    if (r->sinks && crew_status_code(s) == CREW_CODE_TIMEOUT && r->sinks->monitor) {
        crew_rank_sink_enter(r);
        crew_status_free(crew_monitor_event(r->sinks->monitor, CREW_EVENT_HANG, step, -1, NAN, "%s",
                                            crew_status_message(s)));
        crew_rank_sink_leave(r);
    }
    return s;
}

/* Test faults that make a rank late or absent. */
static crew_status inject_stall(crew_rank *r, int64_t step)
{
    const crew_fit_faults *f = &r->run->hooks.faults;
    if (f->stall_step != step || f->stall_rank != r->rank) return CREW_OK;
    struct timespec ts = {(time_t)(r->run->timeout_s + 2.0), 0};
    nanosleep(&ts, NULL);
    /* A timeout, like the others' errors: the run's error is then rank 0's report of the missing replica. */
    return crew_errorf(CREW_CODE_TIMEOUT, "replica %d stalled on purpose at step %lld (test fault)", r->rank,
                       (long long)step);
}

/* Test fault: a rank that stops for good at the start of a step, as a thread stopped by a
 * debugger or stuck in a driver would: it never reaches another collective and never returns. */
static void inject_freeze(const crew_rank *r, int64_t step)
{
    const crew_fit_faults *f = &r->run->hooks.faults;
    if (f->freeze_step != step || f->freeze_rank != r->rank) return;
    for (;;) {
        struct timespec ts = {3600, 0};
        nanosleep(&ts, NULL);
    }
}

/* Test fault: host code reading a parameter straight from device memory, the bug the guarded
 * backend exists to catch (it traps there; on the plain CPU backend this reads a value). */
static void inject_host_touch(crew_rank *r, int64_t step)
{
    if (r->run->hooks.faults.host_touch_step != step || r->rank != 0) return;
    volatile float v = r->m->params[0];
    (void)v;
}

/* What a step with non-finite gradients does: rank 0 reports it; the run stops (on_nan stop) or
 * the update is skipped (*skip = 1). Every rank comes to the same verdict. */
static crew_status nonfinite_verdict(crew_rank *r, int64_t step, int *skip)
{
    int stop = r->run->opts->on_nan == CREW_ON_NAN_STOP;
    if (r->sinks) {
        crew_rank_sink_enter(r);
        crew_status e = crew_monitor_event(r->sinks->monitor, stop ? CREW_EVENT_NAN : CREW_EVENT_SKIPPED_UPDATE, step,
                                           -1, NAN, "step %lld: the gradients hold NaN or infinity; %s", (long long)step,
                                           stop ? "stopping before the update" : "this update is skipped");
        crew_rank_sink_leave(r);
        CREW_TRY(e);
    }
    if (stop)
        return crew_errorf(CREW_CODE_NUMERIC, "step %lld: the gradients hold NaN or infinity; stopped before the update "
                           "(--on-nan skip would skip such steps instead)", (long long)step);
    *skip = 1;
    return CREW_OK;
}

/* Whether the rank's reduced gradients (all of them, or its shard's) are finite. Unsharded they
 * are the same on every rank (they were all-reduced), so every rank decides alike without talking;
 * a shard's verdict travels with the step's metrics. */
static crew_status grads_finite(crew_rank *r, float *grad, int64_t step, int *finite)
{
    const crew_backend_ops *o = r->be->ops;
    if (r->run->hooks.faults.nan_step == step) o->fill(r->be->ctx, grad, NAN, 1);
    int64_t lo = r->shard ? r->shard_lo : 0, n = r->shard ? r->opt.n : r->m->n_params;
    *finite = 1;
    return n > 0 ? o->all_finite(r->be->ctx, grad + lo, n, finite) : CREW_OK;
}

/* Test fault: one rank's first parameter moves by 1e-3, through the backend as any write. */
static crew_status inject_corruption(crew_rank *r, int64_t step)
{
    const crew_fit_faults *f = &r->run->hooks.faults;
    if (f->corrupt_step != step || f->corrupt_rank != r->rank) return CREW_OK;
    float v;
    CREW_TRY(crew_dev_download_f32(r->be, &v, r->m->params, 1));
    v += 1e-3f;
    return crew_dev_upload_f32(r->be, r->m->params, &v, 1);
}

/* Hashes each tensor (parameters and state) and the optimizer's moments of every rank on its
 * device and compares them. The hashes of the first CREW_DRIFT_TENSORS tensors, then of the two
 * moment buffers whole. */
static crew_status check_drift(crew_rank *r, int64_t step)
{
    crew_model *m = r->m;
    CREW_TRY(inject_corruption(r, step));
    crew_named_param names[CREW_DRIFT_TENSORS];
    int named = crew_model_named_params(m, names, CREW_DRIFT_TENSORS);
    if (named > CREW_DRIFT_TENSORS) named = CREW_DRIFT_TENSORS;
    const int t = named + 2;
    int n = r->size;
    double *h = calloc((size_t)n * (size_t)t * 2, sizeof *h);
    if (!h) return CREW_OOM();
    crew_status s = CREW_OK;
    for (int i = 0; i < t && !s; i++) {
        const float *values = i < named ? names[i].param->value : r->opt.slot[i - named];
        int64_t count = i < named ? crew_shape_size(&names[i].param->shape) : r->opt.n;
        /* Batch-norm moving statistics are the same everywhere only when the batch statistics are
         * synchronised; otherwise each replica's follow its own micro-batches, by design. */
        if (i < named && !names[i].param->trainable && !r->run->sync_bn) continue; /* both halves stay 0 */
        if (!values) continue; /* an optimizer without this moment */
        if (i >= named && r->shard) continue; /* sharded: each rank's moments are of its own shard */
        uint64_t x = 0;
        s = r->be->ops->hash(r->be->ctx, values, count, CREW_DT_F32, &x);
        h[((size_t)r->rank * t + i) * 2] = (double)(uint32_t)(x >> 32); /* halves are exact in a double */
        h[((size_t)r->rank * t + i) * 2 + 1] = (double)(uint32_t)x;
    }
    if (!s) s = phase_error(r, crew_rank_allreduce_host(r, h, (int64_t)n * t * 2), step, "replica drift check");
    for (int i = 0; i < t && !s; i++)
        for (int q = 1; q < n; q++) {
            const double *a = h + (size_t)i * 2, *b = h + ((size_t)q * t + i) * 2;
            if (a[0] == b[0] && a[1] == b[1]) continue;
            char what[160];
            if (i < named)
                snprintf(what, sizeof what, "tensor '%.140s'", names[i].name);
            else
                snprintf(what, sizeof what, "the optimizer's %s", i == named ? "first moment" : "second moment");
            s = crew_errorf(CREW_CODE_DIVERGED, "step %lld: replicas diverged: %s differs between replica 0 "
                            "and replica %d", (long long)step, what, q);
            if (r->sinks) {
                crew_rank_sink_enter(r);
                crew_status_free(crew_monitor_event(r->sinks->monitor, CREW_EVENT_DIVERGENCE, step, q, NAN, "%s",
                                                    crew_status_message(s)));
                crew_rank_sink_leave(r);
            }
            break;
        }
    free(h);
    return s;
}

/* Rank 0: everyone's row into a step record for the monitor and the caller. */
static crew_status report_step(crew_rank *r, int epoch, int64_t epoch_step, int64_t step, double step_s,
                               double epoch_start, int skipped, double *loss, double *correct)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    int n = r->size;
    *loss = *correct = 0.0;
    for (int q = 0; q < n; q++) {
        const double *row = r->metrics + (size_t)q * METRIC_FIELDS;
        *loss += row[M_LOSS];
        *correct += row[M_CORRECT];
        memcpy(&r->times[q], row + M_TIMES, sizeof r->times[q]);
    }
    if (!r->sinks) return CREW_OK;
    float lr = crew_lr_at(&run->lr, step - 1);
    crew_step_record rec = {step, epoch, crew_unix_now(), (float)(*loss / (double)p->global_batch),
                            (float)(*correct / (double)p->global_batch), lr, p->global_batch, step_s, skipped, n,
                            r->times};
    crew_rank_sink_enter(r);
    crew_status s = crew_monitor_step(r->sinks->monitor, &rec);
    if (!s && run->opts->on_step) {
        const crew_step_times *t = &r->times[0];
        crew_step_info info = {step, p->total_steps, epoch, epoch_step + 1, p->steps_per_epoch, rec.loss, rec.accuracy,
                               lr, step_s, crew_now() - epoch_start, t->data_s, t->forward_s, t->backward_s,
                               t->comm_exposed_s, t->comm_hidden_s, t->optimizer_s};
        run->opts->on_step(run->opts->user, &info);
    }
    crew_rank_sink_leave(r);
    return s;
}

/* Rank 0 reads the caller's cancel flag inside a sink section: it is the caller's memory. */
static int cancel_requested(const crew_rank *r)
{
    if (!r->sinks || !r->run->opts->cancel) return 0;
    crew_rank_sink_enter(r);
    int stop = __atomic_load_n(r->run->opts->cancel, __ATOMIC_RELAXED) != 0; /* a signal handler may set it */
    crew_rank_sink_leave(r);
    return stop;
}

typedef struct step_result {
    double loss, correct;
    int stop, checkpoint, skipped;
} step_result;

/* The learning rate of 1-based `step`. */
static float lr_at(const crew_rank *r, int64_t step)
{
    crew_lr_plan lr = r->run->lr;
    if (r->run->hooks.plant == CREW_PLANT_WARMUP_SKIPPED && r->size > 1) lr.warmup_steps = 0; /* planted bug */
    return crew_lr_at(&lr, step - 1);
}

/* Sharded: once every rank's verdict on its shard is in, the update of the rank's shard and the
 * parameters' all-gather (rank_shard.c), or every rank's same verdict on non-finite gradients. */
static crew_status sharded_update(crew_rank *r, float *grad, int64_t step, int *skipped)
{
    int bad = 0;
    for (int q = 0; q < r->size; q++) bad |= ((int)r->metrics[(size_t)q * METRIC_FIELDS + M_FLAGS] & FLAG_NONFINITE) != 0;
    r->shard_update_s = 0.0;
    if (bad) return nonfinite_verdict(r, step, skipped);
    double t0 = crew_now();
    crew_status s = crew_rank_shard_update(r, grad, lr_at(r, step));
    r->shard_update_s = crew_now() - t0;
    return phase_error(r, s, step, "sharded update and parameter all-gather");
}

/* Planted bugs between the all-reduce and the update: the gradient averaged once more, or rank
 * 1 updating with the previous step's (zeros at the first). */
static crew_status plant_gradient(crew_rank *r, float **grad)
{
    const crew_backend_ops *o = r->be->ops;
    void *ctx = r->be->ctx;
    int64_t n = r->m->n_params;
    if (r->run->hooks.plant == CREW_PLANT_AVERAGED_TWICE && r->size > 1)
        o->axpby(ctx, n, 1.0f / (float)r->size, *grad, 0.0f, *grad);
    if (r->run->hooks.plant != CREW_PLANT_STALE_GRADIENT || r->rank != 1) return CREW_OK;
    if (!r->plant_prev[0]) {
        for (int i = 0; i < 2; i++) CREW_TRY(crew_dev_alloc_f32(r->be, n, &r->plant_prev[i]));
        o->fill(ctx, r->plant_prev[0], 0.0f, n);
    }
    o->copy(ctx, r->plant_prev[1], *grad, n); /* this step's, for the next */
    *grad = r->plant_prev[0];
    float *t = r->plant_prev[0];
    r->plant_prev[0] = r->plant_prev[1];
    r->plant_prev[1] = t;
    return CREW_OK;
}

/* One optimizer step; `step` is 1-based. */
static crew_status train_step(crew_rank *r, int epoch, int64_t epoch_step, int64_t step, double epoch_start,
                              step_result *out)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    crew_model *m = r->m;
    double t0 = crew_now();
    CREW_TRY(inject_stall(r, step));
    inject_freeze(r, step);
    inject_host_touch(r, step);
    crew_step_totals tot = {0};
    crew_step_times times = {0};
    float *grad;
    batch_source src = {r, epoch, epoch_step};
    crew_status s = crew_stepper_gradients(&r->stepper, p->seed, step - 1, next_batch, &src, &grad, &tot, &times);
    if (r->input_alt) crew_model_set_input(m, r->input_own); /* the model's own buffer between steps */
    CREW_TRY(phase_error(r, s, step, "forward/backward and gradient all-reduce"));
    double t1 = crew_now();
    CREW_TRY(plant_gradient(r, &grad));
    if (run->hooks.first_grads && r->shard && step == run->start_step + 1) CREW_TRY(crew_rank_shard_gather_grad(r, grad));
    if (run->hooks.first_grads && r->sinks && step == run->start_step + 1) { /* the caller's memory */
        crew_rank_sink_enter(r);
        crew_status d = crew_dev_download_f32(r->be, run->hooks.first_grads, grad, m->n_params);
        crew_rank_sink_leave(r);
        CREW_TRY(d);
    }
    int finite = 1;
    CREW_TRY(grads_finite(r, grad, step, &finite));
    if (!r->shard && !finite) CREW_TRY(nonfinite_verdict(r, step, &out->skipped));
    if (!r->shard && !out->skipped) CREW_TRY(crew_optimizer_step(&r->opt, r->be, m->params, grad, lr_at(r, step), NULL));
    times.optimizer_s = crew_now() - t1 + r->shard_update_s; /* sharded: the last step's update */
    memset(r->metrics, 0, (size_t)r->size * METRIC_FIELDS * sizeof *r->metrics);
    double *row = r->metrics + (size_t)r->rank * METRIC_FIELDS;
    row[M_LOSS] = tot.loss_sum;
    row[M_CORRECT] = tot.correct;
    int stop = cancel_requested(r);
    row[M_FLAGS] = (stop ? FLAG_STOP : 0) + (crew_run_checkpoint_due(r->run, r->sinks, step, stop) ? FLAG_CHECKPOINT : 0) +
                   (finite ? 0 : FLAG_NONFINITE);
    memcpy(row + M_TIMES, &times, sizeof times);
    crew_status ms = crew_rank_allreduce_host(r, r->metrics, (int64_t)r->size * METRIC_FIELDS);
    CREW_TRY(phase_error(r, ms, step, "metrics all-reduce"));
    int flags = (int)r->metrics[M_FLAGS]; /* rank 0's row */
    out->stop = (flags & FLAG_STOP) != 0;
    out->checkpoint = (flags & FLAG_CHECKPOINT) != 0;
    if (r->shard) CREW_TRY(sharded_update(r, grad, step, &out->skipped));
    if (run->drift_every > 0 && step % run->drift_every == 0) CREW_TRY(check_drift(r, step));
    return report_step(r, epoch, epoch_step, step, crew_now() - t0, epoch_start, out->skipped, &out->loss, &out->correct);
}

/* Every rank evaluates its share of the test set; the sums are all-reduced. */
static crew_status evaluate_shared(crew_rank *r, const crew_dataset *d, int64_t step, float *loss, float *acc)
{
    int64_t n = crew_dataset_size(d), size = r->size;
    int64_t lo = n * r->rank / size, hi = n * (r->rank + 1) / size;
    double sums[2] = {0.0, 0.0};
    /* Evaluation reuses the training batch size: the activations are already sized for it. */
    CREW_TRY(crew_eval_range(r->m, d, lo, hi, r->run->plan.batch_per_device, &sums[0], &sums[1]));
    CREW_TRY(phase_error(r, crew_rank_allreduce_host(r, sums, 2), step, "evaluation"));
    *loss = (float)(sums[0] / (double)n);
    *acc = (float)(sums[1] / (double)n);
    return CREW_OK;
}

static crew_status finish_epoch(crew_rank *r, crew_epoch_info *info, int64_t step)
{
    const crew_fit_options *o = r->run->opts;
    if (o->test) CREW_TRY(evaluate_shared(r, o->test, step, &info->test_loss, &info->test_accuracy));
    info->test_bits = o->test && crew_model_positions(r->m) > 1 ? (float)(info->test_loss / log(2.0)) : NAN;
    if (!r->sinks) return CREW_OK;
    crew_rank_sink_enter(r);
    crew_status s = crew_run_sinks_epoch(r->sinks, o, info);
    crew_rank_sink_leave(r);
    return s;
}

/* A checkpoint after `step`, when rank 0 said one is due (in the step's metrics, so every rank
 * knows): rank 0 writes it; sharded, every rank first sends it its shard of the optimizer state.
 * Unsharded, the others go on to the next step and wait for rank 0 at its first collective. */
static crew_status write_checkpoint(crew_rank *r, int64_t step)
{
    const crew_run *run = r->run;
    if (r->shard) CREW_TRY(phase_error(r, crew_rank_shard_gather(r), step, "optimizer state gathered for a checkpoint"));
    crew_run_sinks *out = r->sinks;
    if (!out) return CREW_OK;
    crew_checkpoint_state st = {.step = step, .plan = run->plan, .lr = run->lr};
    crew_rank_sink_enter(r);
    /* sharded: the gathered state is host memory of the caller's model, so the values go there too,
     * and the checkpoint is written from that one device */
    crew_status s = r->shard ? crew_model_copy_values(out->model, r->m) : CREW_OK;
    if (!s) s = crew_checkpoint_write(run->opts->checkpoint_dir, r->shard ? out->model : r->m, r->shard ? &r->whole_opt : &r->opt, &st,
                                          run->opts->keep_checkpoints, out->result->last_checkpoint,
                                          sizeof out->result->last_checkpoint);
    out->last_checkpoint_time = crew_now();
    crew_rank_sink_leave(r);
    return s;
}

static crew_status run_epoch(crew_rank *r, int epoch, int64_t *step, int *stopped)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    CREW_TRY(crew_loader_start_epoch(r->loader, epoch, *step - (int64_t)epoch * p->steps_per_epoch));
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
        if (r->sinks) {
            crew_rank_sink_enter(r);
            r->sinks->result->skipped_updates += sr.skipped;
            crew_rank_sink_leave(r);
        }
        *stopped = sr.stop;
        if (sr.checkpoint) CREW_TRY(write_checkpoint(r, *step));
    }
    crew_epoch_info info = crew_run_epoch_info(r->run, epoch, steps, crew_now() - start, loss, correct);
    if (r->sinks) {
        crew_rank_sink_enter(r);
        r->sinks->train_s += info.wall_s;
        crew_rank_sink_leave(r);
    }
    return finish_epoch(r, &info, *step);
}

crew_status crew_rank_train(crew_rank *r)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    int64_t step = run->start_step;
    int stopped = 0;
    for (int epoch = (int)(step / p->steps_per_epoch); epoch < p->epochs && step < p->total_steps && !stopped; epoch++)
        CREW_TRY(run_epoch(r, epoch, &step, &stopped));
    if (r->sinks) {
        crew_rank_sink_enter(r);
        r->sinks->result->steps = step;
        crew_rank_sink_leave(r);
    }
    return CREW_OK;
}
