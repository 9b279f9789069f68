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

typedef struct crew_fit_hooks {
    crew_fit_faults faults;    /* all off after crew_fit_prepare */
    int reverse_batch_rows;    /* each micro-batch's samples in reverse order: the same mathematics with
                                  another order of float sums (crew verify's rounding reference) */
    double loader_slow_s;      /* extra seconds per sample in the loader, to make a run input-bound */
} crew_fit_hooks;

/* The hooks of a prepared fit, to set before crew_fit_run. */
crew_fit_hooks *crew_fit_hooks_of(crew_fit *f);

#endif
