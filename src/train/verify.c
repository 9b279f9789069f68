/* verify.c — N replicas against one replica, every way the work can be split (crew_model_verify
 * in crew.h says what runs and what is compared; verify_compare.c compares).
 *
 * Why the full-batch comparison is judged against a rounding reference. (a) and (c) differ only in
 * the order of float sums, but training amplifies such differences, and Adam-type optimizers most
 * of all: they divide each gradient by its own running magnitude, so a weight whose gradient is
 * nearly zero (the sum of terms that cancel) moves by up to the learning rate in a direction that
 * rounding decides. After 20 steps of the example CNN the largest relative difference of a tensor
 * ranged from 4e-5 to 5e-2 depending only on the batch size, so a fixed tolerance passed or failed
 * by luck; a bias before batch norm, whose gradient is zero but for rounding, differs by 100% of
 * its own tiny scale. (d), run (c) again with each batch's samples in reverse order (the same
 * mathematics, another order of every sum over samples), measures what rounding alone does to
 * this run, tensor by tensor, and each tensor is held to its own bound: max(tolerance,
 * ROUNDING_FACTOR × its (c)-(d) difference), so a tensor of pure rounding noise excuses only
 * itself. (e), the same global batch split into other blocks (2N replicas of B/2, or N/2 of 2B),
 * is a second estimate, of what reversing cannot move: a float32 running sum of terms of one sign
 * (a weight gradient whose inputs are all positive, after a ReLU) errs by an amount that grows
 * with its length and barely depends on its order, so N replicas summing N shorter pieces differ
 * from the full batch by more than its reversed rows do (measured: the Keras batch-norm fixture
 * at N = 2 and 8 samples per replica ended 3.2e-3 from the full batch on a moving mean, 42 times
 * the reversed rows' 7.5e-5, while 4 replicas of 4 ended 5e-5 from 2 of 8). (h), the full batch
 * with every GEMM summed in (a)'s own blocks on one replica, is a third: what (a)'s row count does
 * to a GEMM library's bits, which neither of the others moves (plan_runs says when it mattered).
 * The spread is the largest of them (and of (g), below). A real error (a micro-batch missing or
 * counted twice, a wrong average) moves weights by O(1e-2) to O(1) of their scale from the first
 * step on, far beyond it; and the first-step check
 * holds (d) itself to float32 summation's bound, so a bug that moves (d) (a mask keyed by the row
 * instead of the sample: reversing the rows gives the samples other masks) fails there instead of
 * widening every bound.
 *
 * The factor, measured: both example models, N = 2, 4, 8, per-device batches 16, 32, 64, 20 steps:
 * 126 tensor comparisons. The ratio of (a)-(c) to (c)-(d) has a median of 0.86 and a 90th
 * percentile of 2.6, but a long tail (171 on a tensor whose differences were both under 1e-5);
 * where (a)-(c) exceeded the 1e-3 floor, the largest ratio was 11.2 (a conv bias, N = 8, batch
 * 16): one reversed run is a noisy estimate of another order's rounding. Hence 30. With both
 * references (a batch-norm CNN, the Keras batch-norm fixture and both examples, N = 2, 4, 8,
 * batches 8, 16, 32, 20 steps: 36 runs) the tensor nearest its bound needed a factor of at most
 * 7 (a conv bias, the Keras fixture at N = 8 and 8 samples per replica), 1.0 at the median. (A first
 * version nudged the weights by one ulp instead: that moves the values but keeps every order of
 * summation, so it underestimated the noise of sums that cancel, and a Keras batch-norm model
 * failed.)
 *
 * The order of the runs. In one process the one-replica references run first: their slowest step
 * sets the deadline of the N-replica runs (DEADLINE_FACTOR times it, at least DEADLINE_FLOOR_S),
 * so that a replica that waits for ever (for a collective, or for a micro-batch its loader will
 * never fill) stops its run with a named error instead of hanging verify. Across processes the
 * N-replica runs come first, every process taking part, and process 0 runs the references after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/options.h"
#include "core/rng.h"
#include "core/status.h"
#include "optim/optimizer.h"
#include "data/dataset.h"
#include "train/step.h"
#include "train/train.h"
#include "train/verify.h"

#define DEFAULT_TOLERANCE 1e-3
#define VERIFY_BUCKETS 4        /* verify's own bucket size: a quarter of the model */
#define DEADLINE_FACTOR 20.0
#define DEADLINE_FLOOR_S 10.0
#define GROUP_DEADLINE_S 300.0  /* across processes: the fit's default collective deadline */
#define MIN_STEPS_PER_EPOCH 4   /* the default slice of the data: at least this many global batches */

enum { COL_A, COL_B, COL_C, COL_NONE = -1 };

/* One run of the proof. */
typedef struct run_spec {
    const char *label;          /* as a FAIL names it */
    int devices;                /* replicas in this process */
    int64_t batch;              /* per replica and micro-batch */
    int64_t global_batch;
    int reverse_rows;
    double bucket_mb;
    int sync_bn;                /* crew_fit_options.sync_batch_norm */
    int grouped;                /* joins the process group */
    int column;                 /* its column of the losses table, or COL_NONE */
    const char *kind;           /* another device kind (--against), or NULL: the asked one */
    int shard;                  /* a crew_shard_level (NONE: as the options say); ZeRO-2/3 in units of bucket_mb */
    int64_t sum_block;          /* every sum over the batch in blocks of this many terms (crew_device_options.sum_block) */
} run_spec;

typedef struct verify_ctx {
    const crew_model *m;
    const crew_dataset *train;
    const crew_verify_options *opts;
    crew_fit_options base;
    const crew_verify_hooks *hooks; /* test seams in every run (hooks.h); NULL: the real proof */
    crew_verify_result *res;
    float *losses;              /* the caller's [steps × 3] or NULL */
    double deadline_s;
} verify_ctx;

typedef struct step_log {
    const verify_ctx *v;
    int column;
    crew_verify_values *out;
} step_log;

static void log_step(void *user, const crew_step_info *info)
{
    step_log *l = user;
    if (info->step == 1) l->out->first_loss = info->loss;
    if (info->step_s > l->out->slowest_step_s) l->out->slowest_step_s = info->step_s;
    if (l->column != COL_NONE && l->v->losses && info->step >= 1 && info->step <= l->v->res->steps)
        l->v->losses[(info->step - 1) * 3 + l->column] = info->loss;
}

/* Errors that mean the run itself went wrong (verify FAILs naming it), not that it could not be
 * made (memory, files, options: verify returns those). */
static int stops_the_proof(crew_status s)
{
    switch (crew_status_code(s)) {
    case CREW_CODE_TIMEOUT:
    case CREW_CODE_DIVERGED:
    case CREW_CODE_NUMERIC:
    case CREW_CODE_CANCELLED:
    case CREW_CODE_INTERNAL:
        return 1;
    default:
        return 0;
    }
}

/* Runs one spec from the template's weights into *out. A run that stops sets res->failure and
 * returns CREW_OK with out->m NULL. */
static crew_status run_one(verify_ctx *v, const run_spec *r, crew_verify_values *out)
{
    memset(out, 0, sizeof *out);
    size_t n = (size_t)(v->m->n_params > 0 ? v->m->n_params : 1);
    out->first_grads = calloc(n, sizeof(float));
    out->moments = calloc(2 * n, sizeof(float));
    crew_status s = out->first_grads && out->moments ? CREW_OK : CREW_OOM();
    if (!s) s = crew_model_clone(v->m, NULL, &out->m);
    crew_fit_options o = v->base;
    o.devices = r->devices;
    o.batch_per_device = r->batch;
    o.global_batch = r->global_batch;
    o.bucket_mb = r->bucket_mb;
    o.sync_batch_norm = r->sync_bn;
    if (r->shard) o.shard = r->shard;
    if (r->shard >= CREW_SHARD_GRADIENTS) o.shard_unit_mb = r->bucket_mb;
    o.group = r->grouped ? v->opts->group : NULL;
    if (r->grouped) { /* the N-replica runs: as pipelines when asked */
        o.pipeline_stages = v->opts->pipeline_stages;
        o.pipeline_schedule = v->opts->pipeline_schedule;
        o.pipeline_split = v->opts->pipeline_split;
    }
    if (r->kind) {
        o.device_kind = r->kind;
        /* the other kind's convolutions: as this kind's where it has a library too, else im2col */
        if (!crew_device_kind_find(r->kind)->conv_library) {
            o.conv = CREW_CONV_IM2COL;
            o.conv_choice = NULL;
        }
    }
    o.drift_check_every = 1; /* every replica's values, after every step */
    o.collective_timeout_s = v->deadline_s;
    step_log log = {v, r->column, out};
    o.on_step = log_step;
    o.user = &log;
    if (v->hooks && v->hooks->options) v->hooks->options(v->hooks->user, r->label, r->kind != NULL, &o);
    crew_fit *f = NULL;
    crew_fit_result fr;
    if (!s) s = crew_fit_prepare(out->m, v->train, &o, &f);
    if (!s) {
        crew_fit_hooks *h = crew_fit_hooks_of(f);
        h->reverse_batch_rows = r->reverse_rows;
        h->first_grads = out->first_grads;
        h->final_moments = out->moments;
        h->compare_replicas = o.devices > 1; /* every replica's values, not only replica 0's and their hashes */
        h->sum_block = r->sum_block;
        if (v->hooks) h->rank = v->hooks->rank, h->rank_user = v->hooks->user;
        s = crew_fit_run(f, &fr);
        if (s && stops_the_proof(s)) {
            snprintf(v->res->failure, sizeof v->res->failure, "%s: %s", r->label, crew_status_message(s));
            crew_status_free(s);
            s = CREW_OK;
            crew_model_free(out->m);
            out->m = NULL;
        }
    }
    crew_fit_free(f);
    if (s) crew_verify_values_free(out);
    return s;
}

static int has_batch_norm(const crew_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i]->spec.type == CREW_LAYER_BATCH_NORM) return 1;
    return 0;
}

/* verify's own bucket size, in MiB: VERIFY_BUCKETS buckets of the model (at least one value each). */
static double small_bucket_mb(int64_t n_params)
{
    int64_t per = (n_params + VERIFY_BUCKETS - 1) / VERIFY_BUCKETS;
    if (per < 1) per = 1;
    return ((double)per + 0.5) * (double)sizeof(float) / (1024.0 * 1024.0); /* + 0.5: survives the rounding down */
}

/* Everything verify runs, and what it keeps of each. */
typedef struct verify_runs {
    int n_paths;
    run_spec path_spec[CREW_VERIFY_MAX_PATHS];
    int path_ref[CREW_VERIFY_MAX_PATHS];    /* 0: (b), 1: (b2) */
    crew_verify_values path[CREW_VERIFY_MAX_PATHS];
    int a_is_path0;                         /* no batch norm: (a) is the first path */
    run_spec a_spec, b_spec[2], c_spec, d_spec[2], f_spec, g_spec, h_spec;
    int has_b2, has_d, has_e, has_f, has_h; /* (g) runs with (d) */
    crew_verify_values a, b[2], c, d[2], f, g, h;
} verify_runs;

static void verify_runs_free(verify_runs *w)
{
    for (int i = 0; i < w->n_paths; i++)
        if (!(i == 0 && w->a_is_path0)) crew_verify_values_free(&w->path[i]);
    crew_verify_values_free(&w->a);
    crew_verify_values_free(&w->b[0]);
    crew_verify_values_free(&w->b[1]);
    crew_verify_values_free(&w->c);
    crew_verify_values_free(&w->d[0]);
    crew_verify_values_free(&w->d[1]);
    crew_verify_values_free(&w->f);
    crew_verify_values_free(&w->g);
    crew_verify_values_free(&w->h);
}

/* The specs: (a) as asked; the paths: k and the other k, each with the run's buckets and with
 * verify's own (when that makes a different count). */
static void plan_runs(verify_ctx *v, int n, int total, int64_t batch, int k, int has_k2, verify_runs *w)
{
    const int bn = has_batch_norm(v->m), k2 = k == 1 ? 2 : 1;
    const double run_mb = v->base.bucket_mb > 0 ? v->base.bucket_mb : CREW_DEFAULT_BUCKET_MB;
    const double own_mb = small_bucket_mb(v->m->n_params);
    const int64_t g[2] = {(int64_t)total * batch * k, (int64_t)total * batch * k2};
    w->a_spec = (run_spec){"N replicas", n, batch, g[0], 0, run_mb, -1, 1, COL_A, NULL, 0, 0};
    w->b_spec[0] = (run_spec){"1 replica accumulating", 1, batch, g[0], 0, run_mb, -1, 0, COL_B, NULL, 0, 0};
    w->b_spec[1] = (run_spec){"1 replica accumulating (the other k)", 1, batch, g[1], 0, run_mb, -1, 0, COL_NONE, NULL, 0, 0};
    w->c_spec = (run_spec){"1 replica full batch", 1, g[0], g[0], 0, run_mb, -1, 0, COL_C, NULL, 0, 0};
    w->d_spec[0] = (run_spec){"rounding reference (full batch, rows reversed)", 1, g[0], g[0], 1, run_mb, -1, 0,
                              COL_NONE, NULL, 0, 0};
    /* (e): the same global batch in other blocks, 2N replicas of B/2 (or N/2 of 2B), within
     * process 0; none when neither divides, or when it would be (c) itself */
    int e_n = batch % 2 == 0 ? 2 * total : total % 2 == 0 ? total / 2 : 0;
    int64_t e_batch = e_n ? g[0] / k / e_n : 0;
    w->has_e = e_n > 1 && e_batch * e_n * k == g[0];
    w->d_spec[1] = (run_spec){"rounding reference (other blocks)", e_n, e_batch, g[0], 0, run_mb, -1, 0, COL_NONE, NULL, 0, 0};
    w->has_b2 = has_k2;
    w->a_is_path0 = !bn;
    static const char *labels[2][2] = {{"N replicas, k micro-batches, the run's buckets",
                                        "N replicas, k micro-batches, verify's buckets"},
                                       {"N replicas, the other k, the run's buckets",
                                        "N replicas, the other k, verify's buckets"}};
    for (int kk = 0; kk < (has_k2 ? 2 : 1); kk++)
        for (int own = 0; own < 2; own++) {
            double mb = own ? own_mb : run_mb;
            if (own && crew_bucket_count(v->m->n_params, own_mb) == crew_bucket_count(v->m->n_params, run_mb)) continue;
            /* batch norm: per-micro-batch statistics, which one replica accumulating computes too */
            w->path_spec[w->n_paths] = (run_spec){labels[kk][own], n, batch, g[kk], 0, mb, bn ? 0 : -1, 1, COL_NONE, NULL, 0, 0};
            w->path_ref[w->n_paths++] = kk;
        }
    if (w->a_is_path0) w->path_spec[0] = w->a_spec;
    const int piped = v->opts->pipeline_stages > 1 || v->opts->pipeline_split;
    if (total > 1 && !v->opts->shard_optimizer && !piped) { /* ZeRO-1, which the planner may choose: held bitwise too */
        w->path_spec[w->n_paths] = (run_spec){"N replicas, k micro-batches, verify's buckets, sharded optimizer", n, batch,
                                              g[0], 0, own_mb, bn ? 0 : -1, 1, COL_NONE, NULL, CREW_SHARD_OPTIMIZER, 0};
        w->path_ref[w->n_paths++] = 0;
    }
    /* ZeRO-3 (which holds ZeRO-2's gradient path too), in units of verify's bucket size, whose edges
     * fall inside the shards: its units gathered and reduce-scattered, the clipping norm handed on
     * from shard to shard. Not for LAMB and LARS, which shard their optimizer state only. */
    if (total > 1 && !piped && !crew_optimizer_layerwise(&v->m->compile.optimizer)) {
        w->path_spec[w->n_paths] = (run_spec){"N replicas, k micro-batches, sharded parameters (ZeRO-3) in small units", n,
                                              batch, g[0], 0, own_mb, bn ? 0 : -1, 1, COL_NONE, NULL,
                                              CREW_SHARD_PARAMETERS, 0};
        w->path_ref[w->n_paths++] = 0;
    }
    w->has_d = !v->res->fixed_tolerance;
    /* (g): the blocks of (e) (or half a micro-batch) without the replicas: the full batch on one
     * replica, every GEMM summing its k terms in blocks of that many */
    w->g_spec = (run_spec){"rounding reference (full batch, GEMMs summed in blocks)", 1, g[0], g[0], 0, run_mb, -1, 0,
                           COL_NONE, NULL, 0, w->has_e ? e_batch : batch > 1 ? batch / 2 : 1};
    /* (h): (a)'s own blocks without the replicas: the full batch on one replica, every GEMM
     * summing its k terms in blocks of (a)'s micro-batch, and over its rows in those blocks, as
     * (a)'s replicas do. It measures what (a)'s blocks do to rounding that reversing the rows and
     * other blocks cannot: a GEMM library's bits for a row may depend on the call's row count
     * (oneDNN's dy·Wᵀ on an AVX2 CPU gives other bits at 128 rows than at 64 or 1024), and such a
     * difference, which training amplifies at random (a ReLU or an Adam sign flipped), is (a)'s
     * alone. Measured: the example MLP on 8 replicas of 128 (AMD EPYC, AVX2) ended 0.087 from the
     * full batch on a bias while (d) and (e) stayed within 8e-6 of it (a FAIL of a correct build);
     * with 2, 4 or 16 replicas of the same global batch it ended within 5e-5. None where (a)'s blocks
     * are the full batch. */
    w->has_h = w->has_d && batch < g[0];
    w->h_spec = (run_spec){"rounding reference (full batch, GEMMs summed in the replicas' blocks)", 1, g[0], g[0], 0,
                           run_mb, -1, 0, COL_NONE, NULL, 0, batch};
    w->has_f = v->opts->against_kind != NULL;
    w->f_spec = (run_spec){"1 replica full batch on the other kind (--against)", 1, g[0], g[0], 0, run_mb, -1, 0,
                           COL_NONE, v->opts->against_kind, 0, 0};
}

/* The N-replica runs (every process takes part); stops at the first that stops. */
static crew_status run_replicas(verify_ctx *v, verify_runs *w)
{
    CREW_TRY(run_one(v, &w->a_spec, &w->a));
    if (!w->a.m) return CREW_OK;
    v->res->replica_checks += v->res->steps;
    for (int i = 0; i < w->n_paths; i++) {
        if (i == 0 && w->a_is_path0) {
            w->path[0] = w->a; /* the same run; freed once, as (a) */
            continue;
        }
        CREW_TRY(run_one(v, &w->path_spec[i], &w->path[i]));
        if (!w->path[i].m) return CREW_OK;
        v->res->replica_checks += v->res->steps;
    }
    return CREW_OK;
}

/* The one-replica references (process 0 only); stops at the first that stops. */
static crew_status run_references(verify_ctx *v, verify_runs *w)
{
    CREW_TRY(run_one(v, &w->b_spec[0], &w->b[0]));
    if (!w->b[0].m) return CREW_OK;
    if (w->has_b2) {
        CREW_TRY(run_one(v, &w->b_spec[1], &w->b[1]));
        if (!w->b[1].m) return CREW_OK;
    }
    CREW_TRY(run_one(v, &w->c_spec, &w->c));
    if (!w->c.m || !w->has_d) return CREW_OK;
    CREW_TRY(run_one(v, &w->d_spec[0], &w->d[0]));
    if (!w->d[0].m) return CREW_OK;
    CREW_TRY(run_one(v, &w->g_spec, &w->g));
    if (!w->g.m || !w->has_h) return CREW_OK;
    return run_one(v, &w->h_spec, &w->h);
}

/* (e), process 0 only, after the deadline is known: it has replicas of its own; then (f). */
static crew_status run_reblocked(verify_ctx *v, verify_runs *w)
{
    if (w->has_d && w->has_e) CREW_TRY(run_one(v, &w->d_spec[1], &w->d[1]));
    if (v->res->failure[0] || !w->has_f) return CREW_OK;
    return run_one(v, &w->f_spec, &w->f);
}

/* (f) against (c), judged as (a) is, into the against_* fields (the others stay (a)'s). */
static crew_status judge_against(verify_ctx *v, verify_runs *w)
{
    crew_verify_result *res = v->res, mine = *res;
    mine.first_step_ratio = 0.0;
    mine.first_step_decided_by[0] = '\0'; /* the first check names itself */
    char label[48];
    snprintf(label, sizeof label, "full batch on %s", res->against_kind);
    res->against_first_step_ok = crew_verify_first_step(&w->f, &w->c, res->global_batch, label, &mine);
    res->against_first_step_ratio = mine.first_step_ratio;
    snprintf(res->against_first_step_decided_by, sizeof res->against_first_step_decided_by, "%s",
             mine.first_step_decided_by);
    CREW_TRY(crew_verify_judge(w->f.m, w->c.m, w->has_d ? w->d[0].m : NULL, w->has_e ? w->d[1].m : NULL, NULL, NULL,
                               &mine));
    res->against_ok = mine.full_batch_ok;
    res->against_max_rel_diff = mine.max_rel_diff_full_batch;
    snprintf(res->against_decided_by, sizeof res->against_decided_by, "%s", mine.decided_by);
    res->against_decided_by_diff = mine.decided_by_diff;
    res->against_allowed = mine.allowed;
    return CREW_OK;
}

static double slowest_reference_step(const verify_runs *w)
{
    const crew_verify_values *r[] = {&w->b[0], &w->b[1], &w->c, &w->d[0], &w->g, &w->h};
    double s = 0.0;
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) s = r[i]->slowest_step_s > s ? r[i]->slowest_step_s : s;
    return s;
}

/* Process 0's verdict from every run. */
static crew_status judge_runs(verify_ctx *v, verify_runs *w)
{
    crew_verify_result *res = v->res;
    const int bn = has_batch_norm(v->m);
    res->bitwise_equal = 1;
    for (int i = 0; i < w->n_paths; i++) {
        crew_verify_path *p = &res->path[i];
        const crew_verify_values *ref = &w->b[w->path_ref[i]];
        /* with batch norm per micro-batch, replica 0's moving statistics follow its own micro-batches */
        CREW_TRY(crew_verify_compare(&w->path[i], ref, !bn, &p->bitwise_equal, &p->max_rel_diff));
        res->bitwise_equal &= p->bitwise_equal;
        if (p->max_rel_diff > res->max_rel_diff_accum) res->max_rel_diff_accum = p->max_rel_diff;
    }
    const int64_t g = res->global_batch;
    res->first_step_ok = crew_verify_first_step(&w->a, &w->c, g, "N replicas", res);
    res->first_step_loss_diff = w->c.first_loss != 0.0f
                                    ? (double)(w->a.first_loss - w->c.first_loss) / (double)w->c.first_loss
                                    : (double)(w->a.first_loss - w->c.first_loss);
    if (res->first_step_loss_diff < 0) res->first_step_loss_diff = -res->first_step_loss_diff;
    if (!bn) res->first_step_ok &= crew_verify_first_step(&w->b[0], &w->c, g, "1 replica accumulating", res);
    res->reference_ok = 1;
    if (w->has_d) {
        res->reference_ok &= crew_verify_first_step(&w->d[0], &w->c, g, "rounding reference (rows reversed)", res);
        if (w->has_e)
            res->reference_ok &= crew_verify_first_step(&w->d[1], &w->c, g, "rounding reference (other blocks)", res);
        if (w->has_h)
            res->reference_ok &= crew_verify_first_step(&w->h, &w->c, g, "rounding reference (the replicas' blocks)", res);
    }
    CREW_TRY(crew_verify_judge(w->a.m, w->c.m, w->has_d ? w->d[0].m : NULL, w->has_e ? w->d[1].m : NULL,
                               w->has_d ? w->g.m : NULL, w->has_h ? w->h.m : NULL, res));
    return CREW_OK;
}

void crew_verify_options_init(crew_verify_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
}

/* The proof (crew_model_verify), with test seams in every run when hooks is not NULL. */
static crew_status verify(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                          const crew_verify_hooks *hooks, crew_verify_result *res)
{
    if (!m || !train || !opts || !res) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_verify: NULL argument");
    float *losses = res->losses;
    memset(res, 0, sizeof *res);
    res->losses = losses;
    res->stages = 1;
    crew_verify_options given;
    crew_verify_options_init(&given);
    CREW_TRY(crew_options_take(&given, sizeof given, opts, "crew_verify_options"));
    verify_ctx v = {.m = m, .train = train, .opts = &given, .hooks = hooks, .res = res, .losses = losses};
    crew_fit_options *base = &v.base;
    crew_model_default_fit(m, base);
    if (given.device_kind) base->device_kind = given.device_kind;
    base->precision = given.precision;
    base->conv = given.conv;
    base->conv_choice = given.conv_choice;
    base->shard_optimizer = given.shard_optimizer;
    base->attention_recompute = given.attention_recompute;
    int n = given.devices > 0 ? given.devices : 2;
    if (given.batch_per_device > 0) base->batch_per_device = given.batch_per_device;
    if (given.seed) base->seed = given.seed;
    base->max_steps = given.steps > 0 ? given.steps : 20;
    base->epochs = 1000000;
    const crew_process_group *group = given.group;
    const int processes = crew_group_size(group), lead = crew_group_rank(group) == 0;
    const int total = n * processes; /* N: the replicas of every process */
    base->global_batch = given.global_batch > 0 ? given.global_batch : total * base->batch_per_device;
    base->devices = total;
    if (!m->compiled) {
        crew_compile_options c;
        crew_model_default_compile(m, &c);
        CREW_TRY(crew_model_compile(m, &c));
    }
    crew_fit_plan plan;
    CREW_TRY(crew_model_plan_fit(m, train, base, &plan)); /* checks the combination once, up front */
    /* The data: by default a slice of whole global batches, so that the steps cross epoch
     * boundaries (a bug in how later epochs are ordered or split shows only there). */
    crew_dataset slice;
    const int64_t all = crew_dataset_size(train);
    int64_t want = given.samples;
    if (want == 0) { /* at least MIN_STEPS_PER_EPOCH: fewer would train on the same few batches over and over */
        int64_t per_epoch = (base->max_steps - 1) / CREW_VERIFY_EPOCHS_CROSSED;
        want = (per_epoch > MIN_STEPS_PER_EPOCH ? per_epoch : MIN_STEPS_PER_EPOCH) * plan.global_batch;
    }
    if (want > 0 && want < all) {
        crew_dataset_head(train, want, &slice);
        train = v.train = &slice;
        CREW_TRY(crew_model_plan_fit(m, train, base, &plan));
    }
    res->samples = crew_dataset_size(train);
    res->dataset_samples = all;
    res->steps_per_epoch = plan.steps_per_epoch;
    res->epochs_crossed = plan.steps_per_epoch > 0 ? (int)((plan.total_steps - 1) / plan.steps_per_epoch) : 0;
    if (given.against_kind) {
        CREW_TRY(crew_device_kind_check(given.against_kind));
        snprintf(res->against_kind, sizeof res->against_kind, "%s", given.against_kind);
    }
    if (given.pipeline_stages > 1 || given.pipeline_split) { /* and the pipeline's */
        crew_fit_options piped = *base;
        piped.devices = n;
        piped.pipeline_stages = given.pipeline_stages;
        piped.pipeline_schedule = given.pipeline_schedule;
        piped.pipeline_split = given.pipeline_split;
        crew_fit_plan pp;
        CREW_TRY(crew_model_plan_fit(m, train, &piped, &pp));
        res->stages = pp.stages;
        res->pipeline_schedule = pp.pipeline_schedule;
    }
    if (!m->initialized) CREW_TRY(crew_model_init_params(m, base->seed));
    const int k = plan.accumulation, k2 = k == 1 ? 2 : 1;
    crew_fit_options second = *base; /* the other k: skipped when the dataset cannot fill one step of it */
    second.global_batch = plan.global_batch / k * k2;
    crew_fit_plan plan2;
    crew_status s2 = crew_model_plan_fit(m, train, &second, &plan2);
    const int has_k2 = s2 == CREW_OK;
    crew_status_free(s2);
    res->devices = total;
    res->steps = plan.total_steps;
    res->global_batch = plan.global_batch;
    res->accumulation = k;
    res->tolerance = given.tolerance > 0 ? given.tolerance : DEFAULT_TOLERANCE;
    res->fixed_tolerance = given.tolerance > 0;
    res->batch_norm_synced = total > 1 && has_batch_norm(m);
    res->replicas_compared = total;
    v.deadline_s = given.deadline_s > 0 ? given.deadline_s : GROUP_DEADLINE_S;

    verify_runs w = {0};
    plan_runs(&v, n, total, plan.batch_per_device, k, has_k2, &w);
    res->buckets = crew_bucket_count(m->n_params, w.a_spec.bucket_mb);
    if (w.has_d && w.has_e) {
        res->reference_replicas = w.d_spec[1].devices;
        res->reference_batch = w.d_spec[1].batch;
    }
    if (w.has_h) res->own_blocks_batch = w.h_spec.sum_block;
    res->paths = w.n_paths;
    for (int i = 0; i < w.n_paths; i++)
        res->path[i] = (crew_verify_path){.accumulation = w.path_ref[i] ? k2 : k,
                                          .buckets = w.path_spec[i].shard >= CREW_SHARD_GRADIENTS /* its units */
                                                         ? crew_model_units(m, crew_bucket_values(w.path_spec[i].bucket_mb), NULL, 0)
                                                         : crew_bucket_count(m->n_params, w.path_spec[i].bucket_mb),
                                          .global_batch = w.path_spec[i].global_batch,
                                          .sharded = w.path_spec[i].shard   ? w.path_spec[i].shard
                                                     : given.shard_optimizer ? CREW_SHARD_OPTIMIZER : CREW_SHARD_NONE};
    res->other_blocks_ok = 1;
    crew_status s = CREW_OK;
    if (!group) { /* references first: they set the deadline */
        s = run_references(&v, &w);
        if (!s && !res->failure[0]) {
            double slow = DEADLINE_FACTOR * slowest_reference_step(&w);
            if (given.deadline_s <= 0) v.deadline_s = slow > DEADLINE_FLOOR_S ? slow : DEADLINE_FLOOR_S;
            s = run_replicas(&v, &w);
        }
    } else {
        s = run_replicas(&v, &w);
        if (!s && lead && !res->failure[0]) s = run_references(&v, &w);
    }
    if (!s && lead && !res->failure[0]) s = run_reblocked(&v, &w);
    res->deadline_s = v.deadline_s;
    if (!s && !lead) { /* the references and the verdict are process 0's */
        res->pass = !res->failure[0];
        verify_runs_free(&w);
        return CREW_OK;
    }
    if (!s && !res->failure[0]) s = judge_runs(&v, &w);
    if (!s && !res->failure[0] && w.has_f) s = judge_against(&v, &w);
    if (!s)
        res->pass = !res->failure[0] && res->bitwise_equal && res->first_step_ok && res->reference_ok &&
                    res->other_blocks_ok && res->full_batch_ok &&
                    (!w.has_f || (res->against_first_step_ok && res->against_ok));
    verify_runs_free(&w);
    return s;
}

crew_status crew_model_verify(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                              crew_verify_result *res)
{
    return verify(m, train, opts, NULL, res);
}

crew_status crew_verify_with_hooks(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                                   const crew_verify_hooks *hooks, crew_verify_result *res)
{
    return verify(m, train, opts, hooks, res);
}
