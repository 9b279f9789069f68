/* check.h — the smallest test harness: CHECK records a failure and goes on; a test's main
 * returns check_report(), which prints "N passed, N failed" and the exit status. */
#ifndef CREW_TESTS_CHECK_H
#define CREW_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "crew.h"

static int check_passed_, check_failed_;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (cond) {                                                                        \
            check_passed_++;                                                               \
        } else {                                                                           \
            check_failed_++;                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        if (cond) {                                                                        \
            check_passed_++;                                                               \
        } else {                                                                           \
            check_failed_++;                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* Expects success; on failure prints the status message and frees it. */
#define CHECK_OK(expr)                                                                     \
    do {                                                                                   \
        crew_status check_s_ = (expr);                                                     \
        CHECK_MSG(check_s_ == CREW_OK, "%s", crew_status_message(check_s_));               \
        crew_status_free(check_s_);                                                        \
    } while (0)

/* Expects an error whose message contains `needle`. */
#define CHECK_ERR(expr, needle)                                                            \
    do {                                                                                   \
        crew_status check_s_ = (expr);                                                     \
        CHECK_MSG(check_s_ != CREW_OK, "expected an error containing '%s'", (needle));     \
        if (check_s_)                                                                      \
            CHECK_MSG(strstr(crew_status_message(check_s_), (needle)) != NULL,             \
                      "message '%s' lacks '%s'", crew_status_message(check_s_), (needle)); \
        crew_status_free(check_s_);                                                        \
    } while (0)

static inline int check_report(void)
{
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
