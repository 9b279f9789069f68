/* test_prep_sources.c — crew prep from CIFAR-10 batches, image folders, CSV and text, on small
 * fixtures generated here (PNGs with libpng, JPEGs with libjpeg): pixels landing in NHWC, class
 * numbering, resizing, normalisation statistics, the stratified seeded split, byte tokens in
 * llm.c shards; and every kind of bad input an error naming the file (and line or record), with
 * no output directory or temporary directory left behind. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <ftw.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "data/dataset.h"
#include "data/image_decode.h"
#include "data/manifest.h"
#include "data/resize.h"
#include "data/tokens.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* tmp_dir/name into buf; returns buf. */
static char *tmp(char *buf, const char *name)
{
    snprintf(buf, 512, "%s/%s", tmp_dir, name);
    return buf;
}

static void write_text(const char *path, const char *text) { write_file(path, text, strlen(text)); }


static void check_progress(const progress_log *p)
{
    CHECK(p->calls > 2);
    CHECK(p->bad == 0);
    CHECK(p->last_done == p->last_total);
}

/* A failed prep leaves neither OUT nor OUT.tmp-*. */
static void check_nothing_left(const char *out)
{
    CHECK_MSG(!path_exists(out), "%s exists after a failed prep", out);
    CHECK(temp_dirs_in(tmp_dir) == 0);
}

/* ================================================================ CIFAR-10 */

enum { CIFAR_RECORDS = 20, CIFAR_REC = 3073 };

static uint8_t cifar_pixel(int batch, int rec, int c, int p) { return (uint8_t)(batch * 31 + rec * 7 + c * 100 + p * 3); }
static uint8_t cifar_label(int batch, int rec) { return (uint8_t)((batch * 3 + rec) % 10); }

static void write_cifar_batch(const char *dir, const char *name, int batch, int records, size_t cut, int bad_label_at)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = (size_t)records * CIFAR_REC;
    uint8_t *b = malloc(len);
    for (int r = 0; r < records; r++) {
        uint8_t *rec = b + (size_t)r * CIFAR_REC;
        rec[0] = r == bad_label_at ? 10 : cifar_label(batch, r);
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 1024; p++) rec[1 + c * 1024 + p] = cifar_pixel(batch, r, c, p);
    }
    write_file(path, b, len - cut);
    free(b);
}

static void make_cifar(const char *dir, int with_meta)
{
    static const char *const names[6] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                         "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
    mkdir(dir, 0755);
    for (int b = 0; b < 6; b++) write_cifar_batch(dir, names[b], b, CIFAR_RECORDS, 0, -1);
    if (with_meta) {
        char path[600];
        snprintf(path, sizeof path, "%s/batches.meta.txt", dir);
        write_text(path, "c0\nc1\nc2\nc3\nc4\nc5\nc6\nc7\nc8\nnine\n\n");
    }
}

static void check_cifar_split(const char *out, const char *split, int first_batch, int n)
{
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, split, &d));
    if (!d) return;
    CHECK(d->n == n && d->classes == 10);
    CHECK(d->sample.ndim == 3 && d->sample.dim[0] == 32 && d->sample.dim[1] == 32 && d->sample.dim[2] == 3);
    const uint8_t *x = d->x.data, *y = d->y.data;
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        int b = first_batch + i / CIFAR_RECORDS, r = i % CIFAR_RECORDS;
        if (y[i] != cifar_label(b, r)) wrong++;
        for (int row = 0; row < 32; row++)
            for (int col = 0; col < 32; col++)
                for (int c = 0; c < 3; c++) /* NHWC: [i][row][col][c] from plane c at row * 32 + col */
                    if (x[(((size_t)i * 32 + row) * 32 + col) * 3 + c] != cifar_pixel(b, r, c, row * 32 + col)) wrong++;
    }
    CHECK_MSG(wrong == 0, "%s: %d labels or pixels misplaced", split, wrong);
    CHECK_OK(crew_dataset_verify(d));
    crew_dataset_free(d);
}

/* Mean and std of channel c over the training fixture, as prep should compute them. */
static void cifar_stats(int c, double *mean, double *std)
{
    double sum = 0, sq = 0, n = 5.0 * CIFAR_RECORDS * 1024;
    for (int b = 0; b < 5; b++)
        for (int r = 0; r < CIFAR_RECORDS; r++)
            for (int p = 0; p < 1024; p++) sum += cifar_pixel(b, r, c, p) / 255.0;
    *mean = sum / n;
    for (int b = 0; b < 5; b++)
        for (int r = 0; r < CIFAR_RECORDS; r++)
            for (int p = 0; p < 1024; p++) sq += pow(cifar_pixel(b, r, c, p) / 255.0 - *mean, 2);
    *std = sqrt(sq / n);
}

static void test_cifar(void)
{
    char src[512], out[512], out2[512];
    tmp(src, "cifar-src");
    tmp(out, "cifar-out");
    make_cifar(src, 1);
    progress_log log = {0};
    CHECK_OK(crew_prep_cifar10(src, out, on_progress, &log));
    check_progress(&log);
    check_cifar_split(out, "train", 0, 5 * CIFAR_RECORDS);
    check_cifar_split(out, "test", 5, CIFAR_RECORDS);
    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(m.class_names && !strcmp(m.class_names[0], "c0") && !strcmp(m.class_names[9], "nine"));
    CHECK(!strcmp(m.name, "cifar10") && m.n_channels == 3);
    for (int c = 0; c < 3; c++) {
        double mean, std;
        cifar_stats(c, &mean, &std);
        CHECK_MSG(fabs(m.mean[c] - mean) < 1e-9 && fabs(m.std[c] - std) < 1e-9, "channel %d: %g/%g vs %g/%g", c,
                  m.mean[c], m.std[c], mean, std);
    }
    crew_manifest_free(&m);
    /* Without batches.meta.txt: CIFAR-10's own class names. */
    char meta[600];
    snprintf(meta, sizeof meta, "%s/batches.meta.txt", src);
    remove(meta);
    CHECK_OK(crew_prep_cifar10(src, tmp(out2, "cifar-out2"), NULL, NULL));
    CHECK_OK(crew_manifest_read(out2, &m));
    CHECK(m.class_names && !strcmp(m.class_names[0], "airplane") && !strcmp(m.class_names[9], "truck"));
    crew_manifest_free(&m);
    CHECK_ERR(crew_prep_cifar10(src, out2, NULL, NULL), "already exists");
}

static void test_cifar_errors(void)
{
    char src[512], out[512], path[600];
    tmp(src, "cifar-bad");
    tmp(out, "cifar-bad-out");
    make_cifar(src, 0);
    write_cifar_batch(src, "data_batch_3.bin", 2, CIFAR_RECORDS, 5, -1);
    CHECK_ERR(crew_prep_cifar10(src, out, NULL, NULL), "data_batch_3.bin: 61455 bytes is not a positive multiple of the 3073");
    check_nothing_left(out);
    write_cifar_batch(src, "data_batch_3.bin", 2, CIFAR_RECORDS, 0, -1);
    write_cifar_batch(src, "test_batch.bin", 5, CIFAR_RECORDS, 0, 7);
    CHECK_ERR(crew_prep_cifar10(src, out, NULL, NULL), "test_batch.bin: record 7 has label 10, outside [0, 10)");
    check_nothing_left(out);
    write_cifar_batch(src, "test_batch.bin", 5, CIFAR_RECORDS, 0, -1);
    snprintf(path, sizeof path, "%s/data_batch_5.bin", src);
    remove(path);
    CHECK_ERR(crew_prep_cifar10(src, out, NULL, NULL), "data_batch_5.bin: No such file");
    check_nothing_left(out);
    write_cifar_batch(src, "data_batch_5.bin", 4, 0, 0, -1);
    CHECK_ERR(crew_prep_cifar10(src, out, NULL, NULL), "data_batch_5.bin: 0 bytes");
    write_cifar_batch(src, "data_batch_5.bin", 4, CIFAR_RECORDS, 0, -1);
    snprintf(path, sizeof path, "%s/batches.meta.txt", src);
    write_text(path, "one\ntwo\n");
    CHECK_ERR(crew_prep_cifar10(src, out, NULL, NULL), "batches.meta.txt: 2 class names, expected 10");
    check_nothing_left(out);
}

/* ================================================================ image fixtures */

/* A w x h image of one colour: channels 1 (grey), 3 (RGB) or 4 (RGBA). */
static uint8_t *solid(int w, int h, int channels, const uint8_t *colour)
{
    uint8_t *px = malloc((size_t)w * h * channels);
    for (int i = 0; i < w * h; i++) memcpy(px + (size_t)i * channels, colour, (size_t)channels);
    return px;
}

static void write_png(const char *path, int w, int h, int channels, const uint8_t *colour)
{
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = channels == 1 ? PNG_FORMAT_GRAY : channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
    uint8_t *px = solid(w, h, channels, colour);
    CHECK_MSG(png_image_write_to_file(&im, path, 0, px, 0, NULL), "%s: %s", path, im.message);
    free(px);
}

/* A JPEG in memory (*len bytes, free() it). */
static uint8_t *jpeg_bytes(int w, int h, int channels, const uint8_t *colour, size_t *len)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &buf, &n);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = channels;
    c.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    uint8_t *px = solid(w, h, channels, colour);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = px + (size_t)c.next_scanline * w * channels;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(px);
    uint8_t *out = malloc(n);
    memcpy(out, buf, n);
    free(buf);
    *len = n;
    return out;
}

static void write_jpeg(const char *path, int w, int h, int channels, const uint8_t *colour)
{
    size_t len;
    uint8_t *b = jpeg_bytes(w, h, channels, colour, &len);
    write_file(path, b, len);
    free(b);
}

static const uint8_t CAT_RGB[3] = {200, 100, 50}, CAT_GREY[1] = {77}, DOG_RGB[3] = {10, 200, 30}, DOG_GREY[1] = {140},
                     ZEBRA_RGBA[4] = {0, 0, 250, 128};

/* src/{zebra,cat,dog} (made in that order, so the listing order is not the class order):
 * cat 3 RGB PNGs + 1 grey PNG of different sizes, dog 2 RGB JPEGs + 1 grey JPEG, zebra 2 RGBA
 * PNGs; plus files that must be skipped. */
static void make_image_folder(const char *src)
{
    char p[700];
    mkdir(src, 0755);
    const char *classes[3] = {"zebra", "cat", "dog"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", src, classes[i]);
        mkdir(p, 0755);
    }
    snprintf(p, sizeof p, "%s/zebra/z1.png", src), write_png(p, 5, 9, 4, ZEBRA_RGBA);
    snprintf(p, sizeof p, "%s/zebra/Z2.PNG", src), write_png(p, 40, 3, 4, ZEBRA_RGBA);
    snprintf(p, sizeof p, "%s/cat/a.png", src), write_png(p, 20, 30, 3, CAT_RGB);
    snprintf(p, sizeof p, "%s/cat/b.png", src), write_png(p, 8, 12, 3, CAT_RGB);
    snprintf(p, sizeof p, "%s/cat/c.png", src), write_png(p, 97, 61, 3, CAT_RGB);
    snprintf(p, sizeof p, "%s/cat/grey.png", src), write_png(p, 8, 8, 1, CAT_GREY);
    snprintf(p, sizeof p, "%s/dog/d1.jpg", src), write_jpeg(p, 16, 16, 3, DOG_RGB);
    snprintf(p, sizeof p, "%s/dog/d2.jpeg", src), write_jpeg(p, 33, 17, 3, DOG_RGB);
    snprintf(p, sizeof p, "%s/dog/grey.jpg", src), write_jpeg(p, 24, 24, 1, DOG_GREY);
    snprintf(p, sizeof p, "%s/dog/notes.txt", src), write_text(p, "not an image");
    snprintf(p, sizeof p, "%s/cat/.hidden.png", src), write_text(p, "not an image either");
    snprintf(p, sizeof p, "%s/README", src), write_text(p, "top-level files are not classes");
    snprintf(p, sizeof p, "%s/.git", src), mkdir(p, 0755); /* a hidden folder is not a class */
}

/* Is sample x [h][w][c] one colour, and is it a colour its class's images have? */
static int sample_ok(const uint8_t *x, int h, int w, int c, int label)
{
    for (int i = 1; i < h * w; i++)
        if (memcmp(x, x + (size_t)i * c, (size_t)c)) return 0;
    int near;
    if (label == 0) { /* cat: exact, PNG is lossless */
        if (c == 3) return !memcmp(x, CAT_RGB, 3) || (x[0] == 77 && x[1] == 77 && x[2] == 77);
        return x[0] == 124 || x[0] == 77; /* BT.601 luma of (200, 100, 50) is 124.2 */
    }
    if (label == 1) { /* dog: JPEG, within a few levels */
        near = c == 3 ? (abs(x[0] - 10) <= 3 && abs(x[1] - 200) <= 3 && abs(x[2] - 30) <= 3)
                            || (abs(x[0] - 140) <= 3 && x[0] == x[1] && x[1] == x[2])
                      : (abs(x[0] - 124) <= 3 || abs(x[0] - 140) <= 3); /* luma of (10, 200, 30) is 123.8 */
        return near;
    }
    return c == 3 ? (x[0] == 0 && x[1] == 0 && x[2] == 250) : x[0] == 29; /* alpha dropped; luma 28.5 */
}

static void check_image_split(const char *out, const char *split, int h, int w, int c, int want_n, int *per_class)
{
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, split, &d));
    if (!d) return;
    CHECK_MSG(d->n == want_n, "%s: %lld samples, wanted %d", split, (long long)d->n, want_n);
    CHECK(d->classes == 3 && d->sample.dim[0] == h && d->sample.dim[1] == w && d->sample.dim[2] == c);
    const uint8_t *x = d->x.data, *y = d->y.data;
    for (int64_t i = 0; i < d->n; i++) {
        CHECK_MSG(sample_ok(x + i * h * w * c, h, w, c, y[i]), "%s sample %lld (label %d) is not its class's colour: %d %d %d",
                  split, (long long)i, y[i], x[i * h * w * c], x[i * h * w * c + (c > 1)], x[i * h * w * c + 2 * (c > 1)]);
        if (y[i] < 3) per_class[y[i]]++;
    }
    crew_dataset_free(d);
}

static void test_images(void)
{
    char src[512], out[512], out1[512], again[512];
    tmp(src, "images-src");
    tmp(out, "images-out");
    make_image_folder(src);
    crew_image_prep_options o = {.height = 8, .width = 12, .channels = 3, .test_fraction = 0.34, .seed = 1};
    progress_log log = {0};
    CHECK_OK(crew_prep_images(src, &o, out, on_progress, &log));
    check_progress(&log);
    /* Per class round(n * 0.34): cat 4 -> 1, dog 3 -> 1, zebra 2 -> 1. */
    int train_per[3] = {0}, test_per[3] = {0};
    check_image_split(out, "train", 8, 12, 3, 6, train_per);
    check_image_split(out, "test", 8, 12, 3, 3, test_per);
    CHECK(train_per[0] == 3 && train_per[1] == 2 && train_per[2] == 1);
    CHECK(test_per[0] == 1 && test_per[1] == 1 && test_per[2] == 1);
    crew_manifest m, m2;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(m.classes == 3 && m.class_names && !strcmp(m.class_names[0], "cat") && !strcmp(m.class_names[1], "dog")
          && !strcmp(m.class_names[2], "zebra"));
    /* The same seed gives the same split, byte for byte. */
    CHECK_OK(crew_prep_images(src, &o, tmp(again, "images-again"), NULL, NULL));
    CHECK_OK(crew_manifest_read(again, &m2));
    CHECK(m.splits[1].x.xxh3 == m2.splits[1].x.xxh3 && m.splits[1].y.xxh3 == m2.splits[1].y.xxh3);
    crew_manifest_free(&m);
    crew_manifest_free(&m2);
    /* Grey output. */
    o.channels = 1;
    o.height = o.width = 5;
    CHECK_OK(crew_prep_images(src, &o, tmp(out1, "images-grey"), NULL, NULL));
    int per[3] = {0};
    check_image_split(out1, "train", 5, 5, 1, 6, per);
    CHECK_OK(crew_manifest_read(out1, &m));
    CHECK(m.n_channels == 1 && m.sample_shape.dim[2] == 1);
    crew_manifest_free(&m);
}

/* A fresh copy of a minimal valid folder at src, for one bad thing to be added. */
static void minimal_folder(const char *src)
{
    char p[700];
    rm_tree(src);
    mkdir(src, 0755);
    snprintf(p, sizeof p, "%s/a", src), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/b", src), mkdir(p, 0755);
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/a/%d.png", src, i), write_png(p, 4, 4, 3, CAT_RGB);
        snprintf(p, sizeof p, "%s/b/%d.jpg", src, i), write_jpeg(p, 4, 4, 3, DOG_RGB);
    }
}

static void expect_images_error(const char *src, const char *needle)
{
    char out[512];
    tmp(out, "images-bad-out");
    crew_image_prep_options o = {.height = 4, .width = 4, .channels = 3, .test_fraction = 0.3, .seed = 0};
    CHECK_ERR(crew_prep_images(src, &o, out, NULL, NULL), needle);
    check_nothing_left(out);
}

static void test_image_errors(void)
{
    char src[512], p[700];
    tmp(src, "images-bad");
    minimal_folder(src);
    snprintf(p, sizeof p, "%s/a/empty.png", src), write_file(p, "", 0);
    expect_images_error(src, "a/empty.png: empty file");
    minimal_folder(src);
    size_t len;
    uint8_t *jpg = jpeg_bytes(32, 32, 3, DOG_RGB, &len);
    snprintf(p, sizeof p, "%s/b/cut.jpg", src), write_file(p, jpg, len / 2);
    expect_images_error(src, "b/cut.jpg: corrupt JPEG");
    minimal_folder(src);
    /* An end-of-image marker a few bytes into the entropy-coded scan: libjpeg would only warn. */
    size_t sos = 0;
    for (size_t i = 0; i + 3 < len && !sos; i++)
        if (jpg[i] == 0xff && jpg[i + 1] == 0xda) sos = i + 2 + (size_t)(jpg[i + 2] << 8 | jpg[i + 3]);
    CHECK(sos > 0 && sos + 4 < len);
    jpg[sos + 2] = 0xff, jpg[sos + 3] = 0xd9;
    snprintf(p, sizeof p, "%s/b/flip.jpg", src), write_file(p, jpg, len);
    expect_images_error(src, "b/flip.jpg: corrupt JPEG");
    free(jpg);
    minimal_folder(src);
    snprintf(p, sizeof p, "%s/a/big.png", src), write_png(p, 64, 64, 3, CAT_RGB);
    FILE *f = fopen(p, "rb");
    uint8_t buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    snprintf(p, sizeof p, "%s/a/cut.png", src), write_file(p, buf, n - 20); /* loses IEND and the end of IDAT */
    expect_images_error(src, "a/cut.png: corrupt PNG");
    minimal_folder(src);
    snprintf(p, sizeof p, "%s/a/text.png", src), write_text(p, "hello, I am not a PNG");
    expect_images_error(src, "a/text.png: neither a PNG nor a JPEG");
    minimal_folder(src);
    snprintf(p, sizeof p, "%s/c", src), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/c/readme.txt", src), write_text(p, "no images here");
    expect_images_error(src, "images-bad/c: an empty class folder");
    rm_tree(src);
    mkdir(src, 0755);
    expect_images_error(src, "images-bad: no class folders");
    expect_images_error("/nonexistent-crew-dir", "/nonexistent-crew-dir");
    minimal_folder(src);
    char out[512];
    crew_image_prep_options o = {.height = 4, .width = 4, .channels = 2, .test_fraction = 0.3};
    CHECK_ERR(crew_prep_images(src, &o, tmp(out, "x"), NULL, NULL), "channels must be 1 or 3");
    o.channels = 3, o.test_fraction = 0.01;
    CHECK_ERR(crew_prep_images(src, &o, out, NULL, NULL), "leaves no test sample");
    check_nothing_left(out);
}

static void test_decode_and_resize(void)
{
    /* The decoders straight from memory, and a constant image staying constant at any size. */
    size_t len;
    uint8_t *jpg = jpeg_bytes(13, 7, 1, DOG_GREY, &len);
    crew_image img;
    CHECK_OK(crew_image_decode(jpg, len, "g.jpg", &img));
    CHECK(img.width == 13 && img.height == 7 && img.channels == 1);
    CHECK_OK(crew_image_convert(&img, 3));
    CHECK(img.channels == 3 && img.pixels[0] == img.pixels[1] && img.pixels[1] == img.pixels[2]);
    crew_image_free(&img);
    free(jpg);
    CHECK_ERR(crew_image_decode("", 0, "e.png", &img), "e.png: empty file");
    CHECK_ERR(crew_image_decode_png("\x89PNG\r\n\x1a\n", 8, "h.png", &img), "h.png");
    CHECK_ERR(crew_image_decode_jpeg("\xff\xd8\xff", 3, "h.jpg", &img), "h.jpg: corrupt JPEG");
    const int sizes[][2] = {{7, 5}, {1, 1}, {32, 32}, {3, 97}, {100, 2}};
    uint8_t src[13 * 11 * 3], dst[100 * 97 * 3];
    for (int i = 0; i < 13 * 11; i++) src[3 * i] = 17, src[3 * i + 1] = 254, src[3 * i + 2] = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int h = sizes[k][0], w = sizes[k][1], bad = 0;
        CHECK_OK(crew_resize_u8(src, 13, 11, 3, dst, h, w));
        for (int i = 0; i < h * w; i++) bad += dst[3 * i] != 17 || dst[3 * i + 1] != 254 || dst[3 * i + 2] != 0;
        CHECK_MSG(bad == 0, "13x11 -> %dx%d: %d pixels changed colour", h, w, bad);
    }
    /* Area when shrinking: 4 -> 2 averages pairs; bilinear when growing: 2 -> 4 interpolates. */
    const uint8_t row4[4] = {0, 100, 200, 250}, row2[2] = {0, 100};
    uint8_t out2[2], out4[4];
    CHECK_OK(crew_resize_u8(row4, 1, 4, 1, out2, 1, 2));
    CHECK(out2[0] == 50 && out2[1] == 225);
    CHECK_OK(crew_resize_u8(row2, 1, 2, 1, out4, 1, 4));
    CHECK(out4[0] == 0 && out4[1] == 25 && out4[2] == 75 && out4[3] == 100);
    /* 3 -> 2 weighs the middle pixel half into each output. */
    const uint8_t row3[3] = {0, 90, 180};
    CHECK_OK(crew_resize_u8(row3, 3, 1, 1, out2, 2, 1));
    CHECK(out2[0] == 30 && out2[1] == 150);
}

/* ================================================================ CSV */

static void test_csv(void)
{
    char path[512], out[512];
    /* Quoted header names, CRLF, spaces around fields, a blank line, the label not last. */
    FILE *f = fopen(tmp(path, "table.csv"), "wb");
    fprintf(f, "\"a\", b ,label,\"c \"\"q\"\"\"\r\n");
    for (int i = 0; i < 30; i++) fprintf(f, "%d, %g ,%d,5\r\n", i, 2.5 * i + 1, i % 3);
    fprintf(f, "\r\n");
    fclose(f);
    progress_log log = {0};
    CHECK_OK(crew_prep_csv(path, "label", 0.2, 3, tmp(out, "csv-out"), on_progress, &log));
    check_progress(&log);
    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(m.classes == 3 && m.sample_shape.ndim == 1 && m.sample_shape.dim[0] == 3 && m.n_channels == 3);
    CHECK(m.scale == 1.0 && m.splits[0].x.dtype == CREW_DTYPE_F32 && m.splits[0].y.dtype == CREW_DTYPE_I32);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &d));
    if (d) {
        CHECK(d->n == 24); /* 10 per class, 2 of each held out */
        const float *x = d->x.data;
        const int32_t *y = d->y.data;
        double sum[3] = {0}, sq[3] = {0};
        for (int64_t i = 0; i < d->n; i++) {
            int a = (int)x[3 * i];
            CHECK(x[3 * i + 1] == (float)(2.5 * a + 1) && x[3 * i + 2] == 5 && y[i] == a % 3);
            for (int j = 0; j < 3; j++) sum[j] += x[3 * i + j];
        }
        for (int j = 0; j < 3; j++) {
            double mean = sum[j] / d->n;
            for (int64_t i = 0; i < d->n; i++) sq[j] += pow(x[3 * i + j] - mean, 2);
            double sd = sqrt(sq[j] / d->n);
            CHECK_MSG(fabs(m.mean[j] - mean) < 1e-9 && fabs(m.std[j] - (sd > 0 ? sd : 1)) < 1e-9, "feature %d", j);
        }
        /* Gathering applies (v - mean) / std per feature. */
        float g[3];
        int32_t gy;
        int64_t idx = 0;
        crew_dataset_gather(d, &idx, 1, g, &gy);
        for (int j = 0; j < 3; j++) CHECK(fabsf(g[j] - (float)((x[j] - m.mean[j]) / m.std[j])) < 1e-5f);
        crew_dataset_free(d);
    }
    crew_manifest_free(&m);
}

/* f features, whatever f (up to 16 the manifest holds their statistics inline, beyond it
 * allocates them): the stored values are the CSV's raw numbers, the manifest records one mean and
 * std per feature over the training split, and gathering gives (x - mean) / std. */
static void test_csv_features(int f)
{
    char path[512], out[512], name[64];
    snprintf(name, sizeof name, "features%d.csv", f);
    FILE *f_csv = fopen(tmp(path, name), "wb");
    for (int j = 0; j < f; j++) fprintf(f_csv, "f%d,", j);
    fprintf(f_csv, "y\n");
    for (int i = 0; i < 40; i++) {
        for (int j = 0; j < f; j++) fprintf(f_csv, "%g,", j == 5 ? 7.0 : (i * (j + 1) + j) * 0.5 - 3); /* 5: constant */
        fprintf(f_csv, "%d\n", i % 2);
    }
    fclose(f_csv);
    snprintf(name, sizeof name, "csv-features%d", f);
    CHECK_OK(crew_prep_csv(path, "y", 0.25, 0, tmp(out, name), NULL, NULL));
    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK_MSG(m.n_channels == f && m.scale == 1 && m.sample_shape.dim[0] == f, "%d features: %d entries", f,
              m.n_channels);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &d));
    if (d && m.n_channels == f) {
        const double *mean = m.mean, *std = m.std;
        const float *x = d->x.data;
        int raw = 1, stats = 1, gathered = 1;
        for (int64_t i = 0; i < d->n; i++) { /* the row a train sample came from: its first feature says */
            int row = (int)((x[i * f] + 3) / 0.5);
            for (int j = 0; j < f; j++) raw &= x[i * f + j] == (float)(j == 5 ? 7.0 : (row * (j + 1) + j) * 0.5 - 3);
        }
        for (int j = 0; j < f; j++) {
            double sum = 0, sq = 0;
            for (int64_t i = 0; i < d->n; i++) sum += x[i * f + j];
            for (int64_t i = 0; i < d->n; i++) sq += pow(x[i * f + j] - sum / d->n, 2);
            double sd = sqrt(sq / d->n);
            stats &= fabs(mean[j] - sum / d->n) < 1e-9 && fabs(std[j] - (sd > 0 ? sd : 1)) < 1e-9;
        }
        CHECK_MSG(raw, "%d features: the stored values are not the CSV's", f);
        CHECK_MSG(stats, "%d features: mean/std are not the training split's", f);
        CHECK(std[5] == 1 && mean[5] == 7);
        float *g = malloc(sizeof *g * (size_t)f * 3);
        int32_t gy[3];
        int64_t idx[3] = {0, 7, d->n - 1};
        crew_dataset_gather(d, idx, 3, g, gy);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < f; j++) {
                double want = (x[idx[i] * f + j] - mean[j]) / std[j];
                gathered &= fabs(g[i * f + j] - want) < 1e-5 * (1 + fabs(want));
            }
        CHECK_MSG(gathered, "%d features: gathered values are not (x - mean) / std", f);
        free(g);
    }
    crew_dataset_free(d);
    crew_manifest_free(&m);
}

static void expect_csv_error(const char *name, const char *text, const char *label, const char *needle)
{
    char path[512], out[512];
    write_text(tmp(path, name), text);
    tmp(out, "csv-bad-out");
    CHECK_ERR(crew_prep_csv(path, label, 0.5, 0, out, NULL, NULL), name);
    CHECK_ERR(crew_prep_csv(path, label, 0.5, 0, out, NULL, NULL), needle);
    check_nothing_left(out);
}

static void test_csv_errors(void)
{
    expect_csv_error("ragged.csv", "a,b,y\n1,2,0\n3,4,1\n5,1\n", "y", "line 4 has 2 fields but the header has 3");
    expect_csv_error("long.csv", "a,b,y\n1,2,0\n3,4,1,7\n", "y", "line 3 has 4 fields");
    expect_csv_error("word.csv", "a,b,y\n1,2,0\n3,four,1\n", "y", "line 3, column 2 ('b'): 'four' is not a number");
    expect_csv_error("blank.csv", "a,b,y\n1,,0\n", "y", "line 2, column 2 ('b'): '' is not a number");
    expect_csv_error("nan.csv", "a,b,y\n1,nan,0\n", "y", "'nan' is not a number");
    expect_csv_error("huge.csv", "a,b,y\n1,1e300,0\n", "y", "out of float32 range");
    expect_csv_error("label.csv", "a,b,y\n1,2,0\n1,2,2.5\n", "y", "line 3, column 3 ('y'): '2.5' is not a class label");
    expect_csv_error("neg.csv", "a,b,y\n1,2,-1\n", "y", "'-1' is not a class label");
    expect_csv_error("nolabel.csv", "a,b,c\n1,2,0\n", "y", "no column named 'y'");
    expect_csv_error("twice.csv", "y,b,y\n1,2,0\n", "y", "two columns are named 'y'");
    expect_csv_error("only.csv", "y\n1\n2\n", "y", "the only column");
    expect_csv_error("empty.csv", "", "y", "empty file");
    expect_csv_error("spaces.csv", "  \n\n", "y", "empty file");
    expect_csv_error("header.csv", "a,y\n", "y", "no data rows");
    expect_csv_error("quote.csv", "a,y\n\"1,0\n", "y", "line 2: a quoted field is never closed");
    expect_csv_error("after.csv", "a,y\n\"1\"x,0\n", "y", "line 2: text after a closing quote");
    /* One feature more than a manifest records statistics for. */
    char *wide = malloc(2 * (CREW_MANIFEST_MAX_STATS + 1) + 8), *at = wide;
    for (int j = 0; wide && j <= CREW_MANIFEST_MAX_STATS; j++) at += sprintf(at, "a,");
    if (wide) sprintf(at, "y\n1,0\n");
    if (wide) expect_csv_error("wide.csv", wide, "y", "line 1: more than 1048576 feature columns");
    free(wide);
    char out[512];
    CHECK_ERR(crew_prep_csv("/nonexistent/t.csv", "y", 0.5, 0, tmp(out, "o"), NULL, NULL), "/nonexistent/t.csv");
    CHECK_ERR(crew_prep_csv("/nonexistent/t.csv", "y", 0, 0, out, NULL, NULL), "test fraction");
}

/* ================================================================ text */

static void test_text(void)
{
    enum { N = 5000 };
    uint8_t text[N];
    for (int i = 0; i < N; i++) text[i] = (uint8_t)(i * 7 + i / 256);
    char path[512], out[512], shard[700];
    write_file(tmp(path, "corpus.txt"), text, N);
    progress_log log = {0};
    CHECK_OK(crew_prep_text(path, 64, 0.1, tmp(out, "text-out"), on_progress, &log));
    check_progress(&log);
    crew_token_shard sh;
    snprintf(shard, sizeof shard, "%s/train_000000.bin", out);
    CHECK_OK(crew_tokens_open(shard, &sh));
    CHECK(sh.count == N - 500);
    int wrong = 0;
    for (int64_t i = 0; i < sh.count; i++) wrong += sh.tokens[i] != text[i];
    CHECK(wrong == 0);
    crew_tokens_close(&sh);
    snprintf(shard, sizeof shard, "%s/val_000000.bin", out);
    CHECK_OK(crew_tokens_open(shard, &sh));
    CHECK(sh.count == 500);
    for (int64_t i = 0; i < sh.count; i++) wrong += sh.tokens[i] != text[N - 500 + i];
    CHECK(wrong == 0);
    crew_tokens_close(&sh);
    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(m.has_tokens && m.tokens.vocab == 256 && m.tokens.seq_len == 64 && m.tokens.n_shards == 2 && m.n_splits == 0);
    if (m.tokens.n_shards == 2) {
        CHECK(!strcmp(m.tokens.shards[0].split, "train") && m.tokens.shards[0].tokens == N - 500);
        CHECK(!strcmp(m.tokens.shards[1].file, "val_000000.bin") && m.tokens.shards[1].bytes == 1024 + 1000);
    }
    crew_manifest_free(&m);
    /* The train split as samples: windows of seq_len tokens, each labelled with the next ones. */
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &d));
    if (d) {
        int64_t shape[4];
        CHECK(crew_dataset_is_tokens(d) && crew_dataset_classes(d) == 256);
        CHECK(crew_dataset_size(d) == (N - 500 - 1) / 64 && crew_dataset_sample_shape(d, shape) == 1 && shape[0] == 64);
        int64_t idx[2] = {1, 0};
        float x[128];
        int32_t y[128];
        crew_dataset_gather(d, idx, 2, x, y);
        int bad = 0;
        for (int j = 0; j < 64; j++)
            bad += x[j] != (float)text[64 + j] || y[j] != text[65 + j] || x[64 + j] != (float)text[j] || y[64 + j] != text[j + 1];
        CHECK(bad == 0);
        CHECK_ERR(crew_dataset_set_context(d, N), "needs shards of at least");
        CHECK_OK(crew_dataset_set_context(d, 100));
        CHECK(crew_dataset_size(d) == (N - 500 - 1) / 100);
        CHECK_OK(crew_dataset_verify(d));
        crew_dataset_free(d);
        d = NULL;
    }
    CHECK_OK(crew_dataset_open(out, "test", &d)); /* the held-out split, "val" in a token dataset */
    CHECK(d && crew_dataset_size(d) == (500 - 1) / 64);
    crew_dataset_free(d);
    d = NULL;
    /* The written shard, damaged in its header: bad magic, another version, a count past the end. */
    snprintf(shard, sizeof shard, "%s/val_000000.bin", out);
    const struct {
        long at;
        uint8_t v[4];
        const char *needle;
    } damage[] = {{0, {1, 2, 3, 4}, "not an llm.c token shard"}, {0, {0x88, 0xd8, 0x34, 0x01}, NULL},
                  {4, {2, 0, 0, 0}, "version 2 is not supported"}, {4, {1, 0, 0, 0}, NULL},
                  {8, {0xf5, 1, 0, 0}, "header says 501 tokens"}};
    for (size_t k = 0; k < sizeof damage / sizeof damage[0]; k++) {
        FILE *f = fopen(shard, "r+b");
        CHECK(f && fseek(f, damage[k].at, SEEK_SET) == 0 && fwrite(damage[k].v, 1, 4, f) == 4);
        if (f) fclose(f);
        if (damage[k].needle) {
            CHECK_ERR(crew_tokens_open(shard, &sh), damage[k].needle);
        } else {
            CHECK_OK(crew_tokens_open(shard, &sh));
            crew_tokens_close(&sh);
        }
    }
    CHECK_ERR(crew_tokens_open(shard, &sh), "val_000000.bin");
    /* No val split when the fraction is 0. */
    CHECK_OK(crew_prep_text(path, 1024, 0, tmp(out, "text-all"), NULL, NULL));
    snprintf(shard, sizeof shard, "%s/val_000000.bin", out);
    CHECK(!path_exists(shard));
    CHECK_ERR(crew_prep_text(path, 1000, 0.1, tmp(out, "text-short"), NULL, NULL),
              "leave the val split 500 tokens, fewer than seq_len + 1 = 1001");
    check_nothing_left(out);
    write_file(path, "", 0);
    CHECK_ERR(crew_prep_text(path, 8, 0.1, out, NULL, NULL), "corpus.txt: empty file");
    CHECK_ERR(crew_prep_text(path, 0, 0.1, out, NULL, NULL), "seq_len");
    check_nothing_left(out);
}

/* The manifest's tokens section is as strict as the rest of it. */
static void test_tokens_manifest(void)
{
    const char *head = "{\"format\": \"crew-dataset\", \"version\": 1, \"name\": \"t\", \"tokens\": ";
    const struct {
        const char *tokens, *needle;
    } cases[] = {
        {"{\"vocab\": 256, \"seq_len\": 8, \"shards\": [{\"split\": \"train\", \"file\": \"a.bin\", \"tokens\": 3, "
         "\"bytes\": 1030, \"xxh3\": \"0123456789abcdef\"}]}", NULL},
        {"{\"vocab\": 256, \"seq_len\": 8, \"colour\": 1, \"shards\": []}", "tokens.colour is not a known key"},
        {"{\"vocab\": 70000, \"seq_len\": 8, \"shards\": []}", "tokens.vocab must be an integer in [1, 65536]"},
        {"{\"vocab\": 256, \"seq_len\": 8, \"shards\": []}", "tokens.shards must be an array of 1"},
        {"{\"vocab\": 256, \"seq_len\": 8, \"shards\": [{\"split\": \"train\", \"file\": \"a.bin\", \"tokens\": 3, "
         "\"bytes\": 1031, \"xxh3\": \"0123456789abcdef\"}]}", "tokens.shards[0].bytes must be 1024 + 2 * tokens"},
        {"{\"vocab\": 256, \"seq_len\": 8, \"shards\": [{\"split\": \"train\", \"file\": \"../a.bin\", \"tokens\": 3, "
         "\"bytes\": 1030, \"xxh3\": \"0123456789abcdef\"}]}", "tokens.shards[0].file must be a file name"},
        {"{\"vocab\": 256, \"seq_len\": 8, \"shards\": [{\"split\": \"train\", \"file\": \"a.bin\", \"tokens\": 3, "
         "\"bytes\": 1030, \"xxh3\": \"0123456789abcdef\"}, {\"split\": \"val\", \"file\": \"a.bin\", \"tokens\": 3, "
         "\"bytes\": 1030, \"xxh3\": \"0123456789abcdef\"}]}", "tokens.shards[1].file 'a.bin' is also shard 0's"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s}", head, cases[i].tokens);
        crew_manifest m;
        if (cases[i].needle) {
            CHECK_ERR(crew_manifest_parse(text, strlen(text), "m.json", &m), cases[i].needle);
        } else {
            CHECK_OK(crew_manifest_parse(text, strlen(text), "m.json", &m));
            CHECK(m.has_tokens && m.tokens.n_shards == 1 && m.tokens.shards[0].xxh3 == 0x0123456789abcdefULL);
            crew_manifest_free(&m);
        }
    }
    /* Some array-dataset keys but not all: the missing ones are reported. */
    const char *partial = "{\"format\": \"crew-dataset\", \"version\": 1, \"name\": \"t\", \"classes\": 2, \"tokens\": "
                          "{\"vocab\": 2, \"seq_len\": 1, \"shards\": [{\"split\": \"train\", \"file\": \"a.bin\", "
                          "\"tokens\": 0, \"bytes\": 1024, \"xxh3\": \"0123456789abcdef\"}]}}";
    crew_manifest m;
    CHECK_ERR(crew_manifest_parse(partial, strlen(partial), "m.json", &m), "sample_shape is missing");
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew-prep-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    test_cifar();
    test_cifar_errors();
    test_decode_and_resize();
    test_images();
    test_image_errors();
    test_csv();
    test_csv_features(16); /* the statistics held inline */
    test_csv_features(17); /* allocated */
    test_csv_features(40);
    test_csv_errors();
    test_text();
    test_tokens_manifest();
    rm_tree(tmp_dir);
    return check_report();
}
