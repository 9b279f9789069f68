/* cpu_loss.c — fused softmax cross-entropy, softmax, and embedding lookup. */
#include <math.h>
#include <string.h>

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
        int64_t best = 0;
        float zmax = z[0];
        for (int64_t j = 1; j < classes; j++)
            if (z[j] > zmax) {
                zmax = z[j];
                best = j;
            }
        float sum = 0.0f;
        for (int64_t j = 0; j < classes; j++) {
            dz[j] = expf(z[j] - zmax);
            sum += dz[j];
        }
        row_loss[r] = logf(sum) - (zy - zmax);
        float inv = scale / sum;
        for (int64_t j = 0; j < classes; j++) dz[j] *= inv;
        dz[y] -= scale;
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
        float zmax = z[0];
        for (int64_t j = 1; j < classes; j++) zmax = z[j] > zmax ? z[j] : zmax;
        float sum = 0.0f;
        for (int64_t j = 0; j < classes; j++) sum += (p[j] = expf(z[j] - zmax));
        for (int64_t j = 0; j < classes; j++) p[j] /= sum;
    }
}

/* An id is usable when it is an integer in [0, vocab): NaN fails every comparison. */
static inline int valid_id(float id, int64_t vocab) { return id >= 0.0f && id < (float)vocab && id == (float)(int64_t)id; }

crew_status cpu_embedding_forward(void *ctx, const float *ids, const float *table, int64_t vocab, float *y,
                                  int64_t rows, int64_t dim, int64_t *bad_ids)
{
    (void)ctx;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!valid_id(ids[r], vocab)) {
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
        if (!valid_id(ids[r], vocab)) continue;
        float *d = dtable + (int64_t)ids[r] * dim;
        const float *g = dy + r * dim;
        for (int64_t j = 0; j < dim; j++) d[j] += g[j];
    }
}
