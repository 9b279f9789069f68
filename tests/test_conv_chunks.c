/* test_conv_chunks.c — the conv layer, which works through a micro-batch a chunk of samples at a
 * time, against a direct convolution in double precision.
 *
 * The gradient checks (test_gradcheck.c) use images so small that a whole micro-batch is one
 * chunk. Here the images are big enough that a chunk holds one to three samples, and the batch is
 * not a multiple of the chunk (where it holds more than one), so the last chunk is partial: the offsets into x, y, dy and dx, the
 * kernel gradient summed over chunks (overwritten by the first, added to by the rest), the bias
 * gradient and the rebuilt columns of the backward pass are all exercised. Each case first checks,
 * through the layer's workspace op, that it really has several chunks and a partial last one.
 *
 * Tolerance: each tensor as a whole, max |crew − ref| / max |ref| ≤ 1e-5. The longest float32
 * sums are the kernel gradient's, rows × OH × OW = 7 × 400 = 2800 terms of O(1) values with a
 * rounding error of about sqrt(2800) × 6e-8 ≈ 3e-6 relative to the result; a wrong offset or a
 * chunk summed twice or not at all gives errors of O(1). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "model_values.h"
#include "core/rng.h"
#include "nn/model.h"
#include "nn/window_geometry.h"

#define TOL 1e-5

typedef struct conv_case {
    const char *name;
    int64_t h, w, c, filters, rows;
    int k, stride;
    crew_padding pad;
} conv_case;

typedef struct conv_ref {
    crew_window g;
    int64_t f;
    const float *x, *kernel, *bias, *dy; /* x [rows, H, W, C], kernel [KH, KW, C, F], dy [rows, OH, OW, F] */
    double *y, *dk, *db, *dx;            /* the same layouts as crew's */
} conv_ref;

/* Input position (iy, ix) of output (oy, ox) and kernel tap (ky, kx); 0 when it falls in the padding. */
static int tap(const crew_window *g, int64_t oy, int64_t ox, int64_t ky, int64_t kx, int64_t *iy, int64_t *ix)
{
    *iy = oy * g->stride_h + ky - g->pad_top;
    *ix = ox * g->stride_w + kx - g->pad_left;
    return *iy >= 0 && *iy < g->in_h && *ix >= 0 && *ix < g->in_w;
}

/* The convolution and its three gradients straight from the definition, sample by sample. */
static void direct_conv(conv_ref *r, int64_t rows)
{
    const crew_window *g = &r->g;
    const int64_t f = r->f, c = g->in_c;
    for (int64_t b = 0; b < rows; b++)
        for (int64_t oy = 0; oy < g->out_h; oy++)
            for (int64_t ox = 0; ox < g->out_w; ox++) {
                int64_t o = ((b * g->out_h + oy) * g->out_w + ox) * f;
                for (int64_t j = 0; j < f; j++) {
                    r->y[o + j] += r->bias[j];
                    r->db[j] += r->dy[o + j];
                }
                for (int64_t ky = 0; ky < g->k_h; ky++)
                    for (int64_t kx = 0; kx < g->k_w; kx++) {
                        int64_t iy, ix;
                        if (!tap(g, oy, ox, ky, kx, &iy, &ix)) continue;
                        int64_t in = ((b * g->in_h + iy) * g->in_w + ix) * c;
                        for (int64_t ch = 0; ch < c; ch++) {
                            int64_t kk = ((ky * g->k_w + kx) * c + ch) * f;
                            for (int64_t j = 0; j < f; j++) {
                                r->y[o + j] += (double)r->x[in + ch] * r->kernel[kk + j];
                                r->dk[kk + j] += (double)r->x[in + ch] * r->dy[o + j];
                                r->dx[in + ch] += (double)r->kernel[kk + j] * r->dy[o + j];
                            }
                        }
                    }
            }
}

/* max |a - ref| / max |ref| over a tensor. */
static double tensor_error(const float *a, const double *ref, int64_t n)
{
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= diff)) diff = d; /* NaN sticks */
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    return scale > 0.0 ? diff / scale : diff;
}

static float *uniform(int64_t n, crew_rng *r)
{
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) abort();
    for (int64_t i = 0; i < n; i++) p[i] = 2.0f * crew_rng_next_uniform(r) - 1.0f;
    return p;
}

static double *zeros(int64_t n)
{
    double *p = calloc((size_t)n, sizeof *p);
    if (!p) abort();
    return p;
}

/* Checks that the case splits its batch into several chunks, the last one partial unless a chunk
 * is a single sample. */
static void check_chunking(const conv_case *cc, const crew_layer *l, const crew_window *g)
{
    int64_t n[CREW_LAYER_MAX_WORK] = {0};
    crew_layer_workspace(l, cc->rows, n);
    int64_t per_sample = g->out_h * g->out_w * g->k_h * g->k_w * g->in_c, chunk = n[0] / per_sample;
    CHECK_MSG(n[0] % per_sample == 0 && chunk >= 1 && chunk < cc->rows && (chunk == 1 || cc->rows % chunk != 0),
              "%s: %lld rows in chunks of %lld: not several chunks ending in a partial one", cc->name,
              (long long)cc->rows, (long long)chunk);
}

static void run_case(const conv_case *cc)
{
    crew_model *m = NULL;
    crew_layer_spec spec = {.type = CREW_LAYER_CONV2D, .filters = cc->filters, .kernel = {cc->k, cc->k},
                            .strides = {cc->stride, cc->stride}, .padding = cc->pad};
    crew_status s = crew_model_create((int64_t[]){cc->h, cc->w, cc->c}, 3, &m);
    if (!s) s = crew_model_add(m, &spec);
    if (!s) s = crew_model_init_params(m, 7);
    if (!s) s = crew_model_reserve(m, cc->rows);
    CHECK_MSG(s == CREW_OK, "%s: %s", cc->name, crew_status_message(s));
    if (s) {
        crew_status_free(s);
        crew_model_free(m);
        return;
    }
    crew_layer *l = m->layers[0];
    conv_ref r = {.f = cc->filters};
    CHECK_OK(crew_window_plan(&l->in, cc->k, cc->k, cc->stride, cc->stride, cc->pad, &r.g));
    check_chunking(cc, l, &r.g);

    const int64_t nx = cc->rows * cc->h * cc->w * cc->c, ny = cc->rows * crew_shape_size(&l->out);
    crew_rng rng = crew_rng_make(11);
    float *x = uniform(nx, &rng), *dy = uniform(ny, &rng), *y = uniform(ny, &rng), *dx = uniform(nx, &rng);
    crew_param *kernel = &l->params[0], *bias = &l->params[1];
    const int64_t nk = crew_shape_size(&kernel->shape);
    float *b = malloc((size_t)cc->filters * sizeof *b), *stale = malloc((size_t)m->n_params * sizeof *stale);
    for (int64_t i = 0; i < cc->filters; i++) b[i] = 0.5f - 0.1f * (float)i;
    mv_upload(m, bias->value, b, cc->filters);
    /* Stale gradients: the layer must overwrite them, not add to them. */
    for (int64_t i = 0; i < m->n_params; i++) stale[i] = 100.0f;
    mv_upload(m, m->grads, stale, m->n_params);
    /* the layer's operands in device memory, as the model would hand them over */
    float *dev[4] = {NULL, NULL, NULL, NULL}, *host[4] = {x, y, dy, dx};
    const int64_t sizes[4] = {nx, ny, ny, nx};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(crew_dev_alloc_f32(&m->be, sizes[i], &dev[i]));
        mv_upload(m, dev[i], host[i], sizes[i]);
    }

    crew_pass p = {.be = &m->be, .rows = cc->rows, .training = 1, .total_rows = (double)cc->rows};
    CHECK_OK(l->ops->forward(l, &p, dev[0], dev[1]));
    CHECK_OK(l->ops->backward(l, &p, dev[0], dev[1], dev[2], dev[3]));
    CHECK_OK(m->be.ops->sync(m->be.ctx, NULL));
    float *y_got = mv_download(m, dev[1], ny), *dx_got = mv_download(m, dev[3], nx);
    float *k_val = mv_tensor(m, kernel), *k_grad = mv_download(m, kernel->grad, nk);
    float *b_grad = mv_download(m, bias->grad, cc->filters);
    for (int i = 0; i < 4; i++) crew_dev_free(&m->be, dev[i]);

    r.x = x, r.kernel = k_val, r.bias = b, r.dy = dy;
    r.y = zeros(ny), r.dk = zeros(nk), r.db = zeros(cc->filters), r.dx = zeros(nx);
    direct_conv(&r, cc->rows);
    const struct { const char *what; double err; } errs[] = {
        {"y", tensor_error(y_got, r.y, ny)},
        {"kernel gradient", tensor_error(k_grad, r.dk, nk)},
        {"bias gradient", tensor_error(b_grad, r.db, cc->filters)},
        {"dx", tensor_error(dx_got, r.dx, nx)},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        CHECK_MSG(errs[i].err <= TOL, "%s: %s off by %.3g of its scale", cc->name, errs[i].what, errs[i].err);
    printf("%-28s worst error %.2g\n", cc->name,
           fmax(fmax(errs[0].err, errs[1].err), fmax(errs[2].err, errs[3].err)));

    free(x), free(dy), free(y), free(dx);
    free(y_got), free(dx_got), free(k_val), free(k_grad), free(b_grad), free(b), free(stale);
    free(r.y), free(r.dk), free(r.db), free(r.dx);
    crew_model_free(m);
}

int main(void)
{
    /* Columns per sample: 400·360 = 144000 (one sample per chunk), 256·360 = 92160 (two), and
     * 400·180 = 72000 with stride 2 (three). */
    static const conv_case cases[] = {
        {"3x3 same, 1 per chunk", 20, 20, 40, 4, 3, 3, 1, CREW_PAD_SAME},
        {"3x3 same, 2 per chunk", 16, 16, 40, 5, 5, 3, 1, CREW_PAD_SAME},
        {"3x3 same stride 2, 3 per chunk", 40, 40, 20, 3, 7, 3, 2, CREW_PAD_SAME},
        {"3x3 valid, 2 per chunk", 18, 18, 40, 4, 5, 3, 1, CREW_PAD_VALID},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    return check_report();
}
