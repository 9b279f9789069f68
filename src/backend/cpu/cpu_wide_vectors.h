/* cpu_wide_vectors.h — the widest vectors the target has, for the loops of exponentials that follow
 * (included first, by cpu_activation.c and cpu_attention.c; the pragma holds for the rest of the
 * file, the inline bodies it includes too).
 *
 * GCC's tuning for -march=native prefers narrower vectors than the target has: 128 bits on an AMD
 * Zen 1 (whose units split a 256-bit operation in two), 256 on AVX-512 Xeons (against the clock
 * drop of 512-bit work on the early ones). An exponential is a chain of some twenty dependent
 * operations, and wide vectors' chains in flight hide its latency: GELU with its slope took 3.9
 * ms instead of 4.8 per million values with 256 bits on a family-23 EPYC, and 1.1 instead of 1.4
 * with 512 on a Sapphire Rapids-class Xeon, attention's forward 1.37 ms a layer instead of 1.57
 * there (`bench_rows`, `bench_attention`, docs/PERFORMANCE.md). The GEMM kernels of the same step
 * already run 512-bit instructions, so their clock is the step's either way. Each value takes the
 * same operations at any width and the sums keep their 32 lanes' order (cpu_lanes.h), so the bits
 * do not change.
 *
 * Only where measured: layer norm's loops were slower with 512 bits (130 → 218 µs for gpt_tiny's
 * [2048, 128], their rows of 128 too short for the wider loop's set-up) and the loss's no faster. */
#ifndef CREW_BACKEND_CPU_WIDE_VECTORS_H
#define CREW_BACKEND_CPU_WIDE_VECTORS_H

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#pragma GCC target("prefer-vector-width=512")
#endif

#endif
