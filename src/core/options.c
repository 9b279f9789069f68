/* options.c — see options.h. */
#include "core/options.h"

#include <string.h>

#include "core/status.h"

crew_status crew_options_take(void *dst, size_t dst_size, const void *src, const char *what)
{
    if (!src) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: NULL", what);
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size == 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: struct_size is 0; fill the options with their initialiser "
                           "first (see crew.h)", what);
    if (size < sizeof size || size > dst_size)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: struct_size %zu is not one this library knows (at most %zu): "
                           "was the program built against a newer crew.h?", what, size, dst_size);
    memcpy(dst, src, size);
    memcpy(dst, &dst_size, sizeof dst_size);
    return CREW_OK;
}
