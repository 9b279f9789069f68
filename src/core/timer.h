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

/* *ts := the CLOCK_REALTIME moment `seconds` from now, as pthread_cond_timedwait and
 * pthread_mutex_timedlock take their deadlines. */
static inline void crew_deadline_after(double seconds, struct timespec *ts)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = (double)(long)seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Wall-clock Unix time in seconds, for logs and TensorBoard. */
static inline double crew_unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
