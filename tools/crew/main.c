/* main.c — the crew command line: dispatches to one file per verb. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
    int mpi;                    /* runs across processes under mpirun */
} verbs[] = {
    {"prep", cli_prep, "convert a dataset into crew's ready-to-use format", 0},
    {"train", cli_train, "train a model file on a dataset", 1},
    {"eval", cli_eval, "evaluate saved weights on a dataset's test split", 0},
    {"sample", cli_sample, "continue a prompt with text from a trained language model", 0},
    {"bench-data", cli_bench_data, "measure how fast the loader alone prepares batches", 0},
    {"verify", cli_verify, "prove that N replicas compute what one replica computes", 1},
    {"report", cli_report, "write a run directory's metrics as a self-contained HTML report", 0},
    {"plan", cli_plan, "work out the memory a model needs per device, and what to do if it does not fit", 0},
    {"scale", cli_scale, "measure scaling over replica counts, project it, and say how many devices are worth it", 1},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: crew VERB [options]   (crew VERB --help for a verb's options)\n\nverbs:\n");
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) fprintf(f, "  %-8s %s\n", verbs[i].name, verbs[i].what);
    fprintf(f, "\nexit status: 0 success, 1 the run failed, 2 bad usage or bad input\n");
}

int main(int argc, char **argv)
{
    /* A write past a file-size limit fails with EFBIG and is reported, instead of killing us. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        char blas[256];
        crew_blas_describe(blas, sizeof blas);
        char mpi[256];
        crew_mpi_describe(mpi, sizeof mpi);
        char cuda[1024];
        crew_cuda_describe(cuda, sizeof cuda);
        char nccl[128];
        crew_nccl_describe(nccl, sizeof nccl);
        printf("crew %s\nBLAS: %s\nMPI: %s%s\nCUDA: %s\nNCCL: %s\ndevice kinds:\n", crew_version(), blas, mpi,
               crew_have_mpi() ? " (mpirun -np P crew train ...: P processes)" : "", cuda, nccl);
        const char *about;
        for (int i = 0; crew_device_kind_name(i, &about); i++) printf("  %-12s %s\n", crew_device_kind_name(i, NULL), about);
        cli_warn_slow_blas("--version");
        return 0;
    }
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
        if (strcmp(argv[1], verbs[i].name) != 0) continue;
        /* Under mpirun, the verbs that train start MPI; every process runs the same command. */
        if (verbs[i].mpi) {
            int rc = cli_mpi_begin(verbs[i].name, &argc, &argv);
            if (rc) return rc;
            return cli_mpi_end(verbs[i].run(argc - 1, argv + 1));
        }
        return verbs[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "crew: unknown verb '%s' (crew --help lists them)\n", argv[1]);
    return 2;
}
