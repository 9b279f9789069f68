/* test_scaling.c — the scaling advisor: its statistics, the cost model fitted to made-up trials,
 * the recommendation and the training hint; then the advisor checking itself on this machine:
 * from trials at one replica it predicts the throughput of two, which is then measured.
 *
 * The check runs in rounds, each a 1-replica trial, the lockstep probe, the prediction and a
 * 2-replica trial back to back, because the machine is shared: other work comes and goes, and a
 * prediction is only comparable with a measurement taken under the same load. The median of the
 * rounds' ratios (prediction over measurement) must be within 20% of 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "advise/scaling.h"
#include "check.h"
#include "synthetic.h"

#define SIDE 28
#define SAMPLES 8192
#define ROUNDS 9      /* paired rounds of prediction and measurement per set */
#define MAX_SETS 2     /* a busy machine gets a second set before the check judges */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TRIAL_STEPS 40 /* a sanitizer's build is slower; the check holds the same */
#else
#define TRIAL_STEPS 120
#endif

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
    const crew_link truth = {50e-6, 2e9}, wrong = {1e-6, 50e9};
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
    const crew_link link = {50e-6, 2e9};
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
    const crew_link fast = {1e-9, 1e15};
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

static void check_advice(void)
{
    const crew_link link = {50e-6, 2e9};
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
    crew_link slow = {20e-6, 0.1e9};
    crew_scale_advise(&cm, &slow, counts, 7, 60000, 1000, 3600, &a);
    CHECK_MSG(a.stall_devices == 2 && strstr(a.stall, "communication"), "%s", a.stall);
    crew_scale_trial tiny = made_up(1, 0.0001, &link, 4000);
    CHECK_OK(crew_scale_fit(&tiny, 1, 4000, &link, 0, 0, &cm));
    crew_scale_advise(&cm, NULL, counts, 7, 6000000, 1000, 3600, &a);
    CHECK_MSG(strstr(a.stall, "per-device batch of 64 is too small") != NULL, "%s", a.stall);
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

/* One round: fit the model to a 1-replica trial and the lockstep probe, predict 2 replicas, then
 * measure them. 0 when a figure came out empty. */
static int prediction_round(crew_model *m, crew_dataset *d, const crew_scale_options *o, const crew_link *shared,
                            int64_t params, int cores, double *predicted, double *measured)
{
    static int rounds_run;
    crew_scale_trial one, two;
    crew_scale_model cm;
    crew_scale_point p;
    double speed = 1.0;
    int64_t bytes = params * 4;
    CHECK_OK(crew_scale_measure(m, d, o, 1, &one));
    CHECK_OK(crew_scale_probe_parallel(cores, 1.0, params, one.compute_s + one.optimizer_s, &speed));
    CHECK_OK(crew_scale_fit(&one, 1, bytes, shared, cores, speed, &cm));
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    CHECK_OK(crew_scale_measure(m, d, o, 2, &two));
    if (!(two.samples_per_s > 0) || !(p.samples_per_s > 0)) return 0;
    *predicted = p.samples_per_s;
    *measured = two.samples_per_s;
    printf("round %d: side by side %.0f%% speed; 1 replica %.0f samples/s; 2 replicas predicted %.0f, measured %.0f "
           "samples/s (%+.0f%%)\n", ++rounds_run, 100 * speed, one.samples_per_s, p.samples_per_s, two.samples_per_s,
           100 * (p.samples_per_s / two.samples_per_s - 1));
    if (getenv("DEBUG_SCALE"))
        printf("  pred: compute %.2f shared %.2f data %.2f sync %.2f comm %.2f step %.2f | meas: step %.2f data %.2f "
               "compute %.2f exposed %.2f opt %.2f other %.2f | one: compute %.2f opt %.2f data %.2f jitter %.2f "
               "helper %.2f\n", 1e3 * p.compute_s, 1e3 * p.shared_cores_s, 1e3 * p.data_s, 1e3 * p.sync_s,
               1e3 * p.comm_s, 1e3 * p.step_s, 1e3 * two.step_s, 1e3 * two.data_s, 1e3 * two.compute_s,
               1e3 * two.comm_exposed_s, 1e3 * two.optimizer_s, 1e3 * two.other_s, 1e3 * one.compute_s,
               1e3 * one.optimizer_s, 1e3 * one.data_s, 1e3 * one.compute_jitter_s, 1e3 * one.helper_cpu_s);
    return 1;
}

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

static void check_prediction(const char *src, const char *data)
{
#ifdef CREW_SANITIZED
    /* An instrumented build spends its time in the sanitizer's bookkeeping, which the cost model of
     * crew's own steps does not describe: the prediction is a claim about the real build. */
    printf("the prediction check is left out of the sanitizer build\n");
    (void)src;
    (void)data;
    return;
#endif
    crew_model *m;
    crew_dataset *d;
    open_mlp(src, data, &m, &d);
    if (!m || !d) return;
    crew_scale_options o = {.struct_size = sizeof(crew_scale_options), .batch_per_device = 128, .warmup_steps = 3,
                            .steps = TRIAL_STEPS, .repeats = 1};
    int64_t params = crew_model_param_count(m), bytes = params * 4;
    crew_link shared;
    CHECK_OK(crew_scale_measure_shared_memory(bytes, &shared));
    int cores = crew_cpu_cores();
    double predicted[ROUNDS * MAX_SETS], measured[ROUNDS * MAX_SETS], paired = NAN;
    int n = 0;
    /* Each round's prediction is paired with the measurement taken right after it, under much the
     * same load; the median of the pairs' ratios is robust to the rounds the load changed within.
     * On a shared 2-core machine one set of rounds still scatters by ±15% now and then (other
     * tenants change the cores' speed between a prediction and its measurement), so a set whose
     * median misses is followed by a second one and the check judges the median of both. */
    for (int set = 0; set < MAX_SETS && !(fabs(paired - 1.0) <= 0.20); set++) {
        for (int r = 0; r < ROUNDS; r++)
            if (prediction_round(m, d, &o, &shared, params, cores, &predicted[n], &measured[n])) n++;
        double ratios[ROUNDS * MAX_SETS];
        for (int i = 0; i < n; i++) ratios[i] = predicted[i] / measured[i];
        paired = crew_scale_median(ratios, n);
        printf("2 replicas after %d set%s: prediction / measurement %.3f (%+.1f%%, the median of %d rounds; medians: "
               "predicted %.0f, measured %.0f samples/s)\n", set + 1, set ? "s" : "", paired, 100 * (paired - 1), n,
               crew_scale_median(predicted, n), crew_scale_median(measured, n));
    }
    CHECK_MSG(n >= ROUNDS && fabs(paired - 1.0) <= 0.20, "2 replicas: prediction / measurement %.3f (the median of %d "
              "rounds)", paired, n);
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

int main(void)
{
    const char *src = getenv("CREW_SOURCE_DIR") ? getenv("CREW_SOURCE_DIR") : "..";
    check_statistics();
    check_fit();
    check_epochs_time();
    check_duration();
    check_advice();
    check_hint();
    char dir[] = "/tmp/crew-scaling-XXXXXX", data[400];
    CHECK(make_dataset(dir, data, sizeof data) == 0);
    check_bad_arguments(src, data);
    check_prediction(src, data);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_report();
}
