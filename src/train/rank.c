/* rank.c — the rank program: one rank owns one device and trains its share of every step.
 *
 * It takes everything from the context its launcher gave it: the device (its replica of the
 * model, its optimizer state, its scratch buffers all live there), the communicator handle, the
 * loader of its own micro-batches, and the run's shared description.
 * It reads and writes tensors only through the backend, so the same program runs on a GPU, and
 * whether its peers are threads or processes makes no difference to it. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "data/dataset.h"
#include "train/rank.h"

int64_t crew_rank_scratch_size(int ranks, int tensors)
{
    /* the drift check's hash halves, or one step's metrics rows, whichever is more */
    /* (+2: the optimizer's two moment buffers) */
    int64_t drift = (int64_t)ranks * ((tensors < CREW_DRIFT_TENSORS ? tensors : CREW_DRIFT_TENSORS) + 2) * 2;
    int64_t metrics = (int64_t)ranks * CREW_METRIC_FIELDS;
    return drift > metrics ? drift : metrics;
}

crew_status crew_rank_allreduce_host(crew_rank *r, double *v, int64_t n)
{
    if (!r->has_worker) return CREW_OK; /* one rank: the sum is the values */
    if (n > r->scratch_n)
        return crew_errorf(CREW_CODE_INTERNAL, "rank %d: %lld values exceed the %lld of its scratch", r->rank,
                           (long long)n, (long long)r->scratch_n);
    const crew_backend *be = r->be;
    CREW_TRY(be->ops->upload(be->ctx, NULL, r->dev_scratch, v, n, CREW_DT_F64));
    CREW_TRY(crew_allreduce(&r->comm, r->dev_scratch, n, CREW_COMM_F64, CREW_REDUCE_SUM, r->run->timeout_s));
    return be->ops->download(be->ctx, v, r->dev_scratch, n, CREW_DT_F64);
}

/* Rank 0's parameters, state and optimizer state are the run's starting point. */
static crew_status broadcast_start(crew_rank *r)
{
    crew_model *m = r->m;
    const double timeout = r->run->timeout_s;
    const crew_backend *be = r->be;
    CREW_TRY(crew_broadcast(&r->comm, m->params, m->n_params, CREW_COMM_F32, 0, timeout));
    CREW_TRY(crew_broadcast(&r->comm, m->state, m->n_state, CREW_COMM_F32, 0, timeout));
    for (int i = 0; i < 2 && !r->shard; i++)
        if (r->opt.slot[i]) CREW_TRY(crew_broadcast(&r->comm, r->opt.slot[i], r->opt.n, CREW_COMM_F32, 0, timeout));
    double t = (double)r->opt.t; /* an update count is exact in a double */
    CREW_TRY(be->ops->upload(be->ctx, NULL, r->dev_scratch, &t, 1, CREW_DT_F64));
    CREW_TRY(crew_broadcast(&r->comm, r->dev_scratch, 1, CREW_COMM_F64, 0, timeout));
    CREW_TRY(be->ops->download(be->ctx, &t, r->dev_scratch, 1, CREW_DT_F64));
    r->opt.t = (int64_t)t;
    /* sharded: each rank's part of a resumed run's state (a fresh run's is zeros already) */
    return r->shard && r->opt.t > 0 ? crew_rank_shard_scatter_start(r) : CREW_OK;
}

/* Everything the rank owns, on its device and in host memory. */
static crew_status set_up(crew_rank *r)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    CREW_TRY(crew_model_clone(run->start, r->be, &r->m));
    crew_model_set_conv_ways(r->m, run->start, p->conv_choice);
    crew_act_storage store = crew_act_storage_for(p->precision, p->attention_recompute);
    crew_model_set_storage(r->m, &store);
    CREW_TRY(crew_model_reserve(r->m, p->batch_per_device));
    if (p->shard_optimizer && r->size > 1) CREW_TRY(crew_rank_shard_init(r));
    int64_t own = r->shard ? r->shard[r->rank + 1] - r->shard_lo : r->m->n_params;
    CREW_TRY(crew_optimizer_init(&r->opt, &r->m->compile.optimizer, r->be, own));
    if (r->rank == 0 && run->start_opt && !r->shard)
        CREW_TRY(crew_optimizer_copy(&r->opt, r->be, run->start_opt, &run->start->be));
    if (r->rank == 0 && run->start_opt) r->opt.t = run->start_opt->t;
    r->scratch_n = crew_rank_scratch_size(r->size, crew_model_named_params(r->m, NULL, 0));
    CREW_TRY(r->be->ops->alloc(r->be->ctx, CREW_DT_F64, r->scratch_n, (void **)&r->dev_scratch));
    CREW_TRY(r->be->ops->queue_create(r->be->ctx, &r->copy_q));
    if (crew_comm_needs_staging(r->be)) { /* copies that can overlap compute: a second input buffer */
        crew_model_buffer_sizes n;
        crew_model_buffers(r->m, p->batch_per_device, &n);
        CREW_TRY(crew_dev_alloc_f32(r->be, n.act_input, &r->input_alt));
        r->input_own = r->m->act[0];
    }
    r->metrics = calloc((size_t)r->size * CREW_METRIC_FIELDS, sizeof *r->metrics);
    r->times = calloc((size_t)r->size, sizeof *r->times);
    if (!r->metrics || !r->times) return CREW_OOM();
    CREW_TRY(crew_error_prefix(broadcast_start(r), "step %lld, broadcast of the starting point: ",
                               (long long)run->start_step));
    if (r->size > 1) {
        CREW_TRY(crew_comm_worker_start(&r->worker, r->comm, run->timeout_s));
        r->has_worker = 1;
    }
    CREW_TRY(crew_stepper_init(&r->stepper, r->m, r->has_worker ? &r->worker : NULL, r->rank, r->size,
                               p->batch_per_device, p->accumulation, run->bucket_mb, run->sync_bn));
    if (run->hooks.faults.slow_rank == r->rank) r->stepper.delay_s = run->hooks.faults.slow_s;
    r->stepper.plant = run->hooks.plant;
    if (r->shard) CREW_TRY(crew_stepper_shard(&r->stepper, r->shard));
    if (run->hooks.plant == CREW_PLANT_DROPOUT_BY_ROW) {
        r->plant_rows_n = p->batch_per_device;
        if (!(r->plant_rows = malloc((size_t)p->batch_per_device * sizeof *r->plant_rows))) return CREW_OOM();
    }
    return CREW_OK;
}

/* The optimizer's moments, m then v, into host [2 × n_params]; zeros where it keeps fewer. */
static crew_status download_moments(const crew_rank *r, const crew_optimizer *opt, const crew_backend *be, float *host)
{
    int64_t n = r->m->n_params;
    for (int i = 0; i < 2; i++) {
        if (opt->slot[i])
            CREW_TRY(crew_dev_download_f32(be, host + (size_t)i * (size_t)n, opt->slot[i], n));
        else
            memset(host + (size_t)i * (size_t)n, 0, (size_t)n * sizeof *host);
    }
    return CREW_OK;
}

static void tear_down(crew_rank *r)
{
    crew_comm_worker_stop(&r->worker);
    crew_stepper_release(&r->stepper);
    if (r->copy_q) r->be->ops->queue_destroy(r->be->ctx, r->copy_q);
    crew_dev_free(r->be, r->input_alt);
    crew_dev_free(r->be, r->dev_scratch);
    for (int i = 0; i < 2; i++) crew_dev_free(r->be, r->plant_prev[i]);
    free(r->plant_rows);
    crew_optimizer_release(&r->opt, r->be);
    crew_rank_shard_release(r);
    crew_model_free(r->m);
    free(r->metrics);
    free(r->times);
}

crew_status crew_rank_main(const crew_rank_ctx *ctx)
{
    crew_rank r = {.rank = ctx->rank, .size = ctx->size, .run = ctx->run, .sinks = ctx->sinks, .be = &ctx->device,
                   .comm = ctx->comm, .loader = ctx->loader};
    crew_status s = set_up(&r);
    if (!s) s = crew_rank_train(&r);
    if (!s && r.shard && r.run->hooks.final_moments) s = crew_rank_shard_gather(&r); /* every rank joins */
    /* The caller's model gets the trained values, a cancelled run's included. */
    if (!s && r.sinks) {
        crew_rank_sink_enter(&r);
        int64_t in_use = 0, peak = 0; /* rank 0's device, as each replica's: what the planner counts */
        if (r.be->ops->memory_used) r.be->ops->memory_used(r.be->ctx, &in_use, &peak);
        r.sinks->result->stage_peak_bytes[0] = peak;
        s = crew_model_copy_values(r.sinks->model, r.m);
        if (!s && r.run->hooks.final_moments)
            s = download_moments(&r, r.shard ? &r.whole_opt : &r.opt, r.shard ? &r.sinks->model->be : r.be,
                                 r.run->hooks.final_moments);
        crew_rank_sink_leave(&r);
    }
    tear_down(&r);
    return s;
}
