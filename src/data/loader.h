/* loader.h — the prefetching loader of one rank: K producer threads fill its micro-batches ahead
 * of it, or, with K = 0, the rank's own thread fills each when it takes it (inline).
 *
 * A step's global batch is a sequence of micro-batches (rank r owns micro-batches r·k … r·k+k−1);
 * a rank's loader is given its range and reads only those samples. It keeps up to `prefetch`
 * steps in a ring, each with the rank's micro-batches. Producers claim the next empty one, gather
 * its samples (uint8 → normalised float32), augment them, and mark it ready; the rank takes its
 * micro-batches in order, waiting only when the one it needs is not ready (that wait is what
 * telemetry reports as data time), uploads them to its device and releases them. A step's ring
 * slot is refilled once all its micro-batches have been released.
 *
 * What a micro-batch holds is a pure function of (seed, epoch, step, position, sample): the
 * sample order of an epoch depends on (seed, epoch) alone (every rank's loader computes the same
 * order), augmentations draw from a key of (seed, epoch, sample), so results never depend on the
 * number of producer threads, the prefetch depth or the number of ranks. */
#ifndef CREW_DATA_LOADER_H
#define CREW_DATA_LOADER_H

#include <stdint.h>

#include "crew.h"
#include "data/augment.h"

typedef struct crew_loader_options {
    int threads;            /* producer threads K [2]; 0: none, crew_loader_take fills the micro-batch
                               on the calling thread (for a rank whose core nothing else may use:
                               a producer there would take turns with it) */
    int prefetch;           /* steps prepared ahead D [2] */
    crew_augment augment;   /* per-sample augmentations, none by default */
    int pad_last;           /* 1: the last partial global batch is filled up with samples from the
                               start of the epoch's order; 0: it is dropped */
    int reverse_rows;       /* 1: each micro-batch's samples in reverse order */
    double timeout_s;       /* crew_loader_take gives up after this long [0: waits for ever] */
    /* The slots' memory (inputs, labels, ids): the staging memory of the device the rank copies
     * them to (page-locked on a GPU, so that its copies run at full speed and need no bounce
     * through another buffer). NULL: malloc. slot_free takes what slot_alloc returned. */
    void *(*slot_alloc)(void *user, size_t bytes);
    void (*slot_free)(void *user, void *p);
    void *slot_user;
    /* n_cpus > 0: the producer threads run on cpus[0 .. n_cpus) (copied), those of the rank they
     * feed when the run binds its ranks to cores (crew_fit_plan.bind_cores) */
    const int *cpus;
    int n_cpus;
    /* A test seam (src/train/hooks.h, loader_epoch): the epoch whose sample order this loader
     * serves for `epoch`, asked with order_user and order_rank (the rank the loader is for); NULL,
     * as in every real run: its own. */
    int (*order_epoch)(void *user, int rank, int epoch);
    void *order_user;
    int order_rank;
} crew_loader_options;

typedef struct crew_loader crew_loader;

/* Which micro-batches of every step a loader serves: of the step's `micro` micro-batches of
 * `batch` samples (ranks × accumulation), the `count` from `first` on (one rank's). */
typedef struct crew_loader_range {
    int64_t batch;
    int micro;
    int first, count;
} crew_loader_range;

/* One micro-batch, in the loader's host memory until it is released. */
typedef struct crew_loader_batch {
    const float *x;          /* [batch, sample...] normalised, augmented */
    const int32_t *y;        /* [batch, label positions] */
    const int64_t *ids;      /* [batch] the samples' dataset indices */
} crew_loader_batch;

crew_status crew_loader_create(const crew_dataset *d, const crew_loader_options *o, const crew_loader_range *range,
                               uint64_t seed, crew_loader **out);
/* Steps in an epoch: every full global batch, plus a padded last one with pad_last. */
int64_t crew_loader_steps_per_epoch(const crew_loader *l);
/* Begins producing at epoch `epoch`, step `first` (0-based; a resumed run starts mid-epoch);
 * production then runs on into the following epochs. Later calls do nothing. */
crew_status crew_loader_start_epoch(crew_loader *l, int epoch, int64_t first);
/* Micro-batch `index` (one of the loader's range) of step `step` (0-based within epoch `epoch`),
 * once it is ready; *wait_s: the time spent waiting for it (inline: filling it). Inline, the step's
 * place in the ring must have been released (a rank takes its steps in turn and gives each back, as
 * it must for producers too); else a CREW_CODE_INTERNAL error names both steps. The batch stays valid, and its slot
 * busy, until crew_loader_release. Not ready within the options' timeout_s: a CREW_CODE_TIMEOUT
 * error naming the micro-batch (a rank asking for one its loader will never fill, because the
 * slots it still holds keep the ring full, would otherwise wait for ever). */
crew_status crew_loader_take(crew_loader *l, int epoch, int64_t step, int index, crew_loader_batch *out,
                             double *wait_s);
void crew_loader_release(crew_loader *l, int epoch, int64_t step, int index);
/* Stops the producers and waits for them to end: from then on nothing reads the dataset; a take
 * returns CREW_CODE_CANCELLED and a release does nothing. Safe from any thread, while the loader's
 * user may still call it; again, a no-op. */
void crew_loader_shutdown(crew_loader *l);
/* Shuts down and frees everything. */
void crew_loader_free(crew_loader *l);

/* Measures what the loader alone can produce: samples per second over `steps` steps with K
 * threads (crew bench-data). */
crew_status crew_loader_benchmark(const crew_dataset *d, const crew_loader_options *o, int64_t batch, int64_t steps,
                                  double *samples_per_s);

#endif
