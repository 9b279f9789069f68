/* checkpoint_json.c — state.json: the step, the plan (floats with all their digits, the seed as a
 * string because JSON numbers stop being exact at 2^53), a description of the model it belongs
 * to, and the checksums of the other files. */
#include "train/checkpoint_json.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "nn/layer.h"
#include "nn/model.h"
#include "optim/optimizer.h"

const char *const crew_checkpoint_file_names[CREW_CHECKPOINT_FILES] = {"model.safetensors", "optimizer.safetensors"};

static void add_float(cJSON *o, const char *name, float v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)v); /* 9 digits round-trip any float */
    cJSON_AddRawToObject(o, name, buf);
}

static void add_double(cJSON *o, const char *name, double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.17g", v); /* 17 digits round-trip any double */
    cJSON_AddRawToObject(o, name, buf);
}

static void add_int(cJSON *o, const char *name, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    cJSON_AddRawToObject(o, name, buf);
}

/* ---- the model a checkpoint belongs to: what its tensors' names and shapes cannot tell (an
 * activation, a dropout rate, the optimizer's hyperparameters). Numbers are written as state.json
 * writes them (floats with 9 digits, integers whole); the model at hand is described the same way
 * and read back, so equal values compare equal. Zero fields of a layer are left out, so that a
 * key's absence means 0. */

static const char *activation_name(crew_activation a)
{
    static const char *const names[] = {"linear", "relu", "gelu", "tanh", "sigmoid", "softmax"};
    return (unsigned)a < sizeof names / sizeof names[0] ? names[a] : "unknown";
}

static void add_nonzero(cJSON *o, const char *key, int64_t v)
{
    if (v) add_int(o, key, v);
}

static void add_nonzero_float(cJSON *o, const char *key, float v)
{
    if (v != 0.0f) add_float(o, key, v);
}

static void add_pair(cJSON *o, const char *key, const int v[2])
{
    char buf[32];
    if (!v[0] && !v[1]) return;
    snprintf(buf, sizeof buf, "%dx%d", v[0], v[1]);
    cJSON_AddStringToObject(o, key, buf);
}

static cJSON *layer_json(const crew_layer *l)
{
    const crew_layer_spec *sp = &l->spec;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", crew_layer_type_name(sp->type));
    cJSON_AddStringToObject(o, "name", l->name);
    if (sp->activation != CREW_ACT_NONE) cJSON_AddStringToObject(o, "activation", activation_name(sp->activation));
    add_nonzero(o, "units", sp->units);
    add_nonzero(o, "filters", sp->filters);
    add_pair(o, "kernel", sp->kernel);
    add_pair(o, "strides", sp->strides);
    add_pair(o, "pool", sp->pool);
    if (sp->padding == CREW_PAD_SAME) cJSON_AddStringToObject(o, "padding", "same");
    add_nonzero(o, "no_bias", sp->no_bias);
    add_nonzero_float(o, "rate", sp->rate);
    add_nonzero_float(o, "momentum", sp->momentum);
    add_nonzero_float(o, "epsilon", sp->epsilon);
    add_nonzero(o, "vocab", sp->vocab);
    add_nonzero(o, "dim", sp->dim);
    return o;
}

static cJSON *optimizer_json(const crew_optimizer_spec *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", crew_optimizer_name(s->type));
    add_float(o, "lr", s->lr);
    add_int(o, "base_batch", s->base_batch);
    add_int(o, "scaling", s->scaling);
    add_float(o, "momentum", s->momentum);
    add_int(o, "nesterov", s->nesterov);
    add_double(o, "beta1", s->beta1);
    add_double(o, "beta2", s->beta2);
    add_float(o, "eps", s->eps);
    add_float(o, "weight_decay", s->weight_decay);
    if (s->type == CREW_OPT_LARS) add_float(o, "trust", s->trust); /* a key of its own: older runs' text unchanged */
    add_float(o, "clip_norm", s->clip_norm);
    add_int(o, "schedule", s->schedule);
    add_int(o, "warmup_steps", s->warmup_steps);
    add_float(o, "warmup_epochs", s->warmup_epochs);
    add_int(o, "step_size", s->step_size);
    add_float(o, "gamma", s->gamma);
    add_float(o, "min_lr", s->min_lr);
    return o;
}

static cJSON *model_json(const crew_model *m)
{
    cJSON *o = cJSON_CreateObject();
    char shape[64];
    crew_shape_format(&m->input, shape, sizeof shape);
    cJSON_AddStringToObject(o, "input", shape);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; i < m->n_layers; i++) cJSON_AddItemToArray(layers, layer_json(m->layers[i]));
    cJSON_AddStringToObject(o, "loss", m->compile.loss == CREW_LOSS_SOFTMAX_CROSS_ENTROPY ? "softmax_cross_entropy" : "unknown");
    cJSON_AddItemToObject(o, "optimizer", optimizer_json(&m->compile.optimizer));
    return o;
}

/* A scalar's text for messages: "16", "relu", "none" for an absent key. */
static void value_text(const cJSON *v, char *buf, size_t len)
{
    if (!v) snprintf(buf, len, "none");
    else if (cJSON_IsString(v)) snprintf(buf, len, "%s", v->valuestring);
    else if (cJSON_IsNumber(v)) snprintf(buf, len, "%.9g", v->valuedouble);
    else snprintf(buf, len, "?");
}

static int same_value(const cJSON *a, const cJSON *b)
{
    if (!a || !b) return !a && !b;
    if (cJSON_IsString(a) && cJSON_IsString(b)) return strcmp(a->valuestring, b->valuestring) == 0;
    return cJSON_IsNumber(a) && cJSON_IsNumber(b) && a->valuedouble == b->valuedouble;
}

/* The first key of two flat objects whose values differ (a key missing from one counts); NULL
 * when they agree. */
static const char *first_difference(const cJSON *saved, const cJSON *now)
{
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *from = pass ? now : saved, *other = pass ? saved : now;
        for (const cJSON *k = from->child; k; k = k->next)
            if (!same_value(k, cJSON_GetObjectItemCaseSensitive(other, k->string))) return k->string;
    }
    return NULL;
}

static crew_status difference(const char *what, const char *where, const char *key, const cJSON *saved,
                              const cJSON *now)
{
    char a[128], b[128];
    value_text(cJSON_GetObjectItemCaseSensitive(saved, key), a, sizeof a);
    value_text(cJSON_GetObjectItemCaseSensitive(now, key), b, sizeof b);
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s belongs to another model: %s%s is %s in the checkpoint's run, %s in "
                       "this one", what, where, key, a, b);
}

static crew_status compare_models(const char *what, const cJSON *saved, const cJSON *now)
{
    const char *key;
    cJSON *top_saved = cJSON_Duplicate(saved, 1), *top_now = cJSON_Duplicate(now, 1);
    crew_status s = CREW_OK;
    if (!top_saved || !top_now) s = CREW_OOM();
    /* the layers and the optimizer are compared one by one below */
    for (int pass = 0; !s && pass < 2; pass++) {
        cJSON *o = pass ? top_now : top_saved;
        cJSON_DeleteItemFromObjectCaseSensitive(o, "layers");
        cJSON_DeleteItemFromObjectCaseSensitive(o, "optimizer");
    }
    if (!s && (key = first_difference(top_saved, top_now))) s = difference(what, "", key, top_saved, top_now);
    cJSON_Delete(top_saved);
    cJSON_Delete(top_now);
    if (s) return s;
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(saved, "layers"), *ln = cJSON_GetObjectItemCaseSensitive(now, "layers");
    int n_saved = cJSON_GetArraySize(ls), n_now = cJSON_GetArraySize(ln);
    for (int i = 0; i < n_saved && i < n_now; i++) {
        const cJSON *a = cJSON_GetArrayItem(ls, i), *b = cJSON_GetArrayItem(ln, i);
        if (!cJSON_IsObject(a)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: layer %d is not an object", what, i);
        key = "type"; /* the layer's kind first, when that differs */
        if (same_value(cJSON_GetObjectItemCaseSensitive(a, key), cJSON_GetObjectItemCaseSensitive(b, key)))
            key = first_difference(a, b);
        if (key) {
            char where[160];
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            snprintf(where, sizeof where, "layer %d (%s): ", i, cJSON_IsString(name) ? name->valuestring : "?");
            return difference(what, where, key, a, b);
        }
    }
    if (n_saved != n_now)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s belongs to another model: the checkpoint's run has %d layers, this "
                           "one %d", what, n_saved, n_now);
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(saved, "optimizer"), *on = cJSON_GetObjectItemCaseSensitive(now, "optimizer");
    if (!cJSON_IsObject(os)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: key 'optimizer' is missing", what);
    if ((key = first_difference(os, on))) return difference(what, "optimizer ", key, os, on);
    return CREW_OK;
}

crew_status crew_checkpoint_check_model(const char *text, const char *what, const crew_model *m)
{
    cJSON *root = cJSON_Parse(text);
    const cJSON *saved = cJSON_GetObjectItemCaseSensitive(root, "model");
    crew_status s = CREW_OK;
    if (!root) {
        s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a JSON object", what);
    } else if (saved) {
        /* the model at hand through the same text as the saved one */
        cJSON *built = model_json(m);
        char *text_now = built ? cJSON_PrintUnformatted(built) : NULL;
        cJSON *now = text_now ? cJSON_Parse(text_now) : NULL;
        s = !cJSON_IsObject(saved) ? crew_errorf(CREW_CODE_BAD_INPUT, "%s: key 'model' is not an object", what)
            : now ? compare_models(what, saved, now) : CREW_OOM();
        cJSON_Delete(now);
        free(text_now);
        cJSON_Delete(built);
    }
    cJSON_Delete(root);
    return s;
}

/* ---- state.json */

static const char *const nan_policies[] = {"stop", "skip"}; /* crew_nan_policy's order */
static const char *const precisions[] = {"fp32", "bf16"};   /* crew_precision's order */
static const char *const conv_ways[] = {"auto", "im2col", "library"}; /* crew_conv_way's order */

/* What else shapes the numbers, besides the batch and learning-rate plan. */
static void add_options(cJSON *plan, const crew_fit_plan *p)
{
    add_int(plan, "threads_per_device", p->threads_per_device);
    cJSON *aug = cJSON_AddObjectToObject(plan, "augment");
    add_int(aug, "crop_padding", p->augment.crop_padding);
    cJSON_AddBoolToObject(aug, "flip", p->augment.flip != 0);
    cJSON_AddBoolToObject(plan, "pad_last_batch", p->pad_last_batch != 0);
    cJSON_AddBoolToObject(plan, "sync_batch_norm", p->sync_batch_norm != 0);
    cJSON_AddStringToObject(plan, "on_nan", (unsigned)p->on_nan < 2 ? nan_policies[p->on_nan] : "stop");
    cJSON_AddStringToObject(plan, "precision", (unsigned)p->precision < 2 ? precisions[p->precision] : "fp32");
    cJSON_AddStringToObject(plan, "conv", (unsigned)p->conv < 3 ? conv_ways[p->conv] : "auto");
    cJSON_AddStringToObject(plan, "conv_choice", p->conv_choice);
}

char *crew_checkpoint_state_json(const crew_checkpoint_state *st, const crew_model *m,
                                 const crew_checkpoint_file_sum *sums)
{
    const crew_fit_plan *p = &st->plan;
    const crew_lr_plan *l = &st->lr;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "crew-checkpoint");
    cJSON_AddNumberToObject(root, "version", 1);
    add_int(root, "step", st->step);
    char gemm[sizeof st->gemm];
    if (st->gemm[0])
        snprintf(gemm, sizeof gemm, "%s", st->gemm);
    else
        crew_blas_describe(gemm, sizeof gemm);
    cJSON_AddStringToObject(root, "gemm", gemm);
    cJSON *plan = cJSON_AddObjectToObject(root, "plan");
    add_int(plan, "devices", p->devices);
    add_int(plan, "batch_per_device", p->batch_per_device);
    add_int(plan, "accumulation", p->accumulation);
    add_int(plan, "global_batch", p->global_batch);
    add_int(plan, "train_samples", p->train_samples);
    add_int(plan, "steps_per_epoch", p->steps_per_epoch);
    add_int(plan, "epochs", p->epochs);
    add_int(plan, "total_steps", p->total_steps);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    cJSON_AddStringToObject(plan, "seed", seed);
    add_float(plan, "base_lr", p->base_lr);
    add_int(plan, "base_batch", p->base_batch);
    add_int(plan, "scaling", p->scaling);
    add_float(plan, "lr_factor", p->lr_factor);
    add_options(plan, p);
    cJSON *lr = cJSON_AddObjectToObject(root, "lr");
    add_int(lr, "schedule", l->schedule);
    add_float(lr, "start_lr", l->start_lr);
    add_float(lr, "peak_lr", l->peak_lr);
    add_float(lr, "min_lr", l->min_lr);
    add_int(lr, "warmup_steps", l->warmup_steps);
    add_int(lr, "total_steps", l->total_steps);
    add_int(lr, "step_size", l->step_size);
    add_float(lr, "gamma", l->gamma);
    cJSON_AddItemToObject(root, "model", model_json(m));
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    for (int i = 0; i < CREW_CHECKPOINT_FILES; i++) {
        cJSON *f = cJSON_AddObjectToObject(files, crew_checkpoint_file_names[i]);
        add_int(f, "bytes", sums[i].bytes);
        char h[24];
        snprintf(h, sizeof h, "%016" PRIx64, sums[i].xxh3);
        cJSON_AddStringToObject(f, "xxh3", h);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

typedef struct reader {
    const char *what;
    crew_status err;
} reader;

static const cJSON *member(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && !r->err) r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key '%s' is missing", r->what, key);
    return v;
}

static int64_t get_int(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = member(r, o, key);
    if (v && (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble || v->valuedouble < 0)) {
        if (!r->err) r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key '%s' must be a non-negative integer", r->what, key);
        return 0;
    }
    return v ? (int64_t)v->valuedouble : 0;
}

static float get_float(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = member(r, o, key);
    if (v && !cJSON_IsNumber(v)) {
        if (!r->err) r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key '%s' must be a number", r->what, key);
        return 0.0f;
    }
    return v ? (float)v->valuedouble : 0.0f;
}

static const char *get_string(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = member(r, o, key);
    if (v && !cJSON_IsString(v)) {
        if (!r->err) r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key '%s' must be a string", r->what, key);
        return "";
    }
    return v ? v->valuestring : "";
}

static void parse_plan(reader *r, const cJSON *p, crew_fit_plan *plan)
{
    plan->devices = (int)get_int(r, p, "devices");
    plan->batch_per_device = get_int(r, p, "batch_per_device");
    plan->accumulation = (int)get_int(r, p, "accumulation");
    plan->global_batch = get_int(r, p, "global_batch");
    plan->train_samples = get_int(r, p, "train_samples");
    plan->steps_per_epoch = get_int(r, p, "steps_per_epoch");
    plan->epochs = (int)get_int(r, p, "epochs");
    plan->total_steps = get_int(r, p, "total_steps");
    plan->seed = strtoull(get_string(r, p, "seed"), NULL, 10);
    plan->base_lr = get_float(r, p, "base_lr");
    plan->base_batch = get_int(r, p, "base_batch");
    plan->scaling = (crew_lr_scaling)get_int(r, p, "scaling");
    plan->lr_factor = get_float(r, p, "lr_factor");
}

static int get_bool(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = member(r, o, key);
    if (v && !cJSON_IsBool(v)) {
        if (!r->err) r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key '%s' must be true or false", r->what, key);
        return 0;
    }
    return cJSON_IsTrue(v);
}

/* The ways of convolving: "conv" and "conv_choice"; a checkpoint from before them has the flag
 * "conv_library" (every layer by the library, or none), or nothing (im2col). */
static void parse_conv(reader *r, const cJSON *p, crew_fit_plan *plan)
{
    plan->conv = CREW_CONV_IM2COL;
    memset(plan->conv_choice, 0, sizeof plan->conv_choice);
    if (!cJSON_GetObjectItemCaseSensitive(p, "conv")) {
        if (cJSON_GetObjectItemCaseSensitive(p, "conv_library") && get_bool(r, p, "conv_library"))
            plan->conv = CREW_CONV_LIBRARY;
        return;
    }
    const char *way = get_string(r, p, "conv"), *ways = get_string(r, p, "conv_choice");
    int found = 0;
    for (int i = 0; i < 3 && !found; i++)
        if (!strcmp(way, conv_ways[i])) plan->conv = i, found = 1;
    if (r->err) return;
    if (!found)
        r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key 'conv' must be \"auto\", \"im2col\" or \"library\"", r->what);
    else if (strlen(ways) > CREW_MAX_CONV_LAYERS || strspn(ways, "li") != strlen(ways))
        r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key 'conv_choice' must be at most %d of 'l' and 'i'", r->what,
                             CREW_MAX_CONV_LAYERS);
    else
        memcpy(plan->conv_choice, ways, strlen(ways));
}

/* The options of add_options; a plan without them is an older crew's (st->has_options stays 0). */
static void parse_options(reader *r, const cJSON *p, crew_checkpoint_state *st)
{
    crew_fit_plan *plan = &st->plan;
    if (!cJSON_GetObjectItemCaseSensitive(p, "augment")) return;
    st->has_options = 1;
    plan->threads_per_device = (int)get_int(r, p, "threads_per_device");
    const cJSON *aug = member(r, p, "augment");
    if (aug) {
        plan->augment.crop_padding = (int)get_int(r, aug, "crop_padding");
        plan->augment.flip = get_bool(r, aug, "flip");
    }
    plan->pad_last_batch = get_bool(r, p, "pad_last_batch");
    plan->sync_batch_norm = get_bool(r, p, "sync_batch_norm");
    const char *nan = get_string(r, p, "on_nan");
    if (!strcmp(nan, "skip")) plan->on_nan = CREW_ON_NAN_SKIP;
    else if (strcmp(nan, "stop") != 0 && !r->err)
        r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key 'on_nan' must be \"stop\" or \"skip\"", r->what);
    /* fp32 in a checkpoint from before --precision */
    if (cJSON_GetObjectItemCaseSensitive(p, "precision")) {
        const char *pr = get_string(r, p, "precision");
        if (!strcmp(pr, "bf16")) plan->precision = CREW_PRECISION_BF16;
        else if (strcmp(pr, "fp32") != 0 && !r->err)
            r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: key 'precision' must be \"fp32\" or \"bf16\"", r->what);
    }
    parse_conv(r, p, plan);
    if (!r->err && (plan->threads_per_device < 1 || plan->augment.crop_padding > 1024))
        r->err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: threads_per_device or augment out of range", r->what);
}

static void parse_lr(reader *r, const cJSON *l, crew_lr_plan *lr)
{
    lr->schedule = (crew_schedule_type)get_int(r, l, "schedule");
    lr->start_lr = get_float(r, l, "start_lr");
    lr->peak_lr = get_float(r, l, "peak_lr");
    lr->min_lr = get_float(r, l, "min_lr");
    lr->warmup_steps = get_int(r, l, "warmup_steps");
    lr->total_steps = get_int(r, l, "total_steps");
    lr->step_size = get_int(r, l, "step_size");
    lr->gamma = get_float(r, l, "gamma");
}

crew_status crew_checkpoint_state_parse(const char *text, const char *what, crew_checkpoint_state *st,
                                        crew_checkpoint_file_sum *sums)
{
    memset(st, 0, sizeof *st);
    cJSON *root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a JSON object", what);
    }
    reader r = {what, CREW_OK};
    if (strcmp(get_string(&r, root, "format"), "crew-checkpoint") != 0 && !r.err)
        r.err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a crew checkpoint", what);
    if (get_int(&r, root, "version") != 1 && !r.err)
        r.err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: unknown checkpoint version", what);
    st->step = get_int(&r, root, "step");
    const cJSON *gemm = cJSON_GetObjectItemCaseSensitive(root, "gemm"); /* optional: an older crew's has none */
    if (cJSON_IsString(gemm)) snprintf(st->gemm, sizeof st->gemm, "%s", gemm->valuestring);
    const cJSON *plan = member(&r, root, "plan"), *lr = member(&r, root, "lr"), *files = member(&r, root, "files");
    if (plan) parse_plan(&r, plan, &st->plan);
    if (plan) parse_options(&r, plan, st);
    if (lr) parse_lr(&r, lr, &st->lr);
    for (int i = 0; files && i < CREW_CHECKPOINT_FILES; i++) {
        const cJSON *f = member(&r, files, crew_checkpoint_file_names[i]);
        if (!f) break;
        sums[i].bytes = get_int(&r, f, "bytes");
        sums[i].xxh3 = strtoull(get_string(&r, f, "xxh3"), NULL, 16);
    }
    if (!r.err && (st->plan.global_batch <= 0 || st->plan.steps_per_epoch <= 0 || st->step > st->plan.total_steps))
        r.err = crew_errorf(CREW_CODE_BAD_INPUT, "%s: the plan is inconsistent (step %lld of %lld)", what,
                            (long long)st->step, (long long)st->plan.total_steps);
    cJSON_Delete(root);
    return r.err;
}
