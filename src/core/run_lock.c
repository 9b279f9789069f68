/* run_lock.c — one run at a time in a run directory: RUN_DIR/lock, a POSIX record lock (fcntl
 * F_SETLK on the whole file) held for as long as the holder runs. The kernel drops it when the
 * holder's process ends, however it ends, so a lock never outlives its holder; the file itself
 * stays (removing it would let a process that opened the old one and one that creates a new one
 * both "hold" it). While held it says who holds it; its holder empties it on release. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/links.h"
#include "core/status.h"

struct crew_run_lock {
    int fd;            /* -1: not locked (the filesystem keeps no locks) */
    char note[600];
};

static struct flock whole_file(short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    return fl; /* l_start 0, l_len 0: the whole file, however long */
}

/* The holder's line, as it wrote it ("crew train, process 4242 on host node7, since ..."), or
 * what F_GETLK says of it when it has not written it yet. */
static void holder_text(int fd, char *buf, size_t len)
{
    char text[512];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? (size_t)n : 0] = '\0';
    text[strcspn(text, "\n")] = '\0';
    if (text[0]) {
        snprintf(buf, len, "%s", text);
        return;
    }
    struct flock fl = whole_file(F_WRLCK);
    if (fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK && fl.l_pid > 0)
        snprintf(buf, len, "process %ld (its host unknown: it had not written its name yet)", (long)fl.l_pid);
    else
        snprintf(buf, len, "another process (it had not written its name yet)");
}

/* Filesystems that keep no locks say so with one of these. */
static int no_locks_here(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL; }

crew_status crew_run_lock_take(const char *dir, const char *what, crew_run_lock **out)
{
    if (!dir || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_run_lock_take: NULL argument");
    *out = NULL;
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/lock", dir) >= sizeof path)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", dir);
    static const char why[] = "crew keeps a run directory's lock in a file of its own, never through a link "
                              "(remove the link)";
    CREW_TRY(crew_refuse_link(path, why));
    crew_run_lock *l = calloc(1, sizeof *l);
    if (!l) return CREW_OOM();
    l->fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (l->fd < 0) {
        int err = errno;
        free(l);
        if (err == ELOOP) return crew_refuse_link(path, why);
        return crew_errorf(CREW_CODE_IO, "cannot lock run directory %s: %s: %s", dir, path, strerror(err));
    }
    struct flock fl = whole_file(F_WRLCK);
    if (fcntl(l->fd, F_SETLK, &fl) != 0) {
        int err = errno;
        if (no_locks_here(err)) { /* run unlocked, and say so */
            close(l->fd);
            l->fd = -1;
            snprintf(l->note, sizeof l->note, "run directory %s is not locked: its filesystem keeps no locks (%s), so "
                     "nothing stops a second run there from mixing its files with this one's", dir, strerror(err));
            *out = l;
            return CREW_OK;
        }
        char holder[600];
        if (err == EAGAIN || err == EACCES) holder_text(l->fd, holder, sizeof holder);
        close(l->fd);
        free(l);
        if (err != EAGAIN && err != EACCES)
            return crew_errorf(CREW_CODE_IO, "cannot lock run directory %s: %s", dir, strerror(err));
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "run directory %s is in use by %s: one run at a time in a run "
                           "directory (wait for it to end or stop it, or choose another --run-dir)", dir, holder);
    }
    char host[256] = "", when[64] = "";
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", &tm);
    char line[600];
    int n = snprintf(line, sizeof line, "%s, process %ld on host %s, since %s\n", what && *what ? what : "crew",
                     (long)getpid(), host, when);
    /* What the holder says of itself is a courtesy to the next one: a failure to write it does not
     * undo the lock. */
    if (ftruncate(l->fd, 0) == 0 && n > 0 && pwrite(l->fd, line, (size_t)n, 0) == n) (void)fdatasync(l->fd);
    *out = l;
    return CREW_OK;
}

const char *crew_run_lock_note(const crew_run_lock *l) { return l ? l->note : ""; }

void crew_run_lock_release(crew_run_lock *l)
{
    if (!l) return;
    if (l->fd >= 0) {
        int rc = ftruncate(l->fd, 0); /* a failure is harmless: the next holder rewrites it */
        (void)rc;
        close(l->fd); /* drops the lock */
    }
    free(l);
}
