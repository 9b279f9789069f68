/* report_read.c — the reading half of crew report: RUN_DIR/metrics.jsonl (docs/METRICS.md), line
 * by line, into the bounded crew_report_data of report.h, and the model and data paths from
 * RUN_DIR/config.json. Nothing here writes HTML: report.c draws the page from what this fills in.
 *
 * Memory stays bounded however long or malformed the file is: lines are capped at
 * CREW_REPORT_MAX_LINE bytes, steps are summed into at most CREW_REPORT_BUCKETS buckets, and only
 * the first CREW_REPORT_MAX_EVENTS events and CREW_REPORT_MAX_EPOCHS epochs are kept. */
#include "telemetry/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "telemetry/monitor.h"

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

/* The index of kind in event_kinds: its crew_event_kind, the names being the ones the monitor
 * writes; an unknown kind (a newer writer's) counts as info. */
static int kind_index(const char *kind)
{
    for (int i = 0; i < 8; i++)
        if (!strcmp(kind, crew_event_kind_name((crew_event_kind)i))) return i;
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

/* ---------------------------------------------------------------- config.json */

/* The model and data paths when the run line lacks them, from RUN_DIR/config.json (crew train
 * writes it). Only a nicety: a missing or unreadable file leaves them empty. */
void crew_report_read_config(const char *run_dir, crew_report_data *d)
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
