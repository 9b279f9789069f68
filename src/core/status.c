/* status.c — crew_status: a heap-allocated error, NULL for success.
 * When even the error cannot be allocated, a constant out-of-memory error is returned; freeing
 * it is a no-op, so callers never need to tell the two apart. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct crew_error {
    crew_code code;
    int is_static;
    char *message;
};

static const struct crew_error oom_error = {CREW_CODE_OUT_OF_MEMORY, 1, "out of memory"};

static crew_status make_error(crew_code code, char *message)
{
    struct crew_error *e = malloc(sizeof *e);
    if (!e || !message) {
        free(e);
        free(message);
        return (crew_status)&oom_error;
    }
    e->code = code;
    e->is_static = 0;
    e->message = message;
    return e;
}

static char *vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return NULL;
    char *buf = malloc((size_t)n + 1);
    if (buf) vsnprintf(buf, (size_t)n + 1, fmt, ap);
    return buf;
}

crew_status crew_errorf(crew_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    return make_error(code, msg);
}

crew_status crew_error_prefix(crew_status s, const char *fmt, ...)
{
    if (!s || s->is_static) return s;
    va_list ap;
    va_start(ap, fmt);
    char *prefix = vformat(fmt, ap);
    va_end(ap);
    if (!prefix) return s;
    size_t a = strlen(prefix), b = strlen(s->message);
    char *joined = malloc(a + b + 1);
    if (joined) {
        memcpy(joined, prefix, a);
        memcpy(joined + a, s->message, b + 1);
        free(s->message);
        s->message = joined;
    }
    free(prefix);
    return s;
}

crew_code crew_status_code(crew_status s) { return s ? s->code : CREW_CODE_OK; }

const char *crew_status_message(crew_status s) { return s ? s->message : "ok"; }

void crew_status_free(crew_status s)
{
    if (!s || s->is_static) return;
    free(s->message);
    free(s);
}
