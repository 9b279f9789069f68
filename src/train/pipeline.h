/* pipeline.h — pipeline model parallelism: the split of a model into stages, the schedules that
 * order each stage's passes, and the rank program of one stage.
 *
 * Ranks: a run of D replicas × K stages has D·K ranks; rank g = d·K + s is stage s of replica d.
 * Stage s of every replica sums its gradients with the same stage of the others only (the stage's
 * own communicator, of D ranks); activations and their gradients go between the neighbouring
 * stages of one replica (point-to-point on the run's communicator, of D·K ranks).
 *
 * Summation order (the determinism contract): each stage runs the backward passes of its
 * replica's micro-batches in micro-batch order, whatever the schedule, and sums their gradients in
 * that order (the stepper of step.h). Each micro-batch's passes are the whole model's passes over
 * that micro-batch cut at the stage boundaries, so a pipeline's weights equal one device
 * accumulating the same micro-batches, bit for bit. The rank program of a stage is the rank
 * program of every layout (rank.h): data parallelism is the case of one stage. */
#ifndef CREW_TRAIN_PIPELINE_H
#define CREW_TRAIN_PIPELINE_H

#include "crew.h"
#include "nn/model.h"
#include "telemetry/record.h"
#include "train/run.h"

/* One pass of one micro-batch (0-based, of the replica's accumulation micro-batches). */
typedef struct crew_pipe_op {
    int backward;   /* 0: forward */
    int micro;
} crew_pipe_op;

/* Stage `stage` of `stages`'s 2·micro passes, in the order it runs them, into ops [2·micro]. */
void crew_pipeline_ops(crew_pipeline_schedule schedule, int stages, int stage, int micro, crew_pipe_op *ops);
/* The most micro-batches in flight on that stage (forward done, backward not yet): the sets of
 * activations it keeps. Micro-batch j uses set j mod that. */
int crew_pipeline_slots(crew_pipeline_schedule schedule, int stages, int stage, int micro);
/* The ideal bubble fraction of a schedule of `stages` stages and `micro` micro-batches with
 * stages of equal cost: (K − 1) / (m + K − 1), the same for both schedules. */
double crew_pipeline_ideal_bubble(int stages, int micro);

/* "0-3,4-9": each stage's layers, ranges in order that together cover every layer (a trailing
 * softmax may be left out: it joins the last stage). Fills first[0 .. stages] and *stages; a bad
 * string is a CREW_CODE_INVALID_ARGUMENT error that quotes it. */
crew_status crew_pipeline_split_parse(const crew_model *m, const char *text, int first[CREW_MAX_PIPELINE_STAGES + 1],
                                      int *stages);
/* K contiguous stages whose largest training FLOPs (plus each layer's output size, the cost of
 * the passes that are not GEMMs) is as small as it can be. */
crew_status crew_pipeline_split_balanced(const crew_model *m, int stages, int first[CREW_MAX_PIPELINE_STAGES + 1]);
/* Fills the plan's pipeline fields from the options (plan->stages = 1 without a pipeline) and
 * checks what a pipeline cannot do yet. */
crew_status crew_pipeline_plan(const crew_model *m, const crew_fit_options *o, const crew_compile_options *c,
                               crew_fit_plan *p);
/* "stage 0: layers 0-3 (conv2d_1 .. max_pooling2d_1), stage 1: ..." */
void crew_pipeline_describe(const crew_model *m, const crew_fit_plan *p, char *buf, size_t len);

#endif
