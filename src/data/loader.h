/* loader.h — the prefetching loader: K producer threads fill micro-batches ahead of the replicas.
 *
 * A step's global batch is a sequence of micro-batches (replica r owns micro-batches r·k … r·k+k−1);
 * the loader keeps up to `prefetch` steps in a ring, each with all its micro-batches. Producers
 * claim the next empty micro-batch, gather its samples (uint8 → normalised float32), augment
 * them, and mark it ready; a replica takes its own micro-batches in order, waiting only when the
 * one it needs is not ready (that wait is what telemetry reports as data time). A step's ring slot
 * is refilled once every replica has taken its part.
 *
 * What a micro-batch holds is a pure function of (seed, epoch, step, position, sample): the
 * sample order of an epoch depends on (seed, epoch) alone, augmentations draw from a key of
 * (seed, epoch, sample), so results never depend on the number of producer threads, the prefetch
 * depth or the number of replicas. */
#ifndef CREW_DATA_LOADER_H
#define CREW_DATA_LOADER_H

#include <stdint.h>

#include "crew.h"
#include "data/augment.h"

typedef struct crew_loader_options {
    int threads;            /* producer threads K [2] */
    int prefetch;           /* steps prepared ahead D [2] */
    crew_augment augment;   /* per-sample augmentations, none by default */
    int pad_last;           /* 1: the last partial global batch is filled up with samples from the
                               start of the epoch's order; 0: it is dropped */
    int reverse_rows;       /* 1: each micro-batch's samples in reverse order */
} crew_loader_options;

typedef struct crew_loader crew_loader;

/* A loader for micro-batches of `batch` samples, `micro` of them per step (replicas × accumulation). */
crew_status crew_loader_create(const crew_dataset *d, const crew_loader_options *o, int64_t batch, int micro,
                               uint64_t seed, crew_loader **out);
/* Steps in an epoch: every full global batch, plus a padded last one with pad_last. */
int64_t crew_loader_steps_per_epoch(const crew_loader *l);
/* Begins producing at epoch `epoch`, step `first` (0-based; a resumed run starts mid-epoch);
 * production then runs on into the following epochs. Later calls do nothing. */
crew_status crew_loader_start_epoch(crew_loader *l, int epoch, int64_t first);
/* Copies micro-batch `index` of step `step` (0-based within epoch `epoch`) into x [batch, sample...],
 * y [batch] and ids [batch] (the samples' dataset indices). *wait_s: time spent waiting for it. */
crew_status crew_loader_next(crew_loader *l, int epoch, int64_t step, int index, float *x, int32_t *y, int64_t *ids,
                             double *wait_s);
/* Stops the producers and frees everything. */
void crew_loader_free(crew_loader *l);

/* Measures what the loader alone can produce: samples per second over `steps` steps with K
 * threads (crew bench-data). */
crew_status crew_loader_benchmark(const crew_dataset *d, const crew_loader_options *o, int64_t batch, int64_t steps,
                                  double *samples_per_s);

#endif
