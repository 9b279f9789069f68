/* monitor_internal.h — the monitor's state, shared by monitor.c, detectors.c and monitor_tb.c. */
#ifndef CREW_TELEMETRY_MONITOR_INTERNAL_H
#define CREW_TELEMETRY_MONITOR_INTERNAL_H

#include "telemetry/monitor.h"

#define CREW_LOSS_WINDOW 100

struct crew_tb_writer;

struct crew_monitor {
    crew_monitor_config cfg;
    crew_fit_plan plan;
    int n;                          /* replicas */
    FILE *jsonl;
    char path[1024];
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
    /* whole-run sums, for the summary */
    int64_t steps;
    double sum_step, sum_data, sum_compute, sum_exposed, sum_hidden, sum_optimizer;
    double *total_compute;          /* [n] */
};

crew_status crew_detect_step(crew_monitor *m, const crew_step_record *r);
void crew_summarize(crew_monitor *m, crew_fit_result *res);

crew_status crew_monitor_tb_open(crew_monitor *m);
crew_status crew_monitor_tb_step(crew_monitor *m, const crew_step_record *r);
crew_status crew_monitor_tb_epoch(crew_monitor *m, const crew_epoch_info *e);
crew_status crew_monitor_tb_flush(crew_monitor *m);
void crew_monitor_tb_close(crew_monitor *m);

#endif
