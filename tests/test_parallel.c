/* test_parallel.c — data parallelism: N replicas against one replica, bit for bit.
 *
 * A synthetic 4-class dataset of 12x12 images (a bright square whose position is the class, plus
 * noise) is written as IDX files and prepared with crew_prep_idx, then:
 * - N = 1, 2, 3 and 4 replicas give parameters bitwise equal to one replica accumulating the
 *   same micro-batches (crew_model_verify), and within tolerance of one replica on the full batch;
 * - accumulation with N > 1: 1 x 4, 2 x 2 and 4 x 1 micro-batches, all bit for bit the same;
 * - small gradient buckets (overlapped all-reduce) change nothing, bit for bit;
 * - crew_model_fit with 2 replicas equals 1 replica with the same global batch, bitwise;
 * - synchronised batch norm: 2 replicas agree with the full batch closely; without it they don't;
 * - the full-batch judgement: each tensor against 30 × its own rounding spread (crew_verify_judge
 *   on hand-made differences), so a bias before batch norm, whose gradient is rounding noise,
 *   passes verify without excusing the other tensors; a given tolerance is applied as it is;
 * - the planner's gradient buckets: one, reduced by the replicas after backward, where every core
 *   computes a replica; PyTorch DDP's 25 MB where cores are left over; --bucket-mb as asked; none
 *   with one replica; and the plan's text says which;
 * - impossible combinations are clear errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "model_values.h"
#include "nn/model.h"
#include "train/step.h"
#include "train/train.h"
#include "train/verify.h"

#include "small_cnn.h"
#include "synthetic.h"

enum { SIDE = SYN_SIDE, CLASSES = SYN_CLASSES, SAMPLES = 448 };

static crew_model *cnn(int batch_norm)
{
    const crew_optimizer_spec sgd = {.type = CREW_OPT_SGD, .lr = 0.05f, .momentum = 0.9f};
    return small_cnn(batch_norm, 0.2f, &sgd);
}

static void check_verify(const crew_dataset *train, int devices, int64_t global)
{
    crew_model *m = cnn(0);
    crew_verify_result r = {0};
    crew_verify_options o;
    crew_verify_options_init(&o);
    o.devices = devices;
    o.steps = 6;
    o.batch_per_device = 8;
    o.global_batch = global;
    o.seed = 3;
    CHECK_OK(crew_model_verify(m, train, &o, &r));
    CHECK_MSG(r.bitwise_equal, "N=%d global %lld: not bitwise equal (max rel diff %g)", devices, (long long)global,
              r.max_rel_diff_accum);
    CHECK_MSG(r.max_rel_diff_full_batch <= r.tolerance, "N=%d: full-batch difference %g > %g", devices,
              r.max_rel_diff_full_batch, r.tolerance);
    CHECK(r.pass);
    CHECK(r.steps == 6);
    CHECK_MSG(!r.fixed_tolerance && r.rounding_spread > 0.0 && r.allowed >= r.tolerance && r.decided_by[0],
              "N=%d: rounding reference: spread %g, allowed %g", devices, r.rounding_spread, r.allowed);
    crew_model_free(m);
}

/* Scales every value of layer `layer`'s parameter `param` by (1 + rel). */
static void scale_tensor(crew_model *m, int layer, int param, double rel)
{
    crew_param *p = &m->layers[layer]->params[param];
    float *v = mv_tensor(m, p);
    for (int64_t i = 0; i < crew_shape_size(&p->shape); i++) v[i] *= (float)(1.0 + rel);
    mv_upload(m, p->value, v, crew_shape_size(&p->shape));
    free(v);
}

/* crew_verify_judge on differences made by hand: a tensor may differ by 30 × its own rounding
 * spread (at least the tolerance), measured by any reference, and another tensor's spread does
 * not excuse it. */
static void check_verify_judge(void)
{
    crew_model *c = cnn(0), *a = NULL, *d = NULL;
    CHECK_OK(crew_model_init_params(c, 1));
    CHECK_OK(crew_model_clone(c, NULL, &a));
    CHECK_OK(crew_model_clone(c, NULL, &d));
    if (!a || !d) return;
    crew_verify_result r = {.tolerance = 1e-3};
    CHECK_OK(crew_verify_judge(a, c, d, NULL, NULL, NULL, &r));
    CHECK(r.full_batch_ok && r.max_rel_diff_full_batch == 0.0 && r.rounding_spread == 0.0 && r.allowed == 1e-3);
    /* layer 0 (conv) kernel: rounding moves it by 1e-2, (a) by 5e-2: within 30 x 1e-2 */
    scale_tensor(d, 0, 0, 1e-2);
    scale_tensor(a, 0, 0, 5e-2);
    CHECK_OK(crew_verify_judge(a, c, d, NULL, NULL, NULL, &r));
    CHECK_MSG(r.full_batch_ok && fabs(r.rounding_spread - 1e-2) < 1e-4, "own spread: ok %d, spread %g", r.full_batch_ok,
              r.rounding_spread);
    /* ...but 5e-3 on the last dense kernel, where rounding moved nothing, is beyond 1e-3 */
    int last = a->n_layers - 1;
    scale_tensor(a, last, 0, 5e-3);
    CHECK_OK(crew_verify_judge(a, c, d, NULL, NULL, NULL, &r));
    char want[160];
    snprintf(want, sizeof want, "%s.kernel", a->layers[last]->name);
    CHECK_MSG(!r.full_batch_ok && strcmp(r.decided_by, want) == 0 && r.allowed == 1e-3 &&
                  fabs(r.decided_by_diff - 5e-3) < 1e-4,
              "other tensor: ok %d, decided by %s (%g of %g)", r.full_batch_ok, r.decided_by, r.decided_by_diff, r.allowed);
    /* ...unless (h), the full batch in (a)'s own blocks, moves that kernel by 1e-3: rounding that
     * (a)'s blocks make (a GEMM's bits at their row count) and (d) cannot see: within 30 x 1e-3 */
    crew_model *h = NULL;
    CHECK_OK(crew_model_clone(c, NULL, &h));
    if (h) {
        scale_tensor(h, last, 0, 1e-3);
        CHECK_OK(crew_verify_judge(a, c, d, NULL, NULL, h, &r));
        CHECK_MSG(r.full_batch_ok && fabs(r.rounding_spread - 1e-2) < 1e-4,
                  "own blocks: ok %d, decided by %s (%g of %g)", r.full_batch_ok, r.decided_by, r.decided_by_diff,
                  r.allowed);
        crew_model_free(h);
    }
    /* a NaN where (c) has a number is never within a bound */
    crew_model *e = NULL;
    CHECK_OK(crew_model_clone(c, NULL, &e));
    if (e) {
        float nan = NAN;
        mv_upload(e, e->layers[last]->params[1].value, &nan, 1);
        CHECK_OK(crew_verify_judge(e, c, c, NULL, NULL, NULL, &r));
        CHECK_MSG(!r.full_batch_ok && isinf(r.max_rel_diff_full_batch), "NaN: ok %d, difference %g", r.full_batch_ok,
                  r.max_rel_diff_full_batch);
        crew_model_free(e);
    }
    /* without (d), the tolerance alone: the conv kernel's 5e-2 fails too */
    r.tolerance = 1e-2;
    CHECK_OK(crew_verify_judge(a, c, NULL, NULL, NULL, NULL, &r));
    CHECK(!r.full_batch_ok && r.rounding_spread == 0.0 && strcmp(r.decided_by, "conv2d.kernel") == 0);
    crew_model_free(a);
    crew_model_free(c);
    crew_model_free(d);
}

/* Batch norm: (a) normalises over the global batch, (b) over each micro-batch, so (a) is held to
 * (c) alone. A bias before batch norm gets a gradient of rounding noise only, so (a) and (c)
 * differ by 100% of its tiny scale: a fixed tolerance fails the run, the rounding reference passes
 * it. */
static void check_verify_batch_norm(const crew_dataset *train)
{
    for (int fixed = 0; fixed <= 1; fixed++) {
        crew_model *m = cnn(1);
        crew_verify_result r = {0};
        crew_verify_options o;
        crew_verify_options_init(&o);
        o.devices = 2;
        o.steps = 6;
        o.batch_per_device = 8;
        o.seed = 3;
        o.tolerance = fixed ? 1e-3 : 0;
        CHECK_OK(crew_model_verify(m, train, &o, &r));
        CHECK(r.batch_norm_synced && r.fixed_tolerance == fixed);
        CHECK_MSG(r.pass == !fixed && r.max_rel_diff_full_batch > 1e-3 && (!fixed || r.rounding_spread == 0.0),
                  "batch norm, fixed tolerance %d: pass %d, difference %g, spread %g, decided by %s", fixed, r.pass,
                  r.max_rel_diff_full_batch, r.rounding_spread, r.decided_by);
        crew_model_free(m);
    }
}

/* Trains with the given options from the same initial weights; returns the model. */
static crew_model *train(const crew_dataset *d, int devices, int64_t batch, int64_t global, double bucket_mb,
                         int batch_norm, int sync_bn)
{
    crew_model *m = cnn(batch_norm);
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = devices;
    o.batch_per_device = batch;
    o.global_batch = global;
    o.bucket_mb = bucket_mb;
    o.max_steps = 12;
    o.epochs = 10;
    o.seed = 5;
    o.sync_batch_norm = sync_bn;
    o.drift_check_every = 4; /* replicas must agree throughout, also with local batch norm */
    crew_fit_result r;
    CHECK_OK(crew_model_fit(m, d, &o, &r));
    CHECK(r.steps == 12);
    return m;
}

static int same_weights(const crew_model *a, const crew_model *b) { return mv_equal(a, b); }

static double max_rel_diff(const crew_model *a, const crew_model *b)
{
    float *pa = mv_params(a), *pb = mv_params(b);
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < a->n_params; i++) {
        double d = fabs((double)pa[i] - (double)pb[i]), v = fabs((double)pb[i]);
        diff = d > diff ? d : diff;
        scale = v > scale ? v : scale;
    }
    free(pa);
    free(pb);
    return diff / scale;
}

static void check_fit_equivalence(const crew_dataset *d)
{
    crew_model *one = train(d, 1, 8, 16, 0, 0, -1);
    crew_model *two = train(d, 2, 8, 16, 0, 0, -1);
    CHECK_MSG(same_weights(one, two), "2 replicas differ from 1 replica accumulating 2 micro-batches");
    /* Buckets of 64 values: many all-reduces overlapping the backward pass; same bits. */
    crew_model *small = train(d, 2, 8, 16, 64 * 4.0 / (1024 * 1024), 0, -1);
    CHECK_MSG(same_weights(two, small), "small gradient buckets changed the result");
    /* Any split of the same micro-batches gives the same bits: 4 micro-batches of 8 as 1 replica
     * x 4, 2 replicas x 2, and 4 replicas x 1; with small buckets too. */
    crew_model *acc1 = train(d, 1, 8, 32, 0, 0, -1);
    crew_model *acc2 = train(d, 2, 8, 32, 0, 0, -1);
    crew_model *acc4 = train(d, 4, 8, 32, 0, 0, -1);
    crew_model *acc2s = train(d, 2, 8, 32, 64 * 4.0 / (1024 * 1024), 0, -1);
    CHECK_MSG(same_weights(acc1, acc2), "2 replicas x 2 micro-batches differ from 1 replica x 4");
    CHECK_MSG(same_weights(acc1, acc4), "4 replicas x 1 micro-batch differ from 1 replica x 4");
    CHECK_MSG(same_weights(acc1, acc2s), "2 replicas x 2 micro-batches with small buckets differ");
    crew_model_free(acc1);
    crew_model_free(acc4);
    crew_model_free(acc2s);
    crew_model_free(one);
    crew_model_free(two);
    crew_model_free(small);
    crew_model_free(acc2);
}

static void check_sync_batch_norm(const crew_dataset *d)
{
    crew_model *full = train(d, 1, 32, 32, 0, 1, 0);
    crew_model *sync = train(d, 2, 16, 32, 0, 1, 1);
    crew_model *local = train(d, 2, 16, 32, 0, 1, 0);
    double with_sync = max_rel_diff(sync, full), without = max_rel_diff(local, full);
    printf("batch norm, 2 replicas vs the full batch: synchronised %.3g, local %.3g\n", with_sync, without);
    CHECK_MSG(with_sync < 1e-4, "synchronised batch norm is %g away from the full batch", with_sync);
    CHECK_MSG(without > 10 * with_sync, "local batch norm (%g) should differ clearly more than synchronised (%g)",
              without, with_sync);
    /* Every replica holds the same moving statistics when they are synchronised. */
    crew_model_free(full);
    crew_model_free(sync);
    crew_model_free(local);
}

static void check_errors(const crew_dataset *d)
{
    crew_model *m = cnn(0);
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    crew_fit_plan plan;
    o.devices = 3;
    o.batch_per_device = 8;
    o.global_batch = 40;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "not a multiple of devices (3) x batch per device (8) = 24");
    o.global_batch = 0;
    o.batch_per_device = 200;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &plan), "fewer than one global batch of 600");
    o.devices = 1;
    o.batch_per_device = 8;
    o.global_batch = 48;
    CHECK_OK(crew_model_plan_fit(m, d, &o, &plan));
    CHECK(plan.accumulation == 6 && plan.global_batch == 48 && plan.steps_per_epoch == crew_dataset_size(d) / 48);
    crew_model_free(m);
}

static void plan_with(crew_model *m, const crew_dataset *d, int devices, int threads, double bucket_mb,
                      crew_fit_plan *plan, char *text, size_t len)
{
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = devices;
    o.threads_per_device = threads;
    o.batch_per_device = 8;
    o.bucket_mb = bucket_mb;
    memset(plan, 0, sizeof *plan);
    text[0] = '\0';
    CHECK_OK(crew_model_plan_fit(m, d, &o, plan));
    crew_fit_plan_text(plan, "cpu", text, len);
}

static void check_bucket_plan(const crew_dataset *d)
{
    crew_model *m = cnn(0);
    crew_fit_plan plan;
    char text[4096];
    const int cores = crew_cpu_cores(), busy = cores > 2 ? cores : 2;
    CHECK_OK(crew_model_layout(m));
    const int64_t n = m->n_params;
    /* every core computes: one bucket that holds every gradient, no communication thread */
    plan_with(m, d, busy, 1, 0, &plan, text, sizeof text);
    CHECK_MSG(plan.bucket_auto == 1 && plan.buckets == 1 && plan.bucket_mb * 1024 * 1024 / 4 >= (double)n &&
              plan.bucket_mb * 1024 * 1024 / 4 < (double)n + 256, "%d bucket(s) of %g MiB for %lld values", plan.buckets,
              plan.bucket_mb, (long long)n);
    CHECK_MSG(strstr(text, "gradients all-reduced in one bucket by the replicas' own threads after backward: every core"),
              "%s", text);
    CHECK(plan.bucket_rule == CREW_BUCKETS_BUSY_CORES);
    plan_with(m, d, 2, busy, 0, &plan, text, sizeof text); /* the cores busy with BLAS threads: the same */
    CHECK(plan.bucket_auto == 1 && plan.buckets == 1 && plan.bucket_mb < 25.0);
    if (cores > 2) { /* cores left over: DDP's buckets, reduced on a communication thread */
        plan_with(m, d, 2, 1, 0, &plan, text, sizeof text);
        CHECK_MSG(plan.bucket_auto == 1 && plan.bucket_mb == 25.0 && plan.buckets == 1 && strstr(text, "25 MiB (as PyTorch DDP)"),
                  "%g MiB: %s", plan.bucket_mb, text);
        CHECK(plan.bucket_rule == CREW_BUCKETS_DDP);
    }
    /* asked for: 64 values a bucket */
    const double mb = 64.0 * 4 / (1024 * 1024);
    plan_with(m, d, 2, 1, mb, &plan, text, sizeof text);
    CHECK_MSG(plan.bucket_auto == 0 && plan.bucket_rule == CREW_BUCKETS_ASKED && plan.bucket_mb == mb &&
                  plan.buckets == (int)((n + 63) / 64), "%d buckets", plan.buckets);
    char want[128];
    snprintf(want, sizeof want, "gradients all-reduced in %d buckets of %g MiB (--bucket-mb), each on a communication",
             plan.buckets, mb);
    CHECK_MSG(strstr(text, want), "wanted '%s' in:\n%s", want, text);
    /* processes on several hosts (tests/cli_mpi_netns.sh plans for two): about 16 buckets, none under
     * 64 KiB nor over DDP's 25 MB, each a whole number of KiB */
    const int64_t sizes[] = {420000, 1000, 16 * 1024 * 256 + 1, (int64_t)1 << 30};
    for (int i = 0; i < 4; i++) {
        const double got = crew_hosts_bucket_mb(sizes[i]), kib = got * 1024.0;
        const int count = crew_bucket_count(sizes[i], got);
        CHECK_MSG(kib == floor(kib) && got >= 64.0 / 1024 && got <= 25.0 && (count == 16 || count == 17 || got == 64.0 / 1024 ||
                                                                              got == 25.0),
                  "%lld values: buckets of %g MiB, %d of them", (long long)sizes[i], got, count);
    }
    CHECK(crew_hosts_bucket_mb(1000) == 64.0 / 1024 && crew_hosts_bucket_mb((int64_t)1 << 30) == 25.0);
    /* one replica: nothing to reduce, nothing said */
    plan_with(m, d, 1, 1, 0, &plan, text, sizeof text);
    CHECK(plan.buckets == 0 && !strstr(text, "gradients"));
    crew_model_free(m);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-parallel-XXXXXX", data[300];
    check_verify_judge();
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        for (int n = 1; n <= 4; n++) check_verify(d, n, 0);
        check_verify(d, 2, 32); /* accumulation 2 on each replica */
        check_fit_equivalence(d);
        check_sync_batch_norm(d);
        check_verify_batch_norm(d);
        check_errors(d);
        check_bucket_plan(d);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
