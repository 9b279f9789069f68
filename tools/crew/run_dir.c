/* run_dir.c — creating the run directory and writing its config.json. */
#include "run_dir.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int mkdir_p(const char *path)
{
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

void run_dir_choose(const char *wanted, const char *model_path, char *out, size_t len)
{
    if (wanted && *wanted) {
        snprintf(out, len, "%s", wanted);
    } else {
        const char *base = strrchr(model_path, '/');
        base = base ? base + 1 : model_path;
        size_t stem = strcspn(base, ".");
        char stamp[32];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        snprintf(out, len, "runs/%.*s-%s", (int)(stem < 64 ? stem : 64), base, stamp);
    }
}

int run_dir_create(const char *path, char *err, size_t err_len)
{
    if (mkdir_p(path) != 0) {
        snprintf(err, err_len, "cannot create run directory %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static const char *schedule_name(crew_schedule_type s)
{
    return s == CREW_SCHED_STEP ? "step" : s == CREW_SCHED_COSINE ? "cosine" : "constant";
}

static const char *scaling_name(crew_lr_scaling s)
{
    return s == CREW_SCALE_LINEAR ? "linear" : s == CREW_SCALE_SQRT ? "sqrt" : "none";
}

/* A float32 value with the digits it has, not those of its double widening (0.001, not
 * 0.0010000000474974513). */
static void add_float(cJSON *o, const char *name, float v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)v);
    cJSON_AddRawToObject(o, name, buf);
}

static cJSON *plan_json(const crew_fit_plan *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "devices", p->devices);
    cJSON_AddNumberToObject(o, "threads_per_device", p->threads_per_device);
    cJSON_AddNumberToObject(o, "batch_per_device", (double)p->batch_per_device);
    cJSON_AddNumberToObject(o, "accumulation_steps", p->accumulation);
    cJSON_AddNumberToObject(o, "global_batch", (double)p->global_batch);
    cJSON_AddNumberToObject(o, "train_samples", (double)p->train_samples);
    cJSON_AddNumberToObject(o, "steps_per_epoch", (double)p->steps_per_epoch);
    cJSON_AddNumberToObject(o, "epochs", p->epochs);
    cJSON_AddNumberToObject(o, "total_steps", (double)p->total_steps);
    cJSON_AddNumberToObject(o, "seed", (double)p->seed);
    cJSON *lr = cJSON_AddObjectToObject(o, "learning_rate");
    add_float(lr, "base", p->base_lr);
    cJSON_AddNumberToObject(lr, "base_batch", (double)p->base_batch);
    cJSON_AddStringToObject(lr, "scaling", scaling_name(p->scaling));
    add_float(lr, "factor", p->lr_factor);
    add_float(lr, "scaled", p->scaled_lr);
    cJSON_AddNumberToObject(lr, "warmup_steps", (double)p->warmup_steps);
    add_float(lr, "warmup_start", p->warmup_start_lr);
    cJSON_AddStringToObject(lr, "schedule", schedule_name(p->schedule));
    return o;
}

int run_dir_write_config(const char *run_dir, const run_config *c, char *err, size_t err_len)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "crew_version", crew_version());
    cJSON_AddStringToObject(root, "model", c->model_path);
    cJSON_AddStringToObject(root, "data", c->data_dir);
    cJSON_AddStringToObject(root, "devices", c->devices);
    if (c->init_weights) cJSON_AddStringToObject(root, "init_weights", c->init_weights);
    cJSON_AddItemToObject(root, "plan", plan_json(c->plan));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/config.json", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = text ? fopen(tmp, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        snprintf(err, err_len, "cannot write %s: %s", path, text ? strerror(errno) : "out of memory");
        remove(tmp);
    }
    free(text);
    return ok ? 0 : -1;
}
