/* bench_train.c — training throughput of one model file on one dataset, for comparison with
 * PyTorch (tools/bench_torch.py, tools/bench_compare.py, docs/PERFORMANCE.md).
 *
 *   bench_train MODEL.json DATA_DIR --batch B --steps S [--devices N] [--threads-per-device T]
 *               [--init-weights FILE] [--save-init FILE] [--repeats R] [--json]
 *
 * Every timed fit starts from the same initial weights and a fresh optimizer, runs S steps of
 * global batch B (B / N samples on each of N replicas) on the train split with no test set, and
 * reports crew's own samples/s (training steps only: gather + normalise + forward + backward +
 * all-reduce + update). A 10-step warm-up fit comes first so that page faults, OpenBLAS buffer
 * allocation and thread start-up are not measured. The median of R timed fits is reported, with
 * the min and max so that noise on a shared machine is visible. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "core/timer.h"
#include "crew.h"
#include "nn/model.h" /* crew_model_init_params: the public API initialises only inside a fit */

#define WARMUP_STEPS 10
#define MAX_REPEATS 99
#define INIT_SEED 1

typedef struct bench_args {
    const char *model, *data, *init_weights, *save_init;
    int64_t batch, steps;
    int devices, threads, repeats, json;
    int prefetch, loader_threads; /* 0: the library's choice */
    int shard_optimizer;
    int bind_cores; /* crew_fit_options.bind_cores: 0 the library's choice, 1 on, -1 off */
    int loader_inline; /* crew_fit_options.loader_inline, the same way; 2: not given */
    double bucket_mb; /* 0: the library's choice */
} bench_args;

typedef struct bench_stats {
    double sps[MAX_REPEATS]; /* [repeats] samples/s of each timed fit, in run order */
    double fit_wall_s[MAX_REPEATS]; /* [repeats] whole crew_model_fit call, replica setup included */
    double median, min, max;
    double step_ms, exposed_fraction, hidden_ms, data_fraction; /* the last timed fit's telemetry */
} bench_stats;

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_train MODEL.json DATA_DIR --batch B --steps S [--devices N] [--bucket-mb MB]\n"
               "                   [--threads-per-device T] [--init-weights FILE] [--save-init FILE]\n"
               "                   [--prefetch D] [--loader-threads K] [--shard-optimizer] [--bind-cores auto|on|off]\n"
               "                   [--loader-inline auto|on|off] [--repeats R] [--json]\n"
               "  --batch B               global batch (a multiple of N; each replica takes B/N)\n"
               "  --steps S               optimizer steps per timed fit\n"
               "  --devices N             data-parallel replicas, one thread each [1]\n"
               "  --threads-per-device T  GEMM threads per replica [1]\n"
               "  --bind-cores W          each replica on a core of its own: the library's choice (auto), on, off\n"
               "  --loader-inline W       each replica prepares its own batches: auto, on, off [auto; off\n"
               "                          with --loader-threads]\n"
               "  --init-weights FILE     start every fit from these weights [random, seed 1]\n"
               "  --save-init FILE        write the initial weights (safetensors) for PyTorch\n"
               "  --repeats R             timed fits; the median is reported [3]\n"
               "  --json                  end with one JSON line of the figures\n");
}

/* A positive integer in [1, max], or -1. */
static int64_t parse_count(const char *text, int64_t max)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > max) return -1;
    return v;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.devices = 1, .threads = 1, .repeats = 3, .loader_inline = 2};
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n = 0;
        if (!strcmp(arg, "--json")) { a->json = 1; continue; }
        if (!strcmp(arg, "--shard-optimizer")) { a->shard_optimizer = 1; continue; }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout); exit(0); }
        if (arg[0] == '-' && arg[1] == '-') {
            if (!v) { fprintf(stderr, "bench_train: %s needs a value\n", arg); return -1; }
            i++;
            if (!strcmp(arg, "--init-weights")) { a->init_weights = v; continue; }
            if (!strcmp(arg, "--save-init")) { a->save_init = v; continue; }
            if (!strcmp(arg, "--bind-cores") || !strcmp(arg, "--loader-inline")) {
                int w = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? -1 : !strcmp(v, "auto") ? 0 : 2;
                if (w == 2) {
                    fprintf(stderr, "bench_train: %s takes auto, on or off, got '%s'\n", arg, v);
                    return -1;
                }
                *(!strcmp(arg, "--bind-cores") ? &a->bind_cores : &a->loader_inline) = w;
                continue;
            }
            if (!strcmp(arg, "--bucket-mb")) {
                char *end = NULL;
                a->bucket_mb = strtod(v, &end);
                if (end == v || *end || !(a->bucket_mb > 0) || a->bucket_mb > 1e6) {
                    fprintf(stderr, "bench_train: --bucket-mb must be a positive number of MiB, got '%s'\n", v);
                    return -1;
                }
                continue;
            }
            n = parse_count(v, (int64_t)1 << 30);
            if (n < 0) { fprintf(stderr, "bench_train: %s must be a positive integer, got '%s'\n", arg, v); return -1; }
            if (!strcmp(arg, "--batch")) a->batch = n;
            else if (!strcmp(arg, "--steps")) a->steps = n;
            else if (!strcmp(arg, "--devices") && n <= 1024) a->devices = (int)n;
            else if (!strcmp(arg, "--threads-per-device") && n <= 1024) a->threads = (int)n;
            else if (!strcmp(arg, "--repeats") && n <= MAX_REPEATS) a->repeats = (int)n;
            else if (!strcmp(arg, "--prefetch") && n <= 1024) a->prefetch = (int)n;
            else if (!strcmp(arg, "--loader-threads") && n <= 256) a->loader_threads = (int)n;
            else { fprintf(stderr, "bench_train: unknown option or value out of range: %s %s\n", arg, v); return -1; }
            continue;
        }
        if (positional == 0) a->model = arg;
        else if (positional == 1) a->data = arg;
        else { fprintf(stderr, "bench_train: unexpected argument '%s'\n", arg); return -1; }
        positional++;
    }
    if (!a->model || !a->data || !a->batch || !a->steps) {
        fprintf(stderr, "bench_train: MODEL, DATA_DIR, --batch and --steps are required\n");
        return -1;
    }
    if (a->batch % a->devices) {
        fprintf(stderr, "bench_train: --batch %lld is not a multiple of --devices %d\n", (long long)a->batch,
                a->devices);
        return -1;
    }
    return 0;
}

/* Writes the initial weights (loaded, or initialised from INIT_SEED) to path, so that every timed
 * fit — and PyTorch — can start from exactly these values. */
static crew_status make_init_file(crew_model *m, const bench_args *a, const char *path)
{
    crew_status s = a->init_weights ? crew_model_load_weights(m, a->init_weights)
                                    : crew_model_init_params(m, INIT_SEED);
    if (!s) s = crew_model_save_weights(m, path);
    return s;
}

/* One fit of `steps` steps from the initial weights with a fresh optimizer. */
static crew_status one_fit(crew_model *m, const crew_dataset *train, const bench_args *a, const char *init,
                           int64_t steps, crew_fit_result *res)
{
    crew_status s = crew_model_load_weights(m, init);
    crew_compile_options c;
    crew_model_default_compile(m, &c);
    if (!s) s = crew_model_compile(m, &c); /* resets the Adam moments */
    if (s) return s;
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = a->devices;
    o.threads_per_device = a->threads;
    o.batch_per_device = a->batch / a->devices;
    o.global_batch = a->batch;
    o.seed = INIT_SEED;
    o.epochs = 1000000; /* max_steps decides; a run longer than an epoch simply continues */
    o.max_steps = steps;
    o.test = NULL;
    if (a->bucket_mb > 0) o.bucket_mb = a->bucket_mb;
    if (a->prefetch > 0) o.prefetch = a->prefetch;
    if (a->loader_threads > 0) o.loader_threads = a->loader_threads;
    o.shard_optimizer = a->shard_optimizer;
    o.bind_cores = a->bind_cores;
    if (a->loader_inline != 2) o.loader_inline = a->loader_inline;
    else if (a->loader_threads > 0) o.loader_inline = -1; /* threads asked for */
    return crew_model_fit(m, train, &o, res);
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static crew_status run_bench(crew_model *m, const crew_dataset *train, const bench_args *a, const char *init,
                             bench_stats *st)
{
    crew_fit_result res;
    CREW_TRY(one_fit(m, train, a, init, WARMUP_STEPS, &res));
    for (int i = 0; i < a->repeats; i++) {
        double t0 = crew_now();
        CREW_TRY(one_fit(m, train, a, init, a->steps, &res));
        st->fit_wall_s[i] = crew_now() - t0;
        st->sps[i] = res.samples_per_s;
        /* where the steps went, from the fit's own telemetry (the last run's) */
        st->step_ms = res.samples_per_s > 0 ? 1000.0 * (double)a->batch / res.samples_per_s : 0.0;
        st->exposed_fraction = res.comm_exposed_fraction;
        st->hidden_ms = 1000.0 * res.comm_hidden_s;
        st->data_fraction = res.data_fraction;
        if (!a->json) fprintf(stderr, "  run %d: %.1f samples/s\n", i + 1, res.samples_per_s);
    }
    int r = a->repeats;
    double sorted[MAX_REPEATS];
    memcpy(sorted, st->sps, (size_t)r * sizeof sorted[0]);
    qsort(sorted, (size_t)r, sizeof sorted[0], cmp_double);
    st->median = r % 2 ? sorted[r / 2] : 0.5 * (sorted[r / 2 - 1] + sorted[r / 2]);
    st->min = sorted[0];
    st->max = sorted[r - 1];
    return CREW_OK;
}

/* "examples/fashion_mlp.json" -> "fashion_mlp" */
static void model_label(const char *path, char *out, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out, cap, "%s", base);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}

static void report(const bench_args *a, const bench_stats *st)
{
    char label[128];
    model_label(a->model, label, sizeof label);
    double ms = st->median > 0 ? 1000.0 * (double)a->batch / st->median : 0.0;
    double spread = st->median > 0 ? 100.0 * (st->max - st->min) / st->median : 0.0;
    printf("%s: devices %d x %d thread(s), batch %lld (%lld per device), %lld steps, median of %d\n", label,
           a->devices, a->threads, (long long)a->batch, (long long)(a->batch / a->devices), (long long)a->steps,
           a->repeats);
    printf("  %.1f samples/s  %.3f ms/step  (min %.1f, max %.1f, spread %.1f%%)\n", st->median, ms, st->min,
           st->max, spread);
    printf("  per step: all-reduce exposed %.3f ms (%.1f%%), hidden behind backward %.3f ms; data wait %.1f%%\n",
           st->exposed_fraction * st->step_ms, 100.0 * st->exposed_fraction, st->hidden_ms, 100.0 * st->data_fraction);
    if (!a->json) return;
    printf("{\"framework\": \"crew\", \"crew_version\": \"%s\", \"model\": \"%s\", \"devices\": %d, "
           "\"threads_per_device\": %d, \"batch\": %lld, \"steps\": %lld, \"repeats\": %d, "
           "\"samples_per_s\": %.3f, \"ms_per_step\": %.4f, \"samples_per_s_min\": %.3f, "
           "\"samples_per_s_max\": %.3f, \"runs\": [",
           crew_version(), label, a->devices, a->threads, (long long)a->batch, (long long)a->steps, a->repeats,
           st->median, ms, st->min, st->max);
    for (int i = 0; i < a->repeats; i++) printf("%s%.3f", i ? ", " : "", st->sps[i]);
    printf("], \"fit_wall_s\": [");
    for (int i = 0; i < a->repeats; i++) printf("%s%.4f", i ? ", " : "", st->fit_wall_s[i]);
    printf("], \"comm_exposed_ms\": %.4f, \"comm_exposed_fraction\": %.4f, \"comm_hidden_ms\": %.4f, "
           "\"data_fraction\": %.4f}\n",
           st->exposed_fraction * st->step_ms, st->exposed_fraction, st->hidden_ms, st->data_fraction);
}

/* The initial weights go to --save-init, or to a private temporary directory. */
static int init_path(const bench_args *a, char *tmpdir, char *path, size_t cap)
{
    if (a->save_init) {
        snprintf(path, cap, "%s", a->save_init);
        return 0;
    }
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, cap, "%s/bench_train.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "bench_train: cannot create a temporary directory %s: %s\n", tmpdir, strerror(errno));
        return -1;
    }
    snprintf(path, cap, "%s/init.safetensors", tmpdir);
    return 0;
}

int main(int argc, char **argv)
{
    bench_args a;
    if (parse_args(argc, argv, &a)) {
        usage(stderr);
        return 2;
    }
    char tmpdir[4096] = "", init[4096];
    if (init_path(&a, tmpdir, init, sizeof init)) return 1;
    crew_model *m = NULL;
    crew_dataset *train = NULL;
    static bench_stats st;
    char advice[512];
    if (crew_blas_check(advice, sizeof advice)) fprintf(stderr, "bench_train: warning: %s\n", advice);
    crew_status s = crew_model_load_file(a.model, &m);
    if (!s) s = crew_dataset_open(a.data, "train", &train);
    if (!s) s = make_init_file(m, &a, init);
    if (!s) s = run_bench(m, train, &a, init, &st);
    if (tmpdir[0]) {
        unlink(init);
        rmdir(tmpdir);
    }
    if (!s) report(&a, &st);
    else fprintf(stderr, "bench_train: %s\n", crew_status_message(s));
    crew_code code = crew_status_code(s);
    int rc = !s ? 0 : code == CREW_CODE_INVALID_ARGUMENT || code == CREW_CODE_BAD_INPUT ? 2 : 1;
    crew_status_free(s);
    crew_dataset_free(train);
    crew_model_free(m);
    return rc;
}
