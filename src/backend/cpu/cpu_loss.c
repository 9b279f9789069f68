/* cpu_loss.c — fused softmax cross-entropy, softmax, and embedding lookup: the pieces of
 * backend/body/loss.h, which the CUDA kernels run too; the softmaxes take each row's maximum and
 * sum in the order of the kernels' warp per row (cpu_lanes.h), their exponentials in a loop of
 * their own. */
#include <math.h>
#include <string.h>

#include "backend/body/loss.h"
#include "backend/cpu/cpu_lanes.h"
#include "backend/cpu/cpu_ops.h"
#include "core/status.h"

/* The row's largest logit and its first index, as the warp finds them: each lane's
 * (crew_xent_lane_argmax: from z[0], a later element only when strictly greater), then warp_argmax's
 * butterfly; lane 0's. */
static float row_argmax(const float *z, int64_t classes, long long *best)
{
    float v[CPU_LANES];
    long long at[CPU_LANES];
    for (int l = 0; l < CPU_LANES; l++) v[l] = z[0], at[l] = 0;
    for (int64_t j0 = 0; j0 < classes; j0 += CPU_LANES) {
        const int64_t w = cpu_lanes_width(classes, j0);
        for (int64_t l = 0; l < w; l++)
            if (z[j0 + l] > v[l]) v[l] = z[j0 + l], at[l] = j0 + l;
    }
    for (int k = CPU_LANES / 2; k > 0; k /= 2)
        for (int l = 0; l < k; l++)
            if (crew_xent_argmax_takes(v[l + k], at[l + k], v[l], at[l])) v[l] = v[l + k], at[l] = at[l + k];
    *best = at[0];
    return v[0];
}

/* e[j] = exp(z[j] − zmax) (e may be z), and their sum in the warp's order */
static float row_exp_sum(const float *z, float *e, int64_t classes, float zmax)
{
    for (int64_t j = 0; j < classes; j++) e[j] = crew_exp_poly(z[j] - zmax); /* vectorised */
    float p[CPU_LANES];
    cpu_lanes_zero(p);
    cpu_lanes_add(p, e, classes);
    return cpu_lanes_sum(p);
}

/* loss = logsumexp(z) − z[label], computed after subtracting the row maximum so no exp
 * overflows; d loss / d z = softmax(z) − onehot(label). */
crew_status cpu_softmax_xent(void *ctx, const float *logits, const int32_t *labels, int64_t rows, int64_t classes,
                             float scale, float *row_loss, float *dlogits, int64_t *correct)
{
    CREW_TRY(cpu_take_failure(ctx)); /* a GEMM of the forward pass that could not run */
    int64_t right = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *z = logits + r * classes;
        float *dz = dlogits + r * classes;
        const int32_t y = labels[r];
        const float zy = z[y]; /* before dz, which may be z, is written */
        long long best;
        const float zmax = row_argmax(z, classes, &best);
        const float sum = row_exp_sum(z, dz, classes, zmax);
        row_loss[r] = crew_xent_loss(sum, zy, zmax);
        crew_xent_lane_grad(dz, classes, y, crew_xent_inv(scale, sum), scale, 0, 1);
        right += best == y;
    }
    *correct = right;
    return CREW_OK;
}

void cpu_softmax(void *ctx, const float *logits, float *probs, int64_t rows, int64_t classes)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) {
        const float *z = logits + r * classes;
        float *p = probs + r * classes;
        const float zmax = cpu_lanes_row_max(z, classes);
        crew_softmax_lane_div(p, classes, row_exp_sum(z, p, classes, zmax), 0, 1);
    }
}

crew_status cpu_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                  int64_t rows, int64_t dim, int64_t *bad_ids)
{
    (void)ctx;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!crew_embedding_valid(ids[r], vocab)) { /* the row of crew_body_embedding_forward, at once */
            memset(y + r * dim, 0, (size_t)dim * sizeof(float));
            bad++;
            continue;
        }
        memcpy(y + r * dim, table + (int64_t)ids[r] * dim, (size_t)dim * sizeof(float));
    }
    *bad_ids = bad;
    return CREW_OK;
}

void cpu_embedding_backward(void *ctx, const float *ids, const float *dy, float *dtable, int64_t vocab,
                            int64_t rows, int64_t dim)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) {
        if (!crew_embedding_valid(ids[r], vocab)) continue; /* crew_body_embedding_runs' adds, in its order */
        float *d = dtable + (int64_t)ids[r] * dim;
        const float *g = dy + r * dim;
        for (int64_t j = 0; j < dim; j++) d[j] += g[j];
    }
}
