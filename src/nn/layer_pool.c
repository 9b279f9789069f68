/* layer_pool.c — max pooling, average pooling and global average pooling, NHWC.
 * Max pooling keeps the arg-max of every output in work[0] for the backward pass. */
#include "nn/window_geometry.h"

static crew_status pool_geometry(const crew_layer *l, int64_t rows, crew_window *g)
{
    int k_h = l->spec.pool[0] ? l->spec.pool[0] : 2, k_w = l->spec.pool[1] ? l->spec.pool[1] : 2;
    int s_h = l->spec.strides[0] ? l->spec.strides[0] : k_h, s_w = l->spec.strides[1] ? l->spec.strides[1] : k_w;
    crew_status s = crew_window_plan(&l->in, k_h, k_w, s_h, s_w, l->spec.padding, g);
    if (s) return s;
    g->batch = rows;
    return CREW_OK;
}

static crew_status pool_build(crew_layer *l)
{
    crew_window g = {0};
    CREW_TRY(pool_geometry(l, 1, &g));
    l->out = crew_shape3(g.out_h, g.out_w, g.in_c);
    return CREW_OK;
}

/* One int32 arg-max per output value, in a float-sized buffer. */
static void maxpool_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    n[0] = rows * crew_shape_size(&l->out);
}

static crew_status maxpool_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    crew_window g = {0};
    CREW_TRY(pool_geometry(l, p->rows, &g));
    p->be->ops->maxpool_forward(p->be->ctx, x, y, (int32_t *)l->work[0], &g, l->relu_in);
    return CREW_OK;
}

static crew_status maxpool_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                    const float *dy, float *dx)
{
    (void)x;
    (void)y;
    if (!dx) return CREW_OK;
    crew_window g = {0};
    CREW_TRY(pool_geometry(l, p->rows, &g));
    p->be->ops->maxpool_backward(p->be->ctx, dy, (const int32_t *)l->work[0], dx, &g);
    return CREW_OK;
}

static crew_status avgpool_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    crew_window g = {0};
    CREW_TRY(pool_geometry(l, p->rows, &g));
    p->be->ops->avgpool_forward(p->be->ctx, x, y, &g);
    return CREW_OK;
}

static crew_status avgpool_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                    const float *dy, float *dx)
{
    (void)x;
    (void)y;
    if (!dx) return CREW_OK;
    crew_window g = {0};
    CREW_TRY(pool_geometry(l, p->rows, &g));
    p->be->ops->avgpool_backward(p->be->ctx, dy, dx, &g);
    return CREW_OK;
}

/* Global average pooling is average pooling with one window covering the image: [C] out. */
static crew_status global_geometry(const crew_layer *l, int64_t rows, crew_window *g)
{
    if (l->in.ndim != 3)
        return crew_errorf(CREW_CODE_BAD_INPUT, "needs an input of shape (height, width, channels), got %d axes",
                           l->in.ndim);
    CREW_TRY(crew_window_plan(&l->in, (int)l->in.dim[0], (int)l->in.dim[1], 1, 1, CREW_PAD_VALID, g));
    g->batch = rows;
    return CREW_OK;
}

static crew_status gap_build(crew_layer *l)
{
    crew_window g = {0};
    CREW_TRY(global_geometry(l, 1, &g));
    l->out = crew_shape1(g.in_c);
    return CREW_OK;
}

static crew_status gap_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    crew_window g = {0};
    CREW_TRY(global_geometry(l, p->rows, &g));
    p->be->ops->avgpool_forward(p->be->ctx, x, y, &g);
    return CREW_OK;
}

static crew_status gap_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                const float *dy, float *dx)
{
    (void)x;
    (void)y;
    if (!dx) return CREW_OK;
    crew_window g = {0};
    CREW_TRY(global_geometry(l, p->rows, &g));
    p->be->ops->avgpool_backward(p->be->ctx, dy, dx, &g);
    return CREW_OK;
}

const crew_layer_ops crew_max_pool2d_ops = {.build = pool_build,
                                            .workspace = maxpool_workspace,
                                            .forward = maxpool_forward,
                                            .backward = maxpool_backward,
                                            .release = crew_layer_free_work};
const crew_layer_ops crew_avg_pool2d_ops = {.build = pool_build,
                                            .forward = avgpool_forward,
                                            .backward = avgpool_backward,
                                            .release = crew_layer_free_work};
const crew_layer_ops crew_global_avg_pool2d_ops = {.build = gap_build,
                                                   .forward = gap_forward,
                                                   .backward = gap_backward,
                                                   .release = crew_layer_free_work};
