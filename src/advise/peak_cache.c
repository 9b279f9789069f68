/* peak_cache.c — the peak cache's keys and lines (peak_cache.h). */
#include "advise/peak_cache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "crew.h"

void crew_peak_cache_key(const char *kind, int threads, char *buf, size_t len)
{
    if (!len) return;
    char host[64] = "", blas[200] = "";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    crew_blas_describe(blas, sizeof blas);
    if (len > CREW_PEAK_KEY_MAX) len = CREW_PEAK_KEY_MAX;
    /* the probe's sizes: a figure another probe measured is measured again (spaces become '_' below) */
    snprintf(buf, len, "crew-%s|gemm=%s|%s|%s|threads=%d|%s", crew_version(), CREW_PEAK_TEXT(CREW_PEAK_SIZES), host,
             kind ? kind : "cpu", threads, blas);
    for (char *p = buf; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') *p = '_';
}

int crew_peak_cache_find(const char *text, size_t n, const char *key, double *gflops)
{
    size_t klen = strlen(key);
    int found = 0;
    for (size_t at = 0; at < n;) {
        const char *line = text + at, *nl = memchr(line, '\n', n - at);
        size_t len = nl ? (size_t)(nl - line) : n - at;
        at += len + 1;
        if (len <= klen + 1 || len >= CREW_PEAK_KEY_MAX + 64 || memcmp(line, key, klen) != 0 || line[klen] != ' ')
            continue;
        char num[64];
        size_t vlen = len - klen - 1;
        if (vlen >= sizeof num || line[klen + 1] == ' ' || line[klen + 1] == '\t') continue; /* one space, then the figure */
        memcpy(num, line + klen + 1, vlen);
        num[vlen] = '\0';
        char *end = NULL;
        double v = strtod(num, &end);
        if (end == num || *end != '\0' || !isfinite(v) || !(v > 0.0 && v < 1e9)) continue;
        *gflops = v;
        found = 1;
    }
    return found;
}

#define CACHE_MAX_BYTES (64 * 1024) /* a bigger file is not a cache crew wrote: started anew */
#define PEAK_SECONDS 0.3

char *crew_cache_read(const char *path, size_t *n)
{
    *n = 0;
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) return NULL;
    char *text = malloc(CACHE_MAX_BYTES + 1);
    size_t got = text ? fread(text, 1, CACHE_MAX_BYTES + 1, f) : 0;
    int bad = ferror(f) || got > CACHE_MAX_BYTES;
    fclose(f);
    if (!text || bad) {
        free(text);
        return NULL;
    }
    *n = got;
    return text;
}

void crew_cache_write(const char *path, const char *old, size_t n, const char *const *keys, const double *values,
                      int count)
{
    char tmp[4200];
    if (!path || (size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp) return;
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    while (n > 0 && old[n - 1] != '\n') n--; /* a torn last line is dropped */
    int ok = fwrite(old ? old : "", 1, n, f) == n;
    for (int i = 0; i < count && ok; i++) ok = fprintf(f, "%s %.6g\n", keys[i], values[i]) > 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) remove(tmp);
}

crew_status crew_peak_cached(const char *cache_path, const char *device_kind, int threads_per_device, double *gflops,
                             int *from_cache)
{
    if (!gflops) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_peak_cached: NULL argument");
    if (from_cache) *from_cache = 0;
    char key[CREW_PEAK_KEY_MAX];
    crew_peak_cache_key(device_kind, threads_per_device, key, sizeof key);
    size_t n = 0;
    char *text = crew_cache_read(cache_path, &n);
    if (text && crew_peak_cache_find(text, n, key, gflops)) {
        free(text);
        if (from_cache) *from_cache = 1;
        return CREW_OK;
    }
    crew_status s = crew_measure_peak(device_kind, threads_per_device, PEAK_SECONDS, gflops);
    const char *keys[1] = {key};
    if (!s) crew_cache_write(cache_path, text, n, keys, gflops, 1);
    free(text);
    return s;
}

/* ---------------------------------------------------------------- the figures' cache and a run's peak */

int crew_cache_path(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[3800];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache", home);
    else
        return 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return 0;
    size_t at = (size_t)snprintf(buf, len, "%s/crew", dir);
    if (at >= len || (mkdir(buf, 0755) != 0 && errno != EEXIST)) return 0;
    return (size_t)snprintf(buf, len, "%s/crew/peaks", dir) < len;
}

double crew_run_peak(const char *kind, int devices, int threads, int processes, double *per_device)
{
    char path[4096];
    int have = crew_cache_path(path, sizeof path), cached = 0;
    double per = 0.0;
    crew_status s = crew_peak_cached(have ? path : NULL, kind, threads, &per, &cached);
    crew_status_free(s); /* a peak that cannot be measured leaves the fraction out, nothing more */
    if (s || per <= 0.0) return 0.0;
    char cpu[16];
    int cores = 1;
    crew_status d = crew_devices_parse("cpu", cpu, sizeof cpu, &cores);
    crew_status_free(d);
    if (d || cores < 1) cores = 1;
    int own = cores / (threads > 0 ? threads : 1); /* replicas with cores of their own */
    if (own < 1) own = 1;
    if (per_device) *per_device = per;
    return per * (double)(devices < own ? devices : own) * (double)(processes > 0 ? processes : 1);
}
