/* prep_csv.c — crew prep for a CSV table of numbers with a label column.
 *
 * The first line names the columns. Every other line is a record with exactly as many fields:
 * the label column holds class labels (non-negative integers; "3" or "3.0"), every other column
 * a number that becomes a float32 feature, in the header's column order. Fields are separated by
 * ',', may be quoted ("..." with "" for a quote, as RFC 4180), and may have spaces around them;
 * lines end in \n or \r\n; blank lines are skipped. Anything else is an error naming the file,
 * the line and the column. The file is memory-mapped and parsed in one pass. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/status.h"
#include "data/prep_common.h"

#define FIELD_MAX 256
#define READ_STEPS 100 /* progress steps while parsing: one per percent of the file */

typedef struct csv_reader {
    const char *start, *p, *end;
    const char *path;
    int64_t line; /* 1-based line of p */
} csv_reader;

typedef struct csv_table {
    char **names;   /* [cols] header names */
    int cols, label_col;
    int64_t n, cap; /* rows read, rows allocated */
    float *x;       /* [cap][cols - 1] features */
    int32_t *y;     /* [cap] labels */
} csv_table;

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Skips a line holding nothing but spaces; 1 if it did. */
static int skip_blank_line(csv_reader *r)
{
    const char *q = r->p;
    while (q < r->end && is_space(*q)) q++;
    if (q < r->end && *q != '\n') return 0;
    if (q == r->end && q == r->p) return 0;
    r->p = q < r->end ? q + 1 : q;
    r->line++;
    return 1;
}

/* A quoted field's content, after its opening quote, into buf. */
static crew_status quoted(csv_reader *r, char *buf, size_t *n, int *truncated)
{
    int64_t from = r->line;
    for (;;) {
        if (r->p >= r->end)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld: a quoted field is never closed", r->path, (long long)from);
        char c = *r->p++;
        if (c == '"') {
            if (r->p < r->end && *r->p == '"') r->p++;
            else return CREW_OK;
        }
        if (c == '\n') r->line++;
        if (*n + 1 < FIELD_MAX) buf[(*n)++] = c;
        else *truncated = 1;
    }
}

/* The next field into buf (NUL-terminated, at most FIELD_MAX - 1 characters; *truncated says it
 * was longer); *last says it ended its record. */
static crew_status next_field(csv_reader *r, char *buf, int *truncated, int *last)
{
    size_t n = 0;
    *truncated = 0;
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t')) r->p++;
    if (r->p < r->end && *r->p == '"') {
        r->p++;
        CREW_TRY(quoted(r, buf, &n, truncated));
        while (r->p < r->end && is_space(*r->p)) r->p++;
    } else {
        while (r->p < r->end && *r->p != ',' && *r->p != '\n') {
            if (n + 1 < FIELD_MAX) buf[n++] = *r->p;
            else *truncated = 1;
            r->p++;
        }
        while (n && is_space(buf[n - 1])) n--;
    }
    buf[n] = '\0';
    if (r->p == r->end) *last = 1;
    else if (*r->p == ',') *last = 0;
    else if (*r->p == '\n') *last = 1, r->line++;
    else return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld: text after a closing quote", r->path, (long long)r->line);
    if (r->p < r->end) r->p++;
    return CREW_OK;
}

static crew_status read_header(csv_reader *r, const char *label, csv_table *t)
{
    while (skip_blank_line(r)) {}
    if (r->p >= r->end) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: empty file (expected a header line)", r->path);
    int64_t line = r->line, cap = 0;
    char buf[FIELD_MAX];
    int last = 0, truncated;
    t->label_col = -1;
    while (!last) {
        CREW_TRY(next_field(r, buf, &truncated, &last));
        if (truncated)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld: a column name longer than %d characters", r->path,
                               (long long)line, FIELD_MAX - 1);
        if (t->cols > CREW_MANIFEST_MAX_STATS) /* one more column makes more features than that */
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld: more than %d feature columns (the most whose mean "
                               "and std a manifest records)", r->path, (long long)line, CREW_MANIFEST_MAX_STATS);
        if (t->cols == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = cap <= INT32_MAX / 2 ? realloc(t->names, sizeof *grown * (size_t)cap) : NULL;
            if (!grown) return CREW_OOM();
            t->names = grown;
        }
        if (!(t->names[t->cols] = strdup(buf))) return CREW_OOM();
        t->cols++;
        if (strcmp(buf, label)) continue;
        if (t->label_col >= 0)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld: two columns are named '%s'", r->path, (long long)line,
                               label);
        t->label_col = t->cols - 1;
    }
    if (t->label_col < 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: no column named '%s' in the header (line %lld: %s%s%s...)", r->path,
                           label, (long long)line, t->names[0], t->cols > 1 ? ", " : "", t->cols > 1 ? t->names[1] : "");
    if (t->cols < 2)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the label column '%s' is the only column; no features", r->path, label);
    return CREW_OK;
}

static crew_status not_number(const csv_reader *r, int64_t line, const csv_table *t, int col, const char *text,
                              const char *must)
{
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld, column %d ('%s'): '%.40s' %s", r->path, (long long)line,
                       col + 1, t->names[col], text, must);
}

/* One cell into *v: a finite number within float32's range. */
static crew_status parse_cell(const csv_reader *r, int64_t line, const csv_table *t, int col, const char *text,
                              int truncated, double *v)
{
    char *end;
    errno = 0;
    *v = strtod(text, &end);
    if (truncated || !*text || *end || !isfinite(*v)) return not_number(r, line, t, col, text, "is not a number");
    if (fabs(*v) > FLT_MAX) return not_number(r, line, t, col, text, "is out of float32 range");
    if (col == t->label_col && (*v < 0 || *v != floor(*v) || *v >= CREW_MANIFEST_MAX_CLASSES))
        return not_number(r, line, t, col, text, "is not a class label (a non-negative integer below 1000000)");
    return CREW_OK;
}

static crew_status grow_rows(csv_table *t)
{
    if (t->n < t->cap) return CREW_OK;
    int64_t cap = t->cap ? 2 * t->cap : 1024, f = t->cols - 1;
    float *x = realloc(t->x, sizeof *x * (size_t)(cap * f));
    if (x) t->x = x;
    int32_t *y = realloc(t->y, sizeof *y * (size_t)cap);
    if (y) t->y = y;
    if (!x || !y) return CREW_OOM();
    t->cap = cap;
    return CREW_OK;
}

static crew_status read_row(csv_reader *r, csv_table *t)
{
    int64_t line = r->line;
    CREW_TRY(grow_rows(t));
    float *x = t->x + t->n * (t->cols - 1);
    char buf[FIELD_MAX];
    int last = 0, truncated, col = 0;
    while (!last) {
        CREW_TRY(next_field(r, buf, &truncated, &last));
        if (col < t->cols) {
            double v;
            CREW_TRY(parse_cell(r, line, t, col, buf, truncated, &v));
            if (col == t->label_col) t->y[t->n] = (int32_t)v;
            else *x++ = (float)v;
        }
        col++;
    }
    if (col != t->cols)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: line %lld has %d fields but the header has %d", r->path,
                           (long long)line, col, t->cols);
    t->n++;
    return CREW_OK;
}

static crew_status read_rows(csv_reader *r, csv_table *t, crew_prep_progress *pr)
{
    size_t size = (size_t)(r->end - r->start);
    for (;;) {
        while (skip_blank_line(r)) {}
        int64_t pct = (int64_t)((double)(r->p - r->start) / (double)size * READ_STEPS);
        while (pr->done < pct) crew_prep_tick(pr, r->path);
        if (r->p >= r->end) break;
        CREW_TRY(read_row(r, t));
    }
    if (t->n == 0) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: a header but no data rows", r->path);
    return CREW_OK;
}

/* The manifest's normalization: scale 1 and the mean and std of each feature over the train rows
 * x [n][f] (std 1 for a constant feature). The stored values stay raw, whatever f, and gathering
 * standardises them, as for every other source. */
static crew_status feature_stats(const float *x, int64_t n, int f, crew_manifest *m)
{
    double *mean, *std;
    CREW_TRY(crew_manifest_set_channels(m, f, &mean, &std));
    m->scale = 1.0;
    for (int j = 0; j < f; j++) {
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++) sum += x[i * f + j];
        double mu = sum / (double)n;
        for (int64_t i = 0; i < n; i++) sq += (x[i * f + j] - mu) * (x[i * f + j] - mu);
        double sd = sqrt(sq / (double)n);
        mean[j] = mu;
        std[j] = sd > 1e-12 ? sd : 1.0;
    }
    return CREW_OK;
}

/* Split, normalise and write a parsed table. */
static crew_status finish(const char *path, csv_table *t, double fraction, uint64_t seed, const char *out_dir,
                          crew_prep_progress *pr)
{
    int f = t->cols - 1, classes = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->y[i] + 1 > classes) classes = t->y[i] + 1;
    int64_t sample = (int64_t)f * 4, n_test = 0;
    uint8_t *is_test = malloc((size_t)t->n), *xt = NULL, *yt = NULL;
    crew_status s = is_test ? crew_prep_split(t->y, t->n, classes, fraction, seed, path, is_test) : CREW_OOM();
    for (int64_t i = 0; !s && i < t->n; i++) n_test += is_test[i];
    if (!s && (!(xt = malloc((size_t)(n_test * sample))) || !(yt = malloc((size_t)n_test * 4)))) s = CREW_OOM();
    crew_manifest m;
    memset(&m, 0, sizeof m);
    if (!s) {
        crew_prep_partition((uint8_t *)t->x, sample, (uint8_t *)t->y, 4, is_test, t->n, xt, yt);
        crew_prep_tick(pr, "normalization statistics");
        s = feature_stats(t->x, t->n - n_test, f, &m);
    }
    if (!s) {
        snprintf(m.name, sizeof m.name, "csv");
        m.classes = classes;
        m.sample_shape = crew_shape1(f);
        crew_prep_split_data d[2] = {{"train", t->n - n_test, t->x, t->y}, {"test", n_test, xt, yt}};
        s = crew_prep_write(out_dir, &m, CREW_DTYPE_F32, CREW_DTYPE_I32, d, 2, pr);
    }
    crew_manifest_free(&m);
    free(is_test);
    free(xt);
    free(yt);
    return s;
}

crew_status crew_prep_csv(const char *file, const char *label_column, double test_fraction, uint64_t seed,
                          const char *out_dir, crew_progress_fn progress, void *user)
{
    if (!file || !label_column || !out_dir)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_csv: file, label_column and out_dir are required");
    if (!(test_fraction > 0 && test_fraction < 1))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the test fraction must be in (0, 1), not %g", test_fraction);
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    void *map;
    size_t len;
    CREW_TRY(crew_prep_map_file(file, &map, &len));
    csv_reader r = {.start = map, .p = map, .end = (const char *)map + len, .path = file, .line = 1};
    csv_table t;
    memset(&t, 0, sizeof t);
    crew_prep_progress pr = {.fn = progress, .user = user, .total = READ_STEPS + 1 + 4 + 1};
    crew_status s = read_header(&r, label_column, &t);
    if (!s) s = read_rows(&r, &t, &pr);
    munmap(map, len);
    if (!s) s = finish(file, &t, test_fraction, seed, out_dir, &pr);
    if (!s) crew_prep_done(&pr);
    for (int i = 0; i < t.cols; i++) free(t.names[i]);
    free(t.names);
    free(t.x);
    free(t.y);
    return s;
}
