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

int cli_bench_data(int argc, char **argv)
{
    const char *dir = NULL;
    int json = 0;
    int64_t threads = 0, batch = 128, steps = 200;
    crew_augment_options aug = {0};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) json = 1;
        else if ((r = cli_flag(argc, argv, &i, "--threads", &v))) {
            if (r > 0 && !cli_parse_int("bench-data", "--threads", v, 1, 256, &threads)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--batch", &v))) {
            if (r > 0 && !cli_parse_int("bench-data", "--batch", v, 1, 1 << 20, &batch)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--steps", &v))) {
            if (r > 0 && !cli_parse_int("bench-data", "--steps", v, 1, 1 << 30, &steps)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--augment", &v))) {
            if (r > 0 && !cli_parse_augment("bench-data", v, &aug)) return 2;
        } else if (argv[i][0] == '-') return cli_usage_error("bench-data", "unknown option '%s'", argv[i]);
        else if (!dir) dir = argv[i];
        else return cli_usage_error("bench-data", "unexpected argument '%s'", argv[i]);
        if (r < 0) return cli_usage_error("bench-data", "%s needs a value", argv[i]);
    }
    if (!dir) return cli_usage_error("bench-data", "missing DIR");
    crew_dataset *d = NULL;
    crew_status s = crew_dataset_open(dir, "train", &d);
    if (s) return cli_fail("bench-data", s);
    int cores = crew_cpu_cores();
    int64_t ks[16], nk = 0;
    if (threads)
        ks[nk++] = threads;
    else
        for (int64_t k = 1; k <= 2 * cores && nk < 16; k *= 2) ks[nk++] = k;
    double rates[16];
    printf("%8s %14s\n", "threads", "samples/s");
    for (int64_t i = 0; i < nk && !s; i++) {
        s = crew_bench_loader(d, (int)ks[i], 2 * (int)ks[i], &aug, batch, steps, &rates[i]);
        if (!s) printf("%8lld %14.0f\n", (long long)ks[i], rates[i]);
    }
    crew_dataset_free(d);
    if (s) return cli_fail("bench-data", s);
    if (json) {
        printf("{\"batch\":%lld,\"results\":[", (long long)batch);
        for (int64_t i = 0; i < nk; i++)
            printf("%s{\"threads\":%lld,\"samples_per_s\":%.1f}", i ? "," : "", (long long)ks[i], rates[i]);
        printf("]}\n");
    }
    return 0;
}
