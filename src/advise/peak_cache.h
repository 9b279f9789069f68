/* peak_cache.h — the text of crew's cache of measured figures, GEMM peaks and layouts (the CLI
 * keeps it in $XDG_CACHE_HOME/crew/peaks, else ~/.cache/crew/peaks): one line per measurement,
 * "<key> <figure>", the key naming everything the figure depends on (crew_peak_cache_key; a
 * layout's key adds the model and batch, layout.c). The file is outside data: a line that does
 * not parse is skipped, never trusted. */
#ifndef CREW_ADVISE_PEAK_CACHE_H
#define CREW_ADVISE_PEAK_CACHE_H

#include <stddef.h>

/* The square GEMMs' sizes crew_measure_peak measures (peak.c), in turn, the best rate of any: in
 * the probe's array and in the cache's key, so that a figure another probe measured is measured
 * again. */
#define CREW_PEAK_SIZES 512, 1024
#define CREW_PEAK_TEXT_(...) #__VA_ARGS__
#define CREW_PEAK_TEXT(...) CREW_PEAK_TEXT_(__VA_ARGS__)

/* Longest key, and longest line the cache keeps. */
#define CREW_PEAK_KEY_MAX 400

/* The key of one device of `kind` at `threads` BLAS threads on this host, with this build: no
 * spaces (they are replaced), at most CREW_PEAK_KEY_MAX - 1 characters. */
void crew_peak_cache_key(const char *kind, int threads, char *buf, size_t len);

/* The figure of the last line of text[n] whose key is `key` and whose value is a finite number
 * in (0, 1e9) GFLOP/s: 1 and *gflops, else 0. text need not end in a newline or a NUL. */
int crew_peak_cache_find(const char *text, size_t n, const char *key, double *gflops);

/* The cache file's text (NULL and *n 0 when path is NULL, it cannot be read, or it is bigger than
 * a cache crew writes); the caller frees it. */
char *crew_cache_read(const char *path, size_t *n);
/* old[n] (its whole lines) and `count` new lines "<key> <value>", into path through a temporary
 * file and a rename in its directory; a failure leaves the file as it was (a cache is optional). */
void crew_cache_write(const char *path, const char *old, size_t n, const char *const *keys, const double *values,
                      int count);

#endif
