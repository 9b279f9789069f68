/* monitor.c — metrics.jsonl, events, and the end-of-run summary (the detectors are in
 * detectors.c). One JSON object per line, written with fprintf: a line per step must be cheap. */
#include "telemetry/monitor.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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
static void json_num(FILE *f, const char *key, double v, int comma)
{
    if (isfinite(v))
        fprintf(f, "\"%s\":%.7g%s", key, v, comma ? "," : "");
    else
        fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
}

static crew_status write_error(crew_monitor *m)
{
    return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", m->path, strerror(errno));
}

static crew_status check_file(crew_monitor *m)
{
    if (m->jsonl && ferror(m->jsonl)) return write_error(m);
    return CREW_OK;
}

static void write_run_line(crew_monitor *m)
{
    const crew_fit_plan *p = &m->plan;
    FILE *f = m->jsonl;
    fprintf(f, "{\"type\":\"run\",\"time\":%.3f,\"crew_version\":", crew_unix_now());
    crew_json_write_string(f, crew_version());
    char blas[256]; /* which kernels computed this run: speed figures are read against them */
    crew_blas_describe(blas, sizeof blas);
    fprintf(f, ",\"blas\":");
    crew_json_write_string(f, blas);
    fprintf(f, ",\"devices\":%d,\"batch_per_device\":%lld,\"accumulation\":%d,\"global_batch\":%lld,"
               "\"steps_per_epoch\":%lld,\"total_steps\":%lld,\"epochs\":%d,",
            p->devices, (long long)p->batch_per_device, p->accumulation, (long long)p->global_batch,
            (long long)p->steps_per_epoch, (long long)p->total_steps, p->epochs);
    json_num(f, "base_lr", p->base_lr, 1);
    json_num(f, "scaled_lr", p->scaled_lr, 1);
    fprintf(f, "\"warmup_steps\":%lld}\n", (long long)p->warmup_steps);
}

crew_status crew_monitor_open(const crew_monitor_config *cfg, const crew_fit_plan *plan, crew_monitor **out)
{
    *out = NULL;
    crew_monitor *m = calloc(1, sizeof *m);
    if (!m) return CREW_OOM();
    m->cfg = *cfg;
    m->plan = *plan;
    m->n = plan->devices;
    if (m->cfg.straggler_threshold <= 0) m->cfg.straggler_threshold = 0.2;
    if (m->cfg.straggler_window <= 0) m->cfg.straggler_window = 50;
    if (m->cfg.input_bound_fraction <= 0) m->cfg.input_bound_fraction = 0.05;
    if (m->cfg.loss_spike_z <= 0) m->cfg.loss_spike_z = 6.0; /* minibatch losses are skewed: 4σ happens */
    m->win_compute = calloc((size_t)m->n, sizeof *m->win_compute);
    m->total_compute = calloc((size_t)m->n, sizeof *m->total_compute);
    if (!m->win_compute || !m->total_compute) {
        crew_monitor_close(m);
        return CREW_OOM();
    }
    if (cfg->run_dir) {
        if (mkdir(cfg->run_dir, 0755) != 0 && errno != EEXIST) {
            crew_status s = crew_errorf(CREW_CODE_IO, "cannot create run directory %s: %s", cfg->run_dir, strerror(errno));
            crew_monitor_close(m);
            return s;
        }
        snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", cfg->run_dir);
        m->jsonl = fopen(m->path, cfg->append ? "a" : "w");
        if (!m->jsonl) {
            crew_status s = crew_errorf(CREW_CODE_IO, "cannot create %s: %s", m->path, strerror(errno));
            crew_monitor_close(m);
            return s;
        }
        write_run_line(m);
        crew_status s = crew_monitor_tb_open(m);
        if (s) {
            crew_monitor_close(m);
            return s;
        }
    }
    *out = m;
    return CREW_OK;
}

static void write_step_line(crew_monitor *m, const crew_step_record *r)
{
    FILE *f = m->jsonl;
    fprintf(f, "{\"type\":\"step\",\"step\":%lld,\"epoch\":%d,\"time\":%.3f,", (long long)r->step, r->epoch, r->time);
    json_num(f, "loss", r->loss, 1);
    json_num(f, "accuracy", r->accuracy, 1);
    json_num(f, "lr", r->lr, 1);
    fprintf(f, "\"global_batch\":%lld,", (long long)r->global_batch);
    json_num(f, "step_s", r->step_s, 1);
    json_num(f, "samples_per_s", r->step_s > 0 ? (double)r->global_batch / r->step_s : NAN, 1);
    if (r->skipped) fprintf(f, "\"skipped\":true,");
    fprintf(f, "\"replicas\":[");
    for (int i = 0; i < r->n_replicas; i++) {
        const crew_step_times *t = &r->replicas[i];
        fprintf(f, "%s{\"rank\":%d,", i ? "," : "", i);
        json_num(f, "data_s", t->data_s, 1);
        json_num(f, "forward_s", t->forward_s, 1);
        json_num(f, "backward_s", t->backward_s, 1);
        json_num(f, "comm_exposed_s", t->comm_exposed_s, 1);
        json_num(f, "comm_hidden_s", t->comm_hidden_s, 1);
        json_num(f, "optimizer_s", t->optimizer_s, 0);
        fputc('}', f);
    }
    fprintf(f, "]}\n");
}

crew_status crew_monitor_step(crew_monitor *m, const crew_step_record *r)
{
    if (m->jsonl) {
        write_step_line(m, r);
        CREW_TRY(crew_monitor_tb_step(m, r));
    }
    CREW_TRY(crew_detect_step(m, r));
    return check_file(m);
}

crew_status crew_monitor_epoch(crew_monitor *m, const crew_epoch_info *e)
{
    if (!m->jsonl) return CREW_OK;
    FILE *f = m->jsonl;
    fprintf(f, "{\"type\":\"epoch\",\"epoch\":%d,\"steps\":%lld,", e->epoch, (long long)e->steps);
    json_num(f, "train_loss", e->train_loss, 1);
    json_num(f, "train_accuracy", e->train_accuracy, 1);
    json_num(f, "test_loss", e->test_loss, 1);
    json_num(f, "test_accuracy", e->test_accuracy, 1);
    json_num(f, "wall_s", e->wall_s, 1);
    json_num(f, "samples_per_s", e->samples_per_s, 0);
    fprintf(f, "}\n");
    CREW_TRY(crew_monitor_tb_epoch(m, e));
    if (fflush(f) != 0) return write_error(m);
    return CREW_OK;
}

crew_status crew_monitor_event(crew_monitor *m, crew_event_kind kind, int64_t step, int rank, double value,
                               const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    m->events++;
    if (m->jsonl) {
        FILE *f = m->jsonl;
        fprintf(f, "{\"type\":\"event\",\"step\":%lld,\"kind\":\"%s\",", (long long)step, crew_event_kind_name(kind));
        if (rank >= 0)
            fprintf(f, "\"rank\":%d,", rank);
        else
            fprintf(f, "\"rank\":null,");
        json_num(f, "value", value, 1);
        fprintf(f, "\"message\":");
        crew_json_write_string(f, msg);
        fprintf(f, "}\n");
        fflush(f); /* an event may be the last thing a failing run writes */
    }
    if (m->cfg.on_event) {
        crew_event_info e = {kind, crew_event_kind_name(kind), step, rank, value, msg};
        m->cfg.on_event(m->cfg.user, &e);
    }
    return check_file(m);
}

int crew_monitor_events(const crew_monitor *m) { return m->events; }

crew_status crew_monitor_finish(crew_monitor *m, crew_fit_result *res)
{
    crew_summarize(m, res);
    if (!m->jsonl) return CREW_OK;
    FILE *f = m->jsonl;
    fprintf(f, "{\"type\":\"summary\",\"steps\":%lld,\"epochs\":%d,", (long long)res->steps, res->epochs);
    json_num(f, "wall_s", res->wall_s, 1);
    json_num(f, "samples_per_s", res->samples_per_s, 1);
    json_num(f, "test_accuracy", res->test_accuracy, 1);
    json_num(f, "test_loss", res->test_loss, 1);
    json_num(f, "data_fraction", res->data_fraction, 1);
    json_num(f, "compute_fraction", res->compute_fraction, 1);
    json_num(f, "comm_exposed_fraction", res->comm_exposed_fraction, 1);
    json_num(f, "optimizer_fraction", res->optimizer_fraction, 1);
    fprintf(f, "\"skipped_updates\":%lld,\"events\":%d,\"bottleneck\":", (long long)res->skipped_updates, m->events);
    crew_json_write_string(f, res->bottleneck);
    fprintf(f, "}\n");
    if (fflush(f) != 0) return write_error(m);
    return crew_monitor_tb_flush(m);
}

void crew_monitor_close(crew_monitor *m)
{
    if (!m) return;
    if (m->jsonl) fclose(m->jsonl);
    crew_monitor_tb_close(m);
    free(m->win_compute);
    free(m->total_compute);
    free(m);
}
