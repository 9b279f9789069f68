/* synthetic.h — a small synthetic image dataset for tests: 12x12 grey images of 4 classes (a
 * bright square whose quadrant is the class, on noise), written as IDX files and prepared with
 * crew_prep_idx into a temporary directory. */
#ifndef CREW_TESTS_SYNTHETIC_H
#define CREW_TESTS_SYNTHETIC_H

#include <stdio.h>
#include <stdlib.h>

#include "crew.h"

enum { SYN_SIDE = 12, SYN_CLASSES = 4 };

static inline void syn_put_be32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
    fwrite(b, 1, 4, f);
}

static inline void syn_write_idx_pair(const char *images, const char *labels, int n, unsigned seed)
{
    FILE *fi = fopen(images, "wb"), *fl = fopen(labels, "wb");
    if (!fi || !fl) abort();
    syn_put_be32(fi, 0x803);
    syn_put_be32(fi, (uint32_t)n);
    syn_put_be32(fi, SYN_SIDE);
    syn_put_be32(fi, SYN_SIDE);
    syn_put_be32(fl, 0x801);
    syn_put_be32(fl, (uint32_t)n);
    srand(seed);
    for (int i = 0; i < n; i++) {
        int label = rand() % SYN_CLASSES;
        unsigned char img[SYN_SIDE * SYN_SIDE];
        for (int p = 0; p < SYN_SIDE * SYN_SIDE; p++) img[p] = (unsigned char)(rand() % 60);
        int oy = (label / 2) * 6, ox = (label % 2) * 6;
        for (int y = 1; y < 5; y++)
            for (int x = 1; x < 5; x++) img[(oy + y) * SYN_SIDE + ox + x] = (unsigned char)(180 + rand() % 60);
        fwrite(img, 1, sizeof img, fi);
        fputc(label, fl);
    }
    fclose(fi);
    fclose(fl);
}

/* Random side × side images, labels i mod classes: a dataset of the right shape for models whose
 * accuracy does not matter (memory and speed measurements). */
static inline void syn_write_random_idx(const char *images, const char *labels, int n, int side, int classes)
{
    FILE *fi = fopen(images, "wb"), *fl = fopen(labels, "wb");
    if (!fi || !fl) abort();
    syn_put_be32(fi, 0x803);
    syn_put_be32(fi, (uint32_t)n);
    syn_put_be32(fi, (uint32_t)side);
    syn_put_be32(fi, (uint32_t)side);
    syn_put_be32(fl, 0x801);
    syn_put_be32(fl, (uint32_t)n);
    srand(7);
    for (int i = 0; i < n; i++) {
        for (int p = 0; p < side * side; p++) fputc(rand() % 256, fi);
        fputc(i % classes, fl);
    }
    fclose(fi);
    fclose(fl);
}

/* The IDX files a synthetic dataset is written to, in a fresh directory. */
typedef struct syn_idx_paths {
    char img[300], lab[300], timg[300], tlab[300];
} syn_idx_paths;

/* Makes dir (a mkdtemp template, modified) and names the IDX files in it; out = dir/data. */
static inline int syn_begin(char *dir, syn_idx_paths *p, char *out, size_t out_len)
{
    if (!mkdtemp(dir)) return -1;
    snprintf(p->img, sizeof p->img, "%s/img.idx", dir);
    snprintf(p->lab, sizeof p->lab, "%s/lab.idx", dir);
    snprintf(p->timg, sizeof p->timg, "%s/timg.idx", dir);
    snprintf(p->tlab, sizeof p->tlab, "%s/tlab.idx", dir);
    snprintf(out, out_len, "%s/data", dir);
    return 0;
}

/* crew prep idx of the written files into out. */
static inline int syn_finish(const syn_idx_paths *p, const char *out)
{
    crew_status s = crew_prep_idx(p->img, p->lab, p->timg, p->tlab, out, NULL, NULL);
    int rc = s ? -1 : 0;
    if (s) fprintf(stderr, "synthetic dataset: %s\n", crew_status_message(s));
    crew_status_free(s);
    return rc;
}

/* Like syn_make_dataset, with random side × side images of 10 classes (28: Fashion-MNIST's shape). */
static inline int syn_make_random_dataset(char *dir, int train, int side, char *out, size_t out_len)
{
    syn_idx_paths p;
    if (syn_begin(dir, &p, out, out_len)) return -1;
    syn_write_random_idx(p.img, p.lab, train, side, 10);
    syn_write_random_idx(p.timg, p.tlab, 64, side, 10);
    return syn_finish(&p, out);
}

/* Makes dir (a mkdtemp template, modified) holding data/ with `train` and 64 test samples;
 * returns the path of data/ in out. */
static inline int syn_make_dataset(char *dir, int train, char *out, size_t out_len)
{
    syn_idx_paths p;
    if (syn_begin(dir, &p, out, out_len)) return -1;
    syn_write_idx_pair(p.img, p.lab, train, 1);
    syn_write_idx_pair(p.timg, p.tlab, 64, 2);
    return syn_finish(&p, out);
}

static inline void syn_remove(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

#endif
