/* links.c — see links.h. */
#include "core/links.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

int crew_is_link(const char *path, char *target, size_t len)
{
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode)) return 0;
    if (target && len) {
        ssize_t n = readlink(path, target, len - 1);
        target[n > 0 ? (size_t)n : 0] = '\0';
    }
    return 1;
}

crew_status crew_refuse_link(const char *path, const char *why)
{
    char target[1024];
    if (!crew_is_link(path, target, sizeof target)) return CREW_OK;
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s is a symbolic link (to %s): %s", path, target[0] ? target : "?", why);
}
