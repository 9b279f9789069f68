/* comm_mpi.h — the communicator of a run across processes: each process's ranks are its threads
 * (the in-process communicator), and the processes meet over MPI (src/comm/mpi/). Compiled with
 * or without MPI: without it, creating one fails saying so (mpi_missing.c).
 *
 * Ranks are numbered process by process: global rank = process × T + local rank, T ranks in every
 * process. Every collective keeps the in-process communicator's contract: sums run in global rank
 * order (and within a rank over its k inputs in order), so P processes of T threads compute the
 * same bits as P·T threads, or as one replica accumulating P·T·k micro-batches. */
#ifndef CREW_COMM_COMM_MPI_H
#define CREW_COMM_COMM_MPI_H

#include <stddef.h>

#include "comm/comm.h"

typedef struct crew_mpi_comm crew_mpi_comm;

/* The run's communicator over the processes of g, this process's ranks being lc's `local_size`
 * threads (lc stays the caller's and must outlive it). */
crew_status crew_mpi_comm_create(const crew_process_group *g, crew_local_comm *lc, int local_size,
                                 crew_mpi_comm **out);
/* A communicator over some of g's processes (a pipeline stage's replicas): members[0 .. n_members),
 * in the order of its ranks (member q's local ranks are its ranks q · local_size on), this
 * process among them. Every member creates it with the same members, local_size and id; the
 * communicators a process has open at once have different ids (crew_mpi_comm_create's is 0), so
 * that their messages never meet. Its all-reduces are always ordered: MPI's own would span every
 * process of g (crew_mpi_comm_set_unordered leaves it so). Point to point (send, recv) works on
 * either kind: between local ranks through lc, across processes over MPI. */
crew_status crew_mpi_comm_create_subset(const crew_process_group *g, crew_local_comm *lc, int local_size,
                                        const int *members, int n_members, int id, crew_mpi_comm **out);
/* Local rank i's handle: its rank is the global one. */
crew_comm crew_mpi_comm_rank(crew_mpi_comm *mc, int local_rank);
void crew_mpi_comm_free(crew_mpi_comm *mc);
/* What its errors call a rank when they name the processes that did not answer ("MPI rank 1
 * (host h, replicas 2-3)"): "replica" by default, a data-parallel run's ranks; "rank" for a
 * pipeline's run communicator. A string that outlives it. */
void crew_mpi_comm_name_ranks(crew_mpi_comm *mc, const char *unit);
/* on: its all-reduces across processes are MPI's own (MPI_Iallreduce, polled against the
 * deadline) after each process's ordered sum of its own inputs: faster, but the order of the sums
 * across processes is the MPI library's, so results may change with the process count; and a
 * missing process is reported, not named. Off (the default): crew's ordered algorithm. */
void crew_mpi_comm_set_unordered(crew_mpi_comm *mc, int on);

/* Every process's `bytes` of `mine`, into all[process · bytes], within timeout_s; a process that
 * never sends is named. For agreeing on a run before it starts. */
crew_status crew_group_allgather_bytes(const crew_process_group *g, const void *mine, void *all, size_t bytes,
                                       double timeout_s, const char *what);

#endif
