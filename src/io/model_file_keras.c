/* model_file_keras.c — importing a Keras 3 Sequential model from model.to_json().
 *
 * Keras writes every setting of every layer. Settings crew has no use for (initializers, dtype,
 * constraints left at null, names of metrics, ...) are ignored; a setting crew would silently get
 * wrong (channels_first, dilation, groups, a regularizer, a frozen layer, a normalisation axis
 * other than the last) is an error naming the file, the layer and the key. The layer index in
 * messages is the index in the file's "layers" list, where Keras puts the InputLayer first. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/model_file.h"

typedef crew_status (*keras_parse_fn)(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                      crew_layer_spec *spec);

/* ------------------------------------------------------------------ settings crew cannot honour */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A key that must be absent, null, or equal to the value Keras uses for "off". */
static crew_status expect_off(const crew_mf_where *w, const cJSON *cfg, const char *key, const char *why)
{
    const cJSON *v = crew_mf_get(w, cfg, key);
    if (!v || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0.0)) return CREW_OK;
    return crew_mf_error(w, "key '%s' is set: %s", key, why);
}

static crew_status check_common(const crew_mf_where *w, const cJSON *cfg)
{
    for (const cJSON *c = cfg->child; c; c = c->next) {
        if (!c->string || cJSON_IsNull(c)) continue;
        int reg = ends_with(c->string, "_regularizer"), con = ends_with(c->string, "_constraint");
        if (!reg && !con) continue;
        char q[64];
        crew_mf_quote(c->string, q, sizeof q);
        return crew_mf_error(w, "key '%s' is set: crew does not support %s", q,
                             reg ? "regularizers" : "weight constraints");
    }
    const cJSON *trainable = crew_mf_get(w, cfg, "trainable");
    if (cJSON_IsFalse(trainable)) return crew_mf_error(w, "key 'trainable' is false: crew cannot freeze layers");
    const char *format = NULL;
    CREW_TRY(crew_mf_string(w, cfg, "data_format", 0, &format));
    if (format && strcmp(format, "channels_last") != 0) {
        char q[64];
        crew_mf_quote(format, q, sizeof q);
        return crew_mf_error(w, "key 'data_format' is '%s': crew supports only channels_last (NHWC)", q);
    }
    CREW_TRY(expect_off(w, cfg, "quantization_config", "crew does not support quantized layers"));
    return expect_off(w, cfg, "lora_rank", "crew does not support LoRA layers");
}

/* dilation_rate 1 or [1, 1]; groups 1. */
static crew_status check_plain_conv(const crew_mf_where *w, const cJSON *cfg)
{
    int dilation[2] = {1, 1};
    int64_t groups = 1;
    CREW_TRY(crew_mf_pair(w, cfg, "dilation_rate", 0, CREW_MF_MAX_WINDOW, dilation));
    if (dilation[0] != 1 || dilation[1] != 1)
        return crew_mf_error(w, "key 'dilation_rate' is (%d, %d): crew supports only 1", dilation[0], dilation[1]);
    CREW_TRY(crew_mf_int(w, cfg, "groups", 0, 1, CREW_MF_MAX_SIZE, &groups));
    if (groups != 1) return crew_mf_error(w, "key 'groups' is %lld: crew supports only 1", (long long)groups);
    return CREW_OK;
}

/* A normalisation axis: -1, the last axis counted with the batch axis, or a list of just that. */
static crew_status check_last_axis(const crew_mf_where *w, const cJSON *cfg, const crew_model *m)
{
    const cJSON *v = crew_mf_get(w, cfg, "axis");
    if (!v) return CREW_OK;
    if (cJSON_IsArray(v) && v->child && !v->child->next) v = v->child;
    crew_shape in = m->n_layers ? m->layers[m->n_layers - 1]->out : m->input;
    if (cJSON_IsNumber(v) && (v->valuedouble == -1.0 || v->valuedouble == (double)in.ndim)) return CREW_OK;
    return crew_mf_error(w, "key 'axis' must be the last axis (-1 or %d): crew normalises over channels only",
                         in.ndim);
}

static crew_status check_center_scale(const crew_mf_where *w, const cJSON *cfg)
{
    int center = 1, scale = 1;
    CREW_TRY(crew_mf_bool(w, cfg, "center", &center));
    CREW_TRY(crew_mf_bool(w, cfg, "scale", &scale));
    if (!center || !scale)
        return crew_mf_error(w, "key '%s' is false: crew always learns gamma and beta", center ? "scale" : "center");
    return CREW_OK;
}

/* ------------------------------------------------------------------ layers */

static crew_status keras_dense(const crew_mf_where *w, const cJSON *cfg, const crew_model *m, crew_layer_spec *spec)
{
    (void)m;
    int use_bias = 1;
    CREW_TRY(crew_mf_int(w, cfg, "units", 1, 1, CREW_MF_MAX_SIZE, &spec->units));
    CREW_TRY(crew_mf_activation(w, cfg, "activation", 0, &spec->activation));
    CREW_TRY(crew_mf_bool(w, cfg, "use_bias", &use_bias));
    spec->no_bias = !use_bias;
    return CREW_OK;
}

static crew_status keras_conv2d(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                crew_layer_spec *spec)
{
    (void)m;
    int use_bias = 1;
    spec->strides[0] = spec->strides[1] = 1;
    CREW_TRY(check_plain_conv(w, cfg));
    CREW_TRY(crew_mf_int(w, cfg, "filters", 1, 1, CREW_MF_MAX_SIZE, &spec->filters));
    CREW_TRY(crew_mf_pair(w, cfg, "kernel_size", 1, CREW_MF_MAX_WINDOW, spec->kernel));
    CREW_TRY(crew_mf_pair(w, cfg, "strides", 0, CREW_MF_MAX_WINDOW, spec->strides));
    CREW_TRY(crew_mf_padding(w, cfg, "padding", &spec->padding));
    CREW_TRY(crew_mf_activation(w, cfg, "activation", 0, &spec->activation));
    CREW_TRY(crew_mf_bool(w, cfg, "use_bias", &use_bias));
    spec->no_bias = !use_bias;
    return CREW_OK;
}

static crew_status keras_pool(const crew_mf_where *w, const cJSON *cfg, const crew_model *m, crew_layer_spec *spec)
{
    (void)m;
    spec->pool[0] = spec->pool[1] = 2;
    CREW_TRY(crew_mf_pair(w, cfg, "pool_size", 0, CREW_MF_MAX_WINDOW, spec->pool));
    spec->strides[0] = spec->pool[0]; /* strides: null means the pool size */
    spec->strides[1] = spec->pool[1];
    CREW_TRY(crew_mf_pair(w, cfg, "strides", 0, CREW_MF_MAX_WINDOW, spec->strides));
    return crew_mf_padding(w, cfg, "padding", &spec->padding);
}

static crew_status keras_global_pool(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                     crew_layer_spec *spec)
{
    (void)m;
    (void)spec;
    return expect_off(w, cfg, "keepdims", "crew's global pooling outputs (channels,)");
}

static crew_status keras_nothing(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                 crew_layer_spec *spec)
{
    (void)w;
    (void)cfg;
    (void)m;
    (void)spec;
    return CREW_OK;
}

static crew_status keras_activation(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                    crew_layer_spec *spec)
{
    (void)m;
    return crew_mf_activation(w, cfg, "activation", 1, &spec->activation);
}

static crew_status keras_dropout(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                 crew_layer_spec *spec)
{
    (void)m;
    double rate = 0.0;
    CREW_TRY(crew_mf_real(w, cfg, "rate", 1, 0.0, 1.0, "[)", &rate));
    CREW_TRY(expect_off(w, cfg, "noise_shape", "crew drops values independently"));
    spec->rate = (float)rate;
    return CREW_OK;
}

static crew_status keras_norm(const crew_mf_where *w, const cJSON *cfg, const crew_model *m, crew_layer_spec *spec)
{
    double momentum = 0.99, epsilon = 1e-3;
    CREW_TRY(check_last_axis(w, cfg, m));
    CREW_TRY(check_center_scale(w, cfg));
    if (spec->type == CREW_LAYER_BATCH_NORM) {
        CREW_TRY(expect_off(w, cfg, "renorm", "crew does not support batch renormalization"));
        CREW_TRY(crew_mf_real(w, cfg, "momentum", 0, 0.0, 1.0, "()", &momentum));
    } else {
        CREW_TRY(expect_off(w, cfg, "rms_scaling", "crew's layer normalization centres the values"));
    }
    CREW_TRY(crew_mf_real(w, cfg, "epsilon", 0, 0.0, 1.0, "(]", &epsilon));
    spec->momentum = (float)momentum;
    spec->epsilon = (float)epsilon;
    if (spec->epsilon <= 0.0f) return crew_mf_error(w, "key 'epsilon' is too small for a float: %g", epsilon);
    return CREW_OK;
}

static crew_status keras_embedding(const crew_mf_where *w, const cJSON *cfg, const crew_model *m,
                                   crew_layer_spec *spec)
{
    (void)m;
    CREW_TRY(expect_off(w, cfg, "mask_zero", "crew does not support masking"));
    CREW_TRY(crew_mf_int(w, cfg, "input_dim", 1, 1, CREW_MF_MAX_SIZE, &spec->vocab));
    return crew_mf_int(w, cfg, "output_dim", 1, 1, CREW_MF_MAX_SIZE, &spec->dim);
}

typedef struct keras_kind {
    const char *class_name;
    crew_layer_type layer;
    keras_parse_fn parse;
} keras_kind;

static const keras_kind KERAS_KINDS[] = {
    {"Dense", CREW_LAYER_DENSE, keras_dense},
    {"Conv2D", CREW_LAYER_CONV2D, keras_conv2d},
    {"MaxPooling2D", CREW_LAYER_MAX_POOL2D, keras_pool},
    {"AveragePooling2D", CREW_LAYER_AVG_POOL2D, keras_pool},
    {"GlobalAveragePooling2D", CREW_LAYER_GLOBAL_AVG_POOL2D, keras_global_pool},
    {"Flatten", CREW_LAYER_FLATTEN, keras_nothing},
    {"Activation", CREW_LAYER_ACTIVATION, keras_activation},
    {"Dropout", CREW_LAYER_DROPOUT, keras_dropout},
    {"BatchNormalization", CREW_LAYER_BATCH_NORM, keras_norm},
    {"LayerNormalization", CREW_LAYER_LAYER_NORM, keras_norm},
    {"Embedding", CREW_LAYER_EMBEDDING, keras_embedding},
};
#define N_KERAS_KINDS ((int)(sizeof KERAS_KINDS / sizeof KERAS_KINDS[0]))

static const keras_kind *find_keras_kind(const char *class_name)
{
    for (int i = 0; i < N_KERAS_KINDS; i++)
        if (strcmp(KERAS_KINDS[i].class_name, class_name) == 0) return &KERAS_KINDS[i];
    return NULL;
}

static crew_status unsupported_class(const crew_mf_where *w, const char *class_name)
{
    char q[64], list[320];
    size_t used = 0;
    for (int i = 0; i < N_KERAS_KINDS && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", KERAS_KINDS[i].class_name);
    crew_mf_quote(class_name, q, sizeof q);
    return crew_mf_error(w, "Keras layer '%s' is not supported (crew imports InputLayer, %s)", q, list);
}

/* The layer's class_name and config; the scope names the layer by its Keras name. */
static crew_status layer_parts(crew_mf_where *w, char *scope, size_t scope_len, int index, const cJSON *item,
                               const char **cls, const cJSON **cfg, const char **name)
{
    snprintf(scope, scope_len, "layer %d", index);
    if (!cJSON_IsObject(item)) return crew_mf_error(w, "must be an object with \"class_name\" and \"config\"");
    CREW_TRY(crew_mf_string(w, item, "class_name", 1, cls));
    *cfg = crew_mf_get(w, item, "config");
    char q[64];
    crew_mf_quote(*cls, q, sizeof q);
    snprintf(scope, scope_len, "layer %d (%s)", index, q);
    if (!cJSON_IsObject(*cfg)) return crew_mf_error(w, "key 'config' must be an object");
    *name = NULL;
    CREW_TRY(crew_mf_name(w, *cfg, "name", name));
    if (*name) snprintf(scope, scope_len, "layer %d (%s)", index, *name);
    return CREW_OK;
}

static crew_status keras_layer(crew_model *m, const cJSON *item, int index, int last, const char *file)
{
    char scope[128];
    crew_mf_where w = {file, scope, 1};
    const char *cls, *name;
    const cJSON *cfg;
    CREW_TRY(layer_parts(&w, scope, sizeof scope, index, item, &cls, &cfg, &name));
    if (strcmp(cls, "InputLayer") == 0)
        return crew_mf_error(&w, "an InputLayer is supported only as the first layer");
    const keras_kind *kind = find_keras_kind(cls);
    if (!kind) return unsupported_class(&w, cls);
    CREW_TRY(check_common(&w, cfg));
    crew_layer_spec spec = {.type = kind->layer, .name = name};
    CREW_TRY(kind->parse(&w, cfg, m, &spec));
    if (spec.activation == CREW_ACT_SOFTMAX && index != last)
        return crew_mf_error(&w, "key 'activation': softmax is supported only in the last layer (it is fused "
                                 "into the loss)");
    return crew_mf_add_layer(m, &spec, &w);
}

/* ------------------------------------------------------------------ input shape */

static crew_status input_from_layer(const cJSON *first, const char *file, int64_t dims[3], int *ndim)
{
    char scope[128];
    crew_mf_where w = {file, scope, 1};
    const char *cls, *name;
    const cJSON *cfg;
    CREW_TRY(layer_parts(&w, scope, sizeof scope, 0, first, &cls, &cfg, &name));
    CREW_TRY(expect_off(&w, cfg, "sparse", "crew takes dense inputs"));
    CREW_TRY(expect_off(&w, cfg, "ragged", "crew takes dense inputs"));
    const char *key = "batch_shape"; /* Keras 3; Keras 2 wrote batch_input_shape */
    const cJSON *shape = crew_mf_get(&w, cfg, key);
    if (!shape) shape = crew_mf_get(&w, cfg, key = "batch_input_shape");
    if (!shape) return crew_mf_error(&w, "missing key 'batch_shape'");
    return crew_mf_shape(&w, shape, key, 1, dims, ndim);
}

/* From the InputLayer, else from what Keras recorded when the model was built. */
static crew_status keras_input_shape(const cJSON *root, const cJSON *config, const cJSON *first, const char *file,
                                     int64_t dims[3], int *ndim)
{
    crew_mf_where w = {file, "", 1};
    if (cJSON_IsObject(first)) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(first, "class_name");
        if (cJSON_IsString(cls) && strcmp(cls->valuestring, "InputLayer") == 0)
            return input_from_layer(first, file, dims, ndim);
    }
    const cJSON *build = crew_mf_get(&w, root, "build_config");
    const cJSON *shape = cJSON_IsObject(build) ? crew_mf_get(&w, build, "input_shape") : NULL;
    if (shape) return crew_mf_shape(&w, shape, "build_config.input_shape", 1, dims, ndim);
    shape = crew_mf_get(&w, config, "build_input_shape");
    if (shape) return crew_mf_shape(&w, shape, "build_input_shape", 1, dims, ndim);
    return crew_mf_error(&w, "no input shape: the model has no InputLayer (keras.Input) and was never built");
}

/* ------------------------------------------------------------------ compile_config */

/* 1: a number (into *out); 0: absent or null; -1: something else. */
static int number_at(const cJSON *obj, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 3.4e38) return -1;
    *out = v->valuedouble;
    return 1;
}

/* Absent, null, false or the number `off` (NAN: no number is off). */
static int is_off(const cJSON *obj, const char *key, double off)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == off);
}

static int keras_loss_known(const cJSON *loss)
{
    if (cJSON_IsString(loss)) return strcmp(loss->valuestring, "sparse_categorical_crossentropy") == 0;
    if (!cJSON_IsObject(loss)) return 0;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(loss, "class_name");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(loss, "config");
    if (!cJSON_IsString(cls) || strcmp(cls->valuestring, "SparseCategoricalCrossentropy") != 0) return 0;
    return !cJSON_IsObject(cfg) || is_off(cfg, "ignore_class", NAN) /* any class index is on */;
}

/* Fills o from a Keras Adam, AdamW, Lamb or SGD; 0 when crew cannot run it as written. */
static int keras_optimizer(const cJSON *opt, crew_optimizer_spec *o)
{
    if (!cJSON_IsObject(opt)) return 0;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(opt, "class_name");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(opt, "config");
    if (!cJSON_IsString(cls) || !cJSON_IsObject(cfg)) return 0;
    double lr = 0, wd = 0, clip = 0, b1 = 0.9, b2 = 0.999, eps = 1e-7, momentum = 0;
    if (number_at(cfg, "learning_rate", &lr) != 1 || !(lr > 0)) return 0; /* a schedule object: not mapped */
    if (number_at(cfg, "weight_decay", &wd) < 0 || number_at(cfg, "global_clipnorm", &clip) < 0) return 0;
    if (!is_off(cfg, "clipnorm", 0) || !is_off(cfg, "clipvalue", 0) || !is_off(cfg, "use_ema", 0) ||
        !is_off(cfg, "gradient_accumulation_steps", 1) || !is_off(cfg, "loss_scale_factor", 1))
        return 0;
    const char *c = cls->valuestring;
    *o = (crew_optimizer_spec){.lr = (float)lr, .weight_decay = (float)wd, .clip_norm = (float)clip};
    if (strcmp(c, "Adam") == 0 || strcmp(c, "AdamW") == 0 || strcmp(c, "Lamb") == 0) {
        if (number_at(cfg, "beta_1", &b1) < 0 || number_at(cfg, "beta_2", &b2) < 0 ||
            number_at(cfg, "epsilon", &eps) < 0 || !is_off(cfg, "amsgrad", 0))
            return 0;
        if (!(b1 > 0 && b1 < 1 && b2 > 0 && b2 < 1 && eps > 0)) return 0;
        /* Lamb: Keras applies its weight decay before the step, outside the trust ratio; crew, as the
         * paper, adds it to the update the ratio scales (the same without weight decay) */
        o->type = strcmp(c, "Lamb") == 0 ? CREW_OPT_LAMB : CREW_OPT_ADAMW;
        o->beta1 = b1;
        o->beta2 = b2;
        o->eps = (float)eps;
    } else if (strcmp(c, "SGD") == 0) {
        const cJSON *nesterov = cJSON_GetObjectItemCaseSensitive(cfg, "nesterov");
        if (number_at(cfg, "momentum", &momentum) < 0) return 0;
        o->type = CREW_OPT_SGD;
        o->momentum = (float)momentum;
        o->nesterov = cJSON_IsTrue(nesterov);
    } else {
        return 0;
    }
    crew_status s = crew_optimizer_spec_check(o);
    crew_status_free(s);
    return s == CREW_OK;
}

/* Keras's compile settings become the model's defaults when crew can honour them all. */
static void keras_compile(const cJSON *root, crew_model_defaults *d)
{
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(root, "compile_config");
    if (!cJSON_IsObject(cc)) return;
    crew_compile_options c = {.loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY};
    if (!keras_loss_known(cJSON_GetObjectItemCaseSensitive(cc, "loss"))) return;
    if (!keras_optimizer(cJSON_GetObjectItemCaseSensitive(cc, "optimizer"), &c.optimizer)) return;
    d->has_compile = 1;
    d->compile = c;
}

/* ------------------------------------------------------------------ the model */

static crew_status keras_layers(crew_model *m, const cJSON *layers, const char *file)
{
    int count = 0;
    for (const cJSON *c = layers->child; c; c = c->next) count++;
    int i = 0;
    const cJSON *c = layers->child;
    const cJSON *cls = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "class_name") : NULL;
    if (cJSON_IsString(cls) && strcmp(cls->valuestring, "InputLayer") == 0) {
        c = c->next; /* already read for the input shape */
        i = 1;
    }
    if (!c) {
        crew_mf_where w = {file, "", 1};
        return crew_mf_error(&w, "the model has no layers besides its input");
    }
    for (; c; c = c->next, i++) CREW_TRY(keras_layer(m, c, i, count - 1, file));
    return CREW_OK;
}

static void keras_model_name(const cJSON *config, const char *file, crew_model *m)
{
    crew_mf_where w = {file, "", 1};
    const char *name = NULL;
    crew_status s = crew_mf_name(&w, config, "name", &name);
    /* The model's name is only a label: one crew could not use as a layer name is left out. */
    if (!s && name) snprintf(m->name, sizeof m->name, "%s", name);
    crew_status_free(s);
}

/* ------------------------------------------------------------------ Functional models */

/* The Keras tensors a layer's call took: every "__keras_tensor__" object under its inbound node
 * (its arguments and keyword arguments alike); the last one's source layer into *from. */
static int count_tensors(const cJSON *v, const char **from)
{
    int n = 0;
    if (cJSON_IsObject(v)) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(v, "class_name");
        if (cJSON_IsString(cls) && strcmp(cls->valuestring, "__keras_tensor__") == 0) {
            const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(v, "config");
            const cJSON *hist = cJSON_IsObject(cfg) ? cJSON_GetObjectItemCaseSensitive(cfg, "keras_history") : NULL;
            const cJSON *layer = cJSON_IsArray(hist) ? hist->child : NULL;
            *from = cJSON_IsString(layer) ? layer->valuestring : "?";
            return 1;
        }
    }
    if (cJSON_IsObject(v) || cJSON_IsArray(v))
        for (const cJSON *c = v->child; c; c = c->next) n += count_tensors(c, from);
    return n;
}

static const char *entry_name(const cJSON *item)
{
    const cJSON *name = cJSON_IsObject(item) ? cJSON_GetObjectItemCaseSensitive(item, "name") : NULL;
    if (cJSON_IsString(name)) return name->valuestring;
    const cJSON *cfg = cJSON_IsObject(item) ? cJSON_GetObjectItemCaseSensitive(item, "config") : NULL;
    name = cJSON_IsObject(cfg) ? cJSON_GetObjectItemCaseSensitive(cfg, "name") : NULL;
    return cJSON_IsString(name) ? name->valuestring : "?";
}

/* The model's one input or output layer ("input_layers": [["image", 0, 0]]), or NULL. */
static const char *end_layer(const cJSON *config, const char *key)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsArray(list) && cJSON_GetArraySize(list) == 1) list = list->child; /* [[name, 0, 0]] */
    const cJSON *name = cJSON_IsArray(list) ? list->child : NULL;
    return cJSON_IsString(name) ? name->valuestring : NULL;
}

/* A Functional model is read as the Sequential model it equals when its layers, in the file's
 * order, form one chain: each takes one tensor, the previous layer's, and is called once; the
 * first is the model's one input and the last its one output. Anything else (a branch, a residual
 * sum, a shared layer, several inputs) is an error naming the layer. */
static crew_status keras_functional_chain(const cJSON *layers, const cJSON *config, const char *file)
{
    crew_mf_where w = {file, "", 1};
    const char *prev = NULL;
    int i = 0;
    for (const cJSON *c = layers->child; c; c = c->next, i++) {
        char q[64], p[64];
        const char *name = entry_name(c);
        crew_mf_quote(name, q, sizeof q);
        const cJSON *nodes = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "inbound_nodes") : NULL;
        int n_nodes = cJSON_IsArray(nodes) ? cJSON_GetArraySize(nodes) : -1;
        if (i == 0) {
            if (n_nodes > 0)
                return crew_mf_error(&w, "layer 0 ('%s') of the Functional model takes an input: the first layer must "
                                         "be its InputLayer", q);
            prev = name;
            continue;
        }
        if (n_nodes != 1)
            return crew_mf_error(&w, "layer %d ('%s') is called %s: crew imports Functional models whose layers form "
                                 "one chain, each layer called once", i, q, n_nodes > 1 ? "more than once" : "never");
        const char *from = NULL;
        int inputs = count_tensors(nodes->child, &from);
        if (inputs != 1)
            return crew_mf_error(&w, "layer %d ('%s') takes %d inputs: crew imports Functional models whose layers "
                                 "form one chain, each layer taking the previous one's output", i, q, inputs);
        if (strcmp(from, prev) != 0) {
            crew_mf_quote(from, p, sizeof p);
            char r[64];
            crew_mf_quote(prev, r, sizeof r);
            return crew_mf_error(&w, "layer %d ('%s') takes the output of '%s', not of the layer before it ('%s'): "
                                 "crew imports Functional models whose layers form one chain", i, q, p, r);
        }
        prev = name;
    }
    const char *first = entry_name(layers->child), *in = end_layer(config, "input_layers"),
               *out = end_layer(config, "output_layers");
    if (!in || strcmp(in, first) != 0)
        return crew_mf_error(&w, "key 'config.input_layers' must name the one input, the first layer");
    if (!out || !prev || strcmp(out, prev) != 0)
        return crew_mf_error(&w, "key 'config.output_layers' must name the one output, the last layer");
    return CREW_OK;
}

crew_status crew_model_from_keras_json(const cJSON *root, const char *file, crew_model **out)
{
    *out = NULL;
    crew_mf_where w = {file, "", 1};
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "class_name");
    const int functional = cJSON_IsString(cls) && strcmp(cls->valuestring, "Functional") == 0;
    const char *kind = functional ? "Functional" : "Sequential";
    const cJSON *config = crew_mf_get(&w, root, "config");
    if (!cJSON_IsObject(config)) return crew_mf_error(&w, "key 'config' of the %s model must be an object", kind);
    const cJSON *layers = crew_mf_get(&w, config, "layers");
    if (!cJSON_IsArray(layers)) return crew_mf_error(&w, "key 'config.layers' must be a list of layers");
    int count = 0;
    for (const cJSON *c = layers->child; c && count <= CREW_MF_MAX_LAYERS + 1; c = c->next) count++;
    if (count > CREW_MF_MAX_LAYERS + 1)
        return crew_mf_error(&w, "key 'config.layers' has more than %d layers", CREW_MF_MAX_LAYERS);
    if (functional) CREW_TRY(keras_functional_chain(layers, config, file));
    int64_t dims[3];
    int ndim;
    CREW_TRY(keras_input_shape(root, config, layers->child, file, dims, &ndim));
    crew_model *m;
    CREW_TRY(crew_model_create(dims, ndim, &m));
    keras_model_name(config, file, m);
    crew_status s = keras_layers(m, layers, file);
    if (s) {
        crew_model_free(m);
        return s;
    }
    keras_compile(root, &m->defaults);
    *out = m;
    return CREW_OK;
}
