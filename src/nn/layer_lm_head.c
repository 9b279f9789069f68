/* layer_lm_head.c — a language model's output: logits [T, vocab] = x [T, C] · tableᵀ, where table
 * [vocab, C] is the token embedding of an earlier layer (tied weights, as GPT-2): one parameter
 * with two uses, stored, saved and updated once. The model resolves which layer (spec.tie) before
 * build and points this layer's parameter at the owner's (layer.h, crew_param.tied). */
#include "core/status.h"
#include "nn/layer.h"

static crew_status lm_head_build(crew_layer *l)
{
    int64_t V = l->tie_shape.dim[0], C = l->tie_shape.dim[1];
    if (l->tie_shape.ndim != 2 || V <= 0 || C <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'tie' must name an earlier embedding layer");
    if (l->in.dim[l->in.ndim - 1] != C)
        return crew_errorf(CREW_CODE_BAD_INPUT, "input's last axis is %lld wide, but the tied table's vectors are %lld",
                           (long long)l->in.dim[l->in.ndim - 1], (long long)C);
    l->spec.vocab = V;
    l->spec.dim = C;
    l->out = l->in;
    l->out.dim[l->out.ndim - 1] = V;
    crew_param *p = crew_layer_declare(l, "kernel", l->tie_shape, 1, CREW_INIT_ZEROS, 0, 0);
    p->tied = 1;
    p->tie_layer = l->tie_owner;
    p->tie_param = 0;
    return CREW_OK;
}

static int64_t positions(const crew_layer *l, int64_t rows) { return rows * (crew_shape_size(&l->in) / l->spec.dim); }

static crew_status lm_head_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    int64_t n = positions(l, p->rows), V = l->spec.vocab, C = l->spec.dim;
    p->be->ops->gemm(p->be->ctx, 0, 1, n, V, C, 1.0f, x, C, l->params[0].value, C, 0.0f, y, V);
    return CREW_OK;
}

/* d table = dyᵀ · x [vocab, C], over what the table's gradient held: the head runs its backward
 * before the owner's (it is later in the model), so it writes the gradient's first part and the
 * owner adds its own. Called from backward, or late, just before the owner's backward
 * (crew_layer_ops.tied_grad), with the same x and dy: the same product, the same bits. */
static crew_status lm_head_tied_grad(crew_layer *l, const crew_pass *p, const float *x, const float *dy)
{
    int64_t n = positions(l, p->rows), V = l->spec.vocab, C = l->spec.dim;
    p->be->ops->gemm(p->be->ctx, 1, 0, V, C, n, 1.0f, dy, V, x, C, 0.0f, l->params[0].grad, C);
    return CREW_OK;
}

static crew_status lm_head_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                    const float *dy, float *dx)
{
    (void)y;
    int64_t n = positions(l, p->rows), V = l->spec.vocab, C = l->spec.dim;
    /* dx first: the gradient may be written over the table (nn/layer.h) */
    if (dx) /* dx = dy · table */
        p->be->ops->gemm(p->be->ctx, 0, 0, n, C, V, 1.0f, dy, V, l->params[0].value, C, 0.0f, dx, C);
    return p->tied_grad_late ? CREW_OK : lm_head_tied_grad(l, p, x, dy);
}

const crew_layer_ops crew_lm_head_ops = {.build = lm_head_build,
                                         .forward = lm_head_forward,
                                         .backward = lm_head_backward,
                                         .release = crew_layer_free_work,
                                         .tied_grad = lm_head_tied_grad};
