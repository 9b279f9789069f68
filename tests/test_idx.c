/* test_idx.c — IDX files raw and gzipped: round trips, and corrupt, truncated, mislabelled and
 * hostile files giving errors that name the file (without allocating what a header claims). */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "core/status.h"
#include "data/idx.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

static void path_in_tmp(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", tmp_dir, name); }

/* An IDX image in buf: magic 0 0 0x08 ndim, big-endian dims, then `n` data bytes. */
static size_t make_idx(uint8_t *buf, int type, int ndim, const uint32_t *dims, const uint8_t *data, size_t n)
{
    buf[0] = buf[1] = 0;
    buf[2] = (uint8_t)type;
    buf[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        buf[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        buf[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        buf[7 + 4 * i] = (uint8_t)dims[i];
    }
    memcpy(buf + 4 + 4 * ndim, data, n);
    return 4 + 4 * (size_t)ndim + n;
}

static void write_raw(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n);
    if (f) fclose(f);
}

static void write_gz(const char *path, const void *buf, size_t n)
{
    gzFile f = gzopen(path, "wb");
    CHECK(f && gzwrite(f, buf, (unsigned)n) == (int)n);
    if (f) gzclose(f);
}

static size_t read_whole(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap, f) : 0;
    if (f) fclose(f);
    return n;
}

static void test_round_trip(void)
{
    uint8_t pixels[12], buf[64];
    for (int i = 0; i < 12; i++) pixels[i] = (uint8_t)(i * 20);
    size_t n = make_idx(buf, 0x08, 3, (uint32_t[]){3, 2, 2}, pixels, 12);
    char raw[128], gz[128];
    path_in_tmp(raw, sizeof raw, "img.idx");
    path_in_tmp(gz, sizeof gz, "img.idx.gz");
    write_raw(raw, buf, n);
    write_gz(gz, buf, n);
    const char *paths[2] = {raw, gz};
    for (int k = 0; k < 2; k++) {
        crew_idx x;
        CHECK_OK(crew_idx_read(paths[k], &x));
        CHECK(x.ndim == 3 && x.dims[0] == 3 && x.dims[1] == 2 && x.dims[2] == 2 && x.count == 12);
        CHECK(x.data && memcmp(x.data, pixels, 12) == 0);
        crew_idx_free(&x);
        CHECK(x.data == NULL);
    }
    /* Labels, parsed from memory. */
    uint8_t labels[5] = {0, 9, 3, 3, 1};
    n = make_idx(buf, 0x08, 1, (uint32_t[]){5}, labels, 5);
    crew_idx y;
    CHECK_OK(crew_idx_parse(buf, n, "labels", &y));
    CHECK(y.ndim == 1 && y.count == 5 && memcmp(y.data, labels, 5) == 0);
    crew_idx_free(&y);
}

/* gzip allows several members back to back (cat a.gz b.gz); they inflate as one stream. */
static void test_concatenated_gzip(void)
{
    uint8_t buf[64], gz1[256], gz2[256], both[512];
    uint8_t labels[4] = {1, 2, 3, 4};
    size_t n = make_idx(buf, 0x08, 1, (uint32_t[]){4}, labels, 4);
    char p1[128], p2[128];
    path_in_tmp(p1, sizeof p1, "part1.gz");
    path_in_tmp(p2, sizeof p2, "part2.gz");
    write_gz(p1, buf, 6);
    write_gz(p2, buf + 6, n - 6);
    size_t n1 = read_whole(p1, gz1, sizeof gz1), n2 = read_whole(p2, gz2, sizeof gz2);
    memcpy(both, gz1, n1);
    memcpy(both + n1, gz2, n2);
    crew_idx y;
    CHECK_OK(crew_idx_parse(both, n1 + n2, "two members", &y));
    CHECK(y.count == 4 && y.data[3] == 4);
    crew_idx_free(&y);
    both[n1 + n2] = 0x42;
    CHECK_ERR(crew_idx_parse(both, n1 + n2 + 1, "junk.gz", &y), "junk.gz: stray bytes after the gzip stream");
}

static void test_corrupt_gzip(void)
{
    uint8_t data[4000], buf[4100], gz[8192];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31 ^ i >> 3);
    size_t n = make_idx(buf, 0x08, 2, (uint32_t[]){40, 100}, data, sizeof data);
    char path[128];
    path_in_tmp(path, sizeof path, "c.gz");
    write_gz(path, buf, n);
    size_t gn = read_whole(path, gz, sizeof gz);
    CHECK(gn > 100);
    crew_idx x;
    CHECK_OK(crew_idx_parse(gz, gn, "c.gz", &x));
    crew_idx_free(&x);

    CHECK_ERR(crew_idx_parse(gz, gn - 20, "c.gz", &x), "c.gz: the gzip stream is truncated");
    CHECK(x.data == NULL);
    CHECK_ERR(crew_idx_parse(gz, gn - 4, "c.gz", &x), "c.gz: the gzip stream is truncated");
    gz[gn - 6] ^= 0xff; /* the CRC in the trailer */
    CHECK_ERR(crew_idx_parse(gz, gn, "c.gz", &x), "c.gz: corrupt gzip data");
    gz[gn - 6] ^= 0xff;
    memset(gz + 12, 0xff, 8); /* the deflate data itself */
    CHECK_ERR(crew_idx_parse(gz, gn, "c.gz", &x), "c.gz: corrupt gzip data");
    /* And through the file reader, which names the path. */
    write_raw(path, gz, gn);
    CHECK_ERR(crew_idx_read(path, &x), "c.gz: corrupt gzip data");
}

static void test_bad_headers(void)
{
    uint8_t buf[64], data[8] = {0};
    crew_idx x;
    size_t n = make_idx(buf, 0x08, 1, (uint32_t[]){8}, data, 8);
    CHECK_OK(crew_idx_parse(buf, n, "ok", &x));
    crew_idx_free(&x);

    buf[0] = 0x01;
    CHECK_ERR(crew_idx_parse(buf, n, "b.idx", &x), "b.idx: not an IDX file (magic 01000801)");
    n = make_idx(buf, 0x0D, 1, (uint32_t[]){2}, data, 8);
    CHECK_ERR(crew_idx_parse(buf, n, "f.idx", &x), "element type 0x0d is not supported");
    n = make_idx(buf, 0x08, 0, NULL, data, 0);
    CHECK_ERR(crew_idx_parse(buf, n, "z.idx", &x), "has 0 dimensions");
    n = make_idx(buf, 0x08, 5, (uint32_t[]){1, 1, 1, 1, 1}, data, 1);
    CHECK_ERR(crew_idx_parse(buf, n, "z.idx", &x), "has 5 dimensions");
    CHECK_ERR(crew_idx_parse(buf, 2, "short.idx", &x), "short.idx: truncated: the magic number");
    n = make_idx(buf, 0x08, 3, (uint32_t[]){1, 2, 3}, data, 0);
    CHECK_ERR(crew_idx_parse(buf, 10, "d.idx", &x), "d.idx: truncated: the dimension list");
}

static void test_sizes(void)
{
    uint8_t buf[64], data[12] = {0};
    crew_idx x;
    size_t n = make_idx(buf, 0x08, 2, (uint32_t[]){3, 4}, data, 11);
    CHECK_ERR(crew_idx_parse(buf, n, "t.idx", &x), "t.idx: truncated: dimensions say 12 elements but the file holds 11");
    n = make_idx(buf, 0x08, 2, (uint32_t[]){3, 4}, data, 12);
    buf[n++] = 7;
    CHECK_ERR(crew_idx_parse(buf, n, "t.idx", &x), "t.idx: more data than its dimensions (12 elements) describe");
    /* Hostile headers: refused before any allocation of what they claim. */
    n = make_idx(buf, 0x08, 3, (uint32_t[]){0xffffffffu, 0xffffffffu, 2}, data, 4);
    CHECK_ERR(crew_idx_parse(buf, n, "h.idx", &x), "describe more than 4294967296 bytes");
    n = make_idx(buf, 0x08, 3, (uint32_t[]){60000, 28, 28}, data, 4);
    CHECK_ERR(crew_idx_parse(buf, n, "h.idx", &x), "dimensions say 47040000 elements but the file holds 4");
    char path[128];
    uint8_t gz[256];
    path_in_tmp(path, sizeof path, "h.gz");
    write_gz(path, buf, n);
    size_t gn = read_whole(path, gz, sizeof gz);
    CHECK_ERR(crew_idx_parse(gz, gn, "h.gz", &x), "more than");
    /* A plausible-sized gzip claim that the stream then does not deliver. */
    n = make_idx(buf, 0x08, 2, (uint32_t[]){100, 100}, data, 12);
    write_gz(path, buf, n);
    gn = read_whole(path, gz, sizeof gz);
    CHECK_ERR(crew_idx_parse(gz, gn, "h.gz", &x), "h.gz: truncated: dimensions say 10000 elements but the file holds 12");
    path_in_tmp(path, sizeof path, "absent.idx");
    crew_status s = crew_idx_read(path, &x);
    CHECK(crew_status_code(s) == CREW_CODE_IO && strstr(crew_status_message(s), "absent.idx"));
    crew_status_free(s);
}

/* crew_prep_idx refuses images and labels of different counts, and leaves nothing behind. */
static void test_prep_count_mismatch(void)
{
    uint8_t buf[128], data[48] = {0}, labels[4] = {0, 1, 0, 1};
    char img[128], lab[128], out[128];
    path_in_tmp(img, sizeof img, "p-images.gz");
    path_in_tmp(lab, sizeof lab, "p-labels.gz");
    path_in_tmp(out, sizeof out, "p-out");
    size_t n = make_idx(buf, 0x08, 3, (uint32_t[]){3, 4, 4}, data, 48);
    write_gz(img, buf, n);
    n = make_idx(buf, 0x08, 1, (uint32_t[]){4}, labels, 4);
    write_gz(lab, buf, n);
    CHECK_ERR(crew_prep_idx(img, lab, NULL, NULL, out, NULL, NULL), "p-labels.gz holds 4 labels but");
    CHECK_ERR(crew_prep_idx(img, lab, NULL, NULL, out, NULL, NULL), "p-images.gz holds 3 images");
    struct stat st;
    CHECK(stat(out, &st) != 0);
    CHECK_ERR(crew_prep_idx(img, lab, img, NULL, out, NULL, NULL), "both test images and test labels");
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew_test_idx_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_concatenated_gzip();
    test_corrupt_gzip();
    test_bad_headers();
    test_sizes();
    test_prep_count_mismatch();
    nftw(tmp_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
