/* memory_plan.h — the arithmetic behind crew_model_plan_memory.
 *
 * A replica's memory is the buffers crew allocates for it, counted as they are allocated:
 * crew_model_layout (parameters, gradients, state), the optimizer's slots, crew_model_reserve
 * (activations of every layer, two gradient ping-pong buffers of the widest layer, labels, row
 * losses, each layer's workspace), the stepper (micro-batch gradients kept for the ordered sum,
 * sample ids). The loader's ring and the epoch's sample order are shared by the replicas.
 * What crew_model_reserve allocates is not mirrored but asked of the model and its layers:
 * crew_model_buffers and crew_model_layer_act_size (nn/model.h) and each layer's workspace op,
 * the very sizes crew_model_reserve and crew_layer_reserve allocate. The rest mirrors the
 * allocations; tests/test_memory_plan.c checks the sum against the measured growth of a
 * training process. */
#ifndef CREW_ADVISE_MEMORY_PLAN_H
#define CREW_ADVISE_MEMORY_PLAN_H

#include <stddef.h>

#include "crew.h"
#include "nn/model.h"

/* One replica's bytes, by kind. */
typedef struct crew_mem_costs {
    int64_t param, gradient, optimizer, activation, workspace, accumulation;
    int64_t total;
} crew_mem_costs;

/* The model facts memory depends on, gathered once. */
typedef struct crew_mem_model {
    const crew_model *m;
    int64_t n_params, n_state;   /* trainable and non-trainable values */
    int slots;                   /* optimizer values per parameter: AdamW 2, SGD with momentum 1 */
    const char *optimizer;       /* "AdamW", "SGD with momentum", "SGD" */
    int64_t in_size;             /* values per input sample */
    crew_act_storage store;      /* how the run's layers keep their activations (crew_layer.store) */
    /* ZeRO-2/3's units (crew_model_units at the run's unit size): the widest but the pinned one,
     * and the pinned one's values (0: none) */
    int64_t unit_widest, unit_pinned;
    int unit_tied_late;          /* crew_model_tied_late_ok: without overlap no unit is pinned */
    int unit_overlap;            /* 1: the units but the pinned one double-buffered (crew_fit_plan.shard_overlap) */
} crew_mem_model;

/* store: the run's activation storage (crew_act_storage_for); unit_mb: ZeRO-2/3's unit size
 * (crew_fit_options.shard_unit_mb; 0: the default) */
void crew_mem_model_init(crew_mem_model *mm, const crew_model *m, crew_act_storage store, double unit_mb);

/* Bytes of a backend buffer of n elements of `elem` bytes: the CPU backend rounds to 64. */
int64_t crew_mem_alloc_bytes(int64_t n, int64_t elem);

/* Layer i's own bytes for micro-batches of `rows`; shards divides its optimizer state. The
 * activation is its act[] buffer (crew_model_layer_act_size), the workspace its workspace op's
 * buffers (nn/layer.h) but its scratch, which the model shares among its layers, each rounded as
 * allocated. */
int64_t crew_mem_layer_weights(const crew_mem_model *mm, int i, int shards);
int64_t crew_mem_layer_activation(const crew_mem_model *mm, int i, int64_t rows);
int64_t crew_mem_layer_workspace(const crew_mem_model *mm, int i, int64_t rows);
/* Layer i's scratch (crew_layer_ops.scratch), slot by slot in 4-byte elements (0: none). */
void crew_mem_layer_scratch(const crew_mem_model *mm, int i, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK]);
/* The bytes of the model's shared scratch buffers (crew_model_scratch_sizes), n[k] elements each. */
int64_t crew_mem_scratch_bytes(const int64_t n[CREW_LAYER_MAX_WORK]);

/* One replica with micro-batches of `batch`, accumulating `accumulation` of them per step, one of
 * `devices` replicas, sharding what `shard` says (a crew_shard_level: from OPTIMIZER on, the
 * optimizer state is split `devices` ways; GRADIENTS and PARAMETERS count the units' buffers, as
 * train/rank_units.c allocates them on replica 0). */
void crew_mem_replica(const crew_mem_model *mm, int64_t batch, int devices, int accumulation, int shard,
                      crew_mem_costs *out);
/* What the options shard: crew_memory_options.shard, else OPTIMIZER with optimizer_sharding. */
int crew_memory_shard_level(const crew_memory_options *o);

/* The host memory of the `devices` ranks' loaders: `prefetch` global batches of samples in all,
 * and each loader's two epochs' sample orders of train_samples (0: unknown, not counted); the
 * datasets' own memory (dataset_bytes, crew_dataset_memory_bytes); and the caller's copy of the
 * weights. */
int64_t crew_mem_host(const crew_mem_model *mm, int devices, int64_t global_batch, int prefetch, int64_t train_samples,
                      int64_t dataset_bytes);

/* The ladder of verdicts (memory_verdict.c): fills plan->verdict, advised_*, verdict_text and
 * the layers' stages. */
crew_status crew_mem_verdict(const crew_mem_model *mm, const crew_memory_options *o, crew_memory_plan *plan);

#endif
