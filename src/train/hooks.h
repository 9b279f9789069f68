/* hooks.h — what tests and crew verify set on a prepared fit, never part of crew.h: faults that
 * make the failures the detectors exist for happen on purpose, and verify's reversed rows.
 *
 *   crew_fit *f;
 *   CREW_TRY(crew_fit_prepare(m, train, &opts, &f));
 *   crew_fit_hooks_of(f)->faults.stall_rank = 1; ...
 *   s = crew_fit_run(f, &result);
 */
#ifndef CREW_TRAIN_HOOKS_H
#define CREW_TRAIN_HOOKS_H

#include <stdint.h>

#include "crew.h"

typedef struct crew_fit_faults {
    int slow_rank;             /* this rank sleeps slow_s in each backward pass (-1: none) */
    double slow_s;
    int stall_rank;            /* this rank stops arriving at collectives from stall_step on (-1: none) */
    int64_t stall_step;        /* 1-based; 0: never */
    int freeze_rank;           /* this rank stops for good at the start of freeze_step, and its thread
                                  never returns (-1: none) */
    int64_t freeze_step;       /* 1-based; 0: never */
    int corrupt_rank;          /* this rank's first parameter changes at corrupt_step (-1: none) */
    int64_t corrupt_step;
    int64_t nan_step;          /* the gradients of this step become NaN (all ranks); 0: never */
    int host_touch_step;       /* at this step rank 0 reads a parameter straight from device memory,
                                  as a bug would: the guarded backend must trap it; 0: never */
    int skip_copy_wait;        /* 1: a micro-batch's uploads are not ordered before the compute that
                                  reads them, as a bug would: the guarded backend's results change */
} crew_fit_faults;

/* Bugs planted on purpose, one at a time, in the places where a real one would sit: the proof that
 * crew verify catches every class of broken split of the work (tests/test_verify_planted.c).
 * CREW_PLANT_NONE in every real run; nothing outside the tests can set another. */
typedef enum crew_planted_bug {
    CREW_PLANT_NONE,
    CREW_PLANT_DROPOUT_BY_ROW,        /* dropout keyed by the row within the micro-batch, not the sample */
    CREW_PLANT_LAST_BUCKET_UNREDUCED, /* with several buckets, the last one is never all-reduced */
    CREW_PLANT_ORDERED_DROPS_MICRO,   /* k > 1: the ordered all-reduce leaves out each rank's last micro-batch */
    CREW_PLANT_PLAIN_DROPS_RANK,      /* k = 1: the last rank's gradient is left out of the plain all-reduce */
    CREW_PLANT_STALE_GRADIENT,        /* rank 1 updates with the previous step's gradient */
    CREW_PLANT_ACCUM_DROPS_MICRO,     /* one replica accumulating: its last micro-batch is not added */
    CREW_PLANT_AVERAGED_TWICE,        /* the all-reduced gradient is divided by the replica count again */
    CREW_PLANT_SAME_MICRO_TWICE,      /* rank 1 trains on rank 0's micro-batches */
    CREW_PLANT_LOCAL_BN_STATS,        /* batch-norm statistics of the micro-batch alone, though synchronised */
    CREW_PLANT_WARMUP_SKIPPED,        /* no learning-rate warmup when there is more than one replica */
    CREW_PLANT_WRONG_LOADER_SLOT,     /* rank 1 takes the next step's micro-batch from its loader */
    CREW_PLANT_AGAINST_LOW_PRECISION, /* verify --against: that device computes its GEMMs in bf16, as a GPU
                                         quietly running TF32 would in lower precision */
    CREW_PLANT_COUNT
} crew_planted_bug;

/* Its name, as the tests print it. */
const char *crew_planted_bug_name(crew_planted_bug b);

typedef struct crew_fit_hooks {
    crew_fit_faults faults;    /* all off after crew_fit_prepare */
    int reverse_batch_rows;    /* each micro-batch's samples in reverse order: the same mathematics with
                                  another order of float sums (crew verify's rounding reference) */
    double loader_slow_s;      /* extra seconds per sample in the loader, to make a run input-bound */
    float *first_grads;        /* [n_params] host, or NULL: rank 0 copies the all-reduced gradient of the
                                  run's first step here, before the update (crew verify's first-step check) */
    float *final_moments;      /* [2 × n_params] host, or NULL: rank 0's optimizer moments at the end of the
                                  run (AdamW's m then v; zeros where the optimizer keeps fewer). Both are
                                  written inside rank 0's sink sections (rank.h), as the caller's memory */
    crew_planted_bug plant;    /* CREW_PLANT_NONE after crew_fit_prepare */
} crew_fit_hooks;

/* The hooks of a prepared fit, to set before crew_fit_run. */
crew_fit_hooks *crew_fit_hooks_of(crew_fit *f);

#endif
