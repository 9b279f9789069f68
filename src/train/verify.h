/* verify.h — crew verify's internals: what each run leaves behind for the judgement
 * (verify_compare.c); the entry point with test seams is in hooks.h. */
#ifndef CREW_TRAIN_VERIFY_H
#define CREW_TRAIN_VERIFY_H

#include "crew.h"
#include "nn/model.h"
#include "train/hooks.h"

/* One run's outcome, downloaded to the host. */
typedef struct crew_verify_values {
    crew_model *m;          /* the trained replica (rank 0's values) */
    float *first_grads;     /* [n_params] the all-reduced gradient of step 1, before the update */
    float *moments;         /* [2 × n_params] the optimizer's moments at the end */
    float first_loss;       /* the loss of step 1 */
    double slowest_step_s;  /* its slowest step */
} crew_verify_values;

void crew_verify_values_free(crew_verify_values *v);

/* max over tensors of max |a − b| / max |b|; *equal: parameters, optimizer moments and (with
 * with_state) the model's state all bitwise the same. */
crew_status crew_verify_compare(const crew_verify_values *a, const crew_verify_values *b, int with_state, int *equal,
                                double *max_rel);

/* The first-step check of run x (named `label`) against the full batch c, with global batch g:
 * updates res->first_step_ratio and the tensor it names when x holds the largest ratio so far, and
 * returns 1 when every difference of x is within its bound. */
int crew_verify_first_step(const crew_verify_values *x, const crew_verify_values *c, int64_t g, const char *label,
                           crew_verify_result *res);

/* crew_model_verify's judgement of (a) against the full-batch run (c): each tensor's relative
 * difference against max(res->tolerance, 30 × its rounding spread), the spread being the larger
 * of its differences between (c) and the rounding references d and e (either may be NULL; both
 * NULL: the tolerance alone). Sets max_rel_diff_full_batch, rounding_spread, allowed and
 * decided_by* (the tensor nearest its bound) and full_batch_ok. With the reference g (the full
 * batch with every GEMM summed in (e)'s blocks; else NULL), e's spread is held to 10 times the
 * larger of d's and g's, which a bug in the replicas' machinery cannot move (other_blocks_*).
 * g and h (the full batch summed in (a)'s own blocks; else NULL) widen the spread too. */
crew_status crew_verify_judge(const crew_model *a, const crew_model *c, const crew_model *d, const crew_model *e,
                              const crew_model *g, const crew_model *h, crew_verify_result *res);

#endif
