/* options.h — reading a caller's option struct that carries its own size (crew.h, conventions). */
#ifndef CREW_CORE_OPTIONS_H
#define CREW_CORE_OPTIONS_H

#include <stddef.h>

#include "crew.h"

/* src is the caller's struct, whose first member is its size_t struct_size; dst holds the defaults
 * of this library's layout (dst_size bytes). Copies the caller's first struct_size bytes over dst
 * and sets dst's struct_size to dst_size: fields a caller built against an older crew.h does not
 * know keep their defaults. `what` names the struct in errors ("crew_fit_options"). */
crew_status crew_options_take(void *dst, size_t dst_size, const void *src, const char *what);

#endif
