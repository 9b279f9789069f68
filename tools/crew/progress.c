/* progress.c — the Keras-style progress bar, redrawn in place with a carriage return. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

void cli_progress_init(cli_progress *p, int enabled)
{
    memset(p, 0, sizeof *p);
    p->tty = enabled && isatty(STDOUT_FILENO);
}

void cli_progress_bar(cli_progress *p, int64_t done, int64_t total, double elapsed_s, const char *extra)
{
    if (!p->tty || total <= 0) return;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int filled = (int)((double)WIDTH * (double)done / (double)total);
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '=' : '.';
    if (filled < WIDTH && filled > 0) bar[filled - 1] = '>';
    bar[WIDTH] = '\0';
    double per = done > 0 ? elapsed_s / (double)done : 0.0;
    char line[512];
    int len = snprintf(line, sizeof line, "%*lld/%lld [%s] - %.0fs %.0fms/step%s%s", (int)snprintf(NULL, 0, "%lld", (long long)total),
                       (long long)done, (long long)total, bar, elapsed_s, per * 1e3, extra && *extra ? " - " : "",
                       extra ? extra : "");
    /* Pad with spaces so a shorter line erases the end of a longer one. */
    printf("\r%s%*s", line, p->last_width > len ? p->last_width - len : 0, "");
    p->last_width = len;
    fflush(stdout);
}

void cli_progress_end(cli_progress *p)
{
    if (p->tty && p->last_width) printf("\n");
    p->last_width = 0;
    fflush(stdout);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
