/* mpi_missing.c — the process-group calls of a build without MPI (CMake found none): a group
 * cannot be made, so none of the others is ever reached with one. */
#include <stdio.h>

#include "comm/comm_mpi.h"
#include "core/status.h"

static crew_status no_mpi(void)
{
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "this crew was built without MPI: install libopenmpi-dev (or "
                       "libmpich-dev) and rebuild to run across processes");
}

int crew_have_mpi(void) { return 0; }

void crew_mpi_describe(char *buf, size_t len) { snprintf(buf, len, "none"); }

crew_status crew_group_open_mpi(const void *mpi_comm, double timeout_s, crew_process_group **out)
{
    (void)mpi_comm;
    (void)timeout_s;
    *out = NULL;
    return no_mpi();
}

crew_status crew_mpi_start(double timeout_s, crew_process_group **out)
{
    (void)timeout_s;
    *out = NULL;
    return no_mpi();
}

void crew_mpi_stop(int rc) { (void)rc; }

crew_status crew_group_broadcast(const crew_process_group *g, void *buf, size_t bytes, double timeout_s,
                                 const char *what)
{
    (void)buf, (void)bytes, (void)timeout_s, (void)what;
    return g ? no_mpi() : CREW_OK;
}

int crew_group_rank(const crew_process_group *g) { (void)g; return 0; }
int crew_group_size(const crew_process_group *g) { (void)g; return 1; }
const char *crew_group_host(const crew_process_group *g) { (void)g; return ""; }
int crew_group_hosts(const crew_process_group *g) { (void)g; return 1; }

crew_status crew_group_agree(const crew_process_group *g, const char *what, const char *value, double timeout_s)
{
    (void)g, (void)what, (void)value, (void)timeout_s;
    return no_mpi();
}

void crew_group_close(crew_process_group *g) { (void)g; }

crew_status crew_mpi_comm_create(const crew_process_group *g, crew_local_comm *lc, int local_size, crew_mpi_comm **out)
{
    (void)g, (void)lc, (void)local_size;
    *out = NULL;
    return no_mpi();
}

crew_status crew_mpi_comm_create_subset(const crew_process_group *g, crew_local_comm *lc, int local_size,
                                        const int *members, int n_members, int id, crew_mpi_comm **out)
{
    (void)g, (void)lc, (void)local_size, (void)members, (void)n_members, (void)id;
    *out = NULL;
    return no_mpi();
}

crew_comm crew_mpi_comm_rank(crew_mpi_comm *mc, int local_rank)
{
    (void)mc, (void)local_rank;
    return (crew_comm){0};
}

void crew_mpi_comm_free(crew_mpi_comm *mc) { (void)mc; }
void crew_mpi_comm_set_unordered(crew_mpi_comm *mc, int on) { (void)mc, (void)on; }
void crew_mpi_comm_name_ranks(crew_mpi_comm *mc, const char *unit) { (void)mc, (void)unit; }

crew_status crew_group_allgather_bytes(const crew_process_group *g, const void *mine, void *all, size_t bytes,
                                       double timeout_s, const char *what)
{
    (void)g, (void)mine, (void)all, (void)bytes, (void)timeout_s, (void)what;
    return no_mpi();
}
