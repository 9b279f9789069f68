/* cmd_train.c — crew train MODEL.json --data DIR [options] */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "run_dir.h"

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
    "  --bucket-mb X              gradient bucket size for the overlapped all-reduce [25]\n"
    "  --sync-bn on|off           batch-norm statistics over all replicas [on with >1 device]\n"
    "  --collective-timeout S     a replica missing a collective this long fails the run [300]\n"
    "  --on-nan stop|skip         non-finite gradients end the run (exit 1), or skip that update [stop]\n"
    "  --drift-check-every N      compare the replicas' parameter hashes every N steps; 0 = off [100]\n"
    "  --straggler-threshold X    report a replica slower than the others' median by this fraction [0.2]\n"
    "  --straggler-window N       steps per straggler verdict [50]\n"
    "  --seed S                   seed for initial weights, data order and dropout [1]\n"
    "  --init-weights FILE        start from these weights (safetensors) instead of a random init\n"
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
    "  --resume RUN_DIR           continue the run in RUN_DIR from its newest complete checkpoint,\n"
    "                             on any number of devices that shares its global batch\n"
    "  --run-dir DIR              where config.json, metrics.jsonl, tb/, checkpoints/ and\n"
    "                             weights.safetensors go\n"
    "                             [runs/<model>-<date>-<time>]\n"
    "  --json                     end with one JSON line: test_accuracy, test_loss, train_loss,\n"
    "                             epochs, steps, samples_per_s, wall_s, weights, run_dir\n"
    "  --quiet                    no progress output\n";

typedef struct train_args {
    const char *model, *data, *run_dir, *init_weights, *devices_text;
    char device_kind[32];
    int json, quiet;
    /* epochs and batch 0, seed -1: not given, the model file's */
    int64_t epochs, max_steps, batch, global_batch, seed, devices, threads, base_batch, warmup_steps;
    int lr_scaling, sync_bn, on_nan;
    int64_t drift_every, straggler_window, checkpoint_every, keep_checkpoints, loader_threads, prefetch;
    int pad_last, have_augment;
    crew_augment_options augment;
    double checkpoint_every_s;
    const char *resume;
    double lr, warmup_epochs, bucket_mb, timeout, straggler_threshold;
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

static const char *const lr_rules[] = {"none", "linear", "sqrt", NULL}; /* crew_lr_scaling's order */
static const char *const off_on[] = {"off", "on", NULL};
static const char *const nan_policies[] = {"stop", "skip", NULL}; /* crew_nan_policy's order */

/* Every flag but --help. --devices is only stored here: it is checked after MODEL.json and --data,
 * so a command missing those says so first. */
static const cli_flag_spec train_flags[] = {
    CLI_SWITCH_FLAG(train_args, "--json", json),
    CLI_SWITCH_FLAG(train_args, "--quiet", quiet),
    CLI_SWITCH_FLAG(train_args, "--pad-last", pad_last),
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
    CLI_INT_FLAG(train_args, "--seed", seed, 0, INT64_MAX),
    CLI_FLOAT_FLAG(train_args, "--lr", lr, 1e-12, 1e3),
    CLI_INT_FLAG(train_args, "--base-batch", base_batch, 1, 1 << 30),
    CLI_CHOICE_FLAG(train_args, "--lr-scaling", lr_scaling, lr_rules),
    CLI_INT_FLAG(train_args, "--warmup-steps", warmup_steps, 0, INT64_MAX / 2),
    CLI_FLOAT_FLAG(train_args, "--warmup-epochs", warmup_epochs, 0.0, 1e6),
    CLI_FLOAT_FLAG(train_args, "--bucket-mb", bucket_mb, 1e-6, 1e6),
    CLI_CHOICE_FLAG(train_args, "--sync-bn", sync_bn, off_on),
    CLI_CHOICE_FLAG(train_args, "--on-nan", on_nan, nan_policies),
    CLI_INT_FLAG(train_args, "--drift-check-every", drift_every, 0, INT64_MAX / 2),
    CLI_FLOAT_FLAG(train_args, "--straggler-threshold", straggler_threshold, 0.001, 100.0),
    CLI_INT_FLAG(train_args, "--straggler-window", straggler_window, 1, 1 << 30),
    CLI_INT_FLAG(train_args, "--loader-threads", loader_threads, 1, 256),
    CLI_INT_FLAG(train_args, "--prefetch", prefetch, 1, 1024),
    CLI_CUSTOM_FLAG("--augment", parse_augment),
    CLI_CUSTOM_FLAG("--checkpoint-every", parse_every),
    CLI_INT_FLAG(train_args, "--keep-checkpoints", keep_checkpoints, 1, 1000000),
    CLI_FLOAT_FLAG(train_args, "--collective-timeout", timeout, 0.001, 1e7),
};

/* Returns 0 to go on, -1 after --help, or the exit status. */
static int parse_args(int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    a->devices_text = "cpu";
    a->threads = 1;
    a->seed = -1;
    a->lr_scaling = -1;
    a->sync_bn = -1;
    a->warmup_steps = -1;
    a->drift_every = -2; /* not given */
    int parsed = cli_parse_args("train", usage_text, train_flags, CLI_COUNT(train_flags), argc, argv, a, &a->model);
    if (parsed) return parsed;
    if (!a->model) return cli_usage_error("train", "missing MODEL.json");
    if (a->resume && a->run_dir && strcmp(a->resume, a->run_dir) != 0)
        return cli_usage_error("train", "--resume RUN_DIR continues in RUN_DIR; --run-dir cannot name another");
    if (a->resume) a->run_dir = a->resume;
    if (!a->checkpoint_every && !a->checkpoint_every_s) a->checkpoint_every_s = 600.0;
    if (!a->data) return cli_usage_error("train", "missing --data DIR");
    if (!cli_parse_devices("train", a->devices_text, a->device_kind, sizeof a->device_kind, &a->devices)) return 2;
    return 0;
}

/* ---- progress */

typedef struct train_view {
    cli_progress bar;
    int quiet, json;
    int epoch_open;
    unsigned char shown[16 * 65]; /* events printed, by kind and replica */
} train_view;

static void on_step(void *user, const crew_step_info *s)
{
    train_view *v = user;
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
    if (v->bar.tty) {
        printf(" - test_loss: %.4f - test_accuracy: %.4f\n", (double)e->test_loss, (double)e->test_accuracy);
        v->bar.last_width = 0;
    } else {
        printf("epoch %d/%d: %lld steps in %.1fs (%.0f samples/s), loss %.4f, accuracy %.4f, test_loss %.4f, "
               "test_accuracy %.4f\n",
               e->epoch + 1, e->epochs, (long long)e->steps, e->wall_s, e->samples_per_s, (double)e->train_loss,
               (double)e->train_accuracy, (double)e->test_loss, (double)e->test_accuracy);
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

/* ---- interrupt: the first SIGINT/SIGTERM stops after the current step, a second at once. */

static volatile sig_atomic_t cancel_requested;

static void on_signal(int sig)
{
    if (cancel_requested) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    cancel_requested = 1;
}

/* ---- the run */

static void print_result_json(const crew_fit_result *r, const char *weights, const char *run_dir)
{
    char acc[32], loss[32], tloss[32], tacc[32];
    printf("{\"test_accuracy\":%s,\"test_loss\":%s,\"train_loss\":%s,\"train_accuracy\":%s,"
           "\"epochs\":%d,\"steps\":%lld,\"samples_per_s\":%.1f,\"wall_s\":%.3f,\"weights\":",
           cli_json_number(r->test_accuracy, acc, sizeof acc), cli_json_number(r->test_loss, loss, sizeof loss),
           cli_json_number(r->train_loss, tloss, sizeof tloss), cli_json_number(r->train_accuracy, tacc, sizeof tacc),
           r->epochs, (long long)r->steps, r->samples_per_s, r->wall_s);
    crew_json_write_string(stdout, weights);
    printf(",\"run_dir\":");
    crew_json_write_string(stdout, run_dir);
    printf(",\"events\":%d,\"skipped_updates\":%lld,\"bottleneck\":", r->events, (long long)r->skipped_updates);
    crew_json_write_string(stdout, r->bottleneck);
    printf("}\n");
}

typedef struct train_state {
    crew_model *m;
    crew_dataset *train, *test;
    crew_fit *fit;
    char run_dir[512], checkpoints[600];
} train_state;

static crew_status load_inputs(const train_args *a, train_state *st, crew_fit_options *o)
{
    cli_warn_slow_blas("train");
    crew_status s = crew_model_load_file(a->model, &st->m);
    if (!s) s = crew_dataset_open(a->data, "train", &st->train);
    if (!s) s = crew_dataset_open(a->data, "test", &st->test);
    if (!s && a->init_weights) s = crew_model_load_weights(st->m, a->init_weights);
    if (s) return s;
    crew_model_default_fit(st->m, o);
    if (a->epochs) o->epochs = (int)a->epochs;
    if (a->batch) o->batch_per_device = a->batch;
    if (a->seed >= 0) o->seed = (uint64_t)a->seed;
    o->max_steps = a->max_steps;
    o->global_batch = a->global_batch;
    o->device_kind = a->device_kind;
    o->devices = (int)a->devices;
    o->threads_per_device = (int)a->threads;
    o->lr = (float)a->lr;
    o->base_batch = a->base_batch;
    o->lr_scaling = a->lr_scaling;
    o->warmup_steps = a->warmup_steps;
    o->warmup_epochs = a->warmup_epochs;
    o->bucket_mb = a->bucket_mb;
    o->sync_batch_norm = a->sync_bn;
    o->collective_timeout_s = a->timeout;
    o->on_nan = (crew_nan_policy)a->on_nan;
    o->drift_check_every = a->drift_every == -2 ? 0 : a->drift_every == 0 ? -1 : a->drift_every;
    o->straggler_threshold = a->straggler_threshold;
    o->straggler_window = a->straggler_window;
    o->checkpoint_every = a->checkpoint_every;
    o->checkpoint_every_s = a->checkpoint_every_s;
    o->keep_checkpoints = (int)a->keep_checkpoints;
    o->resume = a->resume != NULL;
    if (a->loader_threads) o->loader_threads = (int)a->loader_threads;
    if (a->prefetch) o->prefetch = (int)a->prefetch;
    if (a->have_augment) o->augment = a->augment;
    o->pad_last_batch = a->pad_last;
    /* The run directory is chosen now and created once the plan holds: a command that fails
     * its plan leaves nothing behind. A resumed run reads its checkpoint there. */
    run_dir_choose(a->run_dir, a->model, st->run_dir, sizeof st->run_dir);
    snprintf(st->checkpoints, sizeof st->checkpoints, "%s/checkpoints", st->run_dir);
    o->run_dir = st->run_dir;
    o->checkpoint_dir = st->checkpoints;
    o->test = st->test;
    return CREW_OK;
}

int cli_train(int argc, char **argv)
{
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    train_state st = {0};
    crew_fit_options o;
    char err[1024], weights[700], devices[48];
    crew_status s = load_inputs(&a, &st, &o);
    train_view view = {.quiet = a.quiet, .json = a.json};
    o.on_step = on_step;
    o.on_epoch = on_epoch;
    o.on_event = on_event;
    o.user = &view;
    o.cancel = (volatile int *)&cancel_requested;
    if (!s) s = crew_fit_prepare(st.m, st.train, &o, &st.fit);
    if (s) {
        rc = cli_fail("train", s);
        goto done;
    }
    const crew_fit_plan *plan = crew_fit_get_plan(st.fit);
    const char *run_dir = st.run_dir;
    snprintf(devices, sizeof devices, "%s:%lld", a.device_kind, (long long)a.devices);
    if (run_dir_create(run_dir, err, sizeof err) != 0) {
        fprintf(stderr, "crew train: %s\n", err);
        rc = 2;
        goto done;
    }
    run_config cfg = {a.model, a.data, devices, a.init_weights, plan};
    if (run_dir_write_config(run_dir, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "crew train: %s\n", err);
        rc = 1;
        goto done;
    }
    if (!a.quiet) {
        cli_print_plan(plan, devices);
        printf("run directory: %s\n", run_dir);
    }
    cli_progress_init(&view.bar, !a.quiet);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    crew_fit_result res;
    s = crew_fit_run(st.fit, &res);
    snprintf(weights, sizeof weights, "%s/weights.safetensors", run_dir);
    if (!s && res.steps > 0) s = crew_model_save_weights(st.m, weights);
    if (s) {
        /* An input error is the user's (2); anything failing once training ran, disk full
         * included, is a failed run (1). */
        int ran = crew_status_code(s) == CREW_CODE_IO || crew_status_code(s) == CREW_CODE_NUMERIC;
        rc = cli_fail("train", s);
        if (ran) rc = 1;
        if (res.last_checkpoint[0]) fprintf(stderr, "crew train: the last checkpoint is %s\n", res.last_checkpoint);
        goto done;
    }
    /* The report is written at the end of every run; failing to write it fails nothing else. */
    char report[700];
    snprintf(report, sizeof report, "%s/report.html", run_dir);
    crew_status rs = crew_report_write(run_dir, NULL);
    if (rs) fprintf(stderr, "crew train: no report: %s\n", crew_status_message(rs));
    crew_status_free(rs);
    if (cancel_requested && !a.quiet)
        printf("stopped by signal after step %lld; checkpoint %s\nresume with: crew train %s --data %s --resume %s\n",
               (long long)res.steps, res.last_checkpoint[0] ? res.last_checkpoint : "(none)", a.model, a.data, run_dir);
    if (!a.quiet) {
        printf("%s after %lld steps in %.1fs (%.0f samples/s): test accuracy %.4f, test loss %.4f\n",
               cancel_requested ? "stopped by signal" : "trained", (long long)res.steps, res.wall_s, res.samples_per_s,
               (double)res.test_accuracy, (double)res.test_loss);
        printf("%s\n", res.bottleneck);
        char hint[512];
        if (crew_fit_scaling_hint(&res, plan, hint, sizeof hint)) printf("%s\n", hint);
        printf("weights: %s\nreport: %s\nrun directory: %s (config.json, metrics.jsonl, tb/, checkpoints/)\n", weights,
               report, run_dir);
    }
    if (a.json) print_result_json(&res, weights, run_dir);
    rc = cancel_requested ? 1 : 0;
done:
    crew_fit_free(st.fit);
    crew_dataset_free(st.test);
    crew_dataset_free(st.train);
    crew_model_free(st.m);
    return rc;
}
