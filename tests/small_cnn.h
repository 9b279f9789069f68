/* small_cnn.h — the small CNN of the data-parallel tests, on synthetic.h's 12x12 images:
 * conv 4 (3x3, same) → [batch norm] → relu → max pool → flatten → dense 16 relu → [dropout] →
 * dense 4. */
#ifndef CREW_TESTS_SMALL_CNN_H
#define CREW_TESTS_SMALL_CNN_H

#include "check.h"
#include "crew.h"
#include "synthetic.h"

/* dropout: its rate, 0 for none; opt: the optimizer (the loss is softmax cross-entropy). */
static inline crew_model *small_cnn(int batch_norm, float dropout, const crew_optimizer_spec *opt)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    if (!m) return NULL;
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {3, 3},
                                                  .padding = CREW_PAD_SAME,
                                                  .activation = batch_norm ? CREW_ACT_NONE : CREW_ACT_RELU}));
    if (batch_norm) {
        CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_BATCH_NORM}));
        CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_ACTIVATION, .activation = CREW_ACT_RELU}));
    }
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_MAX_POOL2D}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 16, .activation = CREW_ACT_RELU}));
    if (dropout > 0.0f) CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DROPOUT, .rate = dropout}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    CHECK_OK(crew_model_compile(m, &(crew_compile_options){.loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY, .optimizer = *opt}));
    return m;
}

#endif
