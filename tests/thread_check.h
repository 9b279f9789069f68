/* thread_check.h — checks for tests whose threads check at the same time (check.h's counters are
 * for one thread): a failure prints its place and counts in thread_failures, which main adds to
 * the report. One translation unit per test includes it. */
#ifndef CREW_TESTS_THREAD_CHECK_H
#define CREW_TESTS_THREAD_CHECK_H

#include <stdatomic.h>
#include <stdio.h>

#include "core/status.h"

static atomic_int thread_failures;

#define EXPECT(cond, ...)                                                                 \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                               \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            atomic_fetch_add(&thread_failures, 1);                                        \
        }                                                                                 \
    } while (0)
#define EXPECT_OK(expr)                                                                   \
    do {                                                                                  \
        crew_status s_ = (expr);                                                          \
        EXPECT(s_ == CREW_OK, "%s: %s", #expr, crew_status_message(s_));                  \
        crew_status_free(s_);                                                             \
    } while (0)

#endif
