/* window_geometry.h — output size and padding of a 2-D window (conv or pool), TensorFlow's rules:
 * 'valid' keeps windows inside the image; 'same' gives ceil(in / stride) outputs and puts the
 * odd padding cell at the bottom/right. */
#ifndef CREW_NN_WINDOW_GEOMETRY_H
#define CREW_NN_WINDOW_GEOMETRY_H

#include "backend/backend.h"
#include "core/status.h"
#include "nn/layer.h"

static inline crew_status crew_window_plan(const crew_shape *in, int k_h, int k_w, int s_h, int s_w,
                                           crew_padding pad, crew_window *g)
{
    if (in->ndim != 3)
        return crew_errorf(CREW_CODE_BAD_INPUT, "needs an input of shape (height, width, channels), got %d axes",
                           in->ndim);
    if (k_h <= 0 || k_w <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'kernel_size' must be positive, got (%d, %d)", k_h, k_w);
    if (s_h <= 0 || s_w <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'strides' must be positive, got (%d, %d)", s_h, s_w);
    *g = (crew_window){0};
    g->in_h = in->dim[0];
    g->in_w = in->dim[1];
    g->in_c = in->dim[2];
    g->k_h = k_h;
    g->k_w = k_w;
    g->stride_h = s_h;
    g->stride_w = s_w;
    if (pad == CREW_PAD_SAME) {
        g->out_h = (g->in_h + s_h - 1) / s_h;
        g->out_w = (g->in_w + s_w - 1) / s_w;
        int64_t ph = (g->out_h - 1) * s_h + k_h - g->in_h, pw = (g->out_w - 1) * s_w + k_w - g->in_w;
        g->pad_top = ph > 0 ? ph / 2 : 0;
        g->pad_left = pw > 0 ? pw / 2 : 0;
    } else {
        if (g->in_h < k_h || g->in_w < k_w)
            return crew_errorf(CREW_CODE_BAD_INPUT,
                               "window (%d, %d) is larger than the input (%lld, %lld) with 'valid' padding",
                               k_h, k_w, (long long)g->in_h, (long long)g->in_w);
        g->out_h = (g->in_h - k_h) / s_h + 1;
        g->out_w = (g->in_w - k_w) / s_w + 1;
    }
    return CREW_OK;
}

/* A conv2d layer's window over micro-batches of `rows` samples (its kernel, strides and
 * padding): the one statement of it, for the layer and for whoever times the layer's two ways
 * (src/advise/conv_choice.c). */
static inline crew_status crew_conv2d_window(const crew_layer *l, int64_t rows, crew_window *g)
{
    int s_h = l->spec.strides[0] ? l->spec.strides[0] : 1, s_w = l->spec.strides[1] ? l->spec.strides[1] : 1;
    CREW_TRY(crew_window_plan(&l->in, l->spec.kernel[0], l->spec.kernel[1], s_h, s_w, l->spec.padding, g));
    g->batch = rows;
    return CREW_OK;
}

#endif
