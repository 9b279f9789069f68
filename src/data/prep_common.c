/* prep_common.c — the parts every crew prep source shares (see prep_common.h). */
#include "data/prep_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/rng.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/atomic_dir.h"

#define SPLIT_STREAM 0x73706c6974ULL /* "split": keeps the split's numbers apart from other uses of a seed */

void crew_prep_tick(crew_prep_progress *p, const char *what)
{
    if (p->fn) p->fn(p->user, p->done < p->total ? p->done : p->total - 1, p->total, what);
    p->done++;
}

void crew_prep_done(crew_prep_progress *p)
{
    if (p->fn) p->fn(p->user, p->total, p->total, "done");
}

crew_status crew_prep_refuse_existing(const char *out_dir)
{
    struct stat st;
    if (out_dir && lstat(out_dir, &st) == 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s already exists; remove it first or choose another output directory",
                           out_dir);
    return CREW_OK;
}

crew_status crew_prep_map_file(const char *path, void **map, size_t *len)
{
    CREW_TRY(crew_map_file(path, map, len));
    if (*len == 0) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: empty file", path);
    return CREW_OK;
}

/* ---------------------------------------------------------------- split */

/* order [n]: the sample indices grouped by class (stable), start [classes + 1]: each group's start. */
static crew_status group_by_class(const int32_t *labels, int64_t n, int classes, int64_t **order, int64_t **start)
{
    *order = malloc(sizeof **order * (size_t)(n ? n : 1));
    *start = calloc((size_t)classes + 1, sizeof **start);
    if (!*order || !*start) return CREW_OOM();
    for (int64_t i = 0; i < n; i++) (*start)[labels[i] + 1]++;
    for (int c = 0; c < classes; c++) (*start)[c + 1] += (*start)[c];
    int64_t *fill = malloc(sizeof *fill * (size_t)classes);
    if (!fill) return CREW_OOM();
    memcpy(fill, *start, sizeof *fill * (size_t)classes);
    for (int64_t i = 0; i < n; i++) (*order)[fill[labels[i]]++] = i;
    free(fill);
    return CREW_OK;
}

crew_status crew_prep_split(const int32_t *labels, int64_t n, int classes, double fraction, uint64_t seed,
                            const char *what, uint8_t *is_test)
{
    if (!(fraction > 0 && fraction < 1))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: the test fraction must be in (0, 1), not %g", what, fraction);
    int64_t *order = NULL, *start = NULL, n_test = 0;
    crew_status s = group_by_class(labels, n, classes, &order, &start);
    memset(is_test, 0, (size_t)n);
    for (int c = 0; !s && c < classes; c++) {
        int64_t *g = order + start[c], n_c = start[c + 1] - start[c];
        int64_t k = (int64_t)floor((double)n_c * fraction + 0.5);
        if (k > n_c - 1) k = n_c > 0 ? n_c - 1 : 0; /* every class keeps a training sample */
        /* The first k of a seeded Fisher-Yates shuffle of the class's samples. */
        crew_rng r = crew_rng_make(crew_rng_key(seed, SPLIT_STREAM, (uint64_t)c, 0));
        for (int64_t i = 0; i < k; i++) {
            int64_t j = i + (int64_t)crew_rng_next_below(&r, (uint64_t)(n_c - i));
            int64_t t = g[i];
            g[i] = g[j];
            g[j] = t;
            is_test[g[i]] = 1;
        }
        n_test += k;
    }
    free(order);
    free(start);
    if (!s && n_test == 0)
        s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: a test fraction of %g leaves no test sample out of %lld (raise it, or add "
                        "samples)", what, fraction, (long long)n);
    return s;
}

void crew_prep_partition(uint8_t *x, int64_t sample_bytes, uint8_t *y, int y_bytes, const uint8_t *is_test, int64_t n,
                         uint8_t *xt, uint8_t *yt)
{
    int64_t tr = 0, te = 0;
    for (int64_t i = 0; i < n; i++) {
        if (is_test[i]) { /* x[i] is intact: only positions below i have been written */
            memcpy(xt + te * sample_bytes, x + i * sample_bytes, (size_t)sample_bytes);
            memcpy(yt + te * y_bytes, y + i * y_bytes, (size_t)y_bytes);
            te++;
        } else {
            if (tr != i) {
                memmove(x + tr * sample_bytes, x + i * sample_bytes, (size_t)sample_bytes);
                memmove(y + tr * y_bytes, y + i * y_bytes, (size_t)y_bytes);
            }
            tr++;
        }
    }
}

/* ---------------------------------------------------------------- statistics */

crew_status crew_prep_stats_u8(const uint8_t *x, int64_t count, int channels, double scale, crew_manifest *m)
{
    if (channels < 1 || channels > CREW_PREP_MAX_CHANNELS)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_stats_u8: %d channels (must be 1 to %d)", channels,
                           CREW_PREP_MAX_CHANNELS);
    uint64_t hist[CREW_PREP_MAX_CHANNELS][256];
    memset(hist, 0, sizeof hist);
    for (int64_t k = 0; k < count; k += channels)
        for (int c = 0; c < channels; c++) hist[c][x[k + c]]++;
    double *mean_out, *std_out;
    CREW_TRY(crew_manifest_set_channels(m, channels, &mean_out, &std_out));
    m->scale = scale;
    for (int c = 0; c < channels; c++) {
        double n = (double)(count / channels), sum = 0, sq = 0;
        for (int v = 0; v < 256; v++) sum += (double)hist[c][v] * v * scale;
        double mean = n > 0 ? sum / n : 0;
        for (int v = 0; v < 256; v++) sq += (double)hist[c][v] * (v * scale - mean) * (v * scale - mean);
        double sd = n > 0 ? sqrt(sq / n) : 0;
        mean_out[c] = mean;
        std_out[c] = sd > 1e-12 ? sd : 1.0;
    }
    return CREW_OK;
}

/* ---------------------------------------------------------------- writing */

static crew_status write_array(const crew_atomic_dir *ad, crew_manifest_array *a, const void *data,
                               crew_prep_progress *progress)
{
    char path[1200];
    crew_prep_tick(progress, a->file);
    CREW_TRY(crew_atomic_dir_file(ad, a->file, path, sizeof path));
    CREW_TRY(crew_npy_write(path, a->dtype, a->ndim, a->shape, data));
    return crew_manifest_hash_file(path, a);
}

static crew_status write_split(const crew_atomic_dir *ad, const crew_manifest *m, crew_npy_dtype xd, crew_npy_dtype yd,
                               const crew_prep_split_data *d, crew_manifest_split *sp, crew_prep_progress *progress)
{
    snprintf(sp->name, sizeof sp->name, "%s", d->name);
    sp->samples = d->n;
    crew_manifest_array *x = &sp->x, *y = &sp->y;
    snprintf(x->file, sizeof x->file, "%s_x.npy", sp->name);
    snprintf(y->file, sizeof y->file, "%s_y.npy", sp->name);
    x->dtype = xd;
    y->dtype = yd;
    x->ndim = 1 + m->sample_shape.ndim;
    x->shape[0] = y->shape[0] = d->n;
    memcpy(&x->shape[1], m->sample_shape.dim, sizeof m->sample_shape.dim[0] * (size_t)m->sample_shape.ndim);
    y->ndim = 1;
    CREW_TRY(write_array(ad, x, d->x, progress));
    return write_array(ad, y, d->y, progress);
}

crew_status crew_prep_write(const char *out_dir, crew_manifest *m, crew_npy_dtype x_dtype, crew_npy_dtype y_dtype,
                            const crew_prep_split_data *splits, int n_splits, crew_prep_progress *progress)
{
    if (n_splits < 1 || n_splits > CREW_MANIFEST_MAX_SPLITS)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_write: %d splits", n_splits);
    crew_atomic_dir ad;
    CREW_TRY(crew_atomic_dir_begin(out_dir, &ad));
    crew_status s = CREW_OK;
    m->n_splits = n_splits;
    for (int i = 0; i < n_splits && !s; i++) s = write_split(&ad, m, x_dtype, y_dtype, &splits[i], &m->splits[i], progress);
    return crew_prep_commit(&ad, m, s, progress);
}

crew_status crew_prep_commit(crew_atomic_dir *ad, const crew_manifest *m, crew_status s, crew_prep_progress *progress)
{
    char path[1200];
    if (!s) s = crew_atomic_dir_file(ad, CREW_MANIFEST_FILE, path, sizeof path);
    if (!s) s = crew_manifest_write(path, m);
    if (!s) {
        crew_prep_tick(progress, ad->final);
        s = crew_atomic_dir_commit(ad); /* removes the temporary directory itself on failure */
    }
    crew_atomic_dir_abort(ad);
    return s;
}
