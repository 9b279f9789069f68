/* npy.c — NumPy .npy files: header parsing (versions 1.0, 2.0, 3.0), read-only memory maps, and
 * a writer whose output numpy.load reads.
 *
 * The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a final '\n'. It is parsed here with a small bounded scanner over
 * [p, end) — the header is not NUL-terminated inside the file — so hostile bytes can neither run
 * past the buffer nor make the parser loop. */
#include "data/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mapped_file.h"
#include "core/status.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64 /* NumPy pads the header so the data starts on a 64-byte boundary */

static const struct {
    crew_npy_dtype dtype;
    const char *descr; /* what crew writes */
    const char *alias; /* another spelling NumPy may produce, or NULL */
    const char *name;  /* manifest spelling */
    size_t size;
} dtype_table[] = {
    {CREW_DTYPE_U8, "|u1", "<u1", "uint8", 1},   {CREW_DTYPE_I32, "<i4", NULL, "int32", 4},
    {CREW_DTYPE_F32, "<f4", NULL, "float32", 4}, {CREW_DTYPE_U16, "<u2", NULL, "uint16", 2},
    {CREW_DTYPE_I64, "<i8", NULL, "int64", 8},
};
#define N_DTYPES (sizeof dtype_table / sizeof dtype_table[0])

size_t crew_npy_dtype_size(crew_npy_dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dtype == t) return dtype_table[i].size;
    return 0;
}

const char *crew_npy_dtype_descr(crew_npy_dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dtype == t) return dtype_table[i].descr;
    return "?";
}

const char *crew_npy_dtype_name(crew_npy_dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dtype == t) return dtype_table[i].name;
    return "?";
}

int crew_npy_dtype_from_name(const char *name, crew_npy_dtype *out)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(dtype_table[i].name, name)) {
            *out = dtype_table[i].dtype;
            return 1;
        }
    return 0;
}

/* ---------------------------------------------------------------- header scanner */

typedef struct scan {
    const char *p, *end;
    const char *what;
} scan;

static void skip_ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static crew_status expect_char(scan *s, char c)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p != c)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: expected '%c'", s->what, c);
    s->p++;
    return CREW_OK;
}

/* A quoted Python string without escapes, copied into buf. */
static crew_status scan_string(scan *s, char *buf, size_t len)
{
    skip_ws(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: expected a quoted string", s->what);
    char q = *s->p++;
    size_t n = 0;
    while (s->p < s->end && *s->p != q) {
        if (*s->p == '\\' || n + 1 >= len)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: unexpected string", s->what);
        buf[n++] = *s->p++;
    }
    if (s->p >= s->end)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: unterminated string", s->what);
    s->p++;
    buf[n] = '\0';
    return CREW_OK;
}

static int scan_word(scan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n)) return 0;
    s->p += n;
    return 1;
}

static crew_status scan_bool(scan *s, int *out)
{
    skip_ws(s);
    if (scan_word(s, "True")) *out = 1;
    else if (scan_word(s, "False")) *out = 0;
    else return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: fortran_order must be True or False", s->what);
    return CREW_OK;
}

static crew_status scan_int(scan *s, int64_t *out)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p < '0' || *s->p > '9')
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: shape entries must be non-negative integers", s->what);
    int64_t v = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        int d = *s->p++ - '0';
        if (v > (INT64_MAX - d) / 10)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: a shape entry overflows 64 bits", s->what);
        v = v * 10 + d;
    }
    if (s->p < s->end && *s->p == 'L') s->p++; /* Python 2 long literals: (3L, 4L) */
    *out = v;
    return CREW_OK;
}

/* (a, b, c) or (a,) or (): the trailing comma is optional, as in Python. */
static crew_status scan_shape(scan *s, crew_npy *out)
{
    CREW_TRY(expect_char(s, '('));
    out->ndim = 0;
    for (;;) {
        skip_ws(s);
        if (s->p < s->end && *s->p == ')') break;
        if (out->ndim == CREW_NPY_MAX_DIMS)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: array has more than %d dimensions", s->what, CREW_NPY_MAX_DIMS);
        CREW_TRY(scan_int(s, &out->shape[out->ndim++]));
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') s->p++;
        else if (s->p >= s->end || *s->p != ')')
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: malformed shape tuple", s->what);
    }
    s->p++;
    return CREW_OK;
}

static crew_status scan_descr(scan *s, crew_npy *out)
{
    skip_ws(s);
    if (s->p < s->end && *s->p == '[')
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: structured dtypes are not supported", s->what);
    char d[32];
    CREW_TRY(scan_string(s, d, sizeof d));
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(d, dtype_table[i].descr) || (dtype_table[i].alias && !strcmp(d, dtype_table[i].alias))) {
            out->dtype = dtype_table[i].dtype;
            return CREW_OK;
        }
    if (d[0] == '>')
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: big-endian dtype '%s' is not supported (save it with arr.astype('<%s'))",
                           s->what, d, d + 1);
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: unsupported dtype '%s' (crew reads |u1, <u2, <i4, <i8, <f4)", s->what, d);
}

/* The dict: exactly the keys descr, fortran_order and shape, then only padding. */
static crew_status scan_dict(scan *s, crew_npy *out)
{
    int seen_descr = 0, seen_order = 0, seen_shape = 0, fortran = 0;
    CREW_TRY(expect_char(s, '{'));
    for (;;) {
        skip_ws(s);
        if (s->p < s->end && *s->p == '}') break;
        char key[32];
        CREW_TRY(scan_string(s, key, sizeof key));
        CREW_TRY(expect_char(s, ':'));
        if (!strcmp(key, "descr") && !seen_descr++) CREW_TRY(scan_descr(s, out));
        else if (!strcmp(key, "fortran_order") && !seen_order++) CREW_TRY(scan_bool(s, &fortran));
        else if (!strcmp(key, "shape") && !seen_shape++) CREW_TRY(scan_shape(s, out));
        else return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: unexpected or repeated key '%s'", s->what, key);
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') s->p++;
        else if (s->p >= s->end || *s->p != '}')
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: expected ',' or '}'", s->what);
    }
    s->p++;
    skip_ws(s);
    if (s->p != s->end) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: text after the dict", s->what);
    if (!seen_descr || !seen_order || !seen_shape)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: bad .npy header: it needs 'descr', 'fortran_order' and 'shape'", s->what);
    if (fortran)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: Fortran-order arrays are not supported (save np.ascontiguousarray(arr))",
                           s->what);
    return CREW_OK;
}

/* ---------------------------------------------------------------- parsing */

static void format_shape(const crew_npy *a, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < a->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)a->shape[i]);
    if (used < len) snprintf(buf + used, len - used, a->ndim == 1 ? ",)" : ")");
}

/* Element count from the shape, then the data size against what the file holds. */
static crew_status check_size(const crew_npy *a, size_t avail, size_t header, const char *what, int64_t *count)
{
    char shp[256];
    format_shape(a, shp, sizeof shp);
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        if (__builtin_mul_overflow(n, a->shape[i], &n))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: shape %s is too large", what, shp);
    size_t item = crew_npy_dtype_size(a->dtype);
    int64_t have = (int64_t)(avail / item);
    if (n > have)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: header says shape %s (%lld elements of %s) but the file holds only %lld elements "
                           "after its %zu-byte header (truncated?)",
                           what, shp, (long long)n, crew_npy_dtype_descr(a->dtype), (long long)have, header);
    if ((size_t)n * item != avail)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %zu stray bytes after the %lld elements of shape %s", what,
                           avail - (size_t)n * item, (long long)n, shp);
    *count = n;
    return CREW_OK;
}

crew_status crew_npy_parse(const void *buf, size_t len, const char *what, crew_npy *out)
{
    if (!buf || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_npy_parse: NULL argument");
    if (!what) what = "(npy)";
    memset(out, 0, sizeof *out);
    const uint8_t *b = buf;
    if (len < 10) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: too short to be a .npy file (%zu bytes)", what, len);
    if (memcmp(b, NPY_MAGIC, NPY_MAGIC_LEN)) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a .npy file (bad magic)", what);
    int major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: unsupported .npy format version %d.%d", what, major, minor);
    size_t prefix = major == 1 ? 10 : 12;
    if (len < prefix) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: too short to be a .npy file (%zu bytes)", what, len);
    size_t hlen = major == 1 ? (size_t)b[8] | (size_t)b[9] << 8
                             : (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (hlen > len - prefix)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header length %zu runs past the end of the file (%zu bytes)", what,
                           hlen, len);
    scan s = {(const char *)b + prefix, (const char *)b + prefix + hlen, what};
    CREW_TRY(scan_dict(&s, out));
    size_t header = prefix + hlen;
    CREW_TRY(check_size(out, len - header, header, what, &out->count));
    out->data = b + header;
    return CREW_OK;
}

crew_status crew_npy_open(const char *path, crew_npy *out)
{
    if (!path || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_npy_open: NULL argument");
    memset(out, 0, sizeof *out);
    void *map;
    size_t len;
    CREW_TRY(crew_map_file(path, &map, &len));
    if (len < 10) {
        crew_unmap_file(map, len);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: too short to be a .npy file (%zu bytes)", path, len);
    }
    crew_status s = crew_npy_parse(map, len, path, out);
    if (s) {
        munmap(map, len);
        memset(out, 0, sizeof *out);
        return s;
    }
    out->map = map;
    out->map_len = len;
    return CREW_OK;
}

void crew_npy_close(crew_npy *a)
{
    if (!a) return;
    if (a->map) munmap(a->map, a->map_len);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- writing */

/* The v1.0 header NumPy writes: the dict, spaces, '\n', total a multiple of 64 bytes. */
static crew_status build_header(crew_npy_dtype dtype, int ndim, const int64_t *shape, char *buf, size_t cap, size_t *len)
{
    int n = snprintf(buf + 10, cap - 10, "{'descr': '%s', 'fortran_order': False, 'shape': (", crew_npy_dtype_descr(dtype));
    size_t used = 10 + (size_t)n;
    for (int i = 0; i < ndim; i++)
        used += (size_t)snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    used += (size_t)snprintf(buf + used, cap - used, "%s}", ndim == 1 ? ",), " : "), ");
    size_t total = (used + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    if (total > cap || total - 10 > 65535) return crew_errorf(CREW_CODE_INTERNAL, "npy header too long");
    memset(buf + used, ' ', total - used - 1);
    buf[total - 1] = '\n';
    memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)((total - 10) & 0xff);
    buf[9] = (char)((total - 10) >> 8);
    *len = total;
    return CREW_OK;
}

static crew_status write_all(int fd, const void *data, size_t len, const char *path)
{
    const char *p = data;
    while (len) {
        size_t chunk = len < ((size_t)1 << 30) ? len : (size_t)1 << 30;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return crew_errorf(CREW_CODE_IO, "%s: write: %s", path, w < 0 ? strerror(errno) : "no progress");
        p += w;
        len -= (size_t)w;
    }
    return CREW_OK;
}

static crew_status check_write_args(const char *path, crew_npy_dtype dtype, int ndim, const int64_t *shape,
                                    const void *data, size_t *bytes)
{
    if (!path || (ndim > 0 && !shape))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_npy_write: NULL argument");
    if (!crew_npy_dtype_size(dtype))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: unknown dtype %d", path, (int)dtype);
    if (ndim < 0 || ndim > CREW_NPY_MAX_DIMS)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: ndim %d outside [0, %d]", path, ndim, CREW_NPY_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: bad shape entry %d", path, i);
    if ((uint64_t)n > SIZE_MAX / crew_npy_dtype_size(dtype))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: array too large", path);
    *bytes = (size_t)n * crew_npy_dtype_size(dtype);
    if (*bytes && !data) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: NULL data", path);
    return CREW_OK;
}

crew_status crew_npy_write(const char *path, crew_npy_dtype dtype, int ndim, const int64_t *shape, const void *data)
{
    size_t bytes = 0, hlen = 0;
    CREW_TRY(check_write_args(path, dtype, ndim, shape, data, &bytes));
    char header[512];
    CREW_TRY(build_header(dtype, ndim, shape, header, sizeof header, &hlen));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return crew_errorf(CREW_CODE_IO, "%s: %s", path, strerror(errno));
    crew_status s = write_all(fd, header, hlen, path);
    if (!s) s = write_all(fd, data, bytes, path);
    if (close(fd) != 0 && !s) s = crew_errorf(CREW_CODE_IO, "%s: close: %s", path, strerror(errno));
    return s;
}
