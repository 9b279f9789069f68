/* report_svg.c — the charts of crew report, as inline SVG: axes with round ticks, lines that
 * break where a bucket holds no value, stacked areas, a heat map and a pipeline's timeline. Pure SVG (no script): tooltips
 * are <title> elements, which browsers show on hover.
 *
 * Every coordinate goes through fx/fy, which map any input (huge, tiny, a degenerate range) to a
 * finite point at most a little outside the plot, so the file never holds "nan" or "inf". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/report.h"

#define CHART_W 1000.0
#define MAX_TICKS 16
#define LEFT 84.0 /* the plot's left edge in every chart, so that their step axes line up */

const char *const crew_report_part_colour[CREW_PART_COUNT] = {"#e45756", "#4c78a8", "#9ecae9", "#f58518",
                                                              "#54a24b"};
const char *const crew_report_part_name[CREW_PART_COUNT] = {"data", "forward", "backward",
                                                            "exposed communication", "optimizer"};

const char *crew_report_kind_colour(const char *kind)
{
    static const struct {
        const char *kind, *colour;
    } colours[] = {{"straggler", "#b2182b"},  {"input_bound", "#d9730d"}, {"nan", "#6a1b9a"},
                   {"skipped_update", "#8e44ad"}, {"loss_spike", "#c2185b"}, {"divergence", "#000000"},
                   {"hang", "#37474f"}};
    for (size_t i = 0; i < sizeof colours / sizeof colours[0]; i++)
        if (!strcmp(kind, colours[i].kind)) return colours[i].colour;
    return "#607d8b";
}

/* ---------------------------------------------------------------- frames and axes */

/* A plot area (SVG pixels) and the data ranges it shows. */
typedef struct frame {
    double left, top, width, height;
    double xlo, xhi, ylo, yhi;
} frame;

static double unit(double v, double lo, double hi)
{
    double t = (v - lo) / (hi - lo);
    if (!isfinite(t)) t = 0;
    return fmin(fmax(t, -0.05), 1.05);
}

static double fx(const frame *p, double x) { return p->left + unit(x, p->xlo, p->xhi) * p->width; }
static double fy(const frame *p, double y) { return p->top + (1 - unit(y, p->ylo, p->yhi)) * p->height; }

/* Round values 1, 2 or 5 times a power of ten apart covering [lo, hi], about n of them. */
static int nice_ticks(double lo, double hi, int n, double ticks[MAX_TICKS], double *step_out)
{
    double span = hi - lo;
    if (!(span > 0) || !isfinite(span)) return 0;
    double raw = span / n, mag = pow(10, floor(log10(raw))), m = raw / mag;
    double step = (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * mag;
    double first = ceil(lo / step - 1e-9) * step;
    int k = 0;
    for (int i = 0; k < MAX_TICKS; i++) {
        double v = first + i * step;
        if (v > hi + step * 1e-9 || !isfinite(v)) break;
        ticks[k++] = fabs(v) < step * 1e-9 ? 0 : v;
    }
    *step_out = step;
    return k;
}

/* A tick label: integers plainly (12k from 10000 on), fractions with as many decimals as the tick
 * spacing needs, tiny numbers in exponent form. */
static const char *tick_label(char *buf, size_t len, double v, double step)
{
    if (v == 0) snprintf(buf, len, "0");
    else if (fabs(v) >= 1e4 && fmod(v, 1000) == 0) snprintf(buf, len, "%gk", v / 1000);
    else if (fabs(v) < 1e-3 || fabs(v) >= 1e9) snprintf(buf, len, "%.2g", v);
    else {
        int decimals = step >= 1 ? 0 : (int)fmin(9, ceil(-log10(step) - 1e-9));
        snprintf(buf, len, "%.*f", decimals, v);
    }
    return buf;
}

static void text(FILE *f, double x, double y, const char *anchor, const char *extra, const char *s)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>", x, y, anchor, extra ? extra : "");
    crew_report_escape(f, s);
    fputs("</text>\n", f);
}

/* whole: only whole numbers get a tick (the axis counts steps). */
static void axis_x_ticks(FILE *f, const frame *p, const char *label, int whole)
{
    double t[MAX_TICKS], step = 1;
    char buf[32];
    int n = nice_ticks(p->xlo, p->xhi, 10, t, &step);
    double base = p->top + p->height;
    for (int i = 0; i < n; i++) {
        if (whole && step < 1 && t[i] != floor(t[i])) continue;
        double x = fx(p, t[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>", x, p->top, x, base);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", x, base, x, base + 4);
        text(f, x, base + 17, "middle", NULL, tick_label(buf, sizeof buf, t[i], step));
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", p->left, base,
            p->left + p->width, base);
    text(f, p->left + p->width / 2, base + 34, "middle", NULL, label);
}

static void axis_x(FILE *f, const frame *p, const char *label) { axis_x_ticks(f, p, label, 1); }

static void axis_y(FILE *f, const frame *p, const char *label)
{
    double t[MAX_TICKS], step = 1;
    char buf[32];
    int n = nice_ticks(p->ylo, p->yhi, p->height > 150 ? 6 : 4, t, &step);
    for (int i = 0; i < n; i++) {
        double y = fy(p, t[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>", p->left, y,
                p->left + p->width, y);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", p->left - 4, y, p->left, y);
        text(f, p->left - 7, y + 4, "end", NULL, tick_label(buf, sizeof buf, t[i], step));
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", p->left, p->top, p->left,
            p->top + p->height);
    double cx = 16, cy = p->top + p->height / 2;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f %.1f)\">", cx, cy, cx, cy);
    crew_report_escape(f, label);
    fputs("</text>\n", f);
}

static void svg_open(FILE *f, const char *cls, const char *id, double h, const char *what)
{
    fprintf(f,
            "<svg class=\"%s\" id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" "
            "height=\"%.0f\" role=\"img\" aria-label=\"%s\" font-size=\"12\" fill=\"#333\">\n",
            cls, id, CHART_W, h, CHART_W, h, what);
}

/* A chart with nothing to draw still appears, saying why. */
static void empty_chart(FILE *f, const char *id, const char *what, const char *why)
{
    const double h = 70;
    svg_open(f, "chart", id, h, what);
    text(f, CHART_W / 2, h / 2, "middle", " fill=\"#888\" font-size=\"14\"", why);
    fputs("</svg>\n", f);
}

/* Restricts drawing to the plot area (values above a robust maximum are cut off). */
static void clip_open(FILE *f, const char *id, const frame *p)
{
    fprintf(f, "<clipPath id=\"%s-clip\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n", id,
            p->left, p->top - 1, p->width, p->height + 1);
    fprintf(f, "<g clip-path=\"url(#%s-clip)\">\n", id);
}

/* ---------------------------------------------------------------- legends and lines */

typedef struct legend {
    double x, y;
} legend;

/* kind: 'l' a line, 'd' a dashed line, 'b' a filled box, 'c' a dot, 't' a triangle, 'o' an outline. */
static void legend_item(FILE *f, legend *g, char kind, const char *colour, const char *label)
{
    double x = g->x, y = g->y;
    switch (kind) {
    case 'l': case 'd':
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>", x,
                y - 4, x + 18, y - 4, colour, kind == 'd' ? " stroke-dasharray=\"5 3\"" : "");
        break;
    case 'c': fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>", x + 9, y - 4, colour); break;
    case 't': fprintf(f, "<path d=\"M%.1f,%.1fl10,0l-5,8z\" fill=\"%s\"/>", x + 4, y - 9, colour); break;
    case 'o':
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"11\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>",
                x, y - 10, colour);
        break;
    default: fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"11\" fill=\"%s\"/>", x, y - 10, colour);
    }
    text(f, x + 23, y, "start", NULL, label);
    g->x += 23 + 6.8 * (double)strlen(label) + 18;
}

/* A line through the points (x[i], y[i]) that breaks where y is NaN; a lone point becomes a dot. */
static void polyline(FILE *f, const frame *p, const double *x, const double *y, int n, const char *style)
{
    fprintf(f, "<path fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\" %s d=\"", style);
    int run = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(y[i])) {
            if (run == 1) fputs("h0.5", f);
            run = 0;
            continue;
        }
        fprintf(f, "%c%.1f,%.1f", run ? 'L' : 'M', fx(p, x[i]), fy(p, y[i]));
        run++;
    }
    if (run == 1) fputs("h0.5", f);
    fputs("\"/>\n", f);
}

/* The band between lo[i] and hi[i], one closed shape per run of points where both are known. */
static void band(FILE *f, const frame *p, const double *x, const double *lo, const double *hi, int n,
                 const char *style)
{
    fprintf(f, "<path %s d=\"", style);
    for (int i = 0; i < n;) {
        if (isnan(lo[i]) || isnan(hi[i])) {
            i++;
            continue;
        }
        int j = i;
        while (j < n && !isnan(lo[j]) && !isnan(hi[j])) j++;
        double half = j - i == 1 ? 1.5 : 0; /* a lone point: a thin bar */
        for (int k = i; k < j; k++) fprintf(f, "%c%.1f,%.1f", k == i ? 'M' : 'L', fx(p, x[k]) - half, fy(p, hi[k]));
        for (int k = j - 1; k >= i; k--) fprintf(f, "L%.1f,%.1f", fx(p, x[k]) + half, fy(p, lo[k]));
        fputc('Z', f);
        i = j;
    }
    fputs("\"/>\n", f);
}

/* Widens [*lo, *hi] (NaN: empty) to take in the finite values of v. */
static void value_range(const double *v, int n, double *lo, double *hi)
{
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        if (isnan(*lo) || v[i] < *lo) *lo = v[i];
        if (isnan(*hi) || v[i] > *hi) *hi = v[i];
    }
}

/* Adds pad × the span on each side; an empty or zero range becomes one that can be drawn. */
static void pad_range(double *lo, double *hi, double pad)
{
    if (isnan(*lo)) {
        *lo = 0;
        *hi = 1;
    }
    double span = *hi - *lo;
    if (!(span > 0) || !isfinite(span)) span = fabs(*lo) > 0 ? fabs(*lo) * 0.2 : 1;
    *lo -= span * pad;
    *hi += span * pad;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A high value of v that ignores the top 2% (a first step that loads the data, say): the top of
 * a chart, above which values are cut off. */
static double robust_max(const double *v, int n)
{
    double sorted[CREW_REPORT_BUCKETS];
    int k = 0;
    for (int i = 0; i < n && k < CREW_REPORT_BUCKETS; i++)
        if (isfinite(v[i])) sorted[k++] = v[i];
    if (k == 0) return 1;
    qsort(sorted, (size_t)k, sizeof sorted[0], cmp_double);
    double top = sorted[k - 1];
    if (k >= 25) top = sorted[(int)floor(0.98 * (k - 1))];
    return top > 0 ? top : 1;
}

/* The x range of the step charts: from the first bucket's start to the last step. */
static void step_range(const crew_report_data *d, frame *p)
{
    p->xlo = floor((double)(d->first_step - 1) / (double)d->bucket_steps) * (double)d->bucket_steps;
    p->xhi = (double)d->last_step;
    if (p->xhi - p->xlo < 2) { /* one step: give the axis some width */
        p->xlo = fmax(0, p->xhi - 2);
        p->xhi = p->xlo + 2;
    }
}

/* Markers above the plot for the events that pass `keep`, each with its message as a tooltip. */
static void event_markers(FILE *f, const frame *p, const crew_report_data *d, int (*keep)(const char *kind),
                          int *shown)
{
    *shown = 0;
    for (int i = 0; i < d->n_events; i++) {
        const crew_report_event *e = &d->events[i];
        if (e->step < 1 || !keep(e->kind)) continue;
        fprintf(f, "<path d=\"M%.1f,%.1fl-5,-8l10,0z\" fill=\"%s\"><title>step %lld, %s: ", fx(p, (double)e->step),
                p->top - 1, crew_report_kind_colour(e->kind), (long long)e->step, e->kind);
        crew_report_escape(f, e->message);
        fputs("</title></path>\n", f);
        (*shown)++;
    }
}

/* ---------------------------------------------------------------- the charts */

static int about_training(const char *kind) { return strcmp(kind, "straggler") && strcmp(kind, "input_bound"); }
static int about_input(const char *kind) { return !strcmp(kind, "input_bound"); }

static void test_points(FILE *f, const frame *p, const crew_report_data *d)
{
    for (int i = 0; i < d->n_epochs; i++) {
        const crew_report_epoch *e = &d->epochs_seen[i];
        if (isnan(e->test_loss) || e->end_step < 1) continue;
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"#d62728\" stroke=\"#fff\" stroke-width=\"1.5\">"
                   "<title>epoch %d (to step %lld): test loss %.4f",
                fx(p, (double)e->end_step), fy(p, e->test_loss), e->epoch + 1, (long long)e->end_step, e->test_loss);
        if (!isnan(e->test_accuracy)) fprintf(f, ", test accuracy %.4f", e->test_accuracy);
        fputs("</title></circle>\n", f);
    }
}

void crew_report_svg_loss(FILE *f, const crew_report_data *d)
{
    const double h = 300;
    const char *what = "training loss and test loss against step";
    if (d->step_lines == 0) {
        empty_chart(f, "loss", what, "no steps recorded");
        return;
    }
    int n = d->buckets;
    double x[CREW_REPORT_BUCKETS], mean[CREW_REPORT_BUCKETS], lo[CREW_REPORT_BUCKETS], hi[CREW_REPORT_BUCKETS];
    frame p = {LEFT, 34, CHART_W - LEFT - 20, h - 34 - 44, 0, 0, NAN, NAN};
    for (int i = 0; i < n; i++) {
        const crew_report_bucket *b = &d->bucket[i];
        x[i] = crew_report_bucket_step(d, i);
        mean[i] = b->loss_n ? b->loss_sum / (double)b->loss_n : NAN;
        lo[i] = b->loss_n ? b->loss_min : NAN;
        hi[i] = b->loss_n ? b->loss_max : NAN;
    }
    step_range(d, &p);
    value_range(lo, n, &p.ylo, &p.yhi);
    value_range(hi, n, &p.ylo, &p.yhi);
    for (int i = 0; i < d->n_epochs; i++) value_range(&d->epochs_seen[i].test_loss, 1, &p.ylo, &p.yhi);
    int nonnegative = !(p.ylo < 0);
    pad_range(&p.ylo, &p.yhi, 0.04);
    if (nonnegative && p.ylo < 0) p.ylo = 0;
    svg_open(f, "chart", "loss", h, what);
    axis_y(f, &p, "loss");
    axis_x(f, &p, "step");
    if (d->bucket_steps > 1) band(f, &p, x, lo, hi, n, "fill=\"#4c78a8\" fill-opacity=\"0.2\"");
    polyline(f, &p, x, mean, n, "stroke=\"#1f5aa6\" stroke-width=\"1.8\"");
    test_points(f, &p, d);
    int events;
    event_markers(f, &p, d, about_training, &events);
    legend g = {p.left + 10, 18};
    char label[64];
    snprintf(label, sizeof label, "train loss (mean of %lld steps)", (long long)d->bucket_steps);
    legend_item(f, &g, 'l', "#1f5aa6", d->bucket_steps > 1 ? label : "train loss");
    if (d->bucket_steps > 1) legend_item(f, &g, 'b', "#c5d3e6", "lowest–highest step");
    legend_item(f, &g, 'c', "#d62728", "test loss (end of epoch)");
    if (events) legend_item(f, &g, 't', "#c2185b", "event (hover)");
    fputs("</svg>\n", f);
}

void crew_report_svg_lr(FILE *f, const crew_report_data *d)
{
    const double h = 170;
    const char *what = "learning rate against step";
    if (d->step_lines == 0) {
        empty_chart(f, "lr", what, "no steps recorded");
        return;
    }
    int n = d->buckets;
    double x[CREW_REPORT_BUCKETS], lr[CREW_REPORT_BUCKETS];
    frame p = {LEFT, 14, CHART_W - LEFT - 20, h - 14 - 44, 0, 0, NAN, NAN};
    for (int i = 0; i < n; i++) {
        x[i] = crew_report_bucket_step(d, i);
        lr[i] = d->bucket[i].lr_n ? d->bucket[i].lr_sum / (double)d->bucket[i].lr_n : NAN;
    }
    step_range(d, &p);
    value_range(lr, n, &p.ylo, &p.yhi);
    if (isnan(p.yhi)) {
        empty_chart(f, "lr", what, "no learning rate recorded");
        return;
    }
    p.ylo = fmin(0, p.ylo);
    p.yhi = p.yhi > p.ylo ? p.yhi + (p.yhi - p.ylo) * 0.08 : p.ylo + 1;
    svg_open(f, "chart", "lr", h, what);
    axis_y(f, &p, "learning rate");
    axis_x(f, &p, "step");
    polyline(f, &p, x, lr, n, "stroke=\"#2ca02c\" stroke-width=\"1.8\"");
    fputs("</svg>\n", f);
}

int crew_report_has_noise(const crew_report_data *d)
{
    for (int i = 0; i < d->buckets; i++)
        if (d->bucket[i].noise_n) return 1;
    return 0;
}

/* The gradient noise scale per bucket, and the global batch as a dashed line: where the run stands
 * against it. */
void crew_report_svg_noise(FILE *f, const crew_report_data *d)
{
    const double h = 220;
    const char *what = "gradient noise scale against step";
    int n = d->buckets;
    double x[CREW_REPORT_BUCKETS], ns[CREW_REPORT_BUCKETS], batch[CREW_REPORT_BUCKETS];
    frame p = {LEFT, 34, CHART_W - LEFT - 20, h - 34 - 44, 0, 0, 0, NAN};
    for (int i = 0; i < n; i++) {
        const crew_report_bucket *b = &d->bucket[i];
        x[i] = crew_report_bucket_step(d, i);
        ns[i] = b->noise_n ? b->noise_sum / (double)b->noise_n : NAN;
        batch[i] = b->steps && b->samples > 0 ? b->samples / (double)b->steps : NAN;
    }
    step_range(d, &p);
    double lo = NAN, blo = NAN, bhi = NAN;
    value_range(ns, n, &lo, &p.yhi);
    value_range(batch, n, &blo, &bhi);
    if (isnan(p.yhi)) {
        empty_chart(f, "noise", what, "no step measured it");
        return;
    }
    p.yhi = fmax(robust_max(ns, n), isnan(bhi) ? 0 : bhi) * 1.08;
    if (!(p.yhi > 0)) p.yhi = 1;
    svg_open(f, "chart", "noise", h, what);
    axis_y(f, &p, "samples");
    axis_x(f, &p, "step");
    clip_open(f, "noise", &p);
    polyline(f, &p, x, ns, n, "stroke=\"#d95f02\" stroke-width=\"2\"");
    polyline(f, &p, x, batch, n, "stroke=\"#333\" stroke-width=\"1.4\" stroke-dasharray=\"5 3\"");
    fputs("</g>\n", f);
    legend g = {p.left + 10, 18};
    legend_item(f, &g, 'l', "#d95f02", "noise scale B_simple (smoothed)");
    legend_item(f, &g, 'd', "#333", "the run's global batch");
    fputs("</svg>\n", f);
}

/* Throughput per bucket (samples over step time), and its moving average over 2k+1 buckets. */
static void throughput_series(const crew_report_data *d, double *raw, double *smooth)
{
    int n = d->buckets, k = n >= 20 ? (n / 40 > 2 ? n / 40 : 2) : 0;
    for (int i = 0; i < n; i++) {
        const crew_report_bucket *b = &d->bucket[i];
        raw[i] = b->samples_s > 0 && isfinite(b->samples / b->samples_s) ? b->samples / b->samples_s : NAN;
    }
    for (int i = 0; i < n; i++) {
        double samples = 0, seconds = 0;
        for (int j = i - k; j <= i + k; j++)
            if (j >= 0 && j < n) {
                samples += d->bucket[j].samples;
                seconds += d->bucket[j].samples_s;
            }
        smooth[i] = seconds > 0 && !isnan(raw[i]) && isfinite(samples / seconds) ? samples / seconds : NAN;
    }
}

void crew_report_svg_throughput(FILE *f, const crew_report_data *d)
{
    const double h = 260;
    const char *what = "training samples per second against step";
    if (d->step_lines == 0) {
        empty_chart(f, "throughput", what, "no steps recorded");
        return;
    }
    int n = d->buckets;
    double x[CREW_REPORT_BUCKETS], raw[CREW_REPORT_BUCKETS], smooth[CREW_REPORT_BUCKETS];
    frame p = {LEFT, 34, CHART_W - LEFT - 20, h - 34 - 44, 0, 0, 0, NAN};
    for (int i = 0; i < n; i++) x[i] = crew_report_bucket_step(d, i);
    throughput_series(d, raw, smooth);
    step_range(d, &p);
    double lo = NAN;
    value_range(smooth, n, &lo, &p.yhi);
    p.yhi = fmax(isnan(p.yhi) ? 0 : p.yhi, robust_max(raw, n));
    if (!isnan(d->sum_samples_per_s)) p.yhi = fmax(p.yhi, d->sum_samples_per_s);
    p.yhi *= 1.08;
    svg_open(f, "chart", "throughput", h, what);
    axis_y(f, &p, "samples/s");
    axis_x(f, &p, "step");
    clip_open(f, "throughput", &p);
    polyline(f, &p, x, raw, n, "stroke=\"#9c9c9c\" stroke-width=\"1\"");
    polyline(f, &p, x, smooth, n, "stroke=\"#7b3294\" stroke-width=\"2.2\"");
    if (!isnan(d->sum_samples_per_s)) {
        double y = fy(&p, d->sum_samples_per_s);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-dasharray=\"5 3\"/>\n",
                p.left, y, p.left + p.width, y);
    }
    fputs("</g>\n", f);
    legend g = {p.left + 10, 18};
    legend_item(f, &g, 'l', "#9c9c9c", d->bucket_steps > 1 ? "per bucket" : "per step");
    legend_item(f, &g, 'l', "#7b3294", "moving average");
    if (!isnan(d->sum_samples_per_s)) {
        char label[64];
        snprintf(label, sizeof label, "whole run: %.0f samples/s", d->sum_samples_per_s);
        legend_item(f, &g, 'd', "#333", label);
    }
    fputs("</svg>\n", f);
}

/* The stacked parts of each bucket: top[p][i] is the sum of parts 0..p (NaN for empty buckets). */
static void breakdown_series(const crew_report_data *d, double top[CREW_PART_COUNT][CREW_REPORT_BUCKETS],
                             double *wall)
{
    for (int i = 0; i < d->buckets; i++) {
        const crew_report_bucket *b = &d->bucket[i];
        double sum = 0;
        for (int p = 0; p < CREW_PART_COUNT; p++) {
            sum += b->part_n ? fmax(0, b->part_sum[p] / (double)b->part_n) : 0;
            top[p][i] = b->part_n ? sum : NAN;
        }
        wall[i] = b->part_n && b->wall_sum > 0 ? b->wall_sum / (double)b->part_n : NAN;
    }
}

static void breakdown_legend(FILE *f, const frame *p, const crew_report_data *d)
{
    legend g = {p->left + 10, 18};
    for (int k = 0; k < CREW_PART_COUNT; k++)
        legend_item(f, &g, 'b', crew_report_part_colour[k], crew_report_part_name[k]);
    legend_item(f, &g, 'l', "#222", "step wall time");
    char label[96];
    snprintf(label, sizeof label, "mean over %d replica%s%s", d->replicas, d->replicas == 1 ? "" : "s",
             d->bucket_steps > 1 ? " and the bucket's steps" : "");
    text(f, p->left + p->width, p->top + p->height + 34, "end", " fill=\"#666\"", label);
}

void crew_report_svg_breakdown(FILE *f, const crew_report_data *d)
{
    const double h = 290;
    const char *what = "step time by part against step, stacked";
    if (d->step_lines == 0) {
        empty_chart(f, "breakdown", what, "no steps recorded");
        return;
    }
    int n = d->buckets;
    static const double zero[CREW_REPORT_BUCKETS];
    double x[CREW_REPORT_BUCKETS], top[CREW_PART_COUNT][CREW_REPORT_BUCKETS], wall[CREW_REPORT_BUCKETS];
    frame p = {LEFT, 34, CHART_W - LEFT - 20, h - 34 - 44, 0, 0, 0, NAN};
    for (int i = 0; i < n; i++) x[i] = crew_report_bucket_step(d, i);
    breakdown_series(d, top, wall);
    step_range(d, &p);
    double highest[CREW_REPORT_BUCKETS];
    for (int i = 0; i < n; i++) highest[i] = isnan(wall[i]) ? top[CREW_PART_COUNT - 1][i] : fmax(wall[i], top[CREW_PART_COUNT - 1][i]);
    p.yhi = robust_max(highest, n) * 1.1;
    svg_open(f, "chart", "breakdown", h, what);
    axis_y(f, &p, "seconds per step");
    axis_x(f, &p, "step");
    clip_open(f, "breakdown", &p);
    for (int k = 0; k < CREW_PART_COUNT; k++) {
        char style[64];
        snprintf(style, sizeof style, "fill=\"%s\" fill-opacity=\"0.9\"", crew_report_part_colour[k]);
        band(f, &p, x, k ? top[k - 1] : zero, top[k], n, style);
    }
    polyline(f, &p, x, wall, n, "stroke=\"#222\" stroke-width=\"1.2\"");
    fputs("</g>\n", f);
    int events;
    event_markers(f, &p, d, about_input, &events);
    breakdown_legend(f, &p, d);
    fputs("</svg>\n", f);
}

/* ---------------------------------------------------------------- the heat map */

/* Diverging colours for compute time relative to the median replica: blue faster, near-white
 * equal, red slower (ColorBrewer RdBu). */
static void ratio_colour(double ratio, char out[8])
{
    static const struct {
        double at;
        int rgb[3];
    } stops[] = {{0.8, {33, 102, 172}}, {0.9, {146, 197, 222}}, {1.0, {247, 247, 247}},
                 {1.1, {244, 165, 130}}, {1.25, {214, 96, 77}}, {1.5, {103, 0, 31}}};
    const int n = sizeof stops / sizeof stops[0];
    if (isnan(ratio)) {
        snprintf(out, 8, "#d0d0d0");
        return;
    }
    int i = 0;
    while (i < n - 2 && ratio > stops[i + 1].at) i++;
    double t = (ratio - stops[i].at) / (stops[i + 1].at - stops[i].at);
    t = fmin(fmax(t, 0), 1);
    int c[3];
    for (int k = 0; k < 3; k++) c[k] = (int)lround(stops[i].rgb[k] + t * (stops[i + 1].rgb[k] - stops[i].rgb[k]));
    snprintf(out, 8, "#%02x%02x%02x", c[0] & 255, c[1] & 255, c[2] & 255);
}

/* The grid of the heat map: columns of `group` buckets each. */
typedef struct heat {
    frame p;
    int rows, cols, group;
    double row_h, col_w;
} heat;

static double cell_mean(const crew_report_data *d, const heat *m, int r, int col)
{
    double sum = 0;
    int64_t n = 0;
    for (int b = col * m->group; b < (col + 1) * m->group && b < d->buckets; b++) {
        sum += d->compute_sum[(size_t)r * CREW_REPORT_BUCKETS + b];
        n += d->compute_n[(size_t)r * CREW_REPORT_BUCKETS + b];
    }
    return n > 0 ? sum / (double)n : NAN;
}

static void heat_column(FILE *f, const crew_report_data *d, const heat *m, int col, double *means)
{
    double sorted[CREW_REPORT_MAX_REPLICAS];
    int k = 0;
    for (int r = 0; r < m->rows; r++) {
        means[r] = cell_mean(d, m, r, col);
        if (!isnan(means[r])) sorted[k++] = means[r];
    }
    qsort(sorted, (size_t)k, sizeof sorted[0], cmp_double);
    double median = k == 0 ? NAN : k % 2 ? sorted[k / 2] : (sorted[k / 2 - 1] + sorted[k / 2]) / 2;
    double w = (double)d->bucket_steps * m->group;
    long long first = (long long)(col * w + 1), last = (long long)fmin((col + 1) * w, (double)d->last_step);
    for (int r = 0; r < m->rows; r++) {
        double ratio = median > 0 ? means[r] / median : NAN;
        char colour[8];
        ratio_colour(ratio, colour);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\">", m->p.left + col * m->col_w,
                m->p.top + r * m->row_h, m->col_w + 0.05, m->row_h - (m->row_h > 8 ? 1 : 0), colour);
        if (isnan(ratio))
            fprintf(f, "<title>replica %d, steps %lld-%lld: no figures</title></rect>\n", r, first, last);
        else
            fprintf(f, "<title>replica %d, steps %lld-%lld: compute %.4f s per step, %.2f× the median</title></rect>\n",
                    r, first, last, means[r], ratio);
    }
}

static void heat_stragglers(FILE *f, const crew_report_data *d, const heat *m)
{
    for (int i = 0; i < d->n_events; i++) {
        const crew_report_event *e = &d->events[i];
        if (strcmp(e->kind, "straggler") || e->rank < 0 || e->rank >= m->rows || e->step < 1) continue;
        int64_t col = (e->step - 1) / d->bucket_steps / m->group;
        if (col >= m->cols) continue;
        double x = m->p.left + (double)col * m->col_w, y = m->p.top + e->rank * m->row_h;
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#111\" "
                   "stroke-width=\"2\"><title>step %lld: ", x - 1, y, fmax(m->col_w, 3) + 2, m->row_h - (m->row_h > 8 ? 1 : 0),
                (long long)e->step);
        crew_report_escape(f, e->message);
        fprintf(f, "</title></rect>\n<path d=\"M%.1f,%.1fl-5,-8l10,0z\" fill=\"%s\"/>\n", x + fmax(m->col_w, 3) / 2,
                m->p.top - 1, crew_report_kind_colour("straggler"));
    }
}

static void heat_rows(FILE *f, const heat *m)
{
    int every = m->rows <= 24 ? 1 : (m->rows + 23) / 24;
    for (int r = 0; r < m->rows; r += every) {
        char label[32];
        snprintf(label, sizeof label, "replica %d", r);
        text(f, m->p.left - 7, m->p.top + (r + 0.5) * m->row_h + 4, "end", NULL, label);
    }
}

static void heat_legend(FILE *f, const heat *m)
{
    static const double at[] = {0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5};
    static const char *const label[] = {"0.8", "0.9", "1", "1.1", "1.2", "1.3", "≥1.5"};
    legend g = {m->p.left, 18};
    text(f, g.x, g.y, "start", NULL, "compute time ÷ median replica:");
    g.x += 200;
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        char colour[8];
        ratio_colour(at[i], colour);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"11\" fill=\"%s\" stroke=\"#bbb\" stroke-width=\"0.5\"/>",
                g.x, g.y - 10, colour);
        text(f, g.x + 22, g.y, "start", NULL, label[i]);
        g.x += 22 + 7.0 * (double)strlen(label[i]) + 10;
    }
    g.x += 20;
    legend_item(f, &g, 'o', "#111", "straggler event");
    legend_item(f, &g, 'b', "#d0d0d0", "no data");
}

void crew_report_svg_heatmap(FILE *f, const crew_report_data *d)
{
    const char *what = "compute time of each replica relative to the median, by steps";
    if (d->step_lines == 0 || d->replicas == 0) {
        empty_chart(f, "heatmap", what, d->step_lines ? "no per-replica times recorded" : "no steps recorded");
        return;
    }
    heat m = {.rows = d->replicas};
    int max_cols = 3000 / m.rows; /* ~3000 cells at most, 20 to 60 columns: wide enough to average out noise */
    max_cols = max_cols < 20 ? 20 : max_cols > 60 ? 60 : max_cols;
    m.group = (d->buckets + max_cols - 1) / max_cols;
    m.cols = (d->buckets + m.group - 1) / m.group;
    m.row_h = fmin(26, fmax(4, 220.0 / m.rows));
    m.p = (frame){LEFT, 40, CHART_W - LEFT - 20, m.rows * m.row_h, 0, (double)m.cols * m.group * (double)d->bucket_steps, 0, 1};
    m.col_w = m.p.width / m.cols;
    double h = m.p.top + m.p.height + 46, means[CREW_REPORT_MAX_REPLICAS];
    svg_open(f, "chart", "heatmap", h, what);
    heat_legend(f, &m);
    for (int c = 0; c < m.cols; c++) heat_column(f, d, &m, c, means);
    heat_stragglers(f, d, &m);
    heat_rows(f, &m);
    axis_x(f, &m.p, "step");
    if (m.rows == 1)
        text(f, m.p.left + m.p.width / 2, m.p.top + m.row_h / 2 + 4, "middle", " fill=\"#666\"",
             "one replica: nothing to compare it with");
    fputs("</svg>\n", f);
}

/* ---------------------------------------------------------------- the summary's fractions */

void crew_report_svg_fractions(FILE *f, const crew_report_data *d)
{
    static const char *const names[4] = {"data", "forward + backward", "exposed communication", "optimizer"};
    const char *colours[4] = {crew_report_part_colour[CREW_PART_DATA], crew_report_part_colour[CREW_PART_FORWARD],
                              crew_report_part_colour[CREW_PART_COMM], crew_report_part_colour[CREW_PART_OPTIMIZER]};
    double total = 0;
    for (int i = 0; i < 4; i++) total += isnan(d->sum_fraction[i]) ? 0 : fmax(0, d->sum_fraction[i]);
    if (!(total > 0) || !isfinite(total)) return;
    double scale = total > 1 ? total : 1, x = 0;
    svg_open(f, "fractions", "fractions", 26, "where the average step's time went");
    for (int i = 0; i < 4; i++) {
        double v = isnan(d->sum_fraction[i]) ? 0 : fmax(0, d->sum_fraction[i]) / scale, w = v * CHART_W;
        if (w <= 0) continue;
        fprintf(f, "<rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"26\" fill=\"%s\"><title>%s: %.1f%% of a step</title></rect>\n",
                x, w, colours[i], names[i], 100 * v);
        char label[64];
        snprintf(label, sizeof label, "%s %.0f%%", names[i], 100 * v);
        if (w > 7.0 * (double)strlen(label) + 10)
            text(f, x + w / 2, 17, "middle", i == 1 ? " fill=\"#fff\"" : " fill=\"#111\"", label);
        x += w;
    }
    if (x < CHART_W - 1)
        fprintf(f, "<rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"26\" fill=\"#ddd\"><title>other: %.1f%% of a step</title></rect>\n",
                x, CHART_W - x, 100 * (1 - x / CHART_W));
    fputs("</svg>\n", f);
}

/* ---------------------------------------------------------------- the pipeline's timeline */

/* A unit for times up to span seconds that keeps tick labels short: s, ms or µs; returns the
 * factor from seconds. */
static double time_unit(double span, const char **name)
{
    if (span >= 1) {
        *name = "s";
        return 1;
    }
    if (span >= 1e-3) {
        *name = "ms";
        return 1e3;
    }
    *name = "µs";
    return 1e6;
}

/* The timeline's grid: a row per stage, x in `unit`s since the step began. */
typedef struct timeline {
    frame p;
    double row_h, bar_h; /* pixels */
    double scale;        /* units per second */
    const char *unit;
    double end;          /* the step's end in units: step_s, else the last pass's end */
} timeline;

static timeline timeline_layout(const crew_report_pipeline *pl)
{
    timeline t = {.row_h = fmin(30, fmax(8, 260.0 / pl->stages))};
    t.bar_h = t.row_h - (t.row_h > 12 ? 6 : 2);
    double first = 0, last = pl->step_s > 0 ? pl->step_s : 0; /* seconds */
    for (int i = 0; i < pl->n_ops; i++) {
        if (isnan(pl->ops[i].start_s) || isnan(pl->ops[i].end_s)) continue;
        first = fmin(first, pl->ops[i].start_s);
        last = fmax(last, pl->ops[i].end_s);
    }
    t.scale = time_unit(last - first, &t.unit);
    t.end = last * t.scale;
    t.p = (frame){LEFT, 40, CHART_W - LEFT - 20, pl->stages * t.row_h, first * t.scale, t.end, 0, 1};
    if (!(t.p.xhi > t.p.xlo) || !isfinite(t.p.xhi - t.p.xlo)) t.p.xhi = t.p.xlo + 1;
    return t;
}

/* Each stage's row: its background, which the gaps between bars show as idle time, with the
 * stage's busy share as a tooltip; and its name (bold: the slowest stage). */
static void timeline_rows(FILE *f, const crew_report_pipeline *pl, const timeline *t)
{
    double busy[CREW_REPORT_MAX_STAGES] = {0}; /* seconds of passes, per stage */
    for (int i = 0; i < pl->n_ops; i++) {
        const crew_report_op *op = &pl->ops[i];
        if (!isnan(op->start_s) && !isnan(op->end_s)) busy[op->stage] += op->end_s - op->start_s;
    }
    int every = t->row_h >= 12 ? 1 : (int)ceil(12 / t->row_h);
    double x0 = fx(&t->p, 0), x1 = fx(&t->p, t->end);
    for (int s = 0; s < pl->stages; s++) {
        double y = t->p.top + s * t->row_h + (t->row_h - t->bar_h) / 2;
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#e6e6e2\"><title>stage %d: "
                   "busy %.4g %s",
                x0, y, fmax(x1 - x0, 0), t->bar_h, s, busy[s] * t->scale, t->unit);
        if (t->end > 0) fprintf(f, " of %.4g %s (idle %.0f%%)", t->end, t->unit, 100 * fmax(0, 1 - busy[s] * t->scale / t->end));
        fputs("</title></rect>\n", f);
        if (s % every && s != pl->slowest_stage) continue; /* thin rows: every other name, or fewer */
        char label[32];
        snprintf(label, sizeof label, "stage %d", s);
        text(f, t->p.left - 7, y + t->bar_h / 2 + 4, "end", s == pl->slowest_stage ? " font-weight=\"bold\"" : NULL,
             label);
    }
}

/* One bar per pass, forward and backward in the colours of the breakdown chart; its micro-batch's
 * number on it where it fits. Each bar is <rect class="op-forward"> or <rect class="op-backward">. */
static void timeline_bars(FILE *f, const crew_report_pipeline *pl, const timeline *t)
{
    for (int i = 0; i < pl->n_ops; i++) {
        const crew_report_op *op = &pl->ops[i];
        if (isnan(op->start_s) || isnan(op->end_s)) continue; /* not measured: nothing to draw */
        const char *pass = op->backward ? "backward" : "forward";
        double x = fx(&t->p, op->start_s * t->scale), w = fmax(1, fx(&t->p, op->end_s * t->scale) - x);
        double y = t->p.top + op->stage * t->row_h + (t->row_h - t->bar_h) / 2;
        fprintf(f, "<rect class=\"op-%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                   "<title>stage %d, micro-batch %d, %s: %.4g–%.4g %s</title></rect>\n",
                pass, x, y, w, t->bar_h, crew_report_part_colour[op->backward ? CREW_PART_BACKWARD : CREW_PART_FORWARD],
                op->stage, op->micro, pass, op->start_s * t->scale, op->end_s * t->scale, t->unit);
        char label[16];
        snprintf(label, sizeof label, "%d", op->micro);
        if (t->bar_h >= 10 && w >= 7.0 * (double)strlen(label) + 4)
            text(f, x + w / 2, y + t->bar_h / 2 + 4, "middle",
                 op->backward ? " fill=\"#111\" pointer-events=\"none\"" : " fill=\"#fff\" pointer-events=\"none\"", label);
    }
}

void crew_report_svg_pipeline(FILE *f, const crew_report_data *d)
{
    const char *what = "the passes of one step on each pipeline stage against time";
    if (d->pipeline_lines == 0) return;
    const crew_report_pipeline *pl = &d->pipeline;
    if (pl->n_ops == 0) {
        empty_chart(f, "pipeline", what, "no passes recorded for this step");
        return;
    }
    timeline t = timeline_layout(pl);
    svg_open(f, "chart", "pipeline", t.p.top + t.p.height + 46, what);
    legend g = {t.p.left, 18};
    legend_item(f, &g, 'b', crew_report_part_colour[CREW_PART_FORWARD], "forward");
    legend_item(f, &g, 'b', crew_report_part_colour[CREW_PART_BACKWARD], "backward");
    legend_item(f, &g, 'b', "#e6e6e2", "idle");
    if (pl->slowest_stage >= 0) text(f, g.x, g.y, "start", " font-weight=\"bold\"", "bold: the slowest stage");
    char label[48];
    snprintf(label, sizeof label, "%s since the step began", t.unit);
    axis_x_ticks(f, &t.p, label, 0); /* first: its grid lines go under the bars */
    timeline_rows(f, pl, &t);
    timeline_bars(f, pl, &t);
    fputs("</svg>\n", f);
}
