/* conv_choice.c — which way each convolution layer computes: im2col + GEMM or the device's library
 * (cuDNN), measured per layer shape and kept in the figures' cache (crew_conv_choose, crew.h).
 *
 * Why measure: cuDNN is not faster everywhere. im2col + one large GEMM (cuBLAS) wins for some
 * shapes (few channels and small images at a small batch, where the library's kernels are
 * latency-bound), the library for others; the answer depends on the GPU, the micro-batch and the
 * precision, so it is a measurement, not a rule.
 *
 * Why cache: the two ways sum in different orders, so the choice shapes the bits a run computes.
 * Two runs on one machine must choose alike (the same weights, bit for bit), which a fresh timing
 * where the ways are close would not promise; the cache's first measurement decides from then on.
 * The key names everything the times depend on: the host, the device kind, crew's version and
 * BLAS, the layer's geometry and filters, the micro-batch and the precision. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "advise/peak_cache.h"
#include "backend/backend.h"
#include "core/status.h"
#include "core/timer.h"
#include "crew.h"
#include "nn/model.h"
#include "nn/window_geometry.h"

#define ROUNDS 3            /* timed rounds per way; the fastest counts (interference only slows) */
#define ROUND_MIN_S 0.01    /* a round repeats the passes for at least this long */
#define ROUND_MIN_REPS 3

static void describe(const crew_layer *l, const crew_window *g, crew_conv_layer_choice *c)
{
    c->layer = l->index;
    snprintf(c->name, sizeof c->name, "%s", l->name);
    snprintf(c->shape, sizeof c->shape, "%lldx%lldx%lld -> %lldx%lldx%lld, %lldx%lld stride %lld", (long long)g->in_h,
             (long long)g->in_w, (long long)g->in_c, (long long)g->out_h, (long long)g->out_w,
             (long long)l->spec.filters, (long long)g->k_h, (long long)g->k_w, (long long)g->stride_h);
}

/* The cache's keys of a layer: its two times, and "unsupported" for a geometry the library does
 * not run. */
enum { KEY_IM2COL, KEY_LIBRARY, KEY_UNSUPPORTED, KEYS };
static void layer_keys(const char *kind, const crew_layer *l, const crew_window *g, int precision,
                       char keys[KEYS][CREW_PEAK_KEY_MAX])
{
    static const char *const what[KEYS] = {"im2col", "library", "unsupported"};
    char base[CREW_PEAK_KEY_MAX];
    crew_peak_cache_key(kind, 1, base, sizeof base);
    for (int i = 0; i < KEYS; i++)
        snprintf(keys[i], CREW_PEAK_KEY_MAX, "conv|%.240s|%lldx%lldx%lld|k%lldx%lld|s%lldx%lld|p%lldx%lld|f%lld|b%d|"
                 "rows=%lld|%s|%s", base, (long long)g->in_h, (long long)g->in_w, (long long)g->in_c, (long long)g->k_h,
                 (long long)g->k_w, (long long)g->stride_h, (long long)g->stride_w, (long long)g->pad_top,
                 (long long)g->pad_left, (long long)l->spec.filters, !l->spec.no_bias, (long long)g->batch,
                 precision == CREW_PRECISION_BF16 ? "bf16" : "fp32", what[i]);
}

/* The times of a layer from the cache: 1 when they are all there. */
static int from_cache(const char *text, size_t n, char keys[KEYS][CREW_PEAK_KEY_MAX], crew_conv_layer_choice *c)
{
    double unsupported = 0.0;
    if (!text || !crew_peak_cache_find(text, n, keys[KEY_IM2COL], &c->im2col_s)) return 0;
    if (crew_peak_cache_find(text, n, keys[KEY_UNSUPPORTED], &unsupported)) {
        c->supported = 0;
        c->library_s = 0.0;
        return 1;
    }
    c->supported = 1;
    return crew_peak_cache_find(text, n, keys[KEY_LIBRARY], &c->library_s);
}

/* Buffers for one layer's passes at g->batch samples, filled with plain values (the times do not
 * depend on them). */
typedef struct pass_buffers {
    float *x, *y, *dy, *dx;
} pass_buffers;

static void free_buffers(const crew_backend *be, pass_buffers *b)
{
    crew_dev_free(be, b->x);
    crew_dev_free(be, b->y);
    crew_dev_free(be, b->dy);
    crew_dev_free(be, b->dx);
    *b = (pass_buffers){0};
}

static crew_status make_buffers(const crew_backend *be, const crew_layer *l, int64_t rows, pass_buffers *b)
{
    const int64_t nx = rows * crew_shape_size(&l->in), ny = rows * crew_shape_size(&l->out);
    *b = (pass_buffers){0};
    crew_status s = crew_dev_alloc_f32(be, nx, &b->x);
    if (!s) s = crew_dev_alloc_f32(be, ny, &b->y);
    if (!s) s = crew_dev_alloc_f32(be, ny, &b->dy);
    if (!s) s = crew_dev_alloc_f32(be, nx, &b->dx);
    if (s) {
        free_buffers(be, b);
        return s;
    }
    be->ops->fill(be->ctx, b->x, 0.5f, nx);
    be->ops->fill(be->ctx, b->dy, 0.25f, ny);
    return CREW_OK;
}

/* Seconds of one forward + backward pass of layer l (its own code, the way its flag says): the
 * fastest of ROUNDS rounds, after a warm-up in which a library picks its algorithms. */
static crew_status time_passes(crew_layer *l, const crew_backend *be, const pass_buffers *b, int64_t rows, double *out)
{
    crew_pass p = {.be = be, .rows = rows, .training = 1, .total_rows = (double)rows};
    double best = INFINITY;
    for (int warm = 0; warm < 2; warm++) {
        CREW_TRY(l->ops->forward(l, &p, b->x, b->y));
        CREW_TRY(l->ops->backward(l, &p, b->x, b->y, b->dy, l->needs_input_grad ? b->dx : NULL));
    }
    CREW_TRY(be->ops->sync(be->ctx, NULL));
    for (int round = 0; round < ROUNDS; round++) {
        const double t0 = crew_now();
        int reps = 0;
        double t = 0.0;
        do {
            CREW_TRY(l->ops->forward(l, &p, b->x, b->y));
            CREW_TRY(l->ops->backward(l, &p, b->x, b->y, b->dy, l->needs_input_grad ? b->dx : NULL));
            if (++reps >= ROUND_MIN_REPS) {
                CREW_TRY(be->ops->sync(be->ctx, NULL));
                t = crew_now() - t0;
            }
        } while (reps < ROUND_MIN_REPS || t < ROUND_MIN_S);
        if (t / reps < best) best = t / reps;
    }
    *out = best > 0.0 ? best : 1e-9; /* a cached figure must be positive */
    return CREW_OK;
}

/* Both ways of layer i of the replica r (on a device opened with its library). */
static crew_status measure_layer(crew_model *r, int i, int64_t rows, crew_conv_layer_choice *c)
{
    const crew_backend *be = &r->be;
    crew_layer *l = r->layers[i];
    crew_window g = {0};
    CREW_TRY(crew_conv2d_window(l, rows, &g));
    c->supported = be->ops->conv_supported && be->ops->conv_supported(be->ctx, &g, l->spec.filters);
    pass_buffers b;
    CREW_TRY(make_buffers(be, l, rows, &b));
    l->conv_by_library = 0;
    crew_status s = time_passes(l, be, &b, rows, &c->im2col_s);
    c->library_s = 0.0;
    if (!s && c->supported) {
        l->conv_by_library = 1;
        s = time_passes(l, be, &b, rows, &c->library_s);
        l->conv_by_library = 0;
    }
    free_buffers(be, &b);
    return s ? crew_error_prefix(s, "timing convolution layer '%s': ", l->name) : CREW_OK;
}

/* The layers still to measure, on one device of the kind with its library; their keys and times
 * join the cache's new lines. */
static crew_status measure(crew_model *m, const char *kind, int64_t rows, int precision, const int *todo,
                           crew_conv_choice *out, char (*keys)[KEYS][CREW_PEAK_KEY_MAX], const char **new_keys,
                           double *new_values, int *n_new)
{
    crew_device_options o = {.blas_threads = 1, .precision = (crew_precision)precision, .conv_library = 1};
    crew_backend be;
    crew_status s = crew_device_open(kind, 0, &o, &be);
    if (s) { /* the device, or only its library (cuDNN missing, or refusing)? */
        crew_device_options plain = o;
        plain.conv_library = 0;
        crew_status ps = crew_device_open(kind, 0, &plain, &be);
        if (ps) {
            crew_status_free(s);
            return ps;
        }
        crew_device_close(&be);
        /* im2col everywhere (nothing measured, nothing cached: a later run tries again), and why */
        snprintf(out->unavailable, sizeof out->unavailable, "%s", crew_status_message(s));
        crew_status_free(s);
        return CREW_OK;
    }
    crew_model *r = NULL;
    s = crew_model_clone(m, &be, &r);
    if (!s) s = crew_model_reserve(r, rows);
    for (int j = 0; j < out->n && !s; j++) {
        if (!todo[j]) continue;
        crew_conv_layer_choice *c = &out->layers[j];
        int i = 0;
        while (r->layers[i]->index != c->layer) i++;
        s = measure_layer(r, i, rows, c);
        if (s) break;
        c->measured = 1;
        new_keys[*n_new] = keys[j][KEY_IM2COL];
        new_values[(*n_new)++] = c->im2col_s;
        new_keys[*n_new] = keys[j][c->supported ? KEY_LIBRARY : KEY_UNSUPPORTED];
        new_values[(*n_new)++] = c->supported ? c->library_s : 1.0;
    }
    crew_model_free(r);
    crew_device_close(&be);
    return s;
}

crew_status crew_conv_choose(crew_model *m, const char *device_kind, int64_t rows, int precision,
                             const char *cache_path, int measure_mode, crew_conv_choice *out)
{
    if (!m || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_conv_choose: NULL argument");
    memset(out, 0, sizeof *out);
    const char *kind = device_kind && *device_kind ? device_kind : "cpu";
    CREW_TRY(crew_device_kind_check(kind));
    if (rows < 1 || rows > (1 << 20))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_conv_choose: a micro-batch of %lld rows: expected 1 to "
                           "1048576", (long long)rows);
    if (precision != CREW_PRECISION_FP32 && precision != CREW_PRECISION_BF16)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_conv_choose: precision %d: expected fp32 or bf16",
                           precision);
    CREW_TRY(crew_model_layout(m));
    const int n = crew_model_conv_count(m, m->n_layers);
    if (n > CREW_MAX_CONV_LAYERS)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the model has %d convolution layers, more than the %d crew "
                           "chooses a way for; give --conv im2col or --conv library", n, CREW_MAX_CONV_LAYERS);
    const crew_device_kind *k = crew_device_kind_find(kind);
    snprintf(out->library, sizeof out->library, "%s", k->conv_library ? k->conv_library : "");
    char(*keys)[KEYS][CREW_PEAK_KEY_MAX] = calloc((size_t)(n ? n : 1), sizeof *keys);
    int *todo = calloc((size_t)(n ? n : 1), sizeof *todo);
    const char **new_keys = calloc((size_t)(2 * n + 1), sizeof *new_keys);
    double *new_values = calloc((size_t)(2 * n + 1), sizeof *new_values);
    if (!keys || !todo || !new_keys || !new_values) {
        free(keys), free(todo), free(new_keys), free(new_values);
        return CREW_OOM();
    }
    size_t text_n = 0;
    char *text = k->conv_library ? crew_cache_read(cache_path, &text_n) : NULL;
    int to_measure = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        if (l->spec.type != CREW_LAYER_CONV2D) continue;
        crew_conv_layer_choice *c = &out->layers[out->n];
        crew_window g = {0};
        crew_status gs = crew_conv2d_window(l, rows, &g); /* a built layer's geometry plans (layer_conv2d.c) */
        if (gs) {
            free(text);
            free(keys), free(todo), free(new_keys), free(new_values);
            return crew_error_prefix(gs, "layer '%s': ", l->name);
        }
        describe(l, &g, c);
        if (k->conv_library) {
            layer_keys(kind, l, &g, precision, keys[out->n]);
            if (measure_mode < 2 && from_cache(text, text_n, keys[out->n], c))
                c->measured = c->cached = 1;
            else
                to_measure += todo[out->n] = measure_mode > 0;
        }
        out->n++;
    }
    int n_new = 0;
    crew_status s = to_measure ? measure(m, kind, rows, precision, todo, out, keys, new_keys, new_values, &n_new) : CREW_OK;
    if (!s && n_new) crew_cache_write(cache_path, text, text_n, new_keys, new_values, n_new);
    for (int j = 0; j < out->n; j++) {
        crew_conv_layer_choice *c = &out->layers[j];
        c->by_library = c->measured && c->supported && c->library_s < c->im2col_s;
        out->ways[j] = c->by_library ? 'l' : 'i';
    }
    free(text);
    free(keys), free(todo), free(new_keys), free(new_values);
    return s;
}
