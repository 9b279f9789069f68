/* test_scaling.c — the scaling advisor: its statistics, the cost model fitted to made-up trials,
 * the recommendation and the training hint; then the advisor's pipeline on real trials of this
 * machine (1 and 2 replicas, the shared-memory link, the lockstep probe), held to what does not
 * depend on how fast the machine is or what else runs on it: every field of a trial where it
 * belongs, the analysis and the fit taking the figures they are given, and the predictions the
 * cost model's arithmetic on those figures; and the layouts of replicas against BLAS threads,
 * each measured and the choice cached.
 *
 * How close the prediction of 2 replicas from a 1-replica trial comes to measuring 2 replicas is a
 * claim about speed, made on a machine without other load: bench/bench_advisor.c measures it in
 * paired rounds (docs/PERFORMANCE.md, "The advisor's prediction"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "advise/scaling.h"
#include "check.h"
#include "synthetic.h"

#define SIDE 28
#define SAMPLES 2048
#define BATCH 64       /* per device, in the real trials */
#define TRIAL_STEPS 6  /* measured per repeat */
#define REPEATS 2

/* ---------------------------------------------------------------- a 28x28 dataset */

static int make_dataset(char *dir, char *data, size_t len)
{
    return syn_make_random_dataset(dir, SAMPLES, SIDE, data, len);
}

/* ---------------------------------------------------------------- statistics */

static void check_statistics(void)
{
    double v[] = {5, 1, 3, 2, 4};
    CHECK(crew_scale_median(v, 5) == 3.0);
    double w[] = {4, 1, 3, 2};
    CHECK(crew_scale_median(w, 4) == 2.5);
    double x[] = {10, 10, 10, 10, 1000}; /* one outlier does not move it */
    CHECK(crew_scale_robust_sigma(x, 5) == 0.0);
    CHECK(crew_scale_expected_max(1) == 0.0);
    CHECK(fabs(crew_scale_expected_max(2) - 0.5642) < 1e-4);
    CHECK(crew_scale_expected_max(3) > crew_scale_expected_max(2) && crew_scale_expected_max(3) < crew_scale_expected_max(4));
    CHECK(crew_scale_expected_max(4096) > crew_scale_expected_max(1024));
}

/* ---------------------------------------------------------------- the cost model on made-up trials */

/* A trial whose all-reduce follows a known link exactly, on free cores. */
static crew_scale_trial made_up(int n, double compute, const crew_link *l, int64_t bytes)
{
    crew_scale_trial t = {.devices = n, .global_batch = 64 * n, .repeats = 3, .steps = 20, .compute_s = compute,
                          .cpu_share = 1.0};
    if (n > 1) t.comm_exposed_s = l->alpha_s + 2.0 * (n - 1) / n * (double)bytes / l->bytes_per_s;
    t.step_s = t.compute_s + t.comm_exposed_s;
    t.samples_per_s = t.samples_per_s_lo = t.samples_per_s_hi = t.global_batch / t.step_s;
    return t;
}

static void check_fit(void)
{
    const int64_t S = 4000000;
    const crew_link truth = {.alpha_s = 50e-6, .bytes_per_s = 2e9}, wrong = {.alpha_s = 1e-6, .bytes_per_s = 50e9};
    crew_scale_trial t[3] = {made_up(1, 0.010, &truth, S), made_up(2, 0.010, &truth, S), made_up(4, 0.010, &truth, S)};
    crew_scale_analyse(t, 3);
    CHECK(t[0].efficiency == 1.0 && t[1].efficiency < 1.0 && t[2].speedup > t[1].speedup);
    crew_scale_model cm;
    CHECK_OK(crew_scale_fit(t, 3, S, &wrong, 0, 0, &cm));
    CHECK(cm.link_fitted == 2);
    CHECK_MSG(fabs(cm.link.alpha_s - truth.alpha_s) < 1e-6 && fabs(cm.link.bytes_per_s / truth.bytes_per_s - 1) < 1e-3,
              "fitted alpha %g, beta %g", cm.link.alpha_s, cm.link.bytes_per_s);
    crew_scale_point p;
    crew_scale_predict(&cm, NULL, 8, 0, 0, &p); /* the all-reduce, plus α for the metrics */
    double comm = truth.alpha_s + 2.0 * 7 / 8 * S / truth.bytes_per_s + truth.alpha_s;
    CHECK_MSG(fabs(p.step_s - (0.010 + comm)) < 1e-9, "step %g, expected %g", p.step_s, 0.010 + comm);
    CHECK(fabs(p.efficiency - 0.010 / p.step_s) < 1e-9 && p.global_batch == 8 * 64);

    /* One count above one: the fallback's shape scaled to it, which reproduces that count. */
    CHECK_OK(crew_scale_fit(t, 2, S, &wrong, 0, 0, &cm));
    CHECK(cm.link_fitted == 1);
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    CHECK(fabs(p.step_s - t[1].step_s - cm.link.alpha_s) < 1e-9);
    /* Only one replica measured: the fallback as it is. */
    CHECK_OK(crew_scale_fit(t, 1, S, &truth, 0, 0, &cm));
    CHECK(cm.link_fitted == 0 && cm.link.alpha_s == truth.alpha_s);

    /* Two cores on which two replicas side by side run at 60% of one alone. */
    CHECK_OK(crew_scale_fit(t, 1, S, &truth, 2, 0.6, &cm));
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    CHECK(fabs(p.compute_s + p.shared_cores_s - 0.010 / 0.6) < 1e-9);
    crew_scale_predict(&cm, NULL, 4, 0, 0, &p); /* twice the cores' count: they also take turns */
    CHECK(fabs(p.compute_s + p.shared_cores_s - 0.010 / 0.3) < 1e-9);
    crew_scale_predict(&cm, &truth, 2, 0, 0, &p); /* devices of their own: no sharing */
    CHECK(p.shared_cores_s == 0.0);
    /* A trial on both cores: the speed comes from it, not the probe. */
    crew_scale_trial slow[2] = {t[0], t[1]};
    slow[1].compute_s = 0.020; /* twice the one replica's work per step: speed 0.5 */
    CHECK_OK(crew_scale_fit(slow, 2, S, &truth, 2, 0.9, &cm));
    CHECK(cm.speed_fitted == 1 && fabs(cm.parallel_speed - 0.5) < 1e-9);
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    CHECK(fabs(p.compute_s + p.shared_cores_s - 0.020) < 1e-9);
    CHECK_ERR(crew_scale_fit(t, 0, S, &truth, 2, 1.0, &cm), "at least one trial");
}

/* The model of one replica's trial: 10 ms per step at batch 64, 4 MB of gradients, free cores. */
static void fit_ten_ms(const crew_link *link, crew_scale_model *cm)
{
    crew_scale_trial t = made_up(1, 0.010, link, 4000000);
    CHECK_OK(crew_scale_fit(&t, 1, 4000000, link, 0, 0, cm));
}

/* The time to train at a count, exactly as training steps through the epochs: whole global batches
 * only, the last partial one dropped. */
static void check_epochs_time(void)
{
    const crew_link link = {.alpha_s = 50e-6, .bytes_per_s = 2e9};
    crew_scale_model cm;
    fit_ten_ms(&link, &cm);
    crew_scale_point p;
    crew_scale_predict(&cm, NULL, 1, 60000, 10, &p); /* 60000 / 64 = 937.5: 937 steps of 10 ms */
    CHECK_MSG(p.step_s == 0.010 && p.epochs_s == 10.0 * 937 * 0.010, "step %g s, epochs %g s", p.step_s, p.epochs_s);
    crew_scale_predict(&cm, &link, 8, 60000, 3, &p); /* global batch 512: 117 steps */
    CHECK_MSG(p.global_batch == 512 && p.epochs_s == 3.0 * 117 * p.step_s, "epochs %g s", p.epochs_s);
    crew_scale_predict(&cm, NULL, 2, 100, 10, &p); /* 100 samples, global batch 128: never steps */
    CHECK(isinf(p.epochs_s) && p.epochs_s > 0);
    crew_scale_predict(&cm, NULL, 1, 0, 0, &p); /* no run asked for */
    CHECK(isinf(p.epochs_s));

    /* The advice's times are the points' own. */
    const int counts[] = {1, 2, 4, 8, 16, 32, 64};
    crew_scale_advice a;
    crew_scale_advise(&cm, NULL, counts, 7, 60000, 10, 3600, &a);
    crew_scale_predict(&cm, NULL, 1, 60000, 10, &p);
    CHECK(a.one_device_s == p.epochs_s && a.recommended_s == p.epochs_s && strstr(a.reason, "about 94 s"));
    /* A link fast enough for every count: 32 and 64 devices (global batches of 2048 and 4096) would
     * not take one step of 2000 samples, so 16 is the largest count that can be recommended. */
    const crew_link fast = {.alpha_s = 1e-9, .bytes_per_s = 1e15};
    crew_scale_advise(&cm, &fast, counts, 7, 2000, 10, 1, &a);
    crew_scale_predict(&cm, &fast, 16, 2000, 10, &p);
    CHECK_MSG(a.recommended_devices == 16 && a.recommended_s == p.epochs_s && p.epochs_s == 10.0 * 1 * p.step_s,
              "recommended %d (%g s): %s", a.recommended_devices, a.recommended_s, a.reason);
}

static void check_duration(void)
{
    static const struct { double s; const char *text; } cases[] = {
        {0, "0.0 s"}, {4.2, "4.2 s"}, {9.94, "9.9 s"}, {10, "10 s"}, {90, "90 s"}, {119, "119 s"},
        {120, "2 min"}, {960, "16 min"}, {7199, "120 min"}, {7200, "2.0 h"}, {8280, "2.3 h"},
        {172799, "48.0 h"}, {172800, "2.0 d"}, {354440, "4.1 d"},
    };
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *r = crew_format_duration(cases[i].s, buf, sizeof buf);
        CHECK_MSG(r == buf && !strcmp(buf, cases[i].text), "%g s: '%s', expected '%s'", cases[i].s, buf, cases[i].text);
    }
    CHECK(!strcmp(crew_format_duration(INFINITY, buf, sizeof buf), "-"));
    CHECK(!strcmp(crew_format_duration(NAN, buf, sizeof buf), "-"));
    char small[4] = "xyz";
    CHECK(!strcmp(crew_format_duration(8280, small, sizeof small), "2.3")); /* cut, still terminated */
    CHECK(!strcmp(crew_format_duration(8280, small, 0), "") && !strcmp(small, "2.3")); /* nothing written */
}

/* A share in percent keeps the digits that tell it from its neighbours: 99.7% is not 100%. */
static void check_percent(void)
{
    static const struct {
        double p;
        const char *text;
    } cases[] = {{99.73, "99.7%"}, {99.96, "99.96%"}, {100, "100%"}, {123.4, "123%"}, {42.4, "42%"},
                 {3.46, "3.5%"}, {0.42, "0.42%"}, {0.004, "<0.01%"}, {0, "0%"}, {-12.6, "-13%"}};
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *r = crew_format_percent(cases[i].p, buf, sizeof buf);
        CHECK_MSG(r == buf && !strcmp(buf, cases[i].text), "%g%%: '%s', expected '%s'", cases[i].p, buf, cases[i].text);
    }
    CHECK(!strcmp(crew_format_percent(NAN, buf, sizeof buf), "-"));
}

static void check_advice(void)
{
    const crew_link link = {.alpha_s = 50e-6, .bytes_per_s = 2e9};
    crew_scale_model cm;
    fit_ten_ms(&link, &cm);
    const int counts[] = {1, 2, 4, 8, 16, 32, 64};
    crew_scale_advice a;
    /* 60000 samples, batch 64: 937 steps of ~10 ms per epoch; 10 epochs ≈ 94 s on one device */
    crew_scale_advise(&cm, NULL, counts, 7, 60000, 10, 3600, &a);
    CHECK(a.recommended_devices == 1 && strstr(a.reason, "stay on one device") && fabs(a.one_device_s - 93.7) < 0.1);
    crew_scale_advise(&cm, NULL, counts, 7, 60000, 1000, 3600, &a); /* 26 h on one device */
    crew_scale_point p, q;
    crew_scale_predict(&cm, NULL, a.recommended_devices, 0, 0, &p);
    CHECK_MSG(a.recommended_devices > 1 && p.efficiency >= 0.75, "recommended %d: %s", a.recommended_devices, a.reason);
    if (a.recommended_devices < 64) {
        crew_scale_predict(&cm, NULL, a.recommended_devices * 2, 0, 0, &q);
        CHECK(q.efficiency < 0.75 && a.stall_devices == a.recommended_devices * 2 && strstr(a.stall, "scaling stalls"));
    }
    /* A slow link makes communication the cause; a tiny batch's compute cannot hide the latency. */
    crew_link slow = {.alpha_s = 20e-6, .bytes_per_s = 0.1e9};
    crew_scale_advise(&cm, &slow, counts, 7, 60000, 1000, 3600, &a);
    CHECK_MSG(a.stall_devices == 2 && strstr(a.stall, "communication"), "%s", a.stall);
    crew_scale_trial tiny = made_up(1, 0.0001, &link, 4000);
    CHECK_OK(crew_scale_fit(&tiny, 1, 4000, &link, 0, 0, &cm));
    crew_scale_advise(&cm, NULL, counts, 7, 6000000, 1000, 3600, &a);
    CHECK_MSG(strstr(a.stall, "per-device batch of 64 is too small") != NULL, "%s", a.stall);
}

/* With a noise scale the projection counts progress, not samples: E(M) = (B + M0) / (B + M). */
static void check_goodput(void)
{
    CHECK(crew_statistical_efficiency(200, 64, 64) == 1.0);
    CHECK(fabs(crew_statistical_efficiency(200, 64, 1024) - 264.0 / 1224.0) < 1e-15);
    CHECK(crew_statistical_efficiency(200, 64, 16) > 1.0); /* a smaller batch: more progress a sample */
    CHECK(isnan(crew_statistical_efficiency(NAN, 64, 64)) && isnan(crew_statistical_efficiency(0, 64, 64)));
    CHECK(isnan(crew_statistical_efficiency(200, 0, 64)) && isnan(crew_statistical_efficiency(200, 64, 0)));

    /* a link so fast that samples per second grow with the count: only the noise scale bends time */
    const crew_link fast = {.alpha_s = 1e-12, .bytes_per_s = 1e18};
    crew_scale_model cm;
    fit_ten_ms(&fast, &cm);
    CHECK(isnan(cm.noise_scale) && cm.noise_batch == 0);
    const int counts[] = {1, 2, 4, 8, 16, 32, 64};
    crew_scale_point p;
    crew_scale_advice a;
    crew_scale_predict(&cm, &fast, 4, 60000, 10, &p); /* unknown: no progress figures */
    CHECK(isnan(p.statistical_efficiency) && isnan(p.goodput) && isnan(p.to_target_s) && isnan(p.to_target_steps));
    crew_scale_advise(&cm, &fast, counts, 7, 60000, 10, 3600, &a);
    CHECK(a.goodput_devices == 0 && a.pays_until_devices == 0 && isnan(a.goodput_s) && !a.goodput_reason[0]);

    cm.noise_scale = 200, cm.noise_batch = 64;
    crew_scale_predict(&cm, &fast, 1, 60000, 10, &p); /* at the noise's own batch: samples are progress */
    CHECK(p.statistical_efficiency == 1.0 && p.goodput == p.samples_per_s && p.to_target_s == p.epochs_s);
    CHECK(p.to_target_steps == 10.0 * 937);
    crew_scale_predict(&cm, &fast, 16, 60000, 10, &p); /* global batch 1024: 58 steps an epoch */
    const double e = 264.0 / 1224.0;
    CHECK_MSG(fabs(p.statistical_efficiency - e) < 1e-15 && fabs(p.goodput - p.samples_per_s * e) < 1e-9 * p.goodput,
              "E %g goodput %g", p.statistical_efficiency, p.goodput);
    CHECK(fabs(p.to_target_s - p.epochs_s / e) < 1e-12 * p.to_target_s && fabs(p.to_target_steps - 580.0 / e) < 1e-9);

    /* Doubling N from n halves the time a sample takes and multiplies the samples needed by
     * (B + 128n) / (B + 64n): with B = 200 that still cuts time by 10% or more up to 16 (from 8:
     * 0.86), not from 16 to 32 (0.92); the time keeps falling, so 64 reaches the result soonest. */
    crew_scale_advise(&cm, &fast, counts, 7, 60000, 10, 3600, &a);
    CHECK_MSG(a.pays_until_devices == 16 && a.goodput_devices == 64, "pays until %d, soonest %d: %s",
              a.pays_until_devices, a.goodput_devices, a.goodput_reason);
    crew_scale_predict(&cm, &fast, 64, 60000, 10, &p);
    CHECK(a.goodput_s == p.to_target_s && strstr(a.goodput_reason, "adding devices pays up to 16") &&
          strstr(a.goodput_reason, "B_noise = 200 samples"));
    /* a noise scale far above the batches: every doubling nearly halves the time */
    cm.noise_scale = 1e6;
    crew_scale_advise(&cm, &fast, counts, 7, 60000, 10, 3600, &a);
    CHECK_MSG(a.pays_until_devices == 64, "pays until %d", a.pays_until_devices);
    /* one far below: past it a doubling saves almost nothing: already 1 -> 2 cuts less than 10% */
    cm.noise_scale = 1;
    crew_scale_advise(&cm, &fast, counts, 7, 60000, 10, 3600, &a);
    CHECK_MSG(a.pays_until_devices == 1, "pays until %d: %s", a.pays_until_devices, a.goodput_reason);
}

static void check_hint(void)
{
    crew_fit_result r = {.steps = 100, .compute_fraction = 0.3, .optimizer_fraction = 0.05, .comm_exposed_fraction = 0.6,
                         .data_fraction = 0.05};
    crew_fit_plan p = {.devices = 4};
    char buf[512];
    CHECK(crew_fit_scaling_hint(&r, &p, buf, sizeof buf) == 1 && strstr(buf, "4 replicas computed only 35%"));
    r = (crew_fit_result){.steps = 100, .compute_fraction = 0.9, .optimizer_fraction = 0.05, .data_fraction = 0.05};
    CHECK(crew_fit_scaling_hint(&r, &p, buf, sizeof buf) == 0 && buf[0] == '\0');
    p.devices = 1; /* one device waiting for data: more devices would not help */
    r = (crew_fit_result){.steps = 100, .compute_fraction = 0.3, .optimizer_fraction = 0.02, .data_fraction = 0.68};
    CHECK(crew_fit_scaling_hint(&r, &p, buf, sizeof buf) == 1 && strstr(buf, "loader threads"));
    r.steps = 0;
    CHECK(crew_fit_scaling_hint(&r, &p, buf, sizeof buf) == 0);
}

/* ---------------------------------------------------------------- the advisor on this machine */

/* The example MLP and the test's dataset, both checked. */
static void open_mlp(const char *src, const char *data, crew_model **m, crew_dataset **d)
{
    char path[600];
    snprintf(path, sizeof path, "%s/examples/fashion_mlp.json", src);
    *m = NULL;
    *d = NULL;
    CHECK_OK(crew_model_load_file(path, m));
    CHECK_OK(crew_dataset_open(data, "train", d));
}

static int finite_pos(double v) { return isfinite(v) && v > 0; }
static int finite_nonneg(double v) { return isfinite(v) && v >= 0; }
static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1.0, fmax(fabs(a), fabs(b))); }

/* A trial as crew_scale_measure must leave it, whatever the machine's speed. */
static void check_trial(const crew_scale_trial *t, int devices)
{
    CHECK_MSG(t->devices == devices && t->global_batch == BATCH * devices && t->repeats == REPEATS &&
              t->steps == TRIAL_STEPS, "%d replicas: devices %d, global batch %lld, %d repeats of %lld steps", devices,
              t->devices, (long long)t->global_batch, t->repeats, (long long)t->steps);
    CHECK_MSG(finite_pos(t->samples_per_s) && t->samples_per_s_lo <= t->samples_per_s &&
              t->samples_per_s <= t->samples_per_s_hi, "%d replicas: samples/s %g in [%g, %g]", devices,
              t->samples_per_s, t->samples_per_s_lo, t->samples_per_s_hi);
    CHECK_MSG(finite_pos(t->step_s) && finite_pos(t->compute_s) && finite_nonneg(t->data_s) &&
              finite_nonneg(t->optimizer_s) && finite_nonneg(t->other_s) && finite_nonneg(t->comm_exposed_s) &&
              finite_nonneg(t->comm_hidden_s) && finite_nonneg(t->compute_jitter_s) && finite_nonneg(t->helper_cpu_s),
              "%d replicas: a time per step is negative or not finite", devices);
    CHECK_MSG(t->cpu_share > 0 && t->cpu_share <= 1, "%d replicas: CPU share %g", devices, t->cpu_share);
    CHECK(isnan(t->speedup) && isnan(t->efficiency)); /* until crew_scale_analyse */
    if (devices == 1) /* nothing to all-reduce */
        CHECK_MSG(t->comm_exposed_s == 0 && t->comm_hidden_s == 0, "1 replica: all-reduce %g + %g s",
                  t->comm_exposed_s, t->comm_hidden_s);
}

/* Real trials at 1 and 2 replicas, the shared-memory link and the lockstep probe, fitted and
 * projected; the projections checked against the cost model written out (scaling.h) on the
 * figures measured, which may be anything a loaded machine gives. cores = 2 is given, not this
 * machine's: the arithmetic is the same for any. */
static void check_real_trials(const char *src, const char *data)
{
    crew_model *m;
    crew_dataset *d;
    open_mlp(src, data, &m, &d);
    if (!m || !d) {
        crew_dataset_free(d);
        crew_model_free(m);
        return;
    }
    crew_scale_options o = {.struct_size = sizeof(crew_scale_options), .batch_per_device = BATCH, .warmup_steps = 2,
                            .steps = TRIAL_STEPS, .repeats = REPEATS};
    int64_t params = crew_model_param_count(m), bytes = params * 4;
    crew_scale_trial t[2];
    CHECK_OK(crew_scale_measure(m, d, &o, 1, &t[0]));
    CHECK_OK(crew_scale_measure(m, d, &o, 2, &t[1]));
    check_trial(&t[0], 1);
    check_trial(&t[1], 2);
    crew_scale_analyse(t, 2);
    CHECK(t[0].speedup == 1.0 && t[0].efficiency == 1.0);
    CHECK(t[1].speedup == t[1].samples_per_s / t[0].samples_per_s && t[1].efficiency == t[1].speedup / 2);

    crew_link shared;
    CHECK_OK(crew_scale_measure_shared_memory(bytes, &shared));
    CHECK_MSG(finite_nonneg(shared.alpha_s) && finite_pos(shared.bytes_per_s), "link: alpha %g s, %g bytes/s",
              shared.alpha_s, shared.bytes_per_s);
    double speed = 0;
    CHECK_OK(crew_scale_probe_parallel(2, 0.2, params, t[0].compute_s + t[0].optimizer_s, &speed));
    CHECK_MSG(speed > 0 && speed <= 1, "lockstep speed %g", speed);

    /* From the 1-replica trial alone: the probe's speed, the link as measured. */
    const crew_scale_trial *one = &t[0], *two = &t[1];
    double work1 = one->compute_s + one->optimizer_s + one->other_s;
    crew_scale_model cm;
    CHECK_OK(crew_scale_fit(one, 1, bytes, &shared, 2, speed, &cm));
    CHECK(cm.batch_per_device == BATCH && cm.gradient_bytes == bytes && cm.compute_s == work1 &&
          cm.data_s == one->data_s && cm.jitter_s == one->compute_jitter_s && cm.helper_s == one->helper_cpu_s);
    CHECK(cm.link_fitted == 0 && cm.link.alpha_s == shared.alpha_s && cm.link.bytes_per_s == shared.bytes_per_s);
    CHECK(cm.speed_fitted == 0 && cm.parallel_speed == speed && cm.cores == 2 && cm.hidden_fraction == 0);
    crew_scale_point p;
    crew_scale_predict(&cm, NULL, 1, 0, 0, &p); /* itself: its work and its wait for data */
    CHECK_MSG(p.step_s == work1 + one->data_s && p.comm_s == 0 && p.sync_s == 0 && p.shared_cores_s == 0,
              "1 replica: step %g, expected %g", p.step_s, work1 + one->data_s);
    CHECK(p.samples_per_s == BATCH / p.step_s && p.speedup == 1.0);
    /* 2 replicas on the 2 cores: the replicas' and helpers' work shares 2 x speed of capacity; one
     * ring all-reduce of the gradients and the metrics' latency. */
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    double comm = shared.alpha_s + (double)bytes / shared.bytes_per_s + shared.alpha_s;
    double cores_s = 2 * (work1 + one->helper_cpu_s) / (2 * speed) - work1;
    CHECK_MSG(near(p.comm_s, comm) && near(p.shared_cores_s, cores_s) && p.sync_s == 0 &&
              near(p.step_s, work1 + one->data_s + comm + cores_s), "2 replicas: step %g = %g + %g + %g + %g",
              p.step_s, work1, one->data_s, p.comm_s, p.shared_cores_s);
    CHECK(p.global_batch == 2 * BATCH && near(p.samples_per_s, 2 * BATCH / p.step_s));
    /* The same replicas as devices of their own: no shared cores, the slowest of two sets the pace. */
    crew_scale_predict(&cm, &shared, 2, 0, 0, &p);
    CHECK(p.shared_cores_s == 0 && near(p.sync_s, one->compute_jitter_s * crew_scale_expected_max(2)));

    /* With the 2-replica trial: the link scaled to its all-reduce, the speed taken from its work. */
    double work2 = two->compute_s + two->optimizer_s + two->other_s, busy = two->comm_exposed_s + two->comm_hidden_s;
    CHECK_OK(crew_scale_fit(t, 2, bytes, &shared, 2, speed, &cm));
    double want_speed = work1 / work2 < 0.05 ? 0.05 : work1 / work2 > 1 ? 1 : work1 / work2;
    CHECK_MSG(cm.link_fitted == 1 && cm.speed_fitted == 1 && near(cm.parallel_speed, want_speed),
              "link fitted %d, speed fitted %d: %g, expected %g", cm.link_fitted, cm.speed_fitted, cm.parallel_speed,
              want_speed);
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    double allreduce = busy > 1e-6 ? busy : 1e-6;
    CHECK_MSG(near(p.comm_s, allreduce + cm.link.alpha_s) &&
              near(p.compute_s + p.shared_cores_s, work1 / cm.parallel_speed), "2 replicas from their own trial: comm %g (measured %g + alpha %g), compute %g", p.comm_s, busy,
              cm.link.alpha_s, p.compute_s + p.shared_cores_s);
    crew_dataset_free(d);
    crew_model_free(m);
}

/* The layouts of 2 and 6 cores: every divisor's trial, in order, at the one global batch, the
 * fastest the best of them (which one is fastest is the machine's business); then the cache: a
 * measured choice is found again without measuring, a cache of garbage is measured past. */
static void check_layouts(const char *src, const char *data, const char *dir)
{
    crew_model *m;
    crew_dataset *d;
    open_mlp(src, data, &m, &d);
    crew_scale_options o;
    crew_scale_options_init(&o);
    o.batch_per_device = 16;
    o.warmup_steps = 1;
    o.steps = 2;
    o.repeats = 1;
    crew_layout_choice c;
    CHECK_OK(crew_layout_measure(m, d, &o, 2, &c));
    CHECK(c.n == 3 && c.trials[0].replicas == 2 && c.trials[0].threads_per_device == 1 &&
          c.trials[0].batch_per_device == 16 && c.trials[1].replicas == 1 && c.trials[1].threads_per_device == 2 &&
          c.trials[1].batch_per_device == 32 && !c.trials[0].shard_optimizer && !c.trials[1].shard_optimizer);
    /* the last: one replica per core again, sharded, against the first */
    CHECK(c.trials[2].replicas == 2 && c.trials[2].threads_per_device == 1 && c.trials[2].shard_optimizer &&
          c.trials[2].batch_per_device == 16 && finite_pos(c.trials[2].samples_per_s));
    CHECK(near(c.shard_speedup, c.trials[2].samples_per_s / c.trials[0].samples_per_s) &&
          c.shard_optimizer == (c.shard_speedup > 1.03));
    int best = c.trials[0].samples_per_s >= c.trials[1].samples_per_s ? 0 : 1;
    CHECK(finite_pos(c.trials[0].samples_per_s) && finite_pos(c.trials[1].samples_per_s));
    CHECK(c.replicas == c.trials[best].replicas && c.threads_per_device == c.trials[best].threads_per_device &&
          c.batch_per_device == c.trials[best].batch_per_device);
    CHECK(near(c.speedup, c.trials[best].samples_per_s / c.trials[0].samples_per_s));
    CHECK_OK(crew_layout_measure(m, d, &o, 6, &c));
    CHECK(c.n == 5 && c.trials[0].replicas == 6 && c.trials[1].replicas == 3 && c.trials[2].replicas == 2 &&
          c.trials[3].replicas == 1 && c.trials[1].threads_per_device == 2 && c.trials[3].batch_per_device == 96 &&
          c.trials[4].replicas == 6 && c.trials[4].shard_optimizer);
    CHECK_ERR(crew_layout_measure(m, d, &o, 0, &c), "layouts of 0 cores");

    char cache[600];
    snprintf(cache, sizeof cache, "%s/figures", dir);
    FILE *f = fopen(cache, "wb");
    CHECK(f && fputs("\177ELF garbage\nlayout|x 3\n", f) >= 0 && fclose(f) == 0);
    int found = 0;
    crew_layout_choice first, again;
    CHECK_OK(crew_layout_cached(cache, 0x1234, NULL, NULL, &o, 2, 0, &first, &found));
    CHECK(!found); /* not measured, not cached */
    CHECK_OK(crew_layout_cached(cache, 0x1234, m, d, &o, 2, 1, &first, &found));
    CHECK(found && first.n == 3);
    CHECK_OK(crew_layout_cached(cache, 0x1234, NULL, NULL, &o, 2, 0, &again, &found));
    CHECK(found && again.n == 0 && again.replicas == first.replicas &&
          again.threads_per_device == first.threads_per_device && again.batch_per_device == first.batch_per_device &&
          fabs(again.speedup - first.speedup) <= 1e-5 * first.speedup &&
          fabs(again.shard_speedup - first.shard_speedup) <= 1e-5 * first.shard_speedup &&
          again.shard_optimizer == first.shard_optimizer);
    CHECK_OK(crew_layout_cached(cache, 0x5678, NULL, NULL, &o, 2, 0, &again, &found));
    CHECK(!found); /* another model's */
    crew_dataset_free(d);
    crew_model_free(m);
}

static void check_bad_arguments(const char *src, const char *data)
{
    crew_model *m;
    crew_dataset *d;
    open_mlp(src, data, &m, &d);
    crew_scale_trial t;
    crew_scale_options o = {.struct_size = sizeof(crew_scale_options), .repeats = 100};
    CHECK_ERR(crew_scale_measure(m, d, &o, 1, &t), "1 to 64 repeats");
    /* two replicas need more samples than there are */
    o = (crew_scale_options){.struct_size = sizeof(crew_scale_options), .batch_per_device = SAMPLES};
    CHECK_ERR(crew_scale_measure(m, d, &o, 2, &t), "scaling trial on 2 replicas");
    double a;
    CHECK_ERR(crew_scale_probe_parallel(0, 0.1, 1000, 0.001, &a), "compute probe");
    crew_link l;
    CHECK_ERR(crew_scale_measure_shared_memory(1, &l), "shared-memory benchmark");
    crew_dataset_free(d);
    crew_model_free(m);
}

/* The device link and the copies, as crew scale measures them for a GPU kind, on cpu-remote (the
 * guarded CPU backend without host_alias: a GPU's staged path on the CPU); on cpu the device link
 * is the shared memory's. Figures are whatever the machine gives: only their kind and sign. */
static void check_device_link(void)
{
    const int64_t bytes = 1 << 18;
    crew_link l, up, down;
    CHECK_OK(crew_scale_measure_device_link("cpu-remote", bytes, &l));
    CHECK_MSG(strncmp(l.name, "host copies between cpu-remote:0 and cpu-remote:", 48) == 0, "link name '%s'", l.name);
    CHECK_MSG(finite_nonneg(l.alpha_s) && finite_pos(l.bytes_per_s), "staged link: alpha %g s, %g bytes/s", l.alpha_s,
              l.bytes_per_s);
    CHECK_OK(crew_scale_measure_device_link("cpu", bytes, &l));
    CHECK_MSG(strcmp(l.name, "shared memory") == 0, "cpu's device link is '%s'", l.name);
    CHECK_OK(crew_scale_measure_copies("cpu-remote", bytes, &up, &down));
    CHECK_MSG(finite_nonneg(up.alpha_s) && finite_pos(up.bytes_per_s) && finite_nonneg(down.alpha_s) &&
                  finite_pos(down.bytes_per_s) && !strcmp(up.name, "host to cpu-remote:0") &&
                  !strcmp(down.name, "cpu-remote:0 to host"),
              "copies: up %s %g s %g B/s, down %s %g s %g B/s", up.name, up.alpha_s, up.bytes_per_s, down.name,
              down.alpha_s, down.bytes_per_s);
    CHECK_ERR(crew_scale_measure_device_link("tpu", bytes, &l), "unknown device kind 'tpu'");
    CHECK_ERR(crew_scale_measure_copies("cpu-remote", 2, &up, &down), "the copy benchmark takes 4 B to 16 GiB");
    /* the fallback's name reaches the model's note */
    crew_scale_trial one = {.devices = 1, .global_batch = 8, .samples_per_s = 100, .compute_s = 0.01};
    crew_scale_model cm;
    CHECK_OK(crew_scale_fit(&one, 1, bytes, &(crew_link){.alpha_s = 1e-5, .bytes_per_s = 1e9, .name = "NCCL"}, 1, 1.0,
                            &cm));
    CHECK_MSG(strstr(cm.link_note, "NCCL, measured") != NULL, "note '%s'", cm.link_note);
}

int main(void)
{
    const char *src = getenv("CREW_SOURCE_DIR") ? getenv("CREW_SOURCE_DIR") : "..";
    check_statistics();
    check_fit();
    check_epochs_time();
    check_duration();
    check_percent();
    check_advice();
    check_goodput();
    check_hint();
    check_device_link();
    char dir[] = "/tmp/crew-scaling-XXXXXX", data[400];
    CHECK(make_dataset(dir, data, sizeof data) == 0);
    check_bad_arguments(src, data);
    check_real_trials(src, data);
    check_layouts(src, data, dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_report();
}
