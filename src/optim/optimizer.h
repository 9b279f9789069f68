/* optimizer.h — optimizer state and learning-rate schedules over the flat parameter buffer.
 * It knows buffers on a backend, not layers: the rank that trains a model owns its optimizer, and
 * tells a layer-wise one (LAMB, LARS) where the buffer's tensors lie. */
#ifndef CREW_OPTIM_OPTIMIZER_H
#define CREW_OPTIM_OPTIMIZER_H

#include "backend/backend.h"
#include "crew.h"

typedef struct crew_optimizer {
    crew_optimizer_spec spec;
    int64_t n;        /* parameters */
    int64_t t;        /* updates applied */
    float *slot[2];   /* sgd, lars: velocity; adamw, lamb: first and second moments. [n] each */
    /* The layer-wise optimizers' tensors (crew_optimizer_set_tensors): tensor j is [bounds[j],
     * bounds[j + 1]) of the whole flat buffer. [n_tensors + 1], owned */
    int64_t *bounds;
    int n_tensors;
} crew_optimizer;

/* "sgd", "adamw", "lamb", "lars": the model file's names. */
const char *crew_optimizer_name(crew_optimizer_type type);
/* 1 for LAMB and LARS: each tensor's update is scaled by a ratio of norms over the whole tensor,
 * so the optimizer needs the tensors (crew_optimizer_set_tensors), and a shard of it the whole
 * buffer of what the norms are over (crew_optimizer_gathers). */
int crew_optimizer_layerwise(const crew_optimizer_spec *spec);
/* The tensors of the whole flat buffer: bounds [n + 1], from 0 to the buffer's parameters. */
crew_status crew_optimizer_set_tensors(crew_optimizer *opt, const int64_t *bounds, int n);

/* Fills unset fields with defaults and checks ranges; errors name the key. */
crew_status crew_optimizer_spec_check(crew_optimizer_spec *spec);
/* The state buffers an optimizer of this spec keeps: 2 for AdamW, 1 for SGD with momentum, else 0. */
int crew_optimizer_slots(const crew_optimizer_spec *spec);
/* Zeroed state for n parameters on backend be. */
crew_status crew_optimizer_init(crew_optimizer *opt, const crew_optimizer_spec *spec, const crew_backend *be,
                                int64_t n);
void crew_optimizer_release(crew_optimizer *opt, const crew_backend *be);
/* dst's state and update count := src's (the same spec and size, on any two devices). */
crew_status crew_optimizer_copy(crew_optimizer *dst, const crew_backend *dst_be, const crew_optimizer *src,
                                const crew_backend *src_be);

/* The learning-rate plan of a run: peak is the scaled rate, start the rate warmup begins at. */
typedef struct crew_lr_plan {
    crew_schedule_type schedule;
    float start_lr, peak_lr, min_lr;
    int64_t warmup_steps, total_steps, step_size;
    float gamma;
} crew_lr_plan;

/* Learning rate for the update with 0-based index step. */
float crew_lr_at(const crew_lr_plan *plan, int64_t step);

/* AdamW's constants for step t (counted from 1) at learning rate lr. */
void crew_adamw_consts_at(const crew_optimizer_spec *s, float lr, int64_t t, crew_adamw_consts *k);
/* One update: clips grads to spec.clip_norm (global L2 norm, in place), then steps.
 * *grad_norm receives the norm before clipping. */
crew_status crew_optimizer_step(crew_optimizer *opt, const crew_backend *be, float *params, float *grads, float lr,
                                double *grad_norm);
/* The same update for the opt->n parameters from `lo` of buffers of n (a shard of optimizer state,
 * ZeRO stage 1): the norm is over all n gradients (they must all be reduced when clipping), the
 * clipping and the update touch the range only, computing there the bits a whole update would.
 * A layer-wise optimizer's shard cannot: it steps in two halves around the caller's gather of the
 * whole buffer (below). */
crew_status crew_optimizer_step_range(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                      int64_t n, int64_t lo, float lr, double *grad_norm);

/* The same update of a shard held on its own (ZeRO-2/3: params and grads point at the shard's
 * opt->n values), clipped by the whole gradient's L2 norm, which the caller computed (the shards'
 * lanes of sum_squares handed on; unused without clipping). Not for a layer-wise optimizer. */
crew_status crew_optimizer_step_shard(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                      float lr, double norm);

/* A layer-wise optimizer's shard (a range of a buffer of n):
 *   1. crew_optimizer_layerwise_begin: clipping as above (LARS clips every gradient, which it
 *      holds whole when clipping); LAMB's moments, and its update (Adam's direction plus weight
 *      decay) into grads over the range; LARS: nothing more;
 *   2. the caller gathers grads whole: every range's updates (LAMB), or the reduced gradients
 *      (LARS), as an all-gather of the shards' ranges;
 *   3. crew_optimizer_layerwise_end: each tensor's norms over the whole tensor, then its update
 *      over the range.
 * Every shard computes the norms of the same whole tensors, so the weights are the bits one
 * unsharded step leaves. crew_optimizer_step_range does both halves, with nothing to gather. */
crew_status crew_optimizer_layerwise_begin(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                           int64_t n, int64_t lo, float lr, double *grad_norm);
crew_status crew_optimizer_layerwise_end(crew_optimizer *opt, const crew_backend *be, float *params, float *grads,
                                         int64_t n, int64_t lo, float lr);

#endif
