/* prep_cifar.c — crew prep for CIFAR-10's binary version (cifar-10-batches-bin).
 *
 * Each batch file is a run of 3073-byte records: one label byte, then a 32x32 image as three
 * planes (1024 red bytes, 1024 green, 1024 blue, each row-major). crew stores images NHWC, so
 * every record is transposed from planar to interleaved on the way in. All six files are
 * checked for presence and size before any is read, so a missing or truncated batch is
 * reported at once, naming it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mapped_file.h"
#include "core/status.h"
#include "data/prep_common.h"

enum { SIDE = 32, PLANE = SIDE * SIDE, PIXELS = 3 * PLANE, RECORD = 1 + PIXELS, CLASSES = 10, BATCHES = 6 };
enum { TRAIN = 0, TEST = 1 };

static const char *const batch_names[BATCHES] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                                 "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
static const char *const default_names[CLASSES] = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                   "dog",      "frog",       "horse", "ship", "truck"};

typedef struct cifar_files {
    char path[BATCHES][1024];
    int64_t records[BATCHES];
    int64_t n[2]; /* samples per split */
} cifar_files;

/* Every batch present and a whole number of records. */
static crew_status find_batches(const char *dir, cifar_files *f)
{
    for (int i = 0; i < BATCHES; i++) {
        if ((size_t)snprintf(f->path[i], sizeof f->path[i], "%s/%s", dir, batch_names[i]) >= sizeof f->path[i])
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", dir);
        struct stat st;
        if (stat(f->path[i], &st) != 0)
            return crew_errorf(errno == ENOENT ? CREW_CODE_BAD_INPUT : CREW_CODE_IO,
                               "%s: %s (CIFAR-10 needs data_batch_1.bin .. data_batch_5.bin and test_batch.bin)",
                               f->path[i], strerror(errno));
        if (!S_ISREG(st.st_mode))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a regular file (%s)", f->path[i], crew_file_kind(st.st_mode));
        if (st.st_size == 0 || st.st_size % RECORD)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %lld bytes is not a positive multiple of the %d-byte record "
                               "(truncated?)", f->path[i], (long long)st.st_size, RECORD);
        f->records[i] = st.st_size / RECORD;
        f->n[i == BATCHES - 1 ? TEST : TRAIN] += f->records[i];
    }
    return CREW_OK;
}

/* path opened as every reader of outside data opens a file (core/mapped_file.h), as a stream. */
static crew_status open_stream(const char *path, FILE **out, int64_t *size)
{
    int fd;
    CREW_TRY(crew_open_regular(path, &fd, size));
    *out = fdopen(fd, "rb");
    if (!*out) {
        crew_status s = crew_errorf(CREW_CODE_IO, "%s: fdopen: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    return CREW_OK;
}

/* Reads one batch and appends its records, transposed to [n][32][32][3], at x and y. */
static crew_status read_batch(const char *path, int64_t records, uint8_t *x, uint8_t *y)
{
    FILE *f;
    int64_t size;
    CREW_TRY(open_stream(path, &f, &size));
    uint8_t rec[RECORD];
    crew_status s = CREW_OK;
    if (size != records * RECORD)
        s = crew_errorf(CREW_CODE_IO, "%s: changed size since it was checked (%lld bytes, now %lld)", path,
                        (long long)(records * RECORD), (long long)size);
    for (int64_t r = 0; r < records && !s; r++) {
        if (fread(rec, 1, RECORD, f) != RECORD) {
            s = crew_errorf(CREW_CODE_IO, "%s: read failed at record %lld%s", path, (long long)r,
                            ferror(f) ? "" : " (the file shrank while reading)");
            break;
        }
        if (rec[0] >= CLASSES)
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: record %lld has label %d, outside [0, %d)", path, (long long)r,
                            rec[0], CLASSES);
        y[r] = rec[0];
        uint8_t *img = x + r * PIXELS;
        for (int p = 0; p < PLANE; p++)
            for (int c = 0; c < 3; c++) img[3 * p + c] = rec[1 + c * PLANE + p];
    }
    fclose(f);
    return s;
}

/* batches.meta.txt: the class names, one per line (blank lines ignored), when the file exists. */
static crew_status read_names(const char *dir, char names[CLASSES][64], int *found)
{
    char path[1024];
    *found = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/batches.meta.txt", dir) >= sizeof path)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", dir);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return CREW_OK; /* absent: CIFAR-10's own names */
    FILE *f;
    int64_t size;
    CREW_TRY(open_stream(path, &f, &size));
    char line[256];
    int n = 0;
    crew_status s = CREW_OK;
    while (!s && fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\r\n");
        while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
        if (len == 0) continue;
        if (n == CLASSES || len >= sizeof names[0])
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s", path,
                            n == CLASSES ? "more than 10 class names" : "a class name longer than 63 characters");
        else snprintf(names[n++], sizeof names[0], "%.*s", (int)len, line);
    }
    if (!s && ferror(f)) s = crew_errorf(CREW_CODE_IO, "%s: read failed", path);
    if (!s && n != CLASSES) s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: %d class names, expected 10", path, n);
    fclose(f);
    *found = !s;
    return s;
}

static crew_status read_all(const cifar_files *files, uint8_t *x[2], uint8_t *y[2], crew_prep_progress *progress)
{
    int64_t at = 0;
    for (int i = 0; i < BATCHES; i++) {
        int split = i == BATCHES - 1 ? TEST : TRAIN;
        if (split == TEST) at = 0;
        crew_prep_tick(progress, files->path[i]);
        CREW_TRY(read_batch(files->path[i], files->records[i], x[split] + at * PIXELS, y[split] + at));
        at += files->records[i];
    }
    return CREW_OK;
}

crew_status crew_prep_cifar10(const char *src_dir, const char *out_dir, crew_progress_fn progress, void *user)
{
    if (!src_dir || !out_dir)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_cifar10: src_dir and out_dir are required");
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    cifar_files files;
    memset(&files, 0, sizeof files);
    CREW_TRY(find_batches(src_dir, &files));
    char names[CLASSES][64];
    int have_names;
    CREW_TRY(read_names(src_dir, names, &have_names));
    crew_prep_progress pr = {.fn = progress, .user = user, .total = BATCHES + 1 + 4 + 1};
    uint8_t *x[2], *y[2];
    crew_status s = CREW_OK;
    for (int i = 0; i < 2; i++) {
        x[i] = malloc((size_t)(files.n[i] * PIXELS));
        y[i] = malloc((size_t)files.n[i]);
        if (!x[i] || !y[i]) s = CREW_OOM();
    }
    if (!s) s = read_all(&files, x, y, &pr);
    if (!s) {
        crew_manifest m;
        memset(&m, 0, sizeof m);
        char *name_ptrs[CLASSES];
        for (int c = 0; c < CLASSES; c++) name_ptrs[c] = have_names ? names[c] : (char *)default_names[c];
        snprintf(m.name, sizeof m.name, "cifar10");
        m.classes = CLASSES;
        m.class_names = name_ptrs; /* only read by the writer */
        m.sample_shape = crew_shape3(SIDE, SIDE, 3);
        crew_prep_tick(&pr, "normalization statistics");
        s = crew_prep_stats_u8(x[TRAIN], files.n[TRAIN] * PIXELS, 3, 1.0 / 255.0, &m);
        crew_prep_split_data d[2] = {{"train", files.n[TRAIN], x[TRAIN], y[TRAIN]},
                                     {"test", files.n[TEST], x[TEST], y[TEST]}};
        if (!s) s = crew_prep_write(out_dir, &m, CREW_DTYPE_U8, CREW_DTYPE_U8, d, 2, &pr);
        m.class_names = NULL; /* name_ptrs, on the stack */
        crew_manifest_free(&m);
    }
    for (int i = 0; i < 2; i++) {
        free(x[i]);
        free(y[i]);
    }
    if (!s) crew_prep_done(&pr);
    return s;
}
