/* run_dir.c — the run directory: choosing it, refusing one that holds another run, clearing it
 * for --replace, creating it and writing its config.json. */
#include "run_dir.h"

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

const char *const run_dir_owned[] = {"config.json", "metrics.jsonl", "tb", "checkpoints", "report.html",
                                     "weights.safetensors", NULL};

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

void run_dir_choose(const char *wanted, const char *model_path, char *out, size_t len)
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

/* "config.json, checkpoints/": crew's files that path holds; returns how many. */
static int owned_present(const char *path, char *list, size_t len)
{
    int n = 0;
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; run_dir_owned[i]; i++) {
        char p[1200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", path, run_dir_owned[i]);
        if (lstat(p, &sb) != 0) continue;
        if (used < len)
            used += (size_t)snprintf(list + used, len - used, "%s%s%s", n ? ", " : "", run_dir_owned[i],
                                     S_ISDIR(sb.st_mode) ? "/" : "");
        n++;
    }
    return n;
}

int run_dir_check_new(const char *path, int replace, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, err_len, "cannot use run directory %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "run directory %s exists and is not a directory", path);
        return -1;
    }
    char held[256];
    if (replace || owned_present(path, held, sizeof held) == 0) return 0;
    snprintf(err, err_len,
             "run directory %s holds another run (%s): continue it with --resume %s, or start a new one there with "
             "--replace, which deletes those",
             path, held, path);
    return -1;
}

int run_dir_check_resume(const char *path, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(err, err_len, "cannot resume %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "cannot resume %s: it is not a run directory (not a directory)", path);
        return -1;
    }
    return 0;
}

/* One line for a link where crew keeps its own files: -1. rel: the path inside the run directory. */
static int link_refused(const char *run_dir, const char *rel, const char *path, char *err, size_t err_len)
{
    char target[1024];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? (size_t)n : 0] = '\0';
    snprintf(err, err_len,
             "run directory %s: %s is a symbolic link (to %s): crew reads and writes only files of its own in a run "
             "directory, never through a link; remove the link (nothing it points to is crew's)",
             run_dir, rel, target[0] ? target : "?");
    return -1;
}

/* The entries of run_dir/sub (depth 1: tb/'s files, checkpoints/' directories; depth 2: also each
 * checkpoint's files), none a link. */
static int check_entries(const char *run_dir, const char *sub, int depth, char *err, size_t err_len)
{
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/%s", run_dir, sub);
    DIR *d = opendir(dir);
    if (!d) return 0; /* missing, or unreadable: what reads it then says so */
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char rel[1400], path[2900];
        struct stat sb;
        snprintf(rel, sizeof rel, "%s/%s", sub, e->d_name);
        snprintf(path, sizeof path, "%s/%s", run_dir, rel);
        if (lstat(path, &sb) != 0) continue;
        if (S_ISLNK(sb.st_mode)) rc = link_refused(run_dir, rel, path, err, err_len);
        else if (S_ISDIR(sb.st_mode) && depth > 1) rc = check_entries(run_dir, rel, depth - 1, err, err_len);
    }
    closedir(d);
    return rc;
}

int run_dir_check_links(const char *path, char *err, size_t err_len)
{
    for (int i = 0; run_dir_owned[i]; i++) {
        char p[1200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", path, run_dir_owned[i]);
        if (lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode)) return link_refused(path, run_dir_owned[i], p, err, err_len);
    }
    if (check_entries(path, "tb", 1, err, err_len) != 0) return -1;
    return check_entries(path, "checkpoints", 2, err, err_len);
}

int run_dir_follow(const char *path, char *note, size_t note_len, char *err, size_t err_len)
{
    note[0] = '\0';
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode)) return 0;
    char target[1024], real[4096];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? (size_t)n : 0] = '\0';
    if (!realpath(path, real)) {
        snprintf(err, err_len, "run directory %s is a symbolic link to %s, which %s", path, target,
                 errno == ENOENT ? "does not exist (create the directory it names, or remove the link)" : strerror(errno));
        return -1;
    }
    if (stat(real, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "run directory %s is a symbolic link to %s, which is not a directory", path, real);
        return -1;
    }
    snprintf(note, note_len, "run directory %s is a symbolic link: the run is written into %s", path, real);
    return 0;
}

static int remove_failed(const char *path, char *err, size_t err_len)
{
    snprintf(err, err_len, "--replace: cannot remove %s: %s", path, strerror(errno));
    return -1;
}

/* Removes path and, when it is a directory (not a link to one), everything in it. */
static int remove_tree(const char *path, char *err, size_t err_len)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : remove_failed(path, err, err_len);
    if (!S_ISDIR(sb.st_mode)) return unlink(path) == 0 ? 0 : remove_failed(path, err, err_len);
    DIR *d = opendir(path);
    if (!d) return remove_failed(path, err, err_len);
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[4096];
        if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) {
            errno = ENAMETOOLONG;
            rc = remove_failed(path, err, err_len);
        } else {
            rc = remove_tree(child, err, err_len);
        }
    }
    closedir(d);
    if (rc) return rc;
    return rmdir(path) == 0 ? 0 : remove_failed(path, err, err_len);
}

int run_dir_clear(const char *path, char *err, size_t err_len)
{
    for (int i = 0; run_dir_owned[i]; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", path, run_dir_owned[i]);
        if (remove_tree(p, err, err_len) != 0) return -1;
    }
    return 0;
}

int run_dir_create(const char *path, char *err, size_t err_len)
{
    struct stat sb;
    if (mkdir_p(path) != 0) {
        snprintf(err, err_len, "cannot create run directory %s: %s", path, strerror(errno));
        return -1;
    }
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) { /* mkdir says EEXIST for a file too */
        snprintf(err, err_len, "run directory %s exists and is not a directory", path);
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
    cJSON *aug = cJSON_AddObjectToObject(o, "augment");
    cJSON_AddNumberToObject(aug, "crop_padding", p->augment.crop_padding);
    cJSON_AddBoolToObject(aug, "flip", p->augment.flip != 0);
    cJSON_AddBoolToObject(o, "pad_last_batch", p->pad_last_batch != 0);
    cJSON_AddBoolToObject(o, "sync_batch_norm", p->sync_batch_norm != 0);
    cJSON_AddStringToObject(o, "on_nan", p->on_nan == CREW_ON_NAN_SKIP ? "skip" : "stop");
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
    /* Never through a link at the temporary's name (rename then replaces config.json itself). */
    int fd = text ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f) close(fd);
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
