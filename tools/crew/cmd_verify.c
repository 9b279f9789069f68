/* cmd_verify.c — crew verify MODEL.json --data DIR --devices KIND:N [--steps K] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew verify MODEL.json --data DIR --devices KIND:N [--steps K] [--batch-per-device B]\n"
    "                   [--global-batch G] [--seed S] [--tolerance T] [--json]\n"
    "\n"
    "Proves that N replicas compute what one computes: runs K steps (default 20) three ways from\n"
    "the same weights and data: N replicas; one replica accumulating the same micro-batches; one\n"
    "replica on the whole global batch. Prints the losses side by side, whether the first two end\n"
    "with bitwise-equal parameters (not required with batch norm, whose statistics N replicas\n"
    "share), and the largest relative parameter difference to the third.\n"
    "That difference is float rounding, which training amplifies; a fourth run (the full batch with\n"
    "each batch's samples in reverse order) measures how much, tensor by tensor, and each tensor may\n"
    "differ by up to 30 times its own figure, at least 1e-3. --tolerance T sets a fixed bound.\n"
    "Exit status 0 only when both hold (1 otherwise). With --json the last line is\n"
    "{\"devices\":N,\"steps\":K,\"bitwise_equal\":..,\"max_rel_diff_accum\":..,\"batch_norm_synced\":..,\n"
    " \"max_rel_diff_full_batch\":..,"
    "\"tolerance\":..,\"rounding_spread\":..,\"decided_by\":\"<layer>.<param>\",\"allowed\":..,\"pass\":..}.\n";

typedef struct verify_args {
    const char *model, *data, *devices; /* devices: checked after MODEL.json and --data */
    int json;
    int64_t steps, batch, global, seed;
    double tol;
} verify_args;

static const cli_flag_spec verify_flags[] = {
    CLI_SWITCH_FLAG(verify_args, "--json", json),
    CLI_STRING_FLAG(verify_args, "--data", data),
    CLI_STRING_FLAG(verify_args, "--devices", devices),
    CLI_INT_FLAG(verify_args, "--steps", steps, 1, 100000),
    CLI_INT_FLAG(verify_args, "--batch-per-device", batch, 1, 1 << 20),
    CLI_INT_FLAG(verify_args, "--global-batch", global, 1, 1 << 30),
    CLI_INT_FLAG(verify_args, "--seed", seed, 0, INT64_MAX),
    CLI_FLOAT_FLAG(verify_args, "--tolerance", tol, 1e-12, 1.0),
};

/* The full-batch verdict: the largest difference, and the tensor nearest its bound. */
static void print_full_batch_verdict(const crew_verify_result *r)
{
    printf("N replicas vs 1 replica on the full batch: max relative difference %.3g: %s\n", r->max_rel_diff_full_batch,
           r->full_batch_ok ? "ok" : "TOO LARGE");
    if (r->fixed_tolerance) {
        printf("  every tensor within the tolerance %.3g; nearest: %s, %.3g\n", r->tolerance, r->decided_by,
               r->decided_by_diff);
        return;
    }
    printf("  rounding alone (the full batch, samples in reverse order) moves tensors by up to %.3g;\n"
           "  each may differ by 30 times its own figure, at least %.3g; nearest its bound: %s, %.3g of %.3g\n",
           r->rounding_spread, r->tolerance, r->decided_by, r->decided_by_diff, r->allowed);
}

int cli_verify(int argc, char **argv)
{
    verify_args a = {.steps = 20};
    int64_t n = 2;
    int parsed = cli_parse_args("verify", usage_text, verify_flags, CLI_COUNT(verify_flags), argc, argv, &a, &a.model);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!a.model) return cli_usage_error("verify", "missing MODEL.json");
    if (!a.data) return cli_usage_error("verify", "missing --data DIR");
    char kind[32] = "cpu";
    const crew_process_group *g = cli_group(); /* under mpirun: --devices counts each process's replicas */
    if (g) n = 1;
    if (a.devices && !cli_parse_devices("verify", a.devices, kind, sizeof kind, &n)) return 2;
    int rc = g ? cli_agree_run("verify", g, argc, argv, a.model, a.data, NULL) : 0;
    if (rc) return rc;
    const int lead = crew_group_rank(g) == 0;

    crew_model *m = NULL;
    crew_dataset *train = NULL;
    crew_verify_options o;
    crew_verify_options_init(&o);
    o.device_kind = kind;
    o.devices = (int)n;
    o.steps = a.steps;
    o.batch_per_device = a.batch;
    o.global_batch = a.global;
    o.seed = (uint64_t)a.seed;
    o.tolerance = a.tol;
    o.group = g;
    crew_verify_result r = {0};
    r.losses = calloc((size_t)a.steps * 3, sizeof(float));
    cli_warn_slow_blas("verify");
    crew_status s = r.losses ? crew_model_load_file(a.model, &m) : NULL;
    if (!r.losses) {
        fprintf(stderr, "crew verify: out of memory\n");
        return 1;
    }
    if (!s) s = crew_dataset_open(a.data, "train", &train);
    if (!s) s = crew_model_verify(m, train, &o, &r);
    if (s) {
        rc = cli_fail("verify", s);
    } else if (!lead) {
        rc = 0; /* the verdict is rank 0's */
    } else {
        if (g)
            printf("verify %s on %d MPI ranks x %s:%lld = %d replicas: %lld steps, global batch %lld\n", a.model,
                   crew_group_size(g), kind, (long long)n, r.devices, (long long)r.steps, (long long)r.global_batch);
        else
            printf("verify %s on %s:%d: %lld steps, global batch %lld\n", a.model, kind, r.devices, (long long)r.steps,
                   (long long)r.global_batch);
        printf("%6s %16s %24s %22s\n", "step", "N replicas", "1 replica accumulating", "1 replica full batch");
        for (int64_t k = 0; k < r.steps; k++)
            printf("%6lld %16.7f %24.7f %22.7f\n", (long long)k + 1, (double)r.losses[k * 3], (double)r.losses[k * 3 + 1],
                   (double)r.losses[k * 3 + 2]);
        if (r.batch_norm_synced && !r.bitwise_equal)
            printf("N replicas vs 1 replica accumulating: not bitwise equal (max relative difference %.3g), as expected\n"
                   "  with batch norm: N replicas normalise over the whole global batch (synchronised), one replica\n"
                   "  accumulating over each micro-batch, so N replicas are held to the full batch alone\n",
                   r.max_rel_diff_accum);
        else
            printf("N replicas vs 1 replica accumulating: %s (max relative difference %.3g)\n",
                   r.bitwise_equal ? "bitwise equal" : "NOT bitwise equal", r.max_rel_diff_accum);
        print_full_batch_verdict(&r);
        printf("%s\n", r.pass ? "PASS" : "FAIL");
        if (a.json) {
            char acc[32], b[32], t[32], spread[32], allowed[32];
            printf("{\"devices\":%d,\"steps\":%lld,\"bitwise_equal\":%s,\"max_rel_diff_accum\":%s,"
                   "\"batch_norm_synced\":%s,\"max_rel_diff_full_batch\":%s,\"tolerance\":%s,\"rounding_spread\":%s,"
                   "\"decided_by\":",
                   r.devices, (long long)r.steps, r.bitwise_equal ? "true" : "false",
                   cli_json_number(r.max_rel_diff_accum, acc, sizeof acc), r.batch_norm_synced ? "true" : "false",
                   cli_json_number(r.max_rel_diff_full_batch, b, sizeof b), cli_json_number(r.tolerance, t, sizeof t),
                   r.fixed_tolerance ? "null" : cli_json_number(r.rounding_spread, spread, sizeof spread));
            crew_json_write_string(stdout, r.decided_by);
            printf(",\"allowed\":%s,\"pass\":%s}\n", cli_json_number(r.allowed, allowed, sizeof allowed),
                   r.pass ? "true" : "false");
        }
        rc = r.pass ? 0 : 1;
    }
    free(r.losses);
    crew_dataset_free(train);
    crew_model_free(m);
    return rc;
}
