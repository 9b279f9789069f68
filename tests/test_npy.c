/* test_npy.c — .npy writing and reading round trips for every dtype, headers as other NumPy
 * versions write them, and every kind of malformed file giving an error that says what is wrong. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/status.h"
#include "data/npy.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static int contains(const void *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp((const char *)hay + i, needle, n)) return 1;
    return 0;
}

static void path_in_tmp(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", tmp_dir, name); }

/* A .npy image in buf: magic, version, header length, the dict padded to 64 bytes, the data. */
static size_t make_npy(uint8_t *buf, int major, const char *dict, const void *data, size_t data_len)
{
    size_t prefix = major == 1 ? 10 : 12, dlen = strlen(dict);
    size_t total = (prefix + dlen + 1 + 63) / 64 * 64, hlen = total - prefix;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    buf[7] = 0;
    buf[8] = (uint8_t)(hlen & 0xff);
    buf[9] = (uint8_t)(hlen >> 8);
    if (major > 1) buf[10] = buf[11] = 0;
    memcpy(buf + prefix, dict, dlen);
    memset(buf + prefix + dlen, ' ', hlen - dlen - 1);
    buf[total - 1] = '\n';
    if (data_len) memcpy(buf + total, data, data_len);
    return total + data_len;
}

static void test_round_trip_all_dtypes(void)
{
    const crew_npy_dtype types[] = {CREW_DTYPE_U8, CREW_DTYPE_I32, CREW_DTYPE_F32, CREW_DTYPE_U16, CREW_DTYPE_I64};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int64_t shape[3] = {2, 3, 5};
        size_t item = crew_npy_dtype_size(types[t]);
        uint8_t data[30 * 8];
        for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + t);
        char path[128];
        path_in_tmp(path, sizeof path, "rt.npy");
        CHECK_OK(crew_npy_write(path, types[t], 3, shape, data));
        crew_npy a;
        CHECK_OK(crew_npy_open(path, &a));
        CHECK(a.dtype == types[t]);
        CHECK(a.ndim == 3 && a.shape[0] == 2 && a.shape[1] == 3 && a.shape[2] == 5);
        CHECK(a.count == 30);
        CHECK(a.data && memcmp(a.data, data, 30 * item) == 0);
        /* NumPy's layout: the data starts on a 64-byte boundary right after a '\n'. */
        size_t header = (size_t)((const uint8_t *)a.data - (const uint8_t *)a.map);
        CHECK(header % 64 == 0 && ((const char *)a.map)[header - 1] == '\n');
        CHECK(a.map_len == header + 30 * item);
        crew_npy_close(&a);
        CHECK(a.map == NULL);
    }
}

static void test_round_trip_shapes(void)
{
    char path[128];
    path_in_tmp(path, sizeof path, "shapes.npy");
    float v = 3.5f;
    CHECK_OK(crew_npy_write(path, CREW_DTYPE_F32, 0, NULL, &v)); /* a scalar: shape () */
    crew_npy a;
    CHECK_OK(crew_npy_open(path, &a));
    CHECK(a.ndim == 0 && a.count == 1 && memcmp(a.data, &v, 4) == 0);
    crew_npy_close(&a);

    int64_t one[1] = {4};
    int32_t ints[4] = {-1, 0, 1, 2147483647};
    CHECK_OK(crew_npy_write(path, CREW_DTYPE_I32, 1, one, ints));
    CHECK_OK(crew_npy_open(path, &a));
    CHECK(a.ndim == 1 && a.shape[0] == 4 && memcmp(a.data, ints, sizeof ints) == 0);
    /* The 1-tuple is written "(4,)" as Python spells it. */
    CHECK(contains(a.map, a.map_len, "'shape': (4,)"));
    crew_npy_close(&a);

    int64_t empty[2] = {0, 5};
    CHECK_OK(crew_npy_write(path, CREW_DTYPE_U8, 2, empty, NULL));
    CHECK_OK(crew_npy_open(path, &a));
    CHECK(a.count == 0 && a.shape[1] == 5);
    crew_npy_close(&a);
}

/* Headers written by other NumPy versions and by hand. */
static void test_header_variants(void)
{
    uint8_t buf[512], data[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    crew_npy a;
    size_t n = make_npy(buf, 1, "{'shape': (3L, 4L), 'fortran_order': False, 'descr': '<u1'}", data, 12);
    CHECK_OK(crew_npy_parse(buf, n, "py2.npy", &a));
    CHECK(a.dtype == CREW_DTYPE_U8 && a.ndim == 2 && a.shape[0] == 3 && a.shape[1] == 4 && a.count == 12);
    CHECK(a.map == NULL && ((const uint8_t *)a.data)[11] == 12);
    crew_npy_close(&a); /* parse does not own the buffer: close only clears */

    n = make_npy(buf, 2, "{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (12,), }", data, 12);
    CHECK_OK(crew_npy_parse(buf, n, "v2.npy", &a));
    CHECK(a.ndim == 1 && a.count == 12);
    n = make_npy(buf, 3, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 6)}", data, 12);
    CHECK_OK(crew_npy_parse(buf, n, "v3.npy", &a));
    CHECK(a.shape[1] == 6);
}

static void test_bad_inputs(void)
{
    uint8_t buf[512], data[20] = {0};
    crew_npy a;
    const char *ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
    size_t n = make_npy(buf, 1, ok_dict, data, 16);
    CHECK_OK(crew_npy_parse(buf, n, "x.npy", &a));

    CHECK_ERR(crew_npy_parse(buf, 7, "x.npy", &a), "x.npy: too short");
    CHECK_ERR(crew_npy_parse(buf, n - 1, "x.npy", &a), "holds only 3 elements");
    CHECK_ERR(crew_npy_parse(buf, n - 16, "x.npy", &a), "header says shape (4,) (4 elements of <f4)");
    buf[1] = 'X';
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "x.npy: not a .npy file (bad magic)");
    buf[1] = 'N';
    buf[6] = 4;
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "unsupported .npy format version 4.0");
    buf[6] = 1;
    buf[9] = 0x10; /* header length 4096 + ... past the end */
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "runs past the end of the file");

    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", data, 20);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "4 stray bytes");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "Fortran-order");
    n = make_npy(buf, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "big-endian dtype '>f4'");
    n = make_npy(buf, 1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "unsupported dtype '<c8'");
    n = make_npy(buf, 1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "structured dtypes");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,) ", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "bad .npy header");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False}", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "needs 'descr', 'fortran_order' and 'shape'");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "unexpected or repeated key 'extra'");
    n = make_npy(buf, 1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "repeated key 'descr'");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "non-negative integers");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "overflows");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "is too large");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "holds only 4 elements");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "more than 8 dimensions");
    n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), } junk", data, 16);
    CHECK_ERR(crew_npy_parse(buf, n, "x.npy", &a), "text after the dict");
}

static void test_files(void)
{
    char path[128];
    crew_npy a;
    path_in_tmp(path, sizeof path, "missing.npy");
    crew_status s = crew_npy_open(path, &a);
    CHECK(crew_status_code(s) == CREW_CODE_IO && strstr(crew_status_message(s), "missing.npy"));
    crew_status_free(s);

    /* A file cut short on disk: the error names the file and the element counts. */
    path_in_tmp(path, sizeof path, "cut.npy");
    int64_t shape[2] = {10, 10};
    uint8_t data[100] = {0};
    CHECK_OK(crew_npy_write(path, CREW_DTYPE_U8, 2, shape, data));
    CHECK(truncate(path, 128 + 99) == 0); /* a 128-byte header, then 99 of the 100 bytes */
    s = crew_npy_open(path, &a);
    CHECK(crew_status_code(s) == CREW_CODE_BAD_INPUT);
    CHECK(strstr(crew_status_message(s), "cut.npy: header says shape (10, 10) (100 elements of |u1)") != NULL);
    CHECK(strstr(crew_status_message(s), "holds only 99 elements") != NULL);
    crew_status_free(s);
    CHECK(truncate(path, 5) == 0);
    CHECK_ERR(crew_npy_open(path, &a), "too short");

    CHECK_ERR(crew_npy_write(path, (crew_npy_dtype)99, 2, shape, data), "unknown dtype");
    CHECK_ERR(crew_npy_write(path, CREW_DTYPE_U8, 9, shape, data), "ndim 9");
    CHECK_ERR(crew_npy_write(path, CREW_DTYPE_U8, 2, shape, NULL), "NULL data");
    path_in_tmp(path, sizeof path, "no/such/dir.npy");
    s = crew_npy_write(path, CREW_DTYPE_U8, 2, shape, data);
    CHECK(crew_status_code(s) == CREW_CODE_IO);
    crew_status_free(s);
}

static void test_dtype_names(void)
{
    crew_npy_dtype t;
    CHECK(crew_npy_dtype_from_name("float32", &t) && t == CREW_DTYPE_F32);
    CHECK(crew_npy_dtype_from_name("uint8", &t) && t == CREW_DTYPE_U8);
    CHECK(!crew_npy_dtype_from_name("float64", &t));
    CHECK(!strcmp(crew_npy_dtype_name(CREW_DTYPE_I64), "int64"));
    CHECK(!strcmp(crew_npy_dtype_descr(CREW_DTYPE_U16), "<u2") && crew_npy_dtype_size(CREW_DTYPE_U16) == 2);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew_test_npy_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip_all_dtypes();
    test_round_trip_shapes();
    test_header_variants();
    test_bad_inputs();
    test_files();
    test_dtype_names();
    nftw(tmp_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
