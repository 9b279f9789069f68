/* dataset.c — opening one split of a dataset directory and gathering normalised batches.
 *
 * Opening checks everything that is cheap: the manifest's schema, each .npy file's size against
 * the manifest's byte count, its dtype and shape against the manifest (so x and y agree on the
 * sample count), and every label against the class count (one pass over N bytes). The content
 * hash reads every byte and so waits for crew_dataset_verify. */
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "core/status.h"
#include "data/manifest.h"

static crew_status array_path(const crew_dataset *d, const char *file, char *buf, size_t len)
{
    if ((size_t)snprintf(buf, len, "%s/%s", d->dir, file) >= len)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s/%s: path too long", d->dir, file);
    return CREW_OK;
}

static void format_dims(const int64_t *dims, int n, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (used < len) snprintf(buf + used, len - used, n == 1 ? ",)" : ")");
}

/* Maps one array and holds it to what the manifest says about it. */
static crew_status open_array(const crew_dataset *d, const crew_manifest_array *a, crew_npy *npy)
{
    char path[1024], have[256], want[256];
    CREW_TRY(array_path(d, a->file, path, sizeof path));
    CREW_TRY(crew_npy_open(path, npy));
    if ((int64_t)npy->map_len != a->bytes)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the file is %zu bytes but %s says %lld (modified or truncated?)",
                           path, npy->map_len, CREW_MANIFEST_FILE, (long long)a->bytes);
    if (npy->dtype != a->dtype)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: dtype is %s but %s says %s", path, crew_npy_dtype_name(npy->dtype),
                           CREW_MANIFEST_FILE, crew_npy_dtype_name(a->dtype));
    int same = npy->ndim == a->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = npy->shape[i] == a->shape[i];
    if (!same) {
        format_dims(npy->shape, npy->ndim, have, sizeof have);
        format_dims(a->shape, a->ndim, want, sizeof want);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: shape is %s but %s says %s", path, have, CREW_MANIFEST_FILE, want);
    }
    return CREW_OK;
}

static int64_t label_at(const crew_npy *y, int64_t i)
{
    if (y->dtype == CREW_DTYPE_U8) return ((const uint8_t *)y->data)[i];
    int32_t v;
    memcpy(&v, (const char *)y->data + 4 * i, 4); /* memcpy: the mapping need not be 4-aligned */
    return v;
}

/* One pass over the labels: each must be a class index. */
static crew_status check_labels(const crew_dataset *d)
{
    for (int64_t i = 0; i < d->n; i++) {
        int64_t v = label_at(&d->y, i);
        if (v < 0 || v >= d->classes)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s/%s: label %lld at index %lld is outside [0, %d)", d->dir,
                               d->y_file, (long long)v, (long long)i, d->classes);
    }
    return CREW_OK;
}

/* The manifest's per-channel statistics (as many as it holds: the reader bounded them) and what
 * gathering computes from them, once. Needs d->x open: only uint8 samples get a table. */
static crew_status set_normalization(crew_dataset *d, const crew_manifest *m)
{
    const double *mean = m->mean, *std = m->std;
    size_t c_n = (size_t)m->n_channels;
    int lut = d->x.dtype == CREW_DTYPE_U8 && c_n <= CREW_DATASET_LUT_CHANNELS;
    /* at least one element: malloc(0) may return NULL (the reader requires an entry anyway) */
    if (!(d->norm = malloc(sizeof *d->norm * (c_n ? c_n : 1) * (lut ? 4 + 256 : 4)))) return CREW_OOM();
    d->n_channels = m->n_channels;
    d->mean = d->norm;
    d->std = d->mean + c_n;
    d->mul = d->std + c_n;
    d->add = d->mul + c_n;
    d->lut = lut ? d->add + c_n : NULL;
    for (size_t c = 0; c < c_n; c++) {
        d->mean[c] = (float)mean[c];
        d->std[c] = (float)std[c];
        d->mul[c] = d->scale / d->std[c];
        d->add[c] = -d->mean[c] / d->std[c];
        for (int v = 0; lut && v < 256; v++) d->lut[c * 256 + v] = (float)(((double)v * m->scale - mean[c]) / std[c]);
    }
    return CREW_OK;
}

static crew_status missing_split(const crew_dataset *d, const crew_manifest *m, const char *split)
{
    char have[CREW_MANIFEST_MAX_SPLITS * 34] = "";
    for (int i = 0; i < m->n_splits; i++) {
        if (i) strcat(have, ", ");
        strcat(have, m->splits[i].name);
    }
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s/%s has no split '%s' (it has: %s)", d->dir, CREW_MANIFEST_FILE, split,
                       have);
}

static void copy_header(crew_dataset *d, const crew_manifest *m, const crew_manifest_split *sp)
{
    snprintf(d->name, sizeof d->name, "%s", m->name);
    snprintf(d->x_file, sizeof d->x_file, "%s", sp->x.file);
    snprintf(d->y_file, sizeof d->y_file, "%s", sp->y.file);
    d->x_xxh3 = sp->x.xxh3;
    d->y_xxh3 = sp->y.xxh3;
    d->n = sp->samples;
    d->sample = m->sample_shape;
    d->classes = m->classes;
    d->scale = (float)m->scale;
    d->label_positions = 1;
}

/* A batch gathers its samples from random places of the array: through the 4 KiB pages of the
 * file's mapping nearly every sample missed the TLB, which made gathering the MLP's batch 1.6x
 * slower, and with it the 2-replica step 3% slower (docs/PERFORMANCE.md, "The loader on the
 * replica's thread"). An array up to this size (and a sixteenth of the memory) is therefore copied
 * once, at open, into memory of the process's own advised to use 2 MiB pages (transparent huge
 * pages where the kernel offers them; else the copy is as the mapping was). Larger arrays are read
 * through the mapping, which costs no memory beyond the pages touched. The values are the same
 * bytes either way. */
#define CREW_DATASET_RESIDENT_MAX ((int64_t)256 << 20)
#define CREW_HUGE_PAGE ((size_t)2 << 20)

static void make_resident(crew_dataset *d)
{
    const int64_t bytes = d->x.count * (int64_t)crew_npy_dtype_size(d->x.dtype);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const int64_t memory = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    if (bytes < (int64_t)CREW_HUGE_PAGE || bytes > CREW_DATASET_RESIDENT_MAX || bytes > memory / 16) return;
    size_t len = ((size_t)bytes + CREW_HUGE_PAGE - 1) / CREW_HUGE_PAGE * CREW_HUGE_PAGE;
    void *copy = aligned_alloc(CREW_HUGE_PAGE, len);
    if (!copy) return; /* the mapping serves, as for a larger array */
    (void)madvise(copy, len, MADV_HUGEPAGE); /* advice: refused (no THP), the copy still serves */
    memcpy(copy, d->x.data, (size_t)bytes);
    d->x.data = copy;
    d->x_resident = copy;
    d->x_resident_len = len;
}

static crew_status open_from_manifest(crew_dataset *d, const crew_manifest *m, const char *split)
{
    const crew_manifest_split *sp = crew_manifest_find_split(m, split);
    if (!sp) return missing_split(d, m, split);
    copy_header(d, m, sp);
    if (sp->x.dtype != CREW_DTYPE_U8 && sp->x.dtype != CREW_DTYPE_F32)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s/%s: splits.%s.x.dtype must be uint8 or float32", d->dir,
                           CREW_MANIFEST_FILE, split);
    if (sp->y.dtype != CREW_DTYPE_U8 && sp->y.dtype != CREW_DTYPE_I32)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s/%s: splits.%s.y.dtype must be uint8 or int32", d->dir,
                           CREW_MANIFEST_FILE, split);
    CREW_TRY(open_array(d, &sp->x, &d->x));
    CREW_TRY(open_array(d, &sp->y, &d->y));
    CREW_TRY(check_labels(d));
    make_resident(d);
    return set_normalization(d, m);
}

/* A file of the dataset that is a symbolic link to a file outside it is read (a dataset may be
 * put together from files kept elsewhere), and said: one line of d->note. */
static void note_link(crew_dataset *d, const char *real_dir, const char *file)
{
    char path[1100], real[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", d->dir, file);
    if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode) || !realpath(path, real)) return;
    size_t dn = strlen(real_dir);
    if (!strncmp(real, real_dir, dn) && real[dn] == '/') return; /* a link within the dataset */
    char line[5800];
    int n = snprintf(line, sizeof line, "%s is a symbolic link to %s, outside %s: read from there", path, real, d->dir);
    size_t used = strlen(d->note);
    if (n <= 0 || used + 1 + (size_t)n >= sizeof d->note) return; /* a whole line or none: never one cut short */
    if (used) d->note[used++] = '\n';
    memcpy(d->note + used, line, (size_t)n + 1);
}

static void note_links(crew_dataset *d)
{
    char real_dir[4096];
    if (!realpath(d->dir, real_dir)) return;
    note_link(d, real_dir, CREW_MANIFEST_FILE);
    if (d->tokens)
        for (int k = 0; k < d->n_shards; k++) note_link(d, real_dir, d->shard_file[k]);
    else {
        note_link(d, real_dir, d->x_file);
        note_link(d, real_dir, d->y_file);
    }
}

const char *crew_dataset_note(const crew_dataset *d) { return d ? d->note : ""; }

crew_status crew_dataset_open(const char *dir, const char *split, crew_dataset **out)
{
    if (!dir || !split || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_dataset_open: NULL argument");
    *out = NULL;
    crew_dataset *d = calloc(1, sizeof *d);
    if (!d) return CREW_OOM();
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    crew_status s = CREW_OK;
    if (n == 0) s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_dataset_open: empty directory name");
    else if (n >= sizeof d->dir) s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", dir);
    else if (strlen(split) >= sizeof d->split)
        s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "split name '%s' is too long", split);
    if (!s) {
        memcpy(d->dir, dir, n);
        snprintf(d->split, sizeof d->split, "%s", split);
        crew_manifest m;
        s = crew_manifest_read(d->dir, &m);
        if (!s) s = m.has_tokens && m.n_splits == 0 ? crew_dataset_open_tokens(d, &m, split)
                                                    : open_from_manifest(d, &m, split);
        crew_manifest_free(&m);
    }
    if (s) {
        crew_dataset_free(d);
        return s;
    }
    note_links(d);
    *out = d;
    return CREW_OK;
}

void crew_dataset_free(crew_dataset *d)
{
    if (!d) return;
    crew_npy_close(&d->x);
    free(d->x_resident);
    crew_npy_close(&d->y);
    crew_dataset_close_tokens(d);
    free(d->norm);
    free(d);
}

int64_t crew_dataset_size(const crew_dataset *d) { return d ? d->n : 0; }

int64_t crew_dataset_memory_bytes(const crew_dataset *d) { return d ? (int64_t)d->x_resident_len : 0; }

void crew_dataset_head(const crew_dataset *d, int64_t n, crew_dataset *view)
{
    *view = *d;
    view->n = n < d->n ? n : d->n;
}

int crew_dataset_classes(const crew_dataset *d) { return d ? d->classes : 0; }

int crew_dataset_sample_shape(const crew_dataset *d, int64_t shape[4])
{
    if (!d) return 0;
    for (int i = 0; i < d->sample.ndim; i++) shape[i] = d->sample.dim[i];
    return d->sample.ndim;
}

static crew_status verify_one(const crew_dataset *d, const crew_npy *a, const char *file, uint64_t want)
{
    uint64_t have = XXH3_64bits(a->map, a->map_len);
    if (have != want)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s/%s: content hash %016llx does not match %s's %016llx (the file is corrupt or was modified)",
                           d->dir, file, (unsigned long long)have, CREW_MANIFEST_FILE, (unsigned long long)want);
    return CREW_OK;
}

crew_status crew_dataset_verify(const crew_dataset *d)
{
    if (!d) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_dataset_verify: NULL dataset");
    if (d->tokens) return crew_dataset_verify_tokens(d);
    if (!d->x.map) return CREW_OK; /* arrays in memory (dataset_arrays.c): no file to hold to a manifest */
    CREW_TRY(verify_one(d, &d->x, d->x_file, d->x_xxh3));
    return verify_one(d, &d->y, d->y_file, d->y_xxh3);
}

/* ---------------------------------------------------------------- gathering */

/* One uint8 sample of `size` values through the per-channel tables. */
static void gather_lut(const crew_dataset *d, const uint8_t *src, int64_t size, float *dst)
{
    if (d->n_channels == 1) {
        const float *lut = d->lut;
        for (int64_t k = 0; k < size; k++) dst[k] = lut[src[k]];
        return;
    }
    int64_t c_n = d->n_channels; /* equals the last axis: the manifest checks it */
    for (int64_t p = 0; p < size; p += c_n)
        for (int64_t c = 0; c < c_n; c++) dst[p + c] = d->lut[c * 256 + src[p + c]];
}

/* One sample of float32 values (or of uint8 ones with too many channels for tables). */
static void gather_affine(const crew_dataset *d, const char *src, int64_t size, float *dst)
{
    int64_t c_n = d->n_channels;
    int u8 = d->x.dtype == CREW_DTYPE_U8;
    const float *mul = d->mul, *add = d->add;
    for (int64_t k = 0; k < size; k++) {
        float v;
        if (u8) v = (uint8_t)src[k];
        else memcpy(&v, src + 4 * k, 4); /* memcpy: the mapping need not be 4-aligned */
        int64_t c = c_n == 1 ? 0 : k % c_n;
        dst[k] = v * mul[c] + add[c];
    }
}

/* The samples are read in a random order, each a few cache lines from memory (or from the page
 * cache through the mapping): asking for the next one while this one is converted hides most of
 * the wait, which was most of the loader's time. */
static void prefetch_sample(const crew_dataset *d, int64_t j, int64_t bytes)
{
    const char *p = (const char *)d->x.data + j * bytes;
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, 0, 0);
}

void crew_dataset_gather(const crew_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y)
{
    if (d->tokens) {
        crew_dataset_gather_tokens(d, idx, n, x, y);
        return;
    }
    int64_t size = crew_shape_size(&d->sample), bytes = (int64_t)crew_npy_dtype_size(d->x.dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t j = idx[i];
        if (x && i + 1 < n) prefetch_sample(d, idx[i + 1], size * bytes);
        if (x && d->lut) gather_lut(d, (const uint8_t *)d->x.data + j * size, size, x + i * size);
        else if (x) gather_affine(d, (const char *)d->x.data + bytes * j * size, size, x + i * size);
        if (y) y[i] = (int32_t)label_at(&d->y, j);
    }
}
