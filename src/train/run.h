/* run.h — one fit as its ranks see it, and the seam between whatever starts ranks and the rank
 * program.
 *
 * A launcher (launch_threads.c: threads of this process; an MPI launcher, one rank per process,
 * plugs in beside it) opens one device per rank, gives every rank a handle of one communicator,
 * and runs crew_rank_main for each with a crew_rank_ctx. The rank program takes everything from
 * that context: it builds its replica on its own device, feeds it from a loader of its own
 * micro-batches, and touches tensors only through the backend. What a run shares (crew_run) is
 * read-only while ranks run; what it produces goes to rank 0's sinks alone, so nothing above
 * assumes that ranks share memory. */
#ifndef CREW_TRAIN_RUN_H
#define CREW_TRAIN_RUN_H

#include "backend/backend.h"
#include "comm/comm.h"
#include "crew.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "telemetry/monitor.h"
#include "train/hooks.h"

typedef struct crew_run {
    const crew_dataset *train;
    const crew_fit_options *opts;   /* resolved: defaults filled in, a resumed run's plan settings in place */
    crew_fit_plan plan;
    crew_lr_plan lr;
    const crew_model *start;        /* the caller's model: the layers, and the starting point */
    const crew_optimizer *start_opt; /* a resumed run's optimizer state on start's device; NULL: fresh */
    int64_t start_step;             /* steps already done (a resumed run) */
    crew_fit_hooks hooks;
    /* resolved knobs */
    double timeout_s;
    double bucket_mb;
    int sync_bn;
    int64_t drift_every;            /* 0: off */
} crew_run;

/* What a run produces; only rank 0 writes here (other ranks get NULL). */
typedef struct crew_run_sinks {
    crew_model *model;              /* the caller's: the trained values are copied back into it */
    crew_monitor *monitor;
    crew_fit_result *result;
    double train_s;                 /* time in training steps, evaluation excluded */
    double last_checkpoint_time;    /* crew_now() of the last checkpoint */
} crew_run_sinks;

/* What a launcher hands each rank program. */
typedef struct crew_rank_ctx {
    int rank, size;
    crew_backend device;            /* opened for this rank alone */
    crew_comm comm;                 /* its handle of the run's communicator */
    const crew_run *run;
    crew_run_sinks *sinks;          /* rank 0: the run's outputs; NULL on every other rank */
} crew_rank_ctx;

/* The rank program: trains this rank's share of every step of the run. */
crew_status crew_rank_main(const crew_rank_ctx *ctx);

/* The threads launcher: run->plan.devices ranks as threads of this process (rank 0 on the calling
 * thread, which therefore also runs the caller's callbacks), each with a device of
 * run->plan.device_kind and a handle of one in-process communicator. Returns the first rank's
 * own failure (a rank that failed by itself, not one told that another failed). */
crew_status crew_launch_threads(const crew_run *run, crew_run_sinks *sinks);

#endif
