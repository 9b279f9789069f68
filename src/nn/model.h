/* model.h — a sequential model: layers, the flat parameter/gradient/state buffers, and the
 * activations of one micro-batch, all in one backend's device memory. The caller's crew_model
 * lives on a CPU backend of its own; each rank of a fit builds its replica on its own device
 * (crew_model_clone) and copies the result back at the end. Optimizer state is not the model's:
 * the rank that trains it owns it (src/train/rank.h). */
#ifndef CREW_NN_MODEL_H
#define CREW_NN_MODEL_H

#include "backend/backend.h"
#include "crew.h"
#include "nn/layer.h"

/* What a model file said besides its layers: defaults for compile and fit. */
typedef struct crew_model_defaults {
    int has_compile;
    crew_compile_options compile;
    int epochs;                 /* 0: not given */
    int64_t batch_per_device;   /* 0: not given */
    int has_seed;
    uint64_t seed;
    int loader_threads;         /* 0: not given */
    int prefetch;               /* 0: not given */
    crew_augment_options augment;
} crew_model_defaults;

/* What is about to happen to layer `layer` (its index in the model) in a pass (crew_model.visit). */
typedef enum crew_visit {
    CREW_VISIT_FORWARD,         /* its forward pass is next */
    CREW_VISIT_BACKWARD,        /* its backward pass is next */
    CREW_VISIT_BACKWARD_DONE,   /* its backward pass wrote its parameters' gradients */
} crew_visit;
typedef crew_status (*crew_layer_visit_fn)(void *user, int layer, crew_visit what);

struct crew_model {
    char name[64];
    crew_shape input;               /* one sample, e.g. (28, 28, 1) */
    crew_layer **layers;
    int n_layers, cap_layers;
    int n_compute;                  /* layers run by forward/backward: a trailing softmax is fused into the loss */
    crew_model_defaults defaults;

    crew_backend be;                /* the device its buffers live on */
    int has_backend;
    int owns_backend;               /* 1: opened by the model itself (crew_model_layout), closed with it */

    /* Flat buffers, laid out in layer order (so backward completes a suffix of grads). */
    int laid_out;
    int64_t n_params;               /* trainable values */
    int64_t n_state;                /* non-trainable values (batch-norm moving statistics) */
    float *params;                  /* [n_params] */
    float *grads;                   /* [n_params] gradient of the current micro-batch (from crew_model_reserve on) */
    float *state;                   /* [n_state] */
    int initialized;                /* params hold trained, loaded or initialised values */

    /* Activations for micro-batches of up to max_rows samples. */
    int64_t max_rows;
    float **act;                    /* act[0]: input [max_rows, in]; act[i+1]: output of layer i */
    float *dbuf[2];                 /* ping-pong gradient buffers, [max_rows, largest layer size] */
    int32_t *labels;                /* [max_rows, positions]: a label at every position of the output */
    int64_t *sample_ids;            /* [max_rows] dataset index of each row, for dropout masks */
    float *row_loss;                /* [max_rows] */
    /* The layers' scratch (crew_layer_ops.scratch), one buffer per slot that every layer with that
     * slot's scratch shares, sized by crew_model_scratch_sizes: a GPT's blocks keep one set of
     * backward buffers instead of one each. A view (crew_model_view) borrows its model's: one layer
     * runs at a time on a device, whichever micro-batch it belongs to. */
    float *scratch[CREW_LAYER_MAX_WORK];
    int scratch_borrowed;

    int compiled;
    crew_compile_options compile;   /* the loss and optimizer a fit uses (checked by crew_model_compile) */

    /* A pipeline stage (model_stage.c): layers [layer_base, layer_base + n_layers) of a whole
     * model. Its layers keep their whole-model index (dropout masks depend on it), and a stage
     * after the first hands the gradient of its input back (input_grad), which its backward
     * leaves in crew_model_input_grad. borrowed: params, grads and state are another model's (a
     * second set of activations of the same stage), not freed with this one. */
    int layer_base;
    int input_grad;
    int borrowed;
    /* 1: a pipeline stage before the last, whose output's gradient the next stage sends into
     * dbuf[0]; 0: the model computes its loss itself (crew_model_loss_in_place). */
    int output_grad;

    /* Sharded replicas (ZeRO-2/3, train/rank_units.c). params_elsewhere: the model has no
     * parameter buffer (params NULL) and grads_elsewhere no gradient buffer (grads NULL); whoever
     * set them points each parameter's value and grad at memory of its own (a unit's gathered
     * values, a unit's gradient) before its layer runs, through `visit`. Set before
     * crew_model_layout and crew_model_reserve. */
    int params_elsewhere, grads_elsewhere;
    /* 1: the tied layers' parameter gradients are computed just before their owners' backward
     * instead of in their own (crew_layer_ops.tied_grad; only where crew_model_tied_late_ok), so
     * that a ZeRO-3 replica need not keep the shared table through the backward pass. The same
     * products in the same order: the same bits. */
    int tied_grads_late;
    crew_layer_visit_fn visit;      /* NULL: none */
    void *visit_user;
};

/* Lays out the parameter buffers on the model's backend; a model without one opens a device of
 * kind "cpu" of its own. */
crew_status crew_model_layout(crew_model *m);
/* Initialises every parameter from seed (Glorot-uniform kernels, zero biases, ...). */
crew_status crew_model_init_params(crew_model *m, uint64_t seed);
/* The model's own buffers for micro-batches of `rows` samples, in elements: the one statement
 * of them, which crew_model_reserve allocates and the memory planner (src/advise/memory_plan.c)
 * counts, each buffer its own backend allocation. The layers' workspace is the layers' own
 * (crew_layer_workspace). */
typedef struct crew_model_buffer_sizes {
    int64_t act_input;          /* act[0]: [rows, input size] */
    int64_t dbuf[2];            /* dbuf[k]: [rows, widest of the activations whose gradient it holds] */
    int64_t labels;             /* [rows, positions] int32 */
    int64_t sample_ids;         /* [rows] int64 */
    int64_t row_loss;           /* [rows, positions] */
} crew_model_buffer_sizes;
void crew_model_buffers(const crew_model *m, int64_t rows, crew_model_buffer_sizes *out);
/* n[i]: the shared scratch buffer of slot i for micro-batches of `rows` samples, in 4-byte
 * elements: the largest work[i] any layer whose slot i is scratch asks for (0: none does), with
 * the layers as a run storing its activations as s says would reserve them (NULL: as they are
 * set). crew_model_reserve allocates exactly these, and the memory planner counts them. */
void crew_model_scratch_sizes(const crew_model *m, int64_t rows, const crew_act_storage *s,
                              int64_t n[CREW_LAYER_MAX_WORK]);
/* Points the model's input (act[0], and the activations that alias it: in-place layers at the
 * front) at `input`, device memory of act_input floats: a rank double-buffers its inputs so that
 * one micro-batch's copy overlaps the previous one's passes (train/rank_step.c). The caller restores
 * the model's own buffer before anything reallocates or frees the model's buffers. */
void crew_model_set_input(crew_model *m, float *input);
/* 1: layer i writes its output over its input (act[i + 1] is act[i]): an activation whose
 * derivative its output gives (relu, tanh, sigmoid), behind a layer that is not an activation.
 * No layer's backward but an activation's reads its own output (only its input), so the values
 * before the activation are not needed once it has run; an activation's backward does read its
 * output, so one behind another keeps a buffer; the model's input (act[0], and what a flatten
 * hands through of it) is left alone. */
int crew_model_layer_in_place(const crew_model *m, int i);
/* 1: layer i hands its input through at no cost in both passes: forward and backward skip it,
 * act[i + 1] is act[i], and the gradient below it is the one above it, in the same buffer.
 * - a flatten below the top computed layer (NHWC values are already in Keras's flat order);
 * - a relu that writes over its input right before a max pool, which pools relu(x) itself
 *   (crew_layer.relu_in, backend.h's maxpool_forward): the pool of relu(x) and its arg-max are
 *   those of the two passes, and an output whose maximum is not positive sends no gradient back,
 *   as relu's backward would not, so the bits are the layers' own. Saves two passes over the
 *   convolution's output, the largest activation of a CNN. */
int crew_model_layer_passes(const crew_model *m, int i);
/* 1: conv2d layer i computes itself, the relu after it and the 2x2 max pool after that in both
 * passes: a convolution of few taps (k_h·k_w·in_c ≤ CREW_CONV_TAPS_MAX) whose input needs no
 * gradient (a first layer), a relu that the pool takes in (crew_model_layer_passes), and a pool
 * whose windows tile its output. The device's one pass (backend.h's conv_taps_pool_*) never
 * writes the convolution's output nor its gradient, the largest tensors of a CNN; a device without
 * it runs the layers one after the other (crew_conv2d_pool_forward). The pool then runs neither
 * pass itself nor switches backward's buffers, but keeps its own output. */
int crew_model_layer_absorbs(const crew_model *m, int i);
/* Which ping-pong buffer backward leaves the gradient of act[j] in, in a model of layers
 * lo..end − 1 of m (the whole: 0, its computed layers; a pipeline stage's range as the planner
 * weighs it), counting from act[end] in dbuf[0]: each layer in [j, end) switches buffers, but
 * those that hand their input through and the pools a convolution takes in. −1: never in one (the
 * output of a convolution that takes in its relu and pool, and the relu's). */
int crew_model_grad_slot(const crew_model *m, int lo, int j, int end);
/* act[i + 1], layer i's output for `rows` samples, in elements: [rows, size of layer i's output],
 * kept for the backward pass (a trailing softmax's too); 0 for a layer that works in place or
 * hands its input through. */
int64_t crew_model_layer_act_size(const crew_model *m, int i, int64_t rows);
/* The same with the layers keeping their activations as s says (NULL: as they are set): 0 also
 * for a convolution that takes in its relu and pool and runs the one pass (conv_one_pass). */
int64_t crew_model_layer_act_size_as(const crew_model *m, int i, int64_t rows, const crew_act_storage *s);
/* Sizes activations for micro-batches of up to max_rows samples (no-op when already enough); the
 * gradient buffer comes with the first call. */
crew_status crew_model_reserve(crew_model *m, int64_t max_rows);
/* Every tied parameter's offset, value and gradient pointed at its owner's, as they are now (after
 * the owners were pointed elsewhere: a sharded replica's units). */
void crew_model_point_tied(crew_model *m);

/* Forward through the computed layers; input in act[0], logits in act[n_compute]. The pass's
 * sample_ids, when dropout needs them, are device memory (m->sample_ids). */
crew_status crew_model_forward(crew_model *m, const crew_pass *p);
/* Softmax cross-entropy of the logits against m->labels at every position; a sample's loss is the
 * mean over its positions (GPT: the mean over the context). Leaves d(scale · Σ sample loss)/d logits
 * where backward takes it: over the logits themselves where crew_model_loss_in_place says so, else
 * in dbuf[0]. Returns the summed sample loss and the right arg-maxes, each position counting
 * 1/positions (so a classifier's count, and a language model's in samples' worth). */
crew_status crew_model_loss(crew_model *m, const crew_pass *p, float scale, double *loss_sum, double *correct);
/* 1 when the loss's gradient is written over the logits (act[n_compute]): the model computes its
 * loss (no output_grad) and its last computed layer is not an activation, the one kind of layer
 * whose backward reads its own output (crew_model_layer_in_place). A GPT's logits then need no
 * second buffer of their width. */
int crew_model_loss_in_place(const crew_model *m);
/* The layers forward and backward run: all but a trailing softmax, which the loss takes in and
 * predict applies (n_compute once the model is laid out or counted). */
int crew_model_computed_layers(const crew_model *m);

/* Called during backward each time the gradients from `offset` to the end of the buffer are
 * final, so the caller can start reducing them while earlier layers still compute. */
typedef void (*crew_grads_ready_fn)(void *user, int64_t offset);
crew_status crew_model_backward(crew_model *m, const crew_pass *p, crew_grads_ready_fn ready, void *user);

/* The logits' width (classes). */
int64_t crew_model_classes(const crew_model *m);
/* Positions per sample that each get logits and a label: 1 for a classifier, the context for a
 * language model ([T, vocab] logits). */
int64_t crew_model_positions(const crew_model *m);
/* Output shape of the model's last computed layer. */
crew_shape crew_model_output_shape(const crew_model *m);

/* A replica: the same layers on backend `be` (NULL: a CPU device of its own), with its own buffers
 * and a copy of m's parameters and state, carried across devices through host memory. */
crew_status crew_model_clone(const crew_model *m, const crew_backend *be, crew_model **out);
/* The convolution layers of m whose whole-model index is below `before` (INT_MAX: all of them). */
int crew_model_conv_count(const crew_model *m, int before);
/* Sets each convolution layer's way (crew_layer.conv_by_library) from ways, one character per
 * convolution layer of the whole model m belongs to ('l': the library; anything else or past the
 * end: im2col). m may be a pipeline stage of whole, or whole itself. */
void crew_model_set_conv_ways(crew_model *m, const crew_model *whole, const char *ways);
/* Sets every layer's activation storage (crew_layer.store) for a run. Before crew_model_reserve. */
void crew_model_set_storage(crew_model *m, const crew_act_storage *s);
/* A run's storage from its precision (a crew_precision) and crew_fit_options.attention_recompute. */
crew_act_storage crew_act_storage_for(int precision, int attention_recompute, const char *device_kind);
/* dst's parameters and state := src's (same layers, any two devices). */
crew_status crew_model_copy_values(crew_model *dst, const crew_model *src);

/* Adds one layer exactly as spec says, named `name` (crew_model_add also splits a fused
 * activation off a dense or conv layer; a clone or a stage copies layers already split). */
crew_status crew_model_append_layer(crew_model *m, const crew_layer_spec *spec, const char *name);

/* Pipeline stages (model_stage.c). Layers [first, end) of `full` as a model of its own on
 * backend `be`, holding a copy of their parameters and state; the stage's values are the
 * contiguous slices of full's buffers from crew_model_stage_offsets. Tied parameters must stay
 * in one stage, and the last stage keeps full's trailing softmax. */
crew_status crew_model_stage(const crew_model *full, int first, int end, const crew_backend *be, crew_model **out);
/* The same with no parameter buffer (params_elsewhere: a replica whose parameters are sharded,
 * ZeRO-3); its state buffer is copied. */
crew_status crew_model_stage_unbuffered(const crew_model *full, int first, int end, const crew_backend *be,
                                        crew_model **out);
/* The same stage's layers only, counted (crew_model_count) but with no buffers: for the memory
 * planner. */
crew_status crew_model_stage_layers(const crew_model *full, int first, int end, crew_model **out);
/* What crew_model_layout would lay out (n_compute, each parameter's offset, n_params, n_state),
 * without allocating anything. */
void crew_model_count(crew_model *m);
/* Where layers [first, ...) start in full's params and state buffers. */
void crew_model_stage_offsets(const crew_model *full, int first, int64_t *params, int64_t *state);
/* Another set of activations and workspace for model m (a micro-batch in flight in a pipeline):
 * the same layers on m's device, whose parameters, gradients, state and shared scratch are m's own
 * buffers. m must have reserved its buffers for at least max_rows rows; the view reserves max_rows
 * rows. Free it before m. */
crew_status crew_model_view(crew_model *m, int64_t max_rows, crew_model **out);
/* After crew_model_backward of a model with input_grad: d loss / d input, [rows, input size]. */
float *crew_model_input_grad(const crew_model *m);

/* 1 when m has a tied parameter and can compute its gradients late (crew_model.tied_grads_late):
 * every tied layer has a tied_grad op and is the top computed layer of a whole model whose loss
 * writes its gradient over the logits (crew_model_loss_in_place), so that its input and output
 * gradient are still in place when the owner's backward comes. */
int crew_model_tied_late_ok(const crew_model *m);

/* Units of a sharded replica (model_units.c, ZeRO-2/3): layers [first, end) whose owned trainable
 * parameters are [lo, hi) of the flat buffer, grown from the first layer until they hold at least
 * `target` values. pinned: the unit holds a parameter another layer ties to (a GPT's token
 * table, which the lm_head reads at the other end of the pass), so it stays gathered through
 * the step. Returns the count (out may be NULL with cap 0). The model must be counted or laid out. */
typedef struct crew_unit {
    int first, end;
    int64_t lo, hi;
    int pinned;
} crew_unit;
int crew_model_units(const crew_model *m, int64_t target, crew_unit *out, int cap);
/* The unit that holds layer `layer` (-1: none). */
int crew_model_unit_of(const crew_unit *units, int n, int layer);
/* The values of the widest of n units but the pinned one (*widest) and of the pinned one (*pinned, 0:
 * none): what the buffers of a sharded replica are sized by (crew_units_layout_for). */
void crew_model_unit_widths(const crew_unit *units, int n, int64_t *widest, int64_t *pinned);

/* Layer i's training FLOPs per sample (forward and backward; model_flops.c). */
double crew_model_layer_flops(const crew_model *m, int i);

/* "<layer>.<param>" for safetensors; returns the param or NULL. */
typedef struct crew_named_param {
    char name[128];
    const crew_param *param;
} crew_named_param;
/* Lists every parameter (trainable and state) in layer order; returns the count. */
int crew_model_named_params(const crew_model *m, crew_named_param *out, int cap);
/* Where each trainable tensor lies in the flat parameter buffer, in layer order (the layout's own
 * order, assign_offsets): bounds[j] .. bounds[j + 1] (bounds [count + 1], or NULL to count them).
 * Returns the count. What a layer-wise optimizer's norms are over. */
int crew_model_tensor_bounds(const crew_model *m, int64_t *bounds);

#endif
