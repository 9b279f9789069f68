/* cmd_verify.c — crew verify MODEL.json --data DIR --devices KIND:N [--steps K] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew verify MODEL.json --data DIR --devices KIND:N [--steps K] [--batch-per-device B]\n"
    "                   [--global-batch G] [--seed S] [--tolerance T] [--deadline S] [--json]\n"
    "                   [--pipeline K [--schedule 1f1b|gpipe] [--stages RANGES] [--micro-batches M]]\n"
    "                   [--precision fp32|bf16] [--conv auto|im2col|library|WAY,...] [--against KIND]\n"
    "                   [--shard-optimizer] [--attention store|recompute] [--samples N|all]\n"
    "\n"
    "Proves that N replicas compute what one computes, from the same weights and data, K steps\n"
    "(default 20):\n"
    "  paths: N replicas with 1 and with 2 micro-batches per replica, each with the run's gradient\n"
    "    buckets and with several small ones, with the optimizer state sharded, and with the\n"
    "    parameters sharded (ZeRO-3, in small units; not for LAMB and LARS); each must end\n"
    "    bitwise equal (parameters, optimizer moments) to one replica accumulating the same\n"
    "    micro-batches. Every replica's values are compared by hash after every step and value by\n"
    "    value at the end. With batch norm the paths normalise each micro-batch alone.\n"
    "  first step: the loss and every gradient of N replicas against one replica on the whole\n"
    "    global batch, within float32 summation's bound 8 u n S (u = 2^-24, n the terms of the sum,\n"
    "    S the layer's largest gradient).\n"
    "  trajectory: N replicas (synchronised batch norm) against the whole batch after K steps. That\n"
    "    difference is rounding, which training amplifies; two more runs (the full batch with each\n"
    "    batch's samples reversed, and the global batch in other blocks: 2N replicas of B/2 or N/2\n"
    "    of 2B; both held to the first-step bound) measure how much, tensor by tensor, and each\n"
    "    tensor may differ by up to 30 times its own figure, at least 1e-3. The replicas of the\n"
    "    second may move a tensor by at most 10 times what the same blocks do without replicas (the\n"
    "    full batch, every GEMM summed in those blocks) or the reversed samples do: beyond, they\n"
    "    share a bug with the N replicas, and verify FAILs. --tolerance T sets a fixed bound instead.\n"
    "The data: by default the first whole global batches of the dataset that make the K steps\n"
    "cross two epoch boundaries (--samples N: the first N; --samples all: every sample).\n"
    "--shard-optimizer, --attention, --precision and --conv apply to every run (crew train's).\n"
    "With --against KIND (a GPU against the CPU: --devices cuda:2 --against cpu) the full-batch run\n"
    "is made once more on one device of that kind and held to this kind's as the N replicas are:\n"
    "its first step within the same bound, its trajectory within every tensor's rounding bound.\n"
    "With --pipeline K the N devices hold N / K replicas of a K-stage pipeline (crew train's\n"
    "flags, docs/PIPELINE.md), each with M micro-batches per step [K]; they are held to the same\n"
    "one-device references, so the paths prove the pipeline bitwise equal to one device\n"
    "accumulating the same micro-batches.\n"
    "A run that stops (a replica missing its deadline, replicas that diverged, NaN) is a FAIL that\n"
    "names it. --deadline S: seconds a replica may wait [20 x the slowest reference step, >= 10].\n"
    "Exit status 0 only when everything holds (1 otherwise). With --json the last line is one\n"
    "JSON object: devices, steps, global_batch, accumulation, buckets, paths [{k, buckets,\n"
    "global_batch, sharded, shard, bitwise_equal, max_rel_diff}], replicas_compared, replica_checks, bitwise_equal,\n"
    "batch_norm_synced, first_step_ok, first_step_ratio, first_step_decided_by, reference_ok,\n"
    "reference_replicas, reference_batch (0: no reference in other blocks), own_blocks_batch\n"
    "(0: no reference in the replicas' blocks), own_blocks_exact,\n"
    "max_rel_diff_full_batch, tolerance, rounding_spread, decided_by, decided_by_diff,\n"
    "decided_by_spread, allowed, other_blocks_ok, immune_spread, other_blocks_decided_by,\n"
    "other_blocks_diff, other_blocks_allowed, other_blocks_exact, samples, dataset_samples,\n"
    "steps_per_epoch, epochs_crossed, deadline_s, failure, pass.\n";

typedef struct verify_args {
    const char *model, *data, *devices; /* devices: checked after MODEL.json and --data */
    int json;
    int64_t steps, batch, global, seed;
    double tol, deadline;
    cli_pipeline pipe;
    int precision;
    cli_conv conv;
    const char *against;
    int shard_optimizer, attention;
    const char *samples;
} verify_args;

static int parse_conv(const char *verb, const char *v, void *args)
{
    return cli_parse_conv(verb, v, &((verify_args *)args)->conv);
}

static const cli_flag_spec verify_flags[] = {
    CLI_SWITCH_FLAG(verify_args, "--json", json),
    CLI_STRING_FLAG(verify_args, "--data", data),
    CLI_STRING_FLAG(verify_args, "--devices", devices),
    CLI_INT_FLAG(verify_args, "--steps", steps, 1, 100000),
    CLI_INT_FLAG(verify_args, "--batch-per-device", batch, 1, 1 << 20),
    CLI_INT_FLAG(verify_args, "--global-batch", global, 1, 1 << 30),
    CLI_INT_FLAG(verify_args, "--seed", seed, 0, INT64_MAX),
    CLI_FLOAT_FLAG(verify_args, "--tolerance", tol, 1e-12, 1.0),
    CLI_FLOAT_FLAG(verify_args, "--deadline", deadline, 0.1, 86400.0),
    CLI_INT_FLAG(verify_args, "--pipeline", pipe.stages, 1, CREW_MAX_PIPELINE_STAGES),
    CLI_CHOICE_FLAG(verify_args, "--schedule", pipe.schedule, cli_schedules),
    CLI_STRING_FLAG(verify_args, "--stages", pipe.split),
    CLI_INT_FLAG(verify_args, "--micro-batches", pipe.micro_batches, 1, 1 << 20),
    CLI_CHOICE_FLAG(verify_args, "--precision", precision, cli_precisions),
    CLI_CUSTOM_FLAG("--conv", parse_conv),
    CLI_STRING_FLAG(verify_args, "--against", against),
    CLI_SWITCH_FLAG(verify_args, "--shard-optimizer", shard_optimizer),
    CLI_CHOICE_FLAG(verify_args, "--attention", attention, cli_attention_ways),
    CLI_STRING_FLAG(verify_args, "--samples", samples),
};

/* The paths: each N-replica run against one replica accumulating the same micro-batches. */
static void print_paths(const crew_verify_result *r)
{
    printf("N replicas vs 1 replica accumulating the same micro-batches (parameters, optimizer moments%s):\n",
           r->batch_norm_synced ? "" : ", state");
    for (int i = 0; i < r->paths; i++) {
        const crew_verify_path *p = &r->path[i];
        printf("  %d micro-batch%s per replica, %d %s%s, global batch %lld%s: %s", p->accumulation,
               p->accumulation == 1 ? "" : "es", p->buckets, p->sharded >= CREW_SHARD_GRADIENTS ? "unit" : "gradient bucket",
               p->buckets == 1 ? "" : "s", (long long)p->global_batch,
               p->sharded == CREW_SHARD_PARAMETERS ? ", parameters sharded (ZeRO-3)"
               : p->sharded == CREW_SHARD_GRADIENTS ? ", gradients sharded (ZeRO-2)"
               : p->sharded ? ", optimizer sharded" : "",
               p->bitwise_equal ? "bitwise equal\n" : "NOT bitwise equal");
        if (!p->bitwise_equal) printf(" (max relative difference %.3g)\n", p->max_rel_diff);
    }
    if (r->batch_norm_synced)
        printf("  (batch norm: these runs normalise each micro-batch alone, as one replica accumulating does;\n"
               "  N replicas with synchronised statistics are held to the full batch below)\n");
    printf("every replica's parameters, state and optimizer moments compared after every step (by hash) and at the end\n"
           "  (value by value): %d replicas, %lld checks, all equal\n", r->replicas_compared,
           (long long)r->replica_checks);
}

/* The rounding references, as the verdicts name them. */
static const char *references(const crew_verify_result *r, char *buf, size_t len)
{
    int at = snprintf(buf, len, "samples reversed");
    if (r->reference_replicas && at >= 0 && (size_t)at < len)
        at += snprintf(buf + at, len - (size_t)at, "; %d replicas of %lld", r->reference_replicas,
                       (long long)r->reference_batch);
    if (r->own_blocks_batch && at >= 0 && (size_t)at < len)
        snprintf(buf + at, len - (size_t)at, "; 1 replica in blocks of %lld", (long long)r->own_blocks_batch);
    return buf;
}

/* The first step: the largest difference against its bound. */
static void print_first_step(const crew_verify_result *r)
{
    char refs[128];
    printf("first step, loss and every gradient vs 1 replica on the full batch (bound 8 u n S): %s\n"
           "  largest: %s, %.3g of %.3g (%.3g of its bound); the loss of N replicas %.3g from it (relative)\n",
           r->first_step_ok && r->reference_ok ? "ok" : "TOO LARGE", r->first_step_decided_by, r->first_step_diff,
           r->first_step_allowed, r->first_step_ratio, r->first_step_loss_diff);
    if (!r->fixed_tolerance)
        printf("  the rounding references (%s) within it too: %s\n", references(r, refs, sizeof refs),
               r->reference_ok ? "yes" : "NO: something bound to a sample moved with its row");
}

/* The full-batch verdict: the largest difference, and the tensor nearest its bound. */
static void print_full_batch_verdict(const crew_verify_result *r)
{
    printf("after %lld steps, N replicas vs 1 replica on the full batch: max relative difference %.3g: %s\n",
           (long long)r->steps, r->max_rel_diff_full_batch, r->full_batch_ok ? "ok" : "TOO LARGE");
    if (r->fixed_tolerance) {
        printf("  every tensor within the tolerance %.3g; nearest: %s, %.3g\n", r->tolerance, r->decided_by,
               r->decided_by_diff);
        return;
    }
    char refs[128];
    printf("  rounding alone (%s) moves tensors by up to %.3g;\n"
           "  each may differ by 30 times its own figure, at least %.3g; nearest its bound: %s, %.3g of %.3g\n",
           references(r, refs, sizeof refs), r->rounding_spread, r->tolerance, r->decided_by, r->decided_by_diff,
           r->allowed);
    if (r->reference_replicas)
        printf("  the %d replicas of %lld within 10 times what the same blocks do without replicas (the full batch, every\n"
               "  GEMM summed in blocks of %lld, and the samples reversed: up to %.3g): %s; nearest: %s, %.3g of %.3g\n",
               r->reference_replicas, (long long)r->reference_batch, (long long)r->reference_batch, r->immune_spread,
               r->other_blocks_ok ? "yes" : "NO: they moved by more than rounding, a bug they share with the N replicas",
               r->other_blocks_decided_by, r->other_blocks_diff, r->other_blocks_allowed);
    if (r->own_blocks_batch)
        printf(r->own_blocks_exact
                   ? "  (1 replica in blocks of %lld, without replicas, ended with the N replicas' bits)\n"
                   : "  (1 replica in blocks of %lld, without replicas, is a stand-in for the N replicas, not their bits)\n",
               (long long)r->own_blocks_batch);
    if (r->reference_replicas)
        printf(r->other_blocks_exact
                   ? "  (the blocks without replicas ended with the replicas' bits: an exact stand-in for them)\n"
                   : "  (the blocks without replicas are a stand-in, not the replicas' bits: some layer sums over the\n"
                     "  batch in other blocks, as a convolution over output positions or a GPT over tokens;\n"
                     "  docs/VERIFY.md)\n");
}

/* Which samples the runs trained on. */
static void print_data(const crew_verify_result *r)
{
    if (r->samples < r->dataset_samples)
        printf("data: the first %lld of the dataset's %lld samples, %lld steps an epoch: the %lld steps cross %d epoch "
               "boundar%s (--samples all: every sample)\n", (long long)r->samples, (long long)r->dataset_samples,
               (long long)r->steps_per_epoch, (long long)r->steps, r->epochs_crossed, r->epochs_crossed == 1 ? "y" : "ies");
    else
        printf("data: all %lld samples, %lld steps an epoch: the %lld steps cross %d epoch boundar%s\n",
               (long long)r->samples, (long long)r->steps_per_epoch, (long long)r->steps, r->epochs_crossed,
               r->epochs_crossed == 1 ? "y" : "ies");
}

static void print_json(const crew_verify_result *r)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], b8[32];
    printf("{\"devices\":%d,\"steps\":%lld,\"global_batch\":%lld,\"accumulation\":%d,\"buckets\":%d,\"paths\":[", r->devices,
           (long long)r->steps, (long long)r->global_batch, r->accumulation, r->buckets);
    for (int i = 0; i < r->paths; i++)
        printf("%s{\"k\":%d,\"buckets\":%d,\"global_batch\":%lld,\"sharded\":%s,\"shard\":\"%s\",\"bitwise_equal\":%s,"
               "\"max_rel_diff\":%s}",
               i ? "," : "", r->path[i].accumulation, r->path[i].buckets, (long long)r->path[i].global_batch,
               r->path[i].sharded ? "true" : "false", crew_shard_level_name(r->path[i].sharded),
               r->path[i].bitwise_equal ? "true" : "false",
               cli_json_number(r->path[i].max_rel_diff, b1, sizeof b1));
    printf("],\"replicas_compared\":%d,\"replica_checks\":%lld,\"bitwise_equal\":%s,\"max_rel_diff_accum\":%s,"
           "\"batch_norm_synced\":%s,\"first_step_ok\":%s,\"first_step_ratio\":%s,\"first_step_decided_by\":",
           r->replicas_compared, (long long)r->replica_checks, r->bitwise_equal ? "true" : "false",
           cli_json_number(r->max_rel_diff_accum, b2, sizeof b2), r->batch_norm_synced ? "true" : "false",
           r->first_step_ok ? "true" : "false", cli_json_number(r->first_step_ratio, b3, sizeof b3));
    crew_json_write_string(stdout, r->first_step_decided_by);
    printf(",\"reference_ok\":%s,\"reference_replicas\":%d,\"reference_batch\":%lld,\"own_blocks_batch\":%lld,"
           "\"own_blocks_exact\":%s,\"max_rel_diff_full_batch\":%s,\"tolerance\":%s,\"rounding_spread\":%s,\"decided_by\":",
           r->reference_ok ? "true" : "false", r->reference_replicas, (long long)r->reference_batch,
           (long long)r->own_blocks_batch, r->own_blocks_exact ? "true" : "false",
           cli_json_number(r->max_rel_diff_full_batch, b4, sizeof b4),
           cli_json_number(r->tolerance, b5, sizeof b5),
           r->fixed_tolerance ? "null" : cli_json_number(r->rounding_spread, b6, sizeof b6));
    crew_json_write_string(stdout, r->decided_by);
    char b9[32], b10[32];
    printf(",\"decided_by_diff\":%s,\"decided_by_spread\":%s,\"allowed\":%s,",
           cli_json_number(r->decided_by_diff, b9, sizeof b9), cli_json_number(r->decided_by_spread, b10, sizeof b10),
           cli_json_number(r->allowed, b7, sizeof b7));
    char b13[32], b14[32], b15[32];
    printf("\"other_blocks_ok\":%s,\"immune_spread\":%s,\"other_blocks_decided_by\":",
           r->other_blocks_ok ? "true" : "false",
           r->fixed_tolerance ? "null" : cli_json_number(r->immune_spread, b13, sizeof b13));
    crew_json_write_string(stdout, r->other_blocks_decided_by);
    printf(",\"other_blocks_diff\":%s,\"other_blocks_allowed\":%s,\"other_blocks_exact\":%s,\"samples\":%lld,"
           "\"dataset_samples\":%lld,\"steps_per_epoch\":%lld,\"epochs_crossed\":%d,\"deadline_s\":%s,\"failure\":",
           cli_json_number(r->other_blocks_diff, b14, sizeof b14), cli_json_number(r->other_blocks_allowed, b15, sizeof b15),
           r->other_blocks_exact ? "true" : "false", (long long)r->samples, (long long)r->dataset_samples,
           (long long)r->steps_per_epoch, r->epochs_crossed, cli_json_number(r->deadline_s, b8, sizeof b8));
    if (r->failure[0])
        crew_json_write_string(stdout, r->failure);
    else
        printf("null");
    if (r->against_kind[0]) {
        char b11[32], b12[32];
        printf(",\"against\":{\"kind\":");
        crew_json_write_string(stdout, r->against_kind);
        printf(",\"first_step_ok\":%s,\"first_step_ratio\":%s,\"ok\":%s,\"max_rel_diff\":%s,\"decided_by\":",
               r->against_first_step_ok ? "true" : "false", cli_json_number(r->against_first_step_ratio, b11, sizeof b11),
               r->against_ok ? "true" : "false", cli_json_number(r->against_max_rel_diff, b12, sizeof b12));
        crew_json_write_string(stdout, r->against_decided_by);
        printf("}");
    }
    printf(",\"pass\":%s}\n", r->pass ? "true" : "false");
}

/* --against KIND: the full-batch run on the other kind against this kind's. */
static void print_against(const crew_verify_result *r)
{
    printf("1 replica full batch on %s vs on this kind, the same steps:\n"
           "  first step within the bound: %s (largest: %s, %.3g of its bound)\n"
           "  after %lld steps: max relative difference %.3g: %s; nearest its bound: %s, %.3g of %.3g\n",
           r->against_kind, r->against_first_step_ok ? "yes" : "NO", r->against_first_step_decided_by,
           r->against_first_step_ratio, (long long)r->steps, r->against_max_rel_diff, r->against_ok ? "ok" : "TOO LARGE",
           r->against_decided_by, r->against_decided_by_diff, r->against_allowed);
}

int cli_verify(int argc, char **argv)
{
    verify_args a = {.steps = 20, .pipe = {.schedule = -1}, .conv = {.way = -1}};
    int64_t n = 2;
    int parsed = cli_parse_args("verify", usage_text, verify_flags, CLI_COUNT(verify_flags), argc, argv, &a, &a.model);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!a.model) return cli_usage_error("verify", "missing MODEL.json");
    if (!a.data) return cli_usage_error("verify", "missing --data DIR");
    char kind[32] = "cpu";
    const crew_process_group *g = cli_group(); /* under mpirun: --devices counts each process's replicas */
    if (g) n = 1;
    if (a.devices && !cli_parse_devices("verify", a.devices, kind, sizeof kind, &n)) return 2;
    int64_t replicas = n;
    if (!cli_pipeline_replicas("verify", &a.pipe, n, 1, &replicas)) return 2; /* a pipeline in one process */
    int rc = g ? cli_agree_run("verify", g, argc, argv, a.model, a.data, NULL) : 0;
    if (rc) return rc;
    const int lead = crew_group_rank(g) == 0;

    crew_model *m = NULL;
    crew_dataset *train = NULL;
    crew_verify_options o;
    crew_verify_options_init(&o);
    o.device_kind = kind;
    o.devices = (int)replicas;
    o.steps = a.steps;
    o.batch_per_device = a.batch;
    o.global_batch = a.global;
    o.seed = (uint64_t)a.seed;
    o.tolerance = a.tol;
    o.deadline_s = a.deadline;
    o.group = g;
    o.precision = a.precision;
    o.against_kind = a.against;
    o.shard_optimizer = a.shard_optimizer;
    o.attention_recompute = a.attention;
    if (a.samples && !strcmp(a.samples, "all")) {
        o.samples = -1;
    } else if (a.samples) {
        char *end;
        long long v = strtoll(a.samples, &end, 10);
        if (end == a.samples || *end || v < 1) return cli_usage_error("verify", "--samples takes a count of samples or 'all'");
        o.samples = v;
    }
    crew_verify_result r = {0};
    r.losses = calloc((size_t)a.steps * 3, sizeof(float));
    cli_warn_slow_blas("verify");
    crew_status s = r.losses ? crew_model_load_file(a.model, &m) : NULL;
    if (!r.losses) {
        fprintf(stderr, "crew verify: out of memory\n");
        return 1;
    }
    if (!s) s = crew_dataset_open_for(m, a.data, "train", &train);
    if (!s && lead) cli_note_dataset("verify", train);
    if (!s && (a.pipe.stages > 1 || a.pipe.split)) { /* the pipeline's stages, schedule and micro-batches */
        crew_fit_options fo;
        crew_model_default_fit(m, &fo);
        fo.devices = o.devices;
        if (a.batch) fo.batch_per_device = a.batch;
        fo.global_batch = a.global;
        cli_pipeline_apply(&a.pipe, a.global > 0, 1, &fo);
        o.pipeline_stages = fo.pipeline_stages;
        o.pipeline_schedule = fo.pipeline_schedule;
        o.pipeline_split = fo.pipeline_split;
        o.global_batch = fo.global_batch;
    }
    crew_conv_choice *conv = NULL; /* --conv auto's measurements: every run takes their ways */
    if (!s) {
        crew_fit_options fo;
        crew_model_default_fit(m, &fo);
        fo.device_kind = kind;
        fo.precision = a.precision;
        if (a.batch) fo.batch_per_device = a.batch;
        rc = cli_conv_apply("verify", &a.conv, m, lead, &fo, &conv);
        o.conv = fo.conv;
        o.conv_choice = fo.conv_choice;
        if (conv) cli_print_conv_choice(conv, fo.batch_per_device);
    }
    if (!s && !rc) s = crew_model_verify(m, train, &o, &r);
    if (rc) {
        /* cli_conv_apply said why */
    } else if (s) {
        rc = cli_fail("verify", s);
    } else if (!lead) {
        rc = r.pass ? 0 : 1; /* the verdict is rank 0's; a run that stopped stopped here too */
    } else {
        if (g)
            printf("verify %s on %d MPI ranks x %s:%lld = %d replicas: %lld steps, global batch %lld\n", a.model,
                   crew_group_size(g), kind, (long long)n, r.devices, (long long)r.steps, (long long)r.global_batch);
        else if (r.stages > 1)
            printf("verify %s on %s:%lld = %d replicas x %d pipeline stages (%s schedule, %d micro-batches per step): "
                   "%lld steps, global batch %lld\n", a.model, kind, (long long)n, r.devices, r.stages,
                   r.pipeline_schedule == CREW_PIPELINE_GPIPE ? "GPipe" : "1F1B", r.accumulation, (long long)r.steps,
                   (long long)r.global_batch);
        else
            printf("verify %s on %s:%d: %lld steps, global batch %lld\n", a.model, kind, r.devices, (long long)r.steps,
                   (long long)r.global_batch);
        print_data(&r);
        printf("%6s %16s %24s %22s\n", "step", "N replicas", "1 replica accumulating", "1 replica full batch");
        for (int64_t k = 0; k < r.steps; k++)
            printf("%6lld %16.7f %24.7f %22.7f\n", (long long)k + 1, (double)r.losses[k * 3], (double)r.losses[k * 3 + 1],
                   (double)r.losses[k * 3 + 2]);
        if (r.failure[0]) {
            printf("stopped: %s\n", r.failure);
        } else {
            print_paths(&r);
            print_first_step(&r);
            print_full_batch_verdict(&r);
            if (r.against_kind[0]) print_against(&r);
        }
        printf("%s\n", r.pass ? "PASS" : "FAIL");
        if (a.json) print_json(&r);
        rc = r.pass ? 0 : 1;
    }
    free(conv);
    free(r.losses);
    crew_dataset_free(train);
    crew_model_free(m);
    return rc;
}
