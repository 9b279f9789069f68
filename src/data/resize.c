/* resize.c — separable resampling (method in resize.h): per axis, a table of which source pixels
 * each output pixel draws on and with what weights; rows first into a float buffer, then
 * columns into the bytes. */
#include "data/resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* Output pixel o reads source pixels first[o] .. first[o] + taps - 1 with weights w[o * taps ..]
 * (trailing weights are 0 where fewer pixels contribute). */
typedef struct axis {
    int taps;
    int *first; /* [n_out] */
    float *w;   /* [n_out][taps] */
} axis;

static void axis_free(axis *a)
{
    free(a->first);
    free(a->w);
}

/* Area: output o covers source [o·scale, (o+1)·scale); each source pixel weighs its overlap. */
static void area_weights(axis *a, int n_in, int n_out)
{
    double scale = (double)n_in / n_out;
    for (int o = 0; o < n_out; o++) {
        double lo = o * scale, hi = (o + 1) * scale, sum = 0;
        int first = (int)floor(lo);
        float *w = a->w + (size_t)o * (size_t)a->taps;
        a->first[o] = first;
        for (int t = 0; t < a->taps; t++) {
            int i = first + t;
            double ov = i < n_in ? fmin(hi, i + 1.0) - fmax(lo, (double)i) : 0;
            w[t] = ov > 0 ? (float)ov : 0.0f;
            sum += w[t];
        }
        for (int t = 0; t < a->taps; t++) w[t] = (float)(w[t] / sum);
    }
}

/* Bilinear with half-pixel centres: output o samples source coordinate (o + ½)·n_in/n_out − ½. */
static void linear_weights(axis *a, int n_in, int n_out)
{
    double scale = (double)n_in / n_out;
    for (int o = 0; o < n_out; o++) {
        double x = (o + 0.5) * scale - 0.5;
        if (x < 0) x = 0;
        if (x > n_in - 1) x = n_in - 1;
        int i0 = (int)floor(x);
        if (i0 > n_in - 2) i0 = n_in > 1 ? n_in - 2 : 0; /* keep both taps inside; f becomes 1 at the end */
        double f = n_in > 1 ? x - i0 : 0;
        a->first[o] = i0;
        a->w[2 * o] = (float)(1 - f);
        a->w[2 * o + 1] = (float)f;
    }
}

static crew_status axis_make(axis *a, int n_in, int n_out)
{
    memset(a, 0, sizeof *a);
    a->taps = n_out < n_in ? (int)ceil((double)n_in / n_out) + 1 : 2;
    a->first = malloc(sizeof *a->first * (size_t)n_out);
    a->w = malloc(sizeof *a->w * (size_t)n_out * (size_t)a->taps);
    if (!a->first || !a->w) {
        axis_free(a);
        return CREW_OOM();
    }
    if (n_out < n_in) area_weights(a, n_in, n_out);
    else linear_weights(a, n_in, n_out);
    return CREW_OK;
}

/* The index a tap reads, kept inside [0, n): a zero-weight tap may point one past the end. */
static int tap_index(int i, int n) { return i < n ? i : n - 1; }

/* src [h][src_w][c] → tmp [h][dst_w][c] along the width. */
static void resize_rows(const uint8_t *src, int h, int src_w, int c, const axis *ax, float *tmp, int dst_w)
{
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * src_w * c;
        float *out = tmp + (size_t)y * dst_w * c;
        for (int o = 0; o < dst_w; o++) {
            const float *w = ax->w + (size_t)o * ax->taps;
            for (int k = 0; k < c; k++) {
                float v = 0;
                for (int t = 0; t < ax->taps; t++)
                    if (w[t] != 0) v += w[t] * row[(size_t)tap_index(ax->first[o] + t, src_w) * c + k];
                out[(size_t)o * c + k] = v;
            }
        }
    }
}

/* tmp [src_h][w·c] → dst [dst_h][w·c] along the height, rounded to bytes. */
static void resize_cols(const float *tmp, int src_h, int wc, const axis *ax, uint8_t *dst, int dst_h)
{
    for (int o = 0; o < dst_h; o++) {
        const float *w = ax->w + (size_t)o * ax->taps;
        uint8_t *out = dst + (size_t)o * wc;
        for (int k = 0; k < wc; k++) {
            float v = 0;
            for (int t = 0; t < ax->taps; t++)
                if (w[t] != 0) v += w[t] * tmp[(size_t)tap_index(ax->first[o] + t, src_h) * wc + k];
            v += 0.5f;
            out[k] = v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
        }
    }
}

crew_status crew_resize_u8(const uint8_t *src, int src_h, int src_w, int channels, uint8_t *dst, int dst_h, int dst_w)
{
    if (!src || !dst || src_h < 1 || src_w < 1 || dst_h < 1 || dst_w < 1 || channels < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_resize_u8: bad sizes %dx%dx%d -> %dx%d", src_h, src_w,
                           channels, dst_h, dst_w);
    if (src_h == dst_h && src_w == dst_w) {
        memcpy(dst, src, (size_t)src_h * src_w * channels);
        return CREW_OK;
    }
    axis ax_w, ax_h;
    CREW_TRY(axis_make(&ax_w, src_w, dst_w));
    crew_status s = axis_make(&ax_h, src_h, dst_h);
    if (s) {
        axis_free(&ax_w);
        return s;
    }
    float *tmp = malloc(sizeof *tmp * (size_t)src_h * dst_w * channels);
    if (!tmp) s = CREW_OOM();
    if (!s) {
        resize_rows(src, src_h, src_w, channels, &ax_w, tmp, dst_w);
        resize_cols(tmp, src_h, dst_w * channels, &ax_h, dst, dst_h);
    }
    free(tmp);
    axis_free(&ax_w);
    axis_free(&ax_h);
    return s;
}
