/* tb_reader.c — event files from memory: TFRecord framing checked record by record, then a
 * minimal protobuf walk of Event -> Summary -> Value and Event -> SessionLog. No recursion: only
 * those message types are looked into, everything else is skipped by its wire type, so nesting
 * depth in the input costs nothing. Every read is bounds-checked against the end of its enclosing
 * message. crew_tb_read_run reads a run's directory the way TensorBoard shows it. */
#include "telemetry/tb_reader.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mapped_file.h"
#include "core/status.h"
#include "telemetry/crc32c.h"
#include "telemetry/tb_writer.h"

/* ---------------------------------------------------------------- protobuf wire format */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
#define PB_MAX_FIELD 536870911u /* 2^29 - 1 */

typedef struct pb_field {
    uint32_t number;
    unsigned wire;
    uint64_t u;          /* the value of a varint, fixed64 or fixed32 field */
    const uint8_t *data; /* the contents of a length-delimited field */
    size_t len;          /* bytes at data */
} pb_field;

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* A varint at *p: at most 10 bytes, the 10th holding only bit 63. Returns NULL or what is wrong. */
static const char *pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (*p >= end) return "a varint runs past the end of its message";
        uint8_t b = *(*p)++;
        if (i == 9 && b > 1) return "a varint overflows 64 bits";
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return NULL;
        }
    }
    return "a varint is longer than 10 bytes";
}

/* The field at *p, moving *p past it. Returns NULL or what is wrong. */
static const char *pb_next(const uint8_t **p, const uint8_t *end, pb_field *f)
{
    uint64_t key;
    const char *err = pb_varint(p, end, &key);
    if (err) return err;
    if (key >> 3 == 0 || key >> 3 > PB_MAX_FIELD) return "a field number is 0 or above 2^29-1";
    f->number = (uint32_t)(key >> 3);
    f->wire = (unsigned)(key & 7);
    size_t left = (size_t)(end - *p);
    switch (f->wire) {
    case WIRE_VARINT:
        return pb_varint(p, end, &f->u);
    case WIRE_FIXED64:
        if (left < 8) return "a fixed64 field runs past the end of its message";
        f->u = le64(*p);
        *p += 8;
        return NULL;
    case WIRE_FIXED32:
        if (left < 4) return "a fixed32 field runs past the end of its message";
        f->u = le32(*p);
        *p += 4;
        return NULL;
    case WIRE_LEN:
        if ((err = pb_varint(p, end, &f->u))) return err;
        if (f->u > (uint64_t)(end - *p)) return "a length-delimited field runs past the end of its message";
        f->data = *p;
        f->len = (size_t)f->u;
        *p += f->len;
        return NULL;
    case 3:
    case 4:
        return "a field uses the group wire types (3, 4), which event files never hold";
    default:
        return "a field has wire type 6 or 7, which do not exist";
    }
}

/* ---------------------------------------------------------------- records */

typedef struct parse_state {
    const char *what;    /* the file, for messages */
    int64_t index;       /* the record being parsed */
    size_t offset;       /* its byte offset in the file */
    crew_tb_callback cb;
    crew_tb_start_callback on_start;
    void *user;
    char *tag;           /* [tag_cap] scratch: the current tag, NUL-terminated */
    size_t tag_cap;
} parse_state;

static crew_status rec_error(const parse_state *st, const char *fmt, ...) CREW_PRINTF(2, 3);

static crew_status rec_error(const parse_state *st, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: record %lld at offset %zu: %s", st->what, (long long)st->index,
                       st->offset, msg);
}

static const char *wire_name(unsigned wire)
{
    static const char *const names[8] = {"varint", "fixed64", "length-delimited", "group start",
                                         "group end", "fixed32", "6", "7"};
    return names[wire & 7];
}

/* A known field must have the wire type its declaration implies. */
static crew_status expect_wire(const parse_state *st, const char *msg, const char *name, const pb_field *f, unsigned wire)
{
    if (f->wire == wire) return CREW_OK;
    return rec_error(st, "%s field %u (%s) has wire type %s, expected %s", msg, f->number, name, wire_name(f->wire),
                     wire_name(wire));
}

typedef struct event_head {
    double wall_time;
    int64_t step;
    int session_start;   /* it holds a SessionLog whose status is START */
} event_head;

/* A SessionLog: its status (a varint enum) and msg (a string) are checked; the rest is skipped. */
static crew_status parse_session_log(const parse_state *st, const uint8_t *p, const uint8_t *end, event_head *h)
{
    uint64_t status = 0;
    while (p < end) {
        pb_field f;
        const char *err = pb_next(&p, end, &f);
        if (err) return rec_error(st, "session_log: %s", err);
        if (f.number == CREW_TB_SESSION_STATUS) {
            CREW_TRY(expect_wire(st, "session_log", "status", &f, WIRE_VARINT));
            status = f.u;
        } else if (f.number == CREW_TB_SESSION_MSG) {
            CREW_TRY(expect_wire(st, "session_log", "msg", &f, WIRE_LEN));
        }
    }
    if (status == CREW_TB_SESSION_START) h->session_start = 1;
    return CREW_OK;
}

/* Validates the Event's top-level fields and takes wall_time and step (the last of each wins,
 * as in protobuf; they may come after the summary). */
static crew_status parse_event_head(const parse_state *st, const uint8_t *p, const uint8_t *end, event_head *h)
{
    h->wall_time = 0;
    h->step = 0;
    h->session_start = 0;
    while (p < end) {
        pb_field f;
        const char *err = pb_next(&p, end, &f);
        if (err) return rec_error(st, "event: %s", err);
        if (f.number == CREW_TB_EVENT_WALL_TIME) {
            CREW_TRY(expect_wire(st, "event", "wall_time", &f, WIRE_FIXED64));
            memcpy(&h->wall_time, &f.u, sizeof h->wall_time);
        } else if (f.number == CREW_TB_EVENT_STEP) {
            CREW_TRY(expect_wire(st, "event", "step", &f, WIRE_VARINT));
            h->step = (int64_t)f.u;
        } else if (f.number == CREW_TB_EVENT_FILE_VERSION) {
            CREW_TRY(expect_wire(st, "event", "file_version", &f, WIRE_LEN));
        } else if (f.number == CREW_TB_EVENT_SUMMARY) {
            CREW_TRY(expect_wire(st, "event", "summary", &f, WIRE_LEN));
        } else if (f.number == CREW_TB_EVENT_SESSION_LOG) {
            CREW_TRY(expect_wire(st, "event", "session_log", &f, WIRE_LEN));
            CREW_TRY(parse_session_log(st, f.data, f.data + f.len, h));
        }
    }
    return CREW_OK;
}

/* Copies a tag into the NUL-terminated scratch buffer. */
static crew_status set_tag(parse_state *st, const uint8_t *data, size_t len)
{
    if (len + 1 > st->tag_cap) {
        size_t cap = len + 1 < 64 ? 64 : len + 1;
        char *t = realloc(st->tag, cap);
        if (!t) return CREW_OOM();
        st->tag = t;
        st->tag_cap = cap;
    }
    if (len) memcpy(st->tag, data, len);
    st->tag[len] = '\0';
    return CREW_OK;
}

/* One Summary.Value: reports it if it holds a simple_value. */
static crew_status parse_value(parse_state *st, int64_t vi, const uint8_t *p, const uint8_t *end, const event_head *h)
{
    crew_tb_point pt = {.step = h->step, .wall_time = h->wall_time, .record = st->index};
    const uint8_t *tag = NULL;
    int has_value = 0;
    char ctx[48];
    snprintf(ctx, sizeof ctx, "summary value %lld", (long long)vi);
    while (p < end) {
        pb_field f;
        const char *err = pb_next(&p, end, &f);
        if (err) return rec_error(st, "%s: %s", ctx, err);
        if (f.number == CREW_TB_VALUE_TAG) {
            CREW_TRY(expect_wire(st, ctx, "tag", &f, WIRE_LEN));
            tag = f.data;
            pt.tag_len = f.len;
        } else if (f.number == CREW_TB_VALUE_SIMPLE_VALUE) {
            CREW_TRY(expect_wire(st, ctx, "simple_value", &f, WIRE_FIXED32));
            uint32_t bits = (uint32_t)f.u;
            memcpy(&pt.value, &bits, sizeof pt.value);
            has_value = 1;
        }
    }
    if (!has_value || !st->cb) return CREW_OK;
    CREW_TRY(set_tag(st, tag, pt.tag_len));
    pt.tag = st->tag;
    return st->cb(&pt, st->user);
}

/* Every summary field of the event: their values, in order. */
static crew_status parse_summaries(parse_state *st, const uint8_t *p, const uint8_t *end, const event_head *h)
{
    int64_t vi = 0;
    while (p < end) {
        pb_field f;
        const char *err = pb_next(&p, end, &f); /* cannot fail: parse_event_head walked these */
        if (err) return rec_error(st, "event: %s", err);
        if (f.number != CREW_TB_EVENT_SUMMARY) continue;
        const uint8_t *q = f.data, *qend = f.data + f.len;
        while (q < qend) {
            pb_field v;
            if ((err = pb_next(&q, qend, &v))) return rec_error(st, "summary: %s", err);
            if (v.number != CREW_TB_SUMMARY_VALUE) continue;
            CREW_TRY(expect_wire(st, "summary", "value", &v, WIRE_LEN));
            CREW_TRY(parse_value(st, vi++, v.data, v.data + v.len, h));
        }
    }
    return CREW_OK;
}

/* The framing of the record at st->offset; on success *data_len is its event's length. *cut_short
 * says that the error is only that the file ends inside the record, which is what a writer still
 * at work, or one that was killed, leaves. */
static crew_status check_record(const parse_state *st, const uint8_t *b, size_t left, size_t *data_len, int *cut_short)
{
    *cut_short = 0;
    if (left < CREW_TB_RECORD_HEADER) {
        *cut_short = 1;
        return rec_error(st, "truncated: %zu bytes left, a record header needs %d", left, CREW_TB_RECORD_HEADER);
    }
    uint64_t n = le64(b);
    uint32_t stored = le32(b + 8), computed = crew_crc32c_mask(crew_crc32c(b, 8));
    if (stored != computed)
        return rec_error(st, "length CRC mismatch (stored 0x%08x, computed 0x%08x): the length field is damaged", stored,
                         computed);
    if (n > CREW_TB_MAX_RECORD)
        return rec_error(st, "length %llu is absurd (the limit is %llu bytes)", (unsigned long long)n,
                         (unsigned long long)CREW_TB_MAX_RECORD);
    size_t body = left - CREW_TB_RECORD_HEADER;
    if (n > body || body - n < CREW_TB_RECORD_FOOTER) {
        *cut_short = 1;
        return rec_error(st, "truncated: the record's data and CRC need %llu bytes after its header, only %zu are left",
                         (unsigned long long)n + CREW_TB_RECORD_FOOTER, body);
    }
    stored = le32(b + CREW_TB_RECORD_HEADER + n);
    computed = crew_crc32c_mask(crew_crc32c(b + CREW_TB_RECORD_HEADER, (size_t)n));
    if (stored != computed)
        return rec_error(st, "data CRC mismatch (stored 0x%08x, computed 0x%08x): the record is damaged", stored,
                         computed);
    *data_len = (size_t)n;
    return CREW_OK;
}

crew_status crew_tb_parse_with(const void *buf, size_t len, const char *what, const crew_tb_parse_options *o,
                               int64_t *records, size_t *torn_bytes)
{
    if (torn_bytes) *torn_bytes = 0;
    if (!buf && len) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_parse: no buffer");
    parse_state st = {.what = what ? what : "event file"};
    if (o) {
        st.cb = o->on_scalar;
        st.on_start = o->on_start;
        st.user = o->user;
    }
    const uint8_t *b = buf;
    crew_status s = CREW_OK;
    while (!s && st.offset < len) {
        size_t n = 0;
        int cut_short;
        s = check_record(&st, b + st.offset, len - st.offset, &n, &cut_short);
        if (s && cut_short && o && o->torn_tail_ok) {
            crew_status_free(s);
            s = CREW_OK;
            if (torn_bytes) *torn_bytes = len - st.offset;
            break;
        }
        if (s) break;
        const uint8_t *data = b + st.offset + CREW_TB_RECORD_HEADER;
        event_head h;
        s = parse_event_head(&st, data, data + n, &h);
        /* A restart is reported before the event's own scalars, which belong to the new run. */
        if (!s && h.session_start && st.on_start) s = st.on_start(h.step, h.wall_time, st.user);
        if (!s) s = parse_summaries(&st, data, data + n, &h);
        st.offset += CREW_TB_RECORD_HEADER + n + CREW_TB_RECORD_FOOTER;
        st.index++;
    }
    free(st.tag);
    if (!s && records) *records = st.index;
    return s;
}

crew_status crew_tb_parse(const void *buf, size_t len, const char *what, crew_tb_callback cb, void *user,
                          int64_t *records)
{
    crew_tb_parse_options o = {.on_scalar = cb, .user = user};
    return crew_tb_parse_with(buf, len, what, &o, records, NULL);
}

/* ---------------------------------------------------------------- files */

/* Maps the file and parses it; *records and *torn_bytes as crew_tb_parse_with. */
static crew_status read_file(const char *path, const crew_tb_parse_options *o, int64_t *records, size_t *torn_bytes)
{
    if (!path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_read: no path");
    void *map;
    size_t len;
    CREW_TRY(crew_map_file(path, &map, &len));
    crew_status s = crew_tb_parse_with(map, len, path, o, records, torn_bytes);
    crew_unmap_file(map, len);
    return s;
}

crew_status crew_tb_read(const char *path, crew_tb_callback cb, void *user)
{
    crew_tb_parse_options o = {.on_scalar = cb, .user = user};
    return read_file(path, &o, NULL, NULL);
}

typedef struct list_builder {
    crew_tb_scalar_list *list;
    int64_t cap;
} list_builder;

static crew_status append_point(const crew_tb_point *p, void *user)
{
    list_builder *lb = user;
    crew_tb_scalar_list *l = lb->list;
    if (l->count == lb->cap) {
        int64_t cap = lb->cap ? 2 * lb->cap : 64;
        crew_tb_point *pts = realloc(l->points, (size_t)cap * sizeof *pts);
        if (!pts) return CREW_OOM();
        l->points = pts;
        lb->cap = cap;
    }
    char *tag = malloc(p->tag_len + 1);
    if (!tag) return CREW_OOM();
    memcpy(tag, p->tag, p->tag_len + 1);
    l->points[l->count] = *p;
    l->points[l->count++].tag = tag;
    return CREW_OK;
}

crew_status crew_tb_read_all(const char *path, crew_tb_scalar_list *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_read_all: no output list");
    memset(out, 0, sizeof *out);
    list_builder lb = {.list = out};
    crew_tb_parse_options o = {.on_scalar = append_point, .user = &lb};
    crew_status s = read_file(path, &o, &out->records, NULL);
    if (s) crew_tb_scalar_list_free(out);
    return s;
}

/* A restart at `step`: the points read so far at that step or later are dropped, as TensorBoard
 * does (EventAccumulator's purge of orphaned data). */
static crew_status purge_from(int64_t step, double wall_time, void *user)
{
    list_builder *lb = user;
    crew_tb_scalar_list *l = lb->list;
    int64_t kept = 0;
    for (int64_t i = 0; i < l->count; i++) {
        if (l->points[i].step < step) l->points[kept++] = l->points[i];
        else free((char *)l->points[i].tag);
    }
    l->purged += l->count - kept;
    l->count = kept;
    l->restarts++;
    return CREW_OK;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

crew_status crew_tb_read_run(const char *dir, crew_tb_scalar_list *out)
{
    if (!dir || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_read_run: a directory and out are required");
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) return crew_errorf(CREW_CODE_IO, "cannot open %s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    crew_status s = CREW_OK;
    errno = 0;
    for (struct dirent *e; !s && (e = readdir(d));) {
        if (!strstr(e->d_name, "tfevents")) continue; /* what TensorBoard takes for an event file */
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) s = CREW_OOM();
            else names = nn;
        }
        if (!s && !(names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2))) s = CREW_OOM();
        if (!s) sprintf(names[n++], "%s/%s", dir, e->d_name);
        errno = 0;
    }
    if (!s && errno) s = crew_errorf(CREW_CODE_IO, "cannot list %s: %s", dir, strerror(errno));
    closedir(d);
    /* In name order, as TensorBoard reads a directory: crew's names start with the Unix time. */
    if (n) qsort(names, n, sizeof *names, by_name);
    list_builder lb = {.list = out};
    crew_tb_parse_options o = {.on_scalar = append_point, .on_start = purge_from, .user = &lb, .torn_tail_ok = 1};
    for (size_t i = 0; i < n && !s; i++) {
        int64_t records = 0;
        size_t torn = 0;
        s = read_file(names[i], &o, &records, &torn);
        out->records += records;
        out->torn_bytes += (int64_t)torn;
        out->files++;
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (s) crew_tb_scalar_list_free(out);
    return s;
}

void crew_tb_scalar_list_free(crew_tb_scalar_list *l)
{
    if (!l) return;
    for (int64_t i = 0; i < l->count; i++) free((char *)l->points[i].tag);
    free(l->points);
    memset(l, 0, sizeof *l);
}
