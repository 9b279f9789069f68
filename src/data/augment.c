/* augment.c — random crop with zero padding and random horizontal flip, NHWC. */
#include "data/augment.h"

#include <string.h>
#include <time.h>

#include "core/rng.h"

/* Shifts the image by (dy, dx) inside an (H + 2p) × (W + 2p) zero-padded frame and crops back
 * to H × W: the usual "random crop with padding". */
static void crop(float *x, float *scratch, int64_t h, int64_t w, int64_t c, int64_t dy, int64_t dx)
{
    memset(scratch, 0, (size_t)(h * w * c) * sizeof(float));
    for (int64_t y = 0; y < h; y++) {
        int64_t sy = y + dy;
        if (sy < 0 || sy >= h) continue;
        for (int64_t xx = 0; xx < w; xx++) {
            int64_t sx = xx + dx;
            if (sx < 0 || sx >= w) continue;
            memcpy(scratch + (y * w + xx) * c, x + (sy * w + sx) * c, (size_t)c * sizeof(float));
        }
    }
    memcpy(x, scratch, (size_t)(h * w * c) * sizeof(float));
}

static void flip(float *x, int64_t h, int64_t w, int64_t c)
{
    for (int64_t y = 0; y < h; y++)
        for (int64_t a = 0, b = w - 1; a < b; a++, b--)
            for (int64_t k = 0; k < c; k++) {
                float *p = x + (y * w + a) * c + k, *q = x + (y * w + b) * c + k, t = *p;
                *p = *q;
                *q = t;
            }
}

void crew_augment_sample(const crew_augment *a, const crew_shape *sample, float *x, float *scratch, uint64_t seed,
                         int epoch, int64_t sample_id)
{
    if (a->slow_s > 0) {
        struct timespec ts = {(time_t)a->slow_s, (long)((a->slow_s - (double)(time_t)a->slow_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (sample->ndim != 3 || (!a->crop_padding && !a->flip)) return;
    int64_t h = sample->dim[0], w = sample->dim[1], c = sample->dim[2];
    crew_rng rng = crew_rng_make(crew_rng_key(seed, CREW_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)sample_id));
    if (a->crop_padding > 0) {
        int64_t span = 2 * (int64_t)a->crop_padding + 1;
        int64_t dy = (int64_t)crew_rng_next_below(&rng, (uint64_t)span) - a->crop_padding;
        int64_t dx = (int64_t)crew_rng_next_below(&rng, (uint64_t)span) - a->crop_padding;
        if (dy || dx) crop(x, scratch, h, w, c, dy, dx);
    }
    if (a->flip && crew_rng_next_uniform(&rng) < 0.5f) flip(x, h, w, c);
}
