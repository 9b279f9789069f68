/* thread_name.h — naming crew's threads ("crew-rank1", "crew-loader0", "crew-comm1"), so that top -H,
 * gdb and perf show which is which when a run is slow or stuck. Linux only; a no-op elsewhere. */
#ifndef CREW_CORE_THREAD_NAME_H
#define CREW_CORE_THREAD_NAME_H

#include <stdio.h>

#ifdef __linux__
#include <sys/prctl.h>
#endif

/* Names the calling thread "crew-<what><index>" (at most 15 characters are kept). */
static inline void crew_thread_name(const char *what, int index)
{
#ifdef __linux__
    char name[16];
    snprintf(name, sizeof name, "crew-%s%d", what, index);
    prctl(PR_SET_NAME, name, 0, 0, 0);
#else
    (void)what;
    (void)index;
#endif
}

#endif
