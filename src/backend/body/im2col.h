/* im2col.h — im2col's body, on its own so that tests/test_kernel_bodies.c can compile it a second
 * time with a wrong index planted (an off-by-one in the window's column) and show that its check
 * fails then; window.h includes it, and nothing else should. No build of crew plants anything: the
 * test does it in its own copy, by macros it defines around a second #include of this file. */
#ifndef CREW_BACKEND_BODY_IM2COL_H
#define CREW_BACKEND_BODY_IM2COL_H

#include "backend/body/window.h"

/* col [batch·out_h·out_w, k_h·k_w·c], element i = (row, (kh·k_w + kw)·c + ci): the input under
 * window position row and tap (kh, kw), 0 in the padding. The CPU copies a kernel row's taps
 * inside the image as one run (cpu_window.c), from the same index math. */
CREW_BODY void crew_body_im2col(const float *x, float *col, const crew_window *g, int64_t i)
{
    const int64_t c = g->in_c, width = g->k_h * g->k_w * c;
    const int64_t row = i / width, e = i % width, ci = e % c, tap = e / c, kw = tap % g->k_w, kh = tap / g->k_w;
    const int64_t ow = row % g->out_w, oh = row / g->out_w % g->out_h, b = row / (g->out_w * g->out_h);
    const int64_t cell = crew_window_cell(g, b, oh, ow, kh, kw);
    col[i] = cell < 0 ? 0.0f : x[cell * c + ci];
}

#endif
