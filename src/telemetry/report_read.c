/* report_read.c — the reading half of crew report: RUN_DIR/metrics.jsonl (docs/METRICS.md), line
 * by line, into the bounded crew_report_data of report.h, and the model and data paths from
 * RUN_DIR/config.json. Nothing here writes HTML: report.c draws the page from what this fills in.
 *
 * Memory stays bounded however long or malformed the file is: lines are capped at
 * CREW_REPORT_MAX_LINE bytes, steps are summed into at most CREW_REPORT_BUCKETS buckets, and only
 * the first CREW_REPORT_MAX_EVENTS events and CREW_REPORT_MAX_EPOCHS epochs are kept, and of the
 * pipeline lines only the last, with at most CREW_REPORT_MAX_OPS of its passes. */
#include "telemetry/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "telemetry/monitor.h"

/* Step numbers above this would lose integer precision in a JSON double. */
#define MAX_STEP 9007199254740992.0

/* ---------------------------------------------------------------- reading lines */

/* Lines of a file, each at most CREW_REPORT_MAX_LINE bytes, without reading more than that into
 * memory however the file looks (one endless line of binary data included), and no further than
 * `limit` bytes into the file. */
typedef struct line_reader {
    FILE *f;
    char chunk[65536];
    size_t pos, end;
    char *line; /* [cap]: the current line, NUL-terminated */
    size_t len, cap;
    int64_t number;    /* 1-based number of the current line */
    int terminated;    /* the current line ended with a newline (else it is the file's last) */
    uint64_t consumed; /* bytes read from the file */
    uint64_t limit;    /* UINT64_MAX: to the end */
    int err;           /* errno of a failed read, taken at the read */
} line_reader;

/* 1: a line is in r->line; 0: end of file; -1: a line too long; -2: a read error; -3: no memory. */
static int next_line(line_reader *r)
{
    r->len = 0;
    r->terminated = 0;
    int got_any = 0;
    for (;;) {
        if (r->pos == r->end) {
            size_t want = sizeof r->chunk;
            if (r->limit - r->consumed < want) want = (size_t)(r->limit - r->consumed);
            r->end = want ? fread(r->chunk, 1, want, r->f) : 0;
            if (want && r->end < want && ferror(r->f)) {
                r->err = errno;
                return -2;
            }
            r->consumed += r->end;
            r->pos = 0;
            if (r->end == 0) {
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
        if (nl) {
            r->terminated = 1;
            break;
        }
    }
    r->line[r->len] = '\0';
    r->number++;
    return 1;
}

/* A line as JSON. A line that is not JSON but holds a line of ours after a torn start
 * ({"type":... cut off, then {"type":... whole: earlier builds appended a resumed run's lines after
 * a killed run's half-written one) gives the whole line; *salvaged says so. NULL when it is not
 * JSON at all, *err_at then the offset where parsing stopped. crew's lines hold {"type": only at
 * their start (a quote inside a string is escaped), so only its next occurrence is tried: a
 * hostile line of them costs two parses, not one per occurrence. */
static cJSON *parse_line(const char *text, size_t len, int *salvaged, size_t *err_at)
{
    static const char start[] = "{\"type\":";
    const char *end = NULL;
    *salvaged = 0;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 1);
    *err_at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
    if (o || len < sizeof start || memcmp(text, start, sizeof start - 1) != 0) return o;
    const char *p = strstr(text + 1, start);
    cJSON *rest = p ? cJSON_ParseWithOpts(p, NULL, 1) : NULL;
    if (cJSON_IsObject(rest)) {
        *salvaged = 1;
        return rest;
    }
    cJSON_Delete(rest);
    return NULL;
}

/* ---------------------------------------------------------------- typed values */

typedef struct read_ctx {
    const char *path;
    int64_t line;
    crew_report_data *d;
    /* Steps above this were run again after a later restart: this line's figures about them are
     * replaced by later lines (INT64_MAX: none). */
    int64_t cutoff;
    int64_t raw_step;  /* the step of the latest step line, replaced or not */
    /* "ops[3]: " while reading an object nested in the line, so that a message names it; NULL
     * for the line's own keys */
    const char *within;
} read_ctx;

static const char *within(const read_ctx *c) { return c->within ? c->within : ""; }

/* The number under key: NaN when absent, null or not finite (1e999); an error for other types. */
static crew_status get_num(const read_ctx *c, const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NAN;
    if (!v || cJSON_IsNull(v)) return CREW_OK;
    if (!cJSON_IsNumber(v))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: %s\"%s\" is not a number", c->path, (long long)c->line,
                           within(c), key);
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
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: %s\"%s\" must be an integer in [%.0f, %.0f]",
                           c->path, (long long)c->line, within(c), key, lo, hi);
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
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: %s\"%s\" is not a string", c->path, (long long)c->line,
                           within(c), key);
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
    dst->noise_sum += src->noise_sum;
    dst->noise_n += src->noise_n;
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

static crew_status read_step(read_ctx *c, const cJSON *o)
{
    crew_report_data *d = c->d;
    int64_t step, batch;
    double loss, lr, step_s, time;
    CREW_TRY(get_int(c, o, "step", 1, MAX_STEP, 1, 0, &step));
    c->raw_step = step;
    CREW_TRY(get_int(c, o, "global_batch", 0, MAX_STEP, 0, -1, &batch));
    CREW_TRY(get_num(c, o, "loss", &loss));
    CREW_TRY(get_num(c, o, "lr", &lr));
    double noise = NAN;
    CREW_TRY(get_num(c, o, "noise_scale", &noise));
    CREW_TRY(get_num(c, o, "step_s", &step_s));
    CREW_TRY(get_num(c, o, "time", &time));
    const cJSON *reps = cJSON_GetObjectItemCaseSensitive(o, "replicas");
    if (reps && !cJSON_IsNull(reps) && !cJSON_IsArray(reps))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: \"replicas\" is not an array", c->path,
                           (long long)c->line);
    if (batch < 0) batch = d->global_batch;
    if (step > c->cutoff) { /* run again after a restart: the later line counts */
        d->replaced_lines++;
        return CREW_OK;
    }

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
    if (isfinite(noise)) {
        k->noise_sum += noise;
        k->noise_n++;
        d->last_noise = noise;
        d->noise_batch = batch;
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
    crew_report_epoch e = {.end_step = d->recent_step};
    int64_t epoch;
    CREW_TRY(get_int(c, o, "epoch", 0, 1e9, 0, -1, &epoch));
    e.epoch = (int)epoch;
    CREW_TRY(get_int(c, o, "steps", 0, MAX_STEP, 0, -1, &e.steps));
    CREW_TRY(get_num(c, o, "train_loss", &e.train_loss));
    CREW_TRY(get_num(c, o, "train_accuracy", &e.train_accuracy));
    CREW_TRY(get_num(c, o, "test_loss", &e.test_loss));
    CREW_TRY(get_num(c, o, "test_accuracy", &e.test_accuracy));
    CREW_TRY(get_num(c, o, "test_bits", &e.test_bits));
    CREW_TRY(get_num(c, o, "wall_s", &e.wall_s));
    CREW_TRY(get_num(c, o, "samples_per_s", &e.samples_per_s));
    if (c->raw_step > c->cutoff) { /* it ended after the checkpoint a later run restarted from */
        d->replaced_lines++;
        return CREW_OK;
    }
    d->total_epochs++;
    if (d->n_epochs >= CREW_REPORT_MAX_EPOCHS) return CREW_OK;
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
    if (e.step > c->cutoff) { /* about a step that was run again */
        d->replaced_lines++;
        return CREW_OK;
    }
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
    if (c->cutoff != INT64_MAX) { /* the run went on after it: a later summary, or none, counts */
        d->replaced_lines++;
        return CREW_OK;
    }
    d->has_summary = 1;
    CREW_TRY(get_int(c, o, "steps", 0, MAX_STEP, 0, -1, &d->sum_steps));
    CREW_TRY(get_int(c, o, "epochs", 0, MAX_STEP, 0, -1, &d->sum_epochs));
    CREW_TRY(get_int(c, o, "skipped_updates", 0, MAX_STEP, 0, -1, &d->sum_skipped));
    CREW_TRY(get_num(c, o, "wall_s", &d->sum_wall_s));
    CREW_TRY(get_num(c, o, "samples_per_s", &d->sum_samples_per_s));
    CREW_TRY(get_num(c, o, "gflops", &d->sum_gflops));
    CREW_TRY(get_num(c, o, "peak_fraction", &d->sum_peak_fraction));
    CREW_TRY(get_num(c, o, "test_accuracy", &d->sum_test_accuracy));
    CREW_TRY(get_num(c, o, "test_loss", &d->sum_test_loss));
    for (int i = 0; i < 4; i++) CREW_TRY(get_num(c, o, fractions[i], &d->sum_fraction[i]));
    CREW_TRY(get_str(c, o, "bottleneck", &bottleneck));
    CREW_TRY(get_str(c, o, "message", &message));
    copy_str(d->bottleneck, sizeof d->bottleneck, bottleneck ? bottleneck : message);
    return CREW_OK;
}

/* A resume line: its figures were taken in the first reading (scan_restarts); here its types are
 * checked, like every other line's. */
static crew_status read_resume(const read_ctx *c, const cJSON *o)
{
    int64_t v;
    const char *message;
    CREW_TRY(get_int(c, o, "checkpoint_step", 0, MAX_STEP, 0, -1, &v));
    CREW_TRY(get_int(c, o, "logged_through", 0, MAX_STEP, 0, -1, &v));
    CREW_TRY(get_str(c, o, "message", &message));
    return CREW_OK;
}

/* ---------------------------------------------------------------- pipeline lines */

/* ops[index] of a pipeline line of `stages` stages and `micro_batches` micro-batches, into *op. */
static crew_status read_op(const read_ctx *c, const cJSON *item, int index, int stages, int micro_batches,
                           crew_report_op *op)
{
    if (!cJSON_IsObject(item))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: ops[%d] is not an object", c->path, (long long)c->line,
                           index);
    char where[32];
    snprintf(where, sizeof where, "ops[%d]: ", index);
    read_ctx in_op = *c;
    in_op.within = where;
    int64_t stage, micro;
    const char *pass;
    CREW_TRY(get_int(&in_op, item, "stage", 0, stages - 1, 1, 0, &stage));
    CREW_TRY(get_int(&in_op, item, "micro", 0, micro_batches - 1, 1, 0, &micro));
    CREW_TRY(get_str(&in_op, item, "pass", &pass));
    if (!pass || (strcmp(pass, "forward") && strcmp(pass, "backward")))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: %s\"pass\" must be \"forward\" or \"backward\"", c->path,
                           (long long)c->line, where);
    CREW_TRY(get_num(&in_op, item, "start_s", &op->start_s));
    CREW_TRY(get_num(&in_op, item, "end_s", &op->end_s));
    if (op->end_s < op->start_s) /* (false when either is missing) */
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: %s\"end_s\" %g is before \"start_s\" %g", c->path,
                           (long long)c->line, where, op->end_s, op->start_s);
    op->stage = (int16_t)stage;
    op->micro = (int32_t)micro;
    op->backward = pass[0] == 'b';
    return CREW_OK;
}

/* The "ops" of a pipeline line (an array, or absent or null: none), every one checked; the first
 * CREW_REPORT_MAX_OPS go into keep[] unless keep is NULL (a line that is not kept). */
static crew_status read_ops(const read_ctx *c, const cJSON *ops, crew_report_op *keep, crew_report_pipeline *p)
{
    p->n_ops = p->total_ops = 0;
    if (!ops || cJSON_IsNull(ops)) return CREW_OK;
    if (!cJSON_IsArray(ops))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: \"ops\" is not an array", c->path, (long long)c->line);
    /* Each micro-batch passes each stage once forward and once backward: more is not one step. */
    int64_t most = 2 * (int64_t)p->stages * p->micro_batches, total = cJSON_GetArraySize(ops);
    if (total > most)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s line %lld: \"ops\" holds %lld passes, more than 2 × %d stages × %d micro-batches",
                           c->path, (long long)c->line, (long long)total, p->stages, p->micro_batches);
    int index = 0;
    for (const cJSON *item = ops->child; item; item = item->next, index++) {
        crew_report_op op;
        CREW_TRY(read_op(c, item, index, p->stages, p->micro_batches, &op));
        if (keep && p->n_ops < CREW_REPORT_MAX_OPS) keep[p->n_ops++] = op;
    }
    p->total_ops = index;
    return CREW_OK;
}

/* A pipeline line: checked whole, and kept in place of the one before unless a restart replaced
 * it (its step was run again). */
static crew_status read_pipeline(const read_ctx *c, const cJSON *o)
{
    crew_report_data *d = c->d;
    crew_report_pipeline p = {.line = c->line};
    int64_t stages, micro_batches, replicas, slowest;
    const char *schedule;
    CREW_TRY(get_int(c, o, "step", 1, MAX_STEP, 0, -1, &p.step));
    CREW_TRY(get_int(c, o, "stages", 1, CREW_REPORT_MAX_STAGES, 1, 0, &stages));
    CREW_TRY(get_int(c, o, "micro_batches", 1, CREW_REPORT_MAX_MICRO, 1, 0, &micro_batches));
    CREW_TRY(get_int(c, o, "replicas", 1, CREW_REPORT_MAX_REPLICAS, 0, -1, &replicas));
    CREW_TRY(get_int(c, o, "slowest_stage", 0, (double)stages - 1, 0, -1, &slowest));
    CREW_TRY(get_str(c, o, "schedule", &schedule));
    CREW_TRY(get_num(c, o, "ideal_bubble", &p.ideal_bubble));
    CREW_TRY(get_num(c, o, "bubble", &p.bubble));
    CREW_TRY(get_num(c, o, "step_s", &p.step_s));
    p.stages = (int)stages;
    p.micro_batches = (int)micro_batches;
    p.replicas = (int)replicas;
    p.slowest_stage = (int)slowest;
    copy_str(p.schedule, sizeof p.schedule, schedule);

    int replaced = p.step > c->cutoff;
    const cJSON *ops = cJSON_GetObjectItemCaseSensitive(o, "ops");
    if (!replaced && cJSON_GetArraySize(ops) > 0 && !d->pipeline.ops) {
        d->pipeline.ops = malloc(sizeof *d->pipeline.ops * CREW_REPORT_MAX_OPS);
        if (!d->pipeline.ops) return CREW_OOM();
    }
    /* The ops of the line kept before are overwritten as this one is read: an error releases all. */
    CREW_TRY(read_ops(c, ops, replaced ? NULL : d->pipeline.ops, &p));
    if (replaced) {
        d->replaced_lines++;
        return CREW_OK;
    }
    p.ops = d->pipeline.ops;
    d->pipeline = p;
    d->pipeline_lines++;
    return CREW_OK;
}

/* One line: blank lines are skipped, lines of unknown type ignored (newer writers may add some).
 * `last` says that it is the file's last line and lacks its newline. */
static crew_status read_line(read_ctx *c, const char *text, size_t len, int last)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) i++;
    if (i == len) return CREW_OK;
    if (memchr(text, '\0', len))
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: holds a NUL byte (not a text file?)", c->path,
                           (long long)c->line);
    int salvaged;
    size_t err_at;
    cJSON *o = parse_line(text, len, &salvaged, &err_at);
    if (!o && last) { /* being written, or cut off by a crash: not a line yet */
        c->d->torn_bytes = (int64_t)len;
        return CREW_OK;
    }
    if (!o)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: not valid JSON (at column %lld)", c->path,
                           (long long)c->line, (long long)err_at + 1);
    if (salvaged && !c->d->torn_lines++) c->d->first_torn_line = c->line;
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
        else if (!strcmp(type, "resume")) s = read_resume(c, o);
        else if (!strcmp(type, "pipeline")) s = read_pipeline(c, o);
    }
    cJSON_Delete(o);
    return s;
}

/* ---------------------------------------------------------------- restarts (the first reading) */

/* The restarts of a file, each as the line of its run line and the checkpoint's step: every line
 * before it about a later step was run again, and later lines replace it. */
typedef struct restart {
    int64_t line, cutoff;
} restart;

typedef struct restart_scan {
    const char *path;
    crew_report_data *d;
    restart *list;
    int n, cap;
    int64_t max_step;          /* over every step line so far */
    /* the run (segment) being read: from its run line to the next */
    int64_t seg_line;          /* -1: no run line yet */
    int64_t seg_max_before;    /* max_step when it started */
    int64_t seg_first_step;    /* its first step line's step, -1: none yet */
    int64_t seg_checkpoint;    /* from its resume line, -1: none (or null) */
    int seg_resume_line;       /* it has a resume line */
    char seg_message[400];
} restart_scan;

static crew_status end_segment(restart_scan *r)
{
    if (r->seg_line < 0) return CREW_OK;
    int64_t ckpt = r->seg_checkpoint;
    int implied = 0;
    if (ckpt < 0 && r->seg_first_step >= 1 && r->seg_first_step <= r->seg_max_before) {
        ckpt = r->seg_first_step - 1; /* no resume line (an older crew), but a logged step came again */
        implied = 1;
    }
    crew_report_data *d = r->d;
    if (r->seg_resume_line || implied) {
        d->total_resumes++;
        if (d->n_resumes < CREW_REPORT_MAX_RESUMES) {
            crew_report_resume *e = &d->resumes[d->n_resumes++];
            e->line = r->seg_line;
            e->checkpoint_step = ckpt;
            if (implied)
                snprintf(e->message, sizeof e->message,
                         "restarted from step %lld: steps %lld-%lld were logged twice (this file has no resume line; "
                         "an older crew wrote it), and the later lines are shown",
                         (long long)ckpt, (long long)ckpt + 1, (long long)r->seg_max_before);
            else
                snprintf(e->message, sizeof e->message, "%s", r->seg_message[0] ? r->seg_message : "resumed");
        }
    }
    if (ckpt < 0) return CREW_OK;
    if (r->n == CREW_REPORT_MAX_RESTARTS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: more than %d restarts (not a metrics file?)", r->path,
                           CREW_REPORT_MAX_RESTARTS);
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        restart *l = realloc(r->list, sizeof *l * (size_t)cap);
        if (!l) return CREW_OOM();
        r->list = l;
        r->cap = cap;
    }
    r->list[r->n++] = (restart){r->seg_line, ckpt};
    return CREW_OK;
}

static void start_segment(restart_scan *r, int64_t line)
{
    r->seg_line = line;
    r->seg_max_before = r->max_step;
    r->seg_first_step = r->seg_checkpoint = -1;
    r->seg_resume_line = 0;
    r->seg_message[0] = '\0';
}

static void saw_step(restart_scan *r, int64_t step)
{
    if (r->seg_first_step < 0) r->seg_first_step = step;
    if (step > r->max_step) r->max_step = step;
}

/* A whole integer at key in [0, MAX_STEP], or -1. */
static int64_t int_at(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > MAX_STEP || v->valuedouble != floor(v->valuedouble))
        return -1;
    return (int64_t)v->valuedouble;
}

/* One line of the first reading. Lines that are not JSON are left for the second to report. */
static crew_status scan_line(restart_scan *r, int64_t number, const char *text, size_t len)
{
    static const char step_start[] = "{\"type\":\"step\",\"step\":"; /* how crew writes them */
    size_t k = sizeof step_start - 1;
    /* (A torn step line with a run line appended to it starts the same way: parse_line below.) */
    if (len > k && !memcmp(text, step_start, k) && text[k] >= '1' && text[k] <= '9' && !strstr(text + 1, "{\"type\":")) {
        int64_t step = 0;
        for (size_t i = k; i < len && i < k + 16 && text[i] >= '0' && text[i] <= '9'; i++) step = step * 10 + (text[i] - '0');
        saw_step(r, step);
        return CREW_OK;
    }
    /* Only run, resume and step lines matter here, and JSON strings escape their quotes, so a line
     * without these quoted words cannot be one. */
    if (!strstr(text, "\"run\"") && !strstr(text, "\"resume\"") && !strstr(text, "\"step\"")) return CREW_OK;
    if (memchr(text, '\0', len)) return CREW_OK;
    int salvaged;
    size_t err_at;
    cJSON *o = parse_line(text, len, &salvaged, &err_at);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    crew_status s = CREW_OK;
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "run")) {
        s = end_segment(r);
        start_segment(r, number);
    } else if (cJSON_IsString(type) && !strcmp(type->valuestring, "resume")) {
        if (r->seg_line < 0) start_segment(r, number);
        r->seg_resume_line = 1;
        r->seg_checkpoint = int_at(o, "checkpoint_step");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "message");
        if (cJSON_IsString(m)) snprintf(r->seg_message, sizeof r->seg_message, "%s", m->valuestring);
    } else if (cJSON_IsString(type) && !strcmp(type->valuestring, "step")) {
        int64_t step = int_at(o, "step");
        if (step >= 1) saw_step(r, step);
    }
    cJSON_Delete(o);
    return s;
}

/* The first reading: the restarts, and how many bytes the second reading is to take. */
static crew_status scan_restarts(line_reader *lr, restart_scan *r, uint64_t *bytes)
{
    crew_status s = CREW_OK;
    int got;
    *bytes = UINT64_MAX;
    while (!s && (got = next_line(lr)) != 0) {
        if (got == -3) return CREW_OOM();
        if (got == -2) return crew_errorf(CREW_CODE_IO, "%s: read failed: %s", r->path, strerror(lr->err));
        if (got == -1) return CREW_OK; /* too long: the second reading, not limited, says so at this line */
        s = scan_line(r, lr->number, lr->line, lr->len);
    }
    if (!s) s = end_segment(r);
    *bytes = lr->consumed;
    return s;
}

static void data_init(crew_report_data *d)
{
    memset(d, 0, sizeof *d);
    d->start_time = d->base_lr = d->scaled_lr = d->last_step_time = d->last_noise = NAN;
    d->devices = d->batch_per_device = d->accumulation = d->global_batch = -1;
    d->steps_per_epoch = d->total_steps = d->epochs = d->warmup_steps = -1;
    d->sum_steps = d->sum_epochs = d->sum_skipped = -1;
    d->sum_wall_s = d->sum_samples_per_s = d->sum_test_accuracy = d->sum_test_loss = NAN;
    d->sum_gflops = d->sum_peak_fraction = NAN;
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
    free(d->pipeline.ops);
    d->pipeline.ops = NULL;
    d->pipeline_lines = 0;
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
    line_reader *lr = calloc(1, sizeof *lr);
    if (!lr) {
        fclose(f);
        return CREW_OOM();
    }
    lr->f = f;
    lr->limit = UINT64_MAX;
    restart_scan rs = {.path = path, .d = d, .seg_line = -1};
    uint64_t bytes = 0;
    crew_status s = scan_restarts(lr, &rs, &bytes);
    /* Suffix minima: a line is replaced above the lowest checkpoint of the restarts after it. */
    for (int i = rs.n - 2; i >= 0; i--)
        if (rs.list[i + 1].cutoff < rs.list[i].cutoff) rs.list[i].cutoff = rs.list[i + 1].cutoff;

    if (!s && fseek(f, 0, SEEK_SET) != 0) s = crew_errorf(CREW_CODE_IO, "%s: cannot read it again: %s", path, strerror(errno));
    char *keep_line = lr->line;
    size_t keep_cap = lr->cap;
    memset(lr, 0, sizeof *lr);
    lr->f = f;
    lr->line = keep_line;
    lr->cap = keep_cap;
    lr->limit = bytes; /* the same bytes as the first reading, however far the writer has gone since */
    read_ctx c = {path, 0, d, INT64_MAX, 0, NULL};
    int next = 0, got;
    while (!s && (got = next_line(lr)) != 0) {
        c.line = lr->number + (got < 0 ? 1 : 0);
        while (next < rs.n && rs.list[next].line <= c.line) next++;
        c.cutoff = next < rs.n ? rs.list[next].cutoff : INT64_MAX;
        if (got == -1)
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s line %lld: longer than %d MiB (not a metrics file?)", path,
                            (long long)c.line, CREW_REPORT_MAX_LINE >> 20);
        else if (got == -2)
            s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", path, strerror(lr->err));
        else if (got == -3)
            s = CREW_OOM();
        else
            s = read_line(&c, lr->line, lr->len, !lr->terminated);
    }
    free(rs.list);
    free(lr->line);
    free(lr);
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

crew_status crew_run_noise_scale(const char *run_dir, double *noise_scale, int64_t *global_batch)
{
    if (!run_dir || !noise_scale || !global_batch)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_run_noise_scale: NULL argument");
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir) >= sizeof path)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", run_dir);
    crew_report_data d;
    CREW_TRY(crew_report_read(path, &d));
    *noise_scale = d.last_noise;
    *global_batch = d.noise_batch;
    crew_report_data_free(&d);
    if (!isfinite(*noise_scale) || *global_batch <= 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s holds no gradient noise scale (a run of one micro-batch a step, "
                           "--noise-scale-every 0, or one that ended before its smoothed |G|^2 was positive)", path);
    return CREW_OK;
}
