/* peak.c — the run's peak for crew train: one device's GEMM rate, measured once per host, build,
 * kind and thread count and kept in $XDG_CACHE_HOME/crew/peaks (else ~/.cache/crew/peaks), times
 * the replicas that have cores of their own. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cli.h"

int cli_cache_path(char *buf, size_t len)
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

double cli_run_peak(const char *kind, int devices, int threads, int processes, double *per_device)
{
    char path[4096];
    int have = cli_cache_path(path, sizeof path), cached = 0;
    double per = 0.0;
    crew_status s = crew_peak_cached(have ? path : NULL, kind, threads, &per, &cached);
    crew_status_free(s); /* a peak that cannot be measured leaves the fraction out, nothing more */
    if (s || per <= 0.0) return 0.0;
    char cpu[16];
    int64_t cores = 1;
    if (!cli_parse_devices("train", "cpu", cpu, sizeof cpu, &cores) || cores < 1) cores = 1;
    int64_t own = cores / (threads > 0 ? threads : 1); /* replicas with cores of their own */
    if (own < 1) own = 1;
    if (per_device) *per_device = per;
    return per * (double)(devices < own ? devices : own) * (double)(processes > 0 ? processes : 1);
}
