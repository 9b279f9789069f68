/* checkpoint.h — saving a run so that a crash loses minutes, never the run.
 *
 * ROOT/step-XXXXXXXX/ holds (docs/CHECKPOINTS.md):
 *   model.safetensors      parameters and state (the weights format: "<layer>.<param>")
 *   optimizer.safetensors  the optimizer's slots ("slot0", "slot1": [n_params]) and "t" (updates)
 *   state.json             step, epoch and position in it, the resolved plan, the files' sizes and
 *                          XXH3-64 checksums
 *   COMPLETE               written last: the checksum of state.json
 * written into step-XXXXXXXX.tmp-<pid>/, fsynced, and renamed, so a crash mid-write leaves either
 * nothing or a complete checkpoint, never a damaged one that looks complete.
 *
 * Nothing else needs saving for an exact resume: every random number (dropout, the epoch's
 * sample order) is a pure function of (seed, step or epoch, sample), so the position in the run
 * is the whole RNG state. */
#ifndef CREW_TRAIN_CHECKPOINT_H
#define CREW_TRAIN_CHECKPOINT_H

#include <stddef.h>

#include "crew.h"
#include "nn/model.h"
#include "optim/optimizer.h"

typedef struct crew_checkpoint_state {
    int64_t step;        /* optimizer steps completed */
    crew_fit_plan plan;  /* as the run was planned when saved */
    crew_lr_plan lr;
    int has_options;     /* read: 1 when state.json holds plan.threads_per_device, augment, pad_last_batch,
                            sync_batch_norm and on_nan (0: written by an older crew) */
    /* The CPU GEMM library of the crew that wrote it (crew_blas_describe), which rounds every
     * product: a resume under another one goes on, but not bit for bit. Written: this crew's when
     * left "" (a test sets another); read: "" when not recorded (an older crew). */
    char gemm[160];
} crew_checkpoint_state;

/* Writes ROOT/step-<step>/ from m and opt (on any device: their values are downloaded) and
 * removes all but the newest `keep` complete checkpoints. path receives the directory once it is
 * committed (or when that step was saved already); after a failure path is left as it was, so it
 * still names the last checkpoint that exists. */
crew_status crew_checkpoint_write(const char *root, const crew_model *m, const crew_optimizer *opt,
                                  const crew_checkpoint_state *st, int keep, char *path, size_t path_len);

/* Loads the newest usable checkpoint under ROOT into m (parameters and state), opt (its state and
 * update count; opt lives on m's device, made for the model's compiled optimizer) and st.
 * A damaged checkpoint (no COMPLETE marker, state.json not matching it, a file missing or failing
 * its size or checksum) is set aside as step-XXXXXXXX.refused-<time> and the next older one is
 * tried. An intact checkpoint that cannot be used (it belongs to another model or optimizer, or a
 * state.json this crew cannot read) ends the search with an error naming what differs, and is left
 * exactly as it was: the run it belongs to can still be resumed with the right model. note says
 * which was used and what was set aside. */
crew_status crew_checkpoint_resume(const char *root, crew_model *m, crew_optimizer *opt, crew_checkpoint_state *st,
                                   char *note, size_t note_len);

/* The state of the newest checkpoint under ROOT whose marker and state.json check out (its other
 * files are checked when it is loaded). */
crew_status crew_checkpoint_newest_state(const char *root, crew_checkpoint_state *st);

/* Reads and checks one checkpoint directory (state only, no model): for tools and tests. */
crew_status crew_checkpoint_read_state(const char *dir, crew_checkpoint_state *st);

#endif
