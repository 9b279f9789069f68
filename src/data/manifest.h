/* manifest.h — manifest.json of a dataset directory (schema in docs/DATA.md), read and written
 * with cJSON. Parsing is strict: an unknown key, a missing key, a wrong type or a value out of
 * range is an error naming the file and the key path ("splits.train.x.dtype must be a string"),
 * and the arrays' shapes must agree with "samples" and "sample_shape". Whether the .npy files
 * agree with the manifest is checked by crew_dataset_open, not here. */
#ifndef CREW_DATA_MANIFEST_H
#define CREW_DATA_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/shape.h"
#include "crew.h"
#include "data/npy.h"

#define CREW_MANIFEST_FORMAT "crew-dataset"
#define CREW_MANIFEST_VERSION 1
#define CREW_MANIFEST_FILE "manifest.json"
#define CREW_MANIFEST_MAX_SPLITS 8
/* The most entries normalization.mean / std may hold: bounds what a hostile manifest can make the
 * reader allocate (16 MiB for both arrays) and is far above any real table's features. */
#define CREW_MANIFEST_MAX_STATS (1 << 20)
#define CREW_MANIFEST_MAX_CLASSES 1000000

/* One array of a split: a .npy file in the dataset directory. */
typedef struct crew_manifest_array {
    char file[128];                    /* a plain file name, no directories */
    crew_npy_dtype dtype;
    int ndim;
    int64_t shape[CREW_NPY_MAX_DIMS];  /* [samples, ...sample_shape] for x, [samples] for y */
    int64_t bytes;                     /* size of the whole .npy file */
    uint64_t xxh3;                     /* XXH3-64 of the whole .npy file */
} crew_manifest_array;

typedef struct crew_manifest_split {
    char name[32];   /* "train", "test", ... */
    int64_t samples;
    crew_manifest_array x, y;
} crew_manifest_split;

/* One llm.c token shard of a token dataset (see data/tokens.h). */
typedef struct crew_manifest_shard {
    char split[32];  /* "train", "val", ... (the rules of split names) */
    char file[128];  /* a plain file name, no directories */
    int64_t tokens;  /* the count in its header */
    int64_t bytes;   /* size of the whole file: 1024 + 2 · tokens */
    uint64_t xxh3;   /* XXH3-64 of the whole file */
} crew_manifest_shard;

#define CREW_MANIFEST_MAX_SHARDS 65536
#define CREW_MANIFEST_MAX_VOCAB 65536 /* tokens are uint16 */

/* The "tokens" section: a dataset of token sequences stored as llm.c shards. */
typedef struct crew_manifest_tokens {
    int vocab;                   /* tokens lie in [0, vocab) */
    int64_t seq_len;             /* the context length the data was prepared for */
    int n_shards;
    crew_manifest_shard *shards; /* [n_shards], malloc'd; crew_manifest_free releases */
} crew_manifest_tokens;

typedef struct crew_manifest {
    char name[128];
    int classes;
    char **class_names;       /* [classes] strings, or NULL when the manifest has none */
    crew_shape sample_shape;  /* e.g. (28, 28, 1); the last axis is the channel axis */
    double scale;             /* raw values are multiplied by this first */
    int n_channels;           /* entries in mean/std: 1 (shared by all channels) or the last axis */
    double *mean, *std;       /* [n_channels] each, malloc'd by crew_manifest_set_channels; NULL
                                 until then; crew_manifest_free releases them */
    int n_splits;             /* 0 only in a token dataset (has_tokens), which then has no
                                 classes, sample_shape, normalization or splits */
    crew_manifest_split splits[CREW_MANIFEST_MAX_SPLITS];
    int has_tokens;           /* the manifest has a "tokens" section */
    crew_manifest_tokens tokens;
} crew_manifest;

/* Parses manifest text (len bytes, need not be NUL-terminated); `what` names it in errors. */
crew_status crew_manifest_parse(const char *text, size_t len, const char *what, crew_manifest *out);
/* Reads DIR/manifest.json. */
crew_status crew_manifest_read(const char *dir, crew_manifest *out);
/* Writes m as JSON to path (the caller handles atomicity of the directory). */
crew_status crew_manifest_write(const char *path, const crew_manifest *m);
/* Frees class_names, the normalization statistics and token shards; the struct itself is the
 * caller's. Accepts a zeroed manifest. */
void crew_manifest_free(crew_manifest *m);
/* Allocates n (1 to CREW_MANIFEST_MAX_STATS) entries of normalization.mean and .std (replacing
 * any earlier), sets n_channels = n and points *mean and *std at them, for the caller to fill. */
crew_status crew_manifest_set_channels(crew_manifest *m, int n, double **mean, double **std);
/* The split named `name`, or NULL. */
const crew_manifest_split *crew_manifest_find_split(const crew_manifest *m, const char *name);

/* Fills a->bytes and a->xxh3 from the file at path (streamed, not mapped). */
crew_status crew_manifest_hash_file(const char *path, crew_manifest_array *a);

#endif
