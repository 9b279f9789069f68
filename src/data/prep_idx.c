/* prep_idx.c — crew prep for MNIST-style IDX files: reads images and labels, checks that they
 * belong together, computes the training split's per-channel mean and standard deviation, and
 * writes the dataset directory (x as uint8 [N, H, W, C], y as uint8 [N], manifest.json)
 * atomically, so a failed prep never leaves a half-written dataset behind. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/status.h"
#include "core/atomic_dir.h"
#include "data/idx.h"
#include "data/manifest.h"
#include "data/npy.h"
#include "data/prep_common.h"

static const char *const fashion_classes[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

enum { TRAIN = 0, TEST = 1 };

typedef struct prep_job {
    const char *name;
    int classes;                    /* 0: max label + 1 */
    const char *const *class_names; /* [classes], or NULL */
    const char *images[2], *labels[2]; /* [TRAIN], [TEST]; TEST NULL: split off the train files */
    crew_progress_fn progress;
    void *user;
    int64_t step, steps;
} prep_job;

typedef struct prep_data {
    crew_idx img[2], lab[2];
    crew_shape sample;          /* e.g. (28, 28, 1) */
    int64_t sample_size;        /* elements per sample */
    const uint8_t *x[2], *y[2]; /* each split's samples and labels */
    int64_t n[2];
} prep_data;

static void tick(prep_job *job, const char *what)
{
    if (job->progress) job->progress(job->user, job->step, job->steps, what);
    job->step++;
}

static void free_data(prep_data *p)
{
    for (int i = 0; i < 2; i++) {
        crew_idx_free(&p->img[i]);
        crew_idx_free(&p->lab[i]);
    }
}

/* Images [N, H, W] or [N, H, W, C] and labels [N]: the sample shape, and agreeing counts. */
static crew_status check_pair(const crew_idx *img, const crew_idx *lab, const char *ipath, const char *lpath,
                              crew_shape *sample)
{
    if (img->ndim < 3)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: images must have 3 or 4 dimensions, not %d", ipath, img->ndim);
    if (lab->ndim != 1)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: labels must have 1 dimension, not %d", lpath, lab->ndim);
    if (img->dims[0] != lab->dims[0])
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s holds %lld labels but %s holds %lld images", lpath,
                           (long long)lab->dims[0], ipath, (long long)img->dims[0]);
    if (img->dims[0] < 1) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: no images", ipath);
    *sample = crew_shape3(img->dims[1], img->dims[2], img->ndim == 4 ? img->dims[3] : 1);
    if (sample->dim[0] < 1 || sample->dim[1] < 1 || sample->dim[2] < 1 || sample->dim[2] > CREW_PREP_MAX_CHANNELS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: image shape %lldx%lldx%lld is empty or has over %d channels", ipath,
                           (long long)sample->dim[0], (long long)sample->dim[1], (long long)sample->dim[2],
                           CREW_PREP_MAX_CHANNELS);
    return CREW_OK;
}

static crew_status read_inputs(prep_job *job, prep_data *p)
{
    int splits = job->images[TEST] ? 2 : 1;
    for (int i = 0; i < splits; i++) {
        tick(job, job->images[i]);
        CREW_TRY(crew_idx_read(job->images[i], &p->img[i]));
        tick(job, job->labels[i]);
        CREW_TRY(crew_idx_read(job->labels[i], &p->lab[i]));
    }
    CREW_TRY(check_pair(&p->img[TRAIN], &p->lab[TRAIN], job->images[TRAIN], job->labels[TRAIN], &p->sample));
    p->sample_size = crew_shape_size(&p->sample);
    p->x[TRAIN] = p->img[TRAIN].data;
    p->y[TRAIN] = p->lab[TRAIN].data;
    p->n[TRAIN] = p->img[TRAIN].dims[0];
    if (splits == 2) {
        crew_shape s;
        CREW_TRY(check_pair(&p->img[TEST], &p->lab[TEST], job->images[TEST], job->labels[TEST], &s));
        if (s.dim[0] != p->sample.dim[0] || s.dim[1] != p->sample.dim[1] || s.dim[2] != p->sample.dim[2])
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: images are %lldx%lldx%lld but the training images are %lldx%lldx%lld",
                               job->images[TEST], (long long)s.dim[0], (long long)s.dim[1], (long long)s.dim[2],
                               (long long)p->sample.dim[0], (long long)p->sample.dim[1], (long long)p->sample.dim[2]);
        p->x[TEST] = p->img[TEST].data;
        p->y[TEST] = p->lab[TEST].data;
        p->n[TEST] = p->img[TEST].dims[0];
        return CREW_OK;
    }
    /* No test files: the last 1/7 (rounded, at least one sample) becomes the test split. */
    int64_t n = p->n[TRAIN], n_test = (n + 3) / 7 ? (n + 3) / 7 : 1;
    if (n < 2) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: 1 sample cannot be split into train and test", job->images[TRAIN]);
    p->n[TRAIN] = n - n_test;
    p->n[TEST] = n_test;
    p->x[TEST] = p->x[TRAIN] + p->n[TRAIN] * p->sample_size;
    p->y[TEST] = p->y[TRAIN] + p->n[TRAIN];
    return CREW_OK;
}

/* A fixed class count holds every label; without one it is the largest label + 1. */
static crew_status settle_classes(const prep_job *job, const prep_data *p, int *classes)
{
    int max = -1;
    for (int s = 0; s < 2; s++)
        for (int64_t i = 0; i < p->n[s]; i++) {
            int v = p->y[s][i];
            if (job->classes && v >= job->classes) {
                const char *file = job->labels[s] ? job->labels[s] : job->labels[TRAIN];
                int64_t at = job->labels[s] ? i : p->n[TRAIN] + i;
                return crew_errorf(CREW_CODE_BAD_INPUT, "%s: label %d at index %lld is outside [0, %d)", file, v,
                                   (long long)at, job->classes);
            }
            if (v > max) max = v;
        }
    *classes = job->classes ? job->classes : max + 1;
    return CREW_OK;
}

static crew_status write_split(prep_job *job, const prep_data *p, int s, crew_atomic_dir *ad, crew_manifest_split *sp)
{
    char path[1200];
    snprintf(sp->name, sizeof sp->name, "%s", s == TRAIN ? "train" : "test");
    sp->samples = p->n[s];
    crew_manifest_array *x = &sp->x, *y = &sp->y;
    snprintf(x->file, sizeof x->file, "%s_x.npy", sp->name);
    snprintf(y->file, sizeof y->file, "%s_y.npy", sp->name);
    x->dtype = y->dtype = CREW_DTYPE_U8;
    x->ndim = 1 + p->sample.ndim;
    x->shape[0] = y->shape[0] = p->n[s];
    memcpy(&x->shape[1], p->sample.dim, sizeof p->sample.dim[0] * (size_t)p->sample.ndim);
    y->ndim = 1;
    tick(job, x->file);
    CREW_TRY(crew_atomic_dir_file(ad, x->file, path, sizeof path));
    CREW_TRY(crew_npy_write(path, x->dtype, x->ndim, x->shape, p->x[s]));
    CREW_TRY(crew_manifest_hash_file(path, x));
    tick(job, y->file);
    CREW_TRY(crew_atomic_dir_file(ad, y->file, path, sizeof path));
    CREW_TRY(crew_npy_write(path, y->dtype, y->ndim, y->shape, p->y[s]));
    return crew_manifest_hash_file(path, y);
}

static crew_status write_dataset(prep_job *job, const prep_data *p, crew_manifest *m, const char *out_dir)
{
    crew_atomic_dir ad;
    CREW_TRY(crew_atomic_dir_begin(out_dir, &ad));
    crew_status s = CREW_OK;
    m->n_splits = 2;
    for (int i = 0; i < 2 && !s; i++) s = write_split(job, p, i, &ad, &m->splits[i]);
    char path[1200];
    if (!s) s = crew_atomic_dir_file(&ad, CREW_MANIFEST_FILE, path, sizeof path);
    if (!s) s = crew_manifest_write(path, m);
    if (!s) {
        tick(job, out_dir);
        s = crew_atomic_dir_commit(&ad); /* removes the temporary directory itself on failure */
    }
    crew_atomic_dir_abort(&ad);
    return s;
}

static crew_status prep_run(prep_job *job, const char *out_dir)
{
    prep_data p;
    memset(&p, 0, sizeof p);
    crew_manifest m;
    memset(&m, 0, sizeof m);
    /* Refuse an existing output before the minutes of reading; commit checks again. */
    struct stat st;
    if (lstat(out_dir, &st) == 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s already exists; remove it first or choose another output directory",
                           out_dir);
    job->steps = (job->images[TEST] ? 4 : 2) + 1 + 4 + 1; /* reads, statistics, arrays, commit */
    crew_status s = read_inputs(job, &p);
    if (!s) s = settle_classes(job, &p, &m.classes);
    if (!s) {
        snprintf(m.name, sizeof m.name, "%s", job->name);
        m.class_names = (char **)job->class_names; /* only read by the writer */
        m.sample_shape = p.sample;
        tick(job, "normalization statistics");
        s = crew_prep_stats_u8(p.x[TRAIN], p.n[TRAIN] * p.sample_size, (int)p.sample.dim[2], 1.0 / 255.0, &m);
        if (!s) s = write_dataset(job, &p, &m, out_dir);
    }
    if (!s && job->progress) job->progress(job->user, job->steps, job->steps, "done");
    free_data(&p);
    m.class_names = NULL; /* the job's */
    crew_manifest_free(&m);
    return s;
}

crew_status crew_prep_idx(const char *images, const char *labels, const char *test_images, const char *test_labels,
                          const char *out_dir, crew_progress_fn progress, void *user)
{
    if (!images || !labels || !out_dir)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_idx: images, labels and out_dir are required");
    if (!test_images != !test_labels)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_idx: give both test images and test labels, or neither");
    prep_job job = {.name = "idx", .images = {images, test_images}, .labels = {labels, test_labels},
                    .progress = progress, .user = user};
    return prep_run(&job, out_dir);
}

/* name, or name without ".gz" when only the uncompressed file is there. */
static crew_status source_file(const char *dir, const char *name, char *buf, size_t len)
{
    if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", dir);
    struct stat st;
    if (stat(buf, &st) != 0) {
        char raw[1024];
        snprintf(raw, sizeof raw, "%.*s", (int)(strlen(buf) - 3), buf);
        if (stat(raw, &st) == 0) snprintf(buf, len, "%s", raw);
    }
    return CREW_OK;
}

crew_status crew_prep_fashion_mnist(const char *src_dir, const char *out_dir, crew_progress_fn progress, void *user)
{
    if (!src_dir || !out_dir)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_fashion_mnist: src_dir and out_dir are required");
    char paths[4][1024];
    static const char *const names[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 4; i++) CREW_TRY(source_file(src_dir, names[i], paths[i], sizeof paths[i]));
    prep_job job = {.name = "fashion-mnist", .classes = 10, .class_names = fashion_classes,
                    .images = {paths[0], paths[2]}, .labels = {paths[1], paths[3]},
                    .progress = progress, .user = user};
    return prep_run(&job, out_dir);
}
