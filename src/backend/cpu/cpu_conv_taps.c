/* cpu_conv_taps.c — convolutions with few taps, summed directly (backend.h's conv_taps_forward and
 * conv_taps_filter_grad): a first layer over one or three channels.
 *
 * Why: as a GEMM, a 3x3 convolution of one channel has k = 9. Its products are few, but im2col
 * writes the columns, the layer seeds y with the bias, and the GEMM reads and writes y again, each
 * a pass over an output 32/9 times the columns' size: the demo CNN's first layer took about 3 ms of
 * a 21 ms step for 2% of its FLOPs. Here the filters go a vector register's width at a time (a
 * lane group: 16 with AVX-512) through a sample's output positions, reading each position's taps
 * where the padded sample holds them; y is written once, and the kernel gradient reads x and dy
 * once. Within a lane group the kernel's values (forward) or the gradient's sums (backward) stay in
 * registers for the whole sample where the number of taps is a constant the compiler sees (9: 3x3
 * over one channel; 27: over three): with the positions outside and the filters inside, as at
 * first, they were loaded, and the sums stored, again at every position, and the one pass with the
 * pool took 13% of the demo CNN's step (now 8%).
 *
 * Sums, in float, in a fixed order that depends on the shapes alone (never on the machine or the
 * replica count): forward, y[f] = bias[f] + Σ_t tap_t · kernel[t, f], t ascending from 0 (a tap
 * in the padding is 0, as im2col's columns hold it); the kernel gradient, each sample's output
 * positions summed on their own, row-major, then the samples' sums added in sample order (or, with
 * the device's sum_block, in blocks of that many samples, each block's sum added to those before:
 * crew verify's reference of other blocks). No fused multiply-add, as the C code around it. With
 * --precision bf16 the taps, the kernel and dy are rounded to bfloat16 first, as the GEMM's
 * operands would be.
 *
 * Layouts as the layer's: x [batch, in_h, in_w, in_c], kernel [k_h, k_w, in_c, out_c] (rows
 * t = (kh·k_w + kw)·in_c + c), y and dy [batch, out_h, out_w, out_c]. */
#include <stdlib.h>
#include <string.h>

#include "backend/body/window.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_vec.h"
#include "core/bf16.h"

/* A lane group is one vector register of filters (cpu_vec.h). Its values (FORWARD_GROUP's kernel,
 * the gradients' sums: 9 lane vectors for a 3x3 kernel) must fit the register file: with 16 lanes
 * on AVX2, two registers a vector, they did not, and the spills made the first layer's two passes
 * 36% of the demo CNN's step on an AMD EPYC (AVX2), against 8% on an AVX-512 Xeon. Each filter is a
 * lane of its own and its sums take the same order at any width, so the bits do not depend on it. */
#define LANES CPU_VEC_LANES
typedef cpu_vec lanes;
#define load(p) cpu_vec_load(p)
#define store(p, v) cpu_vec_store(p, v)

/* Filters in groups of at most this many (a multiple of LANES): the kernel gradient's per-sample
 * sums of a group, [taps, group], stay on the stack. */
#define GROUP 128

static const lanes ZERO = {0};

static float rounded(float v, int bf16) { return bf16 ? crew_bf16_round(v) : v; }

/* A sample with its padding written out, [hp, wp, in_c], so that every tap is a load at a fixed
 * offset from its output position's corner, without a test of the border (a tap gathered through
 * crew_window_cell took 30% of the layer). */
typedef struct padded {
    float *v;
    int64_t hp, wp;
    int64_t off[CREW_CONV_TAPS_MAX]; /* tap t's offset from the corner: (kh·wp + kw)·in_c + c */
} padded;

/* Sizes p for g, in the context's buffer (grown as needed); 0 when there is no room (the
 * device's out_of_memory is set, and the op does nothing). */
static int padded_for(cpu_ctx *cx, const crew_window *g, padded *p)
{
    const int64_t c = g->in_c;
    p->hp = (g->out_h - 1) * g->stride_h + g->k_h;
    p->wp = (g->out_w - 1) * g->stride_w + g->k_w;
    const size_t need = (size_t)(p->hp * p->wp * c);
    if (need > cx->cap_taps) {
        float *grown = realloc(cx->taps, need * sizeof *grown);
        if (!grown) {
            cx->out_of_memory = 1;
            return 0;
        }
        cx->taps = grown;
        cx->cap_taps = need;
    }
    p->v = cx->taps;
    for (int64_t kh = 0; kh < g->k_h; kh++)
        for (int64_t kw = 0; kw < g->k_w; kw++)
            for (int64_t ci = 0; ci < c; ci++) p->off[(kh * g->k_w + kw) * c + ci] = (kh * p->wp + kw) * c + ci;
    return 1;
}

/* Sample b into p: row r, column q hold x's (r − pad_top, q − pad_left), 0 outside the image. */
static void pad_sample(const float *x, const crew_window *g, int64_t b, int bf16, padded *p)
{
    const int64_t c = g->in_c, wp = p->wp;
    /* the image's columns of a padded row: [q0, q1), read from column q0 − pad_left = 0 on; a row
     * is zeros, values, zeros, each a contiguous run (so the copy vectorises) */
    const int64_t q0 = g->pad_left < wp ? g->pad_left : wp;
    const int64_t q1 = g->pad_left + g->in_w < wp ? g->pad_left + g->in_w : wp;
    for (int64_t r = 0; r < p->hp; r++) {
        const int64_t ih = r - g->pad_top;
        float *dst = p->v + r * wp * c;
        if (ih < 0 || ih >= g->in_h) {
            memset(dst, 0, (size_t)(wp * c) * sizeof *dst);
            continue;
        }
        const float *src = x + (b * g->in_h + ih) * g->in_w * c;
        memset(dst, 0, (size_t)(q0 * c) * sizeof *dst);
        for (int64_t i = 0; i < (q1 - q0) * c; i++) dst[q0 * c + i] = rounded(src[i], bf16);
        memset(dst + q1 * c, 0, (size_t)((wp - q1) * c) * sizeof *dst);
    }
}

/* Filters f0 .. f0 + n of the kernel as kg [taps, n], rounded as the GEMM would round them. */
static void kernel_group(const float *kernel, int64_t taps, int64_t out_c, int64_t f0, int64_t n, int bf16, float *kg)
{
    for (int64_t t = 0; t < taps; t++)
        for (int64_t f = 0; f < n; f++) kg[t * n + f] = rounded(kernel[t * out_c + f0 + f], bf16);
}

/* The corner of output position (oh, ow) in the padded sample: tap t is corner[p->off[t]]. */
static inline const float *corner_of(const padded *p, const crew_window *g, int64_t oh, int64_t ow)
{
    return p->v + (oh * g->stride_h * p->wp + ow * g->stride_w) * g->in_c;
}

/* fn_9, fn_27 or fn, by the number of taps: the first two are a loop's instances for a count the
 * compiler sees, which it keeps in registers (below). */
#define BY_TAPS(taps, fn, ...) \
    ((taps) == 9 ? fn##_9(__VA_ARGS__) : (taps) == 27 ? fn##_27(__VA_ARGS__) : fn(__VA_ARGS__))

/* Filters f .. f + LANES of the group at f0 (kg [taps, n]) for every output position of sample b,
 * the kernel's values in registers where TAPS is a constant (9 or 27 taps: 3x3 over one or three
 * channels): with the positions outside and the filters inside they were loaded again at every
 * position, and the position's taps copied out first. The same products and sums, in the same
 * order. A macro for the reason load and store are. */
#define FORWARD_GROUP(TAPS, SIZE)                                                                                   \
    do {                                                                                                            \
        lanes kv[SIZE];                                                                                             \
        for (int64_t t = 0; t < (TAPS); t++) kv[t] = load(kg + t * n + f);                                          \
        const lanes bv = bias ? load(bias + f0 + f) : ZERO;                                                         \
        for (int64_t oh = 0; oh < g->out_h; oh++)                                                                   \
            for (int64_t ow = 0; ow < g->out_w; ow++) {                                                             \
                const float *corner = corner_of(p, g, oh, ow);                                                      \
                lanes acc = kv[0] * corner[p->off[0]];                                                              \
                for (int64_t t = 1; t < (TAPS); t++) acc = acc + kv[t] * corner[p->off[t]];                         \
                store(y + ((b * g->out_h + oh) * g->out_w + ow) * out_c + f0 + f, bias ? bv + acc : acc);           \
            }                                                                                                       \
    } while (0)

static void forward_group_9(const padded *p, const crew_window *g, const float *kg, const float *bias, float *y,
                            int64_t out_c, int64_t b, int64_t f0, int64_t n, int64_t f)
{
    FORWARD_GROUP(9, 9);
}

static void forward_group_27(const padded *p, const crew_window *g, const float *kg, const float *bias, float *y,
                             int64_t out_c, int64_t b, int64_t f0, int64_t n, int64_t f)
{
    FORWARD_GROUP(27, 27);
}

static void forward_group(const padded *p, const crew_window *g, const float *kg, const float *bias, float *y,
                          int64_t out_c, int64_t b, int64_t f0, int64_t n, int64_t f)
{
    const int64_t taps = g->k_h * g->k_w * g->in_c;
    FORWARD_GROUP(taps, CREW_CONV_TAPS_MAX);
}

void cpu_conv_taps_forward(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                           const crew_window *g, int64_t out_c)
{
    cpu_ctx *cx = ctx;
    const int bf16 = cx->bf16;
    const int64_t taps = g->k_h * g->k_w * g->in_c;
    float kg[CREW_CONV_TAPS_MAX * GROUP];
    padded p;
    if (!padded_for(cx, g, &p)) return;
    for (int64_t f0 = 0; f0 < out_c; f0 += GROUP) {
        const int64_t n = out_c - f0 < GROUP ? out_c - f0 : GROUP, whole = n - n % LANES;
        kernel_group(kernel, taps, out_c, f0, n, bf16, kg);
        for (int64_t b = 0; b < g->batch; b++) {
            pad_sample(x, g, b, bf16, &p);
            for (int64_t f = 0; f < whole; f += LANES)
                BY_TAPS(taps, forward_group, &p, g, kg, bias, y, out_c, b, f0, n, f);
            for (int64_t f = whole; f < n; f++) /* the filters past the last whole lane group */
                for (int64_t oh = 0; oh < g->out_h; oh++)
                    for (int64_t ow = 0; ow < g->out_w; ow++) {
                        const float *corner = corner_of(&p, g, oh, ow);
                        float acc = kg[f] * corner[p.off[0]];
                        for (int64_t t = 1; t < taps; t++) acc = acc + kg[t * n + f] * corner[p.off[t]];
                        y[((b * g->out_h + oh) * g->out_w + ow) * out_c + f0 + f] = bias ? bias[f0 + f] + acc : acc;
                    }
        }
    }
}

/* One sample's Σ over its output positions of taps ⊗ dy, filters f .. f + LANES of the group at f0,
 * into part [taps, n], the sums in registers where TAPS is a constant (as FORWARD_GROUP's kernel). */
#define FILTER_GRAD_GROUP(TAPS, SIZE)                                                                               \
    do {                                                                                                            \
        lanes acc[SIZE];                                                                                            \
        for (int64_t t = 0; t < (TAPS); t++) acc[t] = ZERO;                                                         \
        for (int64_t oh = 0; oh < g->out_h; oh++)                                                                   \
            for (int64_t ow = 0; ow < g->out_w; ow++) {                                                             \
                const float *corner = corner_of(p, g, oh, ow);                                                      \
                lanes dv = load(dy + ((b * g->out_h + oh) * g->out_w + ow) * out_c + f0 + f);                       \
                if (bf16)                                                                                           \
                    for (int i = 0; i < LANES; i++) dv[i] = crew_bf16_round(dv[i]);                                 \
                for (int64_t t = 0; t < (TAPS); t++) acc[t] = acc[t] + dv * corner[p->off[t]];                      \
            }                                                                                                       \
        for (int64_t t = 0; t < (TAPS); t++) store(part + t * n + f, acc[t]);                                       \
    } while (0)

static void filter_grad_group_9(const padded *p, const float *dy, const crew_window *g, int64_t out_c, int64_t b,
                                int64_t f0, int64_t n, int64_t f, int bf16, float *part)
{
    FILTER_GRAD_GROUP(9, 9);
}

static void filter_grad_group_27(const padded *p, const float *dy, const crew_window *g, int64_t out_c, int64_t b,
                                 int64_t f0, int64_t n, int64_t f, int bf16, float *part)
{
    FILTER_GRAD_GROUP(27, 27);
}

static void filter_grad_group(const padded *p, const float *dy, const crew_window *g, int64_t out_c, int64_t b,
                              int64_t f0, int64_t n, int64_t f, int bf16, float *part)
{
    const int64_t taps = g->k_h * g->k_w * g->in_c;
    FILTER_GRAD_GROUP(taps, CREW_CONV_TAPS_MAX);
}

/* One sample's Σ over its output positions of taps ⊗ dy, filters f0 .. f0 + n, into part [taps, n]
 * (p: the sample, padded): each sum over the positions in row-major order, from +0. */
static void sample_filter_grad(const padded *p, const float *dy, const crew_window *g, int64_t out_c, int64_t b,
                               int64_t f0, int64_t n, int bf16, float *part)
{
    const int64_t taps = g->k_h * g->k_w * g->in_c, whole = n - n % LANES;
    for (int64_t f = 0; f < whole; f += LANES)
        BY_TAPS(taps, filter_grad_group, p, dy, g, out_c, b, f0, n, f, bf16, part);
    for (int64_t f = whole; f < n; f++) { /* the filters past the last whole lane group */
        for (int64_t t = 0; t < taps; t++) part[t * n + f] = 0.0f;
        for (int64_t oh = 0; oh < g->out_h; oh++)
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                const float *corner = corner_of(p, g, oh, ow);
                const float raw = dy[((b * g->out_h + oh) * g->out_w + ow) * out_c + f0 + f];
                const float d = bf16 ? crew_bf16_round(raw) : raw;
                for (int64_t t = 0; t < taps; t++) part[t * n + f] = part[t * n + f] + d * corner[p->off[t]];
            }
    }
}

/* What a kernel gradient adds per sample: sample b of x padded in p, its sums of filters f0 .. f0 + n
 * into part [taps, n]. */
typedef struct sample_sums {
    const float *x, *dy;
    const int32_t *argmax;      /* conv_taps_pool_grads' (and bias below), NULL for conv_taps_filter_grad */
    struct bias_sums *bias;
    const crew_window *g;
    int64_t out_c;
    int bf16;
} sample_sums;

static void sample_pool_grads(const padded *p, const float *dy, const int32_t *argmax, const crew_window *g,
                              int64_t out_c, int64_t b, int64_t f0, int64_t n, int bf16, float *part,
                              struct bias_sums *bs);

/* The kernel gradient of filters f0 .. f0 + n into total [taps, n]: each sample's sums added in
 * sample order, or, with `block`, each block of that many samples summed from zero and added. */
static void kernel_sums(const sample_sums *w, padded *p, int64_t block, int64_t f0, int64_t n, float *part,
                        float *sum, float *total)
{
    const crew_window *g = w->g;
    const int64_t len = g->k_h * g->k_w * g->in_c * n;
    memset(total, 0, (size_t)len * sizeof *total);
    for (int64_t b0 = 0; b0 < g->batch; b0 += block ? block : g->batch) {
        const int64_t b1 = block && b0 + block < g->batch ? b0 + block : g->batch;
        float *into = block ? sum : total; /* a block sums on its own, then joins the total */
        if (block) memset(sum, 0, (size_t)len * sizeof *sum);
        for (int64_t b = b0; b < b1; b++) {
            pad_sample(w->x, g, b, w->bf16, p);
            if (w->argmax)
                sample_pool_grads(p, w->dy, w->argmax, g, w->out_c, b, f0, n, w->bf16, part, w->bias);
            else
                sample_filter_grad(p, w->dy, g, w->out_c, b, f0, n, w->bf16, part);
            for (int64_t i = 0; i < len; i++) into[i] = into[i] + part[i];
        }
        if (block)
            for (int64_t i = 0; i < len; i++) total[i] = total[i] + sum[i];
    }
}

void cpu_conv_taps_filter_grad(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                               int64_t out_c)
{
    cpu_ctx *cx = ctx;
    const int64_t taps = g->k_h * g->k_w * g->in_c;
    float part[CREW_CONV_TAPS_MAX * GROUP], sum[CREW_CONV_TAPS_MAX * GROUP], total[CREW_CONV_TAPS_MAX * GROUP];
    const sample_sums w = {x, dy, NULL, NULL, g, out_c, cx->bf16};
    padded p;
    if (!padded_for(cx, g, &p)) return;
    for (int64_t f0 = 0; f0 < out_c; f0 += GROUP) {
        const int64_t n = out_c - f0 < GROUP ? out_c - f0 : GROUP;
        kernel_sums(&w, &p, cx->sum_block > 0 ? cx->sum_block : 0, f0, n, part, sum, total);
        for (int64_t t = 0; t < taps; t++) memcpy(dkernel + t * out_c + f0, total + t * n, (size_t)n * sizeof *total);
    }
}

/* ---- a convolution of few taps, its relu and a 2x2 max pool that tiles its output, in one pass
 * (backend.h's conv_taps_pool_forward and conv_taps_pool_grads): the convolution's output, the
 * largest tensor of a CNN, is never written. Each pooled position computes its window's four
 * output positions as conv_taps_forward does (the same bits), relu, and the pool's maximum and
 * arg-max as maxpool_forward of relu(x) does (the first strict maximum in window order, −1 where
 * it is not positive); the arg-max is the index into the convolution's output, as the pool keeps
 * it. The gradients visit only what the pool sent back, in the order in which the layers one after
 * the other would add it (sample_pool_grads): the same bits, so a model computes the same numbers
 * whether a pipeline's stage boundary falls inside the three layers or not. */

typedef int32_t lane_ints __attribute__((vector_size(LANES * sizeof(int32_t)), aligned(sizeof(int32_t))));

#define load_ints(p) (*(const lane_ints *)(p))
#define store_ints(p, v) (*(lane_ints *)(p) = (v))
#define bits(v) ((lane_ints)(v))
#define floats(v) ((lanes)(v))
/* where m (all ones or zero per lane): a, else b */
#define pick(m, a, b) floats((bits(a) & (m)) | (bits(b) & ~(m)))
#define pick_ints(m, a, b) (((a) & (m)) | ((b) & ~(m)))

/* 0, 1, .. LANES − 1 */
static const lane_ints IOTA = {0, 1, 2, 3,
#if LANES > 4
                               4, 5, 6, 7,
#endif
#if LANES > 8
                               8, 9, 10, 11, 12, 13, 14, 15
#endif
};
/* every bit set: a mask of every lane, and −1 in each */
static const lane_ints ONES = {-1, -1, -1, -1,
#if LANES > 4
                               -1, -1, -1, -1,
#endif
#if LANES > 8
                               -1, -1, -1, -1, -1, -1, -1, -1
#endif
};

/* What a lane group of the one pass needs of sample b: its padded values, the filters' group at f0
 * (kg [taps, n], rounded) and the output's. */
typedef struct pool_pass {
    const padded *p;
    const crew_window *g;
    const float *kg, *bias; /* bias: the layer's, or NULL */
    float *y;
    int32_t *argmax;
    int64_t out_c, b, f0, n, taps;
} pool_pass;

/* Output position k (row-major in the pooled window (ph, pw)): its corner in the padded sample and
 * its index's base into the convolution's output. */
#define WINDOW_CELL(w, ph, pw, k, corner, pos)                                                                      \
    const int64_t oh_##k = 2 * (ph) + (k) / 2, ow_##k = 2 * (pw) + (k) % 2;                                         \
    const float *corner = corner_of((w)->p, (w)->g, oh_##k, ow_##k);                                                \
    const int64_t pos = (((w)->b * (w)->g->out_h + oh_##k) * (w)->g->out_w + ow_##k) * (w)->out_c

/* Filters f .. f + LANES of the group through every pooled window of the sample, the kernel's
 * values kept in registers (kv) where TAPS is a constant: they were loaded again for each of a
 * window's four cells, and the cells' taps copied out first. The products and the sums as
 * conv_taps_forward's, in the same order. A macro for the same reason as load and store. */
#define POOL_FORWARD_GROUP(TAPS, SIZE)                                                                              \
    do {                                                                                                            \
        const int64_t ph_n_ = w->g->out_h / 2, pw_n_ = w->g->out_w / 2;                                             \
        lanes kv[SIZE];                                                                                             \
        for (int64_t t = 0; t < (TAPS); t++) kv[t] = load(w->kg + t * w->n + f);                                    \
        const lanes bv = w->bias ? load(w->bias + w->f0 + f) : ZERO;                                                \
        for (int64_t ph = 0; ph < ph_n_; ph++)                                                                      \
            for (int64_t pw = 0; pw < pw_n_; pw++) {                                                                \
                lanes best = ZERO;                                                                                  \
                lane_ints at = {0};                                                                                 \
                for (int k = 0; k < 4; k++) {                                                                       \
                    WINDOW_CELL(w, ph, pw, k, corner, pos);                                                         \
                    lanes acc = kv[0] * corner[w->p->off[0]];                                                       \
                    for (int64_t t = 1; t < (TAPS); t++) acc = acc + kv[t] * corner[w->p->off[t]];                  \
                    const lanes v = w->bias ? bv + acc : acc;                                                       \
                    const lanes r = floats(bits(v) & (v > ZERO)); /* relu: v where v > 0, else +0 */                \
                    const lane_ints idx = IOTA + (int32_t)(pos + w->f0 + f);                                        \
                    const lane_ints gt = k ? r > best : ONES; /* the first cell seeds */                            \
                    best = pick(gt, r, best);                                                                       \
                    at = pick_ints(gt, idx, at);                                                                    \
                }                                                                                                   \
                const int64_t o = ((w->b * ph_n_ + ph) * pw_n_ + pw) * w->out_c + w->f0 + f;                        \
                store(w->y + o, best);                                                                              \
                store_ints(w->argmax + o, pick_ints(best > ZERO, at, ONES));                                        \
            }                                                                                                       \
    } while (0)

static void pool_forward_group_9(const pool_pass *w, int64_t f)
{
    POOL_FORWARD_GROUP(9, 9); /* a 3x3 kernel over one channel: the grey-scale CNN's first layer */
}

static void pool_forward_group_27(const pool_pass *w, int64_t f) { POOL_FORWARD_GROUP(27, 27); }

static void pool_forward_group(const pool_pass *w, int64_t f) { POOL_FORWARD_GROUP(w->taps, CREW_CONV_TAPS_MAX); }

/* The filters past the last whole lane group, one at a time. */
static void pool_forward_tail(const pool_pass *w, int64_t f)
{
    const int64_t ph_n = w->g->out_h / 2, pw_n = w->g->out_w / 2;
    for (int64_t ph = 0; ph < ph_n; ph++)
        for (int64_t pw = 0; pw < pw_n; pw++) {
            float best = 0.0f;
            int32_t at = -1;
            for (int k = 0; k < 4; k++) {
                WINDOW_CELL(w, ph, pw, k, corner, pos);
                float acc = w->kg[f] * corner[w->p->off[0]];
                for (int64_t t = 1; t < w->taps; t++) acc = acc + w->kg[t * w->n + f] * corner[w->p->off[t]];
                const float r = crew_act_relu(w->bias ? w->bias[w->f0 + f] + acc : acc);
                if (k == 0 || r > best) {
                    best = r;
                    at = (int32_t)(pos + w->f0 + f);
                }
            }
            const int64_t o = ((w->b * ph_n + ph) * pw_n + pw) * w->out_c + w->f0 + f;
            w->y[o] = best;
            w->argmax[o] = best > 0.0f ? at : -1;
        }
}

void cpu_conv_taps_pool_forward(void *ctx, const float *x, const float *kernel, const float *bias, float *y,
                                int32_t *argmax, const crew_window *g, int64_t out_c)
{
    cpu_ctx *cx = ctx;
    const int bf16 = cx->bf16;
    const int64_t taps = g->k_h * g->k_w * g->in_c;
    float kg[CREW_CONV_TAPS_MAX * GROUP];
    padded p;
    if (!padded_for(cx, g, &p)) return;
    for (int64_t f0 = 0; f0 < out_c; f0 += GROUP) {
        const int64_t n = out_c - f0 < GROUP ? out_c - f0 : GROUP, whole = n - n % LANES;
        kernel_group(kernel, taps, out_c, f0, n, bf16, kg);
        for (int64_t b = 0; b < g->batch; b++) {
            pad_sample(x, g, b, bf16, &p);
            const pool_pass w = {&p, g, kg, bias, y, argmax, out_c, b, f0, n, taps};
            for (int64_t f = 0; f < whole; f += LANES) BY_TAPS(taps, pool_forward_group, &w, f);
            for (int64_t f = whole; f < n; f++) pool_forward_tail(&w, f);
        }
    }
}

/* The bias gradient as conv_taps_forward's layer takes it from dy without the pool (col_sum over the
 * convolution's output positions, the whole batch in order, or in blocks of `block` positions,
 * each block from zero and added to the sum before): s [n] the sum, p [n] the open block's. */
struct bias_sums {
    float *s, *p;
    int64_t block, open; /* open: the block being summed into p, −1 before the first */
};
typedef struct bias_sums bias_sums;

static void bias_close(bias_sums *bs, int64_t n)
{
    if (bs->block && bs->open >= 0)
        for (int64_t f = 0; f < n; f++) bs->s[f] = bs->s[f] + bs->p[f];
}

/* One sample's kernel gradient sum, filters f0 .. f0 + n, into part [taps, n], and its terms of the
 * bias gradient into bs (p: the sample, padded). The convolution's output positions in row-major
 * order, as conv_taps_filter_grad and col_sum take them from the pool's dx: each pooled row's top
 * output row, then its bottom one, and in each a window's left position, then its right. Only a
 * window's winner has a gradient there; the other positions' terms are 0, and adding 0 to a sum
 * that started at +0 leaves it as it is, so they are skipped (added as +0).
 *
 * One lane group of filters at a time through all the sample's positions, its taps' sums held in
 * vector registers (pool_lane_group): with the positions outside and the filters inside, each sum
 * was loaded and stored again at every position, and the stores bounded the loop (the demo CNN's
 * largest pass outside GEMM, 7.7% of a step). Every sum still takes the positions in the order
 * above, so the bits are the same. */

/* The sample's bias block state at its start, and what pool_lane_group needs of the sample. */
typedef struct pool_sample {
    const padded *p;
    const float *dy;
    const int32_t *argmax;
    const crew_window *g;
    int64_t out_c, b, f0, taps;
    int bf16;
    int64_t block, open; /* bias_sums' block and the block open when the sample starts */
} pool_sample;

/* Filters f .. f + LANES (of the group at f0) through the sample: acc[t] the taps' sums, from and
 * into part's rows; the bias's open block sum and total, from and into bs's. TAPS: the taps, a
 * constant where the caller names one, so that acc lives in registers. Returns the block open at
 * the end. A macro for the same reason as load and store. */
#define POOL_LANE_GROUP(TAPS, SIZE)                                                                                 \
    do {                                                                                                            \
        const crew_window *g_ = w->g;                                                                               \
        const int64_t ph_n_ = g_->out_h / 2, pw_n_ = g_->out_w / 2, n_ = w->out_c;                                  \
        lanes acc[SIZE];                                                                                            \
        for (int64_t t = 0; t < (TAPS); t++) acc[t] = load(part + t * n + f);                                       \
        lanes sum = load(bs->s + f), open_sum = load(bs->p + f);                                                    \
        int64_t open = w->open;                                                                                     \
        for (int64_t oh = 0; oh < 2 * ph_n_; oh++)                                                                  \
            for (int64_t ow = 0; ow < 2 * pw_n_; ow++) {                                                            \
                const int64_t r = (w->b * g_->out_h + oh) * g_->out_w + ow;                                         \
                const int64_t o = ((w->b * ph_n_ + oh / 2) * pw_n_ + ow / 2) * n_ + w->f0 + f;                      \
                const float *corner = corner_of(w->p, g_, oh, ow);                                                  \
                const lane_ints won = load_ints(w->argmax + o) == IOTA + (int32_t)(r * n_ + w->f0 + f);             \
                lanes dv = load(w->dy + o);                                                                         \
                if (w->bf16)                                                                                        \
                    for (int i = 0; i < LANES; i++) dv[i] = crew_bf16_round(dv[i]);                                 \
                dv = floats(bits(dv) & won);                                                                        \
                const lanes raw = floats(bits(load(w->dy + o)) & won);                                              \
                if (w->block && r / w->block != open) { /* the next block opens; the one before joins the sum */    \
                    if (open >= 0) sum = sum + open_sum;                                                            \
                    open_sum = ZERO;                                                                                \
                    open = r / w->block;                                                                            \
                }                                                                                                   \
                if (w->block)                                                                                       \
                    open_sum = open_sum + raw;                                                                      \
                else                                                                                                \
                    sum = sum + raw;                                                                                \
                for (int64_t t = 0; t < (TAPS); t++) acc[t] = acc[t] + dv * corner[w->p->off[t]];                   \
            }                                                                                                       \
        for (int64_t t = 0; t < (TAPS); t++) store(part + t * n + f, acc[t]);                                       \
        store(bs->s + f, sum);                                                                                      \
        store(bs->p + f, open_sum);                                                                                 \
        end_open = open;                                                                                            \
    } while (0)

static int64_t pool_lane_group_9(const pool_sample *w, bias_sums *bs, int64_t n, int64_t f, float *part)
{
    int64_t end_open;
    POOL_LANE_GROUP(9, 9); /* a 3x3 kernel over one channel: the grey-scale CNN's first layer */
    return end_open;
}

static int64_t pool_lane_group_27(const pool_sample *w, bias_sums *bs, int64_t n, int64_t f, float *part)
{
    int64_t end_open;
    POOL_LANE_GROUP(27, 27);
    return end_open;
}

static int64_t pool_lane_group(const pool_sample *w, bias_sums *bs, int64_t n, int64_t f, float *part)
{
    int64_t end_open;
    POOL_LANE_GROUP(w->taps, CREW_CONV_TAPS_MAX);
    return end_open;
}

/* The filters past the last whole lane group, one at a time, in the same order. */
static int64_t pool_tail(const pool_sample *w, bias_sums *bs, int64_t n, int64_t f, float *part)
{
    const crew_window *g = w->g;
    const int64_t ph_n = g->out_h / 2, pw_n = g->out_w / 2;
    float sum = bs->s[f], open_sum = bs->p[f];
    int64_t open = w->open;
    for (int64_t oh = 0; oh < 2 * ph_n; oh++)
        for (int64_t ow = 0; ow < 2 * pw_n; ow++) {
            const int64_t r = (w->b * g->out_h + oh) * g->out_w + ow;
            const int64_t o = ((w->b * ph_n + oh / 2) * pw_n + ow / 2) * w->out_c + w->f0 + f;
            if (w->block && r / w->block != open) {
                if (open >= 0) sum = sum + open_sum;
                open_sum = 0.0f;
                open = r / w->block;
            }
            if (w->argmax[o] != (int32_t)(r * w->out_c + w->f0 + f)) continue;
            const float raw = w->dy[o], d = w->bf16 ? crew_bf16_round(raw) : raw;
            if (w->block)
                open_sum = open_sum + raw;
            else
                sum = sum + raw;
            const float *corner = corner_of(w->p, g, oh, ow);
            for (int64_t t = 0; t < w->taps; t++) part[t * n + f] = part[t * n + f] + d * corner[w->p->off[t]];
        }
    bs->s[f] = sum;
    bs->p[f] = open_sum;
    return open;
}

static void sample_pool_grads(const padded *p, const float *dy, const int32_t *argmax, const crew_window *g,
                              int64_t out_c, int64_t b, int64_t f0, int64_t n, int bf16, float *part,
                              struct bias_sums *bs)
{
    const int64_t taps = g->k_h * g->k_w * g->in_c, whole = n - n % LANES;
    const pool_sample w = {p, dy, argmax, g, out_c, b, f0, taps, bf16, bs->block, bs->open};
    int64_t open = bs->open;
    memset(part, 0, (size_t)(taps * n) * sizeof *part);
    for (int64_t f = 0; f < whole; f += LANES)
        open = BY_TAPS(taps, pool_lane_group, &w, bs, n, f, part);
    for (int64_t f = whole; f < n; f++) open = pool_tail(&w, bs, n, f, part);
    bs->open = open;
}

void cpu_conv_taps_pool_grads(void *ctx, const float *x, const float *dy, const int32_t *argmax, float *dkernel,
                              float *dbias, const crew_window *g, int64_t out_c)
{
    cpu_ctx *cx = ctx;
    const int64_t block = cx->sum_block > 0 ? cx->sum_block : 0;
    const int64_t taps = g->k_h * g->k_w * g->in_c;
    float part[CREW_CONV_TAPS_MAX * GROUP], sum[CREW_CONV_TAPS_MAX * GROUP], total[CREW_CONV_TAPS_MAX * GROUP];
    float bias_s[GROUP], bias_p[GROUP];
    padded p;
    if (!padded_for(cx, g, &p)) return;
    for (int64_t f0 = 0; f0 < out_c; f0 += GROUP) {
        const int64_t n = out_c - f0 < GROUP ? out_c - f0 : GROUP;
        bias_sums bs = {bias_s, bias_p, block, -1};
        memset(bias_s, 0, sizeof bias_s);
        memset(bias_p, 0, sizeof bias_p);
        /* the kernel's sums as conv_taps_filter_grad's; the bias's as col_sum's, over the batch */
        const sample_sums w = {x, dy, argmax, &bs, g, out_c, cx->bf16};
        kernel_sums(&w, &p, block, f0, n, part, sum, total);
        bias_close(&bs, n);
        for (int64_t t = 0; t < taps; t++) memcpy(dkernel + t * out_c + f0, total + t * n, (size_t)n * sizeof *total);
        if (dbias) memcpy(dbias + f0, bias_s, (size_t)n * sizeof *bias_s);
    }
}
