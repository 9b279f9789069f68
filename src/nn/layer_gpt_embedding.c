/* layer_gpt_embedding.c — GPT's input: token ids [T] (integers stored as float) → the token's
 * embedding plus its position's, [T, C].
 *   wte [vocab, C]  token table (an lm_head may share it: then it is `shared`)
 *   wpe [T, C]      one learned vector per position; T is the model's context (its input length)
 * Both N(0, 0.02²) as GPT-2. */
#include "core/status.h"
#include "nn/layer.h"

enum { WTE, WPE };

static int64_t context(const crew_layer *l) { return l->in.dim[0]; }

static crew_status gpt_embedding_build(crew_layer *l)
{
    if (l->in.ndim != 1)
        return crew_errorf(CREW_CODE_BAD_INPUT, "input must be a list of token ids [context], got %d axes", l->in.ndim);
    if (l->spec.vocab <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'vocab' must be a positive integer, got %lld",
                           (long long)l->spec.vocab);
    if (l->spec.dim <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'width' must be a positive integer, got %lld",
                           (long long)l->spec.dim);
    int64_t T = context(l), C = l->spec.dim;
    l->out = (crew_shape){2, {T, C}};
    crew_layer_declare_normal(l, "wte", (crew_shape){2, {l->spec.vocab, C}}, 0.02f);
    crew_layer_declare_normal(l, "wpe", (crew_shape){2, {T, C}}, 0.02f);
    return CREW_OK;
}

static crew_status gpt_embedding_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    int64_t T = context(l), C = l->spec.dim, bad = 0;
    CREW_TRY(o->embedding_forward(p->be->ctx, x, l->params[WTE].value, l->spec.vocab, y, p->rows * T, C, &bad));
    if (bad)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%lld input values are not token ids in [0, %lld)", (long long)bad,
                           (long long)l->spec.vocab);
    for (int64_t r = 0; r < p->rows; r++) o->axpby(p->be->ctx, T * C, 1.0f, l->params[WPE].value, 1.0f, y + r * T * C);
    return CREW_OK;
}

static crew_status gpt_embedding_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                          const float *dy, float *dx)
{
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    int64_t T = context(l), C = l->spec.dim;
    crew_param *wte = &l->params[WTE];
    /* a shared table already holds the lm_head's part of its gradient */
    if (!wte->shared) o->fill(p->be->ctx, wte->grad, 0.0f, l->spec.vocab * C);
    o->embedding_backward(p->be->ctx, x, dy, wte->grad, l->spec.vocab, p->rows * T, C);
    /* d wpe = Σ over the micro-batch's samples of dy [T, C], in sample order */
    o->col_sum(p->be->ctx, dy, p->rows, T * C, l->params[WPE].grad, 0);
    if (dx) o->fill(p->be->ctx, dx, 0.0f, p->rows * T); /* ids are not differentiable */
    return CREW_OK;
}

/* backward scatter-adds dy into the table's gradient: it reads none of the values */
const crew_layer_ops crew_gpt_embedding_ops = {.build = gpt_embedding_build,
                                               .forward = gpt_embedding_forward,
                                               .backward = gpt_embedding_backward,
                                               .release = crew_layer_free_work,
                                               .backward_reads_no_values = 1};
