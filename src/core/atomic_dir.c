/* atomic_dir.c — a directory written under a temporary name, made durable, then renamed into
 * place. rename(2) of a directory is atomic; fsync of the files, the directory and its parent
 * makes sure what the new name points to survives a crash. Linux's renameat2(RENAME_NOREPLACE)
 * closes the race with another writer creating OUT meanwhile; where the filesystem lacks it, a
 * check just before rename() stands in. */
#define _GNU_SOURCE /* renameat2 */
#include "core/atomic_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

static crew_status exists_error(const char *path)
{
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s already exists; remove it first or choose another output directory",
                       path);
}

/* mkdir -p of every directory above path (not path itself). */
static crew_status make_parents(const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        struct stat st;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return crew_errorf(CREW_CODE_IO, "%s: mkdir: %s", buf, strerror(errno));
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
            return crew_errorf(CREW_CODE_IO, "%s: not a directory", buf);
        *p = '/';
    }
    return CREW_OK;
}

crew_status crew_atomic_dir_begin(const char *out_dir, crew_atomic_dir *ad)
{
    if (!out_dir || !ad) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_atomic_dir_begin: NULL argument");
    memset(ad, 0, sizeof *ad);
    size_t n = strlen(out_dir);
    while (n > 1 && out_dir[n - 1] == '/') n--;
    if (n == 0 || (n == 1 && out_dir[0] == '/'))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "'%s' is not a usable output directory", out_dir);
    if (n >= sizeof ad->final) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", out_dir);
    memcpy(ad->final, out_dir, n);
    ad->final[n] = '\0';
    struct stat st;
    if (lstat(ad->final, &st) == 0) return exists_error(ad->final);
    CREW_TRY(make_parents(ad->final));
    char tmp[sizeof ad->tmp];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", ad->final, (long)getpid());
    if (mkdir(tmp, 0755) != 0) {
        if (errno == EEXIST)
            return crew_errorf(CREW_CODE_IO, "%s already exists (another prep writing there, or left by a crash? remove it)",
                               tmp);
        return crew_errorf(CREW_CODE_IO, "%s: mkdir: %s", tmp, strerror(errno));
    }
    memcpy(ad->tmp, tmp, sizeof tmp);
    return CREW_OK;
}

crew_status crew_atomic_dir_file(const crew_atomic_dir *ad, const char *name, char *buf, size_t len)
{
    if (!ad || !ad->tmp[0] || !name || !buf)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_atomic_dir_file: no directory being written");
    if ((size_t)snprintf(buf, len, "%s/%s", ad->tmp, name) >= len)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s/%s: path too long", ad->tmp, name);
    return CREW_OK;
}

static crew_status fsync_path(const char *path, int flags)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0) return crew_errorf(CREW_CODE_IO, "%s: open: %s", path, strerror(errno));
    crew_status s = CREW_OK;
    if (fsync(fd) != 0 && errno != EINVAL) /* EINVAL: a filesystem without fsync (tmpfs is fine) */
        s = crew_errorf(CREW_CODE_IO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    return s;
}

/* fsync each regular file in dir, then dir itself. */
static crew_status sync_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return crew_errorf(CREW_CODE_IO, "%s: %s", dir, strerror(errno));
    crew_status s = CREW_OK;
    struct dirent *e;
    char path[1024];
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        s = fsync_path(path, 0);
    }
    closedir(d);
    return s ? s : fsync_path(dir, O_DIRECTORY);
}

static void parent_of(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, len, ".");
    else if (slash == path) snprintf(buf, len, "/");
    else snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

static crew_status rename_noreplace(const char *from, const char *to)
{
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return CREW_OK;
    if (errno == EEXIST) return exists_error(to);
    if (errno != EINVAL && errno != ENOSYS) return crew_errorf(CREW_CODE_IO, "rename %s to %s: %s", from, to, strerror(errno));
    struct stat st;
    if (lstat(to, &st) == 0) return exists_error(to);
    if (rename(from, to) != 0) return crew_errorf(CREW_CODE_IO, "rename %s to %s: %s", from, to, strerror(errno));
    return CREW_OK;
}

crew_status crew_atomic_dir_commit(crew_atomic_dir *ad)
{
    if (!ad || !ad->tmp[0]) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_atomic_dir_commit: nothing to commit");
    crew_status s = sync_tree(ad->tmp);
    if (!s) s = rename_noreplace(ad->tmp, ad->final);
    if (s) {
        crew_atomic_dir_abort(ad);
        return s;
    }
    ad->tmp[0] = '\0';
    char parent[512];
    parent_of(ad->final, parent, sizeof parent);
    return fsync_path(parent, O_DIRECTORY);
}

/* The files directly in dir, never through a link: a dir that is a symbolic link is not opened
 * (O_NOFOLLOW), and unlinkat removes a link inside it, not what it points to. */
void crew_remove_dir_files(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(fd, e->d_name, 0);
    closedir(d); /* closes fd */
}

void crew_atomic_dir_abort(crew_atomic_dir *ad)
{
    if (!ad || !ad->tmp[0]) return;
    crew_remove_dir_files(ad->tmp);
    rmdir(ad->tmp); /* a symbolic link is no directory: rmdir leaves it (ENOTDIR) */
    ad->tmp[0] = '\0';
}
