/* cmd_prep.c — crew prep SOURCE ... --out DIR: convert data into crew's dataset directory. */
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew prep fashion-mnist [--src DIR] --out DIR\n"
    "       crew prep idx IMAGES LABELS [--test-images FILE --test-labels FILE] --out DIR\n"
    "       crew prep cifar10 --src DIR --out DIR\n"
    "       crew prep images --src DIR --size HxW [--channels 1|3] [--test-fraction F] [--seed S] --out DIR\n"
    "       crew prep csv FILE --label COLUMN [--test-fraction F] [--seed S] --out DIR\n"
    "       crew prep text FILE [--seq-len T] [--test-fraction F] --out DIR\n"
    "       crew prep shards DIR [--vocab N] [--seq-len T] --out DIR\n"
    "       crew prep arrays X.npy Y.npy [--test-x FILE --test-y FILE | --test-fraction F [--seed S]] --out DIR\n"
    "\n"
    "Converts a dataset once into crew's ready-to-use format: manifest.json plus one .npy array\n"
    "per split and field, written atomically (a temporary directory renamed into place).\n"
    "  fashion-mnist   the gzipped IDX files of Debian's dataset-fashion-mnist package\n"
    "                  [--src /usr/share/datasets/fashion-mnist]\n"
    "  idx             any MNIST-style pair of IDX files (gzipped or not); without a test pair\n"
    "                  the last 1/7 of the samples become the test split\n"
    "  cifar10         CIFAR-10's binary version: DIR holds data_batch_1.bin .. data_batch_5.bin\n"
    "                  and test_batch.bin (and optionally batches.meta.txt); images 32x32x3\n"
    "  images          DIR/<class>/<image>.png|.jpg|.jpeg: class i is the i-th folder name in\n"
    "                  byte order; every image is resized to HxW (e.g. --size 64x64) with\n"
    "                  --channels 1 (grey) or 3 (RGB) [3]; files with other extensions are\n"
    "                  skipped. Per class, --test-fraction [0.1] of the images, chosen by\n"
    "                  --seed [0], become the test split\n"
    "  csv             a CSV file with a header line: the --label column holds class labels\n"
    "                  (non-negative integers), every other column a number (a float32\n"
    "                  feature); the test split as for images\n"
    "  text            any file as byte tokens (vocab 256) in llm.c token shards\n"
    "                  (train_000000.bin, val_000000.bin) plus manifest.json; the last\n"
    "                  --test-fraction [0.1] of the bytes is the val split (0: none);\n"
    "                  --seq-len [256] is recorded, and each split must exceed it\n"
    "  shards          a folder of llm.c GPT-2 token shards (fineweb.py, tinyshakespeare.py):\n"
    "                  *_train*.bin are the train split, *_val*.bin the val split, in name\n"
    "                  order; hard-linked (else copied) as train_000000.bin, ... with a\n"
    "                  manifest.json. Every token must be below --vocab [50257, GPT-2's];\n"
    "                  --seq-len [1024] is recorded, and a shard of each split must exceed it\n"
    "  arrays          NumPy arrays as they are (no normalisation, as Keras's fit takes them):\n"
    "                  X.npy uint8 or float32 [samples, ...], Y.npy uint8, int32 or int64 class\n"
    "                  labels [samples]; the test split from --test-x and --test-y, or\n"
    "                  --test-fraction F of each class chosen by --seed [0]; with neither, a\n"
    "                  train split only (enough for crew verify, plan and scale)\n"
    "Bad input is reported as one line naming the file (and line, column or record) with exit\n"
    "status 2. See docs/DATA.md.\n";

enum {
    F_SRC = 1 << 0, F_TEST_IMAGES = 1 << 1, F_TEST_LABELS = 1 << 2, F_SIZE = 1 << 3, F_CHANNELS = 1 << 4,
    F_FRACTION = 1 << 5, F_SEED = 1 << 6, F_LABEL = 1 << 7, F_SEQ_LEN = 1 << 8, F_VOCAB = 1 << 9,
    F_TEST_X = 1 << 10, F_TEST_Y = 1 << 11,
};

static const struct {
    const char *name;
    int bit;
} flags[] = {
    {"--src", F_SRC},       {"--test-images", F_TEST_IMAGES},   {"--test-labels", F_TEST_LABELS},
    {"--size", F_SIZE},     {"--channels", F_CHANNELS},         {"--test-fraction", F_FRACTION},
    {"--seed", F_SEED},     {"--label", F_LABEL},               {"--seq-len", F_SEQ_LEN},
    {"--vocab", F_VOCAB},   {"--test-x", F_TEST_X},             {"--test-y", F_TEST_Y},
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])

/* Each source: its positional arguments and the flags it takes. */
static const struct {
    const char *name;
    int positional;
    int allowed;
} sources[] = {
    {"fashion-mnist", 0, F_SRC},
    {"idx", 2, F_TEST_IMAGES | F_TEST_LABELS},
    {"cifar10", 0, F_SRC},
    {"images", 0, F_SRC | F_SIZE | F_CHANNELS | F_FRACTION | F_SEED},
    {"csv", 1, F_LABEL | F_FRACTION | F_SEED},
    {"text", 1, F_SEQ_LEN | F_FRACTION},
    {"shards", 1, F_VOCAB | F_SEQ_LEN},
    {"arrays", 2, F_TEST_X | F_TEST_Y | F_FRACTION | F_SEED},
};
#define N_SOURCES (int)(sizeof sources / sizeof sources[0])

typedef struct prep_args {
    int source;              /* index into sources */
    const char *out;
    const char *value[N_FLAGS]; /* by index into flags; NULL when not given */
    int given;               /* bits of the flags given */
    const char *pos[2];
    int n_pos;
} prep_args;

typedef struct prep_view {
    cli_progress bar;
    double start;
} prep_view;

static void on_progress(void *user, int64_t done, int64_t total, const char *what)
{
    prep_view *v = user;
    cli_progress_bar(&v->bar, done, total, cli_now() - v->start, what);
}

static const char *flag_value(const prep_args *a, int bit)
{
    for (int i = 0; i < N_FLAGS; i++)
        if (flags[i].bit == bit) return a->value[i];
    return NULL;
}

/* One argument: a flag with its value, the source or a positional. 0 ok, 1 help shown, 2 error. */
static int parse_one(int argc, char **argv, int *i, prep_args *a, const char **source)
{
    const char *v = NULL;
    int r;
    if (!strcmp(argv[*i], "--help") || !strcmp(argv[*i], "-h")) {
        fputs(usage_text, stdout);
        return 1;
    }
    const char *arg = argv[*i];
    if ((r = cli_flag(argc, argv, i, "--out", &v))) {
        a->out = v;
    } else {
        for (int f = 0; f < N_FLAGS && !r; f++)
            if ((r = cli_flag(argc, argv, i, flags[f].name, &v)) > 0) {
                a->value[f] = v;
                a->given |= flags[f].bit;
            }
    }
    if (r < 0) return cli_usage_error("prep", "%s needs a value", arg);
    if (r > 0) return 0;
    if (arg[0] == '-' && arg[1]) return cli_usage_error("prep", "unknown option '%s'", arg);
    if (!*source) *source = arg;
    else if (a->n_pos < 2) a->pos[a->n_pos++] = arg;
    else return cli_usage_error("prep", "unexpected argument '%s'", arg);
    return 0;
}

/* The arguments, checked against what the source takes. 0 ok, 1 help shown, 2 error. */
static int parse_args(int argc, char **argv, prep_args *a)
{
    const char *source = NULL;
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        int r = parse_one(argc, argv, &i, a, &source);
        if (r) return r;
    }
    if (!source)
        return cli_usage_error("prep", "missing the source (fashion-mnist, idx, cifar10, images, csv, text, shards or "
                                       "arrays)");
    a->source = -1;
    for (int s = 0; s < N_SOURCES; s++)
        if (!strcmp(source, sources[s].name)) a->source = s;
    if (a->source < 0)
        return cli_usage_error("prep", "unknown source '%s' (fashion-mnist, idx, cifar10, images, csv, text, shards or "
                                        "arrays)", source);
    for (int f = 0; f < N_FLAGS; f++)
        if ((a->given & flags[f].bit) && !(sources[a->source].allowed & flags[f].bit))
            return cli_usage_error("prep", "%s does not apply to %s", flags[f].name, source);
    int want = sources[a->source].positional;
    if (a->n_pos > want) return cli_usage_error("prep", "unexpected argument '%s'", a->pos[want]);
    if (a->n_pos < want)
        return cli_usage_error("prep", "%s needs %s", source,
                               want == 2 ? (!strcmp(source, "arrays") ? "X.npy and Y.npy files" : "IMAGES and LABELS files")
                               : !strcmp(source, "shards") ? "a DIR" : "a FILE");
    if (!a->out) return cli_usage_error("prep", "missing --out DIR");
    return 0;
}

/* "64x64" or "64" (square) into height and width. */
static int parse_size(const char *text, int64_t *h, int64_t *w)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", text);
    char *x = strchr(buf, 'x');
    if (x) *x = '\0';
    if (!cli_parse_int("prep", "--size", buf, 1, 4096, h)) return 0;
    return cli_parse_int("prep", "--size", x ? x + 1 : buf, 1, 4096, w);
}

static int run_images(const prep_args *a, prep_view *view, crew_status *s)
{
    const char *src = flag_value(a, F_SRC), *size = flag_value(a, F_SIZE);
    const char *ch = flag_value(a, F_CHANNELS), *frac = flag_value(a, F_FRACTION), *seed = flag_value(a, F_SEED);
    if (!src) return cli_usage_error("prep", "images needs --src DIR");
    if (!size) return cli_usage_error("prep", "images needs --size HxW (e.g. --size 64x64)");
    int64_t h, w, c = 3, sd = 0;
    double f = 0.1;
    if (!parse_size(size, &h, &w)) return 2;
    if (ch && !cli_parse_int("prep", "--channels", ch, 1, 3, &c)) return 2;
    if (c == 2) return cli_usage_error("prep", "--channels takes 1 or 3, got 2");
    if (frac && !cli_parse_float("prep", "--test-fraction", frac, 1e-9, 1 - 1e-9, &f)) return 2;
    if (seed && !cli_parse_int("prep", "--seed", seed, 0, INT64_MAX, &sd)) return 2;
    crew_image_prep_options o = {.height = (int)h, .width = (int)w, .channels = (int)c, .test_fraction = f,
                                 .seed = (uint64_t)sd};
    *s = crew_prep_images(src, &o, a->out, on_progress, view);
    return 0;
}

static int run_csv_text(const prep_args *a, prep_view *view, crew_status *s)
{
    const char *frac = flag_value(a, F_FRACTION), *seed = flag_value(a, F_SEED);
    const char *label = flag_value(a, F_LABEL), *seq = flag_value(a, F_SEQ_LEN);
    int text = !strcmp(sources[a->source].name, "text");
    double f = 0.1;
    int64_t sd = 0, t = 256;
    if (frac && !cli_parse_float("prep", "--test-fraction", frac, text ? 0 : 1e-9, 1 - 1e-9, &f)) return 2;
    if (seed && !cli_parse_int("prep", "--seed", seed, 0, INT64_MAX, &sd)) return 2;
    if (seq && !cli_parse_int("prep", "--seq-len", seq, 1, 1 << 24, &t)) return 2;
    if (text) {
        *s = crew_prep_text(a->pos[0], t, f, a->out, on_progress, view);
        return 0;
    }
    if (!label) return cli_usage_error("prep", "csv needs --label COLUMN (the name of the label column)");
    *s = crew_prep_csv(a->pos[0], label, f, (uint64_t)sd, a->out, on_progress, view);
    return 0;
}

static int run_shards(const prep_args *a, prep_view *view, crew_status *s)
{
    const char *vocab = flag_value(a, F_VOCAB), *seq = flag_value(a, F_SEQ_LEN);
    int64_t v = 50257, t = 1024; /* GPT-2's vocabulary and context */
    if (vocab && !cli_parse_int("prep", "--vocab", vocab, 2, 65536, &v)) return 2;
    if (seq && !cli_parse_int("prep", "--seq-len", seq, 1, 1 << 24, &t)) return 2;
    *s = crew_prep_shards(a->pos[0], (int)v, t, a->out, on_progress, view);
    return 0;
}

static int run_arrays(const prep_args *a, prep_view *view, crew_status *s)
{
    const char *tx = flag_value(a, F_TEST_X), *ty = flag_value(a, F_TEST_Y);
    const char *frac = flag_value(a, F_FRACTION), *seed = flag_value(a, F_SEED);
    if (!tx != !ty) return cli_usage_error("prep", "give both --test-x and --test-y, or neither");
    if (tx && frac) return cli_usage_error("prep", "--test-fraction splits the arrays when there are no test arrays: "
                                                   "give it or --test-x and --test-y");
    if (seed && !frac) return cli_usage_error("prep", "--seed chooses the --test-fraction split: give that too");
    double f = 0.0;
    int64_t sd = 0;
    if (frac && !cli_parse_float("prep", "--test-fraction", frac, 1e-9, 1 - 1e-9, &f)) return 2;
    if (seed && !cli_parse_int("prep", "--seed", seed, 0, INT64_MAX, &sd)) return 2;
    *s = crew_prep_npy(a->pos[0], a->pos[1], tx, ty, f, (uint64_t)sd, a->out, on_progress, view);
    return 0;
}

static int run_source(const prep_args *a, prep_view *view, crew_status *s)
{
    const char *name = sources[a->source].name, *src = flag_value(a, F_SRC);
    if (!strcmp(name, "fashion-mnist")) {
        *s = crew_prep_fashion_mnist(src ? src : "/usr/share/datasets/fashion-mnist", a->out, on_progress, view);
    } else if (!strcmp(name, "idx")) {
        const char *ti = flag_value(a, F_TEST_IMAGES), *tl = flag_value(a, F_TEST_LABELS);
        if (!ti != !tl) return cli_usage_error("prep", "give both --test-images and --test-labels, or neither");
        *s = crew_prep_idx(a->pos[0], a->pos[1], ti, tl, a->out, on_progress, view);
    } else if (!strcmp(name, "cifar10")) {
        if (!src) return cli_usage_error("prep", "cifar10 needs --src DIR (the folder of the .bin batches)");
        *s = crew_prep_cifar10(src, a->out, on_progress, view);
    } else if (!strcmp(name, "images")) {
        return run_images(a, view, s);
    } else if (!strcmp(name, "shards")) {
        return run_shards(a, view, s);
    } else if (!strcmp(name, "arrays")) {
        return run_arrays(a, view, s);
    } else {
        return run_csv_text(a, view, s);
    }
    return 0;
}

/* The tokens and shards (of each split) crew prep shards wrote into dir, from the sizes of its
 * llm.c shards (1024-byte header, then 2 bytes a token). */
static void count_shards(const char *dir, long long *tokens, int *train, int *val)
{
    *tokens = 0;
    *train = *val = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int is_train = !strncmp(e->d_name, "train_", 6), is_val = !strncmp(e->d_name, "val_", 4);
        char path[2048];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if ((!is_train && !is_val) || stat(path, &st) != 0 || st.st_size < 1024) continue;
        *tokens += (long long)(st.st_size - 1024) / 2;
        *train += is_train;
        *val += is_val;
    }
    if (d) closedir(d);
}

/* One line about what was written. */
static int summary(const prep_args *a, const prep_view *view)
{
    if (!strcmp(sources[a->source].name, "shards")) {
        const char *vocab = flag_value(a, F_VOCAB);
        long long tokens;
        int train, val;
        count_shards(a->out, &tokens, &train, &val);
        printf("prepared %s: %lld tokens (vocab %d) in %d shards (%d train, %d val) as llm.c token shards (%.1fs)\n",
               a->out, tokens, vocab ? atoi(vocab) : 50257, train + val, train, val, cli_now() - view->start);
        return 0;
    }
    if (!strcmp(sources[a->source].name, "text")) {
        struct stat st;
        long long bytes = stat(a->pos[0], &st) == 0 ? (long long)st.st_size : -1;
        printf("prepared %s: %lld byte tokens (vocab 256) as llm.c token shards (%.1fs)\n", a->out, bytes,
               cli_now() - view->start);
        return 0;
    }
    crew_dataset *train = NULL, *test = NULL;
    /* crew prep arrays without a test split writes the train split alone */
    const int no_test = !strcmp(sources[a->source].name, "arrays") && !flag_value(a, F_TEST_X) &&
                        !flag_value(a, F_FRACTION);
    crew_status s = crew_dataset_open(a->out, "train", &train);
    if (!s && !no_test) s = crew_dataset_open(a->out, "test", &test);
    if (!s)
        printf("prepared %s: %lld training and %lld test samples, %d classes (%.1fs)\n", a->out,
               (long long)crew_dataset_size(train), (long long)crew_dataset_size(test), crew_dataset_classes(train),
               cli_now() - view->start);
    crew_dataset_free(train);
    crew_dataset_free(test);
    return s ? cli_fail("prep", s) : 0;
}

int cli_prep(int argc, char **argv)
{
    prep_args a;
    int r = parse_args(argc, argv, &a);
    if (r) return r == 1 ? 0 : r;
    prep_view view;
    cli_progress_init(&view.bar, 1);
    view.start = cli_now();
    crew_status s = CREW_OK;
    r = run_source(&a, &view, &s);
    cli_progress_end(&view.bar);
    if (r) return r;
    if (s) return cli_fail("prep", s);
    return summary(&a, &view);
}
