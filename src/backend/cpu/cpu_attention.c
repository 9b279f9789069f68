/* cpu_attention.c — causal multi-head self-attention, one (sample, head) at a time, read where qkv
 * holds it (no copies into per-head buffers but kᵀ or vᵀ).
 *
 * Shapes (backend.h): qkv [batch, T, 3C] holding q | k | v, head h in columns [h·d, (h+1)·d) of
 * each; att and datt [batch, heads, T, T]; y and dy [batch, T, C]; C = heads · d.
 *
 * In float32 the products are cpu_attention_tiles.c's register tiles, a head's rows a tile at a
 * time: its scores, their softmax and its rows of y (forward), or its rows of d att, their
 * softmax backward and its rows of dq (backward) one after the other while the tile's rows are in
 * the cache; dv and dk sum over columns, after all rows. Backward's d att of every head lives in
 * the first [T, T] of the caller's scratch, which stays in the cache, and the next head's operands
 * are fetched while a head computes (ahead, below). With bfloat16 products (--precision bf16,
 * or att kept in bfloat16) they are GEMMs (cpu_gemm.c, which rounds their operands) on strided
 * views, and the masked half is skipped by blocks: rows t in [t0, t1) of the scores need only
 * columns s < t1, and a product summing over the T × T matrix sums only over its non-zero part.
 * A block of CPU_ATTENTION_BLOCK rows keeps the GEMMs large enough to run near their peak, and
 * does about 5/8 of the square's work at T = 128 (1/2 + BLOCK/2T). The skipped entries are what the
 * softmax sets to 0, and the products leave out only terms that are 0. Every sum runs in a fixed
 * order set by T alone, so results do not depend on the batch's split across replicas (each
 * sample is its own set of products). */
#include "backend/cpu/cpu_wide_vectors.h" /* first: the pragma must precede the bodies */

#include <math.h>
#include <stdlib.h>

#include "backend/body/attention.h"
#include "backend/cpu/cpu_lanes.h"
#include "backend/cpu/cpu_ops.h"

/* c = alpha · op(a) · op(b), its operands rounded to bfloat16 when bf16 is 1 (cpu_gemm.c) */
static void gemm(void *ctx, int bf16, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    cpu_gemm_rounding(ctx, bf16, bf16, ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc);
}

/* One (sample, head)'s views: its q, k, v columns of qkv (leading dimension 3C), its [T, T]
 * block of an attention-shaped array, and its d columns of a [batch, T, C] array. */
typedef struct head_view {
    int64_t C, ld;
    size_t qkv, att, out; /* offsets into qkv, att, y */
} head_view;

static head_view head_at(int64_t b, int64_t h, int64_t T, int64_t heads, int64_t d)
{
    int64_t C = heads * d;
    return (head_view){C, 3 * C, (size_t)(b * T * 3 * C + h * d), (size_t)((b * heads + h) * T * T),
                       (size_t)(b * T * C + h * d)};
}

/* Row t's causal part s ≤ t in whole strips of the 32 lanes, [0, up), where those fit in the row:
 * then every loop below runs over whole strips, and none ends in a scalar remainder (at T = 128 a
 * row's remainder was as long as its vector part, its exponentials one at a time); 0 where they do
 * not fit (the last rows of a T that is no multiple of 32), and the rows' loops run to t. */
static int64_t strips_end(int64_t t, int64_t T)
{
    const int64_t up = (t + CPU_LANES) / CPU_LANES * CPU_LANES;
    return up <= T ? up : 0;
}

/* Row t of a [T, T] score matrix becomes softmax over s ≤ t (max subtracted first, so exp never
 * overflows), and zeros above the diagonal: backend/body/attention.h's formulas, its maximum and
 * sum in the order of the CUDA kernel's warp per row (cpu_lanes.h; a maximum is exact in any
 * order). Over whole strips (strips_end) the strips below the diagonal's take every lane, and the
 * diagonal's strip masks its lanes past t by a 32-bit lane index (a 64-bit column index per lane
 * cost the loops a second vector of indices each): there the elements past t take part as −∞ in the
 * maximum (never greater than the row's first score, where every lane starts) and as +0 in the sum
 * (a lane's partial, never −0, is the same with +0 added), and their probability is written 0.
 * Each exponential is added to its lane's partial as it is written, in the lanes' order. */
static void softmax_strips(float *row, int64_t t, int64_t up)
{
    const int64_t diag = up - CPU_LANES; /* the diagonal's strip [diag, up) */
    const int keep = (int)(t - diag);    /* its lanes l ≤ keep hold scores */
    float p[CPU_LANES];
    for (int l = 0; l < CPU_LANES; l++) p[l] = row[0];
    for (int64_t s0 = 0; s0 < diag; s0 += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) p[l] = row[s0 + l] > p[l] ? row[s0 + l] : p[l];
    for (int l = 0; l < CPU_LANES; l++) {
        const float x = l <= keep ? row[diag + l] : -INFINITY;
        p[l] = x > p[l] ? x : p[l];
    }
    const float max = cpu_lanes_max(p);
    cpu_lanes_zero(p);
    for (int64_t s0 = 0; s0 < diag; s0 += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) {
            const float e = crew_att_exp(row[s0 + l], max);
            row[s0 + l] = e;
            p[l] += e;
        }
    for (int l = 0; l < CPU_LANES; l++) {
        const float e = l <= keep ? crew_att_exp(row[diag + l], max) : 0.0f;
        row[diag + l] = e;
        p[l] += e;
    }
    const float inv = 1.0f / cpu_lanes_sum(p);
    for (int64_t s = 0; s < diag; s++) row[s] = crew_att_prob(row[s], inv);
    for (int l = 0; l < CPU_LANES; l++) row[diag + l] = l <= keep ? crew_att_prob(row[diag + l], inv) : 0.0f;
}

/* The same over s ≤ t where the strips do not fit (the last rows of a T that is no multiple of
 * 32): every element of [0, t] is a score, the last strip narrower */
static void softmax_tail(float *row, int64_t t)
{
    const int64_t n = t + 1;
    const float max = cpu_lanes_row_max(row, n);
    for (int64_t s = 0; s < n; s++) row[s] = crew_att_exp(row[s], max); /* vectorised */
    float p[CPU_LANES];
    cpu_lanes_zero(p);
    cpu_lanes_add(p, row, n);
    const float inv = 1.0f / cpu_lanes_sum(p);
    for (int64_t s = 0; s < n; s++) row[s] = crew_att_prob(row[s], inv);
}

/* The next head's slices, which the row loops below ask into the cache a row at a time while this
 * head computes (ahead_row). In training a head's operands come from memory: the GEMMs between two
 * attentions evict them (a layer's q, k, v, att and gradients are 15 MB at gpt_tiny's share), and a
 * head's 128 bytes of rows 1.5 KB apart are no stream the hardware's prefetchers run ahead of; at
 * gpt_tiny's share attention took 1.6x as long as where its data was in the cache. Forward asks
 * for the next head's q, k, v and the rows of att and y it will write, backward for its q, k, v, dy
 * and att (its gradients' rows as well made backward slower). A row at a time, not a sweep's rows
 * at once: a burst of hundreds of prefetches held the core's line-fill buffers and slowed the
 * products even where the data was in the cache. Only the timing changes: nothing prefetched is
 * read before the next head. */
#define AHEAD_SLICES 5

typedef struct ahead {
    int n;
    const float *base[AHEAD_SLICES];
    int64_t ld[AHEAD_SLICES], width[AHEAD_SLICES]; /* a row's stride and its floats */
} ahead;

static void ahead_add(ahead *a, const float *base, int64_t ld, int64_t width)
{
    a->base[a->n] = base;
    a->ld[a->n] = ld;
    a->width[a->n++] = width;
}

static void ahead_row(const ahead *a, int64_t t)
{
#if defined(__GNUC__)
    for (int i = 0; a && i < a->n; i++)
        for (int64_t c = 0; c < a->width[i]; c += 64 / (int64_t)sizeof(float)) {
            const float *line = a->base[i] + t * a->ld[i] + c;
            __builtin_prefetch(line, 0, 2); /* into L2: L1 holds this head's */
            __asm__ volatile("" : : "r"(line)); /* else GCC's dead-code pass drops a loop of only prefetches */
        }
#else
    (void)a, (void)t;
#endif
}

static void causal_softmax(float *a, int64_t T, int64_t t0, int64_t t1, const ahead *next)
{
    for (int64_t t = t0; t < t1; t++) {
        ahead_row(next, t);
        float *row = a + t * T;
        const int64_t up = strips_end(t, T);
        if (up)
            softmax_strips(row, t, up);
        else
            softmax_tail(row, t);
        for (int64_t s = up ? up : t + 1; s < T; s++) row[s] = 0.0f;
    }
}

/* Through the softmax, rows [t0, t1) of a head: ds = att ⊙ (d att − Σ_s att·d att), over da; 0
 * above the diagonal. Over whole strips as causal_softmax, the diagonal strip's elements past t
 * adding +0 to their lane's partial (d att there is whatever the products left, so they are
 * masked, not multiplied). */
static float softmax_backward_dot(const float *ar, const float *dr, int64_t t, int64_t up)
{
    float p[CPU_LANES]; /* Σ_s att·datt in the warp's order (crew_att_lane_dot) */
    cpu_lanes_zero(p);
    if (!up) { /* no whole strips: every element of [0, t] counts, the last strip narrower */
        for (int64_t s0 = 0; s0 <= t; s0 += CPU_LANES) {
            const int64_t w = cpu_lanes_width(t + 1, s0);
            for (int64_t l = 0; l < w; l++) p[l] += ar[s0 + l] * dr[s0 + l];
        }
        return cpu_lanes_sum(p);
    }
    const int64_t diag = up - CPU_LANES;
    const int keep = (int)(t - diag);
    for (int64_t s0 = 0; s0 < diag; s0 += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) p[l] += ar[s0 + l] * dr[s0 + l];
    for (int l = 0; l < CPU_LANES; l++) p[l] += l <= keep ? ar[diag + l] * dr[diag + l] : 0.0f;
    return cpu_lanes_sum(p);
}

static void softmax_backward(const float *a, float *da, int64_t T, int64_t t0, int64_t t1, const ahead *next)
{
    for (int64_t t = t0; t < t1; t++) {
        ahead_row(next, t);
        const float *ar = a + t * T;
        float *dr = da + t * T;
        const int64_t up = strips_end(t, T), n = up ? up : t + 1, diag = up ? up - CPU_LANES : n;
        const float dot = softmax_backward_dot(ar, dr, t, up);
        for (int64_t s = 0; s < diag; s++) dr[s] = crew_att_grad(ar[s], dr[s], dot);
        for (int64_t s = diag; s < n; s++) dr[s] = s <= t ? crew_att_grad(ar[s], dr[s], dot) : 0.0f;
        for (int64_t s = n; s < T; s++) dr[s] = 0.0f;
    }
}

/* With att in bfloat16 (backend.h), its products are bfloat16 GEMMs whatever the device's precision;
 * else the device's precision. */
static int products_in_bf16(void *ctx, crew_dtype att_type)
{
    return att_type == CREW_DT_BF16 || ((cpu_ctx *)ctx)->bf16;
}

static int64_t block_end(int64_t t0, int64_t T)
{
    return t0 + CPU_ATTENTION_BLOCK < T ? t0 + CPU_ATTENTION_BLOCK : T;
}

/* Rows of a head that go through scores, softmax and y (or d att, its backward and dq) together: a
 * multiple of the tiles' rows, 16 KB of a [128, 128] head's att */
#define SWEEP_ROWS 32

static int64_t sweep_end(int64_t t0, int64_t T) { return t0 + SWEEP_ROWS < T ? t0 + SWEEP_ROWS : T; }

/* The context's [d, T] scratch for one head's kᵀ or vᵀ; NULL, the device's pending error set, when
 * there is no room */
static float *head_scratch(cpu_ctx *x, int64_t T, int64_t d)
{
    const size_t need = (size_t)T * (size_t)d;
    if (need > x->cap_head_t) {
        float *grown = realloc(x->head_t, need * sizeof *grown);
        if (!grown) {
            x->out_of_memory = 1;
            return NULL;
        }
        x->head_t = grown;
        x->cap_head_t = need;
    }
    return x->head_t;
}

void cpu_attention_scores(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t T, int64_t d, float f,
                          float *yt, float *out)
{
    cpu_att_transpose(y, ldy, T, d, yt);
    cpu_att_rows_dot(x, ldx, yt, T, d, f, out, T, 0, T, T);
}

/* The (sample, head) after (b, h) in the loops below, or 0 past the last */
static int next_head(int64_t *b, int64_t *h, int64_t batch, int64_t heads)
{
    if (++*h == heads) *h = 0, ++*b;
    return *b < batch;
}

/* float32: one head's scores, softmax and y a sweep of rows at a time */
static void forward_tiles(cpu_ctx *x, const float *qkv, float *att, float *y, int64_t batch, int64_t T, int64_t heads,
                          int64_t d)
{
    const float scale = 1.0f / sqrtf((float)d);
    float *kt = head_scratch(x, T, d);
    if (!kt) return;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            head_view hv = head_at(b, h, T, heads, d);
            const float *q = qkv + hv.qkv, *k = q + hv.C, *v = q + 2 * hv.C;
            float *a = att + hv.att;
            ahead next = {0};
            int64_t nb = b, nh = h;
            if (next_head(&nb, &nh, batch, heads)) { /* its q, k, v, its att and y rows */
                const head_view nv = head_at(nb, nh, T, heads, d);
                for (int j = 0; j < 3; j++) ahead_add(&next, qkv + nv.qkv + j * nv.C, nv.ld, d);
                ahead_add(&next, att + nv.att, T, T);
                if (y) ahead_add(&next, y + nv.out, nv.C, d);
            }
            cpu_att_transpose(k, hv.ld, T, d, kt);
            for (int64_t t0 = 0; t0 < T; t0 = sweep_end(t0, T)) {
                const int64_t t1 = sweep_end(t0, T);
                cpu_att_rows_dot(q, hv.ld, kt, T, d, scale, a, T, t0, t1, T); /* a = q·kᵀ/√d */
                causal_softmax(a, T, t0, t1, &next);
                if (y) cpu_att_rows_mul(a, T, v, hv.ld, d, 1.0f, y + hv.out, hv.C, t0, t1); /* y_h = a·v */
            }
        }
}

/* float32: d att, its softmax backward and dq a sweep of rows at a time, then dv and dk */
static void backward_tiles(cpu_ctx *x, const float *dy, const float *qkv, const float *att, float *datt, float *dqkv,
                           int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    const float scale = 1.0f / sqrtf((float)d);
    float *vt = head_scratch(x, T, d);
    if (!vt) return;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            head_view hv = head_at(b, h, T, heads, d);
            const int64_t C = hv.C, ld = hv.ld;
            const float *q = qkv + hv.qkv, *k = q + C, *v = q + 2 * C, *a = att + hv.att, *dyh = dy + hv.out;
            /* every head's d att in the first head's [T, T] of the scratch, which stays in the cache from
             * one head to the next (a [batch, heads, T, T] of them went to memory and back: 4 MB a
             * layer at gpt_tiny's share) */
            float *da = datt, *dq = dqkv + hv.qkv, *dk = dq + C, *dv = dq + 2 * C;
            ahead next = {0};
            int64_t nb = b, nh = h;
            if (next_head(&nb, &nh, batch, heads)) { /* its q, k, v, dy and att */
                const head_view nv = head_at(nb, nh, T, heads, d);
                for (int j = 0; j < 3; j++) ahead_add(&next, qkv + nv.qkv + j * C, ld, d);
                ahead_add(&next, dy + nv.out, C, d);
                ahead_add(&next, att + nv.att, T, T);
            }
            cpu_att_transpose(v, ld, T, d, vt);
            for (int64_t t0 = 0; t0 < T; t0 = sweep_end(t0, T)) {
                const int64_t t1 = sweep_end(t0, T);
                cpu_att_rows_dot(dyh, C, vt, T, d, 1.0f, da, T, t0, t1, T); /* d att = dy_h·vᵀ */
                softmax_backward(a, da, T, t0, t1, &next);                     /* ds, over d att */
                cpu_att_rows_mul(da, T, k, ld, d, scale, dq, ld, t0, t1);      /* dq = ds·k/√d */
            }
            cpu_att_cols_mul(a, T, dyh, C, d, 1.0f, dv, ld, T);  /* dv = attᵀ·dy_h */
            cpu_att_cols_mul(da, T, q, ld, d, scale, dk, ld, T); /* dk = dsᵀ·q/√d */
        }
}

void cpu_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
                           int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    if (!products_in_bf16(ctx, att_type)) {
        forward_tiles(ctx, qkv, att, y, batch, T, heads, d);
        return;
    }
    const float scale = 1.0f / sqrtf((float)d);
    const int bf16 = ((cpu_ctx *)ctx)->bf16, bf16_att = products_in_bf16(ctx, att_type);
    const int keep16 = att_type == CREW_DT_BF16;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            head_view hv = head_at(b, h, T, heads, d);
            const int64_t C = hv.C, ld = hv.ld;
            const float *q = qkv + hv.qkv, *k = q + C, *v = q + 2 * C;
            float *a = (keep16 ? scores : (float *)att) + hv.att;
            for (int64_t t0 = 0; t0 < T; t0 = block_end(t0, T)) { /* a = q·kᵀ/√d  [T, T], s < t1 */
                const int64_t t1 = block_end(t0, T);
                gemm(ctx, bf16, 0, 1, t1 - t0, t1, d, scale, q + t0 * ld, ld, k, ld, a + t0 * T, T);
            }
            causal_softmax(a, T, 0, T, NULL);
            if (keep16) { /* att keeps them in bfloat16; the product below rounds a to the same values */
                crew_bf16 *a16 = (crew_bf16 *)att + hv.att;
                for (int64_t i = 0; i < T * T; i++) crew_body_to_bf16(a, a16, i);
            }
            for (int64_t t0 = 0; y && t0 < T; t0 = block_end(t0, T)) { /* y_h = a·v  [T, d], over s < t1 */
                const int64_t t1 = block_end(t0, T);
                gemm(ctx, bf16_att, 0, 0, t1 - t0, d, t1, 1.0f, a + t0 * T, T, v, ld, y + hv.out + t0 * C, C);
            }
        }
}

void cpu_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
                            float *datt, float *dqkv, int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    if (!products_in_bf16(ctx, att_type)) {
        backward_tiles(ctx, dy, qkv, att, datt, dqkv, batch, T, heads, d);
        return;
    }
    const float scale = 1.0f / sqrtf((float)d);
    const int bf16 = ((cpu_ctx *)ctx)->bf16, bf16_att = products_in_bf16(ctx, att_type);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            head_view hv = head_at(b, h, T, heads, d);
            const int64_t C = hv.C, ld = hv.ld;
            const float *q = qkv + hv.qkv, *k = q + C, *v = q + 2 * C;
            const float *a = att_type == CREW_DT_BF16 ? cpu_widened(ctx, 0, (const crew_bf16 *)att + hv.att, T * T)
                                                      : (const float *)att + hv.att;
            if (!a) return; /* no room to widen: out_of_memory is the device's pending error */
            const float *dyh = dy + hv.out;
            float *da = datt + hv.att;
            float *dq = dqkv + hv.qkv, *dk = dq + C, *dv = dq + 2 * C;
            for (int64_t t0 = 0; t0 < T; t0 = block_end(t0, T)) { /* d att = dy_h · vᵀ  [T, T], s < t1 */
                const int64_t t1 = block_end(t0, T);
                gemm(ctx, bf16, 0, 1, t1 - t0, t1, d, 1.0f, dyh + t0 * C, C, v, ld, da + t0 * T, T);
            }
            /* dv = attᵀ · dy_h  [T, d], rows s in [s0, s1) over t ≥ s0; bfloat16 att, widened, needs no
             * rounding */
            for (int64_t s0 = 0; s0 < T; s0 = block_end(s0, T))
                cpu_gemm_rounding(ctx, bf16_att && att_type != CREW_DT_BF16, bf16_att, 1, 0, block_end(s0, T) - s0, d,
                                  T - s0, 1.0f, a + s0 * T + s0, T, dyh + s0 * C, C, 0.0f, dv + s0 * ld, ld);
            softmax_backward(a, da, T, 0, T, NULL);
            for (int64_t t0 = 0; t0 < T; t0 = block_end(t0, T)) { /* dq = ds · k / √d, over s < t1 */
                const int64_t t1 = block_end(t0, T);
                gemm(ctx, bf16, 0, 0, t1 - t0, d, t1, scale, da + t0 * T, T, k, ld, dq + t0 * ld, ld);
            }
            for (int64_t s0 = 0; s0 < T; s0 = block_end(s0, T)) /* dk = dsᵀ · q / √d, rows [s0, s1) over t ≥ s0 */
                gemm(ctx, bf16, 1, 0, block_end(s0, T) - s0, d, T - s0, scale, da + s0 * T + s0, T, q + s0 * ld, ld,
                     dk + s0 * ld, ld);
        }
}
