/* checkpoint_json.h — state.json of a checkpoint, to and from crew_checkpoint_state. */
#ifndef CREW_TRAIN_CHECKPOINT_JSON_H
#define CREW_TRAIN_CHECKPOINT_JSON_H

#include <stdint.h>

#include "train/checkpoint.h"

#define CREW_CHECKPOINT_FILES 2 /* model.safetensors, optimizer.safetensors */
extern const char *const crew_checkpoint_file_names[CREW_CHECKPOINT_FILES];

typedef struct crew_checkpoint_file_sum {
    int64_t bytes;
    uint64_t xxh3;
} crew_checkpoint_file_sum;

/* A malloc'd JSON text: st, a description of m (its input, layers, loss and optimizer) and sums. */
char *crew_checkpoint_state_json(const crew_checkpoint_state *st, const crew_model *m,
                                 const crew_checkpoint_file_sum *sums);
/* Parses state.json text; `what` names the file in errors. */
crew_status crew_checkpoint_state_parse(const char *text, const char *what, crew_checkpoint_state *st,
                                        crew_checkpoint_file_sum *sums);
/* Whether state.json text describes m: an error naming the first difference (the input shape, the
 * layer count, a layer's key, the loss, an optimizer key) when it does not. A state.json without a
 * description (an older crew's) is not checked here; its tensors still are, when they load. */
crew_status crew_checkpoint_check_model(const char *text, const char *what, const crew_model *m);

#endif
