/* cmd_verify.c — crew verify MODEL.json --data DIR --devices cpu:N [--steps K] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew verify MODEL.json --data DIR --devices cpu:N [--steps K] [--batch-per-device B]\n"
    "                   [--global-batch G] [--seed S] [--tolerance T] [--json]\n"
    "\n"
    "Proves that N replicas compute what one computes: runs K steps (default 20) three ways from\n"
    "the same weights and data: N replicas; one replica accumulating the same micro-batches; one\n"
    "replica on the whole global batch. Prints the losses side by side, whether the first two end\n"
    "with bitwise-equal parameters, and the largest relative parameter difference to the third.\n"
    "Exit status 0 only when both hold (1 otherwise). With --json the last line is\n"
    "{\"devices\":N,\"steps\":K,\"bitwise_equal\":..,\"max_rel_diff_accum\":..,\"max_rel_diff_full_batch\":..,\n"
    " \"tolerance\":..,\"pass\":..}.\n";

int cli_verify(int argc, char **argv)
{
    const char *model = NULL, *data = NULL, *devices = NULL;
    int json = 0;
    int64_t steps = 20, batch = 0, global = 0, seed = 0, n = 2;
    double tol = 0.0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) json = 1;
        else if ((r = cli_flag(argc, argv, &i, "--data", &v))) data = v;
        else if ((r = cli_flag(argc, argv, &i, "--devices", &v))) devices = v;
        else if ((r = cli_flag(argc, argv, &i, "--steps", &v))) {
            if (r > 0 && !cli_parse_int("verify", "--steps", v, 1, 100000, &steps)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--batch-per-device", &v))) {
            if (r > 0 && !cli_parse_int("verify", "--batch-per-device", v, 1, 1 << 20, &batch)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--global-batch", &v))) {
            if (r > 0 && !cli_parse_int("verify", "--global-batch", v, 1, 1 << 30, &global)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--seed", &v))) {
            if (r > 0 && !cli_parse_int("verify", "--seed", v, 0, INT64_MAX, &seed)) return 2;
        } else if ((r = cli_flag(argc, argv, &i, "--tolerance", &v))) {
            if (r > 0 && !cli_parse_float("verify", "--tolerance", v, 1e-12, 1.0, &tol)) return 2;
        } else if (argv[i][0] == '-') return cli_usage_error("verify", "unknown option '%s'", argv[i]);
        else if (!model) model = argv[i];
        else return cli_usage_error("verify", "unexpected argument '%s'", argv[i]);
        if (r < 0) return cli_usage_error("verify", "%s needs a value", argv[i]);
    }
    if (!model) return cli_usage_error("verify", "missing MODEL.json");
    if (!data) return cli_usage_error("verify", "missing --data DIR");
    if (devices && !cli_parse_devices("verify", devices, &n)) return 2;

    crew_model *m = NULL;
    crew_dataset *train = NULL;
    crew_verify_options o = {.devices = (int)n, .steps = steps, .batch_per_device = batch, .global_batch = global,
                             .seed = (uint64_t)seed, .tolerance = tol};
    crew_verify_result r = {0};
    r.losses = calloc((size_t)steps * 3, sizeof(float));
    cli_warn_slow_blas("verify");
    crew_status s = r.losses ? crew_model_load_file(model, &m) : NULL;
    if (!r.losses) {
        fprintf(stderr, "crew verify: out of memory\n");
        return 1;
    }
    if (!s) s = crew_dataset_open(data, "train", &train);
    if (!s) s = crew_model_verify(m, train, &o, &r);
    int rc;
    if (s) {
        rc = cli_fail("verify", s);
    } else {
        printf("verify %s on cpu:%d: %lld steps, global batch %lld\n", model, r.devices, (long long)r.steps,
               (long long)r.global_batch);
        printf("%6s %16s %24s %22s\n", "step", "N replicas", "1 replica accumulating", "1 replica full batch");
        for (int64_t k = 0; k < r.steps; k++)
            printf("%6lld %16.7f %24.7f %22.7f\n", (long long)k + 1, (double)r.losses[k * 3], (double)r.losses[k * 3 + 1],
                   (double)r.losses[k * 3 + 2]);
        printf("N replicas vs 1 replica accumulating: %s (max relative difference %.3g)\n",
               r.bitwise_equal ? "bitwise equal" : "NOT bitwise equal", r.max_rel_diff_accum);
        printf("N replicas vs 1 replica on the full batch: max relative difference %.3g (tolerance %.3g): %s\n",
               r.max_rel_diff_full_batch, r.tolerance, r.max_rel_diff_full_batch <= r.tolerance ? "ok" : "TOO LARGE");
        printf("%s\n", r.pass ? "PASS" : "FAIL");
        if (json) {
            char a[32], b[32], t[32];
            printf("{\"devices\":%d,\"steps\":%lld,\"bitwise_equal\":%s,\"max_rel_diff_accum\":%s,"
                   "\"max_rel_diff_full_batch\":%s,\"tolerance\":%s,\"pass\":%s}\n",
                   r.devices, (long long)r.steps, r.bitwise_equal ? "true" : "false",
                   cli_json_number(r.max_rel_diff_accum, a, sizeof a), cli_json_number(r.max_rel_diff_full_batch, b, sizeof b),
                   cli_json_number(r.tolerance, t, sizeof t), r.pass ? "true" : "false");
        }
        rc = r.pass ? 0 : 1;
    }
    free(r.losses);
    crew_dataset_free(train);
    crew_model_free(m);
    return rc;
}
