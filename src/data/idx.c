/* idx.c — reading IDX files, raw or gzipped, through one byte-source abstraction so the header
 * checks, the size cap and the "no bytes after the data" check are the same for both.
 *
 * For gzip input the payload size cannot be known up front, but deflate never expands more than
 * about 1032:1, so a header promising more than that from the compressed size is refused before
 * anything is allocated. Reading one byte past the payload drives inflate to the end of the
 * stream, which is where zlib checks the gzip CRC and length trailer. */
#include "data/idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/mapped_file.h"
#include "core/status.h"

#define DEFLATE_MAX_RATIO 1032
#define IDX_TYPE_U8 0x08

typedef struct source {
    const uint8_t *buf;
    size_t len, pos; /* raw: read position */
    int gz;
    int ended;       /* gz: the last member's trailer has been checked */
    z_stream zs;
    const char *what;
} source;

static crew_status source_init(source *s, const void *buf, size_t len, const char *what)
{
    memset(s, 0, sizeof *s);
    s->buf = buf;
    s->len = len;
    s->what = what;
    s->gz = len >= 2 && s->buf[0] == 0x1f && s->buf[1] == 0x8b;
    if (!s->gz) return CREW_OK;
    if (inflateInit2(&s->zs, 16 + MAX_WBITS) != Z_OK) return CREW_OOM();
    s->zs.next_in = (Bytef *)s->buf;
    s->zs.avail_in = len > UINT32_MAX ? UINT32_MAX : (uInt)len;
    s->pos = s->zs.avail_in; /* input handed to zlib so far */
    return CREW_OK;
}

static void source_end(source *s)
{
    if (s->gz) inflateEnd(&s->zs);
}

/* After one gzip member ends: another member may follow (gzip allows concatenation). */
static crew_status gz_member_end(source *s)
{
    if (s->zs.avail_in == 0 && s->pos < s->len) { /* inputs over 4 GiB come in slices */
        size_t more = s->len - s->pos;
        s->zs.next_in = (Bytef *)s->buf + s->pos;
        s->zs.avail_in = more > UINT32_MAX ? UINT32_MAX : (uInt)more;
        s->pos += s->zs.avail_in;
    }
    if (s->zs.avail_in == 0) {
        s->ended = 1;
        return CREW_OK;
    }
    if (s->zs.avail_in < 2 || s->zs.next_in[0] != 0x1f || s->zs.next_in[1] != 0x8b)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: stray bytes after the gzip stream", s->what);
    inflateReset(&s->zs);
    return CREW_OK;
}

/* Inflates up to n bytes into dst; *got says how many came (fewer only at the end). */
static crew_status gz_read(source *s, uint8_t *dst, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n && !s->ended) {
        if (s->zs.avail_in == 0 && s->pos < s->len) {
            size_t more = s->len - s->pos;
            s->zs.next_in = (Bytef *)s->buf + s->pos;
            s->zs.avail_in = more > UINT32_MAX ? UINT32_MAX : (uInt)more;
            s->pos += s->zs.avail_in;
        }
        size_t want = n - *got;
        s->zs.next_out = dst + *got;
        s->zs.avail_out = want > UINT32_MAX ? UINT32_MAX : (uInt)want;
        uInt before = s->zs.avail_out;
        int rc = inflate(&s->zs, Z_NO_FLUSH);
        *got += before - s->zs.avail_out;
        if (rc == Z_STREAM_END) CREW_TRY(gz_member_end(s));
        else if (rc == Z_BUF_ERROR && s->zs.avail_in == 0 && s->pos == s->len)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the gzip stream is truncated", s->what);
        else if (rc != Z_OK && rc != Z_BUF_ERROR)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: corrupt gzip data (%s)", s->what,
                               s->zs.msg ? s->zs.msg : zError(rc));
    }
    return CREW_OK;
}

static crew_status source_read(source *s, void *dst, size_t n, size_t *got)
{
    if (s->gz) return gz_read(s, dst, n, got);
    size_t left = s->len - s->pos;
    *got = n < left ? n : left;
    if (*got) memcpy(dst, s->buf + s->pos, *got);
    s->pos += *got;
    return CREW_OK;
}

/* Reads exactly n bytes or fails naming what was being read. */
static crew_status source_need(source *s, void *dst, size_t n, const char *part)
{
    size_t got;
    CREW_TRY(source_read(s, dst, n, &got));
    if (got < n)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: truncated: %s needs %zu bytes but only %zu remain", s->what, part,
                           n, got);
    return CREW_OK;
}

static crew_status parse_header(source *s, crew_idx *out)
{
    uint8_t magic[4], dim[4];
    CREW_TRY(source_need(s, magic, 4, "the magic number"));
    if (magic[0] || magic[1])
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: not an IDX file (magic %02x%02x%02x%02x)", s->what, magic[0],
                           magic[1], magic[2], magic[3]);
    if (magic[2] != IDX_TYPE_U8)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: IDX element type 0x%02x is not supported (only 0x08, unsigned byte)",
                           s->what, magic[2]);
    if (magic[3] < 1 || magic[3] > CREW_IDX_MAX_DIMS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: IDX file has %d dimensions (crew reads 1 to %d)", s->what, magic[3],
                           CREW_IDX_MAX_DIMS);
    out->ndim = magic[3];
    out->count = 1;
    for (int i = 0; i < out->ndim; i++) {
        CREW_TRY(source_need(s, dim, 4, "the dimension list"));
        out->dims[i] = (int64_t)dim[0] << 24 | (int64_t)dim[1] << 16 | (int64_t)dim[2] << 8 | dim[3];
        if (__builtin_mul_overflow(out->count, out->dims[i], &out->count) || out->count > CREW_IDX_MAX_BYTES)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: IDX dimensions describe more than %lld bytes", s->what,
                               (long long)CREW_IDX_MAX_BYTES);
    }
    return CREW_OK;
}

/* The payload can not be larger than the input allows: refuse before allocating. */
static crew_status check_plausible(const source *s, const crew_idx *x)
{
    size_t header = 4 + 4 * (size_t)x->ndim;
    if (!s->gz && (uint64_t)x->count > s->len - header)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: truncated: dimensions say %lld elements but the file holds %zu",
                           s->what, (long long)x->count, s->len - header);
    if (s->gz && (uint64_t)x->count / DEFLATE_MAX_RATIO > s->len)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: truncated: dimensions say %lld elements, more than %zu compressed bytes can hold",
                           s->what, (long long)x->count, s->len);
    return CREW_OK;
}

static crew_status parse_all(source *s, crew_idx *out)
{
    CREW_TRY(parse_header(s, out));
    CREW_TRY(check_plausible(s, out));
    out->data = malloc(out->count ? (size_t)out->count : 1);
    if (!out->data) return CREW_OOM();
    size_t got;
    CREW_TRY(source_read(s, out->data, (size_t)out->count, &got));
    if (got < (size_t)out->count)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: truncated: dimensions say %lld elements but the file holds %zu",
                           s->what, (long long)out->count, got);
    uint8_t extra;
    CREW_TRY(source_read(s, &extra, 1, &got));
    if (got)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: more data than its dimensions (%lld elements) describe", s->what,
                           (long long)out->count);
    return CREW_OK;
}

crew_status crew_idx_parse(const void *buf, size_t len, const char *what, crew_idx *out)
{
    if (!out || (!buf && len)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_idx_parse: NULL argument");
    if (!what) what = "(idx)";
    memset(out, 0, sizeof *out);
    source s;
    CREW_TRY(source_init(&s, buf ? buf : "", len, what));
    crew_status st = parse_all(&s, out);
    source_end(&s);
    if (st) crew_idx_free(out);
    return st;
}

crew_status crew_idx_read(const char *path, crew_idx *out)
{
    if (!path || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_idx_read: NULL argument");
    memset(out, 0, sizeof *out);
    uint8_t *buf = NULL;
    size_t len = 0;
    /* The whole file into memory: compressed MNIST-family files are tens of megabytes. */
    CREW_TRY(crew_read_file(path, CREW_IDX_MAX_BYTES + 64, "an IDX file", &buf, &len));
    crew_status s = crew_idx_parse(buf, len, path, out);
    free(buf);
    return s;
}

void crew_idx_free(crew_idx *x)
{
    if (!x) return;
    free(x->data);
    memset(x, 0, sizeof *x);
}
