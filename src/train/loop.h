/* loop.h — one replica's training loop (loop.c) and the run it belongs to (fit.c). */
#ifndef CREW_TRAIN_LOOP_H
#define CREW_TRAIN_LOOP_H

#include <pthread.h>

#include "telemetry/monitor.h"
#include "train/step.h"
#include "train/train.h"

/* Doubles per replica in the per-step metrics all-reduce: loss, correct, stop, then the times. */
#define CREW_METRIC_FIELDS (3 + CREW_STEP_TIMES_FIELDS)

typedef struct fit_run {
    const crew_dataset *train;
    const crew_fit_options *opts; /* the caller's, with a resumed run's plan settings in place */
    crew_fit_options resolved;    /* the storage opts points at */
    crew_fit_plan plan;
    crew_lr_plan lr;
    crew_fit_result *result;
    crew_monitor *monitor;      /* rank 0 only touches it */
    struct crew_loader *loader; /* shared by the replicas: each takes its own micro-batches */
    crew_fit_faults faults;     /* all off unless a test asked */
    double timeout_s;
    double bucket_mb;
    int sync_bn;
    int64_t drift_every;        /* 0: off */
    double train_s;             /* time in training steps, evaluation excluded (rank 0's clock) */
    int64_t start_step;         /* steps already done (a resumed run) */
    double last_checkpoint_time; /* crew_now() of the last checkpoint (rank 0) */
} fit_run;

typedef struct replica {
    int rank;
    crew_model *m;
    crew_comm comm;
    fit_run *run;
    crew_comm_worker worker;
    int has_worker;             /* only with more than one replica */
    crew_stepper stepper;
    double *metrics;            /* [replicas × METRIC_FIELDS] all-reduced each step */
    crew_step_times *times;     /* [replicas] rank 0's copy of everyone's times */
    crew_status status;
    pthread_t thread;
} replica;

/* Runs every epoch of the plan on this replica; rank 0 reports. */
crew_status crew_replica_train(replica *r);

#endif
