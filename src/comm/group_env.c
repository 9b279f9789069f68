/* group_env.c — whether an MPI launcher started this process: needs no MPI library. */
#include <stdlib.h>

#include "crew.h"

int crew_launched_by_mpi(void)
{
    /* Open MPI's mpirun, MPICH's (and Intel MPI's) Hydra, and any PMIx launcher (Slurm's srun). */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}
