/* checkpoint_write.c — writing a checkpoint atomically, and pruning old ones. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/status.h"
#include "core/atomic_dir.h"
#include "core/links.h"
#include "io/safetensors.h"
#include "train/checkpoint_json.h"

static crew_status write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return crew_errorf(CREW_CODE_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok) return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", path, strerror(errno));
    return CREW_OK;
}

static const char *optimizer_name(const crew_optimizer *o) { return crew_optimizer_name(o->spec.type); }

/* The slots come down from the device into one host buffer first. */
static crew_status write_optimizer(const char *path, const crew_optimizer *o, const crew_backend *be)
{
    crew_st_tensor t[3];
    int n = 0;
    int64_t updates = o->t;
    float *host = malloc((size_t)(o->n > 0 ? o->n : 1) * 2 * sizeof *host);
    if (!host) return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "out of memory for %lld values of optimizer state", (long long)o->n);
    crew_status s = CREW_OK;
    for (int i = 0; i < 2 && !s; i++) {
        if (!o->slot[i]) continue;
        float *slot = host + (size_t)i * (size_t)o->n;
        s = crew_dev_download_f32(be, slot, o->slot[i], o->n);
        t[n] = (crew_st_tensor){.dtype = CREW_ST_F32, .ndim = 1, .shape = {o->n}, .count = o->n, .data = slot};
        snprintf(t[n].name, sizeof t[n].name, "slot%d", i);
        n++;
    }
    t[n] = (crew_st_tensor){.dtype = CREW_ST_I64, .ndim = 1, .shape = {1}, .count = 1, .data = &updates};
    snprintf(t[n].name, sizeof t[n].name, "t");
    n++;
    const char *meta[] = {"optimizer", optimizer_name(o), NULL};
    if (!s) s = crew_st_write(path, t, n, meta);
    free(host);
    return s;
}

/* The files of a checkpoint directory, in the order they are written. */
static crew_status write_files(const crew_atomic_dir *ad, const crew_model *m, const crew_optimizer *opt,
                               const crew_checkpoint_state *st)
{
    char paths[CREW_CHECKPOINT_FILES][700], state_path[700], complete_path[700];
    crew_checkpoint_file_sum sums[CREW_CHECKPOINT_FILES];
    for (int i = 0; i < CREW_CHECKPOINT_FILES; i++)
        CREW_TRY(crew_atomic_dir_file(ad, crew_checkpoint_file_names[i], paths[i], sizeof paths[i]));
    CREW_TRY(crew_atomic_dir_file(ad, "state.json", state_path, sizeof state_path));
    CREW_TRY(crew_atomic_dir_file(ad, "COMPLETE", complete_path, sizeof complete_path));
    CREW_TRY(crew_model_save_weights_progress(m, paths[0], st->step, st->plan.total_steps));
    CREW_TRY(write_optimizer(paths[1], opt, &m->be));
    for (int i = 0; i < CREW_CHECKPOINT_FILES; i++) CREW_TRY(crew_file_hash(paths[i], &sums[i].bytes, &sums[i].xxh3));
    char *text = crew_checkpoint_state_json(st, m, sums);
    if (!text) return CREW_OOM();
    crew_status s = write_text(state_path, text);
    char complete[32];
    snprintf(complete, sizeof complete, "%016" PRIx64 "\n", (uint64_t)XXH3_64bits(text, strlen(text)));
    free(text);
    if (!s) s = write_text(complete_path, complete);
    return s;
}

static int is_checkpoint_name(const char *name, long long *step)
{
    char tail;
    return sscanf(name, "step-%lld%c", step, &tail) == 1 && strlen(name) == 13;
}

/* Removes a checkpoint's files, never through a link: a step directory that is a symbolic link is
 * not opened (O_NOFOLLOW), so whatever it points to keeps its files. */
static void remove_checkpoint(const char *dir)
{
    static const char *const names[] = {"model.safetensors", "optimizer.safetensors", "state.json", "COMPLETE"};
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlinkat(fd, names[i], 0);
    close(fd);
    rmdir(dir); /* leaves a directory holding anything else alone */
}

static int cmp_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x < y) - (x > y);
}

/* Keeps the newest `keep` complete checkpoints. */
static void prune(const char *root, int keep)
{
    DIR *d = opendir(root);
    if (!d) return;
    long long steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        long long step;
        char marker[4300], dir[4200];
        struct stat sb;
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
        /* Only a real directory is crew's checkpoint: a link among them is not counted, nor removed. */
        if (is_checkpoint_name(e->d_name, &step) && lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) &&
            access(marker, F_OK) == 0)
            steps[n++] = step;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof steps[0], cmp_desc);
    for (int i = keep; i < n; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/step-%08lld", root, steps[i]);
        remove_checkpoint(dir);
    }
}

crew_status crew_checkpoint_write(const char *root, const crew_model *m, const crew_optimizer *opt,
                                  const crew_checkpoint_state *st, int keep, char *path, size_t path_len)
{
    char final[600];
    snprintf(final, sizeof final, "%s/step-%08lld", root, (long long)st->step);
    /* Never through a link: one in place of checkpoints/ or of this step is refused
     * (docs/CHECKPOINTS.md, "Symbolic links"). */
    CREW_TRY(crew_refuse_link(root, "a run's checkpoints/ is a directory of crew's own, and crew writes nothing "
                                    "through a link (remove the link)"));
    CREW_TRY(crew_refuse_link(final, "a checkpoint is a directory of crew's own, and crew writes nothing through a "
                                     "link (remove the link)"));
    struct stat sb;
    if (lstat(final, &sb) == 0) { /* this step was saved already (a run resumed right here) */
        snprintf(path, path_len, "%s", final);
        return CREW_OK;
    }
    crew_atomic_dir ad;
    CREW_TRY(crew_atomic_dir_begin(final, &ad));
    crew_status s = write_files(&ad, m, opt, st);
    if (s) {
        crew_atomic_dir_abort(&ad);
        return crew_error_prefix(s, "checkpoint %s: ", final);
    }
    s = crew_atomic_dir_commit(&ad);
    if (s) return crew_error_prefix(s, "checkpoint %s: ", final);
    /* Only now does the checkpoint exist: a caller told of a failure above still names the
     * previous one as the last. */
    snprintf(path, path_len, "%s", final);
    prune(root, keep > 0 ? keep : 3);
    return CREW_OK;
}
