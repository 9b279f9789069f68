/* cmd_prep.c — crew prep SOURCE ... --out DIR: convert data into crew's dataset directory. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew prep fashion-mnist [--src DIR] --out DIR\n"
    "       crew prep idx IMAGES LABELS [--test-images FILE --test-labels FILE] --out DIR\n"
    "\n"
    "Converts a dataset once into crew's ready-to-use format: manifest.json plus one .npy array\n"
    "per split and field, written atomically (a temporary directory renamed into place).\n"
    "  fashion-mnist   the gzipped IDX files of Debian's dataset-fashion-mnist package\n"
    "                  [--src /usr/share/datasets/fashion-mnist]\n"
    "  idx             any MNIST-style pair of IDX files (gzipped or not); without a test pair\n"
    "                  the last 1/7 of the samples become the test split\n";

typedef struct prep_view {
    cli_progress bar;
    double start;
} prep_view;

static void on_progress(void *user, int64_t done, int64_t total, const char *what)
{
    prep_view *v = user;
    cli_progress_bar(&v->bar, done, total, cli_now() - v->start, what);
}

int cli_prep(int argc, char **argv)
{
    const char *source = NULL, *out = NULL, *src = "/usr/share/datasets/fashion-mnist";
    const char *test_images = NULL, *test_labels = NULL, *pos[2] = {NULL, NULL};
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if ((r = cli_flag(argc, argv, &i, "--out", &v))) out = v;
        else if ((r = cli_flag(argc, argv, &i, "--src", &v))) src = v;
        else if ((r = cli_flag(argc, argv, &i, "--test-images", &v))) test_images = v;
        else if ((r = cli_flag(argc, argv, &i, "--test-labels", &v))) test_labels = v;
        else if (argv[i][0] == '-') return cli_usage_error("prep", "unknown option '%s'", argv[i]);
        else if (!source) source = argv[i];
        else if (n_pos < 2) pos[n_pos++] = argv[i];
        else return cli_usage_error("prep", "unexpected argument '%s'", argv[i]);
        if (r < 0) return cli_usage_error("prep", "%s needs a value", argv[i]);
    }
    if (!source) return cli_usage_error("prep", "missing the source (fashion-mnist or idx)");
    if (!out) return cli_usage_error("prep", "missing --out DIR");
    prep_view view;
    cli_progress_init(&view.bar, 1);
    view.start = cli_now();
    crew_status s;
    if (!strcmp(source, "fashion-mnist")) {
        if (n_pos) return cli_usage_error("prep", "unexpected argument '%s'", pos[0]);
        s = crew_prep_fashion_mnist(src, out, on_progress, &view);
    } else if (!strcmp(source, "idx")) {
        if (n_pos != 2) return cli_usage_error("prep", "idx needs IMAGES and LABELS files");
        if (!test_images != !test_labels) return cli_usage_error("prep", "give both --test-images and --test-labels, or neither");
        s = crew_prep_idx(pos[0], pos[1], test_images, test_labels, out, on_progress, &view);
    } else {
        return cli_usage_error("prep", "unknown source '%s' (fashion-mnist or idx)", source);
    }
    cli_progress_end(&view.bar);
    if (s) return cli_fail("prep", s);
    crew_dataset *train = NULL, *test = NULL;
    s = crew_dataset_open(out, "train", &train);
    if (!s) s = crew_dataset_open(out, "test", &test);
    if (!s)
        printf("prepared %s: %lld training and %lld test samples, %d classes (%.1fs)\n", out,
               (long long)crew_dataset_size(train), (long long)crew_dataset_size(test), crew_dataset_classes(train),
               cli_now() - view.start);
    crew_dataset_free(train);
    crew_dataset_free(test);
    return s ? cli_fail("prep", s) : 0;
}
