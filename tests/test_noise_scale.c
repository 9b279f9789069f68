/* test_noise_scale.c — the gradient noise scale (telemetry/noise_scale.h) against a brute-force one.
 *
 * At fixed weights (SGD at a learning rate of 1e-30, which moves no weight that matters), every
 * sample's own gradient is computed one by one over the whole training set: their mean is the true
 * gradient G and their spread its covariance Σ, so |G|² and tr(Σ) are known exactly (as exactly as
 * the finite set defines them). A run of 4 replicas × 8 samples (B = 32, b = 8) over 40 epochs of
 * that set measures both every step from what its replicas compute (the micro-batches' squared
 * norms, the reduced gradient's); the mean of its per-step estimates must agree with the brute
 * force within 10%, and so must B_simple = tr(Σ) / |G|². The per-step figures, written to
 * metrics.jsonl, are also the same bits when one replica accumulates the same 4 micro-batches: the
 * estimate does not depend on how the work was split. And the arithmetic of the estimators and of
 * their smoothing, on figures made up here, and the words of the run's summary. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/dataset.h"
#include "model_values.h"
#include "nn/model.h"
#include "synthetic.h"
#include "telemetry/noise_scale.h"

enum { SAMPLES = 1024, EPOCHS = 40, BATCH = 8, REPLICAS = 4 };

static crew_model *model(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 12, .activation = CREW_ACT_TANH}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    crew_compile_options c = {.loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY,
                              .optimizer = {.type = CREW_OPT_SGD, .lr = 1e-30f}};
    CHECK_OK(crew_model_compile(m, &c));
    CHECK_OK(crew_model_init_params(m, 5));
    return m;
}

/* |G|² and tr(Σ) over every sample of d, each sample's gradient on its own. */
static void brute_force(crew_model *m, const crew_dataset *d, double *g2, double *trace)
{
    const int64_t n = crew_dataset_size(d), np = m->n_params, in = crew_shape_size(&m->input);
    double *mean = calloc((size_t)np, sizeof *mean), sq = 0.0;
    float *x = malloc((size_t)in * sizeof *x), *g = malloc((size_t)np * sizeof *g);
    CHECK_OK(crew_model_reserve(m, 1));
    for (int64_t s = 0; s < n; s++) {
        int32_t y;
        crew_dataset_gather(d, &s, 1, x, &y);
        mv_upload(m, m->act[0], x, in);
        mv_upload_as(m, m->labels, &y, 1, CREW_DT_I32);
        mv_upload_as(m, m->sample_ids, &s, 1, CREW_DT_I64);
        crew_pass p = {.be = &m->be, .rows = 1, .training = 1, .seed = 1, .sample_ids = m->sample_ids, .total_rows = 1};
        double loss, correct;
        CHECK_OK(crew_model_forward(m, &p));
        CHECK_OK(crew_model_loss(m, &p, 1.0f, &loss, &correct));
        CHECK_OK(crew_model_backward(m, &p, NULL, NULL));
        CHECK_OK(crew_dev_download_f32(&m->be, g, m->grads, np));
        for (int64_t i = 0; i < np; i++) {
            mean[i] += g[i];
            sq += (double)g[i] * g[i];
        }
    }
    double mm = 0.0;
    for (int64_t i = 0; i < np; i++) mm += (mean[i] / n) * (mean[i] / n);
    *g2 = mm;
    *trace = sq / n - mm;
    free(mean);
    free(x);
    free(g);
}

/* Every step's estimates from a run's metrics.jsonl, averaged; the per-step inputs into a list
 * (small, big, ...) for comparing two runs. Returns the steps read. */
static int read_steps(const char *run_dir, double *g2, double *trace, double *inputs, int cap)
{
    char path[600], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "no %s", path);
    int n = 0;
    double sum_g2 = 0.0, sum_trace = 0.0;
    while (f && fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *small = cJSON_GetObjectItemCaseSensitive(o, "grad_sq_small"),
                    *big = cJSON_GetObjectItemCaseSensitive(o, "grad_sq_big"),
                    *b = cJSON_GetObjectItemCaseSensitive(o, "small_batch"),
                    *B = cJSON_GetObjectItemCaseSensitive(o, "global_batch");
        if (cJSON_IsNumber(small) && cJSON_IsNumber(big) && cJSON_IsNumber(b) && cJSON_IsNumber(B)) {
            double one_g2, one_trace;
            crew_noise_scale_estimates(small->valuedouble, (int64_t)b->valuedouble, big->valuedouble,
                                       (int64_t)B->valuedouble, &one_g2, &one_trace);
            sum_g2 += one_g2;
            sum_trace += one_trace;
            if (2 * n + 1 < cap) inputs[2 * n] = small->valuedouble, inputs[2 * n + 1] = big->valuedouble;
            n++;
        }
        cJSON_Delete(o);
    }
    if (f) fclose(f);
    *g2 = n ? sum_g2 / n : NAN;
    *trace = n ? sum_trace / n : NAN;
    return n;
}

static void run(crew_model *m, const crew_dataset *d, int devices, const char *run_dir)
{
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = devices;
    o.batch_per_device = BATCH;
    o.global_batch = REPLICAS * BATCH;
    o.epochs = EPOCHS;
    o.seed = 3;
    o.run_dir = run_dir;
    o.noise_scale_every = 1;
    crew_fit_result r;
    CHECK_OK(crew_model_fit(m, d, &o, &r));
    CHECK_MSG(isfinite(r.noise_scale) && strstr(r.noise_text, "gradient noise scale B_simple = "), "summary: %s",
              r.noise_text);
}

static void check_against_brute_force(const crew_dataset *d, const char *tmp)
{
    crew_model *m = model();
    double g2, trace;
    brute_force(m, d, &g2, &trace);
    char dir4[512], dir1[512];
    snprintf(dir4, sizeof dir4, "%s/four", tmp);
    snprintf(dir1, sizeof dir1, "%s/one", tmp);
    crew_model *a = model(), *b = model();
    run(a, d, REPLICAS, dir4);
    run(b, d, 1, dir1);
    enum { CAP = 2 * 4096 };
    static double in4[CAP], in1[CAP];
    double e_g2, e_trace, e1_g2, e1_trace;
    int n4 = read_steps(dir4, &e_g2, &e_trace, in4, CAP), n1 = read_steps(dir1, &e1_g2, &e1_trace, in1, CAP);
    const int want = EPOCHS * SAMPLES / (REPLICAS * BATCH);
    CHECK_MSG(n4 == want && n1 == want, "steps measured: %d and %d, wanted %d", n4, n1, want);
    CHECK_MSG(n4 == n1 && !memcmp(in4, in1, sizeof(double) * 2 * (size_t)(n4 < CAP / 2 ? n4 : CAP / 2)),
              "the per-step figures of 4 replicas and of 1 accumulating 4 micro-batches differ");
    const double rel_g2 = fabs(e_g2 / g2 - 1.0), rel_trace = fabs(e_trace / trace - 1.0);
    const double rel_b = fabs((e_trace / e_g2) / (trace / g2) - 1.0);
    printf("brute force over %d samples: |G|^2 %.5g, tr(Sigma) %.5g, B_simple %.4g\n", SAMPLES, g2, trace, trace / g2);
    printf("the replicas' estimates, averaged over %d steps: |G|^2 %.5g (%+.1f%%), tr(Sigma) %.5g (%+.1f%%), "
           "B_simple %.4g (%+.1f%%)\n", n4, e_g2, 100 * (e_g2 / g2 - 1), e_trace, 100 * (e_trace / trace - 1),
           e_trace / e_g2, 100 * ((e_trace / e_g2) / (trace / g2) - 1));
    CHECK_MSG(rel_g2 < 0.10 && rel_trace < 0.10 && rel_b < 0.10,
              "the estimates are off the brute force by %.1f%%, %.1f%% and %.1f%% (|G|^2, tr, B_simple; allowed 10%%)",
              100 * rel_g2, 100 * rel_trace, 100 * rel_b);
    crew_model_free(m);
    crew_model_free(a);
    crew_model_free(b);
}

/* The estimators and their smoothing on made-up figures. */
static void check_arithmetic(void)
{
    /* |G|² = 4, tr(Σ) = 64: E[S] at b = 8 is 4 + 8 = 12, E[L] at B = 32 is 4 + 2 = 6 */
    double g2, trace;
    crew_noise_scale_estimates(12.0, 8, 6.0, 32, &g2, &trace);
    CHECK(fabs(g2 - 4.0) < 1e-12 && fabs(trace - 64.0) < 1e-12);
    crew_noise_scale ns;
    crew_noise_scale_init(&ns, 1);
    CHECK(isnan(ns.b_simple));
    crew_noise_scale_add(&ns, 12.0, 8, 6.0, 32);
    CHECK_MSG(fabs(ns.b_simple - 16.0) < 1e-12, "one step: %g", ns.b_simple); /* bias-corrected: the step itself */
    crew_noise_scale_add(&ns, 12.0, 8, 6.0, 8);   /* B <= b: left out */
    crew_noise_scale_add(&ns, NAN, 8, 6.0, 32);   /* not measured: left out */
    CHECK(ns.steps == 1);
    crew_noise_scale_add(&ns, 7.0, 8, 6.0, 32);   /* |G|² (192 − 56)/24, tr 1/(1/8 − 1/32) */
    const double want = (0.99 * 0.01 * 64 + 0.01 * (1.0 / 0.09375)) / (0.99 * 0.01 * 4 + 0.01 * (136.0 / 24));
    CHECK_MSG(fabs(ns.b_simple - want) < 1e-9, "two steps: %g, want %g", ns.b_simple, want);
    /* a time constant of ~100 steps whatever the interval: every 4 steps decays by 0.99^4 a measurement */
    crew_noise_scale_init(&ns, 4);
    CHECK(fabs(ns.decay - pow(0.99, 4)) < 1e-15);
    char text[400];
    crew_noise_scale_init(&ns, 1);
    crew_noise_scale_text(&ns, 32, 32, 0, text, sizeof text);
    CHECK_MSG(strstr(text, "not measured: each step is one micro-batch of 32 samples") && strstr(text, "--global-batch 64"),
              "%s", text);
    crew_noise_scale_text(&ns, 64, 32, 0, text, sizeof text);
    CHECK_MSG(strstr(text, "turned off"), "%s", text);
    crew_noise_scale_add(&ns, 12.0, 8, 6.0, 32);
    crew_noise_scale_text(&ns, 32, 8, 1, text, sizeof text);
    CHECK_MSG(strstr(text, "B_simple = 16 samples (averaged over the 1 step measured)") &&
              strstr(text, "the global batch of 32 is 2 of it") &&
              strstr(text, "not time to a result"), "%s", text);
    crew_noise_scale_text(&ns, 1, 8, 1, text, sizeof text);
    CHECK_MSG(strstr(text, "0.062 of it") && strstr(text, "nearly proportionally more progress"), "%s", text);
    crew_noise_scale_init(&ns, 1);
    crew_noise_scale_add(&ns, 30.0, 8, 6.0, 32); /* |G|² = (192 − 240)/24 < 0: no ratio yet */
    CHECK(isnan(ns.b_simple) && ns.steps == 1);
    crew_noise_scale_text(&ns, 32, 8, 1, text, sizeof text);
    CHECK_MSG(strstr(text, "too large to estimate (over the last steps measured, 1 in all"), "%s", text);
    /* past the averages' time constant the text says so, and how often a step was measured */
    crew_noise_scale_init(&ns, 4);
    for (int i = 0; i < 30; i++) crew_noise_scale_add(&ns, 12.0, 8, 6.0, 32);
    crew_noise_scale_text(&ns, 32, 8, 4, text, sizeof text);
    CHECK_MSG(strstr(text, "(smoothed over about the last 100 steps; 30 measured, one in 4)"), "%s", text);
}

int main(void)
{
    check_arithmetic();
    char dir[64] = "/tmp/crew-test-noise-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) check_against_brute_force(d, dir);
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
