/* monitor.c — metrics.jsonl, events, and the end-of-run summary (the detectors are in
 * detectors.c, what a resumed run appends in monitor_resume.c). One JSON object per line, formatted
 * in memory and written when it ends (crew_text_file): a line per step must be cheap, a killed run
 * must leave whole lines, and a full disk must be reported with its real reason (text_file.h says
 * why not stdio). */
#include "telemetry/monitor.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/links.h"
#include "core/status.h"
#include "core/timer.h"
#include "telemetry/monitor_internal.h"

const char *crew_event_kind_name(crew_event_kind kind)
{
    switch (kind) {
    case CREW_EVENT_STRAGGLER: return "straggler";
    case CREW_EVENT_INPUT_BOUND: return "input_bound";
    case CREW_EVENT_NAN: return "nan";
    case CREW_EVENT_SKIPPED_UPDATE: return "skipped_update";
    case CREW_EVENT_LOSS_SPIKE: return "loss_spike";
    case CREW_EVENT_DIVERGENCE: return "divergence";
    case CREW_EVENT_HANG: return "hang";
    default: return "info";
    }
}

/* A number, or null when it is not finite (JSON has no NaN). */
static void json_num(crew_text_file *f, const char *key, double v, int comma)
{
    if (isfinite(v))
        crew_text_printf(f, "\"%s\":%.7g%s", key, v, comma ? "," : "");
    else
        crew_text_printf(f, "\"%s\":null%s", key, comma ? "," : "");
}

static crew_status write_run_line(crew_monitor *m)
{
    const crew_fit_plan *p = &m->plan;
    crew_text_file *f = &m->jsonl;
    crew_text_printf(f, "{\"type\":\"run\",\"time\":%.3f,\"crew_version\":", crew_unix_now());
    crew_text_json_string(f, crew_version());
    char blas[256]; /* which kernels computed this run: speed figures are read against them */
    crew_blas_describe(blas, sizeof blas);
    crew_text_puts(f, ",\"blas\":");
    crew_text_json_string(f, blas);
    crew_text_printf(f, ",\"devices\":%d,\"batch_per_device\":%lld,\"accumulation\":%d,\"global_batch\":%lld,"
                        "\"steps_per_epoch\":%lld,\"total_steps\":%lld,\"epochs\":%d,",
                     p->devices, (long long)p->batch_per_device, p->accumulation, (long long)p->global_batch,
                     (long long)p->steps_per_epoch, (long long)p->total_steps, p->epochs);
    json_num(f, "base_lr", p->base_lr, 1);
    json_num(f, "scaled_lr", p->scaled_lr, 1);
    crew_text_printf(f, "\"warmup_steps\":%lld}", (long long)p->warmup_steps);
    return crew_text_end_line(f);
}

/* metrics.jsonl, new or (a resumed run) to append to after its last complete line. */
static crew_status open_record(crew_monitor *m)
{
    /* Never through a link (docs/CHECKPOINTS.md, "Symbolic links"): O_NOFOLLOW closes the gap
     * between the check and the open. */
    static const char why[] = "crew writes a run's record only into a file of its own, never through a link (remove the link)";
    CREW_TRY(crew_refuse_link(m->path, why));
    int flags = O_CLOEXEC | O_CREAT | O_NOFOLLOW | (m->cfg.append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC);
    int fd = open(m->path, flags, 0644);
    if (fd < 0 && errno == ELOOP) return crew_refuse_link(m->path, why);
    if (fd < 0) return crew_errorf(CREW_CODE_IO, "cannot create %s: %s", m->path, strerror(errno));
    if (m->cfg.append) {
        crew_status s = crew_monitor_resume_scan(m, fd);
        if (s) {
            close(fd);
            return s;
        }
    }
    CREW_TRY(crew_text_attach(&m->jsonl, fd, m->path));
    m->has_file = 1;
    if (m->torn_completed) {
        crew_text_putc(&m->jsonl, '\n'); /* the last line lacked only its newline */
        CREW_TRY(crew_text_flush(&m->jsonl));
    }
    return CREW_OK;
}

crew_status crew_monitor_open(const crew_monitor_config *cfg, const crew_fit_plan *plan, crew_monitor **out)
{
    *out = NULL;
    crew_monitor *m = calloc(1, sizeof *m);
    if (!m) return CREW_OOM();
    m->jsonl.fd = -1;
    m->cfg = *cfg;
    m->plan = *plan;
    m->n = plan->devices;
    if (m->cfg.straggler_threshold <= 0) m->cfg.straggler_threshold = 0.2;
    if (m->cfg.straggler_window <= 0) m->cfg.straggler_window = 50;
    if (m->cfg.input_bound_fraction <= 0) m->cfg.input_bound_fraction = 0.05;
    if (m->cfg.loss_spike_z <= 0) m->cfg.loss_spike_z = 6.0; /* minibatch losses are skewed: 4σ happens */
    crew_noise_scale_init(&m->noise, m->cfg.noise_scale_every);
    m->win_compute = calloc((size_t)m->n, sizeof *m->win_compute);
    m->total_compute = calloc((size_t)m->n, sizeof *m->total_compute);
    if (!m->win_compute || !m->total_compute) {
        crew_monitor_close(m);
        return CREW_OOM();
    }
    if (cfg->run_dir) {
        crew_status s = CREW_OK;
        if (mkdir(cfg->run_dir, 0755) != 0 && errno != EEXIST)
            s = crew_errorf(CREW_CODE_IO, "cannot create run directory %s: %s", cfg->run_dir, strerror(errno));
        else if ((size_t)snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", cfg->run_dir) >= sizeof m->path)
            s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "run directory %s: path too long", cfg->run_dir);
        if (!s) s = open_record(m);
        if (!s) s = write_run_line(m);
        if (!s) s = crew_monitor_tb_open(m);
        if (s) {
            crew_monitor_close(m);
            return s;
        }
    }
    *out = m;
    return CREW_OK;
}

double crew_monitor_gflops(const crew_monitor *m, const crew_step_record *r)
{
    return r->step_s > 0 ? m->plan.flops_per_sample * (double)r->global_batch / r->step_s / 1e9 : NAN;
}

static crew_status write_step_line(crew_monitor *m, const crew_step_record *r)
{
    crew_text_file *f = &m->jsonl;
    crew_text_printf(f, "{\"type\":\"step\",\"step\":%lld,\"epoch\":%d,\"time\":%.3f,", (long long)r->step, r->epoch,
                     r->time);
    json_num(f, "loss", r->loss, 1);
    json_num(f, "accuracy", r->accuracy, 1);
    json_num(f, "lr", r->lr, 1);
    crew_text_printf(f, "\"global_batch\":%lld,", (long long)r->global_batch);
    json_num(f, "step_s", r->step_s, 1);
    json_num(f, "samples_per_s", r->step_s > 0 ? (double)r->global_batch / r->step_s : NAN, 1);
    double gflops = crew_monitor_gflops(m, r);
    json_num(f, "gflops", gflops, 1);
    json_num(f, "peak_fraction", m->plan.peak_gflops > 0 ? gflops / m->plan.peak_gflops : NAN, 1);
    if (r->skipped) crew_text_puts(f, "\"skipped\":true,");
    if (r->small_batch > 0 && isfinite(r->grad_sq_small) && isfinite(r->grad_sq_big)) { /* the steps that measured it */
        json_num(f, "noise_scale", m->noise.b_simple, 1);
        json_num(f, "grad_sq_small", r->grad_sq_small, 1);
        json_num(f, "grad_sq_big", r->grad_sq_big, 1);
        crew_text_printf(f, "\"small_batch\":%lld,", (long long)r->small_batch);
    }
    crew_text_puts(f, "\"replicas\":[");
    for (int i = 0; i < r->n_replicas; i++) {
        const crew_step_times *t = &r->replicas[i];
        crew_text_printf(f, "%s{\"rank\":%d,", i ? "," : "", i);
        json_num(f, "data_s", t->data_s, 1);
        json_num(f, "forward_s", t->forward_s, 1);
        json_num(f, "backward_s", t->backward_s, 1);
        json_num(f, "comm_exposed_s", t->comm_exposed_s, 1);
        json_num(f, "comm_hidden_s", t->comm_hidden_s, 1);
        json_num(f, "optimizer_s", t->optimizer_s, 0);
        crew_text_putc(f, '}');
    }
    crew_text_puts(f, "]}");
    return crew_text_end_line(f);
}

crew_status crew_monitor_step(crew_monitor *m, const crew_step_record *r)
{
    if (m->resume_pending) CREW_TRY(crew_monitor_resume_line(m, r->step));
    m->last_step = r->step;
    crew_noise_scale_add(&m->noise, r->grad_sq_small, r->small_batch, r->grad_sq_big, r->global_batch);
    if (m->has_file) {
        CREW_TRY(write_step_line(m, r));
        CREW_TRY(crew_monitor_tb_step(m, r));
    }
    return crew_detect_step(m, r);
}

crew_status crew_monitor_pipeline(crew_monitor *m, const crew_pipeline_record *r)
{
    if (!m->has_file) return CREW_OK;
    crew_text_file *f = &m->jsonl;
    crew_text_printf(f, "{\"type\":\"pipeline\",\"step\":%lld,\"stages\":%d,\"replicas\":%d,\"micro_batches\":%d,"
                     "\"schedule\":\"%s\",", (long long)r->step, r->stages, r->replicas, r->micro_batches,
                     r->gpipe ? "gpipe" : "1f1b");
    json_num(f, "ideal_bubble", r->ideal_bubble, 1);
    json_num(f, "bubble", r->bubble, 1);
    json_num(f, "step_s", r->step_s, 1);
    crew_text_printf(f, "\"slowest_stage\":%d,\"ops\":[", r->slowest_stage);
    for (int i = 0; i < r->n_ops; i++) {
        const crew_pipe_timing *o = &r->ops[i];
        crew_text_printf(f, "%s{\"stage\":%d,\"micro\":%d,\"pass\":\"%s\",", i ? "," : "", o->stage, o->micro,
                         o->backward ? "backward" : "forward");
        json_num(f, "start_s", o->start_s, 1);
        json_num(f, "end_s", o->end_s, 0);
        crew_text_putc(f, '}');
    }
    crew_text_puts(f, "]}");
    return crew_text_end_line(f);
}

crew_status crew_monitor_epoch(crew_monitor *m, const crew_epoch_info *e)
{
    if (!m->has_file) return CREW_OK;
    crew_text_file *f = &m->jsonl;
    crew_text_printf(f, "{\"type\":\"epoch\",\"epoch\":%d,\"steps\":%lld,", e->epoch, (long long)e->steps);
    json_num(f, "train_loss", e->train_loss, 1);
    json_num(f, "train_accuracy", e->train_accuracy, 1);
    json_num(f, "test_loss", e->test_loss, 1);
    json_num(f, "test_accuracy", e->test_accuracy, 1);
    if (!isnan(e->test_bits)) json_num(f, "test_bits", e->test_bits, 1); /* language models only */
    json_num(f, "wall_s", e->wall_s, 1);
    json_num(f, "samples_per_s", e->samples_per_s, 0);
    crew_text_putc(f, '}');
    CREW_TRY(crew_text_end_line(f));
    return crew_monitor_tb_epoch(m, e);
}

crew_status crew_monitor_event(crew_monitor *m, crew_event_kind kind, int64_t step, int rank, double value,
                               const char *fmt, ...)
{
    /* Formatted whole, however long: an event never ends mid-sentence (its writers keep their
     * lists short, summarising them). */
    char small[512], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1)) != NULL) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    if (!msg) return CREW_OOM();
    m->events++;
    crew_status s = CREW_OK;
    if (m->has_file) {
        crew_text_file *f = &m->jsonl;
        crew_text_printf(f, "{\"type\":\"event\",\"step\":%lld,\"kind\":\"%s\",", (long long)step,
                         crew_event_kind_name(kind));
        if (rank >= 0)
            crew_text_printf(f, "\"rank\":%d,", rank);
        else
            crew_text_puts(f, "\"rank\":null,");
        json_num(f, "value", value, 1);
        crew_text_puts(f, "\"message\":");
        crew_text_json_string(f, msg);
        crew_text_putc(f, '}');
        s = crew_text_end_line(f);
    }
    /* The person hears of the event even when the record could not take it. */
    if (m->cfg.on_event) {
        crew_event_info e = {kind, crew_event_kind_name(kind), step, rank, value, msg};
        m->cfg.on_event(m->cfg.user, &e);
    }
    if (msg != small) free(msg);
    return s;
}

int crew_monitor_events(const crew_monitor *m) { return m->events; }

double crew_monitor_noise_scale(const crew_monitor *m) { return m->noise.b_simple; }

crew_status crew_monitor_finish(crew_monitor *m, crew_fit_result *res)
{
    crew_summarize(m, res);
    if (!m->has_file) return CREW_OK;
    if (m->resume_pending) CREW_TRY(crew_monitor_resume_line(m, 0)); /* no step ran after the restart */
    crew_text_file *f = &m->jsonl;
    crew_text_printf(f, "{\"type\":\"summary\",\"steps\":%lld,\"epochs\":%d,", (long long)res->steps, res->epochs);
    json_num(f, "wall_s", res->wall_s, 1);
    json_num(f, "samples_per_s", res->samples_per_s, 1);
    json_num(f, "gflops", res->gflops, 1);
    json_num(f, "peak_fraction", res->peak_fraction, 1);
    json_num(f, "test_accuracy", res->test_accuracy, 1);
    json_num(f, "test_loss", res->test_loss, 1);
    if (!isnan(res->test_bits)) json_num(f, "test_bits", res->test_bits, 1); /* language models only */
    json_num(f, "data_fraction", res->data_fraction, 1);
    json_num(f, "compute_fraction", res->compute_fraction, 1);
    json_num(f, "comm_exposed_fraction", res->comm_exposed_fraction, 1);
    json_num(f, "optimizer_fraction", res->optimizer_fraction, 1);
    json_num(f, "noise_scale", res->noise_scale, 1);
    crew_text_printf(f, "\"skipped_updates\":%lld,\"events\":%d,\"bottleneck\":", (long long)res->skipped_updates,
                     m->events);
    crew_text_json_string(f, res->bottleneck);
    crew_text_puts(f, ",\"noise\":");
    crew_text_json_string(f, res->noise_text);
    crew_text_putc(f, '}');
    CREW_TRY(crew_text_end_line(f));
    return crew_monitor_tb_flush(m);
}

void crew_monitor_close(crew_monitor *m)
{
    if (!m) return;
    /* Nothing is left to report a failure to: finish flushed everything that mattered. */
    crew_status_free(crew_text_close(&m->jsonl, 0));
    crew_monitor_tb_close(m);
    free(m->win_compute);
    free(m->total_compute);
    free(m);
}
