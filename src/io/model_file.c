/* model_file.c — crew_model_load_file: reads a model file, parses it with cJSON, and builds the
 * model from crew's own JSON format (here) or a Keras 3 Sequential model.to_json()
 * (model_file_keras.c). docs/MODEL_FILES.md describes the format.
 *
 * crew's format is strict: an unknown key, a value of the wrong type or out of range is an error
 * naming the file, the layer index and the key, so a typo never silently falls back to a default. */
#include "io/model_file.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_text.h"
#include "core/mapped_file.h"

/* ------------------------------------------------------------------ reading */

crew_status crew_model_load_file(const char *path, crew_model **out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_load_file: out is NULL");
    *out = NULL;
    if (!path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_load_file: path is NULL");
    uint8_t *text;
    size_t len;
    CREW_TRY(crew_read_file(path, CREW_MF_MAX_FILE_BYTES, "a model file", &text, &len));
    crew_status s = crew_model_parse_json((const char *)text, len, path, out);
    free(text);
    return s;
}

static crew_status dispatch(const cJSON *root, const char *what, crew_model **out)
{
    crew_mf_where w = {what, "", 0};
    if (!cJSON_IsObject(root)) return crew_mf_error(&w, "the top level must be a JSON object");
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "class_name");
    if (!cls) return crew_model_from_crew_json(root, what, out);
    if (cJSON_IsString(cls) && (strcmp(cls->valuestring, "Sequential") == 0 || strcmp(cls->valuestring, "Functional") == 0))
        return crew_model_from_keras_json(root, what, out);
    char q[64];
    crew_mf_quote(cJSON_IsString(cls) ? cls->valuestring : "?", q, sizeof q);
    return crew_mf_error(&w, "Keras model class '%s' is not supported: only Sequential models and Functional ones whose "
                             "layers form one chain can be imported", q);
}

crew_status crew_model_parse_json(const char *text, size_t len, const char *what, crew_model **out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_parse_json: out is NULL");
    *out = NULL;
    if (!what) what = "model";
    if (!text && len) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_parse_json: text is NULL");
    crew_mf_where w = {what, "", 0};
    if (len > (size_t)CREW_MF_MAX_FILE_BYTES)
        return crew_mf_error(&w, "larger than %d MiB; not a model file", CREW_MF_MAX_FILE_BYTES >> 20);
    /* cJSON would end a string at a NUL: "a\u0000b" would read as "a" and pass the name rules. */
    int escaped;
    size_t nul = len ? crew_json_find_nul(text, len, &escaped) : (size_t)-1;
    if (nul != (size_t)-1 && !escaped) return crew_mf_error(&w, "byte %zu is NUL: not a JSON text file", nul);
    if (nul != (size_t)-1) {
        int line, col;
        crew_json_locate(text, nul, &line, &col);
        return crew_mf_error(&w, "line %d, column %d: a string holds \\u0000 (NUL), which no name, key or value may "
                             "contain", line, col);
    }
    size_t start = 0;
    while (start < len && (text[start] == ' ' || text[start] == '\t' || text[start] == '\r' || text[start] == '\n'))
        start++;
    if (start == len) return crew_mf_error(&w, "the file is empty");
    /* cJSON wants a NUL-terminated text to reject trailing garbage after the value. */
    char *buf = malloc(len + 1);
    if (!buf) return CREW_OOM();
    memcpy(buf, text, len);
    buf[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(buf, &end, 1);
    crew_status s;
    if (!root) {
        size_t offset = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        int line, col;
        crew_json_locate(buf, offset, &line, &col);
        s = crew_mf_error(&w, "not valid JSON (line %d, column %d)", line, col);
    } else {
        s = dispatch(root, what, out);
    }
    cJSON_Delete(root);
    free(buf);
    return s;
}

/* ------------------------------------------------------------------ crew's format: layers */

typedef crew_status (*layer_parse_fn)(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec);

static crew_status parse_dense(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    int use_bias = 1;
    CREW_TRY(crew_mf_int(w, obj, "units", 1, 1, CREW_MF_MAX_SIZE, &spec->units));
    CREW_TRY(crew_mf_activation(w, obj, "activation", 0, &spec->activation));
    CREW_TRY(crew_mf_bool(w, obj, "use_bias", &use_bias));
    spec->no_bias = !use_bias;
    return CREW_OK;
}

static crew_status parse_conv2d(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    int use_bias = 1;
    spec->strides[0] = spec->strides[1] = 1;
    CREW_TRY(crew_mf_int(w, obj, "filters", 1, 1, CREW_MF_MAX_SIZE, &spec->filters));
    CREW_TRY(crew_mf_pair(w, obj, "kernel_size", 1, CREW_MF_MAX_WINDOW, spec->kernel));
    CREW_TRY(crew_mf_pair(w, obj, "strides", 0, CREW_MF_MAX_WINDOW, spec->strides));
    CREW_TRY(crew_mf_padding(w, obj, "padding", &spec->padding));
    CREW_TRY(crew_mf_activation(w, obj, "activation", 0, &spec->activation));
    CREW_TRY(crew_mf_bool(w, obj, "use_bias", &use_bias));
    spec->no_bias = !use_bias;
    return CREW_OK;
}

static crew_status parse_pool(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    spec->pool[0] = spec->pool[1] = 2;
    CREW_TRY(crew_mf_pair(w, obj, "pool_size", 0, CREW_MF_MAX_WINDOW, spec->pool));
    spec->strides[0] = spec->pool[0]; /* Keras: strides default to the pool size */
    spec->strides[1] = spec->pool[1];
    CREW_TRY(crew_mf_pair(w, obj, "strides", 0, CREW_MF_MAX_WINDOW, spec->strides));
    return crew_mf_padding(w, obj, "padding", &spec->padding);
}

static crew_status parse_nothing(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    (void)w;
    (void)obj;
    (void)spec;
    return CREW_OK;
}

static crew_status parse_activation(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    return crew_mf_activation(w, obj, "activation", 1, &spec->activation);
}

static crew_status parse_dropout(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    double rate = 0.0;
    CREW_TRY(crew_mf_real(w, obj, "rate", 1, 0.0, 1.0, "[)", &rate));
    spec->rate = (float)rate;
    return CREW_OK;
}

static crew_status parse_norm(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    double momentum = 0.99, epsilon = 1e-3; /* Keras's defaults */
    if (spec->type == CREW_LAYER_BATCH_NORM)
        CREW_TRY(crew_mf_real(w, obj, "momentum", 0, 0.0, 1.0, "()", &momentum));
    CREW_TRY(crew_mf_real(w, obj, "epsilon", 0, 0.0, 1.0, "(]", &epsilon));
    spec->momentum = (float)momentum;
    spec->epsilon = (float)epsilon;
    if (spec->epsilon <= 0.0f) return crew_mf_error(w, "key 'epsilon' is too small for a float: %g", epsilon);
    return CREW_OK;
}

static crew_status parse_embedding(const crew_mf_where *w, const cJSON *obj, crew_layer_spec *spec)
{
    CREW_TRY(crew_mf_int(w, obj, "input_dim", 1, 1, CREW_MF_MAX_SIZE, &spec->vocab));
    return crew_mf_int(w, obj, "output_dim", 1, 1, CREW_MF_MAX_SIZE, &spec->dim);
}

/* Every layer also takes "type" and "name". */
#define LAYER_KEYS(...) ((const char *const[]){"type", "name", __VA_ARGS__})
#define N_KEYS(...) (2 + (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)))

typedef struct layer_kind {
    const char *type;
    crew_layer_type layer;
    layer_parse_fn parse;
    const char *const *keys;
    int n_keys;
} layer_kind;

#define KIND(type, layer, parse, ...) {type, layer, parse, LAYER_KEYS(__VA_ARGS__), N_KEYS(__VA_ARGS__)}
#define KIND0(type, layer) {type, layer, parse_nothing, LAYER_KEYS(NULL), 2}

static const layer_kind KINDS[] = {
    KIND("dense", CREW_LAYER_DENSE, parse_dense, "units", "activation", "use_bias"),
    KIND("conv2d", CREW_LAYER_CONV2D, parse_conv2d, "filters", "kernel_size", "strides", "padding", "activation",
         "use_bias"),
    KIND("max_pool2d", CREW_LAYER_MAX_POOL2D, parse_pool, "pool_size", "strides", "padding"),
    KIND("avg_pool2d", CREW_LAYER_AVG_POOL2D, parse_pool, "pool_size", "strides", "padding"),
    KIND0("global_avg_pool2d", CREW_LAYER_GLOBAL_AVG_POOL2D),
    KIND0("flatten", CREW_LAYER_FLATTEN),
    KIND("activation", CREW_LAYER_ACTIVATION, parse_activation, "activation"),
    KIND("dropout", CREW_LAYER_DROPOUT, parse_dropout, "rate"),
    KIND("batch_norm", CREW_LAYER_BATCH_NORM, parse_norm, "momentum", "epsilon"),
    KIND("layer_norm", CREW_LAYER_LAYER_NORM, parse_norm, "epsilon"),
    KIND("embedding", CREW_LAYER_EMBEDDING, parse_embedding, "input_dim", "output_dim"),
};
#define N_KINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

static const layer_kind *find_kind(const char *type)
{
    for (int i = 0; i < N_KINDS; i++)
        if (strcmp(KINDS[i].type, type) == 0) return &KINDS[i];
    return NULL;
}

static crew_status unknown_type(const crew_mf_where *w, const char *type)
{
    char q[64], list[256];
    size_t used = 0;
    for (int i = 0; i < N_KINDS && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", KINDS[i].type);
    crew_mf_quote(type, q, sizeof q);
    return crew_mf_error(w, "unknown layer type '%s' (known: %s)", q, list);
}

static crew_status parse_layer(crew_model *m, const cJSON *item, int index, int count, const char *file)
{
    char scope[128];
    snprintf(scope, sizeof scope, "layer %d", index);
    crew_mf_where w = {file, scope, 0};
    if (!cJSON_IsObject(item)) return crew_mf_error(&w, "must be an object with a \"type\"");
    if (crew_mf_is_gpt(item)) {
        snprintf(scope, sizeof scope, "layer %d (gpt)", index);
        if (count != 1) return crew_mf_error(&w, "a gpt block is a whole model: it must be the only entry of 'layers'");
        return crew_mf_add_gpt(m, item, &w);
    }
    const char *type = NULL, *name = NULL;
    CREW_TRY(crew_mf_string(&w, item, "type", 1, &type));
    const layer_kind *kind = find_kind(type);
    if (!kind) return unknown_type(&w, type);
    snprintf(scope, sizeof scope, "layer %d (%s)", index, type);
    CREW_TRY(crew_mf_known_keys(&w, item, kind->keys, kind->n_keys));
    CREW_TRY(crew_mf_name(&w, item, "name", &name));
    if (name) snprintf(scope, sizeof scope, "layer %d (%s)", index, name);
    crew_layer_spec spec = {.type = kind->layer, .name = name};
    CREW_TRY(kind->parse(&w, item, &spec));
    if (spec.activation == CREW_ACT_SOFTMAX && index != count - 1)
        return crew_mf_error(&w, "key 'activation': softmax is supported only in the last layer (it is fused "
                                 "into the loss)");
    return crew_mf_add_layer(m, &spec, &w);
}

/* ------------------------------------------------------------------ crew's format: compile, fit */

static crew_status parse_schedule(const crew_mf_where *ow, const cJSON *v, crew_optimizer_spec *o)
{
    crew_mf_where w = {ow->file, "schedule", 0};
    static const char *const names[] = {"constant", "step", "cosine"};
    static const int values[] = {CREW_SCHED_CONSTANT, CREW_SCHED_STEP, CREW_SCHED_COSINE};
    int type = CREW_SCHED_CONSTANT;
    if (cJSON_IsString(v)) { /* "schedule": "cosine" is short for {"type": "cosine"} */
        for (int i = 0; i < 3; i++)
            if (strcmp(v->valuestring, names[i]) == 0) {
                o->schedule = (crew_schedule_type)values[i];
                return o->schedule == CREW_SCHED_STEP
                           ? crew_mf_error(&w, "the step schedule needs an object with 'step_size'")
                           : CREW_OK;
            }
        char q[64];
        crew_mf_quote(v->valuestring, q, sizeof q);
        return crew_mf_error(&w, "must be one of 'constant', 'step', 'cosine', got '%s'", q);
    }
    if (!cJSON_IsObject(v)) return crew_mf_error(ow, "key 'schedule' must be an object or a schedule name");
    CREW_TRY(crew_mf_enum(&w, v, "type", 1, names, values, 3, &type));
    o->schedule = (crew_schedule_type)type;
    static const char *const k_const[] = {"type", "warmup_steps", "warmup_epochs"};
    static const char *const k_step[] = {"type", "warmup_steps", "warmup_epochs", "step_size", "gamma"};
    static const char *const k_cos[] = {"type", "warmup_steps", "warmup_epochs", "min_lr"};
    const char *const *keys = type == CREW_SCHED_STEP ? k_step : type == CREW_SCHED_COSINE ? k_cos : k_const;
    CREW_TRY(crew_mf_known_keys(&w, v, keys, type == CREW_SCHED_STEP ? 5 : type == CREW_SCHED_COSINE ? 4 : 3));
    const int64_t big = (int64_t)1 << 40;
    double gamma = 0.1, min_lr = 0.0, warmup_epochs = 0.0;
    CREW_TRY(crew_mf_int(&w, v, "warmup_steps", 0, 0, big, &o->warmup_steps));
    CREW_TRY(crew_mf_real(&w, v, "warmup_epochs", 0, 0.0, 1e6, "[]", &warmup_epochs));
    o->warmup_epochs = (float)warmup_epochs;
    CREW_TRY(crew_mf_int(&w, v, "step_size", type == CREW_SCHED_STEP, 1, big, &o->step_size));
    CREW_TRY(crew_mf_real(&w, v, "gamma", 0, 0.0, 1.0, "(]", &gamma));
    CREW_TRY(crew_mf_real(&w, v, "min_lr", 0, 0.0, INFINITY, "[)", &min_lr));
    o->gamma = (float)gamma;
    o->min_lr = (float)min_lr;
    return CREW_OK;
}

static const char *const SGD_KEYS[] = {"type",     "lr",           "base_batch", "lr_scaling", "schedule",
                                       "momentum", "nesterov",     "weight_decay", "clip_norm"};
static const char *const ADAMW_KEYS[] = {"type",  "lr",  "base_batch",   "lr_scaling", "schedule",
                                         "beta1", "beta2", "eps", "weight_decay", "clip_norm"};
static const char *const LARS_KEYS[] = {"type",     "lr",       "base_batch", "lr_scaling", "schedule", "momentum",
                                        "nesterov", "trust",    "eps",        "weight_decay", "clip_norm"};

/* The keys both optimizers share. */
static crew_status parse_common(const crew_mf_where *w, const cJSON *v, crew_optimizer_spec *o)
{
    static const char *const names[] = {"none", "linear", "sqrt"};
    static const int values[] = {CREW_SCALE_NONE, CREW_SCALE_LINEAR, CREW_SCALE_SQRT};
    double lr = o->lr, wd = 0.0, clip = 0.0;
    int scaling = CREW_SCALE_NONE;
    CREW_TRY(crew_mf_real(w, v, "lr", 0, 0.0, INFINITY, "()", &lr));
    CREW_TRY(crew_mf_int(w, v, "base_batch", 0, 1, CREW_MF_MAX_SIZE, &o->base_batch));
    CREW_TRY(crew_mf_enum(w, v, "lr_scaling", 0, names, values, 3, &scaling));
    CREW_TRY(crew_mf_real(w, v, "weight_decay", 0, 0.0, INFINITY, "[)", &wd));
    CREW_TRY(crew_mf_real(w, v, "clip_norm", 0, 0.0, INFINITY, "[)", &clip));
    if (scaling != CREW_SCALE_NONE && o->base_batch == 0)
        return crew_mf_error(w, "key 'lr_scaling' needs 'base_batch' (the global batch 'lr' was tuned for)");
    o->lr = (float)lr;
    o->scaling = (crew_lr_scaling)scaling;
    o->weight_decay = (float)wd;
    o->clip_norm = (float)clip;
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(v, "schedule");
    return sched ? parse_schedule(w, sched, o) : CREW_OK;
}

static crew_status parse_optimizer(const char *file, const cJSON *v, crew_optimizer_spec *o)
{
    crew_mf_where w = {file, "optimizer", 0};
    if (!cJSON_IsObject(v)) return crew_mf_error(&w, "must be an object with a \"type\"");
    static const char *const names[] = {"sgd", "adamw", "lamb", "lars"};
    static const int values[] = {CREW_OPT_SGD, CREW_OPT_ADAMW, CREW_OPT_LAMB, CREW_OPT_LARS};
    int type = CREW_OPT_ADAMW;
    CREW_TRY(crew_mf_enum(&w, v, "type", 1, names, values, 4, &type));
    o->type = (crew_optimizer_type)type;
    if (o->type == CREW_OPT_SGD || o->type == CREW_OPT_LARS) {
        const int lars = o->type == CREW_OPT_LARS;
        CREW_TRY(lars ? crew_mf_known_keys(&w, v, LARS_KEYS, (int)(sizeof LARS_KEYS / sizeof *LARS_KEYS))
                      : crew_mf_known_keys(&w, v, SGD_KEYS, (int)(sizeof SGD_KEYS / sizeof *SGD_KEYS)));
        double momentum = lars ? 0.9 : 0.0, trust = 1e-3, eps = 0.0;
        o->lr = lars ? 0.1f : 0.01f; /* Keras's SGD default; LARS's for its large batches */
        CREW_TRY(crew_mf_real(&w, v, "momentum", 0, 0.0, 1.0, "[)", &momentum));
        CREW_TRY(crew_mf_bool(&w, v, "nesterov", &o->nesterov));
        CREW_TRY(crew_mf_real(&w, v, "trust", 0, 0.0, 1e3, "(]", &trust));
        CREW_TRY(crew_mf_real(&w, v, "eps", 0, 0.0, 1.0, "[]", &eps));
        o->momentum = (float)momentum;
        if (lars) o->trust = (float)trust, o->eps = (float)eps;
    } else {
        const int lamb = o->type == CREW_OPT_LAMB;
        CREW_TRY(crew_mf_known_keys(&w, v, ADAMW_KEYS, (int)(sizeof ADAMW_KEYS / sizeof *ADAMW_KEYS)));
        double b1 = 0.9, b2 = 0.999, eps = lamb ? 1e-6 : 1e-8;
        o->lr = 1e-3f;
        CREW_TRY(crew_mf_real(&w, v, "beta1", 0, 0.0, 1.0, "()", &b1));
        CREW_TRY(crew_mf_real(&w, v, "beta2", 0, 0.0, 1.0, "()", &b2));
        CREW_TRY(crew_mf_real(&w, v, "eps", 0, 0.0, 1.0, "(]", &eps));
        o->beta1 = b1;
        o->beta2 = b2;
        o->eps = (float)eps;
    }
    CREW_TRY(parse_common(&w, v, o));
    return crew_mf_check_optimizer(&w, o);
}

static crew_status parse_compile(const cJSON *root, const char *file, crew_model_defaults *d)
{
    crew_mf_where w = {file, "", 0};
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(root, "loss");
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    if (!loss && !opt) return CREW_OK;
    static const char *const names[] = {"softmax_cross_entropy", "sparse_categorical_crossentropy"};
    static const int values[] = {CREW_LOSS_SOFTMAX_CROSS_ENTROPY, CREW_LOSS_SOFTMAX_CROSS_ENTROPY};
    int l = CREW_LOSS_SOFTMAX_CROSS_ENTROPY;
    CREW_TRY(crew_mf_enum(&w, root, "loss", 0, names, values, 2, &l));
    crew_compile_options c = {.loss = (crew_loss)l, .optimizer = {.type = CREW_OPT_ADAMW, .lr = 1e-3f}};
    if (opt)
        CREW_TRY(parse_optimizer(file, opt, &c.optimizer));
    else
        CREW_TRY(crew_mf_check_optimizer(&w, &c.optimizer));
    d->has_compile = 1;
    d->compile = c;
    return CREW_OK;
}

static crew_status parse_augment(const cJSON *t, const char *file, crew_augment_options *a)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, "augment");
    if (!v) return CREW_OK;
    crew_mf_where w = {file, "training.augment", 0};
    if (!cJSON_IsObject(v)) return crew_mf_error(&w, "must be an object");
    static const char *const keys[] = {"crop_padding", "flip"};
    CREW_TRY(crew_mf_known_keys(&w, v, keys, 2));
    int64_t pad = 0;
    CREW_TRY(crew_mf_int(&w, v, "crop_padding", 0, 0, 1024, &pad));
    a->crop_padding = (int)pad;
    return crew_mf_bool(&w, v, "flip", &a->flip);
}

static crew_status parse_training(const cJSON *root, const char *file, crew_model_defaults *d)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "training");
    if (!t) return CREW_OK;
    crew_mf_where w = {file, "training", 0};
    if (!cJSON_IsObject(t)) return crew_mf_error(&w, "must be an object");
    static const char *const keys[] = {"epochs", "batch_per_device", "seed", "loader_threads", "prefetch", "augment"};
    CREW_TRY(crew_mf_known_keys(&w, t, keys, 6));
    int64_t epochs = 0, seed = -1, threads = 0, prefetch = 0;
    CREW_TRY(crew_mf_int(&w, t, "loader_threads", 0, 1, 256, &threads));
    CREW_TRY(crew_mf_int(&w, t, "prefetch", 0, 1, 1024, &prefetch));
    d->loader_threads = (int)threads;
    d->prefetch = (int)prefetch;
    CREW_TRY(parse_augment(t, file, &d->augment));
    CREW_TRY(crew_mf_int(&w, t, "epochs", 0, 1, 1000000, &epochs));
    CREW_TRY(crew_mf_int(&w, t, "batch_per_device", 0, 1, CREW_MF_MAX_SIZE, &d->batch_per_device));
    /* JSON numbers are doubles: integers are exact up to 2^53. */
    CREW_TRY(crew_mf_int(&w, t, "seed", 0, 0, (int64_t)1 << 53, &seed));
    d->epochs = (int)epochs;
    if (seed >= 0) {
        d->has_seed = 1;
        d->seed = (uint64_t)seed;
    }
    return CREW_OK;
}

/* ------------------------------------------------------------------ crew's format: the model */

static crew_status parse_layers(crew_model *m, const cJSON *root, const char *file)
{
    crew_mf_where w = {file, "", 0};
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!cJSON_IsArray(layers)) return crew_mf_error(&w, "key 'layers' must be a list of layers");
    int count = 0;
    for (const cJSON *c = layers->child; c && count <= CREW_MF_MAX_LAYERS; c = c->next) count++;
    if (count == 0) return crew_mf_error(&w, "key 'layers' is empty");
    if (count > CREW_MF_MAX_LAYERS)
        return crew_mf_error(&w, "key 'layers' has more than %d layers", CREW_MF_MAX_LAYERS);
    int i = 0;
    for (const cJSON *c = layers->child; c; c = c->next, i++) CREW_TRY(parse_layer(m, c, i, count, file));
    return CREW_OK;
}

static crew_status build_crew_model(const cJSON *root, const char *file, crew_model *m)
{
    crew_mf_where w = {file, "", 0};
    const char *name = NULL;
    CREW_TRY(crew_mf_name(&w, root, "name", &name));
    if (name) snprintf(m->name, sizeof m->name, "%s", name);
    CREW_TRY(parse_layers(m, root, file));
    CREW_TRY(parse_compile(root, file, &m->defaults));
    return parse_training(root, file, &m->defaults);
}

crew_status crew_model_from_crew_json(const cJSON *root, const char *file, crew_model **out)
{
    *out = NULL;
    crew_mf_where w = {file, "", 0};
    static const char *const keys[] = {"name", "input_shape", "layers", "loss", "optimizer", "training"};
    CREW_TRY(crew_mf_known_keys(&w, root, keys, 6));
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(root, "input_shape");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    const cJSON *first = cJSON_IsArray(layers) ? layers->child : NULL;
    int64_t dims[3];
    int ndim;
    if (!shape && first && crew_mf_is_gpt(first)) { /* a gpt block's input is its context of token ids */
        crew_mf_where lw = {file, "layer 0 (gpt)", 0};
        CREW_TRY(crew_mf_gpt_context(&lw, first, &dims[0]));
        ndim = 1;
    } else {
        if (!shape) return crew_mf_error(&w, "missing key 'input_shape'");
        CREW_TRY(crew_mf_shape(&w, shape, "input_shape", 0, dims, &ndim));
    }
    crew_model *m;
    CREW_TRY(crew_model_create(dims, ndim, &m));
    crew_status s = build_crew_model(root, file, m);
    if (s) {
        crew_model_free(m);
        return s;
    }
    *out = m;
    return CREW_OK;
}
