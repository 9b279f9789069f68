/* augment.h — per-sample augmentations of image batches (NHWC float32, already normalised),
 * run by the loader's producer threads. Every random choice comes from the key
 * (seed, epoch, sample index), so a sample is augmented the same way whoever prepares it. */
#ifndef CREW_DATA_AUGMENT_H
#define CREW_DATA_AUGMENT_H

#include <stdint.h>

#include "core/shape.h"

#include "crew.h"

/* crop_padding, flip: see crew_augment_options in crew.h. */
typedef struct crew_augment {
    int crop_padding;
    int flip;
    double slow_s;              /* test only (a run's hooks): extra seconds per sample, to make a run
                                   input-bound on purpose */
} crew_augment;

static inline crew_augment crew_augment_of(const crew_augment_options *o, double slow_s)
{
    crew_augment a = {o->crop_padding, o->flip, slow_s};
    return a;
}

static inline int crew_augment_active(const crew_augment *a) { return a->crop_padding > 0 || a->flip || a->slow_s > 0; }

/* Augments one sample x [H, W, C] in place; scratch holds H·W·C floats. */
void crew_augment_sample(const crew_augment *a, const crew_shape *sample, float *x, float *scratch, uint64_t seed,
                         int epoch, int64_t sample_id);

#endif
