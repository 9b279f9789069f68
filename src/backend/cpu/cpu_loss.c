/* cpu_loss.c — fused softmax cross-entropy, softmax, and embedding lookup: the pieces of
 * backend/body/loss.h, which the CUDA kernels run too; the softmaxes walk each row as the one-lane
 * case (lane 0 of 1) of the kernels' warp per row. */
#include <string.h>

#include "backend/body/loss.h"
#include "backend/cpu/cpu_ops.h"
#include "core/status.h"

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
        const float zmax = crew_xent_lane_argmax(z, classes, 0, 1, &best);
        const float sum = crew_xent_lane_exp(z, dz, classes, zmax, 0, 1);
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
        const float zmax = crew_softmax_lane_max(z, classes, 0, 1);
        crew_softmax_lane_div(p, classes, crew_softmax_lane_exp(z, p, classes, zmax, 0, 1), 0, 1);
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
