/* stop.h — how a training process stops on SIGINT and SIGTERM (docs/CHECKPOINTS.md, "Stopping a
 * run"). Every process of a run, under mpirun each rank, installs the same handlers:
 * - the first SIGINT or SIGTERM sets the run's cancel flag (crew_fit_options.cancel): the run stops
 *   after the step, rank 0 writes a checkpoint and says how to resume;
 * - a later SIGTERM changes nothing (a scheduler and mpirun may both send one);
 * - a later SIGINT (Ctrl-C again) stops the process at once, without a checkpoint of its step;
 * - a stop that has not ended --stop-grace seconds after the first signal is given up: the process
 *   says so (rank 0: the newest checkpoint and the command that resumes from it) and exits 1; the
 *   other ranks 2 s later, so that rank 0's line comes before a launcher ends the job.
 * A thread of this module says and times the stop, so that the handler itself only sets the flag
 * and writes one byte to a pipe (async-signal-safe). */
#ifndef CREW_CLI_STOP_H
#define CREW_CLI_STOP_H

#include <stddef.h>

typedef struct cli_stop {
    double grace_s;          /* --stop-grace: seconds from the first signal to giving up */
    int rank;                /* this process's MPI rank; 0 when alone */
    int lead;                /* rank 0: it says the stop, the newest checkpoint, the resume command */
    const char *checkpoints; /* lead: RUN_DIR/checkpoints */
    const char *resume;      /* lead: the command that resumes the run ("crew train ... --resume R") */
} cli_stop;

/* The flag the handlers set, for crew_fit_options.cancel. */
volatile int *cli_stop_flag(void);
/* Installs the handlers and starts the thread that says and times the stop (the strings are
 * copied). 0, or -1 when the thread could not start: the handlers are in place, without the grace. */
int cli_stop_arm(const cli_stop *c);
/* The newest complete checkpoint in dir (RUN_DIR/checkpoints) into buf, "" when there is none. */
void cli_stop_newest_checkpoint(const char *dir, char *buf, size_t len);

#endif
