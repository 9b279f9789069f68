/* timer.h — monotonic wall time in seconds. */
#ifndef CREW_CORE_TIMER_H
#define CREW_CORE_TIMER_H

#include <time.h>

static inline double crew_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wall-clock Unix time in seconds, for logs and TensorBoard. */
static inline double crew_unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
