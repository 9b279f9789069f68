/* peak_cache.h — the text of crew's cache of measured GEMM peaks (the CLI keeps it in
 * $XDG_CACHE_HOME/crew/peaks, else ~/.cache/crew/peaks): one line per measurement,
 * "<key> <gflops>", the key naming everything the figure depends on (crew_peak_cache_key). The
 * file is outside data: a line that does not parse is skipped, never trusted. */
#ifndef CREW_ADVISE_PEAK_CACHE_H
#define CREW_ADVISE_PEAK_CACHE_H

#include <stddef.h>

/* Longest key, and longest line the cache keeps. */
#define CREW_PEAK_KEY_MAX 400

/* The key of one device of `kind` at `threads` BLAS threads on this host, with this build: no
 * spaces (they are replaced), at most CREW_PEAK_KEY_MAX - 1 characters. */
void crew_peak_cache_key(const char *kind, int threads, char *buf, size_t len);

/* The figure of the last line of text[n] whose key is `key` and whose value is a finite number
 * in (0, 1e9) GFLOP/s: 1 and *gflops, else 0. text need not end in a newline or a NUL. */
int crew_peak_cache_find(const char *text, size_t n, const char *key, double *gflops);

#endif
