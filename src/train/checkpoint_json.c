/* checkpoint_json.c — state.json: the step, the plan (floats with all their digits, the seed as a
 * string because JSON numbers stop being exact at 2^53) and the checksums of the other files. */
#include "train/checkpoint_json.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

const char *const crew_checkpoint_file_names[CREW_CHECKPOINT_FILES] = {"model.safetensors", "optimizer.safetensors"};

static void add_float(cJSON *o, const char *name, float v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)v); /* 9 digits round-trip any float */
    cJSON_AddRawToObject(o, name, buf);
}

static void add_int(cJSON *o, const char *name, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    cJSON_AddRawToObject(o, name, buf);
}

char *crew_checkpoint_state_json(const crew_checkpoint_state *st, const crew_checkpoint_file_sum *sums)
{
    const crew_fit_plan *p = &st->plan;
    const crew_lr_plan *l = &st->lr;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "crew-checkpoint");
    cJSON_AddNumberToObject(root, "version", 1);
    add_int(root, "step", st->step);
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
    cJSON *lr = cJSON_AddObjectToObject(root, "lr");
    add_int(lr, "schedule", l->schedule);
    add_float(lr, "start_lr", l->start_lr);
    add_float(lr, "peak_lr", l->peak_lr);
    add_float(lr, "min_lr", l->min_lr);
    add_int(lr, "warmup_steps", l->warmup_steps);
    add_int(lr, "total_steps", l->total_steps);
    add_int(lr, "step_size", l->step_size);
    add_float(lr, "gamma", l->gamma);
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
    const cJSON *plan = member(&r, root, "plan"), *lr = member(&r, root, "lr"), *files = member(&r, root, "files");
    if (plan) parse_plan(&r, plan, &st->plan);
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
