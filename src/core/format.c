/* format.c — the few ways crew writes a figure or a string, shared by the library's files and the
 * CLI's output so that a value reads the same everywhere (all public, in crew.h). */
#include <math.h>
#include <stdio.h>

#include "core/json_text.h"
#include "crew.h"

const char *crew_format_percent(double percent, char *buf, size_t len)
{
    if (!buf || len == 0) return "";
    if (!isfinite(percent)) {
        snprintf(buf, len, "-");
        return buf;
    }
    double a = fabs(percent);
    if (a == 0 || a >= 100) {
        snprintf(buf, len, "%.0f%%", percent);
        return buf;
    }
    if (a < 0.01) {
        snprintf(buf, len, "%s0.01%%", percent < 0 ? ">-" : "<");
        return buf;
    }
    /* Two significant digits at least, and as many more as keep a value under 100 under it. */
    int digits = a >= 10 ? 0 : a >= 1 ? 1 : 2;
    while (digits < 6 && a < 100 && round(a * pow(10, digits)) >= 100 * pow(10, digits)) digits++;
    snprintf(buf, len, "%.*f%%", digits, percent);
    return buf;
}

void crew_json_write_string(FILE *f, const char *s)
{
    char e[8];
    fputc('"', f);
    for (; s && *s; s++) fwrite(e, 1, (size_t)crew_json_escape_byte((unsigned char)*s, e), f);
    fputc('"', f);
}

/* Each unit holds until two of the next one: "90 s", "100 min", "36.0 h" keep two or three digits. */
const char *crew_format_duration(double seconds, char *buf, size_t len)
{
    if (!buf || len == 0) return "";
    if (!isfinite(seconds))
        snprintf(buf, len, "-");
    else if (seconds < 10)
        snprintf(buf, len, "%.1f s", seconds);
    else if (seconds < 120)
        snprintf(buf, len, "%.0f s", seconds);
    else if (seconds < 7200)
        snprintf(buf, len, "%.0f min", seconds / 60);
    else if (seconds < 172800)
        snprintf(buf, len, "%.1f h", seconds / 3600);
    else
        snprintf(buf, len, "%.1f d", seconds / 86400);
    return buf;
}

const char *crew_format_bytes(int64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, len, "%lld B", (long long)bytes);
    else
        snprintf(buf, len, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, units[u]);
    return buf;
}
