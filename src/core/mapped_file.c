/* mapped_file.c — open, check it is a regular file, mmap, close. */
#include "core/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

crew_status crew_map_file(const char *path, void **map, size_t *len)
{
    *map = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return crew_errorf(CREW_CODE_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    crew_status s = CREW_OK;
    if (fstat(fd, &st) != 0)
        s = crew_errorf(CREW_CODE_IO, "%s: stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a regular file", path);
    if (!s && st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            s = crew_errorf(CREW_CODE_IO, "%s: mmap: %s", path, strerror(errno));
        else {
            *map = m;
            *len = (size_t)st.st_size;
        }
    }
    close(fd);
    return s;
}

void crew_unmap_file(void *map, size_t len)
{
    if (map) munmap(map, len);
}
