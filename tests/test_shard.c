/* test_shard.c — sharding (--shard optimizer|gradients|parameters: ZeRO stages 1, 2 and 3) against
 * the unsharded run.
 *
 * On the small CNN of the data-parallel tests (synthetic 12x12 images):
 * - N = 2, 3 and 4 sharded replicas end with parameters and optimizer moments bitwise equal to one
 *   replica accumulating the same micro-batches: AdamW clipping by the global norm (so the norm
 *   must be the whole gradient's), SGD with momentum, LAMB and LARS (whose tensors' norms a shard
 *   does not hold alone; ZeRO-1 only); one micro-batch per replica and two; ZeRO-1 with the
 *   default bucket and buckets of 64 values, whose edges fall inside the shards; ZeRO-2 and 3 with
 *   the default units on the replicas' threads, and units of 64 values (a layer each, cut by the
 *   shards) with their collectives on the communication thread (--shard-overlap on);
 * - each replica's device holds 1/N of the optimizer state (and of the gradients, and of the
 *   parameters): its measured peak is the memory planner's figure for each level (ZeRO-3 with
 *   overlap: two buffers of a unit), within 1%;
 * - a sharded run's checkpoint is an ordinary one: stopped at step 6 on one layout and level, it
 *   resumes on another replica count and level (ZeRO-3 to ZeRO-2, unsharded to ZeRO-3, ZeRO-2 to
 *   unsharded, ...) and ends bitwise equal to the uninterrupted run;
 * - the plan says whether it shards (not with one replica); a pipeline with sharding, an unknown
 *   level, a bad unit size and LAMB with sharded gradients are refused with clear messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "model_values.h"
#include "nn/model.h"
#include "train/hooks.h"
#include "train/step.h"
#include "train/train.h"

#include "small_cnn.h"
#include "synthetic.h"

enum { SAMPLES = 448, STEPS = 12 };

static const crew_optimizer_spec ADAMW = {.type = CREW_OPT_ADAMW, .lr = 0.01f, .weight_decay = 0.01f,
                                          .clip_norm = 0.05f};
static const crew_optimizer_spec SGD = {.type = CREW_OPT_SGD, .lr = 0.05f, .momentum = 0.9f};
/* The layer-wise ones: each tensor's update scaled by norms over the whole tensor, which a shard
 * does not hold alone (LARS clipping too: its gradients are gathered once, for both). */
static const crew_optimizer_spec LAMB = {.type = CREW_OPT_LAMB, .lr = 0.01f, .weight_decay = 0.01f};
static const crew_optimizer_spec LARS = {.type = CREW_OPT_LARS, .lr = 0.5f, .momentum = 0.9f, .weight_decay = 5e-4f,
                                         .clip_norm = 0.05f};

typedef struct run_spec {
    const crew_optimizer_spec *opt;
    int devices, shard;         /* shard: a crew_shard_level */
    int64_t global;             /* batch 8 per device */
    double bucket_mb;           /* 0: the default; ZeRO-2/3: the units' size */
    const char *checkpoints;    /* NULL: none */
    int resume, stop_at;        /* stop_at: cancel after this step (0: run to the end) */
    int overlap;                /* ZeRO-2/3: crew_fit_options.shard_overlap */
} run_spec;

typedef struct run_out {
    crew_model *m;
    float *moments;             /* [2 × n_params] */
    crew_fit_result res;
    crew_fit_plan plan;
} run_out;

typedef struct stopper {
    int64_t at;
    volatile int flag;
} stopper;

static void stop_after(void *user, const crew_step_info *info)
{
    stopper *s = user;
    if (s->at > 0 && info->step >= s->at - 1) s->flag = 1; /* read when the next step starts: it is the last */
}

static run_out run(const crew_dataset *d, const run_spec *rs)
{
    run_out out = {0};
    out.m = small_cnn(0, 0.2f, rs->opt);
    crew_fit_options o;
    crew_model_default_fit(out.m, &o);
    o.devices = rs->devices;
    o.batch_per_device = 8;
    o.global_batch = rs->global;
    o.bucket_mb = rs->bucket_mb;
    o.max_steps = STEPS;
    o.epochs = 10;
    o.seed = 11;
    o.drift_check_every = 3; /* the parameters must agree on every replica throughout */
    o.shard = rs->shard;
    if (rs->shard >= CREW_SHARD_GRADIENTS) {
        o.shard_unit_mb = rs->bucket_mb;
        o.bucket_mb = 0.0;
        o.shard_overlap = rs->overlap;
    }
    o.checkpoint_dir = rs->checkpoints;
    o.checkpoint_every = rs->checkpoints ? 3 : 0;
    o.resume = rs->resume;
    stopper stop = {rs->stop_at, 0};
    o.on_step = stop_after;
    o.user = &stop;
    o.cancel = &stop.flag;
    out.moments = calloc(2 * (size_t)out.m->n_params, sizeof *out.moments);
    crew_fit *f = NULL;
    CHECK_OK(crew_fit_prepare(out.m, d, &o, &f));
    if (!f) return out;
    crew_fit_hooks_of(f)->final_moments = out.moments;
    out.plan = *crew_fit_get_plan(f);
    crew_status s = crew_fit_run(f, &out.res);
    if (rs->stop_at) {
        CHECK_MSG(crew_status_code(s) == CREW_CODE_CANCELLED || !s, "stopped run: %s", crew_status_message(s));
        crew_status_free(s);
    } else {
        CHECK_OK(s);
    }
    crew_fit_free(f);
    return out;
}

static void run_free(run_out *r)
{
    crew_model_free(r->m);
    free(r->moments);
}

static int same_moments(const run_out *a, const run_out *b)
{
    return memcmp(a->moments, b->moments, 2 * (size_t)a->m->n_params * sizeof(float)) == 0;
}

static void check_bitwise(const crew_dataset *d, const crew_optimizer_spec *opt, const char *name, int top)
{
    const double small = 64 * 4.0 / (1024 * 1024); /* 64 values a bucket or unit */
    for (int64_t global = 24; global <= 48; global += 24) {
        run_out one = run(d, &(run_spec){opt, 1, 0, global, 0, NULL, 0, 0, 0});
        CHECK(one.plan.shard_optimizer == 0 && one.plan.shard == 0); /* nothing to shard with one replica */
        for (int level = CREW_SHARD_OPTIMIZER; level <= top; level++)
            for (int n = 2; n <= 4; n++) {
                if (global % (8 * n)) continue;
                for (int b = 0; b < 2; b++) {
                    /* ZeRO-2/3 in small units with their collectives beside compute, the default ones without */
                    run_out sh = run(d, &(run_spec){opt, n, level, global, b ? small : 0, NULL, 0, 0, b ? 1 : -1});
                    CHECK(sh.plan.shard_optimizer == 1 && sh.plan.shard == level && sh.res.steps == STEPS);
                    CHECK_MSG(mv_equal(one.m, sh.m), "%s, global batch %lld: %d replicas sharding %s%s differ from one "
                              "replica", name, (long long)global, n, crew_shard_level_name(level),
                              b ? " in small buckets or units" : "");
                    CHECK_MSG(same_moments(&one, &sh), "%s, global batch %lld: the moments of %d replicas sharding "
                              "%s%s differ", name, (long long)global, n, crew_shard_level_name(level),
                              b ? " in small buckets or units" : "");
                    run_free(&sh);
                }
            }
        run_free(&one);
    }
}

/* Replica 0's device peak at every level against the planner's figures, and what ZeRO-1 saves:
 * (N − 1)/N of the optimizer state. */
static void check_memory(const crew_dataset *d)
{
    const double unit_mb = 64 * 4.0 / (1024 * 1024);
    for (int n = 2; n <= 4; n += 2) {
        /* ZeRO-3 twice: with overlap, two buffers of a unit's parameters and two of its gradient;
         * without, one buffer that takes the unit's gradient over its parameters */
        run_out r[5];
        int64_t peak[5];
        for (int i = 0; i < 5; i++) {
            const int level = i < 4 ? i : CREW_SHARD_PARAMETERS, overlap = i == CREW_SHARD_PARAMETERS;
            r[i] = run(d, &(run_spec){&ADAMW, n, level, 8 * n, level >= CREW_SHARD_GRADIENTS ? unit_mb : 0, NULL, 0, 0,
                                      level == CREW_SHARD_PARAMETERS ? overlap : -1});
            CHECK(level < CREW_SHARD_PARAMETERS || r[i].plan.shard_overlap == overlap);
            peak[i] = r[i].res.stage_peak_bytes[0];
            crew_memory_options mo;
            crew_memory_options_init(&mo);
            mo.batch_per_device = 8;
            mo.devices = n;
            mo.global_batch = 8 * n;
            mo.shard = level;
            mo.shard_unit_mb = unit_mb;
            mo.shard_overlap = overlap;
            crew_memory_plan planned;
            CHECK_OK(crew_model_plan_memory(r[0].m, &mo, &planned));
            printf("%d replicas sharding %s%s: device peak %lld, planned %lld\n", n, crew_shard_level_name(level),
                   overlap ? " (overlap)" : "", (long long)peak[i], (long long)planned.bytes_per_device);
            double off = (double)peak[i] / (double)planned.bytes_per_device - 1.0;
            CHECK_MSG(off > -0.01 && off < 0.01, "%d replicas sharding %s%s: measured peak %lld vs planned %lld", n,
                      crew_shard_level_name(level), overlap ? " (overlap)" : "", (long long)peak[i],
                      (long long)planned.bytes_per_device);
            crew_memory_plan_release(&planned);
        }
        /* the gradient over the parameters: ZeRO-3 without overlap holds, besides its shards, the
         * gathered unit's parameters alone, two of its buffers fewer than with overlap */
        crew_unit units[64];
        const int n_units = crew_model_units(r[0].m, crew_bucket_values(unit_mb), units, 64);
        int64_t widest = 0;
        for (int u = 0; u < n_units && u < 64; u++)
            if (units[u].hi - units[u].lo > widest) widest = units[u].hi - units[u].lo;
        const int64_t fewer = peak[3] - peak[4], bufs = 3 * widest * (int64_t)sizeof(float);
        CHECK_MSG(n_units <= 64 && widest > 0 && fewer >= bufs && fewer < bufs + 3 * 1024, "%d replicas: ZeRO-3 "
                  "without overlap %lld bytes, with %lld, not 3 buffers of the widest unit (%lld values) fewer", n,
                  (long long)peak[4], (long long)peak[3], (long long)widest);
        const int64_t values = r[0].m->n_params * (int64_t)sizeof(float), state = 2 * values; /* AdamW's two moments */
        double saved = (double)(peak[0] - peak[1]), expect = (double)state * (n - 1) / n;
        CHECK_MSG(saved > 0.95 * expect && saved < 1.05 * expect + 1024, "%d replicas: sharding the optimizer saved "
                  "%.0f bytes, expected about %.0f", n, saved, expect);
        /* ZeRO-2 and 3 trade a whole buffer for the widest shard and the widest unit's buffer; this
         * model's widest layer holds half its parameters, so they save nothing here: how much they
         * save on a model of many units is cli_shard.sh's (gpt_tiny) */
        for (int i = 0; i < 5; i++) run_free(&r[i]);
    }
}

static void remove_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* A run stopped at step 6 resumes on another replica count and another level (or none), and ends
 * bitwise equal to the uninterrupted run. */
static void check_resume(const crew_dataset *d, const char *tmp)
{
    const struct { int64_t global; int first, first_shard, later, later_shard; } cases[] = {
        {48, 3, CREW_SHARD_OPTIMIZER, 2, CREW_SHARD_OPTIMIZER}, {32, 2, CREW_SHARD_OPTIMIZER, 4, CREW_SHARD_NONE},
        {48, 3, CREW_SHARD_PARAMETERS, 2, CREW_SHARD_GRADIENTS}, {32, 2, CREW_SHARD_NONE, 4, CREW_SHARD_PARAMETERS},
        {48, 2, CREW_SHARD_GRADIENTS, 3, CREW_SHARD_NONE}};
    for (int i = 0; i < (int)(sizeof cases / sizeof *cases); i++) {
        char dir[400];
        snprintf(dir, sizeof dir, "%s/checkpoints-%d", tmp, i);
        int64_t g = cases[i].global;
        run_out ref = run(d, &(run_spec){&ADAMW, 1, 0, g, 0, NULL, 0, 0, 0});
        run_out first = run(d, &(run_spec){&ADAMW, cases[i].first, cases[i].first_shard, g, 0, dir, 0, 6, 1});
        CHECK_MSG(first.res.steps == 6, "the first part ran %lld steps, wanted 6", (long long)first.res.steps);
        run_out rest = run(d, &(run_spec){&ADAMW, cases[i].later, cases[i].later_shard, g, 0, dir, 1, 0, 0});
        CHECK_MSG(rest.res.steps == STEPS, "the resumed run ended at step %lld", (long long)rest.res.steps);
        CHECK_MSG(mv_equal(ref.m, rest.m) && same_moments(&ref, &rest),
                  "stopped on %d replicas sharding %s and resumed on %d sharding %s: not the uninterrupted run's "
                  "weights", cases[i].first, crew_shard_level_name(cases[i].first_shard), cases[i].later,
                  crew_shard_level_name(cases[i].later_shard));
        run_free(&ref);
        run_free(&first);
        run_free(&rest);
        remove_tree(dir);
    }
}

static void check_refusals(const crew_dataset *d)
{
    crew_model *m = small_cnn(0, 0.0f, &ADAMW);
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = 2;
    o.batch_per_device = 8;
    o.shard_optimizer = 1;
    o.pipeline_stages = 2;
    crew_fit_plan plan;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "sharding (optimizer) and a pipeline together are not supported");
    o.pipeline_stages = 0;
    o.shard_optimizer = 0;
    o.shard = 7;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "shard 7: expected none, optimizer, gradients or parameters");
    o.shard = CREW_SHARD_PARAMETERS;
    o.shard_unit_mb = -1.0;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "shard_unit_mb -1: expected 0");
    crew_model_free(m);
    /* LAMB's and LARS's trust ratios are over whole tensors: sharded with the optimizer only, for now */
    m = small_cnn(0, 0.0f, &LAMB);
    crew_model_default_fit(m, &o);
    o.devices = 2;
    o.batch_per_device = 8;
    o.shard = CREW_SHARD_GRADIENTS;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "lamb with sharded gradients is not built yet");
    crew_model_free(m);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-shard-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        check_bitwise(d, &ADAMW, "AdamW with clipping", CREW_SHARD_PARAMETERS);
        check_bitwise(d, &SGD, "SGD with momentum", CREW_SHARD_PARAMETERS);
        check_bitwise(d, &LAMB, "LAMB with weight decay", CREW_SHARD_OPTIMIZER);
        check_bitwise(d, &LARS, "LARS with clipping", CREW_SHARD_OPTIMIZER);
        check_memory(d);
        check_resume(d, dir);
        check_refusals(d);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
