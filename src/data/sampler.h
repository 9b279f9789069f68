/* sampler.h — the order of samples in an epoch. */
#ifndef CREW_DATA_SAMPLER_H
#define CREW_DATA_SAMPLER_H

#include <stdint.h>

/* A permutation of [0, n) that depends on (seed, epoch) alone, never on the number of replicas
 * or threads. perm: [n] */
void crew_epoch_order(uint64_t seed, int epoch, int64_t n, int64_t *perm);

#endif
