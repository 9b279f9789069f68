/* cpu_attention.c — causal multi-head self-attention, one (sample, head) at a time, its three
 * products as OpenBLAS GEMMs on strided views of qkv (no copies into per-head buffers).
 *
 * Shapes (backend.h): qkv [batch, T, 3C] holding q | k | v, head h in columns [h·d, (h+1)·d) of
 * each; att and datt [batch, heads, T, T]; y and dy [batch, T, C]; C = heads · d.
 * The scores are computed for the whole T × T square and the softmax then zeroes the part above
 * the diagonal (s > t): a GEMM over the square is faster than T dot products of growing length,
 * and the masked half never reaches a result. Every sum runs in a fixed order, so results do not
 * depend on the batch's split across replicas (each sample is its own set of products). */
#include <math.h>

#include "backend/body/attention.h"
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

/* Row t of a [T, T] score matrix becomes softmax over s ≤ t (max subtracted first, so exp never
 * overflows), and zeros above the diagonal: backend/body/attention.h's formulas, the one-lane case
 * of the CUDA kernel's warp per row, but for the exponentials, which get a loop of their own. */
static void causal_softmax(float *a, int64_t T)
{
    for (int64_t t = 0; t < T; t++) {
        float *row = a + t * T;
        const float max = crew_att_lane_max(row, t, 0, 1);
        for (int64_t s = 0; s <= t; s++) row[s] = crew_att_exp(row[s], max); /* vectorised */
        float sum = 0.0f;
        for (int64_t s = 0; s <= t; s++) sum += row[s];
        float inv = 1.0f / sum;
        for (int64_t s = 0; s <= t; s++) row[s] = crew_att_prob(row[s], inv);
        for (int64_t s = t + 1; s < T; s++) row[s] = 0.0f;
    }
}

/* With att in bfloat16 (backend.h), its products are bfloat16 GEMMs whatever the device's precision;
 * else the device's precision. */
static int products_in_bf16(void *ctx, crew_dtype att_type)
{
    return att_type == CREW_DT_BF16 || ((cpu_ctx *)ctx)->bf16;
}

void cpu_attention_forward(void *ctx, const float *qkv, void *att, crew_dtype att_type, float *scores, float *y,
                           int64_t batch, int64_t T, int64_t heads, int64_t d)
{
    const float scale = 1.0f / sqrtf((float)d);
    const int bf16 = ((cpu_ctx *)ctx)->bf16, bf16_att = products_in_bf16(ctx, att_type);
    const int keep16 = att_type == CREW_DT_BF16;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            head_view hv = head_at(b, h, T, heads, d);
            const int64_t C = hv.C, ld = hv.ld;
            const float *q = qkv + hv.qkv, *k = q + C, *v = q + 2 * C;
            float *a = (keep16 ? scores : (float *)att) + hv.att;
            gemm(ctx, bf16, 0, 1, T, T, d, scale, q, ld, k, ld, a, T); /* a = q·kᵀ/√d  [T, T] */
            causal_softmax(a, T);
            if (keep16) { /* att keeps them in bfloat16; the product below rounds a to the same values */
                crew_bf16 *a16 = (crew_bf16 *)att + hv.att;
                for (int64_t i = 0; i < T * T; i++) crew_body_to_bf16(a, a16, i);
            }
            if (y) gemm(ctx, bf16_att, 0, 0, T, d, T, 1.0f, a, T, v, ld, y + hv.out, C); /* y_h = a·v  [T, d] */
        }
}

void cpu_attention_backward(void *ctx, const float *dy, const float *qkv, const void *att, crew_dtype att_type,
                            float *datt, float *dqkv, int64_t batch, int64_t T, int64_t heads, int64_t d)
{
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
            gemm(ctx, bf16, 0, 1, T, T, d, 1.0f, dyh, C, v, ld, da, T);     /* d att = dy_h · vᵀ  [T, T] */
            /* dv = attᵀ · dy_h  [T, d]; bfloat16 att, widened, needs no rounding */
            cpu_gemm_rounding(ctx, bf16_att && att_type != CREW_DT_BF16, bf16_att, 1, 0, T, d, T, 1.0f, a, T, dyh, C,
                              0.0f, dv, ld);
            /* through the softmax: ds = att ⊙ (d att − Σ_s att·d att), row by row; 0 above the diagonal */
            for (int64_t t = 0; t < T; t++) {
                const float *ar = a + t * T;
                float *dr = da + t * T;
                crew_att_lane_grad(ar, 0, dr, t, T, crew_att_lane_dot(ar, 0, dr, t, 0, 1), 0, 1);
            }
            gemm(ctx, bf16, 0, 0, T, d, T, scale, da, T, k, ld, dq, ld); /* dq = ds · k / √d */
            gemm(ctx, bf16, 1, 0, T, d, T, scale, da, T, q, ld, dk, ld); /* dk = dsᵀ · q / √d */
        }
}
