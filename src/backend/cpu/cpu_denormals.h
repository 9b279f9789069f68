/* cpu_denormals.h — the optimizer updates run with subnormal floats flushed to zero.
 *
 * A moment whose gradient stays 0 (a unit that dropout or ReLU silences, a rarely seen input
 * pixel) decays geometrically: Adam's first moment reaches the subnormal range (below 1.2e-38)
 * after some 800 steps, and every operation on a subnormal operand or result then takes a
 * microcode assist of a hundred cycles or more on x86. The demo's CNN spent 3.5 ms of its 25 ms
 * step in the AdamW update from its second epoch on, against 0.5 ms in the first
 * (docs/PERFORMANCE.md). Flushed, such a moment is 0 instead of a value that moves its parameter
 * by less than a millionth of an ulp: the state's bits change where one would have been
 * subnormal, the same way on every replica, shard and replica count (the determinism contract
 * holds), and the update costs the same in every epoch.
 *
 * The mode is the calling thread's (MXCSR on x86, FPCR on AArch64); begin sets it and returns
 * the caller's, which end restores, so nothing outside the update sees it. Elsewhere both do
 * nothing and subnormals stay, at their cost. */
#ifndef CREW_CPU_DENORMALS_H
#define CREW_CPU_DENORMALS_H

#if defined(__SSE__)
#include <xmmintrin.h>
typedef unsigned int cpu_fp_mode;
#define CPU_FLUSH_BITS 0x8040u /* flush-to-zero (results) | denormals-are-zero (operands) */
static inline cpu_fp_mode cpu_flush_denormals(void)
{
    cpu_fp_mode was = _mm_getcsr();
    _mm_setcsr(was | CPU_FLUSH_BITS);
    return was;
}
static inline void cpu_restore_fp_mode(cpu_fp_mode was) { _mm_setcsr(was); }
#elif defined(__aarch64__)
typedef unsigned long cpu_fp_mode;
#define CPU_FLUSH_BITS (1ul << 24) /* FPCR.FZ */
static inline cpu_fp_mode cpu_flush_denormals(void)
{
    cpu_fp_mode was;
    __asm__ volatile("mrs %0, fpcr" : "=r"(was));
    __asm__ volatile("msr fpcr, %0" : : "r"(was | CPU_FLUSH_BITS));
    return was;
}
static inline void cpu_restore_fp_mode(cpu_fp_mode was) { __asm__ volatile("msr fpcr, %0" : : "r"(was)); }
#else
typedef int cpu_fp_mode;
static inline cpu_fp_mode cpu_flush_denormals(void) { return 0; }
static inline void cpu_restore_fp_mode(cpu_fp_mode was) { (void)was; }
#endif

#endif
