/* status.h — building crew_status errors inside the library. */
#ifndef CREW_CORE_STATUS_H
#define CREW_CORE_STATUS_H

#include "crew.h"

#if defined(__GNUC__)
#define CREW_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CREW_PRINTF(a, b)
#endif

/* A new error with a printf-style message. Never returns NULL. */
crew_status crew_errorf(crew_code code, const char *fmt, ...) CREW_PRINTF(2, 3);
/* Prepends context to an error's message ("reading x.npy: " + old message) and returns it.
 * NULL stays NULL, so it can wrap any call. */
crew_status crew_error_prefix(crew_status s, const char *fmt, ...) CREW_PRINTF(2, 3);

#define CREW_TRY(expr)                    \
    do {                                  \
        crew_status crew_try_s_ = (expr); \
        if (crew_try_s_) return crew_try_s_; \
    } while (0)

#define CREW_OOM() crew_errorf(CREW_CODE_OUT_OF_MEMORY, "out of memory")

#endif
