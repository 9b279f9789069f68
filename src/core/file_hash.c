/* file_hash.c — size and XXH3-64 of a file, read in 1 MiB blocks. */
#include "core/file_hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/status.h"

crew_status crew_file_hash(const char *path, int64_t *bytes, uint64_t *xxh3)
{
    FILE *f = fopen(path, "rb");
    if (!f) return crew_errorf(CREW_CODE_IO, "%s: cannot open: %s", path, strerror(errno));
    XXH3_state_t *st = XXH3_createState();
    unsigned char *buf = malloc(1 << 20);
    crew_status s = CREW_OK;
    if (!st || !buf) s = CREW_OOM();
    if (!s) XXH3_64bits_reset(st);
    int64_t total = 0;
    size_t n;
    while (!s && (n = fread(buf, 1, 1 << 20, f)) > 0) {
        XXH3_64bits_update(st, buf, n);
        total += (int64_t)n;
    }
    if (!s && ferror(f)) s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", path, strerror(errno));
    if (!s) {
        *bytes = total;
        *xxh3 = XXH3_64bits_digest(st);
    }
    free(buf);
    if (st) XXH3_freeState(st);
    fclose(f);
    return s;
}
