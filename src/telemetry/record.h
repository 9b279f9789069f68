/* record.h — what the training loop tells telemetry about a step. */
#ifndef CREW_TELEMETRY_RECORD_H
#define CREW_TELEMETRY_RECORD_H

#include <stdint.h>

/* Where one replica's step went, in seconds. */
typedef struct crew_step_times {
    double data_s;          /* gathering (or waiting for) its batches */
    double forward_s;
    double backward_s;      /* the loss included */
    double comm_exposed_s;  /* waiting for gradient all-reduces after backward ended */
    double comm_hidden_s;   /* all-reduce time that overlapped backward */
    double optimizer_s;     /* the finiteness check and the update */
} crew_step_times;

#define CREW_STEP_TIMES_FIELDS 6

static inline double crew_step_compute_s(const crew_step_times *t) { return t->forward_s + t->backward_s; }

/* One optimizer step of the whole run, as rank 0 sees it after the metrics all-reduce. */
typedef struct crew_step_record {
    int64_t step;                   /* 1-based */
    int epoch;                      /* 0-based */
    double time;                    /* Unix time at the end of the step */
    float loss, accuracy, lr;       /* over the global batch; lr applied */
    int64_t global_batch;
    double step_s;                  /* rank 0's wall time for the step */
    int skipped;                    /* the update was skipped (non-finite gradients) */
    int n_replicas;
    const crew_step_times *replicas; /* [n_replicas] */
    /* The gradient noise scale's inputs (noise_scale.h), NaN when the step did not measure them:
     * the mean |G_b|² of the step's micro-batches of small_batch samples each (their mean
     * gradients), and |G_B|² of its whole global batch. */
    double grad_sq_small, grad_sq_big;
    int64_t small_batch;
} crew_step_record;

/* One pass of a pipeline stage in a sampled step: seconds since the step began on the earliest
 * stage. */
typedef struct crew_pipe_timing {
    int stage, micro, backward;
    double start_s, end_s;
} crew_pipe_timing;

/* A pipelined step's timeline, on the stages of replica 0 (metrics.jsonl's "pipeline" line). */
typedef struct crew_pipeline_record {
    int64_t step;
    int stages, replicas, micro_batches;
    int gpipe;                      /* 1: the GPipe schedule, 0: 1F1B */
    double ideal_bubble, bubble;    /* (K − 1) / (m + K − 1); the measured share of idle stage time */
    double step_s;
    int slowest_stage;
    int n_ops;
    const crew_pipe_timing *ops;    /* [n_ops] */
} crew_pipeline_record;

#endif
