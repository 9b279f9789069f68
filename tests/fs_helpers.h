/* fs_helpers.h — small file-system helpers shared by the tests of readers and writers. */
#ifndef CREW_TESTS_FS_HELPERS_H
#define CREW_TESTS_FS_HELPERS_H

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

static inline int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* How many "*.tmp-*" entries dir holds: failed or finished atomic writes must leave none. */
static inline int temp_dirs_in(const char *dir)
{
    DIR *d = opendir(dir);
    int found = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp-")) found++;
    if (d) closedir(d);
    return found;
}

/* Writes len bytes to path; a failure is a failed check. */
static inline void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
}

/* The whole file in a malloc'd buffer (at least 1 byte), its size in *len; NULL when it cannot be
 * opened. A short read gives the bytes read. */
static inline uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    *len = b ? fread(b, 1, n > 0 ? (size_t)n : 0, f) : 0;
    fclose(f);
    return b;
}

/* A crew_progress_fn that records its calls: done never decreases or passes total (bad counts
 * the calls that broke that), and the last call's figures. */
typedef struct progress_log {
    int64_t calls, last_done, last_total, bad;
} progress_log;

static inline void on_progress(void *user, int64_t done, int64_t total, const char *what)
{
    progress_log *p = user;
    if (done < p->last_done || done > total || !what) p->bad++;
    p->calls++;
    p->last_done = done;
    p->last_total = total;
}

#endif
