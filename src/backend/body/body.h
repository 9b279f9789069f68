/* body.h — what the kernel bodies share: one body per kernel, compiled by both backends.
 *
 * A CUDA kernel of crew computes each of its output elements from the element's index, one
 * thread an index (a grid-stride loop). The arithmetic of that element, its index math and its
 * formula, lives in a header of this folder as a function of the index (a "body"), which the
 * kernel calls for each of its indices and which the CPU backend calls too: in its own loop where
 * that loop is the same elementwise walk, else (a loop shaped for a CPU's speed: im2col's runs of
 * taps, col2im and the pooling gradients scattering in the CPU's order) through the same index
 * helpers and per-element formulas. So the formula and the index math are written once, and
 * tests/test_kernel_bodies.c runs every body over its whole index space on the CPU, without a GPU,
 * bit for bit against the CPU backend's op (docs/GPU.md lists the kernels and what each shares).
 *
 * A body is `static inline __host__ __device__` where nvcc compiles it and plain `static inline`
 * where the C compiler does (as core/rng.h and backend/exp_poly.h already are), so it inlines into
 * the CPU's loops, which keep their speed, and into the kernels. Every header here compiles as C11
 * (gcc -std=c11 -Wall -Wextra) and as C++17 under nvcc: no C-only syntax (no restrict, no compound
 * literals, no designated initialisers), no C++-only one (the CPU's restrict stays on its own
 * functions' parameters, which the inlined bodies inherit). The arithmetic is the CPU's, operation for operation and
 * type for type (the CPU builds with -std=c11, so nothing is contracted to an FMA; nvcc with
 * --fmad=false; fmaf where the CPU fuses on purpose), so a body gives the CPU exactly the bits it
 * gave before it moved here.
 *
 * The kernels along a row (a warp per row: softmax cross-entropy, softmax, layer norm, attention's
 * softmax) share their per-lane pieces instead: a lane's strided partial (elements lane, lane +
 * lanes, ...) and each element's formula, which the kernel calls with its lane and 32 lanes and
 * combines with its shuffle butterfly. The CPU sums in that order too, its 32 partials side by side
 * and folded as the butterfly folds them (backend/cpu/cpu_lanes.h), from the same per-element
 * terms: a row's sums have the GPU's bits, and the CPU's loops vectorise. */
#ifndef CREW_BACKEND_BODY_H
#define CREW_BACKEND_BODY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define CREW_BODY static inline __host__ __device__
#else
#define CREW_BODY static inline
#endif

/* The lanes of a row kernel's warp: the CUDA kernels' ROW_LANES, the test's emulation. */
#define CREW_BODY_LANES 32

#endif
