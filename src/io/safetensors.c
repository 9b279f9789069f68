/* safetensors.c — reading, checking and writing safetensors files.
 *
 * Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data section.
 * The reader trusts nothing: it checks N against the file, the header's bytes (UTF-8, no raw
 * control characters), its JSON, every entry's keys and types, each dtype, shape and offset, and
 * that the tensors tile the data section exactly — no overlaps and no holes, the data section
 * ending where the file ends — which is what the reference implementation (huggingface/
 * safetensors) demands too, so a file crew accepts is a file Python accepts. Leading and trailing
 * JSON whitespace in the header is accepted (writers pad with spaces).
 *
 * Stricter than the reference: tensor names must be 1 to 127 bytes (they live in a fixed
 * buffer), and only the dtypes crew uses (F32, I32, I64, U8) are read.
 *
 * The writer keeps the caller's tensor order, pads the header with spaces to a multiple of 8
 * bytes (so data starts 8-aligned, as the reference writes it), and replaces the target
 * atomically: temporary file, fsync, rename, fsync of the directory. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/json_text.h"
#include "core/mapped_file.h"
#include "core/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this code copies it as host bytes"
#endif

#define NAME_CAP ((int)sizeof(((crew_st_tensor *)0)->name)) /* 128: names up to 127 bytes */
#define MAX_EXACT_INT 9007199254740992.0                       /* 2^53: JSON numbers are doubles */

/* ------------------------------------------------------------------ dtypes and shapes */

size_t crew_st_dtype_size(crew_st_dtype dtype)
{
    switch (dtype) {
    case CREW_ST_F32: return 4;
    case CREW_ST_I32: return 4;
    case CREW_ST_I64: return 8;
    case CREW_ST_U8: return 1;
    }
    return 0;
}

const char *crew_st_dtype_name(crew_st_dtype dtype)
{
    switch (dtype) {
    case CREW_ST_F32: return "F32";
    case CREW_ST_I32: return "I32";
    case CREW_ST_I64: return "I64";
    case CREW_ST_U8: return "U8";
    }
    return "?";
}

static crew_st_dtype dtype_from_name(const char *s)
{
    static const crew_st_dtype all[] = {CREW_ST_F32, CREW_ST_I32, CREW_ST_I64, CREW_ST_U8};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, crew_st_dtype_name(all[i])) == 0) return all[i];
    return (crew_st_dtype)0;
}

/* "[784, 256]" */
static void format_shape(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

/* Product of the dims; -1 when it overflows int64 (checked in order, as the reference does). */
static int64_t shape_count(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

/* ------------------------------------------------------------------ header bytes */

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. Also refuses raw
 * control characters other than JSON whitespace, which JSON never allows unescaped. */
static int header_text_ok(const uint8_t *s, size_t n, size_t *bad_at)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        *bad_at = i;
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return 0;
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static uint64_t read_u64_le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* The header length, checked against the file. */
static crew_status header_length(size_t len, const uint8_t *bytes, const char *what, uint64_t *out)
{
    if (len < 8)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: file is %zu bytes, too short for the 8-byte header length",
                           what, len);
    uint64_t n = read_u64_le(bytes);
    if (n > CREW_ST_MAX_HEADER)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header length %" PRIu64 " exceeds the %u-byte limit", what, n,
                           CREW_ST_MAX_HEADER);
    if (n > len - 8)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: header length %" PRIu64 " is larger than the %zu bytes after it (truncated file?)",
                           what, n, len - 8);
    if (n < 2)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header length %" PRIu64 " is too short for a JSON object", what,
                           n);
    *out = n;
    return CREW_OK;
}

static crew_status parse_header_json(const uint8_t *h, size_t n, const char *what, cJSON **out)
{
    size_t bad = 0;
    if (!header_text_ok(h, n, &bad))
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: header byte %zu (0x%02x) is not valid UTF-8 JSON text", what, bad, h[bad]);
    /* cJSON would end a string at \u0000: "t\u0000x" would name tensor "t". */
    int escaped;
    size_t nul = crew_json_find_nul((const char *)h, n, &escaped);
    if (nul != (size_t)-1)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: header byte %zu: a string holds \\u0000 (NUL), which no tensor name, key or value may "
                           "contain", what, nul);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)h, n, &end, 0);
    if (!root) {
        size_t at = end && end >= (const char *)h ? (size_t)(end - (const char *)h) : 0;
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header is not valid JSON (near byte %zu of %zu)", what, at, n);
    }
    for (size_t i = (size_t)(end - (const char *)h); i < n; i++)
        if (h[i] != ' ' && h[i] != '\t' && h[i] != '\n' && h[i] != '\r') {
            cJSON_Delete(root);
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header has bytes after its JSON object (at byte %zu)", what,
                               i);
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header is not a JSON object", what);
    }
    *out = root;
    return CREW_OK;
}

/* ------------------------------------------------------------------ header entries */

/* Byte range of one tensor in the data section; index into the tensor array. */
typedef struct span {
    uint64_t begin, end;
    int index;
} span;

/* A non-negative integer that a double represents exactly. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= MAX_EXACT_INT) || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

static crew_status parse_dtype(const cJSON *v, const char *what, crew_st_tensor *t)
{
    if (!cJSON_IsString(v))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': key 'dtype' is not a string", what, t->name);
    t->dtype = dtype_from_name(v->valuestring);
    if (!t->dtype)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: tensor '%s': dtype '%.32s' is not supported (crew reads F32, I32, I64, U8)", what,
                           t->name, v->valuestring);
    return CREW_OK;
}

static crew_status parse_shape(const cJSON *v, const char *what, crew_st_tensor *t)
{
    if (!cJSON_IsArray(v))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': key 'shape' is not an array", what, t->name);
    int ndim = cJSON_GetArraySize(v);
    if (ndim > CREW_ST_MAX_DIMS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': shape has %d axes, more than %d", what, t->name,
                           ndim, CREW_ST_MAX_DIMS);
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        uint64_t dim;
        if (!json_uint(d, &dim))
            return crew_errorf(CREW_CODE_BAD_INPUT,
                               "%s: tensor '%s': shape axis %d is not a non-negative integer", what, t->name, i);
        t->shape[i] = (int64_t)dim;
    }
    t->ndim = ndim;
    t->count = shape_count(t->shape, ndim);
    if (t->count < 0) {
        char sh[160];
        format_shape(t->shape, ndim, sh, sizeof sh);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': shape %s has too many elements", what, t->name, sh);
    }
    return CREW_OK;
}

static crew_status parse_offsets(const cJSON *v, uint64_t data_len, const char *what, const crew_st_tensor *t,
                                 span *sp)
{
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !json_uint(v->child, &sp->begin) ||
        !json_uint(v->child->next, &sp->end))
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: tensor '%s': key 'data_offsets' is not two non-negative integers [begin, end]", what,
                           t->name);
    if (sp->end < sp->begin)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", what,
                           t->name, sp->begin, sp->end);
    if (sp->end > data_len)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] run past the data section's %" PRIu64 " bytes (truncated file?)",
                           what, t->name, sp->begin, sp->end, data_len);
    return CREW_OK;
}

/* end − begin must be exactly count × itemsize. */
static crew_status check_size(const crew_st_tensor *t, const span *sp, const char *what)
{
    uint64_t have = sp->end - sp->begin, item = crew_st_dtype_size(t->dtype);
    if ((uint64_t)t->count <= UINT64_MAX / item && have == (uint64_t)t->count * item) return CREW_OK;
    char sh[160];
    format_shape(t->shape, t->ndim, sh, sizeof sh);
    if (have % item)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                           " bytes, not a whole number of %s values, but shape %s needs %lld",
                           what, t->name, sp->begin, sp->end, have, crew_st_dtype_name(t->dtype), sh,
                           (long long)t->count);
    return crew_errorf(CREW_CODE_BAD_INPUT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " values but shape %s needs %lld",
                       what, t->name, sp->begin, sp->end, have / item, sh, (long long)t->count);
}

/* Which of the three keys an entry member is: bit 0, 1, 2; 0 for none. */
static unsigned entry_key_bit(const char *k)
{
    if (strcmp(k, "dtype") == 0) return 1u;
    if (strcmp(k, "shape") == 0) return 2u;
    if (strcmp(k, "data_offsets") == 0) return 4u;
    return 0u;
}

static crew_status parse_entry(const cJSON *e, uint64_t data_len, const char *what, crew_st_tensor *t, span *sp)
{
    size_t nlen = strlen(e->string);
    if (nlen == 0 || nlen >= (size_t)NAME_CAP)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor name '%.40s%s' must be 1 to %d bytes long", what,
                           e->string, nlen > 40 ? "..." : "", NAME_CAP - 1);
    memcpy(t->name, e->string, nlen + 1);
    if (!cJSON_IsObject(e))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': entry is not an object", what, t->name);
    const cJSON *keys[3] = {NULL, NULL, NULL};
    unsigned seen = 0;
    for (const cJSON *k = e->child; k; k = k->next) {
        unsigned bit = entry_key_bit(k->string);
        if (!bit)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': unexpected key '%.40s'", what, t->name,
                               k->string);
        if (seen & bit)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': key '%s' appears twice", what, t->name,
                               k->string);
        seen |= bit;
        keys[bit >> 1] = k; /* 1 → 0, 2 → 1, 4 → 2 */
    }
    static const char *const names[3] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++)
        if (!keys[i])
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s': lacks key '%s'", what, t->name, names[i]);
    CREW_TRY(parse_dtype(keys[0], what, t));
    CREW_TRY(parse_shape(keys[1], what, t));
    CREW_TRY(parse_offsets(keys[2], data_len, what, t, sp));
    return check_size(t, sp, what);
}

static crew_status parse_metadata(const cJSON *m, const char *what, crew_st_file *out)
{
    if (!cJSON_IsObject(m)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: '__metadata__' is not an object", what);
    int n = cJSON_GetArraySize(m);
    out->metadata = calloc((size_t)n * 2 + 1, sizeof *out->metadata);
    if (!out->metadata) return CREW_OOM();
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: '__metadata__' key '%.40s' is not a string", what, kv->string);
        char **slot = out->metadata + 2 * out->n_metadata;
        slot[0] = strdup(kv->string);
        slot[1] = strdup(kv->valuestring);
        out->n_metadata++; /* counted before the check so crew_st_free releases a half-made pair */
        if (!slot[0] || !slot[1]) return CREW_OOM();
    }
    return CREW_OK;
}

/* ------------------------------------------------------------------ layout checks */

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names unique: sorts pointers to them (n log n, so a header of a million entries stays quick). */
static crew_status check_unique(const crew_st_tensor *t, int n, const char *what)
{
    if (n < 2) return CREW_OK;
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names) return CREW_OOM();
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    crew_status s = CREW_OK;
    for (int i = 1; i < n && !s; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s' appears twice in the header", what, names[i]);
    free(names);
    return s;
}

/* The tensors must tile [0, data_len) exactly: sorted by offsets, each begins where the last
 * ended. Sorts sp in place. */
static crew_status check_tiling(span *sp, int n, const crew_st_tensor *t, uint64_t data_len, const char *what)
{
    qsort(sp, (size_t)n, sizeof *sp, cmp_span);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (sp[i].begin < at)
            return crew_errorf(CREW_CODE_BAD_INPUT,
                               "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64
                               "] overlap",
                               what, t[sp[i - 1].index].name, sp[i - 1].begin, sp[i - 1].end, t[sp[i].index].name,
                               sp[i].begin, sp[i].end);
        if (sp[i].begin > at)
            return crew_errorf(CREW_CODE_BAD_INPUT,
                               "%s: bytes [%" PRIu64 ", %" PRIu64
                               ") of the data section belong to no tensor (before '%s')",
                               what, at, sp[i].begin, t[sp[i].index].name);
        at = sp[i].end;
    }
    if (at != data_len)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: the tensors cover %" PRIu64 " bytes but the data section holds %" PRIu64
                           " (trailing bytes belong to no tensor)",
                           what, at, data_len);
    return CREW_OK;
}

/* ------------------------------------------------------------------ reading */

static crew_status fill_file(const cJSON *root, const uint8_t *data, uint64_t data_len, const char *what,
                             crew_st_file *out)
{
    int n = cJSON_GetArraySize(root), n_meta = 0;
    out->tensors = calloc((size_t)n + 1, sizeof *out->tensors);
    span *sp = calloc((size_t)n + 1, sizeof *sp);
    crew_status s = out->tensors && sp ? CREW_OK : CREW_OOM();
    for (const cJSON *e = root->child; e && !s; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            s = n_meta++ ? crew_errorf(CREW_CODE_BAD_INPUT, "%s: '__metadata__' appears twice", what)
                         : parse_metadata(e, what, out);
            continue;
        }
        int i = out->n_tensors;
        sp[i].index = i;
        s = parse_entry(e, data_len, what, &out->tensors[i], &sp[i]);
        out->n_tensors++;
    }
    if (!s) s = check_unique(out->tensors, out->n_tensors, what);
    if (!s) s = check_tiling(sp, out->n_tensors, out->tensors, data_len, what);
    for (int i = 0; i < out->n_tensors && !s; i++) out->tensors[sp[i].index].data = data + sp[i].begin;
    free(sp);
    return s;
}

crew_status crew_st_parse(const uint8_t *bytes, size_t len, const char *what, crew_st_file *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_st_parse: NULL output");
    memset(out, 0, sizeof *out);
    if (!what) what = "safetensors";
    if (!bytes && len) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: NULL bytes", what);
    uint64_t hlen = 0;
    CREW_TRY(header_length(len, bytes, what, &hlen));
    cJSON *root = NULL;
    CREW_TRY(parse_header_json(bytes + 8, (size_t)hlen, what, &root));
    crew_status s = fill_file(root, bytes + 8 + hlen, (uint64_t)len - 8 - hlen, what, out);
    cJSON_Delete(root);
    if (s) {
        crew_st_free(out);
        return s;
    }
    out->bytes = (uint8_t *)bytes; /* borrowed: owns_bytes stays 0 */
    out->len = len;
    return CREW_OK;
}

crew_status crew_st_read(const char *path, crew_st_file *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_st_read: NULL output");
    memset(out, 0, sizeof *out);
    if (!path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_st_read: NULL path");
    uint8_t *bytes = NULL;
    size_t len = 0;
    CREW_TRY(crew_read_file(path, INT64_MAX, NULL, &bytes, &len));
    crew_status s = crew_st_parse(bytes, len, path, out);
    if (s) {
        free(bytes);
        return s;
    }
    out->owns_bytes = 1;
    return CREW_OK;
}

const crew_st_tensor *crew_st_find(const crew_st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *crew_st_metadata(const crew_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_metadata; i++)
        if (strcmp(f->metadata[2 * i], key) == 0) return f->metadata[2 * i + 1];
    return NULL;
}

void crew_st_free(crew_st_file *f)
{
    if (!f) return;
    if (f->owns_bytes) free(f->bytes);
    free(f->tensors);
    for (int i = 0; i < 2 * f->n_metadata; i++) free(f->metadata[i]);
    free(f->metadata);
    memset(f, 0, sizeof *f);
}

/* ------------------------------------------------------------------ writing */

static crew_status check_write_args(const crew_st_tensor *t, int n, const char *const *metadata, const char *path)
{
    if (!path || !path[0]) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_st_write: empty path");
    if (n < 0 || (n > 0 && !t)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: bad tensor list (n = %d)", path, n);
    for (int i = 0; i < n; i++) {
        size_t nlen = strnlen(t[i].name, NAME_CAP);
        const char *name = nlen < (size_t)NAME_CAP ? t[i].name : "(unterminated name)";
        if (nlen == 0 || nlen >= (size_t)NAME_CAP || strcmp(name, "__metadata__") == 0)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: tensor %d: name '%s' is empty, too long or reserved",
                               path, i, name);
        if (!crew_st_dtype_size(t[i].dtype))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: tensor '%s': unknown dtype %d", path, name,
                               (int)t[i].dtype);
        int bad_dim = t[i].ndim < 0 || t[i].ndim > CREW_ST_MAX_DIMS;
        for (int d = 0; !bad_dim && d < t[i].ndim; d++) bad_dim = t[i].shape[d] < 0;
        if (bad_dim || shape_count(t[i].shape, t[i].ndim) != t[i].count || (t[i].count > 0 && !t[i].data))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                               "%s: tensor '%s': shape, count (%lld) or data pointer is inconsistent", path, name,
                               (long long)t[i].count);
    }
    CREW_TRY(check_unique(t, n, path));
    for (int i = 0; metadata && metadata[i]; i += 2) {
        if (!metadata[i + 1])
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: metadata key '%s' has no value", path, metadata[i]);
        for (int j = 0; j < i; j += 2)
            if (strcmp(metadata[i], metadata[j]) == 0)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: metadata key '%s' appears twice", path,
                                   metadata[i]);
    }
    return CREW_OK;
}

/* Adds an integer as raw JSON text: cJSON prints doubles above 2^31 as "%g", which could turn
 * a large offset into "1e+15" that strict readers refuse. */
static int add_raw_int(cJSON *array, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON *item = cJSON_CreateRaw(buf);
    if (!item || !cJSON_AddItemToArray(array, item)) {
        cJSON_Delete(item);
        return 0;
    }
    return 1;
}

static int add_entry(cJSON *root, const crew_st_tensor *t, uint64_t begin, uint64_t end)
{
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToObject(root, t->name, e)) {
        cJSON_Delete(e);
        return 0;
    }
    cJSON *shape = NULL, *offsets = NULL;
    int ok = cJSON_AddStringToObject(e, "dtype", crew_st_dtype_name(t->dtype)) != NULL;
    if (ok) ok = (shape = cJSON_AddArrayToObject(e, "shape")) != NULL;
    for (int d = 0; ok && d < t->ndim; d++) ok = add_raw_int(shape, (uint64_t)t->shape[d]);
    if (ok) ok = (offsets = cJSON_AddArrayToObject(e, "data_offsets")) != NULL;
    return ok && add_raw_int(offsets, begin) && add_raw_int(offsets, end);
}

/* The header text, padded with spaces to a multiple of 8 bytes. */
static crew_status build_header(const crew_st_tensor *t, int n, const char *const *metadata, const char *path,
                                char **out, size_t *out_len)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && metadata && metadata[0]) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && metadata[i]; i += 2)
            ok = cJSON_AddStringToObject(meta, metadata[i], metadata[i + 1]) != NULL;
    }
    uint64_t at = 0;
    for (int i = 0; ok && i < n; i++) {
        uint64_t size = (uint64_t)t[i].count * crew_st_dtype_size(t[i].dtype);
        ok = add_entry(root, &t[i], at, at + size);
        at += size;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return CREW_OOM();
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    if (padded > CREW_ST_MAX_HEADER) {
        free(text);
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: header of %zu bytes exceeds the %u-byte limit", path,
                           padded, CREW_ST_MAX_HEADER);
    }
    char *buf = realloc(text, padded + 1);
    if (!buf) {
        free(text);
        return CREW_OOM();
    }
    memset(buf + len, ' ', padded - len);
    buf[padded] = '\0';
    *out = buf;
    *out_len = padded;
    return CREW_OK;
}

static crew_status write_stream(FILE *f, const char *tmp, const char *header, size_t hlen, const crew_st_tensor *t,
                                int n)
{
    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len_bytes, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    for (int i = 0; ok && i < n; i++) {
        size_t item = crew_st_dtype_size(t[i].dtype);
        if (t[i].count > 0) ok = fwrite(t[i].data, item, (size_t)t[i].count, f) == (size_t)t[i].count;
    }
    if (ok) ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok) ok = 0, err = errno;
    if (!ok) return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", tmp, strerror(err));
    return CREW_OK;
}

/* Makes the rename durable. Some file systems refuse fsync on a directory (EINVAL): not an error. */
static crew_status sync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
    char *dir = n ? strndup(path, n) : strdup(".");
    if (!dir) return CREW_OOM();
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    free(dir);
    if (fd < 0) return crew_errorf(CREW_CODE_IO, "%s: cannot open its directory to sync: %s", path, strerror(errno));
    int rc = fsync(fd), err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL)
        return crew_errorf(CREW_CODE_IO, "%s: cannot sync its directory: %s", path, strerror(err));
    return CREW_OK;
}

crew_status crew_st_write(const char *path, const crew_st_tensor *tensors, int n, const char *const *metadata)
{
    CREW_TRY(check_write_args(tensors, n, metadata, path));
    char *header = NULL;
    size_t hlen = 0;
    CREW_TRY(build_header(tensors, n, metadata, path, &header, &hlen));
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if (!tmp) {
        free(header);
        return CREW_OOM();
    }
    snprintf(tmp, tlen, "%s.tmp-%ld", path, (long)getpid());
    crew_status s = CREW_OK;
    /* Never through a link planted at the temporary's name; rename then replaces a link at path
     * itself, never what it points to. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !f) close(fd);
    int created = f != NULL;
    if (!f) s = crew_errorf(CREW_CODE_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (!s) s = write_stream(f, tmp, header, hlen, tensors, n); /* closes f */
    if (!s && rename(tmp, path) != 0)
        s = crew_errorf(CREW_CODE_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    if (s && created) unlink(tmp);
    if (!s) s = sync_dir(path);
    free(tmp);
    free(header);
    return s;
}
