/* tb_reader.c — event files from memory: TFRecord framing checked record by record, then a
 * minimal protobuf walk of Event -> Summary -> Value. No recursion: only those three message
 * types are looked into, everything else is skipped by its wire type, so nesting depth in the
 * input costs nothing. Every read is bounds-checked against the end of its enclosing message. */
#include "telemetry/tb_reader.h"

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
} event_head;

/* Validates the Event's top-level fields and takes wall_time and step (the last of each wins,
 * as in protobuf; they may come after the summary). */
static crew_status parse_event_head(const parse_state *st, const uint8_t *p, const uint8_t *end, event_head *h)
{
    h->wall_time = 0;
    h->step = 0;
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

/* The framing of the record at st->offset; on success *data_len is its event's length. */
static crew_status check_record(const parse_state *st, const uint8_t *b, size_t left, size_t *data_len)
{
    if (left < CREW_TB_RECORD_HEADER)
        return rec_error(st, "truncated: %zu bytes left, a record header needs %d", left, CREW_TB_RECORD_HEADER);
    uint64_t n = le64(b);
    uint32_t stored = le32(b + 8), computed = crew_crc32c_mask(crew_crc32c(b, 8));
    if (stored != computed)
        return rec_error(st, "length CRC mismatch (stored 0x%08x, computed 0x%08x): the length field is damaged", stored,
                         computed);
    if (n > CREW_TB_MAX_RECORD)
        return rec_error(st, "length %llu is absurd (the limit is %llu bytes)", (unsigned long long)n,
                         (unsigned long long)CREW_TB_MAX_RECORD);
    size_t body = left - CREW_TB_RECORD_HEADER;
    if (n > body || body - n < CREW_TB_RECORD_FOOTER)
        return rec_error(st, "truncated: the record's data and CRC need %llu bytes after its header, only %zu are left",
                         (unsigned long long)n + CREW_TB_RECORD_FOOTER, body);
    stored = le32(b + CREW_TB_RECORD_HEADER + n);
    computed = crew_crc32c_mask(crew_crc32c(b + CREW_TB_RECORD_HEADER, (size_t)n));
    if (stored != computed)
        return rec_error(st, "data CRC mismatch (stored 0x%08x, computed 0x%08x): the record is damaged", stored,
                         computed);
    *data_len = (size_t)n;
    return CREW_OK;
}

crew_status crew_tb_parse(const void *buf, size_t len, const char *what, crew_tb_callback cb, void *user,
                          int64_t *records)
{
    if (!buf && len) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_parse: no buffer");
    parse_state st = {.what = what ? what : "event file", .cb = cb, .user = user};
    const uint8_t *b = buf;
    crew_status s = CREW_OK;
    while (!s && st.offset < len) {
        size_t n = 0;
        s = check_record(&st, b + st.offset, len - st.offset, &n);
        if (s) break;
        const uint8_t *data = b + st.offset + CREW_TB_RECORD_HEADER;
        event_head h;
        s = parse_event_head(&st, data, data + n, &h);
        if (!s) s = parse_summaries(&st, data, data + n, &h);
        st.offset += CREW_TB_RECORD_HEADER + n + CREW_TB_RECORD_FOOTER;
        st.index++;
    }
    free(st.tag);
    if (!s && records) *records = st.index;
    return s;
}

/* ---------------------------------------------------------------- files */

/* Maps the file and parses it; *records as crew_tb_parse. */
static crew_status read_file(const char *path, crew_tb_callback cb, void *user, int64_t *records)
{
    if (!path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tb_read: no path");
    void *map;
    size_t len;
    CREW_TRY(crew_map_file(path, &map, &len));
    crew_status s = crew_tb_parse(map, len, path, cb, user, records);
    crew_unmap_file(map, len);
    return s;
}

crew_status crew_tb_read(const char *path, crew_tb_callback cb, void *user) { return read_file(path, cb, user, NULL); }

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
    crew_status s = read_file(path, append_point, &lb, &out->records);
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
