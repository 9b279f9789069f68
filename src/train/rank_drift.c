/* rank_drift.c — every replica's values must stay the bits of replica 0's: the drift check every
 * so many steps, and (crew verify) a comparison value by value at the end.
 *
 * The drift check: each rank hashes, on its device, every tensor of its stage's model (parameters,
 * and batch-norm state when the statistics are synchronised) and the optimizer's two moment
 * buffers; the hashes travel as one all-reduce of a [ranks × slots × 2] matrix of doubles (each
 * rank fills its own row, 32-bit halves exact in a double), and every rank compares every replica
 * with replica 0 of the same stage, so that all stop alike with the same message. A stage of more
 * than CREW_DRIFT_TENSORS − 1 tensors folds the hashes of the rest into its last tensor slot.
 *
 * The comparison at the end does not trust the hashes: replica 0 of each stage broadcasts its
 * values, and every other replica compares them with its own, value by value, on the host, so
 * that a broken drift check is not the only witness. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "train/rank.h"

/* The whole model's named tensors, and where each stage's begin among them (a stage's model names
 * its layers' tensors in the same order), for messages that name a tensor of any stage. */
typedef struct tensor_names {
    crew_named_param *names;   /* [n] */
    int n;
    int *first;                /* [stages + 1] */
} tensor_names;

static void tensor_names_free(tensor_names *t)
{
    free(t->names);
    free(t->first);
}

static crew_status tensor_names_of(const crew_rank *r, tensor_names *t)
{
    const crew_model *start = r->run->start;
    t->n = crew_model_named_params(start, NULL, 0);
    t->names = calloc((size_t)t->n + 1, sizeof *t->names);
    t->first = calloc((size_t)r->stages + 1, sizeof *t->first);
    if (!t->names || !t->first) return CREW_OOM();
    crew_model_named_params(start, t->names, t->n);
    for (int st = 0; st < r->stages; st++) {
        const int layer = r->stages > 1 ? r->run->plan.stage_first[st] : 0;
        int n = 0;
        for (int i = 0; i < layer; i++)
            for (int j = 0; j < start->layers[i]->n_params; j++) n += crew_param_owned(&start->layers[i]->params[j]);
        t->first[st] = n;
    }
    t->first[r->stages] = t->n;
    return CREW_OK;
}

/* Hash slots of each rank's row: its tensors (capped), then the two moment buffers. */
static int row_slots(const tensor_names *t) { return (t->n < CREW_DRIFT_TENSORS ? t->n : CREW_DRIFT_TENSORS) + 2; }

/* What differs in slot i of stage st (a tensor slot of `slots`, or a moment), for the message. */
static void describe(const crew_rank *r, const tensor_names *t, int slots, int st, int i, char *what, size_t len)
{
    const int tensors = slots - 2, named = t->first[st + 1] - t->first[st];
    char stage[32] = "";
    if (r->stages > 1) snprintf(stage, sizeof stage, " of stage %d", st);
    if (i >= tensors)
        snprintf(what, len, "the optimizer's %s moment%s", i == tensors ? "first" : "second", stage);
    else if (i == tensors - 1 && named > tensors)
        snprintf(what, len, "tensor '%.100s'%s or one after it", t->names[t->first[st] + i].name, stage);
    else
        snprintf(what, len, "tensor '%.120s'%s", t->names[t->first[st] + i].name, stage);
}

/* A difference found in slot i of stage st on replica d: rank 0's event, and every rank's error. */
static crew_status diverged(crew_rank *r, const tensor_names *t, int slots, int64_t step, int st, int d, int i,
                            const char *how)
{
    char what[200], msg[400];
    describe(r, t, slots, st, i, what, sizeof what);
    snprintf(msg, sizeof msg, "step %lld: replicas diverged: %s differs between replica 0 and replica %d%s",
             (long long)step, what, d, how);
    crew_status_free(crew_rank_event(r, CREW_EVENT_DIVERGENCE, step, d * r->stages + st, msg));
    return crew_errorf(CREW_CODE_DIVERGED, "%s", msg);
}

/* Whether tensor p is compared between replicas: unsynchronised batch-norm statistics follow each
 * replica's own micro-batches by design, and a ZeRO-3 replica holds no whole parameter. */
static int compared(const crew_rank *r, const crew_param *p)
{
    if (p->trainable) return crew_rank_holds_params(r); /* ZeRO-3: each rank holds its own shard */
    return r->run->sync_bn;
}

/* ------------------------------------------------------------------ the drift check */

/* This rank's row: slot i < slots − 2 the hash of tensor i (the last of them, when the stage has
 * more tensors than slots, the hashes of it and every later one folded together), then the
 * moments. Zeros where a value is not compared (a sharded optimizer's moments are each rank's own
 * shard). */
static crew_status hash_row(crew_rank *r, const crew_named_param *names, int named, int slots, double *row)
{
    const int t = slots - 2;
    uint64_t *h = calloc((size_t)slots, sizeof *h);
    if (!h) return CREW_OOM();
    crew_status s = CREW_OK;
    for (int i = 0; i < named && !s; i++) {
        const crew_param *p = names[i].param;
        if (!compared(r, p)) continue;
        uint64_t x = 0;
        s = r->be->ops->hash(r->be->ctx, p->value, crew_shape_size(&p->shape), CREW_DT_F32, &x);
        int at = i < t ? i : t - 1;
        h[at] = i < t ? x : crew_mix64(h[at] ^ x);
    }
    for (int i = 0; i < 2 && !s && !r->shard; i++)
        if (r->opt.slot[i]) s = r->be->ops->hash(r->be->ctx, r->opt.slot[i], r->opt.n, CREW_DT_F32, &h[t + i]);
    if (CREW_HOOK(r, drift_hashes)) r->hooks->drift_hashes(r->hooks_user, &r->who, h, slots);
    for (int i = 0; i < slots; i++) {
        row[2 * i] = (double)(uint32_t)(h[i] >> 32);
        row[2 * i + 1] = (double)(uint32_t)h[i];
    }
    free(h);
    return s;
}

crew_status crew_rank_check_drift(crew_rank *r, int64_t step)
{
    if (CREW_HOOK(r, before_drift)) CREW_TRY(r->hooks->before_drift(r->hooks_user, &r->who, step));
    tensor_names t = {0};
    crew_status s = tensor_names_of(r, &t);
    const int slots = row_slots(&t), width = 2 * slots, mine = crew_model_named_params(r->m, NULL, 0);
    crew_named_param *own = calloc((size_t)mine + 1, sizeof *own);
    double *h = calloc((size_t)r->size * (size_t)width, sizeof *h);
    if (!s && (!own || !h)) s = CREW_OOM();
    if (!s) {
        crew_model_named_params(r->m, own, mine);
        s = hash_row(r, own, mine, slots, h + (size_t)r->rank * width);
    }
    if (!s) s = crew_rank_phase_error(r, crew_rank_allreduce_host(r, h, (int64_t)r->size * width), step,
                                      "replica drift check");
    for (int st = 0; st < r->stages && !s; st++) /* every rank judges every stage: they all stop alike */
        for (int d = 1; d < r->replicas && !s; d++)
            for (int i = 0; i < slots; i++) {
                const double *a = h + (size_t)st * width + 2 * i, *b = h + ((size_t)d * r->stages + st) * width + 2 * i;
                if (a[0] == b[0] && a[1] == b[1]) continue;
                s = diverged(r, &t, slots, step, st, d, i, "");
                break;
            }
    tensor_names_free(&t);
    free(own);
    free(h);
    return s;
}

/* ------------------------------------------------------------------ value by value, at the end */

/* One buffer of the rank's (n values at `mine` on its device) against replica 0's of the stage,
 * broadcast into `through` (device memory of at least n values; replica 0 sends its own): the
 * first index whose bits differ, or -1. */
static crew_status compare_buffer(crew_rank *r, float *mine, int64_t n, float *through, float *host_mine,
                                  float *host_theirs, int64_t *first)
{
    *first = -1;
    if (n == 0) return CREW_OK;
    CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
    CREW_TRY(crew_broadcast(&r->group, r->replica == 0 ? mine : through, n, CREW_COMM_F32, 0, r->run->timeout_s));
    if (r->replica == 0) return CREW_OK;
    CREW_TRY(crew_dev_download_f32(r->be, host_mine, mine, n));
    CREW_TRY(crew_dev_download_f32(r->be, host_theirs, through, n));
    for (int64_t k = 0; k < n; k++)
        if (memcmp(&host_mine[k], &host_theirs[k], sizeof *host_mine) != 0) {
            *first = k;
            break;
        }
    return CREW_OK;
}

/* The slot (drift.c's numbering) of value k of the parameters (trainable) or the state. */
static int slot_of(const crew_rank *r, int64_t k, int trainable, int slots)
{
    crew_named_param names[CREW_DRIFT_TENSORS];
    const int named = crew_model_named_params(r->m, names, CREW_DRIFT_TENSORS), t = slots - 2;
    for (int i = 0; i < named && i < CREW_DRIFT_TENSORS; i++) {
        const crew_param *p = names[i].param;
        if (p->trainable == trainable && k >= p->offset && k < p->offset + crew_shape_size(&p->shape))
            return i < t ? i : t - 1;
    }
    return t - 1; /* beyond the named ones: "or one after it" */
}

/* Replica d's first difference, as a slot + 1 (0: none), in its row of the world's all-reduce. */
static crew_status first_difference(crew_rank *r, int slots, int *found)
{
    crew_model *m = r->m;
    int64_t most = m->n_params > m->n_state ? m->n_params : m->n_state;
    float *through = m->grads, *own_buf = NULL; /* the gradient buffer holds nothing at the end */
    crew_status s = CREW_OK;
    /* sharded gradients leave no whole buffer to pass through (the run's peak is recorded by now) */
    if (m->n_state > m->n_params || !through) s = crew_dev_alloc_f32(r->be, most, &own_buf), through = own_buf;
    float *hm = malloc((size_t)(most > 0 ? most : 1) * sizeof *hm), *ht = malloc((size_t)(most > 0 ? most : 1) * sizeof *ht);
    if (!s && (!hm || !ht)) s = CREW_OOM();
    int64_t k = -1;
    *found = 0;
    if (!s && crew_rank_holds_params(r)) /* ZeRO-3: each replica holds its own shard, nothing to compare */
        s = compare_buffer(r, m->params, m->n_params, through, hm, ht, &k);
    if (!s && k >= 0) *found = 1 + slot_of(r, k, 1, slots);
    if (!s && r->run->sync_bn) s = compare_buffer(r, m->state, m->n_state, through, hm, ht, &k);
    if (!s && k >= 0 && !*found) *found = 1 + slot_of(r, k, 0, slots);
    for (int i = 0; i < 2 && !s && !r->shard; i++) {
        if (!r->opt.slot[i]) continue;
        s = compare_buffer(r, r->opt.slot[i], r->opt.n, through, hm, ht, &k);
        if (!s && k >= 0 && !*found) *found = 1 + slots - 2 + i;
    }
    free(hm);
    free(ht);
    crew_dev_free(r->be, own_buf);
    return s;
}

crew_status crew_rank_compare_replicas(crew_rank *r, int64_t step)
{
    if (r->replicas < 2) return CREW_OK;
    tensor_names t = {0};
    crew_status s = tensor_names_of(r, &t);
    const int slots = row_slots(&t);
    int found = 0;
    if (!s) s = first_difference(r, slots, &found);
    double *row = r->metrics;
    memset(row, 0, (size_t)r->size * CREW_METRIC_FIELDS * sizeof *row);
    row[(size_t)r->rank * CREW_METRIC_FIELDS] = found;
    if (!s) s = crew_rank_phase_error(r, crew_rank_allreduce_host(r, row, (int64_t)r->size * CREW_METRIC_FIELDS), step,
                                      "replicas compared value by value");
    for (int g = 0; g < r->size && !s; g++) {
        const int at = (int)row[(size_t)g * CREW_METRIC_FIELDS];
        if (at) s = diverged(r, &t, slots, step, g % r->stages, g / r->stages, at - 1,
                             " (compared value by value at the end of the run)");
    }
    tensor_names_free(&t);
    return s;
}
