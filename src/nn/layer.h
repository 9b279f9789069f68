/* layer.h — the layer interface.
 *
 * A layer is a table of functions (build, workspace, forward, backward, release) plus its own
 * configuration and workspace. Its parameters are slices of the model's one contiguous parameter
 * buffer (trainable) or state buffer (running statistics), and its gradients slices of the
 * gradient buffer; the model sets the pointers after laying the buffers out.
 *
 * Conventions for a pass over a micro-batch of `rows` samples:
 * - x is [rows, in], y is [rows, out] (in, out: the layer's per-sample sizes);
 * - backward overwrites its parameter gradients (the trainer accumulates micro-batches itself,
 *   so that the order of every floating-point sum is fixed) and writes dx unless dx is NULL,
 *   which the model passes exactly when l->needs_input_grad is 0 (see that field);
 * - a parameter's gradient may be its value's memory (ZeRO-3, src/train/rank_units.c: the
 *   gathered unit's buffer takes its gradient), so backward reads each value before it writes that
 *   parameter's gradient (dx first), or keeps a copy of what it reads after (crew_layer_value_kept).
 */
#ifndef CREW_NN_LAYER_H
#define CREW_NN_LAYER_H

#include "backend/backend.h"
#include "core/shape.h"
#include "crew.h"

#define CREW_LAYER_MAX_PARAMS 12 /* a transformer block's */
#define CREW_LAYER_MAX_WORK 20

typedef enum crew_init {
    CREW_INIT_ZEROS = 0,
    CREW_INIT_ONES,
    CREW_INIT_GLOROT_UNIFORM, /* U(±sqrt(6 / (fan_in + fan_out))), Keras's default */
    CREW_INIT_UNIFORM_005,    /* U(±0.05), Keras's default for embeddings */
    CREW_INIT_NORMAL,         /* N(0, std²), GPT-2's init (crew_param.std) */
} crew_init;

typedef struct crew_param {
    const char *name;   /* "kernel", "bias", "gamma", "beta", "moving_mean", ... */
    crew_shape shape;   /* the tensor's full shape, e.g. dense kernel [in, out] */
    int trainable;      /* 0: lives in the state buffer, has no gradient */
    crew_init init;
    int64_t fan_in, fan_out;
    float std;          /* CREW_INIT_NORMAL's standard deviation */
    /* Tied weights. A tied parameter is another layer's (layer tie_layer, earlier in the model,
     * parameter tie_param): it has no room of its own in the buffers and is not initialised,
     * saved, loaded or counted; its value and grad point at the owner's. The owner is marked
     * shared, and its layer's backward adds to its gradient instead of overwriting it: the tied
     * layer, later in the model, runs its backward first and writes the gradient's first part. */
    int tied, tie_layer, tie_param;
    int shared;
    int64_t offset;     /* into the model's params (trainable) or state buffer; set by the model */
    float *value;       /* set by the model */
    float *grad;        /* set by the model once it reserves its buffers; NULL when not trainable */
} crew_param;

/* 0 for a tied parameter (another layer's): loops over a model's tensors skip it, so that each is
 * counted, saved, compared and initialised once. */
static inline int crew_param_owned(const crew_param *p) { return !p->tied; }

/* Everything a layer needs to know about the pass it runs in. */
typedef struct crew_pass {
    const crew_backend *be;
    int64_t rows;                /* samples in this micro-batch */
    int training;                /* 1: dropout active, batch norm uses batch statistics */
    uint64_t seed;
    int64_t step;                /* optimizer step, for dropout masks */
    const int64_t *sample_ids;   /* [rows] device memory: dataset index of each sample, for dropout masks */
    /* Synchronised batch norm: sums per-channel statistics (doubles, backend.h says why) over all
     * replicas in place (rank order). NULL: statistics are local to this micro-batch. total_rows
     * is then rows. */
    crew_status (*sync_sum)(void *user, double *buf, int64_t n);
    void *sync_user;
    double total_rows;
    /* 1: a layer with a tied parameter leaves that parameter's gradient to its tied_grad op
     * (crew_model.tied_grads_late); its backward writes dx alone */
    int tied_grad_late;
    /* 1: no backward follows this forward (evaluation, prediction), so a layer need not prepare
     * what only its backward reads (a transformer block's GELU slope) */
    int forward_only;
} crew_pass;

typedef struct crew_layer crew_layer;

/* How a run's layers keep their activations: set from the plan on every replica and pipeline stage
 * (crew_model_set_storage) before their workspace is reserved; the workspace ops read it, and the
 * memory planner counts a model as a run would set it (crew_layer_workspace_as). */
typedef struct crew_act_storage {
    /* --precision bf16: a transformer block keeps its GEMM-only activations and its attention
     * probabilities in bfloat16 (layer_transformer.c) */
    int bf16;
    /* --attention recompute: a transformer block keeps no attention probabilities for backward but
     * recomputes them there, the same bits, in scratch its model shares among its layers */
    int att_recompute;
    /* a conv2d that takes in its relu and pool (crew_model_layer_absorbs) runs the device's one
     * pass and keeps no buffer for its output (crew_device_kind.conv_one_pass), unless it runs by
     * the device's convolution library; 0: the buffer is there for the layers one after the other */
    int conv_one_pass;
} crew_act_storage;

typedef struct crew_layer_ops {
    /* Checks the configuration against the input shape, sets l->out and declares l->params.
     * Errors name the key that is wrong; the caller prefixes the layer. */
    crew_status (*build)(crew_layer *l);
    /* The scratch memory forward and backward need for micro-batches of `rows` samples: n[i] is
     * the element count of work[i] (4-byte elements: floats, or max pooling's int32 arg-maxes, or
     * two for each of batch norm's doubles, or one for two bfloat16 values),
     * 0 where the layer uses no buffer i; n arrives zeroed. NULL: the layer needs none.
     * This is the one statement of a layer's workspace: crew_layer_reserve allocates exactly
     * these buffers and the memory planner (src/advise/memory_plan.c) counts exactly these, so
     * the two cannot drift. It reads only what build set, so it cannot fail. */
    void (*workspace)(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK]);
    crew_status (*forward)(crew_layer *l, const crew_pass *p, const float *x, float *y);
    crew_status (*backward)(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                            const float *dy, float *dx);
    /* Frees what crew_layer_reserve allocated (it may be called again after). */
    void (*release)(crew_layer *l, const crew_backend *be);
    /* Bit i set: work[i] carries nothing from one call to the next (forward and backward each
     * write it before they read it: im2col columns, backward's gradients), so a model gives all
     * its layers one buffer for slot i, the largest any of them asks for, instead of one each
     * (crew_model_reserve): a device runs one layer at a time. */
    unsigned scratch;
    /* A layer with a tied parameter (lm_head) may leave that parameter's gradient for later: with
     * crew_pass.tied_grad_late set its backward writes dx alone, and the model calls tied_grad just
     * before the owner's backward, with the layer's input and output gradient still in place
     * (crew_model_tied_late_ok says where they are), so that a sharded replica (ZeRO-2/3) keeps no
     * buffer of the shared table's own through the pass (src/train/rank_units.c). NULL: the layer
     * has no tied parameter. */
    crew_status (*tied_grad)(crew_layer *l, const crew_pass *p, const float *x, const float *dy);
    /* 1: backward reads none of the layer's parameter values (an embedding's scatter-add), so a
     * ZeRO-3 replica does not gather them for it. */
    int backward_reads_no_values;
} crew_layer_ops;

struct crew_layer {
    const crew_layer_ops *ops;
    crew_layer_spec spec;        /* spec.name points at name below */
    char name[64];
    int index;                   /* position in the model, for messages */
    /* 1: some earlier layer has trainable parameters, so backward gets a dx to write. 0: nothing
     * upstream needs this layer's input gradient (the input is data) and the model's backward
     * passes dx == NULL — or, below the first layer with trainable parameters, does not run the
     * layer at all. Set once when the model appends the layer; backward and the workspace op
     * both read it, so a layer that needs a spare buffer for dx gets one exactly when it is
     * called without dx. 0 (calloc's value) for a layer outside a model: the safe side. */
    int needs_input_grad;
    crew_shape in, out;          /* per-sample shapes */
    /* lm_head: the layer whose token table it shares, and that table's shape [vocab, dim]; the
     * model resolves spec.tie to them before build */
    int tie_owner;
    crew_shape tie_shape;
    crew_param params[CREW_LAYER_MAX_PARAMS];
    int n_params;
    /* conv2d: 1 when it runs by the device's convolution library where that runs its geometry
     * (crew_fit_plan.conv_choice, set on a run's replicas by crew_model_set_conv_ways; copies
     * of the model keep it), 0: im2col + GEMM */
    int conv_by_library;
    /* max_pool2d: 1 when it pools relu(x) for the relu layer right before it, which then hands its
     * input through instead of running (crew_model_layer_passes); set by the model as it appends
     * the layer, 0 for a layer outside a model */
    int relu_in;
    crew_act_storage store;      /* the run's (crew_model_set_storage; copies of the model keep it) */
    float *work[CREW_LAYER_MAX_WORK]; /* backend workspace, sized by the workspace op for
                                          reserved_rows (crew_layer_reserve) */
    unsigned work_shared;        /* bit i: work[i] is its model's shared scratch, not the layer's to free */
    int64_t reserved_rows;
};

/* 1 when layer l's backward writes gradients of its own (its first parameter is trainable and not
 * another layer's): where the grads-ready hook and a sharded replica's units look. */
static inline int crew_layer_trains(const crew_layer *l)
{
    return l->n_params && l->params[0].trainable && !l->params[0].tied;
}

/* Parameter i's value for a backward pass that still reads it after writing the parameter's
 * gradient (layer norm's gamma, which one op reads while it sums the gradient): the value itself,
 * or, where the gradient is written over it (ZeRO-3), a copy in spare ([the parameter's count]). */
const float *crew_layer_value_kept(const crew_layer *l, const crew_pass *p, int i, float *spare);

/* The table for each layer type; NULL for an unknown type. */
const crew_layer_ops *crew_layer_ops_for(crew_layer_type type);
/* Keras's name stem for a type: "dense", "conv2d", ... */
const char *crew_layer_type_name(crew_layer_type type);

/* Declares a parameter during build. */
crew_param *crew_layer_declare(crew_layer *l, const char *name, crew_shape shape, int trainable, crew_init init,
                               int64_t fan_in, int64_t fan_out);
/* A trainable parameter initialised N(0, std²). */
crew_param *crew_layer_declare_normal(crew_layer *l, const char *name, crew_shape shape, float std);
/* The layer's workspace for micro-batches of `rows` samples: n[i] elements for work[i], 0 for a
 * buffer it does not use (the workspace op, or all zeros when the type has none). */
void crew_layer_workspace(const crew_layer *l, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK]);
/* The same for the layer as a run storing its activations as s says would reserve it: the memory
 * planner's view of a model whose layers are not set for the run. */
void crew_layer_workspace_as(const crew_layer *l, int64_t rows, const crew_act_storage *s,
                             int64_t n[CREW_LAYER_MAX_WORK]);
/* Allocates the workspace for micro-batches of up to max_rows samples on the backend, replacing
 * what an earlier call allocated. */
crew_status crew_layer_reserve(crew_layer *l, const crew_backend *be, int64_t max_rows);
/* The same with its scratch buffers (crew_layer_ops.scratch) at shared[i], buffers the caller owns
 * and has sized for every layer it gives them to; NULL entries, or shared NULL: its own. */
crew_status crew_layer_reserve_shared(crew_layer *l, const crew_backend *be, int64_t max_rows,
                                      float *const shared[CREW_LAYER_MAX_WORK]);
/* Frees all of a layer's work buffers (a release that needs nothing else). */
void crew_layer_free_work(crew_layer *l, const crew_backend *be);
/* A conv2d that takes in the relu and 2x2 max pool after it (nn/model.h's crew_model_layer_absorbs),
 * forward and backward (layer_conv2d.c): x its input, conv_out its own output buffer, y and dy the
 * pool's output and its gradient. */
crew_status crew_conv2d_pool_forward(crew_layer *conv, crew_layer *pool, const crew_pass *p, const float *x,
                                     float *conv_out, float *y);
crew_status crew_conv2d_pool_backward(crew_layer *conv, crew_layer *pool, const crew_pass *p, const float *x,
                                      float *conv_out, const float *dy);

#endif
