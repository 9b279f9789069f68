/* test_dataset.c — crew prep from small synthetic IDX files, then opening, gathering and
 * verifying the dataset; every way a dataset directory can be wrong giving an error that names
 * the file and key; atomic writes leaving nothing behind; and, when Debian's Fashion-MNIST is
 * installed, the real thing. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "fs_helpers.h"
#include "core/status.h"
#include "core/atomic_dir.h"
#include "data/dataset.h"
#include "data/manifest.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

static void tmp_path(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", tmp_dir, name); }

/* A gzipped IDX file: dims big-endian, then the bytes. */
static void write_idx_gz(const char *path, int ndim, const uint32_t *dims, const uint8_t *data, size_t n)
{
    uint8_t head[4 + 16] = {0, 0, 0x08, (uint8_t)ndim};
    for (int i = 0; i < ndim; i++)
        for (int b = 0; b < 4; b++) head[4 + 4 * i + b] = (uint8_t)(dims[i] >> (24 - 8 * b));
    gzFile f = gzopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(gzwrite(f, head, 4 + 4 * (unsigned)ndim) == 4 + 4 * ndim);
    CHECK(gzwrite(f, data, (unsigned)n) == (int)n);
    gzclose(f);
}

/* Synthetic images: N samples of H×W×C bytes, pixel values spread over 0..255; labels i % 3. */
#define N 14
#define H 4
#define W 3
static uint8_t pixels[N * H * W * 3], labels[N];

static void make_fixture(const char *img, const char *lab, int channels)
{
    for (size_t i = 0; i < sizeof pixels; i++) pixels[i] = (uint8_t)((i * 37 + i / 5) & 0xff);
    for (int i = 0; i < N; i++) labels[i] = (uint8_t)(i % 3);
    if (channels == 1) write_idx_gz(img, 3, (uint32_t[]){N, H, W}, pixels, N * H * W);
    else write_idx_gz(img, 4, (uint32_t[]){N, H, W, (uint32_t)channels}, pixels, N * H * W * (size_t)channels);
    write_idx_gz(lab, 1, (uint32_t[]){N}, labels, N);
}

typedef struct strict_progress {
    int calls, ok;
    int64_t last_done, total;
} strict_progress;

static void on_strict_progress(void *user, int64_t done, int64_t total, const char *what)
{
    strict_progress *p = user;
    if (p->calls && (done <= p->last_done || total != p->total)) p->ok = 0;
    if (done < 0 || done > total || !what) p->ok = 0;
    p->calls++;
    p->last_done = done;
    p->total = total;
}

/* Mean and standard deviation of pixel values (scaled by 1/255) of samples [0, n), channel c. */
static void expected_stats(int64_t n, int channels, int c, double *mean, double *sd)
{
    double sum = 0, sq = 0;
    int64_t count = n * H * W;
    for (int64_t k = 0; k < count; k++) sum += pixels[k * channels + c] / 255.0;
    *mean = sum / (double)count;
    for (int64_t k = 0; k < count; k++) sq += (pixels[k * channels + c] / 255.0 - *mean) * (pixels[k * channels + c] / 255.0 - *mean);
    *sd = sqrt(sq / (double)count);
}

static void check_gather(const crew_dataset *d, int64_t first, int channels)
{
    int64_t idx[3] = {1, 0, d->n - 1}, size = H * W * channels;
    float x[3 * H * W * 3];
    int32_t y[3];
    crew_dataset_gather(d, idx, 3, x, y);
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        int64_t sample = first + idx[i];
        CHECK(y[i] == labels[sample]);
        for (int64_t k = 0; k < size; k++) {
            int c = (int)(k % channels);
            double want = (pixels[sample * size + k] / 255.0 - d->mean[c]) / d->std[c];
            if (fabs(x[i * size + k] - want) > 1e-5 * (1 + fabs(want))) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d gathered values differ from (raw/255 - mean) / std", bad);
}

static void test_prep_and_gather(int channels)
{
    char img[128], lab[128], out[128];
    tmp_path(img, sizeof img, "imgs.gz");
    tmp_path(lab, sizeof lab, "labs.gz");
    snprintf(out, sizeof out, "%s/ds%d/nested/", tmp_dir, channels); /* parents made; trailing '/' ok */
    make_fixture(img, lab, channels);
    strict_progress log = {0, 1, 0, 0};
    CHECK_OK(crew_prep_idx(img, lab, NULL, NULL, out, on_strict_progress, &log));
    CHECK(log.calls >= 5 && log.ok && log.last_done == log.total); /* the last call says done */
    CHECK(temp_dirs_in(tmp_dir) == 0);

    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(!strcmp(m.name, "idx") && m.classes == 3 && m.class_names == NULL && m.n_splits == 2);
    CHECK(m.sample_shape.ndim == 3 && m.sample_shape.dim[0] == H && m.sample_shape.dim[1] == W);
    CHECK(m.sample_shape.dim[2] == channels && m.n_channels == channels);
    CHECK(fabs(m.scale - 1.0 / 255) < 1e-15);
    for (int c = 0; c < channels; c++) {
        double mean, sd;
        expected_stats(12, channels, c, &mean, &sd); /* 14 samples: the last 2 are the test split */
        CHECK(fabs(m.mean[c] - mean) < 1e-12 && fabs(m.std[c] - sd) < 1e-12);
    }
    crew_manifest_free(&m);

    crew_dataset *train, *test;
    CHECK_OK(crew_dataset_open(out, "train", &train));
    CHECK_OK(crew_dataset_open(out, "test", &test));
    if (!train || !test) return;
    int64_t shape[4];
    CHECK(crew_dataset_size(train) == 12 && crew_dataset_size(test) == 2 && crew_dataset_classes(train) == 3);
    CHECK(crew_dataset_sample_shape(train, shape) == 3 && shape[0] == H && shape[1] == W && shape[2] == channels);
    CHECK(!strcmp(train->name, "idx"));
    check_gather(train, 0, channels);
    check_gather(test, 12, channels);
    CHECK_OK(crew_dataset_verify(train));
    CHECK_OK(crew_dataset_verify(test));
    crew_dataset_free(train);
    crew_dataset_free(test);
}

/* With a test pair the splits come from the files; classes is the largest label + 1 over both. */
static void test_prep_with_test_files(void)
{
    char img[128], lab[128], timg[128], tlab[128], out[128];
    tmp_path(img, sizeof img, "a-imgs.gz");
    tmp_path(lab, sizeof lab, "a-labs.gz");
    tmp_path(timg, sizeof timg, "a-timgs.gz");
    tmp_path(tlab, sizeof tlab, "a-tlabs.gz");
    tmp_path(out, sizeof out, "withtest");
    make_fixture(img, lab, 1);
    uint8_t tl[2] = {5, 0};
    write_idx_gz(timg, 3, (uint32_t[]){2, H, W}, pixels, 2 * H * W);
    write_idx_gz(tlab, 1, (uint32_t[]){2}, tl, 2);
    CHECK_OK(crew_prep_idx(img, lab, timg, tlab, out, NULL, NULL));
    crew_dataset *train = NULL, *test = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &train));
    CHECK_OK(crew_dataset_open(out, "test", &test));
    CHECK(crew_dataset_size(train) == N && crew_dataset_size(test) == 2 && crew_dataset_classes(test) == 6);
    crew_dataset_free(train);
    crew_dataset_free(test);
    /* Test images of another size are refused. */
    write_idx_gz(timg, 3, (uint32_t[]){2, W, H}, pixels, 2 * H * W);
    tmp_path(out, sizeof out, "withtest2");
    CHECK_ERR(crew_prep_idx(img, lab, timg, tlab, out, NULL, NULL), "a-timgs.gz: images are 3x4x1 but the training images are 4x3x1");
    CHECK(!path_exists(out) && temp_dirs_in(tmp_dir) == 0);
}

/* ---------------------------------------------------------------- broken datasets */

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[4096];
    size_t n;
    while (a && b && (n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

/* A fresh copy of the good dataset in tmp_dir/name. */
static void clone_good(const char *name, char *dir, size_t len)
{
    static const char *const files[] = {"manifest.json", "train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"};
    char good[128], from[256], to[256];
    tmp_path(good, sizeof good, "good");
    tmp_path(dir, len, name);
    mkdir(dir, 0755);
    for (int i = 0; i < 5; i++) {
        snprintf(from, sizeof from, "%s/%s", good, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        copy_file(from, to);
    }
}

/* Sets (or with value NULL deletes) the member at a dotted path of dir/manifest.json. */
static void edit_manifest(const char *dir, const char *dotted, cJSON *value)
{
    char path[256], buf[8192], key[64];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf), *obj = root;
    const char *p = dotted, *dot;
    while ((dot = strchr(p, '.'))) {
        snprintf(key, sizeof key, "%.*s", (int)(dot - p), p);
        obj = cJSON_GetObjectItemCaseSensitive(obj, key);
        p = dot + 1;
    }
    CHECK(obj != NULL);
    if (!obj) return;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, p);
    if (value) cJSON_AddItemToObject(obj, p, value);
    char *text = cJSON_Print(root);
    f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
    cJSON_free(text);
    cJSON_Delete(root);
}

static void expect_open_error(const char *dir, const char *split, const char *needle)
{
    crew_dataset *d = (crew_dataset *)1;
    CHECK_ERR(crew_dataset_open(dir, split, &d), needle);
    CHECK(d == NULL);
}

static void test_bad_manifests(void)
{
    char dir[128], want[256];
    clone_good("bad1", dir, sizeof dir);
    edit_manifest(dir, "colour", cJSON_CreateNumber(1));
    snprintf(want, sizeof want, "%s/manifest.json: colour is not a known key", dir);
    expect_open_error(dir, "train", want);

    clone_good("bad2", dir, sizeof dir);
    edit_manifest(dir, "splits.train.x.extra", cJSON_CreateTrue());
    expect_open_error(dir, "train", "manifest.json: splits.train.x.extra is not a known key");

    clone_good("bad3", dir, sizeof dir);
    edit_manifest(dir, "splits.train.x.dtype", cJSON_CreateNumber(5));
    expect_open_error(dir, "train", "manifest.json: splits.train.x.dtype must be a string");

    clone_good("bad4", dir, sizeof dir);
    edit_manifest(dir, "classes", cJSON_CreateString("three"));
    expect_open_error(dir, "train", "manifest.json: classes must be an integer in [1, 1000000]");

    clone_good("bad5", dir, sizeof dir);
    edit_manifest(dir, "version", cJSON_CreateNumber(2));
    expect_open_error(dir, "train", "version 2 is not supported");

    clone_good("bad6", dir, sizeof dir);
    edit_manifest(dir, "normalization.mean", cJSON_CreateDoubleArray((double[]){0.1, 0.2}, 2));
    expect_open_error(dir, "train",
                      "manifest.json: normalization.mean holds 2 entries; it must hold 1 (shared by all channels) or "
                      "one per channel (1)");
    clone_good("bad6b", dir, sizeof dir);
    edit_manifest(dir, "normalization.std", cJSON_CreateDoubleArray((double[]){0}, 1));
    expect_open_error(dir, "train", "manifest.json: normalization.std[0] must be a finite positive number");

    clone_good("bad7", dir, sizeof dir);
    edit_manifest(dir, "splits.test.y.file", cJSON_CreateString("../../etc/passwd"));
    expect_open_error(dir, "test", "splits.test.y.file must be a file name inside the dataset directory");

    clone_good("bad8", dir, sizeof dir);
    edit_manifest(dir, "splits.train.samples", cJSON_CreateNumber(11));
    expect_open_error(dir, "train", "splits.train.x.shape must be [samples, ...sample_shape] = [11, ...]");

    clone_good("bad9", dir, sizeof dir);
    edit_manifest(dir, "splits.train.x.xxh3", cJSON_CreateString("xyz"));
    expect_open_error(dir, "train", "splits.train.x.xxh3 must be a string of 16 hex digits");

    clone_good("bad10", dir, sizeof dir);
    edit_manifest(dir, "name", NULL);
    expect_open_error(dir, "train", "manifest.json: name is missing");

    /* cJSON ends a string at \u0000, so "train\u0000x" would read as "train": refused before parsing. */
    crew_manifest m;
    const char nul_name[] = "{\"format\": \"crew-dataset\", \"version\": 1, \"name\": \"a\\u0000b\"}";
    CHECK_ERR(crew_manifest_parse(nul_name, sizeof nul_name - 1, "m.json", &m),
              "m.json: line 1, column 52: a string holds \\u0000 (NUL)");
    const char nul_split[] = "{\"format\": \"crew-dataset\",\n \"splits\": {\"train\\u0000x\": {}}}";
    CHECK_ERR(crew_manifest_parse(nul_split, sizeof nul_split - 1, "m.json", &m), "m.json: line 2, column 19");
    const char raw_nul[] = "{\"format\": \"crew-\0dataset\"}";
    CHECK_ERR(crew_manifest_parse(raw_nul, sizeof raw_nul - 1, "m.json", &m), "m.json: line 1, column 18: a NUL byte");

    /* A split the manifest does not have, and one that was removed. */
    tmp_path(dir, sizeof dir, "good");
    expect_open_error(dir, "valid", "good/manifest.json has no split 'valid' (it has: train, test)");
    clone_good("bad11", dir, sizeof dir);
    edit_manifest(dir, "splits.test", NULL);
    expect_open_error(dir, "test", "has no split 'test' (it has: train)");

    clone_good("bad12", dir, sizeof dir);
    char path[256];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "wb");
    fputs("{\n  \"format\": \"crew-dataset\",\n  \"version\": 1,,\n}\n", f);
    fclose(f);
    expect_open_error(dir, "train", "manifest.json: invalid JSON at line 3");

    expect_open_error("", "train", "empty directory name");
    tmp_path(dir, sizeof dir, "nowhere");
    expect_open_error(dir, "train", "nowhere/manifest.json: cannot open: No such file or directory");
}

static void rewrite_npy(const char *dir, const char *file, crew_npy_dtype t, int ndim, const int64_t *shape, const void *data)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    CHECK_OK(crew_npy_write(path, t, ndim, shape, data));
}

static void test_bad_arrays(void)
{
    char dir[128], path[256];
    uint8_t x[12 * H * W] = {0}, y[12] = {0};

    clone_good("arr1", dir, sizeof dir); /* same bytes, another shape */
    rewrite_npy(dir, "train_x.npy", CREW_DTYPE_U8, 4, (int64_t[]){12, W, H, 1}, x);
    expect_open_error(dir, "train", "train_x.npy: shape is (12, 3, 4, 1) but manifest.json says (12, 4, 3, 1)");

    clone_good("arr2", dir, sizeof dir); /* the manifest says float32, the file holds uint8 */
    edit_manifest(dir, "splits.train.x.dtype", cJSON_CreateString("float32"));
    expect_open_error(dir, "train", "train_x.npy: dtype is uint8 but manifest.json says float32");

    clone_good("arr3", dir, sizeof dir); /* 11 labels for 12 samples */
    rewrite_npy(dir, "train_y.npy", CREW_DTYPE_U8, 1, (int64_t[]){11}, y);
    expect_open_error(dir, "train", "train_y.npy: the file is 139 bytes but manifest.json says 140");

    clone_good("arr4", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/train_x.npy", dir);
    CHECK(truncate(path, 128 + 12 * H * W - 1) == 0);
    expect_open_error(dir, "train", "train_x.npy: header says shape (12, 4, 3, 1) (144 elements of |u1) but the file holds only 143");

    clone_good("arr5", dir, sizeof dir); /* a label out of range, same file size */
    y[4] = 7;
    rewrite_npy(dir, "train_y.npy", CREW_DTYPE_U8, 1, (int64_t[]){12}, y);
    expect_open_error(dir, "train", "train_y.npy: label 7 at index 4 is outside [0, 3)");

    clone_good("arr6", dir, sizeof dir); /* one flipped pixel: opens fine, verify catches it */
    snprintf(path, sizeof path, "%s/train_x.npy", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, 128 + 17, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 128 + 17, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(dir, "train", &d));
    if (d) CHECK_ERR(crew_dataset_verify(d), "train_x.npy: content hash");
    if (d) CHECK_ERR(crew_dataset_verify(d), "does not match manifest.json's");
    crew_dataset_free(d);
}

/* Writes x [3, ...m->sample_shape] of x_dtype and y [3] (int32) into dir as x.npy and y.npy, and
 * m (name, classes, sample_shape and normalization filled in), with them as its one split, as
 * manifest.json. */
static void write_three_samples(const char *dir, crew_manifest *m, crew_npy_dtype x_dtype, const void *xs,
                                const int32_t *ys)
{
    char path[256];
    m->n_splits = 1;
    crew_manifest_split *sp = &m->splits[0];
    *sp = (crew_manifest_split){.name = "train", .samples = 3,
                                .x = {.file = "x.npy", .dtype = x_dtype, .ndim = 1 + m->sample_shape.ndim},
                                .y = {.file = "y.npy", .dtype = CREW_DTYPE_I32, .ndim = 1, .shape = {3}}};
    sp->x.shape[0] = 3;
    for (int i = 0; i < m->sample_shape.ndim; i++) sp->x.shape[1 + i] = m->sample_shape.dim[i];
    rewrite_npy(dir, "x.npy", x_dtype, sp->x.ndim, sp->x.shape, xs);
    rewrite_npy(dir, "y.npy", CREW_DTYPE_I32, 1, sp->y.shape, ys);
    snprintf(path, sizeof path, "%s/x.npy", dir);
    CHECK_OK(crew_manifest_hash_file(path, &sp->x));
    snprintf(path, sizeof path, "%s/y.npy", dir);
    CHECK_OK(crew_manifest_hash_file(path, &sp->y));
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    CHECK_OK(crew_manifest_write(path, m));
}

/* float32 samples with int32 labels, written by hand: the non-uint8 gather path. */
static void test_float_dataset(void)
{
    char dir[128];
    tmp_path(dir, sizeof dir, "floats");
    mkdir(dir, 0755);
    float xs[3 * 2 * 2] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    int32_t ys[3] = {1, 0, 1};
    crew_manifest m = {.classes = 2, .sample_shape = {2, {2, 2}}, .scale = 0.5};
    double *mean, *std;
    CHECK_OK(crew_manifest_set_channels(&m, 2, &mean, &std));
    mean[0] = 1, mean[1] = 2, std[0] = 2, std[1] = 4;
    snprintf(m.name, sizeof m.name, "floats");
    write_three_samples(dir, &m, CREW_DTYPE_F32, xs, ys);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(dir, "train", &d));
    if (!d) {
        crew_manifest_free(&m);
        return;
    }
    CHECK_OK(crew_dataset_verify(d));
    float x[4];
    int32_t y;
    crew_dataset_gather(d, (int64_t[]){2}, 1, x, &y);
    CHECK(y == 1);
    for (int k = 0; k < 4; k++) {
        double want = (xs[8 + k] * 0.5 - m.mean[k % 2]) / m.std[k % 2];
        CHECK_MSG(fabs(x[k] - want) < 1e-6, "x[%d] = %g, want %g", k, x[k], want);
    }
    crew_dataset_free(d);
    crew_manifest_free(&m);
}

/* uint8 samples with c channels of their own statistics: through tables up to
 * CREW_DATASET_LUT_CHANNELS channels, through the float32 multiply-add beyond; either way
 * (v · scale − mean[c]) / std[c]. */
static void test_u8_channels(int c)
{
    char dir[128], name[32];
    snprintf(name, sizeof name, "u8-%d", c);
    tmp_path(dir, sizeof dir, name);
    mkdir(dir, 0755);
    int64_t size = 2 * (int64_t)c;
    uint8_t *xs = malloc((size_t)(3 * size));
    float *x = malloc(sizeof *x * (size_t)size);
    crew_dataset *d = NULL;
    crew_manifest m;
    memset(&m, 0, sizeof m);
    CHECK(xs && x);
    if (xs && x) {
        for (int64_t k = 0; k < 3 * size; k++) xs[k] = (uint8_t)(k * 7 + k / 3);
        const int32_t ys[3] = {0, 1, 0};
        double *mean, *std;
        m = (crew_manifest){.classes = 2, .sample_shape = {2, {2, c}}, .scale = 1.0 / 255};
        snprintf(m.name, sizeof m.name, "u8");
        CHECK_OK(crew_manifest_set_channels(&m, c, &mean, &std));
        for (int j = 0; j < m.n_channels; j++) mean[j] = 0.25 + j % 5 * 0.1, std[j] = 0.5 + j % 3 * 0.25;
        write_three_samples(dir, &m, CREW_DTYPE_U8, xs, ys);
        CHECK_OK(crew_dataset_open(dir, "train", &d));
    }
    if (d && m.n_channels == c) {
        const double *mean = m.mean, *std = m.std;
        CHECK_MSG((d->lut != NULL) == (c <= CREW_DATASET_LUT_CHANNELS), "%d channels: table %p", c, (void *)d->lut);
        int32_t y;
        crew_dataset_gather(d, (int64_t[]){1}, 1, x, &y);
        int bad = y != 1;
        for (int64_t k = 0; k < size; k++) {
            double want = (xs[size + k] / 255.0 - mean[k % c]) / std[k % c];
            bad += fabs(x[k] - want) > 1e-6 * (1 + fabs(want));
        }
        CHECK_MSG(bad == 0, "%d channels: %d gathered values differ from (v / 255 - mean) / std", c, bad);
    }
    crew_dataset_free(d);
    crew_manifest_free(&m);
    free(xs);
    free(x);
}

/* ---------------------------------------------------------------- atomic writes */

static void test_atomic_dir(void)
{
    char out[128], file[1200], good[128];
    tmp_path(good, sizeof good, "good");
    crew_atomic_dir ad;
    CHECK_ERR(crew_atomic_dir_begin(good, &ad), "good already exists");

    tmp_path(out, sizeof out, "atomic");
    CHECK_OK(crew_atomic_dir_begin(out, &ad));
    CHECK(path_exists(ad.tmp) && strstr(ad.tmp, "atomic.tmp-") && !path_exists(out));
    CHECK_OK(crew_atomic_dir_file(&ad, "a.txt", file, sizeof file));
    FILE *f = fopen(file, "w");
    fputs("hello", f);
    fclose(f);
    crew_atomic_dir_abort(&ad);
    CHECK(temp_dirs_in(tmp_dir) == 0 && !path_exists(out));

    /* OUT appearing while the temporary directory is written: commit refuses and cleans up. */
    CHECK_OK(crew_atomic_dir_begin(out, &ad));
    CHECK_OK(crew_atomic_dir_file(&ad, "a.txt", file, sizeof file));
    f = fopen(file, "w");
    fputs("hello", f);
    fclose(f);
    mkdir(out, 0755);
    CHECK_ERR(crew_atomic_dir_commit(&ad), "atomic already exists");
    CHECK(temp_dirs_in(tmp_dir) == 0);
    rmdir(out);

    CHECK_OK(crew_atomic_dir_begin(out, &ad));
    CHECK_OK(crew_atomic_dir_file(&ad, "a.txt", file, sizeof file));
    f = fopen(file, "w");
    fputs("hello", f);
    fclose(f);
    CHECK_OK(crew_atomic_dir_commit(&ad));
    snprintf(file, sizeof file, "%s/a.txt", out);
    CHECK(path_exists(file) && temp_dirs_in(tmp_dir) == 0);
    crew_atomic_dir_abort(&ad); /* a no-op after commit */
    CHECK(path_exists(file));
}

static void test_prep_refusals(void)
{
    char img[128], lab[128], good[128], manifest[256];
    tmp_path(img, sizeof img, "imgs.gz");
    tmp_path(lab, sizeof lab, "labs.gz");
    tmp_path(good, sizeof good, "good");
    make_fixture(img, lab, 1);
    CHECK_ERR(crew_prep_idx(img, lab, NULL, NULL, good, NULL, NULL), "good already exists");
    snprintf(manifest, sizeof manifest, "%s/manifest.json", good);
    CHECK(path_exists(manifest));

    /* Fashion-MNIST's prep holds labels to its 10 classes. */
    char src[128], out[128], path[256];
    tmp_path(src, sizeof src, "fake-fashion");
    tmp_path(out, sizeof out, "fake-out");
    mkdir(src, 0755);
    labels[3] = 10;
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", src);
    write_idx_gz(path, 3, (uint32_t[]){N, H, W}, pixels, N * H * W);
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", src);
    write_idx_gz(path, 1, (uint32_t[]){N}, labels, N);
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte", src); /* uncompressed is found too */
    write_idx_gz(path, 3, (uint32_t[]){N, H, W}, pixels, N * H * W);
    snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", src);
    write_idx_gz(path, 1, (uint32_t[]){N}, labels, N);
    CHECK_ERR(crew_prep_fashion_mnist(src, out, NULL, NULL), "train-labels-idx1-ubyte.gz: label 10 at index 3 is outside [0, 10)");
    labels[3] = 0;
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", src);
    write_idx_gz(path, 1, (uint32_t[]){N}, labels, N);
    snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", src);
    write_idx_gz(path, 1, (uint32_t[]){N}, labels, N);
    CHECK_OK(crew_prep_fashion_mnist(src, out, NULL, NULL));
    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(!strcmp(m.name, "fashion-mnist") && m.classes == 10 && m.class_names && !strcmp(m.class_names[9], "Ankle boot"));
    crew_manifest_free(&m);
    CHECK(temp_dirs_in(tmp_dir) == 0);
}

/* A write failing halfway (a file-size limit makes write() fail with EFBIG): prep reports it and
 * removes its temporary directory, so no half-written dataset exists. */
static void test_prep_write_failure(void)
{
    static uint8_t big[20 * 32 * 32], lab[20];
    char img[128], labp[128], out[128];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)i;
    tmp_path(img, sizeof img, "big-imgs.gz");
    tmp_path(labp, sizeof labp, "big-labs.gz");
    tmp_path(out, sizeof out, "big-out");
    write_idx_gz(img, 3, (uint32_t[]){20, 32, 32}, big, sizeof big);
    write_idx_gz(labp, 1, (uint32_t[]){20}, lab, sizeof lab);
    struct rlimit old, small;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    small = old;
    small.rlim_cur = 4096;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    crew_status s = crew_prep_idx(img, labp, NULL, NULL, out, NULL, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    CHECK(crew_status_code(s) == CREW_CODE_IO && strstr(crew_status_message(s), "train_x.npy: write"));
    crew_status_free(s);
    CHECK(!path_exists(out) && temp_dirs_in(tmp_dir) == 0);
}

/* ---------------------------------------------------------------- the real Fashion-MNIST */

/* The sample array as the file holds it (the end of the .npy file, after its header) */
static const uint8_t *mapped_samples(const crew_dataset *d, size_t bytes)
{
    return (const uint8_t *)d->x.map + d->x.map_len - bytes;
}

/* A sample array of 2 MiB or more is read from a copy in memory of the process's own (huge pages
 * where the kernel gives them), byte for byte the file's; a small one from the mapping. */
static void test_resident_copy(void)
{
    enum { BIG = 3500, SIDE = 28 }; /* the train split 6/7 of it: 2.24 MiB of uint8 samples */
    uint8_t *px = malloc((size_t)BIG * SIDE * SIDE), *lb = malloc(BIG);
    if (!px || !lb) return;
    for (size_t i = 0; i < (size_t)BIG * SIDE * SIDE; i++) px[i] = (uint8_t)((i * 131 + i / 977) & 0xff);
    for (int i = 0; i < BIG; i++) lb[i] = (uint8_t)(i % 10);
    char img[128], lab[128], out[128];
    tmp_path(img, sizeof img, "big_imgs.gz");
    tmp_path(lab, sizeof lab, "big_labs.gz");
    tmp_path(out, sizeof out, "big");
    write_idx_gz(img, 3, (uint32_t[]){BIG, SIDE, SIDE}, px, (size_t)BIG * SIDE * SIDE);
    write_idx_gz(lab, 1, (uint32_t[]){BIG}, lb, BIG);
    CHECK_OK(crew_prep_idx(img, lab, NULL, NULL, out, NULL, NULL));
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &d));
    if (d) {
        const int64_t n = d->n;
        const size_t bytes = (size_t)n * SIDE * SIDE;
        CHECK(n == BIG - BIG / 7);
        CHECK_MSG(d->x_resident != NULL && d->x.data == d->x_resident && d->x_resident_len >= bytes,
                  "a %zu-byte sample array is read from a copy", bytes);
        CHECK(crew_dataset_memory_bytes(d) == (int64_t)d->x_resident_len); /* what the memory planner counts */
        CHECK(memcmp(d->x.data, px, bytes) == 0 && memcmp(mapped_samples(d, bytes), px, bytes) == 0);
        float x[2 * SIDE * SIDE];
        int32_t y[2];
        crew_dataset_gather(d, (int64_t[]){n - 1, 7}, 2, x, y);
        int same = y[0] == lb[n - 1] && y[1] == lb[7];
        for (int k = 0; k < SIDE * SIDE; k++)
            same &= x[k] == d->lut[px[(size_t)(n - 1) * SIDE * SIDE + k]] &&
                    x[SIDE * SIDE + k] == d->lut[px[(size_t)7 * SIDE * SIDE + k]];
        CHECK_MSG(same, "the copy's samples gather as the file's");
        CHECK_OK(crew_dataset_verify(d)); /* the hash reads the file */
        crew_dataset_free(d);
    }
    crew_dataset *small = NULL; /* the fixture of the other tests: a few hundred bytes */
    tmp_path(out, sizeof out, "good");
    CHECK_OK(crew_dataset_open(out, "train", &small));
    CHECK(small && small->x_resident == NULL && crew_dataset_memory_bytes(small) == 0);
    crew_dataset_free(small);
    free(px);
    free(lb);
}

static void test_fashion_mnist(void)
{
    if (!path_exists(FASHION_DIR "/train-images-idx3-ubyte.gz")) {
        printf("note: %s is absent; skipping the Fashion-MNIST test\n", FASHION_DIR);
        return;
    }
    char out[128];
    tmp_path(out, sizeof out, "fashion");
    CHECK_OK(crew_prep_fashion_mnist(FASHION_DIR, out, NULL, NULL));
    crew_dataset *train = NULL, *test = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &train));
    CHECK_OK(crew_dataset_open(out, "test", &test));
    if (!train || !test) return;
    CHECK(crew_dataset_size(train) == 60000 && crew_dataset_size(test) == 10000 && crew_dataset_classes(train) == 10);
    int64_t shape[4];
    CHECK(crew_dataset_sample_shape(train, shape) == 3 && shape[0] == 28 && shape[1] == 28 && shape[2] == 1);
    int64_t count[2][10] = {{0}};
    const crew_dataset *ds[2] = {train, test};
    for (int s = 0; s < 2; s++)
        for (int64_t i = 0; i < ds[s]->n; i++) count[s][((const uint8_t *)ds[s]->y.data)[i]]++;
    for (int c = 0; c < 10; c++) CHECK_MSG(count[0][c] == 6000 && count[1][c] == 1000, "class %d: %lld/%lld", c,
                                           (long long)count[0][c], (long long)count[1][c]);
    /* The well-known statistics of Fashion-MNIST's training images. */
    CHECK_MSG(fabs(train->mean[0] - 0.2860) < 1e-3 && fabs(train->std[0] - 0.3530) < 1e-3, "mean %g std %g",
              train->mean[0], train->std[0]);
    CHECK_OK(crew_dataset_verify(train));
    const size_t bytes = (size_t)60000 * 28 * 28; /* 45 MiB: read from the copy, the file's bytes */
    CHECK(train->x_resident != NULL && memcmp(train->x.data, mapped_samples(train, bytes), bytes) == 0);
    crew_dataset_free(train);
    crew_dataset_free(test);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew_test_dataset_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_prep_and_gather(1);
    test_prep_and_gather(3);
    test_prep_with_test_files();
    char img[128], lab[128], good[128];
    tmp_path(img, sizeof img, "imgs.gz");
    tmp_path(lab, sizeof lab, "labs.gz");
    tmp_path(good, sizeof good, "good");
    make_fixture(img, lab, 1);
    CHECK_OK(crew_prep_idx(img, lab, NULL, NULL, good, NULL, NULL));
    test_bad_manifests();
    test_bad_arrays();
    test_float_dataset();
    test_u8_channels(3);
    test_u8_channels(20);
    test_u8_channels(CREW_DATASET_LUT_CHANNELS + 1);
    test_atomic_dir();
    test_prep_refusals();
    test_prep_write_failure();
    test_resident_copy();
    test_fashion_mnist();
    CHECK(temp_dirs_in(tmp_dir) == 0);
    nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
