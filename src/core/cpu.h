/* cpu.h — small helpers about the processor this runs on and its cores (crew_cpu_cores() is public,
 * in crew.h). */
#ifndef CREW_CORE_CPU_H
#define CREW_CORE_CPU_H

#include <pthread.h>

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

/* The CPUs the calling thread may run on (its affinity mask: the process's, unless the thread's
 * was changed), in ascending order, at most cap of them into cpus; returns how many (0 when the
 * mask cannot be read). */
int crew_cpu_list(int *cpus, int cap);

/* Binds the calling thread to cpus[0 .. n): 0, or the errno value of the refusal (a CPU outside
 * the process's cpuset, say). Threads the caller starts afterwards inherit the binding. */
int crew_cpu_bind_self(const int *cpus, int n);

/* The same binding for the threads started with attr (pthread_attr_init'ed). */
int crew_cpu_bind_attr(pthread_attr_t *attr, const int *cpus, int n);

#endif
