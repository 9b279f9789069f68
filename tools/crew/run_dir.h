/* run_dir.h — the run directory: where a training run leaves config.json, weights and logs. */
#ifndef CREW_CLI_RUN_DIR_H
#define CREW_CLI_RUN_DIR_H

#include <stddef.h>

#include "crew.h"

/* The run directory's path: `wanted` when given, else runs/<model file stem>-<YYYYmmdd-HHMMSS>.
 * Creates nothing. */
void run_dir_choose(const char *wanted, const char *model_path, char *out, size_t len);
/* Creates the directory (and its parents). Returns 0, or -1 with a message in err. */
int run_dir_create(const char *path, char *err, size_t err_len);

typedef struct run_config {
    const char *model_path;
    const char *data_dir;
    const char *devices;        /* "cpu:2" */
    const char *init_weights;   /* or NULL */
    const crew_fit_plan *plan;
} run_config;

/* Writes RUN_DIR/config.json: everything the run resolved. Returns 0, or -1 with a message. */
int run_dir_write_config(const char *run_dir, const run_config *c, char *err, size_t err_len);

#endif
