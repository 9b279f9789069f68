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
    /* bugs that escaped verify's earlier defaults (issue "verify's blind spots") */
    PLANT_DECAY_PER_MICRO,       /* SGD's weight decay added to every micro-batch's gradient before the
                                    all-reduce, so counted N·k times: it moves the reference of other
                                    blocks (2N replicas) too */
    PLANT_BLIND_DRIFT_STATE,     /* the drift check hashes the first tensor for every slot, and only
                                    replica 0 updates batch norm's moving statistics */
    PLANT_SHARD_GATHER_SHORT,    /* a sharded optimizer's all-gather skips the last shard */
    PLANT_EPOCH_ORDER_REUSED,    /* replicas > 0 reuse epoch 0's sample order in every later epoch */
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
        [PLANT_DECAY_PER_MICRO] = "weight decay added to each micro-batch's gradient",
        [PLANT_BLIND_DRIFT_STATE] = "drift check blind, replica 1's moving statistics stale",
        [PLANT_SHARD_GATHER_SHORT] = "sharded all-gather skips the last shard",
        [PLANT_EPOCH_ORDER_REUSED] = "replicas > 0 reuse epoch 0's sample order",
    };
    return names[b];
}

/* The seams' user: the bug of every run of one verify. */
typedef struct plant {
    planted_bug bug;
} plant;

static planted_bug bug_of(void *user) { return ((const plant *)user)->bug; }

/* A rank's own: the row numbers standing in for sample ids, the previous step's gradient, the
 * state before the step. */
typedef struct plant_rank {
    int64_t *rows;       /* [rows] 0, 1, 2, ... */
    int64_t n_rows;
    float *prev[2];      /* [n_params] device */
    float *state;        /* [n_state] device */
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
    crew_dev_free(r->be, p->state);
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
    int64_t n = r->grad_n; /* the whole buffer, or a ZeRO-2/3 shard */
    if (bug_of(user) == PLANT_DECAY_PER_MICRO) { /* wd·p in each of the N·k micro-batches, where the update adds it once */
        float extra = (float)(r->replicas * r->accumulation - 1) * r->m->compile.optimizer.weight_decay;
        o->axpby(r->be->ctx, n, extra, r->grad_params, 1.0f, *grad);
    }
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

/* Replica 1 keeps its state of before the step: only replica 0 updates the moving statistics. */
static crew_status plant_step_begins(void *user, crew_hook_rank *r, int64_t step)
{
    (void)step;
    plant_rank *p = r->state;
    if (bug_of(user) != PLANT_BLIND_DRIFT_STATE || r->replica == 0 || !r->m->n_state) return CREW_OK;
    if (!p->state) CREW_TRY(crew_dev_alloc_f32(r->be, r->m->n_state, &p->state));
    r->be->ops->copy(r->be->ctx, p->state, r->m->state, r->m->n_state);
    return CREW_OK;
}

static crew_status plant_step_ends(void *user, crew_hook_rank *r, int64_t step)
{
    (void)step;
    plant_rank *p = r->state;
    if (bug_of(user) == PLANT_BLIND_DRIFT_STATE && p->state) r->be->ops->copy(r->be->ctx, r->m->state, p->state, r->m->n_state);
    return CREW_OK;
}

/* Every slot of the drift check's row gets the first tensor's hash. */
static void plant_drift_hashes(void *user, crew_hook_rank *r, uint64_t *hashes, int slots)
{
    (void)r;
    for (int i = 1; i < slots && bug_of(user) == PLANT_BLIND_DRIFT_STATE; i++) hashes[i] = hashes[0];
}

static void plant_shard_allgather(void *user, crew_hook_rank *r, int64_t *bounds)
{
    if (bug_of(user) == PLANT_SHARD_GATHER_SHORT) bounds[r->replicas] = bounds[r->replicas - 1];
}

static int plant_loader_epoch(void *user, int rank, int epoch)
{
    return bug_of(user) == PLANT_EPOCH_ORDER_REUSED && rank > 0 ? 0 : epoch;
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
    .step_begins = plant_step_begins,
    .step_ends = plant_step_ends,
    .drift_hashes = plant_drift_hashes,
    .shard_allgather = plant_shard_allgather,
    .loader_rank = plant_loader_rank,
    .loader_epoch = plant_loader_epoch,
};

/* ------------------------------------------------------------------ the proof */

enum { SAMPLES = 448 };

/* The models: small_cnn.h's CNN with dropout 0.3 or with batch norm, AdamW with a warmup of 4
 * steps (so that a skipped warmup changes something); and an MLP with SGD, momentum 0.9 and weight
 * decay 2e-5, on which a bug in the decay hides best. */
enum { DROPOUT_CNN, BATCH_NORM_CNN, SGD_MLP, MODELS };
static const char *const model_names[MODELS] = {"dropout CNN", "batch-norm CNN", "SGD MLP"};

static crew_model *model(int which)
{
    if (which == SGD_MLP) {
        const crew_optimizer_spec sgd = {.type = CREW_OPT_SGD, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-6f};
        crew_model *m = NULL;
        CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
        if (!m) return NULL;
        CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
        CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 32, .activation = CREW_ACT_RELU}));
        CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
        CHECK_OK(crew_model_compile(m, &(crew_compile_options){.loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY, .optimizer = sgd}));
        return m;
    }
    crew_compile_options c;
    crew_model_default_compile(NULL, &c); /* AdamW */
    c.optimizer.warmup_steps = 4;
    return small_cnn(which == BATCH_NORM_CNN, which == DROPOUT_CNN ? 0.3f : 0.0f, &c.optimizer);
}

/* Which check failed first: the verdict's own order. */
static const char *caught_by(const crew_verify_result *r)
{
    if (r->failure[0]) return "a run stopped";
    if (!r->bitwise_equal) return "paths (bitwise)";
    if (!r->first_step_ok) return "first step";
    if (!r->reference_ok) return "rounding reference";
    if (!r->other_blocks_ok) return "other blocks beyond the blocks without replicas";
    if (!r->full_batch_ok) return "trajectory";
    if (r->against_kind[0] && !r->against_first_step_ok) return "--against, first step";
    if (r->against_kind[0] && !r->against_ok) return "--against, trajectory";
    return "NOTHING";
}

static int applies(planted_bug b, int model)
{
    if (b == PLANT_NONE) return 1;
    if (model == SGD_MLP) return b == PLANT_DECAY_PER_MICRO;
    switch (b) {
    case PLANT_DROPOUT_BY_ROW:
    case PLANT_WRONG_LOADER_SLOT:     /* waits out a deadline: once is enough */
    case PLANT_AGAINST_LOW_PRECISION:
    case PLANT_SHARD_GATHER_SHORT:
    case PLANT_EPOCH_ORDER_REUSED:
        return model == DROPOUT_CNN;
    case PLANT_LOCAL_BN_STATS:
    case PLANT_BLIND_DRIFT_STATE:
        return model == BATCH_NORM_CNN;
    case PLANT_DECAY_PER_MICRO:
        return 0;
    default:
        return 1;
    }
}

/* verify --against cpu where it has something to judge: the other device's bug, and the correct
 * build (which must pass it too). */
static const char *against_for(planted_bug b)
{
    return b == PLANT_NONE || b == PLANT_AGAINST_LOW_PRECISION ? "cpu" : NULL;
}

/* crew verify's defaults (20 steps, the model's batch) on n replicas; returns the verdict. */
static int verify(const crew_dataset *d, int which, int n, planted_bug b, crew_verify_result *r)
{
    crew_model *m = model(which);
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
    CHECK_MSG(!s, "%s, N=%d, %s: %s", model_names[which], n, bug_name(b), crew_status_message(s));
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
    for (int which = 0; which < MODELS; which++)
        for (int n = 2; n <= 4; n += 2)
            for (int b = 0; b < PLANT_COUNT; b++) {
                if (!applies((planted_bug)b, which)) continue;
                crew_verify_result r;
                int pass = verify(d, which, n, (planted_bug)b, &r);
                const char *name = bug_name((planted_bug)b);
                printf("%-56s %-15s %2d  %s%s\n", name, model_names[which], n,
                       pass == 1 ? "PASS" : pass == 0 ? "FAIL, caught by " : "ERROR", pass == 0 ? caught_by(&r) : "");
                if (r.failure[0]) printf("    %s\n", r.failure);
                if (!r.other_blocks_ok || b == PLANT_NONE)
                    printf("    other blocks: %s moved %.3g, %s %.3g\n", r.other_blocks_decided_by, r.other_blocks_diff,
                           r.other_blocks_ok ? "within" : "beyond", r.other_blocks_allowed);
                if (b == PLANT_NONE)
                    CHECK_MSG(pass == 1, "%s, N=%d, no bug: verify did not pass (%s; first step %s %g of its bound)",
                              model_names[which], n, caught_by(&r), r.first_step_decided_by, r.first_step_ratio);
                else
                    CHECK_MSG(pass == 0, "%s, N=%d: verify passed with the bug '%s' planted", model_names[which], n,
                              name);
                if (b == PLANT_NONE) { /* the JSON's account of what ran */
                    const int bn = which == BATCH_NORM_CNN;
                    CHECK_MSG(r.paths == 6 && r.replicas_compared == n && r.replica_checks == (bn ? 7 : 6) * r.steps &&
                                  r.path[2].accumulation == 2 && r.path[1].buckets > 1 &&
                                  r.path[4].sharded == CREW_SHARD_OPTIMIZER && r.path[5].sharded == CREW_SHARD_PARAMETERS,
                              "paths %d, replicas %d, checks %lld", r.paths, r.replicas_compared,
                              (long long)r.replica_checks);
                    /* a slice of the data whose steps cross two epoch boundaries */
                    CHECK_MSG(r.epochs_crossed >= CREW_VERIFY_EPOCHS_CROSSED && r.samples <= r.dataset_samples,
                              "%s, N=%d: %lld of %lld samples, %d epoch boundaries crossed", model_names[which], n,
                              (long long)r.samples, (long long)r.dataset_samples, r.epochs_crossed);
                }
            }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
