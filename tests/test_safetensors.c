/* test_safetensors.c — the safetensors reader and writer: a round trip of every dtype with
 * metadata, the writer's file layout (8-aligned header, no temporary left behind), and the
 * reader refusing every kind of malformed file with a message that names what was wrong. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/status.h"
#include "io/safetensors.h"

static char dir[64];

static void path_in_dir(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", dir, name); }

static int files_in_dir(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

static void write_bytes(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

/* A file image: u64 LE length of header, header, then data_len bytes of 0xAB. */
static uint8_t *make_file(const char *header, uint64_t declared_len, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(declared_len >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0xAB, data_len);
    return b;
}

/* Parses header + data_len bytes in memory and expects an error containing needle. */
static void expect_bad(const char *header, size_t data_len, const char *needle)
{
    size_t len;
    uint8_t *b = make_file(header, strlen(header), data_len, &len);
    crew_st_file f;
    crew_status s = crew_st_parse(b, len, "w.safetensors", &f);
    CHECK_MSG(s != CREW_OK, "header %s was accepted", header);
    if (s) {
        CHECK_MSG(strstr(crew_status_message(s), needle) != NULL, "header %s: message '%s' lacks '%s'", header,
                  crew_status_message(s), needle);
        CHECK(strstr(crew_status_message(s), "w.safetensors") != NULL);
        CHECK(crew_status_code(s) == CREW_CODE_BAD_INPUT);
    }
    CHECK(f.tensors == NULL && f.n_tensors == 0);
    crew_status_free(s);
    free(b);
}

static void test_round_trip(void)
{
    float f32[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e-30f};
    int32_t i32[4] = {-1, 0, 7, INT32_MAX};
    int64_t i64[4] = {INT64_MIN, -5, 0, INT64_MAX};
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    float scalar = 42.0f;
    crew_st_tensor t[6] = {
        {.name = "z.weights", .dtype = CREW_ST_F32, .ndim = 2, .shape = {2, 3}, .count = 6, .data = f32},
        {.name = "a.ids", .dtype = CREW_ST_I32, .ndim = 1, .shape = {4}, .count = 4, .data = i32},
        {.name = "m.big", .dtype = CREW_ST_I64, .ndim = 2, .shape = {2, 2}, .count = 4, .data = i64},
        {.name = "bytes", .dtype = CREW_ST_U8, .ndim = 1, .shape = {5}, .count = 5, .data = u8},
        {.name = "scalar", .dtype = CREW_ST_F32, .ndim = 0, .count = 1, .data = &scalar},
        {.name = "empty", .dtype = CREW_ST_F32, .ndim = 2, .shape = {0, 3}, .count = 0, .data = NULL},
    };
    const char *meta[] = {"format", "crew", "note", "caf\xc3\xa9 \"quoted\"", NULL};
    char path[128];
    path_in_dir(path, sizeof path, "round.safetensors");
    CHECK_OK(crew_st_write(path, t, 6, meta));
    CHECK(files_in_dir() == 1); /* the temporary was renamed, not left behind */

    crew_st_file f;
    CHECK_OK(crew_st_read(path, &f));
    CHECK(f.n_tensors == 6 && f.owns_bytes == 1);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0 && f.len >= 8; i--) hlen = (hlen << 8) | f.bytes[i];
    CHECK(hlen % 8 == 0);
    CHECK(f.len == 8 + hlen + sizeof f32 + sizeof i32 + sizeof i64 + sizeof u8 + sizeof scalar);
    for (int i = 0; i < 6 && i < f.n_tensors; i++) {
        CHECK(strcmp(f.tensors[i].name, t[i].name) == 0); /* the caller's order is kept */
        const crew_st_tensor *r = crew_st_find(&f, t[i].name);
        CHECK(r != NULL);
        if (!r) continue;
        CHECK(r->dtype == t[i].dtype && r->ndim == t[i].ndim && r->count == t[i].count);
        for (int d = 0; d < t[i].ndim; d++) CHECK(r->shape[d] == t[i].shape[d]);
        if (t[i].count) CHECK(memcmp(r->data, t[i].data, (size_t)t[i].count * crew_st_dtype_size(t[i].dtype)) == 0);
    }
    CHECK(crew_st_find(&f, "missing") == NULL);
    CHECK(crew_st_metadata(&f, "format") && strcmp(crew_st_metadata(&f, "format"), "crew") == 0);
    CHECK(crew_st_metadata(&f, "note") && strcmp(crew_st_metadata(&f, "note"), meta[3]) == 0);
    CHECK(crew_st_metadata(&f, "absent") == NULL);
    crew_st_free(&f);
    CHECK(f.tensors == NULL && f.bytes == NULL);

    /* Overwriting an existing file replaces it whole. */
    CHECK_OK(crew_st_write(path, t + 3, 1, NULL));
    CHECK_OK(crew_st_read(path, &f));
    CHECK(f.n_tensors == 1 && f.n_metadata == 0 && crew_st_find(&f, "bytes") != NULL);
    crew_st_free(&f);
    unlink(path);
}

static void test_writer_refuses(void)
{
    float v[2] = {1, 2};
    crew_st_tensor dup[2] = {
        {.name = "x", .dtype = CREW_ST_F32, .ndim = 1, .shape = {2}, .count = 2, .data = v},
        {.name = "x", .dtype = CREW_ST_F32, .ndim = 1, .shape = {2}, .count = 2, .data = v},
    };
    char path[128];
    path_in_dir(path, sizeof path, "bad.safetensors");
    CHECK_ERR(crew_st_write(path, dup, 2, NULL), "'x' appears twice");
    crew_st_tensor wrong = {.name = "w", .dtype = CREW_ST_F32, .ndim = 1, .shape = {3}, .count = 2, .data = v};
    CHECK_ERR(crew_st_write(path, &wrong, 1, NULL), "tensor 'w'");
    crew_st_tensor nodtype = {.name = "d", .ndim = 1, .shape = {2}, .count = 2, .data = v};
    CHECK_ERR(crew_st_write(path, &nodtype, 1, NULL), "unknown dtype");
    crew_st_tensor reserved = {
        .name = "__metadata__", .dtype = CREW_ST_F32, .ndim = 1, .shape = {2}, .count = 2, .data = v};
    CHECK_ERR(crew_st_write(path, &reserved, 1, NULL), "reserved");
    const char *meta_dup[] = {"k", "1", "k", "2", NULL};
    CHECK_ERR(crew_st_write(path, dup, 1, meta_dup), "metadata key 'k' appears twice");
    CHECK(files_in_dir() == 0);

    /* An OS failure is an IO error naming the path, and leaves no temporary behind. */
    char nodir[160];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/w.safetensors", dir);
    crew_status s = crew_st_write(nodir, dup, 1, NULL);
    CHECK(crew_status_code(s) == CREW_CODE_IO);
    CHECK(s && strstr(crew_status_message(s), "no/such/dir") != NULL);
    crew_status_free(s);
    CHECK(files_in_dir() == 0);
}

/* Well-formed headers around which the bad ones are built: 2×2 F32 = 16 bytes of data. */
#define OK_ENTRY "\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"

static void test_minimal_good(void)
{
    const char *goods[] = {
        "{" OK_ENTRY "}",
        "  {" OK_ENTRY ",\"__metadata__\":{\"a\":\"b\"}}     ", /* JSON whitespace around is fine */
    };
    for (size_t i = 0; i < sizeof goods / sizeof goods[0]; i++) {
        size_t len;
        uint8_t *b = make_file(goods[i], strlen(goods[i]), 16, &len);
        crew_st_file f;
        CHECK_OK(crew_st_parse(b, len, "w.safetensors", &f));
        CHECK(f.n_tensors == 1 && f.tensors && f.tensors[0].count == 4 && f.tensors[0].data == b + len - 16);
        CHECK(f.owns_bytes == 0);
        crew_st_free(&f); /* must not free b */
        free(b);
    }
    /* No tensors at all, no data: valid. */
    size_t len;
    uint8_t *b = make_file("{}", 2, 0, &len);
    crew_st_file f;
    CHECK_OK(crew_st_parse(b, len, "w.safetensors", &f));
    CHECK(f.n_tensors == 0);
    crew_st_free(&f);
    free(b);
}

static void test_bad_headers(void)
{
    expect_bad("not json at all", 0, "not valid JSON");
    expect_bad("{\"t\":", 0, "not valid JSON");
    expect_bad("[1,2,3]", 0, "not a JSON object");
    expect_bad("\"str\"", 0, "not a JSON object");
    expect_bad("{" OK_ENTRY "} x", 16, "bytes after its JSON object");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}\x01", 16, "not valid UTF-8");
    expect_bad("{\"t\xff\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, "not valid UTF-8");
    expect_bad("{\"t\":{\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, "tensor 't': lacks key 'dtype'");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", 16, "lacks key 'shape'");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2]}}", 16, "lacks key 'data_offsets'");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16],\"x\":1}}", 16, "unexpected key 'x'");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
               "key 'dtype' appears twice");
    expect_bad("{\"t\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8, "dtype 'F16' is not supported");
    expect_bad("{\"t\":{\"dtype\":3,\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, "'dtype' is not a string");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[-2,2],\"data_offsets\":[0,16]}}", 16,
               "shape axis 0 is not a non-negative integer");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}", 12, "shape axis 1");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape axis 0");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, "'shape' is not an array");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "more than 8");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
               "too many elements");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0]}}", 16, "'data_offsets' is not two");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}}", 16, "end before they begin");
    expect_bad("{\"t\":\"F32\"}", 0, "tensor 't': entry is not an object");
    expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "must be 1 to 127 bytes");
    expect_bad("{\"__metadata__\":{\"a\":1}}", 0, "'__metadata__' key 'a' is not a string");
    expect_bad("{\"__metadata__\":[]}", 0, "'__metadata__' is not an object");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "'__metadata__' appears twice");
    expect_bad("{" OK_ENTRY "," OK_ENTRY "}", 32, "appears twice"); /* caught by overlap or name */
    /* cJSON ends a string at \u0000: "t\u0000x" would name tensor "t". */
    expect_bad("{\"t\\u0000x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
               "header byte 3: a string holds \\u0000 (NUL)");
    expect_bad("{\"__metadata__\":{\"format\":\"pt\\u0000\"}," OK_ENTRY "}", 16, "\\u0000");

    char longname[300] = "{\"";
    memset(longname + 2, 'n', 200);
    strcpy(longname + 202, "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    expect_bad(longname, 1, "must be 1 to 127 bytes");
}

static void test_bad_offsets(void)
{
    /* Out of range: the data section is shorter than the offsets say (a truncated file). */
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 10,
               "run past the data section's 10 bytes");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,1e300]}}", 16,
               "'data_offsets' is not two");
    /* Size not matching shape, with the brief's message. */
    expect_bad("{\"dense.kernel\":{\"dtype\":\"F32\",\"shape\":[784,256],\"data_offsets\":[0,100]}}", 100,
               "tensor 'dense.kernel': data_offsets [0, 100] hold 25 values but shape [784, 256] needs 200704");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,15]}}", 15, "not a whole number of F32");
    /* Overlap. */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
    /* Holes: before, between and after the tensors (strict, as the reference reader). */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "bytes [0, 4) of the data section");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, "belong to no tensor (before 'b')");
    expect_bad("{" OK_ENTRY "}", 20, "cover 16 bytes but the data section holds 20");
}

static void test_bad_lengths(void)
{
    crew_st_file f;
    uint8_t seven[7] = {2, 0, 0, 0, 0, 0, 0};
    CHECK_ERR(crew_st_parse(seven, 0, "w.safetensors", &f), "w.safetensors: file is 0 bytes");
    CHECK_ERR(crew_st_parse(seven, 7, "w.safetensors", &f), "file is 7 bytes");
    size_t len;
    uint8_t *b = make_file("{" OK_ENTRY "}", 1000, 16, &len); /* declares more header than exists */
    CHECK_ERR(crew_st_parse(b, len, "w.safetensors", &f), "header length 1000 is larger than");
    free(b);
    b = make_file("{}", (uint64_t)1 << 40, 0, &len);
    CHECK_ERR(crew_st_parse(b, len, "w.safetensors", &f), "exceeds the 100000000-byte limit");
    free(b);
    b = make_file("{}", UINT64_MAX, 0, &len);
    CHECK_ERR(crew_st_parse(b, len, "w.safetensors", &f), "exceeds");
    free(b);

    /* The same through files on disk: empty, 7 bytes, truncated data, missing. */
    char path[128];
    path_in_dir(path, sizeof path, "short.safetensors");
    write_bytes(path, seven, 0);
    CHECK_ERR(crew_st_read(path, &f), "short.safetensors: file is 0 bytes");
    write_bytes(path, seven, 7);
    CHECK_ERR(crew_st_read(path, &f), "short.safetensors: file is 7 bytes");
    b = make_file("{" OK_ENTRY "}", strlen("{" OK_ENTRY "}"), 16, &len);
    write_bytes(path, b, len - 3);
    CHECK_ERR(crew_st_read(path, &f), "tensor 't': data_offsets [0, 16] run past the data section's 13 bytes");
    write_bytes(path, b, len);
    CHECK_OK(crew_st_read(path, &f));
    CHECK(f.n_tensors == 1 && f.owns_bytes);
    crew_st_free(&f);
    free(b);
    unlink(path);
    crew_status s = crew_st_read(path, &f);
    CHECK(crew_status_code(s) == CREW_CODE_IO);
    CHECK(s && strstr(crew_status_message(s), "short.safetensors: cannot open") != NULL);
    crew_status_free(s);
    CHECK_ERR(crew_st_read(dir, &f), "not a regular file (a directory)");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/crew_st_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_writer_refuses();
    test_minimal_good();
    test_bad_headers();
    test_bad_offsets();
    test_bad_lengths();
    rmdir(dir);
    return check_report();
}
