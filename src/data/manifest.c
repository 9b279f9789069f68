/* manifest.c — parsing and checking manifest.json (cJSON does the JSON, this file the schema).
 *
 * Every getter takes the manifest's name (`what`) and the dotted key path of the object it looks
 * in, so each error can say exactly which key was wrong. */
#include "data/manifest.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_text.h"
#include "core/mapped_file.h"
#include "core/status.h"

#define MAX_EXACT_INT ((int64_t)1 << 53) /* JSON numbers are doubles: integers are exact up to here */
#define MAX_MANIFEST_BYTES (16 << 20)

/* "path.key", or "key" at the top level. */
static void join(char *buf, size_t len, const char *path, const char *key)
{
    snprintf(buf, len, "%s%s%s", path, *path ? "." : "", key);
}

static crew_status bad(const char *what, const char *path, const char *key, const char *must)
{
    char full[256];
    join(full, sizeof full, path, key);
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s %s", what, full, must);
}

/* Every member of obj is in allowed[] (NULL-terminated), and none appears twice. */
static crew_status check_keys(const cJSON *obj, const char *const *allowed, const char *what, const char *path)
{
    for (const cJSON *c = obj->child; c; c = c->next) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, c->string);
        if (!ok) return bad(what, path, c->string, "is not a known key");
        for (const cJSON *d = obj->child; d != c; d = d->next)
            if (!strcmp(d->string, c->string)) return bad(what, path, c->string, "appears twice");
    }
    return CREW_OK;
}

static crew_status member(const cJSON *obj, const char *key, const char *what, const char *path, const cJSON **out)
{
    *out = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!*out) return bad(what, path, key, "is missing");
    return CREW_OK;
}

static crew_status get_object(const cJSON *obj, const char *key, const char *what, const char *path, const cJSON **out)
{
    CREW_TRY(member(obj, key, what, path, out));
    if (!cJSON_IsObject(*out)) return bad(what, path, key, "must be an object");
    return CREW_OK;
}

/* An integer-valued JSON number, for manifests that say 60000.0 as much as 60000. */
static int as_int(const cJSON *item, int64_t lo, int64_t hi, int64_t *out)
{
    if (!cJSON_IsNumber(item)) return 0;
    double v = item->valuedouble;
    if (!isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi) return 0;
    *out = (int64_t)v;
    return 1;
}

static crew_status get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, const char *what,
                           const char *path, int64_t *out)
{
    const cJSON *item;
    CREW_TRY(member(obj, key, what, path, &item));
    if (as_int(item, lo, hi, out)) return CREW_OK;
    char must[96];
    snprintf(must, sizeof must, "must be an integer in [%lld, %lld]", (long long)lo, (long long)hi);
    return bad(what, path, key, must);
}

static crew_status get_string(const cJSON *obj, const char *key, char *buf, size_t len, const char *what,
                              const char *path)
{
    const cJSON *item;
    CREW_TRY(member(obj, key, what, path, &item));
    if (!cJSON_IsString(item)) return bad(what, path, key, "must be a string");
    size_t n = strlen(item->valuestring);
    if (n == 0 || n >= len) {
        char must[64];
        snprintf(must, sizeof must, "must be 1 to %zu characters long", len - 1);
        return bad(what, path, key, must);
    }
    memcpy(buf, item->valuestring, n + 1);
    return CREW_OK;
}

/* An array of 1..max integers, each at least lo. */
static crew_status get_dims(const cJSON *obj, const char *key, int max, int64_t lo, const char *what,
                            const char *path, int64_t *dims, int *ndim)
{
    const cJSON *arr;
    CREW_TRY(member(obj, key, what, path, &arr));
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    char must[96];
    snprintf(must, sizeof must, "must be an array of 1 to %d integers, each at least %lld", max, (long long)lo);
    if (n < 1 || n > max) return bad(what, path, key, must);
    int i = 0;
    for (const cJSON *c = arr->child; c; c = c->next, i++)
        if (!as_int(c, lo, MAX_EXACT_INT, &dims[i])) return bad(what, path, key, must);
    *ndim = n;
    return CREW_OK;
}

/* ---------------------------------------------------------------- parts of the schema */

static int plain_file_name(const char *s)
{
    return strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\\');
}

static crew_status parse_hash(const cJSON *obj, const char *what, const char *path, uint64_t *out)
{
    char hex[17];
    crew_status s = get_string(obj, "xxh3", hex, sizeof hex, what, path);
    if (!s && strspn(hex, "0123456789abcdefABCDEF") != 16) s = bad(what, path, "xxh3", "must be 16 hex digits");
    if (s) {
        crew_status_free(s);
        return bad(what, path, "xxh3", "must be a string of 16 hex digits");
    }
    *out = strtoull(hex, NULL, 16);
    return CREW_OK;
}

static crew_status parse_array(const cJSON *split, const char *key, const char *what, const char *spath,
                               crew_manifest_array *a)
{
    static const char *const keys[] = {"file", "dtype", "shape", "bytes", "xxh3", NULL};
    const cJSON *obj;
    char path[96], dtype[16];
    CREW_TRY(get_object(split, key, what, spath, &obj));
    join(path, sizeof path, spath, key);
    CREW_TRY(check_keys(obj, keys, what, path));
    CREW_TRY(get_string(obj, "file", a->file, sizeof a->file, what, path));
    if (!plain_file_name(a->file)) return bad(what, path, "file", "must be a file name inside the dataset directory");
    CREW_TRY(get_string(obj, "dtype", dtype, sizeof dtype, what, path));
    if (!crew_npy_dtype_from_name(dtype, &a->dtype))
        return bad(what, path, "dtype", "must be one of uint8, int32, float32, uint16, int64");
    CREW_TRY(get_dims(obj, "shape", CREW_NPY_MAX_DIMS, 0, what, path, a->shape, &a->ndim));
    CREW_TRY(get_int(obj, "bytes", 0, MAX_EXACT_INT, what, path, &a->bytes));
    return parse_hash(obj, what, path, &a->xxh3);
}

/* x is [samples, ...sample_shape] and y is [samples]. */
static crew_status check_split_shapes(const crew_manifest *m, const crew_manifest_split *sp, const char *what)
{
    const crew_manifest_array *x = &sp->x, *y = &sp->y;
    int ok = x->ndim == 1 + m->sample_shape.ndim && x->shape[0] == sp->samples;
    for (int i = 0; ok && i < m->sample_shape.ndim; i++) ok = x->shape[i + 1] == m->sample_shape.dim[i];
    if (!ok)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: splits.%s.x.shape must be [samples, ...sample_shape] = [%lld, ...]",
                           what, sp->name, (long long)sp->samples);
    if (y->ndim != 1 || y->shape[0] != sp->samples)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: splits.%s.y.shape must be [samples] = [%lld]", what, sp->name,
                           (long long)sp->samples);
    return CREW_OK;
}

/* 1 to len - 1 letters, digits, '_' or '-'. */
static int valid_split_name(const char *s, size_t len)
{
    size_t n = strlen(s);
    return n > 0 && n < len && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

static crew_status parse_split(const cJSON *item, const char *what, const crew_manifest *m, crew_manifest_split *sp)
{
    static const char *const keys[] = {"samples", "x", "y", NULL};
    char path[64];
    size_t n = strlen(item->string);
    if (!valid_split_name(item->string, sizeof sp->name))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: split names must be 1 to %zu letters, digits, '_' or '-'", what,
                           sizeof sp->name - 1);
    memcpy(sp->name, item->string, n + 1);
    snprintf(path, sizeof path, "splits.%s", sp->name);
    if (!cJSON_IsObject(item)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s must be an object", what, path);
    CREW_TRY(check_keys(item, keys, what, path));
    CREW_TRY(get_int(item, "samples", 1, MAX_EXACT_INT, what, path, &sp->samples));
    CREW_TRY(parse_array(item, "x", what, path, &sp->x));
    CREW_TRY(parse_array(item, "y", what, path, &sp->y));
    return check_split_shapes(m, sp, what);
}

static crew_status parse_splits(const cJSON *root, const char *what, crew_manifest *m)
{
    const cJSON *splits;
    CREW_TRY(get_object(root, "splits", what, "", &splits));
    int n = cJSON_GetArraySize(splits);
    if (n < 1 || n > CREW_MANIFEST_MAX_SPLITS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: splits must hold 1 to %d splits", what, CREW_MANIFEST_MAX_SPLITS);
    for (const cJSON *c = splits->child; c; c = c->next) {
        for (int i = 0; i < m->n_splits; i++)
            if (!strcmp(m->splits[i].name, c->string))
                return crew_errorf(CREW_CODE_BAD_INPUT, "%s: splits.%s appears twice", what, c->string);
        CREW_TRY(parse_split(c, what, m, &m->splits[m->n_splits]));
        m->n_splits++;
    }
    return CREW_OK;
}

/* normalization.mean or .std (key) in *arr, and its length in *n: 1 entry (shared by all
 * channels) or one per channel (c, the last axis of sample_shape). Checked before anything is
 * allocated, so a hostile manifest cannot ask for more than CREW_MANIFEST_MAX_STATS entries. */
static crew_status stats_length(const cJSON *norm, const char *key, int64_t c, const char *what, const cJSON **arr,
                                int *n)
{
    CREW_TRY(member(norm, key, what, "normalization", arr));
    if (!cJSON_IsArray(*arr)) return bad(what, "normalization", key, "must be an array of numbers");
    int len = cJSON_GetArraySize(*arr);
    if (len > CREW_MANIFEST_MAX_STATS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: normalization.%s holds %d entries, more than the %d crew reads",
                           what, key, len, CREW_MANIFEST_MAX_STATS);
    if (len != 1 && len != c)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: normalization.%s holds %d entries; it must hold 1 (shared by all channels) or one per "
                           "channel (%lld)", what, key, len, (long long)c);
    *n = len;
    return CREW_OK;
}

/* The numbers of normalization.<key> into out: each finite, and > 0 where positive is set (std). */
static crew_status stats_values(const cJSON *arr, const char *key, int positive, const char *what, double *out)
{
    int i = 0;
    for (const cJSON *c = arr->child; c; c = c->next, i++) {
        double v = c->valuedouble;
        if (!cJSON_IsNumber(c) || !isfinite(v) || (positive && !(v > 0)))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: normalization.%s[%d] must be a %s number", what, key, i,
                               positive ? "finite positive" : "finite");
        out[i] = v;
    }
    return CREW_OK;
}

static crew_status parse_normalization(const cJSON *root, const char *what, crew_manifest *m)
{
    static const char *const keys[] = {"scale", "mean", "std", NULL};
    const cJSON *norm, *scale, *mean_arr, *std_arr;
    CREW_TRY(get_object(root, "normalization", what, "", &norm));
    CREW_TRY(check_keys(norm, keys, what, "normalization"));
    CREW_TRY(member(norm, "scale", what, "normalization", &scale));
    if (!cJSON_IsNumber(scale) || !isfinite(scale->valuedouble) || !(scale->valuedouble > 0))
        return bad(what, "normalization", "scale", "must be a positive number");
    m->scale = scale->valuedouble;
    int64_t c = m->sample_shape.dim[m->sample_shape.ndim - 1];
    int n_mean, n_std;
    CREW_TRY(stats_length(norm, "mean", c, what, &mean_arr, &n_mean));
    CREW_TRY(stats_length(norm, "std", c, what, &std_arr, &n_std));
    if (n_std != n_mean)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: normalization.mean and .std must hold as many entries (%d and %d)",
                           what, n_mean, n_std);
    double *mean, *std;
    CREW_TRY(crew_manifest_set_channels(m, n_mean, &mean, &std));
    CREW_TRY(stats_values(mean_arr, "mean", 0, what, mean));
    return stats_values(std_arr, "std", 1, what, std);
}

static crew_status parse_class_names(const cJSON *root, const char *what, crew_manifest *m)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "class_names");
    if (!arr) return CREW_OK;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != m->classes)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: class_names must be an array of %d strings (one per class)", what,
                           m->classes);
    m->class_names = calloc((size_t)m->classes, sizeof *m->class_names);
    if (!m->class_names) return CREW_OOM();
    int i = 0;
    for (const cJSON *c = arr->child; c; c = c->next, i++) {
        if (!cJSON_IsString(c))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: class_names[%d] must be a string", what, i);
        if (!(m->class_names[i] = strdup(c->valuestring))) return CREW_OOM();
    }
    return CREW_OK;
}

/* tokens.shards[i]: {split, file, tokens, bytes, xxh3}, bytes agreeing with the token count. */
static crew_status parse_shard(const cJSON *item, int i, const char *what, crew_manifest_shard *sh)
{
    static const char *const keys[] = {"split", "file", "tokens", "bytes", "xxh3", NULL};
    char path[64];
    snprintf(path, sizeof path, "tokens.shards[%d]", i);
    if (!cJSON_IsObject(item)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s must be an object", what, path);
    CREW_TRY(check_keys(item, keys, what, path));
    CREW_TRY(get_string(item, "split", sh->split, sizeof sh->split, what, path));
    if (!valid_split_name(sh->split, sizeof sh->split))
        return bad(what, path, "split", "must be 1 to 31 letters, digits, '_' or '-'");
    CREW_TRY(get_string(item, "file", sh->file, sizeof sh->file, what, path));
    if (!plain_file_name(sh->file)) return bad(what, path, "file", "must be a file name inside the dataset directory");
    CREW_TRY(get_int(item, "tokens", 0, INT32_MAX, what, path, &sh->tokens));
    CREW_TRY(get_int(item, "bytes", 0, MAX_EXACT_INT, what, path, &sh->bytes));
    if (sh->bytes != 1024 + 2 * sh->tokens)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s.bytes must be 1024 + 2 * tokens = %lld for an llm.c shard", what,
                           path, (long long)(1024 + 2 * sh->tokens));
    return parse_hash(item, what, path, &sh->xxh3);
}

static crew_status parse_shards(const cJSON *tok, const char *what, crew_manifest_tokens *t)
{
    const cJSON *arr;
    CREW_TRY(member(tok, "shards", what, "tokens", &arr));
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (n < 1 || n > CREW_MANIFEST_MAX_SHARDS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tokens.shards must be an array of 1 to %d shards", what,
                           CREW_MANIFEST_MAX_SHARDS);
    t->shards = calloc((size_t)n, sizeof *t->shards);
    if (!t->shards) return CREW_OOM();
    for (const cJSON *c = arr->child; c; c = c->next) {
        crew_manifest_shard *sh = &t->shards[t->n_shards];
        CREW_TRY(parse_shard(c, t->n_shards, what, sh));
        for (int j = 0; j < t->n_shards; j++)
            if (!strcmp(t->shards[j].file, sh->file))
                return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tokens.shards[%d].file '%s' is also shard %d's", what,
                                   t->n_shards, sh->file, j);
        t->n_shards++;
    }
    return CREW_OK;
}

static crew_status parse_tokens(const cJSON *root, const char *what, crew_manifest *m)
{
    static const char *const keys[] = {"vocab", "seq_len", "shards", NULL};
    const cJSON *tok;
    int64_t vocab;
    CREW_TRY(get_object(root, "tokens", what, "", &tok));
    CREW_TRY(check_keys(tok, keys, what, "tokens"));
    CREW_TRY(get_int(tok, "vocab", 1, CREW_MANIFEST_MAX_VOCAB, what, "tokens", &vocab));
    m->tokens.vocab = (int)vocab;
    CREW_TRY(get_int(tok, "seq_len", 1, INT32_MAX, what, "tokens", &m->tokens.seq_len));
    m->has_tokens = 1;
    return parse_shards(tok, what, &m->tokens);
}

/* A token dataset may leave out every key of an array dataset (all of them, not some). */
static int token_only(const cJSON *root)
{
    static const char *const array_keys[] = {"classes", "class_names", "sample_shape", "normalization", "splits", NULL};
    if (!cJSON_GetObjectItemCaseSensitive(root, "tokens")) return 0;
    for (const char *const *k = array_keys; *k; k++)
        if (cJSON_GetObjectItemCaseSensitive(root, *k)) return 0;
    return 1;
}

static crew_status parse_root(const cJSON *root, const char *what, crew_manifest *m)
{
    static const char *const keys[] = {"format", "version", "name", "classes", "class_names", "sample_shape",
                                       "normalization", "splits", "tokens", NULL};
    char format[32];
    int64_t version, classes;
    if (!cJSON_IsObject(root)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the top level must be a JSON object", what);
    CREW_TRY(check_keys(root, keys, what, ""));
    CREW_TRY(get_string(root, "format", format, sizeof format, what, ""));
    if (strcmp(format, CREW_MANIFEST_FORMAT))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: format is '%s', not '%s'", what, format, CREW_MANIFEST_FORMAT);
    CREW_TRY(get_int(root, "version", 1, MAX_EXACT_INT, what, "", &version));
    if (version != CREW_MANIFEST_VERSION)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: version %lld is not supported (crew reads version %d)", what,
                           (long long)version, CREW_MANIFEST_VERSION);
    CREW_TRY(get_string(root, "name", m->name, sizeof m->name, what, ""));
    if (cJSON_GetObjectItemCaseSensitive(root, "tokens")) CREW_TRY(parse_tokens(root, what, m));
    if (token_only(root)) return CREW_OK;
    CREW_TRY(get_int(root, "classes", 1, CREW_MANIFEST_MAX_CLASSES, what, "", &classes));
    m->classes = (int)classes;
    CREW_TRY(parse_class_names(root, what, m));
    CREW_TRY(get_dims(root, "sample_shape", CREW_MAX_DIMS, 1, what, "", m->sample_shape.dim, &m->sample_shape.ndim));
    CREW_TRY(parse_normalization(root, what, m));
    return parse_splits(root, what, m);
}

/* "line L, column C" of a parse error. */
static void locate(const char *text, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *p = text; p < at; p++) {
        if (*p == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

crew_status crew_manifest_parse(const char *text, size_t len, const char *what, crew_manifest *out)
{
    if (!out || (!text && len)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_manifest_parse: NULL argument");
    if (!what) what = CREW_MANIFEST_FILE;
    memset(out, 0, sizeof *out);
    /* cJSON would end a string at a NUL: "train\u0000x" would read as "train". */
    int escaped;
    size_t nul = len ? crew_json_find_nul(text, len, &escaped) : (size_t)-1;
    if (nul != (size_t)-1) {
        int line, col;
        crew_json_locate(text, nul, &line, &col);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %d, column %d: %s", what, line, col,
                           escaped ? "a string holds \\u0000 (NUL), which no key or value may contain"
                                   : "a NUL byte; not a JSON text file");
    }
    const char *end = NULL;
    cJSON *root = len ? cJSON_ParseWithLengthOpts(text, len, &end, 0) : NULL;
    if (root && end) {
        while (end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
        if (end < text + len) {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    if (!root) {
        int line = 1, col = 1;
        if (end && end >= text && end <= text + len) locate(text, end, &line, &col);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: invalid JSON at line %d, column %d", what, line, col);
    }
    crew_status s = parse_root(root, what, out);
    cJSON_Delete(root);
    if (s) crew_manifest_free(out);
    return s;
}

crew_status crew_manifest_read(const char *dir, crew_manifest *out)
{
    if (!dir || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_manifest_read: NULL argument");
    memset(out, 0, sizeof *out);
    char path[1024];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, CREW_MANIFEST_FILE) >= sizeof path)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", dir);
    uint8_t *buf;
    size_t n;
    CREW_TRY(crew_read_file(path, MAX_MANIFEST_BYTES, "a manifest", &buf, &n));
    crew_status s = crew_manifest_parse((const char *)buf, n, path, out);
    free(buf);
    return s;
}

static void free_stats(crew_manifest *m)
{
    free(m->mean);
    free(m->std);
    m->mean = m->std = NULL;
}

crew_status crew_manifest_set_channels(crew_manifest *m, int n, double **mean, double **std)
{
    if (!m || !mean || !std || n < 1 || n > CREW_MANIFEST_MAX_STATS)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_manifest_set_channels: %d entries (must be 1 to %d)", n,
                           CREW_MANIFEST_MAX_STATS);
    free_stats(m);
    m->n_channels = 0; /* until the entries exist: no reader reaches past what is there */
    m->mean = malloc(sizeof *m->mean * (size_t)n);
    m->std = malloc(sizeof *m->std * (size_t)n);
    if (!m->mean || !m->std) {
        free_stats(m);
        return CREW_OOM();
    }
    m->n_channels = n;
    *mean = m->mean;
    *std = m->std;
    return CREW_OK;
}

void crew_manifest_free(crew_manifest *m)
{
    if (!m) return;
    free_stats(m);
    m->n_channels = 0;
    if (m->class_names)
        for (int i = 0; i < m->classes; i++) free(m->class_names[i]);
    free(m->class_names);
    m->class_names = NULL;
    free(m->tokens.shards);
    m->tokens.shards = NULL;
    m->tokens.n_shards = 0;
}

const crew_manifest_split *crew_manifest_find_split(const crew_manifest *m, const char *name)
{
    for (int i = 0; m && name && i < m->n_splits; i++)
        if (!strcmp(m->splits[i].name, name)) return &m->splits[i];
    return NULL;
}

/* ---------------------------------------------------------------- writing */

static cJSON *dims_json(const int64_t *dims, int n)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) {
        cJSON *v = cJSON_CreateNumber((double)dims[i]);
        if (!v || !cJSON_AddItemToArray(arr, v)) {
            cJSON_Delete(v);
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

/* cJSON's Add* functions return NULL on failure; one check at the end catches any. */
static int add_array(cJSON *split, const char *key, const crew_manifest_array *a)
{
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)a->xxh3);
    cJSON *o = cJSON_AddObjectToObject(split, key);
    return o && cJSON_AddStringToObject(o, "file", a->file) && cJSON_AddStringToObject(o, "dtype", crew_npy_dtype_name(a->dtype))
        && cJSON_AddItemToObject(o, "shape", dims_json(a->shape, a->ndim))
        && cJSON_AddNumberToObject(o, "bytes", (double)a->bytes) && cJSON_AddStringToObject(o, "xxh3", hex);
}

static int add_normalization(cJSON *root, const crew_manifest *m)
{
    cJSON *n = cJSON_AddObjectToObject(root, "normalization");
    return n && cJSON_AddNumberToObject(n, "scale", m->scale)
        && cJSON_AddItemToObject(n, "mean", cJSON_CreateDoubleArray(m->mean, m->n_channels))
        && cJSON_AddItemToObject(n, "std", cJSON_CreateDoubleArray(m->std, m->n_channels));
}

static int add_shard(cJSON *arr, const crew_manifest_shard *sh)
{
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sh->xxh3);
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(arr, o)) {
        cJSON_Delete(o);
        return 0;
    }
    return cJSON_AddStringToObject(o, "split", sh->split) && cJSON_AddStringToObject(o, "file", sh->file)
        && cJSON_AddNumberToObject(o, "tokens", (double)sh->tokens) && cJSON_AddNumberToObject(o, "bytes", (double)sh->bytes)
        && cJSON_AddStringToObject(o, "xxh3", hex);
}

static int add_tokens(cJSON *root, const crew_manifest_tokens *t)
{
    cJSON *o = cJSON_AddObjectToObject(root, "tokens");
    cJSON *arr = o && cJSON_AddNumberToObject(o, "vocab", t->vocab) && cJSON_AddNumberToObject(o, "seq_len", (double)t->seq_len)
                   ? cJSON_AddArrayToObject(o, "shards") : NULL;
    int ok = arr != NULL;
    for (int i = 0; ok && i < t->n_shards; i++) ok = add_shard(arr, &t->shards[i]);
    return ok;
}

static cJSON *manifest_json(const crew_manifest *m)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root && cJSON_AddStringToObject(root, "format", CREW_MANIFEST_FORMAT)
          && cJSON_AddNumberToObject(root, "version", CREW_MANIFEST_VERSION)
          && cJSON_AddStringToObject(root, "name", m->name);
    if (ok && m->has_tokens) ok = add_tokens(root, &m->tokens);
    if (ok && m->has_tokens && m->n_splits == 0) return root; /* a token dataset only */
    ok = ok && cJSON_AddNumberToObject(root, "classes", m->classes);
    if (ok && m->class_names)
        ok = cJSON_AddItemToObject(root, "class_names",
                                   cJSON_CreateStringArray((const char *const *)m->class_names, m->classes));
    ok = ok && cJSON_AddItemToObject(root, "sample_shape", dims_json(m->sample_shape.dim, m->sample_shape.ndim))
      && add_normalization(root, m);
    cJSON *splits = ok ? cJSON_AddObjectToObject(root, "splits") : NULL;
    ok = ok && splits;
    for (int i = 0; ok && i < m->n_splits; i++) {
        const crew_manifest_split *sp = &m->splits[i];
        cJSON *s = cJSON_AddObjectToObject(splits, sp->name);
        ok = s && cJSON_AddNumberToObject(s, "samples", (double)sp->samples) && add_array(s, "x", &sp->x)
          && add_array(s, "y", &sp->y);
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

crew_status crew_manifest_write(const char *path, const crew_manifest *m)
{
    if (!path || !m) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_manifest_write: NULL argument");
    cJSON *root = manifest_json(m);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return CREW_OOM();
    FILE *f = fopen(path, "wb");
    if (!f) {
        crew_status s = crew_errorf(CREW_CODE_IO, "%s: %s", path, strerror(errno));
        cJSON_free(text);
        return s;
    }
    int failed = fputs(text, f) == EOF || fputc('\n', f) == EOF;
    failed |= fclose(f) != 0;
    cJSON_free(text);
    if (failed) return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", path, strerror(errno));
    return CREW_OK;
}

crew_status crew_manifest_hash_file(const char *path, crew_manifest_array *a)
{
    if (!path || !a) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_manifest_hash_file: NULL argument");
    return crew_file_hash(path, &a->bytes, &a->xxh3);
}
