/* prep_images.c — crew prep for a folder of class folders (the layout Keras'
 * image_dataset_from_directory reads): SRC/<class>/<image>.png|.jpg|.jpeg.
 *
 * Class i is the i-th class folder name in byte order (strcmp), and images within a class are
 * taken in byte order of their names, so the dataset depends only on the folder's contents,
 * never on the order the filesystem lists them. Only files named *.png, *.jpg or *.jpeg (any
 * case) are decoded; other files, hidden entries (".name") and folders nested in a class folder
 * are skipped. Each image is decoded, converted to the requested channels, resized to H x W
 * (data/resize.h) into its slot of the sample array; then a stratified, seeded split
 * (crew_prep_split) separates the test images. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/mapped_file.h"
#include "core/status.h"
#include "data/image_decode.h"
#include "data/prep_common.h"
#include "data/resize.h"

#define MAX_SIDE 4096                      /* of the resized images */
#define MAX_SAMPLE_BYTES ((int64_t)1 << 24) /* H x W x C of one resized image */

typedef struct name_list {
    char **names; /* [n], sorted, malloc'd */
    int64_t n, cap;
} name_list;

typedef struct image_set {
    name_list classes;
    char **paths;     /* [n] "SRC/class/file" */
    int32_t *labels;  /* [n] */
    int64_t n;
} image_set;

static void list_free(name_list *l)
{
    for (int64_t i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static crew_status list_add(name_list *l, const char *name)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 64;
        char **grown = realloc(l->names, sizeof *grown * (size_t)cap);
        if (!grown) return CREW_OOM();
        l->names = grown;
        l->cap = cap;
    }
    if (!(l->names[l->n] = strdup(name))) return CREW_OOM();
    l->n++;
    return CREW_OK;
}

static int by_bytes(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_image_name(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot && dot != name && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* The visible entries of dir that are directories (want_dirs) or image files, sorted. */
static crew_status list_dir(const char *dir, int want_dirs, name_list *out)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) return crew_errorf(errno == ENOENT || errno == ENOTDIR ? CREW_CODE_BAD_INPUT : CREW_CODE_IO, "%s: %s", dir,
                               strerror(errno));
    crew_status s = CREW_OK;
    struct dirent *e;
    char path[2048];
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.' || (!want_dirs && !is_image_name(e->d_name))) continue;
        struct stat st;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s/%s: path too long", dir, e->d_name);
        else if (stat(path, &st) != 0) s = crew_errorf(CREW_CODE_IO, "%s: %s", path, strerror(errno));
        else if (want_dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) s = list_add(out, e->d_name);
        else if (!want_dirs && !S_ISDIR(st.st_mode)) /* named as an image, so it must be one; folders are skipped */
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a regular file (%s)", path, crew_file_kind(st.st_mode));
    }
    closedir(d);
    if (s) list_free(out);
    else if (out->n) qsort(out->names, (size_t)out->n, sizeof *out->names, by_bytes);
    return s;
}

static void set_free(image_set *set)
{
    for (int64_t i = 0; i < set->n; i++) free(set->paths[i]);
    free(set->paths);
    free(set->labels);
    list_free(&set->classes);
}

static crew_status set_add(image_set *set, int64_t *cap, const char *path, int32_t label)
{
    if (set->n == *cap) {
        int64_t c = *cap ? 2 * *cap : 256;
        char **p = realloc(set->paths, sizeof *p * (size_t)c);
        if (p) set->paths = p;
        int32_t *l = realloc(set->labels, sizeof *l * (size_t)c);
        if (l) set->labels = l;
        if (!p || !l) return CREW_OOM();
        *cap = c;
    }
    if (!(set->paths[set->n] = strdup(path))) return CREW_OOM();
    set->labels[set->n++] = label;
    return CREW_OK;
}

/* Every class folder and its images; no class folders, or an empty one, is an error. */
static crew_status scan(const char *src, image_set *set)
{
    CREW_TRY(list_dir(src, 1, &set->classes));
    if (set->classes.n == 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: no class folders (expected %s/<class>/<image>.png|.jpg|.jpeg)", src, src);
    if (set->classes.n > CREW_MANIFEST_MAX_CLASSES)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %lld class folders, more than %d", src, (long long)set->classes.n,
                           CREW_MANIFEST_MAX_CLASSES);
    int64_t cap = 0;
    char dir[2048], path[4096];
    for (int64_t c = 0; c < set->classes.n; c++) {
        snprintf(dir, sizeof dir, "%s/%s", src, set->classes.names[c]);
        name_list files;
        CREW_TRY(list_dir(dir, 0, &files));
        crew_status s = files.n ? CREW_OK
                                : crew_errorf(CREW_CODE_BAD_INPUT, "%s: an empty class folder (no .png, .jpg or .jpeg files)", dir);
        for (int64_t i = 0; !s && i < files.n; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, files.names[i]);
            s = set_add(set, &cap, path, (int32_t)c);
        }
        list_free(&files);
        CREW_TRY(s);
    }
    return CREW_OK;
}

/* Decodes image i into x + i * sample bytes. */
static crew_status load_one(const image_set *set, int64_t i, const crew_image_prep_options *o, uint8_t *x)
{
    crew_image img;
    CREW_TRY(crew_image_read(set->paths[i], &img));
    crew_status s = crew_image_convert(&img, o->channels);
    if (!s) {
        int64_t sample = (int64_t)o->height * o->width * o->channels;
        s = crew_resize_u8(img.pixels, img.height, img.width, o->channels, x + i * sample, o->height, o->width);
    }
    crew_image_free(&img);
    return s;
}

static crew_status check_options(const crew_image_prep_options *o)
{
    if (o->height < 1 || o->width < 1 || o->height > MAX_SIDE || o->width > MAX_SIDE)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "image size %dx%d: each side must be in [1, %d]", o->height, o->width,
                           MAX_SIDE);
    if (o->channels != 1 && o->channels != 3)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "image channels must be 1 or 3, not %d", o->channels);
    if ((int64_t)o->height * o->width * o->channels > MAX_SAMPLE_BYTES)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "image size %dx%dx%d is over %lld values per sample", o->height,
                           o->width, o->channels, (long long)MAX_SAMPLE_BYTES);
    if (!(o->test_fraction > 0 && o->test_fraction < 1))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the test fraction must be in (0, 1), not %g", o->test_fraction);
    return CREW_OK;
}

/* Decoded samples x [n, H, W, C] and labels y [n]: split, statistics, files. */
static crew_status finish(const char *src, const image_set *set, const crew_image_prep_options *o, uint8_t *x,
                          const char *out_dir, crew_prep_progress *pr)
{
    int64_t n = set->n, sample = (int64_t)o->height * o->width * o->channels;
    int classes = (int)set->classes.n, y_size = classes <= 256 ? 1 : 4;
    uint8_t *is_test = malloc((size_t)n), *y = malloc((size_t)(n * y_size)), *xt = NULL, *yt = NULL;
    crew_status s = is_test && y ? CREW_OK : CREW_OOM();
    for (int64_t i = 0; !s && i < n; i++) {
        if (y_size == 1) y[i] = (uint8_t)set->labels[i];
        else memcpy(y + 4 * i, &set->labels[i], 4);
    }
    if (!s) s = crew_prep_split(set->labels, n, classes, o->test_fraction, o->seed, src, is_test);
    int64_t n_test = 0;
    for (int64_t i = 0; !s && i < n; i++) n_test += is_test[i];
    if (!s && (!(xt = malloc((size_t)(n_test * sample))) || !(yt = malloc((size_t)(n_test * y_size))))) s = CREW_OOM();
    if (!s) {
        crew_prep_partition(x, sample, y, y_size, is_test, n, xt, yt);
        crew_manifest m;
        memset(&m, 0, sizeof m);
        snprintf(m.name, sizeof m.name, "images");
        m.classes = classes;
        m.class_names = set->classes.names; /* only read by the writer */
        m.sample_shape = crew_shape3(o->height, o->width, o->channels);
        crew_prep_tick(pr, "normalization statistics");
        s = crew_prep_stats_u8(x, (n - n_test) * sample, o->channels, 1.0 / 255.0, &m);
        crew_prep_split_data d[2] = {{"train", n - n_test, x, y}, {"test", n_test, xt, yt}};
        if (!s) s = crew_prep_write(out_dir, &m, CREW_DTYPE_U8, y_size == 1 ? CREW_DTYPE_U8 : CREW_DTYPE_I32, d, 2, pr);
        m.class_names = NULL; /* the image set's */
        crew_manifest_free(&m);
    }
    free(is_test);
    free(y);
    free(xt);
    free(yt);
    return s;
}

crew_status crew_prep_images(const char *src_dir, const crew_image_prep_options *opts, const char *out_dir,
                             crew_progress_fn progress, void *user)
{
    if (!src_dir || !opts || !out_dir)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_images: src_dir, opts and out_dir are required");
    CREW_TRY(check_options(opts));
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    image_set set;
    memset(&set, 0, sizeof set);
    crew_status s = scan(src_dir, &set);
    int64_t sample = (int64_t)opts->height * opts->width * opts->channels;
    uint8_t *x = NULL;
    if (!s && !(x = malloc((size_t)(set.n * sample)))) s = CREW_OOM();
    crew_prep_progress pr = {.fn = progress, .user = user, .total = set.n + 1 + 4 + 1};
    for (int64_t i = 0; !s && i < set.n; i++) {
        crew_prep_tick(&pr, set.paths[i]);
        s = load_one(&set, i, opts, x);
    }
    if (!s) s = finish(src_dir, &set, opts, x, out_dir, &pr);
    if (!s) crew_prep_done(&pr);
    free(x);
    set_free(&set);
    return s;
}
