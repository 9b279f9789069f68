/* bench_backend.h — the plain CPU backend on one thread, as the benchmarks of single ops open it
 * (bench_optim, bench_rows): 0, or -1 with the reason on stderr under the program's name. */
#ifndef CREW_BENCH_BACKEND_H
#define CREW_BENCH_BACKEND_H

#include <stdio.h>

#include "backend/backend.h"
#include "crew.h"

static inline int bench_open_cpu(const char *program, crew_backend *be)
{
    crew_status s = crew_cpu_backend_create(1, be);
    if (!s) return 0;
    fprintf(stderr, "%s: %s\n", program, crew_status_message(s));
    crew_status_free(s);
    return -1;
}

#endif
