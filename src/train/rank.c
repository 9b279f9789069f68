/* rank.c — the rank program's set-up and end (rank.h draws the whole program).
 *
 * A rank takes everything from the context its launcher gave it: the device (its stage's model,
 * the optimizer state, its scratch buffers all live there), the communicator handles, the loader
 * of its replica's micro-batches, and the run's shared description. It reads and writes tensors
 * only through the backend, so the same program runs on a GPU, and whether its peers are threads
 * or processes makes no difference to it. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "data/dataset.h"
#include "train/rank.h"

/* Message tags of the starting point, sent to the ranks of other processes (share_start). */
#define TAG_START(b) ((1 << 28) + (b))

int64_t crew_rank_scratch_size(int ranks, int tensors)
{
    /* the drift check's hash halves (each tensor's, capped, and the optimizer's two moment
     * buffers), one step's metrics rows, or the sharded norm's state (rank_units.c), whichever is
     * more */
    int64_t drift = (int64_t)ranks * ((tensors < CREW_DRIFT_TENSORS ? tensors : CREW_DRIFT_TENSORS) + 2) * 2;
    int64_t metrics = (int64_t)ranks * CREW_METRIC_FIELDS, most = drift > metrics ? drift : metrics;
    return most > CREW_SQ_STATE ? most : CREW_SQ_STATE;
}

crew_status crew_rank_allreduce_host(crew_rank *r, double *v, int64_t n)
{
    if (r->size == 1) return CREW_OK; /* one rank: the sum is the values */
    if (n > r->scratch_n)
        return crew_errorf(CREW_CODE_INTERNAL, "rank %d: %lld values exceed the %lld of its scratch", r->rank,
                           (long long)n, (long long)r->scratch_n);
    const crew_backend *be = r->be;
    CREW_TRY(be->ops->upload(be->ctx, NULL, r->dev_scratch, v, n, CREW_DT_F64));
    CREW_TRY(crew_allreduce(&r->world, r->dev_scratch, n, CREW_COMM_F64, CREW_REDUCE_SUM, r->run->timeout_s));
    return be->ops->download(be->ctx, v, r->dev_scratch, n, CREW_DT_F64);
}

/* ------------------------------------------------------------------ the starting point */

/* Without a pipeline: rank 0's parameters, state and optimizer state are every replica's start,
 * broadcast (the other processes of an MPI run have no checkpoint: only process 0 reads it). */
static crew_status broadcast_start(crew_rank *r)
{
    crew_model *m = r->m;
    const double timeout = r->run->timeout_s;
    const crew_backend *be = r->be;
    if (crew_rank_holds_params(r))
        CREW_TRY(crew_broadcast(&r->world, m->params, m->n_params, CREW_COMM_F32, 0, timeout));
    else /* ZeRO-3: each rank its shard of rank 0's */
        CREW_TRY(crew_rank_units_start(r));
    CREW_TRY(crew_broadcast(&r->world, m->state, m->n_state, CREW_COMM_F32, 0, timeout));
    for (int i = 0; i < 2 && !r->shard; i++)
        if (r->opt.slot[i]) CREW_TRY(crew_broadcast(&r->world, r->opt.slot[i], r->opt.n, CREW_COMM_F32, 0, timeout));
    double t = (double)r->opt.t; /* an update count is exact in a double */
    CREW_TRY(be->ops->upload(be->ctx, NULL, r->dev_scratch, &t, 1, CREW_DT_F64));
    CREW_TRY(crew_broadcast(&r->world, r->dev_scratch, 1, CREW_COMM_F64, 0, timeout));
    CREW_TRY(be->ops->download(be->ctx, &t, r->dev_scratch, 1, CREW_DT_F64));
    r->opt.t = (int64_t)t;
    /* sharded: each rank's part of a resumed run's state (a fresh run's is zeros already) */
    return r->shard && r->opt.t > 0 ? crew_rank_shard_scatter_start(r) : CREW_OK;
}

/* A pipeline: every rank took its stage's slice of the start at set-up; the ranks of the other
 * processes, whose caller's model is not the run's starting point, receive theirs from global
 * rank 0: a header ({optimizer state follows, its step}), then the values, through rank 0's
 * staging. */
static crew_status send_start_slices(crew_rank *r)
{
    const crew_run *run = r->run;
    const int per_process = r->size / (run->plan.processes > 1 ? run->plan.processes : 1);
    if (per_process == r->size || (r->rank != 0 && r->rank < per_process)) return CREW_OK;
    const double timeout = run->timeout_s;
    crew_model *m = r->m;
    if (r->rank != 0) {
        double head[2];
        CREW_TRY(crew_recv(&r->world, r->dev_scratch, 2, CREW_COMM_F64, 0, TAG_START(0), timeout));
        CREW_TRY(r->be->ops->download(r->be->ctx, head, r->dev_scratch, 2, CREW_DT_F64));
        if (m->n_params) CREW_TRY(crew_recv(&r->world, m->params, m->n_params, CREW_COMM_F32, 0, TAG_START(1), timeout));
        if (m->n_state) CREW_TRY(crew_recv(&r->world, m->state, m->n_state, CREW_COMM_F32, 0, TAG_START(2), timeout));
        for (int i = 0; i < 2 && head[0] != 0.0 && r->opt.n; i++)
            if (r->opt.slot[i])
                CREW_TRY(crew_recv(&r->world, r->opt.slot[i], r->opt.n, CREW_COMM_F32, 0, TAG_START(3 + i), timeout));
        r->opt.t = (int64_t)head[1];
        return CREW_OK;
    }
    const crew_model *start = run->start;
    const crew_optimizer *so = run->start_opt;
    const double head[2] = {so ? 1.0 : 0.0, so ? (double)so->t : 0.0};
    CREW_TRY(r->be->ops->upload(r->be->ctx, NULL, r->dev_scratch, head, 2, CREW_DT_F64));
    for (int g = per_process; g < r->size; g++) {
        const int st = g % r->stages;
        const int64_t pa = r->param_at[st], np = r->param_at[st + 1] - pa, sa = r->state_at[st],
                      ns = r->state_at[st + 1] - sa;
        CREW_TRY(crew_send(&r->world, r->dev_scratch, 2, CREW_COMM_F64, g, TAG_START(0), timeout));
        const float *from[4] = {start->params + pa, start->n_state ? start->state + sa : NULL,
                                so && so->slot[0] ? so->slot[0] + pa : NULL, so && so->slot[1] ? so->slot[1] + pa : NULL};
        const int64_t count[4] = {np, ns, np, np};
        for (int b = 0; b < 4; b++) {
            /* what the receiver expects: the values it has any of, the moments its optimizer keeps */
            if (!count[b] || !from[b]) continue;
            CREW_TRY(crew_dev_transfer_f32(r->be, r->staging, &start->be, from[b], count[b]));
            CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
            CREW_TRY(crew_send(&r->world, r->staging, count[b], CREW_COMM_F32, g, TAG_START(1 + b), timeout));
        }
    }
    return CREW_OK;
}

static crew_status share_start(crew_rank *r) { return r->stages > 1 ? send_start_slices(r) : broadcast_start(r); }

/* The stage's slice of a resumed run's optimizer state (every rank of the process that read the
 * checkpoint; sharded, the owners get theirs from rank 0 in broadcast_start). */
static crew_status copy_start_optimizer(crew_rank *r)
{
    const crew_run *run = r->run;
    if (!run->start_opt) return CREW_OK;
    r->opt.t = run->start_opt->t;
    if (r->shard) return CREW_OK;
    int64_t at = r->param_at[r->stage], n = r->opt.n;
    for (int i = 0; i < 2; i++)
        if (r->opt.slot[i] && run->start_opt->slot[i])
            CREW_TRY(crew_dev_transfer_f32(r->be, r->opt.slot[i], &run->start->be, run->start_opt->slot[i] + at, n));
    return CREW_OK;
}

/* ------------------------------------------------------------------ set-up */

/* Where each stage's layers begin (whole model: one stage of every layer), and where its values lie
 * in the whole model's buffers. */
static crew_status stage_bounds(crew_rank *r, int *first)
{
    const crew_model *start = r->run->start;
    const crew_fit_plan *p = &r->run->plan;
    r->param_at = calloc((size_t)r->stages + 1, sizeof *r->param_at);
    r->state_at = calloc((size_t)r->stages + 1, sizeof *r->state_at);
    if (!r->param_at || !r->state_at) return CREW_OOM();
    for (int s = 0; s <= r->stages; s++) first[s] = r->stages > 1 ? p->stage_first[s] : s == 0 ? 0 : start->n_layers;
    for (int s = 0; s < r->stages; s++) crew_model_stage_offsets(start, first[s], &r->param_at[s], &r->state_at[s]);
    r->param_at[r->stages] = start->n_params;
    r->state_at[r->stages] = start->n_state;
    return CREW_OK;
}

/* The stage's model and the activation sets of the micro-batches it keeps in flight. */
static crew_status build_models(crew_rank *r, const int *first)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    const int k = p->accumulation;
    /* without a pipeline, the passes of one replica accumulating: F0 B0 F1 B1 ... */
    const crew_pipeline_schedule schedule =
        r->stages > 1 ? (crew_pipeline_schedule)p->pipeline_schedule : CREW_PIPELINE_1F1B;
    r->ops = calloc((size_t)2 * (size_t)k, sizeof *r->ops);
    r->n_slots = crew_pipeline_slots(schedule, r->stages, r->stage, k);
    r->slot = calloc((size_t)r->n_slots, sizeof *r->slot);
    if (!r->ops || !r->slot) return CREW_OOM();
    crew_pipeline_ops(schedule, r->stages, r->stage, k, r->ops);
    if (p->shard >= CREW_SHARD_PARAMETERS) /* ZeRO-3: the parameters live in shards and gathered units */
        CREW_TRY(crew_model_stage_unbuffered(run->start, first[r->stage], first[r->stage + 1], r->be, &r->slot[0]));
    else
        CREW_TRY(crew_model_stage(run->start, first[r->stage], first[r->stage + 1], r->be, &r->slot[0]));
    r->m = r->slot[0];
    r->m->grads_elsewhere = p->shard >= CREW_SHARD_GRADIENTS; /* ZeRO-2/3: in the units' buffers */
    crew_model_set_conv_ways(r->m, run->start, p->conv_choice); /* before the views, which copy them */
    crew_act_storage store = crew_act_storage_for(p->precision, p->attention_recompute, p->device_kind);
    crew_model_set_storage(r->m, &store);
    r->rows = p->batch_per_device;
    CREW_TRY(crew_model_reserve(r->m, r->rows));
    for (int i = 1; i < r->n_slots; i++) CREW_TRY(crew_model_view(r->m, r->rows, &r->slot[i]));
    r->in_values = crew_shape_size(&r->m->input);
    crew_shape out = crew_model_output_shape(r->m);
    r->out_values = crew_shape_size(&out);
    return CREW_OK;
}

/* The test seams' view of the rank (hooks.h). */
static crew_status begin_hooks(crew_rank *r)
{
    r->hooks = r->run->hooks.rank;
    r->hooks_user = r->run->hooks.rank_user;
    r->who = (crew_hook_rank){.rank = r->rank, .size = r->size, .replica = r->replica, .replicas = r->replicas,
                              .stage = r->stage, .stages = r->stages, .sink = r->sinks != NULL, .be = r->be, .m = r->m,
                              .accumulation = r->run->plan.accumulation,
                              .steps_per_epoch = r->run->plan.steps_per_epoch, .timeout_s = r->run->timeout_s};
    crew_stepper_hooks(&r->stepper, r->hooks, r->hooks_user, &r->who);
    return CREW_HOOK(r, rank_begins) ? r->hooks->rank_begins(r->hooks_user, &r->who) : CREW_OK;
}

/* A layer-wise optimizer (LAMB, LARS) learns where the rank's model's tensors lie (its stage's). */
static crew_status tell_tensors(crew_rank *r)
{
    const int n = crew_model_tensor_bounds(r->m, NULL);
    int64_t *bounds = malloc(((size_t)n + 1) * sizeof *bounds);
    if (!bounds) return CREW_OOM();
    crew_model_tensor_bounds(r->m, bounds);
    crew_status s = crew_optimizer_set_tensors(&r->opt, bounds, n);
    free(bounds);
    return s;
}

/* Everything the rank owns, on its device and in host memory. */
static crew_status set_up(crew_rank *r)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    int first[CREW_MAX_PIPELINE_STAGES + 1];
    CREW_TRY(stage_bounds(r, first));
    CREW_TRY(build_models(r, first));
    if (p->shard_optimizer && r->replicas > 1) CREW_TRY(crew_rank_shard_init(r));
    if (p->shard >= CREW_SHARD_GRADIENTS && r->replicas > 1) CREW_TRY(crew_rank_units_init(r));
    int64_t own = r->shard ? r->shard[r->replica + 1] - r->shard_lo : r->m->n_params;
    CREW_TRY(crew_optimizer_init(&r->opt, &r->m->compile.optimizer, r->be, own));
    if (crew_optimizer_layerwise(&r->opt.spec)) CREW_TRY(tell_tensors(r));
    CREW_TRY(copy_start_optimizer(r));
    r->scratch_n = crew_rank_scratch_size(r->size, crew_model_named_params(run->start, NULL, 0));
    CREW_TRY(r->be->ops->alloc(r->be->ctx, CREW_DT_F64, r->scratch_n, (void **)&r->dev_scratch));
    CREW_TRY(r->be->ops->queue_create(r->be->ctx, &r->copy_q));
    if (r->stages == 1 && crew_comm_needs_staging(r->be)) { /* copies that can overlap compute: a second input */
        crew_model_buffer_sizes n;
        crew_model_buffers(r->m, r->rows, &n);
        CREW_TRY(crew_dev_alloc_f32(r->be, n.act_input, &r->input_alt));
        r->input_own = r->m->act[0];
    } else if (r->stages == 1 && crew_run_inputs_in_place(run, r->be)) { /* no copy at all */
        if (!(r->held = calloc((size_t)p->accumulation, sizeof *r->held))) return CREW_OOM();
        r->in_place = 1;
        r->input_own = r->m->act[0];
    }
    r->metrics = calloc((size_t)r->size * CREW_METRIC_FIELDS, sizeof *r->metrics);
    r->times = calloc((size_t)r->size, sizeof *r->times);
    if (!r->metrics || !r->times) return CREW_OOM();
    CREW_TRY(crew_rank_whole_init(r));
    if (r->stages > 1) CREW_TRY(crew_rank_timeline_init(r));
    CREW_TRY(crew_error_prefix(share_start(r), "step %lld, the starting point: ", (long long)run->start_step));
    if (r->replicas > 1) {
        CREW_TRY(crew_comm_worker_start(&r->worker, r->group, run->timeout_s));
        r->has_worker = 1;
    }
    if (r->units) { /* the units reduce; the stepper only says whether batch norm is synchronised */
        r->stepper.sync_bn = run->sync_bn && r->replicas > 1;
        return begin_hooks(r);
    }
    CREW_TRY(crew_stepper_init(&r->stepper, r->m, r->has_worker ? &r->worker : NULL, r->replica, r->replicas, r->rows,
                               p->accumulation, run->bucket_mb, run->sync_bn));
    if (r->shard) CREW_TRY(crew_stepper_shard(&r->stepper, r->shard));
    return begin_hooks(r);
}

static void tear_down(crew_rank *r)
{
    if (CREW_HOOK(r, rank_ends)) r->hooks->rank_ends(r->hooks_user, &r->who);
    crew_comm_worker_stop(&r->worker);
    crew_stepper_release(&r->stepper);
    if (r->copy_q) r->be->ops->queue_destroy(r->be->ctx, r->copy_q);
    crew_dev_free(r->be, r->input_alt);
    free(r->held);
    crew_dev_free(r->be, r->dev_scratch);
    crew_optimizer_release(&r->opt, r->be);
    crew_rank_units_release(r);
    crew_rank_shard_release(r);
    crew_rank_whole_release(r);
    crew_rank_timeline_release(r);
    for (int i = r->n_slots - 1; r->slot && i >= 0; i--) crew_model_free(r->slot[i]); /* views before their owner */
    free(r->slot);
    free(r->ops);
    free(r->param_at);
    free(r->state_at);
    free(r->metrics);
    free(r->times);
}

crew_status crew_rank_main(const crew_rank_ctx *ctx)
{
    const crew_fit_plan *p = &ctx->run->plan;
    const int stages = p->stages > 1 ? p->stages : 1, processes = p->processes > 1 ? p->processes : 1;
    crew_rank r = {.rank = ctx->rank, .size = ctx->size, .stage = ctx->stage, .stages = stages,
                   .replica = ctx->replica, .replicas = p->devices, .run = ctx->run, .sinks = ctx->sinks,
                   .own_model = ctx->own_model,
                   .be = &ctx->device, .world = ctx->comm, .group = stages > 1 ? ctx->stage_comm : ctx->comm,
                   .loader = ctx->loader, .gathered_step = -1};
    r.local_lead = ctx->rank % (ctx->size / processes) == 0;
    crew_status s = set_up(&r);
    if (s && stages > 1) s = crew_error_prefix(s, "stage %d of replica %d: ", r.stage, r.replica);
    if (!s) s = crew_rank_train(&r);
    tear_down(&r);
    return s;
}
