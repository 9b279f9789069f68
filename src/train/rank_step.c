/* rank_step.c — one optimizer step of a rank: the schedule's passes over its replica's
 * micro-batches, the reduction of their gradients with the stage's other replicas (the stepper,
 * step.h), the step's metrics shared with every rank, and the update.
 *
 * The passes run in the order of rank->ops: for one stage, F0 B0 F1 B1 ... (one replica
 * accumulating); in a pipeline, the schedule's (pipeline.h), activations coming from the stage
 * before and going to the one after. Every stage runs its backward passes in micro-batch order,
 * so its gradient is the sum of the micro-batches' in that order whatever the layout.
 *
 * The metrics of a step travel as one all-reduce of a [ranks × CREW_METRIC_FIELDS] matrix of
 * doubles in which each rank fills its own row (the others are zero, so the sum is a gather).
 * Nothing here assumes that ranks share memory, nor that device memory is the host's: the same
 * code runs over MPI and on a GPU. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"
#include "train/rank.h"

enum { M_LOSS, M_CORRECT, M_FLAGS, M_SQ_SMALL, M_SQ_BIG, M_TIMES };
_Static_assert(M_TIMES + CREW_STEP_TIMES_FIELDS == CREW_METRIC_FIELDS, "metric row layout");
/* M_FLAGS, a sum of: this rank's process asks to stop; rank 0 writes a checkpoint after this step,
 * or would when the run stops after it; this rank's gradients (all of them, its shard's or its
 * stage's) are not finite. */
enum { FLAG_STOP = 1, FLAG_CHECKPOINT = 2, FLAG_CHECKPOINT_ON_STOP = 4, FLAG_NONFINITE = 8 };

/* Message tags of a micro-batch's activation (forward) and its gradient (backward). */
#define TAG_FORWARD(j) (2 * (j))
#define TAG_BACKWARD(j) (2 * (j) + 1)

typedef struct step_sums {
    double loss, correct;
} step_sums;

/* ------------------------------------------------------------------ the passes */

/* "replica 1", or in a pipeline "stage 0 of replica 1": for messages. */
static const char *rank_name(const crew_rank *r, char *buf, size_t len)
{
    if (r->stages > 1)
        snprintf(buf, len, "stage %d of replica %d", r->stage, r->replica);
    else
        snprintf(buf, len, "replica %d", r->replica);
    return buf;
}

/* Micro-batch `micro` of the step from the loader's host memory into the slot, on the rank's copy
 * queue: the input on the first stage, the labels on the last, the sample ids (dropout's masks) on
 * every stage; the compute queue waits for them, and the loader's slot is given back once the
 * copies are done. A rank whose device reads host memory (r->in_place) reads the input where the
 * loader left it instead, and keeps the slot until the step ends (release_held): the copy of a
 * micro-batch written by another core cost the MLP a tenth of its step. */
static crew_status load(crew_rank *r, crew_model *m, const crew_rank_step *st, int micro, crew_step_times *t)
{
    const crew_backend_ops *o = r->be->ops;
    void *ctx = r->be->ctx;
    int64_t epoch_step = st->epoch_step;
    int index = r->replica * r->run->plan.accumulation + micro;
    if (CREW_HOOK(r, batch_slot)) r->hooks->batch_slot(r->hooks_user, &r->who, micro, &epoch_step, &index);
    double t0 = crew_now(), waited = 0.0;
    crew_loader_batch lb;
    char who[48];
    CREW_TRY(crew_error_prefix(crew_loader_take(r->loader, st->epoch, epoch_step, index, &lb, &waited), "%s, ",
                               rank_name(r, who, sizeof who)));
    const int64_t *ids = lb.ids;
    if (CREW_HOOK(r, sample_ids)) ids = r->hooks->sample_ids(r->hooks_user, &r->who, ids, r->rows);
    /* The input is what a backward pass still reads after its loss (the first layer's weight
     * gradient, an embedding's ids); labels and sample ids are done with once the loss, which
     * waits for the device, is in. With two input buffers the copy goes to the one the micro-batch
     * before last read, after its passes (ordered at the end of the previous call), so that it
     * overlaps the last micro-batch's; with one, after everything enqueued so far (a GPU's
     * backward pass of the slot's last micro-batch may still read it). */
    crew_status s = CREW_OK;
    if (r->input_alt)
        crew_model_set_input(m, r->uploads++ % 2 ? r->input_alt : r->input_own);
    else
        s = o->queue_wait(ctx, r->copy_q, NULL);
    if (r->in_place) {
        crew_model_set_input(m, o->in_place(ctx, (float *)lb.x, r->rows * r->in_values, CREW_DT_F32));
        r->held[r->n_held++] = (struct crew_rank_held){st->epoch, epoch_step, index};
    } else if (!s && crew_rank_first_stage(r)) {
        s = o->upload(ctx, r->copy_q, m->act[0], lb.x, r->rows * r->in_values, CREW_DT_F32);
    }
    if (!s && crew_rank_last_stage(r))
        s = o->upload(ctx, r->copy_q, m->labels, lb.y, r->rows * crew_model_positions(m), CREW_DT_I32);
    if (!s) s = o->upload(ctx, r->copy_q, m->sample_ids, ids, r->rows, CREW_DT_I64);
    int ordered = !CREW_HOOK(r, unordered_uploads) || !r->hooks->unordered_uploads(r->hooks_user, &r->who);
    if (!s && ordered) s = o->queue_wait(ctx, NULL, r->copy_q);
    if (!s && ordered) s = o->sync(ctx, r->copy_q); /* the loader may refill the slot from here on */
    if (!s && r->input_alt) s = o->queue_wait(ctx, r->copy_q, NULL); /* the next copy: after these passes */
    if (!r->in_place) crew_loader_release(r->loader, st->epoch, epoch_step, index);
    t->data_s += crew_now() - t0;
    return s;
}

/* The slots whose inputs the step's passes read in place, given back once they have run (the
 * CPU's ops have run when they return), and the model's own input buffer put back. */
static void release_held(crew_rank *r)
{
    for (int i = 0; i < r->n_held; i++)
        crew_loader_release(r->loader, r->held[i].epoch, r->held[i].step, r->held[i].index);
    r->n_held = 0;
    crew_model_set_input(r->m, r->input_own);
}

/* Synchronised batch norm: the statistics summed over this stage of every replica, which run the
 * same passes in the same order, so their collectives match up (on the communication thread, in
 * the order of the rank's other requests). */
static crew_status sync_sum(void *user, double *buf, int64_t n)
{
    crew_rank *r = user;
    return crew_comm_worker_allreduce(&r->worker, buf, n, CREW_COMM_F64, CREW_REDUCE_SUM);
}

static crew_pass pass_of(crew_rank *r, crew_model *m, const crew_rank_step *st)
{
    crew_pass p = {.be = r->be, .rows = r->rows, .training = 1, .seed = r->run->plan.seed, .step = st->step - 1,
                   .sample_ids = m->sample_ids, .total_rows = (double)r->rows};
    if (r->stepper.sync_bn) {
        p.sync_sum = sync_sum;
        p.sync_user = r;
        p.total_rows = (double)r->rows * r->replicas;
    }
    if (CREW_HOOK(r, pass)) r->hooks->pass(r->hooks_user, &r->who, &p);
    return p;
}

static crew_status recv_timed(crew_rank *r, void *buf, int64_t n, int peer, int tag, crew_step_times *t)
{
    double t0 = crew_now();
    crew_status s = crew_recv(&r->world, buf, n, CREW_COMM_F32, peer, tag, r->run->timeout_s);
    t->comm_exposed_s += crew_now() - t0;
    return s;
}

/* The device's compute must be done before a send reads its output from the host. */
static crew_status send_after(crew_rank *r, const void *buf, int64_t n, int peer, int tag)
{
    CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
    return crew_send(&r->world, buf, n, CREW_COMM_F32, peer, tag, r->run->timeout_s);
}

/* Pass i of the step, the forward pass of micro-batch `micro`, and on the last stage its loss. Its
 * timeline entry (a pipeline's) spans the compute and the send, not the waits for data and for the
 * neighbour. */
static crew_status forward(crew_rank *r, const crew_rank_step *st, int i, int micro, crew_step_times *t,
                           step_sums *sums)
{
    crew_model *m = r->slot[micro % r->n_slots];
    CREW_TRY(load(r, m, st, micro, t));
    if (!crew_rank_first_stage(r))
        CREW_TRY(recv_timed(r, m->act[0], r->rows * r->in_values, r->rank - 1, TAG_FORWARD(micro), t));
    crew_pass pass = pass_of(r, m, st);
    double t0 = crew_now();
    if (r->tl) r->tl[2 * i] = t0;
    CREW_TRY(crew_model_forward(m, &pass));
    double t1 = crew_now();
    t->forward_s += t1 - t0;
    if (crew_rank_last_stage(r)) { /* the loss counts as backward's (record.h) */
        double loss = 0.0, correct = 0.0;
        CREW_TRY(crew_model_loss(m, &pass, 1.0f / (float)r->run->plan.global_batch, &loss, &correct));
        sums->loss += loss;
        sums->correct += correct;
        t->backward_s += crew_now() - t1;
    }
    if (!crew_rank_last_stage(r))
        CREW_TRY(send_after(r, m->act[m->n_compute], r->rows * r->out_values, r->rank + 1, TAG_FORWARD(micro)));
    if (r->tl) r->tl[2 * i + 1] = crew_now();
    return CREW_OK;
}

static crew_status backward(crew_rank *r, const crew_rank_step *st, int i, int micro, crew_step_times *t)
{
    crew_model *m = r->slot[micro % r->n_slots];
    if (!crew_rank_last_stage(r))
        CREW_TRY(recv_timed(r, m->dbuf[0], r->rows * r->out_values, r->rank + 1, TAG_BACKWARD(micro), t));
    crew_pass pass = pass_of(r, m, st);
    double t0 = crew_now();
    if (r->tl) r->tl[2 * i] = t0;
    if (r->units) { /* ZeRO-2/3: the units reduce as the model visits its layers (rank_units.c) */
        crew_rank_units_micro(r, micro);
        CREW_TRY(crew_model_backward(m, &pass, NULL, NULL));
    } else {
        CREW_TRY(crew_stepper_backward(&r->stepper, m, micro, &pass));
    }
    t->backward_s += crew_now() - t0;
    if (!crew_rank_first_stage(r))
        CREW_TRY(send_after(r, crew_model_input_grad(m), r->rows * r->in_values, r->rank - 1, TAG_BACKWARD(micro)));
    if (r->tl) r->tl[2 * i + 1] = crew_now();
    return CREW_OK;
}

/* The step's passes, then the stage's gradients reduced over its replicas into *grad. */
static crew_status gradients(crew_rank *r, const crew_rank_step *st, float **grad, crew_step_times *t, step_sums *sums)
{
    if (r->units)
        crew_rank_units_begin(r, st->measure, t);
    else
        crew_stepper_begin(&r->stepper, st->measure);
    crew_status s = CREW_OK;
    for (int i = 0; i < 2 * r->run->plan.accumulation && !s; i++)
        s = r->ops[i].backward ? backward(r, st, i, r->ops[i].micro, t) : forward(r, st, i, r->ops[i].micro, t, sums);
    if (!s && CREW_HOOK(r, passes_done)) r->hooks->passes_done(r->hooks_user, &r->who, t);
    if (r->units)
        s = crew_rank_units_finish(r, s, grad, &r->stepper.sq_small);
    else
        s = crew_stepper_finish(&r->stepper, s, t, grad);
    if (r->input_alt) crew_model_set_input(r->m, r->input_own); /* the model's own buffer between steps */
    if (r->in_place) release_held(r);
    return s;
}

/* ------------------------------------------------------------------ the update */

/* The learning rate of 1-based `step`. */
static float lr_at(crew_rank *r, int64_t step)
{
    crew_lr_plan lr = r->run->lr;
    if (CREW_HOOK(r, lr_plan)) r->hooks->lr_plan(r->hooks_user, &r->who, &lr);
    return crew_lr_at(&lr, step - 1);
}

/* Whether the rank's reduced gradients (its shard's, when sharded) are finite. A step that
 * measures the noise scale asks the same pass for their squared norm instead: in double, the sum of
 * float32 squares is finite exactly when every value is (none can overflow it). The norm counts
 * once in the run: from every shard, else from replica 0 of each stage alone (the others hold the
 * same gradient). */
static crew_status grads_finite(crew_rank *r, const float *grad, crew_rank_step *st, int *finite)
{
    /* ZeRO-2/3's gradient is its shard alone; ZeRO-1's the shard's range of a whole buffer */
    int64_t lo = r->shard && !r->units ? r->shard_lo : 0, n = r->shard ? r->opt.n : r->m->n_params;
    *finite = 1;
    st->sq_big = 0.0;
    if (n <= 0) return CREW_OK;
    if (!st->measure) return r->be->ops->all_finite(r->be->ctx, grad + lo, n, finite);
    double sq = 0.0;
    CREW_TRY(r->be->ops->sum_squares(r->be->ctx, grad + lo, n, &sq));
    *finite = isfinite(sq);
    if (r->shard || r->replica == 0) st->sq_big = sq;
    return CREW_OK;
}

/* Without sharding and without a pipeline every rank holds the same reduced gradient, so every
 * rank decides alike before the metrics all-reduce, and the update's time is the step's own.
 * Otherwise the verdict needs every shard's or stage's, which the metrics carry, and the update
 * follows them (its time is reported with the next step). */
static int local_verdict(const crew_rank *r) { return r->stages == 1 && !r->shard; }

/* What a step with non-finite gradients does: rank 0 reports it; the run stops (on_nan stop) or
 * the update is skipped (*skipped = 1). Every rank comes to the same verdict. */
static crew_status nonfinite_verdict(crew_rank *r, int64_t step, int *skipped)
{
    int stop = r->run->opts->on_nan == CREW_ON_NAN_STOP;
    char msg[160];
    snprintf(msg, sizeof msg, "step %lld: the gradients hold NaN or infinity; %s", (long long)step,
             stop ? "stopping before the update" : "this update is skipped");
    CREW_TRY(crew_rank_event(r, stop ? CREW_EVENT_NAN : CREW_EVENT_SKIPPED_UPDATE, step, -1, msg));
    if (stop)
        return crew_errorf(CREW_CODE_NUMERIC, "step %lld: the gradients hold NaN or infinity; stopped before the update "
                           "(--on-nan skip would skip such steps instead)", (long long)step);
    *skipped = 1;
    return CREW_OK;
}

/* The update of the rank's parameters (its shard's, sharded: then the parameters' all-gather). */
static crew_status update(crew_rank *r, float *grad, int64_t step)
{
    if (r->shard)
        return crew_rank_phase_error(r, crew_rank_shard_update(r, grad, lr_at(r, step)), step,
                                     "sharded update and parameter all-gather");
    if (!r->m->n_params) { /* a stage without parameters counts the update too, for the checkpoint */
        r->opt.t++;
        return CREW_OK;
    }
    return crew_optimizer_step(&r->opt, r->be, r->m->params, grad, lr_at(r, step), NULL);
}

/* ------------------------------------------------------------------ the step */

int crew_rank_cancel_requested(const crew_rank *r)
{
    if (!r->local_lead || !r->run->opts->cancel) return 0;
    crew_rank_sink_enter(r);
    int stop = __atomic_load_n(r->run->opts->cancel, __ATOMIC_RELAXED) != 0;
    crew_rank_sink_leave(r);
    return stop;
}

/* This rank's row of the step's metrics. */
static void fill_row(crew_rank *r, const crew_rank_step *st, const step_sums *sums, const crew_step_times *t, int finite)
{
    memset(r->metrics, 0, (size_t)r->size * CREW_METRIC_FIELDS * sizeof *r->metrics);
    double *row = r->metrics + (size_t)r->rank * CREW_METRIC_FIELDS;
    row[M_LOSS] = sums->loss;
    row[M_CORRECT] = sums->correct;
    int flags = (crew_rank_cancel_requested(r) ? FLAG_STOP : 0) | (finite ? 0 : FLAG_NONFINITE);
    if (crew_run_checkpoint_due(r->run, r->sinks, st->step, 0)) flags |= FLAG_CHECKPOINT;
    if (crew_run_checkpoint_due(r->run, r->sinks, st->step, 1)) flags |= FLAG_CHECKPOINT_ON_STOP;
    row[M_FLAGS] = flags;
    row[M_SQ_SMALL] = st->measure ? r->stepper.sq_small : 0.0;
    row[M_SQ_BIG] = st->sq_big;
    memcpy(row + M_TIMES, t, sizeof *t);
}

/* Everyone's rows: the step's sums and times, and the verdicts every rank takes alike. */
static void read_rows(crew_rank *r, crew_rank_step *st, int *nonfinite)
{
    int any = 0;
    st->loss = st->correct = st->sq_small = st->sq_big = 0.0;
    for (int q = 0; q < r->size; q++) {
        const double *row = r->metrics + (size_t)q * CREW_METRIC_FIELDS;
        st->loss += row[M_LOSS];
        st->correct += row[M_CORRECT];
        st->sq_small += row[M_SQ_SMALL];
        st->sq_big += row[M_SQ_BIG];
        any |= (int)row[M_FLAGS];
        memcpy(&r->times[q], row + M_TIMES, sizeof r->times[q]);
    }
    const int first = (int)r->metrics[M_FLAGS]; /* rank 0's row: the checkpoint is its to decide */
    st->stop = (any & FLAG_STOP) != 0;
    st->checkpoint = (first & FLAG_CHECKPOINT) || (st->stop && (first & FLAG_CHECKPOINT_ON_STOP));
    *nonfinite = (any & FLAG_NONFINITE) != 0;
}

/* Rank 0: everyone's rows into a step record for the monitor and the caller. */
static crew_status report_step(crew_rank *r, const crew_rank_step *st, double step_s)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    if (!r->sinks) return CREW_OK;
    float lr = crew_lr_at(&run->lr, st->step - 1);
    crew_step_record rec = {st->step, st->epoch, crew_unix_now(), (float)(st->loss / (double)p->global_batch),
                            (float)(st->correct / (double)p->global_batch), lr, p->global_batch, step_s, st->skipped,
                            r->size, r->times, NAN, NAN, p->batch_per_device};
    if (st->measure) {
        /* The loss is the global batch's mean, so a micro-batch's gradient g is its samples' summed
         * gradients over B: its own mean gradient is (B/b)·g. The step's M = B/b micro-batches. */
        const double B = (double)p->global_batch, b = (double)p->batch_per_device, scale = B / b;
        rec.grad_sq_small = scale * scale * st->sq_small / (B / b);
        rec.grad_sq_big = st->sq_big;
    }
    crew_rank_sink_enter(r);
    crew_status s = crew_monitor_step(r->sinks->monitor, &rec);
    if (!s && run->opts->on_step) {
        const crew_step_times *t = &r->times[0];
        crew_step_info info = {st->step, p->total_steps, st->epoch, st->epoch_step + 1, p->steps_per_epoch, rec.loss,
                               rec.accuracy, lr, step_s, crew_now() - st->epoch_start, t->data_s, t->forward_s,
                               t->backward_s, t->comm_exposed_s, t->comm_hidden_s, t->optimizer_s,
                               crew_monitor_noise_scale(r->sinks->monitor)};
        run->opts->on_step(run->opts->user, &info);
    }
    crew_rank_sink_leave(r);
    return s;
}

crew_status crew_rank_train_step(crew_rank *r, crew_rank_step *st)
{
    const crew_run *run = r->run;
    const int64_t step = st->step;
    double t0 = crew_now();
    if (CREW_HOOK(r, step_begins)) CREW_TRY(r->hooks->step_begins(r->hooks_user, &r->who, step));
    crew_step_times times = {0};
    step_sums sums = {0};
    float *grad = NULL;
    const int64_t every = run->plan.noise_scale_every;
    st->measure = every > 0 && (step - 1) % every == 0;
    crew_status s = gradients(r, st, &grad, &times, &sums);
    CREW_TRY(crew_rank_phase_error(r, s, step, "forward/backward and gradient all-reduce"));
    double t1 = crew_now();
    if (CREW_HOOK(r, gradient)) {
        crew_rank_grad_range(r, &r->who.grad_lo, &r->who.grad_n, &r->who.grad_params);
        CREW_TRY(r->hooks->gradient(r->hooks_user, &r->who, step, &grad));
    }
    if (run->hooks.first_grads && step == run->start_step + 1) CREW_TRY(crew_rank_capture_first_grads(r, grad));
    int finite = 1, nonfinite = 0;
    CREW_TRY(grads_finite(r, grad, st, &finite));
    if (local_verdict(r) && !finite) CREW_TRY(nonfinite_verdict(r, step, &st->skipped));
    if (local_verdict(r) && finite) CREW_TRY(update(r, grad, step));
    times.optimizer_s = crew_now() - t1 + r->update_s; /* deferred: the last step's update */
    r->update_s = 0.0;
    fill_row(r, st, &sums, &times, finite);
    CREW_TRY(crew_rank_phase_error(r, crew_rank_allreduce_host(r, r->metrics, (int64_t)r->size * CREW_METRIC_FIELDS),
                                   step, "metrics all-reduce"));
    read_rows(r, st, &nonfinite);
    if (!local_verdict(r) && nonfinite) CREW_TRY(nonfinite_verdict(r, step, &st->skipped));
    if (!local_verdict(r) && !nonfinite) {
        double t2 = crew_now();
        CREW_TRY(update(r, grad, step));
        r->update_s = crew_now() - t2;
    }
    if (CREW_HOOK(r, step_ends)) CREW_TRY(r->hooks->step_ends(r->hooks_user, &r->who, step));
    if (run->drift_every > 0 && step % run->drift_every == 0) CREW_TRY(crew_rank_check_drift(r, step));
    double step_s = crew_now() - t0;
    r->step_s += step_s;
    r->busy_s += times.forward_s + times.backward_s;
    CREW_TRY(report_step(r, st, step_s));
    if (r->stages > 1 && crew_rank_timeline_step(r, step)) CREW_TRY(crew_rank_send_timeline(r, step, step_s));
    return CREW_OK;
}
