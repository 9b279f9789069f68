/* augment.h — per-sample augmentations of image batches (NHWC float32, already normalised),
 * run by the loader's producer threads. Every random choice comes from the key
 * (seed, epoch, sample index), so a sample is augmented the same way whoever prepares it. */
#ifndef CREW_DATA_AUGMENT_H
#define CREW_DATA_AUGMENT_H

#include <stdint.h>

#include "core/shape.h"

#include "crew.h"

/* crop_padding, flip, slow_s: see crew_augment_options in crew.h. */
typedef crew_augment_options crew_augment;

static inline int crew_augment_active(const crew_augment *a) { return a->crop_padding > 0 || a->flip || a->slow_s > 0; }

/* Augments one sample x [H, W, C] in place; scratch holds H·W·C floats. */
void crew_augment_sample(const crew_augment *a, const crew_shape *sample, float *x, float *scratch, uint64_t seed,
                         int epoch, int64_t sample_id);

#endif
