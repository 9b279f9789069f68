/* test_report.c — crew_report_write: a synthetic metrics.jsonl (2 replicas, 200 steps, replica 1
 * slow over steps 101-150 and reported as a straggler, epoch lines, a summary) becomes a page with
 * the five charts, the event, the bottleneck and the epochs, well-formed and without a NaN in any
 * coordinate; long runs are downsampled so the page stays small; a pipelined run's last pipeline
 * line becomes a timeline of its passes; and every kind of bad input is an error naming the file
 * and line, never a crash or a half-written report. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ctype.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "telemetry/report.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

#define STRAGGLER_MSG "replica 1 was 31% slower than the median of the others over steps 101-150"
#define BOTTLENECK "compute-bound: forward and backward took 81% of each step"

/* A fresh run directory tmp_dir/name (emptied first). */
static const char *run_dir(const char *name)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    nftw(path, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    mkdir(path, 0755);
    return path;
}

static FILE *open_metrics(const char *dir)
{
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) perror(path);
    return f;
}

static void write_step(FILE *f, int64_t step, int replicas)
{
    double slow = step > 100 && step <= 150 ? 1.31 : 1.0;
    fprintf(f, "{\"type\":\"step\",\"step\":%lld,\"epoch\":%d,\"time\":%.3f,\"loss\":%.5f,\"accuracy\":0.5,"
               "\"lr\":%.6f,\"global_batch\":128,\"step_s\":0.08,\"samples_per_s\":1600,\"replicas\":[",
            (long long)step, (int)((step - 1) / 100), 1764504000.0 + 0.08 * (double)step, 2.0 / (1 + 0.02 * (double)step),
            step < 50 ? 0.001 * (double)step / 50 : 0.001);
    for (int r = 0; r < replicas; r++)
        fprintf(f, "%s{\"rank\":%d,\"data_s\":0.002,\"forward_s\":%.4f,\"backward_s\":%.4f,\"comm_exposed_s\":0.004,"
                   "\"comm_hidden_s\":0.002,\"optimizer_s\":0.003,\"future_key\":[1,2]}",
                r ? "," : "", r, 0.02 * (r == 1 ? slow : 1), 0.045 * (r == 1 ? slow : 1));
    fputs("]}\n", f);
}

/* The synthetic run: `steps` steps on `replicas` replicas, epochs of 100 steps. */
static void write_run(const char *dir, int64_t steps, int replicas)
{
    FILE *f = open_metrics(dir);
    if (!f) return;
    fprintf(f, "{\"type\":\"run\",\"time\":1764504000.1,\"crew_version\":\"0.1.0\",\"model\":\"examples/fashion_cnn.json\","
               "\"data\":\"data/fm\",\"devices\":%d,\"batch_per_device\":64,\"accumulation\":1,\"global_batch\":128,"
               "\"steps_per_epoch\":100,\"total_steps\":%lld,\"epochs\":2,\"base_lr\":0.001,\"scaled_lr\":0.001,"
               "\"warmup_steps\":50,\"a_new_key\":{\"x\":1}}\n",
            replicas, (long long)steps);
    for (int64_t s = 1; s <= steps; s++) {
        write_step(f, s, replicas);
        if (s == 150)
            fprintf(f, "{\"type\":\"event\",\"step\":150,\"kind\":\"straggler\",\"rank\":1,\"value\":1.31,"
                       "\"message\":\"%s\"}\n"
                       "{\"type\":\"event\",\"step\":160,\"kind\":\"loss_spike\",\"rank\":null,\"value\":null,"
                       "\"message\":\"loss <script>alert(1)</script> & spike\"}\n",
                    STRAGGLER_MSG);
        if (s % 100 == 0)
            fprintf(f, "{\"type\":\"epoch\",\"epoch\":%d,\"steps\":100,\"train_loss\":0.52,\"train_accuracy\":0.81,"
                       "\"test_loss\":%.3f,\"test_accuracy\":0.867,\"wall_s\":8.1,\"samples_per_s\":1580.0}\n",
                    (int)(s / 100 - 1), 0.4 - 0.05 * (double)(s / 100));
    }
    fprintf(f, "{\"type\":\"a_later_type\",\"x\":1}\n\n");
    fprintf(f, "{\"type\":\"summary\",\"steps\":%lld,\"epochs\":2,\"wall_s\":16.2,\"samples_per_s\":1580.3,"
               "\"test_accuracy\":0.912,\"test_loss\":0.25,\"data_fraction\":0.03,\"compute_fraction\":0.81,"
               "\"comm_exposed_fraction\":0.05,\"optimizer_fraction\":0.04,\"skipped_updates\":0,\"events\":2,"
               "\"bottleneck\":\"%s\"}\n",
            (long long)steps, BOTTLENECK);
    fclose(f);
}

/* The whole file in a NUL-terminated buffer (caller frees), or NULL. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

/* strstr by hand: ASan's strstr measures the whole rest of the haystack at every call, which makes
 * a scan from hit to hit quadratic on the pages of megabytes that pipelines give. */
static const char *find(const char *hay, const char *needle)
{
    size_t k = strlen(needle);
    for (const char *p = hay; *p; p++)
        if (*p == *needle && !strncmp(p, needle, k)) return p;
    return NULL;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = find(hay, needle); p; p = find(p + 1, needle)) n++;
    return n;
}

/* The text of <svg ... id="id" ...> ... </svg> (caller frees), or NULL. */
static char *svg_element(const char *html, const char *id)
{
    char key[64];
    snprintf(key, sizeof key, "<svg class=\"chart\" id=\"%s\"", id);
    const char *start = strstr(html, key);
    const char *end = start ? strstr(start, "</svg>") : NULL;
    if (!end) return NULL;
    return strndup(start, (size_t)(end - start) + 6);
}

/* No attribute holding coordinates says nan or inf: every number drawn is finite. */
static int coordinates_finite(const char *html)
{
    static const char *const attrs[] = {" x=\"", " y=\"", " x1=\"", " x2=\"", " y1=\"", " y2=\"", " cx=\"", " cy=\"",
                                        " r=\"", " width=\"", " height=\"", " d=\"", " viewBox=\"", " transform=\""};
    for (size_t a = 0; a < sizeof attrs / sizeof attrs[0]; a++) {
        for (const char *p = find(html, attrs[a]); p; p = find(p + 1, attrs[a])) {
            const char *v = p + strlen(attrs[a]), *end = strchr(v, '"');
            if (!end) return 0;
            for (const char *c = v; c < end; c++) {
                if (!strncasecmp(c, "nan", 3) || !strncasecmp(c, "inf", 3)) {
                    fprintf(stderr, "non-finite coordinate: %.60s\n", p);
                    return 0;
                }
                if (!isdigit((unsigned char)*c) && !strchr(" .,-+eMLHVZhlvzr()otae", *c)) {
                    fprintf(stderr, "odd coordinate: %.60s\n", p);
                    return 0;
                }
            }
        }
    }
    return 1;
}

/* Every <svg has its </svg> before the next <svg starts; tags that hold text are closed. */
static int well_formed(const char *html)
{
    const char *p = html;
    while ((p = strstr(p, "<svg"))) {
        const char *close = strstr(p, "</svg>"), *next = strstr(p + 4, "<svg");
        if (!close || (next && next < close)) return 0;
        p = close;
    }
    return count(html, "<svg") == count(html, "</svg>") && count(html, "<title>") == count(html, "</title>") &&
           count(html, "<text ") == count(html, "</text>") && count(html, "<table") == count(html, "</table>") &&
           count(html, "<html") == 1 && count(html, "</html>") == 1 && count(html, "<script") == 0;
}

static char *report_of(const char *dir)
{
    char path[256];
    snprintf(path, sizeof path, "%s/report.html", dir);
    return slurp(path, NULL);
}

static void test_synthetic_run(void)
{
    const char *dir = run_dir("run");
    write_run(dir, 200, 2);
    CHECK_OK(crew_report_write(dir, NULL));
    char *html = report_of(dir);
    CHECK(html != NULL);
    if (!html) return;
    const char *ids[] = {"loss", "lr", "throughput", "breakdown", "heatmap"};
    for (int i = 0; i < 5; i++) {
        char *svg = svg_element(html, ids[i]);
        CHECK_MSG(svg != NULL, "no <svg class=\"chart\" id=\"%s\">", ids[i]);
        /* Lines and areas have a point per step; the heat map a cell per replica and column. */
        if (svg) CHECK_MSG(count(svg, "L") >= 199 || count(svg, "<title>replica ") == 100, "chart %s draws little", ids[i]);
        free(svg);
    }
    CHECK(strstr(html, STRAGGLER_MSG) != NULL);
    CHECK(strstr(html, BOTTLENECK) != NULL);
    CHECK(strstr(html, "loss &lt;script&gt;alert(1)&lt;/script&gt; &amp; spike") != NULL);
    CHECK(well_formed(html));
    CHECK(coordinates_finite(html));
    CHECK(strstr(html, "NaN") == NULL);
    CHECK(strstr(html, "examples/fashion_cnn.json") != NULL);
    CHECK(strstr(html, "0.9120") != NULL); /* final test accuracy, from the summary */

    /* The heat map marks replica 1 in the column of step 150, and colours its slow steps red. */
    char *heat = svg_element(html, "heatmap");
    CHECK(heat && strstr(heat, "stroke=\"#111\" stroke-width=\"2\"><title>step 150: " STRAGGLER_MSG) != NULL);
    CHECK(heat && strstr(heat, "replica 1, steps 121-124: compute 0.0852 s per step, 1.13× the median") != NULL);
    CHECK(heat && strstr(heat, "replica 0, steps 1-4: compute 0.0650 s per step, 1.00× the median") != NULL);
    free(heat);
    /* Test loss per epoch as points; the epochs table; the events table. */
    char *loss = svg_element(html, "loss");
    CHECK(loss && count(loss, "<title>epoch ") == 2 && strstr(loss, "epoch 2 (to step 200): test loss 0.3000") != NULL);
    free(loss);
    CHECK(strstr(html, "<table id=\"epochs\">") && count(html, "<td class=\"n\">1580</td>") == 2);
    CHECK(strstr(html, "<table id=\"events\">") && strstr(html, "<td class=\"n\">150</td>"));
    free(html);

    /* --out elsewhere; no temporary file is left behind in either place. */
    char out[256];
    snprintf(out, sizeof out, "%s/elsewhere.html", tmp_dir);
    CHECK_OK(crew_report_write(dir, out));
    char *again = slurp(out, NULL);
    CHECK(again && strstr(again, "<svg class=\"chart\" id=\"heatmap\""));
    free(again);
    remove(out);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls %s %s | grep -q tmp-", dir, tmp_dir);
    CHECK(system(cmd) != 0);
}

/* 20000 steps: at most CREW_REPORT_BUCKETS points a line, buckets of 64 steps, a small page. */
static void test_long_run(void)
{
    const char *dir = run_dir("long");
    write_run(dir, 20000, 2);
    crew_report_data d;
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    CHECK_OK(crew_report_read(path, &d));
    CHECK(d.bucket_steps == 64 && d.buckets == 313 && d.step_lines == 20000 && d.last_step == 20000);
    int64_t steps = 0;
    for (int i = 0; i < d.buckets; i++) steps += d.bucket[i].steps;
    CHECK(steps == 20000 && d.bucket[0].steps == 64 && d.replicas == 2);
    crew_report_data_free(&d);
    CHECK_OK(crew_report_write(dir, NULL));
    size_t len = 0;
    snprintf(path, sizeof path, "%s/report.html", dir);
    char *html = slurp(path, &len);
    CHECK_MSG(len > 10000 && len < 400000, "report of 20000 steps is %zu bytes", len);
    CHECK(html && strstr(html, "train loss (mean of 64 steps)") && well_formed(html) && coordinates_finite(html));
    free(html);
}

static void write_text(const char *dir, const char *text)
{
    FILE *f = open_metrics(dir);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Runs that have not got far: no steps at all, no summary, one replica, missing keys. */
static void test_sparse_runs(void)
{
    const char *dir = run_dir("empty");
    write_text(dir, "{\"type\":\"run\",\"devices\":2}\n");
    CHECK_OK(crew_report_write(dir, NULL));
    char *html = report_of(dir);
    CHECK(html && strstr(html, "holds no steps") && strstr(html, "did not finish") && well_formed(html));
    CHECK(html && count(html, "<svg class=\"chart\"") == 5 && coordinates_finite(html));
    free(html);

    dir = run_dir("zero-bytes");
    write_text(dir, "");
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && strstr(html, "holds no steps") && well_formed(html));
    free(html);

    /* Steps with nothing but their number, one odd replica, huge and non-finite values. */
    dir = run_dir("sparse");
    write_text(dir, "{\"type\":\"step\",\"step\":3}\n"
                    "{\"type\":\"step\",\"step\":7,\"loss\":1e308,\"lr\":null,\"step_s\":1e999,\"replicas\":[]}\n"
                    "{\"type\":\"step\",\"step\":9,\"loss\":-1e308,\"replicas\":[{\"forward_s\":1e300}]}\n"
                    "{\"type\":\"step\",\"step\":5,\"loss\":0.5,\"replicas\":[{\"rank\":0,\"backward_s\":0}]}\n"
                    "{\"type\":\"event\"}\n{\"type\":\"epoch\"}\n{\"type\":\"summary\"}\n{\"no_type\":1}\n");
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && well_formed(html) && coordinates_finite(html) && count(html, "<svg class=\"chart\"") == 5);
    free(html);

    dir = run_dir("one-replica");
    write_run(dir, 30, 1);
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && strstr(html, "one replica: nothing to compare") && coordinates_finite(html));
    free(html);
}

/* Bad input: an error that names the file and the line, and no report. */
static void expect_bad(const char *text, const char *needle)
{
    const char *dir = run_dir("bad");
    write_text(dir, text);
    crew_status s = crew_report_write(dir, NULL);
    CHECK_MSG(crew_status_code(s) == CREW_CODE_BAD_INPUT, "%s: got '%s'", needle, crew_status_message(s));
    CHECK_MSG(s && strstr(crew_status_message(s), "metrics.jsonl line") && strstr(crew_status_message(s), needle),
              "message '%s' lacks '%s'", crew_status_message(s), needle);
    CHECK_MSG(s && !strchr(crew_status_message(s), '\n'), "message '%s' is not one line", crew_status_message(s));
    crew_status_free(s);
    char path[256];
    snprintf(path, sizeof path, "%s/report.html", dir);
    CHECK(access(path, F_OK) != 0);
}

static void test_bad_inputs(void)
{
    const char *ok = "{\"type\":\"run\",\"devices\":2}\n";
    char text[512];
    snprintf(text, sizeof text, "%s{\"type\":\"step\",\"step\":1}\n{\"type\":\"step\",\"step\":2,\n", ok);
    expect_bad(text, "line 3: not valid JSON");
    snprintf(text, sizeof text, "%s{\"type\":\"step\",\"step\":1} trailing\n", ok);
    expect_bad(text, "line 2: not valid JSON");
    expect_bad("[1,2,3]\n", "line 1: not a JSON object");
    expect_bad("\n\n{\"type\":\"step\",\"step\":2,\"loss\":\"low\"}\n", "line 3: \"loss\" is not a number");
    expect_bad("{\"type\":\"step\",\"step\":0}\n", "line 1: \"step\" must be an integer");
    expect_bad("{\"type\":\"step\",\"step\":1.5}\n", "\"step\" must be an integer");
    expect_bad("{\"type\":\"step\"}\n", "\"step\" must be an integer");
    expect_bad("{\"type\":\"step\",\"step\":1,\"replicas\":[{\"rank\":5000}]}\n", "\"rank\" must be an integer");
    expect_bad("{\"type\":\"step\",\"step\":1,\"replicas\":{}}\n", "\"replicas\" is not an array");
    expect_bad("{\"type\":\"step\",\"step\":1,\"replicas\":[3]}\n", "replicas[0] is not an object");
    expect_bad("{\"type\":\"event\",\"message\":7}\n", "\"message\" is not a string");
    expect_bad("{\"type\":7}\n", "\"type\" is not a string");

    /* Missing metrics.jsonl: an IO error naming it. */
    const char *dir = run_dir("missing");
    crew_status s = crew_report_write(dir, NULL);
    CHECK(crew_status_code(s) == CREW_CODE_IO);
    CHECK_ERR(s, "metrics.jsonl");
    CHECK_ERR(crew_report_write(NULL, NULL), "run directory");
    /* An output directory that does not exist. */
    dir = run_dir("run");
    write_run(dir, 10, 2);
    s = crew_report_write(dir, "/nonexistent-dir/x/report.html");
    CHECK(crew_status_code(s) == CREW_CODE_IO);
    CHECK_ERR(s, "/nonexistent-dir/x/report.html");
}

/* ---------------------------------------------------------------- pipelines */

/* A pipeline line of a GPipe-like step: every micro-batch forward through the stages, then
 * backward, each pass 1 ms forward and 2 ms backward (stage 1 a fifth slower). */
static void write_pipeline_line(FILE *f, int64_t step, int stages, int micro, const char *schedule)
{
    double fwd_end[CREW_REPORT_MAX_STAGES] = {0}, bwd_end[CREW_REPORT_MAX_STAGES] = {0};
    fprintf(f, "{\"type\":\"pipeline\",\"step\":%lld,\"stages\":%d,\"replicas\":1,\"micro_batches\":%d,"
               "\"schedule\":\"%s\",\"ideal_bubble\":%.4f,\"bubble\":0.31,\"step_s\":null,\"slowest_stage\":%d,\"ops\":[",
            (long long)step, stages, micro, schedule, (stages - 1.0) / (micro + stages - 1.0), stages > 1 ? 1 : 0);
    const char *sep = "";
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < micro; i++)
            for (int k = 0; k < stages; k++) {
                int s = pass ? stages - 1 - k : k;
                double *end = pass ? bwd_end : fwd_end, len = (pass ? 0.002 : 0.001) * (s == 1 ? 1.2 : 1);
                double ready = pass ? (k ? bwd_end[s + 1] : fwd_end[stages - 1]) : (k ? fwd_end[s - 1] : 0);
                double start = ready > end[s] ? ready : end[s];
                if (pass && fwd_end[s] > start) start = fwd_end[s];
                end[s] = start + len;
                fprintf(f, "%s{\"stage\":%d,\"micro\":%d,\"pass\":\"%s\",\"start_s\":%.6f,\"end_s\":%.6f}", sep, s, i,
                        pass ? "backward" : "forward", start, end[s]);
                sep = ",";
            }
    fputs("]}\n", f);
}

/* A run of `steps` steps on one replica, with a pipeline line at each step in pipeline_steps[n]. */
static void write_pipelined_run(const char *dir, int64_t steps, const int64_t *pipeline_steps, const int *stages,
                                const int *micro, int n)
{
    FILE *f = open_metrics(dir);
    if (!f) return;
    fputs("{\"type\":\"run\",\"devices\":1,\"global_batch\":32}\n", f);
    for (int64_t s = 1; s <= steps; s++) {
        write_step(f, s, 1);
        for (int i = 0; i < n; i++)
            if (pipeline_steps[i] == s) write_pipeline_line(f, s, stages[i], micro[i], i % 2 ? "gpipe" : "1f1b");
    }
    fputs("{\"type\":\"summary\",\"steps\":200}\n", f);
    fclose(f);
}

static void test_pipeline_section(void)
{
    /* One pipeline line: 2 stages of 4 micro-batches, a bar per pass. */
    const char *dir = run_dir("pipeline");
    write_pipelined_run(dir, 200, (int64_t[]){100}, (int[]){2}, (int[]){4}, 1);
    CHECK_OK(crew_report_write(dir, NULL));
    char *html = report_of(dir);
    CHECK(html && strstr(html, "<h2 id=\"pipeline-section\">Pipeline</h2>"));
    CHECK(html && strstr(html, "2 stages × 1 replica, 1F1B schedule, 4 micro-batches per step: measured bubble 31.0% "
                               "of the step (ideal 20.0%); the slowest stage is stage 1. The timeline is step 100,"));
    char *svg = html ? svg_element(html, "pipeline") : NULL;
    CHECK(svg != NULL);
    if (svg) {
        CHECK_MSG(count(svg, "<rect class=\"op-forward\"") == 8 && count(svg, "<rect class=\"op-backward\"") == 8,
                  "%d forward and %d backward bars", count(svg, "<rect class=\"op-forward\""),
                  count(svg, "<rect class=\"op-backward\""));
        CHECK(strstr(svg, "<title>stage 1, micro-batch 3, backward: ") != NULL);
        CHECK(count(svg, ">stage 0</text>") == 1 && count(svg, ">stage 1</text>") == 1 && !strstr(svg, ">stage 2</text>"));
        CHECK(strstr(svg, " font-weight=\"bold\">stage 1</text>") != NULL); /* the slowest */
        CHECK(count(svg, "pointer-events=\"none\">3</text>") == 4);        /* micro-batch 3 on each of its bars */
        CHECK(strstr(svg, "ms since the step began") && strstr(svg, ">forward</text>") && strstr(svg, ">backward</text>"));
    }
    free(svg);
    CHECK(html && well_formed(html) && coordinates_finite(html) && !strstr(html, "nan") && !strstr(html, "inf "));
    free(html);

    /* Several: the last is shown, and every one is counted. */
    dir = run_dir("pipelines");
    write_pipelined_run(dir, 200, (int64_t[]){100, 200}, (int[]){2, 3}, (int[]){4, 2}, 2);
    crew_report_data d;
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    CHECK_OK(crew_report_read(path, &d));
    CHECK(d.pipeline_lines == 2 && d.pipeline.step == 200 && d.pipeline.stages == 3 && d.pipeline.n_ops == 12 &&
          d.pipeline.total_ops == 12 && !strcmp(d.pipeline.schedule, "gpipe"));
    crew_report_data_free(&d);
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && strstr(html, "3 stages × 1 replica, GPipe schedule, 2 micro-batches per step") &&
          strstr(html, "The timeline is step 200, the last of 2 sampled steps"));
    svg = html ? svg_element(html, "pipeline") : NULL;
    CHECK(svg && count(svg, "<rect class=\"op-forward\"") == 6 && count(svg, "<rect class=\"op-backward\"") == 6 &&
          strstr(svg, ">stage 2</text>"));
    free(svg);
    free(html);

    /* The example of docs/METRICS.md, three passes of sixteen, and passes whose times are null. */
    dir = run_dir("pipeline-example");
    write_text(dir, "{\"type\":\"pipeline\",\"step\":100,\"stages\":2,\"replicas\":1,\"micro_batches\":4,\"schedule\":\"1f1b\","
                    "\"ideal_bubble\":0.2,\"bubble\":0.31,\"step_s\":0.0123,\"slowest_stage\":1,\"ops\":["
                    "{\"stage\":0,\"micro\":0,\"pass\":\"forward\",\"start_s\":0.0,\"end_s\":0.0011},"
                    "{\"stage\":1,\"micro\":0,\"pass\":\"forward\",\"start_s\":0.0012,\"end_s\":0.002},"
                    "{\"stage\":1,\"micro\":0,\"pass\":\"backward\",\"start_s\":0.002,\"end_s\":0.0041},"
                    "{\"stage\":0,\"micro\":1,\"pass\":\"forward\",\"start_s\":null,\"end_s\":0.003},"
                    "{\"stage\":0,\"micro\":0,\"pass\":\"backward\",\"start_s\":1e999,\"end_s\":null}]}\n"
                    "{\"type\":\"pipeline\",\"stages\":1,\"micro_batches\":1,\"ops\":null,\"bubble\":null}\n"
                    "{\"type\":\"pipeline\",\"step\":100,\"stages\":2,\"replicas\":1,\"micro_batches\":4,\"schedule\":\"1f1b\","
                    "\"ideal_bubble\":0.2,\"bubble\":0.31,\"step_s\":0.0123,\"slowest_stage\":1,\"ops\":["
                    "{\"stage\":0,\"micro\":0,\"pass\":\"forward\",\"start_s\":0.0,\"end_s\":0.0011},"
                    "{\"stage\":1,\"micro\":0,\"pass\":\"forward\",\"start_s\":0.0012,\"end_s\":0.002},"
                    "{\"stage\":1,\"micro\":0,\"pass\":\"backward\",\"start_s\":0.002,\"end_s\":0.0041},"
                    "{\"stage\":0,\"micro\":1,\"pass\":\"forward\",\"start_s\":null,\"end_s\":0.003},"
                    "{\"stage\":0,\"micro\":0,\"pass\":\"backward\",\"start_s\":1e999,\"end_s\":null}]}\n");
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && strstr(html, "The timeline is step 100 (12.3 ms), the last of 3 sampled steps"));
    svg = html ? svg_element(html, "pipeline") : NULL;
    CHECK(svg && count(svg, "<rect class=\"op-forward\"") == 2 && count(svg, "<rect class=\"op-backward\"") == 1);
    CHECK(svg && strstr(svg, "<title>stage 1: busy 2.9 ms of 12.3 ms (idle 76%)</title>"));
    free(svg);
    CHECK(html && well_formed(html) && coordinates_finite(html) && !strstr(html, "nan"));
    free(html);

    /* A line with no passes: the section says so; with no unit-less numbers: "–". */
    dir = run_dir("pipeline-no-ops");
    write_text(dir, "{\"type\":\"pipeline\",\"stages\":1,\"micro_batches\":1,\"ops\":[],\"schedule\":\"<b>\"}\n");
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && strstr(html, "1 stage, &lt;b&gt; schedule, 1 micro-batch per step: measured bubble – of the step "
                               "(ideal –). The timeline is a step,"));
    CHECK(html && strstr(html, "no passes recorded for this step") && well_formed(html));
    free(html);

    /* A run without pipeline lines has no such section. */
    dir = run_dir("no-pipeline");
    write_run(dir, 20, 2);
    CHECK_OK(crew_report_write(dir, NULL));
    html = report_of(dir);
    CHECK(html && !strstr(html, "Pipeline</h2>") && !strstr(html, "id=\"pipeline") && !strstr(html, "op-forward"));
    free(html);
}

/* A pipeline line about a step that a restart ran again is replaced: the one before it is shown. */
static void test_pipeline_after_restart(void)
{
    const char *dir = run_dir("pipeline-resumed");
    FILE *f = open_metrics(dir);
    if (!f) return;
    fputs("{\"type\":\"run\",\"devices\":1}\n", f);
    for (int64_t s = 1; s <= 200; s++) {
        write_step(f, s, 1);
        if (s == 100) write_pipeline_line(f, s, 2, 4, "1f1b");
        if (s == 200) write_pipeline_line(f, s, 3, 4, "1f1b");
    }
    fputs("{\"type\":\"run\",\"devices\":1}\n{\"type\":\"resume\",\"checkpoint_step\":150,\"logged_through\":200}\n", f);
    for (int64_t s = 151; s <= 160; s++) write_step(f, s, 1);
    fclose(f);
    crew_report_data d;
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    CHECK_OK(crew_report_read(path, &d));
    CHECK(d.pipeline_lines == 1 && d.pipeline.step == 100 && d.pipeline.stages == 2 && d.pipeline.n_ops == 16);
    crew_report_data_free(&d);
}

/* More passes than are kept: the first CREW_REPORT_MAX_OPS are drawn, and the page says so. */
static void test_pipeline_many_ops(void)
{
    const char *dir = run_dir("pipeline-many");
    FILE *f = open_metrics(dir);
    if (!f) return;
    const int stages = 64, micro = 200; /* 25600 passes */
    fprintf(f, "{\"type\":\"pipeline\",\"step\":1,\"stages\":%d,\"micro_batches\":%d,\"slowest_stage\":63,\"ops\":[",
            stages, micro);
    for (int i = 0; i < 2 * stages * micro; i++)
        fprintf(f, "%s{\"stage\":%d,\"micro\":%d,\"pass\":\"%s\",\"start_s\":%d,\"end_s\":%d}", i ? "," : "",
                i % stages, i / stages % micro, i < stages * micro ? "forward" : "backward", i / stages, i / stages + 1);
    fputs("]}\n", f);
    fclose(f);
    CHECK_OK(crew_report_write(dir, NULL));
    char *html = report_of(dir);
    CHECK(html && strstr(html, "Only the first 16384 of its 25600 passes are drawn."));
    char *svg = html ? svg_element(html, "pipeline") : NULL;
    CHECK(svg && count(svg, "<rect class=\"op-forward\"") + count(svg, "<rect class=\"op-backward\"") == CREW_REPORT_MAX_OPS);
    /* Rows of 8 pixels: every other one is named, and the slowest, 63, too. */
    CHECK(svg && strstr(svg, ">stage 62</text>") && !strstr(svg, ">stage 61</text>") && strstr(svg, ">stage 63</text>"));
    CHECK(svg && strstr(svg, ">s since the step began"));
    free(svg);
    CHECK(html && well_formed(html) && coordinates_finite(html));
    free(html);
}

/* Each kind of bad pipeline line: one line naming the file, the line and what is wrong. */
static void test_bad_pipeline_lines(void)
{
    static const struct {
        const char *line, *error;
    } cases[] = {
        {"\"stages\":0,\"micro_batches\":4", "line 2: \"stages\" must be an integer in [1, 64]"},
        {"\"stages\":65,\"micro_batches\":4", "line 2: \"stages\" must be an integer in [1, 64]"},
        {"\"micro_batches\":4", "line 2: \"stages\" must be an integer in [1, 64]"},
        {"\"stages\":\"2\",\"micro_batches\":4", "line 2: \"stages\" is not a number"},
        {"\"stages\":2,\"micro_batches\":0", "line 2: \"micro_batches\" must be an integer in [1, 65536]"},
        {"\"stages\":2,\"micro_batches\":65537", "line 2: \"micro_batches\" must be an integer in [1, 65536]"},
        {"\"stages\":2,\"micro_batches\":1.5", "line 2: \"micro_batches\" must be an integer in [1, 65536]"},
        {"\"stages\":2,\"micro_batches\":4,\"step\":-1", "line 2: \"step\" must be an integer"},
        {"\"stages\":2,\"micro_batches\":4,\"replicas\":0", "line 2: \"replicas\" must be an integer in [1, 1024]"},
        {"\"stages\":2,\"micro_batches\":4,\"slowest_stage\":2", "line 2: \"slowest_stage\" must be an integer in [0, 1]"},
        {"\"stages\":2,\"micro_batches\":4,\"schedule\":1", "line 2: \"schedule\" is not a string"},
        {"\"stages\":2,\"micro_batches\":4,\"bubble\":\"high\"", "line 2: \"bubble\" is not a number"},
        {"\"stages\":2,\"micro_batches\":4,\"ideal_bubble\":[]", "line 2: \"ideal_bubble\" is not a number"},
        {"\"stages\":2,\"micro_batches\":4,\"step_s\":true", "line 2: \"step_s\" is not a number"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":{}", "line 2: \"ops\" is not an array"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[7]", "line 2: ops[0] is not an object"},
        {"\"stages\":1,\"micro_batches\":1,\"ops\":[{},{},{}]",
         "line 2: \"ops\" holds 3 passes, more than 2 × 1 stages × 1 micro-batches"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0,\"pass\":\"forward\"},"
         "{\"stage\":2,\"micro\":0,\"pass\":\"forward\"}]",
         "line 2: ops[1]: \"stage\" must be an integer in [0, 1]"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"micro\":0,\"pass\":\"forward\"}]",
         "line 2: ops[0]: \"stage\" must be an integer in [0, 1]"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":4,\"pass\":\"forward\"}]",
         "line 2: ops[0]: \"micro\" must be an integer in [0, 3]"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":-1,\"pass\":\"forward\"}]",
         "line 2: ops[0]: \"micro\" must be an integer in [0, 3]"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0,\"pass\":\"recompute\"}]",
         "line 2: ops[0]: \"pass\" must be \"forward\" or \"backward\""},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0}]",
         "line 2: ops[0]: \"pass\" must be \"forward\" or \"backward\""},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0,\"pass\":1}]",
         "line 2: ops[0]: \"pass\" is not a string"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0,\"pass\":\"forward\",\"start_s\":\"0\"}]",
         "line 2: ops[0]: \"start_s\" is not a number"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0,\"pass\":\"forward\",\"end_s\":{}}]",
         "line 2: ops[0]: \"end_s\" is not a number"},
        {"\"stages\":2,\"micro_batches\":4,\"ops\":[{\"stage\":0,\"micro\":0,\"pass\":\"backward\",\"start_s\":0.002,"
         "\"end_s\":0.001}]",
         "line 2: ops[0]: \"end_s\" 0.001 is before \"start_s\" 0.002"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "{\"type\":\"run\",\"devices\":2}\n{\"type\":\"pipeline\",%s}\n", cases[i].line);
        expect_bad(text, cases[i].error);
    }
}

/* A NUL byte inside a line (fwrite: fputs would stop at it). */
static void test_nul_byte(void)
{
    const char *dir = run_dir("bad");
    FILE *f = open_metrics(dir);
    if (!f) return;
    static const char text[] = "{\"type\":\"run\"}\n{\"type\":\0\"step\"}\n";
    fwrite(text, 1, sizeof text - 1, f);
    fclose(f);
    crew_status s = crew_report_write(dir, NULL);
    CHECK_ERR(s, "line 2: holds a NUL byte");
}

/* A line of 5 MiB, a file of binary noise, and the synthetic run with bytes flipped at random:
 * errors or reports, never a crash (the sanitizer build runs this too). */
static void test_hostile_files(void)
{
    const char *dir = run_dir("huge");
    FILE *f = open_metrics(dir);
    if (!f) return;
    for (int i = 0; i < 5 * 1024; i++) fprintf(f, "%01024d", i);
    fclose(f);
    CHECK_ERR(crew_report_write(dir, NULL), "line 1: longer than 4 MiB");

    uint64_t state = 0x9e3779b97f4a7c15u;
    dir = run_dir("binary");
    f = open_metrics(dir);
    if (!f) return;
    for (int i = 0; i < 200000; i++) {
        state = state * 6364136223846793005u + 1442695040888963407u;
        fputc((int)(state >> 56), f);
    }
    fclose(f);
    crew_status s = crew_report_write(dir, NULL);
    CHECK(crew_status_code(s) == CREW_CODE_BAD_INPUT);
    crew_status_free(s);

    dir = run_dir("flipped");
    write_run(dir, 60, 3);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    size_t len = 0;
    char *orig = slurp(path, &len);
    if (!orig || len == 0) return;
    int reports = 0, errors = 0;
    for (int round = 0; round < 150; round++) {
        char *copy = malloc(len);
        memcpy(copy, orig, len);
        for (int k = 0; k < 1 + round % 4; k++) {
            state = state * 6364136223846793005u + 1442695040888963407u;
            copy[(state >> 33) % len] = round % 3 ? (char)(state >> 24) : "0123456789-.e,:{}[]\" \n"[(state >> 40) % 22];
        }
        f = fopen(path, "wb");
        fwrite(copy, 1, len, f);
        fclose(f);
        free(copy);
        s = crew_report_write(dir, NULL);
        if (s) {
            errors++;
            CHECK_MSG(crew_status_code(s) == CREW_CODE_BAD_INPUT, "%s", crew_status_message(s));
        } else {
            reports++;
        }
        crew_status_free(s);
    }
    CHECK(reports > 0 && errors > 0);
    free(orig);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew_test_report_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_synthetic_run();
    test_long_run();
    test_sparse_runs();
    test_bad_inputs();
    test_pipeline_section();
    test_pipeline_after_restart();
    test_pipeline_many_ops();
    test_bad_pipeline_lines();
    test_nul_byte();
    test_hostile_files();
    nftw(tmp_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
