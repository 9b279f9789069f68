/* mapped_file.c — opening only regular files, without blocking; reading them whole; mapping them. */
#include "core/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

#define READ_CHUNK ((size_t)1 << 30) /* Linux reads at most about 2 GiB per call anyway */

const char *crew_file_kind(mode_t mode)
{
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "an unknown kind of file";
}

static crew_status not_regular(const char *path, mode_t mode)
{
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a regular file (%s)", path, crew_file_kind(mode));
}

crew_status crew_open_regular(const char *path, int *fd, int64_t *size)
{
    *fd = -1;
    *size = 0;
    if (!path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_open_regular: NULL path");
    /* First by name: a device or socket is refused without being opened at all. */
    struct stat st;
    if (stat(path, &st) != 0) return crew_errorf(CREW_CODE_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
    /* O_NONBLOCK: should a FIFO have replaced the file since the stat, the open returns at once
     * (and the fstat below refuses it) instead of waiting for a writer. O_NOCTTY likewise for a
     * terminal. */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return crew_errorf(CREW_CODE_IO, "%s: cannot open: %s", path, strerror(errno));
    crew_status s = CREW_OK;
    if (fstat(f, &st) != 0) s = crew_errorf(CREW_CODE_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = not_regular(path, st.st_mode);
    else {
        int fl = fcntl(f, F_GETFL);
        if (fl == -1 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) == -1)
            s = crew_errorf(CREW_CODE_IO, "%s: fcntl: %s", path, strerror(errno));
    }
    if (s) {
        close(f);
        return s;
    }
    *fd = f;
    *size = (int64_t)st.st_size;
    return CREW_OK;
}

/* read() until n bytes or the end of the file; *got the bytes read. */
static int read_fully(int fd, uint8_t *dst, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        size_t want = n - *got < READ_CHUNK ? n - *got : READ_CHUNK;
        ssize_t r = read(fd, dst + *got, want);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        *got += (size_t)r;
    }
    return 0;
}

crew_status crew_read_file(const char *path, int64_t max_bytes, const char *limit_what, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd;
    int64_t size;
    CREW_TRY(crew_open_regular(path, &fd, &size));
    crew_status s = CREW_OK;
    if (size > max_bytes || (uint64_t)size >= (uint64_t)SIZE_MAX)
        s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: %lld bytes is more than the %lld %s may have", path, (long long)size,
                        (long long)max_bytes, limit_what ? limit_what : "this reader allows");
    size_t n = s ? 0 : (size_t)size, got = 0;
    uint8_t *b = s ? NULL : malloc(n + 1);
    if (!s && !b) s = crew_errorf(CREW_CODE_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, n);
    if (!s && read_fully(fd, b, n, &got) != 0) s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", path, strerror(errno));
    if (!s) {
        /* One byte more must find the end: otherwise the file grew, or its size meant nothing. */
        uint8_t extra;
        size_t more = 0;
        if (got == n && read_fully(fd, &extra, 1, &more) != 0)
            s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", path, strerror(errno));
        else if (got != n || more != 0)
            s = crew_errorf(CREW_CODE_IO, "%s: changed size while being read (%lld bytes when opened)", path,
                            (long long)size);
    }
    close(fd);
    if (s) {
        free(b);
        return s;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return CREW_OK;
}

crew_status crew_map_file(const char *path, void **map, size_t *len)
{
    *map = NULL;
    *len = 0;
    int fd;
    int64_t size;
    CREW_TRY(crew_open_regular(path, &fd, &size));
    crew_status s = CREW_OK;
    if ((uint64_t)size > (uint64_t)SIZE_MAX) s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: too large to map", path);
    void *m = NULL;
    if (!s && size > 0) {
        m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            m = NULL;
            s = crew_errorf(CREW_CODE_IO, "%s: mmap: %s", path, strerror(errno));
        }
    }
    /* Shrunk between the fstat and the mmap, a page of the mapping would be a SIGBUS: look again. */
    struct stat st;
    if (!s && (fstat(fd, &st) != 0 || (int64_t)st.st_size != size))
        s = crew_errorf(CREW_CODE_IO, "%s: changed size while being mapped (%lld bytes when opened)", path,
                        (long long)size);
    close(fd);
    if (s) {
        if (m) munmap(m, (size_t)size);
        return s;
    }
    *map = m;
    *len = (size_t)size;
    return CREW_OK;
}

void crew_unmap_file(void *map, size_t len)
{
    if (map) munmap(map, len);
}
