/* rank.h — the state of one rank program (rank.c sets it up, loop.c trains with it). */
#ifndef CREW_TRAIN_RANK_H
#define CREW_TRAIN_RANK_H

#include "comm/comm_worker.h"
#include "data/loader.h"
#include "train/run.h"
#include "train/step.h"
#include "train/train.h"

/* Doubles per rank in the per-step metrics all-reduce: loss, correct, stop, then the times. */
#define CREW_METRIC_FIELDS (3 + CREW_STEP_TIMES_FIELDS)
/* Tensors the drift check hashes at most (the first ones of crew_model_named_params). */
#define CREW_DRIFT_TENSORS 256

typedef struct crew_rank {
    int rank, size;
    const crew_run *run;
    crew_run_sinks *sinks;          /* rank 0 only */
    const crew_backend *be;         /* the rank's device (the context's) */
    crew_comm comm;
    crew_model *m;                  /* the replica, on the rank's device */
    crew_optimizer opt;             /* its optimizer state, on the same device: with sharding, of its
                                       shard [shard_lo, shard_lo + opt.n) only */
    crew_comm_worker worker;        /* the collectives that overlap compute */
    int has_worker;                 /* only with more than one rank */
    crew_stepper stepper;
    crew_loader *loader;            /* this rank's micro-batches only (the launcher's) */
    crew_queue *copy_q;             /* the micro-batches' uploads */
    /* On a device whose copies run beside its compute (one the host cannot reach: a GPU), every other
     * micro-batch's input goes to input_alt, so that its copy overlaps the previous micro-batch's
     * passes instead of waiting for them (loop.c's next_batch); NULL on the CPU kinds, whose
     * copies are done when upload returns. input_own: the model's own input buffer, put back after
     * each step. uploads: micro-batches uploaded so far, whose parity picks the buffer. */
    float *input_alt, *input_own;
    uint64_t uploads;
    /* Host values all-reduced between steps (metrics, evaluation sums, drift hashes) travel through
     * device memory, as every collective's buffers do. */
    int64_t scratch_n;
    double *dev_scratch;            /* [scratch_n] device */
    double *metrics;                /* [size × CREW_METRIC_FIELDS] host */
    crew_step_times *times;         /* [size] everyone's times of the last step (host) */
    /* optimizer sharding (rank_shard.c); shard NULL: off */
    int64_t *shard;                 /* [size + 1] rank q's shard is parameters shard[q] .. shard[q + 1] */
    int64_t shard_lo;
    crew_optimizer whole_opt;       /* rank 0: every shard's state, host memory, for checkpoints */
    int has_whole_opt;
    double shard_update_s;          /* the last update's time, reported with the next step */
    /* planted bugs' own buffers (train/hooks.h); unused in real runs */
    int64_t *plant_rows;            /* [plant_rows_n] host: 0, 1, 2, ... for CREW_PLANT_DROPOUT_BY_ROW */
    int64_t plant_rows_n;
    float *plant_prev[2];           /* [n_params] device, CREW_PLANT_STALE_GRADIENT */
} crew_rank;

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

/* Values of a rank's device scratch for a run of `ranks` ranks of a model with `tensors` named
 * tensors (the memory planner counts it too). */
int64_t crew_rank_scratch_size(int ranks, int tensors);

/* Optimizer sharding (rank_shard.c): set-up before the optimizer's (the shards, the scratch;
 * crew_stepper_shard then makes the stepper reduce-scatter), the start's state sent to its owners (when it has any: opt.t > 0), rank 0's gather of every
 * shard into whole_opt (every rank calls it), the update of the rank's shard followed by the
 * all-gather of the parameters, and the gradient gathered whole (verify's first-step hook). */
crew_status crew_rank_shard_init(crew_rank *r);
void crew_rank_shard_release(crew_rank *r);
crew_status crew_rank_shard_scatter_start(crew_rank *r);
crew_status crew_rank_shard_gather(crew_rank *r);
crew_status crew_rank_shard_update(crew_rank *r, float *grad, float lr);
crew_status crew_rank_shard_gather_grad(crew_rank *r, float *grad);

/* Runs every epoch of the plan on this rank; rank 0 reports. */
crew_status crew_rank_train(crew_rank *r);
/* Sums n host doubles over all ranks (in rank order), through the rank's device scratch: the step
 * metrics, evaluation sums and drift hashes. The rank's own thread makes it rather than handing it
 * to its communication thread: the rank would only wait for it, and the two hand-offs cost two
 * thread wake-ups each time (about 30 us idle, more with every core busy). It is called only when
 * none of the rank's requests is queued or in flight (the step's buckets have all been waited
 * for), so the communicator is used by one thread of the rank at a time and the collectives keep
 * the same order on every rank. */
crew_status crew_rank_allreduce_host(crew_rank *r, double *v, int64_t n);

#endif
