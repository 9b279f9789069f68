/* cli_mpi.c — crew under mpirun: the CLI starts MPI, hands the library a process group, and ends
 * MPI so that no process can hang: a run that succeeded finalises, one that failed aborts the whole
 * job (another process may be stuck where MPI_Finalize would wait for it for ever). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#ifdef CREW_HAVE_MPI
#include <mpi.h>
#endif

/* How long the processes may take to find each other at start. */
#define GROUP_TIMEOUT_S 60.0

static crew_process_group *group; /* the CLI's, for the one verb this process runs */
static int failed_together;       /* every process failed the same check: each can end cleanly */

void cli_mpi_failed_together(void) { failed_together = 1; }

/* Every process's id and host, gathered at the start: a process that a signal reaches while the
 * job ends can tell which of the others on its host is gone (cli_mpi_peer). */
typedef struct peer {
    long pid;
    char host[64];
} peer;
static peer *peers;
static int n_peers;

int cli_mpi_peer(int rank, long *pid, const char **host)
{
    if (rank < 0 || rank >= n_peers) return 0;
    *pid = peers[rank].pid;
    *host = peers[rank].host;
    return 1;
}

const crew_process_group *cli_group(void) { return group; }

int cli_mpi_begin(const char *verb, int *argc, char ***argv)
{
    if (!crew_launched_by_mpi()) return 0;
#ifdef CREW_HAVE_MPI
    /* --allreduce fast uses MPI_Iallreduce, which Open MPI's libnbc runs with an algorithm of its
     * own choosing unless told: on 2 processes its choice reached 0.25-0.7 of MPI_Allreduce, its
     * ring 0.8-1.0 (docs/PERFORMANCE.md). A user's own setting wins; other MPIs ignore it. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "crew %s: MPI_Init_thread failed\n", verb);
        return 1;
    }
    MPI_Comm world = MPI_COMM_WORLD;
    crew_status s = crew_group_open_mpi(&world, GROUP_TIMEOUT_S, &group);
    if (s) {
        int rc = cli_fail(verb, s);
        MPI_Abort(MPI_COMM_WORLD, rc);
        return rc;
    }
    /* Every process is there (the group's opening waited for all): a plain gather cannot hang. */
    int n = crew_group_size(group);
    peers = calloc((size_t)n, sizeof *peers);
    if (peers) {
        peer mine = {.pid = (long)getpid()};
        if (gethostname(mine.host, sizeof mine.host) != 0) snprintf(mine.host, sizeof mine.host, "?");
        mine.host[sizeof mine.host - 1] = '\0';
        if (MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, peers, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS)
            n_peers = n;
    }
    return 0;
#else
    (void)argc, (void)argv;
    fprintf(stderr, "crew %s: started by mpirun, but this crew was built without MPI (install libopenmpi-dev and "
                    "rebuild)\n", verb);
    return 2;
#endif
}

int cli_mpi_end(int rc)
{
#ifdef CREW_HAVE_MPI
    if (!group) return rc;
    crew_group_close(group);
    group = NULL;
    fflush(stdout);
    fflush(stderr);
    if (rc == 0 || failed_together) {
        MPI_Finalize();
        return rc;
    }
    MPI_Abort(MPI_COMM_WORLD, rc);
#endif
    return rc;
}
