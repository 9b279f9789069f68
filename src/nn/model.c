/* model.c — building a sequential model layer by layer, laying out its flat buffers, and
 * running forward, loss and backward over one micro-batch. */
#include "nn/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"

crew_status crew_model_create(const int64_t *input_shape, int ndim, crew_model **out)
{
    *out = NULL;
    if (!input_shape || ndim < 1 || ndim > CREW_MAX_DIMS - 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "input shape must have 1 to %d axes, got %d",
                           CREW_MAX_DIMS - 1, ndim);
    int64_t size = 1;
    for (int i = 0; i < ndim; i++) {
        if (input_shape[i] <= 0 || input_shape[i] > (1 << 24))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "input shape axis %d must be in [1, 2^24], got %lld", i,
                               (long long)input_shape[i]);
        size *= input_shape[i]; /* at most 2^24 · 2^24 before the check below stops it */
        if (size > (1LL << 28))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "input shape holds more than 2^28 values per sample");
    }
    crew_model *m = calloc(1, sizeof *m);
    if (!m) return CREW_OOM();
    m->input.ndim = ndim;
    for (int i = 0; i < ndim; i++) m->input.dim[i] = input_shape[i];
    snprintf(m->name, sizeof m->name, "sequential");
    *out = m;
    return CREW_OK;
}

static crew_shape last_shape(const crew_model *m)
{
    return m->n_layers ? m->layers[m->n_layers - 1]->out : m->input;
}

static int name_taken(const crew_model *m, const char *name)
{
    for (int i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i]->name, name) == 0) return 1;
    return 0;
}

/* Keras's automatic names: dense, dense_1, dense_2, ... */
static void auto_name(const crew_model *m, crew_layer_type type, char *buf, size_t len)
{
    const char *stem = crew_layer_type_name(type);
    snprintf(buf, len, "%s", stem);
    for (int k = 1; name_taken(m, buf); k++) snprintf(buf, len, "%s_%d", stem, k);
}

/* Trainable parameters are declared first (gamma before moving_mean), so params[0] tells; a tied
 * parameter is its owner's, whose gradient is final only when the owner's backward has run. */


/* lm_head: the layer spec.tie names (else the latest gpt_embedding or embedding), whose first
 * parameter, its token table [vocab, dim], the head shares. */
static crew_status resolve_tie(const crew_model *m, crew_layer *l)
{
    const char *tie = l->spec.tie;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const crew_layer *o = m->layers[i];
        int named = tie && tie[0] ? strcmp(o->name, tie) == 0 : 0;
        int kind = o->spec.type == CREW_LAYER_GPT_EMBEDDING || o->spec.type == CREW_LAYER_EMBEDDING;
        if (named && !kind)
            return crew_errorf(CREW_CODE_BAD_INPUT, "key 'tie': layer '%s' is not an embedding", tie);
        if (named || (kind && !(tie && tie[0]))) {
            l->tie_owner = i;
            l->tie_shape = o->params[0].shape;
            l->spec.tie = o->name; /* the owner's storage: a clone resolves the same name again */
            return CREW_OK;
        }
    }
    if (tie && tie[0]) return crew_errorf(CREW_CODE_BAD_INPUT, "key 'tie': no earlier layer is named '%s'", tie);
    return crew_errorf(CREW_CODE_BAD_INPUT, "an lm_head needs an earlier embedding layer to share its table");
}

/* Layers lo..end − 1 of m computed as one model: the whole model (lo 0, end its computed layers),
 * or a pipeline stage of it as the memory planner weighs one before building it. Which layers
 * write over their input or hand it through depends on where such a model begins and ends. */
typedef struct layer_span {
    const crew_model *m;
    int lo, end;
} layer_span;

static layer_span whole_model(const crew_model *m) { return (layer_span){m, 0, crew_model_computed_layers(m)}; }

static int span_passes(layer_span s, int i);

/* act[i] is layer i − 1's input buffer, written over in place or handed through, not a buffer of
 * its own (i > lo). */
static int span_in_place(layer_span s, int i);
static int span_alias(layer_span s, int i)
{
    return i > s.lo && (span_passes(s, i - 1) || span_in_place(s, i - 1));
}

static int span_in_place(layer_span s, int i)
{
    const crew_layer *l = s.m->layers[i];
    /* behind another activation it would write over that one's output, which its backward reads;
     * never over the model's input (a flatten may hand it through): the caller's data */
    if (i == s.lo || l->spec.type != CREW_LAYER_ACTIVATION || s.m->layers[i - 1]->spec.type == CREW_LAYER_ACTIVATION)
        return 0;
    int owner = i;
    while (span_alias(s, owner)) owner--;
    if (owner == s.lo) return 0;
    crew_activation a = l->spec.activation;
    return a == CREW_ACT_RELU || a == CREW_ACT_TANH || a == CREW_ACT_SIGMOID;
}

static int span_passes(layer_span s, int i)
{
    const crew_layer *l = s.m->layers[i];
    if (i + 1 >= s.end) return 0; /* the top: the loss may write over it, or the next stage reads it */
    if (l->spec.type == CREW_LAYER_FLATTEN) return 1;
    return l->spec.type == CREW_LAYER_ACTIVATION && l->spec.activation == CREW_ACT_RELU &&
           s.m->layers[i + 1]->spec.type == CREW_LAYER_MAX_POOL2D && span_in_place(s, i);
}

/* A first convolution of few taps (its input is data: no dx), then a relu folded into a 2x2 max pool
 * that tiles its output: the convolution computes the three (crew_model_layer_absorbs). */
static int span_absorbs(layer_span s, int i)
{
    const crew_layer *l = s.m->layers[i];
    if (l->spec.type != CREW_LAYER_CONV2D || l->needs_input_grad || i + 2 >= s.end || !span_passes(s, i + 1))
        return 0;
    const crew_layer *pool = s.m->layers[i + 2];
    const crew_shape *k = &l->params[0].shape; /* [k_h, k_w, in_c, filters] */
    const int p_h = pool->spec.pool[0] ? pool->spec.pool[0] : 2, p_w = pool->spec.pool[1] ? pool->spec.pool[1] : 2;
    const int s_h = pool->spec.strides[0] ? pool->spec.strides[0] : p_h;
    const int s_w = pool->spec.strides[1] ? pool->spec.strides[1] : p_w;
    return k->dim[0] * k->dim[1] * k->dim[2] <= CREW_CONV_TAPS_MAX && p_h == 2 && p_w == 2 && s_h == 2 && s_w == 2 &&
           pool->out.dim[0] * 2 == pool->in.dim[0] && pool->out.dim[1] * 2 == pool->in.dim[1];
}

static int span_absorbed(layer_span s, int i) { return i - 2 >= s.lo && span_absorbs(s, i - 2); }

int crew_model_layer_in_place(const crew_model *m, int i) { return span_in_place(whole_model(m), i); }

int crew_model_layer_absorbs(const crew_model *m, int i) { return span_absorbs(whole_model(m), i); }

/* Computed by a layer before it, in both passes: a pool that a convolution takes in. */
static int layer_absorbed(const crew_model *m, int i) { return span_absorbed(whole_model(m), i); }

int crew_model_layer_passes(const crew_model *m, int i) { return span_passes(whole_model(m), i); }

static int act_is_alias(const crew_model *m, int i) { return span_alias(whole_model(m), i); }

/* The pool being appended takes in the relu right before it when that relu will hand its input
 * through (crew_model_layer_passes): decided from the layers before it, as every copy of the
 * model decides it. */
static int pool_takes_relu(const crew_model *m, const crew_layer_spec *spec)
{
    int i = m->n_layers - 1;
    return spec->type == CREW_LAYER_MAX_POOL2D && i >= 0 && m->layers[i]->spec.type == CREW_LAYER_ACTIVATION &&
           m->layers[i]->spec.activation == CREW_ACT_RELU && crew_model_layer_in_place(m, i);
}

int crew_model_grad_slot(const crew_model *m, int lo, int j, int end)
{
    layer_span s = {m, lo, end};
    /* the output of a convolution that takes in its relu and pool, and the relu's (the same): their
     * gradient is never in a ping-pong buffer (its one pass keeps none; the fallback writes it over
     * the convolution's output) */
    for (int back = 1; back <= 2; back++)
        if (j - back >= lo && j - back < end && span_absorbs(s, j - back)) return -1;
    int flips = 0;
    for (int i = j; i < end; i++) flips += !span_passes(s, i) && !span_absorbed(s, i);
    return flips % 2;
}

/* Whether backward must hand the next layer appended to m a dx: only when a layer before it has
 * trainable parameters; below the first such layer nothing needs a gradient, the input is data.
 * This is the one place that decides it (crew_layer.needs_input_grad). */
static int input_grad_needed(const crew_model *m)
{
    const crew_layer *prev = m->n_layers ? m->layers[m->n_layers - 1] : NULL;
    if (!prev) return m->input_grad; /* a pipeline stage's input is the stage before's output */
    return prev->needs_input_grad || crew_layer_trains(prev);
}

crew_status crew_model_append_layer(crew_model *m, const crew_layer_spec *spec, const char *name)
{
    const crew_layer_ops *ops = crew_layer_ops_for(spec->type);
    int index = m->n_layers;
    if (!ops) return crew_errorf(CREW_CODE_BAD_INPUT, "layer %d: unknown layer type %d", index, (int)spec->type);
    if (m->laid_out)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "layer %d: cannot add layers after the model was built", index);
    if (m->n_layers == m->cap_layers) {
        int cap = m->cap_layers ? 2 * m->cap_layers : 8;
        crew_layer **grown = realloc(m->layers, (size_t)cap * sizeof *grown);
        if (!grown) return CREW_OOM();
        m->layers = grown;
        m->cap_layers = cap;
    }
    crew_layer *l = calloc(1, sizeof *l);
    if (!l) return CREW_OOM();
    l->ops = ops;
    l->spec = *spec;
    l->index = m->layer_base + index;
    l->needs_input_grad = input_grad_needed(m);
    l->relu_in = pool_takes_relu(m, spec);
    l->in = last_shape(m);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->spec.name = l->name;
    crew_status s = spec->type == CREW_LAYER_LM_HEAD ? resolve_tie(m, l) : CREW_OK;
    if (!s) s = ops->build(l);
    if (!s && crew_shape_size(&l->out) <= 0)
        s = crew_errorf(CREW_CODE_BAD_INPUT, "produces an empty output");
    if (s) {
        free(l);
        return crew_error_prefix(s, "layer %d (%s): ", index, name);
    }
    for (int j = 0; j < l->n_params; j++)
        if (l->params[j].tied) m->layers[l->params[j].tie_layer]->params[l->params[j].tie_param].shared = 1;
    m->layers[m->n_layers++] = l;
    m->n_compute = m->n_layers;
    return CREW_OK;
}

crew_status crew_model_add(crew_model *m, const crew_layer_spec *spec)
{
    if (!m || !spec) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_add: NULL argument");
    char name[64];
    if (spec->name && spec->name[0]) {
        if (strlen(spec->name) >= sizeof name)
            return crew_errorf(CREW_CODE_BAD_INPUT, "layer %d: name '%.20s...' is longer than %zu characters",
                               m->n_layers, spec->name, sizeof name - 1);
        if (name_taken(m, spec->name))
            return crew_errorf(CREW_CODE_BAD_INPUT, "layer %d: name '%s' is used twice", m->n_layers, spec->name);
        snprintf(name, sizeof name, "%s", spec->name);
    } else {
        auto_name(m, spec->type, name, sizeof name);
    }
    if (m->n_layers && m->layers[m->n_layers - 1]->spec.type == CREW_LAYER_ACTIVATION &&
        m->layers[m->n_layers - 1]->spec.activation == CREW_ACT_SOFTMAX)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "layer %d (%s): softmax is supported only as the last layer (fused into the loss)",
                           m->n_layers, name);
    crew_activation act = spec->activation;
    int fused_act = (spec->type == CREW_LAYER_DENSE || spec->type == CREW_LAYER_CONV2D) && act != CREW_ACT_NONE;
    if (fused_act && (act < CREW_ACT_NONE || act > CREW_ACT_GELU_TANH))
        return crew_errorf(CREW_CODE_BAD_INPUT, "layer %d (%s): key 'activation' has an unknown value %d",
                           m->n_layers, name, (int)act);
    CREW_TRY(crew_model_append_layer(m, spec, name));
    if (fused_act) {
        /* Dense(activation=...) is a dense layer followed by an activation layer. */
        crew_layer_spec a = {.type = CREW_LAYER_ACTIVATION, .activation = act};
        char act_name[64];
        snprintf(act_name, sizeof act_name, "%.50s_act", name);
        CREW_TRY(crew_model_append_layer(m, &a, act_name));
    }
    return CREW_OK;
}

void crew_model_free(crew_model *m)
{
    if (!m) return;
    const crew_backend *be = &m->be;
    if (m->has_backend) {
        for (int i = 0; i < m->n_layers; i++) m->layers[i]->ops->release(m->layers[i], be);
        if (!m->borrowed) {
            crew_dev_free(be, m->params);
            crew_dev_free(be, m->grads);
            crew_dev_free(be, m->state);
        }
        if (m->act)
            for (int i = 0; i <= m->n_layers; i++)
                if (!act_is_alias(m, i)) crew_dev_free(be, m->act[i]);
        crew_dev_free(be, m->dbuf[0]);
        crew_dev_free(be, m->dbuf[1]);
        crew_dev_free(be, m->labels);
        crew_dev_free(be, m->sample_ids);
        crew_dev_free(be, m->row_loss);
        if (!m->scratch_borrowed)
            for (int i = 0; i < CREW_LAYER_MAX_WORK; i++) crew_dev_free(be, m->scratch[i]);
        if (m->owns_backend) crew_device_close(&m->be);
    }
    for (int i = 0; i < m->n_layers; i++) free(m->layers[i]);
    free(m->layers);
    free(m->act);
    free(m);
}

int64_t crew_model_param_count(const crew_model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *p = &m->layers[i]->params[j];
            if (p->trainable && crew_param_owned(p)) n += crew_shape_size(&p->shape);
        }
    return n;
}

int crew_model_layer_count(const crew_model *m) { return m->n_layers; }

crew_shape crew_model_output_shape(const crew_model *m)
{
    return m->n_compute ? m->layers[m->n_compute - 1]->out : m->input;
}

int64_t crew_model_classes(const crew_model *m)
{
    crew_shape s = crew_model_output_shape(m);
    return s.dim[s.ndim - 1];
}

int64_t crew_model_output_size(const crew_model *m) { return crew_model_classes(m); }

int64_t crew_model_positions(const crew_model *m)
{
    crew_shape s = crew_model_output_shape(m);
    return crew_shape_size(&s) / s.dim[s.ndim - 1];
}

void crew_model_summary(const crew_model *m, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
#define APPEND(...)                                                                       \
    do {                                                                                  \
        if (used < len) used += (size_t)snprintf(buf + used, len - used, __VA_ARGS__); \
    } while (0)
    char shape[64];
    crew_shape_format(&m->input, shape, sizeof shape);
    APPEND("%-28s %-20s %10s\n", "input", shape, "");
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        int64_t n = 0;
        for (int j = 0; j < l->n_params; j++)
            if (crew_param_owned(&l->params[j])) n += crew_shape_size(&l->params[j].shape);
        crew_shape_format(&l->out, shape, sizeof shape);
        if (l->spec.type == CREW_LAYER_LM_HEAD)
            APPEND("%-28s %-20s %10s\n", l->name, shape, "tied");
        else
            APPEND("%-28s %-20s %10lld\n", l->name, shape, (long long)n);
    }
    APPEND("trainable parameters: %lld\n", (long long)crew_model_param_count(m));
#undef APPEND
}

/* ------------------------------------------------------------------ buffers */

/* The caller's model keeps its values on a CPU device of its own: host code such as predict,
 * evaluation or loading weights then works on it without a run. */
static crew_status ensure_backend(crew_model *m)
{
    if (m->has_backend) return CREW_OK;
    CREW_TRY(crew_device_open("cpu", 0, NULL, &m->be));
    m->has_backend = 1;
    m->owns_backend = 1;
    return CREW_OK;
}

/* Each owned parameter's place in the params (trainable) or state buffer, in layer order. */
static void assign_offsets(crew_model *m)
{
    int64_t np = 0, ns = 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            crew_param *p = &m->layers[i]->params[j];
            if (!crew_param_owned(p)) continue;
            int64_t size = crew_shape_size(&p->shape);
            p->offset = p->trainable ? np : ns;
            *(p->trainable ? &np : &ns) += size;
        }
    m->n_params = np;
    m->n_state = ns;
}

/* Every parameter's value (and, once there, gradient) pointer into the model's buffers. */
static void point_params(crew_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            crew_param *p = &m->layers[i]->params[j];
            float *base = p->trainable ? m->params : m->state;
            p->value = base ? base + p->offset : NULL; /* NULL: params_elsewhere, or nothing to hold */
            if (m->grads && p->trainable) p->grad = m->grads + p->offset;
        }
    crew_model_point_tied(m); /* their owners are laid out by now */
}

void crew_model_point_tied(crew_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            crew_param *p = &m->layers[i]->params[j];
            if (!p->tied) continue;
            const crew_param *owner = &m->layers[p->tie_layer]->params[p->tie_param];
            p->offset = owner->offset;
            p->value = owner->value;
            if (p->trainable) p->grad = owner->grad;
        }
}

int crew_model_computed_layers(const crew_model *m)
{
    const crew_layer *last = m->n_layers ? m->layers[m->n_layers - 1] : NULL;
    int fused = last && last->spec.type == CREW_LAYER_ACTIVATION && last->spec.activation == CREW_ACT_SOFTMAX;
    return m->n_layers - fused;
}

void crew_model_count(crew_model *m)
{
    m->n_compute = crew_model_computed_layers(m);
    assign_offsets(m);
}

crew_status crew_model_layout(crew_model *m)
{
    if (m->laid_out) return CREW_OK;
    if (m->n_layers == 0) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "model has no layers");
    CREW_TRY(ensure_backend(m));
    /* A trailing softmax activation is fused into the loss; predict applies it. */
    m->n_compute = crew_model_computed_layers(m);
    if (m->n_compute == 0) return crew_errorf(CREW_CODE_BAD_INPUT, "model has no layer besides softmax");
    assign_offsets(m);
    /* The gradients come with the activations (crew_model_reserve): the caller's model, which only
     * holds the weights a run starts from and ends with, needs none. */
    crew_status s = m->params_elsewhere ? CREW_OK : crew_dev_alloc_f32(&m->be, m->n_params, &m->params);
    if (!s) s = crew_dev_alloc_f32(&m->be, m->n_state, &m->state);
    if (s) return crew_error_prefix(s, "the buffers of %lld parameters: ", (long long)m->n_params);
    point_params(m);
    m->laid_out = 1;
    return CREW_OK;
}

/* A model with m's layers (as they are, already split: crew_model_append_layer), its name,
 * defaults, compile options and stage, on backend be (NULL: none yet); no buffers. */
static crew_status copy_layers(const crew_model *m, const crew_backend *be, crew_model **out)
{
    *out = NULL;
    crew_model *c;
    CREW_TRY(crew_model_create(m->input.dim, m->input.ndim, &c));
    c->layer_base = m->layer_base;
    c->input_grad = m->input_grad;
    c->output_grad = m->output_grad;
    crew_status s = CREW_OK;
    for (int i = 0; i < m->n_layers && !s; i++) s = crew_model_append_layer(c, &m->layers[i]->spec, m->layers[i]->name);
    if (s) {
        crew_model_free(c);
        return s;
    }
    for (int i = 0; i < m->n_layers; i++) {
        c->layers[i]->conv_by_library = m->layers[i]->conv_by_library;
        c->layers[i]->store = m->layers[i]->store;
    }
    memcpy(c->name, m->name, sizeof c->name);
    c->defaults = m->defaults;
    c->compile = m->compile;
    c->compiled = m->compiled;
    if (be) {
        c->be = *be;
        c->has_backend = 1;
    }
    *out = c;
    return CREW_OK;
}

crew_status crew_model_view(crew_model *m, int64_t max_rows, crew_model **out)
{
    *out = NULL;
    if (!m->laid_out || !m->grads)
        return crew_errorf(CREW_CODE_INTERNAL, "a view of a model that has not reserved its buffers");
    if (max_rows > m->max_rows) /* its scratch is m's, sized for m's rows */
        return crew_errorf(CREW_CODE_INTERNAL, "a view of %lld rows of a model reserved for %lld", (long long)max_rows,
                           (long long)m->max_rows);
    crew_model *v;
    CREW_TRY(copy_layers(m, &m->be, &v));
    v->n_compute = m->n_compute;
    assign_offsets(v);
    v->params = m->params;
    v->grads = m->grads;
    v->state = m->state;
    v->borrowed = 1;
    memcpy(v->scratch, m->scratch, sizeof v->scratch); /* one layer runs at a time on the device */
    v->scratch_borrowed = 1;
    v->initialized = m->initialized;
    point_params(v);
    v->laid_out = 1;
    crew_status s = crew_model_reserve(v, max_rows); /* the gradients are there: it keeps m's */
    if (s) {
        crew_model_free(v);
        return s;
    }
    *out = v;
    return CREW_OK;
}

float *crew_model_input_grad(const crew_model *m)
{
    return m->input_grad ? m->dbuf[crew_model_grad_slot(m, 0, 0, m->n_compute)] : NULL;
}

static void init_values(const crew_param *p, uint64_t key, float *host, int64_t n)
{
    crew_rng rng = crew_rng_make(key);
    float limit = 0.0f;
    switch (p->init) {
    case CREW_INIT_ZEROS: memset(host, 0, (size_t)n * sizeof(float)); return;
    case CREW_INIT_ONES:
        for (int64_t i = 0; i < n; i++) host[i] = 1.0f;
        return;
    case CREW_INIT_GLOROT_UNIFORM: limit = sqrtf(6.0f / (float)(p->fan_in + p->fan_out)); break;
    case CREW_INIT_UNIFORM_005: limit = 0.05f; break;
    case CREW_INIT_NORMAL: /* Box–Muller over pairs of uniforms; 1 − u keeps the log's argument in (0, 1] */
        for (int64_t i = 0; i < n; i += 2) {
            double u1 = 1.0 - (double)crew_rng_next_uniform(&rng), u2 = (double)crew_rng_next_uniform(&rng);
            double r = sqrt(-2.0 * log(u1)) * (double)p->std, a = 6.283185307179586 * u2;
            host[i] = (float)(r * cos(a));
            if (i + 1 < n) host[i + 1] = (float)(r * sin(a));
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) host[i] = (2.0f * crew_rng_next_uniform(&rng) - 1.0f) * limit;
}

crew_status crew_model_init_params(crew_model *m, uint64_t seed)
{
    CREW_TRY(crew_model_layout(m));
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            crew_param *p = &m->layers[i]->params[j];
            if (!crew_param_owned(p)) continue;
            int64_t n = crew_shape_size(&p->shape);
            float *host = malloc((size_t)n * sizeof(float));
            if (!host) return CREW_OOM();
            init_values(p, crew_rng_key(seed, CREW_STREAM_INIT, (uint64_t)i, (uint64_t)j), host, n);
            crew_status s = crew_dev_upload_f32(&m->be, p->value, host, n);
            if (!s) s = m->be.ops->sync(m->be.ctx, NULL); /* the host values must outlive the copy */
            free(host);
            CREW_TRY(s);
        }
    m->initialized = 1;
    return CREW_OK;
}

int64_t crew_model_layer_act_size_as(const crew_model *m, int i, int64_t rows, const crew_act_storage *s)
{
    const crew_layer *l = m->layers[i];
    if (!s) s = &l->store;
    const int unkept = s->conv_one_pass && !l->conv_by_library && crew_model_layer_absorbs(m, i);
    return act_is_alias(m, i + 1) || unkept ? 0 : rows * crew_shape_size(&l->out);
}

int64_t crew_model_layer_act_size(const crew_model *m, int i, int64_t rows)
{
    return crew_model_layer_act_size_as(m, i, rows, NULL);
}

int crew_model_loss_in_place(const crew_model *m)
{
    int n = crew_model_computed_layers(m);
    return !m->output_grad && n > 0 && m->layers[n - 1]->spec.type != CREW_LAYER_ACTIVATION;
}

void crew_model_buffers(const crew_model *m, int64_t rows, crew_model_buffer_sizes *out)
{
    /* Backward's ping-pong buffers: with n computed layers, the gradient of act[n] is in dbuf[0]
     * (the next stage's, or the loss's unless it is written over the logits: a GPT's logits, wider
     * than everything else together, then take no room here), layer n − 1 writes d act[n − 1] into
     * dbuf[1], layer n − 2 d act[n − 2] into dbuf[0], ..., a layer that hands its input through
     * leaving its gradient where it is (crew_model_grad_slot): dbuf[k] is as wide as the widest
     * gradient it holds. */
    const int n = crew_model_computed_layers(m), top = crew_model_loss_in_place(m) ? n - 1 : n;
    int64_t wide[2] = {0, 0};
    for (int j = 0; j <= top; j++) {
        int64_t size = crew_shape_size(j == 0 ? &m->input : &m->layers[j - 1]->out);
        int k = crew_model_grad_slot(m, 0, j, n);
        if (k >= 0 && size > wide[k]) wide[k] = size;
    }
    out->act_input = rows * crew_shape_size(&m->input);
    out->dbuf[0] = rows * wide[0];
    out->dbuf[1] = rows * wide[1];
    out->labels = rows * crew_model_positions(m);
    out->sample_ids = rows;
    out->row_loss = rows * crew_model_positions(m);
}

/* Frees *p and allocates n elements of type t in its place. */
static crew_status realloc_dev(const crew_backend *be, crew_dtype t, int64_t n, void *p, void **out)
{
    crew_dev_free(be, p);
    *out = NULL;
    return be->ops->alloc(be->ctx, t, n, out);
}

void crew_model_set_input(crew_model *m, float *input)
{
    m->act[0] = input;
    for (int i = 1; i <= m->n_layers && act_is_alias(m, i); i++) m->act[i] = input;
}

crew_status crew_model_reserve(crew_model *m, int64_t max_rows)
{
    CREW_TRY(crew_model_layout(m));
    if (max_rows <= m->max_rows) return CREW_OK;
    const crew_backend *be = &m->be;
    if (!m->act) {
        m->act = calloc((size_t)m->n_layers + 1, sizeof *m->act);
        if (!m->act) return CREW_OOM();
    }
    crew_model_buffer_sizes n;
    crew_model_buffers(m, max_rows, &n);
    m->max_rows = 0; /* until every buffer below is in place */
    if (!m->grads && !m->grads_elsewhere) {
        CREW_TRY(crew_dev_alloc_f32(be, m->n_params, &m->grads));
        for (int i = 0; i < m->n_layers; i++)
            for (int j = 0; j < m->layers[i]->n_params; j++) {
                crew_param *p = &m->layers[i]->params[j];
                if (p->trainable) p->grad = m->grads + p->offset; /* a tied one's offset is its owner's */
            }
    }
    for (int i = 0; i <= m->n_layers; i++) {
        if (act_is_alias(m, i)) { /* its owner, act[i - 1], is already (re)allocated */
            m->act[i] = m->act[i - 1];
            continue;
        }
        int64_t size = i == 0 ? n.act_input : crew_model_layer_act_size(m, i - 1, max_rows);
        if (size == 0) { /* a convolution's output that its one pass never writes */
            crew_dev_free(be, m->act[i]);
            m->act[i] = NULL;
            continue;
        }
        crew_status s = realloc_dev(be, CREW_DT_F32, size, m->act[i], (void **)&m->act[i]);
        if (s) return crew_error_prefix(s, "activations of layer %d: ", i);
    }
    for (int k = 0; k < 2; k++)
        CREW_TRY(realloc_dev(be, CREW_DT_F32, n.dbuf[k], m->dbuf[k], (void **)&m->dbuf[k]));
    CREW_TRY(realloc_dev(be, CREW_DT_I32, n.labels, m->labels, (void **)&m->labels));
    CREW_TRY(realloc_dev(be, CREW_DT_I64, n.sample_ids, m->sample_ids, (void **)&m->sample_ids));
    CREW_TRY(realloc_dev(be, CREW_DT_F32, n.row_loss, m->row_loss, (void **)&m->row_loss));
    int64_t scratch[CREW_LAYER_MAX_WORK];
    crew_model_scratch_sizes(m, max_rows, NULL, scratch);
    for (int k = 0; k < CREW_LAYER_MAX_WORK && !m->scratch_borrowed; k++) { /* the layers reserve anew below */
        crew_dev_free(be, m->scratch[k]);
        m->scratch[k] = NULL;
        if (scratch[k] > 0) {
            crew_status s = crew_dev_alloc_f32(be, scratch[k], &m->scratch[k]);
            if (s) return crew_error_prefix(s, "the layers' shared scratch %d (%lld values): ", k, (long long)scratch[k]);
        }
    }
    for (int i = 0; i < m->n_layers; i++) {
        crew_layer *l = m->layers[i];
        crew_status s = crew_layer_reserve_shared(l, be, max_rows, m->scratch);
        if (s) return crew_error_prefix(s, "layer %d (%s): ", i, l->name);
    }
    m->max_rows = max_rows;
    return CREW_OK;
}

void crew_model_scratch_sizes(const crew_model *m, int64_t rows, const crew_act_storage *s,
                              int64_t n[CREW_LAYER_MAX_WORK])
{
    for (int k = 0; k < CREW_LAYER_MAX_WORK; k++) n[k] = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        int64_t w[CREW_LAYER_MAX_WORK];
        crew_layer_workspace_as(l, rows, s ? s : &l->store, w);
        for (int k = 0; k < CREW_LAYER_MAX_WORK; k++)
            if ((l->ops->scratch & (1u << k)) && w[k] > n[k]) n[k] = w[k];
    }
}

/* ------------------------------------------------------------------ passes */

crew_status crew_model_forward(crew_model *m, const crew_pass *p)
{
    if (p->rows > m->max_rows)
        return crew_errorf(CREW_CODE_INTERNAL, "forward: %lld rows exceed the %lld reserved", (long long)p->rows,
                           (long long)m->max_rows);
    for (int i = 0; i < m->n_compute; i++) {
        crew_layer *l = m->layers[i];
        crew_status s = m->visit ? m->visit(m->visit_user, i, CREW_VISIT_FORWARD) : CREW_OK;
        /* a layer that hands its input through, or that one below it computes, runs nothing; a
         * convolution that takes in its relu and pool writes the pool's output, act[i + 3] */
        if (!s && !crew_model_layer_passes(m, i) && !layer_absorbed(m, i))
            s = crew_model_layer_absorbs(m, i)
                    ? crew_conv2d_pool_forward(l, m->layers[i + 2], p, m->act[i], m->act[i + 1], m->act[i + 3])
                    : l->ops->forward(l, p, m->act[i], m->act[i + 1]);
        if (s) return crew_error_prefix(s, "layer %d (%s): ", i, l->name);
    }
    return CREW_OK;
}

crew_status crew_model_loss(crew_model *m, const crew_pass *p, float scale, double *loss_sum, double *correct)
{
    int64_t classes = crew_model_classes(m), pos = crew_model_positions(m), right = 0;
    const crew_backend_ops *o = m->be.ops;
    /* every position is a row of the softmax; the 1/pos makes a sample's loss their mean */
    float *dlogits = crew_model_loss_in_place(m) ? m->act[m->n_compute] : m->dbuf[0];
    CREW_TRY(o->softmax_xent(m->be.ctx, m->act[m->n_compute], m->labels, p->rows * pos, classes,
                             pos > 1 ? scale / (float)pos : scale, m->row_loss, dlogits, &right));
    /* in row order, in double: the same sum whichever device ran the loss */
    CREW_TRY(o->sum(m->be.ctx, m->row_loss, p->rows * pos, loss_sum));
    *loss_sum /= (double)pos;
    *correct = (double)right / (double)pos;
    return CREW_OK;
}

int crew_model_tied_late_ok(const crew_model *m)
{
    const int top = crew_model_computed_layers(m) - 1; /* the planner's models are not counted */
    int tied = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        for (int j = 0; j < l->n_params; j++) {
            if (!l->params[j].tied) continue;
            if (!l->ops->tied_grad || i != top) return 0;
            tied = 1;
        }
    }
    return tied && m->layer_base == 0 && crew_model_loss_in_place(m);
}

/* With tied_grads_late, before owner i's backward: the gradient parts of the tied layers that share
 * its parameters (the top layer alone: crew_model_tied_late_ok), from their input and the logits'
 * gradient, both still where forward and the loss left them. */
static crew_status late_tied_grads(crew_model *m, const crew_pass *p, int i)
{
    crew_layer *top = m->layers[m->n_compute - 1];
    for (int j = 0; j < top->n_params; j++)
        if (top->params[j].tied && top->params[j].tie_layer == i)
            return top->ops->tied_grad(top, p, m->act[m->n_compute - 1], m->act[m->n_compute]);
    return CREW_OK;
}

crew_status crew_model_backward(crew_model *m, const crew_pass *pass, crew_grads_ready_fn ready, void *user)
{
    crew_pass late = *pass;
    late.tied_grad_late = m->tied_grads_late;
    const crew_pass *p = &late;
    /* Below the first layer with trainable parameters nothing needs a gradient: the input is
     * data. So that layer skips its input gradient and the pass stops there (for an MLP behind
     * a flatten, a quarter of the backward GEMM work); without any, it stops at the last
     * computed layer. needs_input_grad says which layers get a dx: the layers' workspace ops
     * read the same field, so a layer that needs a spare dx buffer has one exactly here. */
    int cur = 0; /* dbuf[cur] holds d loss / d output of the layer being processed */
    for (int i = m->n_compute - 1; i >= 0; i--) {
        crew_layer *l = m->layers[i];
        float *dx = l->needs_input_grad ? m->dbuf[1 - cur] : NULL;
        /* the top layer's: over the logits, where the loss wrote it (crew_model_loss_in_place) */
        const float *dy = i == m->n_compute - 1 && crew_model_loss_in_place(m) ? m->act[i + 1] : m->dbuf[cur];
        /* a layer that hands its input through, or that a layer below computes, leaves dy where it
         * is, the dx of the layer below */
        const int passes = crew_model_layer_passes(m, i) || layer_absorbed(m, i);
        crew_status s = m->visit ? m->visit(m->visit_user, i, CREW_VISIT_BACKWARD) : CREW_OK;
        if (!s && m->tied_grads_late) s = late_tied_grads(m, p, i);
        if (!s && !passes) /* taking in its relu and pool, dy is the pool's, and there is no dx */
            s = crew_model_layer_absorbs(m, i)
                    ? crew_conv2d_pool_backward(l, m->layers[i + 2], p, m->act[i], m->act[i + 1], dy)
                    : l->ops->backward(l, p, m->act[i], m->act[i + 1], dy, dx);
        if (!s && m->visit) s = m->visit(m->visit_user, i, CREW_VISIT_BACKWARD_DONE);
        if (s) return crew_error_prefix(s, "layer %d (%s): ", i, l->name);
        if (!passes) cur = 1 - cur;
        if (ready && crew_layer_trains(l)) ready(user, l->params[0].offset);
        if (!dx) break;
    }
    return CREW_OK;
}

/* ------------------------------------------------------------------ replicas */

crew_status crew_model_copy_values(crew_model *dst, const crew_model *src)
{
    if (dst->n_params != src->n_params || dst->n_state != src->n_state)
        return crew_errorf(CREW_CODE_INTERNAL, "copy of model values: %lld/%lld values into %lld/%lld",
                           (long long)src->n_params, (long long)src->n_state, (long long)dst->n_params,
                           (long long)dst->n_state);
    CREW_TRY(crew_dev_transfer_f32(&dst->be, dst->params, &src->be, src->params, src->n_params));
    CREW_TRY(crew_dev_transfer_f32(&dst->be, dst->state, &src->be, src->state, src->n_state));
    dst->initialized = src->initialized;
    return CREW_OK;
}

crew_status crew_model_clone(const crew_model *m, const crew_backend *be, crew_model **out)
{
    *out = NULL;
    crew_model *c;
    CREW_TRY(copy_layers(m, be, &c));
    crew_status s = crew_model_layout(c);
    if (!s && m->laid_out) s = crew_model_copy_values(c, m);
    if (s) {
        crew_model_free(c);
        return s;
    }
    *out = c;
    return CREW_OK;
}

int crew_model_named_params(const crew_model *m, crew_named_param *out, int cap)
{
    int n = 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            if (!crew_param_owned(&m->layers[i]->params[j])) continue;
            if (n < cap) {
                snprintf(out[n].name, sizeof out[n].name, "%s.%s", m->layers[i]->name, m->layers[i]->params[j].name);
                out[n].param = &m->layers[i]->params[j];
            }
            n++;
        }
    return n;
}

int crew_model_conv_count(const crew_model *m, int before)
{
    int n = 0;
    for (int i = 0; i < m->n_layers && m->layers[i]->index < before; i++) n += m->layers[i]->spec.type == CREW_LAYER_CONV2D;
    return n;
}

void crew_model_set_storage(crew_model *m, const crew_act_storage *s)
{
    for (int i = 0; i < m->n_layers; i++) m->layers[i]->store = *s;
}

crew_act_storage crew_act_storage_for(int precision, int attention_recompute, const char *device_kind)
{
    const crew_device_kind *k = crew_device_kind_find(device_kind ? device_kind : "cpu");
    return (crew_act_storage){.bf16 = precision == CREW_PRECISION_BF16,
                              .att_recompute = attention_recompute != 0,
                              .conv_one_pass = k && k->conv_one_pass};
}

void crew_model_set_conv_ways(crew_model *m, const crew_model *whole, const char *ways)
{
    const size_t n = ways ? strlen(ways) : 0;
    for (int i = 0; i < m->n_layers; i++) {
        crew_layer *l = m->layers[i];
        if (l->spec.type != CREW_LAYER_CONV2D) continue;
        const size_t k = (size_t)crew_model_conv_count(whole, l->index);
        l->conv_by_library = k < n && ways[k] == 'l';
    }
}

int crew_model_tensor_bounds(const crew_model *m, int64_t *bounds)
{
    int n = 0;
    int64_t at = 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *p = &m->layers[i]->params[j];
            if (!crew_param_owned(p) || !p->trainable) continue;
            if (bounds) bounds[n] = at;
            at += crew_shape_size(&p->shape);
            n++;
        }
    if (bounds) bounds[n] = at;
    return n;
}
