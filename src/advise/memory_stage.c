/* memory_stage.c — what each device of a pipeline holds (crew_model_plan_stages in crew.h): the
 * buffers the rank program (src/train/rank.c) allocates for its stage, counted as memory_plan.c
 * counts a replica's. */
#include <stdlib.h>

#include "advise/memory_plan.h"
#include "core/status.h"
#include "train/pipeline.h"
#include "train/rank.h"

/* A set of activations of a micro-batch in flight: what crew_model_view allocates (the input's and
 * every layer's activation, the layers' workspace, the ping-pong buffers, labels, ids, losses; the
 * shared scratch is the stage's own). */
static int64_t view_bytes(const crew_mem_model *mm, int64_t rows)
{
    const crew_model *m = mm->m;
    crew_model_buffer_sizes n;
    crew_model_buffers(m, rows, &n);
    int64_t b = crew_mem_alloc_bytes(n.act_input, 4);
    for (int i = 0; i < m->n_layers; i++) b += crew_mem_layer_activation(mm, i, rows) + crew_mem_layer_workspace(mm, i, rows);
    return b + crew_mem_alloc_bytes(n.dbuf[0], 4) + crew_mem_alloc_bytes(n.dbuf[1], 4) +
           crew_mem_alloc_bytes(n.labels, (int64_t)sizeof(int32_t)) + crew_mem_alloc_bytes(n.sample_ids, (int64_t)sizeof(int64_t)) +
           crew_mem_alloc_bytes(n.row_loss, 4);
}

crew_status crew_model_plan_stages(const crew_model *full, const crew_fit_plan *p, int64_t *bytes)
{
    if (!full || !p || !bytes) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_plan_stages: NULL argument");
    if (p->stages < 2) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_plan_stages: the plan has no pipeline");
    const int ranks = p->devices * p->stages, k = p->accumulation;
    int64_t largest_slice = 0;
    for (int s = 0; s < p->stages; s++) {
        crew_model *m;
        CREW_TRY(crew_model_stage_layers(full, p->stage_first[s], p->stage_first[s + 1], &m));
        crew_mem_model mm;
        crew_mem_model_init(&mm, m, crew_act_storage_for(p->precision, p->attention_recompute, p->device_kind), 0.0);
        crew_mem_costs c; /* slot 0: the stage as a replica of its own */
        crew_mem_replica(&mm, p->batch_per_device, p->devices, k, CREW_SHARD_NONE, &c);
        /* the scratch of a rank among all the run's ranks, for the whole model's drift hashes */
        c.total -= crew_mem_alloc_bytes(crew_rank_scratch_size(p->devices, crew_model_named_params(m, NULL, 0)), 8);
        c.total += crew_mem_alloc_bytes(crew_rank_scratch_size(ranks, crew_model_named_params(full, NULL, 0)), 8);
        c.total += crew_mem_alloc_bytes((int64_t)4 * k, 8); /* the step's timeline, for metrics.jsonl */
        int slots = crew_pipeline_slots((crew_pipeline_schedule)p->pipeline_schedule, p->stages, s, k);
        bytes[s] = c.total + (int64_t)(slots - 1) * view_bytes(&mm, p->batch_per_device);
        if (mm.n_params > largest_slice) largest_slice = mm.n_params;
        if (mm.n_state > largest_slice) largest_slice = mm.n_state;
        crew_model_free(m);
    }
    bytes[0] += crew_mem_alloc_bytes(largest_slice, 4); /* rank 0's staging */
    return CREW_OK;
}
