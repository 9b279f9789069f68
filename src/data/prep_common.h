/* prep_common.h — what the crew prep sources (CIFAR-10, image folders, CSV) share: progress
 * steps, the stratified train/test split, normalisation statistics of the training split, and
 * writing the finished arrays with their manifest into a dataset directory atomically. */
#ifndef CREW_DATA_PREP_COMMON_H
#define CREW_DATA_PREP_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "core/atomic_dir.h"
#include "crew.h"
#include "data/manifest.h"
#include "data/npy.h"

/* Progress in steps: done counts up to total, and the last call has done == total. */
typedef struct crew_prep_progress {
    crew_progress_fn fn;
    void *user;
    int64_t done, total;
} crew_prep_progress;

/* Reports the step about to start, then counts it. */
void crew_prep_tick(crew_prep_progress *p, const char *what);
/* The final call: done == total. */
void crew_prep_done(crew_prep_progress *p);

/* Refuses an existing out_dir before minutes of work (the atomic commit checks again). */
crew_status crew_prep_refuse_existing(const char *out_dir);

/* Maps a whole file read-only (munmap(*map, *len) releases it); an empty file is an error. */
crew_status crew_prep_map_file(const char *path, void **map, size_t *len);

/* Which samples become the test split, stratified by label and reproducible from the seed: for
 * each class with n_c samples, round(n_c · fraction) of them (but never all: a class keeps at
 * least one training sample) chosen by a seeded shuffle. is_test [n] receives 1 for test
 * samples. An empty train or test split is an error; `what` names the source in it. */
crew_status crew_prep_split(const int32_t *labels, int64_t n, int classes, double fraction, uint64_t seed,
                            const char *what, uint8_t *is_test);

/* Moves the test samples (is_test [n]) into xt/yt and compacts the training samples to the front
 * of x/y, both keeping their order. Samples are sample_bytes long, labels y_bytes. */
void crew_prep_partition(uint8_t *x, int64_t sample_bytes, uint8_t *y, int y_bytes, const uint8_t *is_test, int64_t n,
                         uint8_t *xt, uint8_t *yt);

/* The most channels of a uint8 image source: the statistics below keep 256 counters per channel
 * on the stack. */
#define CREW_PREP_MAX_CHANNELS 16

/* Per-channel mean and std of scale·v over the uint8 values x [count] (channel = index mod
 * channels, 1 ≤ channels ≤ CREW_PREP_MAX_CHANNELS), exact from histograms, into m's
 * normalization (scale included; crew_manifest_free releases it). A constant channel gets std 1. */
crew_status crew_prep_stats_u8(const uint8_t *x, int64_t count, int channels, double scale, crew_manifest *m);

/* One split's arrays in memory, to be written as <name>_x.npy and <name>_y.npy. */
typedef struct crew_prep_split_data {
    const char *name; /* "train", "test" */
    int64_t n;
    const void *x;    /* [n, ...m->sample_shape] of x_dtype */
    const void *y;    /* [n] of y_dtype */
} crew_prep_split_data;

/* Writes the splits and m (name, classes, class_names, sample_shape and normalization filled in;
 * m->splits is filled here) into out_dir atomically: one progress step per array and one for
 * the commit. */
crew_status crew_prep_write(const char *out_dir, crew_manifest *m, crew_npy_dtype x_dtype, crew_npy_dtype y_dtype,
                            const crew_prep_split_data *splits, int n_splits, crew_prep_progress *progress);

/* The end of every prep's writing into ad: unless s already holds an error, writes m as
 * manifest.json and commits ad (one progress step); in every case ad's temporary directory is
 * gone afterwards. Returns s or the first new error. */
crew_status crew_prep_commit(crew_atomic_dir *ad, const crew_manifest *m, crew_status s, crew_prep_progress *progress);

#endif
