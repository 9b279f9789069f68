/* cmd_train.c — crew train MODEL.json --data DIR [options] */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "stop.h"

static const char *usage_text =
    "usage: crew train MODEL.json --data DIR [options]\n"
    "\n"
    "Trains the model file on the dataset directory DIR (written by crew prep), evaluates it on\n"
    "DIR's test split after every epoch, and saves the weights into the run directory.\n"
    "\n"
    "options (defaults from the model file's \"training\" section, else as shown):\n"
    "  --data DIR                 dataset directory (required)\n"
    "  --epochs N                 passes over the training split [1]\n"
    "  --max-steps N              stop after N optimizer steps [no limit]\n"
    "  --devices KIND:N           N replicas, data-parallel, one device each; KIND alone = every\n"
    "                             device of that kind ('cpu': all cores) [cpu]. Kinds: crew --version\n"
    "  --threads-per-device T     BLAS threads per replica [1]\n"
    "  --bind-cores auto|on|off   each replica's thread, and its loader's, on cores of its own (its T\n"
    "                             BLAS threads' worth); auto: on where every core of the process computes\n"
    "                             a replica of a CPU kind; the same bits [auto]\n"
    "  --layout replicas|auto     replicas: one per core, 1 BLAS thread each; auto: the faster of\n"
    "                             R replicas x cores/R threads for this model here, measured once\n"
    "                             (a few seconds) and cached: the same global batch, but the last\n"
    "                             bits differ between layouts (BLAS threads sum in another order)\n"
    "                             [replicas]\n"
    "  --pipeline K               cut the model into K stages, one device each (docs/PIPELINE.md):\n"
    "                             N / K replicas of a K-stage pipeline; for a model that does not fit\n"
    "                             one device (crew plan says when) [no pipeline]\n"
    "  --stages RANGES            the stages' layers, e.g. 0-3,4-9 [balanced by compute]\n"
    "  --schedule 1f1b|gpipe      the order of each stage's passes: one forward one backward (at\n"
    "                             most K micro-batches in flight), or every forward first [1f1b]\n"
    "  --micro-batches M          micro-batches per pipeline per step; the global batch is then\n"
    "                             N / K x B x M [K]\n"
    "  --device-memory SIZE       each device's own memory (512M, 8G; crew plan's flag): the memory\n"
    "                             planner picks the layout for the global batch: data parallel when\n"
    "                             the model fits, a smaller per-device batch with accumulation, or\n"
    "                             the pipeline split it computes; the plan says which and why\n"
    "  --batch-per-device B       samples per replica per micro-batch [32]\n"
    "  --global-batch G           samples per optimizer step; a multiple of N x B, the rest is\n"
    "                             gradient accumulation [N x B]\n"
    "  --lr X                     base learning rate, overriding the model file's\n"
    "  --base-batch N             the global batch that learning rate was tuned for [model file's]\n"
    "  --lr-scaling RULE          none, linear (Goyal et al.) or sqrt: scales the rate to the global\n"
    "                             batch [model file's, else none]\n"
    "  --warmup-steps N           gradual warmup to the scaled rate; 0 = none [automatic: 5 epochs,\n"
    "                             at most half the run, when scaling raised the rate]\n"
    "  --warmup-epochs E          the same in epochs\n"
    "  --bucket-mb X              gradient bucket size for the overlapped all-reduce [one bucket\n"
    "                             where every core computes a replica, else 25; the plan says]\n"
    "  --sync-bn on|off           batch-norm statistics over all replicas [on with >1 device]\n"
    "  --collective-timeout S     a replica missing a collective this long fails the run [300]\n"
    "  --on-nan stop|skip         non-finite gradients end the run (exit 1), or skip that update [stop]\n"
    "  --allreduce ordered|fast   under mpirun or NCCL: crew's ordered all-reduce, the same bits for\n"
    "                             any split of the work, or the library's own (fast; its order of the\n"
    "                             sums, so the last bits, may change with the process or GPU count,\n"
    "                             and a missing process is reported, not named) [ordered]\n"
    "  --precision fp32|bf16      the GEMMs' operands in float32, or rounded to bfloat16 with float32\n"
    "                             sums (tensor cores on a GPU; emulated, slower, on the CPU); weights,\n"
    "                             gradients and optimizer state stay float32 [fp32; a resumed run:\n"
    "                             its checkpoint's]\n"
    "  --attention store|recompute\n"
    "                             transformer blocks keep their attention probabilities for the\n"
    "                             backward pass, or compute them again there: the same bits, one\n"
    "                             buffer for all blocks instead of one each (a GPT's largest\n"
    "                             activation), one more q.k GEMM per block [store]\n"
    "  --conv auto|im2col|library|WAY,WAY,...\n"
    "                             how convolutions compute: im2col + GEMM, or the device's library\n"
    "                             (cuDNN; also 'cudnn') wherever it runs the layer's shape, or per\n"
    "                             layer: auto times both ways on each layer's shape once per machine\n"
    "                             (the figures' cache) and takes the faster, im2col on the CPU; a\n"
    "                             list gives one way per convolution layer. Each way sums in its own\n"
    "                             order (cuDNN's algorithms are deterministic: the same bits run after\n"
    "                             run) [auto; a resumed run: its checkpoint's]\n"
    "  --comm auto|host|nccl      how the replicas talk: NCCL (GPUs, each replica on a GPU of its own,\n"
    "                             no pipeline), the host's (threads, MPI, GPU buffers through host\n"
    "                             copies), or NCCL where it can (auto); the same bits either way\n"
    "                             unless --allreduce fast [auto]\n"
    "  --shard optimizer|gradients|parameters\n"
    "                             what each of N replicas keeps 1/N of: the optimizer state (ZeRO-1:\n"
    "                             gradients reduce-scattered, parameters all-gathered), the summed\n"
    "                             gradients too (ZeRO-2), or the parameters too (ZeRO-3: each unit of\n"
    "                             layers gathered just before it runs); the same weights, bit for bit;\n"
    "                             none also keeps --device-memory from choosing sharding [none]\n"
    "  --shard-optimizer          the same as --shard optimizer\n"
    "  --shard-unit-mb X          ZeRO-2/3: gather and reduce-scatter the layers in units of about X MiB\n"
    "                             of parameters [0.25]\n"
    "  --shard-overlap auto|on|off  ZeRO-2/3: the units' collectives on a communication thread beside\n"
    "                             compute, for one more unit's buffers; auto: off where every core\n"
    "                             computes a replica, else on; the same bits [auto]\n"
    "  --drift-check-every N      compare the replicas' parameter hashes every N steps; 0 = off [100]\n"
    "  --noise-scale-every N      measure the gradient noise scale every N steps (one more pass over\n"
    "                             each micro-batch's gradient and the reduced one; it needs 2 or more\n"
    "                             micro-batches a step); 0 = off [4]\n"
    "  --straggler-threshold X    report a replica slower than the others' median by this fraction [0.2]\n"
    "  --straggler-window N       steps per straggler verdict [50]\n"
    "  --seed S                   seed for initial weights, data order and dropout [1]\n"
    "  --init-weights FILE        start from these weights (safetensors) instead of a random init\n"
    "  --loader-inline auto|on|off\n"
    "                             on: each replica prepares its own batches as it takes them, on\n"
    "                             its own thread; off: loader threads prepare them ahead; auto: on\n"
    "                             where every core of the process computes a replica of a CPU kind\n"
    "                             (a loader thread would take turns with one); the same bits [auto;\n"
    "                             off with --loader-threads]\n"
    "  --loader-threads K         threads preparing batches ahead of the replicas [min(4, cores)]\n"
    "  --prefetch D               steps of batches prepared ahead [2]\n"
    "  --augment LIST             per-sample augmentations: crop=P (random crop with P pixels of\n"
    "                             padding), flip (random horizontal flip), none [model file's]\n"
    "  --pad-last                 pad the last partial global batch of each epoch instead of\n"
    "                             dropping it\n"
    "  --checkpoint-every N[s|m]  save a checkpoint every N steps, or every N seconds/minutes (the\n"
    "                             flag may be given twice, for both) [10m]; always at the end and\n"
    "                             on SIGINT/SIGTERM\n"
    "  --keep-checkpoints K       newest checkpoints kept [3]\n"
    "  --stop-grace S             after SIGINT/SIGTERM, seconds the stop (the step, its checkpoint,\n"
    "                             the weights) may take before crew gives it up and exits [25]\n"
    "  --resume RUN_DIR           continue the run in RUN_DIR from its newest complete checkpoint,\n"
    "                             on any number of devices that shares its global batch; the\n"
    "                             checkpoint decides everything that changes the numbers (batch,\n"
    "                             length, seed, learning rate, --augment, --pad-last, --sync-bn,\n"
    "                             --on-nan, --threads-per-device): such a flag may be repeated\n"
    "                             with the run's value, any other value is refused\n"
    "  --run-dir DIR              where config.json, metrics.jsonl, tb/, checkpoints/, report.html\n"
    "                             and weights.safetensors go; a directory holding another run is\n"
    "                             refused [runs/<model>-<date>-<time>]\n"
    "  --replace                  start anew in a --run-dir that holds another run: deletes that\n"
    "                             run's config.json, metrics.jsonl, tb/, checkpoints/, report.html\n"
    "                             and weights.safetensors (nothing else) once the new plan holds\n"
    "  --json                     end with one JSON line: test_accuracy, test_loss, train_loss,\n"
    "                             epochs, steps, samples_per_s, gflops, peak_fraction, wall_s,\n"
    "                             weights, run_dir\n"
    "  --log-every N              a line every N steps (loss, accuracy, learning rate, step time)\n"
    "                             instead of the progress bar, also when stdout is not a terminal\n"
    "  --quiet                    no progress output (a run stopped by a signal still says on\n"
    "                             stderr how to resume it)\n"
    "\n"
    "Stopped by SIGINT or SIGTERM before its end (under mpirun, of any of its processes), a run\n"
    "finishes its step, saves a checkpoint, prints the command that resumes it and exits with\n"
    "status 1; its weights.safetensors is marked unfinished (metadata \"finished\": \"false\",\n"
    "docs/WEIGHTS.md), and crew eval says so. A second SIGINT stops at once, without a checkpoint;\n"
    "a stop that takes longer than --stop-grace is given up. Under mpirun: docs/CHECKPOINTS.md.\n";

/* Below Slurm's default KillWait (30 s), so that a scheduler's SIGKILL after its SIGTERM comes
 * after crew's own last line. */
#define DEFAULT_STOP_GRACE_S 25.0

typedef struct train_args {
    const char *model, *data, *run_dir, *init_weights, *devices_text;
    char device_kind[32];
    int json, quiet, replace;
    int argc;
    char **argv;                /* as given, for the command that resumes the run */
    /* 0 (seed, lr_scaling, sync_bn, on_nan, warmup_steps: -1): not given, the model file's or
     * the library's default; a resumed run's checkpoint decides these unless given */
    int64_t log_every;
    int64_t epochs, max_steps, batch, global_batch, seed, devices, threads, base_batch, warmup_steps;
    int64_t replicas;           /* devices / pipeline stages */
    int lr_scaling, sync_bn, on_nan, allreduce, shard_optimizer, shard, shard_overlap, comm, precision, attention;
    int bind_cores;             /* an index of overlap_ways: auto, on, off */
    int loader_inline;          /* an index of overlap_ways; -1: not given */
    double shard_unit_mb;
    cli_conv conv;
    int64_t drift_every, straggler_window, checkpoint_every, keep_checkpoints, loader_threads, prefetch;
    int64_t noise_every;        /* --noise-scale-every; -1: not given */
    int pad_last, have_augment;
    crew_augment_options augment;
    double checkpoint_every_s;
    const char *resume;
    double lr, warmup_epochs, bucket_mb, timeout, straggler_threshold;
    double stop_grace;          /* --stop-grace, seconds */
    cli_pipeline pipe;
    int64_t device_memory;      /* --device-memory: the planner chooses the layout; 0: not given */
    int layout;                 /* --layout: 0 replicas, 1 auto */
} train_args;

/* --checkpoint-every: "500" (steps), "90s", "10m"; given twice it can set both. */
static int parse_every(const char *verb, const char *v, void *args)
{
    train_args *a = args;
    size_t n = strlen(v);
    char unit = n ? v[n - 1] : 0;
    if (unit != 's' && unit != 'm') return cli_parse_int(verb, "--checkpoint-every", v, 1, INT64_MAX / 2, &a->checkpoint_every);
    char num[64];
    snprintf(num, sizeof num, "%.*s", (int)(n - 1), v);
    double x;
    if (!cli_parse_float(verb, "--checkpoint-every", num, 0.001, 1e9, &x)) return 0;
    a->checkpoint_every_s = unit == 'm' ? 60.0 * x : x;
    return 1;
}

/* --augment: the all-zero options mean "none", so a marker tells "none" given from not given
 * (which keeps the model file's). */
static int parse_augment(const char *verb, const char *v, void *args)
{
    train_args *a = args;
    a->have_augment = 1;
    return cli_parse_augment(verb, v, &a->augment);
}

static int parse_conv(const char *verb, const char *v, void *args)
{
    return cli_parse_conv(verb, v, &((train_args *)args)->conv);
}

static int parse_device_memory(const char *verb, const char *v, void *args)
{
    return cli_parse_size(verb, "--device-memory", v, &((train_args *)args)->device_memory);
}

static const char *const lr_rules[] = {"none", "linear", "sqrt", NULL}; /* crew_lr_scaling's order */
static const char *const off_on[] = {"off", "on", NULL};
static const char *const nan_policies[] = {"stop", "skip", NULL}; /* crew_nan_policy's order */
static const char *const allreduce_kinds[] = {"ordered", "fast", NULL}; /* crew_fit_options.unordered_allreduce */
static const char *const layouts[] = {"replicas", "auto", NULL};
static const char *const comms[] = {"auto", "host", "nccl", NULL}; /* crew_communicator's order */
static const char *const shard_levels[] = {"none", "optimizer", "gradients", "parameters", NULL}; /* crew_shard_level's */
static const char *const overlap_ways[] = {"auto", "on", "off", NULL};

/* Every flag but --help. --devices is only stored here: it is checked after MODEL.json and --data,
 * so a command missing those says so first. */
static const cli_flag_spec train_flags[] = {
    CLI_SWITCH_FLAG(train_args, "--json", json),
    CLI_SWITCH_FLAG(train_args, "--quiet", quiet),
    CLI_INT_FLAG(train_args, "--log-every", log_every, 1, INT64_MAX / 2),
    CLI_SWITCH_FLAG(train_args, "--pad-last", pad_last),
    CLI_SWITCH_FLAG(train_args, "--replace", replace),
    CLI_STRING_FLAG(train_args, "--data", data),
    CLI_STRING_FLAG(train_args, "--run-dir", run_dir),
    CLI_STRING_FLAG(train_args, "--init-weights", init_weights),
    CLI_STRING_FLAG(train_args, "--devices", devices_text),
    CLI_STRING_FLAG(train_args, "--resume", resume),
    CLI_INT_FLAG(train_args, "--epochs", epochs, 1, 1000000),
    CLI_INT_FLAG(train_args, "--max-steps", max_steps, 1, INT64_MAX / 2),
    CLI_INT_FLAG(train_args, "--batch-per-device", batch, 1, 1 << 20),
    CLI_INT_FLAG(train_args, "--global-batch", global_batch, 1, 1 << 30),
    CLI_INT_FLAG(train_args, "--threads-per-device", threads, 1, 1024),
    CLI_CHOICE_FLAG(train_args, "--bind-cores", bind_cores, overlap_ways),
    CLI_CHOICE_FLAG(train_args, "--loader-inline", loader_inline, overlap_ways),
    CLI_INT_FLAG(train_args, "--seed", seed, 0, INT64_MAX),
    CLI_FLOAT_FLAG(train_args, "--lr", lr, 1e-12, 1e3),
    CLI_INT_FLAG(train_args, "--base-batch", base_batch, 1, 1 << 30),
    CLI_CHOICE_FLAG(train_args, "--lr-scaling", lr_scaling, lr_rules),
    CLI_INT_FLAG(train_args, "--warmup-steps", warmup_steps, 0, INT64_MAX / 2),
    CLI_FLOAT_FLAG(train_args, "--warmup-epochs", warmup_epochs, 0.0, 1e6),
    CLI_FLOAT_FLAG(train_args, "--bucket-mb", bucket_mb, 1e-6, 1e6),
    CLI_CHOICE_FLAG(train_args, "--sync-bn", sync_bn, off_on),
    CLI_CHOICE_FLAG(train_args, "--on-nan", on_nan, nan_policies),
    CLI_CHOICE_FLAG(train_args, "--allreduce", allreduce, allreduce_kinds),
    CLI_SWITCH_FLAG(train_args, "--shard-optimizer", shard_optimizer),
    CLI_CHOICE_FLAG(train_args, "--shard", shard, shard_levels),
    CLI_FLOAT_FLAG(train_args, "--shard-unit-mb", shard_unit_mb, 1e-6, 1e6),
    CLI_CHOICE_FLAG(train_args, "--shard-overlap", shard_overlap, overlap_ways),
    CLI_CHOICE_FLAG(train_args, "--comm", comm, comms),
    CLI_CHOICE_FLAG(train_args, "--precision", precision, cli_precisions),
    CLI_CHOICE_FLAG(train_args, "--attention", attention, cli_attention_ways),
    CLI_CUSTOM_FLAG("--conv", parse_conv),
    CLI_INT_FLAG(train_args, "--drift-check-every", drift_every, 0, INT64_MAX / 2),
    CLI_INT_FLAG(train_args, "--noise-scale-every", noise_every, 0, INT64_MAX / 2),
    CLI_FLOAT_FLAG(train_args, "--straggler-threshold", straggler_threshold, 0.001, 100.0),
    CLI_INT_FLAG(train_args, "--straggler-window", straggler_window, 1, 1 << 30),
    CLI_INT_FLAG(train_args, "--loader-threads", loader_threads, 1, 256),
    CLI_INT_FLAG(train_args, "--prefetch", prefetch, 1, 1024),
    CLI_CUSTOM_FLAG("--augment", parse_augment),
    CLI_CUSTOM_FLAG("--checkpoint-every", parse_every),
    CLI_INT_FLAG(train_args, "--keep-checkpoints", keep_checkpoints, 1, 1000000),
    CLI_FLOAT_FLAG(train_args, "--collective-timeout", timeout, 0.001, 1e7),
    CLI_FLOAT_FLAG(train_args, "--stop-grace", stop_grace, 0.001, 1e7),
    CLI_INT_FLAG(train_args, "--pipeline", pipe.stages, 1, CREW_MAX_PIPELINE_STAGES),
    CLI_CHOICE_FLAG(train_args, "--schedule", pipe.schedule, cli_schedules),
    CLI_STRING_FLAG(train_args, "--stages", pipe.split),
    CLI_INT_FLAG(train_args, "--micro-batches", pipe.micro_batches, 1, 1 << 20),
    CLI_CUSTOM_FLAG("--device-memory", parse_device_memory),
    CLI_CHOICE_FLAG(train_args, "--layout", layout, layouts),
};

/* Combinations that cannot mean anything: 0, or the exit status after the error. */
static int check_combinations(const train_args *a)
{
    if (a->run_dir && !*a->run_dir) return cli_usage_error("train", "--run-dir needs a directory, got ''");
    if (a->resume && !*a->resume) return cli_usage_error("train", "--resume needs the run directory to continue, got ''");
    if (a->resume && a->run_dir && strcmp(a->resume, a->run_dir) != 0)
        return cli_usage_error("train", "--resume RUN_DIR continues in RUN_DIR; --run-dir cannot name another");
    if (a->resume && a->replace)
        return cli_usage_error("train", "--replace starts a new run and --resume continues one: give one of them");
    if (a->resume && a->init_weights)
        return cli_usage_error("train", "--init-weights starts a new run from weights; --resume continues from the "
                                        "run's checkpoint");
    if (a->replace && !a->run_dir) return cli_usage_error("train", "--replace needs the --run-dir it replaces");
    if (a->layout == 1) { /* auto: the replicas and threads are what it chooses */
        const char *other = a->threads ? "--threads-per-device" : a->pipe.stages > 1 || a->pipe.split ? "a pipeline"
                            : a->device_memory ? "--device-memory" : a->resume ? "--resume" : cli_group() ? "mpirun" : NULL;
        if (other)
            return cli_usage_error("train", "--layout auto chooses the replicas and BLAS threads of this machine's "
                                            "cores itself: leave out %s, or --layout", other);
    }
    return 0;
}

/* Returns 0 to go on, -1 after --help, or the exit status. */
static int parse_args(int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->seed = -1;
    a->lr_scaling = -1;
    a->sync_bn = -1;
    a->on_nan = -1;
    a->precision = -1; /* a resumed run takes its checkpoint's */
    a->conv.way = -1;
    a->warmup_steps = -1;
    a->drift_every = -2; /* not given */
    a->noise_every = -1;
    a->pipe.schedule = -1;
    a->layout = -1;
    a->shard = -1;
    a->loader_inline = -1;
    int parsed = cli_parse_args("train", usage_text, train_flags, CLI_COUNT(train_flags), argc, argv, a, &a->model);
    if (parsed) return parsed;
    if (!a->model) return cli_usage_error("train", "missing MODEL.json");
    if ((parsed = check_combinations(a))) return parsed;
    if (a->resume) a->run_dir = a->resume;
    if (!a->checkpoint_every && !a->checkpoint_every_s) a->checkpoint_every_s = 600.0;
    if (!a->stop_grace) a->stop_grace = DEFAULT_STOP_GRACE_S;
    if (!a->data) return cli_usage_error("train", "missing --data DIR");
    /* Under mpirun each process is one replica unless --devices says more: every core for every
     * process would oversubscribe a machine running several. */
    if (!a->devices_text) a->devices_text = cli_group() ? "cpu:1" : "cpu";
    if (!cli_parse_devices("train", a->devices_text, a->device_kind, sizeof a->device_kind, &a->devices)) return 2;
    if (a->layout == 1 && strcmp(a->device_kind, "cpu") != 0)
        return cli_usage_error("train", "--layout auto divides CPU cores between replicas and BLAS threads, not %s "
                                        "devices", a->device_kind);
    if (!cli_pipeline_replicas("train", &a->pipe, a->devices, crew_group_size(cli_group()), &a->replicas)) return 2;
    return 0;
}

/* ---- progress */

typedef struct train_view {
    cli_progress bar;
    int quiet, json;
    int64_t log_every;           /* --log-every: a line every N steps instead of the bar */
    int epoch_open;
    const char *bits_unit;       /* a language model's "bits per byte" (byte data) or "per token" */
    unsigned char shown[16 * 65]; /* events printed, by kind and replica */
} train_view;

static void on_step(void *user, const crew_step_info *s)
{
    train_view *v = user;
    if (!v->quiet && v->log_every > 0) {
        if (s->step % v->log_every == 0 || s->step == s->steps_total)
            printf("step %lld/%lld (epoch %d): loss %.4f, accuracy %.4f, lr %.3g, %.3f s a step\n", (long long)s->step,
                   (long long)s->steps_total, s->epoch + 1, (double)s->loss, (double)s->accuracy, (double)s->lr,
                   s->step_s);
        fflush(stdout);
        return;
    }
    if (v->quiet || !v->bar.tty) return;
    if (!v->epoch_open) {
        printf("Epoch %d\n", s->epoch + 1);
        v->epoch_open = 1;
    }
    /* Redrawing costs little, but a terminal needs no more than ~20 frames a second. */
    if (s->epoch_step != s->epoch_steps && s->step % 8 != 0) return;
    char extra[96];
    snprintf(extra, sizeof extra, "loss: %.4f - accuracy: %.4f", (double)s->loss, (double)s->accuracy);
    cli_progress_bar(&v->bar, s->epoch_step, s->epoch_steps, s->elapsed_s, extra);
}

static void on_epoch(void *user, const crew_epoch_info *e)
{
    train_view *v = user;
    v->epoch_open = 0;
    if (v->quiet) return;
    char bits[64] = "";
    if (e->test_bits == e->test_bits) snprintf(bits, sizeof bits, ", %.3f %s", (double)e->test_bits, v->bits_unit);
    if (v->bar.tty && !v->log_every) {
        printf(" - test_loss: %.4f - test_accuracy: %.4f%s\n", (double)e->test_loss, (double)e->test_accuracy, bits);
        v->bar.last_width = 0;
    } else {
        printf("epoch %d/%d: %lld steps in %.1fs (%.0f samples/s), loss %.4f, accuracy %.4f, test_loss %.4f, "
               "test_accuracy %.4f%s\n",
               e->epoch + 1, e->epochs, (long long)e->steps, e->wall_s, e->samples_per_s, (double)e->train_loss,
               (double)e->train_accuracy, (double)e->test_loss, (double)e->test_accuracy, bits);
    }
    fflush(stdout);
}

/* Events go to stderr, one line each; a repeated kind for the same replica is only counted
 * (metrics.jsonl keeps them all). */
static void on_event(void *user, const crew_event_info *e)
{
    train_view *v = user;
    int slot = (int)e->kind * 65 + (e->rank >= 0 && e->rank < 64 ? e->rank + 1 : 0);
    if (slot < (int)sizeof v->shown && v->shown[slot]++) return;
    if (v->bar.tty && v->bar.last_width) {
        printf("\n");
        v->bar.last_width = 0;
    }
    fflush(stdout);
    fprintf(stderr, "crew train: %s: %s\n", e->kind_name, e->message);
}

/* ---- the run */

static void print_result_json(const crew_fit_result *r, const char *weights, const char *run_dir)
{
    char acc[32], loss[32], tloss[32], tacc[32], gf[32], pf[32];
    printf("{\"test_accuracy\":%s,\"test_loss\":%s,\"train_loss\":%s,\"train_accuracy\":%s,"
           "\"epochs\":%d,\"steps\":%lld,\"samples_per_s\":%.1f,\"gflops\":%s,\"peak_fraction\":%s,\"wall_s\":%.3f,"
           "\"weights\":",
           cli_json_number(r->test_accuracy, acc, sizeof acc), cli_json_number(r->test_loss, loss, sizeof loss),
           cli_json_number(r->train_loss, tloss, sizeof tloss), cli_json_number(r->train_accuracy, tacc, sizeof tacc),
           r->epochs, (long long)r->steps, r->samples_per_s, cli_json_number(r->gflops, gf, sizeof gf),
           cli_json_number(r->peak_fraction, pf, sizeof pf), r->wall_s);
    crew_json_write_string(stdout, weights);
    printf(",\"run_dir\":");
    crew_json_write_string(stdout, run_dir);
    printf(",\"events\":%d,\"skipped_updates\":%lld,\"bottleneck\":", r->events, (long long)r->skipped_updates);
    crew_json_write_string(stdout, r->bottleneck);
    char bubble[32];
    printf(",\"stages\":%d,\"bubble_fraction\":%s,\"stage_peak_bytes\":[", r->stages,
           cli_json_number(r->bubble_fraction, bubble, sizeof bubble));
    for (int s = 0; s < r->stages && r->stages > 1; s++) printf("%s%lld", s ? "," : "", (long long)r->stage_peak_bytes[s]);
    printf("]}\n");
}

/* A pipeline: each stage's device memory, planned and measured. */
static void print_stage_memory(const crew_model *m, const crew_fit_result *r, const crew_fit_plan *plan)
{
    int64_t planned[CREW_MAX_PIPELINE_STAGES];
    crew_status s = crew_model_plan_stages(m, plan, planned);
    if (s) {
        crew_status_free(s);
        return;
    }
    for (int i = 0; i < plan->stages; i++) {
        char a[32], b[32];
        printf("stage %d (layers %d-%d): device memory %s at its peak, planned %s (%+.1f%%)\n", i, plan->stage_first[i],
               plan->stage_first[i + 1] - 1, crew_format_bytes(r->stage_peak_bytes[i], a, sizeof a),
               crew_format_bytes(planned[i], b, sizeof b),
               planned[i] > 0 ? 100.0 * ((double)r->stage_peak_bytes[i] / (double)planned[i] - 1.0) : 0.0);
    }
}

/* Data parallelism with sharded optimizer state or a memory limit: replica 0's device memory,
 * planned (crew_model_plan_memory, as crew plan counts it) and measured. */
static void print_replica_memory(const crew_model *m, const crew_fit_result *r, const crew_fit_plan *plan)
{
    crew_memory_options mo;
    crew_memory_options_init(&mo);
    mo.batch_per_device = plan->batch_per_device;
    mo.devices = plan->devices;
    mo.global_batch = plan->global_batch;
    mo.optimizer_sharding = plan->shard_optimizer;
    mo.shard = plan->shard;
    mo.shard_unit_mb = plan->shard_unit_mb;
    mo.shard_overlap = plan->shard_overlap;
    mo.device_kind = plan->device_kind;
    mo.precision = plan->precision;
    mo.attention_recompute = plan->attention_recompute;
    crew_memory_plan mp;
    crew_status s = crew_model_plan_memory(m, &mo, &mp);
    if (s) {
        crew_status_free(s);
        return;
    }
    char a[32], b[32], c[32];
    printf("device memory: %s at its peak on replica 0, planned %s (%+.1f%%); optimizer state %s per replica%s\n",
           crew_format_bytes(r->stage_peak_bytes[0], a, sizeof a), crew_format_bytes(mp.bytes_per_device, b, sizeof b),
           mp.bytes_per_device > 0 ? 100.0 * ((double)r->stage_peak_bytes[0] / (double)mp.bytes_per_device - 1.0) : 0.0,
           crew_format_bytes(mp.optimizer_bytes, c, sizeof c), plan->shard_optimizer ? " (sharded)" : "");
    if (plan->shard >= CREW_SHARD_GRADIENTS) {
        char g[32], q[32];
        printf("              gradients %s and parameters %s per replica (sharded, with the units' buffers)\n",
               crew_format_bytes(mp.gradient_bytes, g, sizeof g), crew_format_bytes(mp.param_bytes, q, sizeof q));
    }
    crew_memory_plan_release(&mp);
}

typedef struct train_state {
    crew_model *m;
    crew_dataset *train, *test;
    crew_fit *fit;
    crew_run_lock *lock;        /* rank 0's, of run_dir: from before anything is written there */
    char run_dir[512], checkpoints[600];
} train_state;

/* Takes the run directory's lock (crew_run_lock_take): 0, or 2 after naming its holder. */
static int lock_run_dir(train_state *st)
{
    crew_status s = crew_run_lock_take(st->run_dir, "crew train", &st->lock);
    if (s) return cli_fail("train", s);
    if (crew_run_lock_note(st->lock)[0]) fprintf(stderr, "crew train: warning: %s\n", crew_run_lock_note(st->lock));
    return 0;
}

static crew_status load_inputs(const train_args *a, train_state *st, crew_fit_options *o)
{
    cli_warn_slow_blas("train");
    crew_status s = crew_model_load_file(a->model, &st->m);
    if (!s) s = crew_dataset_open_for(st->m, a->data, "train", &st->train);
    if (!s) s = crew_dataset_open_for(st->m, a->data, "test", &st->test);
    if (!s && crew_group_rank(cli_group()) == 0) {
        cli_note_dataset("train", st->train);
        cli_note_dataset("train", st->test);
    }
    if (!s && a->init_weights) s = crew_model_load_weights(st->m, a->init_weights);
    if (s) return s;
    crew_model_default_fit(st->m, o);
    if (a->epochs) o->epochs = (int)a->epochs;
    if (a->batch) o->batch_per_device = a->batch;
    if (a->seed >= 0) o->seed = (uint64_t)a->seed;
    o->max_steps = a->max_steps;
    o->global_batch = a->global_batch;
    o->device_kind = a->device_kind;
    o->devices = (int)a->replicas;
    if (a->threads) o->threads_per_device = (int)a->threads;
    o->lr = (float)a->lr;
    o->base_batch = a->base_batch;
    o->lr_scaling = a->lr_scaling;
    o->warmup_steps = a->warmup_steps;
    o->warmup_epochs = a->warmup_epochs;
    o->bucket_mb = a->bucket_mb;
    o->sync_batch_norm = a->sync_bn;
    o->unordered_allreduce = a->allreduce == 1;
    o->shard_optimizer = a->shard_optimizer;
    if (a->shard >= 0) o->shard = a->shard;
    o->shard_unit_mb = a->shard_unit_mb;
    o->shard_overlap = a->shard_overlap == 1 ? 1 : a->shard_overlap == 2 ? -1 : 0;
    o->bind_cores = a->bind_cores == 1 ? 1 : a->bind_cores == 2 ? -1 : 0;
    o->communicator = a->comm;
    if (a->precision >= 0) o->precision = a->precision;
    o->attention_recompute = a->attention;
    o->collective_timeout_s = a->timeout;
    if (a->on_nan >= 0) o->on_nan = (crew_nan_policy)a->on_nan;
    o->drift_check_every = a->drift_every == -2 ? 0 : a->drift_every == 0 ? -1 : a->drift_every;
    o->noise_scale_every = a->noise_every < 0 ? 0 : a->noise_every == 0 ? -1 : a->noise_every;
    o->straggler_threshold = a->straggler_threshold;
    o->straggler_window = a->straggler_window;
    o->checkpoint_every = a->checkpoint_every;
    o->checkpoint_every_s = a->checkpoint_every_s;
    o->keep_checkpoints = (int)a->keep_checkpoints;
    o->resume = a->resume != NULL;
    if (a->loader_threads) o->loader_threads = (int)a->loader_threads;
    if (a->loader_inline >= 0) /* auto, on, off; not given: threads where they were asked for */
        o->loader_inline = a->loader_inline == 1 ? 1 : a->loader_inline == 2 ? -1 : 0;
    else if (a->loader_threads)
        o->loader_inline = -1;
    if (a->prefetch) o->prefetch = (int)a->prefetch;
    if (a->have_augment) o->augment = a->augment;
    o->pad_last_batch = a->pad_last;
    cli_pipeline_apply(&a->pipe, a->global_batch > 0 || a->resume, crew_group_size(cli_group()), o);
    /* The run directory was checked before (check_run_dir) and is created once the plan holds:
     * a command that fails its plan leaves nothing behind. A resumed run reads its checkpoint. */
    snprintf(st->checkpoints, sizeof st->checkpoints, "%s/checkpoints", st->run_dir);
    o->run_dir = st->run_dir;
    o->checkpoint_dir = st->checkpoints;
    o->test = st->test;
    return CREW_OK;
}

/* The split of layers into stages that the memory verdict advises: "0-4,5-7". */
static void verdict_split(const crew_memory_plan *p, char *split, size_t len)
{
    size_t used = 0;
    split[0] = '\0';
    for (int i = 0, first = 0; i < p->n_layers && used < len; i++) {
        if (i == 0 || p->layers[i].stage != p->layers[i - 1].stage) first = i;
        if (i + 1 < p->n_layers && p->layers[i + 1].stage == p->layers[i].stage) continue;
        used += (size_t)(first == i ? snprintf(split + used, len - used, "%s%d", first ? "," : "", i)
                                    : snprintf(split + used, len - used, "%s%d-%d", first ? "," : "", first, i));
    }
}

/* The model needs a pipeline: the fewest stages, then the most replicas of the pipeline, then the
 * largest micro-batch, whose every stage fits the device as crew_model_plan_stages counts it
 * (with the micro-batches in flight and the gradient sums that the verdict's rough packing
 * leaves out); the verdict's own split first, then splits balanced by compute. */
/* One candidate layout: 1 when every stage fits (t then holds it and *largest its largest stage). */
static int layout_fits(const train_state *st, crew_fit_options *t, int64_t mem, crew_fit_plan *fp, int64_t *largest)
{
    int64_t bytes[CREW_MAX_PIPELINE_STAGES];
    crew_status s = crew_model_plan_fit(st->m, st->train, t, fp);
    if (!s) s = crew_model_plan_stages(st->m, fp, bytes);
    if (s) {
        crew_status_free(s);
        return 0;
    }
    *largest = 0;
    for (int i = 0; i < fp->stages; i++) *largest = bytes[i] > *largest ? bytes[i] : *largest;
    return *largest <= mem;
}

static int pipeline_layout(const train_args *a, const train_state *st, const crew_memory_plan *p, crew_fit_options *o,
                           char *why, size_t len)
{
    static char split[512]; /* the options point at it until the run ends */
    const int64_t global = p->global_batch, mem = a->device_memory;
    verdict_split(p, split, sizeof split);
    for (int k = p->advised_devices; k <= a->devices && k <= CREW_MAX_PIPELINE_STAGES; k++)
        for (int64_t d = a->devices / k; d >= 1; d--)
            for (int own = k == p->advised_devices; own >= 0 && global % d == 0; own--)
                for (int64_t b = global / d < o->batch_per_device ? global / d : o->batch_per_device; b >= 1; b--) {
                    crew_fit_options t = *o;
                    t.devices = (int)d;
                    t.batch_per_device = b;
                    t.global_batch = global;
                    t.pipeline_stages = k;
                    t.pipeline_schedule = a->pipe.schedule >= 0 ? a->pipe.schedule : CREW_PIPELINE_1F1B;
                    t.pipeline_split = own ? split : NULL;
                    crew_fit_plan fp;
                    int64_t largest;
                    if ((global / d) % b != 0 || !layout_fits(st, &t, mem, &fp, &largest)) continue;
                    *o = t;
                    char need[32], have[32];
                    snprintf(why, len, "a pipeline of %d stages x %lld replica%s, micro-batches of %lld (%d per step), "
                             "the largest stage %s of %s: the model %s", k, (long long)d, d == 1 ? "" : "s",
                             (long long)b, fp.accumulation, crew_format_bytes(largest, need, sizeof need),
                             crew_format_bytes(mem, have, sizeof have), p->verdict_text);
                    return 0;
                }
    return cli_usage_error("train", "the model %s; with the micro-batches in flight no pipeline over at most %lld "
                           "devices fits: give more --devices or more --device-memory", p->verdict_text,
                           (long long)a->devices);
}

/* The layout's measurements (crew_layout_cached), for --layout auto and for plain runs:
 *  - --layout auto: the fastest of R replicas x cores/R BLAS threads and of one replica per core
 *    with its optimizer state sharded (measured once, cached), at the replicas' global batch;
 *  - without --layout, a plain run on every core reads the cache only (nothing is measured):
 *    sharding that measured faster is turned on, since it keeps the bits; another split of the
 *    cores that measured faster becomes a hint, since it does not;
 *  - --layout replicas: one replica per core, as given, nothing chosen.
 * The line saying what was chosen goes into `why`, a hint into `hint`. Returns 0, or the exit
 * status. */
static int choose_layout(train_args *a, const train_state *st, crew_fit_options *o, char *why, size_t len,
                         char *hint, size_t hint_len)
{
    const int cores = (int)a->devices, automatic = a->layout == 1;
    /* a run that says what to shard (--shard, --shard-optimizer) is not plain: that is the user's choice */
    const int plain = a->layout < 0 && !a->threads && a->pipe.stages <= 1 && !a->pipe.split && !a->device_memory &&
                      !a->resume && !cli_group() && !strcmp(a->device_kind, "cpu") && cores == crew_cpu_cores() &&
                      a->shard < 0 && !a->shard_optimizer;
    if (!automatic && !plain) return 0;
    crew_layout_choice c;
    int found = 0, cached = 0;
    crew_status s = cli_layout(a->model, st->train, cores, a->batch, automatic, &c, &found, &cached);
    if (s && !automatic) { /* a plain run's reading of the cache is optional */
        crew_status_free(s);
        return 0;
    }
    if (s) return cli_fail("train", s);
    if (!found) return 0;
    const char *when = cached ? "measured before on this machine" : "measured now";
    char trials[600] = "";
    cli_layout_trials_text(&c, trials, sizeof trials);
    const int shard = c.shard_optimizer && (plain || c.shard_speedup >= c.speedup);
    if (shard) { /* one replica per core, sharded: the same bits as without */
        o->shard_optimizer = 1;
        snprintf(why, len, "optimizer state sharded across the %d replicas, %.2fx the samples/s of the unsharded "
                 "ones for this model (%s%s%s); the same bits (--layout replicas keeps it off)", cores, c.shard_speedup,
                 when, cached ? "" : ": ", trials);
    }
    if (plain) {
        if (c.replicas != cores && c.speedup > 1.05 && c.speedup > (shard ? c.shard_speedup : 1.0))
            snprintf(hint, hint_len, "hint: %d replica%s x %d BLAS threads measured %.2fx the samples/s of %d replicas "
                     "x 1 thread for this model here (--layout auto takes it; the last bits differ)", c.replicas,
                     c.replicas == 1 ? "" : "s", c.threads_per_device, c.speedup, cores);
        return 0;
    }
    if (shard) return 0;
    const int64_t global = o->global_batch ? o->global_batch : (int64_t)cores * o->batch_per_device;
    a->devices = a->replicas = c.replicas;
    o->devices = c.replicas;
    o->threads_per_device = c.threads_per_device;
    o->batch_per_device = c.batch_per_device;
    o->global_batch = global;
    char against[96] = "the fastest";
    if (c.replicas != cores)
        snprintf(against, sizeof against, "%.2fx the samples/s of %d replicas x 1 thread", c.speedup, cores);
    snprintf(why, len, "%d replica%s x %d BLAS thread%s, %s (%s%s%s)%s", c.replicas, c.replicas == 1 ? "" : "s",
             c.threads_per_device, c.threads_per_device == 1 ? "" : "s", against, when, cached ? "" : ": ", trials,
             c.replicas == cores ? "" : "; the last bits differ from that layout's");
    return 0;
}

/* --device-memory: the memory planner's verdict for the asked global batch decides the layout
 * (a flag that sets the layout itself, --pipeline or --stages, wins). Its line goes into `why`.
 * 0, or the exit status after the error. */
static int plan_layout(const train_args *a, const train_state *st, crew_fit_options *o, char *why, size_t len)
{
    why[0] = '\0';
    if (!a->device_memory || a->resume || a->pipe.stages || a->pipe.split) return 0;
    crew_memory_options mo;
    crew_memory_options_init(&mo);
    mo.batch_per_device = o->batch_per_device;
    mo.devices = (int)a->devices;
    mo.global_batch = o->global_batch;
    mo.device_memory_bytes = a->device_memory;
    mo.train_samples = crew_dataset_size(st->train);
    mo.dataset_bytes = crew_dataset_memory_bytes(st->train) + crew_dataset_memory_bytes(st->test);
    mo.optimizer_sharding = a->shard_optimizer;
    mo.shard = a->shard > 0 ? a->shard : CREW_SHARD_NONE;
    mo.shard_unit_mb = a->shard_unit_mb;
    mo.shard_overlap = a->shard_overlap == 1;
    mo.no_sharding = a->shard == CREW_SHARD_NONE && !a->shard_optimizer; /* --shard none: the user's word */
    mo.device_kind = a->device_kind;
    mo.precision = o->precision;
    mo.attention_recompute = o->attention_recompute;
    crew_memory_plan p;
    crew_status s = crew_model_plan_memory(st->m, &mo, &p);
    if (s) return cli_fail("train", s);
    o->attention_recompute = p.attention_recompute; /* the planner may advise it: the same bits */
    int rc = 0;
    switch (p.verdict) {
    case CREW_MEMORY_FITS:
        snprintf(why, len, "data parallel: the model %s", p.verdict_text);
        break;
    case CREW_MEMORY_SMALLER_BATCH:
        o->batch_per_device = p.advised_batch;
        o->global_batch = p.global_batch;
        snprintf(why, len, "data parallel, batch %lld per device: the model %s", (long long)p.advised_batch, p.verdict_text);
        break;
    case CREW_MEMORY_MODEL_PARALLEL:
        rc = pipeline_layout(a, st, &p, o, why, len);
        break;
    case CREW_MEMORY_SHARD_OPTIMIZER:
        if (p.advised_devices != (int)a->devices) { /* the replica count is the user's to choose */
            rc = cli_usage_error("train", "the model %s; run it with --devices %s:%d --shard %s, or split its "
                                 "layers with --pipeline K", p.verdict_text, o->device_kind, p.advised_devices,
                                 crew_shard_level_name(p.advised_shard));
            break;
        }
        o->shard = p.advised_shard;
        if (!o->shard_overlap) o->shard_overlap = -1; /* the budget counted one buffer of each unit */
        o->batch_per_device = p.advised_batch;
        o->global_batch = p.global_batch;
        snprintf(why, len, "data parallel with %s sharded across the %d replicas: the model %s",
                 p.advised_shard == CREW_SHARD_PARAMETERS  ? "parameters, gradients and optimizer state"
                 : p.advised_shard == CREW_SHARD_GRADIENTS ? "gradients and optimizer state" : "optimizer state",
                 p.advised_devices, p.verdict_text);
        break;
    default: /* nothing fits */
        rc = cli_usage_error("train", "the model %s", p.verdict_text);
    }
    crew_memory_plan_release(&p);
    return rc;
}

/* One line on stderr for a refused run directory: the exit status 2 (s is freed). */
static int refuse_dir(crew_status s)
{
    fprintf(stderr, "crew train: %s\n", crew_status_message(s));
    crew_status_free(s);
    return 2;
}

/* A new run may not land on another run's files: a directory that is not one, or that holds
 * another run's files (unless --replace), is refused with the ways on. 0, or 2 after the error. */
static int check_new_dir(const char *path, int replace)
{
    crew_status s = crew_run_dir_usable(path);
    if (s) return refuse_dir(s);
    char held[256];
    if (replace || crew_run_dir_holds(path, held, sizeof held) == 0) return 0;
    fprintf(stderr,
            "crew train: run directory %s holds another run (%s): continue it with --resume %s, or start a new one "
            "there with --replace, which deletes those\n", path, held, path);
    return 2;
}

/* The directory before anything is loaded: a new run may not land on another run's files, a
 * resumed one needs its directory. 0, or 2 after the error. */
static int check_run_dir(const train_args *a, train_state *st)
{
    char note[5200];
    crew_run_dir_choose(a->run_dir, a->model, st->run_dir, sizeof st->run_dir);
    crew_status s = crew_run_dir_follow(st->run_dir, note, sizeof note);
    if (s) return refuse_dir(s);
    if (note[0]) fprintf(stderr, "crew train: note: %s\n", note);
    if (!a->resume) return check_new_dir(st->run_dir, a->replace);
    if ((s = crew_run_dir_check_resume(st->run_dir))) return refuse_dir(s);
    /* A resume reads and sets aside checkpoints while it prepares: it holds the lock from here.
     * A new run takes it once its plan holds (make_run_dir). */
    int rc = lock_run_dir(st);
    if (rc) return rc;
    /* Before anything is read or written there: a link where crew keeps its files is refused. */
    s = crew_run_dir_check_links(st->run_dir);
    return s ? refuse_dir(s) : 0;
}

/* ---- resuming: the checkpoint decides what changes the numbers; a flag may repeat it */

static void augment_text(const crew_augment_options *g, char *buf, size_t len)
{
    if (!g->crop_padding && !g->flip) snprintf(buf, len, "none");
    else if (!g->flip) snprintf(buf, len, "crop=%d", g->crop_padding);
    else if (!g->crop_padding) snprintf(buf, len, "flip");
    else snprintf(buf, len, "crop=%d,flip", g->crop_padding);
}

/* One refused flag: exit status 2. */
static int conflict(const char *run_dir, const char *flag, const char *given, const char *runs)
{
    fprintf(stderr,
            "crew train: cannot resume with %s %s: the run in %s has %s, and a resumed run keeps its own (leave the "
            "flag out, or start a new run)\n",
            flag, given, run_dir, runs);
    return 2;
}

/* The batch, the length and the seed. */
static int check_plan_flags(const train_args *a, const crew_fit_options *o, const crew_fit_plan *p, const char *dir)
{
    char g[64], r[96];
#define INT_FLAG(cond, flag, given, runs)                                     \
    if (cond) {                                                               \
        snprintf(g, sizeof g, "%lld", (long long)(given));                    \
        snprintf(r, sizeof r, "%lld", (long long)(runs));                     \
        return conflict(dir, flag, g, r);                                     \
    }
    INT_FLAG(a->seed >= 0 && (uint64_t)a->seed != p->seed, "--seed", a->seed, p->seed)
    INT_FLAG(a->batch && a->batch != p->batch_per_device, "--batch-per-device", a->batch, p->batch_per_device)
    INT_FLAG(a->global_batch && a->global_batch != p->global_batch, "--global-batch", a->global_batch, p->global_batch)
    INT_FLAG(a->threads && a->threads != p->threads_per_device, "--threads-per-device", a->threads, p->threads_per_device)
#undef INT_FLAG
    /* --epochs and --max-steps ask for a length: the steps they make on this dataset. */
    int64_t steps = (int64_t)o->epochs * p->steps_per_epoch;
    if (o->max_steps && o->max_steps < steps) steps = o->max_steps;
    if ((a->epochs || a->max_steps) && steps != p->total_steps) {
        snprintf(g, sizeof g, "%lld", a->max_steps ? (long long)a->max_steps : (long long)a->epochs);
        snprintf(r, sizeof r, "%lld steps (%d epoch%s); these flags make %lld", (long long)p->total_steps, p->epochs,
                 p->epochs == 1 ? "" : "s", (long long)steps);
        return conflict(dir, a->max_steps ? "--max-steps" : "--epochs", g, r);
    }
    return 0;
}

/* The learning-rate rule and warmup. */
static int check_lr_flags(const train_args *a, const crew_fit_plan *p, const char *dir)
{
    static const char *const rules[] = {"none", "linear", "sqrt"};
    char g[64], r[64];
    if (a->lr > 0 && (float)a->lr != p->base_lr) {
        snprintf(g, sizeof g, "%g", a->lr);
        snprintf(r, sizeof r, "%g", (double)p->base_lr);
        return conflict(dir, "--lr", g, r);
    }
    if (a->base_batch && a->base_batch != p->base_batch) {
        snprintf(g, sizeof g, "%lld", (long long)a->base_batch);
        snprintf(r, sizeof r, "%lld", (long long)p->base_batch);
        return conflict(dir, "--base-batch", g, r);
    }
    if (a->lr_scaling >= 0 && a->lr_scaling != (int)p->scaling)
        return conflict(dir, "--lr-scaling", rules[a->lr_scaling], (unsigned)p->scaling < 3 ? rules[p->scaling] : "?");
    int64_t warmup = a->warmup_epochs > 0 ? (int64_t)ceil(a->warmup_epochs * (double)p->steps_per_epoch) : a->warmup_steps;
    if ((a->warmup_epochs > 0 || a->warmup_steps >= 0) && warmup != p->warmup_steps) {
        snprintf(g, sizeof g, "%g (%lld steps)", a->warmup_epochs > 0 ? a->warmup_epochs : (double)a->warmup_steps,
                 (long long)warmup);
        snprintf(r, sizeof r, "%lld warmup steps", (long long)p->warmup_steps);
        return conflict(dir, a->warmup_epochs > 0 ? "--warmup-epochs" : "--warmup-steps", g, r);
    }
    return 0;
}

/* Augmentation, the last batch, batch norm, NaN handling, precision and the convolutions' way. */
static int check_data_flags(const train_args *a, const crew_fit_plan *p, const char *dir)
{
    static const char *const off_on_text[] = {"off", "on"}, *const nan_text[] = {"stop", "skip"};
    char g[128], r[128];
    if (a->have_augment && (a->augment.crop_padding != p->augment.crop_padding || !a->augment.flip != !p->augment.flip)) {
        augment_text(&a->augment, g, sizeof g);
        augment_text(&p->augment, r, sizeof r);
        return conflict(dir, "--augment", g, r);
    }
    if (a->pad_last && !p->pad_last_batch) return conflict(dir, "--pad-last", "", "the last partial batch dropped");
    if (a->sync_bn >= 0 && a->sync_bn != (p->sync_batch_norm != 0))
        return conflict(dir, "--sync-bn", off_on_text[a->sync_bn], off_on_text[p->sync_batch_norm != 0]);
    if (a->on_nan >= 0 && a->on_nan != (int)p->on_nan)
        return conflict(dir, "--on-nan", nan_text[a->on_nan], nan_text[p->on_nan == CREW_ON_NAN_SKIP]);
    if (a->precision >= 0 && a->precision != p->precision)
        return conflict(dir, "--precision", cli_precisions[a->precision], cli_precisions[p->precision == CREW_PRECISION_BF16]);
    if ((a->conv.ways[0] && strcmp(a->conv.ways, p->conv_choice) != 0) ||
        (a->conv.way >= 0 && !a->conv.ways[0] && a->conv.way != p->conv)) {
        snprintf(g, sizeof g, "%.60s", a->conv.ways[0] ? a->conv.ways : cli_conv_ways[a->conv.way]);
        snprintf(r, sizeof r, "--conv %s (ways '%.40s')", (unsigned)p->conv < 3 ? cli_conv_ways[p->conv] : "?",
                 p->conv_choice);
        return conflict(dir, "--conv", g, r);
    }
    return 0;
}

/* Every flag that changes the numbers, against the resumed run's plan: 0, or 2 after the error. */
static int check_resume_flags(const train_args *a, const crew_fit_options *o, const crew_fit_plan *p, const char *dir)
{
    int rc = check_plan_flags(a, o, p, dir);
    if (!rc) rc = check_lr_flags(a, p, dir);
    if (!rc) rc = check_data_flags(a, p, dir);
    return rc;
}

/* ---- stopping: the command that resumes the run is the one given, with --resume RUN_DIR in
 * place of what only a new run takes (--run-dir, --replace, --init-weights). */

/* Writes arg to f, in single quotes unless it is plain. */
static void put_shell_word(FILE *f, const char *arg)
{
    if (*arg && strspn(arg, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+=.,/:@%") == strlen(arg)) {
        fputs(arg, f);
        return;
    }
    fputc('\'', f);
    for (const char *c = arg; *c; c++)
        if (*c == '\'') fputs("'\\''", f);
        else fputc(*c, f);
    fputc('\'', f);
}

/* 1 when argv[i] is one of the flags the resume command leaves out; *skip: arguments it takes. */
static int dropped_flag(const char *arg, int *skip)
{
    static const char *const with_value[] = {"--run-dir", "--resume", "--init-weights"};
    *skip = 0;
    if (!strcmp(arg, "--replace")) return 1;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
        size_t n = strlen(with_value[k]);
        if (strncmp(arg, with_value[k], n) != 0) continue;
        if (arg[n] == '=') return 1;
        if (arg[n] == '\0') {
            *skip = 1;
            return 1;
        }
    }
    return 0;
}

/* "crew train MODEL ... --resume RUN_DIR" into buf (cut to len). */
static void resume_command(const train_args *a, const char *run_dir, char *buf, size_t len)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    buf[0] = '\0';
    if (!f) return;
    fputs("crew train", f);
    for (int i = 1; i < a->argc; i++) {
        int skip;
        if (dropped_flag(a->argv[i], &skip)) {
            i += skip;
            continue;
        }
        fputc(' ', f);
        put_shell_word(f, a->argv[i]);
    }
    fputs(" --resume ", f);
    put_shell_word(f, run_dir);
    if (fclose(f) == 0) snprintf(buf, len, "%s", text);
    free(text);
}

/* A run stopped by a signal before its end says so on stderr, --quiet or not. Under mpirun the
 * command runs under mpirun again (on any number of processes that shares the global batch). */
static void report_stop(const crew_fit_result *res, const crew_fit_plan *plan, const char *resume)
{
    fprintf(stderr, "crew train: stopped by signal after step %lld of %lld; the last checkpoint is %s\n",
            (long long)res->steps, (long long)plan->total_steps,
            res->last_checkpoint[0] ? res->last_checkpoint : "(none)");
    fprintf(stderr, "crew train: resume with%s: %s\n", cli_group() ? " (under mpirun, as before)" : "", resume);
}

/* The run failed: which checkpoint it can resume from. Only a committed checkpoint is named. */
static void report_failure(const crew_fit_result *res)
{
    if (res->last_checkpoint[0]) fprintf(stderr, "crew train: the last checkpoint is %s\n", res->last_checkpoint);
    else if (res->resumed_from_step > 0)
        fprintf(stderr, "crew train: the last checkpoint is still the one this run resumed from (step %lld)\n",
                (long long)res->resumed_from_step);
}

static void print_summary(const crew_fit_result *res, const crew_fit_plan *plan, const char *run_dir, int finished,
                          const char *bits_unit)
{
    char weights[700], report[700], hint[512];
    snprintf(weights, sizeof weights, "%s/weights.safetensors", run_dir);
    snprintf(report, sizeof report, "%s/report.html", run_dir);
    char peak[96] = "";
    if (plan->peak_gflops > 0 && res->peak_fraction == res->peak_fraction)
        snprintf(peak, sizeof peak, " = %.0f%% of the peak", 100 * res->peak_fraction);
    char bits[64] = "";
    if (res->test_bits == res->test_bits) snprintf(bits, sizeof bits, " (%.3f %s)", (double)res->test_bits, bits_unit);
    printf("%s after %lld steps in %.1fs (%.0f samples/s, %.1f GFLOP/s%s): test accuracy %.4f, test loss %.4f%s\n",
           finished ? "trained" : "stopped by signal", (long long)res->steps, res->wall_s, res->samples_per_s,
           res->gflops, peak, (double)res->test_accuracy, (double)res->test_loss, bits);
    printf("%s\n", res->bottleneck);
    printf("%s\n", res->noise_text);
    if (crew_fit_scaling_hint(res, plan, hint, sizeof hint)) printf("%s\n", hint);
    if (finished) printf("weights: %s\n", weights);
    else printf("weights: %s (unfinished: %lld of %lld steps)\n", weights, (long long)res->steps, (long long)plan->total_steps);
    printf("report: %s\nrun directory: %s (config.json, metrics.jsonl, tb/, checkpoints/)\n", report, run_dir);
}

/* After the plan holds and before anything is written: the flags a resume may not change; for a
 * new run the directory, its lock, and for --replace the old run's files. 0, or the exit status
 * after the error. */
static int make_run_dir(const train_args *a, const crew_fit_options *o, const crew_fit_plan *plan, train_state *st)
{
    const char *run_dir = st->run_dir;
    if (a->resume) {
        int rc = check_resume_flags(a, o, plan, run_dir);
        if (rc) return rc;
    }
    if (a->resume) return 0; /* locked since check_run_dir */
    crew_status s = crew_run_dir_create(run_dir);
    if (s) return refuse_dir(s);
    /* Under the lock, the check of check_run_dir again: another run may have started there
     * since, and even ended. */
    int rc = lock_run_dir(st);
    if (!rc) rc = check_new_dir(run_dir, a->replace);
    if (!rc && a->replace && (s = crew_run_dir_clear(run_dir))) rc = refuse_dir(s);
    return rc;
}

/* Trains the prepared fit, then writes its weights (marked with how far it got) and report.
 * Returns the exit status. */
static int run_and_save(const train_args *a, train_state *st, train_view *view)
{
    const crew_fit_plan *plan = crew_fit_get_plan(st->fit);
    const char *run_dir = st->run_dir;
    char weights[700], resume[8192];
    cli_progress_init(&view->bar, !a->quiet);
    resume_command(a, run_dir, resume, sizeof resume);
    cli_stop stop = {.grace_s = a->stop_grace, .lead = 1, .checkpoints = st->checkpoints, .resume = resume};
    cli_stop_arm(&stop);
    crew_fit_result res;
    crew_status s = crew_fit_run(st->fit, &res);
    snprintf(weights, sizeof weights, "%s/weights.safetensors", run_dir);
    if (!s && res.steps > 0) s = crew_model_save_weights_progress(st->m, weights, res.steps, plan->total_steps);
    if (s) {
        /* An input error is the user's (2); anything failing once training ran, disk full
         * included, is a failed run (1). */
        int ran = crew_status_code(s) == CREW_CODE_IO || crew_status_code(s) == CREW_CODE_NUMERIC;
        int rc = cli_fail("train", s);
        report_failure(&res);
        return ran ? 1 : rc;
    }
    /* The report is written at the end of every run; failing to write it fails nothing else. */
    crew_status rs = crew_report_write(run_dir, NULL);
    if (rs) fprintf(stderr, "crew train: no report: %s\n", crew_status_message(rs));
    crew_status_free(rs);
    int finished = res.steps == plan->total_steps;
    if (!finished) {
        report_stop(&res, plan, resume);
        cli_mpi_failed_together(); /* every process stopped after the same step: MPI ends cleanly */
    }
    if (!a->quiet) print_summary(&res, plan, run_dir, finished, view->bits_unit);
    if (!a->quiet && plan->stages > 1 && res.stages > 1) print_stage_memory(st->m, &res, plan);
    if (!a->quiet && plan->stages <= 1 && res.stage_peak_bytes[0] > 0 && (plan->shard_optimizer || a->device_memory))
        print_replica_memory(st->m, &res, plan);
    if (a->json) print_result_json(&res, weights, run_dir);
    return finished ? 0 : 1;
}

/* A process of an MPI run other than rank 0: it trains its replicas and writes nothing. A signal
 * reaching it stops the run as one reaching rank 0 does. */
static int run_follower(const train_args *a, train_state *st)
{
    cli_stop stop = {.grace_s = a->stop_grace, .rank = crew_group_rank(cli_group())};
    cli_stop_arm(&stop);
    crew_fit_result res;
    crew_status s = crew_fit_run(st->fit, &res);
    if (!s && __atomic_load_n(cli_stop_flag(), __ATOMIC_RELAXED)) {
        /* This process was signalled, so the run stopped (its result is rank 0's): it exits 1 as
         * rank 0 does, since a launcher may report any process's status, and MPI ends cleanly. */
        cli_mpi_failed_together();
        return 1;
    }
    if (!s) return 0;
    char verb[48];
    snprintf(verb, sizeof verb, "train (MPI rank %d)", crew_group_rank(cli_group()));
    int rc = cli_fail(verb, s);
    return crew_status_code(s) == CREW_CODE_IO ? 1 : rc;
}

int cli_train(int argc, char **argv)
{
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    train_state st = {0};
    const crew_process_group *g = cli_group();
    const int lead = crew_group_rank(g) == 0; /* rank 0 of an MPI run, or the only process */
    if (g && (rc = cli_agree_run("train", g, argc, argv, a.model, a.data, a.init_weights))) return rc;
    if (!lead) a.quiet = 1, a.json = 0;
    if (lead && (rc = check_run_dir(&a, &st))) {
        crew_run_lock_release(st.lock); /* a resume refused after it took the lock */
        return rc;
    }
    crew_fit_options o;
    char devices[80];
    crew_status s = load_inputs(&a, &st, &o);
    if (!lead) o.run_dir = o.checkpoint_dir = NULL; /* rank 0 owns the run directory */
    o.group = g;
    train_view view = {.quiet = a.quiet, .json = a.json, .log_every = a.log_every,
                       .bits_unit = !s && crew_dataset_classes(st.train) == 256 ? "bits per byte" : "bits per token"};
    o.on_step = on_step;
    o.on_epoch = on_epoch;
    o.on_event = on_event;
    o.user = &view;
    o.cancel = cli_stop_flag();
    char chosen[700] = "", hint[300] = "";
    crew_conv_choice *conv = NULL; /* --conv auto's measurements (o.conv_choice points into it) */
    if (!s && (rc = choose_layout(&a, &st, &o, chosen, sizeof chosen, hint, sizeof hint))) goto done;
    double per_device = 0.0; /* the peak: measured once per machine (0.3 s), then from the cache */
    if (!s && lead)
        o.peak_gflops = crew_run_peak(o.device_kind, (int)a.devices, o.threads_per_device > 0 ? o.threads_per_device : 1,
                                     crew_group_size(g), &per_device);
    char layout[1400] = "";
    if (!s && lead && (rc = plan_layout(&a, &st, &o, layout, sizeof layout))) goto done;
    if (!s && !a.resume && (rc = cli_conv_apply("train", &a.conv, st.m, lead, &o, &conv))) goto done;
    if (!s) s = crew_fit_prepare(st.m, st.train, &o, &st.fit);
    if (s) {
        rc = cli_fail("train", s);
        goto done;
    }
    if (!lead) {
        rc = run_follower(&a, &st);
        goto done;
    }
    const crew_fit_plan *plan = crew_fit_get_plan(st.fit);
    if (g)
        snprintf(devices, sizeof devices, "%d MPI ranks x %s:%lld", crew_group_size(g), a.device_kind,
                 (long long)a.devices);
    else
        snprintf(devices, sizeof devices, "%s:%lld", a.device_kind, (long long)a.devices);
    if ((rc = make_run_dir(&a, &o, plan, &st))) goto done;
    crew_run_config cfg = {a.model, a.data, devices, a.init_weights, NULL, plan};
    if ((s = crew_run_dir_write_config(st.run_dir, &cfg))) {
        fprintf(stderr, "crew train: %s\n", crew_status_message(s));
        crew_status_free(s);
        rc = 1;
        goto done;
    }
    if (!a.quiet) {
        cli_print_plan(plan, devices);
        if (layout[0]) printf("      layout (--device-memory): %s\n", layout);
        if (chosen[0]) printf("      layout (%s): %s\n", a.layout == 1 ? "--layout auto" : "measured", chosen);
        if (conv) cli_print_conv_choice(conv, plan->batch_per_device);
        if (plan->peak_gflops > 0)
            printf("      %.3g GFLOP per sample (forward and backward); peak %.1f GFLOP/s (%.0f x one device's measured GEMM rate, %.1f)\n",
                   plan->flops_per_sample / 1e9, plan->peak_gflops, plan->peak_gflops / per_device, per_device);
        printf("run directory: %s\n", st.run_dir);
        if (hint[0]) printf("%s\n", hint);
    }
    rc = run_and_save(&a, &st, &view);
done:
    crew_fit_free(st.fit);
    crew_run_lock_release(st.lock);
    free(conv);
    crew_dataset_free(st.test);
    crew_dataset_free(st.train);
    crew_model_free(st.m);
    return rc;
}
