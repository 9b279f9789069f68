/* test_run_lock.c — one run at a time in a run directory (crew_run_lock_take, docs/CHECKPOINTS.md
 * "One run at a time"). The holder is a child process that takes the lock and waits on a pipe, so
 * every case meets a lock that is certainly held, with no timing involved:
 * - a lock held by another process is refused, naming that process and its host;
 * - two `crew train` started at the same instant on an empty --run-dir both pass its first check
 *   (the directory holds no run yet): the later one meets the lock once its plan holds, and is
 *   refused (exit 2) naming the holder, having written nothing there;
 * - a holder that dies holding the lock (no release) leaves nothing in the next one's way, and the
 *   lock file then names the new holder; a release empties it;
 * - a lock file that is a symbolic link is refused. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "synthetic.h"

typedef struct holder {
    pid_t pid;
    int go;     /* a byte here ends it: 'x' exits holding the lock (as if killed), 'r' releases first */
} holder;

/* A child process that takes dir's lock; returns once it holds it (pid -1 when it could not). */
static holder hold_lock(const char *dir)
{
    holder h = {-1, -1};
    int ready[2], go[2];
    if (pipe(ready) != 0) return h;
    if (pipe(go) != 0) {
        close(ready[0]);
        close(ready[1]);
        return h;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        crew_run_lock *l = NULL;
        crew_status s = crew_run_lock_take(dir, "test_run_lock", &l);
        char ok = s ? 'f' : 'y';
        if (write(ready[1], &ok, 1) != 1) _exit(3);
        char how = 'x';
        if (read(go[0], &how, 1) != 1) how = 'x';
        if (how == 'r') crew_run_lock_release(l);
        _exit(s ? 1 : 0);
    }
    close(ready[1]);
    close(go[0]);
    char ok = 0;
    int got = pid > 0 && read(ready[0], &ok, 1) == 1 && ok == 'y';
    close(ready[0]);
    h.pid = pid;
    h.go = go[1];
    if (!got && pid > 0) {
        close(go[1]);
        waitpid(pid, NULL, 0);
        h.pid = -1;
        h.go = -1;
    }
    return h;
}

static void end_holder(holder *h, char how)
{
    if (h->pid <= 0) return;
    if (write(h->go, &how, 1) != 1) kill(h->pid, SIGKILL);
    close(h->go);
    waitpid(h->pid, NULL, 0);
    h->pid = -1;
}

static void read_text(const char *path, char *buf, size_t len)
{
    size_t n = 0;
    uint8_t *b = read_file(path, &n);
    snprintf(buf, len, "%.*s", b ? (int)n : 0, b ? (const char *)b : "");
    free(b);
}

/* The same directory locked by another process is refused, naming it; once it ends (holding the
 * lock, as a killed process does), the lock is free, and the file names its new holder. */
static void check_holder_named(const char *dir)
{
    char host[256] = "", want[400], lock_path[700], text[600];
    gethostname(host, sizeof host);
    snprintf(lock_path, sizeof lock_path, "%s/lock", dir);
    holder h = hold_lock(dir);
    CHECK_MSG(h.pid > 0, "the child could not take the lock");
    if (h.pid <= 0) return;
    snprintf(want, sizeof want, "is in use by test_run_lock, process %ld on host %s, since ", (long)h.pid, host);
    crew_run_lock *l = NULL;
    crew_status s = crew_run_lock_take(dir, "test_run_lock (parent)", &l);
    CHECK_MSG(s && crew_status_code(s) == CREW_CODE_INVALID_ARGUMENT && strstr(crew_status_message(s), want),
              "a held lock: %s (wanted '%s')", crew_status_message(s), want);
    crew_status_free(s);
    crew_run_lock_release(l);
    end_holder(&h, 'x'); /* dies holding it */
    read_text(lock_path, text, sizeof text);
    CHECK_MSG(strstr(text, "test_run_lock, process"), "a dead holder's lock file: '%s'", text);
    l = NULL;
    CHECK_OK(crew_run_lock_take(dir, "test_run_lock (parent)", &l));
    CHECK(l && !crew_run_lock_note(l)[0]);
    snprintf(want, sizeof want, "test_run_lock (parent), process %ld on host %s", (long)getpid(), host);
    read_text(lock_path, text, sizeof text);
    CHECK_MSG(strstr(text, want), "the lock file of its new holder: '%s'", text);
    crew_run_lock_release(l);
    read_text(lock_path, text, sizeof text);
    CHECK_MSG(!text[0], "a released lock file still says '%s'", text);
    /* released properly, the next take works too */
    h = hold_lock(dir);
    end_holder(&h, 'r');
    l = NULL;
    CHECK_OK(crew_run_lock_take(dir, "test_run_lock (parent)", &l));
    crew_run_lock_release(l);
}

/* Two crew train at the same instant on an empty directory: the later one passed the first check
 * like the earlier; it is refused at the lock, naming the holder, and writes nothing there. */
static void check_same_instant(const char *crew, const char *root, const char *data)
{
    char dir[600], model[600], err[600], cmd[3000], host[256] = "", want[1000], text[4000];
    gethostname(host, sizeof host);
    snprintf(dir, sizeof dir, "%s/run", root);
    snprintf(model, sizeof model, "%s/mlp.json", root);
    snprintf(err, sizeof err, "%s/train.err", root);
    CHECK(mkdir(dir, 0755) == 0);
    const char *json = "{\"input_shape\": [12, 12, 1], \"layers\": [{\"type\": \"flatten\"}, {\"type\": \"dense\", "
                       "\"units\": 4}]}";
    write_file(model, json, strlen(json));
    holder h = hold_lock(dir);
    CHECK_MSG(h.pid > 0, "the child could not take the lock");
    if (h.pid <= 0) return;
    snprintf(cmd, sizeof cmd, "'%s' train '%s' --data '%s' --devices cpu:1 --max-steps 2 --quiet --run-dir '%s' 2> '%s'",
             crew, model, data, dir, err);
    snprintf(want, sizeof want, "crew train: run directory %s is in use by test_run_lock, process %ld on host %s", dir,
             (long)h.pid, host);
    int status = system(cmd);
    end_holder(&h, 'r');
    read_text(err, text, sizeof text);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 2, "the second run: status %d: %s", status, text);
    CHECK_MSG(strstr(text, want) && !strchr(strchr(text, '\n') ? strchr(text, '\n') + 1 : "", '\n'),
              "the second run's stderr: '%s' (wanted one line with '%s')", text, want);
    static const char *const outputs[] = {"config.json", "metrics.jsonl", "tb", "checkpoints", "weights.safetensors"};
    for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, outputs[i]);
        CHECK_MSG(!path_exists(p), "the refused run wrote %s", p);
    }
    /* the holder gone, the same command runs */
    snprintf(cmd, sizeof cmd, "'%s' train '%s' --data '%s' --devices cpu:1 --max-steps 2 --quiet --run-dir '%s' 2> '%s'",
             crew, model, data, dir, err);
    status = system(cmd);
    read_text(err, text, sizeof text);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the run after the holder ended: status %d: %s", status, text);
}

static void check_link_refused(const char *root)
{
    char dir[600], lock_path[700], target[700];
    snprintf(dir, sizeof dir, "%s/linked", root);
    snprintf(lock_path, sizeof lock_path, "%s/lock", dir);
    snprintf(target, sizeof target, "%s/elsewhere", root);
    CHECK(mkdir(dir, 0755) == 0);
    write_file(target, "x", 1);
    CHECK(symlink(target, lock_path) == 0);
    crew_run_lock *l = NULL;
    crew_status s = crew_run_lock_take(dir, "test_run_lock", &l);
    CHECK_MSG(s && strstr(crew_status_message(s), "lock is a symbolic link"), "a linked lock file: %s",
              crew_status_message(s));
    crew_status_free(s);
    char text[16];
    read_text(target, text, sizeof text);
    CHECK(!strcmp(text, "x"));
}

int main(void)
{
    char root[] = "/tmp/crew-test-run-lock-XXXXXX", data[400], plain[600];
    if (syn_make_dataset(root, 64, data, sizeof data) != 0) {
        CHECK_MSG(0, "could not make the dataset");
        return check_report();
    }
    snprintf(plain, sizeof plain, "%s/plain", root);
    CHECK(mkdir(plain, 0755) == 0);
    check_holder_named(plain);
    const char *crew = getenv("CREW_BIN");
    if (crew) check_same_instant(crew, root, data);
    else fprintf(stderr, "CREW_BIN unset: the crew train case is left out\n");
    check_link_refused(root);
    syn_remove(root);
    return check_report();
}
