/* tb_writer.c — TensorBoard event files: Event/Summary/Value messages encoded by hand in
 * protobuf wire format, framed as TFRecords (see tb_writer.h). Each event is sized first, then
 * encoded into one scratch buffer together with its record header and footer, so a record
 * reaches the FILE in one fwrite. */
#include "telemetry/tb_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "telemetry/crc32c.h"
#include "telemetry/tb_reader.h"

struct crew_tb_writer {
    FILE *f;
    char *path;
    uint8_t *buf; /* [cap] bytes: scratch for one framed record */
    size_t cap;
    int failed;   /* a write failed: the file may end in a partial record, so write no more */
};

/* ---------------------------------------------------------------- protobuf wire format */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_key(uint8_t *p, unsigned field, unsigned wire) { return put_varint(p, (uint64_t)field << 3 | wire); }

static uint8_t *put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

/* A length-delimited field's key and length prefix (its contents follow). */
static uint8_t *put_len_prefix(uint8_t *p, unsigned field, size_t len)
{
    return put_varint(put_key(p, field, WIRE_LEN), (uint64_t)len);
}

/* Every key used here has a field number below 16, so it takes one byte. */
static size_t len_field_size(size_t len) { return 1 + varint_len(len) + len; }

/* Value { tag = 1; simple_value = 2 }: the message's own size, without its key and length. */
static size_t value_size(size_t tag_len) { return len_field_size(tag_len) + 1 + 4; }

static uint8_t *put_value(uint8_t *p, const char *tag, size_t tag_len, float value)
{
    p = put_len_prefix(p, CREW_TB_VALUE_TAG, tag_len);
    memcpy(p, tag, tag_len);
    p += tag_len;
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return put_le32(put_key(p, CREW_TB_VALUE_SIMPLE_VALUE, WIRE_FIXED32), bits);
}

/* ---------------------------------------------------------------- records */

/* Makes room for a record of `len` data bytes plus framing. */
static crew_status reserve(crew_tb_writer *w, size_t len)
{
    if (len > CREW_TB_MAX_RECORD)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: an event of %zu bytes is larger than the %llu-byte limit",
                           w->path, len, (unsigned long long)CREW_TB_MAX_RECORD);
    size_t need = CREW_TB_RECORD_HEADER + len + CREW_TB_RECORD_FOOTER;
    if (need <= w->cap) return CREW_OK;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < need) cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b) return CREW_OOM();
    w->buf = b;
    w->cap = cap;
    return CREW_OK;
}

/* Frames the `len` data bytes already at buf + CREW_TB_RECORD_HEADER and writes the record. */
static crew_status write_record(crew_tb_writer *w, size_t len)
{
    uint8_t *b = w->buf;
    put_le64(b, (uint64_t)len);
    put_le32(b + 8, crew_crc32c_mask(crew_crc32c(b, 8)));
    put_le32(b + CREW_TB_RECORD_HEADER + len, crew_crc32c_mask(crew_crc32c(b + CREW_TB_RECORD_HEADER, len)));
    size_t total = CREW_TB_RECORD_HEADER + len + CREW_TB_RECORD_FOOTER;
    errno = 0;
    if (fwrite(b, 1, total, w->f) != total) {
        w->failed = 1;
        return crew_errorf(CREW_CODE_IO, "%s: write: %s", w->path, errno ? strerror(errno) : "short write");
    }
    return CREW_OK;
}

static crew_status check_writable(const crew_tb_writer *w)
{
    if (w->failed)
        return crew_errorf(CREW_CODE_IO, "%s: an earlier write failed, so no more events are written", w->path);
    return CREW_OK;
}

/* The Event's fields other than summary/file_version, in field order. */
static uint8_t *put_event_head(uint8_t *p, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    p = put_le64(put_key(p, CREW_TB_EVENT_WALL_TIME, WIRE_FIXED64), bits);
    /* int64 fields are plain varints of the two's-complement value (not zigzag). */
    return put_varint(put_key(p, CREW_TB_EVENT_STEP, WIRE_VARINT), (uint64_t)step);
}

static size_t event_head_size(int64_t step) { return 1 + 8 + 1 + varint_len((uint64_t)step); }

double crew_tb_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static crew_status write_file_version(crew_tb_writer *w)
{
    double now = crew_tb_wall_time();
    size_t vlen = strlen(CREW_TB_FILE_VERSION);
    size_t len = event_head_size(0) + len_field_size(vlen);
    CREW_TRY(reserve(w, len));
    uint8_t *p = put_event_head(w->buf + CREW_TB_RECORD_HEADER, now, 0);
    p = put_len_prefix(p, CREW_TB_EVENT_FILE_VERSION, vlen);
    memcpy(p, CREW_TB_FILE_VERSION, vlen);
    return write_record(w, len);
}

crew_status crew_tb_scalars(crew_tb_writer *w, int64_t step, double wall_time, const char *const *tags,
                            const float *values, int n)
{
    if (!w || !tags || !values || n < 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_scalars: needs a writer and n >= 1 tags and values (n = %d)", n);
    for (int i = 0; i < n; i++)
        if (!tags[i] || !tags[i][0])
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: scalar %d of step %lld has no tag", w->path, i, (long long)step);
    CREW_TRY(check_writable(w));
    size_t summary = 0;
    for (int i = 0; i < n; i++) summary += len_field_size(value_size(strlen(tags[i])));
    size_t len = event_head_size(step) + len_field_size(summary);
    CREW_TRY(reserve(w, len));
    uint8_t *p = put_event_head(w->buf + CREW_TB_RECORD_HEADER, wall_time, step);
    p = put_len_prefix(p, CREW_TB_EVENT_SUMMARY, summary);
    for (int i = 0; i < n; i++) {
        size_t tag_len = strlen(tags[i]);
        p = put_len_prefix(p, CREW_TB_SUMMARY_VALUE, value_size(tag_len));
        p = put_value(p, tags[i], tag_len, values[i]);
    }
    return write_record(w, len);
}

crew_status crew_tb_session_start(crew_tb_writer *w, int64_t step, double wall_time, const char *msg)
{
    if (!w) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_session_start: no writer");
    CREW_TRY(check_writable(w));
    size_t mlen = msg ? strlen(msg) : 0;
    if (mlen > 4096) mlen = 4096; /* a note for people; TensorBoard only looks at the status */
    size_t session = 1 + varint_len(CREW_TB_SESSION_START) + (mlen ? len_field_size(mlen) : 0);
    size_t len = event_head_size(step) + len_field_size(session);
    CREW_TRY(reserve(w, len));
    uint8_t *p = put_event_head(w->buf + CREW_TB_RECORD_HEADER, wall_time, step);
    p = put_len_prefix(p, CREW_TB_EVENT_SESSION_LOG, session);
    p = put_varint(put_key(p, CREW_TB_SESSION_STATUS, WIRE_VARINT), CREW_TB_SESSION_START);
    if (mlen) {
        p = put_len_prefix(p, CREW_TB_SESSION_MSG, mlen);
        memcpy(p, msg, mlen);
    }
    return write_record(w, len);
}

crew_status crew_tb_scalar(crew_tb_writer *w, const char *tag, int64_t step, double wall_time, float value)
{
    return crew_tb_scalars(w, step, wall_time, &tag, &value, 1);
}

/* ---------------------------------------------------------------- files */

static crew_status writer_on(FILE *f, const char *path, crew_tb_writer **out)
{
    crew_tb_writer *w = calloc(1, sizeof *w);
    char *copy = strdup(path);
    if (!w || !copy) {
        free(w);
        free(copy);
        fclose(f);
        return CREW_OOM();
    }
    w->f = f;
    w->path = copy;
    crew_status s = write_file_version(w);
    if (s) {
        crew_tb_close(w);
        return s;
    }
    *out = w;
    return CREW_OK;
}

crew_status crew_tb_open_file(const char *path, crew_tb_writer **out)
{
    if (!path || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_open_file: path and out are required");
    *out = NULL;
    FILE *f = fopen(path, "wb");
    if (!f) return crew_errorf(CREW_CODE_IO, "%s: cannot create: %s", path, strerror(errno));
    return writer_on(f, path, out);
}

/* mkdir -p dir. */
static crew_status make_dirs(const char *dir)
{
    size_t n = strlen(dir);
    char *buf = malloc(n + 1);
    if (!buf) return CREW_OOM();
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        struct stat st;
        if (mkdir(buf, 0755) != 0 && !(errno == EEXIST && stat(buf, &st) == 0 && S_ISDIR(st.st_mode))) {
            crew_status s = crew_errorf(CREW_CODE_IO, "%s: cannot create directory: %s", buf,
                                        errno == EEXIST ? "a file of that name exists" : strerror(errno));
            free(buf);
            return s;
        }
        buf[i] = saved;
    }
    free(buf);
    return CREW_OK;
}

/* The host name with anything but [A-Za-z0-9._-] replaced, so it is safe in a file name. */
static void host_name(char *buf, size_t len)
{
    if (gethostname(buf, len) != 0 || !buf[0]) snprintf(buf, len, "localhost");
    buf[len - 1] = '\0';
    for (char *c = buf; *c; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '.' || *c == '-' || *c == '_';
        if (!ok) *c = '_';
    }
}

crew_status crew_tb_open(const char *dir, crew_tb_writer **out)
{
    if (!dir || !dir[0] || !out)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_open: a directory and out are required");
    *out = NULL;
    CREW_TRY(make_dirs(dir));
    char host[256];
    host_name(host, sizeof host);
    long long secs = (long long)time(NULL);
    size_t plen = strlen(dir) + strlen(host) + 96;
    char *path = malloc(plen);
    if (!path) return CREW_OOM();
    int err = 0;
    /* "x": never overwrite; another writer of this process in the same second gets a counter. */
    for (int k = 0; k < 1000; k++) {
        if (k == 0)
            snprintf(path, plen, "%s/events.out.tfevents.%lld.%s.%ld.crew", dir, secs, host, (long)getpid());
        else
            snprintf(path, plen, "%s/events.out.tfevents.%lld.%s.%ld.%d.crew", dir, secs, host, (long)getpid(), k);
        FILE *f = fopen(path, "wbx");
        if (f) {
            crew_status s = writer_on(f, path, out);
            free(path);
            return s;
        }
        err = errno;
        if (err != EEXIST) break;
    }
    crew_status s = crew_errorf(CREW_CODE_IO, "%s: cannot create: %s", path, strerror(err));
    free(path);
    return s;
}

const char *crew_tb_path(const crew_tb_writer *w) { return w ? w->path : ""; }

crew_status crew_tb_flush(crew_tb_writer *w)
{
    if (!w) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_flush: no writer");
    CREW_TRY(check_writable(w));
    errno = 0;
    if (fflush(w->f) != 0) {
        w->failed = 1;
        return crew_errorf(CREW_CODE_IO, "%s: write: %s", w->path, errno ? strerror(errno) : "flush failed");
    }
    return CREW_OK;
}

void crew_tb_close(crew_tb_writer *w)
{
    if (!w) return;
    if (w->f) fclose(w->f); /* flushes */
    free(w->path);
    free(w->buf);
    free(w);
}
