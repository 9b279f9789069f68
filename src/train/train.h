/* train.h — internals of the training loop shared by fit, evaluate and verify. */
#ifndef CREW_TRAIN_TRAIN_H
#define CREW_TRAIN_TRAIN_H

#include "comm/comm.h"
#include "crew.h"
#include "nn/model.h"
#include "optim/optimizer.h"

crew_status crew_check_dataset(const crew_model *m, const crew_dataset *d);
/* The plan of options already resolved (struct_size checked, defaults filled in); o->resume is
 * not looked at. */
crew_status crew_plan_fit_resolved(crew_model *m, const crew_dataset *train, const crew_fit_options *o,
                                   crew_fit_plan *p);
crew_lr_plan crew_lr_plan_of(const crew_fit_plan *p, const crew_optimizer_spec *s);

/* Loss and accuracy of samples [lo, hi) of d on one replica, in batches of `batch` rows;
 * returns the sums (not means). */
crew_status crew_eval_range(crew_model *m, const crew_dataset *d, int64_t lo, int64_t hi, int64_t batch,
                            double *loss_sum, double *correct);

struct crew_checkpoint_state;
/* The options of a resumed run: the checkpoint's global batch, per-device batch, seed and length
 * replace the caller's; an error says which device counts can share the global batch when
 * o->devices cannot. */
crew_status crew_resume_options(crew_fit_options *o, const struct crew_checkpoint_state *st);
/* The plan of a checkpoint's run on o's devices (crew_resume_options applied to o), with the
 * checkpoint's learning-rate plan; a dataset of another length is refused. */
crew_status crew_plan_resumed(crew_model *m, const crew_dataset *train, crew_fit_options *o,
                              const struct crew_checkpoint_state *st, crew_fit_plan *p);

#endif
