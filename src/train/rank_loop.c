/* rank_loop.c — a rank's training loop: epochs of steps (rank_step.c), the checkpoints rank 0
 * says are due, the evaluation at each epoch's end, rank 0's events and reports, and the end of
 * the run (rank_whole.c). */
#include <math.h>
#include <stdio.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "train/rank.h"

crew_status crew_rank_event(crew_rank *r, crew_event_kind kind, int64_t step, int rank, const char *msg)
{
    if (!r->sinks || !r->sinks->monitor) return CREW_OK;
    crew_rank_sink_enter(r);
    crew_status s = crew_monitor_event(r->sinks->monitor, kind, step, rank, NAN, "%s", msg);
    crew_rank_sink_leave(r);
    return s;
}

crew_status crew_rank_phase_error(crew_rank *r, crew_status s, int64_t step, const char *phase)
{
    if (!s) return s;
    if (r->stages > 1)
        s = crew_error_prefix(s, "step %lld, stage %d of replica %d, %s: ", (long long)step, r->stage, r->replica, phase);
    else
        s = crew_error_prefix(s, "step %lld, %s: ", (long long)step, phase);
    if (crew_status_code(s) == CREW_CODE_TIMEOUT) crew_status_free(crew_rank_event(r, CREW_EVENT_HANG, step, -1,
                                                                                   crew_status_message(s)));
    return s;
}

/* ZeRO-3: each forward pass gathers every unit from every rank, so every rank runs as many passes
 * as the one with the most samples; a rank with fewer runs the rest on one sample, uncounted. */
static crew_status even_passes(crew_rank *r, const crew_dataset *d, int64_t n, int64_t own)
{
    const int64_t most = (n + r->size - 1) / r->size, b = r->rows;
    const int64_t extra = (most + b - 1) / b - (own + b - 1) / b;
    double unused[2];
    for (int64_t i = 0; i < extra; i++) CREW_TRY(crew_eval_range(r->m, d, 0, 1, b, &unused[0], &unused[1]));
    return CREW_OK;
}

/* The test set's loss and accuracy after `step`. Without a pipeline every replica evaluates its
 * share (ZeRO-3's gathering each unit as training does) and the sums are all-reduced; a pipeline's
 * stages hold parts of the model, so rank 0
 * evaluates the whole model, gathered into the caller's, on the host, while the others wait at
 * the next collective. */
static crew_status evaluate(crew_rank *r, const crew_dataset *d, int64_t step, crew_epoch_info *info)
{
    int64_t n = crew_dataset_size(d);
    double sums[2] = {0.0, 0.0};
    crew_model *m = r->m;
    if (r->stages == 1) {
        int64_t lo = n * r->rank / r->size, hi = n * (r->rank + 1) / r->size;
        /* Evaluation reuses the training batch size: the activations are already sized for it. */
        CREW_TRY(crew_eval_range(m, d, lo, hi, r->rows, &sums[0], &sums[1]));
        if (!crew_rank_holds_params(r)) CREW_TRY(even_passes(r, d, n, hi - lo));
        CREW_TRY(crew_rank_phase_error(r, crew_rank_allreduce_host(r, sums, 2), step, "evaluation"));
    } else {
        const crew_optimizer *opt;
        CREW_TRY(crew_rank_phase_error(r, crew_rank_whole(r, step, 0, &m, &opt), step,
                                       "the whole model gathered for the evaluation"));
        if (!r->sinks) return CREW_OK;
        crew_rank_sink_enter(r); /* the caller's model */
        crew_status s = crew_eval_range(m, d, 0, n, r->rows, &sums[0], &sums[1]);
        crew_rank_sink_leave(r);
        CREW_TRY(s);
    }
    info->test_loss = (float)(sums[0] / (double)n);
    info->test_accuracy = (float)(sums[1] / (double)n);
    info->test_bits = crew_model_positions(m) > 1 ? (float)(info->test_loss / log(2.0)) : NAN;
    return CREW_OK;
}

static crew_status finish_epoch(crew_rank *r, crew_epoch_info *info, int64_t step)
{
    const crew_fit_options *o = r->run->opts;
    if (o->test) CREW_TRY(evaluate(r, o->test, step, info));
    if (!r->sinks) return CREW_OK;
    crew_rank_sink_enter(r);
    crew_status s = crew_run_sinks_epoch(r->sinks, o, info);
    crew_rank_sink_leave(r);
    return s;
}

/* A stop asked for at the epoch's end (a callback of on_epoch: Keras's EarlyStopping; a Ctrl-C
 * during the evaluation) takes effect before the next epoch's first step, not after it: the ranks
 * agree on it by one small all-reduce an epoch, and rank 0 says whether the stop checkpoint is due,
 * as after a step (none when the epoch's last step wrote one). */
static crew_status stop_at_epoch_end(crew_rank *r, int64_t step, int written, int *stopped)
{
    double v[2] = {crew_rank_cancel_requested(r) ? 1.0 : 0.0,
                   !written && crew_run_checkpoint_due(r->run, r->sinks, step, 1) ? 1.0 : 0.0};
    CREW_TRY(crew_rank_phase_error(r, crew_rank_allreduce_host(r, v, 2), step, "the stop at the epoch's end"));
    if (v[0] <= 0.0) return CREW_OK;
    *stopped = 1;
    return v[1] > 0.0 ? crew_rank_write_checkpoint(r, step) : CREW_OK;
}

static crew_status run_epoch(crew_rank *r, int epoch, int64_t *step, int *stopped)
{
    const crew_fit_plan *p = &r->run->plan;
    /* A resumed run enters its first epoch where the checkpoint left it. */
    const int64_t from = *step - (int64_t)epoch * p->steps_per_epoch;
    CREW_TRY(crew_loader_start_epoch(r->loader, epoch, from));
    double start = crew_now(), loss = 0.0, correct = 0.0;
    int64_t steps = 0;
    int written = 0; /* the last step wrote a checkpoint */
    for (int64_t es = from; es < p->steps_per_epoch && *step < p->total_steps && !*stopped; es++) {
        crew_rank_step st = {.epoch = epoch, .epoch_step = es, .step = *step + 1, .epoch_start = start};
        CREW_TRY(crew_rank_train_step(r, &st));
        ++*step;
        loss += st.loss;
        correct += st.correct;
        steps++;
        if (r->sinks) {
            crew_rank_sink_enter(r);
            r->sinks->result->skipped_updates += st.skipped;
            crew_rank_sink_leave(r);
        }
        *stopped = st.stop;
        written = st.checkpoint;
        if (st.checkpoint) CREW_TRY(crew_rank_write_checkpoint(r, *step));
    }
    crew_epoch_info info = crew_run_epoch_info(r->run, epoch, steps, crew_now() - start, loss, correct);
    if (r->sinks) {
        crew_rank_sink_enter(r);
        r->sinks->train_s += info.wall_s;
        crew_rank_sink_leave(r);
    }
    CREW_TRY(finish_epoch(r, &info, *step));
    return *stopped || *step >= p->total_steps ? CREW_OK : stop_at_epoch_end(r, *step, written, stopped);
}

crew_status crew_rank_train(crew_rank *r)
{
    const crew_fit_plan *p = &r->run->plan;
    int64_t step = r->run->start_step;
    int stopped = 0;
    for (int epoch = (int)(step / p->steps_per_epoch); epoch < p->epochs && step < p->total_steps && !stopped; epoch++)
        CREW_TRY(run_epoch(r, epoch, &step, &stopped));
    return crew_rank_finish(r, step);
}
