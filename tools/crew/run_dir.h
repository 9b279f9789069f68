/* run_dir.h — the run directory: where a training run leaves config.json, weights and logs.
 *
 * A run directory belongs to one run. crew owns what it writes there (run_dir_owned, and the lock
 * file of crew_run_lock_take, which outlives every run and is no run's) and nothing else; a new run is never started on top of another one's files, which would mix the two (the
 * old checkpoints would outrank the new ones, and a later --resume continue the old run). */
#ifndef CREW_CLI_RUN_DIR_H
#define CREW_CLI_RUN_DIR_H

#include <stddef.h>

#include "crew.h"

/* config.json, metrics.jsonl, tb, checkpoints, report.html, weights.safetensors; NULL-terminated. */
extern const char *const run_dir_owned[];

/* The run directory's path: `wanted` when given, else runs/<model file stem>-<YYYYmmdd-HHMMSS>
 * (with -2, -3, ... when a run started in the same second has it). Creates nothing. */
void run_dir_choose(const char *wanted, const char *model_path, char *out, size_t len);
/* Whether a new run may start in path: it does not exist, or it is a directory holding none of
 * crew's files (any directory with replace, whose crew files run_dir_clear then removes).
 * Returns 0, or -1 with one line in err: not a directory, or the files of another run and the
 * two ways on (--resume, --replace). */
int run_dir_check_new(const char *path, int replace, char *err, size_t err_len);
/* Whether path is a directory a run can be resumed in. Returns 0, or -1 with a message. */
int run_dir_check_resume(const char *path, char *err, size_t err_len);
/* A run directory crew resumes in holds no symbolic link where crew keeps its files: none of
 * run_dir_owned, nothing in tb/, no entry of checkpoints/ (a temporary included) nor a file of a
 * checkpoint. Returns 0, or -1 with one line naming the first link and what it points to. */
int run_dir_check_links(const char *path, char *err, size_t err_len);
/* A --run-dir or --resume that is itself a symbolic link is followed, and said: note gets "run
 * directory X is a symbolic link: the run is written into Y" ("" when path is no link). Returns 0,
 * or -1 with a message when the link points nowhere, or to something not a directory. */
int run_dir_follow(const char *path, char *note, size_t note_len, char *err, size_t err_len);
/* Removes crew's files from path (tb/ and checkpoints/ with all they hold), nothing else; a
 * symbolic link is removed, never followed. Returns 0, or -1 with a message naming the file. */
int run_dir_clear(const char *path, char *err, size_t err_len);
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
