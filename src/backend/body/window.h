/* window.h — the window ops' index math (convolution's im2col/col2im, max and average pooling;
 * NHWC, backend.h's crew_window) and the bodies of their kernels.
 *
 * Index math, written once: window position (oh, ow) with tap (kh, kw) reads input row
 * oh·stride_h − pad_top + kh and column ow·stride_w − pad_left + kw (crew_window_row/col), a cell
 * of the padding when outside the image; average pooling divides by the taps inside the image
 * (crew_window_cells, crew_avgpool_scale). Every op of cpu_window.c and cpu_conv_direct.c and
 * every kernel here goes through these.
 *
 * The bodies are the kernels' gather form: one output element from its index. The forward ops'
 * bodies walk the window's taps in row-major order, as the CPU does with its channels innermost.
 * The backward ops (col2im and the pooling gradients) gather: input cell (ih, iw) sums what the
 * window positions covering it (crew_window_covering) contribute, in ascending (oh, ow) order,
 * which is the order in which the CPU's scatter (positions outer, taps inner) adds into that cell:
 * the same adds in the same order, without atomics. im2col's body is in im2col.h.
 * body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_WINDOW_H
#define CREW_BACKEND_BODY_WINDOW_H

#include "backend/body/activation.h" /* relu, folded into max pooling */
#include "backend/body/body.h"

CREW_BODY int64_t crew_window_row(const crew_window *g, int64_t oh, int64_t kh)
{
    return oh * g->stride_h - g->pad_top + kh;
}

CREW_BODY int64_t crew_window_col(const crew_window *g, int64_t ow, int64_t kw)
{
    return ow * g->stride_w - g->pad_left + kw;
}

/* The input position (b, ih, iw) under window position (oh, ow) and tap (kh, kw), as
 * (b·in_h + ih)·in_w + iw (times in_c for the cell's first channel); -1 in the padding. (The test
 * of the padding is written out here, not called as a predicate: gcc's code for that form cost the
 * CPU's max pooling 9% more instructions.) */
CREW_BODY int64_t crew_window_cell(const crew_window *g, int64_t b, int64_t oh, int64_t ow, int64_t kh, int64_t kw)
{
    const int64_t ih = crew_window_row(g, oh, kh), iw = crew_window_col(g, ow, kw);
    if (ih < 0 || ih >= g->in_h || iw < 0 || iw >= g->in_w) return -1;
    return (b * g->in_h + ih) * g->in_w + iw;
}

/* The taps of k at window origin o0 = o·stride − pad that fall inside [0, n). */
CREW_BODY int64_t crew_window_taps_inside(int64_t o0, int64_t k, int64_t n)
{
    const int64_t lo = o0 < 0 ? 0 : o0, hi = o0 + k < n ? o0 + k : n;
    return hi > lo ? hi - lo : 0;
}

/* The window cells of position (oh, ow) inside the image. */
CREW_BODY int64_t crew_window_cells(const crew_window *g, int64_t oh, int64_t ow)
{
    return crew_window_taps_inside(crew_window_row(g, oh, 0), g->k_h, g->in_h) *
           crew_window_taps_inside(crew_window_col(g, ow, 0), g->k_w, g->in_w);
}

/* What average pooling multiplies a window's sum by: 1/cells, 0 for a window in the padding. */
CREW_BODY float crew_avgpool_scale(const crew_window *g, int64_t oh, int64_t ow)
{
    const int64_t n = crew_window_cells(g, oh, ow);
    return n ? 1.0f / (float)n : 0.0f;
}

/* The window positions o in [0, out) whose k taps from o·stride − pad cover input index i: [*lo, *hi),
 * empty when *lo >= *hi. o covers i when 0 <= i − (o·stride − pad) < k. */
CREW_BODY void crew_window_covering(int64_t i, int64_t stride, int64_t pad, int64_t k, int64_t out, int64_t *lo,
                                    int64_t *hi)
{
    const int64_t a = i + pad - k + 1, z = i + pad; /* a <= o·stride <= z */
    *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
    *hi = z < 0 ? 0 : z / stride + 1;
    if (*hi > out) *hi = out;
}

/* The sizes of a window op's arrays: input and output [batch, h, w, in_c], im2col's columns
 * [batch·out_h·out_w, k_h·k_w·in_c]. */
CREW_BODY int64_t crew_window_in_cells(const crew_window *g) { return g->batch * g->in_h * g->in_w * g->in_c; }
CREW_BODY int64_t crew_window_out_cells(const crew_window *g) { return g->batch * g->out_h * g->out_w * g->in_c; }
CREW_BODY int64_t crew_window_col_size(const crew_window *g)
{
    return g->batch * g->out_h * g->out_w * g->k_h * g->k_w * g->in_c;
}

/* The coordinates of element i of a [b, h, w, c] array, channel fastest (NHWC). */
CREW_BODY void crew_nhwc_at(int64_t i, int64_t c, int64_t w, int64_t h, int64_t *ci, int64_t *x, int64_t *y,
                            int64_t *b)
{
    *ci = i % c;
    *x = i / c % w;
    *y = i / (c * w) % h;
    *b = i / (c * w * h);
}

/* Input element i of a gathering body: its coordinates, and the window positions covering it,
 * oh in [oh0, oh1) and ow in [ow0, ow1). */
typedef struct crew_window_span {
    int64_t ci, iw, ih, b;
    int64_t oh0, oh1, ow0, ow1;
} crew_window_span;

CREW_BODY crew_window_span crew_window_span_of(const crew_window *g, int64_t i)
{
    crew_window_span s;
    crew_nhwc_at(i, g->in_c, g->in_w, g->in_h, &s.ci, &s.iw, &s.ih, &s.b);
    crew_window_covering(s.ih, g->stride_h, g->pad_top, g->k_h, g->out_h, &s.oh0, &s.oh1);
    crew_window_covering(s.iw, g->stride_w, g->pad_left, g->k_w, g->out_w, &s.ow0, &s.ow1);
    return s;
}

/* The output element of window position (oh, ow) at input element s's channel. */
CREW_BODY int64_t crew_window_out_at(const crew_window *g, const crew_window_span *s, int64_t oh, int64_t ow)
{
    return ((s->b * g->out_h + oh) * g->out_w + ow) * g->in_c + s->ci;
}

/* col2im: dx (b, ih, iw, ci) = Σ of the column entries that read it, element (row, (kh·k_w + kw)·c
 * + ci) of col [batch·out_h·out_w, k_h·k_w·c] (overwrites dx). */
CREW_BODY void crew_body_col2im(const float *col, float *dx, const crew_window *g, int64_t i)
{
    const int64_t c = g->in_c, width = g->k_h * g->k_w * c;
    const crew_window_span s = crew_window_span_of(g, i);
    float sum = 0.0f;
    for (int64_t oh = s.oh0; oh < s.oh1; oh++) {
        const int64_t kh = s.ih - crew_window_row(g, oh, 0);
        for (int64_t ow = s.ow0; ow < s.ow1; ow++) {
            const int64_t kw = s.iw - crew_window_col(g, ow, 0), row = (s.b * g->out_h + oh) * g->out_w + ow;
            sum += col[row * width + (kh * g->k_w + kw) * c + s.ci];
        }
    }
    dx[i] = sum;
}

/* Max pooling, output element i: the first in-image cell of the window seeds the maximum, a later
 * one wins only when strictly greater (the first maximum in window order, backend.h; a NaN never
 * wins); argmax[i] is the input element's index, -1 (and y 0) for a window in the padding. With
 * relu_in, of relu(x), and argmax −1 where the maximum is not positive (backend.h). */
CREW_BODY void crew_body_maxpool_forward(const float *x, float *y, int32_t *argmax, const crew_window *g, int relu_in,
                                         int64_t i)
{
    const int64_t c = g->in_c;
    int64_t ci, ow, oh, b;
    crew_nhwc_at(i, c, g->out_w, g->out_h, &ci, &ow, &oh, &b);
    int seeded = 0;
    float best = 0.0f;
    int32_t at = -1;
    for (int64_t kh = 0; kh < g->k_h; kh++)
        for (int64_t kw = 0; kw < g->k_w; kw++) {
            const int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
            if (cell < 0) continue;
            const float v = relu_in ? crew_act_relu(x[cell * c + ci]) : x[cell * c + ci];
            if (!seeded || v > best) {
                best = v;
                at = (int32_t)(cell * c + ci);
                seeded = 1;
            }
        }
    y[i] = seeded ? best : 0.0f;
    argmax[i] = relu_in && !(best > 0.0f) ? -1 : at;
}

/* dx (input element i) = Σ dy[o] over the outputs o whose argmax is i, o ascending (the CPU's
 * order: it adds dy[o] into dx[argmax[o]] for o ascending). */
CREW_BODY void crew_body_maxpool_backward(const float *dy, const int32_t *argmax, float *dx, const crew_window *g,
                                          int64_t i)
{
    const crew_window_span s = crew_window_span_of(g, i);
    float sum = 0.0f;
    for (int64_t oh = s.oh0; oh < s.oh1; oh++)
        for (int64_t ow = s.ow0; ow < s.ow1; ow++) {
            const int64_t o = crew_window_out_at(g, &s, oh, ow);
            if (argmax[o] == (int32_t)i) sum += dy[o];
        }
    dx[i] = sum;
}

/* Average pooling, output element i: the window's in-image cells summed in tap order, times the
 * scale. */
CREW_BODY void crew_body_avgpool_forward(const float *x, float *y, const crew_window *g, int64_t i)
{
    const int64_t c = g->in_c;
    int64_t ci, ow, oh, b;
    crew_nhwc_at(i, c, g->out_w, g->out_h, &ci, &ow, &oh, &b);
    float s = 0.0f;
    for (int64_t kh = 0; kh < g->k_h; kh++)
        for (int64_t kw = 0; kw < g->k_w; kw++) {
            const int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
            if (cell >= 0) s += x[cell * c + ci];
        }
    y[i] = s * crew_avgpool_scale(g, oh, ow);
}

/* dx (input element i) = Σ over the windows covering it of dy·scale, (oh, ow) ascending. */
CREW_BODY void crew_body_avgpool_backward(const float *dy, float *dx, const crew_window *g, int64_t i)
{
    const crew_window_span s = crew_window_span_of(g, i);
    float sum = 0.0f;
    for (int64_t oh = s.oh0; oh < s.oh1; oh++)
        for (int64_t ow = s.ow0; ow < s.ow1; ow++)
            sum += dy[crew_window_out_at(g, &s, oh, ow)] * crew_avgpool_scale(g, oh, ow);
    dx[i] = sum;
}

#include "backend/body/im2col.h"

#endif
