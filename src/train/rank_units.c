/* rank_units.c — gradient and parameter sharding (ZeRO stages 2 and 3) in the data-parallel rank
 * program, on top of the optimizer's (rank_shard.c: the same shards, crew_shard_bounds).
 *
 * The replica works in units of layers (crew_model_units: a transformer block, a conv layer, small
 * layers grouped), each of whose parameters is a contiguous range [lo, hi) of the flat buffer.
 *   - Gradients (ZeRO-2 and 3): the model has no gradient buffer. A unit's layers write their
 *     gradients into one buffer of the largest unit; when the last micro-batch's backward pass has
 *     completed the unit, its gradient is reduce-scattered in the ordered way (the unit's part of
 *     each shard to the shard's owner: the bits an all-reduce leaves there) and the rank keeps its
 *     part in its shard of the summed gradient. With accumulation (k > 1) the earlier micro-batches'
 *     gradients are kept whole until then: crew's ordered sum adds every replica's micro-batches in
 *     global order, which a running sum per shard cannot (docs/ARCHITECTURE.md, "Sharding").
 *   - Parameters (ZeRO-3): the model has no parameter buffer either. Each rank keeps its shard's
 *     parameters; a unit's are all-gathered into one buffer of the largest unit just before its
 *     first layer runs, forward and backward (the last unit of the forward pass is still there when
 *     backward begins; a layer whose backward reads no values, an embedding's, is not gathered
 *     for). Backward writes the unit's gradient over its parameters in that buffer (each layer
 *     reads a value before it writes its gradient: nn/layer.h), so ZeRO-3 holds no gradient buffer
 *     of a unit; with overlap, where the next unit's gather would land in a buffer whose
 *     reduce-scatter is still in flight, the units keep gradient buffers of their own.
 *   - A tied parameter (a GPT's token table, which the lm_head reads and adds a gradient to at the
 *     other end of the pass) keeps its unit, the pinned unit, in a buffer of its own, gathered at
 *     the first forward layer and reduced after the unit's last backward layer (ZeRO-2: and a
 *     gradient buffer of its own; ZeRO-3: its gradient over its values, as the other units').
 *     Except without overlap, where the model computes the lm_head's part of the table's
 *     gradient late, just before the embedding's backward (crew_model.tied_grads_late): there the
 *     table is a unit like the others, its gradient written into the one buffer at the embedding
 *     (ZeRO-3: gathered into it for the embedding, again for the lm_head, which reads it in
 *     forward and backward). crew_units_layout_for says which buffers each case keeps.
 *   - The update: every shard's squared gradient norm through the backend's sum_squares lanes,
 *     handed from rank to rank in shard order, so that clipping uses the whole buffer's norm to the
 *     bit; each rank updates its shard (crew_optimizer_step_shard); under ZeRO-2 the parameters
 *     are then all-gathered as ZeRO-1 does, under ZeRO-3 they stay sharded.
 * The units' collectives run on the rank's own thread in layer order, the same on every replica.
 * Elementwise updates on the same sums give the same bits, so every level equals the unsharded run
 * on any replica count (tests/test_shard.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"
#include "train/rank.h"

typedef struct crew_rank_units {
    int params;                 /* 1: ZeRO-3 */
    crew_unit *unit;            /* [n] */
    int n;
    int pinned;                 /* the unit a tied parameter keeps gathered; -1: none */
    int *complete_at;           /* [n] the layer after whose backward pass the unit's gradient is complete */
    int64_t *bounds;            /* [n × (replicas + 1)] each shard's part of each unit, relative to the unit's lo */
    int64_t widest;             /* values of the largest unit but the pinned one */
    float *grad_shard;          /* [the largest shard] the rank's shard of the summed gradient; between
                                   steps, another rank's shard passing through */
    /* The units but the pinned one take turns in one buffer, or with overlap in two (slot[u]: 0 and 1
     * alternately in layer order), so that the next unit's collective runs while this one computes. */
    int overlap;
    int *slot;                  /* [n] */
    crew_units_layout lay;      /* which buffers there are */
    float *unit_grads[2];       /* [widest] the running unit's gradient (NULL where grads_over) */
    float *pinned_grads;        /* [the pinned unit's] (ZeRO-2 with overlap) */
    float *param_shard;         /* ZeRO-3: [the rank's shard] its parameters */
    float *unit_params[2];      /* ZeRO-3: [widest] the gathered units */
    float *pinned_params;       /* ZeRO-3: [the pinned unit's] */
    float **saved;              /* k > 1: [k − 1][n_params] the earlier micro-batches' gradients, whole */
    float **parts[3];           /* [k] the inputs of the reduce-scatters in flight: slot 0, 1, the pinned unit */
    int k;
    /* during a step: what each slot holds, and the collectives in flight on the communication thread
     * (overlap), each with the unit it is for (-1: none) */
    int held[2];                /* ZeRO-3: the unit whose parameters the slot's buffer holds */
    int pinned_gathered;
    crew_comm_request gather[2];
    int gathering[2];
    crew_comm_request reduce[3]; /* slot 0, 1, the pinned unit */
    int reducing[3];
    int micro;
    int measure;
    double sq_small;
    int64_t done_from;          /* the gradients from here to the end are this micro-batch's, complete */
    crew_step_times *times;
} crew_rank_units;

int crew_rank_holds_params(const crew_rank *r) { return !r->units || !r->units->params; }

void crew_rank_grad_range(const crew_rank *r, int64_t *lo, int64_t *n, float **params)
{
    crew_rank_units *x = r->units;
    *lo = x ? r->shard_lo : 0;
    *n = x ? r->opt.n : r->m->n_params;
    *params = !x ? r->m->params : x->params ? x->param_shard : r->m->params + r->shard_lo;
}

float *crew_rank_pass_through(const crew_rank *r) { return r->units ? r->units->grad_shard : r->m->grads; }

static int64_t unit_len(const crew_unit *u) { return u->hi - u->lo; }
static const int64_t *unit_bounds(const crew_rank *r, int u)
{
    return r->units->bounds + (size_t)u * (size_t)(r->replicas + 1);
}

/* The unit's parameters' buffer (ZeRO-3), and its gradient's: the same under ZeRO-3 for the pinned
 * unit, and for the others where `over` */
static float *params_of(const crew_rank_units *x, int u)
{
    return u == x->pinned ? x->pinned_params : x->unit_params[x->slot[u]];
}
static int grads_over_params(const crew_rank_units *x, int u)
{
    return x->params && (u == x->pinned || x->lay.grads_over);
}
static float *grads_of(const crew_rank_units *x, int u)
{
    if (grads_over_params(x, u)) return params_of(x, u);
    return u == x->pinned ? x->pinned_grads : x->unit_grads[x->slot[u]];
}
/* The reduce-scatter slot of unit u: its buffers' slot, or 2 for the pinned unit. */
static int reduce_slot(const crew_rank_units *x, int u) { return u == x->pinned ? 2 : x->slot[u]; }


/* ------------------------------------------------------------------ set-up */

void crew_units_layout_for(int64_t widest, int64_t pinned, int tied_late_ok, int level, int overlap,
                           crew_units_layout *out)
{
    const int params = level >= CREW_SHARD_PARAMETERS;
    const int over = params && !overlap, late = !overlap && pinned > 0 && tied_late_ok;
    *out = (crew_units_layout){
        .slots = overlap ? 2 : 1,
        .slot_values = late && pinned > widest ? pinned : widest,
        .pinned = late ? 0 : pinned,
        .params = params,
        .slot_grads = !over,
        .pinned_grads = pinned > 0 && !late && !params,
        .grads_over = over,
        .tied_late = late,
    };
}

/* Every parameter's value (ZeRO-3) and gradient pointed at its unit's buffers, at its place
 * relative to the unit's start; the tied ones then at their owners'. */
static void point_layers(crew_rank *r)
{
    crew_rank_units *x = r->units;
    crew_model *m = r->m;
    for (int u = 0; u < x->n; u++)
        for (int i = x->unit[u].first; i < x->unit[u].end; i++)
            for (int j = 0; j < m->layers[i]->n_params; j++) {
                crew_param *p = &m->layers[i]->params[j];
                if (!p->trainable || p->tied) continue;
                p->grad = grads_of(x, u) + (p->offset - x->unit[u].lo);
                if (x->params) p->value = params_of(x, u) + (p->offset - x->unit[u].lo);
            }
    crew_model_point_tied(m);
}

static crew_status visit(void *user, int layer, crew_visit what);

static crew_status alloc_units(crew_rank *r)
{
    crew_rank_units *x = r->units;
    const crew_fit_plan *p = &r->run->plan;
    const int w = r->replicas + 1;
    x->n = crew_model_units(r->m, crew_bucket_values(p->shard_unit_mb), NULL, 0);
    x->unit = calloc((size_t)x->n + 1, sizeof *x->unit);
    x->complete_at = calloc((size_t)x->n + 1, sizeof *x->complete_at);
    x->bounds = calloc((size_t)x->n * (size_t)w + 1, sizeof *x->bounds);
    x->slot = calloc((size_t)x->n + 1, sizeof *x->slot);
    for (int i = 0; i < 3; i++) x->parts[i] = calloc((size_t)x->k, sizeof *x->parts[i]);
    if (!x->unit || !x->complete_at || !x->bounds || !x->slot || !x->parts[0] || !x->parts[1] || !x->parts[2])
        return CREW_OOM();
    crew_model_units(r->m, crew_bucket_values(p->shard_unit_mb), x->unit, x->n);
    int64_t widest, pinned;
    crew_model_unit_widths(x->unit, x->n, &widest, &pinned);
    crew_units_layout_for(widest, pinned, crew_model_tied_late_ok(r->m), p->shard, x->overlap, &x->lay);
    r->m->tied_grads_late = x->lay.tied_late;
    x->widest = x->lay.slot_values;
    x->pinned = -1;
    for (int u = 0, turn = 0; u < x->n; u++) {
        const crew_unit *un = &x->unit[u];
        const int apart = un->pinned && !x->lay.tied_late;
        if (apart) x->pinned = u;
        else x->slot[u] = x->overlap ? turn++ % 2 : 0;
        x->complete_at[u] = -1; /* the unit's first layer with parameters of its own */
        for (int i = un->end - 1; i >= un->first; i--)
            if (crew_layer_trains(r->m->layers[i])) x->complete_at[u] = i;
        for (int q = 0; q < w; q++) {
            int64_t at = r->shard[q] < un->lo ? un->lo : r->shard[q] > un->hi ? un->hi : r->shard[q];
            x->bounds[(size_t)u * w + q] = at - un->lo;
        }
    }
    int64_t widest_shard = 0;
    for (int q = 0; q < r->replicas; q++)
        if (crew_rank_shard_len(r, q) > widest_shard) widest_shard = crew_rank_shard_len(r, q);
    const crew_backend *be = r->be;
    const crew_units_layout *lay = &x->lay;
    CREW_TRY(crew_dev_alloc_f32(be, widest_shard, &x->grad_shard));
    for (int i = 0; lay->slot_grads && i < lay->slots; i++)
        CREW_TRY(crew_dev_alloc_f32(be, x->widest, &x->unit_grads[i]));
    if (lay->pinned_grads) CREW_TRY(crew_dev_alloc_f32(be, lay->pinned, &x->pinned_grads));
    if (lay->params) {
        CREW_TRY(crew_dev_alloc_f32(be, crew_rank_shard_len(r, r->replica), &x->param_shard));
        for (int i = 0; i < lay->slots; i++) CREW_TRY(crew_dev_alloc_f32(be, x->widest, &x->unit_params[i]));
        if (lay->pinned) CREW_TRY(crew_dev_alloc_f32(be, lay->pinned, &x->pinned_params));
    }
    if (x->k > 1) {
        if (!(x->saved = calloc((size_t)x->k - 1, sizeof *x->saved))) return CREW_OOM();
        for (int j = 0; j < x->k - 1; j++) CREW_TRY(crew_dev_alloc_f32(be, r->m->n_params, &x->saved[j]));
    }
    return CREW_OK;
}

crew_status crew_rank_units_init(crew_rank *r)
{
    const crew_fit_plan *p = &r->run->plan;
    if (!(r->units = calloc(1, sizeof *r->units))) return CREW_OOM();
    r->units->params = p->shard >= CREW_SHARD_PARAMETERS;
    r->units->k = p->accumulation;
    r->units->overlap = p->shard_overlap && r->replicas > 1; /* the communication thread starts after set-up */
    if (r->m->compile.optimizer.clip_norm > 0.0f && !r->be->ops->sum_squares_lanes)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "clipping with sharded %s on %s: the device has no sum_squares "
                           "lanes to hand on for the whole gradient's norm yet; --shard optimizer clips sharded",
                           crew_shard_level_name(p->shard), p->device_kind);
    CREW_TRY(alloc_units(r));
    for (int i = 0; i < 3; i++) r->units->reducing[i] = -1;
    for (int i = 0; i < 2; i++) r->units->held[i] = r->units->gathering[i] = -1;
    point_layers(r);
    r->m->visit = visit;
    r->m->visit_user = r;
    return CREW_OK;
}

void crew_rank_units_release(crew_rank *r)
{
    crew_rank_units *x = r->units;
    if (!x) return;
    const crew_backend *be = r->be;
    crew_dev_free(be, x->grad_shard);
    for (int i = 0; i < 2; i++) {
        crew_dev_free(be, x->unit_grads[i]);
        crew_dev_free(be, x->unit_params[i]);
    }
    crew_dev_free(be, x->pinned_grads);
    crew_dev_free(be, x->param_shard);
    crew_dev_free(be, x->pinned_params);
    for (int j = 0; x->saved && j < x->k - 1; j++) crew_dev_free(be, x->saved[j]);
    free(x->saved);
    for (int i = 0; i < 3; i++) free(x->parts[i]);
    free(x->slot);
    free(x->unit);
    free(x->complete_at);
    free(x->bounds);
    free(x);
    r->units = NULL;
    if (r->m) {
        r->m->visit = NULL;
        r->m->tied_grads_late = 0;
    }
}

/* ------------------------------------------------------------------ shards to and from rank 0 */

/* Rank 0's host values (from, the whole buffer's; NULL elsewhere) into every rank's shard `mine`:
 * each shard is broadcast from rank 0 in turn, every rank joining, through the pass-through
 * buffer of the ranks it is not for. */
static crew_status scatter_from(crew_rank *r, const crew_backend *host, const float *from, float *mine)
{
    for (int q = 0; q < r->replicas; q++) {
        int64_t n = crew_rank_shard_len(r, q);
        if (n == 0) continue;
        float *into = q == r->replica ? mine : crew_rank_pass_through(r);
        if (r->replica == 0) CREW_TRY(crew_dev_transfer_f32(r->be, into, host, from + r->shard[q], n));
        CREW_TRY(crew_broadcast(&r->group, into, n, CREW_COMM_F32, 0, r->run->timeout_s));
    }
    return CREW_OK;
}

/* Every rank's shard `mine` into rank 0's host buffer `into` (the whole buffer's; NULL elsewhere):
 * each owner broadcasts its own in turn. */
static crew_status gather_to(crew_rank *r, const crew_backend *host, float *into, float *mine)
{
    for (int q = 0; q < r->replicas; q++) {
        int64_t n = crew_rank_shard_len(r, q);
        if (n == 0) continue;
        float *buf = q == r->replica ? mine : crew_rank_pass_through(r);
        if (q != 0) CREW_TRY(crew_broadcast(&r->group, buf, n, CREW_COMM_F32, q, r->run->timeout_s));
        if (r->replica == 0) CREW_TRY(crew_dev_transfer_f32(host, into + r->shard[q], r->be, buf, n));
    }
    return CREW_OK;
}

crew_status crew_rank_units_start(crew_rank *r)
{
    if (!r->units->params) return CREW_OK;
    const crew_model *start = r->run->start;
    return scatter_from(r, &start->be, r->replica == 0 ? start->params : NULL, r->units->param_shard);
}

crew_status crew_rank_units_gather_params(crew_rank *r, float *host_params)
{
    const crew_backend *host = r->sinks ? &r->sinks->model->be : NULL;
    return gather_to(r, host, host_params, r->units->param_shard);
}

crew_status crew_rank_units_to_own_model(crew_rank *r)
{
    crew_model *own = r->own_model && !r->sinks ? r->own_model : NULL;
    for (int q = 0; q < r->replicas; q++) {
        int64_t n = crew_rank_shard_len(r, q);
        if (n == 0) continue;
        float *buf = q == r->replica ? r->units->param_shard : crew_rank_pass_through(r);
        CREW_TRY(crew_broadcast(&r->group, buf, n, CREW_COMM_F32, q, r->run->timeout_s));
        if (own) CREW_TRY(crew_dev_transfer_f32(&own->be, own->params + r->shard[q], r->be, buf, n));
    }
    if (!own) return CREW_OK;
    own->initialized = 1;
    return crew_dev_transfer_f32(&own->be, own->state, r->be, r->m->state, r->m->n_state);
}

/* Mid-step, when the shard of the summed gradient is still to be used: the others' pass through a
 * buffer of their own (verify's first step only). */
crew_status crew_rank_units_grads_to_host(crew_rank *r, float *host)
{
    int64_t widest = 0;
    for (int q = 0; q < r->replicas; q++)
        if (crew_rank_shard_len(r, q) > widest) widest = crew_rank_shard_len(r, q);
    float *through = NULL;
    crew_status s = crew_dev_alloc_f32(r->be, widest, &through);
    for (int q = 0; q < r->replicas && !s; q++) {
        int64_t n = crew_rank_shard_len(r, q);
        if (n == 0) continue;
        float *buf = q == r->replica ? r->units->grad_shard : through;
        if (q != 0) s = crew_broadcast(&r->group, buf, n, CREW_COMM_F32, q, r->run->timeout_s);
        if (!s && r->replica == 0) s = crew_dev_download_f32(r->be, host + r->shard[q], buf, n);
    }
    crew_dev_free(r->be, through);
    return s;
}

/* ------------------------------------------------------------------ the passes */

/* A unit's collective: with overlap on the communication thread (submitted now, waited for
 * later: wait_request), else at once on the rank's own thread. With overlap every collective of
 * the units goes through that thread, so that the communicator is never used by two threads of
 * the rank at once and the order of the collectives stays the program's on every rank. */
static crew_status start_request(crew_rank *r, crew_comm_request *req, int wait)
{
    if (!r->units->overlap) return crew_comm_request_run(&r->group, req, r->run->timeout_s);
    crew_comm_worker_submit(&r->worker, req);
    return wait ? crew_comm_worker_wait(&r->worker, req) : CREW_OK;
}

static void timed(crew_rank_units *x, double t0)
{
    if (x->times) x->times->comm_exposed_s += crew_now() - t0;
}

/* ZeRO-3: unit u's parameters gathered into its buffer (the rank's part from its shard, the rest
 * from their owners), waited for unless `ahead` (a prefetch, waited for by gather_wait). */
static crew_status gather_unit(crew_rank *r, int u, int ahead)
{
    crew_rank_units *x = r->units;
    const crew_unit *un = &x->unit[u];
    const int64_t *b = unit_bounds(r, u);
    const int64_t lo = b[r->replica], n = b[r->replica + 1] - lo;
    float *buf = params_of(x, u);
    if (n > 0) r->be->ops->copy(r->be->ctx, buf + lo, x->param_shard + (un->lo + lo - r->shard_lo), n);
    crew_comm_request *req = &x->gather[u == x->pinned ? 0 : x->slot[u]], local;
    if (!ahead) req = &local; /* the pinned unit's, and every one without overlap: waited for at once */
    *req = (crew_comm_request){.buf = buf, .n = unit_len(un), .bounds = b, .type = CREW_COMM_F32, .gather = 1};
    double t0 = crew_now();
    crew_status s = start_request(r, req, !ahead);
    if (!ahead) timed(x, t0);
    return s;
}

/* The prefetch in flight into slot i, waited for (its time is what compute did not hide). */
static crew_status gather_wait(crew_rank *r, int i)
{
    crew_rank_units *x = r->units;
    if (x->gathering[i] < 0) return CREW_OK;
    double t0 = crew_now();
    crew_status s = crew_comm_worker_wait(&r->worker, &x->gather[i]);
    timed(x, t0);
    x->held[i] = x->gathering[i];
    x->gathering[i] = -1;
    return s;
}

/* The unit after u in the pass's direction (forward: +1) but the pinned one; -1: none. */
static int next_unit(const crew_rank_units *x, int u, int dir)
{
    for (int v = u + dir; v >= 0 && v < x->n; v += dir)
        if (v != x->pinned) return v;
    return -1;
}

/* ZeRO-3: unit u's parameters in place before its layer runs, and with overlap the next unit's
 * gathered meanwhile into the other buffer (which the unit before this one has finished with). A
 * unit still in its buffer from earlier in the step is not gathered again. */
static crew_status ensure_gathered(crew_rank *r, int u, int dir)
{
    crew_rank_units *x = r->units;
    if (u == x->pinned) {
        if (!x->pinned_gathered) CREW_TRY(gather_unit(r, u, 0));
        x->pinned_gathered = 1;
    } else {
        const int i = x->slot[u];
        if (x->gathering[i] >= 0) CREW_TRY(gather_wait(r, i));
        if (x->held[i] != u) {
            x->held[i] = u;
            CREW_TRY(gather_unit(r, u, 0));
        }
    }
    const int v = x->overlap ? next_unit(x, u, dir) : -1;
    if (v < 0 || x->held[x->slot[v]] == v || x->gathering[x->slot[v]] == v) return CREW_OK;
    if (u != x->pinned && x->slot[v] == x->slot[u]) return CREW_OK; /* its buffer is this unit's */
    CREW_TRY(gather_wait(r, x->slot[v])); /* none in flight there but in odd orders; never two at once */
    x->held[x->slot[v]] = -1;
    x->gathering[x->slot[v]] = v;
    return gather_unit(r, v, 1);
}

/* The reduce-scatter in flight from slot i, waited for, and the rank's part of it taken into its
 * shard of the summed gradient. */
static crew_status reduce_wait(crew_rank *r, int i)
{
    crew_rank_units *x = r->units;
    const int u = x->reducing[i];
    if (u < 0) return CREW_OK;
    x->reducing[i] = -1;
    crew_comm_request *req = &x->reduce[i];
    double t0 = crew_now();
    crew_status s = x->overlap && req->n ? crew_comm_worker_wait(&r->worker, req) : req->status;
    timed(x, t0);
    const int64_t lo = req->bounds[r->replica], n = req->bounds[r->replica + 1] - lo, at = x->unit[u].lo + lo;
    if (!s && n > 0) r->be->ops->copy(r->be->ctx, x->grad_shard + (at - r->shard_lo), (float *)req->buf + lo, n);
    return s;
}

/* Unit u's gradient of the last micro-batch is complete: reduce-scattered in the ordered way with
 * the earlier micro-batches' (kept whole), the rank's part into its shard of the sum, at once or,
 * with overlap, when the buffer is next needed (reduce_wait). */
static crew_status reduce_unit(crew_rank *r, int u)
{
    crew_rank_units *x = r->units;
    const crew_unit *un = &x->unit[u];
    const int i = reduce_slot(x, u);
    float *g = grads_of(x, u), **parts = x->parts[i];
    for (int j = 0; j < x->k - 1; j++) parts[j] = x->saved[j] + un->lo;
    parts[x->k - 1] = g;
    crew_comm_request *req = &x->reduce[i];
    *req = (crew_comm_request){.buf = g, .n = unit_len(un), .parts = parts, .k = x->k, .bounds = unit_bounds(r, u),
                               .type = CREW_COMM_F32, .op = CREW_REDUCE_SUM};
    x->reducing[i] = u;
    if (CREW_HOOK(r, bucket) && !r->hooks->bucket(r->hooks_user, &r->who, u, x->n, req)) {
        req->n = 0; /* a seam left it out: as if reduced at once */
        req->status = CREW_OK;
        return reduce_wait(r, i);
    }
    double t0 = crew_now();
    crew_status s = start_request(r, req, 0);
    if (x->overlap) return s; /* submitted: its part is taken when the slot is next needed */
    req->status = s;
    timed(x, t0);
    return reduce_wait(r, i);
}

/* After layer i's backward pass: its gradients are this micro-batch's (their squared norm, when
 * the step measures the noise scale, over the same ranges the unsharded stepper takes); the
 * unit's gradient, once complete, kept for the ordered sum or reduced. */
static crew_status backward_done(crew_rank *r, int i, int u)
{
    crew_rank_units *x = r->units;
    const crew_unit *un = &x->unit[u];
    const crew_layer *l = r->m->layers[i];
    if (!crew_layer_trains(l)) return CREW_OK;
    const int64_t lo = l->params[0].offset;
    if (x->measure && x->done_from > lo) {
        double part = 0.0;
        CREW_TRY(r->be->ops->sum_squares(r->be->ctx, grads_of(x, u) + (lo - un->lo), x->done_from - lo, &part));
        x->sq_small += part;
    }
    x->done_from = lo;
    if (i != x->complete_at[u]) return CREW_OK;
    if (grads_over_params(x, u)) { /* the buffer holds the gradient now: gathered anew when next needed */
        if (u == x->pinned) x->pinned_gathered = 0;
        else x->held[x->slot[u]] = -1;
    }
    if (x->micro < x->k - 1) {
        r->be->ops->copy(r->be->ctx, x->saved[x->micro] + un->lo, grads_of(x, u), unit_len(un));
        return CREW_OK;
    }
    return reduce_unit(r, u);
}

/* With the tied gradients late: the unit of the parameters that layer i reads but does not own (the
 * lm_head's table, a unit like the others then); -1: none. */
static int tied_unit(const crew_rank *r, int i)
{
    const crew_layer *l = r->m->layers[i];
    for (int j = 0; r->units->lay.tied_late && j < l->n_params; j++)
        if (l->params[j].tied) return crew_model_unit_of(r->units->unit, r->units->n, l->params[j].tie_layer);
    return -1;
}

static crew_status visit(void *user, int layer, crew_visit what)
{
    crew_rank *r = user;
    crew_rank_units *x = r->units;
    const int u = crew_model_unit_of(x->unit, x->n, layer);
    if (u < 0) return crew_errorf(CREW_CODE_INTERNAL, "layer %d belongs to no unit", layer);
    if (what == CREW_VISIT_BACKWARD_DONE) return backward_done(r, layer, u);
    const int t = tied_unit(r, layer); /* it reads the owner's values alone, forward and backward */
    if (t >= 0) return x->params ? ensure_gathered(r, t, what == CREW_VISIT_FORWARD ? 1 : -1) : CREW_OK;
    /* the unit's gradient buffer: free once the reduce-scatter of the unit before in it is done */
    if (what == CREW_VISIT_BACKWARD && x->reducing[reduce_slot(x, u)] >= 0 && x->reducing[reduce_slot(x, u)] != u)
        CREW_TRY(reduce_wait(r, reduce_slot(x, u)));
    /* below the unit's last layer with parameters backward reads none of them (its gradient may lie
     * over them by now) */
    if (what == CREW_VISIT_BACKWARD && layer < x->complete_at[u]) return CREW_OK;
    if (!x->params) return CREW_OK;
    /* a unit's last backward layer that reads no values (an embedding's) where no layer above it in
     * the unit has gathered it: nothing to gather, and where its gradient goes over its buffer,
     * what the buffer held is gone */
    if (what == CREW_VISIT_BACKWARD && layer == x->complete_at[u] && u != x->pinned &&
        r->m->layers[layer]->ops->backward_reads_no_values && x->held[x->slot[u]] != u &&
        x->gathering[x->slot[u]] != u) {
        if (grads_over_params(x, u)) x->held[x->slot[u]] = -1;
        return CREW_OK;
    }
    return ensure_gathered(r, u, what == CREW_VISIT_FORWARD ? 1 : -1);
}

void crew_rank_units_begin(crew_rank *r, int measure, crew_step_times *times)
{
    crew_rank_units *x = r->units;
    x->times = times;
    x->measure = measure;
    x->sq_small = 0.0;
    x->micro = 0;
    x->done_from = r->m->n_params;
}

/* Before each backward pass of the step (micro-batch `micro` of the rank's). */
void crew_rank_units_micro(crew_rank *r, int micro)
{
    crew_rank_units *x = r->units;
    x->micro = micro;
    x->done_from = r->m->n_params;
}

crew_status crew_rank_units_finish(crew_rank *r, crew_status passes, float **grad, double *sq_small)
{
    crew_rank_units *x = r->units;
    crew_status s = passes;
    for (int i = 0; i < 3; i++) { /* every collective in flight, waited for even after an error */
        crew_status w = i < 2 ? gather_wait(r, i) : CREW_OK;
        crew_status v = reduce_wait(r, i);
        if (!s) s = w ? w : v;
        if (w && w != s) crew_status_free(w);
        if (v && v != s) crew_status_free(v);
    }
    x->times = NULL;
    x->held[0] = x->held[1] = -1; /* the parameters change with the update: gathered anew next time */
    x->pinned_gathered = 0;
    *grad = x->grad_shard;
    *sq_small = x->sq_small;
    return s;
}

/* ------------------------------------------------------------------ the update */

/* The whole summed gradient's L2 norm, to the bit of sum_squares over it: every rank continues
 * the sum's state (backend.h, CREW_SQ_CHUNK) over its shard in shard order, each handing it on by a
 * broadcast. */
static crew_status whole_norm(crew_rank *r, const float *grad, double *norm)
{
    const crew_backend *be = r->be;
    double state[CREW_SQ_STATE] = {0.0};
    for (int q = 0; q < r->replicas; q++) {
        if (q == r->replica && crew_rank_shard_len(r, q) > 0)
            CREW_TRY(be->ops->sum_squares_lanes(be->ctx, grad, crew_rank_shard_len(r, q), state));
        CREW_TRY(be->ops->upload(be->ctx, NULL, r->dev_scratch, state, CREW_SQ_STATE, CREW_DT_F64));
        CREW_TRY(crew_broadcast(&r->group, r->dev_scratch, CREW_SQ_STATE, CREW_COMM_F64, q, r->run->timeout_s));
        CREW_TRY(be->ops->download(be->ctx, state, r->dev_scratch, CREW_SQ_STATE, CREW_DT_F64));
    }
    *norm = sqrt(crew_sq_state_sum(state));
    return CREW_OK;
}

crew_status crew_rank_units_update(crew_rank *r, float *grad, float lr)
{
    crew_rank_units *x = r->units;
    crew_model *m = r->m;
    double norm = -1.0;
    if (m->compile.optimizer.clip_norm > 0.0f) CREW_TRY(whole_norm(r, grad, &norm));
    float *params = x->params ? x->param_shard : m->params + r->shard_lo;
    return crew_optimizer_step_shard(&r->opt, r->be, params, grad, lr, norm);
}
