/* bench_noise_scale.c — what measuring the gradient noise scale costs a step (docs/PERFORMANCE.md,
 * "The gradient noise scale's cost").
 *
 *   bench_noise_scale DATA_DIR [--models FILE,FILE] [--steps S] [--rounds R] [--devices N] [--every K]
 *
 * A step that measures it does one more pass over each micro-batch's gradient (sum_squares, on the
 * device) and asks the finiteness check's pass over the reduced gradient for its squared norm
 * instead (sum_squares in place of all_finite). Two figures per model, N replicas [2]:
 *  - the passes' own cost: each op timed on the model's parameter count (the median of 200 runs on
 *    a warm buffer), as a share of the step's time in a real run of S steps [200], measuring every
 *    K steps [1];
 *  - end to end: R paired rounds [5] of S steps with the noise scale measured every step and off,
 *    alternating which goes first, and the median of the rounds' samples/s ratio (off / on: the
 *    slowdown), whose spread says how much of it is this machine's noise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench_machine.h"
#include "bench_stats.h"
#include "core/status.h"
#include "core/timer.h"
#include "crew.h"

/* The median seconds of one sum_squares (which = 0) or all_finite (1) over n values. */
static double op_time(const crew_backend *be, const float *x, int64_t n, int which)
{
    enum { RUNS = 200 };
    double t[RUNS], sq;
    int finite;
    for (int r = 0; r < RUNS; r++) {
        double t0 = crew_now();
        crew_status s = which ? be->ops->all_finite(be->ctx, x, n, &finite) : be->ops->sum_squares(be->ctx, x, n, &sq);
        t[r] = crew_now() - t0;
        crew_status_free(s);
    }
    return bench_median(t, RUNS);
}

/* samples/s of one fit of `steps` steps on `devices` replicas, noise scale every step (1) or off (0). */
static int64_t every = 1; /* --every: the steps between measurements of the measured runs */

static double fit_once(const char *model, const crew_dataset *d, int devices, int64_t steps, int noise, int64_t *params,
                       int64_t *global, double *noise_scale)
{
    crew_model *m = NULL;
    crew_status s = crew_model_load_file(model, &m);
    crew_fit_options o;
    if (!s) {
        crew_model_default_fit(m, &o);
        o.devices = devices;
        o.max_steps = steps;
        o.epochs = 1000;
        o.noise_scale_every = noise ? every : -1;
        crew_fit_result r;
        s = crew_model_fit(m, d, &o, &r);
        if (!s) {
            *params = crew_model_param_count(m);
            *global = (int64_t)devices * o.batch_per_device;
            if (noise) *noise_scale = r.noise_scale;
            crew_model_free(m);
            return r.samples_per_s;
        }
    }
    fprintf(stderr, "bench_noise_scale: %s: %s\n", model, crew_status_message(s));
    exit(1);
}

int main(int argc, char **argv)
{
    const char *data = NULL, *models = "examples/fashion_mlp.json,examples/fashion_cnn.json";
    int64_t steps = 200;
    int rounds = 5, devices = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc) devices = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--every") && i + 1 < argc) every = atoll(argv[++i]);
        else if (argv[i][0] != '-' && !data) data = argv[i];
        else {
            fprintf(stderr, "usage: bench_noise_scale DATA_DIR [--models FILE,FILE] [--steps S] [--rounds R] "
                            "[--devices N] [--every K]\n");
            return 2;
        }
    }
    if (!data || steps < 20 || rounds < 1 || rounds > 64 || devices < 2) {
        fprintf(stderr, "bench_noise_scale: needs DATA_DIR, --steps >= 20, --rounds 1..64, --devices >= 2\n");
        return 2;
    }
    crew_dataset *d = NULL;
    crew_status s = crew_dataset_open(data, "train", &d);
    if (s) {
        fprintf(stderr, "bench_noise_scale: %s\n", crew_status_message(s));
        return 1;
    }
    char blas[256];
    crew_blas_describe(blas, sizeof blas);
    printf("%s; %d replicas, %lld steps a run, %d paired rounds, measured every %lld step%s\n\n", blas, devices,
           (long long)steps, rounds, (long long)every, every == 1 ? "" : "s");
    bench_load load;
    bench_load_start(&load);
    printf("| model | parameters | step (ms) | sum_squares (ms) | all_finite (ms) | the passes' share of a step | "
           "end to end, off / on (median) | rounds (lowest-highest) | noise scale at the end |\n");
    printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    char list[1024];
    snprintf(list, sizeof list, "%s", models);
    for (char *model = strtok(list, ","); model; model = strtok(NULL, ",")) {
        double ratio[64], on_sum = 0.0, ns = NAN;
        int64_t params = 0, global = 0;
        for (int r = 0; r < rounds; r++) {
            double on, off;
            if (r % 2) {
                off = fit_once(model, d, devices, steps, 0, &params, &global, &ns);
                on = fit_once(model, d, devices, steps, 1, &params, &global, &ns);
            } else {
                on = fit_once(model, d, devices, steps, 1, &params, &global, &ns);
                off = fit_once(model, d, devices, steps, 0, &params, &global, &ns);
            }
            ratio[r] = off / on;
            on_sum += on;
        }
        double lo = ratio[0], hi = ratio[0];
        for (int r = 1; r < rounds; r++) lo = fmin(lo, ratio[r]), hi = fmax(hi, ratio[r]);
        const double step_s = (double)global / (on_sum / rounds);
        crew_backend be;
        float *x = NULL;
        s = crew_device_open("cpu", 0, NULL, &be);
        if (!s) s = crew_dev_alloc_f32(&be, params, &x);
        if (s) {
            fprintf(stderr, "bench_noise_scale: %s\n", crew_status_message(s));
            return 1;
        }
        be.ops->fill(be.ctx, x, 0.01f, params);
        const double sq = op_time(&be, x, params, 0), fin = op_time(&be, x, params, 1);
        /* one pass a micro-batch (one a replica here), and sum_squares for all_finite on the reduced
         * one, every `every` steps */
        const double share = (sq + (sq - fin)) / step_s / (double)every;
        printf("| %s | %lld | %.3f | %.4f | %.4f | %.2f%% | %.3f | %.3f-%.3f | %.3g |\n", model, (long long)params,
               1e3 * step_s, 1e3 * sq, 1e3 * fin, 100.0 * share, bench_median(ratio, rounds), lo, hi, ns);
        crew_dev_free(&be, x);
        crew_device_close(&be);
    }
    char say[96];
    printf("\nother processes used %s during the runs\n", bench_load_say(bench_load_others(&load), say, sizeof say));
    crew_dataset_free(d);
    return 0;
}
