/* test_shard.c — optimizer-state sharding (ZeRO stage 1, --shard-optimizer) against the unsharded run.
 *
 * On the small CNN of the data-parallel tests (synthetic 12x12 images):
 * - N = 2, 3 and 4 sharded replicas end with parameters and optimizer moments bitwise equal to one
 *   replica accumulating the same micro-batches: AdamW clipping by the global norm (so the norm
 *   must be the whole gradient's), SGD with momentum, LAMB and LARS (whose tensors' norms a shard
 *   does not hold alone); one micro-batch per replica and two; the
 *   default bucket and buckets of 64 values, whose edges fall inside the shards;
 * - each replica's device holds 1/N of the optimizer state: its measured peak is the memory
 *   planner's figure for a sharded replica, and below the unsharded replica's by about
 *   (N − 1)/N of the state;
 * - a sharded run's checkpoint is an ordinary one: stopped at step 6 on 3 sharded replicas, it
 *   resumes on 2 sharded replicas and on 4 unsharded ones, and both end bitwise equal to the
 *   uninterrupted run;
 * - the plan says whether it shards (not with one replica), and a pipeline with sharding is
 *   refused with a clear message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "model_values.h"
#include "nn/model.h"
#include "train/hooks.h"
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
    int devices, shard;
    int64_t global;             /* batch 8 per device */
    double bucket_mb;           /* 0: the default */
    const char *checkpoints;    /* NULL: none */
    int resume, stop_at;        /* stop_at: cancel after this step (0: run to the end) */
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
    o.shard_optimizer = rs->shard;
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

static void check_bitwise(const crew_dataset *d, const crew_optimizer_spec *opt, const char *name)
{
    const double small = 64 * 4.0 / (1024 * 1024); /* 64 values a bucket */
    for (int64_t global = 24; global <= 48; global += 24) {
        run_out one = run(d, &(run_spec){opt, 1, 0, global, 0, NULL, 0, 0});
        CHECK(one.plan.shard_optimizer == 0); /* nothing to shard with one replica */
        for (int n = 2; n <= 4; n++) {
            if (global % (8 * n)) continue;
            for (int b = 0; b < 2; b++) {
                run_out sh = run(d, &(run_spec){opt, n, 1, global, b ? small : 0, NULL, 0, 0});
                CHECK(sh.plan.shard_optimizer == 1 && sh.res.steps == STEPS);
                CHECK_MSG(mv_equal(one.m, sh.m), "%s, global batch %lld: %d sharded replicas%s differ from one replica",
                          name, (long long)global, n, b ? " with small buckets" : "");
                CHECK_MSG(same_moments(&one, &sh), "%s, global batch %lld: the moments of %d sharded replicas%s differ",
                          name, (long long)global, n, b ? " with small buckets" : "");
                run_free(&sh);
            }
        }
        run_free(&one);
    }
}

/* Replica 0's device peak, sharded and not, against the planner's figures. */
static void check_memory(const crew_dataset *d)
{
    for (int n = 2; n <= 4; n += 2) {
        run_out plain = run(d, &(run_spec){&ADAMW, n, 0, 8 * n, 0, NULL, 0, 0});
        run_out sh = run(d, &(run_spec){&ADAMW, n, 1, 8 * n, 0, NULL, 0, 0});
        crew_memory_options mo;
        crew_memory_options_init(&mo);
        mo.batch_per_device = 8;
        mo.devices = n;
        mo.global_batch = 8 * n;
        crew_memory_plan planned[2];
        for (int i = 0; i < 2; i++) {
            mo.optimizer_sharding = i;
            CHECK_OK(crew_model_plan_memory(sh.m, &mo, &planned[i]));
        }
        int64_t peak[2] = {plain.res.stage_peak_bytes[0], sh.res.stage_peak_bytes[0]};
        int64_t state = 2 * sh.m->n_params * (int64_t)sizeof(float); /* AdamW's two moments */
        printf("%d replicas: device peak %lld unsharded (planned %lld), %lld sharded (planned %lld); state %lld\n", n,
               (long long)peak[0], (long long)planned[0].bytes_per_device, (long long)peak[1],
               (long long)planned[1].bytes_per_device, (long long)state);
        for (int i = 0; i < 2; i++) {
            double off = (double)peak[i] / (double)planned[i].bytes_per_device - 1.0;
            CHECK_MSG(off > -0.01 && off < 0.01, "%d replicas%s: measured peak %lld vs planned %lld", n,
                      i ? " sharded" : "", (long long)peak[i], (long long)planned[i].bytes_per_device);
            crew_memory_plan_release(&planned[i]);
        }
        double saved = (double)(peak[0] - peak[1]), expect = (double)state * (n - 1) / n;
        CHECK_MSG(saved > 0.95 * expect && saved < 1.05 * expect + 1024, "%d replicas: sharding saved %.0f bytes, "
                  "expected about %.0f", n, saved, expect);
        run_free(&plain);
        run_free(&sh);
    }
}

static void remove_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* Stopped on 3 sharded replicas and resumed on 2 sharded ones; stopped on 2 sharded and resumed on
 * 4 unsharded. */
static void check_resume(const crew_dataset *d, const char *tmp)
{
    const struct { int64_t global; int first, later, later_shard; } cases[2] = {{48, 3, 2, 1}, {32, 2, 4, 0}};
    for (int i = 0; i < 2; i++) {
        char dir[400];
        snprintf(dir, sizeof dir, "%s/checkpoints-%d", tmp, i);
        int64_t g = cases[i].global;
        run_out ref = run(d, &(run_spec){&ADAMW, 1, 0, g, 0, NULL, 0, 0});
        run_out first = run(d, &(run_spec){&ADAMW, cases[i].first, 1, g, 0, dir, 0, 6});
        CHECK_MSG(first.res.steps == 6, "the first part ran %lld steps, wanted 6", (long long)first.res.steps);
        run_out rest = run(d, &(run_spec){&ADAMW, cases[i].later, cases[i].later_shard, g, 0, dir, 1, 0});
        CHECK_MSG(rest.res.steps == STEPS, "the resumed run ended at step %lld", (long long)rest.res.steps);
        CHECK_MSG(mv_equal(ref.m, rest.m) && same_moments(&ref, &rest),
                  "stopped on %d sharded replicas and resumed on %d %s: not the uninterrupted run's weights",
                  cases[i].first, cases[i].later, cases[i].later_shard ? "sharded" : "unsharded");
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
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "optimizer sharding and a pipeline together are not supported");
    crew_model_free(m);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-shard-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        check_bitwise(d, &ADAMW, "AdamW with clipping");
        check_bitwise(d, &SGD, "SGD with momentum");
        check_bitwise(d, &LAMB, "LAMB with weight decay");
        check_bitwise(d, &LARS, "LARS with clipping");
        check_memory(d);
        check_resume(d, dir);
        check_refusals(d);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
