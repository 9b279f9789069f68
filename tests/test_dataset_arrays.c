/* test_dataset_arrays.c — datasets over arrays in memory (crew_dataset_from_arrays), the dataset
 * directories crew prep arrays writes from them (crew_prep_arrays, crew_prep_npy), and a model's
 * tensors read and written in memory (crew_model_get_tensors / crew_model_set_tensors):
 *  - gathering a batch gives the values as they are, uint8 and float32;
 *  - every bad input is refused with a message naming what is wrong (NULL, dtype, no samples,
 *    axes, a NaN or an infinity and where, a label out of range and which);
 *  - a directory written by crew_prep_arrays gathers the same values, and a model trained on it
 *    ends with the weights of one trained on the arrays, bit for bit (2 replicas), with the test
 *    split given or drawn by a fraction;
 *  - crew_prep_npy reads .npy files, int64 labels included, and refuses what it cannot take;
 *  - tensors set from memory, saved and loaded back, and read again are the same values. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "data/dataset.h"
#include "data/npy.h"

enum { N = 96, SIDE = 6, CLASSES = 3 };

static char tmp_dir[] = "/tmp/crew-test-arrays-XXXXXX";

static void tmp_path(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", tmp_dir, name); }

/* Samples whose class is where their bright pixel is, so that a model learns something. */
static void make_arrays(uint8_t *x8, float *xf, int32_t *y, int n, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < n; i++) {
        y[i] = rand() % CLASSES;
        for (int p = 0; p < SIDE * SIDE; p++) {
            uint8_t v = (uint8_t)(rand() % 50);
            if (p == y[i] * 7 + 3) v = 250;
            if (x8) x8[i * SIDE * SIDE + p] = v;
            if (xf) xf[i * SIDE * SIDE + p] = (float)v / 255.0f - 0.25f;
        }
    }
}

static const int64_t shape[3] = {SIDE, SIDE, 1};

static crew_arrays arrays_of(const void *x, int x_type, const int32_t *y, int64_t n)
{
    return (crew_arrays){.x = x, .x_type = x_type, .sample_shape = shape, .sample_ndim = 3, .y = y,
                         .y_type = CREW_ARRAY_I32, .n = n, .classes = CLASSES, .name = "x"};
}

static void test_gather(void)
{
    static uint8_t x8[N * SIDE * SIDE];
    static float xf[N * SIDE * SIDE];
    static int32_t y[N];
    make_arrays(x8, xf, y, N, 1);
    for (int t = 0; t < 2; t++) {
        crew_arrays a = arrays_of(t ? (const void *)xf : x8, t ? CREW_ARRAY_F32 : CREW_ARRAY_U8, y, N);
        crew_dataset *d = NULL;
        CHECK_OK(crew_dataset_from_arrays(&a, &d));
        if (!d) continue;
        CHECK(crew_dataset_size(d) == N && crew_dataset_classes(d) == CLASSES);
        int64_t s[4];
        CHECK(crew_dataset_sample_shape(d, s) == 3 && s[0] == SIDE && s[1] == SIDE && s[2] == 1);
        int64_t idx[3] = {5, 0, N - 1};
        float got[3 * SIDE * SIDE];
        int32_t labels[3];
        crew_dataset_gather(d, idx, 3, got, labels);
        int same = 1;
        for (int i = 0; i < 3; i++) {
            same &= labels[i] == y[idx[i]];
            for (int p = 0; p < SIDE * SIDE; p++) {
                float want = t ? xf[idx[i] * SIDE * SIDE + p] : (float)x8[idx[i] * SIDE * SIDE + p];
                same &= memcmp(&got[i * SIDE * SIDE + p], &want, 4) == 0;
            }
        }
        CHECK_MSG(same, "%s samples are gathered as they are", t ? "float32" : "uint8");
        CHECK_OK(crew_dataset_verify(d)); /* nothing to hash: no files */
        crew_dataset_free(d);
    }
}

static void expect_refused(crew_arrays a, const char *needle)
{
    crew_dataset *d = NULL;
    CHECK_ERR(crew_dataset_from_arrays(&a, &d), needle);
    CHECK(d == NULL);
}

static void test_bad_arrays(void)
{
    static float xf[N * SIDE * SIDE];
    static int32_t y[N];
    make_arrays(NULL, xf, y, N, 2);
    crew_arrays good = arrays_of(xf, CREW_ARRAY_F32, y, N);
    crew_arrays a = good;
    a.x = NULL;
    expect_refused(a, "NULL array");
    a = good, a.x_type = CREW_ARRAY_I32;
    expect_refused(a, "must be uint8 or float32");
    a = good, a.y_type = CREW_ARRAY_F32;
    expect_refused(a, "labels must be uint8 or int32");
    a = good, a.n = 0;
    expect_refused(a, "x: no samples");
    a = good, a.sample_ndim = 4;
    expect_refused(a, "samples of 4 axes");
    a = good, a.classes = 0;
    expect_refused(a, "0 classes");
    a = good, a.sample_shape = (int64_t[]){SIDE, 0, 1};
    expect_refused(a, "axis 2 of a sample has 0 values");
    xf[7 * SIDE * SIDE + 11] = NAN;
    expect_refused(good, "x: sample 7 holds NaN at value 11 (of 36 per sample)");
    xf[7 * SIDE * SIDE + 11] = 0.5f;
    xf[N * SIDE * SIDE - 1] = -INFINITY;
    expect_refused(good, "sample 95 holds an infinity at value 35");
    xf[N * SIDE * SIDE - 1] = 0.5f;
    y[40] = CLASSES;
    expect_refused(good, "x: label 3 of sample 40 is outside [0, 3)");
    y[40] = -1;
    expect_refused(good, "label -1 of sample 40");
    y[40] = 0;
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_from_arrays(&good, &d)); /* mended, the same arrays are taken */
    crew_dataset_free(d);
    CHECK_ERR(crew_dataset_from_arrays(NULL, &d), "NULL argument");
}

static crew_model *small_model(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SIDE, SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 3, .kernel = {3, 3},
                                                  .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_BATCH_NORM}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = CLASSES}));
    crew_compile_options c;
    crew_model_default_compile(m, &c);
    CHECK_OK(crew_model_compile(m, &c));
    return m;
}

/* Every tensor of m, one after another, in a fresh host array (free it); *count: the floats. */
static float *all_tensors(const crew_model *m, int64_t *count)
{
    int n = crew_model_tensor_count(m);
    int64_t total = 0, sizes[64];
    for (int i = 0; i < n && i < 64; i++) {
        int64_t s[8], c = 1;
        int nd = crew_model_tensor_info(m, i, NULL, 0, s);
        for (int k = 0; k < nd; k++) c *= s[k];
        sizes[i] = c;
        total += c;
    }
    float *all = calloc((size_t)total + 1, sizeof *all), *at[64];
    int64_t off = 0;
    for (int i = 0; i < n && i < 64; i++) at[i] = all + off, off += sizes[i];
    CHECK_OK(crew_model_get_tensors(m, at));
    *count = total;
    return all;
}

/* 2 replicas for 6 steps on d (test split t) from seed 3: the trained tensors (free them). */
static float *train_on(const crew_dataset *d, const crew_dataset *t, int64_t *count)
{
    crew_model *m = small_model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = 2;
    o.batch_per_device = 8;
    o.max_steps = 6;
    o.epochs = 2;
    o.seed = 3;
    o.test = t;
    crew_fit_result r;
    CHECK_OK(crew_model_fit(m, d, &o, &r));
    float *v = all_tensors(m, count);
    crew_model_free(m);
    return v;
}

static void check_same_training(const crew_dataset *a, const crew_dataset *b, const char *what)
{
    int64_t na = 0, nb = 0;
    float *va = train_on(a, NULL, &na), *vb = train_on(b, NULL, &nb);
    CHECK_MSG(na == nb && na > 0 && memcmp(va, vb, (size_t)na * sizeof *va) == 0,
              "%s: the weights differ from those trained on the arrays in memory", what);
    free(va);
    free(vb);
}

static void test_prep_arrays(void)
{
    static uint8_t x8[N * SIDE * SIDE], t8[N / 4 * SIDE * SIDE];
    static int32_t y[N], ty[N / 4];
    make_arrays(x8, NULL, y, N, 3);
    make_arrays(t8, NULL, ty, N / 4, 4);
    crew_arrays a = arrays_of(x8, CREW_ARRAY_U8, y, N), t = arrays_of(t8, CREW_ARRAY_U8, ty, N / 4);
    char dir[512], frac[512], only[512];
    tmp_path(dir, sizeof dir, "with-test");
    tmp_path(frac, sizeof frac, "fraction");
    tmp_path(only, sizeof only, "train-only");
    CHECK_OK(crew_prep_arrays(&a, &t, 0.0, 0, dir, NULL, NULL));
    CHECK_OK(crew_prep_arrays(&a, NULL, 0.25, 7, frac, NULL, NULL));
    CHECK_OK(crew_prep_arrays(&a, NULL, 0.0, 0, only, NULL, NULL));
    crew_dataset *mem = NULL, *disk = NULL, *disk_test = NULL, *fr = NULL, *fr_test = NULL, *tr = NULL, *none = NULL;
    CHECK_OK(crew_dataset_from_arrays(&a, &mem));
    CHECK_OK(crew_dataset_open(dir, "train", &disk));
    CHECK_OK(crew_dataset_open(dir, "test", &disk_test));
    CHECK_OK(crew_dataset_open(frac, "train", &fr));
    CHECK_OK(crew_dataset_open(frac, "test", &fr_test));
    CHECK_OK(crew_dataset_open(only, "train", &tr));
    CHECK_ERR(crew_dataset_open(only, "test", &none), "has no split 'test'");
    if (mem && disk && disk_test && fr && fr_test && tr) {
        CHECK(crew_dataset_size(disk) == N && crew_dataset_size(disk_test) == N / 4 && crew_dataset_classes(disk) == CLASSES);
        CHECK_MSG(crew_dataset_size(fr) + crew_dataset_size(fr_test) == N && crew_dataset_size(fr_test) > 0,
                  "the fraction split: %lld + %lld", (long long)crew_dataset_size(fr), (long long)crew_dataset_size(fr_test));
        CHECK_OK(crew_dataset_verify(disk));
        check_same_training(mem, disk, "crew_prep_arrays with test arrays");
        check_same_training(mem, tr, "crew_prep_arrays without a test split");
    }
    crew_dataset_free(mem);
    crew_dataset_free(disk);
    crew_dataset_free(disk_test);
    crew_dataset_free(fr);
    crew_dataset_free(fr_test);
    crew_dataset_free(tr);
    /* refusals: the directory exists; both a test split and a fraction; a test of another shape */
    CHECK_ERR(crew_prep_arrays(&a, &t, 0.0, 0, dir, NULL, NULL), "exists");
    tmp_path(dir, sizeof dir, "refused");
    CHECK_ERR(crew_prep_arrays(&a, &t, 0.5, 0, dir, NULL, NULL), "not both");
    crew_arrays other = t;
    other.sample_shape = (int64_t[]){SIDE * SIDE};
    other.sample_ndim = 1;
    CHECK_ERR(crew_prep_arrays(&a, &other, 0.0, 0, dir, NULL, NULL), "must have the training ones' shape and dtypes");
    ty[3] = CLASSES + 2;
    CHECK_ERR(crew_prep_arrays(&a, &t, 0.0, 0, dir, NULL, NULL), "label 5 of sample 3 is outside [0, 3)");
    struct stat sb;
    CHECK_MSG(stat(dir, &sb) != 0, "a refused prep left %s behind", dir);
}

static void write_npy(const char *name, crew_npy_dtype t, int ndim, const int64_t *dims, const void *data, char *path,
                      size_t len)
{
    tmp_path(path, len, name);
    CHECK_OK(crew_npy_write(path, t, ndim, dims, data));
}

static void test_prep_npy(void)
{
    static float xf[N * SIDE * SIDE];
    static int32_t y[N];
    static int64_t y64[N];
    make_arrays(NULL, xf, y, N, 5);
    for (int i = 0; i < N; i++) y64[i] = y[i];
    char x_path[512], y_path[512], bad_path[512], short_path[512], out[512];
    write_npy("x.npy", CREW_DTYPE_F32, 4, (int64_t[]){N, SIDE, SIDE, 1}, xf, x_path, sizeof x_path);
    write_npy("y.npy", CREW_DTYPE_I64, 1, (int64_t[]){N}, y64, y_path, sizeof y_path);
    tmp_path(out, sizeof out, "from-npy");
    CHECK_OK(crew_prep_npy(x_path, y_path, NULL, NULL, 0.2, 1, out, NULL, NULL));
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, "test", &d));
    CHECK(d && crew_dataset_classes(d) == CLASSES);
    crew_dataset_free(d);
    tmp_path(out, sizeof out, "npy-refused");
    y64[9] = -4;
    write_npy("y-neg.npy", CREW_DTYPE_I64, 1, (int64_t[]){N}, y64, bad_path, sizeof bad_path);
    CHECK_ERR(crew_prep_npy(x_path, bad_path, NULL, NULL, 0.0, 0, out, NULL, NULL), "label -4 of sample 9 is not a class index");
    write_npy("y-short.npy", CREW_DTYPE_I32, 1, (int64_t[]){N - 1}, y, short_path, sizeof short_path);
    CHECK_ERR(crew_prep_npy(x_path, short_path, NULL, NULL, 0.0, 0, out, NULL, NULL), "one array of 96 values");
    write_npy("x-i32.npy", CREW_DTYPE_I32, 2, (int64_t[]){N, 1}, y, bad_path, sizeof bad_path);
    CHECK_ERR(crew_prep_npy(bad_path, y_path, NULL, NULL, 0.0, 0, out, NULL, NULL), "the samples are int32");
    write_npy("x-flat.npy", CREW_DTYPE_F32, 1, (int64_t[]){N}, xf, bad_path, sizeof bad_path);
    CHECK_ERR(crew_prep_npy(bad_path, y_path, NULL, NULL, 0.0, 0, out, NULL, NULL), "an array of 1 axes");
    CHECK_ERR(crew_prep_npy(x_path, y_path, x_path, NULL, 0.0, 0, out, NULL, NULL), "go together");
    tmp_path(bad_path, sizeof bad_path, "missing.npy");
    CHECK_ERR(crew_prep_npy(bad_path, y_path, NULL, NULL, 0.0, 0, out, NULL, NULL), "missing.npy");
}

static void test_tensors(void)
{
    crew_model *m = small_model(), *back = small_model();
    if (!m || !back) return;
    int n = crew_model_tensor_count(m);
    CHECK_MSG(n == 8, "conv kernel and bias, batch norm's four, dense kernel and bias: %d", n);
    char name[128];
    int64_t s[8];
    CHECK(crew_model_tensor_info(m, 0, name, sizeof name, s) == 4 && !strcmp(name, "conv2d.kernel") && s[0] == 3 &&
          s[3] == 3);
    CHECK(crew_model_tensor_info(m, 5, name, sizeof name, s) == 1 && !strcmp(name, "batch_normalization.moving_variance"));
    CHECK(crew_model_tensor_info(m, n, name, sizeof name, s) == 0);
    float *none[8] = {0};
    CHECK_ERR(crew_model_get_tensors(m, none), "no weights to read yet");
    int64_t total = 0;
    float *values[8], *all;
    for (int i = 0; i < n; i++) {
        int64_t c = 1;
        int nd = crew_model_tensor_info(m, i, NULL, 0, s);
        for (int k = 0; k < nd; k++) c *= s[k];
        total += c;
    }
    all = malloc((size_t)total * sizeof *all);
    for (int64_t k = 0; k < total; k++) all[k] = (float)k / 7.0f - 3.0f;
    for (int i = 0, off = 0; i < n; i++) {
        int64_t c = 1;
        int nd = crew_model_tensor_info(m, i, NULL, 0, s);
        for (int k = 0; k < nd; k++) c *= s[k];
        values[i] = all + off;
        off += (int)c;
    }
    CHECK_ERR(crew_model_set_tensors(m, (const float *const *)none), "no values for 'conv2d.kernel'");
    CHECK_OK(crew_model_set_tensors(m, (const float *const *)values));
    char path[512];
    tmp_path(path, sizeof path, "tensors.safetensors");
    CHECK_OK(crew_model_save_weights(m, path));
    CHECK_OK(crew_model_load_weights(back, path));
    int64_t count = 0;
    float *read = all_tensors(back, &count);
    CHECK_MSG(count == total && memcmp(read, all, (size_t)total * sizeof *all) == 0,
              "set, saved, loaded and read again: the same values");
    free(read);
    free(all);
    crew_model_free(m);
    crew_model_free(back);
}

int main(void)
{
    if (!mkdtemp(tmp_dir)) return 1;
    test_gather();
    test_bad_arrays();
    test_prep_arrays();
    test_prep_npy();
    test_tensors();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return check_report();
}
