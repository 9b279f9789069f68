/* cpu.c — how many CPU cores this process may run on.
 *
 * The affinity mask, not the machine's count: under `taskset`, a container's cpuset or a batch
 * scheduler's allocation a process sees all the machine's cores in sysconf() but may use only a
 * few, and sizing replicas or loader threads by the larger figure oversubscribes them. */
#define _GNU_SOURCE
#include <sched.h>
#include <unistd.h>

#include "crew.h"

int crew_cpu_cores(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN); /* affinity unknown (more CPUs than cpu_set_t holds) */
    return n > 0 ? (int)n : 1;
}
