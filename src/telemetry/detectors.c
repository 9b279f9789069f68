/* detectors.c — reading the step records for trouble: stragglers, input-bound steps, loss
 * spikes; and the end-of-run verdict on what held the run back. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "telemetry/monitor_internal.h"

#define CREW_WARMUP_STEPS 5

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v without element `skip` (n − 1 values; n ≥ 2). */
static double median_without(const double *v, int n, int skip)
{
    double *w = malloc((size_t)n * sizeof *w);
    if (!w) return NAN;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != skip) w[k++] = v[i];
    qsort(w, (size_t)k, sizeof *w, cmp_double);
    double med = k % 2 ? w[k / 2] : 0.5 * (w[k / 2 - 1] + w[k / 2]);
    free(w);
    return med;
}

static crew_status close_window(crew_monitor *m, int64_t last_step)
{
    const double steps = (double)m->win_steps;
    if (m->n >= 2)
        for (int r = 0; r < m->n; r++) {
            double mine = m->win_compute[r] / steps, others = median_without(m->win_compute, m->n, r) / steps;
            double slower = others > 0 ? mine / others - 1.0 : 0.0;
            if (slower > m->cfg.straggler_threshold)
                CREW_TRY(crew_monitor_event(m, CREW_EVENT_STRAGGLER, last_step, r, slower,
                                            "replica %d was %.0f%% slower than the median of the others over steps "
                                            "%lld-%lld (compute %.4f s vs %.4f s per step)",
                                            r, 100.0 * slower, (long long)m->win_first, (long long)last_step, mine,
                                            others));
        }
    double frac = m->win_step > 0 ? m->win_data / m->win_step : 0.0;
    if (frac > m->cfg.input_bound_fraction && !m->input_bound_reported) {
        m->input_bound_reported = 1;
        if (m->plan.loader_inline) /* no loader threads to add: the replicas' own threads did the work */
            CREW_TRY(crew_monitor_event(m, CREW_EVENT_INPUT_BOUND, last_step, -1, frac,
                                        "input-bound: replicas spent %.0f%% of each step preparing their own batches "
                                        "over steps %lld-%lld (%.4f s of %.4f s); preprocess once with crew prep, use "
                                        "cheaper augmentation, or leave cores free for loader threads (fewer "
                                        "replicas, --loader-inline off)",
                                        100.0 * frac, (long long)m->win_first, (long long)last_step,
                                        m->win_data / steps, m->win_step / steps));
        else
            CREW_TRY(crew_monitor_event(m, CREW_EVENT_INPUT_BOUND, last_step, -1, frac,
                                        "input-bound: replicas waited %.0f%% of each step for data over steps "
                                        "%lld-%lld (%.4f s of %.4f s); use more loader threads (--loader-threads), a "
                                        "deeper prefetch (--prefetch), or preprocess once with crew prep",
                                        100.0 * frac, (long long)m->win_first, (long long)last_step,
                                        m->win_data / steps, m->win_step / steps));
    }
    memset(m->win_compute, 0, (size_t)m->n * sizeof *m->win_compute);
    m->win_steps = 0;
    m->win_data = m->win_step = 0.0;
    return CREW_OK;
}

/* A loss more than z standard deviations above the mean of the previous window (llm.c's rule). */
static crew_status check_spike(crew_monitor *m, const crew_step_record *r)
{
    int64_t have = m->n_losses < CREW_LOSS_WINDOW ? m->n_losses : CREW_LOSS_WINDOW;
    if (have >= 20 && isfinite(r->loss)) {
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < have; i++) mean += m->losses[i];
        mean /= (double)have;
        for (int64_t i = 0; i < have; i++) var += (m->losses[i] - mean) * (m->losses[i] - mean);
        double sd = sqrt(var / (double)(have - 1));
        double z = sd > 0 ? ((double)r->loss - mean) / sd : 0.0;
        if (z > m->cfg.loss_spike_z)
            CREW_TRY(crew_monitor_event(m, CREW_EVENT_LOSS_SPIKE, r->step, -1, z,
                                        "loss spike at step %lld: %.4g is %.1f standard deviations above the mean "
                                        "%.4g of the last %lld steps",
                                        (long long)r->step, (double)r->loss, z, mean, (long long)have));
    }
    if (isfinite(r->loss)) m->losses[m->n_losses++ % CREW_LOSS_WINDOW] = r->loss;
    return CREW_OK;
}

crew_status crew_detect_step(crew_monitor *m, const crew_step_record *r)
{
    double slowest_data = 0.0, compute = 0.0, exposed = 0.0, hidden = 0.0, optimizer = 0.0;
    for (int i = 0; i < r->n_replicas && i < m->n; i++) {
        const crew_step_times *t = &r->replicas[i];
        double c = crew_step_compute_s(t);
        m->win_compute[i] += c;
        m->total_compute[i] += c;
        slowest_data = fmax(slowest_data, t->data_s);
        compute += c;
        exposed += t->comm_exposed_s;
        hidden += t->comm_hidden_s;
        optimizer += t->optimizer_s;
    }
    double n = (double)(r->n_replicas > 0 ? r->n_replicas : 1);
    /* The first steps fill the loader's pipeline and warm the caches: they say nothing about the
     * steady state, so the input-bound verdict leaves them out. */
    if (r->step <= CREW_WARMUP_STEPS) slowest_data = 0.0;
    if (m->win_steps++ == 0) m->win_first = r->step;
    m->win_data += slowest_data;
    m->win_step += r->step_s;
    m->steps++;
    m->sum_step += r->step_s;
    m->sum_data += slowest_data;
    m->sum_compute += compute / n;
    m->sum_exposed += exposed / n;
    m->sum_hidden += hidden / n;
    m->sum_optimizer += optimizer / n;
    CREW_TRY(check_spike(m, r));
    if (m->win_steps >= m->cfg.straggler_window) CREW_TRY(close_window(m, r->step));
    return CREW_OK;
}

void crew_summarize(crew_monitor *m, crew_fit_result *res)
{
    res->noise_scale = m->noise.b_simple;
    crew_noise_scale_text(&m->noise, m->plan.global_batch, m->plan.batch_per_device, m->cfg.noise_scale_every,
                          res->noise_text, sizeof res->noise_text);
    res->gflops = m->plan.flops_per_sample * res->samples_per_s / 1e9;
    res->peak_fraction = m->plan.peak_gflops > 0 ? res->gflops / m->plan.peak_gflops : NAN;
    if (m->steps == 0 || m->sum_step <= 0) {
        snprintf(res->bottleneck, sizeof res->bottleneck, "no training steps ran");
        return;
    }
    res->data_fraction = m->sum_data / m->sum_step;
    res->compute_fraction = m->sum_compute / m->sum_step;
    res->comm_exposed_fraction = m->sum_exposed / m->sum_step;
    res->optimizer_fraction = m->sum_optimizer / m->sum_step;
    res->comm_hidden_s = m->sum_hidden / (double)m->steps;
    int worst = -1;
    double worst_slower = 0.0;
    for (int r = 0; m->n >= 2 && r < m->n; r++) {
        double others = median_without(m->total_compute, m->n, r);
        double slower = others > 0 ? m->total_compute[r] / others - 1.0 : 0.0;
        if (slower > worst_slower) worst_slower = slower, worst = r;
    }
    const char *tail_fmt = " (data %.0f%%, forward+backward %.0f%%, exposed communication %.0f%%, update %.0f%%)";
    char tail[160];
    snprintf(tail, sizeof tail, tail_fmt, 100 * res->data_fraction, 100 * res->compute_fraction,
             100 * res->comm_exposed_fraction, 100 * res->optimizer_fraction);
    if (res->data_fraction > m->cfg.input_bound_fraction)
        snprintf(res->bottleneck, sizeof res->bottleneck, "input-bound: replicas waited %.0f%% of each step for data%s",
                 100 * res->data_fraction, tail);
    else if (res->stages > 1 && res->bubble_fraction > 0.10)
        snprintf(res->bottleneck, sizeof res->bottleneck,
                 "pipeline-bound: the stages waited %.0f%% of each step (ideal bubble %.0f%%); stage %d computes "
                 "longest%.120s", 100 * res->bubble_fraction,
                 100.0 * (res->stages - 1) / (m->plan.accumulation + res->stages - 1), res->bottleneck_stage, tail);
    else if (res->comm_exposed_fraction > 0.10)
        snprintf(res->bottleneck, sizeof res->bottleneck,
                 "communication-bound: %.0f%% of each step waited on all-reduce%s", 100 * res->comm_exposed_fraction, tail);
    else if (worst >= 0 && worst_slower > m->cfg.straggler_threshold)
        snprintf(res->bottleneck, sizeof res->bottleneck, "straggler: replica %d was %.0f%% slower than the others%s",
                 worst, 100 * worst_slower, tail);
    else
        snprintf(res->bottleneck, sizeof res->bottleneck, "compute-bound: forward and backward took %.0f%% of each step%s",
                 100 * res->compute_fraction, tail);
}
