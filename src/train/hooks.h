/* hooks.h — the test seams of a fit, never part of crew.h: faults that make the failures the
 * detectors exist for happen on purpose, bugs planted where a real one would sit (the proof that
 * crew verify catches them), and verify's own references (reversed rows, the first step's
 * gradients, the final moments).
 *
 * The rank program consults one table of functions, crew_rank_hooks, at named points of every
 * step; a run without seams has no table (NULL), so each point costs one NULL check. What the
 * faults and the bugs do lives with the tests that plant them (tests/fault_hooks.h,
 * tests/test_verify_planted.c): the library only says where they may act.
 *
 *   crew_fit *f;
 *   CREW_TRY(crew_fit_prepare(m, train, &opts, &f));
 *   crew_fit_hooks_of(f)->rank = &my_hooks;           // a crew_rank_hooks
 *   crew_fit_hooks_of(f)->rank_user = &my_state;
 *   s = crew_fit_run(f, &result);
 */
#ifndef CREW_TRAIN_HOOKS_H
#define CREW_TRAIN_HOOKS_H

#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm_worker.h"
#include "crew.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "telemetry/record.h"

/* The rank a hook is called on: what a seam may look at and act through. Hooks of one rank are
 * called from that rank's own thread, one at a time (bucket from its communication thread's
 * submitter, which is the rank's thread too). */
typedef struct crew_hook_rank {
    int rank, size;            /* its global rank, and the run's ranks (replicas × stages) */
    int replica, replicas;     /* its data-parallel replica, and their number */
    int stage, stages;         /* its pipeline stage (0 of 1 without a pipeline) */
    int sink;                  /* 1 on global rank 0, which writes the run's outputs */
    const crew_backend *be;    /* its device */
    crew_model *m;             /* its model (its stage's layers) on that device */
    int accumulation;          /* micro-batches per replica per step */
    int64_t steps_per_epoch;
    double timeout_s;          /* the collectives' deadline */
    void *state;               /* the hooks' own, per rank (rank_begins may set it, rank_ends frees it) */
    /* What the gradient hook's *grad holds (set before each call): values for the parameters
     * [grad_lo, grad_lo + grad_n) of the flat buffer, whose values are at grad_params (device
     * memory). The whole buffer (grad_lo 0) but under ZeRO-2/3, whose gradient is the rank's shard
     * alone; under ZeRO-1 the whole buffer, of which the shard holds the reduced sums. */
    int64_t grad_lo, grad_n;
    float *grad_params;
} crew_hook_rank;

/* The named points. Every member may be NULL (the point does nothing); `user` is the fit hooks'
 * rank_user. Steps are 1-based. */
typedef struct crew_rank_hooks {
    /* the rank is set up (its model, optimizer and stepper exist) / is about to free everything */
    crew_status (*rank_begins)(void *user, crew_hook_rank *r);
    void (*rank_ends)(void *user, crew_hook_rank *r);
    /* a step begins, before anything of it: a late or absent rank (return its error), a frozen one
     * (never return), a host read of device memory */
    crew_status (*step_begins)(void *user, crew_hook_rank *r, int64_t step);
    /* which of the loader's micro-batches the rank takes for its micro-batch `micro`: the step of
     * the epoch and the index within the step's global batch, in the loader's terms */
    void (*batch_slot)(void *user, crew_hook_rank *r, int micro, int64_t *epoch_step, int *index);
    /* the micro-batch's sample ids as uploaded (dropout's keys): ids, or [rows] of the hook's own */
    const int64_t *(*sample_ids)(void *user, crew_hook_rank *r, const int64_t *ids, int64_t rows);
    /* 1: the micro-batch's uploads are not ordered before the compute that reads them */
    int (*unordered_uploads)(void *user, crew_hook_rank *r);
    /* a training pass about to run (its batch-norm synchronisation, its dropout keys) */
    void (*pass)(void *user, crew_hook_rank *r, crew_pass *p);
    /* one replica accumulating: 0 leaves micro-batch `micro`'s gradient out of the running sum */
    int (*accumulates)(void *user, crew_hook_rank *r, int micro);
    /* bucket b of n, about to be reduced (its request filled in: the hook may change it, or zero
     * its buffer through the rank's device); 0: it is never reduced */
    int (*bucket)(void *user, crew_hook_rank *r, int b, int n, crew_comm_request *req);
    /* the step's passes are done: the hook may take time (a slow replica), and adds it to *times */
    void (*passes_done)(void *user, crew_hook_rank *r, crew_step_times *times);
    /* the reduced gradient, before the finiteness check and the update: the hook may change it
     * or point *grad at a buffer of its own */
    crew_status (*gradient)(void *user, crew_hook_rank *r, int64_t step, float **grad);
    /* the learning-rate plan the rank steps with */
    void (*lr_plan)(void *user, crew_hook_rank *r, crew_lr_plan *lr);
    /* a sharded optimizer's all-gather of the updated parameters, about to run over the ranges
     * bounds[0 .. replicas] (replica q's shard: bounds[q] .. bounds[q + 1]): the hook may change
     * them (every replica alike) */
    void (*shard_allgather)(void *user, crew_hook_rank *r, int64_t *bounds);
    /* the step's update is done (the rank's values are the step's) */
    crew_status (*step_ends)(void *user, crew_hook_rank *r, int64_t step);
    /* before the drift check after `step`: the hook may change the rank's values */
    crew_status (*before_drift)(void *user, crew_hook_rank *r, int64_t step);
    /* the drift check's hashes of the rank's values (its row: `slots` hashes), before they are
     * shared: the hook may change them */
    void (*drift_hashes)(void *user, crew_hook_rank *r, uint64_t *hashes, int slots);
    /* the rank whose micro-batches rank `rank`'s loader reads (run.c) */
    int (*loader_rank)(void *user, int rank);
    /* the epoch whose sample order rank `rank`'s loader serves for `epoch` (run.c, loader.h) */
    int (*loader_epoch)(void *user, int rank, int epoch);
} crew_rank_hooks;

typedef struct crew_fit_hooks {
    const crew_rank_hooks *rank; /* NULL after crew_fit_prepare */
    void *rank_user;           /* must stay valid, and unchanged, as long as any rank may run: a rank
                                  the threads launcher left behind after a failed run (a stalled or
                                  frozen one) calls its hooks after crew_fit_run has returned */
    int reverse_batch_rows;    /* each micro-batch's samples in reverse order: the same mathematics with
                                  another order of float sums (crew verify's rounding reference) */
    double loader_slow_s;      /* extra seconds per sample in the loader, to make a run input-bound */
    float *first_grads;        /* [n_params] host, or NULL: rank 0 copies the reduced gradient of the
                                  run's first step here, before the update (crew verify's first-step check) */
    float *final_moments;      /* [2 × n_params] host, or NULL: the optimizer's moments at the end of the
                                  run (AdamW's m then v; zeros where the optimizer keeps fewer). Both are
                                  written inside rank 0's sink sections (rank.h), as the caller's memory */
    int64_t sum_block;         /* every device's sums over a batch (GEMMs' k, column sums' rows) in
                                  blocks of this many (crew_device_options.sum_block): crew verify's
                                  reference of other blocks without the replicas; 0: whole */
    int compare_replicas;      /* 1: at the end every replica's parameters, state (when batch norm is
                                  synchronised) and optimizer moments (unsharded) are compared value by
                                  value with replica 0's of its stage, a witness besides the drift
                                  check's hashes: a difference is a CREW_CODE_DIVERGED error naming the
                                  tensor and the replica (crew verify) */
} crew_fit_hooks;

/* The hooks of a prepared fit, to set before crew_fit_run. */
crew_fit_hooks *crew_fit_hooks_of(crew_fit *f);

/* crew verify with seams in every run it makes (tests/test_verify_planted.c): `rank` goes into
 * every fit, and `options` may change each run's options first (label: the run's name in the
 * verdict; against: 1 for the run on verify --against's device kind). */
typedef struct crew_verify_hooks {
    const crew_rank_hooks *rank;
    void *user;
    void (*options)(void *user, const char *label, int against, crew_fit_options *o);
} crew_verify_hooks;

crew_status crew_verify_with_hooks(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                                   const crew_verify_hooks *hooks, crew_verify_result *res);

#endif
