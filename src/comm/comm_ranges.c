/* comm_ranges.c — the all-gather of ranges for a communicator without its own (comm.h). */
#include "comm/comm.h"

#include "core/status.h"

crew_status crew_allgather_ranges(const crew_comm *c, float *buf, int64_t n, const int64_t *bounds, double timeout_s)
{
    if (c->ops->allgather_ranges) return c->ops->allgather_ranges(c->ctx, c->rank, buf, n, bounds, timeout_s);
    /* Each rank's range from it, in rank order: every rank makes the same calls. */
    for (int q = 0; q < c->size; q++)
        if (bounds[q + 1] > bounds[q])
            CREW_TRY(crew_broadcast(c, buf + bounds[q], bounds[q + 1] - bounds[q], CREW_COMM_F32, q, timeout_s));
    return CREW_OK;
}
