/* monitor_internal.h — the monitor's state, shared by monitor.c, monitor_resume.c, detectors.c and
 * monitor_tb.c. */
#ifndef CREW_TELEMETRY_MONITOR_INTERNAL_H
#define CREW_TELEMETRY_MONITOR_INTERNAL_H

#include "telemetry/monitor.h"
#include "telemetry/noise_scale.h"
#include "telemetry/text_file.h"

#define CREW_LOSS_WINDOW 100

struct crew_tb_writer;

struct crew_monitor {
    crew_monitor_config cfg;
    crew_fit_plan plan;
    int n;                          /* replicas */
    int has_file;                   /* run_dir was given: jsonl is open */
    crew_text_file jsonl;           /* RUN_DIR/metrics.jsonl */
    char path[1024];
    /* A resumed run (cfg.append): what the record held when it was opened (monitor_resume.c) */
    int resume_pending;             /* the resume line is still to be written */
    int64_t logged_through;         /* the step of the record's last step line, 0 if none */
    int64_t torn_bytes;             /* bytes of a torn last line that were dropped */
    int torn_completed;             /* the last line lacked only its newline, which was added */
    int64_t last_step;              /* the step of the latest record, where the test scalars go */
    struct crew_tb_writer *tb;
    int events;
    /* the current straggler / input-bound window */
    int64_t win_steps, win_first;
    double *win_compute;            /* [n] summed compute seconds */
    double win_data, win_step;      /* summed slowest-replica data seconds, step seconds */
    int input_bound_reported;
    /* the last losses, for spikes */
    double losses[CREW_LOSS_WINDOW];
    int64_t n_losses;
    crew_noise_scale noise;         /* the gradient noise scale, smoothed over the steps that measured it */
    /* whole-run sums, for the summary */
    int64_t steps;
    double sum_step, sum_data, sum_compute, sum_exposed, sum_hidden, sum_optimizer;
    double *total_compute;          /* [n] */
};

crew_status crew_detect_step(crew_monitor *m, const crew_step_record *r);
void crew_summarize(crew_monitor *m, crew_fit_result *res);
/* A step's FLOP rate, GFLOP/s: the plan's FLOPs per sample × its samples / its time (NaN without a time). */
double crew_monitor_gflops(const crew_monitor *m, const crew_step_record *r);

/* monitor_resume.c: reads the record a resumed run appends to (fd open for reading and
 * appending), cuts a torn last line off, and notes what resume_line needs. */
crew_status crew_monitor_resume_scan(crew_monitor *m, int fd);
/* Writes the resume line before the first step of a resumed run (first_step: that step). */
crew_status crew_monitor_resume_line(crew_monitor *m, int64_t first_step);

crew_status crew_monitor_tb_open(crew_monitor *m);
/* A SessionLog START at `step`: TensorBoard drops every point at that step or later that it has
 * read before it, so re-run steps are drawn once. */
crew_status crew_monitor_tb_restart(crew_monitor *m, int64_t step, const char *msg);
crew_status crew_monitor_tb_step(crew_monitor *m, const crew_step_record *r);
crew_status crew_monitor_tb_epoch(crew_monitor *m, const crew_epoch_info *e);
crew_status crew_monitor_tb_flush(crew_monitor *m);
void crew_monitor_tb_close(crew_monitor *m);

#endif
