/* model_stage.c — a pipeline stage: a contiguous run of a model's layers as a model of its own.
 *
 * Its parameters are laid out in layer order as the whole model's are, so a stage's buffers are
 * exactly the slices of the whole model's buffers that its layers own: copying a stage in or out
 * is one transfer per buffer, and the checkpoint and weights files of a pipelined run are the
 * same as a data-parallel run's. */
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "nn/model.h"

void crew_model_stage_offsets(const crew_model *full, int first, int64_t *params, int64_t *state)
{
    *params = full->n_params;
    *state = full->n_state;
    int found_p = 0, found_s = 0;
    for (int i = first; i < full->n_layers && !(found_p && found_s); i++)
        for (int j = 0; j < full->layers[i]->n_params; j++) {
            const crew_param *p = &full->layers[i]->params[j];
            if (!crew_param_owned(p)) continue;
            if (p->trainable && !found_p) {
                *params = p->offset;
                found_p = 1;
            } else if (!p->trainable && !found_s) {
                *state = p->offset;
                found_s = 1;
            }
        }
}

/* A tied parameter whose owner is in another stage: the two would need their gradients summed
 * between stages, which the pipeline does not do. */
static crew_status check_ties(const crew_model *full, int first, int end)
{
    for (int i = 0; i < full->n_layers; i++)
        for (int j = 0; j < full->layers[i]->n_params; j++) {
            const crew_param *p = &full->layers[i]->params[j];
            int here = i >= first && i < end, owner_here = p->tie_layer >= first && p->tie_layer < end;
            if (p->tied && here != owner_here)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                                   "layer %d (%s) shares '%s' with layer %d (%s) across pipeline stages: tied layers "
                                   "must be in one stage", i, full->layers[i]->name, p->name, p->tie_layer,
                                   full->layers[p->tie_layer]->name);
        }
    return CREW_OK;
}

crew_status crew_model_stage_layers(const crew_model *full, int first, int end, crew_model **out)
{
    *out = NULL;
    if (!full->laid_out || first < 0 || end > full->n_layers || first >= end)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "pipeline stage: layers %d-%d of a model of %d", first, end - 1,
                           full->n_layers);
    if (end < full->n_layers && end >= full->n_compute)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "pipeline stage: layers %d-%d leave the trailing softmax alone "
                           "in a stage (it belongs to the stage before)", first, end - 1);
    CREW_TRY(check_ties(full, first, end));
    crew_shape in = first == 0 ? full->input : full->layers[first - 1]->out;
    crew_model *m;
    CREW_TRY(crew_model_create(in.dim, in.ndim, &m));
    m->layer_base = first;
    m->input_grad = first > 0;
    m->output_grad = end < full->n_layers; /* a stage before the last: the next one sends it */
    crew_status s = CREW_OK;
    for (int i = first; i < end && !s; i++) s = crew_model_append_layer(m, &full->layers[i]->spec, full->layers[i]->name);
    if (s) {
        crew_model_free(m);
        return s;
    }
    for (int i = first; i < end; i++) {
        m->layers[i - first]->conv_by_library = full->layers[i]->conv_by_library;
        m->layers[i - first]->store = full->layers[i]->store;
    }
    snprintf(m->name, sizeof m->name, "%s", full->name);
    m->defaults = full->defaults;
    m->compile = full->compile;
    m->compiled = full->compiled;
    crew_model_count(m);
    *out = m;
    return CREW_OK;
}

static crew_status stage_as(const crew_model *full, int first, int end, const crew_backend *be, int unbuffered,
                            crew_model **out)
{
    *out = NULL;
    crew_model *m;
    CREW_TRY(crew_model_stage_layers(full, first, end, &m));
    crew_status s = CREW_OK;
    if (be) {
        m->be = *be;
        m->has_backend = 1;
    }
    m->params_elsewhere = unbuffered;
    s = crew_model_layout(m);
    if (!s && full->initialized) {
        int64_t po, so;
        crew_model_stage_offsets(full, first, &po, &so);
        if (!unbuffered) s = crew_dev_transfer_f32(&m->be, m->params, &full->be, full->params + po, m->n_params);
        if (!s) s = crew_dev_transfer_f32(&m->be, m->state, &full->be, full->state + so, m->n_state);
        m->initialized = 1;
    }
    if (s) {
        crew_model_free(m);
        return crew_error_prefix(s, "pipeline stage of layers %d-%d: ", first, end - 1);
    }
    *out = m;
    return CREW_OK;
}

crew_status crew_model_stage(const crew_model *full, int first, int end, const crew_backend *be, crew_model **out)
{
    return stage_as(full, first, end, be, 0, out);
}

crew_status crew_model_stage_unbuffered(const crew_model *full, int first, int end, const crew_backend *be,
                                        crew_model **out)
{
    return stage_as(full, first, end, be, 1, out);
}
