/* scaling.c — the cost model of data-parallel steps (scaling.h), fitted to trials; projections
 * to other replica counts and links; the recommendation; the hint after a training run. */
#include "advise/scaling.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"

#define EFFICIENCY_FLOOR 0.75
#define HINT_EFFICIENCY 0.5
#define BUCKET_BYTES (25.0 * 1024 * 1024) /* crew_fit_options.bucket_mb's default */

static double ring_factor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

static double allreduce_s(const crew_link *l, int n, int64_t bytes)
{
    if (n <= 1) return 0.0;
    return l->alpha_s + ring_factor(n) * (double)bytes / l->bytes_per_s;
}

/* The trial the per-replica figures come from: one replica if measured, else the fewest. */
static const crew_scale_trial *base_trial(const crew_scale_trial *t, int n)
{
    const crew_scale_trial *b = &t[0];
    for (int i = 1; i < n; i++)
        if (t[i].devices < b->devices) b = &t[i];
    return b;
}

/* Least squares of y = α + x·(S/β) over the counts above one; needs two distinct x. */
static int fit_two(const crew_scale_model *cm, const double *x, const double *y, int k, crew_link *out)
{
    double mx = 0, my = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < k; i++) mx += x[i] / k, my += y[i] / k;
    for (int i = 0; i < k; i++) sxx += (x[i] - mx) * (x[i] - mx), sxy += (x[i] - mx) * (y[i] - my);
    if (sxx < 1e-9) return 0;
    double slope = sxy / sxx, alpha = my - slope * mx;
    if (alpha < 0) { /* through the origin instead: no latency to speak of */
        double xx = 0, xy = 0;
        for (int i = 0; i < k; i++) xx += x[i] * x[i], xy += x[i] * y[i];
        alpha = 0;
        slope = xy / xx;
    }
    out->alpha_s = alpha;
    out->bytes_per_s = slope > 1e-12 ? (double)cm->gradient_bytes / slope : 1e18;
    return 1;
}

/* What the fallback link measured, for the notes: shared memory unless it says otherwise. */
static const char *link_name(const crew_link *l) { return l->name[0] ? l->name : "shared memory"; }

/* The all-reduce times measured at the counts above one: exposed + hidden. Rank 0's share of it
 * also holds its waits for a slower replica, which makes α an effective latency. */
static void fit_link(crew_scale_model *cm, const crew_scale_trial *t, int n, const crew_link *fallback)
{
    double x[64], y[64];
    int k = 0, last = -1;
    for (int i = 0; i < n && k < 64; i++) {
        if (t[i].devices <= 1) continue;
        double busy = t[i].comm_exposed_s + t[i].comm_hidden_s;
        x[k] = ring_factor(t[i].devices);
        y[k++] = busy > 1e-6 ? busy : 1e-6;
        last = i;
    }
    cm->link = *fallback;
    if (k >= 2 && fit_two(cm, x, y, k, &cm->link)) {
        cm->link_fitted = 2;
        snprintf(cm->link_note, sizeof cm->link_note, "alpha and beta fitted to the all-reduce times measured at %d "
                 "replica counts", k);
        return;
    }
    if (k >= 1) { /* one count: the fallback's shape, scaled to what was measured */
        double want = y[0], had = allreduce_s(fallback, t[last].devices, cm->gradient_bytes);
        double f = had > 0 ? want / had : 1.0;
        cm->link.alpha_s = fallback->alpha_s * f;
        cm->link.bytes_per_s = fallback->bytes_per_s / f;
        cm->link_fitted = 1;
        snprintf(cm->link_note, sizeof cm->link_note, "%s, measured, scaled by %.2f to the all-reduce time "
                 "measured at %d replicas", link_name(fallback), f, t[last].devices);
        return;
    }
    cm->link_fitted = 0;
    snprintf(cm->link_note, sizeof cm->link_note, "%s, measured: an all-reduce of the gradients' size between two "
             "replicas; no trial above one replica to fit it to", link_name(fallback));
}

/* How fast a replica among n computes relative to one alone on this machine: the probe's speed
 * with every core busy, interpolated from 1 for fewer replicas; beyond the cores they take turns. */
static double core_share(const crew_scale_model *cm, int n)
{
    if (cm->cores <= 0 || n <= 1) return 1.0;
    double s = cm->parallel_speed;
    if (n > cm->cores) return s * cm->cores / n;
    return cm->cores > 1 ? 1.0 - (1.0 - s) * (n - 1) / (cm->cores - 1) : 1.0;
}

/* The lockstep speed from the trial with the most replicas within the cores (above one): the base
 * trial's per-step work over that trial's (its waits for a slower replica included, as in the
 * probe), carried from N to all the cores along the line core_share() interpolates. */
static void fit_speed(crew_scale_model *cm, const crew_scale_trial *t, int n, const crew_scale_trial *base)
{
    const crew_scale_trial *w = NULL;
    for (int i = 0; i < n; i++)
        if (t[i].devices > 1 && t[i].devices <= cm->cores && (!w || t[i].devices > w->devices)) w = &t[i];
    double work = w ? w->compute_s + w->optimizer_s + w->other_s : 0.0;
    if (!w || base->devices != 1 || work <= 0) return;
    double s = cm->compute_s / work;
    if (w->devices < cm->cores) s = 1.0 - (1.0 - s) * (cm->cores - 1) / (w->devices - 1);
    cm->parallel_speed = s < 0.05 ? 0.05 : s > 1.0 ? 1.0 : s;
    cm->speed_fitted = 1;
}

crew_status crew_scale_fit(const crew_scale_trial *t, int n, int64_t gradient_bytes, const crew_link *fallback,
                           int cores, double parallel_speed, crew_scale_model *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_fit: NULL model");
    memset(out, 0, sizeof *out);
    out->noise_scale = NAN; /* unknown until the caller sets it */
    if (!t || n < 1 || !fallback || gradient_bytes < 0 || !(fallback->bytes_per_s > 0) || !(fallback->alpha_s >= 0))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_fit needs at least one trial, the gradient bytes "
                           "and a fallback link with positive bandwidth");
    const crew_scale_trial *b = base_trial(t, n);
    out->batch_per_device = b->global_batch / b->devices;
    out->gradient_bytes = gradient_bytes;
    out->compute_s = b->compute_s + b->optimizer_s + b->other_s;
    out->data_s = b->data_s;
    out->helper_s = b->helper_cpu_s;
    out->jitter_s = b->compute_jitter_s;
    out->cores = cores > 0 ? cores : 0;
    out->parallel_speed = parallel_speed > 0 && parallel_speed <= 1 ? parallel_speed : 1.0;
    fit_speed(out, t, n, b);
    /* Gradients within one bucket (25 MiB by default) are all-reduced only once the backward pass
     * is over: nothing of it can hide, whatever the step's accounting of the last moments says. */
    double hidden = 0, busy = 0;
    for (int i = 0; i < n; i++)
        if (t[i].devices > 1) hidden += t[i].comm_hidden_s, busy += t[i].comm_hidden_s + t[i].comm_exposed_s;
    out->hidden_fraction = busy > 0 && gradient_bytes > BUCKET_BYTES ? hidden / busy : 0.0;
    fit_link(out, t, n, fallback);
    return CREW_OK;
}

static void predict_raw(const crew_scale_model *cm, const crew_link *link, int shared, int n, crew_scale_point *p)
{
    memset(p, 0, sizeof *p);
    p->devices = n;
    p->global_batch = (int64_t)n * cm->batch_per_device;
    p->compute_s = cm->compute_s;
    p->data_s = cm->data_s;
    /* On this machine the probe's lockstep rounds already hold the waits for the slowest replica. */
    p->sync_s = shared && cm->cores > 0 ? 0.0 : cm->jitter_s * crew_scale_expected_max(n);
    p->comm_s = (1.0 - cm->hidden_fraction) * allreduce_s(link, n, cm->gradient_bytes) + (n > 1 ? link->alpha_s : 0.0);
    if (shared && cm->cores > 0 && n >= cm->cores) {
        /* Every core busy: the replicas' and the helpers' CPU work shares cores·speed of capacity. */
        double capacity = cm->cores * core_share(cm, cm->cores);
        double helpers = cm->speed_fitted ? 0.0 : cm->helper_s; /* a fitted speed already holds them */
        p->shared_cores_s = n * (cm->compute_s + helpers) / capacity - cm->compute_s;
    } else if (shared) { /* idle cores take the helpers; side by side the replicas still slow down */
        p->shared_cores_s = cm->compute_s * (1.0 / core_share(cm, n) - 1.0);
    }
    p->step_s = p->compute_s + p->data_s + p->sync_s + p->comm_s + p->shared_cores_s;
    p->samples_per_s = p->step_s > 0 ? (double)p->global_batch / p->step_s : 0.0;
}

/* E epochs at this count, as training runs them: the last partial global batch is dropped, so a
 * count whose global batch exceeds the training set never steps (INFINITY: no time to give). */
static double epochs_s(const crew_scale_point *p, int64_t samples, int epochs)
{
    int64_t steps = p->global_batch > 0 ? samples / p->global_batch : 0;
    return steps > 0 ? (double)epochs * (double)steps * p->step_s : INFINITY;
}

void crew_scale_predict(const crew_scale_model *cm, const crew_link *link, int devices, int64_t train_samples,
                        int epochs, crew_scale_point *out)
{
    const crew_link *l = link ? link : &cm->link;
    crew_scale_point one;
    predict_raw(cm, l, link == NULL, 1, &one);
    predict_raw(cm, l, link == NULL, devices < 1 ? 1 : devices, out);
    out->speedup = one.samples_per_s > 0 ? out->samples_per_s / one.samples_per_s : NAN;
    out->efficiency = out->speedup / out->devices;
    out->epochs_s = epochs_s(out, train_samples, epochs);
    out->statistical_efficiency = out->goodput = out->to_target_s = out->to_target_steps = NAN;
    const double e = crew_statistical_efficiency(cm->noise_scale, cm->noise_batch, out->global_batch);
    if (isfinite(e)) {
        out->statistical_efficiency = e;
        out->goodput = out->samples_per_s * e;
        out->to_target_s = out->epochs_s / e;
        int64_t steps = out->global_batch > 0 ? train_samples / out->global_batch : 0;
        out->to_target_steps = steps > 0 ? (double)steps * epochs / e : INFINITY;
    }
}

double crew_statistical_efficiency(double noise_scale, int64_t noise_batch, int64_t global_batch)
{
    if (!(noise_scale > 0 && isfinite(noise_scale)) || noise_batch < 1 || global_batch < 1) return NAN;
    return (noise_scale + (double)noise_batch) / (noise_scale + (double)global_batch);
}

static void say(char *buf, size_t len, const char *fmt, ...) CREW_PRINTF(3, 4);
static void say(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* Why efficiency fell under the floor at this count, and what would help. */
static void explain_stall(const crew_scale_model *cm, const crew_link *l, const crew_scale_point *p, char *buf, size_t len)
{
    double latency = 2 * l->alpha_s, bandwidth = ring_factor(p->devices) * (double)cm->gradient_bytes / l->bytes_per_s;
    double parts[4] = {p->comm_s, p->sync_s, p->data_s, p->shared_cores_s};
    int worst = 0;
    for (int i = 1; i < 4; i++)
        if (parts[i] > parts[worst]) worst = i;
    char head[160];
    snprintf(head, sizeof head, "scaling stalls at %d devices (%.0f%% efficiency): ", p->devices, 100 * p->efficiency);
    if (worst == 3)
        say(buf, len, "%sside by side the replicas compute at %.0f%% of one alone: this machine has %d cores%s; use at "
            "most %d replicas here, or devices with cores of their own", head, 100 * core_share(cm, p->devices),
            cm->cores, cm->parallel_speed < 0.9 ? " that slow each other down (shared units, memory, other processes)"
                                                : "", cm->cores);
    else if (worst == 2)
        say(buf, len, "%sdata loading: each replica spends %.1f ms per step getting its batch; loader threads "
            "on cores of their own (--loader-threads), cheaper augmentation or faster storage would help", head, 1e3 * p->data_s);
    else if (worst == 1)
        say(buf, len, "%sstragglers: a step's compute varies by %.1f ms and the slowest of %d replicas sets the pace; "
            "a quieter machine, pinned threads or a larger per-device batch (steadier steps) would help", head,
            1e3 * cm->jitter_s, p->devices);
    else if (latency > bandwidth || cm->compute_s < 4 * p->comm_s)
        say(buf, len, "%sthe per-device batch of %lld is too small: %.1f ms of compute per step cannot hide %.1f ms of "
            "communication (%.0f us latency per all-reduce); a larger --batch-per-device, or accumulation "
            "(--global-batch), pays it once for more samples", head, (long long)cm->batch_per_device,
            1e3 * cm->compute_s, 1e3 * p->comm_s, 1e6 * l->alpha_s);
    else
        say(buf, len, "%scommunication: all-reducing %.1f MB per step takes %.1f ms at %.2f GB/s; a faster link, "
            "smaller buckets (--bucket-mb) to overlap more of it with the backward pass, or fewer steps per sample "
            "(a larger batch) would help", head, cm->gradient_bytes / 1e6, 1e3 * p->comm_s, l->bytes_per_s / 1e9);
}

/* With a noise scale: the count that reaches the asked epochs' progress (at the noise's batch)
 * soonest, and the last one each of whose successors still cuts that time by 10% or more. */
#define GOODPUT_GAIN 0.10
static void advise_goodput(const crew_scale_model *cm, const crew_link *link, const int *counts, int n_counts,
                           int64_t train_samples, int epochs, crew_scale_advice *out)
{
    out->goodput_s = NAN;
    if (!(cm->noise_scale > 0 && cm->noise_batch > 0) || n_counts < 1) return;
    crew_scale_point best = {0}, at = {0}, p, prev = {0}; /* at: the last count that pays */
    int have = 0, stopped = 0;
    for (int i = 0; i < n_counts; i++) {
        crew_scale_predict(cm, link, counts[i], train_samples, epochs, &p);
        if (!isfinite(p.to_target_s)) continue;
        if (!have || p.to_target_s < best.to_target_s) best = p;
        if (!have || (!stopped && p.to_target_s <= (1.0 - GOODPUT_GAIN) * prev.to_target_s))
            at = p;
        else
            stopped = 1;
        prev = p;
        have = 1;
    }
    if (!have) return;
    const int pays = at.devices;
    out->goodput_devices = best.devices;
    out->goodput_s = best.to_target_s;
    out->pays_until_devices = pays;
    char t[32], b[32];
    crew_format_duration(best.to_target_s, t, sizeof t);
    snprintf(b, sizeof b, "%.3g", cm->noise_scale);
    say(out->goodput_reason, sizeof out->goodput_reason,
        "counting the gradient noise scale (B_noise = %s samples, measured at a global batch of %lld): %d device%s "
        "reach the progress of %d epoch%s at that batch soonest, in about %s (a sample at their global batch of %lld "
        "is worth %.2f of one at %lld); adding devices pays up to %d (a global batch of %lld, %.2g of the noise "
        "scale), each count up to it cutting that time by %.0f%% or more; past it more devices buy samples per "
        "second, not time to the result", b, (long long)cm->noise_batch, best.devices, best.devices == 1 ? "" : "s",
        epochs, epochs == 1 ? "" : "s", t, (long long)best.global_batch, best.statistical_efficiency,
        (long long)cm->noise_batch, pays, (long long)at.global_batch, (double)at.global_batch / cm->noise_scale,
        100 * GOODPUT_GAIN);
}

void crew_scale_advise(const crew_scale_model *cm, const crew_link *link, const int *counts, int n_counts,
                       int64_t train_samples, int epochs, double worth_it_s, crew_scale_advice *out)
{
    memset(out, 0, sizeof *out);
    advise_goodput(cm, link, counts, n_counts, train_samples, epochs, out);
    const crew_link *l = link ? link : &cm->link;
    crew_scale_point one, best, p;
    crew_scale_predict(cm, link, 1, train_samples, epochs, &one);
    best = one;
    out->one_device_s = one.epochs_s;
    for (int i = 0; i < n_counts; i++) {
        crew_scale_predict(cm, link, counts[i], train_samples, epochs, &p);
        /* A count whose global batch exceeds the training set never steps: nothing to recommend. */
        if (p.efficiency >= EFFICIENCY_FLOOR && p.devices > best.devices && isfinite(p.epochs_s)) best = p;
        if (p.efficiency < EFFICIENCY_FLOOR && !out->stall_devices) {
            out->stall_devices = p.devices;
            explain_stall(cm, l, &p, out->stall, sizeof out->stall);
        }
    }
    char t1[32], tn[32], limit[32];
    crew_format_duration(out->one_device_s, t1, sizeof t1);
    crew_format_duration(worth_it_s, limit, sizeof limit);
    if (out->one_device_s <= worth_it_s) {
        out->recommended_devices = 1;
        out->recommended_s = out->one_device_s;
        say(out->reason, sizeof out->reason, "stay on one device: it trains %d epoch%s in about %s, within the %s "
            "worth-it threshold; more devices would add coordination and failure modes for little time saved",
            epochs, epochs == 1 ? "" : "s", t1, limit);
        return;
    }
    out->recommended_devices = best.devices;
    out->recommended_s = best.epochs_s;
    crew_format_duration(out->recommended_s, tn, sizeof tn);
    if (best.devices == 1)
        say(out->reason, sizeof out->reason, "stay on one device: it needs about %s for %d epoch%s, but no larger count "
            "keeps a projected efficiency of %.0f%%", t1, epochs, epochs == 1 ? "" : "s", 100 * EFFICIENCY_FLOOR);
    else
        say(out->reason, sizeof out->reason, "use %d devices: %d epoch%s take about %s instead of %s on one device "
            "(speedup %.1fx, projected efficiency %.0f%%); it is the largest count at or above %.0f%%", best.devices,
            epochs, epochs == 1 ? "" : "s", tn, t1, best.speedup, 100 * best.efficiency, 100 * EFFICIENCY_FLOOR);
}

int crew_fit_scaling_hint(const crew_fit_result *r, const crew_fit_plan *p, char *buf, size_t len)
{
    if (!buf || len == 0) return 0;
    buf[0] = '\0';
    if (!r || !p || r->steps <= 0) return 0;
    /* The share of a step one device would also spend: its own forward, backward and update. The
     * rest is waiting, which more devices add or do not remove. */
    double work = r->compute_fraction + r->optimizer_fraction, data = r->data_fraction, comm = r->comm_exposed_fraction;
    if (p->devices > 1 && work < HINT_EFFICIENCY) {
        say(buf, len, "hint: the %d replicas computed only %.0f%% of each step (waiting %.0f%% on all-reduce, %.0f%% on "
            "data), an estimated scaling efficiency of %.0f%%: fewer devices would train about as fast; crew scale "
            "measures it", p->devices, 100 * work, 100 * comm, 100 * data, 100 * work);
        return 1;
    }
    if (data + comm > work) {
        say(buf, len, "hint: each step waited longer (%.0f%% on data, %.0f%% on all-reduce) than it computed (%.0f%%): "
            "%s", 100 * data, 100 * comm, 100 * work,
            data < comm ? "a larger per-device batch or fewer devices would spend less of each step waiting"
            : p->loader_inline ? "the replicas prepare their own batches (every core computes): cores left free for "
                                 "loader threads, or cheaper preprocessing, would help more than more devices"
                               : "more loader threads (--loader-threads) would help more than more devices");
        return 1;
    }
    return 0;
}
