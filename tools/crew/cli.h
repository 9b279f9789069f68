/* cli.h — the verbs of the crew command line and the helpers they share. */
#ifndef CREW_CLI_H
#define CREW_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "crew.h"

int cli_prep(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_sample(int argc, char **argv);
int cli_verify(int argc, char **argv);
int cli_bench_data(int argc, char **argv);
int cli_report(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_scale(int argc, char **argv);

/* "crop=4,flip" (or "none") into *out; prints the error and returns 0 when malformed. */
int cli_parse_augment(const char *verb, const char *text, crew_augment_options *out);

/* "cpu" (all cores) or "cpu:N" into *n; prints the error and returns 0 when malformed. */
/* --devices KIND or KIND:N (crew_devices_parse): the kind into kind, the count into *n; 0 after
 * printing the error (exit status 2). */
int cli_parse_devices(const char *verb, const char *text, char *kind, size_t kind_len, int64_t *n);

/* "512M", "8G", "24GiB", "1.5GB", "1000000" (K/M/G/T and KiB..TiB powers of 1024, KB..TB of
 * 1000) into *out; 0 after a usage error naming flag. */
int cli_parse_size(const char *verb, const char *flag, const char *text, int64_t *out);

/* The pipeline flags of train and verify: --pipeline K, --schedule gpipe|1f1b, --stages RANGES,
 * --micro-batches M. */
typedef struct cli_pipeline {
    int64_t stages;             /* 0: not given */
    int schedule;               /* a crew_pipeline_schedule; -1: not given */
    const char *split;          /* --stages, or NULL */
    int64_t micro_batches;      /* 0: not given */
    int span;                   /* cli_pipeline_replicas: the processes each replica spans [1] */
} cli_pipeline;
extern const char *const cli_schedules[]; /* "1f1b", "gpipe": crew_pipeline_schedule's order */
extern const char *const cli_precisions[]; /* "fp32", "bf16": crew_precision's order */
extern const char *const cli_attention_ways[]; /* "store", "recompute": crew_fit_options.attention_recompute */
/* --conv of train, verify and scale: auto, im2col, library (or cudnn, the same), or one of
 * im2col|library per convolution layer, comma-separated (crew_fit_options.conv_choice). */
typedef struct cli_conv {
    int way;                    /* a crew_conv_way; -1: not given */
    char ways[CREW_MAX_CONV_LAYERS + 1]; /* a list given: 'l' or 'i' per layer; else "" */
} cli_conv;
extern const char *const cli_conv_ways[]; /* "auto", "im2col", "library": crew_conv_way's order */
/* Reads --conv's value into *out: 1, or 0 after the usage error. */
int cli_parse_conv(const char *verb, const char *text, cli_conv *out);
/* Applies --conv to o (o->device_kind, batch_per_device and precision set): a list as it is; with
 * measure (process 0 of a group: the others take its plan), auto (given, or the default) on a
 * kind whose library may be faster measures each layer both ways
 * once per machine (crew_conv_choose with the figures' cache) and gives o the ways, keeping the
 * measurements in *table (the caller frees it, after the fit: o->conv_choice points into it;
 * NULL when nothing was measured). 0, or the exit status after printing the error. */
int cli_conv_apply(const char *verb, const cli_conv *c, crew_model *m, int measure, crew_fit_options *o,
                   crew_conv_choice **table);
/* The measurements of cli_conv_apply, one line per layer: which way won. */
void cli_print_conv_choice(const crew_conv_choice *t, int64_t rows);
/* K stages out of `devices` devices (each process's, of `processes`): *replicas = devices / K
 * per process; under mpirun, devices a divisor of K instead makes each replica span K / devices
 * processes (p->span, *replicas = 1). Returns 1, or 0 after a usage error (neither, a flag given
 * without --pipeline or --stages). */
int cli_pipeline_replicas(const char *verb, cli_pipeline *p, int64_t devices, int processes, int64_t *replicas);
/* Applies the flags to o (o->devices already the replicas of this process, of `processes`): the
 * stages, schedule, split and span, and the micro-batches per step (--micro-batches, else K) as
 * the global batch, unless global_given. */
void cli_pipeline_apply(const cli_pipeline *p, int global_given, int processes, crew_fit_options *o);

/* The layout of `cores` cores for the model file at per-device batch `batch` (0: the model's):
 * from the cache, else with measure 1 a short trial of each (crew_layout_cached, on a copy of
 * the model loaded from model_path), measure 2 trials anew; *found 0 when none is cached and
 * measure is 0, *cached 1 when it came from the cache. */
crew_status cli_layout(const char *model_path, const crew_dataset *train, int cores, int64_t batch, int measure,
                       crew_layout_choice *out, int *found, int *cached);
/* "2 replicas x 1 thread: 4185 samples/s, 1 replica x 2 threads: 3550" of a measured choice (its
 * trials), or "" from the cache. */
void cli_layout_trials_text(const crew_layout_choice *c, char *buf, size_t len);

/* Prints "crew VERB: message" on one line to stderr, frees s, and returns the exit status for
 * its code: 2 for bad usage or bad input, 1 for a run that failed. */
int cli_fail(const char *verb, crew_status s);

/* cli_mpi.c: under mpirun, starts MPI and the process group (0, or the exit status); cli_group()
 * is then that group (NULL when not under mpirun). cli_mpi_end(rc) ends MPI, aborting the whole
 * job when rc is not 0, and returns rc. */
int cli_mpi_begin(const char *verb, int *argc, char ***argv);
const crew_process_group *cli_group(void);
int cli_mpi_end(int rc);
/* Every process failed the same way (a check they all made): MPI may end cleanly, no abort. */
void cli_mpi_failed_together(void);
/* Under mpirun, process `rank`'s id and host name (gethostname) as it gave them at the start: 1,
 * or 0 when there is no such rank (or not under mpirun). */
int cli_mpi_peer(int rank, long *pid, const char **host);
/* agree_mpi.c: every process of g has the same crew, model file, dataset manifest, initial
 * weights (NULL: none) and options (argv); 0, or the exit status after saying which rank differs. */
int cli_agree_run(const char *verb, const crew_process_group *g, int argc, char **argv, const char *model,
                  const char *data, const char *init_weights);
/* A warning on stderr when the BLAS runs kernels older than this CPU (crew_blas_check): printed by
 * the verbs that compute, once, before they start. */
void cli_warn_slow_blas(const char *verb);
int cli_usage_error(const char *verb, const char *fmt, ...);
/* The dataset's files read through a symbolic link to outside it (crew_dataset_note), one
 * "crew VERB: note: ..." line each on stderr, each line once per process. */
void cli_note_dataset(const char *verb, const crew_dataset *d);

/* Flag values, range-checked; on error they print one line and return 0. */
int cli_parse_int(const char *verb, const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out);
/* The index of text in the NULL-terminated choices; prints the error and returns -1 otherwise. */
int cli_parse_choice(const char *verb, const char *flag, const char *text, const char *const *choices);
int cli_parse_float(const char *verb, const char *flag, const char *text, double lo, double hi, double *out);


/* If argv[*i] is `flag` or `flag=value`, stores the value (the next argument in the first form,
 * advancing *i) and returns 1; returns -1 when the value is missing, 0 when argv[*i] is another flag. */
int cli_flag(int argc, char **argv, int *i, const char *flag, const char **value);

/* A verb's flags as one table: each entry names a flag, how its value is read and checked, and
 * where it goes, as an offset into the verb's own argument struct, so that adding a flag is one
 * line and every flag reports its errors the same way. */
typedef enum cli_flag_kind {
    CLI_SWITCH, /* no value; sets an int to 1. Only the exact name: "--json=1" is not it */
    CLI_STRING, /* const char *, stored as given */
    CLI_INT,    /* int64_t in [lo, hi] */
    CLI_FLOAT,  /* double in [flo, fhi] */
    CLI_CHOICE, /* int: the index of the value in choices */
    CLI_CUSTOM, /* parse(verb, value, args) reads and stores it */
} cli_flag_kind;

typedef struct cli_flag_spec {
    const char *name;
    cli_flag_kind kind;
    size_t field; /* offsetof the destination in the argument struct (unused by CLI_CUSTOM) */
    int64_t lo, hi;
    double flo, fhi;
    const char *const *choices; /* NULL-terminated */
    int (*parse)(const char *verb, const char *value, void *args); /* 0 after printing the error */
} cli_flag_spec;

/* Table entries for a flag stored in member m of the argument struct S. The table holds only an
 * offset, so nothing would notice a kind that does not match the member's type: CLI_FIELD makes
 * that a compile error (_Generic has no case for any other type). */
#define CLI_FIELD(S, m, T) (offsetof(S, m) + 0 * sizeof(char[_Generic(((S *)0)->m, T: 1)]))
#define CLI_SWITCH_FLAG(S, flag_, m) {.name = flag_, .kind = CLI_SWITCH, .field = CLI_FIELD(S, m, int)}
#define CLI_STRING_FLAG(S, flag_, m) {.name = flag_, .kind = CLI_STRING, .field = CLI_FIELD(S, m, const char *)}
#define CLI_INT_FLAG(S, flag_, m, lo_, hi_) \
    {.name = flag_, .kind = CLI_INT, .field = CLI_FIELD(S, m, int64_t), .lo = lo_, .hi = hi_}
#define CLI_FLOAT_FLAG(S, flag_, m, lo_, hi_) \
    {.name = flag_, .kind = CLI_FLOAT, .field = CLI_FIELD(S, m, double), .flo = lo_, .fhi = hi_}
#define CLI_CHOICE_FLAG(S, flag_, m, choices_) \
    {.name = flag_, .kind = CLI_CHOICE, .field = CLI_FIELD(S, m, int), .choices = choices_}
#define CLI_CUSTOM_FLAG(flag_, parse_) {.name = flag_, .kind = CLI_CUSTOM, .parse = parse_}

/* If argv[*i] is one of the n flags, reads its value (advancing *i past it) into args and returns
 * 1; returns 0 when argv[*i] is none of them, and -1 after printing the error for a missing or bad
 * value (exit status 2). */
int cli_parse_flag(const char *verb, const cli_flag_spec *flags, size_t n, int argc, char **argv, int *i, void *args);

/* A verb's whole command line: --help/-h prints usage to stdout and returns -1; each flag of the
 * table is read into args; one positional argument (MODEL.json, DIR, ...) goes to *positional.
 * Returns 0 when all was read, -1 after --help, 2 after printing a usage error (an unknown
 * option, a second positional argument, a bad or missing value). */
int cli_parse_args(const char *verb, const char *usage, const cli_flag_spec *flags, size_t n, int argc, char **argv,
                   void *args, const char **positional);
#define CLI_COUNT(table) (sizeof(table) / sizeof((table)[0]))

/* Monotonic seconds. */
double cli_now(void);

/* A progress display for long work: a Keras-style bar on a terminal, nothing elsewhere. */
typedef struct cli_progress {
    int tty;
    double start;
    int last_width;
} cli_progress;
void cli_progress_init(cli_progress *p, int enabled);
/* "  234/937 [=====>........] - 12s 51ms/step" + extra */
void cli_progress_bar(cli_progress *p, int64_t done, int64_t total, double elapsed_s, const char *extra);
void cli_progress_end(cli_progress *p);

/* JSON output helpers: a number ("null" when not finite) and a quoted, escaped string. */
const char *cli_json_number(double v, char *buf, size_t len);

/* Human-readable model summary and plan, to stdout. */
void cli_print_plan(const crew_fit_plan *plan, const char *devices);

#endif
