/* comm_nccl.h — the communicator of ranks that each own a GPU: NCCL behind comm.h's table.
 *
 * Built where CMake finds NCCL beside the CUDA toolkit (CREW_HAVE_NCCL); src/comm/nccl/.
 *
 * Determinism. The default collectives are crew's ordered ones, made of NCCL's point-to-point
 * sends (docs/ARCHITECTURE.md, "NCCL"): every rank sends each rank that rank's slice of its
 * inputs, the owner of a slice sums what it received in (rank, micro-batch) order on its GPU, and
 * the sums go back to every rank. The result is the in-process communicator's bit for bit, so N
 * GPUs equal one GPU accumulating N micro-batches, and the traffic is a ring all-reduce's (each
 * value crosses the links twice). With `unordered` set, all-reduces are NCCL's own (ncclAllReduce:
 * faster, its order of the sums, so the last bits may change with the GPU count and topology).
 *
 * Lifecycle, as NCCL's: a unique id made once (crew_nccl_id_new, by process 0 of a group) and
 * handed to every process (the launcher: in memory, or over MPI); each process then opens its
 * ranks together (crew_nccl_clique_create: one thread, one NCCL group, non-blocking), gets one
 * handle per rank, and frees the clique after the ranks' last collective.
 *
 * Deadlines. Communicators are non-blocking (ncclConfig_t.blocking = 0): a collective is enqueued
 * on the rank's communication stream, after the work on its compute stream so far, and polled
 * until it completes, fails, or its deadline passes. Then the communicator is aborted
 * (ncclCommAbort) and the error names the ranks of this process that never arrived, or says that
 * the missing one is in another process. Each rank's handle is used by one thread at a time
 * (comm_worker.h), as NCCL requires. */
#ifndef CREW_COMM_COMM_NCCL_H
#define CREW_COMM_COMM_NCCL_H

#include <stddef.h>

#include "comm/comm.h"

/* ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), carried as plain bytes by the launcher. */
#define CREW_NCCL_ID_BYTES 128
typedef struct crew_nccl_id {
    unsigned char bytes[CREW_NCCL_ID_BYTES];
} crew_nccl_id;

typedef struct crew_nccl_clique crew_nccl_clique;

crew_status crew_nccl_id_new(crew_nccl_id *out);

/* This process's ranks first .. first + n − 1 of `world`, rank first + i on devices[i] (a CUDA
 * backend; no two on the same GPU: NCCL refuses that). Every process of the run calls it with the
 * same id and world, at about the same time; a process missing for timeout_s fails it. */
crew_status crew_nccl_clique_create(const crew_nccl_id *id, int world, int first, int n, const crew_backend *devices,
                                    int unordered, double timeout_s, crew_nccl_clique **out);
/* Local rank i's handle (global rank first + i). */
crew_comm crew_nccl_clique_rank(crew_nccl_clique *q, int i);
/* Ends every rank's communicator (aborted when a collective failed, else destroyed). */
void crew_nccl_clique_free(crew_nccl_clique *q);

#endif
