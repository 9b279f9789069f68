/* file_hash.c — size and XXH3-64 of a file, read in 1 MiB blocks. */
#include "crew.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/mapped_file.h"
#include "core/status.h"

crew_status crew_file_hash(const char *path, int64_t *bytes, uint64_t *xxh3)
{
    int fd;
    int64_t size;
    CREW_TRY(crew_open_regular(path, &fd, &size)); /* never a FIFO (it would block) or /dev/zero (no end) */
    XXH3_state_t *st = XXH3_createState();
    unsigned char *buf = malloc(1 << 20);
    crew_status s = CREW_OK;
    if (!st || !buf) s = CREW_OOM();
    if (!s) XXH3_64bits_reset(st);
    int64_t total = 0;
    while (!s) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", path, strerror(errno));
        if (n <= 0) break;
        XXH3_64bits_update(st, buf, (size_t)n);
        total += (int64_t)n;
    }
    if (!s && total != size)
        s = crew_errorf(CREW_CODE_IO, "%s: changed size while being read (%lld bytes when opened, %lld read)", path,
                        (long long)size, (long long)total);
    if (!s) {
        *bytes = total;
        *xxh3 = XXH3_64bits_digest(st);
    }
    free(buf);
    if (st) XXH3_freeState(st);
    close(fd);
    return s;
}
