/* cmd_plan.c — crew plan MODEL.json [--batch-per-device B] [--device-memory SIZE] [--devices KIND:N]
 * [--precision fp32|bf16] [--from RUN_DIR] [--json] */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew plan MODEL.json [--batch-per-device B] [--global-batch G] [--devices KIND:N]\n"
    "                 [--device-memory SIZE] [--shard-optimizer] [--precision fp32|bf16]\n"
    "                 [--attention store|recompute] [--data DIR] [--from RUN_DIR] [--json]\n"
    "\n"
    "Works out, from the model's structure alone, the memory one replica needs for training:\n"
    "parameters, gradients, optimizer state, the activations kept for the backward pass (per\n"
    "layer, for the batch), workspace (im2col columns, gradient buffers, accumulation), and the\n"
    "loader's buffers shared by the replicas. Then a verdict: fits with data parallelism; fits\n"
    "only with a smaller per-device batch plus accumulation; fits with optimizer-state sharding\n"
    "across N replicas; or needs model parallelism over k stages (with a balanced split).\n"
    "\n"
    "  --batch-per-device B   samples per replica per micro-batch [model file's, else 32]\n"
    "  --global-batch G       samples per step, a multiple of N x B [N x B]\n"
    "  --devices KIND:N       replicas [cpu:1]\n"
    "  --device-memory SIZE   each device's own memory: 512M, 8G, 24GiB (K/M/G/T and KiB..TiB are\n"
    "                         powers of 1024, KB/MB/GB/TB powers of 1000) [this machine's physical\n"
    "                         memory, shared by its CPU replicas]\n"
    "  --shard-optimizer      plan for optimizer state sharded across the replicas, as crew train\n"
    "                         --shard-optimizer runs it (--optimizer-sharding: the same)\n"
    "  --shard none|optimizer|gradients|parameters  plan for what crew train --shard shards\n"
    "                         (ZeRO-1/2/3); none: the verdict never advises sharding\n"
    "  --shard-unit-mb X      ZeRO-2/3's units, as crew train --shard-unit-mb [0.25]\n"
    "  --precision fp32|bf16  the run's, as crew train --precision: bf16 keeps a GPT block's attention\n"
    "                         probabilities in bfloat16 [fp32]\n"
    "  --attention store|recompute  as crew train --attention: recompute keeps one buffer of attention\n"
    "                         probabilities for all transformer blocks instead of one each [store]\n"
    "  --data DIR             count the loader's sample order for DIR's training split\n"
    "  --from RUN_DIR         that run's gradient noise scale (crew train measures it): what a sample\n"
    "                         at the planned global batch is worth in progress against one at that\n"
    "                         run's, and the steps to the same progress\n"
    "  --json                 end with one JSON line (docs/ADVISOR.md)\n";

static const char *verdict_key(const crew_memory_plan *p)
{
    switch (p->verdict) {
    case CREW_MEMORY_FITS: return "data_parallel";
    case CREW_MEMORY_SMALLER_BATCH: return "smaller_batch";
    case CREW_MEMORY_SHARD_OPTIMIZER:
        return p->advised_shard == CREW_SHARD_PARAMETERS ? "parameter_sharding"
               : p->advised_shard == CREW_SHARD_GRADIENTS ? "gradient_sharding" : "optimizer_sharding";
    case CREW_MEMORY_MODEL_PARALLEL: return "model_parallel";
    case CREW_MEMORY_TOO_LARGE: return "too_large";
    }
    return "unknown";
}

static void print_layers(const crew_memory_plan *p)
{
    char w[32], a[32], s[32];
    int staged = p->verdict == CREW_MEMORY_MODEL_PARALLEL;
    printf("\n%4s  %-24s %-20s %-16s %10s %11s %12s %11s%s\n", "#", "layer", "type", "output", "params", "weights",
           "activations", "workspace", staged ? "  stage" : "");
    for (int i = 0; i < p->n_layers; i++) {
        const crew_memory_layer *l = &p->layers[i];
        crew_format_bytes(l->weight_bytes, w, sizeof w);
        crew_format_bytes(l->activation_bytes, a, sizeof a);
        crew_format_bytes(l->workspace_bytes, s, sizeof s);
        printf("%4d  %-24s %-20s %-16s %10lld %11s %12s %11s", i, l->name, l->type, l->shape, (long long)l->params, w,
               a, s);
        if (staged) printf("  %5d", l->stage);
        printf("\n");
    }
    printf("(weights: parameters, gradients and optimizer state; activations: the layer's output for the batch, 0 B where none is kept: written over its input, handed through, or never written)\n");
    printf("(workspace: the layer's own; the layers' scratch, one buffer a slot shared by all of them, counts once in the total)\n");
}

static void print_line(const char *what, int64_t bytes, const char *note)
{
    char b[32];
    crew_format_bytes(bytes, b, sizeof b);
    printf("  %-22s %12s%s%s\n", what, b, note[0] ? "   " : "", note);
}

static void print_plan(const char *model, const crew_memory_plan *p)
{
    char mem[32], note[160];
    crew_format_bytes(p->device_memory_bytes, mem, sizeof mem);
    printf("memory plan for %s: %d replica%s, per-device batch %lld, accumulation %d, global batch %lld%s%s\n", model,
           p->devices, p->devices == 1 ? "" : "s", (long long)p->batch_per_device, p->accumulation,
           (long long)p->global_batch, p->precision == CREW_PRECISION_BF16 ? ", precision bf16" : "",
           p->attention_recompute ? ", attention recomputed" : "");
    printf("device memory: %s%s\n", mem,
           p->shared_memory ? " (this machine's physical memory, shared by its CPU replicas)" : " per device");
    print_layers(p);
    printf("\none replica:\n");
    print_line("parameters and state", p->param_bytes, "");
    print_line("gradients", p->gradient_bytes, "");
    char opt[96];
    snprintf(opt, sizeof opt, "%s: %d value%s a parameter", p->optimizer, p->optimizer_slots,
             p->optimizer_slots == 1 ? "" : "s");
    print_line("optimizer state", p->optimizer_bytes, opt);
    print_line("activations", p->activation_bytes, "kept for the backward pass: the input and each layer's output");
    print_line("workspace", p->workspace_bytes, "layers' workspace, gradient ping-pong buffers, labels");
    snprintf(note, sizeof note, p->accumulation > 1 ? "micro-batch gradients kept for the ordered sum" : "");
    print_line("accumulation", p->accumulation_bytes, note);
    print_line("peak per replica", p->bytes_per_device, "");
    print_line("host", p->host_bytes,
               "loaders' prefetched batches and sample orders, the dataset's samples, the caller's weights");
    snprintf(note, sizeof note, "%d x replica + host", p->devices);
    print_line("total", p->total_bytes, note);
    printf("\nverdict: %s\n", p->verdict_text);
}

/* --from RUN_DIR: the run's noise scale B at its global batch M0, against the plan's M. */
typedef struct plan_noise {
    double scale;              /* B, NaN without --from */
    int64_t batch;             /* M0 */
    double efficiency;         /* E(M) */
    double steps_ratio;        /* steps at M to the progress of one step at M0: (M0 / M) / E(M) */
} plan_noise;

static void noise_for(const crew_memory_plan *p, plan_noise *n)
{
    n->efficiency = crew_statistical_efficiency(n->scale, n->batch, p->global_batch);
    n->steps_ratio = (double)n->batch / (double)p->global_batch / n->efficiency;
}

static void print_noise(const char *from, const crew_memory_plan *p, const plan_noise *n)
{
    if (!from) return;
    printf("\nbatch against the gradient noise scale of %s: B = %.3g samples, measured at a global batch of %lld;\n"
           "  the planned global batch of %lld is %.2g of it: a sample here is worth %.2f of one there, and the same\n"
           "  progress takes %.2f times the steps (%.2f times the samples)%s\n", from, n->scale, (long long)n->batch,
           (long long)p->global_batch, (double)p->global_batch / n->scale, n->efficiency, n->steps_ratio,
           1.0 / n->efficiency,
           (double)p->global_batch > n->scale ? "; past the noise scale more samples a step buy little progress"
                                              : "");
}

static void print_json(const char *model, const crew_memory_plan *p, const char *from, const plan_noise *n)
{
    printf("{\"model\":");
    crew_json_write_string(stdout, model);
    printf(",\"precision\":\"%s\",\"attention\":\"%s\"", p->precision == CREW_PRECISION_BF16 ? "bf16" : "fp32",
           p->attention_recompute ? "recompute" : "store");
    printf(",\"devices\":%d,\"batch_per_device\":%lld,\"global_batch\":%lld,\"accumulation\":%d,"
           "\"device_memory_bytes\":%lld,\"shared_memory\":%s,\"bytes_per_device\":%lld,\"host_bytes\":%lld,"
           "\"total_bytes\":%lld,\"fits\":%s,\"verdict_kind\":\"%s\",\"verdict\":",
           p->devices, (long long)p->batch_per_device, (long long)p->global_batch, p->accumulation,
           (long long)p->device_memory_bytes, p->shared_memory ? "true" : "false", (long long)p->bytes_per_device,
           (long long)p->host_bytes, (long long)p->total_bytes, p->fits ? "true" : "false", verdict_key(p));
    crew_json_write_string(stdout, p->verdict_text);
    printf(",\"optimizer\":");
    crew_json_write_string(stdout, p->optimizer);
    printf(",\"optimizer_slots\":%d", p->optimizer_slots);
    printf(",\"advised\":{\"batch_per_device\":%lld,\"accumulation\":%d,\"devices\":%d,\"bytes_per_device\":%lld,"
           "\"shard\":\"%s\"},", (long long)p->advised_batch, p->advised_accumulation, p->advised_devices,
           (long long)p->advised_bytes_per_device,
           crew_shard_level_name(p->verdict == CREW_MEMORY_SHARD_OPTIMIZER ? p->advised_shard : CREW_SHARD_NONE));
    printf("\"breakdown\":{\"parameters\":%lld,\"gradients\":%lld,\"optimizer\":%lld,\"activations\":%lld,"
           "\"workspace\":%lld,\"accumulation\":%lld},\"layers\":[",
           (long long)p->param_bytes, (long long)p->gradient_bytes, (long long)p->optimizer_bytes,
           (long long)p->activation_bytes, (long long)p->workspace_bytes, (long long)p->accumulation_bytes);
    for (int i = 0; i < p->n_layers; i++) {
        const crew_memory_layer *l = &p->layers[i];
        printf("%s{\"index\":%d,\"name\":", i ? "," : "", i);
        crew_json_write_string(stdout, l->name);
        printf(",\"type\":\"%s\",\"shape\":\"%s\",\"params\":%lld,\"weight_bytes\":%lld,\"activation_bytes\":%lld,"
               "\"workspace_bytes\":%lld,\"stage\":%d}", l->type, l->shape, (long long)l->params,
               (long long)l->weight_bytes, (long long)l->activation_bytes, (long long)l->workspace_bytes, l->stage);
    }
    printf("],\"noise\":");
    if (!from) {
        printf("null}\n");
        return;
    }
    char b[32];
    printf("{\"from\":");
    crew_json_write_string(stdout, from);
    printf(",\"noise_scale\":%s,\"noise_batch\":%lld,", cli_json_number(n->scale, b, sizeof b), (long long)n->batch);
    printf("\"statistical_efficiency\":%s,", cli_json_number(n->efficiency, b, sizeof b));
    printf("\"steps_ratio\":%s}}\n", cli_json_number(n->steps_ratio, b, sizeof b));
}

typedef struct plan_args {
    const char *model, *data;
    const char *from;           /* --from RUN_DIR */
    int json;
    int shard_given;            /* --shard was given */
    char kind[32];              /* --devices KIND */
    crew_memory_options o;
} plan_args;

static int parse_devices(const char *verb, const char *v, void *args)
{
    int64_t n;
    plan_args *a = args;
    if (!cli_parse_devices(verb, v, a->kind, sizeof a->kind, &n)) return 0;
    a->o.devices = (int)n;
    a->o.device_kind = a->kind;
    return 1;
}

static int parse_device_memory(const char *verb, const char *v, void *args)
{
    return cli_parse_size(verb, "--device-memory", v, &((plan_args *)args)->o.device_memory_bytes);
}

/* --shard LEVEL: a crew_shard_level's name; "none" (given) keeps the verdict from advising sharding. */
static int parse_shard(const char *verb, const char *v, void *args)
{
    static const char *const levels[] = {"none", "optimizer", "gradients", "parameters", NULL}; /* crew_shard_level's */
    plan_args *a = args;
    int level = cli_parse_choice(verb, "--shard", v, levels);
    if (level < 0) return 0;
    a->o.shard = level;
    a->shard_given = 1;
    return 1;
}

static const cli_flag_spec plan_flags[] = {
    CLI_SWITCH_FLAG(plan_args, "--json", json),
    CLI_SWITCH_FLAG(plan_args, "--shard-optimizer", o.optimizer_sharding),
    CLI_SWITCH_FLAG(plan_args, "--optimizer-sharding", o.optimizer_sharding),
    CLI_CUSTOM_FLAG("--shard", parse_shard),
    CLI_FLOAT_FLAG(plan_args, "--shard-unit-mb", o.shard_unit_mb, 1e-6, 1e6),
    CLI_CHOICE_FLAG(plan_args, "--precision", o.precision, cli_precisions),
    CLI_CHOICE_FLAG(plan_args, "--attention", o.attention_recompute, cli_attention_ways),
    CLI_STRING_FLAG(plan_args, "--data", data),
    CLI_STRING_FLAG(plan_args, "--from", from),
    CLI_INT_FLAG(plan_args, "--batch-per-device", o.batch_per_device, 1, 1 << 20),
    CLI_INT_FLAG(plan_args, "--global-batch", o.global_batch, 1, 1 << 30),
    CLI_CUSTOM_FLAG("--devices", parse_devices),
    CLI_CUSTOM_FLAG("--device-memory", parse_device_memory),
};

/* Returns 0 to go on, -1 after --help, or the exit status. */
static int parse_args(int argc, char **argv, plan_args *a)
{
    memset(a, 0, sizeof *a);
    crew_memory_options_init(&a->o);
    int parsed = cli_parse_args("plan", usage_text, plan_flags, CLI_COUNT(plan_flags), argc, argv, a, &a->model);
    if (parsed) return parsed;
    if (!a->model) return cli_usage_error("plan", "missing MODEL.json");
    a->o.no_sharding = a->shard_given && a->o.shard == CREW_SHARD_NONE && !a->o.optimizer_sharding;
    return 0;
}

int cli_plan(int argc, char **argv)
{
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    crew_model *m = NULL;
    crew_dataset *train = NULL, *test = NULL;
    crew_memory_plan p;
    plan_noise noise = {.scale = NAN};
    crew_status s = a.from ? crew_run_noise_scale(a.from, &noise.scale, &noise.batch) : CREW_OK;
    if (!s) s = crew_model_load_file(a.model, &m);
    if (!s && a.data) s = crew_dataset_open_for(m, a.data, "train", &train);
    if (!s && train) cli_note_dataset("plan", train);
    if (!s && train) a.o.train_samples = crew_dataset_size(train);
    if (!s && train) { /* a run holds its test split open too, for its evaluations; one the plan cannot
                          open, crew train refuses: the plan counts the training split alone, and says so */
        crew_status t = crew_dataset_open_for(m, a.data, "test", &test);
        if (t)
            fprintf(stderr, "crew plan: note: %s: the host line counts the training split's samples alone, and crew "
                    "train needs the test split too\n", crew_status_message(t));
        crew_status_free(t);
        a.o.dataset_bytes = crew_dataset_memory_bytes(train) + crew_dataset_memory_bytes(test);
    }
    if (!s) s = crew_model_plan_memory(m, &a.o, &p);
    if (s) {
        rc = cli_fail("plan", s);
    } else {
        print_plan(a.model, &p);
        if (a.from) noise_for(&p, &noise);
        print_noise(a.from, &p, &noise);
        if (a.json) print_json(a.model, &p, a.from, &noise);
        crew_memory_plan_release(&p);
        rc = 0;
    }
    crew_dataset_free(test);
    crew_dataset_free(train);
    crew_model_free(m);
    return rc;
}
