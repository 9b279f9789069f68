/* monitor.h — rank 0's view of a run: it receives every step record, writes metrics.jsonl (and
 * TensorBoard files), runs the detectors (stragglers, input-bound steps, loss spikes), reports
 * events through the caller's callback, and sums up the run's bottleneck at the end.
 *
 * The training loop never formats text itself: it hands records and raw events to the monitor. */
#ifndef CREW_TELEMETRY_MONITOR_H
#define CREW_TELEMETRY_MONITOR_H

#include <stdio.h>

#include "crew.h"
#include "telemetry/record.h"

typedef struct crew_monitor_config {
    const char *run_dir;            /* NULL: no files */
    /* A resumed run: metrics.jsonl goes on after its last complete line (a torn last line is cut
     * off), and a "resume" line before the first step record says which logged steps are run
     * again (monitor_resume.c; docs/METRICS.md, "Resumed runs"). */
    int append;
    double straggler_threshold;     /* fraction above the others' median [0.2] */
    int64_t straggler_window;       /* steps per verdict [50] */
    double input_bound_fraction;    /* data waiting above this fraction of a step [0.05] */
    double loss_spike_z;            /* [6] */
    int64_t noise_scale_every;      /* the gradient noise scale measured every this many steps; 0: not */
    void (*on_event)(void *user, const crew_event_info *e);
    void *user;
} crew_monitor_config;

typedef struct crew_monitor crew_monitor;

crew_status crew_monitor_open(const crew_monitor_config *cfg, const crew_fit_plan *plan, crew_monitor **out);
crew_status crew_monitor_step(crew_monitor *m, const crew_step_record *rec);
crew_status crew_monitor_epoch(crew_monitor *m, const crew_epoch_info *e);
/* A pipelined step's timeline: the "pipeline" line (docs/METRICS.md). */
crew_status crew_monitor_pipeline(crew_monitor *m, const crew_pipeline_record *rec);
/* Reports an event (printf-style message); writes it to metrics.jsonl and calls back. */
crew_status crew_monitor_event(crew_monitor *m, crew_event_kind kind, int64_t step, int rank, double value,
                               const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Fills the result's time fractions and bottleneck line, and writes the summary line. */
crew_status crew_monitor_finish(crew_monitor *m, crew_fit_result *result);
int crew_monitor_events(const crew_monitor *m);
/* The gradient noise scale so far (smoothed), NaN while unknown. */
double crew_monitor_noise_scale(const crew_monitor *m);
void crew_monitor_close(crew_monitor *m);

const char *crew_event_kind_name(crew_event_kind kind);


#endif
