/* loss.h — softmax cross-entropy and softmax along a row of logits (backend.h's softmax_xent,
 * softmax), and the embedding's bodies.
 *
 * The softmaxes run along a row: a warp per row on a GPU, whose lanes take elements lane, lane + 32,
 * ... (the crew_*_lane_* pieces here), and whose partials meet in a butterfly of shuffles (the
 * largest value and its first index; the sum); the CPU keeps the same 32 partials and folds them the
 * same way (backend/cpu/cpu_lanes.h), so the two sum in one order; tests/test_kernel_bodies.c holds
 * them to the same bits. The exponentials are crew_exp_poly's (backend/exp_poly.h), the same bits
 * on both, and a loop of them vectorises on the CPU (glibc's expf, a call per value, took half of
 * the loss's time, and a GPU's expf is not glibc's). body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_LOSS_H
#define CREW_BACKEND_BODY_LOSS_H

#include "backend/body/body.h"
#include "backend/exp_poly.h"

/* ---- softmax cross-entropy: loss = logsumexp(z) − z[label], after subtracting the row's maximum
 * so that no exp overflows; d (loss · scale) / d z = scale · (softmax(z) − onehot(label)). */

/* The lane's largest logit and its first index: every lane starts from z[0] (the CPU's start; lane
 * 0, whose first element it is, goes on from its second), and a later element wins only when
 * strictly greater. Across lanes the larger value wins, and of equal values the smaller index: the
 * row's first maximum, whichever lane held it. */
CREW_BODY float crew_xent_lane_argmax(const float *z, int64_t classes, int64_t lane, int64_t lanes, long long *at)
{
    float zmax = z[0];
    long long best = 0;
    for (int64_t j = lane ? lane : lanes; j < classes; j += lanes)
        if (z[j] > zmax) {
            zmax = z[j];
            best = j;
        }
    *at = best;
    return zmax;
}

/* The butterfly's rule for two lanes' (value, index): 1 when (o, oi) replaces (v, vi). */
CREW_BODY int crew_xent_argmax_takes(float o, long long oi, float v, long long vi)
{
    return o > v || (o == v && oi < vi);
}

/* The lane's exponentials, written into dz (which may be z: each lane reads then writes only its
 * own elements), and their partial sum */
CREW_BODY float crew_xent_lane_exp(const float *z, float *dz, int64_t classes, float zmax, int64_t lane,
                                   int64_t lanes)
{
    float sum = 0.0f;
    for (int64_t j = lane; j < classes; j += lanes) {
        float e = crew_exp_poly(z[j] - zmax);
        dz[j] = e;
        sum += e;
    }
    return sum;
}

/* The lane's gradients from the row's sum: dz = e·(scale/sum), less scale at the label (which the
 * lane holding it subtracts: the loop stays branch-free, so it vectorises) */
CREW_BODY void crew_xent_lane_grad(float *dz, int64_t classes, int32_t label, float inv, float scale, int64_t lane,
                                   int64_t lanes)
{
    for (int64_t j = lane; j < classes; j += lanes) dz[j] *= inv;
    if (label >= lane && label < classes && (label - lane) % lanes == 0) dz[label] -= scale;
}

CREW_BODY float crew_xent_inv(float scale, float sum) { return scale / sum; }
CREW_BODY float crew_xent_loss(float sum, float z_label, float zmax) { return logf(sum) - (z_label - zmax); }

/* ---- softmax: p = exp(z − max) / Σ exp(z − max) */

/* from z[0], as crew_xent_lane_argmax */
CREW_BODY float crew_softmax_lane_max(const float *z, int64_t classes, int64_t lane, int64_t lanes)
{
    float zmax = z[0];
    for (int64_t j = lane ? lane : lanes; j < classes; j += lanes) zmax = z[j] > zmax ? z[j] : zmax;
    return zmax;
}

/* the butterfly's maximum of two lanes' values: o when greater (a NaN in v stays) */
CREW_BODY float crew_lane_max_of(float o, float v) { return o > v ? o : v; }

/* p may be z: each lane reads then writes only its own elements */
CREW_BODY float crew_softmax_lane_exp(const float *z, float *p, int64_t classes, float zmax, int64_t lane,
                                      int64_t lanes)
{
    float sum = 0.0f;
    for (int64_t j = lane; j < classes; j += lanes) sum += (p[j] = crew_exp_poly(z[j] - zmax));
    return sum;
}

CREW_BODY void crew_softmax_lane_div(float *p, int64_t classes, float sum, int64_t lane, int64_t lanes)
{
    for (int64_t j = lane; j < classes; j += lanes) p[j] /= sum;
}

/* ---- embedding: ids hold integer token ids as float (backend.h) */

/* An id is usable when it is an integer in [0, vocab): NaN fails every comparison. */
CREW_BODY int crew_embedding_valid(float id, int64_t vocab)
{
    return id >= 0.0f && id < (float)vocab && id == (float)(int64_t)id;
}

/* y [rows, dim]: row r is the table's row ids[r], zeros for an invalid id */
CREW_BODY void crew_body_embedding_forward(const float *ids, const float *table, int64_t vocab, float *y, int64_t dim,
                                           int64_t i)
{
    const int64_t r = i / dim, j = i % dim;
    y[i] = crew_embedding_valid(ids[r], vocab) ? table[(int64_t)ids[r] * dim + j] : 0.0f;
}

/* bad[r]: 1 for an invalid id (the op's count is their sum in order, crew_body_count) */
CREW_BODY void crew_body_embedding_bad(const float *ids, int64_t vocab, long long *bad, int64_t r)
{
    bad[r] = !crew_embedding_valid(ids[r], vocab);
}

/* The gradient of the table as the CPU adds it (every row r in order: dtable[ids[r]] += dy[r]),
 * on a GPU without walking every row for every entry: the rows' keys (the id, or vocab for an
 * invalid one, which sorts last and is skipped) and their indices are sorted by a stable sort on
 * the key (CUB's radix sort), so each id's rows stay in ascending order; then the thread of (the
 * first row of an id's run, column j) adds the run's rows into that id's entry one by one. */
CREW_BODY void crew_body_embedding_keys(const float *ids, int64_t vocab, int *keys, int *order, int64_t r)
{
    keys[r] = crew_embedding_valid(ids[r], vocab) ? (int)ids[r] : (int)vocab;
    order[r] = (int)r;
}

/* Element i = (p, j) of the sorted rows: keys and order as the stable sort left them. */
CREW_BODY void crew_body_embedding_runs(const int *keys, const int *order, const float *dy, float *dtable,
                                        int64_t vocab, int64_t rows, int64_t dim, int64_t i)
{
    const int64_t p = i / dim, j = i % dim;
    const int key = keys[p];
    if (key >= vocab || (p > 0 && keys[p - 1] == key)) return; /* an invalid id, or inside a run */
    float s = dtable[(int64_t)key * dim + j];
    for (int64_t q = p; q < rows && keys[q] == key; q++) s += dy[(int64_t)order[q] * dim + j];
    dtable[(int64_t)key * dim + j] = s;
}

#endif
