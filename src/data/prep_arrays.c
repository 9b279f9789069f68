/* prep_arrays.c — crew prep arrays: a dataset directory from arrays (NumPy's .npy files, or a
 * program's memory), written as they are.
 *
 * The samples keep their values: the manifest's normalisation is scale 1, mean 0, std 1, so a
 * model trained on the directory sees what one trained on the arrays in memory sees
 * (crew_dataset_from_arrays), bit for bit, and what Keras's fit sees. The arrays are checked as
 * crew_dataset_from_arrays checks them (every label in range, every float32 value finite). */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "data/dataset.h"
#include "data/prep_common.h"

/* The test split and the train split's rest, copied out of `a` by a stratified split. */
typedef struct split_copy {
    uint8_t *x, *xt;            /* [n − n_test] and [n_test] samples */
    int32_t *y, *yt;            /* their labels, as int32 */
    int64_t n_test;
} split_copy;

static crew_status split_arrays(const crew_arrays *a, double fraction, uint64_t seed, split_copy *c)
{
    int64_t sample = a->x_type == CREW_ARRAY_U8 ? 1 : 4;
    for (int i = 0; i < a->sample_ndim; i++) sample *= a->sample_shape[i];
    uint8_t *is_test = malloc((size_t)a->n);
    c->x = malloc((size_t)(a->n * sample));
    c->y = malloc((size_t)a->n * sizeof *c->y);
    crew_status s = is_test && c->x && c->y ? CREW_OK : CREW_OOM();
    for (int64_t i = 0; !s && i < a->n; i++)
        c->y[i] = a->y_type == CREW_ARRAY_U8 ? ((const uint8_t *)a->y)[i] : ((const int32_t *)a->y)[i];
    if (!s) s = crew_prep_split(c->y, a->n, a->classes, fraction, seed, a->name ? a->name : "arrays", is_test);
    for (int64_t i = 0; !s && i < a->n; i++) c->n_test += is_test[i];
    if (!s && (!(c->xt = malloc((size_t)(c->n_test * sample))) || !(c->yt = malloc((size_t)c->n_test * 4))))
        s = CREW_OOM();
    if (!s) {
        memcpy(c->x, a->x, (size_t)(a->n * sample));
        crew_prep_partition(c->x, sample, (uint8_t *)c->y, 4, is_test, a->n, c->xt, (uint8_t *)c->yt);
    }
    free(is_test);
    return s;
}

static crew_status same_kind(const crew_arrays *a, const crew_arrays *b)
{
    int same = a->x_type == b->x_type && a->y_type == b->y_type && a->sample_ndim == b->sample_ndim;
    for (int i = 0; same && i < a->sample_ndim; i++) same = a->sample_shape[i] == b->sample_shape[i];
    if (!same)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s and %s: the test samples and labels must have the training ones' "
                           "shape and dtypes", a->name ? a->name : "train", b->name ? b->name : "test");
    return CREW_OK;
}

/* The manifest's name: the arrays' name without folders or ".npy" ("data/fm_x.npy": "fm_x"), in
 * the characters of a file name; "arrays" when nothing is left. */
static void dataset_name(const char *from, char *out, size_t len)
{
    const char *base = from && strrchr(from, '/') ? strrchr(from, '/') + 1 : from ? from : "";
    size_t n = strlen(base), k = 0;
    if (n >= 4 && !strcmp(base + n - 4, ".npy")) n -= 4;
    for (size_t i = 0; i < n && k + 1 < len; i++)
        if (strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-", base[i]) && base[i]) out[k++] = base[i];
    out[k] = '\0';
    if (!k) snprintf(out, len, "arrays");
}

crew_status crew_prep_arrays(const crew_arrays *train, const crew_arrays *test, double test_fraction, uint64_t seed,
                             const char *out_dir, crew_progress_fn progress, void *user)
{
    if (!train || !out_dir) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_arrays: NULL argument");
    if (test && test_fraction > 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "give test arrays or a test fraction, not both");
    if (!(test_fraction >= 0 && test_fraction < 1))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the test fraction must be in [0, 1), not %g", test_fraction);
    /* Every check of the arrays a dataset over them makes. */
    crew_dataset *check = NULL;
    CREW_TRY(crew_dataset_from_arrays(train, &check));
    crew_dataset_free(check);
    if (test) {
        CREW_TRY(same_kind(train, test));
        crew_arrays t = *test;
        t.classes = train->classes;
        CREW_TRY(crew_dataset_from_arrays(&t, &check));
        crew_dataset_free(check);
    }
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    const int split = !test && test_fraction > 0, n_splits = test || split ? 2 : 1;
    crew_prep_progress pr = {.fn = progress, .user = user, .total = 2 * n_splits + 1 + split};
    split_copy c = {0};
    crew_status s = CREW_OK;
    if (split) {
        crew_prep_tick(&pr, "the test split");
        s = split_arrays(train, test_fraction, seed, &c);
    }
    crew_manifest m;
    memset(&m, 0, sizeof m);
    double *mean, *std;
    if (!s) s = crew_manifest_set_channels(&m, 1, &mean, &std);
    if (!s) {
        mean[0] = 0.0, std[0] = 1.0, m.scale = 1.0;
        dataset_name(train->name, m.name, sizeof m.name);
        m.classes = train->classes;
        m.sample_shape.ndim = train->sample_ndim;
        for (int i = 0; i < train->sample_ndim; i++) m.sample_shape.dim[i] = train->sample_shape[i];
        crew_prep_split_data d[2] = {{"train", train->n, train->x, train->y}};
        if (test) d[1] = (crew_prep_split_data){"test", test->n, test->x, test->y};
        if (split) d[0] = (crew_prep_split_data){"train", train->n - c.n_test, c.x, c.y},
                   d[1] = (crew_prep_split_data){"test", c.n_test, c.xt, c.yt};
        /* a split's labels were copied as int32 */
        const crew_npy_dtype y_dtype = !split && train->y_type == CREW_ARRAY_U8 ? CREW_DTYPE_U8 : CREW_DTYPE_I32;
        s = crew_prep_write(out_dir, &m, train->x_type == CREW_ARRAY_U8 ? CREW_DTYPE_U8 : CREW_DTYPE_F32, y_dtype, d,
                            n_splits, &pr);
    }
    if (!s) crew_prep_done(&pr);
    crew_manifest_free(&m);
    free(c.x);
    free(c.xt);
    free(c.y);
    free(c.yt);
    return s;
}

/* ------------------------------------------------------------------ from .npy files */

/* One pair of .npy files as arrays: x uint8 or float32 [n, sample...], y [n] uint8, int32 or
 * int64 (NumPy's default integer, copied into *y32 as int32 when every label fits). */
typedef struct npy_pair {
    crew_npy x, y;
    int32_t *y32;
    crew_arrays a;
} npy_pair;

static crew_status open_pair(const char *x_path, const char *y_path, npy_pair *p)
{
    CREW_TRY(crew_npy_open(x_path, &p->x));
    CREW_TRY(crew_npy_open(y_path, &p->y));
    if (p->x.dtype != CREW_DTYPE_U8 && p->x.dtype != CREW_DTYPE_F32)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the samples are %s; crew takes uint8 or float32", x_path,
                           crew_npy_dtype_name(p->x.dtype));
    if (p->x.ndim < 2 || p->x.ndim > CREW_MAX_DIMS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: an array of %d axes; crew takes [samples, ...] with 1 to %d axes "
                           "a sample", x_path, p->x.ndim, CREW_MAX_DIMS - 1);
    if (p->y.ndim != 1 || p->y.shape[0] != p->x.shape[0])
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the labels must be one array of %lld values, one a sample of %s",
                           y_path, (long long)p->x.shape[0], x_path);
    if (p->y.dtype == CREW_DTYPE_I64) {
        if (!(p->y32 = malloc((size_t)(p->y.count ? p->y.count : 1) * sizeof *p->y32))) return CREW_OOM();
        for (int64_t i = 0; i < p->y.count; i++) {
            int64_t v;
            memcpy(&v, (const char *)p->y.data + 8 * i, 8);
            if (v < 0 || v > INT32_MAX)
                return crew_errorf(CREW_CODE_BAD_INPUT, "%s: label %lld of sample %lld is not a class index", y_path,
                                   (long long)v, (long long)i);
            p->y32[i] = (int32_t)v;
        }
    } else if (p->y.dtype != CREW_DTYPE_U8 && p->y.dtype != CREW_DTYPE_I32) {
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the labels are %s; crew takes uint8, int32 or int64", y_path,
                           crew_npy_dtype_name(p->y.dtype));
    }
    p->a = (crew_arrays){.x = p->x.data, .x_type = p->x.dtype == CREW_DTYPE_U8 ? CREW_ARRAY_U8 : CREW_ARRAY_F32,
                         .sample_shape = p->x.shape + 1, .sample_ndim = p->x.ndim - 1,
                         .y = p->y32 ? (const void *)p->y32 : p->y.data,
                         .y_type = p->y.dtype == CREW_DTYPE_U8 ? CREW_ARRAY_U8 : CREW_ARRAY_I32, .n = p->x.shape[0],
                         .name = x_path};
    return CREW_OK;
}

static void close_pair(npy_pair *p)
{
    crew_npy_close(&p->x);
    crew_npy_close(&p->y);
    free(p->y32);
}

/* The classes: one more than the largest label (negative ones are the dataset's check to report). */
static int classes_of(const crew_arrays *a)
{
    int32_t top = 0;
    for (int64_t i = 0; i < a->n; i++) {
        int32_t v = a->y_type == CREW_ARRAY_U8 ? ((const uint8_t *)a->y)[i] : ((const int32_t *)a->y)[i];
        if (v > top) top = v;
    }
    return top < (1 << 24) ? top + 1 : 1 << 24;
}

crew_status crew_prep_npy(const char *x, const char *y, const char *test_x, const char *test_y, double test_fraction,
                          uint64_t seed, const char *out_dir, crew_progress_fn progress, void *user)
{
    if (!x || !y || !out_dir || !test_x != !test_y)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_npy: x, y and out_dir are required, and test_x and "
                                                       "test_y go together");
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    npy_pair train = {0}, test = {0};
    crew_status s = open_pair(x, y, &train);
    if (!s && test_x) s = open_pair(test_x, test_y, &test);
    if (!s) {
        train.a.classes = classes_of(&train.a);
        if (test_x && classes_of(&test.a) > train.a.classes) train.a.classes = classes_of(&test.a);
        s = crew_prep_arrays(&train.a, test_x ? &test.a : NULL, test_fraction, seed, out_dir, progress, user);
    }
    close_pair(&train);
    close_pair(&test);
    return s;
}
