/* bench_input_bound.c — how many loader threads keep a slow input pipeline ahead of the model
 * (docs/PERFORMANCE.md, "Loader threads against a slow augmentation").
 *
 *   bench_input_bound [--slow-ms X] [--steps S] [--threads K,K,...] [--json]
 *
 * One replica trains a small CNN (a 32-filter convolution and a dense layer of 768 on 12x12
 * images, batch 8: about 10 ms a step on the 2-core machine) while its loader sleeps X ms per
 * sample [5] in the augmentation, as a slow decode would (the test-only hook of train/hooks.h):
 * one thread prepares a micro-batch in 8X ms, four times the step, and K threads, sleeping rather
 * than computing, K times as fast. For each K it prints the share of each step the replica waited
 * for data, whether the run reported itself input-bound (waiting over 5% of a step, the first 5
 * steps left out), and the mean step after the first 5. The expectation it was written for
 * (test_loader's, until tests stopped measuring speed): 1 thread input-bound; 32 threads not,
 * waiting under a quarter of what 1 thread waits. Other processes' CPU use during the run is
 * printed with the figures. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_machine.h"
#include "core/status.h"
#include "crew.h"
#include "synthetic.h"
#include "train/hooks.h"

#define MAX_K 16

typedef struct args {
    double slow_s;
    int64_t steps;
    int k[MAX_K], n_k, json;
} args;

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_input_bound [--slow-ms X] [--steps S] [--threads K,K,...] [--json]\n"
               "  --slow-ms X        loader sleep per sample, in ms [5]\n"
               "  --steps S          training steps per loader thread count, at least 20 (one window) [100]\n"
               "  --threads K,...    loader thread counts [1,2,4,8,16,32]\n"
               "  --json             one JSON line per thread count\n");
}

static int parse(int argc, char **argv, args *a)
{
    *a = (args){.slow_s = 0.005, .steps = 100, .k = {1, 2, 4, 8, 16, 32}, .n_k = 6};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(arg, "--json")) { a->json = 1; continue; }
        if (!v) { fprintf(stderr, "bench_input_bound: %s needs a value\n", arg); return -1; }
        i++;
        char *end;
        errno = 0;
        if (!strcmp(arg, "--slow-ms")) {
            double ms = strtod(v, &end);
            if (errno || *end || !(ms >= 0) || ms > 1000) goto bad;
            a->slow_s = ms / 1000;
        } else if (!strcmp(arg, "--steps")) {
            long long n = strtoll(v, &end, 10);
            if (errno || *end || n < 20 || n > 100000) goto bad;
            a->steps = n;
        } else if (!strcmp(arg, "--threads")) {
            a->n_k = 0;
            for (const char *p = v; *p && a->n_k < MAX_K;) {
                long n = strtol(p, &end, 10);
                if (end == p || n < 1 || n > 256) goto bad;
                a->k[a->n_k++] = (int)n;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') goto bad;
            }
            if (a->n_k == 0) goto bad;
        } else {
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "bench_input_bound: bad option or value: %s %s\n", arg, v);
        return -1;
    }
    return 0;
}

static crew_status make_model(crew_model **m)
{
    CREW_TRY(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, m));
    CREW_TRY(crew_model_add(*m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 32, .kernel = {3, 3},
                                                   .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU}));
    CREW_TRY(crew_model_add(*m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CREW_TRY(crew_model_add(*m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 768}));
    CREW_TRY(crew_model_add(*m, &(crew_layer_spec){.type = CREW_LAYER_DROPOUT, .rate = 0.1f}));
    return crew_model_add(*m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES});
}

typedef struct seen {
    int events;      /* input-bound reports */
    double step_s;   /* summed over the steps after the first 5 */
    int64_t steps;
} seen;

static void on_event(void *user, const crew_event_info *e)
{
    if (e->kind == CREW_EVENT_INPUT_BOUND) ((seen *)user)->events++;
}

static void on_step(void *user, const crew_step_info *i)
{
    seen *s = user;
    if (i->step <= 5) return;
    s->step_s += i->step_s;
    s->steps++;
}

static crew_status run(const crew_dataset *d, const args *a, int k, crew_fit_result *r, seen *seen)
{
    crew_model *m = NULL;
    crew_status s = make_model(&m);
    crew_fit_options o;
    crew_fit *f = NULL;
    if (!s) {
        crew_model_default_fit(m, &o);
        o.devices = 1;
        o.batch_per_device = 8;
        o.max_steps = a->steps;
        o.epochs = 1000000;
        o.loader_threads = k;
        o.prefetch = k > 2 ? k : 2;
        o.straggler_window = 20;
        o.drift_check_every = -1;
        o.on_event = on_event;
        o.on_step = on_step;
        o.user = seen;
        s = crew_fit_prepare(m, d, &o, &f);
    }
    if (!s) {
        crew_fit_hooks_of(f)->loader_slow_s = a->slow_s;
        s = crew_fit_run(f, r);
    }
    crew_fit_free(f);
    crew_model_free(m);
    return s;
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
    snprintf(dir, sizeof dir, "%s/crew-bench-input-XXXXXX", tmp);
    if (syn_make_dataset(dir, 1024, data, sizeof data) != 0) {
        fprintf(stderr, "bench_input_bound: could not make the dataset in %s\n", tmp);
        return 1;
    }
    crew_dataset *d = NULL;
    crew_status s = crew_dataset_open(data, "train", &d);
    int rc = 0;
    printf("loader sleeping %.1f ms per sample (%.0f ms per 8-sample batch), %lld steps each\n", 1000 * a.slow_s,
           8000 * a.slow_s, (long long)a.steps);
    printf("%8s %8s %8s %12s %10s %12s\n", "threads", "prefetch", "data %", "input-bound", "step ms", "other cores");
    double one_data = -1;
    for (int i = 0; !s && i < a.n_k; i++) {
        crew_fit_result r;
        seen seen = {0};
        bench_load load;
        bench_load_start(&load);
        s = run(d, &a, a.k[i], &r, &seen);
        if (s) break;
        int events = seen.events;
        double others = bench_load_others(&load), step_ms = seen.steps ? 1000 * seen.step_s / (double)seen.steps : 0;
        if (a.k[i] == 1) one_data = r.data_fraction;
        printf("%8d %8d %8.1f %12s %10.2f %12.2f\n", a.k[i], a.k[i] > 2 ? a.k[i] : 2, 100 * r.data_fraction,
               events ? "yes" : "no", step_ms, others);
        if (a.json)
            printf("{\"threads\":%d,\"data_fraction\":%.4f,\"input_bound_events\":%d,\"step_ms\":%.3f,"
                   "\"background_cores\":%.3f}\n", a.k[i], r.data_fraction, events, step_ms, others);
        if (a.k[i] == 32 && one_data > 0)
            printf("32 threads against 1: %s input-bound, waiting %.2f of what 1 thread waits (expected: not, under "
                   "0.25)\n", events ? "still" : "not", r.data_fraction / one_data);
        fflush(stdout);
    }
    if (s) {
        fprintf(stderr, "bench_input_bound: %s\n", crew_status_message(s));
        crew_status_free(s);
        rc = 1;
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return rc;
}
