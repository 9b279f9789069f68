/* bench_advisor.c — how well the scaling advisor predicts this machine: from a 1-replica trial,
 * the lockstep probe and the shared-memory link it predicts the throughput of 2 replicas, which
 * is then measured (docs/PERFORMANCE.md, "The advisor's prediction"; docs/ADVISOR.md).
 *
 *   bench_advisor [MODEL.json] [--rounds R] [--sets K] [--steps S] [--batch B] [--json]
 *
 * It runs in rounds, each a 1-replica trial, the probe, the prediction and a 2-replica trial back
 * to back, because a prediction is only comparable with a measurement taken under the same load.
 * The figure is the median of the rounds' ratios (prediction over measurement); the target is
 * within 20% of 1. A set of R rounds whose median misses is followed by another (up to K sets),
 * and the median of all of them is the figure: on a shared 2-core machine one set now and then
 * scatters by ±15% (other tenants change the cores' speed between a prediction and its
 * measurement). The model is examples/fashion_mlp.json unless given; the data are random 28x28
 * images (8192), made in $TMPDIR. This was test_scaling's check until tests stopped measuring
 * speed: on a loaded machine a prediction made from a quiet moment misses by 30% and more, which
 * says nothing about the cost model. Other processes' CPU use during the run is printed with the
 * figure; rerun when it is above about 0.1 core. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "advise/scaling.h"
#include "bench_machine.h"
#include "crew.h"
#include "synthetic.h"

#define SIDE 28
#define SAMPLES 8192
#define MAX_ROUNDS 99
#define MAX_SETS 9
#define TARGET 0.20

typedef struct args {
    const char *model;
    int rounds, sets, json;
    int64_t steps, batch;
} args;

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_advisor [MODEL.json] [--rounds R] [--sets K] [--steps S] [--batch B] [--json]\n"
               "  MODEL.json    the model to predict [examples/fashion_mlp.json]\n"
               "  --rounds R    paired rounds of prediction and measurement per set [9]\n"
               "  --sets K      at most K sets; another only while the median misses the target [2]\n"
               "  --steps S     measured steps of each trial [120]\n"
               "  --batch B     per-device batch [128]\n"
               "  --json        end with one JSON line of the figures\n");
}

static int64_t count(const char *text, int64_t max)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > max) return -1;
    return v;
}

static int parse(int argc, char **argv, args *a)
{
    *a = (args){.model = "examples/fashion_mlp.json", .rounds = 9, .sets = 2, .steps = 120, .batch = 128};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(arg, "--json")) { a->json = 1; continue; }
        if (arg[0] != '-') { a->model = arg; continue; }
        int64_t n = v ? count(v, 100000) : -1;
        i++;
        if (!strcmp(arg, "--rounds") && n > 0 && n <= MAX_ROUNDS) a->rounds = (int)n;
        else if (!strcmp(arg, "--sets") && n > 0 && n <= MAX_SETS) a->sets = (int)n;
        else if (!strcmp(arg, "--steps") && n > 0) a->steps = n;
        else if (!strcmp(arg, "--batch") && n > 0 && n <= SAMPLES / 2) a->batch = n;
        else {
            fprintf(stderr, "bench_advisor: unknown option or value out of range: %s %s\n", arg, v ? v : "");
            return -1;
        }
    }
    return 0;
}

static int fail(crew_status s, const char *what)
{
    if (!s) return 0;
    fprintf(stderr, "bench_advisor: %s: %s\n", what, crew_status_message(s));
    crew_status_free(s);
    return 1;
}

/* One round: the model fitted to a 1-replica trial and the lockstep probe predicts 2 replicas,
 * which are measured right after. 0 on success. */
static int round_of(crew_model *m, crew_dataset *d, const crew_scale_options *o, const crew_link *shared,
                    int64_t params, int cores, int index, double *predicted, double *measured)
{
    crew_scale_trial one, two;
    crew_scale_model cm;
    crew_scale_point p;
    double speed = 1.0;
    if (fail(crew_scale_measure(m, d, o, 1, &one), "1-replica trial") ||
        fail(crew_scale_probe_parallel(cores, 1.0, params, one.compute_s + one.optimizer_s, &speed), "probe") ||
        fail(crew_scale_fit(&one, 1, params * 4, shared, cores, speed, &cm), "fit"))
        return 1;
    crew_scale_predict(&cm, NULL, 2, 0, 0, &p);
    if (fail(crew_scale_measure(m, d, o, 2, &two), "2-replica trial")) return 1;
    if (!(two.samples_per_s > 0) || !(p.samples_per_s > 0)) {
        fprintf(stderr, "bench_advisor: round %d: an empty figure\n", index);
        return 1;
    }
    *predicted = p.samples_per_s;
    *measured = two.samples_per_s;
    printf("round %d: side by side %.0f%% speed; 1 replica %.0f samples/s; 2 replicas predicted %.0f, measured %.0f "
           "samples/s (%+.0f%%)\n", index, 100 * speed, one.samples_per_s, p.samples_per_s, two.samples_per_s,
           100 * (p.samples_per_s / two.samples_per_s - 1));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    args a;
    if (parse(argc, argv, &a)) {
        usage(stderr);
        return 2;
    }
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[200], data[300];
    snprintf(dir, sizeof dir, "%s/crew-bench-advisor-XXXXXX", tmp);
    if (syn_make_random_dataset(dir, SAMPLES, SIDE, data, sizeof data) != 0) {
        fprintf(stderr, "bench_advisor: could not make the dataset in %s\n", tmp);
        return 1;
    }
    crew_model *m = NULL;
    crew_dataset *d = NULL;
    int rc = fail(crew_model_load_file(a.model, &m), a.model) || fail(crew_dataset_open(data, "train", &d), data);
    crew_scale_options o = {.struct_size = sizeof(crew_scale_options), .batch_per_device = a.batch, .warmup_steps = 3,
                            .steps = a.steps, .repeats = 1};
    int64_t params = m ? crew_model_param_count(m) : 0;
    crew_link shared = {0};
    if (!rc) rc = fail(crew_scale_measure_shared_memory(params * 4, &shared), "shared-memory link");
    int cores = crew_cpu_cores();
    double predicted[MAX_ROUNDS * MAX_SETS], measured[MAX_ROUNDS * MAX_SETS], ratios[MAX_ROUNDS * MAX_SETS];
    double paired = NAN, lo = NAN, hi = NAN;
    int n = 0, sets = 0;
    bench_load load;
    bench_load_start(&load);
    for (; !rc && sets < a.sets && !(fabs(paired - 1.0) <= TARGET); sets++) {
        for (int r = 0; r < a.rounds && !rc; r++) {
            rc = round_of(m, d, &o, &shared, params, cores, n + 1, &predicted[n], &measured[n]);
            if (!rc) n++;
        }
        for (int i = 0; i < n; i++) ratios[i] = predicted[i] / measured[i];
        paired = crew_scale_median(ratios, n); /* sorts ratios */
        lo = ratios[0], hi = ratios[n - 1];
        printf("2 replicas after %d set%s: prediction / measurement %.3f (%+.1f%%, the median of %d rounds, "
               "%.3f-%.3f)\n", sets + 1, sets ? "s" : "", paired, 100 * (paired - 1), n, lo, hi);
    }
    double others = bench_load_others(&load);
    char say[96];
    if (!rc) {
        double med_p = crew_scale_median(predicted, n), med_m = crew_scale_median(measured, n);
        printf("%s on %d cores: 2 replicas predicted %.0f, measured %.0f samples/s (medians); prediction / "
               "measurement %.3f over %d rounds: %s the target of %.0f%%; other processes used %s\n", a.model,
               cores, med_p, med_m, paired, n, fabs(paired - 1.0) <= TARGET ? "within" : "outside", 100 * TARGET,
               bench_load_say(others, say, sizeof say));
        if (a.json)
            printf("{\"model\":\"%s\",\"cores\":%d,\"rounds\":%d,\"sets\":%d,\"ratio\":%.4f,\"ratio_lo\":%.4f,"
                   "\"ratio_hi\":%.4f,\"predicted_samples_per_s\":%.1f,\"measured_samples_per_s\":%.1f,"
                   "\"within_target\":%s,\"background_cores\":%.3f}\n", a.model, cores, n, sets, paired, lo, hi,
                   med_p, med_m, fabs(paired - 1.0) <= TARGET ? "true" : "false", others);
    }
    crew_dataset_free(d);
    crew_model_free(m);
    syn_remove(dir);
    return rc;
}
