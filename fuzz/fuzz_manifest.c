/* fuzz_manifest.c — crew_manifest_parse on arbitrary text, and on a valid manifest around an
 * arbitrary "normalization" object: no crash or leak, and an accepted manifest keeps the
 * invariants crew_dataset_open relies on. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/manifest.h"

/* A token dataset: its shards' sizes agree with their token counts. */
static int tokens_ok(const crew_manifest *m)
{
    const crew_manifest_tokens *t = &m->tokens;
    int ok = t->vocab >= 1 && t->vocab <= CREW_MANIFEST_MAX_VOCAB && t->n_shards >= 1 && t->shards;
    for (int i = 0; ok && i < t->n_shards; i++) ok = t->shards[i].bytes == 1024 + 2 * t->shards[i].tokens;
    return ok;
}

/* A dataset of samples: splits agree with sample_shape; normalization has 1 or C entries, each
 * finite (std > 0). */
static int samples_ok(const crew_manifest *m)
{
    int ok = m->classes >= 1 && m->n_splits >= 1 && m->n_splits <= CREW_MANIFEST_MAX_SPLITS
          && m->sample_shape.ndim >= 1 && m->sample_shape.ndim <= CREW_MAX_DIMS && m->n_channels >= 1
          && m->n_channels <= CREW_MANIFEST_MAX_STATS && m->scale > 0
          && (m->n_channels == 1 || m->n_channels == m->sample_shape.dim[m->sample_shape.ndim - 1])
          && m->mean && m->std;
    /* Every entry is read, so ASan sees any that the reader did not allocate. */
    const double *mean = m->mean, *std = m->std;
    for (int c = 0; ok && c < m->n_channels; c++) ok = isfinite(mean[c]) && isfinite(std[c]) && std[c] > 0;
    for (int i = 0; ok && i < m->n_splits; i++) {
        const crew_manifest_split *sp = &m->splits[i];
        ok = sp->x.ndim == 1 + m->sample_shape.ndim && sp->x.shape[0] == sp->samples && sp->y.ndim == 1
          && sp->y.shape[0] == sp->samples && crew_manifest_find_split(m, sp->name) == sp;
    }
    return ok;
}

static void check_parse(const char *text, size_t len)
{
    crew_manifest m;
    crew_status s = crew_manifest_parse(text, len, "fuzz.json", &m);
    if (!s) {
        int ok = (!m.has_tokens || tokens_ok(&m)) && (m.n_splits == 0 ? m.has_tokens : samples_ok(&m));
        if (!ok) __builtin_trap();
        crew_manifest_free(&m);
    }
    crew_status_free(s);
}

/* norm (len bytes) as the "normalization" object of an otherwise valid manifest whose samples
 * have c channels: reaches the per-channel statistics without inventing the rest of the schema. */
static void check_with_normalization(int c, const char *norm, size_t len)
{
    static const char arrays[] =
        "\"x\": {\"file\": \"x.npy\", \"dtype\": \"float32\", \"shape\": [1, %d], \"bytes\": 0, \"xxh3\": \"%s\"}, "
        "\"y\": {\"file\": \"y.npy\", \"dtype\": \"int32\", \"shape\": [1], \"bytes\": 0, \"xxh3\": \"%s\"}";
    char head[256], tail[512], x[400];
    int h = snprintf(head, sizeof head, "{\"format\": \"crew-dataset\", \"version\": 1, \"name\": \"f\", "
                     "\"classes\": 2, \"sample_shape\": [%d], \"normalization\": ", c);
    snprintf(x, sizeof x, arrays, c, "0000000000000000", "0000000000000000");
    int t = snprintf(tail, sizeof tail, ", \"splits\": {\"train\": {\"samples\": 1, %s}}}", x);
    char *text = malloc((size_t)h + len + (size_t)t);
    if (!text) return;
    memcpy(text, head, (size_t)h);
    memcpy(text + h, norm, len);
    memcpy(text + h + len, tail, (size_t)t);
    check_parse(text, (size_t)h + len + (size_t)t);
    free(text);
}

/* count numbers into buf from the input's bytes, 8 a number (zeros past the end): any double,
 * the non-finite ones spelled as cJSON reads them (1e999 overflows to infinity). */
static char *numbers(char *at, int count, const uint8_t **data, size_t *size)
{
    for (int i = 0; i < count; i++) {
        uint8_t bits[8] = {0};
        size_t n = *size < 8 ? *size : 8;
        memcpy(bits, *data, n);
        *data += n, *size -= n;
        double v;
        memcpy(&v, bits, 8);
        const char *sep = i ? ", " : "";
        if (isnan(v)) at += sprintf(at, "%snull", sep);
        else if (isinf(v)) at += sprintf(at, "%s%s1e999", sep, v < 0 ? "-" : "");
        else at += sprintf(at, "%s%.17g", sep, v);
    }
    return at;
}

/* The input once more, twice over: its bytes after the first as the normalization object's JSON
 * (any shape), and read as counts and values of mean and std (so lengths on either side of the
 * channel count, and any value, come within a few mutations);
 * in both, the samples have 1 + data[0] % 40 channels. */
static void check_normalizations(const uint8_t *data, size_t size)
{
    if (size < 3 || size > (1 << 16)) return;
    int c = 1 + data[0] % 40, n_mean = data[1] % 42, n_std = data[2] % 42;
    check_with_normalization(c, (const char *)data + 1, size - 1);
    char norm[2 * 41 * 32 + 64], *at = norm;
    const uint8_t *rest = data + 3;
    size_t left = size - 3;
    at += sprintf(at, "{\"scale\": 1, \"mean\": [");
    at = numbers(at, n_mean, &rest, &left);
    at += sprintf(at, "], \"std\": [");
    at = numbers(at, n_std, &rest, &left);
    at += sprintf(at, "]}");
    check_with_normalization(c, norm, (size_t)(at - norm));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_parse((const char *)data, size);
    check_normalizations(data, size);
    return 0;
}
