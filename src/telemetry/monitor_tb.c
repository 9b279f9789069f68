/* monitor_tb.c — the monitor's TensorBoard scalars, in RUN_DIR/tb/ (docs/TENSORBOARD.md). */
#include <math.h>
#include <stdio.h>

#include "core/links.h"
#include "core/status.h"
#include "core/timer.h"
#include "telemetry/monitor_internal.h"
#include "telemetry/tb_writer.h"

crew_status crew_monitor_tb_open(crew_monitor *m)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tb", m->cfg.run_dir);
    /* Its event files are created O_EXCL, which never follows a link; the directory is checked. */
    CREW_TRY(crew_refuse_link(dir, "crew writes a run's TensorBoard files only into a directory of its own, never "
                                   "through a link (remove the link)"));
    return crew_tb_open(dir, &m->tb);
}

crew_status crew_monitor_tb_step(crew_monitor *m, const crew_step_record *r)
{
    if (!m->tb) return CREW_OK;
    const crew_step_times *t = &r->replicas[0];
    static const char *const tags[] = {"train/loss", "train/accuracy", "train/lr", "train/samples_per_s",
                                       "time/step_s", "time/data_s", "time/forward_s", "time/backward_s",
                                       "time/comm_exposed_s", "time/comm_hidden_s", "time/optimizer_s",
                                       "perf/gflops", "perf/peak_fraction"};
    double gflops = crew_monitor_gflops(m, r);
    float v[] = {r->loss, r->accuracy, r->lr, r->step_s > 0 ? (float)((double)r->global_batch / r->step_s) : 0.0f,
                 (float)r->step_s, (float)t->data_s, (float)t->forward_s, (float)t->backward_s,
                 (float)t->comm_exposed_s, (float)t->comm_hidden_s, (float)t->optimizer_s,
                 gflops == gflops ? (float)gflops : 0.0f,
                 m->plan.peak_gflops > 0 && gflops == gflops ? (float)(gflops / m->plan.peak_gflops) : 0.0f};
    /* the peak fraction only when the peak is known */
    int n = (int)(sizeof v / sizeof v[0]) - (m->plan.peak_gflops > 0 ? 0 : 1);
    CREW_TRY(crew_tb_scalars(m->tb, r->step, r->time, tags, v, n));
    if (isfinite(m->noise.b_simple) && r->small_batch > 0 && isfinite(r->grad_sq_small))
        CREW_TRY(crew_tb_scalar(m->tb, "train/noise_scale", r->step, r->time, (float)m->noise.b_simple));
    for (int i = 0; i < r->n_replicas && i < 64; i++) {
        char tag[48];
        snprintf(tag, sizeof tag, "replica/%d/compute_s", i);
        CREW_TRY(crew_tb_scalar(m->tb, tag, r->step, r->time, (float)crew_step_compute_s(&r->replicas[i])));
    }
    return CREW_OK;
}

crew_status crew_monitor_tb_epoch(crew_monitor *m, const crew_epoch_info *e)
{
    if (!m->tb) return CREW_OK;
    static const char *const tags[] = {"test/loss", "test/accuracy", "test/bits_per_token"};
    float v[] = {e->test_loss, e->test_accuracy, e->test_bits};
    /* At the step the epoch ended: m->steps counts only this run's steps, and a resumed run
     * started after its checkpoint. A classifier has no bits per token. */
    CREW_TRY(crew_tb_scalars(m->tb, m->last_step, crew_unix_now(), tags, v, isnan(e->test_bits) ? 2 : 3));
    return crew_tb_flush(m->tb);
}

crew_status crew_monitor_tb_restart(crew_monitor *m, int64_t step, const char *msg)
{
    if (!m->tb) return CREW_OK;
    CREW_TRY(crew_tb_session_start(m->tb, step, crew_unix_now(), msg));
    return crew_tb_flush(m->tb);
}

crew_status crew_monitor_tb_flush(crew_monitor *m) { return m->tb ? crew_tb_flush(m->tb) : CREW_OK; }

void crew_monitor_tb_close(crew_monitor *m)
{
    if (m->tb) crew_tb_close(m->tb);
    m->tb = NULL;
}
