/* rank_drift.c — the replica drift check: every replica's values must stay the bits of replica
 * 0's, and a run that lets them part is stopped at the step it happened, naming the tensor.
 *
 * Each rank hashes, on its device, every tensor of its stage's model (parameters, and batch-norm
 * state when the statistics are synchronised) and the optimizer's two moment buffers; the hashes
 * travel as one all-reduce of a [ranks × slots × 2] matrix of doubles (each rank fills its own
 * row, 32-bit halves exact in a double), and every rank compares every replica with replica 0 of
 * the same stage, so that all stop alike with the same message. A stage of more than
 * CREW_DRIFT_TENSORS − 1 tensors folds the hashes of the rest into its last tensor slot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "train/rank.h"

/* Hash slots of each rank's row: its tensors (capped), then the two moment buffers. */
static int row_slots(const crew_rank *r)
{
    int whole = crew_model_named_params(r->run->start, NULL, 0);
    return (whole < CREW_DRIFT_TENSORS ? whole : CREW_DRIFT_TENSORS) + 2;
}

/* The named tensors of the whole model before layer `first`: where a stage's tensors begin in the
 * whole model's list (a stage's model names its layers' tensors in the same order). */
static int tensors_before(const crew_model *whole, int first)
{
    int n = 0;
    for (int i = 0; i < first; i++)
        for (int j = 0; j < whole->layers[i]->n_params; j++) n += crew_param_owned(&whole->layers[i]->params[j]);
    return n;
}

/* This rank's row: slot i < slots − 2 the hash of tensor i (the last of them, when the stage has
 * more tensors than slots, the hashes of it and every later one folded together), then the
 * moments. Zeros where a value is not compared (unsynchronised batch-norm statistics follow each
 * replica's own micro-batches by design; a sharded optimizer's moments are each rank's own shard). */
static crew_status hash_row(crew_rank *r, const crew_named_param *names, int named, int slots, double *row)
{
    const int t = slots - 2;
    uint64_t *h = calloc((size_t)slots, sizeof *h);
    if (!h) return CREW_OOM();
    crew_status s = CREW_OK;
    for (int i = 0; i < named && !s; i++) {
        const crew_param *p = names[i].param;
        if (!p->trainable && !r->run->sync_bn) continue;
        uint64_t x = 0;
        s = r->be->ops->hash(r->be->ctx, p->value, crew_shape_size(&p->shape), CREW_DT_F32, &x);
        int at = i < t ? i : t - 1;
        h[at] = i < t ? x : crew_mix64(h[at] ^ x);
    }
    for (int i = 0; i < 2 && !s && !r->shard; i++)
        if (r->opt.slot[i]) s = r->be->ops->hash(r->be->ctx, r->opt.slot[i], r->opt.n, CREW_DT_F32, &h[t + i]);
    for (int i = 0; i < slots; i++) {
        row[2 * i] = (double)(uint32_t)(h[i] >> 32);
        row[2 * i + 1] = (double)(uint32_t)h[i];
    }
    free(h);
    return s;
}

/* What differs in slot i of stage st, for the message. */
static void describe(const crew_rank *r, const crew_named_param *whole, int base, int named, int slots, int st, int i,
                     char *what, size_t len)
{
    const int t = slots - 2;
    char stage[32] = "";
    if (r->stages > 1) snprintf(stage, sizeof stage, " of stage %d", st);
    if (i >= t)
        snprintf(what, len, "the optimizer's %s moment%s", i == t ? "first" : "second", stage);
    else if (i == t - 1 && named > t)
        snprintf(what, len, "tensor '%.100s'%s or one after it", whole[base + i].name, stage);
    else
        snprintf(what, len, "tensor '%.120s'%s", whole[base + i].name, stage);
}

crew_status crew_rank_check_drift(crew_rank *r, int64_t step)
{
    if (CREW_HOOK(r, before_drift)) CREW_TRY(r->hooks->before_drift(r->hooks_user, &r->who, step));
    const crew_model *start = r->run->start;
    const int slots = row_slots(r), width = 2 * slots;
    const int whole_n = crew_model_named_params(start, NULL, 0), mine = crew_model_named_params(r->m, NULL, 0);
    crew_named_param *whole = calloc((size_t)whole_n + 1, sizeof *whole), *own = calloc((size_t)mine + 1, sizeof *own);
    double *h = calloc((size_t)r->size * (size_t)width, sizeof *h);
    int *first = calloc((size_t)r->stages + 1, sizeof *first);
    crew_status s = whole && own && h && first ? CREW_OK : CREW_OOM();
    if (!s) {
        crew_model_named_params(start, whole, whole_n);
        crew_model_named_params(r->m, own, mine);
        for (int st = 0; st < r->stages; st++) first[st] = tensors_before(start, r->stages > 1 ? r->run->plan.stage_first[st] : 0);
        first[r->stages] = whole_n;
        s = hash_row(r, own, mine, slots, h + (size_t)r->rank * width);
    }
    if (!s) s = crew_rank_phase_error(r, crew_rank_allreduce_host(r, h, (int64_t)r->size * width), step,
                                      "replica drift check");
    for (int st = 0; st < r->stages && !s; st++) /* every rank judges every stage: they all stop alike */
        for (int d = 1; d < r->replicas && !s; d++)
            for (int i = 0; i < slots; i++) {
                const double *a = h + (size_t)st * width + 2 * i, *b = h + ((size_t)d * r->stages + st) * width + 2 * i;
                if (a[0] == b[0] && a[1] == b[1]) continue;
                char what[200], msg[300];
                describe(r, whole, first[st], first[st + 1] - first[st], slots, st, i, what, sizeof what);
                snprintf(msg, sizeof msg, "step %lld: replicas diverged: %s differs between replica 0 and replica %d",
                         (long long)step, what, d);
                crew_status_free(crew_rank_event(r, CREW_EVENT_DIVERGENCE, step, d * r->stages + st, msg));
                s = crew_errorf(CREW_CODE_DIVERGED, "%s", msg);
                break;
            }
    free(whole);
    free(own);
    free(h);
    free(first);
    return s;
}
