/* report.c — crew_report_write: reads RUN_DIR/metrics.jsonl (docs/METRICS.md) into a bounded
 * summary and writes the HTML page around the charts of report_svg.c, atomically (a temporary
 * file renamed over the report), so a reader never sees half a page. */
#include "telemetry/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"

/* Step numbers above this would lose integer precision in a JSON double. */
#define MAX_STEP 9007199254740992.0

/* ---------------------------------------------------------------- reading lines */

/* Lines of a file, each at most CREW_REPORT_MAX_LINE bytes, without reading more than that into
 * memory however the file looks (one endless line of binary data included). */
typedef struct line_reader {
    FILE *f;
    char chunk[65536];
    size_t pos, end;
    char *line; /* [cap]: the current line, NUL-terminated */
    size_t len, cap;
    int64_t number; /* 1-based number of the current line */
} line_reader;

/* 1: a line is in r->line; 0: end of file; -1: a line too long; -2: a read error. */
static int next_line(line_reader *r)
{
    r->len = 0;
    int got_any = 0;
    for (;;) {
        if (r->pos == r->end) {
            r->end = fread(r->chunk, 1, sizeof r->chunk, r->f);
            r->pos = 0;
            if (r->end == 0) {
                if (ferror(r->f)) return -2;
                if (!got_any) return 0;
                break;
            }
        }
        got_any = 1;
        char *start = r->chunk + r->pos;
        char *nl = memchr(start, '\n', r->end - r->pos);
        size_t take = nl ? (size_t)(nl - start) : r->end - r->pos;
        if (r->len + take > CREW_REPORT_MAX_LINE) return -1;
        if (r->len + take + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + take + 1) cap *= 2;
            char *p = realloc(r->line, cap);
            if (!p) return -3;
            r->line = p;
            r->cap = cap;
        }
        memcpy(r->line + r->len, start, take);
        r->len += take;
        r->pos += take + (nl ? 1 : 0);
        if (nl) break;
    }
    r->line[r->len] = '\0';
    r->number++;
    return 1;
}

/* ---------------------------------------------------------------- typed values */

typedef struct read_ctx {
    const char *path;
    int64_t line;
    crew_report_data *d;
} read_ctx;

/* The number under key: NaN when absent, null or not finite (1e999); an error for other types. */
static crew_status get_num(const read_ctx *c, const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NAN;
    if (!v || cJSON_IsNull(v)) return CREW_OK;
    if (!cJSON_IsNumber(v))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: \"%s\" is not a number", c->path, (long long)c->line,
                           key);
    if (isfinite(v->valuedouble)) *out = v->valuedouble;
    return CREW_OK;
}

/* An integer in [lo, hi] under key; *out = dflt when absent or null (an error when required). */
static crew_status get_int(const read_ctx *c, const cJSON *o, const char *key, double lo, double hi, int required,
                           int64_t dflt, int64_t *out)
{
    double v;
    CREW_TRY(get_num(c, o, key, &v));
    *out = dflt;
    if (isnan(v) && !required) return CREW_OK;
    if (isnan(v) || v != floor(v) || v < lo || v > hi)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: \"%s\" must be an integer in [%.0f, %.0f]",
                           c->path, (long long)c->line, key, lo, hi);
    *out = (int64_t)v;
    return CREW_OK;
}

/* The string under key, or NULL when absent or null; an error for other types. */
static crew_status get_str(const read_ctx *c, const cJSON *o, const char *key, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return CREW_OK;
    if (!cJSON_IsString(v))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: \"%s\" is not a string", c->path, (long long)c->line,
                           key);
    *out = v->valuestring;
    return CREW_OK;
}

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

/* ---------------------------------------------------------------- line types */

static crew_status read_run(const read_ctx *c, const cJSON *o)
{
    crew_report_data *d = c->d;
    const char *version, *model, *data;
    d->has_run = 1;
    CREW_TRY(get_num(c, o, "time", &d->start_time));
    CREW_TRY(get_str(c, o, "crew_version", &version));
    CREW_TRY(get_str(c, o, "model", &model));
    CREW_TRY(get_str(c, o, "data", &data));
    copy_str(d->version, sizeof d->version, version);
    copy_str(d->model, sizeof d->model, model);
    copy_str(d->data, sizeof d->data, data);
    CREW_TRY(get_int(c, o, "devices", 1, CREW_REPORT_MAX_REPLICAS, 0, -1, &d->devices));
    CREW_TRY(get_int(c, o, "batch_per_device", 0, MAX_STEP, 0, -1, &d->batch_per_device));
    CREW_TRY(get_int(c, o, "accumulation", 0, MAX_STEP, 0, -1, &d->accumulation));
    CREW_TRY(get_int(c, o, "global_batch", 0, MAX_STEP, 0, -1, &d->global_batch));
    CREW_TRY(get_int(c, o, "steps_per_epoch", 0, MAX_STEP, 0, -1, &d->steps_per_epoch));
    CREW_TRY(get_int(c, o, "total_steps", 0, MAX_STEP, 0, -1, &d->total_steps));
    CREW_TRY(get_int(c, o, "epochs", 0, MAX_STEP, 0, -1, &d->epochs));
    CREW_TRY(get_int(c, o, "warmup_steps", 0, MAX_STEP, 0, -1, &d->warmup_steps));
    CREW_TRY(get_num(c, o, "base_lr", &d->base_lr));
    CREW_TRY(get_num(c, o, "scaled_lr", &d->scaled_lr));
    return CREW_OK;
}

static void add_bucket(crew_report_bucket *dst, const crew_report_bucket *src)
{
    if (src->loss_n) {
        dst->loss_min = dst->loss_n ? fmin(dst->loss_min, src->loss_min) : src->loss_min;
        dst->loss_max = dst->loss_n ? fmax(dst->loss_max, src->loss_max) : src->loss_max;
    }
    dst->steps += src->steps;
    dst->loss_sum += src->loss_sum;
    dst->loss_n += src->loss_n;
    dst->lr_sum += src->lr_sum;
    dst->lr_n += src->lr_n;
    dst->samples += src->samples;
    dst->samples_s += src->samples_s;
    for (int p = 0; p < CREW_PART_COUNT; p++) dst->part_sum[p] += src->part_sum[p];
    dst->wall_sum += src->wall_sum;
    dst->part_n += src->part_n;
}

/* Halves the number of buckets: bucket i becomes buckets 2i and 2i+1, twice as wide. */
static void merge_pairs(crew_report_data *d)
{
    int half = (d->buckets + 1) / 2;
    for (int i = 0; i < half; i++) {
        crew_report_bucket b = d->bucket[2 * i];
        if (2 * i + 1 < d->buckets) add_bucket(&b, &d->bucket[2 * i + 1]);
        d->bucket[i] = b;
        for (int r = 0; r < d->replica_rows; r++) {
            double *s = d->compute_sum + (size_t)r * CREW_REPORT_BUCKETS;
            int64_t *n = d->compute_n + (size_t)r * CREW_REPORT_BUCKETS;
            double s2 = 2 * i + 1 < d->buckets ? s[2 * i + 1] : 0;
            int64_t n2 = 2 * i + 1 < d->buckets ? n[2 * i + 1] : 0;
            s[i] = s[2 * i] + s2;
            n[i] = n[2 * i] + n2;
        }
    }
    memset(d->bucket + half, 0, sizeof d->bucket[0] * (size_t)(CREW_REPORT_BUCKETS - half));
    for (int r = 0; r < d->replica_rows; r++) {
        memset(d->compute_sum + (size_t)r * CREW_REPORT_BUCKETS + half, 0, sizeof(double) * (CREW_REPORT_BUCKETS - half));
        memset(d->compute_n + (size_t)r * CREW_REPORT_BUCKETS + half, 0, sizeof(int64_t) * (CREW_REPORT_BUCKETS - half));
    }
    d->buckets = half;
    d->bucket_steps *= 2;
}

/* The bucket of a step (1 <= step <= MAX_STEP), merging buckets until it fits. */
static int bucket_of(crew_report_data *d, int64_t step)
{
    int64_t i;
    while ((i = (step - 1) / d->bucket_steps) >= CREW_REPORT_BUCKETS) merge_pairs(d);
    if (i >= d->buckets) d->buckets = (int)i + 1;
    return (int)i;
}

/* Makes room for rank in the per-replica arrays. */
static crew_status ensure_replica(crew_report_data *d, int rank)
{
    if (rank >= d->replicas) d->replicas = rank + 1;
    if (rank < d->replica_rows) return CREW_OK;
    int rows = d->replica_rows ? d->replica_rows : 2;
    while (rows <= rank) rows *= 2;
    if (rows > CREW_REPORT_MAX_REPLICAS) rows = CREW_REPORT_MAX_REPLICAS;
    double *s = realloc(d->compute_sum, sizeof *s * (size_t)rows * CREW_REPORT_BUCKETS);
    if (!s) return CREW_OOM();
    d->compute_sum = s;
    int64_t *n = realloc(d->compute_n, sizeof *n * (size_t)rows * CREW_REPORT_BUCKETS);
    if (!n) return CREW_OOM();
    d->compute_n = n;
    size_t old = (size_t)d->replica_rows * CREW_REPORT_BUCKETS, add = (size_t)(rows - d->replica_rows) * CREW_REPORT_BUCKETS;
    memset(s + old, 0, sizeof *s * add);
    memset(n + old, 0, sizeof *n * add);
    d->replica_rows = rows;
    return CREW_OK;
}

static const char *const part_keys[CREW_PART_COUNT] = {"data_s", "forward_s", "backward_s", "comm_exposed_s",
                                                       "optimizer_s"};

/* The replicas of a step line: their compute time into the heat map's bucket, and the mean of
 * each part over the replicas that reported it into part_mean. Returns the replicas counted. */
static crew_status read_replicas(const read_ctx *c, const cJSON *arr, int b, double part_mean[CREW_PART_COUNT],
                                 int *counted)
{
    double part_n[CREW_PART_COUNT] = {0};
    int index = 0;
    *counted = 0;
    for (const cJSON *rep = arr ? arr->child : NULL; rep; rep = rep->next, index++) {
        if (!cJSON_IsObject(rep))
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: replicas[%d] is not an object", c->path,
                               (long long)c->line, index);
        int64_t rank;
        double t[CREW_PART_COUNT];
        CREW_TRY(get_int(c, rep, "rank", 0, CREW_REPORT_MAX_REPLICAS - 1, 0, index, &rank));
        for (int p = 0; p < CREW_PART_COUNT; p++) {
            CREW_TRY(get_num(c, rep, part_keys[p], &t[p]));
            if (isnan(t[p])) continue;
            part_mean[p] += t[p];
            part_n[p]++;
        }
        CREW_TRY(ensure_replica(c->d, (int)rank));
        if (!isnan(t[CREW_PART_FORWARD]) || !isnan(t[CREW_PART_BACKWARD])) {
            double fwd = isnan(t[CREW_PART_FORWARD]) ? 0 : t[CREW_PART_FORWARD];
            double bwd = isnan(t[CREW_PART_BACKWARD]) ? 0 : t[CREW_PART_BACKWARD];
            c->d->compute_sum[(size_t)rank * CREW_REPORT_BUCKETS + b] += fwd + bwd;
            c->d->compute_n[(size_t)rank * CREW_REPORT_BUCKETS + b]++;
        }
        (*counted)++;
    }
    for (int p = 0; p < CREW_PART_COUNT; p++) part_mean[p] = part_n[p] > 0 ? part_mean[p] / part_n[p] : 0;
    return CREW_OK;
}

static crew_status read_step(const read_ctx *c, const cJSON *o)
{
    crew_report_data *d = c->d;
    int64_t step, batch;
    double loss, lr, step_s, time;
    CREW_TRY(get_int(c, o, "step", 1, MAX_STEP, 1, 0, &step));
    CREW_TRY(get_int(c, o, "global_batch", 0, MAX_STEP, 0, -1, &batch));
    CREW_TRY(get_num(c, o, "loss", &loss));
    CREW_TRY(get_num(c, o, "lr", &lr));
    CREW_TRY(get_num(c, o, "step_s", &step_s));
    CREW_TRY(get_num(c, o, "time", &time));
    const cJSON *reps = cJSON_GetObjectItemCaseSensitive(o, "replicas");
    if (reps && !cJSON_IsNull(reps) && !cJSON_IsArray(reps))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: \"replicas\" is not an array", c->path,
                           (long long)c->line);
    if (batch < 0) batch = d->global_batch;

    int b = bucket_of(d, step);
    crew_report_bucket *k = &d->bucket[b];
    double part_mean[CREW_PART_COUNT] = {0};
    int counted;
    CREW_TRY(read_replicas(c, reps, b, part_mean, &counted));
    k->steps++;
    if (!isnan(loss)) {
        k->loss_min = k->loss_n ? fmin(k->loss_min, loss) : loss;
        k->loss_max = k->loss_n ? fmax(k->loss_max, loss) : loss;
        k->loss_sum += loss;
        k->loss_n++;
    }
    if (!isnan(lr)) {
        k->lr_sum += lr;
        k->lr_n++;
    }
    if (batch > 0 && step_s > 0) {
        k->samples += (double)batch;
        k->samples_s += step_s;
    }
    if (counted > 0) {
        for (int p = 0; p < CREW_PART_COUNT; p++) k->part_sum[p] += part_mean[p];
        k->wall_sum += isnan(step_s) ? 0 : step_s;
        k->part_n++;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "skipped"))) d->skipped_steps++;
    if (!d->step_lines || step < d->first_step) d->first_step = step;
    if (!d->step_lines || step > d->last_step) d->last_step = step;
    if (!isnan(time)) d->last_step_time = time;
    d->recent_step = step;
    d->step_lines++;
    return CREW_OK;
}

static crew_status read_epoch(const read_ctx *c, const cJSON *o)
{
    crew_report_data *d = c->d;
    d->total_epochs++;
    if (d->n_epochs >= CREW_REPORT_MAX_EPOCHS) return CREW_OK;
    crew_report_epoch e = {.end_step = d->recent_step};
    int64_t epoch;
    CREW_TRY(get_int(c, o, "epoch", 0, 1e9, 0, -1, &epoch));
    e.epoch = (int)epoch;
    CREW_TRY(get_int(c, o, "steps", 0, MAX_STEP, 0, -1, &e.steps));
    CREW_TRY(get_num(c, o, "train_loss", &e.train_loss));
    CREW_TRY(get_num(c, o, "train_accuracy", &e.train_accuracy));
    CREW_TRY(get_num(c, o, "test_loss", &e.test_loss));
    CREW_TRY(get_num(c, o, "test_accuracy", &e.test_accuracy));
    CREW_TRY(get_num(c, o, "wall_s", &e.wall_s));
    CREW_TRY(get_num(c, o, "samples_per_s", &e.samples_per_s));
    if (!d->epochs_seen) {
        d->epochs_seen = calloc(CREW_REPORT_MAX_EPOCHS, sizeof *d->epochs_seen);
        if (!d->epochs_seen) return CREW_OOM();
    }
    d->epochs_seen[d->n_epochs++] = e;
    return CREW_OK;
}

static int kind_index(const char *kind)
{
    static const char *const names[8] = {"info", "straggler", "input_bound", "nan", "skipped_update",
                                         "loss_spike", "divergence", "hang"};
    for (int i = 0; i < 8; i++)
        if (!strcmp(kind, names[i])) return i;
    return 0;
}

static crew_status read_event(const read_ctx *c, const cJSON *o)
{
    crew_report_data *d = c->d;
    crew_report_event e = {.value = NAN};
    const char *kind, *message;
    int64_t rank;
    CREW_TRY(get_int(c, o, "step", 0, MAX_STEP, 0, -1, &e.step));
    CREW_TRY(get_int(c, o, "rank", 0, CREW_REPORT_MAX_REPLICAS - 1, 0, -1, &rank));
    CREW_TRY(get_num(c, o, "value", &e.value));
    CREW_TRY(get_str(c, o, "kind", &kind));
    CREW_TRY(get_str(c, o, "message", &message));
    e.rank = (int)rank;
    copy_str(e.kind, sizeof e.kind, kind ? kind : "info");
    d->total_events++;
    d->event_kinds[kind_index(e.kind)]++;
    if (d->n_events >= CREW_REPORT_MAX_EVENTS) return CREW_OK;
    if (!d->events) {
        d->events = calloc(CREW_REPORT_MAX_EVENTS, sizeof *d->events);
        if (!d->events) return CREW_OOM();
    }
    e.message = strdup(message ? message : "");
    if (!e.message) return CREW_OOM();
    d->events[d->n_events++] = e;
    return CREW_OK;
}

static crew_status read_summary(const read_ctx *c, const cJSON *o)
{
    static const char *const fractions[4] = {"data_fraction", "compute_fraction", "comm_exposed_fraction",
                                             "optimizer_fraction"};
    crew_report_data *d = c->d;
    const char *bottleneck, *message;
    d->has_summary = 1;
    CREW_TRY(get_int(c, o, "steps", 0, MAX_STEP, 0, -1, &d->sum_steps));
    CREW_TRY(get_int(c, o, "epochs", 0, MAX_STEP, 0, -1, &d->sum_epochs));
    CREW_TRY(get_int(c, o, "skipped_updates", 0, MAX_STEP, 0, -1, &d->sum_skipped));
    CREW_TRY(get_num(c, o, "wall_s", &d->sum_wall_s));
    CREW_TRY(get_num(c, o, "samples_per_s", &d->sum_samples_per_s));
    CREW_TRY(get_num(c, o, "test_accuracy", &d->sum_test_accuracy));
    CREW_TRY(get_num(c, o, "test_loss", &d->sum_test_loss));
    for (int i = 0; i < 4; i++) CREW_TRY(get_num(c, o, fractions[i], &d->sum_fraction[i]));
    CREW_TRY(get_str(c, o, "bottleneck", &bottleneck));
    CREW_TRY(get_str(c, o, "message", &message));
    copy_str(d->bottleneck, sizeof d->bottleneck, bottleneck ? bottleneck : message);
    return CREW_OK;
}

/* One line: blank lines are skipped, lines of unknown type ignored (newer writers may add some). */
static crew_status read_line(const read_ctx *c, const char *text, size_t len)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) i++;
    if (i == len) return CREW_OK;
    if (memchr(text, '\0', len))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: holds a NUL byte (not a text file?)", c->path,
                           (long long)c->line);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 1);
    if (!o) {
        long long col = end && end >= text && end <= text + len ? (long long)(end - text) + 1 : 1;
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: not valid JSON (at column %lld)", c->path,
                           (long long)c->line, col);
    }
    crew_status s = CREW_OK;
    const char *type = NULL;
    if (!cJSON_IsObject(o))
        s = crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: not a JSON object", c->path, (long long)c->line);
    if (!s) s = get_str(c, o, "type", &type);
    if (!s && type) {
        if (!strcmp(type, "run")) s = read_run(c, o);
        else if (!strcmp(type, "step")) s = read_step(c, o);
        else if (!strcmp(type, "epoch")) s = read_epoch(c, o);
        else if (!strcmp(type, "event")) s = read_event(c, o);
        else if (!strcmp(type, "summary")) s = read_summary(c, o);
    }
    cJSON_Delete(o);
    return s;
}

static void data_init(crew_report_data *d)
{
    memset(d, 0, sizeof *d);
    d->start_time = d->base_lr = d->scaled_lr = d->last_step_time = NAN;
    d->devices = d->batch_per_device = d->accumulation = d->global_batch = -1;
    d->steps_per_epoch = d->total_steps = d->epochs = d->warmup_steps = -1;
    d->sum_steps = d->sum_epochs = d->sum_skipped = -1;
    d->sum_wall_s = d->sum_samples_per_s = d->sum_test_accuracy = d->sum_test_loss = NAN;
    for (int i = 0; i < 4; i++) d->sum_fraction[i] = NAN;
    d->bucket_steps = 1;
}

void crew_report_data_free(crew_report_data *d)
{
    for (int i = 0; i < d->n_events; i++) free(d->events[i].message);
    free(d->events);
    free(d->epochs_seen);
    free(d->compute_sum);
    free(d->compute_n);
    d->events = NULL;
    d->epochs_seen = NULL;
    d->compute_sum = NULL;
    d->compute_n = NULL;
    d->n_events = d->n_epochs = 0;
}

crew_status crew_report_read(const char *path, crew_report_data *d)
{
    data_init(d);
    FILE *f = fopen(path, "rb");
    if (!f) return crew_errorf(CREW_CODE_IO, "cannot open %s: %s", path, strerror(errno));
    line_reader *r = calloc(1, sizeof *r);
    if (!r) {
        fclose(f);
        return CREW_OOM();
    }
    r->f = f;
    read_ctx c = {path, 0, d};
    crew_status s = CREW_OK;
    int got;
    while (!s && (got = next_line(r)) != 0) {
        c.line = r->number + (got < 0 ? 1 : 0);
        if (got == -1)
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: longer than %d MiB (not a metrics file?)", path,
                            (long long)c.line, CREW_REPORT_MAX_LINE >> 20);
        else if (got == -2)
            s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", path, strerror(errno));
        else if (got == -3)
            s = CREW_OOM();
        else
            s = read_line(&c, r->line, r->len);
    }
    free(r->line);
    free(r);
    fclose(f);
    if (s) crew_report_data_free(d);
    return s;
}

double crew_report_bucket_step(const crew_report_data *d, int i)
{
    return (double)i * (double)d->bucket_steps + ((double)d->bucket_steps + 1) / 2;
}

/* ---------------------------------------------------------------- the page */

void crew_report_escape(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
        }
    }
}

/* label and the escaped value, when there is a value. */
static void labelled(FILE *f, const char *label, const char *value)
{
    if (!value[0]) return;
    fputs(label, f);
    crew_report_escape(f, value);
}

/* The model and data paths when the run line lacks them, from RUN_DIR/config.json (crew train
 * writes it). Only a nicety: a missing or unreadable file leaves them empty. */
static void read_config(const char *run_dir, crew_report_data *d)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", run_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return;
    buf[n] = '\0';
    cJSON *o = cJSON_Parse(buf);
    free(buf);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
    if (!d->model[0] && cJSON_IsString(model)) copy_str(d->model, sizeof d->model, model->valuestring);
    if (!d->data[0] && cJSON_IsString(data)) copy_str(d->data, sizeof d->data, data->valuestring);
    cJSON_Delete(o);
}

static const char page_style[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif;"
    "color:#222;background:#f6f6f4;margin:0}\n"
    "main{max-width:1040px;margin:0 auto;padding:12px 24px 40px}\n"
    "h1{font-size:22px;margin:6px 0 0}h2{font-size:17px;margin:26px 0 2px}\n"
    ".sub{color:#666;margin:0 0 10px;overflow-wrap:anywhere}.how{color:#555;margin:0 0 6px;font-size:13px}\n"
    ".facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:8px;margin:10px 0}\n"
    ".fact{background:#fff;border:1px solid #e0e0dc;border-radius:6px;padding:5px 10px}\n"
    ".fact b{display:block;font-size:18px;font-weight:600}.fact span{color:#666;font-size:12px}\n"
    ".note{background:#fff7e0;border-left:4px solid #e8a33d;padding:7px 12px;margin:8px 0}\n"
    ".warn{background:#fdecea;border-left:4px solid #c0392b;padding:7px 12px;margin:8px 0}\n"
    "svg{display:block;max-width:100%;height:auto}svg.chart,svg.fractions{width:100%}svg.chart{background:#fff;border:1px solid #e0e0dc;"
    "border-radius:6px;margin:6px 0}\n"
    "table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}\n"
    "th,td{border:1px solid #e0e0dc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#efefeb}\n"
    "td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\n"
    ".kind{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:12px;white-space:nowrap}\n"
    "footer{color:#888;font-size:12px;margin-top:30px}\n";

/* "12.3", or "–" when the number is missing. */
static const char *num(char *buf, size_t len, const char *fmt, double v)
{
    if (isnan(v)) snprintf(buf, len, "–");
    else snprintf(buf, len, fmt, v);
    return buf;
}

static const char *duration(char *buf, size_t len, double s)
{
    if (isnan(s) || s < 0) snprintf(buf, len, "–");
    else if (s < 60) snprintf(buf, len, "%.1f s", s);
    else if (s < 3600) snprintf(buf, len, "%dm %02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, len, "%dh %02dm", (int)fmin(s / 3600, 1e6), (int)fmod(s / 60, 60));
    return buf;
}

static void fact(FILE *f, const char *value, const char *label)
{
    fputs("<div class=\"fact\"><b>", f);
    crew_report_escape(f, value);
    fputs("</b><span>", f);
    crew_report_escape(f, label);
    fputs("</span></div>\n", f);
}

/* The final test figures: the summary's, else the last epoch's. */
static void final_test(const crew_report_data *d, double *acc, double *loss)
{
    *acc = d->sum_test_accuracy;
    *loss = d->sum_test_loss;
    if (d->n_epochs > 0 && isnan(*acc)) *acc = d->epochs_seen[d->n_epochs - 1].test_accuracy;
    if (d->n_epochs > 0 && isnan(*loss)) *loss = d->epochs_seen[d->n_epochs - 1].test_loss;
}

/* "3 (2 straggler, 1 input_bound)": the events by kind. */
static void event_counts(const crew_report_data *d, char *buf, size_t len)
{
    static const char *const names[8] = {"info", "straggler", "input_bound", "nan", "skipped_update",
                                         "loss_spike", "divergence", "hang"};
    size_t used = (size_t)snprintf(buf, len, "events");
    const char *sep = " (";
    for (int k = 0; k < 8 && used < len; k++) {
        if (!d->event_kinds[k]) continue;
        used += (size_t)snprintf(buf + used, len - used, "%s%lld %s", sep, (long long)d->event_kinds[k], names[k]);
        sep = ", ";
    }
    if (used < len && sep[0] == ',') snprintf(buf + used, len - used, ")");
}

static void write_facts(FILE *f, const crew_report_data *d)
{
    char a[64], b[64], t[160], label[200];
    double acc, loss;
    final_test(d, &acc, &loss);
    fputs("<div class=\"facts\">\n", f);
    fact(f, num(a, sizeof a, "%.4f", acc), "final test accuracy");
    fact(f, num(a, sizeof a, "%.4f", loss), "final test loss");
    fact(f, num(a, sizeof a, "%.0f", d->sum_samples_per_s), "training samples/s");
    double wall = d->sum_wall_s;
    if (isnan(wall) && !isnan(d->start_time) && !isnan(d->last_step_time)) wall = d->last_step_time - d->start_time;
    fact(f, duration(a, sizeof a, wall), d->has_summary ? "wall time" : "wall time, to the last step");
    snprintf(t, sizeof t, "%lld", (long long)(d->sum_steps >= 0 ? d->sum_steps : d->last_step));
    snprintf(label, sizeof label, "steps (of %lld planned)", (long long)d->total_steps);
    fact(f, t, d->total_steps >= 0 ? label : "steps");
    int64_t devices = d->devices >= 0 ? d->devices : d->replicas;
    snprintf(t, sizeof t, "%lld", (long long)devices);
    fact(f, t, "replicas");
    snprintf(t, sizeof t, "%lld", (long long)(d->sum_epochs >= 0 ? d->sum_epochs : d->total_epochs));
    snprintf(label, sizeof label, "epochs (of %lld planned)", (long long)d->epochs);
    fact(f, t, d->epochs >= 0 ? label : "epochs");
    snprintf(t, sizeof t, "%lld", (long long)d->global_batch);
    int used = snprintf(label, sizeof label, "global batch = %lld × %lld", (long long)devices,
                        (long long)d->batch_per_device);
    if (d->accumulation > 1 && used > 0 && (size_t)used < sizeof label)
        snprintf(label + used, sizeof label - (size_t)used, " × %lld accumulated", (long long)d->accumulation);
    fact(f, d->global_batch >= 0 ? t : "–", d->batch_per_device > 0 ? label : "global batch");
    snprintf(label, sizeof label, "peak learning rate (base %s, %lld warmup steps)", num(b, sizeof b, "%.3g", d->base_lr),
             (long long)(d->warmup_steps > 0 ? d->warmup_steps : 0));
    fact(f, num(a, sizeof a, "%.3g", d->scaled_lr), isnan(d->base_lr) ? "peak learning rate" : label);
    snprintf(t, sizeof t, "%lld", (long long)d->total_events);
    event_counts(d, label, sizeof label);
    fact(f, t, label);
    fputs("</div>\n", f);
}

static void write_header(FILE *f, const char *run_dir, const crew_report_data *d)
{
    fputs("<h1>crew training report</h1>\n<p class=\"sub\">", f);
    crew_report_escape(f, run_dir);
    labelled(f, " · model ", d->model);
    labelled(f, " · data ", d->data);
    if (!isnan(d->start_time) && d->start_time > 0 && d->start_time < 1e11) {
        time_t t = (time_t)d->start_time;
        struct tm tm;
        char when[64];
        if (gmtime_r(&t, &tm) && strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm))
            fprintf(f, " · started %s", when);
    }
    fputs("</p>\n", f);
    write_facts(f, d);
    if (d->bottleneck[0]) {
        fputs("<p class=\"note\"><b>Bottleneck:</b> ", f);
        crew_report_escape(f, d->bottleneck);
        fputs("</p>\n", f);
        crew_report_svg_fractions(f, d);
    }
    if (!d->has_summary)
        fputs("<p class=\"warn\">No summary line: the run did not finish (it may still be running, or it "
              "failed or was stopped). The report shows what was recorded.</p>\n", f);
    if (d->step_lines == 0) fputs("<p class=\"warn\">metrics.jsonl holds no steps: there is nothing to chart.</p>\n", f);
    if (d->skipped_steps > 0)
        fprintf(f, "<p class=\"warn\">%lld updates were skipped (NaN or infinite gradients).</p>\n",
                (long long)d->skipped_steps);
}

static void section(FILE *f, const char *title, const char *how)
{
    fprintf(f, "<h2>%s</h2>\n<p class=\"how\">%s</p>\n", title, how);
}

static void write_charts(FILE *f, const crew_report_data *d)
{
    char how[512];
    const char *per = d->bucket_steps > 1 ? "bucket" : "step";
    snprintf(how, sizeof how,
             "Training loss of each %s (the mean over its global batch%s), test loss at the end of each epoch; "
             "below it the learning rate applied. Markers above the plot are events.",
             per, d->bucket_steps > 1 ? "; the band spans the bucket's lowest and highest step" : "");
    section(f, "Loss and learning rate", how);
    crew_report_svg_loss(f, d);
    crew_report_svg_lr(f, d);
    section(f, "Throughput",
            "Training samples per second of step time; the thin line per point, the thick one a moving average. "
            "The dashed line is the whole run's figure.");
    crew_report_svg_throughput(f, d);
    section(f, "Where each step's time went",
            "Seconds per step, stacked: the mean over all replicas of each part. Exposed communication is the "
            "all-reduce time not hidden behind the backward pass. The black line is the step's wall time.");
    crew_report_svg_breakdown(f, d);
    section(f, "Per-replica compute time",
            "Forward + backward time of each replica, relative to the median replica of the same steps: "
            "red is slower, blue faster. Outlined cells hold a straggler event. Hover a cell for its figures.");
    crew_report_svg_heatmap(f, d);
}

static void write_events(FILE *f, const crew_report_data *d)
{
    fputs("<h2>Events</h2>\n", f);
    if (d->total_events == 0) {
        fputs("<p class=\"how\">No events: no straggler, input stall, NaN, loss spike or divergence was "
              "detected.</p>\n", f);
        return;
    }
    fputs("<table id=\"events\"><tr><th class=\"n\">step</th><th>kind</th><th class=\"n\">replica</th>"
          "<th>message</th></tr>\n", f);
    for (int i = 0; i < d->n_events; i++) {
        const crew_report_event *e = &d->events[i];
        if (e->step >= 0) fprintf(f, "<tr><td class=\"n\">%lld</td>", (long long)e->step);
        else fputs("<tr><td class=\"n\">–</td>", f);
        fprintf(f, "<td><span class=\"kind\" style=\"background:%s\">", crew_report_kind_colour(e->kind));
        crew_report_escape(f, e->kind);
        if (e->rank >= 0) fprintf(f, "</span></td><td class=\"n\">%d</td><td>", e->rank);
        else fputs("</span></td><td class=\"n\">all</td><td>", f);
        crew_report_escape(f, e->message);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
    if (d->total_events > d->n_events)
        fprintf(f, "<p class=\"how\">… and %lld more events (the table keeps the first %d).</p>\n",
                (long long)(d->total_events - d->n_events), CREW_REPORT_MAX_EVENTS);
}

static void write_epochs(FILE *f, const crew_report_data *d)
{
    char v[8][48];
    fputs("<h2>Epochs</h2>\n", f);
    if (d->n_epochs == 0) {
        fputs("<p class=\"how\">No epoch finished.</p>\n", f);
        return;
    }
    fputs("<table id=\"epochs\"><tr><th class=\"n\">epoch</th><th class=\"n\">steps</th><th class=\"n\">train loss</th>"
          "<th class=\"n\">train accuracy</th><th class=\"n\">test loss</th><th class=\"n\">test accuracy</th>"
          "<th class=\"n\">wall time</th><th class=\"n\">samples/s</th></tr>\n", f);
    for (int i = 0; i < d->n_epochs; i++) {
        const crew_report_epoch *e = &d->epochs_seen[i];
        fprintf(f, "<tr><td class=\"n\">%s</td><td class=\"n\">%s</td>", num(v[0], 48, "%.0f", e->epoch + 1.0),
                num(v[1], 48, "%.0f", e->steps >= 0 ? (double)e->steps : NAN));
        fprintf(f, "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>",
                num(v[2], 48, "%.4f", e->train_loss), num(v[3], 48, "%.4f", e->train_accuracy),
                num(v[4], 48, "%.4f", e->test_loss), num(v[5], 48, "%.4f", e->test_accuracy));
        fprintf(f, "<td class=\"n\">%s</td><td class=\"n\">%s</td></tr>\n", duration(v[6], 48, e->wall_s),
                num(v[7], 48, "%.0f", e->samples_per_s));
    }
    fputs("</table>\n", f);
    if (d->total_epochs > d->n_epochs)
        fprintf(f, "<p class=\"how\">… and %lld more epochs.</p>\n", (long long)(d->total_epochs - d->n_epochs));
}

static void write_page(FILE *f, const char *run_dir, const crew_report_data *d)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>crew report: ", f);
    crew_report_escape(f, run_dir);
    fprintf(f, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<main>\n", page_style);
    write_header(f, run_dir, d);
    write_charts(f, d);
    write_events(f, d);
    write_epochs(f, d);
    fputs("<footer>Written by crew report", f);
    labelled(f, " from a run of crew ", d->version);
    fputs(" · the source is metrics.jsonl in the run directory (docs/METRICS.md).</footer>\n"
          "</main>\n</body>\n</html>\n", f);
}

/* Writes the page into tmp, flushed to disk; the caller renames it. */
static crew_status write_file(const char *tmp, const char *run_dir, const crew_report_data *d)
{
    FILE *f = fopen(tmp, "w");
    if (!f) return crew_errorf(CREW_CODE_IO, "cannot create %s: %s", tmp, strerror(errno));
    write_page(f, run_dir, d);
    int bad = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int err = errno;
    if (fclose(f) != 0 && !bad) bad = 1, err = errno;
    if (bad) return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", tmp, strerror(err));
    return CREW_OK;
}

crew_status crew_report_write(const char *run_dir, const char *out_path)
{
    if (!run_dir || !*run_dir) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_report_write: no run directory");
    char metrics[4096], out[4096], tmp[4200];
    if ((size_t)snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir) >= sizeof metrics ||
        (size_t)snprintf(out, sizeof out, "%s", out_path ? out_path : "") >= sizeof out)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_report_write: path too long");
    if (!out_path) snprintf(out, sizeof out, "%s/report.html", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());

    crew_report_data *d = malloc(sizeof *d);
    if (!d) return CREW_OOM();
    crew_status s = crew_report_read(metrics, d);
    if (s) {
        free(d);
        return s;
    }
    read_config(run_dir, d);
    s = write_file(tmp, run_dir, d);
    if (!s && rename(tmp, out) != 0)
        s = crew_errorf(CREW_CODE_IO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
    if (s) unlink(tmp);
    crew_report_data_free(d);
    free(d);
    return s;
}
