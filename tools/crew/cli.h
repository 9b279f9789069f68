/* cli.h — the verbs of the crew command line and the helpers they share. */
#ifndef CREW_CLI_H
#define CREW_CLI_H

#include <stdint.h>

#include "crew.h"

int cli_prep(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_eval(int argc, char **argv);

/* Prints "crew VERB: message" on one line to stderr, frees s, and returns the exit status for
 * its code: 2 for bad usage or bad input, 1 for a run that failed. */
int cli_fail(const char *verb, crew_status s);
int cli_usage_error(const char *verb, const char *fmt, ...);

/* Flag values, range-checked; on error they print one line and return 0. */
int cli_parse_int(const char *verb, const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_float(const char *verb, const char *flag, const char *text, double lo, double hi, double *out);

#endif
