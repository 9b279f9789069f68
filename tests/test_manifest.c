/* test_manifest.c — normalization statistics in manifest.json: manifests as crew wrote them
 * before (at most 16 entries) read unchanged; any number of entries up to
 * CREW_MANIFEST_MAX_STATS (a CSV table's features) read, written and read back exactly;
 * and every bad normalization an error naming the file and the key, with nothing leaked (the
 * suite also runs under AddressSanitizer). Other parts of the schema: tests/test_dataset.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/status.h"
#include "data/manifest.h"

/* A manifest of one split of 2 samples with `c` channels and normalization `norm` (JSON text). */
static char *manifest_text(int64_t c, const char *norm)
{
    static const char fmt[] =
        "{\"format\": \"crew-dataset\", \"version\": 1, \"name\": \"t\", \"classes\": 2, \"sample_shape\": [%lld],\n"
        " \"normalization\": %s,\n"
        " \"splits\": {\"train\": {\"samples\": 2,\n"
        "   \"x\": {\"file\": \"x.npy\", \"dtype\": \"float32\", \"shape\": [2, %lld], \"bytes\": 0,\n"
        "          \"xxh3\": \"%s\"},\n"
        "   \"y\": {\"file\": \"y.npy\", \"dtype\": \"int32\", \"shape\": [2], \"bytes\": 0, \"xxh3\": \"%s\"}}}}\n";
    size_t len = strlen(fmt) + strlen(norm) + 64;
    char *text = malloc(len);
    if (text) snprintf(text, len, fmt, (long long)c, norm, (long long)c, "0123456789abcdef", "0123456789abcdef");
    return text;
}

/* {"scale": 1, "mean": [n numbers], "std": [k numbers]}: mean j is j / 3 - 5, std j is 1 + j / 7,
 * and entry `bad_at` of std (of mean where bad_at is negative: entry -bad_at - 2) is the text
 * `bad`; bad_at -1 leaves every entry good. */
static char *norm_text(int n, int k, int bad_at, const char *bad)
{
    int bad_mean = bad_at < -1 ? -bad_at - 2 : -1;
    size_t len = 64 + 32 * ((size_t)n + (size_t)k);
    char *text = malloc(len), *at = text;
    if (!text) return NULL;
    at += sprintf(at, "{\"scale\": 1, \"mean\": [");
    for (int j = 0; j < n; j++) {
        if (j == bad_mean) at += sprintf(at, "%s%s", j ? ", " : "", bad);
        else at += sprintf(at, "%s%.17g", j ? ", " : "", j / 3.0 - 5);
    }
    at += sprintf(at, "], \"std\": [");
    for (int j = 0; j < k; j++) {
        if (j == bad_at) at += sprintf(at, "%s%s", j ? ", " : "", bad);
        else at += sprintf(at, "%s%.17g", j ? ", " : "", 1 + j / 7.0);
    }
    sprintf(at, "]}");
    return text;
}

static crew_status parse(int64_t c, const char *norm, crew_manifest *m)
{
    char *text = manifest_text(c, norm);
    if (!text) return CREW_OOM();
    crew_status s = crew_manifest_parse(text, strlen(text), "m.json", m);
    free(text);
    return s;
}

/* c channels with n entries of each; std entry bad_at replaced by `bad`. */
static crew_status parse_stats(int64_t c, int n, int k, int bad_at, const char *bad, crew_manifest *m)
{
    char *norm = norm_text(n, k, bad_at, bad);
    crew_status s = norm ? parse(c, norm, m) : CREW_OOM();
    free(norm);
    return s;
}

/* The statistics of norm_text, exactly as read from it (relative tolerance 0), or as written by
 * cJSON, whose printing settles for 15 digits when they read back within DBL_EPSILON. */
static int stats_are(const crew_manifest *m, int n, double tolerance)
{
    const double *mean = m->mean, *std = m->std;
    int same = m->n_channels == n && mean && std;
    for (int j = 0; same && j < n; j++) {
        double mu = j / 3.0 - 5, sd = 1 + j / 7.0;
        same = fabs(mean[j] - mu) <= tolerance * fabs(mu) && fabs(std[j] - sd) <= tolerance * sd;
    }
    return same;
}

static int stats_exact(const crew_manifest *m, int n) { return stats_are(m, n, 0); }

/* What crew wrote before statistics could be more than 16: 1 shared entry, or one per channel up
 * to 16. They read as they did. */
static void test_narrow(void)
{
    const int64_t channels[] = {1, 3, 16, 28};
    const int entries[] = {1, 3, 16, 1};
    for (int i = 0; i < 4; i++) {
        crew_manifest m;
        CHECK_OK(parse_stats(channels[i], entries[i], entries[i], -1, NULL, &m));
        CHECK_MSG(stats_exact(&m, entries[i]), "%lld channels, %d entries", (long long)channels[i], entries[i]);
        crew_manifest_free(&m);
        CHECK(m.mean == NULL && m.std == NULL && m.n_channels == 0);
    }
    /* Exactly the text of a crew 1 manifest for Fashion-MNIST's statistics. */
    crew_manifest m;
    CHECK_OK(parse(1, "{\"scale\": 0.00392156862745098, \"mean\": [0.2860405969887955], "
                      "\"std\": [0.3530242445149225]}", &m));
    CHECK(m.n_channels == 1 && m.mean[0] == 0.2860405969887955 && m.std[0] == 0.3530242445149225);
    crew_manifest_free(&m);
}

/* Many entries (a table's features) are read exactly, written, and read back. */
static void test_wide(void)
{
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/crew-manifest-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/%s", dir, CREW_MANIFEST_FILE);
    const int channels[] = {17, 40, 5000};
    for (int i = 0; i < 3; i++) {
        int c = channels[i];
        crew_manifest m, back;
        CHECK_OK(parse_stats(c, c, c, -1, NULL, &m));
        CHECK_MSG(stats_exact(&m, c), "%d channels", c);
        CHECK_OK(crew_manifest_write(path, &m));
        CHECK_OK(crew_manifest_read(dir, &back));
        CHECK_MSG(stats_are(&back, c, 4e-16), "%d channels, written and read back", c);
        crew_manifest_free(&m);
        crew_manifest_free(&back);
        CHECK(m.mean == NULL && back.std == NULL);
    }
    /* One entry shared by many channels stays one entry. */
    crew_manifest m;
    CHECK_OK(parse_stats(5000, 1, 1, -1, NULL, &m));
    CHECK(stats_exact(&m, 1));
    crew_manifest_free(&m);
    /* The reader of a directory names the file. */
    FILE *f = fopen(path, "wb");
    char *norm = norm_text(40, 40, 33, "0"), *text = norm ? manifest_text(40, norm) : NULL;
    if (f && text) fputs(text, f);
    if (f) fclose(f);
    char want[192];
    snprintf(want, sizeof want, "%s: normalization.std[33] must be a finite positive number", path);
    CHECK_ERR(crew_manifest_read(dir, &m), want);
    free(norm);
    free(text);
    remove(path);
    rmdir(dir);
}

/* Each bad normalization: one error naming the file and the key, after which nothing is left
 * allocated (LeakSanitizer checks, in the sanitizer build). */
static void test_bad(void)
{
    crew_manifest m;
    CHECK_ERR(parse_stats(40, 39, 39, -1, NULL, &m),
              "m.json: normalization.mean holds 39 entries; it must hold 1 (shared by all channels) or one per "
              "channel (40)");
    CHECK_ERR(parse_stats(3, 16, 16, -1, NULL, &m), "normalization.mean holds 16 entries; it must hold 1");
    CHECK_ERR(parse_stats(40, 40, 1, -1, NULL, &m),
              "m.json: normalization.mean and .std must hold as many entries (40 and 1)");
    CHECK_ERR(parse_stats(40, 1, 40, -1, NULL, &m), "(1 and 40)");
    CHECK_ERR(parse_stats(40, 40, 41, -1, NULL, &m), "m.json: normalization.std holds 41 entries");
    CHECK_ERR(parse_stats(40, 0, 0, -1, NULL, &m), "normalization.mean holds 0 entries");
    /* Entries: finite numbers, std positive; the index names the entry. */
    CHECK_ERR(parse_stats(40, 40, 40, 20, "0", &m), "m.json: normalization.std[20] must be a finite positive number");
    CHECK_ERR(parse_stats(40, 40, 40, 39, "-1e-300", &m), "normalization.std[39] must be a finite positive number");
    CHECK_ERR(parse_stats(40, 40, 40, 0, "1e999", &m), "normalization.std[0] must be a finite positive number");
    CHECK_ERR(parse_stats(3, 3, 3, 1, "\"1\"", &m), "normalization.std[1] must be a finite positive number");
    CHECK_ERR(parse_stats(3, 3, 3, 2, "null", &m), "normalization.std[2] must be a finite positive number");
    CHECK_ERR(parse_stats(20, 20, 20, -2 - 17, "-1e999", &m), "m.json: normalization.mean[17] must be a finite number");
    CHECK_ERR(parse_stats(20, 20, 20, -2 - 0, "true", &m), "m.json: normalization.mean[0] must be a finite number");
    CHECK_ERR(parse(2, "{\"scale\": 1, \"mean\": [0, [1]], \"std\": [1, 1]}", &m),
              "normalization.mean[1] must be a finite");
    CHECK_ERR(parse(2, "{\"scale\": 1, \"mean\": {\"0\": 1}, \"std\": [1, 1]}", &m),
              "m.json: normalization.mean must be an array of numbers");
    CHECK_ERR(parse(2, "{\"scale\": 1, \"mean\": [0, 0]}", &m), "m.json: normalization.std is missing");
    CHECK_ERR(parse(2, "{\"scale\": 1, \"mean\": [0, 0], \"std\": [1, 1], \"var\": [1, 1]}", &m),
              "m.json: normalization.var is not a known key");
    /* More entries than any manifest may hold: refused before they are copied anywhere. */
    int many = CREW_MANIFEST_MAX_STATS + 1;
    char *norm = malloc(2 * (size_t)many + 64), *at = norm;
    if (norm) {
        at += sprintf(at, "{\"scale\": 1, \"mean\": [0");
        for (int j = 1; j < many; j++) at += sprintf(at, ",0");
        sprintf(at, "], \"std\": [1]}");
        CHECK_ERR(parse(many, norm, &m),
                  "m.json: normalization.mean holds 1048577 entries, more than the 1048576 crew reads");
    }
    free(norm);
}

/* Sizing the statistics by hand, as prep does: allocated, replaced on a second call, and refused
 * outside 1 to CREW_MANIFEST_MAX_STATS. */
static void test_set_channels(void)
{
    crew_manifest m;
    memset(&m, 0, sizeof m);
    double *mean = NULL, *std = NULL;
    CHECK_OK(crew_manifest_set_channels(&m, 3, &mean, &std));
    CHECK(m.n_channels == 3 && mean == m.mean && std == m.std && mean && std);
    CHECK_OK(crew_manifest_set_channels(&m, 100, &mean, &std));
    CHECK(m.n_channels == 100 && mean == m.mean && std == m.std && mean);
    if (mean) mean[99] = std[99] = 1; /* the whole length is there (ASan would say otherwise) */
    CHECK_OK(crew_manifest_set_channels(&m, 16, &mean, &std));
    CHECK(m.n_channels == 16 && mean == m.mean);
    CHECK_ERR(crew_manifest_set_channels(&m, 0, &mean, &std), "0 entries (must be 1 to 1048576)");
    CHECK_ERR(crew_manifest_set_channels(&m, CREW_MANIFEST_MAX_STATS + 1, &mean, &std), "1048577 entries");
    CHECK_OK(crew_manifest_set_channels(&m, 17, &mean, &std));
    crew_manifest_free(&m);
    CHECK(m.mean == NULL && m.std == NULL);
    crew_manifest_free(&m); /* twice is harmless */
}

int main(void)
{
    test_narrow();
    test_wide();
    test_bad();
    test_set_channels();
    return check_report();
}
