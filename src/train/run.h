/* run.h — one fit as its ranks see it, and the seam between whatever starts ranks and the rank
 * program.
 *
 * A launcher (launch_threads.c: threads of this process; an MPI launcher, one rank per process,
 * plugs in beside it) opens one device and one loader per rank, gives every rank a handle of one
 * communicator, and runs crew_rank_main for each with a crew_rank_ctx. The rank program takes
 * everything from that context: it builds its replica on its own device, feeds it from the loader
 * of its own micro-batches, and touches tensors only through the backend. What a run shares (crew_run) is
 * read-only while ranks run; what it produces goes to rank 0's sinks alone, so nothing above
 * assumes that ranks share memory. */
#ifndef CREW_TRAIN_RUN_H
#define CREW_TRAIN_RUN_H

#include <pthread.h>

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

/* What a run produces; only rank 0 writes here (other ranks get NULL), inside sink sections
 * (crew_rank_sink_enter in rank.h) under `lock`. */
typedef struct crew_run_sinks {
    pthread_mutex_t lock;
    crew_model *model;              /* the caller's: the trained values are copied back into it */
    crew_monitor *monitor;
    crew_fit_result *result;
    double train_s;                 /* time in training steps, evaluation excluded */
    double last_checkpoint_time;    /* crew_now() of the last checkpoint */
    /* set by the launcher when rank 0 never returned: */
    int rank0_left;                 /* 1: its thread was left behind; the launcher holds `lock` for good */
    int monitor_lost;               /* 1: rank 0 stopped inside a sink section, so the monitor may be
                                       half-way through a write: nobody may touch it (or `lock`) again */
} crew_run_sinks;

struct crew_loader;

/* What a launcher hands each rank program. */
typedef struct crew_rank_ctx {
    int rank, size;
    crew_backend device;            /* opened for this rank alone */
    crew_comm comm;                 /* its handle of the run's communicator */
    struct crew_loader *loader;     /* this rank's micro-batches of every step (crew_run_open_loader) */
    const crew_run *run;
    crew_run_sinks *sinks;          /* rank 0: the run's outputs; NULL on every other rank */
    /* The first rank of a process other than process 0: that process's caller's model, into which it
     * copies the trained values at the end (without a pipeline every replica holds all of them), so
     * that every process's caller ends with the weights; NULL on every other rank. */
    crew_model *own_model;
    /* A pipeline (run->plan.stages > 1, pipeline.h): this rank is stage `stage` of replica
     * `replica`, and stage_comm joins it to the same stage of the other replicas (rank `replica`
     * of plan.devices). Without one: stage 0, replica = rank, stage_comm unused. */
    int stage, replica;
    crew_comm stage_comm;
} crew_rank_ctx;

/* The loader of rank `rank` of `size`: its micro-batches r·k … r·k+k−1 of every step, with its share
 * of the run's loader threads (at least one), bound to cpus[0 .. n_cpus) when n_cpus > 0 (the
 * rank's own, plan.bind_cores). For launchers: the launcher owns it, so that it can stop it
 * (crew_loader_shutdown) when the rank never returns. */
crew_status crew_run_open_loader(const crew_run *run, int rank, int size, const crew_backend *device,
                                  const int *cpus, int n_cpus, struct crew_loader **out);
/* Whether the ranks on `device` read their micro-batches' inputs where the loader left them (the
 * backend's in_place) instead of copying them: data-parallel ranks (no pipeline) on a device whose
 * ops read host memory. Such a rank holds a step's loader slots until the step ends, so its loader
 * keeps one step more in its ring than the prefetch depth. */
int crew_run_inputs_in_place(const crew_run *run, const crew_backend *device);

/* An epoch's figures from its steps' summed loss and right answers over the global batches (the
 * test figures NaN until evaluated). */
crew_epoch_info crew_run_epoch_info(const crew_run *run, int epoch, int64_t steps, double wall_s, double loss_sum,
                                    double correct_sum);
/* Rank 0, inside its sink section: the epoch into the result, the monitor and the caller's callback. */
/* Rank 0 (sinks non-NULL; else 0): whether a checkpoint is due after 1-based `step`: every N
 * steps, every so many seconds, when the caller cancels (stopping), and at the end of the run. */
int crew_run_checkpoint_due(const crew_run *run, const crew_run_sinks *sinks, int64_t step, int stopping);
crew_status crew_run_sinks_epoch(crew_run_sinks *sinks, const crew_fit_options *o, const crew_epoch_info *info);

/* The rank program: trains this rank's share of every step of the run. */
crew_status crew_rank_main(const crew_rank_ctx *ctx);

/* The threads launcher: run->plan.devices ranks, each on a thread of its own with a device of
 * run->plan.device_kind and a handle of one in-process communicator (rank 0's thread also runs
 * the caller's callbacks); the calling thread supervises. With a process group
 * (run->opts->group) it starts this process's share, devices / processes ranks numbered from
 * process × that, joined to the other processes' by the MPI communicator (comm_mpi.h); the sinks
 * are global rank 0's, so only process 0's are used. Returns the first rank's own failure (a
 * rank that failed by itself, not one told that another failed). When a rank fails, the others
 * get a short grace to return; a rank that never does (a stopped thread, a stuck driver) is left
 * behind with what it may still touch, and the run ends anyway, with an error naming it. */
crew_status crew_launch_threads(const crew_run *run, crew_run_sinks *sinks);

#endif
