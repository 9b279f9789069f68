/* rank_timeline.c — what a run says about its stages: a pipeline's timeline of passes in the
 * sampled steps (metrics.jsonl's "pipeline" lines), and at the end of every run the device memory
 * each stage held at its peak (the planner is checked against it) and a pipeline's measured
 * bubble. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "train/rank.h"

/* Message tags of the stages' timelines. */
#define TAG_TIMELINE(s) ((1 << 29) + (s))
/* A step whose timeline goes into metrics.jsonl: every TIMELINE_EVERY-th and the last. */
#define TIMELINE_EVERY 100

crew_status crew_rank_timeline_init(crew_rank *r)
{
    const int k = r->run->plan.accumulation;
    r->tl = calloc((size_t)4 * (size_t)k, sizeof *r->tl);
    if (!r->tl) return CREW_OOM();
    CREW_TRY(r->be->ops->alloc(r->be->ctx, CREW_DT_F64, (int64_t)4 * k, (void **)&r->tl_dev));
    if (!r->sinks) return CREW_OK;
    r->tl_all = calloc((size_t)r->stages * 4 * (size_t)k, sizeof *r->tl_all);
    r->tl_ops = calloc((size_t)r->stages * 2 * (size_t)k, sizeof *r->tl_ops);
    r->tl_order = calloc((size_t)2 * (size_t)k, sizeof *r->tl_order);
    return r->tl_all && r->tl_ops && r->tl_order ? CREW_OK : CREW_OOM();
}

void crew_rank_timeline_release(crew_rank *r)
{
    crew_dev_free(r->be, r->tl_dev);
    free(r->tl);
    free(r->tl_all);
    free(r->tl_ops);
    free(r->tl_order);
}

int crew_rank_timeline_step(const crew_rank *r, int64_t step)
{
    return step % TIMELINE_EVERY == 0 || step == r->run->plan.total_steps;
}

/* The stages of replica 0 send their passes' times to rank 0, which writes the step's timeline
 * (after the metrics all-reduce: everyone's forward and backward times are in r->times). */
crew_status crew_rank_send_timeline(crew_rank *r, int64_t step, double step_s)
{
    if (r->replica != 0) return CREW_OK;
    const int k = r->run->plan.accumulation, n = 4 * k;
    const double timeout = r->run->timeout_s;
    const crew_backend_ops *o = r->be->ops;
    if (r->rank != 0) {
        CREW_TRY(o->upload(r->be->ctx, NULL, r->tl_dev, r->tl, n, CREW_DT_F64));
        CREW_TRY(o->sync(r->be->ctx, NULL));
        return crew_send(&r->world, r->tl_dev, n, CREW_COMM_F64, 0, TAG_TIMELINE(r->stage), timeout);
    }
    memcpy(r->tl_all, r->tl, (size_t)n * sizeof *r->tl);
    for (int s = 1; s < r->stages; s++) {
        CREW_TRY(crew_recv(&r->world, r->tl_dev, n, CREW_COMM_F64, s, TAG_TIMELINE(s), timeout));
        CREW_TRY(o->download(r->be->ctx, r->tl_all + (size_t)s * n, r->tl_dev, n, CREW_DT_F64));
    }
    double t0 = r->tl_all[0], bubble = 0.0, most = -1.0;
    for (int i = 0; i < r->stages * 2 * k; i++) t0 = r->tl_all[2 * i] < t0 ? r->tl_all[2 * i] : t0;
    int slowest = 0, n_ops = 0;
    crew_pipe_op *so = r->tl_order;
    for (int s = 0; s < r->stages; s++) {
        double busy = crew_step_compute_s(&r->times[s]); /* rank s is stage s of replica 0 */
        bubble += step_s > 0 ? (1.0 - busy / step_s) / r->stages : 0.0;
        if (busy > most) most = busy, slowest = s;
        /* the stage's order of passes, as it ran them */
        crew_pipeline_ops((crew_pipeline_schedule)r->run->plan.pipeline_schedule, r->stages, s, k, so);
        for (int i = 0; i < 2 * k; i++) {
            const double *t = r->tl_all + (size_t)s * n + 2 * i;
            r->tl_ops[n_ops++] = (crew_pipe_timing){s, so[i].micro, so[i].backward, t[0] - t0, t[1] - t0};
        }
    }
    const crew_fit_plan *p = &r->run->plan;
    crew_pipeline_record rec = {step, r->stages, r->replicas, k, p->pipeline_schedule == CREW_PIPELINE_GPIPE,
                                crew_pipeline_ideal_bubble(r->stages, k), bubble, step_s, slowest, n_ops, r->tl_ops};
    crew_rank_sink_enter(r);
    crew_status st = crew_monitor_pipeline(r->sinks->monitor, &rec);
    crew_rank_sink_leave(r);
    return st;
}

/* The measured bubble: the share of the steps' time in which a stage did not compute (waiting for
 * its neighbours, for data, for the all-reduces and the update), the mean over the stages of
 * replica 0, next to the schedule's ideal; rank 0 reports it once, naming the busiest stage. */
static crew_status report_bubble(crew_rank *r, const double *rows, int64_t steps)
{
    double idle = 0.0, most = -1.0;
    int busiest = 0;
    for (int s = 0; s < r->stages; s++) {
        double busy = rows[(size_t)s * CREW_METRIC_FIELDS], total = rows[(size_t)s * CREW_METRIC_FIELDS + 1];
        idle += total > 0 ? (1.0 - busy / total) / r->stages : 0.0;
        if (busy > most) most = busy, busiest = s;
    }
    const crew_fit_plan *p = &r->run->plan;
    crew_rank_sink_enter(r);
    crew_fit_result *res = r->sinks->result;
    res->stages = r->stages;
    res->bubble_fraction = idle;
    res->bottleneck_stage = busiest;
    crew_rank_sink_leave(r);
    char msg[320];
    snprintf(msg, sizeof msg, "pipeline of %d stages, %s schedule, %d micro-batches per step: the stages computed "
             "%.0f%% of each step and waited %.0f%% (the ideal bubble is %.0f%%); stage %d is the bottleneck (%.4f s "
             "of forward and backward a step)", r->stages, p->pipeline_schedule == CREW_PIPELINE_GPIPE ? "GPipe" : "1F1B",
             p->accumulation, 100.0 * (1.0 - idle), 100.0 * idle,
             100.0 * crew_pipeline_ideal_bubble(r->stages, p->accumulation), busiest, most / (double)steps);
    return crew_rank_event(r, CREW_EVENT_INFO, r->run->start_step + steps, -1, msg);
}

crew_status crew_rank_report_end(crew_rank *r, int64_t steps)
{
    double *row = r->metrics;
    memset(row, 0, (size_t)r->size * CREW_METRIC_FIELDS * sizeof *row);
    if (r->replica == 0) { /* rank s is stage s of replica 0 */
        int64_t in_use = 0, peak = 0;
        if (r->be->ops->memory_used) r->be->ops->memory_used(r->be->ctx, &in_use, &peak);
        row[(size_t)r->rank * CREW_METRIC_FIELDS] = r->busy_s;
        row[(size_t)r->rank * CREW_METRIC_FIELDS + 1] = r->step_s;
        row[(size_t)r->rank * CREW_METRIC_FIELDS + 2] = (double)peak; /* exact below 2^53 bytes */
    }
    CREW_TRY(crew_rank_phase_error(r, crew_rank_allreduce_host(r, row, (int64_t)r->size * CREW_METRIC_FIELDS),
                                   r->run->start_step + steps, "the run's end"));
    if (!r->sinks) return CREW_OK;
    crew_rank_sink_enter(r);
    for (int s = 0; s < r->stages; s++)
        r->sinks->result->stage_peak_bytes[s] = (int64_t)row[(size_t)s * CREW_METRIC_FIELDS + 2];
    crew_rank_sink_leave(r);
    return r->stages > 1 && steps > 0 ? report_bubble(r, row, steps) : CREW_OK;
}
