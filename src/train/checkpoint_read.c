/* checkpoint_read.c — finding the newest usable checkpoint and loading it, falling back to older
 * ones when the newest is incomplete or damaged. A checkpoint that is intact but does not fit the
 * model (another model file, another optimizer) stops the search and is left alone: it is the
 * caller who is wrong, not the checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/status.h"
#include "core/atomic_dir.h"
#include "core/links.h"
#include "io/safetensors.h"
#include "train/checkpoint_json.h"

/* Reads a small text file whole (at most 1 MiB). */
static crew_status read_text(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return crew_errorf(CREW_CODE_BAD_INPUT, "%s is missing (%s)", path, strerror(errno));
    char *buf = malloc((1 << 20) + 1);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    if (!buf) return CREW_OOM();
    buf[n] = '\0';
    *out = buf;
    return CREW_OK;
}

/* Damage: what a crash, a full disk or a person's mistake can do to a checkpoint that crew wrote
 * whole. Such a checkpoint is set aside; any other refusal leaves it untouched: one that does not
 * fit (REFUSED), and one that is or holds a symbolic link (LINKED: crew never writes one, so a
 * person made it, and crew reads nothing through it, not even to hash it). */
typedef enum verdict { USABLE, DAMAGED, REFUSED, LINKED } verdict;

#define LINK_WHY "a checkpoint is a directory of crew's own files, and crew reads none through a link (remove the link)"

/* The checkpoint directory and each of its files, not links. */
static crew_status refuse_links(const char *dir)
{
    char path[4200];
    CREW_TRY(crew_refuse_link(dir, LINK_WHY));
    static const char *const markers[] = {"COMPLETE", "state.json"};
    for (int i = 0; i < 2 + CREW_CHECKPOINT_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, i < 2 ? markers[i] : crew_checkpoint_file_names[i - 2]);
        CREW_TRY(crew_refuse_link(path, LINK_WHY));
    }
    return CREW_OK;
}

/* The marker and state.json: damage when either is missing or they disagree; state.json that
 * matches its marker but cannot be used (another version, another model) is refused. text
 * receives state.json (malloc'd) when the marker checks out. */
static crew_status check_marker(const char *dir, char **text)
{
    char path[4200], *complete = NULL;
    *text = NULL;
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    crew_status s = read_text(path, &complete);
    if (s) {
        crew_status_free(s);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s is incomplete: it has no COMPLETE marker", dir);
    }
    snprintf(path, sizeof path, "%s/state.json", dir);
    s = read_text(path, text);
    if (!s && strtoull(complete, NULL, 16) != (uint64_t)XXH3_64bits(*text, strlen(*text)))
        s = crew_errorf(CREW_CODE_BAD_INPUT, "%s does not match its COMPLETE marker (checksum)", path);
    free(complete);
    if (s) {
        free(*text);
        *text = NULL;
    }
    return s;
}

/* m NULL: the model is not compared. */
static crew_status check_state(const char *dir, const crew_model *m, crew_checkpoint_state *st,
                               crew_checkpoint_file_sum *sums, verdict *v)
{
    char path[4200], *text;
    *v = LINKED;
    CREW_TRY(refuse_links(dir));
    *v = DAMAGED;
    CREW_TRY(check_marker(dir, &text));
    *v = REFUSED;
    snprintf(path, sizeof path, "%s/state.json", dir);
    crew_status s = crew_checkpoint_state_parse(text, path, st, sums);
    if (!s && m) s = crew_checkpoint_check_model(text, dir, m);
    free(text);
    return s;
}

crew_status crew_checkpoint_read_state(const char *dir, crew_checkpoint_state *st)
{
    crew_checkpoint_file_sum sums[CREW_CHECKPOINT_FILES];
    verdict v;
    return check_state(dir, NULL, st, sums, &v);
}

static crew_status check_files(const char *dir, const crew_checkpoint_file_sum *sums)
{
    for (int i = 0; i < CREW_CHECKPOINT_FILES; i++) {
        char path[4200];
        int64_t bytes;
        uint64_t h;
        snprintf(path, sizeof path, "%s/%s", dir, crew_checkpoint_file_names[i]);
        crew_status s = crew_file_hash(path, &bytes, &h);
        if (s) {
            crew_status_free(s);
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s is missing or unreadable", path);
        }
        if (bytes != sums[i].bytes)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s holds %lld bytes, state.json says %lld", path, (long long)bytes,
                               (long long)sums[i].bytes);
        if (h != sums[i].xxh3)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s fails its checksum (xxh3 %016" PRIx64 ", expected %016" PRIx64 ")",
                               path, h, sums[i].xxh3);
    }
    return CREW_OK;
}

/* The optimizer file must hold exactly the slots the compiled optimizer has. */
static crew_status check_optimizer(const char *path, const crew_optimizer *o, const crew_st_file *f)
{
    for (int i = 0; i < 2; i++) {
        char name[8];
        snprintf(name, sizeof name, "slot%d", i);
        const crew_st_tensor *t = crew_st_find(f, name);
        if (!o->slot[i] != !t)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s holds the state of '%s' but the model is compiled with '%s'",
                               path, crew_st_metadata(f, "optimizer") ? crew_st_metadata(f, "optimizer") : "?",
                               o->spec.type == CREW_OPT_ADAMW ? "adamw" : "sgd");
        if (t && (t->dtype != CREW_ST_F32 || t->count != o->n))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s' holds %lld values, the model has %lld parameters",
                               path, name, (long long)t->count, (long long)o->n);
    }
    const crew_st_tensor *t = crew_st_find(f, "t");
    if (!t || t->dtype != CREW_ST_I64 || t->count != 1)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor 't' (the update count) is missing", path);
    return CREW_OK;
}

/* Once every file matches its checksum, whatever fails is a mismatch with this model, never
 * damage: *v says which. */
static crew_status try_load(const char *dir, crew_model *m, crew_optimizer *opt, crew_checkpoint_state *st, verdict *v)
{
    crew_checkpoint_file_sum sums[CREW_CHECKPOINT_FILES];
    CREW_TRY(check_state(dir, m, st, sums, v));
    *v = DAMAGED;
    CREW_TRY(check_files(dir, sums));
    *v = REFUSED;
    char opt_path[4200], model_path[4200];
    snprintf(opt_path, sizeof opt_path, "%s/optimizer.safetensors", dir);
    snprintf(model_path, sizeof model_path, "%s/model.safetensors", dir);
    crew_st_file f;
    CREW_TRY(crew_st_read(opt_path, &f));
    crew_status s = check_optimizer(opt_path, opt, &f);
    if (!s) s = crew_model_load_weights(m, model_path); /* all or nothing */
    float *host = s ? NULL : malloc((size_t)(opt->n > 0 ? opt->n : 1) * sizeof *host);
    if (!s && !host) s = CREW_OOM();
    for (int i = 0; i < 2 && !s; i++) {
        char name[8];
        snprintf(name, sizeof name, "slot%d", i);
        const crew_st_tensor *t = crew_st_find(&f, name);
        if (!t) continue;
        memcpy(host, t->data, (size_t)opt->n * sizeof(float)); /* file data may be unaligned */
        s = crew_dev_upload_f32(&m->be, opt->slot[i], host, opt->n);
        if (!s) s = m->be.ops->sync(m->be.ctx, NULL); /* host is reused for the next slot */
    }
    if (!s) memcpy(&opt->t, crew_st_find(&f, "t")->data, sizeof opt->t);
    free(host);
    crew_st_free(&f);
    if (!s) *v = USABLE;
    return s;
}

static int cmp_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x < y) - (x > y);
}

static void append(char *note, size_t len, const char *fmt, ...)
{
    size_t used = strlen(note);
    if (used >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + used, len - used, fmt, ap);
    va_end(ap);
}

/* The step numbers of ROOT's step-XXXXXXXX directories, newest first; returns the count. */
static int list_steps(const char *root, long long *steps, int cap, crew_status *err)
{
    *err = CREW_OK;
    DIR *d = opendir(root);
    if (!d) {
        *err = crew_errorf(CREW_CODE_BAD_INPUT, "no checkpoints to resume from: %s: %s", root, strerror(errno));
        return 0;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        long long step;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &step, &tail) == 1 && strlen(e->d_name) == 13) steps[n++] = step;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof steps[0], cmp_desc);
    return n;
}

/* A refused checkpoint is renamed step-XXXXXXXX.refused-<time>: kept for a person to look at,
 * never tried again, and out of the way of the run that will save that step anew. */
static void set_aside(const char *dir, char *note, size_t note_len)
{
    char aside[4200];
    snprintf(aside, sizeof aside, "%s.refused-%lld", dir, (long long)time(NULL));
    if (rename(dir, aside) == 0) append(note, note_len, " (moved to %s)", aside);
}

/* Temporary directories of writers that died mid-checkpoint: step-XXXXXXXX.tmp-<pid> whose
 * process is gone. Only a real directory is crew's: a symbolic link of that name is left alone
 * (nothing is removed through it) and named in the note. */
static void remove_stale_temporaries(const char *root, char *note, size_t note_len)
{
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        int pid;
        if (sscanf(e->d_name, "step-%lld.tmp-%d", &step, &pid) != 2) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        char dir[4200];
        struct stat sb;
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        if (lstat(dir, &sb) != 0) continue;
        if (!S_ISDIR(sb.st_mode)) {
            append(note, note_len, "%sleft %s alone (%s, not a directory crew wrote)", note[0] ? "; " : "", e->d_name,
                   S_ISLNK(sb.st_mode) ? "a symbolic link" : "a file");
            continue;
        }
        crew_remove_dir_files(dir);
        rmdir(dir);
    }
    closedir(d);
}

#define ROOT_LINK_WHY "a run's checkpoints/ is a directory of crew's own, and crew reads and writes none through a link (remove the link)"

crew_status crew_checkpoint_newest_state(const char *root, crew_checkpoint_state *st)
{
    CREW_TRY(crew_refuse_link(root, ROOT_LINK_WHY));
    long long steps[4096];
    crew_status err;
    int n = list_steps(root, steps, 4096, &err);
    CREW_TRY(err);
    for (int i = 0; i < n; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/step-%08lld", root, steps[i]);
        crew_status s = crew_checkpoint_read_state(dir, st);
        if (!s) return CREW_OK;
        crew_status_free(s);
    }
    return crew_errorf(CREW_CODE_BAD_INPUT, "no complete checkpoint in %s", root);
}

crew_status crew_checkpoint_resume(const char *root, crew_model *m, crew_optimizer *opt, crew_checkpoint_state *st,
                                   char *note, size_t note_len)
{
    note[0] = '\0';
    CREW_TRY(crew_refuse_link(root, ROOT_LINK_WHY));
    remove_stale_temporaries(root, note, note_len);
    long long steps[4096];
    crew_status err;
    int n = list_steps(root, steps, 4096, &err);
    CREW_TRY(err);
    for (int i = 0; i < n; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/step-%08lld", root, steps[i]);
        verdict v;
        crew_status s = try_load(dir, m, opt, st, &v);
        if (!s) {
            append(note, note_len, "%sresumed from %s (step %lld)", note[0] ? "; " : "", dir, (long long)st->step);
            return CREW_OK;
        }
        if (v == REFUSED || v == LINKED) { /* every older checkpoint is of the same run: no use trying them */
            crew_status e = crew_errorf(crew_status_code(s), "%s%scannot resume: %s (%s)", note, note[0] ? "; " : "",
                                        crew_status_message(s), v == LINKED ? "it was left as it is"
                                                                            : "the checkpoint is intact and was left as it is");
            crew_status_free(s);
            return e;
        }
        append(note, note_len, "%srefused %s: %s", note[0] ? "; " : "", dir, crew_status_message(s));
        crew_status_free(s);
        set_aside(dir, note, note_len);
        if (i + 1 < n) append(note, note_len, "; falling back to the previous checkpoint");
    }
    return crew_errorf(CREW_CODE_BAD_INPUT, "no usable checkpoint in %s%s%s", root, note[0] ? ": " : "", note);
}
