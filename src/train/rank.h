/* rank.h — the rank program: one rank owns one device and trains its share of every step.
 *
 * One program for every layout. A run has D replicas of K stages, D·K ranks; rank g = d·K + s is
 * stage s of replica d. Data parallelism is the case K = 1: each rank is a replica of the whole
 * model (its one stage). A pipeline (K > 1) gives each rank a contiguous range of the layers, and
 * its micro-batches pass from stage to stage. Everything else is the same code for both: the
 * loading of micro-batches, the stepper that sums their gradients in micro-batch order and
 * reduces them with the stage's other replicas, the update, the metrics every rank shares,
 * reporting, cancellation, the drift check, checkpoints, the evaluation and the end of the run.
 *
 *   rank.c          set-up, the starting point, tear-down, crew_rank_main
 *   rank_step.c     one step: the schedule's passes (for K = 1: F0 B0 F1 B1 ...), the update
 *   rank_loop.c     epochs and steps, the shared metrics, rank 0's reports, the evaluation, the end
 *   rank_drift.c    the replica drift check
 *   rank_whole.c    the whole model on rank 0 (a pipeline's stages, a sharded optimizer's shards):
 *                   checkpoints, the caller's model at the end, verify's first-step gradients
 *   rank_shard.c    optimizer sharding (ZeRO stage 1)
 *   rank_timeline.c a pipeline's timeline of passes and its measured bubble
 *
 * Communicators: `world` joins every rank of the run (the step's metrics, the drift hashes, the
 * evaluation's sums, a pipeline's activations and gradients between neighbouring stages);
 * `group` joins stage s of every replica (the gradient reduction, synchronised batch norm): the
 * world itself when K = 1. */
#ifndef CREW_TRAIN_RANK_H
#define CREW_TRAIN_RANK_H

#include "comm/comm_worker.h"
#include "data/loader.h"
#include "train/hooks.h"
#include "train/pipeline.h"
#include "train/run.h"
#include "train/step.h"
#include "train/train.h"

/* Doubles per rank in the per-step metrics all-reduce: loss, correct, flags, the gradient noise
 * scale's two sums, then the times. */
#define CREW_METRIC_FIELDS (5 + CREW_STEP_TIMES_FIELDS)
/* Tensors the drift check hashes one by one at most; beyond, the rest of a buffer as one. */
#define CREW_DRIFT_TENSORS 256

typedef struct crew_rank {
    int rank, size;                 /* of the run: rank = replica · stages + stage */
    int stage, stages, replica, replicas;
    int local_lead;                 /* 1 on the first rank of its process: it reads the process's cancel flag */
    const crew_run *run;
    crew_run_sinks *sinks;          /* global rank 0 only */
    crew_model *own_model;          /* crew_rank_ctx.own_model */
    const crew_backend *be;         /* the rank's device (the context's) */
    crew_comm world;                /* every rank of the run */
    crew_comm group;                /* this stage of every replica: the world when stages == 1 */
    /* The stage's model on the rank's device (its layers' values, gradients and optimizer state)
     * and the activation sets of the micro-batches in flight: slot[0] is m, the others are views
     * over m's values (crew_model_view); micro-batch j uses slot j mod n_slots. */
    crew_model *m;
    crew_model **slot;              /* [n_slots] */
    int n_slots;
    crew_pipe_op *ops;              /* [2 · accumulation] the step's passes in the order the rank runs them */
    int64_t rows;                   /* per micro-batch */
    int64_t in_values, out_values;  /* per sample: the stage's input and output */
    int64_t *param_at, *state_at;   /* [stages + 1] where each stage's values lie in the whole model's buffers */
    crew_optimizer opt;             /* its optimizer state, on the same device: of the stage's parameters, and
                                       with sharding of its shard [shard_lo, shard_lo + opt.n) only */
    crew_comm_worker worker;        /* the collectives that overlap compute (the group's) */
    int has_worker;                 /* only with more than one replica */
    crew_stepper stepper;
    crew_loader *loader;            /* this replica's micro-batches only (the launcher's) */
    crew_queue *copy_q;             /* the micro-batches' uploads */
    /* On a device whose copies run beside its compute (one the host cannot reach: a GPU), without
     * a pipeline, every other micro-batch's input goes to input_alt, so that its copy overlaps the
     * previous micro-batch's passes instead of waiting for them (rank_step.c's load); NULL on the
     * CPU kinds, whose copies are done when upload returns. input_own: the model's own input
     * buffer, put back after each step. uploads: micro-batches uploaded so far (the parity). */
    float *input_alt, *input_own;
    uint64_t uploads;
    /* On a device whose ops read host memory (the CPU; crew_run_inputs_in_place), without a
     * pipeline, the model reads each micro-batch's input in the loader's slot instead of a copy:
     * the step holds its slots (held[0 .. n_held), its micro-batches' loader coordinates) until its
     * backward passes are over, and input_own is put back after it. */
    int in_place;
    struct crew_rank_held { int epoch; int64_t step; int index; } *held; /* [accumulation] */
    int n_held;
    /* Host values all-reduced between steps (metrics, evaluation sums, drift hashes) travel through
     * device memory, as every collective's buffers do. */
    int64_t scratch_n;
    double *dev_scratch;            /* [scratch_n] device */
    double *metrics;                /* [size × CREW_METRIC_FIELDS] host */
    crew_step_times *times;         /* [size] everyone's times of the last step (host) */
    double update_s;                /* an update decided after the metrics all-reduce (a shard's, a pipeline
                                       stage's): its time, reported with the next step */
    /* optimizer sharding (rank_shard.c); shard NULL: off */
    int64_t *shard;                 /* [replicas + 1] replica q's shard is parameters shard[q] .. shard[q + 1] */
    int64_t shard_lo;
    /* gradient and parameter sharding (ZeRO-2/3, rank_units.c); NULL: off */
    struct crew_rank_units *units;
    /* the whole model on global rank 0 (rank_whole.c): the optimizer state of every stage or shard in
     * host memory (the caller's model's device; the caller's model holds the values), gathered
     * through staging, [staging_n] on rank 0's device */
    crew_optimizer whole_opt;
    int has_whole_opt;
    float *staging;
    int64_t staging_n;
    int64_t gathered_step;          /* the step after which the last gather ran (-1: none) */
    int gathered_opt;               /* 1: it gathered the optimizer state too */
    /* a pipeline's timeline (rank_timeline.c) */
    double busy_s, step_s;          /* this run's forward and backward time, and its steps' */
    double *tl, *tl_dev;            /* [2 · 2 · accumulation] each pass's start and end, host and device */
    double *tl_all;                 /* rank 0: [stages × 2 · 2 · accumulation] */
    crew_pipe_timing *tl_ops;       /* rank 0: [stages × 2 · accumulation] */
    crew_pipe_op *tl_order;         /* rank 0: [2 · accumulation] */
    /* the run's test seams (hooks.h); hooks NULL in real runs */
    const crew_rank_hooks *hooks;
    void *hooks_user;
    crew_hook_rank who;
} crew_rank;

/* A named point of hooks.h, if the run has seams and this one: one NULL check when it has none. */
#define CREW_HOOK(r, point) ((r)->hooks && (r)->hooks->point)

/* Rank 0's writes to the run's sinks (the monitor, the result, the caller's callbacks and model)
 * happen inside a sink section. The launcher takes the same lock, and keeps it, when it leaves
 * behind a rank 0 that never returned, so that its thread cannot write into a finished run should
 * it ever wake (launch_threads.c). No-ops on the other ranks, which have no sinks. */
static inline void crew_rank_sink_enter(const crew_rank *r)
{
    if (r->sinks) pthread_mutex_lock(&r->sinks->lock);
}

static inline void crew_rank_sink_leave(const crew_rank *r)
{
    if (r->sinks) pthread_mutex_unlock(&r->sinks->lock);
}

static inline int crew_rank_first_stage(const crew_rank *r) { return r->stage == 0; }
/* Values of replica q's shard (optimizer sharding and up: r->shard set). */
static inline int64_t crew_rank_shard_len(const crew_rank *r, int q) { return r->shard[q + 1] - r->shard[q]; }
static inline int crew_rank_last_stage(const crew_rank *r) { return r->stage == r->stages - 1; }

/* Values of a rank's device scratch for a run of `ranks` ranks (replicas × stages) of a model with
 * `tensors` named tensors in all (the memory planner counts it too). */
int64_t crew_rank_scratch_size(int ranks, int tensors);

/* Sums n host doubles over all ranks of the world (in rank order), through the rank's device
 * scratch: the step metrics, evaluation sums and drift hashes. The rank's own thread makes it
 * rather than handing it to its communication thread: the rank would only wait for it, and the two
 * hand-offs cost two thread wake-ups each time (about 30 us idle, more with every core busy). It is
 * called only when none of the rank's requests is queued or in flight (the step's buckets have all
 * been waited for), so the communicator is used by one thread of the rank at a time and the
 * collectives keep the same order on every rank. */
crew_status crew_rank_allreduce_host(crew_rank *r, double *v, int64_t n);

/* rank_loop.c: rank 0's event into the monitor (a no-op elsewhere); and a failed phase of `step`
 * named, a missed deadline reported as a hang event first. */
crew_status crew_rank_event(crew_rank *r, crew_event_kind kind, int64_t step, int rank, const char *msg);
crew_status crew_rank_phase_error(crew_rank *r, crew_status s, int64_t step, const char *phase);

/* rank_step.c: one optimizer step, 1-based `step`; rank_loop.c runs them. */
typedef struct crew_rank_step {
    int epoch;
    int64_t epoch_step;             /* 0-based, within the epoch */
    int64_t step;                   /* 1-based */
    double epoch_start;             /* crew_now() at the epoch's start */
    /* out */
    double loss, correct;           /* summed over every rank's micro-batches */
    int stop, checkpoint, skipped;
    /* The gradient noise scale's sums when the step measures it (measure): Σ |g|² over every
     * micro-batch's own gradient, and |G|² of the reduced one (telemetry/noise_scale.h) */
    int measure;
    double sq_small, sq_big;
} crew_rank_step;
crew_status crew_rank_train_step(crew_rank *r, crew_rank_step *st);

/* rank_loop.c: every epoch of the plan. */
crew_status crew_rank_train(crew_rank *r);

/* rank_drift.c: every replica's values after `step` hashed and compared with replica 0's of the
 * same stage; a difference is a CREW_CODE_DIVERGED error naming the tensor, on every rank. */
crew_status crew_rank_check_drift(crew_rank *r, int64_t step);
/* The same judgement value by value (crew_fit_hooks.compare_replicas: crew verify, at the end):
 * replica 0 of each stage broadcasts its values and every other replica compares its own. */
crew_status crew_rank_compare_replicas(crew_rank *r, int64_t step);

/* rank_whole.c: the whole model on global rank 0 after `step` (every rank calls it: the stages and
 * shards send theirs), its optimizer state too when with_opt. On rank 0, *m and *opt are where it
 * is: the replica itself when it holds all of it (one stage, unsharded), else the caller's model
 * and rank 0's host copy of the optimizer state (NULL without with_opt), filled now. Elsewhere
 * both NULL. */
crew_status crew_rank_whole(crew_rank *r, int64_t step, int with_opt, crew_model **m, const crew_optimizer **opt);
crew_status crew_rank_whole_init(crew_rank *r);
void crew_rank_whole_release(crew_rank *r);
/* Whether this rank's process asks to stop: the first rank of each process reads the caller's
 * flag (a signal handler or a callback may set it), rank 0 inside its sink section (the caller's
 * memory); every other rank says no. The ranks agree on it through a collective (a step's metrics,
 * or the epoch's end). */
int crew_rank_cancel_requested(const crew_rank *r);
/* A checkpoint after `step` (every rank calls it, when rank 0 said one is due). */
crew_status crew_rank_write_checkpoint(crew_rank *r, int64_t step);
/* verify's first-step hook: the reduced gradient of the run's first step, whole, into the caller's memory. */
crew_status crew_rank_capture_first_grads(crew_rank *r, float *grad);
/* The end of the run after `step`: the trained values into the caller's model, the final moments
 * into the hook's memory. */
crew_status crew_rank_finish(crew_rank *r, int64_t step);

/* Optimizer sharding (rank_shard.c): set-up before the optimizer's (the shards over the stage's
 * replicas; crew_stepper_shard then makes the stepper reduce-scatter), the start's state sent to
 * its owners (when it has any: opt.t > 0), the gather of every shard into rank 0's whole_opt
 * (every rank calls it), the update of the rank's shard followed by the all-gather of the
 * parameters, and the gradient gathered whole (verify's first-step hook). */
crew_status crew_rank_shard_init(crew_rank *r);
void crew_rank_shard_release(crew_rank *r);
crew_status crew_rank_shard_scatter_start(crew_rank *r);
crew_status crew_rank_shard_gather(crew_rank *r);
crew_status crew_rank_shard_update(crew_rank *r, float *grad, float lr);
crew_status crew_rank_shard_gather_grad(crew_rank *r, float *grad);

/* Gradient and parameter sharding (rank_units.c, ZeRO-2/3), on top of the optimizer's (the shard
 * bounds are rank_shard.c's). The replica's model has no gradient buffer (and under ZeRO-3 no
 * parameter buffer): its layers work in units (crew_model_units), each unit's gradient is
 * reduce-scattered as soon as the last micro-batch's backward pass has completed it, and under
 * ZeRO-3 each unit's parameters are all-gathered just before it runs, forward and backward.
 *   init: before crew_model_reserve's buffers are used (after build_models: r->m laid out with
 *         params_elsewhere under ZeRO-3 and grads_elsewhere); points the layers at the units' buffers
 *   start: each rank's shard of rank 0's starting parameters (ZeRO-3)
 *   begin/micro/finish: around a step's passes (micro: before each backward pass); finish leaves
 *         the rank's shard of the summed gradient
 *   update: the shard's update from grad (finish's, or a test seam's), the clipping norm from every
 *         shard's lanes (rank_shard.c's update then all-gathers the parameters under ZeRO-2)
 *   gather_params: every shard's parameters into rank 0's caller model (ZeRO-3; every rank calls it)
 *   grads_to_host: the summed gradient, whole, into rank 0's host memory (verify's first step) */
crew_status crew_rank_units_init(crew_rank *r);
void crew_rank_units_release(crew_rank *r);

/* The buffers a sharded replica's units keep, by level (crew_shard_level: ZeRO-2 or 3) and overlap
 * (--shard-overlap with replicas > 1), from the model's units: the widest but the pinned one
 * (widest), the pinned one's values (pinned, 0: none), and whether the model can compute its tied
 * gradients late (crew_model_tied_late_ok). rank_units.c allocates what it says and the memory plan
 * (src/advise/memory_plan.c) counts it: the one statement of the rule.
 *   - ZeRO-3 writes a unit's gradient over its gathered parameters (nn/layer.h's rule), the pinned
 *     unit's always and the others' without overlap (with overlap the next unit's gather would
 *     land in a buffer whose reduce-scatter may still be in flight);
 *   - without overlap no unit is pinned where the tied gradients can come late: the tied table
 *     takes its turn in the one buffer (ZeRO-3: gathered again for the lm_head) and its gradient
 *     is computed at the embedding (crew_model.tied_grads_late). */
typedef struct crew_units_layout {
    int slots;                  /* buffers the units but a pinned one take turns in: 1, or 2 (overlap) */
    int64_t slot_values;        /* each: the widest unit that takes turns */
    int64_t pinned;             /* values of the pinned unit's buffers of its own; 0: none */
    int params;                 /* 1: ZeRO-3: the slots and the pinned unit hold gathered parameters */
    int slot_grads;             /* 1: the slots have gradient buffers of their own */
    int pinned_grads;           /* 1: the pinned unit has a gradient buffer of its own */
    int grads_over;             /* 1: the units but a pinned one write their gradient over their parameters */
    int tied_late;              /* 1: no pinned unit; crew_model.tied_grads_late */
} crew_units_layout;
void crew_units_layout_for(int64_t widest, int64_t pinned, int tied_late_ok, int level, int overlap,
                           crew_units_layout *out);

crew_status crew_rank_units_start(crew_rank *r);
void crew_rank_units_begin(crew_rank *r, int measure, crew_step_times *times);
void crew_rank_units_micro(crew_rank *r, int micro);
crew_status crew_rank_units_finish(crew_rank *r, crew_status passes, float **grad, double *sq_small);
crew_status crew_rank_units_update(crew_rank *r, float *grad, float lr);
crew_status crew_rank_units_gather_params(crew_rank *r, float *host_params);
crew_status crew_rank_units_grads_to_host(crew_rank *r, float *host);
/* ZeRO-3 across processes, at the end: every shard's parameters (and the state) into the caller's
 * model of every process but process 0's (crew_rank_ctx.own_model); every rank calls it. */
crew_status crew_rank_units_to_own_model(crew_rank *r);
/* Where another rank's shard passes through on its way to or from rank 0 (start, checkpoints, the
 * end): a buffer of the largest shard that holds nothing between steps. */
float *crew_rank_pass_through(const crew_rank *r);
/* What the step's reduced gradient holds: values for parameters [*lo, *lo + *n), whose values are
 * at *params on the device (the whole buffer, or under ZeRO-2/3 the rank's shard). */
void crew_rank_grad_range(const crew_rank *r, int64_t *lo, int64_t *n, float **params);
/* 1 when the rank's replica holds every parameter (not under ZeRO-3). */
int crew_rank_holds_params(const crew_rank *r);

/* rank_timeline.c: a pipeline's timeline (whether `step`'s is written; the stages of replica 0
 * send their passes' times to rank 0, which writes it), and at the end of every run the device
 * memory each stage of replica 0 held at its peak, and a pipeline's measured bubble, into rank 0's
 * result (every rank calls it). */
crew_status crew_rank_timeline_init(crew_rank *r);
void crew_rank_timeline_release(crew_rank *r);
int crew_rank_timeline_step(const crew_rank *r, int64_t step);
crew_status crew_rank_send_timeline(crew_rank *r, int64_t step, double step_s);
crew_status crew_rank_report_end(crew_rank *r, int64_t steps);

#endif
