/* cpu.c — which CPU cores this process may run on, and binding a thread to some of them.
 *
 * The affinity mask, not the machine's count: under `taskset`, a container's cpuset or a batch
 * scheduler's allocation a process sees all the machine's cores in sysconf() but may use only a
 * few, and sizing replicas or loader threads by the larger figure oversubscribes them. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "core/cpu.h"
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

int crew_cpu_list(int *cpus, int cap)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
        if (CPU_ISSET(c, &set)) cpus[n++] = c;
    return n;
}

/* cpus[0 .. n) as a set: 0, or EINVAL for a CPU number the set cannot hold. */
static int set_of(const int *cpus, int n, cpu_set_t *set)
{
    CPU_ZERO(set);
    for (int i = 0; i < n; i++) {
        if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE) return EINVAL;
        CPU_SET(cpus[i], set);
    }
    return 0;
}

int crew_cpu_bind_self(const int *cpus, int n)
{
    cpu_set_t set;
    int err = set_of(cpus, n, &set);
    return err ? err : pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

int crew_cpu_bind_attr(pthread_attr_t *attr, const int *cpus, int n)
{
    cpu_set_t set;
    int err = set_of(cpus, n, &set);
    return err ? err : pthread_attr_setaffinity_np(attr, sizeof set, &set);
}
