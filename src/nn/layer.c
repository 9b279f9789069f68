/* layer.c — the layer registry and helpers shared by every layer. */
#include "nn/layer.h"

#include <string.h>

#include "core/status.h"

extern const crew_layer_ops crew_dense_ops, crew_conv2d_ops, crew_max_pool2d_ops, crew_avg_pool2d_ops,
    crew_global_avg_pool2d_ops, crew_flatten_ops, crew_activation_ops, crew_dropout_ops,
    crew_batch_norm_ops, crew_layer_norm_ops, crew_embedding_ops, crew_gpt_embedding_ops, crew_transformer_block_ops,
    crew_lm_head_ops;

const crew_layer_ops *crew_layer_ops_for(crew_layer_type type)
{
    switch (type) {
    case CREW_LAYER_DENSE: return &crew_dense_ops;
    case CREW_LAYER_CONV2D: return &crew_conv2d_ops;
    case CREW_LAYER_MAX_POOL2D: return &crew_max_pool2d_ops;
    case CREW_LAYER_AVG_POOL2D: return &crew_avg_pool2d_ops;
    case CREW_LAYER_GLOBAL_AVG_POOL2D: return &crew_global_avg_pool2d_ops;
    case CREW_LAYER_FLATTEN: return &crew_flatten_ops;
    case CREW_LAYER_ACTIVATION: return &crew_activation_ops;
    case CREW_LAYER_DROPOUT: return &crew_dropout_ops;
    case CREW_LAYER_BATCH_NORM: return &crew_batch_norm_ops;
    case CREW_LAYER_LAYER_NORM: return &crew_layer_norm_ops;
    case CREW_LAYER_EMBEDDING: return &crew_embedding_ops;
    case CREW_LAYER_GPT_EMBEDDING: return &crew_gpt_embedding_ops;
    case CREW_LAYER_TRANSFORMER_BLOCK: return &crew_transformer_block_ops;
    case CREW_LAYER_LM_HEAD: return &crew_lm_head_ops;
    }
    return NULL;
}

const char *crew_layer_type_name(crew_layer_type type)
{
    switch (type) {
    case CREW_LAYER_DENSE: return "dense";
    case CREW_LAYER_CONV2D: return "conv2d";
    case CREW_LAYER_MAX_POOL2D: return "max_pooling2d";
    case CREW_LAYER_AVG_POOL2D: return "average_pooling2d";
    case CREW_LAYER_GLOBAL_AVG_POOL2D: return "global_average_pooling2d";
    case CREW_LAYER_FLATTEN: return "flatten";
    case CREW_LAYER_ACTIVATION: return "activation";
    case CREW_LAYER_DROPOUT: return "dropout";
    case CREW_LAYER_BATCH_NORM: return "batch_normalization";
    case CREW_LAYER_LAYER_NORM: return "layer_normalization";
    case CREW_LAYER_EMBEDDING: return "embedding";
    case CREW_LAYER_GPT_EMBEDDING: return "gpt_embedding";
    case CREW_LAYER_TRANSFORMER_BLOCK: return "transformer_block";
    case CREW_LAYER_LM_HEAD: return "lm_head";
    }
    return "unknown";
}

crew_param *crew_layer_declare(crew_layer *l, const char *name, crew_shape shape, int trainable, crew_init init,
                               int64_t fan_in, int64_t fan_out)
{
    crew_param *p = &l->params[l->n_params++];
    memset(p, 0, sizeof *p);
    p->name = name;
    p->shape = shape;
    p->trainable = trainable;
    p->init = init;
    p->fan_in = fan_in;
    p->fan_out = fan_out;
    return p;
}

crew_param *crew_layer_declare_normal(crew_layer *l, const char *name, crew_shape shape, float std)
{
    crew_param *p = crew_layer_declare(l, name, shape, 1, CREW_INIT_NORMAL, 0, 0);
    p->std = std;
    return p;
}

const float *crew_layer_value_kept(const crew_layer *l, const crew_pass *p, int i, float *spare)
{
    const crew_param *q = &l->params[i];
    if (q->grad != q->value) return q->value;
    p->be->ops->copy(p->be->ctx, spare, q->value, crew_shape_size(&q->shape));
    return spare;
}

void crew_layer_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    for (int i = 0; i < CREW_LAYER_MAX_WORK; i++) n[i] = 0;
    if (l->ops->workspace) l->ops->workspace(l, rows, n);
}

void crew_layer_workspace_as(const crew_layer *l, int64_t rows, const crew_act_storage *s,
                             int64_t n[CREW_LAYER_MAX_WORK])
{
    if (l->store.bf16 == s->bf16 && l->store.att_recompute == s->att_recompute) {
        crew_layer_workspace(l, rows, n);
        return;
    }
    crew_layer as = *l; /* the workspace op reads only what build set, and the storage */
    as.store = *s;
    crew_layer_workspace(&as, rows, n);
}

/* Drops work[i]: frees it unless it is the model's shared scratch. */
static void drop_work(crew_layer *l, const crew_backend *be, int i)
{
    if (l->work[i] && !(l->work_shared & (1u << i))) be->ops->free(be->ctx, l->work[i]);
    l->work[i] = NULL;
    l->work_shared &= ~(1u << i);
}

void crew_layer_free_work(crew_layer *l, const crew_backend *be)
{
    for (int i = 0; i < CREW_LAYER_MAX_WORK; i++) drop_work(l, be, i);
    l->reserved_rows = 0;
}

crew_status crew_layer_reserve(crew_layer *l, const crew_backend *be, int64_t max_rows)
{
    return crew_layer_reserve_shared(l, be, max_rows, NULL);
}

/* One buffer per slot, each its own allocation: the memory planner counts them the same way
 * (the backend rounds every allocation up, so one buffer of the sum would be a different size). */
crew_status crew_layer_reserve_shared(crew_layer *l, const crew_backend *be, int64_t max_rows,
                                      float *const shared[CREW_LAYER_MAX_WORK])
{
    int64_t n[CREW_LAYER_MAX_WORK];
    crew_layer_workspace(l, max_rows, n);
    for (int i = 0; i < CREW_LAYER_MAX_WORK; i++) {
        drop_work(l, be, i);
        if (n[i] <= 0) continue;
        if (shared && shared[i] && (l->ops->scratch & (1u << i))) {
            l->work[i] = shared[i];
            l->work_shared |= 1u << i;
            continue;
        }
        /* 4-byte elements: floats, or max pooling's int32 arg-maxes in the same room */
        crew_status s = crew_dev_alloc_f32(be, n[i], &l->work[i]);
        if (s) return crew_error_prefix(s, "workspace %d (%lld values): ", i, (long long)n[i]);
    }
    l->reserved_rows = max_rows;
    return CREW_OK;
}
