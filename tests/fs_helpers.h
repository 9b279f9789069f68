/* fs_helpers.h — small file-system checks shared by the tests of writers. */
#ifndef CREW_TESTS_FS_HELPERS_H
#define CREW_TESTS_FS_HELPERS_H

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

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

#endif
