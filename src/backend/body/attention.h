/* attention.h — causal attention's softmax and its backward, along row t of a [T, T] block of
 * scores (backend.h's attention_forward and attention_backward, between their GEMMs): over s <= t,
 * zeros above the diagonal.
 *
 * A warp per row on a GPU, its lanes taking s = lane, lane + 32, ... (the crew_att_lane_* pieces);
 * the CPU computes the same 32 lanes' partials side by side and folds them as the warp's butterfly
 * does (backend/cpu/cpu_lanes.h), through the per-element formulas (crew_att_exp, crew_att_prob,
 * crew_att_grad), its exponentials in a loop of their own so that they vectorise. The two give the
 * same bits, which tests/test_kernel_bodies.c checks. att is float32 or
 * bfloat16 (crew_bf16, backend.h): crew_att_load reads either. body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_ATTENTION_H
#define CREW_BACKEND_BODY_ATTENTION_H

#include "backend/body/body.h"
#include "backend/body/elementwise.h"
#include "backend/exp_poly.h"

CREW_BODY float crew_att_exp(float score, float max) { return crew_exp_poly(score - max); }
CREW_BODY float crew_att_prob(float e, float inv) { return e * inv; }
/* ds = att ⊙ (datt − Σ_s att·datt) */
CREW_BODY float crew_att_grad(float a, float d, float dot) { return a * (d - dot); }

/* att[s] as float: bf16 (1) or float32 (0) */
CREW_BODY float crew_att_load(const void *att, int bf16, int64_t s)
{
    return bf16 ? crew_body_bf16_widen(((const crew_bf16 *)att)[s]) : ((const float *)att)[s];
}

/* The lane's largest score of row[0 .. t] (a maximum is exact in any order), from row[0] (lane 0
 * goes on from its second element) */
CREW_BODY float crew_att_lane_max(const float *row, int64_t t, int64_t lane, int64_t lanes)
{
    float mx = row[0];
    for (int64_t s = lane ? lane : lanes; s <= t; s += lanes) mx = row[s] > mx ? row[s] : mx;
    return mx;
}

/* The lane's exponentials, back into the row, and their partial sum */
CREW_BODY float crew_att_lane_exp(float *row, int64_t t, float mx, int64_t lane, int64_t lanes)
{
    float sum = 0.0f;
    for (int64_t s = lane; s <= t; s += lanes) {
        float e = crew_att_exp(row[s], mx);
        row[s] = e;
        sum += e;
    }
    return sum;
}

/* The lane's partial of Σ_s att·datt over s <= t */
CREW_BODY float crew_att_lane_dot(const void *att, int bf16, const float *dr, int64_t t, int64_t lane, int64_t lanes)
{
    float dot = 0.0f;
    for (int64_t s = lane; s <= t; s += lanes) dot += crew_att_load(att, bf16, s) * dr[s];
    return dot;
}

/* The lane's elements of the row's ds, in place of datt, 0 above the diagonal */
CREW_BODY void crew_att_lane_grad(const void *att, int bf16, float *dr, int64_t t, int64_t T, float dot, int64_t lane,
                                  int64_t lanes)
{
    for (int64_t s = lane; s <= t; s += lanes) dr[s] = crew_att_grad(crew_att_load(att, bf16, s), dr[s], dot);
    for (int64_t s = t + 1 + lane; s < T; s += lanes) dr[s] = 0.0f;
}

#endif
