/* crew.h — the public API of libcrew.
 *
 * A Keras-like C library for training neural networks on one or many devices.
 *
 *   crew_model *m;
 *   crew_status s = crew_model_create((int64_t[]){28, 28, 1}, 3, &m);
 *   s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN});
 *   s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 256,
 *                                            .activation = CREW_ACT_RELU});
 *   ...
 *   s = crew_model_compile(m, &compile_options);
 *   s = crew_model_fit(m, train, &fit_options, &fit_result);
 *
 * Conventions
 * - Every fallible call returns a crew_status. NULL (CREW_OK) means success; anything else is an
 *   error the caller owns and releases with crew_status_free(). Its message names what was wrong
 *   (the file, the layer index, the key, the rank).
 * - The library never prints and never exits; progress reaches the caller through callbacks.
 * - Sizes in typed interfaces are counts of elements, never bytes.
 * - Tensors are row-major; images are NHWC (channels last, as Keras).
 * - Option structs (crew_fit_options, crew_verify_options, crew_memory_options,
 *   crew_scale_options) begin with struct_size. Fill one with its initialiser (crew_model_default_fit,
 *   crew_verify_options_init, ...), which sets struct_size to the size this header declares, then
 *   change the fields you want. Fields are only ever added at the end, and the library reads only
 *   the first struct_size bytes (the rest keep their defaults), so a program built against an
 *   older crew.h keeps working with a newer library. A struct_size of 0 is an error saying so.
 */
#ifndef CREW_H
#define CREW_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum crew_code {
    CREW_CODE_OK = 0,
    CREW_CODE_INVALID_ARGUMENT = 1, /* a bad option, flag or API argument */
    CREW_CODE_BAD_INPUT = 2,        /* malformed file or data from outside */
    CREW_CODE_IO = 3,               /* the operating system refused a read or write */
    CREW_CODE_OUT_OF_MEMORY = 4,
    CREW_CODE_NUMERIC = 5,          /* NaN or infinity where a number was needed */
    CREW_CODE_TIMEOUT = 6,          /* a collective missed its deadline */
    CREW_CODE_DIVERGED = 7,         /* replicas no longer hold equal parameters */
    CREW_CODE_CANCELLED = 8,        /* the caller asked the run to stop */
    CREW_CODE_INTERNAL = 9,
} crew_code;

typedef struct crew_error *crew_status;
#define CREW_OK ((crew_status)0)

crew_code crew_status_code(crew_status s);       /* CREW_CODE_OK for NULL */
const char *crew_status_message(crew_status s);  /* "ok" for NULL */
void crew_status_free(crew_status s);            /* accepts NULL */

/* ---------------------------------------------------------------- layers */

typedef enum crew_layer_type {
    CREW_LAYER_DENSE = 1,
    CREW_LAYER_CONV2D,
    CREW_LAYER_MAX_POOL2D,
    CREW_LAYER_AVG_POOL2D,
    CREW_LAYER_GLOBAL_AVG_POOL2D,
    CREW_LAYER_FLATTEN,
    CREW_LAYER_ACTIVATION,
    CREW_LAYER_DROPOUT,
    CREW_LAYER_BATCH_NORM,
    CREW_LAYER_LAYER_NORM,
    CREW_LAYER_EMBEDDING,
    /* GPT (docs/MODEL_FILES.md, "gpt"): token ids [T] → token + learned position embedding [T, dim] */
    CREW_LAYER_GPT_EMBEDDING,
    /* one pre-norm transformer block over [T, C]: x + attn(ln_1(x)), then + mlp(ln_2(x)); causal
     * multi-head self-attention with `heads` heads, a 4·C GELU (tanh form) MLP */
    CREW_LAYER_TRANSFORMER_BLOCK,
    /* logits [T, vocab] = x [T, C] · tableᵀ, where table is the token embedding of the layer named
     * by `tie` (tied weights: one parameter, two uses) */
    CREW_LAYER_LM_HEAD,
} crew_layer_type;

typedef enum crew_activation {
    CREW_ACT_NONE = 0, /* linear */
    CREW_ACT_RELU,
    CREW_ACT_GELU,     /* exact (erf) form, as Keras and PyTorch by default */
    CREW_ACT_TANH,
    CREW_ACT_SIGMOID,
    CREW_ACT_SOFTMAX,  /* only as the last layer before a cross-entropy loss: fused into it */
    CREW_ACT_GELU_TANH, /* GPT-2's tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) */
} crew_activation;

typedef enum crew_padding { CREW_PAD_VALID = 0, CREW_PAD_SAME = 1 } crew_padding;

/* One layer to append to a model. Fields not used by a type are ignored; a zero means "the
 * default" (shown in brackets). */
typedef struct crew_layer_spec {
    crew_layer_type type;
    const char *name;           /* [type-derived, Keras style: dense, dense_1, ...] */
    crew_activation activation; /* dense, conv2d, activation */
    int64_t units;              /* dense: output features */
    int64_t filters;            /* conv2d: output channels */
    int kernel[2];              /* conv2d: kernel height, width */
    int strides[2];             /* conv2d, pooling [1,1 for conv; pool size for pooling] */
    int pool[2];                /* pooling window [2,2] */
    crew_padding padding;       /* conv2d, pooling [valid] */
    int no_bias;                /* dense, conv2d: 1 to omit the bias */
    float rate;                 /* dropout: fraction dropped, in [0, 1); transformer_block: of each
                                   residual branch, in training */
    float momentum;             /* batch norm: running-statistics momentum [0.99, as Keras] */
    float epsilon;              /* batch/layer norm [1e-3 as Keras] */
    int64_t vocab;              /* embedding: input_dim */
    int64_t dim;                /* embedding: output_dim; gpt_embedding: width C */
    int64_t heads;              /* transformer_block: attention heads (dividing the width) */
    int blocks;                 /* transformer_block: blocks in the model, which scales the init of
                                   the residual projections (GPT-2: 0.02/√(2·blocks)) [1] */
    const char *tie;            /* lm_head: the layer whose token table it shares [the first
                                   gpt_embedding or embedding] */
} crew_layer_spec;

/* ---------------------------------------------------------------- model */

typedef struct crew_model crew_model;

/* A model taking samples of the given shape (without the batch axis). */
crew_status crew_model_create(const int64_t *input_shape, int ndim, crew_model **out);
crew_status crew_model_add(crew_model *m, const crew_layer_spec *spec);
/* Reads a model file: crew's own JSON format, or Keras 3 model.to_json() of a Sequential model.
 * The file's loss, optimizer and training settings are kept as the model's defaults. */
crew_status crew_model_load_file(const char *path, crew_model **out);
/* The same from JSON text in memory (len bytes; NUL-terminated or not), Keras's model.to_json() say;
 * `what` names the text in messages as the path does for a file. */
crew_status crew_model_parse_json(const char *text, size_t len, const char *what, crew_model **out);
void crew_model_free(crew_model *m);

int64_t crew_model_param_count(const crew_model *m);  /* trainable parameters */
int crew_model_layer_count(const crew_model *m);
/* One line per layer, Keras summary style, into buf (always NUL-terminated). */
void crew_model_summary(const crew_model *m, char *buf, size_t buf_len);

typedef enum crew_loss { CREW_LOSS_SOFTMAX_CROSS_ENTROPY = 1 } crew_loss;
typedef enum crew_optimizer_type {
    CREW_OPT_SGD = 1,
    CREW_OPT_ADAMW,
    /* Layer-wise adaptive rates for large batches: each tensor's update scaled by a trust ratio of
     * norms over the whole tensor (docs/MODEL_FILES.md, "Optimizers"). */
    CREW_OPT_LAMB, /* You et al. 2019: Adam's direction plus weight decay, times ‖w‖ / ‖update‖ */
    CREW_OPT_LARS, /* You et al. 2017: SGD with momentum on trust · ‖w‖ / (‖g‖ + wd‖w‖) times (g + wd·w) */
} crew_optimizer_type;
typedef enum crew_schedule_type {
    CREW_SCHED_CONSTANT = 0,
    CREW_SCHED_STEP,   /* lr * gamma^(floor(step / step_size)) */
    CREW_SCHED_COSINE, /* from lr down to min_lr over the run */
} crew_schedule_type;
typedef enum crew_lr_scaling {
    CREW_SCALE_NONE = 0,
    CREW_SCALE_LINEAR, /* lr * global_batch / base_batch (Goyal et al. 2017) */
    CREW_SCALE_SQRT,   /* lr * sqrt(global_batch / base_batch), for Adam-type optimizers */
} crew_lr_scaling;

typedef struct crew_optimizer_spec {
    crew_optimizer_type type;
    float lr;            /* base learning rate, tuned for base_batch */
    int64_t base_batch;  /* the global batch lr was tuned for [the global batch: no scaling] */
    crew_lr_scaling scaling;
    float momentum;      /* sgd, lars */
    int nesterov;        /* sgd, lars */
    double beta1, beta2;  /* adamw, lamb [0.9, 0.999]: double, as written in the model file, so that 1 − β
                             and 1 − βᵗ are the constants PyTorch computes from the same numbers */
    float eps;            /* adamw [1e-8], lamb [1e-6]; lars: in its ratio's denominator [0] */
    float weight_decay;  /* decoupled for adamw; added to the gradient for sgd; lamb: added to the update
                            before its trust ratio; lars: added to the gradient before its ratio */
    float trust;          /* lars: the trust coefficient η of its ratio [0.001] */
    float clip_norm;     /* clip gradients to this global L2 norm; 0 = off */
    crew_schedule_type schedule;
    int64_t warmup_steps; /* gradual warmup to the scaled rate over this many steps; 0 = automatic:
                             5 epochs (at most half the run) when scaling raised the rate, else none */
    float warmup_epochs;  /* the same in epochs, when > 0 (wins over warmup_steps) */
    int64_t step_size;    /* step schedule: steps between decays */
    float gamma;          /* step schedule: decay factor */
    float min_lr;         /* cosine: final learning rate */
} crew_optimizer_spec;

typedef struct crew_compile_options {
    crew_loss loss;
    crew_optimizer_spec optimizer;
} crew_compile_options;

/* Fills opts with the loss and optimizer the model file named, or crew's defaults
 * (softmax cross-entropy, AdamW at lr 1e-3). */
void crew_model_default_compile(const crew_model *m, crew_compile_options *opts);
/* Checks and records the loss and optimizer that fits of m use; the optimizer's state itself is
 * made by each fit, on each replica's device. */
crew_status crew_model_compile(crew_model *m, const crew_compile_options *opts);

/* ---------------------------------------------------------------- data */

typedef struct crew_dataset crew_dataset;

/* Opens one split ("train", "test") of a dataset directory written by crew prep. */
crew_status crew_dataset_open(const char *dir, const char *split, crew_dataset **out);
void crew_dataset_free(crew_dataset *d);
int64_t crew_dataset_size(const crew_dataset *d);          /* samples */
/* Bytes of memory the open split holds of its own: the copy of its sample array it reads samples
 * from (arrays of 2 to 256 MiB, docs/DATA.md), else 0 (it reads the mapped files, whose pages the
 * kernel may drop and read again). The memory planner's host line counts it (crew_memory_options). */
int64_t crew_dataset_memory_bytes(const crew_dataset *d);
int crew_dataset_classes(const crew_dataset *d);           /* number of label classes */
/* Shape of one sample (without batch axis); returns its ndim. */
int crew_dataset_sample_shape(const crew_dataset *d, int64_t shape[4]);
/* 1 for a token dataset (crew prep text, llm.c shards): its samples are windows of `context`
 * tokens [context] (at first the manifest's seq_len), labelled with the next token at every
 * position; its held-out split is "val" ("test" opens it too). */
int crew_dataset_is_tokens(const crew_dataset *d);
/* Re-cuts a token dataset into windows of `context` tokens (a GPT's context): an error when no
 * shard holds context + 1 tokens. */
crew_status crew_dataset_set_context(crew_dataset *d, int64_t context);
/* The dataset's files that are symbolic links to files outside its directory, one line each
 * ("data/fm/train_x.npy is a symbolic link to /big/fm/train_x.npy, outside data/fm: read from
 * there"): crew reads them, and the CLI says so (docs/DATA.md, "Symbolic links"). "" when none. */
const char *crew_dataset_note(const crew_dataset *d);
/* crew_dataset_open for training or evaluating model m: a token dataset is cut into windows of
 * m's context (crew_model_context) when m is a language model. */
crew_status crew_dataset_open_for(const crew_model *m, const char *dir, const char *split, crew_dataset **out);

/* A dataset over arrays in memory (NumPy's, say), read where they are: no copy. The dataset
 * borrows them: they must stay, unchanged, until crew_dataset_free, and crew never writes or frees
 * them. Their values reach the model as they are (no normalisation: what Keras's fit does with
 * arrays); `crew prep arrays` writes a dataset directory that trains to the same bits. Every label
 * is checked against `classes`, and every float32 value must be finite: an error names the sample. */
typedef enum crew_array_type { CREW_ARRAY_U8 = 1, CREW_ARRAY_I32 = 2, CREW_ARRAY_F32 = 3 } crew_array_type;
typedef struct crew_arrays {
    const void *x;              /* [n, sample_shape...] C order, x_type */
    int x_type;                 /* CREW_ARRAY_U8 or CREW_ARRAY_F32 */
    const int64_t *sample_shape;/* [sample_ndim]: one sample's shape, e.g. {28, 28, 1} */
    int sample_ndim;            /* 1 to 3 */
    const void *y;              /* [n] class labels, y_type */
    int y_type;                 /* CREW_ARRAY_U8 or CREW_ARRAY_I32 */
    int64_t n;                  /* samples */
    int classes;                /* labels are in [0, classes) */
    const char *name;           /* for messages ("x", "validation_data"); NULL: "arrays" */
} crew_arrays;
crew_status crew_dataset_from_arrays(const crew_arrays *a, crew_dataset **out);

typedef void (*crew_progress_fn)(void *user, int64_t done, int64_t total, const char *what);

/* Converts the gzipped IDX files of Fashion-MNIST (src, e.g. /usr/share/datasets/fashion-mnist)
 * into a dataset directory, written atomically. */
crew_status crew_prep_fashion_mnist(const char *src_dir, const char *out_dir,
                                    crew_progress_fn progress, void *user);
/* Any MNIST-style IDX pair (gzipped or not) into the train split of a dataset; with
 * test_images/test_labels NULL the last 1/7 of the samples becomes the test split. */
crew_status crew_prep_idx(const char *images, const char *labels, const char *test_images,
                          const char *test_labels, const char *out_dir,
                          crew_progress_fn progress, void *user);
/* CIFAR-10's binary version: src_dir holds data_batch_1.bin .. data_batch_5.bin (the train
 * split) and test_batch.bin, records of 1 label byte + 3072 bytes of planar 32x32 R, G, B;
 * class names come from batches.meta.txt when present. Writes x uint8 [N, 32, 32, 3] (NHWC). */
crew_status crew_prep_cifar10(const char *src_dir, const char *out_dir,
                              crew_progress_fn progress, void *user);

typedef struct crew_image_prep_options {
    int height, width;    /* every image is resized to height x width */
    int channels;         /* 1 (grey) or 3 (RGB) */
    double test_fraction; /* in (0, 1): per class, this fraction (rounded) becomes the test split */
    uint64_t seed;        /* chooses which images are held out */
} crew_image_prep_options;
/* A folder of class folders, src_dir/<class>/<image> with .png, .jpg or .jpeg images; class i is
 * the i-th folder name in byte order. Writes x uint8 [N, height, width, channels]; files with
 * other extensions are skipped. */
crew_status crew_prep_images(const char *src_dir, const crew_image_prep_options *opts,
                             const char *out_dir, crew_progress_fn progress, void *user);
/* A CSV file of numbers with a header line; label_column names the column of class labels
 * (non-negative integers), every other column becomes a float32 feature: x [N, F], y int32 [N].
 * test_fraction in (0, 1) of each class, chosen by seed, becomes the test split. */
crew_status crew_prep_csv(const char *file, const char *label_column, double test_fraction,
                          uint64_t seed, const char *out_dir,
                          crew_progress_fn progress, void *user);
/* Arrays (crew_arrays; NumPy's .npy files through `crew prep arrays`) as they are: the manifest's
 * normalisation changes no value (scale 1, mean 0, std 1), so a model trains on the directory to
 * the bits it trains to on the arrays in memory (crew_dataset_from_arrays). The test split is
 * `test` (its shape and dtypes the training arrays'), or, with test == NULL and test_fraction in
 * (0, 1), that fraction of each class of `train`, chosen by seed; with neither, the directory has
 * a train split only (enough for crew verify, crew plan and crew scale). train->classes counts
 * the classes of both. */
crew_status crew_prep_arrays(const crew_arrays *train, const crew_arrays *test, double test_fraction, uint64_t seed,
                             const char *out_dir, crew_progress_fn progress, void *user);
/* crew_prep_arrays from .npy files (`crew prep arrays`): x uint8 or float32 [n, sample...], y [n]
 * uint8, int32 or int64 class labels (NumPy's default integer); the classes are one more than the
 * largest label of either split. test_x and test_y go together, or are both NULL. */
crew_status crew_prep_npy(const char *x, const char *y, const char *test_x, const char *test_y, double test_fraction,
                          uint64_t seed, const char *out_dir, crew_progress_fn progress, void *user);
/* Any file as byte tokens (vocab 256) in llm.c token shards: out_dir/train_000000.bin, ...
 * and, when test_fraction > 0, val_000000.bin from the last test_fraction of the bytes, plus a
 * manifest.json recording them and seq_len (each shard must hold at least seq_len + 1 tokens). */
crew_status crew_prep_text(const char *file, int64_t seq_len, double test_fraction,
                           const char *out_dir, crew_progress_fn progress, void *user);
/* A directory of llm.c GPT-2 token shards (as llm.c's fineweb.py or tinyshakespeare.py write
 * them) as a token dataset: every regular file *.bin of src_dir whose name contains "_train" is a
 * train shard, "_val" a val shard, in byte order of the names; other files are ignored. Each
 * shard must be a valid llm.c shard with every token in [0, vocab) (2 ≤ vocab ≤ 65536; GPT-2's is
 * 50257), and each split must hold a shard of at least seq_len + 1 tokens. The shards are hard-
 * linked (copied where a link fails) into out_dir as train_000000.bin, ..., val_000000.bin, with
 * a manifest.json named after src_dir's base name; written atomically. */
crew_status crew_prep_shards(const char *src_dir, int vocab, int64_t seq_len, const char *out_dir,
                             crew_progress_fn progress, void *user);

/* Per-sample augmentations, applied by the loader's threads with per-sample random keys. */
typedef struct crew_augment_options {
    int crop_padding;          /* random crop: pad by this many pixels, crop back at a random offset; 0 off */
    int flip;                  /* random horizontal flip */
} crew_augment_options;

/* Samples per second the loader alone prepares from d with `threads` threads and `prefetch` steps
 * ahead (gather, normalise, augment; no model): what crew bench-data prints. */
crew_status crew_bench_loader(const crew_dataset *d, int threads, int prefetch, const crew_augment_options *augment,
                              int64_t batch, int64_t steps, double *samples_per_s);

/* ---------------------------------------------------------------- training */

typedef struct crew_step_info {
    int64_t step;          /* optimizer steps done, 1-based */
    int64_t steps_total;   /* planned optimizer steps */
    int epoch;             /* 0-based */
    int64_t epoch_step;    /* 1-based step within the epoch */
    int64_t epoch_steps;   /* steps per epoch */
    float loss;            /* mean loss of this step's global batch */
    float accuracy;        /* fraction of this step's global batch classified right */
    float lr;              /* learning rate applied */
    double step_s;         /* wall time of the step */
    double elapsed_s;      /* since the start of the epoch */
    /* Where rank 0's step went, in seconds (the sum is close to step_s): */
    double data_s;         /* gathering and normalising its batches */
    double forward_s;
    double backward_s;     /* including the loss */
    double comm_exposed_s; /* waiting for gradient all-reduces after backward ended */
    double comm_hidden_s;  /* all-reduce time that overlapped the backward pass */
    double optimizer_s;    /* metrics reduction and the update */
    /* The gradient noise scale B_simple so far (crew_fit_result.noise_scale), NaN while unknown. */
    double noise_scale;
} crew_step_info;

typedef struct crew_epoch_info {
    int epoch;             /* 0-based */
    int epochs;
    int64_t steps;         /* optimizer steps in this epoch */
    float train_loss;      /* mean over the epoch */
    float train_accuracy;
    float test_loss;       /* NaN when no test set was given */
    float test_accuracy;
    double wall_s;         /* training steps of this epoch, evaluation excluded */
    double samples_per_s;
    /* A language model's test loss in bits per token (test_loss / ln 2; per byte on byte-level
     * data, whose tokens are bytes); NaN for a classifier or without a test set. */
    float test_bits;
} crew_epoch_info;

/* Something that needs a person's attention; the run goes on unless said otherwise. */
typedef enum crew_event_kind {
    CREW_EVENT_INFO = 0,
    CREW_EVENT_STRAGGLER,      /* a replica computes markedly slower than the others */
    CREW_EVENT_INPUT_BOUND,    /* replicas wait for data for a noticeable part of each step */
    CREW_EVENT_NAN,            /* a NaN or infinity in the gradients (the loss follows them) */
    CREW_EVENT_SKIPPED_UPDATE, /* with on_nan = skip: that step's update was not applied */
    CREW_EVENT_LOSS_SPIKE,     /* the loss jumped far above its recent values */
    CREW_EVENT_DIVERGENCE,     /* replicas hold different parameters */
    CREW_EVENT_HANG,           /* a replica missed a collective's deadline */
} crew_event_kind;

typedef struct crew_event_info {
    crew_event_kind kind;
    const char *kind_name;     /* "straggler", "input_bound", ... as in metrics.jsonl */
    int64_t step;              /* 1-based step it concerns */
    int rank;                  /* the replica it concerns, or -1 */
    double value;              /* the figure it is about (ratio, fraction, z-score), or NaN */
    const char *message;       /* one line, with the figures */
} crew_event_info;

typedef enum crew_nan_policy {
    CREW_ON_NAN_STOP = 0,      /* end the run with CREW_CODE_NUMERIC before the bad update */
    CREW_ON_NAN_SKIP,          /* skip that update, count it, report it, go on */
} crew_nan_policy;

typedef struct crew_fit_options {
    size_t struct_size;         /* sizeof(crew_fit_options), set by crew_model_default_fit */
    int epochs;                 /* [model file's, else 1] */
    int64_t max_steps;          /* stop after this many optimizer steps; 0 = no limit */
    int64_t batch_per_device;   /* samples per replica per micro-batch [model file's, else 32] */
    int64_t global_batch;       /* samples per optimizer step; 0 = devices × batch_per_device.
                                   A multiple of devices × batch_per_device: the rest is
                                   gradient accumulation. */
    const char *device_kind;    /* the kind of device each replica runs on (crew_device_kinds) [cpu] */
    int devices;                /* replicas, one per device [1] */
    int threads_per_device;     /* CPU kinds: BLAS threads per replica [1] */
    double bucket_mb;           /* gradient bucket size for overlapped all-reduce [0: the planner's choice,
                                   crew_fit_plan.bucket_mb] */
    int sync_batch_norm;        /* batch statistics over all replicas: -1 auto (on when devices > 1), 0, 1 */
    double collective_timeout_s;/* a replica missing a collective for this long fails the run [300] */
    uint64_t seed;              /* [model file's, else 1] */
    float lr;                   /* overrides the compiled base learning rate when > 0 */
    int64_t base_batch;         /* overrides the batch lr was tuned for when > 0 */
    int lr_scaling;             /* overrides the rule when >= 0 (a crew_lr_scaling); -1 = compiled */
    int64_t warmup_steps;       /* overrides the warmup when >= 0 (0 = none); -1 = compiled or automatic */
    double warmup_epochs;       /* warmup as a number of epochs, when > 0 (wins over warmup_steps) */
    const crew_dataset *test;   /* evaluated at the end of each epoch when not NULL */
    /* Progress, called by replica 0's thread (not the caller's), one call at a time: */
    void (*on_step)(void *user, const crew_step_info *info);
    void (*on_epoch)(void *user, const crew_epoch_info *info);
    void (*on_event)(void *user, const crew_event_info *info);
    /* Telemetry: with run_dir set, the run writes run_dir/metrics.jsonl (docs/METRICS.md) and
     * TensorBoard event files in run_dir/tb/. */
    const char *run_dir;
    crew_nan_policy on_nan;
    int64_t drift_check_every;  /* hash every replica's parameters each this many steps [100]; <0 off */
    double straggler_threshold; /* slower than the median of the others by this fraction [0.2] */
    int64_t straggler_window;   /* steps per straggler verdict [50] */
    double loss_spike_z;        /* z-score of a loss spike over the last 100 steps [6] */
    /* The loader (docs/DATA.md): threads preparing batches ahead of the replicas. */
    int loader_threads;         /* [model file's, else min(4, cores)] */
    int prefetch;               /* steps prepared ahead [model file's, else 2] */
    crew_augment_options augment; /* [model file's, else none] */
    int pad_last_batch;         /* 1: pad the last partial global batch of an epoch; 0: drop it */
    /* Checkpoints (docs/CHECKPOINTS.md): into checkpoint_dir/step-XXXXXXXX/ every so many steps
     * and/or seconds, and when the run is cancelled. */
    const char *checkpoint_dir;     /* NULL: no checkpoints */
    int64_t checkpoint_every;       /* steps; 0: not by steps */
    double checkpoint_every_s;      /* seconds; 0: not by time */
    int keep_checkpoints;           /* newest complete ones kept [3] */
    /* Continue from the newest complete checkpoint in checkpoint_dir (an older one when the newest
     * is damaged; an intact one of another model is refused, untouched). The global batch,
     * per-device batch, length, seed and learning-rate plan are the checkpoint's, and so are
     * threads_per_device, augment, pad_last_batch, sync_batch_norm and on_nan (crew_fit_get_plan
     * shows them); devices may differ (the accumulation is recomputed), except for a model with
     * batch normalization. docs/CHECKPOINTS.md. */
    int resume;
    void *user;
    volatile int *cancel;       /* when it becomes non-zero the run stops after the step (or, set during an
                                   epoch's end, before the next epoch); read with a relaxed atomic load, so
                                   set it with an atomic store (a signal handler may) */
    /* Processes (crew_process_group, below): this process runs `devices` replicas of the run's
     * devices × processes, numbered process by process. Process 0 owns the outputs (monitor,
     * checkpoints, the result); the others write nothing. Every process's model ends with the
     * trained values (without a pipeline across processes; with one, process 0's alone). NULL: this
     * process alone. */
    const struct crew_process_group *group;
    /* The run's devices' peak, GFLOP/s (crew_measure_peak, times the replicas); each step then
     * records its FLOP rate as a fraction of it. 0: unknown, only the rate is recorded. */
    double peak_gflops;
    /* 1: across processes, the all-reduces are MPI's own (MPI_Iallreduce after each process's
     * ordered sum of its replicas'), and with NCCL, NCCL's own (ncclAllReduce): as fast as the
     * library, but its order of the sums, so the last bits of the results, may change with the
     * process or GPU count and the library, and a process that goes missing is reported without
     * its name. The plan says so. 0: crew's ordered all-reduce, bitwise the same for any split of
     * the work [0]. No effect in one process on the host's communicator. */
    int unordered_allreduce;
    /* 1: optimizer-state sharding (ZeRO stage 1, docs/ARCHITECTURE.md "Sharding"): each
     * of the replicas keeps the optimizer state of 1/devices of the parameters and updates only
     * those; gradients are reduce-scattered and parameters all-gathered instead of the gradients
     * all-reduced. The same bits as without, on any replica count; checkpoints are the ordinary
     * ones. Data parallelism only (no pipeline); no effect with one replica [0]. */
    int shard_optimizer;
    /* Pipeline model parallelism (docs/PIPELINE.md): the model's layers cut into pipeline_stages
     * contiguous stages, one device each, so that each device holds only its stage's parameters,
     * gradients and optimizer state; `devices` stays the number of data-parallel replicas, each a
     * pipeline, devices × pipeline_stages devices in all. Each replica's accumulation micro-batches
     * flow through its stages in the order pipeline_schedule says; every stage sums its gradients
     * in micro-batch order, so the weights equal one device accumulating the same micro-batches,
     * bit for bit, in one process or across processes. 0 or 1: no pipeline [0]. */
    int pipeline_stages;
    int pipeline_schedule;      /* a crew_pipeline_schedule [CREW_PIPELINE_1F1B] */
    /* each stage's first layer, "0-3,4-9" style ranges over every layer (crew_pipeline_split_parse);
     * NULL: stages of balanced compute (crew_pipeline_split_balanced) */
    const char *pipeline_split;
    /* A pipeline across processes (group): 0 or 1, each process runs `devices` whole replicas,
     * devices × pipeline_stages ranks; R > 1: each replica's stages span R consecutive processes,
     * pipeline_stages / R stages in each (ranks numbered process by process, a replica's stages in
     * order), so the run has processes / R replicas and `devices` must be 1 [0]. */
    int pipeline_processes;
    /* How the replicas talk (a crew_communicator) [CREW_COMMUNICATOR_AUTO]. */
    int communicator;
    /* The precision of the GEMMs (a crew_precision) [CREW_PRECISION_FP32]; the device kind must
     * have it. Part of what shapes the numbers: a checkpoint keeps it and a resumed run takes it. */
    int precision;
    /* How the convolution layers compute (a crew_conv_way) [CREW_CONV_AUTO]. Shapes the numbers:
     * the plan resolves it to one way per layer (crew_fit_plan.conv_choice), which checkpoints
     * keep and a resumed run takes. */
    int conv;
    /* The ways themselves, one character per convolution layer in the model's order: 'l' by the
     * device's library, 'i' by im2col + GEMM (crew_conv_choice.ways, from crew_conv_choose's
     * measurements and their cache). Given, it is taken as it is, whatever conv says; NULL: conv
     * decides, and CREW_CONV_AUTO on a kind with a library measures here (crew_fit_prepare, on
     * process 0 of a group), which two fits may settle differently where the ways are close. */
    const char *conv_choice;
    /* 1: transformer blocks keep no attention probabilities for the backward pass but compute them
     * again there (the same GEMM and softmax on the q and k they keep: the same bits), in one
     * buffer the model's blocks share instead of one each: a GPT's largest activation, for one
     * more q·kᵀ GEMM and softmax per block in backward [0]. */
    int attention_recompute;
    /* The gradient noise scale (docs/METRICS.md, "The gradient noise scale"): measured every this
     * many steps from what the replicas compute anyway, each micro-batch's gradient and the reduced
     * one (one more pass over each, by the device, which changes no weight); -1: off; 0: every
     * CREW_NOISE_SCALE_EVERY steps, which keeps its cost under 1% of a step for the examples
     * (docs/PERFORMANCE.md). It needs at least 2 micro-batches a step (replicas or accumulation). */
    int64_t noise_scale_every;
    /* What the data-parallel replicas shard among themselves (a crew_shard_level; docs/
     * ARCHITECTURE.md "Sharding"): the optimizer state (ZeRO-1, as shard_optimizer = 1, which
     * still works), the gradients too (ZeRO-2: each replica keeps the summed gradient of its shard
     * only) or the parameters too (ZeRO-3: each keeps its shard's parameters and gathers a unit of
     * layers just before the unit runs, forward and backward). The same bits as without, on any
     * replica count; checkpoints are the ordinary ones. Data parallelism only (no pipeline); no
     * effect with one replica [CREW_SHARD_NONE]. */
    int shard;
    /* ZeRO-2/3: the layers are gathered and their gradients reduce-scattered in units of about
     * this many MiB of parameters (a layer is never split; a tied parameter's unit stays gathered
     * through the step); 0: CREW_SHARD_UNIT_MB. */
    double shard_unit_mb;
    /* ZeRO-2/3: the units' collectives on the replica's communication thread, overlapping its
     * compute (the next unit's parameters gathered while this one runs, each unit's gradient
     * reduce-scattered while the layers before it run backward), for one more unit's buffers; 1 on,
     * -1 off, 0 the planner's choice: off where every core computes a replica (a communication
     * thread there only takes time from them), else on. The same bits either way. */
    int shard_overlap;
    /* Each rank's thread bound to cores of its own (CPUs [i·T, (i+1)·T) of the process's affinity
     * mask for local rank i of T BLAS threads), and its loader threads with it, so that the
     * replicas keep a core each as separate processes under `taskset` would: 1 on (an error where
     * the ranks' threads outnumber the cores, or with several processes or a GPU kind), -1 off,
     * 0 the planner's choice: on where every core of one process computes a rank of a CPU kind and
     * there are several ranks. The same bits either way. */
    int bind_cores;
    /* Where each rank's batches are prepared (docs/DATA.md, "The loader"): 1 inline, on the rank's
     * own thread as it takes each micro-batch (no loader threads); -1 by loader_threads threads,
     * prefetch steps ahead; 0 the planner's choice: inline where every core of the process (its
     * affinity mask: under mpirun, the cores it was bound to) computes a rank of a CPU kind (a loader
     * thread there takes turns with a replica on its core, and the other replicas wait for that one
     * at the next collective), else threads. A model file that names its loader_threads asks for
     * threads. The same batches, so the same bits, either way. */
    int loader_inline;
} crew_fit_options;

/* What data-parallel replicas shard (crew_fit_options.shard). */
typedef enum crew_shard_level {
    CREW_SHARD_NONE = 0,
    CREW_SHARD_OPTIMIZER,       /* ZeRO-1: optimizer state */
    CREW_SHARD_GRADIENTS,       /* ZeRO-2: optimizer state and gradients */
    CREW_SHARD_PARAMETERS,      /* ZeRO-3: optimizer state, gradients and parameters */
} crew_shard_level;
#define CREW_SHARD_UNIT_MB 0.25
/* "none", "optimizer", "gradients", "parameters"; NULL for another value. */
const char *crew_shard_level_name(int level);
/* The level of a name above; -1 for another. */
int crew_shard_level_parse(const char *name);
#define CREW_NOISE_SCALE_EVERY 4

/* How convolution layers compute (docs/GPU.md, "Convolutions"). Each way has its own order of
 * sums, so the choice shapes the numbers; every replica of a run takes the same one per layer. */
typedef enum crew_conv_way {
    /* By the device's library where it is measured faster than im2col + GEMM for the layer's
     * shape (cuDNN on a GPU, crew_conv_choose); im2col + GEMM on a kind without one (the CPU). */
    CREW_CONV_AUTO = 0,
    CREW_CONV_IM2COL = 1,       /* im2col + GEMM everywhere */
    /* By the device's library wherever it runs the layer's geometry deterministically (the same
     * bits run after run), im2col + GEMM elsewhere; the kind must have one. */
    CREW_CONV_LIBRARY = 2,
} crew_conv_way;
#define CREW_MAX_CONV_LAYERS 128 /* a model with more convolutions computes them all one way */

/* What precision the devices compute their GEMMs in (docs/GPU.md, "Precision"). */
typedef enum crew_precision {
    CREW_PRECISION_FP32 = 0,    /* float32 throughout (no TF32) */
    /* Every GEMM's operands rounded to bfloat16 (to nearest, ties to even), their products
     * accumulated in float32 into float32 results: a GPU's tensor cores (cuBLAS's bfloat16
     * GEMM with float32 accumulation), emulated on the CPU, where it is slower. Weights, gradients,
     * optimizer state and every other op stay float32 (the fp32 master weights of mixed precision);
     * bfloat16 has float32's range, so no loss scaling; a non-finite loss or gradient is caught as
     * in float32 (crew_fit_options.on_nan). */
    CREW_PRECISION_BF16 = 1,
} crew_precision;

/* The communicator of a run's replicas (docs/GPU.md, "NCCL"). */
typedef enum crew_communicator {
    /* NCCL where the device kind has it (cuda, in a build with NCCL), the run has more than one
     * replica, every replica of a process has a GPU of its own, and there is no pipeline; else the
     * host's (threads in a process, MPI between processes, GPUs' buffers through host copies). */
    CREW_COMMUNICATOR_AUTO = 0,
    CREW_COMMUNICATOR_HOST,     /* the host's, always */
    CREW_COMMUNICATOR_NCCL,     /* NCCL, or an error saying why it cannot be (one replica is allowed) */
} crew_communicator;

typedef enum crew_pipeline_schedule {
    CREW_PIPELINE_1F1B = 0,     /* one forward, one backward: at most K − s micro-batches in flight on stage s */
    CREW_PIPELINE_GPIPE = 1,    /* every forward, then every backward: all micro-batches in flight */
} crew_pipeline_schedule;
#define CREW_MAX_PIPELINE_STAGES 64

typedef struct crew_fit_result {
    int epochs;
    int64_t steps;
    float train_loss;      /* mean over the last epoch */
    float train_accuracy;
    float test_loss;       /* NaN without a test set */
    float test_accuracy;
    double wall_s;         /* the whole fit, evaluation included */
    double samples_per_s;  /* training samples per second of training steps (evaluation excluded) */
    int64_t skipped_updates;   /* with on_nan = skip */
    int events;                /* events reported */
    /* Where the time went, averaged over the training steps of rank 0 (fractions of a step): */
    double data_fraction, compute_fraction, comm_exposed_fraction, optimizer_fraction;
    double comm_hidden_s;      /* all-reduce time per step that overlapped the backward pass */
    char bottleneck[256];      /* one line in words and figures: "input-bound: replicas waited ..." */
    int64_t resumed_from_step; /* 0 when the run started afresh */
    char resume_note[1024];    /* which checkpoint was used, and any refused on the way */
    char last_checkpoint[512]; /* the newest checkpoint written, or "" */
    double gflops;             /* the FLOP rate of the training steps (plan.flops_per_sample × samples/s) */
    double peak_fraction;      /* gflops / plan.peak_gflops; NaN when the peak is unknown */
    float test_bits;           /* a language model's test loss in bits per token (crew_epoch_info) */
    /* A pipeline: the stages, and each stage's device memory at its peak (replica 0's device;
     * the backend's count of its buffers, crew_model_plan_stages's figure to compare with).
     * Without a pipeline, stages is 1 and stage_peak_bytes[0] replica 0's device peak
     * (crew_memory_plan.bytes_per_device's figure; 0 where the backend does not count). */
    int stages;
    int64_t stage_peak_bytes[CREW_MAX_PIPELINE_STAGES];
    double bubble_fraction;    /* the share of a step the stages did not compute (NaN without a pipeline) */
    int bottleneck_stage;      /* the stage with the most forward and backward time (-1 without a pipeline) */
    /* The gradient noise scale B_simple = tr(Σ) / |G|² at the end (McCandlish et al. 2018; smoothed
     * over about the last 100 steps measured), in samples: NaN when not measured or not estimable;
     * and in words against the global batch, or why there is none. */
    double noise_scale;
    char noise_text[384];
} crew_fit_result;

/* Fills opts with the model file's training settings (or the defaults above), struct_size included.
 * A fit starts a fresh optimizer (zero moments, update count 0) from the model's weights, unless
 * it resumes a checkpoint, which brings its own: to continue a run, resume it. */
void crew_model_default_fit(const crew_model *m, crew_fit_options *opts);

/* How a fit will run: resolved before it starts, so the caller can show and record it. */
typedef struct crew_fit_plan {
    char device_kind[16];       /* "cpu" */
    int devices;
    int threads_per_device;
    int64_t batch_per_device;
    int accumulation;           /* micro-batches per replica per step */
    int64_t global_batch;       /* devices × batch_per_device × accumulation */
    int64_t train_samples;
    int64_t steps_per_epoch;    /* the last partial global batch is dropped */
    int epochs;
    int64_t total_steps;
    uint64_t seed;
    float base_lr;              /* as compiled (or overridden), tuned for base_batch */
    int64_t base_batch;
    crew_lr_scaling scaling;
    float lr_factor;            /* scaled_lr / base_lr */
    float scaled_lr;            /* the peak rate after warmup */
    int64_t warmup_steps;
    float warmup_start_lr;
    crew_schedule_type schedule;
    /* The other settings that change the numbers a run computes. A checkpoint stores them with
     * the rest of the plan, and a resumed run takes them from it (docs/CHECKPOINTS.md). */
    crew_augment_options augment;
    int pad_last_batch;
    int sync_batch_norm;        /* as resolved: 1 when replicas share batch-norm statistics */
    crew_nan_policy on_nan;
    int processes;              /* of a process group: devices / processes replicas each [1] */
    int unordered_allreduce;    /* crew_fit_options.unordered_allreduce, as resolved (0 in one process
                                   unless the collectives are NCCL's) */
    int nccl;                   /* 1: the replicas' collectives are NCCL's (crew_fit_options.communicator) */
    int precision;              /* crew_fit_options.precision (a crew_precision) */
    int conv;                   /* crew_fit_options.conv (a crew_conv_way), as asked */
    /* One way per convolution layer, in model order ('l': the device's library, 'i': im2col +
     * GEMM; "" for a model without one): what the replicas run. */
    char conv_choice[CREW_MAX_CONV_LAYERS + 1];
    int shard_optimizer;        /* crew_fit_options.shard_optimizer, as resolved (0 with one replica) */
    double flops_per_sample;    /* a training step's FLOPs per sample (crew_model_flops: total) */
    double peak_gflops;         /* crew_fit_options.peak_gflops: the devices' GEMM rate; 0: unknown */
    /* A pipeline (crew_fit_options.pipeline_stages > 1): `devices` replicas of `stages` stages;
     * stage s holds layers stage_first[s] .. stage_first[s + 1] − 1 (stage_first[stages] is the
     * model's layer count). 1 stage: no pipeline. */
    int stages;
    int pipeline_schedule;
    int stage_first[CREW_MAX_PIPELINE_STAGES + 1];
    int pipeline_processes;     /* the processes each replica's stages span: 1 in one process or
                                   with whole replicas in each, R (crew_fit_options.pipeline_processes) */
    int attention_recompute;    /* crew_fit_options.attention_recompute */
    int64_t noise_scale_every;  /* the gradient noise scale measured every this many steps; 0: not (off,
                                   or one micro-batch a step) */
    /* The gradient buckets of the replicas' all-reduce: their size (crew_fit_options.bucket_mb, or
     * the planner's choice when it is 0) and how many the model's (a pipeline's largest stage's)
     * gradients make; 0 buckets with one replica. One bucket is reduced by the replicas' own threads
     * after the backward pass; several, each on a communication thread as soon as backward has
     * completed it. bucket_auto: 1 when the planner chose; bucket_rule: by which rule
     * (crew_bucket_rule; docs/PERFORMANCE.md has the measurements behind each). */
    double bucket_mb;
    int buckets;
    int bucket_auto;
    int bucket_rule;            /* why that size (a crew_bucket_rule) */
    /* What the replicas shard (crew_fit_options.shard and shard_optimizer, as resolved: NONE with
     * one replica; shard_optimizer above is 1 from OPTIMIZER on), and with GRADIENTS or PARAMETERS
     * the units of layers they gather and reduce-scatter: their size and count, and the unit a tied
     * parameter keeps gathered through each step (-1: none). */
    int shard;
    double shard_unit_mb;
    int shard_units;
    int shard_pinned_unit;
    /* 1: under ZeRO-2/3 without overlap the tied weight's unit takes its turn like the others (the
     * tied layer's part of its gradient computed just before its owner's backward; ZeRO-3: gathered
     * again where the tied layer reads it), so no unit is kept apart: shard_pinned_unit is -1 */
    int shard_tied_late;
    int shard_overlap;          /* 1: the units' collectives overlap compute (crew_fit_options.shard_overlap) */
    int bind_cores;             /* 1: each rank and its loader bound to cores of its own (crew_fit_options.bind_cores) */
    int loader_inline;          /* each rank prepares its own batches as it takes them (crew_fit_options.loader_inline):
                                   1 as asked, 2 since every core of the process computes a rank; 0: loader threads */
} crew_fit_plan;

/* Resolves and checks the plan; a combination that cannot work is an error saying why. With
 * opts->resume it plans the newest complete checkpoint's run. */
crew_status crew_model_plan_fit(crew_model *m, const crew_dataset *train, const crew_fit_options *opts,
                                crew_fit_plan *plan);

/* A fit in two steps, so that a caller can show and record the plan before the run starts, and
 * the plan (and a resumed checkpoint) is worked out once:
 *
 *   crew_fit *f;
 *   s = crew_fit_prepare(m, train, &opts, &f);      // plan; with opts.resume, load the checkpoint
 *   print(crew_fit_get_plan(f));
 *   s = crew_fit_run(f, &result);                   // train; opts.run_dir is written from here on
 *   crew_fit_free(f);
 *
 * prepare writes nothing. m, train, opts->test and the strings of opts must outlive the fit;
 * opts itself is copied. */
typedef struct crew_fit crew_fit;
crew_status crew_fit_prepare(crew_model *m, const crew_dataset *train, const crew_fit_options *opts, crew_fit **out);
const crew_fit_plan *crew_fit_get_plan(const crew_fit *f);
/* Which checkpoint a resumed fit starts from, and any it refused on the way ("" when not resuming). */
const char *crew_fit_resume_note(const crew_fit *f);
/* Runs the prepared fit once; the trained weights are in m afterwards (also after a cancel). */
crew_status crew_fit_run(crew_fit *f, crew_fit_result *result);
void crew_fit_free(crew_fit *f);

/* The plan in words, the lines crew train prints before a run ("plan: cpu:2 (2 replicas x 1 BLAS
 * thread), batch 32 per device ..."), each ended by a newline, into buf (cut to len); `devices`
 * is how the devices were asked for ("cpu:2", "2 MPI ranks x cpu:1"). Returns the length the
 * whole text needs, as snprintf does. */
size_t crew_fit_plan_text(const crew_fit_plan *plan, const char *devices, char *buf, size_t len);

/* prepare + run + free. */
crew_status crew_model_fit(crew_model *m, const crew_dataset *train, const crew_fit_options *opts,
                           crew_fit_result *result);

/* Writes a self-contained HTML report of a run (inline CSS and SVG charts, no script, nothing
 * fetched) from run_dir/metrics.jsonl: the run's facts, loss and learning rate, throughput, where
 * each step's time went, per-replica compute time with stragglers marked, events and epochs.
 * out_path NULL means run_dir/report.html; the file is replaced atomically. A malformed line of
 * metrics.jsonl is a CREW_CODE_BAD_INPUT error naming the file and line number. */
crew_status crew_report_write(const char *run_dir, const char *out_path);

typedef struct crew_eval_result {
    float loss;
    float accuracy;
    int64_t samples;
} crew_eval_result;

crew_status crew_model_evaluate(crew_model *m, const crew_dataset *data, int64_t batch,
                                crew_eval_result *result);
/* Class probabilities for n samples. x: [n, input...] float32; probs: [n, classes] — or, for a
 * language model, [n, context, vocab]: the next token's distribution at every position. */
crew_status crew_model_predict(crew_model *m, const float *x, int64_t n, float *probs);
/* The vocabulary of a language model (its lm_head's logits), or 0 for a model that is not one. */
int64_t crew_model_vocab(const crew_model *m);
/* Its context: the most tokens it sees at once (0 for a model that is not a language model). */
int64_t crew_model_context(const crew_model *m);

/* Text generation from a trained language model: continues prompt[0..n_prompt) by n_new tokens,
 * written to out[0..n_new). Each token is drawn from the model's distribution at the last
 * position, sharpened by temperature (p^(1/temperature), renormalised; 0 takes the most likely
 * token), by counter-based random numbers of (seed, position): the same seed gives the same text.
 * The model sees the last `context` tokens; a shorter history is left-aligned (causal attention
 * keeps the padding after it from mattering). n_prompt must be at least 1; a prompt token outside
 * the vocabulary is an error. */
crew_status crew_model_generate(crew_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                                float temperature, uint64_t seed, int32_t *out);
int64_t crew_model_output_size(const crew_model *m); /* classes */

/* ---------------------------------------------------------------- FLOPs and the peak */

/* A model's FLOPs per sample, counted from its layers: 2 per multiply-add of the layers that are
 * GEMMs (dense; conv2d, an im2col GEMM), which are where a step's time goes; the elementwise
 * layers, pooling, normalisation, the loss and the optimizer are memory-bound and not counted
 * (as MLPerf and the usual "model FLOPs" do). Training is forward + backward: the weight
 * gradient's GEMM for every such layer, and the input gradient's where an earlier layer needs it. */
typedef struct crew_flops {
    double forward;     /* per sample */
    double backward;
    double total;       /* forward + backward: a training step's FLOPs per sample */
} crew_flops;

crew_status crew_model_flops(const crew_model *m, crew_flops *out);

/* One device's measured single-precision GEMM rate, GFLOP/s: square GEMMs of 512 and 1024 in
 * turn through the device's own backend at threads_per_device BLAS threads, for about `seconds`
 * (at least three of each), the best of them. A run's peak is that times its replicas, when each
 * has cores of its own. */
crew_status crew_measure_peak(const char *device_kind, int threads_per_device, double seconds, double *gflops);
/* crew_measure_peak, measured once: the figure for this host, build, kind and thread count from
 * the cache file at cache_path (lines "<key> <gflops>"; NULL: no cache), else measured for 0.3 s
 * and added to it (the file rewritten whole, atomically, in its directory, which must exist). A
 * cache that cannot be read, parsed or written is measured past, never an error; *from_cache
 * (may be NULL) says whether the figure came from it. */
crew_status crew_peak_cached(const char *cache_path, const char *device_kind, int threads_per_device, double *gflops,
                             int *from_cache);
/* The figures' cache of this user: $XDG_CACHE_HOME/crew/peaks, else ~/.cache/crew/peaks (its folders
 * made): 1 with the path in buf, 0 when neither variable names a home for it. */
int crew_cache_path(char *buf, size_t len);
/* A run's peak GFLOP/s (crew_fit_options.peak_gflops): one device's GEMM rate from the cache
 * (measured once, 0.3 s, when it lacks it), times the replicas that have cores of their own, times
 * the processes; *per_device (may be NULL) gets the one device's. 0 when it cannot be measured. */
double crew_run_peak(const char *kind, int devices, int threads, int processes, double *per_device);

/* ---------------------------------------------------------------- verification */

/* The built-in proof that N replicas compute what one computes. From the same initial weights and
 * data, K steps run several ways:
 *   (a) N replicas: the run as the options make it (k micro-batches per replica, the default
 *       gradient buckets, synchronised batch norm);
 *   the paths: N replicas again with k = 1 and k = 2 micro-batches per replica (2 and 1 when k
 *       is 2 or more), each with the default buckets and with verify's own bucket size (a
 *       quarter of the model, so every model has several): each must end bitwise equal to
 *   (b) one replica accumulating the same micro-batches in the same order: parameters, state and
 *       the optimizer's moments. Batch norm normalises over every replica's micro-batch at once
 *       when synchronised, which one replica cannot do, so a batch-norm model's paths run with
 *       per-micro-batch statistics, where the two compute the same sums in the same order.
 *       Every replica's parameters, state and moments are hashed and compared after every step
 *       of every N-replica run.
 *   (c) one replica on the whole global batch at once, and
 *   (d), (e) rounding alone (not run with a fixed tolerance): (c) again with each batch's samples
 *       in reverse order, and the same global batch in other blocks (2N replicas of half the
 *       batch, or N/2 of twice it; in process 0).
 * The first step: the loss and every gradient tensor of step 1, before the optimizer can amplify
 * rounding, of (a), (b) (without batch norm), (d) and (e) against (c), each within a bound derived
 * from float32 summation: |x − c| <= 8 · u · n · S per tensor, u = 2^-24, n the terms of each
 * sum (samples of the global batch × the positions that share the parameter), S the layer's
 * largest gradient value (the loss: n = the global batch, S = the loss); src/train/verify_compare.c
 * has the reasoning. A bug that changes what is computed shows there at once, and (d) and (e)
 * passing it proves that the rounding references were not moved by one (everything bound to a
 * sample stays bound to it when rows are reordered).
 * The trajectory: (a) and (c) differ by the rounding of different summation orders, which
 * training amplifies (Adam-type optimizers most). Unless a tolerance is given, each tensor of (a)
 * may differ from (c) by up to 30 times its rounding spread (the larger of its (c)-(d) and (c)-(e)
 * differences), or 1e-3 when that is larger (src/train/verify.c has the measurements behind 30).
 * A run that stops (a replica missing a collective or its data, replicas that diverged, NaN)
 * makes verify FAIL naming the run and the phase; every run has a deadline of its own.
 * docs/VERIFY.md says what this proves and what it cannot. */
typedef struct crew_verify_options {
    size_t struct_size;         /* sizeof(crew_verify_options), set by crew_verify_options_init */
    const char *device_kind;    /* [cpu] */
    int devices;                /* N [2] */
    int64_t steps;              /* K [20] */
    int64_t batch_per_device;   /* [the model file's, else 32] */
    int64_t global_batch;       /* [N × batch_per_device]; a multiple of it: accumulation */
    uint64_t seed;              /* [the model file's, else 1] */
    double tolerance;           /* a fixed bound on every tensor's difference, no run (d) [0: see above] */
    /* Processes (as crew_fit_options.group): the N-replica runs run `devices` replicas in each
     * process, N = devices × processes in all; process 0 alone runs (b), (c), (d) and (e) and
     * judges. The other processes return once their share is done, with steps, global_batch and
     * devices filled in and pass = 1 unless a run stopped: the verdict is process 0's. NULL: this
     * process alone. */
    const struct crew_process_group *group;
    /* Seconds a replica may miss a collective or wait for its data before its run stops [0: 20
     * times the slowest step of the one-replica references, at least 10 s; 300 s across
     * processes, whose N-replica runs come first]. */
    double deadline_s;
    /* The N-replica runs as pipelines (crew_fit_options.pipeline_*): N replicas of
     * pipeline_stages stages each, held to the same one-device references. 0 or 1: none. */
    int pipeline_stages;
    int pipeline_schedule;
    const char *pipeline_split;
    int precision;              /* every run's (crew_fit_options.precision) [fp32] */
    int conv;                   /* every run's (crew_fit_options.conv) [auto] */
    const char *conv_choice;    /* every run's (crew_fit_options.conv_choice) [NULL] */
    /* Another device kind to hold this one to (a GPU against the CPU): (f), the full-batch run (c)
     * again on one device of that kind, against (c) as (a) is: its first step within float32
     * summation's bound, its trajectory within every tensor's rounding bound. NULL: none. */
    const char *against_kind;
    /* Every run's optimizer state sharded over its replicas (crew_fit_options.shard_optimizer):
     * (a) and its paths run sharded. Without it the N-replica runs still add a sharded path, held
     * bitwise to (b) as the others are. */
    int shard_optimizer;
    int attention_recompute;    /* every run's (crew_fit_options.attention_recompute) [0] */
    /* The samples verify trains on: the first `samples` of the dataset [0: as many global batches
     * as make the steps cross CREW_VERIFY_EPOCHS_CROSSED epoch boundaries, at least 4, where the
     * dataset has them; −1: all of it]. */
    int64_t samples;
} crew_verify_options;

/* The epoch boundaries verify's default slice of the data makes its steps cross. */
#define CREW_VERIFY_EPOCHS_CROSSED 2

/* One N-replica run held bitwise to its one-replica reference. */
typedef struct crew_verify_path {
    int accumulation;               /* k: micro-batches per replica per step */
    int buckets;                    /* gradient buckets its all-reduce used (sharded gradients: its units) */
    int64_t global_batch;
    int bitwise_equal;              /* with (b) of the same micro-batches */
    double max_rel_diff;            /* max |a − b| / max |b| over each tensor */
    int sharded;                    /* what the replicas shard (a crew_shard_level; 0: nothing) */
} crew_verify_path;

#define CREW_VERIFY_MAX_PATHS 6

typedef struct crew_verify_result {
    int devices;                    /* N */
    int64_t steps;
    int64_t global_batch;           /* of (a) */
    int accumulation;               /* k of (a) */
    int buckets;                    /* of (a) */
    /* the paths */
    int paths;
    crew_verify_path path[CREW_VERIFY_MAX_PATHS];
    int batch_norm_synced;          /* 1: batch norm, N > 1: (a) synchronised, the paths per micro-batch */
    int replicas_compared;          /* every replica's values hashed after each step of each N-replica run */
    int64_t replica_checks;         /* how many such comparisons passed */
    int bitwise_equal;              /* every path bitwise equal */
    double max_rel_diff_accum;      /* the largest max_rel_diff of the paths */
    /* the first step */
    int first_step_ok;
    double first_step_loss_diff;    /* |loss (a) − loss (c)| / |loss (c)| at step 1 */
    double first_step_ratio;        /* the largest difference over its bound, over every check */
    char first_step_decided_by[192];/* "<run>: <layer>.<param>" or "<run>: loss", the largest ratio */
    double first_step_diff;         /* its difference (max |x − c| of the tensor, or of the loss) */
    double first_step_allowed;      /* and its bound */
    int reference_ok;               /* (d), (e) and (h) passed the first-step check (1 when they did not run) */
    int reference_replicas;         /* (e)'s replicas and per-replica batch; 0 when (e) did not run */
    int64_t reference_batch;
    /* (h): the full batch on one replica, every GEMM summed in (a)'s own blocks of this many rows
     * (its per-replica micro-batch), without replicas; 0 when it did not run (no rounding
     * references, or (a)'s blocks are the full batch) */
    int64_t own_blocks_batch;
    int own_blocks_exact;           /* 1: (h) ended with (a)'s bits (every sum over the batch a dense
                                       layer's); 0 where some layer sums in other blocks, or (h) did not run */
    /* the trajectory */
    double max_rel_diff_full_batch; /* (a) vs (c) */
    double tolerance;               /* the given one, else the floor 1e-3 */
    int fixed_tolerance;            /* 1: tolerance was given, (d) and (e) did not run */
    double rounding_spread;         /* (c) vs (d), (e), (g) and (h), the largest over tensors; 0 without them */
    char decided_by[160];           /* "<layer>.<param>": the tensor nearest its bound */
    double decided_by_diff;         /* its (a) vs (c) difference, */
    double decided_by_spread;       /* its rounding spread, */
    double allowed;                 /* and its bound: max(tolerance, 30 × decided_by_spread) */
    int full_batch_ok;              /* every tensor within its bound */
    double deadline_s;              /* the deadline the runs had */
    char failure[640];              /* a run that stopped: "<run>: <the error>"; "" when none did */
    int pass;                       /* no failure, bitwise_equal, first_step_ok, reference_ok, full_batch_ok,
                                       and with against_kind, against_first_step_ok and against_ok */
    int stages;                     /* pipeline stages of each of the N replicas (1: none) */
    int pipeline_schedule;          /* a crew_pipeline_schedule, with stages > 1 */
    float *losses;                  /* caller's [steps × 3] or NULL: per step, the loss of (a), (b), (c) */
    /* against_kind: (f) against (c) */
    char against_kind[16];          /* "" when not asked */
    int against_first_step_ok;
    double against_first_step_ratio;/* its largest first-step difference over its bound */
    char against_first_step_decided_by[192];
    int against_ok;                 /* its trajectory: every tensor within its bound */
    double against_max_rel_diff;
    char against_decided_by[160];   /* the tensor nearest its bound, */
    double against_decided_by_diff; /* its difference, */
    double against_allowed;         /* and its bound */
    /* the data: the first `samples` of the dataset's `dataset_samples`, `steps_per_epoch` steps each
     * epoch, so that the steps crossed `epochs_crossed` epoch boundaries */
    int64_t samples, dataset_samples, steps_per_epoch;
    int epochs_crossed;
    /* The reference of other blocks (e) runs through the replicas' machinery, so a bug there that
     * grows with the replica or micro-batch count moves it too. It is held to the references that
     * cannot share such a bug, (d) and (g) (the full batch on one replica with every GEMM summed
     * in (e)'s blocks): each tensor's (e) spread within 10 times theirs (at least tolerance / 30,
     * below which it widens no bound); beyond, verify FAILs. 1 when they did not run. */
    int other_blocks_ok;
    char other_blocks_decided_by[192];  /* "<layer>.<param>", the tensor nearest its bound */
    double other_blocks_diff;       /* its (e) spread, */
    double other_blocks_allowed;    /* and its bound */
    double immune_spread;           /* (c) vs (d) and (g), the largest over tensors */
    int other_blocks_exact;         /* 1: (g) ended with (e)'s bits, an exact stand-in for the replicas
                                       (a model whose sums over the batch are all dense layers'); 0 where
                                       a layer sums in other blocks (a convolution's output positions,
                                       a GPT's tokens), or (e) and (g) did not run */
} crew_verify_result;

/* Every field at its default (zero, or as bracketed above). */
void crew_verify_options_init(crew_verify_options *opts);
crew_status crew_model_verify(crew_model *m, const crew_dataset *train, const crew_verify_options *opts,
                              crew_verify_result *result);

/* ---------------------------------------------------------------- weights */

/* safetensors: one tensor per parameter, named "<layer name>.<kernel|bias|gamma|...>" with
 * Keras layouts (dense kernel [in, out], conv kernel [kh, kw, cin, cout]). */
crew_status crew_model_save_weights(const crew_model *m, const char *path);
crew_status crew_model_load_weights(crew_model *m, const char *path);
/* The weights of a run that has done `steps` of its `total_steps` optimizer steps: saved as
 * crew_model_save_weights does, with metadata "steps", "total_steps" and "finished" ("true" when
 * steps == total_steps, else "false"), so that nobody takes an interrupted run's weights for
 * final ones (docs/WEIGHTS.md). */
crew_status crew_model_save_weights_progress(const crew_model *m, const char *path, int64_t steps,
                                             int64_t total_steps);
/* How far the run that wrote a weights file had got: *steps and *total_steps from its metadata,
 * both -1 when the file does not say (written by crew_model_save_weights or another tool).
 * Errors name the file. */
crew_status crew_weights_progress(const char *path, int64_t *steps, int64_t *total_steps);

/* The same tensors in memory (a front end's own framework: Keras's get_weights/set_weights). The
 * model's tensors, every parameter trainable or not, in layer order, named as in the safetensors
 * file ("dense.kernel", "batch_normalization.moving_mean") with the same shapes. */
int crew_model_tensor_count(const crew_model *m);
/* Tensor i's name (into name, cut to name_len) and shape [ndim]: returns ndim, 0 when i is out of range. */
int crew_model_tensor_info(const crew_model *m, int i, char *name, size_t name_len, int64_t shape[8]);
/* Copies every tensor into values[i] (a host buffer of tensor i's element count). */
crew_status crew_model_get_tensors(const crew_model *m, float *const *values);
/* Sets every tensor from values[i]; the model then holds weights, as after crew_model_load_weights. */
crew_status crew_model_set_tensors(crew_model *m, const float *const *values);

/* ---------------------------------------------------------------- advice (docs/ADVISOR.md) */

/* Memory planning: what one replica needs, worked out from the model's structure alone (nothing is
 * allocated), and what to do when it does not fit. Sizes in this section are bytes, not elements:
 * a plan adds up buffers of different element types and alignments. */
typedef struct crew_memory_options {
    size_t struct_size;          /* sizeof(crew_memory_options), set by crew_memory_options_init */
    int64_t batch_per_device;    /* [model file's, else 32] */
    int devices;                 /* replicas [1] */
    int64_t global_batch;        /* [devices × batch_per_device]; a multiple of it: accumulation */
    int64_t device_memory_bytes; /* each device's own memory; 0: the devices' own as their kind
                                    reports it (a GPU's), else this machine's physical memory,
                                    which its CPU replicas share */
    int64_t train_samples;       /* training samples, for the loader's sample order; 0: unknown */
    int prefetch;                /* loader steps prepared ahead [model file's, else 2] */
    int optimizer_sharding;      /* 1: plan for optimizer state sharded across the replicas */
    const char *device_kind;     /* the replicas' device kind (crew_device_kinds) [cpu] */
    /* the run's (a crew_precision) [fp32]: bf16 keeps a GPT block's GEMM-only activations and
     * attention probabilities in bfloat16, half their bytes */
    int precision;
    int attention_recompute;     /* the run's (crew_fit_options.attention_recompute) [0] */
    /* What the replicas shard (a crew_shard_level; optimizer_sharding = 1 is CREW_SHARD_OPTIMIZER)
     * and ZeRO-2/3's unit size (crew_fit_options.shard_unit_mb) [none, 0: the default] */
    int shard;
    double shard_unit_mb;
    int no_sharding;             /* 1: never advise sharding (the user said --shard none) [0] */
    int shard_overlap;           /* 1: ZeRO-2/3's units double-buffered (crew_fit_plan.shard_overlap) [0] */
    int64_t dataset_bytes;       /* the memory the run's open splits hold of their own, in each
                                    process (crew_dataset_memory_bytes, summed) [0: not counted] */
} crew_memory_options;

typedef struct crew_memory_layer {
    char name[64];
    const char *type;            /* "dense", "conv2d", ... */
    char shape[48];              /* its per-sample output shape, "(28, 28, 32)" */
    int64_t params;              /* trainable values */
    int64_t weight_bytes;        /* its parameters, state, gradients and optimizer state */
    int64_t activation_bytes;    /* its output for one micro-batch, kept for the backward pass */
    int64_t workspace_bytes;     /* im2col columns, pooling arg-max, dropout mask, norm statistics */
    int stage;                   /* 0-based pipeline stage with a model-parallel verdict, else 0 */
} crew_memory_layer;

typedef enum crew_memory_verdict {
    CREW_MEMORY_FITS = 0,         /* data parallelism as asked */
    CREW_MEMORY_SMALLER_BATCH,    /* a smaller per-device batch plus accumulation, same global batch */
    CREW_MEMORY_SHARD_OPTIMIZER,  /* sharding across advised_devices replicas: what advised_shard says */
    CREW_MEMORY_MODEL_PARALLEL,   /* the layers split into advised_devices pipeline stages */
    CREW_MEMORY_TOO_LARGE,        /* one layer alone exceeds a device */
} crew_memory_verdict;

typedef struct crew_memory_plan {
    int devices;
    int64_t batch_per_device, global_batch;
    int accumulation;
    int shared_memory;            /* 1: the replicas share this machine's memory (CPU replicas) */
    int64_t device_memory_bytes;
    /* One replica at the asked batch: */
    int64_t param_bytes;          /* trainable parameters and state (batch-norm statistics) */
    int64_t gradient_bytes;
    int64_t optimizer_bytes;
    const char *optimizer;        /* its optimizer: "AdamW", "SGD with momentum", "LAMB", "LARS", ... */
    int optimizer_slots;          /* the values of state it keeps a parameter (AdamW and LAMB: 2) */
    int64_t activation_bytes;     /* the input and every layer's output, for one micro-batch */
    int64_t workspace_bytes;      /* layers' workspace, gradient ping-pong buffers, labels, losses */
    int64_t accumulation_bytes;   /* micro-batch gradients kept for the ordered sum */
    int64_t bytes_per_device;     /* the peak of one replica: the sum of the six above */
    int64_t host_bytes;           /* host memory besides the devices': the loaders' rings and sample
                                     orders, the datasets' own (dataset_bytes), and the caller's copy
                                     of the weights */
    int64_t total_bytes;          /* devices × bytes_per_device + host_bytes */
    int fits;                     /* as asked */
    crew_memory_verdict verdict;
    int64_t advised_batch;        /* the verdict's per-device batch */
    int advised_accumulation;
    int advised_devices;          /* the verdict's replicas (sharding) or stages (model parallel) */
    int64_t advised_bytes_per_device;
    char verdict_text[1024];      /* in words, with the figures and the flags to use */
    int n_layers;
    crew_memory_layer *layers;    /* [n_layers]; freed by crew_memory_plan_release */
    int precision;                /* the run's (crew_memory_options.precision) */
    /* The plan's: as asked, or 1 where the model does not fit as asked and recomputing the
     * attention probabilities (which changes no bit) fits better: then every figure above is the
     * recomputing run's, and verdict_text says so. */
    int attention_recompute;
    /* With CREW_MEMORY_SHARD_OPTIMIZER: what the replicas shard (a crew_shard_level, from
     * CREW_SHARD_OPTIMIZER on), the lightest that fits */
    int advised_shard;
} crew_memory_plan;

void crew_memory_options_init(crew_memory_options *o); /* every field at its default */
crew_status crew_model_plan_memory(const crew_model *m, const crew_memory_options *o, crew_memory_plan *plan);
/* A pipelined fit's plan (plan->stages > 1): the bytes each stage's device holds at its peak,
 * into bytes[plan->stages]: its layers' parameters, gradients, state and optimizer state, the
 * activations and workspace of every micro-batch it keeps in flight, its gradient sums and
 * scratch; stage 0 also the staging buffer through which it gathers the whole model. */
crew_status crew_model_plan_stages(const crew_model *m, const crew_fit_plan *plan, int64_t *bytes);
void crew_memory_plan_release(crew_memory_plan *plan);

/* Scaling: short trials at a few replica counts, a cost model fitted to them, projections and a
 * recommendation. One count's trials, timed from the on_step breakdown of rank 0; times are
 * seconds per step, medians over the measured steps of every repeat. */
typedef struct crew_scale_trial {
    int devices;
    int64_t global_batch;
    int repeats;
    int64_t steps;               /* measured steps per repeat, warm-up excluded */
    double samples_per_s;        /* the median repeat */
    double samples_per_s_lo, samples_per_s_hi; /* the slowest and the fastest repeat */
    double step_s, data_s, compute_s, comm_exposed_s, comm_hidden_s, optimizer_s;
    double other_s;              /* the rest of a step: the metrics all-reduce, bookkeeping */
    double compute_jitter_s;     /* robust spread (1.4826 × MAD) of a step's forward + backward */
    double cpu_share;            /* CPU time of replica 0's thread over wall time: the share of a core
                                    it got (under 1 when other processes compete for the cores) */
    double helper_cpu_s;         /* CPU time per step of the process's other threads (the loader,
                                    communication), per replica */
    double speedup, efficiency;  /* against a 1-replica trial (crew_scale_analyse); NaN without one */
    double noise_scale;          /* the gradient noise scale the trial measured (crew_fit_result's), NaN
                                    when it could not (one replica): the advisor's, without --from */
} crew_scale_trial;

typedef struct crew_scale_options {
    size_t struct_size;          /* sizeof(crew_scale_options), set by crew_scale_options_init */
    int64_t batch_per_device;    /* [model file's, else 32] */
    int64_t warmup_steps;        /* run, not measured [3] */
    int64_t steps;               /* measured per repeat [20] */
    int repeats;                 /* [3] */
    int threads_per_device;      /* [1] */
    int shard_optimizer;         /* 1: the replicas shard their optimizer state (--shard-optimizer) [0] */
    void (*on_repeat)(void *user, int devices, int repeat, double samples_per_s); /* progress, or NULL */
    void *user;
    /* Processes (as crew_fit_options.group): a trial runs `devices` replicas in each, devices ×
     * processes in all, and every process calls crew_scale_measure; the figures are process 0's
     * (the others get zeros). NULL: this process alone. */
    const struct crew_process_group *group;
    const char *device_kind;     /* the replicas' devices (crew_device_kinds) [cpu] */
    int precision;               /* their GEMMs' (crew_fit_options.precision) [fp32] */
    int conv;                    /* crew_fit_options.conv [auto] */
    const char *conv_choice;     /* crew_fit_options.conv_choice [NULL] */
} crew_scale_options;

void crew_scale_options_init(crew_scale_options *o); /* every field at its default */
crew_status crew_scale_measure(crew_model *m, const crew_dataset *train, const crew_scale_options *o, int devices,
                               crew_scale_trial *out);
/* Fills speedup and efficiency of every trial against the 1-replica one (NaN without it). */
void crew_scale_analyse(crew_scale_trial *trials, int n);

/* The layouts of `cores` CPU cores for m at one global batch, cores × o->batch_per_device: for
 * each R dividing cores (the largest first, at most CREW_LAYOUT_MAX - 1), R replicas of
 * cores / R BLAS threads each and a per-device batch of cores / R × o->batch_per_device, one
 * scaling trial each (o's warm-up, steps and repeats; o->threads_per_device and
 * o->shard_optimizer are ignored); then, with more than one core, the `cores` replicas again with
 * their optimizer state sharded. Trains m (give it a copy). The layouts compute the same step but
 * not the same bits: BLAS threads, and one replica's larger GEMMs, sum in another order
 * (docs/ARCHITECTURE.md "Determinism"), so the library never picks one unasked; crew train
 * --layout auto does, and says so. Sharding keeps the bits, so crew train turns it on by itself
 * where it measured faster. */
#define CREW_LAYOUT_MAX 8
typedef struct crew_layout_trial {
    int replicas, threads_per_device;
    int shard_optimizer;         /* 1: the replicas' optimizer state sharded */
    int64_t batch_per_device;
    double samples_per_s;        /* the trial's median repeat */
} crew_layout_trial;
typedef struct crew_layout_choice {
    crew_layout_trial trials[CREW_LAYOUT_MAX]; /* [n], the most replicas first; n = 0 when the
                                                  choice came from a cache */
    int n;
    int replicas, threads_per_device; /* the fastest unsharded (ties: the most replicas) */
    int64_t batch_per_device;
    double speedup;              /* its samples/s over those of `cores` replicas of 1 thread */
    /* the `cores` replicas sharded over the same unsharded (1 with one core: not measured), and
     * whether that is faster beyond the noise (more than 3%) */
    double shard_speedup;
    int shard_optimizer;
} crew_layout_choice;
crew_status crew_layout_measure(crew_model *m, const crew_dataset *train, const crew_scale_options *o, int cores,
                                crew_layout_choice *out);
/* crew_layout_measure, measured once: the choice for this model (model_key: the model file's
 * xxh3, crew_file_hash), cores, per-device batch, host and build from the cache file (lines
 * "<key> <figure>", the peaks' file; NULL: no cache), else, with measure 1, measured and added to
 * it; measure 2 measures anew and replaces it. *found says whether there is a choice: 0 when
 * nothing was cached and measure is 0 (m and train may then be NULL). A cache that cannot be read
 * or written is passed by, never an error. */
crew_status crew_layout_cached(const char *cache_path, uint64_t model_key, crew_model *m, const crew_dataset *train,
                               const crew_scale_options *o, int cores, int measure, crew_layout_choice *out,
                               int *found);

/* Each convolution layer of a model timed both ways on one device of a kind (a forward and a
 * backward pass of a micro-batch of `rows` samples at `precision`, the layer's own code): im2col +
 * GEMM, and the kind's convolution library (cuDNN) where it runs the layer's geometry; the faster
 * wins (ties: im2col). cache_path (NULL: none) keeps the times, one pair per layer shape, device
 * kind and host, micro-batch and precision (the peaks' cache, crew_peak_cached), so that runs on
 * one machine choose alike: measure 0 reads the cache alone, and a shape it lacks keeps im2col
 * unmeasured; 1 measures what the cache lacks and adds it; 2 measures every layer anew. */
typedef struct crew_conv_layer_choice {
    int layer;                  /* index in the model */
    char name[64];
    char shape[96];             /* "28x28x1 -> 28x28x32, 3x3 stride 1" */
    int supported;              /* the library runs the geometry */
    int measured;               /* 1: the times below are known (measured, or from the cache) */
    int cached;                 /* 1: they came from the cache */
    double im2col_s, library_s; /* seconds of a forward + backward pass; library_s 0 where unsupported */
    int by_library;             /* the choice */
} crew_conv_layer_choice;
typedef struct crew_conv_choice {
    char library[64];           /* the kind's library ("cuDNN"), "" for a kind without one */
    int n;                      /* convolution layers */
    crew_conv_layer_choice layers[CREW_MAX_CONV_LAYERS];
    char ways[CREW_MAX_CONV_LAYERS + 1]; /* crew_fit_options.conv_choice */
    /* Why the library could not be opened on the device ("" when it could): nothing was measured
     * or cached, and every layer takes im2col. A device that does not open at all is an error. */
    char unavailable[256];
} crew_conv_choice;
crew_status crew_conv_choose(crew_model *m, const char *device_kind, int64_t rows, int precision,
                             const char *cache_path, int measure, crew_conv_choice *out);

/* An interconnect: an all-reduce of S bytes over N devices takes alpha_s + 2(N−1)/N · S / bytes_per_s. */
typedef struct crew_link {
    double alpha_s;
    double bytes_per_s;
    char name[64];              /* what was measured: "shared memory", "host copies between cuda:0 and
                                   cuda:0", "NCCL between cuda:0 and cuda:1", "MPI link"; "" for a
                                   link given by the caller */
} crew_link;

/* This machine's shared memory as a link, measured: all-reduces of `bytes` and of one value between
 * two replicas' communication threads, as training runs them. */
crew_status crew_scale_measure_shared_memory(int64_t bytes, crew_link *out);
/* The processes of g as a link, measured: all-reduces of `bytes` and of one value across them,
 * one replica each, through the MPI communicator as training runs it; α the latency, β from the
 * ring's 2(P − 1)/P · S/β. Every process of g calls it; each gets its own measurement. */
crew_status crew_scale_measure_group_link(const struct crew_process_group *g, int64_t bytes, crew_link *out);
/* The link between two devices of `kind` as training's all-reduce crosses it, two replicas each
 * with its communication thread: shared memory for the kinds whose memory the host reaches (as
 * crew_scale_measure_shared_memory); between GPUs, NCCL where the kind has it and two are
 * visible, else the staged path through host copies (on one GPU, two replicas sharing it). */
crew_status crew_scale_measure_device_link(const char *kind, int64_t bytes, crew_link *out);
/* Device 0 of `kind`'s copies of `bytes` from pinned host memory and back, each as a link: alpha
 * the time of one value's copy, bytes_per_s the full size's rate beyond it. For a GPU, what each
 * micro-batch's input and each staged all-reduce pays. */
crew_status crew_scale_measure_copies(const char *kind, int64_t bytes, crew_link *up, crew_link *down);

/* How fast `threads` replicas step in lockstep, each relative to one alone (1: no slowdown),
 * measured for about `seconds` in all with replica-like rounds of about round_s (a step's compute):
 * a dense layer's GEMM and an AdamW-like pass over stream_values values (the model's parameter
 * count), each round ending where all threads meet. Shared execution units (SMT, vCPUs), memory
 * bandwidth, other processes and the waits for the slowest thread all show in it. */
crew_status crew_scale_probe_parallel(int threads, double seconds, int64_t stream_values, double round_s,
                                      double *speed);

typedef struct crew_scale_model {
    int64_t batch_per_device;
    int64_t gradient_bytes;      /* S: what each step all-reduces */
    double compute_s;            /* one replica's forward + backward + update + bookkeeping per step */
    double data_s;               /* one replica's wait for data per step */
    double helper_s;             /* CPU time per step and replica of the loader and communication
                                    threads: it competes with the replicas once every core is busy */
    double jitter_s;             /* per-step compute jitter: the slowest of N replicas sets the pace */
    double hidden_fraction;      /* the share of the all-reduce hidden behind the backward pass */
    int cores;                   /* CPU cores this machine's replicas share */
    double parallel_speed;       /* `cores` replicas in lockstep each step at this fraction of the
                                    speed of one alone (1: no slowdown): fitted to a trial above one
                                    replica and within the cores, else the probe's */
    int speed_fitted;            /* 1: parallel_speed comes from a trial */
    crew_link link;              /* fitted, or the shared-memory fallback */
    int link_fitted;             /* 2: α and β fitted to two or more counts; 1: the fallback scaled
                                    to one measured count; 0: the fallback as it is */
    char link_note[256];         /* where α and β came from, in words */
    /* The gradient noise scale B_noise (crew_fit_result.noise_scale) and the global batch M0 of the
     * run it was measured in, or NaN and 0: with it, each projection says what a global batch M is
     * worth in progress (below). crew_scale_fit leaves it unknown; the caller sets it. */
    double noise_scale;
    int64_t noise_batch;
} crew_scale_model;

/* Fits the cost model to trials (at least one). fallback: the link to use, or to calibrate,
 * when fewer than two replica counts above one were measured. cores: this machine's;
 * parallel_speed: crew_scale_probe_parallel(cores, ...), used when no trial ran 2 to `cores`
 * replicas (0: not measured, taken as 1). */
crew_status crew_scale_fit(const crew_scale_trial *trials, int n, int64_t gradient_bytes, const crew_link *fallback,
                           int cores, double parallel_speed, crew_scale_model *out);

/* One replica count's projection. */
typedef struct crew_scale_point {
    int devices;
    int64_t global_batch;
    double step_s;
    double compute_s, data_s, comm_s, sync_s; /* parts of step_s: comm = exposed all-reduce, sync =
                                                 waiting for the slowest replica */
    double shared_cores_s;       /* extra compute time because replicas side by side compute slower
                                    than one alone (on this machine: shared units, other processes,
                                    more replicas than cores) */
    double samples_per_s, speedup, efficiency;
    double epochs_s;             /* seconds to train the asked epochs of the training set: epochs ×
                                    ⌊train_samples / global_batch⌋ × step_s (the last partial global
                                    batch dropped, as training does; evaluation not included);
                                    INFINITY when not one global batch fits */
    /* With the model's noise scale (NaN without): the statistical efficiency of this global batch M,
     * E(M) = (B_noise + M0) / (B_noise + M), what a sample is worth in progress against one at the
     * noise's batch M0 (Pollux, Qiao et al. 2021; from McCandlish et al. 2018's steps S = S_min
     * (1 + B_noise / M)); goodput = samples_per_s × E(M); and the time and steps to the progress the
     * asked epochs make at M0: epochs_s / E(M) and the steps in it. */
    double statistical_efficiency, goodput, to_target_s, to_target_steps;
} crew_scale_point;

/* The statistical efficiency of a global batch M against M0 with the gradient noise scale B_noise
 * measured at M0: E(M) = (B_noise + M0) / (B_noise + M) (above), what one sample at M is worth in
 * progress against one at M0; NaN unless all three are positive. The steps to the same progress
 * scale by (M0 / M) / E(M). */
double crew_statistical_efficiency(double noise_scale, int64_t noise_batch, int64_t global_batch);

/* A run's gradient noise scale, as its run directory's metrics.jsonl last recorded it, and the global
 * batch it was measured at: what crew scale --from RUN_DIR projects with. A run without one is a
 * CREW_CODE_BAD_INPUT error saying why there may be none. */
crew_status crew_run_noise_scale(const char *run_dir, double *noise_scale, int64_t *global_batch);

/* link NULL: this machine (the model's link, replicas sharing its cores); else devices with their
 * own cores connected by *link. train_samples and epochs size the run for epochs_s. */
void crew_scale_predict(const crew_scale_model *cm, const crew_link *link, int devices, int64_t train_samples,
                        int epochs, crew_scale_point *out);

typedef struct crew_scale_advice {
    int recommended_devices;
    double one_device_s;         /* seconds for the epochs on one device (that point's epochs_s) */
    double recommended_s;        /* seconds for the epochs on the recommended count */
    int stall_devices;           /* the first projected count under 75% efficiency, or 0 */
    char reason[768];            /* the recommendation in words */
    char stall[768];             /* where scaling stalls, why, and the change that would help; or "" */
    /* With the model's noise scale (0, NaN and "" without): the count that reaches the asked epochs'
     * progress soonest (to_target_s; ties: fewer), its time, the last count each of whose next
     * counts still cuts that time by 10% or more (where adding devices stops paying), and why. */
    int goodput_devices;
    double goodput_s;
    int pays_until_devices;
    char goodput_reason[768];
} crew_scale_advice;

/* counts: the projected replica counts, ascending, starting at 1. link as for crew_scale_predict.
 * A count whose global batch exceeds train_samples is never recommended (it would not step). */
void crew_scale_advise(const crew_scale_model *cm, const crew_link *link, const int *counts, int n_counts,
                       int64_t train_samples, int epochs, double worth_it_s, crew_scale_advice *out);

/* A duration in the unit that reads best: "4.2 s", "90 s", "16 min", "2.3 h", "4.1 d"; "-" when not
 * finite (no time to give, as epochs_s when not one global batch fits). The advice's sentences and
 * crew scale's tables use it, so a time reads the same in both. Returns buf, for printf. */
const char *crew_format_duration(double seconds, char *buf, size_t len);

/* A size in bytes in binary units: "512 B", "4.61 MiB", "23.5 GiB" (three significant digits).
 * crew plan's table and the memory verdicts use it, so a size reads the same in both. Returns buf. */
const char *crew_format_bytes(int64_t bytes, char *buf, size_t len);

/* A share in percent with the digits it needs: "42%", "3.5%", "0.42%", and "99.7%" for what is just
 * under 100 (never rounded up to "100%", nor written "1e+02%"); "-" when not finite. Returns buf. */
const char *crew_format_percent(double percent, char *buf, size_t len);

/* Writes s as a JSON string (quoted, with '"', '\\' and control characters escaped) to f; NULL
 * writes "". The library's metrics files and the CLI's --json lines both use it. */
void crew_json_write_string(FILE *f, const char *s);

/* After a fit: one line when the run's own telemetry says that scaling was not worth it (several
 * replicas spending under half of each step computing, or a step dominated by waiting). Returns 1
 * and fills buf then; 0 (buf "") otherwise. */
int crew_fit_scaling_hint(const crew_fit_result *r, const crew_fit_plan *p, char *buf, size_t len);

const char *crew_version(void);

/* ---- crew's structs by name, for front ends in other languages (docs/PYTHON.md)
 *
 * What the Python package (ctypes) reads and sets of crew's structs without restating their
 * layout: each member's name ("epochs"; a nested one "augment.flip"), type, offset and count. */
typedef enum crew_field_type {
    CREW_FIELD_INT = 1,         /* int, and the enums */
    CREW_FIELD_INT64,
    CREW_FIELD_UINT64,          /* uint64_t and size_t */
    CREW_FIELD_FLOAT,
    CREW_FIELD_DOUBLE,
    CREW_FIELD_STRING,          /* const char *: the caller keeps the text alive */
    CREW_FIELD_CHARS,           /* char[count]: NUL-terminated text in the struct */
    CREW_FIELD_POINTER,         /* any other pointer: a dataset, a callback, user data */
} crew_field_type;
typedef struct crew_field {
    const char *name;
    crew_field_type type;
    size_t offset;              /* from the start of the struct, in bytes */
    int count;                  /* 1, or the elements of an array member (stage_first: 65) */
} crew_field;
/* The members of struct `name` (crew_struct_name lists them: "crew_fit_options", "crew_fit_plan",
 * "crew_fit_result", "crew_step_info", "crew_epoch_info", "crew_event_info", "crew_eval_result",
 * "crew_arrays", "crew_run_config"), with the struct's size in bytes into *size and the members'
 * number into *n; NULL for a name it does not know. */
const crew_field *crew_struct_fields(const char *name, size_t *size, int *n);
const char *crew_struct_name(int i);    /* the i-th, NULL past the last */

/* CPU cores this process may run on: its affinity mask (taskset, a container's cpuset), which can
 * be fewer than the machine has. At least 1. "--devices cpu" and the default loader threads use it. */
int crew_cpu_cores(void);

/* The device kinds this build of crew has ("cpu", "cpu-guarded", ...): i-th name and a line about
 * it, or NULL past the last. */
const char *crew_device_kind_name(int i, const char **about);
/* "KIND" (every device of that kind this process may use: its cores for cpu) or "KIND:N" into
 * kind and *count. An unknown kind or a bad count is a CREW_CODE_INVALID_ARGUMENT error whose
 * message lists the kinds built in. */
crew_status crew_devices_parse(const char *text, char *kind, size_t kind_len, int *count);
/* How many devices of `kind` this process sees, and whether they have memory of their own (a GPU:
 * 1) or share the host's (the CPU kinds: 0). An unknown kind is an error listing the kinds. */
crew_status crew_device_kind_about(const char *kind, int *available, int *own_memory);
/* The name of the convolution library of kind's devices ("cuDNN"), NULL for an unknown kind or one
 * without; *measured (may be NULL): 1 when --conv auto measures it against im2col + GEMM, 0 for a
 * library used only when asked (cpu-remote's test stand-in). */
const char *crew_device_kind_conv_library(const char *kind, int *measured);

/* The CPU's GEMM library in use, for version lines and bug reports ("oneDNN 2.6.3 sgemm,
 * instruction sets up to AVX512_CORE"; in an OpenBLAS build "OpenBLAS 0.3.21 DYNAMIC_ARCH ...,
 * kernels for Haswell"). */
void crew_blas_describe(char *buf, size_t len);

/* 1 when the GEMM library runs kernels older than this CPU supports (an OpenBLAS that does not know
 * a new CPU model falls back to SSE3 kernels, several times slower; oneDNN held back by
 * DNNL_MAX_CPU_ISA), with one line of advice in buf naming the setting that fixes it; 0 and ""
 * otherwise. */
int crew_blas_check(char *buf, size_t len);

/* ---- run directories (docs/CHECKPOINTS.md): what a front end (crew train, crew.fit in Python)
 * does with one before crew_fit_run writes there. A run directory belongs to one run: crew owns
 * what it writes there (crew_run_dir_owned, and the lock file below, which outlives every run and
 * is no run's) and nothing else, and a new run never starts on top of another one's files, which
 * would mix the two (the old checkpoints would outrank the new ones, and a later resume continue
 * the old run). Errors name the directory; the advice on what to do next is the front end's. */

/* config.json, metrics.jsonl, tb, checkpoints, report.html, weights.safetensors: the i-th, NULL
 * past the last. */
const char *crew_run_dir_owned(int i);
/* The run directory's path: `wanted` when given, else runs/<model file stem>-<YYYYmmdd-HHMMSS>
 * (with -2, -3, ... when a run started in the same second has it). Creates nothing. */
void crew_run_dir_choose(const char *wanted, const char *model_path, char *out, size_t len);
/* How many of crew's files (crew_run_dir_owned) path holds, listed into `list` ("config.json,
 * tb/"): another run's, which a new run must not start on. */
int crew_run_dir_holds(const char *path, char *list, size_t len);
/* A new run may use path: it does not exist, or is a directory (crew_run_dir_holds then says
 * whether another run is there). */
crew_status crew_run_dir_usable(const char *path);
/* path is a directory a run can be resumed in. */
crew_status crew_run_dir_check_resume(const char *path);
/* No symbolic link where crew keeps its files: none of crew_run_dir_owned, nothing in tb/, no
 * entry of checkpoints/ (a temporary included) nor a file of a checkpoint; the error names the
 * first link and what it points to. */
crew_status crew_run_dir_check_links(const char *path);
/* A run directory that is itself a symbolic link is followed, and said: note gets "run directory X
 * is a symbolic link: the run is written into Y" ("" when path is no link); a link to nothing, or
 * to something not a directory, is an error. */
crew_status crew_run_dir_follow(const char *path, char *note, size_t note_len);
/* Removes crew's files from path (tb/ and checkpoints/ with all they hold), nothing else; a
 * symbolic link is removed, never followed. */
crew_status crew_run_dir_clear(const char *path);
/* Creates the directory and its parents. */
crew_status crew_run_dir_create(const char *path);
typedef struct crew_run_config {
    const char *model_path;     /* the model file, as given */
    const char *data_dir;       /* the dataset directory, or what the data was ("arrays x [60000, 28, 28, 1]") */
    const char *devices;        /* "cpu:2" */
    const char *init_weights;   /* or NULL */
    const char *front_end;      /* who ran it ("python 3.11.7, keras 3.15.1"), or NULL */
    const crew_fit_plan *plan;
} crew_run_config;
/* Writes RUN_DIR/config.json: everything the run resolved (atomically, never through a link). */
crew_status crew_run_dir_write_config(const char *run_dir, const crew_run_config *c);

/* ---- run directories: one run at a time (docs/CHECKPOINTS.md, "One run at a time")
 *
 * A run directory (crew_fit_options.run_dir) belongs to one run. The program that runs there holds
 * its lock while it runs: RUN_DIR/lock, a POSIX record lock (fcntl) on the whole file, which the
 * kernel drops when the holder's process ends, however it ends, so a lock never outlives its
 * holder and a dead run never blocks the next. The file stays, empty when no one holds it.
 * crew_fit does not take it: the program that owns the directory does (crew train, before it
 * reads or writes anything there). */
typedef struct crew_run_lock crew_run_lock;
/* Locks dir (which must exist) for `what` ("crew train"). Held by another process: a
 * CREW_CODE_INVALID_ARGUMENT error naming the holder as it described itself ("crew train, process
 * 4242 on host node7, since 2025-06-01 10:00:00 CEST"). dir/lock as a symbolic link is refused.
 * On a filesystem that keeps no locks (ENOLCK, EOPNOTSUPP, ...) *out comes back unlocked and
 * crew_run_lock_note says so; else the note is "". */
crew_status crew_run_lock_take(const char *dir, const char *what, crew_run_lock **out);
const char *crew_run_lock_note(const crew_run_lock *l);
/* Empties the lock file and drops the lock; NULL is a no-op. */
void crew_run_lock_release(crew_run_lock *l);

/* ---- processes: a run across processes and machines (MPI)
 *
 * The application starts MPI (MPI_Init_thread with at least MPI_THREAD_SERIALIZED: crew calls MPI
 * from one thread of a process at a time) and hands crew a communicator, or asks crew to
 * (crew_mpi_start, below); crew never initialises or finalises MPI on its own. Every collective
 * between processes is non-blocking MPI polled against the run's deadline, so that a process that
 * never answers is named, not waited for. */
typedef struct crew_process_group crew_process_group;

/* 1 when this build has MPI (CMake found it), else 0: then crew_group_open_mpi fails saying so. */
int crew_have_mpi(void);
/* The MPI library this build runs with, "Open MPI v4.1.4, ..." (its first line), or "none". */
void crew_mpi_describe(char *buf, size_t len);
/* The CUDA this build runs with: "runtime 13.0, driver 13.0, cuBLAS 13.1.0, cuDNN 9.19.0; cuda:0 NVIDIA H200
 * (139.8 GiB, compute 9.0)", "... driver none ...; no GPU visible", or that this build has no CUDA
 * (its toolkit was not found when it was configured). */
void crew_cuda_describe(char *buf, size_t len);
/* The NCCL this build runs with, "2.28.9", or that this build has none. */
void crew_nccl_describe(char *buf, size_t len);
/* 1 when the environment says mpirun or mpiexec started this process (Open MPI, MPICH, PMIx). */
int crew_launched_by_mpi(void);
/* A group of the processes of `mpi_comm` (a pointer to an MPI_Comm, duplicated: the caller's stays
 * its own); every process of it calls this, and learns the others' host names within timeout_s. */
crew_status crew_group_open_mpi(const void *mpi_comm, double timeout_s, crew_process_group **out);
int crew_group_rank(const crew_process_group *g);
int crew_group_size(const crew_process_group *g);
/* This process's host, as MPI names it. */
const char *crew_group_host(const crew_process_group *g);
/* Why a run's gradient buckets have their size (crew_fit_plan.bucket_rule; docs/PERFORMANCE.md has
 * the measurements behind each): as asked (--bucket-mb); one bucket, where every core of a single
 * process's machine computes a replica; about a sixteenth of the gradients a bucket, where the
 * processes are on several hosts and the all-reduce crosses a network; else PyTorch DDP's 25 MB. */
typedef enum crew_bucket_rule {
    CREW_BUCKETS_ASKED,
    CREW_BUCKETS_BUSY_CORES,
    CREW_BUCKETS_HOSTS,
    CREW_BUCKETS_DDP,
} crew_bucket_rule;

/* How many hosts the group's processes are on: their distinct host names (1 without a group). */
int crew_group_hosts(const crew_process_group *g);
/* Every process passes its own `value` of the same `what` ("model file", "crew version", ...);
 * CREW_OK when all are equal, else a CREW_CODE_BAD_INPUT error on every process that names the
 * first process whose value differs from process 0's and both values. Values longer than 400
 * bytes compare by their first 400. */
crew_status crew_group_agree(const crew_process_group *g, const char *what, const char *value, double timeout_s);
/* The size and XXH3-64 of a whole file, streamed (a FIFO, a device or a directory is refused,
 * never read; a file whose size changes while it is hashed is CREW_CODE_IO, naming the path):
 * what the processes of a run compare to know they read the same model and dataset. */
crew_status crew_file_hash(const char *path, int64_t *bytes, uint64_t *xxh3);
/* Process 0's `bytes` bytes of buf into every process's buf (a result only process 0 has: the
 * Python package's History). */
crew_status crew_group_broadcast(const crew_process_group *g, void *buf, size_t bytes, double timeout_s,
                                 const char *what);
/* Frees the group (MPI_Comm_free of its duplicate); MPI itself stays initialised. */
void crew_group_close(crew_process_group *g);
/* For an application with no MPI code of its own (the Python package under mpirun): starts MPI if
 * nothing has (MPI_Init_thread, MPI_THREAD_SERIALIZED) and opens the group of MPI_COMM_WORLD; and
 * at the end, MPI_Finalize, or with rc != 0 MPI_Abort(rc), since a process that failed alone may
 * leave the others waiting for it for ever. crew calls neither on its own. */
crew_status crew_mpi_start(double timeout_s, crew_process_group **out);
void crew_mpi_stop(int rc);

#ifdef __cplusplus
}
#endif

#endif /* CREW_H */
