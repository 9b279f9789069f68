/* cpu.h — small helpers about the processor this runs on (crew_cpu_cores() is public, in crew.h). */
#ifndef CREW_CORE_CPU_H
#define CREW_CORE_CPU_H

/* One pause in a busy-wait loop: tells the core it is spinning (cheaper for its hyperthread
 * sibling, and no memory-order mis-speculation when the watched value changes). */
static inline void crew_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
