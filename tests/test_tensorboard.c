/* test_tensorboard.c — TensorBoard event files: CRC-32C against published vectors, writer ->
 * reader round trips bit for bit, damaged files (truncation, flipped CRC and length bytes,
 * absurd lengths) and malformed protobuf each giving an error that names the file and the
 * record, unknown fields of every wire type skipped, and write failures (an unwritable
 * directory, a full disk) reported as IO errors. A restart (SessionLog START) read back the way
 * TensorBoard shows a run: re-run steps once, a killed writer's torn last record left out.
 *
 * With CREW_TB_KEEP=DIR in the environment, the round-trip run is also written to DIR and left
 * there, for tools/read_tensorboard.py to check that real TensorBoard reads it. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "core/status.h"
#include "telemetry/crc32c.h"
#include "telemetry/tb_reader.h"
#include "telemetry/tb_writer.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

/* ---------------------------------------------------------------- helpers */

/* A growable byte string for hand-made files. */
typedef struct bytes {
    uint8_t b[32768];
    size_t n;
} bytes;

static void put(bytes *o, const void *p, size_t n)
{
    if (o->n + n > sizeof o->b) abort();
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_varint(bytes *o, uint64_t v)
{
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(o, &c, 1);
    } while (v);
}

static void put_key(bytes *o, unsigned field, unsigned wire) { put_varint(o, (uint64_t)field << 3 | wire); }

static void put_le(bytes *o, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        put(o, &c, 1);
    }
}

static void put_len_field(bytes *o, unsigned field, const void *p, size_t n)
{
    put_key(o, field, 2);
    put_varint(o, n);
    put(o, p, n);
}

/* Appends one TFRecord holding payload to file. */
static void put_record(bytes *file, const bytes *payload)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)payload->n >> (8 * i));
    put(file, len, 8);
    put_le(file, crew_crc32c_mask(crew_crc32c(len, 8)), 4);
    put(file, payload->b, payload->n);
    put_le(file, crew_crc32c_mask(crew_crc32c(payload->b, payload->n)), 4);
}

/* A record whose length field says `length` (with a correct length CRC) but holds no data. */
static void put_header_only(bytes *file, uint64_t length)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(length >> (8 * i));
    put(file, len, 8);
    put_le(file, crew_crc32c_mask(crew_crc32c(len, 8)), 4);
}

/* The one event file in dir (its full path in buf): 0, or -1 when there is not exactly one. */
static int only_event_file(const char *dir, char *buf, size_t len);

static int contains(const void *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp((const char *)hay + i, needle, n)) return 1;
    return 0;
}

static int same_bits32(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }
static int same_bits64(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---------------------------------------------------------------- CRC-32C */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c(void)
{
    CHECK(crew_crc32c("123456789", 9) == 0xE3069283u);
    CHECK(crew_crc32c("", 0) == 0);
    /* RFC 3720 (iSCSI) appendix B.4 */
    uint8_t b[32];
    memset(b, 0, 32);
    CHECK(crew_crc32c(b, 32) == 0x8A9136AAu);
    memset(b, 0xff, 32);
    CHECK(crew_crc32c(b, 32) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    CHECK(crew_crc32c(b, 32) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
    CHECK(crew_crc32c(b, 32) == 0x113FDB5Cu);
    /* Every byte value through the table, against the bit-at-a-time definition. */
    uint8_t all[1000];
    for (int i = 0; i < 1000; i++) all[i] = (uint8_t)(i * 131 + (i >> 3));
    CHECK(crew_crc32c(all, 1000) == crc32c_bitwise(all, 1000));
    for (int v = 0; v < 256; v++) {
        uint8_t c = (uint8_t)v;
        if (crew_crc32c(&c, 1) != crc32c_bitwise(&c, 1)) {
            CHECK_MSG(0, "crc32c of the byte 0x%02x", v);
            break;
        }
    }
    CHECK(crew_crc32c_extend(crew_crc32c(all, 377), all + 377, 623) == crew_crc32c(all, 1000));
    uint32_t xs[] = {0, 1, 0xE3069283u, 0xffffffffu, 0x80000000u};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) CHECK(crew_crc32c_unmask(crew_crc32c_mask(xs[i])) == xs[i]);
    CHECK(crew_crc32c_mask(0) == 0xa282ead8u);
    CHECK(crew_crc32c_mask(1) == (1u << 17) + 0xa282ead8u);
}

/* ---------------------------------------------------------------- round trip */

#define STEPS 50
#define NTAGS 5
static const char *const round_tags[NTAGS] = {"loss", "lr", "replica/0/compute_s", "replica/1/compute_s",
                                              "train/samples_per_s"};

static float round_value(int step, int t)
{
    float v = 1.0f / (float)(step + 1) + 0.37f * (float)t;
    if (step == 7 && t == 0) v = NAN;
    if (step == 8 && t == 0) v = -0.0f;
    if (step == 9 && t == 1) v = INFINITY;
    if (step == 10 && t == 1) v = 1e-45f; /* a denormal */
    return v;
}

static double round_time(int step) { return 1764504000.0 + 0.123456789 * step; }

/* Batched events every step, one single-scalar event ("test/accuracy") every 10 steps. */
static crew_status write_round_trip(crew_tb_writer *w)
{
    for (int s = 1; s <= STEPS; s++) {
        float v[NTAGS];
        for (int t = 0; t < NTAGS; t++) v[t] = round_value(s, t);
        CREW_TRY(crew_tb_scalars(w, s, round_time(s), round_tags, v, NTAGS));
        if (s % 10 == 0) CREW_TRY(crew_tb_scalar(w, "test/accuracy", s, round_time(s) + 0.5, 0.5f + 0.01f * s));
    }
    return CREW_OK;
}

static void check_round_trip(const crew_tb_scalar_list *l)
{
    CHECK(l->records == 1 + STEPS + STEPS / 10);
    CHECK(l->count == STEPS * NTAGS + STEPS / 10);
    int64_t i = 0;
    int bad = 0;
    for (int s = 1; s <= STEPS && i < l->count; s++) {
        for (int t = 0; t < NTAGS && i < l->count; t++, i++) {
            const crew_tb_point *p = &l->points[i];
            if (strcmp(p->tag, round_tags[t]) || p->tag_len != strlen(round_tags[t]) || p->step != s ||
                !same_bits64(p->wall_time, round_time(s)) || !same_bits32(p->value, round_value(s, t)) ||
                p->record != s + (s - 1) / 10)
                bad++;
        }
        if (s % 10 == 0 && i < l->count) {
            const crew_tb_point *p = &l->points[i++];
            if (strcmp(p->tag, "test/accuracy") || p->step != s || !same_bits64(p->wall_time, round_time(s) + 0.5) ||
                !same_bits32(p->value, 0.5f + 0.01f * s))
                bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d points differ from what was written", bad);
}

static void test_round_trip(char *event_path, size_t len)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/run/tb", tmp_dir); /* neither level exists yet */
    crew_tb_writer *w = NULL;
    CHECK_OK(crew_tb_open(dir, &w));
    if (!w) return;
    const char *path = crew_tb_path(w);
    const char *base = strrchr(path, '/');
    CHECK(base && strncmp(base + 1, "events.out.tfevents.", 20) == 0);
    CHECK(strncmp(path, dir, strlen(dir)) == 0);
    snprintf(event_path, len, "%s", path);
    CHECK_OK(write_round_trip(w));
    CHECK_OK(crew_tb_flush(w));
    crew_tb_close(w);

    char found[512];
    CHECK(only_event_file(dir, found, sizeof found) == 0 && strcmp(found, event_path) == 0);
    size_t n = 0;
    uint8_t *raw = read_file(event_path, &n);
    CHECK(raw && n > 100 && contains(raw, n, CREW_TB_FILE_VERSION));
    free(raw);

    crew_tb_scalar_list l;
    CHECK_OK(crew_tb_read_all(event_path, &l));
    check_round_trip(&l);
    crew_tb_scalar_list_free(&l);

    const char *keep = getenv("CREW_TB_KEEP");
    if (keep && keep[0]) {
        crew_tb_writer *k = NULL;
        CHECK_OK(crew_tb_open(keep, &k));
        if (k) CHECK_OK(write_round_trip(k));
        if (k) printf("kept %s\n", crew_tb_path(k));
        crew_tb_close(k);
    }
}

/* A second writer in the same directory and second gets its own file; negative steps and
 * every tag crew writes survive. */
static void test_second_writer(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/two", tmp_dir);
    crew_tb_writer *a = NULL, *b = NULL;
    CHECK_OK(crew_tb_open(dir, &a));
    CHECK_OK(crew_tb_open(dir, &b));
    if (!a || !b) {
        crew_tb_close(a);
        crew_tb_close(b);
        return;
    }
    CHECK(strcmp(crew_tb_path(a), crew_tb_path(b)) != 0);
    double now = crew_tb_wall_time();
    CHECK(now > 1.6e9 && now < 4e9); /* Unix time, not a monotonic clock */
    CHECK_OK(crew_tb_scalar(a, "time/comm_exposed_s", -5, 1.5, 2.5f));
    CHECK_OK(crew_tb_scalar(b, "replica/12/compute_s", INT64_MAX, 2.5, -3.25f));
    char pa[256], pb[256];
    snprintf(pa, sizeof pa, "%s", crew_tb_path(a));
    snprintf(pb, sizeof pb, "%s", crew_tb_path(b));
    crew_tb_close(a);
    crew_tb_close(b);
    crew_tb_scalar_list la, lb;
    CHECK_OK(crew_tb_read_all(pa, &la));
    CHECK_OK(crew_tb_read_all(pb, &lb));
    CHECK(la.count == 1 && la.points[0].step == -5 && la.points[0].value == 2.5f &&
          strcmp(la.points[0].tag, "time/comm_exposed_s") == 0);
    CHECK(lb.count == 1 && lb.points[0].step == INT64_MAX && lb.points[0].value == -3.25f &&
          strcmp(lb.points[0].tag, "replica/12/compute_s") == 0);
    crew_tb_scalar_list_free(&la);
    crew_tb_scalar_list_free(&lb);
}

/* ---------------------------------------------------------------- damaged files */

/* Offset of record k in a well-formed file. */
static size_t record_offset(const uint8_t *b, size_t n, int k)
{
    size_t off = 0;
    for (int i = 0; i < k && off + 8 <= n; i++) {
        uint64_t len = 0;
        for (int j = 0; j < 8; j++) len |= (uint64_t)b[off + j] << (8 * j);
        off += 16 + (size_t)len;
    }
    return off;
}

static crew_status parse(const void *b, size_t n) { return crew_tb_parse(b, n, "mem.tfevents", NULL, NULL, NULL); }

static void test_damaged(const char *event_path)
{
    size_t n = 0;
    uint8_t *orig = read_file(event_path, &n);
    CHECK(orig != NULL && n > 200);
    if (!orig || n <= 200) return;
    uint8_t *b = malloc(n);
    char needle[256];
    CHECK_OK(parse(orig, n));
    CHECK_OK(parse(orig, 0)); /* an empty file holds no records */

    size_t last = record_offset(orig, n, 55); /* the last record */
    CHECK(last < n && record_offset(orig, n, 56) == n);
    CHECK_ERR(parse(orig, n - 3), "truncated");
    snprintf(needle, sizeof needle, "record 55 at offset %zu: truncated", last);
    CHECK_ERR(parse(orig, n - 3), needle);
    CHECK_ERR(parse(orig, last + 5), "a record header needs 12");

    size_t r2 = record_offset(orig, n, 2), r2_len = record_offset(orig, n, 3) - r2 - 16;
    memcpy(b, orig, n);
    b[r2 + 12 + r2_len + 1] ^= 0x40; /* inside record 2's data CRC */
    snprintf(needle, sizeof needle, "mem.tfevents: record 2 at offset %zu: data CRC mismatch", r2);
    CHECK_ERR(parse(b, n), needle);
    memcpy(b, orig, n);
    b[r2 + 12 + 3] ^= 0x01; /* inside record 2's data */
    CHECK_ERR(parse(b, n), needle);

    size_t r1 = record_offset(orig, n, 1);
    memcpy(b, orig, n);
    b[r1 + 1] ^= 0x01; /* record 1's length: 256 bytes more */
    snprintf(needle, sizeof needle, "record 1 at offset %zu: length CRC mismatch", r1);
    CHECK_ERR(parse(b, n), needle);
    memcpy(b, orig, n);
    b[r1 + 9] ^= 0x80; /* record 1's length CRC */
    CHECK_ERR(parse(b, n), "length CRC mismatch");

    /* Lengths with valid CRCs: absurd, and merely longer than the file. */
    bytes f = {.n = 0};
    put(&f, orig, r1);
    put_header_only(&f, (uint64_t)1 << 40);
    put(&f, orig + r1 + 12, n - r1 - 12);
    CHECK_ERR(parse(f.b, f.n), "record 1 at offset");
    CHECK_ERR(parse(f.b, f.n), "absurd");
    f.n = r1;
    put_header_only(&f, UINT64_MAX);
    CHECK_ERR(parse(f.b, f.n), "absurd");
    f.n = r1;
    put_header_only(&f, 100000);
    put(&f, orig + r1 + 12, n - r1 - 12 < 1000 ? n - r1 - 12 : 1000);
    CHECK_ERR(parse(f.b, f.n), "truncated: the record's data and CRC need 100004 bytes after its header, only 1000 are left");

    /* Through the file API the path is in the message. */
    char bad_path[128];
    snprintf(bad_path, sizeof bad_path, "%s/damaged.tfevents", tmp_dir);
    memcpy(b, orig, n);
    b[r2 + 12 + r2_len + 1] ^= 0x40;
    write_file(bad_path, b, n); /* checks that it wrote */
    crew_tb_scalar_list l;
    snprintf(needle, sizeof needle, "%s: record 2 at offset %zu: data CRC", bad_path, r2);
    crew_status s = crew_tb_read_all(bad_path, &l);
    CHECK(crew_status_code(s) == CREW_CODE_BAD_INPUT);
    CHECK_MSG(s && strstr(crew_status_message(s), needle), "%s", crew_status_message(s));
    crew_status_free(s);
    CHECK(l.count == 0 && l.points == NULL);
    snprintf(bad_path, sizeof bad_path, "%s/missing.tfevents", tmp_dir);
    s = crew_tb_read_all(bad_path, &l);
    CHECK(crew_status_code(s) == CREW_CODE_IO && strstr(crew_status_message(s), "missing.tfevents"));
    crew_status_free(s);
    CHECK_ERR(crew_tb_read(tmp_dir, NULL, NULL), "not a regular file");
    free(b);
    free(orig);
}

/* ---------------------------------------------------------------- protobuf contents */

typedef struct collected {
    char tags[8][32];
    int64_t steps[8];
    float values[8];
    int n;
} collected;

static crew_status collect(const crew_tb_point *p, void *user)
{
    collected *c = user;
    if (c->n == 8) return crew_errorf(CREW_CODE_INTERNAL, "too many points");
    snprintf(c->tags[c->n], sizeof c->tags[0], "%s", p->tag);
    c->steps[c->n] = p->step;
    c->values[c->n++] = p->value;
    return CREW_OK;
}

/* An Event with unknown fields of every wire type at every level, step after the summary, a
 * value without simple_value (a TF2 tensor scalar) and one with a tag after its value. */
static void build_rich_event(bytes *ev)
{
    bytes v1 = {.n = 0}, v2 = {.n = 0}, v3 = {.n = 0}, sum = {.n = 0};
    put_len_field(&v1, 7, "node", 4);            /* node_name */
    put_len_field(&v1, 1, "train/loss", 10);
    put_len_field(&v1, 9, "\x0a\x02hi", 4);      /* metadata */
    put_key(&v1, 2, 5);
    put_le(&v1, 0x40490fdbu, 4);                 /* 3.14159274f */
    put_key(&v1, 20, 0);
    put_varint(&v1, UINT64_MAX);                 /* unknown varint, 10 bytes */
    put_key(&v2, 2, 5);
    put_le(&v2, 0xbf800000u, 4);                 /* -1.0f before its tag */
    put_len_field(&v2, 1, "x", 1);
    put_len_field(&v3, 1, "tensor/only", 11);
    put_len_field(&v3, 8, "\x08\x01", 2);        /* tensor: skipped */
    put_key(&sum, 3, 1);
    put_le(&sum, 42, 8);                         /* unknown fixed64 in Summary */
    put_len_field(&sum, 1, v1.b, v1.n);
    put_len_field(&sum, 1, v3.b, v3.n);
    put_len_field(&sum, 1, v2.b, v2.n);
    put_key(ev, 1, 1);
    put_le(ev, 0x41da4b2c80000000ull, 8);        /* wall_time */
    put_len_field(ev, 4, "graphdef", 8);
    put_key(ev, 15, 5);
    put_le(ev, 7, 4);                            /* unknown fixed32 */
    put_len_field(ev, 5, sum.b, sum.n);
    put_key(ev, 2, 0);
    put_varint(ev, 77);                          /* step, after the summary */
    put_key(ev, 1000000, 0);
    put_varint(ev, 1);                           /* large unknown field number */
}

static void test_unknown_fields(void)
{
    bytes ev = {.n = 0}, file = {.n = 0};
    build_rich_event(&ev);
    put_record(&file, &ev);
    collected c = {.n = 0};
    int64_t records = -1;
    CHECK_OK(crew_tb_parse(file.b, file.n, "rich", collect, &c, &records));
    CHECK(records == 1);
    CHECK(c.n == 2);
    CHECK(strcmp(c.tags[0], "train/loss") == 0 && c.steps[0] == 77 && c.values[0] == 3.14159274f);
    CHECK(strcmp(c.tags[1], "x") == 0 && c.steps[1] == 77 && c.values[1] == -1.0f);
}

/* One event payload, framed correctly, must give an error containing needle. */
static void expect_bad_event(const bytes *ev, const char *needle)
{
    bytes file = {.n = 0};
    put_record(&file, ev);
    CHECK_ERR(crew_tb_parse(file.b, file.n, "bad.tfevents", NULL, NULL, NULL), needle);
}

static void test_malformed_protobuf(void)
{
    bytes ev = {.n = 0};
    put_key(&ev, 2, 0);
    for (int i = 0; i < 11; i++) put(&ev, "\xff", 1);
    expect_bad_event(&ev, "bad.tfevents: record 0 at offset 0: event: a varint");
    ev.n = 0;
    put_key(&ev, 2, 0);
    put(&ev, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 10); /* bit 64 set */
    expect_bad_event(&ev, "overflows 64 bits");
    ev.n = 0;
    put_key(&ev, 2, 0);
    put(&ev, "\x80\x80", 2);
    expect_bad_event(&ev, "runs past the end");
    ev.n = 0;
    put_key(&ev, 5, 2);
    put_varint(&ev, 50); /* longer than the event */
    put(&ev, "abc", 3);
    expect_bad_event(&ev, "length-delimited field runs past");
    ev.n = 0;
    put_key(&ev, 1, 1);
    put(&ev, "1234", 4);
    expect_bad_event(&ev, "fixed64 field runs past");
    ev.n = 0;
    put_key(&ev, 6, 3);
    expect_bad_event(&ev, "group");
    ev.n = 0;
    put_key(&ev, 6, 7);
    expect_bad_event(&ev, "wire type 6 or 7");
    ev.n = 0;
    put(&ev, "\x00\x01", 2);
    expect_bad_event(&ev, "field number is 0");
    ev.n = 0;
    put_key(&ev, 2, 5);
    put_le(&ev, 1, 4);
    expect_bad_event(&ev, "event field 2 (step) has wire type fixed32, expected varint");

    /* Inside the summary and a value. */
    bytes sum = {.n = 0}, val = {.n = 0};
    put_key(&val, 2, 1);
    put_le(&val, 0, 8);
    put_len_field(&sum, 1, val.b, val.n);
    ev.n = 0;
    put_len_field(&ev, 5, sum.b, sum.n);
    expect_bad_event(&ev, "summary value 0 field 2 (simple_value) has wire type fixed64, expected fixed32");
    sum.n = 0;
    put_len_field(&sum, 1, "\x0a\x09train", 7); /* tag length 9, 5 bytes present */
    ev.n = 0;
    put_len_field(&ev, 5, sum.b, sum.n);
    expect_bad_event(&ev, "summary value 0: a length-delimited field runs past");
    sum.n = 0;
    put_key(&sum, 1, 0);
    put_varint(&sum, 3);
    ev.n = 0;
    put_len_field(&ev, 5, sum.b, sum.n);
    expect_bad_event(&ev, "summary field 1 (value) has wire type varint");
}

/* ---------------------------------------------------------------- restarts */

typedef struct starts {
    int n;
    int64_t step;
    int64_t points_before; /* scalars seen before the first START */
    int64_t points;
} starts;

static crew_status on_start(int64_t step, double wall_time, void *user)
{
    starts *st = user;
    if (!st->n++) {
        st->step = step;
        st->points_before = st->points;
    }
    return CREW_OK;
}

static crew_status count_point(const crew_tb_point *p, void *user)
{
    ((starts *)user)->points++;
    return CREW_OK;
}

/* A killed run's file (steps 1-7, its last record cut short) and the resumed run's (START at step
 * 5, then steps 5-9) in one directory: read as a run, each step once, with the re-run's values. */
static void test_restart(void)
{
    char dir[128], a[192], b[192];
    snprintf(dir, sizeof dir, "%s/restart", tmp_dir);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(a, sizeof a, "%s/events.out.tfevents.1000000000.x.1.crew", dir);
    snprintf(b, sizeof b, "%s/events.out.tfevents.1000000100.x.2.crew", dir);
    crew_tb_writer *w = NULL;
    CHECK_OK(crew_tb_open_file(a, &w));
    for (int s = 1; w && s <= 7; s++) CHECK_OK(crew_tb_scalar(w, "train/loss", s, 1.0 + s, 1.0f + (float)s));
    crew_tb_close(w);
    struct stat st;
    CHECK(stat(a, &st) == 0 && truncate(a, st.st_size - 5) == 0); /* killed inside step 7's record */
    CHECK_OK(crew_tb_open_file(b, &w));
    CHECK_OK(crew_tb_session_start(w, 5, 200.0, "resumed from the checkpoint at step 4"));
    for (int s = 5; w && s <= 9; s++) CHECK_OK(crew_tb_scalar(w, "train/loss", s, 200.0 + s, 10.0f + (float)s));
    CHECK_OK(crew_tb_flush(w));
    crew_tb_close(w);

    /* The START is reported, before the scalars that follow it; one file alone is not purged. */
    size_t n = 0;
    uint8_t *img = read_file(b, &n);
    starts sc = {0};
    crew_tb_parse_options o = {.on_scalar = count_point, .on_start = on_start, .user = &sc};
    int64_t records = 0;
    CHECK_OK(crew_tb_parse_with(img, n, b, &o, &records, NULL));
    CHECK(sc.n == 1 && sc.step == 5 && sc.points_before == 0 && sc.points == 5 && records == 7);
    CHECK_OK(crew_tb_parse(img, n, b, NULL, NULL, NULL)); /* a reader that does not ask is not told */
    free(img);

    /* The torn record: an error for the strict reader, the end of the file for a run's. */
    CHECK_ERR(crew_tb_read(a, NULL, NULL), "truncated");
    img = read_file(a, &n);
    size_t torn = 0;
    crew_tb_parse_options lax = {.torn_tail_ok = 1};
    CHECK_OK(crew_tb_parse_with(img, n, a, &lax, &records, &torn));
    size_t last = record_offset(img, n, 7);
    CHECK_MSG(records == 7 && last < n && torn == n - last, "%lld records, %zu torn bytes", (long long)records, torn);
    img[record_offset(img, n, 2) + 14] ^= 0x20; /* damage inside a whole record stays an error */
    CHECK_ERR(crew_tb_parse_with(img, n, a, &lax, NULL, NULL), "record 2 at offset");
    free(img);

    crew_tb_scalar_list l;
    CHECK_OK(crew_tb_read_run(dir, &l));
    CHECK(l.files == 2 && l.restarts == 1 && l.purged == 2 && l.torn_bytes == (int64_t)torn);
    int ok = l.count == 9;
    for (int64_t i = 0; ok && i < l.count; i++) {
        const crew_tb_point *p = &l.points[i];
        float want = p->step <= 4 ? 1.0f + (float)p->step : 10.0f + (float)p->step;
        ok = p->step == i + 1 && p->value == want && !strcmp(p->tag, "train/loss");
    }
    CHECK_MSG(ok, "%lld points; expected steps 1-4 of the killed run, 5-9 of the resumed one", (long long)l.count);
    crew_tb_scalar_list_free(&l);

    char missing[160];
    snprintf(missing, sizeof missing, "%s/no-such-dir", tmp_dir);
    CHECK_ERR(crew_tb_read_run(missing, &l), "no-such-dir");
    CHECK(l.count == 0 && l.points == NULL);

    /* A malformed SessionLog is named like any other field. */
    bytes ev = {.n = 0}, log = {.n = 0};
    put_key(&log, 1, 5);
    put_le(&log, 1, 4);
    put_len_field(&ev, 7, log.b, log.n);
    expect_bad_event(&ev, "session_log field 1 (status) has wire type fixed32, expected varint");
    ev.n = 0;
    put_key(&ev, 7, 0);
    put_varint(&ev, 1);
    expect_bad_event(&ev, "event field 7 (session_log) has wire type varint");
}

/* ---------------------------------------------------------------- write failures */

static void test_write_errors(void)
{
    crew_tb_writer *w = NULL;
    char path[160];
    snprintf(path, sizeof path, "%s/plain_file", tmp_dir);
    write_file(path, "x", 1); /* checks that it wrote */
    snprintf(path, sizeof path, "%s/plain_file/tb", tmp_dir);
    crew_status s = crew_tb_open(path, &w);
    CHECK(crew_status_code(s) == CREW_CODE_IO && w == NULL);
    CHECK_MSG(s && strstr(crew_status_message(s), "plain_file") && strstr(crew_status_message(s), "cannot create"),
              "%s", crew_status_message(s));
    crew_status_free(s);

    if (geteuid() != 0) { /* root writes anywhere, so only other users can test permissions */
        snprintf(path, sizeof path, "%s/locked", tmp_dir);
        CHECK(mkdir(path, 0500) == 0);
        s = crew_tb_open(path, &w);
        CHECK(crew_status_code(s) == CREW_CODE_IO);
        CHECK_MSG(s && strstr(crew_status_message(s), strerror(EACCES)), "%s", crew_status_message(s));
        crew_status_free(s);
    }

    /* A full disk: buffered records fail at the flush, or at a write once the buffer fills. */
    if (access("/dev/full", W_OK) == 0) {
        CHECK_OK(crew_tb_open_file("/dev/full", &w));
        if (w) {
            CHECK_OK(crew_tb_scalar(w, "train/loss", 1, 1.0, 0.5f));
            s = crew_tb_flush(w);
            CHECK(crew_status_code(s) == CREW_CODE_IO);
            CHECK_MSG(s && strstr(crew_status_message(s), "/dev/full: write: ") &&
                          strstr(crew_status_message(s), strerror(ENOSPC)),
                      "%s", crew_status_message(s));
            crew_status_free(s);
            CHECK_ERR(crew_tb_scalar(w, "train/loss", 2, 1.0, 0.5f), "an earlier write failed");
            crew_tb_close(w);
        }
        CHECK_OK(crew_tb_open_file("/dev/full", &w));
        s = CREW_OK;
        for (int i = 0; i < 100000 && !s && w; i++) s = crew_tb_scalar(w, "train/loss", i, 1.0, 0.5f);
        CHECK_MSG(s && strstr(crew_status_message(s), strerror(ENOSPC)), "%s", crew_status_message(s));
        crew_status_free(s);
        crew_tb_close(w);
    }

    snprintf(path, sizeof path, "%s/args", tmp_dir);
    CHECK_OK(crew_tb_open(path, &w));
    if (w) {
        const char *tags[2] = {"a", NULL};
        float v[2] = {1, 2};
        s = crew_tb_scalars(w, 1, 1.0, tags, v, 2);
        CHECK(crew_status_code(s) == CREW_CODE_INVALID_ARGUMENT);
        crew_status_free(s);
        CHECK_ERR(crew_tb_scalar(w, "", 1, 1.0, 1.0f), "has no tag");
        CHECK_ERR(crew_tb_scalars(w, 1, 1.0, tags, v, 0), "n >= 1");
        CHECK_OK(crew_tb_scalars(w, 1, 1.0, tags, v, 1)); /* still usable after refused calls */
        crew_tb_close(w);
    }
    crew_tb_close(NULL);
}

/* ---------------------------------------------------------------- main */

static int only_event_file(const char *dir, char *buf, size_t len)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0) continue;
        snprintf(buf, len, "%s/%s", dir, e->d_name);
        found++;
    }
    closedir(d);
    return found == 1 ? 0 : -1;
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/crew_tb_XXXXXX", base && strlen(base) < 40 ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char event_path[256] = "";
    test_crc32c();
    test_round_trip(event_path, sizeof event_path);
    test_second_writer();
    if (event_path[0]) test_damaged(event_path);
    test_unknown_fields();
    test_malformed_protobuf();
    test_restart();
    test_write_errors();
    nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
