/* stop.c — see stop.h. */
#include "stop.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define FOLLOWER_EXTRA_S 2.0

/* Written by the handlers and read by the library's ranks and this module's thread, all through
 * atomic builtins (lock-free on every target: safe in a handler, no data race between threads). */
static int cancel_flag, first_signal;
static int wake[2] = {-1, -1};      /* the handler's byte to the thread */
static char at_once[8400];          /* said by the handler of a second SIGINT (precomputed: no formatting there) */
static size_t at_once_len;
static cli_stop cfg;
static char checkpoints[1200], resume[8192];

volatile int *cli_stop_flag(void) { return &cancel_flag; }

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w, n -= (size_t)w;
    }
}

static void on_signal(int sig)
{
    int saved = errno; /* the interrupted code's */
    int none = 0;
    if (__atomic_compare_exchange_n(&first_signal, &none, sig, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&cancel_flag, 1, __ATOMIC_RELAXED);
        char b = (char)sig;
        if (wake[1] >= 0) write_all(wake[1], &b, 1);
    } else if (sig == SIGINT) { /* Ctrl-C again: at once */
        write_all(2, at_once, at_once_len);
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
    }
    /* a later SIGTERM: the stop is under way already */
    errno = saved;
}

void cli_stop_newest_checkpoint(const char *dir, char *buf, size_t len)
{
    buf[0] = '\0';
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return;
    long long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        char tail, path[1500];
        struct stat sb;
        if (sscanf(e->d_name, "step-%lld%c", &step, &tail) != 1 || strlen(e->d_name) != 13 || step <= best) continue;
        snprintf(path, sizeof path, "%s/%s/COMPLETE", dir, e->d_name);
        if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) best = step;
    }
    closedir(d);
    if (best >= 0) snprintf(buf, len, "%s/step-%08lld", dir, best);
}

/* A progress bar may be drawing on the terminal: a line of ours starts on a line of its own. */
static const char *on_terminal(void) { return isatty(STDOUT_FILENO) && isatty(STDERR_FILENO) ? "\n" : ""; }

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

/* The seconds Open MPI's mpirun leaves a process between its SIGTERM and its SIGKILL (it also
 * waits that long before the SIGTERM), or 0 when not under Open MPI. Set with --mca
 * odls_base_sigkill_timeout, it reaches the processes as OMPI_MCA_...; set in a parameter file it
 * does not, and this says its default. */
static double open_mpi_kill_after(void)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE")) return 0;
    const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    double t = v ? atof(v) : 1.0;
    return t > 0 ? t : 1.0;
}

/* The first signal: rank 0 says what happens now, and where the run stands until it has. */
static void say_stop(int sig)
{
    if (!cfg.lead) return;
    char newest[1400];
    cli_stop_newest_checkpoint(cfg.checkpoints, newest, sizeof newest);
    fflush(stdout);
    fprintf(stderr, "%screw train: %s: stopping after this step with a checkpoint, within --stop-grace %g s (SIGINT "
            "again stops at once, without one); the newest checkpoint until then: %s\n", on_terminal(), signal_name(sig), cfg.grace_s,
            newest[0] ? newest : "none yet");
    double t = open_mpi_kill_after();
    if (t > 0 && t < cfg.grace_s)
        fprintf(stderr, "crew train: note: Open MPI's mpirun kills its processes %g s after its own SIGTERM "
                "(odls_base_sigkill_timeout): a stop that needs longer is lost; mpirun --mca odls_base_sigkill_timeout "
                "%g gives it --stop-grace (docs/CHECKPOINTS.md)\n", t, cfg.grace_s);
}

/* Under mpirun, the processes of this host that are gone: a signal while one is gone is the end of
 * the job (mpirun stopping the others), and the step cannot finish. The lowest-numbered process
 * still here says it, rank 0 with the newest checkpoint. 1 when one is gone. */
static int say_lost(void)
{
    const char *here = NULL, *host;
    long pid;
    if (!cli_mpi_peer(cfg.rank, &pid, &here)) return 0;
    char lost[600] = "";
    size_t used = 0;
    int n_lost = 0, n_listed = 0, lowest_alive = -1;
    for (int r = 0; cli_mpi_peer(r, &pid, &host); r++) {
        if (strcmp(host, here) != 0) continue;
        int gone = r != cfg.rank && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if (!gone && lowest_alive < 0) lowest_alive = r;
        if (!gone) continue;
        n_lost++;
        if (used + 160 < sizeof lost) { /* a long list is summarised, never cut */
            used += (size_t)snprintf(lost + used, sizeof lost - used, "%sMPI rank %d (process %ld on host %s)",
                                     n_listed ? ", " : "", r, pid, host);
            n_listed++;
        }
    }
    if (!n_lost) return 0;
    if (n_listed < n_lost) snprintf(lost + used, sizeof lost - used, " and %d more", n_lost - n_listed);
    if (lowest_alive != cfg.rank) return 1;
    const char *verb = n_lost == 1 ? "has" : "have";
    if (cfg.lead) {
        char newest[1400];
        cli_stop_newest_checkpoint(cfg.checkpoints, newest, sizeof newest);
        fprintf(stderr, "crew train: %s %s ended, so this run cannot finish its step: the newest checkpoint is %s; "
                "resume with: %s\n", lost, verb, newest[0] ? newest : "none (nothing to resume)", cfg.resume);
    } else {
        fprintf(stderr, "crew train (MPI rank %d): %s %s ended, so this run cannot finish its step: resume it from the "
                "newest checkpoint in rank 0's run directory (crew train ... --resume RUN_DIR)\n", cfg.rank, lost, verb);
    }
    return 1;
}

static void give_up(void)
{
    if (cfg.lead) {
        char newest[1400];
        cli_stop_newest_checkpoint(cfg.checkpoints, newest, sizeof newest);
        fprintf(stderr, "crew train: the stop did not end within --stop-grace %g s: exiting without a checkpoint of its "
                "step; the newest checkpoint is %s; resume with: %s\n", cfg.grace_s,
                newest[0] ? newest : "none (nothing to resume)", cfg.resume);
    } else {
        fprintf(stderr, "crew train (MPI rank %d): the stop did not end within --stop-grace %g s: exiting\n", cfg.rank,
                cfg.grace_s);
    }
}

static void *watch(void *arg)
{
    (void)arg;
    char b = 0;
    for (;;) {
        ssize_t n = read(wake[0], &b, 1);
        if (n == 1) break;
        if (n < 0 && errno == EINTR) continue;
        return NULL; /* the pipe is gone: nothing more to watch */
    }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (!say_lost()) say_stop((unsigned char)b);
    /* The other processes give up a little later than rank 0: a process that exits ends the job
     * (mpirun kills the rest), and rank 0's line, which says where to resume, comes first. */
    const double grace = cfg.grace_s + (cfg.lead ? 0.0 : FOLLOWER_EXTRA_S);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = grace - ((double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec));
        if (left <= 0) break;
        struct timespec nap = {(time_t)(left > 1 ? 1 : 0), (long)((left > 1 ? 0 : left) * 1e9)};
        nanosleep(&nap, NULL);
    }
    give_up();
    _exit(1);
}

int cli_stop_arm(const cli_stop *c)
{
    cfg = *c;
    snprintf(checkpoints, sizeof checkpoints, "%s", c->checkpoints ? c->checkpoints : "");
    snprintf(resume, sizeof resume, "%s", c->resume ? c->resume : "");
    cfg.checkpoints = checkpoints[0] ? checkpoints : NULL;
    cfg.resume = resume;
    at_once_len = 0;
    if (c->lead) {
        int n = snprintf(at_once, sizeof at_once, "%screw train: SIGINT again: stopped at once, without a checkpoint of "
                         "this step; resume from the newest one with: %s\n", on_terminal(), resume);
        at_once_len = n > 0 && (size_t)n < sizeof at_once ? (size_t)n : 0;
    }
    int ok = pipe(wake) == 0;
    if (ok) fcntl(wake[0], F_SETFD, FD_CLOEXEC), fcntl(wake[1], F_SETFD, FD_CLOEXEC);
    pthread_t t;
    if (ok && pthread_create(&t, NULL, watch, NULL) != 0) ok = 0;
    if (ok) pthread_detach(t);
    else if (wake[0] >= 0) {
        close(wake[0]);
        close(wake[1]);
        wake[0] = wake[1] = -1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return ok ? 0 : -1;
}
