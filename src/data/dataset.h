/* dataset.h — a split of a dataset directory (manifest.json + .npy arrays), memory-mapped.
 *
 * Layout written by crew prep (see docs/DATA.md):
 *   DIR/manifest.json   name, splits with sample counts, shapes, dtypes, normalisation, checksums
 *   DIR/train_x.npy     uint8 or float32 [N, ...sample shape]
 *   DIR/train_y.npy     uint8 or int32 [N] class labels
 *   DIR/test_x.npy, DIR/test_y.npy
 * Images stay uint8 on disk; gathering a batch converts them to float32 and normalises:
 *   x = (raw · scale − mean[c]) / std[c]   for channel c (the last axis). */
#ifndef CREW_DATA_DATASET_H
#define CREW_DATA_DATASET_H

#include <stdint.h>

#include "core/shape.h"
#include "crew.h"
#include "data/npy.h"
#include "data/tokens.h"

struct crew_manifest;

/* uint8 samples with at most this many channels are normalised through a table of 256 floats a
 * channel (1 MiB at most); beyond it, through the float32 samples' multiply-add. */
#define CREW_DATASET_LUT_CHANNELS 1024

struct crew_dataset {
    char dir[512];
    char split[32];
    crew_npy x;                     /* [n, sample...] uint8 or float32; its data the resident
                                       copy below when there is one */
    void *x_resident;               /* x's values copied into huge pages, or NULL (dataset.c) */
    size_t x_resident_len;          /* its bytes, rounded up to whole huge pages */
    crew_npy y;                     /* [n] uint8 or int32 */
    int64_t n;
    crew_shape sample;              /* per-sample shape, e.g. (28, 28, 1) */
    int classes;
    float scale;                    /* applied to raw values first (1/255 for uint8 images) */
    int n_channels;                 /* entries in mean/std: 1 (shared) or the last axis */
    float *norm;                    /* one allocation holding mean, std, mul, add and lut */
    float *mean, *std;              /* [n_channels], the manifest's */
    float *mul, *add;               /* [n_channels]: float32 samples become raw · mul[c] + add[c] */
    char name[128];                 /* the manifest's dataset name, e.g. "fashion-mnist" */
    char x_file[128], y_file[128];  /* file names inside dir, for messages and verify */
    uint64_t x_xxh3, y_xxh3;        /* the manifest's content hashes, checked by verify */
    /* uint8 samples with at most CREW_DATASET_LUT_CHANNELS channels, else NULL:
     * lut[c · 256 + v] = (v · scale − mean[c]) / std[c], built once at open so that gathering a
     * batch is one table lookup per value. [n_channels][256] */
    float *lut;
    /* Labels per sample: 1 for a classifier's dataset, `context` for a token dataset. */
    int64_t label_positions;
    /* A token dataset (crew prep text, llm.c shards; dataset_tokens.c): sample w is a window of
     * `context` tokens and its labels the `context` tokens after each of them. The windows of
     * a shard do not overlap: window w of shard k starts at token (w − first_window[k])·context
     * and needs context + 1 tokens. classes is the vocabulary, sample is [context]. */
    int tokens;
    int n_shards;
    crew_token_shard *shards;   /* [n_shards], mapped */
    int64_t *first_window;      /* [n_shards + 1]: windows before shard k; the last is n */
    uint64_t *shard_xxh3;       /* [n_shards]: the manifest's hashes */
    char (*shard_file)[128];    /* [n_shards]: file names, for messages */
    int64_t context;
    /* Each of its files (the manifest, the arrays or shards) that is a symbolic link to a file
     * outside dir, one line each: "DIR/x.npy is a symbolic link to /y/x.npy, outside DIR: ..."
     * (crew_dataset_note). "" when none. */
    char note[2048];
};

/* Opens the shards of split `split` of a token dataset (dataset_tokens.c); "test" names the
 * held-out split, which token datasets call "val" as llm.c does. */
crew_status crew_dataset_open_tokens(crew_dataset *d, const struct crew_manifest *m, const char *split);
void crew_dataset_close_tokens(crew_dataset *d);
crew_status crew_dataset_verify_tokens(const crew_dataset *d);
void crew_dataset_gather_tokens(const crew_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y);

/* A view of d's first n samples (all of them when n >= d->n): it shares d's mapped arrays and
 * tables, so it lives no longer than d, and is never freed (crew_dataset_free must not see it). */
void crew_dataset_head(const crew_dataset *d, int64_t n, crew_dataset *view);

/* Hashes both .npy files whole (XXH3-64) and compares with the manifest: catches corruption
 * that opening (sizes, shapes, label range) cannot. Reads every byte, so it is on request only. */
crew_status crew_dataset_verify(const crew_dataset *d);

/* Copies samples idx[0..n) into x [n, sample] (normalised float32) and labels into
 * y [n, label_positions].
 * Every idx[i] must be in [0, d->n): the caller's sampler guarantees it. */
void crew_dataset_gather(const crew_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y);

#endif
