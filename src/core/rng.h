/* rng.h — counter-based random numbers.
 * A value is a pure function of (key, counter): no hidden state, so a dropout mask or an
 * augmentation depends on (seed, step, sample index, element) and never on how a batch was
 * split across replicas or threads. The mixer is SplitMix64's finaliser (Steele et al. 2014). */
#ifndef CREW_CORE_RNG_H
#define CREW_CORE_RNG_H

#include <stdint.h>

/* The CUDA backend draws the same numbers on the device (dropout masks equal the CPU's). */
#ifdef __CUDACC__
#define CREW_RNG_FN static inline __host__ __device__
#else
#define CREW_RNG_FN static inline
#endif

CREW_RNG_FN uint64_t crew_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A key for a stream of numbers derived from up to four identifiers. */
CREW_RNG_FN uint64_t crew_rng_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    return crew_mix64(crew_mix64(crew_mix64(crew_mix64(seed) ^ a) ^ b) ^ c);
}

CREW_RNG_FN uint64_t crew_rng_u64(uint64_t key, uint64_t counter)
{
    return crew_mix64(key ^ crew_mix64(counter));
}

/* Uniform in [0, 1) with 24 random bits: exact in float32. */
CREW_RNG_FN float crew_rng_uniform(uint64_t key, uint64_t counter)
{
    return (float)(crew_rng_u64(key, counter) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-32 for n < 2^32). */
static inline uint64_t crew_rng_below(uint64_t key, uint64_t counter, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)crew_rng_u64(key, counter) * n) >> 64);
}

/* A sequential generator over the same mixer, for initialisation and shuffles. */
typedef struct crew_rng {
    uint64_t key;
    uint64_t counter;
} crew_rng;

static inline crew_rng crew_rng_make(uint64_t key) { return (crew_rng){key, 0}; }
static inline float crew_rng_next_uniform(crew_rng *r) { return crew_rng_uniform(r->key, r->counter++); }
static inline uint64_t crew_rng_next_below(crew_rng *r, uint64_t n)
{
    return crew_rng_below(r->key, r->counter++, n);
}

/* RNG stream identifiers, so different uses of one seed never share numbers. */
enum {
    CREW_STREAM_INIT = 1,
    CREW_STREAM_SHUFFLE = 2,
    CREW_STREAM_DROPOUT = 3,
    CREW_STREAM_AUGMENT = 4,
    CREW_STREAM_SAMPLE = 5, /* text generation */
};

#endif
