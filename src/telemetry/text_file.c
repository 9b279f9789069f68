/* text_file.c — see text_file.h: a buffer, write(2), and the errno of the call that failed. */
#include "telemetry/text_file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json_text.h"


crew_status crew_text_attach(crew_text_file *t, int fd, const char *path)
{
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->path = strdup(path);
    t->cap = 4096;
    t->buf = malloc(t->cap);
    if (!t->path || !t->buf) {
        free(t->path);
        free(t->buf);
        memset(t, 0, sizeof *t);
        t->fd = -1;
        close(fd);
        return CREW_OOM();
    }
    t->fd = fd;
    return CREW_OK;
}

/* Room for `more` bytes after the buffered text (and a NUL, for vsnprintf). */
static int reserve(crew_text_file *t, size_t more)
{
    if (t->err) return 0;
    if (t->len + more + 1 <= t->cap) return 1;
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + more + 1) cap *= 2;
    char *b = realloc(t->buf, cap);
    if (!b) {
        t->err = ENOMEM;
        return 0;
    }
    t->buf = b;
    t->cap = cap;
    return 1;
}

void crew_text_printf(crew_text_file *t, const char *fmt, ...)
{
    if (t->err || t->fd < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->err = EINVAL; /* a format error: nothing sensible was written */
        return;
    }
    if ((size_t)n >= t->cap - t->len) { /* it did not fit: make room and format again */
        if (!reserve(t, (size_t)n)) return;
        va_start(ap, fmt);
        vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
    }
    t->len += (size_t)n;
}

void crew_text_puts(crew_text_file *t, const char *s)
{
    size_t n = strlen(s);
    if (t->fd < 0 || !reserve(t, n)) return;
    memcpy(t->buf + t->len, s, n);
    t->len += n;
}

void crew_text_putc(crew_text_file *t, char c)
{
    if (t->fd < 0 || !reserve(t, 1)) return;
    t->buf[t->len++] = c;
}

void crew_text_json_string(crew_text_file *t, const char *s)
{
    char e[8];
    crew_text_putc(t, '"');
    for (; s && *s; s++) {
        crew_json_escape_byte((unsigned char)*s, e);
        crew_text_printf(t, "%s", e);
    }
    crew_text_putc(t, '"');
}

crew_status crew_text_status(const crew_text_file *t)
{
    if (!t->err) return CREW_OK;
    return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", t->path ? t->path : "(text file)", strerror(t->err));
}

crew_status crew_text_flush(crew_text_file *t)
{
    size_t done = 0;
    while (!t->err && t->fd >= 0 && done < t->len) {
        ssize_t n = write(t->fd, t->buf + done, t->len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) t->err = errno;          /* read here, before anything else can change it */
        else if (n == 0) t->err = EIO;      /* write(2) of a regular file never returns 0 for n > 0 */
        else done += (size_t)n;
    }
    /* After a failure the rest is dropped, never retried: the file keeps a torn line at most. */
    t->len = 0;
    return crew_text_status(t);
}

crew_status crew_text_end_line(crew_text_file *t)
{
    crew_text_putc(t, '\n');
    /* Every line at once: one write(2) of a few hundred bytes costs microseconds, a step takes
     * milliseconds, and a killed run's record then holds every step it logged, in whole lines. */
    return crew_text_flush(t);
}

crew_status crew_text_close(crew_text_file *t, int sync)
{
    if (t->fd >= 0) {
        crew_status_free(crew_text_flush(t)); /* its failure is kept in t->err */
        if (sync && !t->err && fsync(t->fd) != 0 && errno != EINVAL) t->err = errno; /* EINVAL: not syncable (a pipe, /dev/full) */
        if (close(t->fd) != 0 && !t->err && errno != EINTR) t->err = errno;
        t->fd = -1;
    }
    crew_status s = crew_text_status(t);
    free(t->path);
    free(t->buf);
    t->path = t->buf = NULL;
    t->len = t->cap = 0;
    return s;
}
