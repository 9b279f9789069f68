/* run_dir.c — the run directory (crew.h, "The run directory"): choosing it, telling one that
 * holds another run, refusing links where crew keeps its files, clearing it for a replacing run,
 * creating it and writing its config.json. What a front end (crew train, the Python package's
 * crew.fit) needs before crew_fit_run writes there; the words that tell a user what to do next
 * (--resume, resume=) are the front end's. */

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"

static const char *const owned[] = {"config.json", "metrics.jsonl", "tb", "checkpoints", "report.html",
                                    "weights.safetensors", NULL};

const char *crew_run_dir_owned(int i) { return i >= 0 && i < (int)(sizeof owned / sizeof owned[0]) ? owned[i] : NULL; }

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

static int exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

void crew_run_dir_choose(const char *wanted, const char *model_path, char *out, size_t len)
{
    if (wanted) {
        snprintf(out, len, "%s", wanted);
        return;
    }
    const char *base = strrchr(model_path, '/');
    base = base ? base + 1 : model_path;
    size_t stem = strcspn(base, ".");
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, len, "runs/%.*s-%s", (int)(stem < 64 ? stem : 64), base, stamp);
    /* Two runs started in the same second get directories of their own. */
    size_t at = strlen(out);
    for (int n = 2; exists(out) && n < 1000 && at + 8 < len; n++) snprintf(out + at, len - at, "-%d", n);
}

int crew_run_dir_holds(const char *path, char *list, size_t len)
{
    int n = 0;
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; owned[i]; i++) {
        char p[1200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", path, owned[i]);
        if (lstat(p, &sb) != 0) continue;
        if (used < len)
            used += (size_t)snprintf(list + used, len - used, "%s%s%s", n ? ", " : "", owned[i],
                                     S_ISDIR(sb.st_mode) ? "/" : "");
        n++;
    }
    return n;
}

crew_status crew_run_dir_usable(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return CREW_OK;
        return crew_errorf(CREW_CODE_IO, "cannot use run directory %s: %s", path, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "run directory %s exists and is not a directory", path);
    return CREW_OK;
}

crew_status crew_run_dir_check_resume(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cannot resume %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cannot resume %s: it is not a run directory (not a directory)",
                           path);
    return CREW_OK;
}

/* The error for a link where crew keeps its own files. rel: the path inside the run directory. */
static crew_status link_refused(const char *run_dir, const char *rel, const char *path)
{
    char target[1024];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? (size_t)n : 0] = '\0';
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                       "run directory %s: %s is a symbolic link (to %s): crew reads and writes only files of its own "
                       "in a run directory, never through a link; remove the link (nothing it points to is crew's)",
                       run_dir, rel, target[0] ? target : "?");
}

/* The entries of run_dir/sub (depth 1: tb/'s files, checkpoints/' directories; depth 2: also each
 * checkpoint's files), none a link. */
static crew_status check_entries(const char *run_dir, const char *sub, int depth)
{
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/%s", run_dir, sub);
    DIR *d = opendir(dir);
    if (!d) return CREW_OK; /* missing, or unreadable: what reads it then says so */
    crew_status s = CREW_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char rel[1400], path[2900];
        struct stat sb;
        snprintf(rel, sizeof rel, "%s/%s", sub, e->d_name);
        snprintf(path, sizeof path, "%s/%s", run_dir, rel);
        if (lstat(path, &sb) != 0) continue;
        if (S_ISLNK(sb.st_mode)) s = link_refused(run_dir, rel, path);
        else if (S_ISDIR(sb.st_mode) && depth > 1) s = check_entries(run_dir, rel, depth - 1);
    }
    closedir(d);
    return s;
}

crew_status crew_run_dir_check_links(const char *path)
{
    for (int i = 0; owned[i]; i++) {
        char p[1200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", path, owned[i]);
        if (lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode)) return link_refused(path, owned[i], p);
    }
    CREW_TRY(check_entries(path, "tb", 1));
    return check_entries(path, "checkpoints", 2);
}

crew_status crew_run_dir_follow(const char *path, char *note, size_t note_len)
{
    note[0] = '\0';
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode)) return CREW_OK;
    char target[1024], real[4096];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? (size_t)n : 0] = '\0';
    if (!realpath(path, real))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "run directory %s is a symbolic link to %s, which %s", path, target,
                           errno == ENOENT ? "does not exist (create the directory it names, or remove the link)"
                                           : strerror(errno));
    if (stat(real, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "run directory %s is a symbolic link to %s, which is not a directory",
                           path, real);
    snprintf(note, note_len, "run directory %s is a symbolic link: the run is written into %s", path, real);
    return CREW_OK;
}

static crew_status remove_failed(const char *path)
{
    return crew_errorf(CREW_CODE_IO, "cannot remove %s (replacing the run there): %s", path, strerror(errno));
}

/* Removes path and, when it is a directory (not a link to one), everything in it. */
static crew_status remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? CREW_OK : remove_failed(path);
    if (!S_ISDIR(sb.st_mode)) return unlink(path) == 0 ? CREW_OK : remove_failed(path);
    DIR *d = opendir(path);
    if (!d) return remove_failed(path);
    crew_status s = CREW_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[4096];
        if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) {
            errno = ENAMETOOLONG;
            s = remove_failed(path);
        } else {
            s = remove_tree(child);
        }
    }
    closedir(d);
    if (s) return s;
    return rmdir(path) == 0 ? CREW_OK : remove_failed(path);
}

crew_status crew_run_dir_clear(const char *path)
{
    for (int i = 0; owned[i]; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", path, owned[i]);
        CREW_TRY(remove_tree(p));
    }
    return CREW_OK;
}

crew_status crew_run_dir_create(const char *path)
{
    struct stat sb;
    if (mkdir_p(path) != 0) return crew_errorf(CREW_CODE_IO, "cannot create run directory %s: %s", path, strerror(errno));
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) /* mkdir says EEXIST for a file too */
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "run directory %s exists and is not a directory", path);
    return CREW_OK;
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
    cJSON *aug = cJSON_AddObjectToObject(o, "augment");
    cJSON_AddNumberToObject(aug, "crop_padding", p->augment.crop_padding);
    cJSON_AddBoolToObject(aug, "flip", p->augment.flip != 0);
    cJSON_AddBoolToObject(o, "pad_last_batch", p->pad_last_batch != 0);
    cJSON_AddStringToObject(o, "loader", p->loader_inline ? "inline" : "threads"); /* where batches are prepared */
    cJSON_AddBoolToObject(o, "sync_batch_norm", p->sync_batch_norm != 0);
    cJSON_AddStringToObject(o, "on_nan", p->on_nan == CREW_ON_NAN_SKIP ? "skip" : "stop");
    cJSON_AddStringToObject(o, "shard", crew_shard_level_name(p->shard)); /* what the replicas shard */
    if (p->shard >= CREW_SHARD_GRADIENTS) {
        cJSON_AddNumberToObject(o, "shard_unit_mb", p->shard_unit_mb);
        cJSON_AddNumberToObject(o, "shard_units", p->shard_units);
    } else if (p->buckets > 0) { /* the gradients' all-reduce: how many buckets, and why that size */
        static const char *const rules[] = {"asked", "busy cores", "hosts", "ddp"};
        cJSON *b = cJSON_AddObjectToObject(o, "gradient_buckets");
        cJSON_AddNumberToObject(b, "count", p->buckets);
        cJSON_AddNumberToObject(b, "mb", p->bucket_mb);
        const int known = p->bucket_rule >= 0 && p->bucket_rule < (int)(sizeof rules / sizeof rules[0]);
        cJSON_AddStringToObject(b, "rule", known ? rules[p->bucket_rule] : "?");
    }
    return o;
}

crew_status crew_run_dir_write_config(const char *run_dir, const crew_run_config *c)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "crew_version", crew_version());
    cJSON_AddStringToObject(root, "model", c->model_path);
    cJSON_AddStringToObject(root, "data", c->data_dir);
    cJSON_AddStringToObject(root, "devices", c->devices);
    if (c->init_weights) cJSON_AddStringToObject(root, "init_weights", c->init_weights);
    if (c->front_end) cJSON_AddStringToObject(root, "front_end", c->front_end);
    cJSON_AddItemToObject(root, "plan", plan_json(c->plan));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/config.json", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* Never through a link at the temporary's name (rename then replaces config.json itself). */
    int fd = text ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f) close(fd);
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    crew_status s = ok ? CREW_OK
                       : crew_errorf(text ? CREW_CODE_IO : CREW_CODE_OUT_OF_MEMORY, "cannot write %s: %s", path,
                                     text ? strerror(errno) : "out of memory");
    if (!ok) remove(tmp);
    free(text);
    return s;
}
