/* report.c — the writing half of crew report: crew_report_write reads the run through
 * report_read.c and writes the HTML page (header, facts, tables) around the charts of
 * report_svg.c, atomically (a temporary file renamed over the report), so a reader never sees half
 * a page. */
#include "telemetry/report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "telemetry/monitor.h"
#include "telemetry/text_file.h"

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
    size_t used = (size_t)snprintf(buf, len, "events");
    const char *sep = " (";
    for (int k = 0; k < 8 && used < len; k++) {
        if (!d->event_kinds[k]) continue;
        used += (size_t)snprintf(buf + used, len - used, "%s%lld %s", sep, (long long)d->event_kinds[k],
                                 crew_event_kind_name((crew_event_kind)k));
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
    if (!isnan(d->sum_gflops)) fact(f, num(a, sizeof a, "%.1f", d->sum_gflops), "GFLOP/s (dense and convolution layers)");
    if (!isnan(d->sum_peak_fraction))
        fact(f, num(a, sizeof a, "%.0f%%", 100 * d->sum_peak_fraction), "of the measured GEMM peak");
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

/* Restarts, and lines that were left out: the page says what it does not show, and why. */
static void write_restarts(FILE *f, const crew_report_data *d)
{
    for (int i = 0; i < d->n_resumes; i++) {
        fputs("<p class=\"note resume\"><b>Resumed:</b> ", f);
        crew_report_escape(f, d->resumes[i].message);
        fprintf(f, " (line %lld).</p>\n", (long long)d->resumes[i].line);
    }
    if (d->total_resumes > d->n_resumes)
        fprintf(f, "<p class=\"note resume\">… and %lld more restarts.</p>\n", (long long)(d->total_resumes - d->n_resumes));
    if (d->replaced_lines > 0)
        fprintf(f, "<p class=\"how\">%lld lines about steps that were run again after a restart are replaced by the "
                   "re-run's lines: each step is shown once.</p>\n", (long long)d->replaced_lines);
    if (d->torn_lines == 1)
        fprintf(f, "<p class=\"warn\">A torn line (at line %lld) was left out: a run was killed while writing it, "
                   "and a resumed run's line was appended to it.</p>\n", (long long)d->first_torn_line);
    else if (d->torn_lines > 1)
        fprintf(f, "<p class=\"warn\">%lld torn lines (the first at line %lld) were left out: a run was killed while "
                   "writing each, and a resumed run's line was appended to it.</p>\n",
                (long long)d->torn_lines, (long long)d->first_torn_line);
    if (d->torn_bytes > 0)
        fprintf(f, "<p class=\"warn\">The last line of metrics.jsonl is incomplete (%lld bytes): the run is still "
                   "writing it, or was killed while writing it. It was left out.</p>\n", (long long)d->torn_bytes);
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
    write_restarts(f, d);
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
    if (crew_report_has_noise(d)) {
        section(f, "Gradient noise scale",
                "B_simple = tr(&Sigma;) / |G|&sup2;, estimated from the replicas' own gradients against the reduced "
                "one and smoothed over about 100 steps (McCandlish et al. 2018): the batch size at which the "
                "gradient's noise equals its signal. A global batch (dashed) well below it gains nearly in proportion "
                "from growing; well above it, little.");
        crew_report_svg_noise(f, d);
    }
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

/* "1F1B", "GPipe": a schedule's usual spelling; any other name as the file has it. */
static const char *schedule_name(const char *schedule)
{
    if (!strcmp(schedule, "1f1b")) return "1F1B";
    if (!strcmp(schedule, "gpipe")) return "GPipe";
    return schedule;
}

/* "2 stages × 1 replica, 1F1B schedule, 4 micro-batches per step: measured bubble 31% ...": the
 * pipeline line kept, in one paragraph above its timeline. */
static void pipeline_summary(FILE *f, const crew_report_data *d)
{
    const crew_report_pipeline *pl = &d->pipeline;
    char a[48], b[48];
    fprintf(f, "<p class=\"how\" id=\"pipeline-summary\">%d stage%s", pl->stages, pl->stages == 1 ? "" : "s");
    if (pl->replicas > 0) fprintf(f, " × %d replica%s", pl->replicas, pl->replicas == 1 ? "" : "s");
    if (pl->schedule[0]) {
        fputs(", ", f);
        crew_report_escape(f, schedule_name(pl->schedule));
        fputs(" schedule", f);
    }
    fprintf(f, ", %d micro-batch%s per step: measured bubble %s of the step (ideal %s)", pl->micro_batches,
            pl->micro_batches == 1 ? "" : "es", num(a, sizeof a, "%.1f%%", 100 * pl->bubble),
            num(b, sizeof b, "%.1f%%", 100 * pl->ideal_bubble));
    if (pl->slowest_stage >= 0) fprintf(f, "; the slowest stage is stage %d", pl->slowest_stage);
    fputs(". The timeline is ", f);
    if (pl->step >= 0) fprintf(f, "step %lld", (long long)pl->step);
    else fputs("a step", f);
    if (!isnan(pl->step_s) && pl->step_s < 1) fprintf(f, " (%.4g ms)", 1e3 * pl->step_s);
    else if (!isnan(pl->step_s)) fprintf(f, " (%.4g s)", pl->step_s);
    if (d->pipeline_lines > 1) fprintf(f, ", the last of %lld sampled steps", (long long)d->pipeline_lines);
    fputs(", on replica 0: one row per stage, a bar per forward or backward pass of a micro-batch (its number on "
          "the bar), and the gaps between bars are idle time. Hover a bar or a row for its figures.", f);
    if (pl->total_ops > pl->n_ops)
        fprintf(f, " Only the first %d of its %d passes are drawn.", pl->n_ops, pl->total_ops);
    fputs("</p>\n", f);
}

/* The Pipeline section, for a run that has pipeline lines. */
static void write_pipeline(FILE *f, const crew_report_data *d)
{
    if (d->pipeline_lines == 0) return;
    fputs("<h2 id=\"pipeline-section\">Pipeline</h2>\n", f);
    pipeline_summary(f, d);
    crew_report_svg_pipeline(f, d);
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
    int lm = 0; /* a language model's epochs carry bits per token: a column of their own */
    for (int i = 0; i < d->n_epochs; i++) lm |= !isnan(d->epochs_seen[i].test_bits);
    fprintf(f, "<table id=\"epochs\"><tr><th class=\"n\">epoch</th><th class=\"n\">steps</th><th class=\"n\">train loss</th>"
               "<th class=\"n\">train accuracy</th><th class=\"n\">test loss</th><th class=\"n\">test accuracy</th>%s"
               "<th class=\"n\">wall time</th><th class=\"n\">samples/s</th></tr>\n",
            lm ? "<th class=\"n\">test bits/token</th>" : "");
    for (int i = 0; i < d->n_epochs; i++) {
        const crew_report_epoch *e = &d->epochs_seen[i];
        fprintf(f, "<tr><td class=\"n\">%s</td><td class=\"n\">%s</td>", num(v[0], 48, "%.0f", e->epoch + 1.0),
                num(v[1], 48, "%.0f", e->steps >= 0 ? (double)e->steps : NAN));
        fprintf(f, "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>",
                num(v[2], 48, "%.4f", e->train_loss), num(v[3], 48, "%.4f", e->train_accuracy),
                num(v[4], 48, "%.4f", e->test_loss), num(v[5], 48, "%.4f", e->test_accuracy));
        if (lm) fprintf(f, "<td class=\"n\">%s</td>", num(v[6], 48, "%.3f", e->test_bits));
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
    write_pipeline(f, d);
    write_events(f, d);
    write_epochs(f, d);
    fputs("<footer>Written by crew report", f);
    labelled(f, " from a run of crew ", d->version);
    fputs(" · the source is metrics.jsonl in the run directory (docs/METRICS.md).</footer>\n"
          "</main>\n</body>\n</html>\n", f);
}

/* Writes the page into tmp, synced to disk; the caller renames it. The page is drawn into memory
 * first and written with crew_text_file, so that a full disk or a file-size limit is reported with
 * its reason (stdio's error flag carries none: text_file.h). out names the report in messages. */
static crew_status write_file(const char *tmp, const char *out, const char *run_dir, const crew_report_data *d)
{
    char *page = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&page, &len);
    if (!mem) return CREW_OOM();
    write_page(mem, run_dir, d);
    int bad = ferror(mem);
    if (fclose(mem) != 0 || bad) { /* only memory can run out here */
        free(page);
        return CREW_OOM();
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644); /* never through a link */
    if (fd < 0) {
        crew_status s = crew_errorf(CREW_CODE_IO, "cannot create %s: %s", tmp, strerror(errno));
        free(page);
        return s;
    }
    crew_text_file t;
    crew_status s = crew_text_attach(&t, fd, out);
    if (!s) {
        crew_text_puts(&t, page);
        s = crew_text_close(&t, 1);
    }
    free(page);
    return s;
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
    crew_report_read_config(run_dir, d);
    s = write_file(tmp, out, run_dir, d);
    if (!s && rename(tmp, out) != 0)
        s = crew_errorf(CREW_CODE_IO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
    if (s) unlink(tmp);
    crew_report_data_free(d);
    free(d);
    return s;
}
