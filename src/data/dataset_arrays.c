/* dataset_arrays.c — a dataset over arrays the caller holds in memory (crew_dataset_from_arrays):
 * NumPy arrays from Python, or anything a C program has at hand, read where they are.
 *
 * The dataset borrows the arrays: it reads them for as long as it lives and never writes or frees
 * them. Their values reach the model as they are (scale 1, mean 0, std 1), which is what Keras's
 * fit does with arrays; `crew prep arrays` writes the same statistics into a dataset directory,
 * so the two train to the same bits. Opening checks what a dataset directory's opening checks
 * (shapes, every label) and more, since no crew prep stood before it: every float32 value must be
 * finite, and the name of the sample that is not is in the error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "data/dataset.h"

static crew_status check_arrays(const crew_arrays *a, const char *name)
{
    if (!a->x || !a->y || !a->sample_shape)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: crew_dataset_from_arrays: NULL array", name);
    if (a->x_type != CREW_ARRAY_U8 && a->x_type != CREW_ARRAY_F32)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the samples must be uint8 or float32", name);
    if (a->y_type != CREW_ARRAY_U8 && a->y_type != CREW_ARRAY_I32)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the labels must be uint8 or int32", name);
    if (a->n < 1) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: no samples", name);
    if (a->classes < 1 || a->classes > (1 << 24))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %d classes (1 to %d)", name, a->classes, 1 << 24);
    if (a->sample_ndim < 1 || a->sample_ndim > CREW_MAX_DIMS - 1)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: samples of %d axes (crew takes 1 to %d)", name, a->sample_ndim,
                           CREW_MAX_DIMS - 1);
    int64_t size = 1;
    for (int i = 0; i < a->sample_ndim; i++) {
        if (a->sample_shape[i] < 1 || a->sample_shape[i] > ((int64_t)1 << 28) / size)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: axis %d of a sample has %lld values", name, i + 1,
                               (long long)a->sample_shape[i]);
        size *= a->sample_shape[i];
    }
    if (a->n > INT64_MAX / 4 / size) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: too many samples", name);
    return CREW_OK;
}

/* "sample 12, value 40 (of 784)": where a float32 sample holds a NaN or an infinity. */
static crew_status check_finite(const crew_dataset *d, const char *name)
{
    const int64_t size = crew_shape_size(&d->sample);
    const float *x = d->x.data;
    for (int64_t i = 0; i < d->n; i++) {
        const float *s = x + i * size;
        float sum = 0.0f; /* NaN or ±inf anywhere makes the sum non-finite: one test per sample */
        for (int64_t k = 0; k < size; k++) sum += s[k] * 0.0f;
        if (sum == 0.0f) continue;
        for (int64_t k = 0; k < size; k++)
            if (!isfinite(s[k]))
                return crew_errorf(CREW_CODE_BAD_INPUT, "%s: sample %lld holds %s at value %lld (of %lld per sample)",
                                   name, (long long)i, isnan(s[k]) ? "NaN" : "an infinity", (long long)k,
                                   (long long)size);
    }
    return CREW_OK;
}

static crew_status check_labels(const crew_dataset *d, const char *name)
{
    for (int64_t i = 0; i < d->n; i++) {
        int64_t v = d->y.dtype == CREW_DTYPE_U8 ? ((const uint8_t *)d->y.data)[i] : ((const int32_t *)d->y.data)[i];
        if (v < 0 || v >= d->classes)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: label %lld of sample %lld is outside [0, %d)", name,
                               (long long)v, (long long)i, d->classes);
    }
    return CREW_OK;
}

/* Normalisation that changes nothing: scale 1, one channel of mean 0 and std 1 (a table of the
 * 256 values themselves for uint8 samples). */
static crew_status set_identity(crew_dataset *d)
{
    const int lut = d->x.dtype == CREW_DTYPE_U8;
    if (!(d->norm = malloc(sizeof *d->norm * (lut ? 4 + 256 : 4)))) return CREW_OOM();
    d->scale = 1.0f;
    d->n_channels = 1;
    d->mean = d->norm;
    d->std = d->mean + 1;
    d->mul = d->std + 1;
    d->add = d->mul + 1;
    d->lut = lut ? d->add + 1 : NULL;
    d->mean[0] = 0.0f, d->std[0] = 1.0f, d->mul[0] = 1.0f, d->add[0] = 0.0f;
    for (int v = 0; lut && v < 256; v++) d->lut[v] = (float)v;
    return CREW_OK;
}

crew_status crew_dataset_from_arrays(const crew_arrays *a, crew_dataset **out)
{
    if (!a || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_dataset_from_arrays: NULL argument");
    *out = NULL;
    const char *name = a->name && *a->name ? a->name : "arrays";
    CREW_TRY(check_arrays(a, name));
    crew_dataset *d = calloc(1, sizeof *d);
    if (!d) return CREW_OOM();
    snprintf(d->dir, sizeof d->dir, "%s", name);
    snprintf(d->split, sizeof d->split, "arrays");
    snprintf(d->name, sizeof d->name, "%s", name);
    snprintf(d->x_file, sizeof d->x_file, "x");
    snprintf(d->y_file, sizeof d->y_file, "y");
    d->n = a->n;
    d->classes = a->classes;
    d->label_positions = 1;
    d->sample.ndim = a->sample_ndim;
    for (int i = 0; i < a->sample_ndim; i++) d->sample.dim[i] = a->sample_shape[i];
    /* The arrays as crew_npy views without a mapping: crew_npy_close leaves them alone. */
    d->x = (crew_npy){.dtype = a->x_type == CREW_ARRAY_U8 ? CREW_DTYPE_U8 : CREW_DTYPE_F32, .ndim = a->sample_ndim + 1,
                      .data = a->x};
    d->x.shape[0] = a->n;
    for (int i = 0; i < a->sample_ndim; i++) d->x.shape[i + 1] = a->sample_shape[i];
    d->x.count = a->n * crew_shape_size(&d->sample);
    d->y = (crew_npy){.dtype = a->y_type == CREW_ARRAY_U8 ? CREW_DTYPE_U8 : CREW_DTYPE_I32, .ndim = 1,
                      .shape = {a->n}, .count = a->n, .data = a->y};
    crew_status s = check_labels(d, name);
    if (!s && d->x.dtype == CREW_DTYPE_F32) s = check_finite(d, name);
    if (!s) s = set_identity(d);
    if (s) {
        crew_dataset_free(d);
        return s;
    }
    *out = d;
    return CREW_OK;
}
