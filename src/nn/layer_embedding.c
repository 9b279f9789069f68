/* layer_embedding.c — token ids [T] (integers stored as float) → vectors [T, dim].
 * table: embeddings [vocab, dim], initialised U(±0.05) as Keras. */
#include "core/status.h"
#include "nn/layer.h"

static crew_status embedding_build(crew_layer *l)
{
    if (l->spec.vocab <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'input_dim' must be a positive integer, got %lld",
                           (long long)l->spec.vocab);
    if (l->spec.dim <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'output_dim' must be a positive integer, got %lld",
                           (long long)l->spec.dim);
    if (l->in.ndim >= CREW_MAX_DIMS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "input has %d axes; at most %d are supported", l->in.ndim,
                           CREW_MAX_DIMS - 1);
    l->out = l->in;
    l->out.dim[l->out.ndim++] = l->spec.dim;
    crew_shape t = {2, {l->spec.vocab, l->spec.dim}};
    crew_layer_declare(l, "embeddings", t, 1, CREW_INIT_UNIFORM_005, l->spec.vocab, l->spec.dim);
    return CREW_OK;
}

static crew_status embedding_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    int64_t ids = p->rows * crew_shape_size(&l->in);
    int64_t bad = 0;
    CREW_TRY(p->be->ops->embedding_forward(p->be->ctx, x, l->params[0].value, l->spec.vocab, y, ids, l->spec.dim, &bad));
    if (bad)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%lld input values are not token ids in [0, %lld)", (long long)bad,
                           (long long)l->spec.vocab);
    return CREW_OK;
}

static crew_status embedding_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                      const float *dy, float *dx)
{
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    int64_t ids = p->rows * crew_shape_size(&l->in);
    /* a shared table already holds the lm_head's part of its gradient */
    if (!l->params[0].shared) o->fill(p->be->ctx, l->params[0].grad, 0.0f, l->spec.vocab * l->spec.dim);
    o->embedding_backward(p->be->ctx, x, dy, l->params[0].grad, l->spec.vocab, ids, l->spec.dim);
    if (dx) o->fill(p->be->ctx, dx, 0.0f, ids); /* ids are not differentiable */
    return CREW_OK;
}

/* backward scatter-adds dy into the table's gradient: it reads none of the values */
const crew_layer_ops crew_embedding_ops = {.build = embedding_build,
                                           .forward = embedding_forward,
                                           .backward = embedding_backward,
                                           .release = crew_layer_free_work,
                                           .backward_reads_no_values = 1};
