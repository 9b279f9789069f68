/* scaling_group_link.c — the processes of a group measured as a link (crew_scale_measure_group_link
 * in crew.h): one replica per process all-reduces a buffer of the gradients' size through the MPI
 * communicator, as a run across processes does, and one value for the latency. Compiled with or
 * without MPI: without it, the communicator cannot be made and the call says so. */
#include <stdio.h>
#include <stdlib.h>

#include "advise/scaling.h"
#include "comm/comm_mpi.h"
#include "core/status.h"
#include "core/timer.h"

#define WARMUP 3
#define REPEATS 15
#define TIMEOUT_S 60.0

crew_status crew_scale_measure_group_link(const crew_process_group *g, int64_t bytes, crew_link *out)
{
    if (!g || !out || bytes < 4 || bytes > ((int64_t)1 << 34))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the MPI link benchmark takes a group and 4 B to 16 GiB, got %lld",
                           (long long)bytes);
    const int p = crew_group_size(g);
    crew_local_comm *lc = NULL;
    crew_mpi_comm *mc = NULL;
    const int64_t n = bytes / (int64_t)sizeof(float);
    float *buf = calloc((size_t)n, sizeof *buf);
    double times[2][REPEATS];
    crew_status s = buf ? crew_local_comm_create(1, &lc) : CREW_OOM();
    if (!s) s = crew_mpi_comm_create(g, lc, 1, &mc);
    crew_comm comm = {0};
    if (!s) comm = crew_mpi_comm_rank(mc, 0);
    for (int size = 0; size < 2 && !s; size++)
        for (int r = -WARMUP; r < REPEATS && !s; r++) {
            double t0 = crew_now();
            s = crew_allreduce(&comm, buf, size ? n : 1, CREW_COMM_F32, CREW_REDUCE_SUM, TIMEOUT_S);
            if (r >= 0) times[size][r] = crew_now() - t0;
        }
    if (!s) {
        double lat = crew_scale_median(times[0], REPEATS), full = crew_scale_median(times[1], REPEATS);
        double ring = p > 1 ? 2.0 * (p - 1) / p : 1.0; /* the ring's traffic per byte of the buffer */
        out->alpha_s = lat;
        out->bytes_per_s = full > lat ? ring * (double)bytes / (full - lat) : ring * (double)bytes / 1e-7;
        snprintf(out->name, sizeof out->name, "MPI link");
    }
    crew_mpi_comm_free(mc);
    crew_local_comm_free(lc);
    free(buf);
    return s ? crew_error_prefix(s, "measuring the MPI link: ") : CREW_OK;
}
