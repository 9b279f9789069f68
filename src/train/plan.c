/* plan.c — resolving a fit: the batch plan (devices × per-device batch × accumulation = global
 * batch) and the learning-rate plan (base rate scaled to the global batch by the rule, gradual
 * warmup, then the schedule). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/options.h"
#include "core/status.h"
#include "train/pipeline.h"
#include "train/rank.h"
#include "train/step.h"
#include "data/dataset.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/train.h"

void crew_model_default_compile(const crew_model *m, crew_compile_options *opts)
{
    if (m && m->defaults.has_compile) {
        *opts = m->defaults.compile;
        return;
    }
    memset(opts, 0, sizeof *opts);
    opts->loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY;
    opts->optimizer.type = CREW_OPT_ADAMW;
    opts->optimizer.lr = 1e-3f;
}

void crew_model_default_fit(const crew_model *m, crew_fit_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
    opts->device_kind = "cpu";
    opts->epochs = m && m->defaults.epochs > 0 ? m->defaults.epochs : 1;
    opts->batch_per_device = m && m->defaults.batch_per_device > 0 ? m->defaults.batch_per_device : 32;
    opts->devices = 1;
    opts->threads_per_device = 1;
    opts->seed = m && m->defaults.has_seed ? m->defaults.seed : 1;
    opts->sync_batch_norm = -1;
    opts->lr_scaling = -1;
    opts->warmup_steps = -1;
    int cores = crew_cpu_cores();
    opts->loader_threads = m && m->defaults.loader_threads > 0 ? m->defaults.loader_threads : cores > 4 ? 4 : cores;
    opts->prefetch = m && m->defaults.prefetch > 0 ? m->defaults.prefetch : 2;
    opts->loader_inline = m && m->defaults.loader_threads > 0 ? -1 : 0; /* threads named: threads */
    if (m) opts->augment = m->defaults.augment;
}

static crew_status check_data(const crew_model *m, const crew_dataset *d)
{
    crew_shape out = crew_model_output_shape(m);
    int64_t classes = out.dim[out.ndim - 1], pos = crew_model_positions(m);
    if (pos != d->label_positions)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           pos > 1 ? "the model predicts a token at each of %lld positions, but dataset %s (%s) has %lld "
                                     "label(s) per sample: a language model trains on a token dataset"
                                   : "the model predicts one class per sample (%lld), but dataset %s (%s) is a token "
                                     "dataset with %lld labels per sample: it trains a language model (a gpt block)",
                           (long long)pos, d->dir, d->split, (long long)d->label_positions);
    int64_t shape[4];
    int nd = crew_dataset_sample_shape(d, shape);
    int same = nd == m->input.ndim;
    for (int i = 0; same && i < nd; i++) same = shape[i] == m->input.dim[i];
    if (!same) {
        char want[64], got[64];
        crew_shape g = {nd, {shape[0], shape[1], shape[2], shape[3]}};
        crew_shape_format(&m->input, want, sizeof want);
        crew_shape_format(&g, got, sizeof got);
        return crew_errorf(CREW_CODE_BAD_INPUT, "dataset %s (%s) has samples of shape %s but the model takes %s",
                           d->dir, d->split, got, want);
    }
    if (crew_dataset_classes(d) > classes)
        return crew_errorf(CREW_CODE_BAD_INPUT, "dataset %s has %d %s but the model outputs only %lld logits", d->dir,
                           crew_dataset_classes(d), d->tokens ? "tokens in its vocabulary" : "classes",
                           (long long)classes);
    return CREW_OK;
}

crew_status crew_check_dataset(const crew_model *m, const crew_dataset *d) { return check_data(m, d); }

static crew_status check_options(const crew_fit_options *o)
{
    if (o->epochs < 1 || o->epochs > 1000000)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "epochs must be in [1, 1000000], got %d", o->epochs);
    if (o->batch_per_device < 1 || o->batch_per_device > (1 << 20))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "batch per device must be in [1, 1048576], got %lld",
                           (long long)o->batch_per_device);
    if (o->devices < 1 || o->devices > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "devices must be in [1, 1024], got %d", o->devices);
    if (o->threads_per_device < 1 || o->threads_per_device > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "threads per device must be in [1, 1024], got %d",
                           o->threads_per_device);
    if (!(o->peak_gflops >= 0.0 && o->peak_gflops < 1e12))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the peak must be a finite number of GFLOP/s >= 0, got %g",
                           o->peak_gflops);
    if (o->bucket_mb < 0 || o->collective_timeout_s < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "bucket size and collective timeout must not be negative");
    if (o->loader_threads < 0 || o->loader_threads > 256 || o->prefetch < 0 || o->prefetch > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "loader threads must be in [1, 256] and prefetch in [1, 1024]");
    if (o->augment.crop_padding < 0 || o->augment.crop_padding > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crop padding must be in [0, 1024]");
    if (o->max_steps < 0 || o->global_batch < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "max steps and global batch must not be negative");
    if (o->lr_scaling > CREW_SCALE_SQRT || o->base_batch < 0 || !(o->warmup_epochs >= 0.0) || !isfinite(o->warmup_epochs))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "lr scaling, base batch or warmup epochs out of range");
    if (!(o->lr >= 0.0f) || !isfinite(o->lr))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "learning rate must be positive, got %g", (double)o->lr);
    return CREW_OK;
}

static float scale_factor(crew_lr_scaling rule, int64_t global, int64_t base)
{
    double ratio = (double)global / (double)base;
    switch (rule) {
    case CREW_SCALE_LINEAR: return (float)ratio;
    case CREW_SCALE_SQRT: return (float)sqrt(ratio);
    default: return 1.0f;
    }
}

/* "cannot resume on 3 devices: ...; choose 1, 2, 4 devices" */
static crew_status device_count_error(const crew_fit_options *o, const crew_checkpoint_state *st, int64_t rounds)
{
    char choices[256] = "";
    size_t used = 0;
    for (int64_t d = 1; d <= rounds && d <= 1024 && used < sizeof choices; d++)
        if (rounds % d == 0)
            used += (size_t)snprintf(choices + used, sizeof choices - used, "%s%lld", used ? ", " : "", (long long)d);
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                       "cannot resume on %d devices: the run's global batch of %lld at %lld per device is %lld "
                       "micro-batches per step, which %d devices cannot share; choose %s devices",
                       o->devices, (long long)st->plan.global_batch, (long long)st->plan.batch_per_device,
                       (long long)rounds, o->devices, choices);
}

crew_status crew_resume_options(crew_fit_options *o, const crew_checkpoint_state *st)
{
    int64_t rounds = st->plan.global_batch / st->plan.batch_per_device;
    if (o->devices < 1 || rounds % o->devices != 0) return device_count_error(o, st, rounds);
    o->seed = st->plan.seed;
    o->batch_per_device = st->plan.batch_per_device;
    o->global_batch = st->plan.global_batch;
    o->epochs = st->plan.epochs;
    o->max_steps = st->plan.total_steps;
    /* Everything else that changes the numbers comes back from the run too, so that a resume
     * needs no flag repeated. A checkpoint of an older crew does not hold it: the caller's stay. */
    if (st->has_options) {
        o->threads_per_device = st->plan.threads_per_device;
        o->augment = st->plan.augment;
        o->pad_last_batch = st->plan.pad_last_batch;
        o->sync_batch_norm = st->plan.sync_batch_norm;
        o->on_nan = st->plan.on_nan;
        o->precision = st->plan.precision;
        o->conv = st->plan.conv;
        o->conv_choice = NULL; /* the plan takes the run's ways (crew_plan_resumed) */
    }
    return CREW_OK;
}

static int has_batch_norm(const crew_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i]->spec.type == CREW_LAYER_BATCH_NORM) return 1;
    return 0;
}

/* The checkpoint's ways of convolving (an older checkpoint's "conv_library" flag: every layer one
 * way), checked against the model and this run's device kind. */
static crew_status resumed_convolutions(const crew_model *m, const crew_checkpoint_state *st, crew_fit_plan *p)
{
    if (!st->has_options) return CREW_OK;
    const int n = crew_model_conv_count(m, INT_MAX);
    char ways[CREW_MAX_CONV_LAYERS + 1] = "";
    memcpy(ways, st->plan.conv_choice, sizeof ways - 1);
    if (!ways[0] && n <= CREW_MAX_CONV_LAYERS) memset(ways, st->plan.conv == CREW_CONV_LIBRARY ? 'l' : 'i', (size_t)n);
    if (strlen(ways) != (size_t)(n <= CREW_MAX_CONV_LAYERS ? n : 0) || strspn(ways, "li") != strlen(ways))
        return crew_errorf(CREW_CODE_BAD_INPUT, "cannot resume: the checkpoint's run chose the ways of %zu convolution "
                           "layers ('%s'), this model has %d", strlen(ways), ways, n);
    if (strchr(ways, 'l') && !crew_device_kind_find(p->device_kind)->conv_library)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cannot resume on %s: the run computed convolutions by its "
                           "devices' library ('%s'), which %s has not; resume it on the run's device kind",
                           p->device_kind, ways, p->device_kind);
    p->conv = st->plan.conv;
    memcpy(p->conv_choice, ways, sizeof p->conv_choice);
    return CREW_OK;
}

/* The plan of a checkpoint's run on this run's devices: o takes the checkpoint's settings, the
 * plan its learning-rate plan. */
crew_status crew_plan_resumed(crew_model *m, const crew_dataset *train, crew_fit_options *o,
                              const crew_checkpoint_state *st, crew_fit_plan *p)
{
    /* Batch norm is the one layer whose numbers depend on the split: each replica's moving
     * statistics follow its own micro-batches, and synchronised statistics are summed over the
     * replicas. Another device count would continue another run. */
    if (has_batch_norm(m) && o->devices != st->plan.devices)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "cannot resume on %d device%s: the run trained its batch normalization on %d, and batch-norm "
                           "statistics depend on how the global batch is split; resume it on %d devices",
                           o->devices, o->devices == 1 ? "" : "s", st->plan.devices, st->plan.devices);
    CREW_TRY(crew_resume_options(o, st));
    CREW_TRY(crew_plan_fit_resolved(m, train, o, p));
    CREW_TRY(resumed_convolutions(m, st, p));
    if (p->train_samples != st->plan.train_samples || p->steps_per_epoch != st->plan.steps_per_epoch)
        return crew_errorf(CREW_CODE_BAD_INPUT, "cannot resume: the checkpoint's run trained on %lld samples (%lld steps "
                           "per epoch), this dataset has %lld (%lld steps per epoch): a different dataset?",
                           (long long)st->plan.train_samples, (long long)st->plan.steps_per_epoch,
                           (long long)p->train_samples, (long long)p->steps_per_epoch);
    p->base_lr = st->plan.base_lr;
    p->base_batch = st->plan.base_batch;
    p->scaling = st->plan.scaling;
    p->scaled_lr = st->lr.peak_lr;
    p->lr_factor = st->plan.lr_factor;
    p->warmup_steps = st->lr.warmup_steps;
    p->warmup_start_lr = st->lr.start_lr;
    p->schedule = st->lr.schedule;
    return CREW_OK;
}

crew_status crew_model_plan_fit(crew_model *m, const crew_dataset *train, const crew_fit_options *opts,
                                crew_fit_plan *p)
{
    memset(p, 0, sizeof *p);
    if (!m || !train || !opts) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_plan_fit: NULL argument");
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    CREW_TRY(crew_options_take(&o, sizeof o, opts, "crew_fit_options"));
    if (!o.resume) return crew_plan_fit_resolved(m, train, &o, p);
    /* plan as the checkpoint's run, on this run's devices */
    if (!o.checkpoint_dir) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "resume: no checkpoint directory given");
    crew_checkpoint_state st;
    CREW_TRY(crew_checkpoint_newest_state(o.checkpoint_dir, &st));
    return crew_plan_resumed(m, train, &o, &st, p);
}

static crew_status no_library(const crew_fit_plan *p, const char *asked)
{
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--conv %s on %s: its devices have no convolution library (cuda, "
                       "in a build that found cuDNN, has)", asked, p->device_kind);
}

/* One way per convolution layer (crew_fit_plan.conv_choice): as given, or from the way asked. */
static crew_status plan_convolutions(const crew_model *m, const crew_fit_options *o, crew_fit_plan *p)
{
    const crew_device_kind *k = crew_device_kind_find(p->device_kind);
    const int n = crew_model_conv_count(m, INT_MAX);
    if (o->conv != CREW_CONV_AUTO && o->conv != CREW_CONV_IM2COL && o->conv != CREW_CONV_LIBRARY)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "conv %d: expected auto, im2col or library", o->conv);
    p->conv = o->conv;
    memset(p->conv_choice, 0, sizeof p->conv_choice);
    if (o->conv_choice) {
        const size_t given = strlen(o->conv_choice);
        if (given != (size_t)n || strspn(o->conv_choice, "li") != given)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "conv choice '%.40s%s': expected one way per convolution layer "
                               "of the model ('l': the device's library, 'i': im2col + GEMM), %d of them", o->conv_choice,
                               given > 40 ? "..." : "", n);
        if (strchr(o->conv_choice, 'l') && !k->conv_library) return no_library(p, "library");
        memcpy(p->conv_choice, o->conv_choice, given);
        return CREW_OK;
    }
    if (o->conv == CREW_CONV_LIBRARY && !k->conv_library) return no_library(p, "library");
    if (n > CREW_MAX_CONV_LAYERS) {
        if (o->conv == CREW_CONV_LIBRARY)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--conv library: the model has %d convolution layers, more "
                               "than the %d a run can choose for; give --conv im2col", n, CREW_MAX_CONV_LAYERS);
        return CREW_OK; /* "": im2col throughout */
    }
    /* auto without measurements (a caller that did not run crew_conv_choose): the library where the
     * kind offers it for speed, which is every layer it runs on a GPU; im2col elsewhere */
    const int library = o->conv == CREW_CONV_LIBRARY || (o->conv == CREW_CONV_AUTO && k->conv_library && k->conv_auto);
    memset(p->conv_choice, library ? 'l' : 'i', (size_t)n);
    return CREW_OK;
}

static crew_status plan_sharding(crew_model *m, const crew_fit_options *o, crew_fit_plan *p);

/* NCCL (crew_communicator) where the kind has it, every rank of a process has a GPU of its own
 * (NCCL refuses two ranks on one GPU) and there is no pipeline (its point-to-point messages stay
 * on the host's communicator); AUTO takes it for more than one replica only. */
static crew_status plan_communicator(const crew_fit_options *o, crew_fit_plan *p)
{
    const int want = o->communicator;
    if (want != CREW_COMMUNICATOR_AUTO && want != CREW_COMMUNICATOR_HOST && want != CREW_COMMUNICATOR_NCCL)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "communicator %d: expected auto, host or nccl", want);
    const crew_device_kind *k = crew_device_kind_find(p->device_kind);
    const int processes = crew_group_size(o->group), per_process = p->devices * p->stages / processes;
    const char *why = NULL;
    if (!k->nccl)
        why = "its device kind has no NCCL (cuda, in a build that found NCCL, has)";
    else if (p->stages > 1)
        why = "a pipeline's stages talk through the host's communicator";
    else if (k->available() < 1)
        why = "no GPU is visible to this process";
    else if (per_process > k->available())
        why = "NCCL needs a GPU of its own for every replica, and this process has more replicas than GPUs";
    if (want == CREW_COMMUNICATOR_NCCL && why)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--comm nccl on %s:%d: %s", p->device_kind, per_process, why);
    p->nccl = !why && (want == CREW_COMMUNICATOR_NCCL || (want == CREW_COMMUNICATOR_AUTO && p->devices > 1));
    if (p->nccl) p->unordered_allreduce = o->unordered_allreduce != 0 && p->devices > 1;
    return CREW_OK;
}

/* The trainable values of layers [first, last), each tied parameter counted once (by its owner). */
static int64_t stage_values(const crew_model *m, int first, int last)
{
    int64_t n = 0;
    for (int i = first; i < last; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *q = &m->layers[i]->params[j];
            if (q->trainable && !q->tied) n += crew_shape_size(&q->shape);
        }
    return n;
}

/* The gradient buckets (crew_bucket_rule). Asked for: as asked. Else, where every core of this
 * process's machine runs a replica's compute (the CPU kinds, in one process, ranks × BLAS threads ≥
 * cores), one bucket reduced by the replicas themselves after backward: a
 * communication thread there takes its time from a core that computes, and the extra hand-offs of
 * several buckets made both example models slower on 2 cores at every bucket size tried
 * (docs/PERFORMANCE.md, "Where the all-reduce runs"). Where the processes are on several hosts the
 * all-reduce crosses a network, slow against shared memory: buckets of about a sixteenth of the
 * gradients (crew_hosts_bucket_mb), so that the last layers' are on the wire while the first
 * layers' backward runs (both example models 1.25x faster a step over a 1 Gbit/s link,
 * docs/PERFORMANCE.md, "Buckets across hosts"). Elsewhere (GPUs, spare cores, processes on one host)
 * PyTorch DDP's 25 MB. With several processes every input of the choice is the same on each (the
 * model, the hosts' names gathered by all), since their buckets must match: not the cores of each
 * one's affinity mask, which mpirun may set differently. */
static int every_core_computes(const crew_fit_options *o, const crew_fit_plan *p)
{
    const crew_device_kind *k = crew_device_kind_find(p->device_kind);
    const int ranks = p->devices * (p->stages > 1 ? p->stages : 1);
    const int host_cores = k && !k->memory_bytes; /* the CPU kinds: each device is the host's cores */
    return host_cores && crew_group_size(o->group) == 1 && ranks * p->threads_per_device >= crew_cpu_cores();
}

static void plan_buckets(const crew_model *m, const crew_fit_options *o, crew_fit_plan *p)
{
    int64_t n = m->n_params; /* with a pipeline: its largest stage's */
    if (p->stages > 1) {
        n = 0;
        for (int s = 0; s < p->stages; s++) {
            int64_t v = stage_values(m, p->stage_first[s], p->stage_first[s + 1]);
            n = v > n ? v : n;
        }
    }
    p->bucket_auto = o->bucket_mb <= 0;
    if (!p->bucket_auto)
        p->bucket_mb = o->bucket_mb, p->bucket_rule = CREW_BUCKETS_ASKED;
    else if (every_core_computes(o, p))
        p->bucket_mb = crew_one_bucket_mb(n), p->bucket_rule = CREW_BUCKETS_BUSY_CORES;
    else if (crew_group_hosts(o->group) > 1)
        p->bucket_mb = crew_hosts_bucket_mb(n), p->bucket_rule = CREW_BUCKETS_HOSTS;
    else
        p->bucket_mb = CREW_DEFAULT_BUCKET_MB, p->bucket_rule = CREW_BUCKETS_DDP;
    p->buckets = p->devices > 1 ? crew_bucket_count(n, p->bucket_mb) : 0;
}

/* Whether every core of this process's affinity mask computes one of its ranks, of a CPU kind. Unlike
 * the buckets' rule (every_core_computes) it asks each process about its own cores, which mpirun may
 * have bound: where the batches are prepared never changes the bits, so processes need not agree. */
static int own_cores_compute(const crew_fit_options *o, const crew_fit_plan *p)
{
    const crew_device_kind *k = crew_device_kind_find(p->device_kind);
    const int processes = crew_group_size(o->group) > 1 ? crew_group_size(o->group) : 1;
    const int mine = p->devices * (p->stages > 1 ? p->stages : 1) / processes;
    return k && !k->memory_bytes && mine * p->threads_per_device >= crew_cpu_cores();
}

/* Where each rank's batches are prepared (crew_fit_options.loader_inline). Where every core of the
 * process computes a rank, a loader thread has no core of its own: it takes turns with a replica,
 * at moments of the scheduler's choosing, so that replica reaches the next collective late and the
 * others wait for it; the 2-replica MLP lost about twice the loader's own time a step that way. On
 * the rank's own thread, as it takes each micro-batch, the work costs its time once, at the same
 * point of every replica's step (docs/PERFORMANCE.md, "The loader on the replica's thread"). With
 * spare cores, or a device that computes elsewhere, loader threads keep the batches ahead. */
static crew_status plan_loader(const crew_fit_options *o, crew_fit_plan *p)
{
    if (o->loader_inline < -1 || o->loader_inline > 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "loader_inline %d: expected -1 (threads), 0 (the planner's) or "
                           "1 (inline)", o->loader_inline);
    p->loader_inline = o->loader_inline == 1 ? 1 : o->loader_inline == 0 && own_cores_compute(o, p) ? 2 : 0;
    return CREW_OK;
}

/* Each rank's thread, and its loader threads, bound to cores of its own (crew_fit_options.bind_cores).
 * Where every core of one process computes a rank, unbound, the replicas and their loaders share
 * the cores as the scheduler likes: a loader thread that runs on the other replica's core delays
 * that replica, and the first waits for it at the next collective. Bound, each core carries one
 * replica and its loader, as two processes under `taskset` would: the 2-replica MLP ran 5% faster
 * and steadier (docs/PERFORMANCE.md, "Replicas bound to cores"). With spare cores the planner
 * leaves the threads free: the loaders then have cores of their own. */
static crew_status plan_binding(const crew_fit_options *o, crew_fit_plan *p)
{
    if (o->bind_cores < -1 || o->bind_cores > 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "bind_cores %d: expected -1 (off), 0 (the planner's) or 1 (on)",
                           o->bind_cores);
    const crew_device_kind *k = crew_device_kind_find(p->device_kind);
    const int ranks = p->devices * (p->stages > 1 ? p->stages : 1), cores = crew_cpu_cores();
    const int fits = ranks * p->threads_per_device <= cores;
    if (o->bind_cores < 0) return CREW_OK;
    if (o->bind_cores == 0) {
        p->bind_cores = ranks > 1 && fits && every_core_computes(o, p);
        return CREW_OK;
    }
    if (!k || k->memory_bytes)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--bind-cores on binds the ranks of the CPU kinds to cores; "
                           "device kind %s computes elsewhere", p->device_kind);
    if (crew_group_size(o->group) > 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--bind-cores on binds the threads of one process; under "
                           "mpirun, its --bind-to binds each process");
    if (!fits)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--bind-cores on: %d rank%s x %d BLAS thread%s need %d cores, and "
                           "this process may use %d (its affinity mask)", ranks, ranks == 1 ? "" : "s",
                           p->threads_per_device, p->threads_per_device == 1 ? "" : "s", ranks * p->threads_per_device,
                           cores);
    p->bind_cores = 1;
    return CREW_OK;
}

crew_status crew_plan_fit_resolved(crew_model *m, const crew_dataset *train, const crew_fit_options *o,
                                   crew_fit_plan *p)
{
    memset(p, 0, sizeof *p);
    CREW_TRY(check_options(o));
    CREW_TRY(crew_model_layout(m));
    CREW_TRY(check_data(m, train));
    if (o->test) CREW_TRY(check_data(m, o->test));
    crew_compile_options c;
    if (m->compiled)
        c = m->compile;
    else
        crew_model_default_compile(m, &c);

    const char *kind = o->device_kind && *o->device_kind ? o->device_kind : "cpu";
    CREW_TRY(crew_device_kind_check(kind));
    snprintf(p->device_kind, sizeof p->device_kind, "%s", kind);
    p->devices = o->devices;
    p->threads_per_device = o->threads_per_device;
    p->batch_per_device = o->batch_per_device;
    int64_t per_round = (int64_t)o->devices * o->batch_per_device;
    p->global_batch = o->global_batch ? o->global_batch : per_round;
    if (p->global_batch % per_round != 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "global batch %lld is not a multiple of devices (%d) x batch per device (%lld) = %lld; "
                           "choose %lld or %lld",
                           (long long)p->global_batch, o->devices, (long long)o->batch_per_device,
                           (long long)per_round, (long long)(p->global_batch / per_round) * per_round,
                           (long long)(p->global_batch / per_round + 1) * per_round);
    p->accumulation = (int)(p->global_batch / per_round);
    p->train_samples = crew_dataset_size(train);
    p->steps_per_epoch = o->pad_last_batch ? (p->train_samples + p->global_batch - 1) / p->global_batch
                                           : p->train_samples / p->global_batch;
    if (p->steps_per_epoch < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "dataset %s holds %lld training samples, fewer than one global batch of %lld",
                           train->dir, (long long)p->train_samples, (long long)p->global_batch);
    p->epochs = o->epochs;
    p->total_steps = p->steps_per_epoch * o->epochs;
    if (o->max_steps && o->max_steps < p->total_steps) {
        p->total_steps = o->max_steps;
        p->epochs = (int)((o->max_steps + p->steps_per_epoch - 1) / p->steps_per_epoch);
    }
    p->seed = o->seed;

    const crew_optimizer_spec *s = &c.optimizer;
    p->base_lr = o->lr > 0.0f ? o->lr : s->lr;
    p->base_batch = o->base_batch > 0 ? o->base_batch : s->base_batch > 0 ? s->base_batch : p->global_batch;
    p->scaling = o->lr_scaling >= 0 ? (crew_lr_scaling)o->lr_scaling : s->scaling;
    p->lr_factor = scale_factor(p->scaling, p->global_batch, p->base_batch);
    p->scaled_lr = p->base_lr * p->lr_factor;
    p->schedule = s->schedule;
    double warmup_epochs = o->warmup_epochs > 0 ? o->warmup_epochs : o->warmup_steps >= 0 ? 0.0 : s->warmup_epochs;
    int64_t warmup_steps = o->warmup_steps >= 0 ? o->warmup_steps : s->warmup_steps;
    if (warmup_epochs > 0) {
        p->warmup_steps = (int64_t)ceil(warmup_epochs * (double)p->steps_per_epoch);
    } else if (warmup_steps > 0 || o->warmup_steps == 0) {
        p->warmup_steps = warmup_steps;
    } else if (p->lr_factor > 1.0f) {
        /* Goyal et al.: 5 epochs of gradual warmup; never more than half of a short run. */
        int64_t five = 5 * p->steps_per_epoch, half = p->total_steps / 2;
        p->warmup_steps = five < half ? five : half;
    }
    /* Gradual warmup rises from the base rate (Goyal et al.) when scaling raised it, else from 0. */
    p->warmup_start_lr = p->lr_factor > 1.0f ? p->base_lr : 0.0f;
    /* The rest of what shapes the numbers, so that checkpoints carry it (crew_resume_options). */
    p->augment = o->augment;
    p->pad_last_batch = o->pad_last_batch != 0;
    p->sync_batch_norm = o->sync_batch_norm < 0 ? o->devices > 1 : o->sync_batch_norm != 0;
    p->on_nan = o->on_nan;
    if (o->precision != CREW_PRECISION_FP32 && o->precision != CREW_PRECISION_BF16)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "precision %d: expected fp32 or bf16", o->precision);
    p->precision = o->precision;
    if (o->attention_recompute != 0 && o->attention_recompute != 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "attention_recompute %d: expected 0 or 1", o->attention_recompute);
    p->attention_recompute = o->attention_recompute;
    CREW_TRY(plan_convolutions(m, o, p));
    crew_flops f;
    CREW_TRY(crew_model_flops(m, &f));
    p->flops_per_sample = f.total;
    p->peak_gflops = o->peak_gflops;
    p->unordered_allreduce = o->unordered_allreduce != 0 && crew_group_size(o->group) > 1;
    CREW_TRY(plan_sharding(m, o, p));
    CREW_TRY(crew_pipeline_plan(m, o, &c, p));
    /* The gradient noise scale needs a step of at least two micro-batches to hold against it. */
    if (o->noise_scale_every < -1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "noise_scale_every %lld: expected -1 (off), 0 (every step) or N",
                           (long long)o->noise_scale_every);
    p->noise_scale_every = o->noise_scale_every < 0 || p->global_batch <= p->batch_per_device ? 0
                           : o->noise_scale_every ? o->noise_scale_every : CREW_NOISE_SCALE_EVERY;
    CREW_TRY(plan_communicator(o, p));
    plan_buckets(m, o, p);
    CREW_TRY(plan_loader(o, p));
    return plan_binding(o, p);
}

const char *crew_shard_level_name(int level)
{
    static const char *const names[] = {"none", "optimizer", "gradients", "parameters"};
    return level >= 0 && level <= CREW_SHARD_PARAMETERS ? names[level] : NULL;
}

int crew_shard_level_parse(const char *name)
{
    for (int l = 0; l <= CREW_SHARD_PARAMETERS; l++)
        if (name && !strcmp(name, crew_shard_level_name(l))) return l;
    return -1;
}

/* What the replicas shard (shard_optimizer = 1 is the optimizer level), and for gradients and
 * parameters the units they gather and reduce-scatter. */
static crew_status plan_sharding(crew_model *m, const crew_fit_options *o, crew_fit_plan *p)
{
    int level = o->shard ? o->shard : o->shard_optimizer ? CREW_SHARD_OPTIMIZER : CREW_SHARD_NONE;
    if (!crew_shard_level_name(level))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "shard %d: expected none, optimizer, gradients or parameters", level);
    if (level && o->pipeline_stages > 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "sharding (%s) and a pipeline together are not supported yet: a "
                           "pipeline's stages already divide the model; drop one of them", crew_shard_level_name(level));
    if (!(o->shard_unit_mb >= 0.0) || o->shard_unit_mb > 1e6)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "shard_unit_mb %g: expected 0 (the default) or a size in MiB",
                           o->shard_unit_mb);
    p->shard = p->devices > 1 ? level : CREW_SHARD_NONE;
    p->shard_optimizer = p->shard >= CREW_SHARD_OPTIMIZER;
    p->shard_unit_mb = p->shard_units = 0;
    p->shard_pinned_unit = -1;
    if (p->shard < CREW_SHARD_GRADIENTS) return CREW_OK;
    if (crew_optimizer_layerwise(&m->compile.optimizer))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s with sharded %s is not built yet (its trust ratios need whole "
                           "tensors); --shard optimizer keeps it sharded", crew_optimizer_name(m->compile.optimizer.type),
                           crew_shard_level_name(p->shard));
    p->shard_unit_mb = o->shard_unit_mb > 0.0 ? o->shard_unit_mb : CREW_SHARD_UNIT_MB;
    const int n = crew_model_units(m, crew_bucket_values(p->shard_unit_mb), NULL, 0);
    crew_unit *u = malloc((size_t)n * sizeof *u);
    if (!u) return CREW_OOM();
    crew_model_units(m, crew_bucket_values(p->shard_unit_mb), u, n);
    p->shard_units = n;
    for (int i = 0; i < n; i++)
        if (u[i].pinned) p->shard_pinned_unit = i;
    int64_t widest, pinned;
    crew_model_unit_widths(u, n, &widest, &pinned);
    free(u);
    if (o->shard_overlap < -1 || o->shard_overlap > 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "shard_overlap %d: expected -1 (off), 0 (the planner's) or 1 (on)",
                           o->shard_overlap);
    p->shard_overlap = o->shard_overlap ? o->shard_overlap > 0 : !every_core_computes(o, p);
    crew_units_layout lay; /* rank_units.c's buffers: whether the tied weight's unit is kept apart */
    crew_units_layout_for(widest, pinned, crew_model_tied_late_ok(m), p->shard, p->shard_overlap, &lay);
    p->shard_tied_late = lay.tied_late;
    if (lay.tied_late) p->shard_pinned_unit = -1;
    return CREW_OK;
}

crew_lr_plan crew_lr_plan_of(const crew_fit_plan *p, const crew_optimizer_spec *s)
{
    crew_lr_plan lr = {0};
    lr.schedule = s->schedule;
    lr.start_lr = p->warmup_start_lr;
    lr.peak_lr = p->scaled_lr;
    lr.min_lr = s->min_lr * p->lr_factor;
    lr.warmup_steps = p->warmup_steps;
    lr.total_steps = p->total_steps;
    lr.step_size = s->step_size;
    lr.gamma = s->gamma;
    return lr;
}
