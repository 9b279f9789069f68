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
                               crew_optimizer_name(o->spec.type));
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

/* What a resume met on the way, for its note: checkpoints set aside (each with its reason) and
 * temporaries left alone, in the order met. A note lists them whole while they fit, and counts the
 * rest: it never ends mid-sentence, and the checkpoint used comes first, whatever was met. */
#define PASSED_TEXTS 32
typedef struct passed {
    int n, n_aside;
    char (*names)[48];          /* [CAP]: "step-00000480", "step-00000490.tmp-77" */
    char *texts[PASSED_TEXTS];  /* the first ones' "refused step-00000480: model.safetensors ..." */
    long long aside_time;       /* the .refused-<time> of every one set aside by this resume */
} passed;
#define PASSED_CAP 4096

static void passed_add(passed *p, const char *name, int aside, const char *fmt, ...) CREW_PRINTF(4, 5);
static void passed_add(passed *p, const char *name, int aside, const char *fmt, ...)
{
    if (!p->names || p->n >= PASSED_CAP) return;
    snprintf(p->names[p->n], sizeof p->names[p->n], "%s", name);
    if (p->n < PASSED_TEXTS) {
        va_list ap;
        va_start(ap, fmt);
        int len = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        p->texts[p->n] = len >= 0 ? malloc((size_t)len + 1) : NULL;
        if (p->texts[p->n]) {
            va_start(ap, fmt);
            vsnprintf(p->texts[p->n], (size_t)len + 1, fmt, ap);
            va_end(ap);
        }
    }
    p->n++;
    p->n_aside += aside != 0;
}

static void passed_free(passed *p)
{
    for (int i = 0; i < p->n && i < PASSED_TEXTS; i++) free(p->texts[i]);
    free(p->names);
}

/* Appends text to out[len] when all of it fits with `reserve` bytes to spare: 1, else 0. */
static int put_whole(char *out, size_t len, size_t reserve, const char *text)
{
    size_t used = strlen(out), n = strlen(text);
    if (used + n + reserve >= len) return 0;
    memcpy(out + used, text, n + 1);
    return 1;
}

/* out = head, then what p met: those set aside, and each thing met whole while it fits, then
 * "and K more (first to last)". head itself must fit. */
static void passed_note(const passed *p, const char *head, char *out, size_t len)
{
    snprintf(out, len, "%s", head);
    if (!p->n) return;
    char part[200];
    if (p->n_aside) {
        snprintf(part, sizeof part, "%sfalling back past %d damaged checkpoint%s, set aside as step-XXXXXXXX.refused-%lld",
                 head[0] ? ", " : "", p->n_aside, p->n_aside == 1 ? "" : "s", p->aside_time);
        if (!put_whole(out, len, 1, part)) return;
    }
    const size_t tail = 2 * sizeof p->names[0] + 40; /* room for the summary */
    int i = 0;
    for (; i < p->n && i < PASSED_TEXTS && p->texts[i]; i++) {
        const char *sep = out[0] ? (i == 0 && p->n_aside ? ": " : "; ") : "";
        size_t used = strlen(out);
        if (!put_whole(out, len, tail, sep) || !put_whole(out, len, tail, p->texts[i])) {
            out[used] = '\0';
            break;
        }
    }
    if (i == p->n) return;
    if (i + 1 == p->n) snprintf(part, sizeof part, "%sand 1 more (%s)", out[0] ? "; " : "", p->names[i]);
    else
        snprintf(part, sizeof part, "%sand %d more (%s to %s)", out[0] ? "; " : "", p->n - i, p->names[i],
                 p->names[p->n - 1]);
    put_whole(out, len, 1, part);
}

/* A reason as the note gives it: without the directory it names ("model.safetensors fails its
 * checksum", not the whole path), which the note says once. */
static void short_reason(const char *reason, const char *root, const char *dir, char *out, size_t len)
{
    char prefixes[2][4300];
    snprintf(prefixes[0], sizeof prefixes[0], "%s/", dir);
    snprintf(prefixes[1], sizeof prefixes[1], "%s/", root);
    size_t used = 0;
    out[0] = '\0';
    for (const char *c = reason; *c && used + 1 < len;) {
        int skipped = 0;
        for (int k = 0; k < 2 && !skipped; k++) {
            size_t n = strlen(prefixes[k]);
            if (!strncmp(c, prefixes[k], n)) c += n, skipped = 1;
        }
        if (!skipped) out[used++] = *c++;
    }
    out[used] = '\0';
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
 * never tried again, and out of the way of the run that will save that step anew. 1 when it was. */
static int set_aside(const char *dir, long long when)
{
    char aside[4200];
    snprintf(aside, sizeof aside, "%s.refused-%lld", dir, when);
    return rename(dir, aside) == 0;
}

/* Temporary directories of writers that died mid-checkpoint: step-XXXXXXXX.tmp-<pid> whose
 * process is gone. Only a real directory is crew's: a symbolic link of that name is left alone
 * (nothing is removed through it) and named in the note. */
static void remove_stale_temporaries(const char *root, passed *met)
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
            passed_add(met, e->d_name, 0, "left %s alone (%s, not a directory crew wrote)", e->d_name,
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

/* "" when the checkpoint was written under this crew's CPU GEMM library; else why the resumed run's
 * last bits will not be those of a run never stopped (every product rounds another way). */
static void gemm_remark(const char *written, char *out, size_t len)
{
    char here[sizeof ((crew_checkpoint_state *)0)->gemm];
    crew_blas_describe(here, sizeof here);
    if (!written[0])
        snprintf(out, len, "; it does not say which CPU GEMM library its crew ran (an older crew's); this one runs %s, "
                 "and under another library the run goes on with other last bits than a run never stopped", here);
    else if (strcmp(written, here) != 0)
        snprintf(out, len, "; it was written under %s and this crew runs %s: the run goes on, with other last bits "
                 "than a run never stopped", written, here);
    else
        out[0] = '\0';
}

crew_status crew_checkpoint_resume(const char *root, crew_model *m, crew_optimizer *opt, crew_checkpoint_state *st,
                                   char *note, size_t note_len)
{
    note[0] = '\0';
    CREW_TRY(crew_refuse_link(root, ROOT_LINK_WHY));
    passed met = {.names = malloc(PASSED_CAP * sizeof *met.names), .aside_time = (long long)time(NULL)};
    if (!met.names) return CREW_OOM();
    remove_stale_temporaries(root, &met);
    long long steps[4096];
    crew_status err;
    int n = list_steps(root, steps, 4096, &err);
    for (int i = 0; i < n && !err; i++) {
        char dir[4096], name[32], head[4200], reason[1200];
        snprintf(name, sizeof name, "step-%08lld", steps[i]);
        snprintf(dir, sizeof dir, "%s/%s", root, name);
        verdict v;
        crew_status s = try_load(dir, m, opt, st, &v);
        if (!s) {
            /* the GEMM library's remark last, its room kept: the note drops what it met first */
            char remark[600];
            gemm_remark(st->gemm, remark, sizeof remark);
            size_t keep = strlen(remark) < note_len / 2 ? strlen(remark) : 0;
            snprintf(head, sizeof head, "resumed from %s (step %lld)", dir, (long long)st->step);
            passed_note(&met, head, note, note_len - keep);
            if (keep) put_whole(note, note_len, 1, remark);
            passed_free(&met);
            return CREW_OK;
        }
        if (v == REFUSED || v == LINKED) { /* every older checkpoint is of the same run: no use trying them */
            passed_note(&met, "", note, note_len);
            err = crew_errorf(crew_status_code(s), "cannot resume: %s (%s)%s%s", crew_status_message(s),
                              v == LINKED ? "it was left as it is" : "the checkpoint is intact and was left as it is",
                              note[0] ? "; on the way: " : "", note);
        } else {
            short_reason(crew_status_message(s), root, dir, reason, sizeof reason);
            int aside = set_aside(dir, met.aside_time);
            /* "step-X is incomplete: ..." reads "refused step-X, incomplete: ..." */
            size_t k = strlen(name);
            int about_it = !strncmp(reason, name, k) && !strncmp(reason + k, " is ", 4);
            passed_add(&met, name, aside, "refused %s%s%s%s", name, about_it ? ", " : ": ", about_it ? reason + k + 4 : reason,
                       aside ? "" : " (it could not be renamed)");
        }
        crew_status_free(s);
    }
    if (!err) {
        passed_note(&met, "", note, note_len);
        err = crew_errorf(CREW_CODE_BAD_INPUT, "no usable checkpoint in %s%s%s", root, note[0] ? ": " : "", note);
    }
    passed_free(&met);
    return err;
}
