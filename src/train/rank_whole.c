/* rank_whole.c — the whole model on global rank 0: what a checkpoint writes, a pipeline's
 * evaluation reads and the caller's model receives at the end.
 *
 * Without a pipeline and without sharding, rank 0's replica holds all of it on its device. A
 * sharded optimizer's state exists whole nowhere on a device: every owner broadcasts its shard to
 * rank 0, which keeps it in host memory (rank_shard.c), and the values go into the caller's model.
 * A pipeline's stages of replica 0 send their slices, which are contiguous in the whole model's
 * buffers (model_stage.c), through a staging buffer on rank 0's device the size of the largest
 * slice, so no device ever holds more than its stage. Either way the checkpoints and weights are
 * an unsharded data-parallel run's, and a run resumes on any layout. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"
#include "train/checkpoint.h"
#include "train/rank.h"

/* Message tags of the gathered buffers: parameters, state, the optimizer's two moments, of each
 * stage (and the first step's gradients, as parameters). */
#define TAG_GATHER(s, b) ((1 << 30) + 4 * (s) + (b))

/* Whether rank 0's replica alone holds the whole model. */
static int replica_is_whole(const crew_rank *r) { return r->stages == 1 && !r->shard; }

crew_status crew_rank_whole_init(crew_rank *r)
{
    if (!r->sinks || replica_is_whole(r)) return CREW_OK;
    crew_model *w = r->sinks->model;
    CREW_TRY(crew_optimizer_init(&r->whole_opt, &r->m->compile.optimizer, &w->be, w->n_params));
    r->has_whole_opt = 1;
    if (r->stages == 1) return CREW_OK; /* the shards pass through the gradient buffer (rank_shard.c) */
    for (int s = 0; s < r->stages; s++) {
        int64_t np = r->param_at[s + 1] - r->param_at[s], ns = r->state_at[s + 1] - r->state_at[s];
        if (np > r->staging_n) r->staging_n = np;
        if (ns > r->staging_n) r->staging_n = ns;
    }
    return crew_dev_alloc_f32(r->be, r->staging_n, &r->staging);
}

void crew_rank_whole_release(crew_rank *r)
{
    if (r->has_whole_opt) crew_optimizer_release(&r->whole_opt, &r->sinks->model->be);
    crew_dev_free(r->be, r->staging);
}

/* ------------------------------------------------------------------ a pipeline's stages */

/* One slice (n values, at `at` in the whole model's buffer `into`, host memory of the caller's
 * model's device) from stage s of replica 0: its own buffer on rank 0, else received through
 * staging. */
static crew_status take_slice(crew_rank *r, int s, int b, const float *own, float *into, int64_t at, int64_t n)
{
    const crew_backend *host = &r->sinks->model->be;
    if (n == 0) return CREW_OK;
    if (s == 0) return crew_dev_transfer_f32(host, into + at, r->be, own, n);
    CREW_TRY(crew_recv(&r->world, r->staging, n, CREW_COMM_F32, s, TAG_GATHER(s, b), r->run->timeout_s));
    return crew_dev_transfer_f32(host, into + at, r->be, r->staging, n);
}

/* The device's compute must be done before a send reads its output from the host. */
static crew_status send_after(crew_rank *r, const float *buf, int64_t n, int tag)
{
    CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
    return crew_send(&r->world, buf, n, CREW_COMM_F32, 0, tag, r->run->timeout_s);
}

/* Replica 0's stages send their values (and optimizer state) to global rank 0, which puts them in
 * place in the caller's model and the host optimizer state; every replica holds the same values,
 * so one copy is enough. */
static crew_status gather_stages(crew_rank *r, int with_opt)
{
    if (r->replica != 0) return CREW_OK;
    crew_model *m = r->m;
    if (r->rank != 0) {
        CREW_TRY(send_after(r, m->params, m->n_params, TAG_GATHER(r->stage, 0)));
        if (m->n_state) CREW_TRY(send_after(r, m->state, m->n_state, TAG_GATHER(r->stage, 1)));
        for (int i = 0; i < 2 && with_opt && m->n_params; i++)
            if (r->opt.slot[i]) CREW_TRY(send_after(r, r->opt.slot[i], r->opt.n, TAG_GATHER(r->stage, 2 + i)));
        return CREW_OK;
    }
    CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
    crew_rank_sink_enter(r); /* the caller's model */
    crew_model *w = r->sinks->model;
    crew_status st = CREW_OK;
    for (int s = 0; s < r->stages && !st; s++) {
        int64_t pa = r->param_at[s], np = r->param_at[s + 1] - pa, sa = r->state_at[s], ns = r->state_at[s + 1] - sa;
        st = take_slice(r, s, 0, m->params, w->params, pa, np);
        if (!st) st = take_slice(r, s, 1, m->state, w->state, sa, ns);
        for (int i = 0; i < 2 && with_opt && !st; i++)
            if (r->whole_opt.slot[i]) st = take_slice(r, s, 2 + i, r->opt.slot[i], r->whole_opt.slot[i], pa, np);
    }
    r->whole_opt.t = r->opt.t;
    w->initialized = 1;
    crew_rank_sink_leave(r);
    return st;
}

/* A sharded optimizer: every shard's state into rank 0's host copy, the values (every replica
 * holds them all) into the caller's model. */
static crew_status gather_shards(crew_rank *r, int with_opt)
{
    if (with_opt) CREW_TRY(crew_rank_shard_gather(r));
    crew_model *w = r->sinks ? r->sinks->model : NULL;
    crew_status s = CREW_OK;
    if (!crew_rank_holds_params(r)) { /* ZeRO-3: the parameters from their owners, the state from rank 0 */
        crew_rank_sink_enter(r);
        s = crew_rank_units_gather_params(r, w ? w->params : NULL);
        if (!s && w) s = crew_dev_transfer_f32(&w->be, w->state, r->be, r->m->state, r->m->n_state);
        if (w) w->initialized = 1;
        crew_rank_sink_leave(r);
        return s;
    }
    if (!w) return CREW_OK;
    crew_rank_sink_enter(r);
    s = crew_model_copy_values(w, r->m);
    crew_rank_sink_leave(r);
    return s;
}

crew_status crew_rank_whole(crew_rank *r, int64_t step, int with_opt, crew_model **m, const crew_optimizer **opt)
{
    *m = NULL;
    *opt = NULL;
    if (replica_is_whole(r)) {
        if (r->sinks) *m = r->m, *opt = &r->opt;
        return CREW_OK;
    }
    /* Nothing changed since the last gather (the last step's checkpoint, then the epoch's evaluation,
     * then the end of the run): every rank knows the step, so all skip together. */
    with_opt = with_opt != 0;
    if (step != r->gathered_step || with_opt > r->gathered_opt) {
        CREW_TRY(r->stages > 1 ? gather_stages(r, with_opt) : gather_shards(r, with_opt));
        r->gathered_opt = with_opt;
        r->gathered_step = step;
    }
    if (r->sinks) *m = r->sinks->model, *opt = with_opt ? &r->whole_opt : NULL;
    return CREW_OK;
}

/* ------------------------------------------------------------------ what rank 0 writes */

crew_status crew_rank_write_checkpoint(crew_rank *r, int64_t step)
{
    const crew_run *run = r->run;
    crew_model *m;
    const crew_optimizer *opt;
    CREW_TRY(crew_rank_phase_error(r, crew_rank_whole(r, step, 1, &m, &opt), step,
                                   "the whole model gathered for a checkpoint"));
    crew_run_sinks *out = r->sinks;
    if (!out) return CREW_OK;
    crew_checkpoint_state st = {.step = step, .plan = run->plan, .lr = run->lr};
    crew_rank_sink_enter(r);
    crew_status s = crew_checkpoint_write(run->opts->checkpoint_dir, m, opt, &st, run->opts->keep_checkpoints,
                                          out->result->last_checkpoint, sizeof out->result->last_checkpoint);
    out->last_checkpoint_time = crew_now();
    crew_rank_sink_leave(r);
    return s;
}

crew_status crew_rank_capture_first_grads(crew_rank *r, float *grad)
{
    float *host = r->run->hooks.first_grads;
    if (r->units) { /* the shards straight into rank 0's host memory, every rank joining */
        crew_rank_sink_enter(r);
        crew_status s = crew_rank_units_grads_to_host(r, host);
        crew_rank_sink_leave(r);
        return s;
    }
    if (r->shard) CREW_TRY(crew_rank_shard_gather_grad(r, grad)); /* every rank joins */
    if (r->replica != 0) return CREW_OK;
    const int64_t n = r->m->n_params;
    if (r->rank != 0) return n ? send_after(r, grad, n, TAG_GATHER(r->stage, 0)) : CREW_OK;
    crew_rank_sink_enter(r); /* the caller's memory */
    crew_status st = n ? crew_dev_download_f32(r->be, host, grad, n) : CREW_OK;
    for (int s = 1; s < r->stages && !st; s++) { /* a pipeline's other stages, in place */
        int64_t at = r->param_at[s], ns = r->param_at[s + 1] - at;
        if (!ns) continue;
        st = crew_recv(&r->world, r->staging, ns, CREW_COMM_F32, s, TAG_GATHER(s, 0), r->run->timeout_s);
        if (!st) st = crew_dev_download_f32(r->be, host + at, r->staging, ns);
    }
    crew_rank_sink_leave(r);
    return st;
}

/* The optimizer's moments, m then v, into host [2 × n]; zeros where it keeps fewer. */
static crew_status download_moments(const crew_optimizer *opt, const crew_backend *be, int64_t n, float *host)
{
    for (int i = 0; i < 2; i++) {
        if (opt->slot[i])
            CREW_TRY(crew_dev_download_f32(be, host + (size_t)i * (size_t)n, opt->slot[i], n));
        else
            memset(host + (size_t)i * (size_t)n, 0, (size_t)n * sizeof *host);
    }
    return CREW_OK;
}

crew_status crew_rank_finish(crew_rank *r, int64_t step)
{
    float *moments = r->run->hooks.final_moments;
    CREW_TRY(crew_rank_report_end(r, step - r->run->start_step));
    if (r->run->hooks.compare_replicas) CREW_TRY(crew_rank_compare_replicas(r, step));
    crew_model *m;
    const crew_optimizer *opt;
    CREW_TRY(crew_rank_whole(r, step, moments != NULL, &m, &opt));
    /* another process's caller gets them too: from its replica where that holds them all, else
     * (ZeRO-3) from every shard, every rank joining */
    if (!crew_rank_holds_params(r) && r->run->plan.processes > 1) CREW_TRY(crew_rank_units_to_own_model(r));
    if (!r->sinks)
        return r->own_model && r->stages == 1 && crew_rank_holds_params(r) ? crew_model_copy_values(r->own_model, r->m)
                                                                              : CREW_OK;
    crew_rank_sink_enter(r);
    crew_model *caller = r->sinks->model;
    r->sinks->result->steps = step;
    /* The caller's model gets the trained values, a cancelled run's included. */
    crew_status s = m == caller ? CREW_OK : crew_model_copy_values(caller, m);
    if (!s && moments) s = download_moments(opt, m == caller ? &caller->be : r->be, caller->n_params, moments);
    crew_rank_sink_leave(r);
    return s;
}
