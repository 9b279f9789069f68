/* cmd_bench_data.c — crew bench-data DIR: how fast the loader alone prepares batches. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew bench-data DIR [--threads K] [--batch B] [--steps S] [--augment LIST] [--json]\n"
    "\n"
    "Measures the samples per second the loader can prepare from DIR's training split (gather,\n"
    "normalise, augment), with no model: for K = 1, 2, 4, ... up to twice the cores, or for the K\n"
    "given. Compare with the samples per second a training run consumes: a loader that cannot\n"
    "keep ahead makes the replicas wait. With --json the last line is\n"
    "{\"batch\":B,\"results\":[{\"threads\":K,\"samples_per_s\":X},...]}.\n";

typedef struct bench_args {
    const char *dir;
    int json;
    int64_t threads, batch, steps; /* threads 0: 1, 2, 4, ... */
    crew_augment_options aug;
} bench_args;

static int parse_augment(const char *verb, const char *v, void *args)
{
    return cli_parse_augment(verb, v, &((bench_args *)args)->aug);
}

static const cli_flag_spec bench_flags[] = {
    CLI_SWITCH_FLAG(bench_args, "--json", json),
    CLI_INT_FLAG(bench_args, "--threads", threads, 1, 256),
    CLI_INT_FLAG(bench_args, "--batch", batch, 1, 1 << 20),
    CLI_INT_FLAG(bench_args, "--steps", steps, 1, 1 << 30),
    CLI_CUSTOM_FLAG("--augment", parse_augment),
};

int cli_bench_data(int argc, char **argv)
{
    bench_args a = {.batch = 128, .steps = 200};
    int parsed = cli_parse_args("bench-data", usage_text, bench_flags, CLI_COUNT(bench_flags), argc, argv, &a, &a.dir);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!a.dir) return cli_usage_error("bench-data", "missing DIR");
    crew_dataset *d = NULL;
    crew_status s = crew_dataset_open(a.dir, "train", &d);
    if (!s) cli_note_dataset("bench-data", d);
    if (s) return cli_fail("bench-data", s);
    int cores = crew_cpu_cores();
    int64_t ks[16], nk = 0;
    if (a.threads)
        ks[nk++] = a.threads;
    else
        for (int64_t k = 1; k <= 2 * cores && nk < 16; k *= 2) ks[nk++] = k;
    double rates[16];
    printf("%8s %14s\n", "threads", "samples/s");
    for (int64_t i = 0; i < nk && !s; i++) {
        s = crew_bench_loader(d, (int)ks[i], 2 * (int)ks[i], &a.aug, a.batch, a.steps, &rates[i]);
        if (!s) printf("%8lld %14.0f\n", (long long)ks[i], rates[i]);
    }
    crew_dataset_free(d);
    if (s) return cli_fail("bench-data", s);
    if (a.json) {
        printf("{\"batch\":%lld,\"results\":[", (long long)a.batch);
        for (int64_t i = 0; i < nk; i++)
            printf("%s{\"threads\":%lld,\"samples_per_s\":%.1f}", i ? "," : "", (long long)ks[i], rates[i]);
        printf("]}\n");
    }
    return 0;
}
