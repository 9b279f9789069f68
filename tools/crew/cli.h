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
int cli_verify(int argc, char **argv);
int cli_bench_data(int argc, char **argv);
int cli_report(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_scale(int argc, char **argv);

/* "crop=4,flip" (or "none") into *out; prints the error and returns 0 when malformed. */
int cli_parse_augment(const char *verb, const char *text, crew_augment_options *out);

/* "cpu" (all cores) or "cpu:N" into *n; prints the error and returns 0 when malformed. */
int cli_parse_devices(const char *verb, const char *text, int64_t *n);

/* Prints "crew VERB: message" on one line to stderr, frees s, and returns the exit status for
 * its code: 2 for bad usage or bad input, 1 for a run that failed. */
int cli_fail(const char *verb, crew_status s);
/* A warning on stderr when the BLAS runs kernels older than this CPU (crew_blas_check): printed by
 * the verbs that compute, once, before they start. */
void cli_warn_slow_blas(const char *verb);
int cli_usage_error(const char *verb, const char *fmt, ...);

/* Flag values, range-checked; on error they print one line and return 0. */
int cli_parse_int(const char *verb, const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out);
/* The index of text in the NULL-terminated choices; prints the error and returns -1 otherwise. */
int cli_parse_choice(const char *verb, const char *flag, const char *text, const char *const *choices);
int cli_parse_float(const char *verb, const char *flag, const char *text, double lo, double hi, double *out);


/* If argv[*i] is `flag` or `flag=value`, stores the value (the next argument in the first form,
 * advancing *i) and returns 1; returns -1 when the value is missing, 0 when argv[*i] is another flag. */
int cli_flag(int argc, char **argv, int *i, const char *flag, const char **value);

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
void cli_json_string(FILE *f, const char *s);

/* Human-readable model summary and plan, to stdout. */
void cli_print_plan(const crew_fit_plan *plan, const char *devices);

#endif
