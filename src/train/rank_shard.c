/* rank_shard.c — optimizer-state sharding (ZeRO stage 1) in the data-parallel rank program.
 *
 * With --shard-optimizer each of the N replicas keeps the optimizer state (AdamW's moments, SGD's
 * velocity) of 1/N of the parameters, its shard (crew_shard_bounds: contiguous, aligned). A step:
 *   1. the gradient buckets are reduce-scattered, in the ordered way (crew_stepper_shard): each
 *      replica receives the sum of its shard only, the bits an all-reduce would leave there;
 *   2. each replica updates its shard's parameters and state (crew_optimizer_step_range; when
 *      clipping, the gradients are first gathered whole so that the norm is the whole buffer's; a
 *      layer-wise optimizer, LAMB or LARS, gathers what its tensors' norms are over, below);
 *   3. the parameters are all-gathered, so every replica holds them all again.
 * Elementwise updates on the same sums give the same bits wherever they run, so the weights equal
 * the unsharded run's, bit for bit, on any N. The state exists whole nowhere on a device: rank 0
 * gathers it into host memory (its `whole` optimizer) only for a checkpoint and at the end, and a
 * checkpoint is an ordinary one, resumable sharded or not, on any replica count. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "train/rank.h"

crew_status crew_rank_shard_init(crew_rank *r)
{
    crew_model *m = r->m;
    r->shard = calloc((size_t)r->replicas + 1, sizeof *r->shard);
    if (!r->shard) return CREW_OOM();
    crew_shard_bounds(m->n_params, r->replicas, r->shard);
    r->shard_lo = r->shard[r->replica];
    return CREW_OK;
}

void crew_rank_shard_release(crew_rank *r) { free(r->shard); }


/* Rank 0's starting state (a resumed run's, host memory of the caller's model), each shard sent
 * to its owner; every rank joins every broadcast, in rank order. */
crew_status crew_rank_shard_scatter_start(crew_rank *r)
{
    const crew_run *run = r->run;
    const double timeout = run->timeout_s;
    for (int i = 0; i < 2; i++) {
        if (!r->opt.slot[i]) continue;
        for (int q = 0; q < r->replicas; q++) {
            int64_t at = r->shard[q], n = crew_rank_shard_len(r, q);
            if (n == 0) continue;
            float *into = q == r->replica ? r->opt.slot[i] : crew_rank_pass_through(r);
            if (r->replica == 0 && run->start_opt && run->start_opt->slot[i])
                CREW_TRY(crew_dev_transfer_f32(r->be, into, &run->start->be, run->start_opt->slot[i] + at, n));
            if (q != 0) CREW_TRY(crew_broadcast(&r->group, into, n, CREW_COMM_F32, 0, timeout));
        }
    }
    return CREW_OK;
}

/* Every shard's state into rank 0's host optimizer (crew_rank_whole_init made it): each owner
 * broadcasts its shard in turn. */
crew_status crew_rank_shard_gather(crew_rank *r)
{
    const double timeout = r->run->timeout_s;
    for (int i = 0; i < 2; i++) {
        if (!r->opt.slot[i]) continue;
        for (int q = 0; q < r->replicas; q++) {
            int64_t n = crew_rank_shard_len(r, q);
            if (n == 0) continue;
            float *buf = q == r->replica ? r->opt.slot[i] : crew_rank_pass_through(r);
            if (q != 0) CREW_TRY(crew_broadcast(&r->group, buf, n, CREW_COMM_F32, q, timeout));
            if (r->sinks)
                CREW_TRY(crew_dev_transfer_f32(&r->sinks->model->be, r->whole_opt.slot[i] + r->shard[q], r->be, buf, n));
        }
    }
    if (r->sinks) r->whole_opt.t = r->opt.t;
    return CREW_OK;
}

/* A layer-wise optimizer's shard (LAMB, LARS): its first half over the shard, the whole buffer its
 * norms are over gathered (LAMB's updates, LARS's gradients), then each tensor's update over the
 * shard from the whole tensors' norms, which every replica computes alike. */
static crew_status layerwise_update(crew_rank *r, float *grad, float lr)
{
    crew_model *m = r->m;
    CREW_TRY(crew_optimizer_layerwise_begin(&r->opt, r->be, m->params, grad, m->n_params, r->shard_lo, lr, NULL));
    if (r->opt.spec.type == CREW_OPT_LAMB || r->opt.spec.clip_norm <= 0.0f) /* LARS with clipping has them whole */
        CREW_TRY(crew_allgather_ranges(&r->group, grad, m->n_params, r->shard, r->run->timeout_s));
    return crew_optimizer_layerwise_end(&r->opt, r->be, m->params, grad, m->n_params, r->shard_lo, lr);
}

crew_status crew_rank_shard_update(crew_rank *r, float *grad, float lr)
{
    crew_model *m = r->m;
    const double timeout = r->run->timeout_s;
    if (r->units) { /* ZeRO-2/3: the gradient exists as shards only */
        CREW_TRY(crew_rank_units_update(r, grad, lr));
        if (!crew_rank_holds_params(r)) return CREW_OK; /* ZeRO-3: the parameters stay sharded */
    } else {
        if (m->compile.optimizer.clip_norm > 0.0f) /* the norm is the whole gradient's */
            CREW_TRY(crew_allgather_ranges(&r->group, grad, m->n_params, r->shard, timeout));
        if (crew_optimizer_layerwise(&r->opt.spec))
            CREW_TRY(layerwise_update(r, grad, lr));
        else
            CREW_TRY(crew_optimizer_step_range(&r->opt, r->be, m->params, grad, m->n_params, r->shard_lo, lr, NULL));
    }
    if (!CREW_HOOK(r, shard_allgather)) return crew_allgather_ranges(&r->group, m->params, m->n_params, r->shard, timeout);
    int64_t *bounds = malloc(((size_t)r->replicas + 1) * sizeof *bounds); /* a test seam's own ranges */
    if (!bounds) return CREW_OOM();
    memcpy(bounds, r->shard, ((size_t)r->replicas + 1) * sizeof *bounds);
    r->hooks->shard_allgather(r->hooks_user, &r->who, bounds);
    crew_status s = crew_allgather_ranges(&r->group, m->params, m->n_params, bounds, timeout);
    free(bounds);
    return s;
}

crew_status crew_rank_shard_gather_grad(crew_rank *r, float *grad)
{
    if (r->units) return crew_errorf(CREW_CODE_INTERNAL, "a sharded gradient gathered whole on the device");
    return crew_allgather_ranges(&r->group, grad, r->m->n_params, r->shard, r->run->timeout_s);
}
