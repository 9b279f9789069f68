/* report.h — internals of crew_report_write (crew report), shared by its three files:
 * RUN_DIR/metrics.jsonl is read into a summary of bounded size (report_read.c), then drawn as one
 * self-contained HTML page (report.c) whose charts are inline SVG (report_svg.c).
 *
 * Memory does not grow with the length of the run: step lines are summed into at most
 * CREW_REPORT_BUCKETS buckets of `bucket_steps` consecutive steps each; when a step falls past
 * the last bucket, neighbouring buckets are merged in pairs and bucket_steps doubles. A run of up
 * to CREW_REPORT_BUCKETS steps keeps one step per bucket, so short runs are drawn exactly. */
#ifndef CREW_TELEMETRY_REPORT_H
#define CREW_TELEMETRY_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "crew.h"

#define CREW_REPORT_BUCKETS 400        /* points per chart, at most */
#define CREW_REPORT_MAX_REPLICAS 1024  /* a rank at or above this is bad input */
#define CREW_REPORT_MAX_EVENTS 1000    /* events kept for the table; the rest are only counted */
#define CREW_REPORT_MAX_EPOCHS 1000    /* epoch lines kept; the rest are only counted */
#define CREW_REPORT_MAX_LINE (4 << 20) /* bytes in one line of metrics.jsonl */
#define CREW_REPORT_MAX_RESUMES 20     /* restarts described on the page; the rest are only counted */
#define CREW_REPORT_MAX_RESTARTS 65536 /* restarts in one file, at most (each costs 16 bytes to read) */
/* A pipeline line outside these is bad input: crew's planner makes at most 64 stages, and a step
 * of more than 65536 micro-batches is not a metrics file's. */
#define CREW_REPORT_MAX_STAGES 64
#define CREW_REPORT_MAX_MICRO 65536
/* Passes of the pipeline line shown that are kept and drawn (24 bytes each: 384 kB at most). A
 * line may hold up to 2 × stages × micro-batches of them (2·64·65536 in principle, though a line
 * of 4 MiB holds fewer than 60000); past this many the timeline would be thinner than a pixel a
 * bar anyway, so the rest are validated and counted, and the page says they were left out. */
#define CREW_REPORT_MAX_OPS 16384

/* The parts of a step, in the stacking order of the breakdown chart. */
enum {
    CREW_PART_DATA,
    CREW_PART_FORWARD,
    CREW_PART_BACKWARD,
    CREW_PART_COMM,      /* exposed communication */
    CREW_PART_OPTIMIZER,
    CREW_PART_COUNT
};

/* Sums over the step lines that fell into one bucket. Missing (null) values are left out of both
 * the sum and its count. */
typedef struct crew_report_bucket {
    int64_t steps;                     /* step lines in the bucket */
    double loss_sum, loss_min, loss_max;
    int64_t loss_n;
    double lr_sum;
    int64_t lr_n;
    double samples, samples_s;         /* global_batch and step_s summed over steps having both */
    double noise_sum;                  /* the gradient noise scale (smoothed) of the steps that have one */
    int64_t noise_n;
    double part_sum[CREW_PART_COUNT];  /* per step, the mean over its replicas, summed */
    double wall_sum;                   /* step_s of the same steps */
    int64_t part_n;
} crew_report_bucket;

typedef struct crew_report_event {
    int64_t step;    /* -1 when missing */
    char kind[24];
    int rank;        /* -1: the whole run */
    double value;    /* NaN when missing */
    char *message;   /* owned; "" when missing */
} crew_report_event;

typedef struct crew_report_epoch {
    int epoch;        /* 0-based, as in the file */
    int64_t steps;    /* -1 when missing */
    int64_t end_step; /* the last step line read before it (0: none) */
    double train_loss, train_accuracy, test_loss, test_accuracy, wall_s, samples_per_s; /* NaN: missing */
    double test_bits; /* a language model's bits per token; NaN for a classifier */
} crew_report_epoch;

/* A restart from a checkpoint: a "resume" line, or (files of an older crew, which wrote none) a
 * run line followed by a step that had been logged already. */
typedef struct crew_report_resume {
    int64_t line;            /* of its run line (or of the resume line, if no run line came before) */
    int64_t checkpoint_step; /* -1: unknown (no step ran after the restart) */
    char message[400];
} crew_report_resume;

/* One forward or backward pass of a micro-batch on a pipeline stage. */
typedef struct crew_report_op {
    int16_t stage;          /* 0 .. stages-1 */
    uint8_t backward;       /* 0: the forward pass, 1: the backward pass */
    int32_t micro;          /* 0 .. micro_batches-1 */
    double start_s, end_s;  /* seconds since the step began; NaN when missing (null) */
} crew_report_op;

/* The last pipeline line (docs/METRICS.md): one sampled step of a pipelined run. */
typedef struct crew_report_pipeline {
    int64_t line;                      /* its line in the file */
    int64_t step;                      /* -1 when missing */
    int stages, micro_batches;         /* 1..CREW_REPORT_MAX_STAGES, 1..CREW_REPORT_MAX_MICRO */
    int replicas;                      /* -1 when missing */
    int slowest_stage;                 /* -1 when missing */
    char schedule[24];                 /* "1f1b", "gpipe", ...; "" when missing */
    double ideal_bubble, bubble;       /* shares of the step, 0..1; NaN when missing */
    double step_s;                     /* NaN when missing */
    crew_report_op *ops;               /* [n_ops], owned; at most CREW_REPORT_MAX_OPS */
    int n_ops, total_ops;              /* kept, and in the line */
} crew_report_pipeline;

/* Everything the page shows. Numbers are NaN and counts -1 where the file did not say. */
typedef struct crew_report_data {
    /* the run line */
    int has_run;
    double start_time;
    char version[32];
    char model[256], data[256];  /* from the run line, else RUN_DIR/config.json, else "" */
    int64_t devices, batch_per_device, accumulation, global_batch, steps_per_epoch, total_steps,
        epochs, warmup_steps;
    double base_lr, scaled_lr;

    /* step lines */
    int64_t step_lines, skipped_steps;
    int64_t first_step, last_step;   /* smallest and largest step number seen */
    double last_step_time;           /* Unix time of the last step line, NaN if none */
    int64_t bucket_steps;            /* steps per bucket: 1, 2, 4, ... */
    int buckets;                     /* buckets in use: bucket i holds steps i*bucket_steps+1 .. */
    crew_report_bucket bucket[CREW_REPORT_BUCKETS];
    int64_t recent_step;             /* the step of the latest step line (epoch lines follow it) */
    double last_noise;               /* the latest step line's gradient noise scale (NaN: none) */
    int64_t noise_batch;             /* and that line's global batch */
    int replicas;                    /* replicas seen: the highest rank + 1 */
    int replica_rows;                /* rows allocated in compute_sum / compute_n */
    double *compute_sum;             /* [replica_rows][CREW_REPORT_BUCKETS] forward_s + backward_s */
    int64_t *compute_n;              /* [replica_rows][CREW_REPORT_BUCKETS] */

    crew_report_event *events;       /* [n_events], at most CREW_REPORT_MAX_EVENTS */
    int n_events;
    int64_t total_events, event_kinds[8]; /* every event line, and by kind (crew_event_kind) */
    crew_report_epoch *epochs_seen;  /* [n_epochs], at most CREW_REPORT_MAX_EPOCHS */
    int n_epochs;
    int64_t total_epochs;

    /* pipeline lines: every one is checked, the last one is kept */
    int64_t pipeline_lines;          /* 0: the run has no pipeline (the page shows no such section) */
    crew_report_pipeline pipeline;   /* meaningful when pipeline_lines > 0 */

    /* the summary line */
    int has_summary;
    int64_t sum_steps, sum_epochs, sum_skipped;
    double sum_wall_s, sum_samples_per_s, sum_test_accuracy, sum_test_loss;
    double sum_gflops, sum_peak_fraction; /* NaN when absent (older runs; no peak measured) */
    double sum_fraction[4];          /* data, compute, comm_exposed, optimizer */
    char bottleneck[512];

    /* what was left out, and why (docs/METRICS.md, "Resumed runs" and "Torn lines") */
    crew_report_resume resumes[CREW_REPORT_MAX_RESUMES]; /* [n_resumes] */
    int n_resumes;
    int64_t total_resumes;
    int64_t replaced_lines;          /* lines about re-run steps that later lines replaced */
    int64_t torn_bytes;              /* the torn last line (a run still writing, or killed), 0: none */
    int64_t torn_lines, first_torn_line; /* torn lines inside the file, each with a line appended to it */
} crew_report_data;

/* Reads path (RUN_DIR/metrics.jsonl) into d. On error d is released. The file is read twice: once
 * for its restarts, then for the figures, leaving out the lines that a restart replaced; a file
 * still being written is read up to where the first reading ended. */
crew_status crew_report_read(const char *path, crew_report_data *d);
void crew_report_data_free(crew_report_data *d);
/* Fills d->model and d->data from RUN_DIR/config.json where the run line left them empty. Never
 * fails: the paths are a nicety, and a missing or unreadable file leaves them empty. A reader, so
 * it lives in report_read.c; crew_report_write calls it after crew_report_read. */
void crew_report_read_config(const char *run_dir, crew_report_data *d);

/* The centre step of bucket i, for the x axis. */
double crew_report_bucket_step(const crew_report_data *d, int i);

/* Writes s with &, <, >, " and ' escaped, and bytes below 0x20 as spaces. */
void crew_report_escape(FILE *f, const char *s);

/* The charts, each one <svg class="chart" id="..."> element: loss, lr, throughput, breakdown,
 * heatmap. Every coordinate written is finite. */
void crew_report_svg_loss(FILE *f, const crew_report_data *d);
void crew_report_svg_lr(FILE *f, const crew_report_data *d);
/* The gradient noise scale against step, beside the run's global batch; 0 when no step has one. */
int crew_report_has_noise(const crew_report_data *d);
void crew_report_svg_noise(FILE *f, const crew_report_data *d);
void crew_report_svg_throughput(FILE *f, const crew_report_data *d);
void crew_report_svg_breakdown(FILE *f, const crew_report_data *d);
void crew_report_svg_heatmap(FILE *f, const crew_report_data *d);
/* The timeline of the pipeline line kept (<svg class="chart" id="pipeline">): a row per stage, a
 * bar per pass. Draws nothing when the run has no pipeline line. */
void crew_report_svg_pipeline(FILE *f, const crew_report_data *d);
/* The summary's time fractions as one stacked bar (<svg class="fractions">), when present. */
void crew_report_svg_fractions(FILE *f, const crew_report_data *d);

/* The colour of an event kind ("straggler", ...), for markers and the events table. */
const char *crew_report_kind_colour(const char *kind);

/* Colours of the step parts, shared by the charts and the page's legends. */
extern const char *const crew_report_part_colour[CREW_PART_COUNT];
extern const char *const crew_report_part_name[CREW_PART_COUNT];

#endif
