/* test_verify_planted.c — the proof, proven: crew verify, with its default options, FAILs on each
 * bug planted in the split of the work and PASSes without them, at N = 2 and 4, on a CNN with
 * dropout and on a CNN with batch norm, both trained with AdamW and a warmup. The correct build
 * also passes --against cpu (the full-batch run on another device of the kind), which fails when
 * that device computes in lower precision.
 *
 * Each bug is planted through the rank program's test seams (src/train/hooks.h), at the point
 * where a real one would sit; the library carries none of them. Each is tried on the models it
 * can affect: a dropout bug needs dropout, a batch-norm bug batch norm. The table printed at the
 * end says which of verify's checks caught each bug (the first that failed, in the order: a run
 * that stopped, the bitwise paths, the first step, the rounding reference, the trajectory);
 * docs/VERIFY.md shows it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/status.h"
#include "train/hooks.h"
#include "train/verify.h"

#include "small_cnn.h"
#include "synthetic.h"

/* ------------------------------------------------------------------ the bugs */

typedef enum planted_bug {
    PLANT_NONE,
    PLANT_DROPOUT_BY_ROW,        /* dropout keyed by the row within the micro-batch, not the sample */
    PLANT_LAST_BUCKET_UNREDUCED, /* with several buckets, the last one is never all-reduced */
    PLANT_ORDERED_DROPS_MICRO,   /* k > 1: the ordered all-reduce leaves out each rank's last micro-batch */
    PLANT_PLAIN_DROPS_RANK,      /* k = 1: the last rank's gradient is left out of the plain all-reduce */
    PLANT_STALE_GRADIENT,        /* replica 1 updates with the previous step's gradient */
    PLANT_ACCUM_DROPS_MICRO,     /* one replica accumulating: its last micro-batch is not added */
    PLANT_AVERAGED_TWICE,        /* the all-reduced gradient is divided by the replica count again */
    PLANT_SAME_MICRO_TWICE,      /* replica 1 trains on replica 0's micro-batches */
    PLANT_LOCAL_BN_STATS,        /* batch-norm statistics of the micro-batch alone, though synchronised */
    PLANT_WARMUP_SKIPPED,        /* no learning-rate warmup when there is more than one replica */
    PLANT_WRONG_LOADER_SLOT,     /* replica 1 takes the next step's micro-batch from its loader */
    PLANT_AGAINST_LOW_PRECISION, /* verify --against: that device computes its GEMMs in bf16, as a GPU
                                    quietly running TF32 would in lower precision */
    PLANT_COUNT
} planted_bug;

static const char *bug_name(planted_bug b)
{
    static const char *const names[PLANT_COUNT] = {
        [PLANT_NONE] = "none",
        [PLANT_DROPOUT_BY_ROW] = "dropout mask keyed by the row, not the sample",
        [PLANT_LAST_BUCKET_UNREDUCED] = "last gradient bucket never all-reduced",
        [PLANT_ORDERED_DROPS_MICRO] = "ordered all-reduce drops a micro-batch (k > 1)",
        [PLANT_PLAIN_DROPS_RANK] = "a rank left out of the plain all-reduce",
        [PLANT_STALE_GRADIENT] = "one replica updates with the previous step's gradient",
        [PLANT_ACCUM_DROPS_MICRO] = "one replica accumulating drops a micro-batch",
        [PLANT_AVERAGED_TWICE] = "gradients averaged twice",
        [PLANT_SAME_MICRO_TWICE] = "the same micro-batch given to two replicas",
        [PLANT_LOCAL_BN_STATS] = "local instead of synchronised batch-norm statistics",
        [PLANT_WARMUP_SKIPPED] = "warmup skipped when N > 1",
        [PLANT_WRONG_LOADER_SLOT] = "a replica reads the wrong loader slot",
        [PLANT_AGAINST_LOW_PRECISION] = "--against: that device's GEMMs in lower precision",
    };
    return names[b];
}

/* The seams' user: the bug of every run of one verify. */
typedef struct plant {
    planted_bug bug;
} plant;

static planted_bug bug_of(void *user) { return ((const plant *)user)->bug; }

/* A rank's own: the row numbers standing in for sample ids, the previous step's gradient. */
typedef struct plant_rank {
    int64_t *rows;       /* [rows] 0, 1, 2, ... */
    int64_t n_rows;
    float *prev[2];      /* [n_params] device */
} plant_rank;

static crew_status plant_begins(void *user, crew_hook_rank *r)
{
    (void)user;
    plant_rank *p = calloc(1, sizeof *p);
    if (!p) return CREW_OOM();
    r->state = p;
    return CREW_OK;
}

static void plant_ends(void *user, crew_hook_rank *r)
{
    (void)user;
    plant_rank *p = r->state;
    if (!p) return;
    for (int i = 0; i < 2; i++) crew_dev_free(r->be, p->prev[i]);
    free(p->rows);
    free(p);
    r->state = NULL;
}

static void plant_batch_slot(void *user, crew_hook_rank *r, int micro, int64_t *epoch_step, int *index)
{
    if (r->replica != 1) return;
    if (bug_of(user) == PLANT_SAME_MICRO_TWICE) *index = micro; /* replica 0's */
    if (bug_of(user) == PLANT_WRONG_LOADER_SLOT && *epoch_step + 1 < r->steps_per_epoch) ++*epoch_step;
}

static int plant_loader_rank(void *user, int rank) { return bug_of(user) == PLANT_SAME_MICRO_TWICE && rank == 1 ? 0 : rank; }

static const int64_t *plant_sample_ids(void *user, crew_hook_rank *r, const int64_t *ids, int64_t rows)
{
    plant_rank *p = r->state;
    if (bug_of(user) != PLANT_DROPOUT_BY_ROW) return ids;
    if (p->n_rows < rows) {
        int64_t *grown = realloc(p->rows, (size_t)rows * sizeof *grown);
        if (!grown) return ids;
        p->rows = grown;
        p->n_rows = rows;
    }
    for (int64_t k = 0; k < rows; k++) p->rows[k] = k; /* the row stands in for the sample */
    return p->rows;
}

static void plant_pass(void *user, crew_hook_rank *r, crew_pass *pass)
{
    (void)r;
    if (bug_of(user) != PLANT_LOCAL_BN_STATS || !pass->sync_sum) return;
    pass->sync_sum = NULL; /* normalises over the micro-batch alone */
    pass->sync_user = NULL;
    pass->total_rows = (double)pass->rows;
}

static int plant_accumulates(void *user, crew_hook_rank *r, int micro)
{
    return !(bug_of(user) == PLANT_ACCUM_DROPS_MICRO && micro == r->accumulation - 1);
}

static int plant_bucket(void *user, crew_hook_rank *r, int b, int n, crew_comm_request *req)
{
    switch (bug_of(user)) {
    case PLANT_LAST_BUCKET_UNREDUCED:
        return !(n > 1 && b == n - 1);
    case PLANT_ORDERED_DROPS_MICRO:
        if (r->accumulation > 1) req->k = r->accumulation - 1;
        return 1;
    case PLANT_PLAIN_DROPS_RANK: /* it contributes zeros */
        if (req->k <= 1 && r->replica == r->replicas - 1) r->be->ops->fill(r->be->ctx, req->buf, 0.0f, req->n);
        return 1;
    default:
        return 1;
    }
}

static crew_status plant_gradient(void *user, crew_hook_rank *r, int64_t step, float **grad)
{
    (void)step;
    const crew_backend_ops *o = r->be->ops;
    int64_t n = r->m->n_params;
    if (bug_of(user) == PLANT_AVERAGED_TWICE && r->replicas > 1)
        o->axpby(r->be->ctx, n, 1.0f / (float)r->replicas, *grad, 0.0f, *grad);
    if (bug_of(user) != PLANT_STALE_GRADIENT || r->replica != 1) return CREW_OK;
    plant_rank *p = r->state;
    if (!p->prev[0]) { /* zeros at the first step */
        for (int i = 0; i < 2; i++) CREW_TRY(crew_dev_alloc_f32(r->be, n, &p->prev[i]));
        o->fill(r->be->ctx, p->prev[0], 0.0f, n);
    }
    o->copy(r->be->ctx, p->prev[1], *grad, n); /* this step's, for the next */
    *grad = p->prev[0];
    float *t = p->prev[0];
    p->prev[0] = p->prev[1];
    p->prev[1] = t;
    return CREW_OK;
}

static void plant_lr(void *user, crew_hook_rank *r, crew_lr_plan *lr)
{
    if (bug_of(user) == PLANT_WARMUP_SKIPPED && r->replicas > 1) lr->warmup_steps = 0;
}

static void plant_options(void *user, const char *label, int against, crew_fit_options *o)
{
    (void)label;
    if (against && bug_of(user) == PLANT_AGAINST_LOW_PRECISION) o->precision = CREW_PRECISION_BF16;
}

static const crew_rank_hooks plant_hooks = {
    .rank_begins = plant_begins,
    .rank_ends = plant_ends,
    .batch_slot = plant_batch_slot,
    .sample_ids = plant_sample_ids,
    .pass = plant_pass,
    .accumulates = plant_accumulates,
    .bucket = plant_bucket,
    .gradient = plant_gradient,
    .lr_plan = plant_lr,
    .loader_rank = plant_loader_rank,
};

/* ------------------------------------------------------------------ the proof */

enum { SAMPLES = 448 };

/* small_cnn.h's CNN, with dropout 0.3 or with batch norm; AdamW with a warmup of 4 steps (so
 * that a skipped warmup changes something). */
static crew_model *model(int batch_norm)
{
    crew_compile_options c;
    crew_model_default_compile(NULL, &c); /* AdamW */
    c.optimizer.warmup_steps = 4;
    return small_cnn(batch_norm, batch_norm ? 0.0f : 0.3f, &c.optimizer);
}

/* Which check failed first: the verdict's own order. */
static const char *caught_by(const crew_verify_result *r)
{
    if (r->failure[0]) return "a run stopped";
    if (!r->bitwise_equal) return "paths (bitwise)";
    if (!r->first_step_ok) return "first step";
    if (!r->reference_ok) return "rounding reference";
    if (!r->full_batch_ok) return "trajectory";
    if (r->against_kind[0] && !r->against_first_step_ok) return "--against, first step";
    if (r->against_kind[0] && !r->against_ok) return "--against, trajectory";
    return "NOTHING";
}

static int applies(planted_bug b, int batch_norm)
{
    if (b == PLANT_DROPOUT_BY_ROW) return !batch_norm;
    if (b == PLANT_LOCAL_BN_STATS) return batch_norm;
    if (b == PLANT_WRONG_LOADER_SLOT) return !batch_norm; /* waits out a deadline: once is enough */
    if (b == PLANT_AGAINST_LOW_PRECISION) return !batch_norm;
    return 1;
}

/* verify --against cpu where it has something to judge: the other device's bug, and the correct
 * build (which must pass it too). */
static const char *against_for(planted_bug b)
{
    return b == PLANT_NONE || b == PLANT_AGAINST_LOW_PRECISION ? "cpu" : NULL;
}

/* crew verify's defaults (20 steps, the model's batch) on n replicas; returns the verdict. */
static int verify(const crew_dataset *d, int batch_norm, int n, planted_bug b, crew_verify_result *r)
{
    crew_model *m = model(batch_norm);
    if (!m) return -1;
    crew_verify_options o;
    crew_verify_options_init(&o);
    o.devices = n;
    o.against_kind = against_for(b);
    memset(r, 0, sizeof *r);
    plant p = {b};
    const crew_verify_hooks hooks = {&plant_hooks, &p, plant_options};
    crew_status s = crew_verify_with_hooks(m, d, &o, b == PLANT_NONE ? NULL : &hooks, r);
    int pass = s ? -1 : r->pass;
    CHECK_MSG(!s, "%s, N=%d, %s: %s", batch_norm ? "batch-norm CNN" : "dropout CNN", n, bug_name(b),
              crew_status_message(s));
    crew_status_free(s);
    crew_model_free(m);
    return pass;
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-planted-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (!d) return check_report();
    printf("%-56s %-15s %2s  %s\n", "planted bug", "model", "N", "verify");
    for (int bn = 0; bn <= 1; bn++)
        for (int n = 2; n <= 4; n += 2)
            for (int b = 0; b < PLANT_COUNT; b++) {
                if (!applies((planted_bug)b, bn)) continue;
                crew_verify_result r;
                int pass = verify(d, bn, n, (planted_bug)b, &r);
                const char *name = bug_name((planted_bug)b);
                printf("%-56s %-15s %2d  %s%s%s\n", name, bn ? "batch-norm CNN" : "dropout CNN", n,
                       pass == 1 ? "PASS" : pass == 0 ? "FAIL, caught by " : "ERROR",
                       pass == 0 ? caught_by(&r) : "", r.failure[0] ? "" : "");
                if (r.failure[0]) printf("    %s\n", r.failure);
                if (b == PLANT_NONE)
                    CHECK_MSG(pass == 1, "%s, N=%d, no bug: verify did not pass (%s; first step %s %g of its bound)",
                              bn ? "batch-norm CNN" : "dropout CNN", n, caught_by(&r), r.first_step_decided_by,
                              r.first_step_ratio);
                else
                    CHECK_MSG(pass == 0, "%s, N=%d: verify passed with the bug '%s' planted",
                              bn ? "batch-norm CNN" : "dropout CNN", n, name);
                if (b == PLANT_NONE) /* the JSON's account of what ran */
                    CHECK_MSG(r.paths == 4 && r.replicas_compared == n && r.replica_checks == (bn ? 5 : 4) * r.steps &&
                                  r.path[2].accumulation == 2 && r.path[1].buckets > 1,
                              "paths %d, replicas %d, checks %lld", r.paths, r.replicas_compared,
                              (long long)r.replica_checks);
            }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
