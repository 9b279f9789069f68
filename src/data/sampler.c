/* sampler.c — the order of samples in an epoch: Fisher–Yates driven by the counter-based RNG
 * keyed on (seed, epoch), so it is reproducible and independent of replicas and threads. */
#include "core/rng.h"
#include "data/sampler.h"

void crew_epoch_order(uint64_t seed, int epoch, int64_t n, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    crew_rng rng = crew_rng_make(crew_rng_key(seed, CREW_STREAM_SHUFFLE, (uint64_t)epoch, 0));
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)crew_rng_next_below(&rng, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
