/* test_fit_stuck.c — a replica that stops for good does not hold the run: whichever rank is
 * stuck (rank 1, or rank 0, whose thread also runs the caller's callbacks), the run ends with a
 * timeout error that names it, within the collective deadline and a short grace (generous bounds
 * here: the point is that it ends at all, where it used to wait forever), with metrics.jsonl
 * closed by a summary and holding a hang event, and the newest checkpoint intact.
 *
 * The stuck rank's thread never returns (the freeze_rank fault sleeps forever), so each case runs
 * in a child process of its own, which reports through its exit status. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "fault_hooks.h"
#include "core/timer.h"
#include "synthetic.h"
#include "train/checkpoint.h"
#include "train/hooks.h"

#define DEADLINE_S 1.5
/* The deadline, the launcher's grace (at most the deadline) and set-up: a few seconds; ten
 * times that still fails a run that waits forever, and a loaded machine cannot reach it. */
#define ENDS_WITHIN_S 60.0

static crew_model *small_model(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 16, .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    return m;
}

/* The last line of a file, into buf. */
static void last_line(const char *path, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) snprintf(buf, len, "%s", line);
    fclose(f);
}

static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* In the child: trains 2 ranks with `stuck` frozen at step 3 and checks the outcome. */
static void stuck_run(const crew_dataset *d, int stuck, const char *dir)
{
    char checkpoints[512];
    snprintf(checkpoints, sizeof checkpoints, "%s/checkpoints", dir);
    crew_model *m = small_model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = 2;
    o.batch_per_device = 8;
    o.max_steps = 20;
    o.epochs = 100;
    o.collective_timeout_s = DEADLINE_S;
    o.run_dir = dir;
    o.checkpoint_dir = checkpoints;
    o.checkpoint_every = 1;
    crew_fit *f = NULL;
    crew_fit_result r;
    CHECK_OK(crew_fit_prepare(m, d, &o, &f));
    if (!f) return;
    crew_fit_faults faults = crew_no_faults();
    faults.freeze_rank = stuck;
    faults.freeze_step = 3;
    fault_hooks_set(f, &faults);
    double start = crew_now();
    crew_status s = crew_fit_run(f, &r);
    double took = crew_now() - start;
    char want[64];
    snprintf(want, sizeof want, "rank %d never returned", stuck);
    CHECK_MSG(crew_status_code(s) == CREW_CODE_TIMEOUT, "rank %d stuck: code %d: %s", stuck, crew_status_code(s),
              crew_status_message(s));
    CHECK_MSG(s && strstr(crew_status_message(s), want) && strstr(crew_status_message(s), "did not arrive within"),
              "rank %d stuck: %s", stuck, crew_status_message(s));
    CHECK_MSG(took < ENDS_WITHIN_S, "rank %d stuck: the run took %.1f s to end", stuck, took);
    crew_status_free(s);
    char metrics[600], line[4096];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    last_line(metrics, line, sizeof line);
    CHECK_MSG(strstr(line, "\"type\":\"summary\"") != NULL, "rank %d stuck: metrics.jsonl ends with %s", stuck, line);
    CHECK_MSG(file_has(metrics, "\"kind\":\"hang\""), "rank %d stuck: no hang event in metrics.jsonl", stuck);
    crew_checkpoint_state st;
    CHECK_OK(crew_checkpoint_newest_state(checkpoints, &st));
    CHECK_MSG(st.step == 2, "rank %d stuck: the newest checkpoint is at step %lld, expected 2", stuck, (long long)st.step);
    /* The fit and the model stay: the stuck thread may still hold pointers into them. */
}

/* The case in a child, with an alarm as a safety net should the run never end. */
static void check_stuck(const crew_dataset *d, int stuck)
{
    char dir[] = "/tmp/crew-test-stuck-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(0, "mkdtemp failed");
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm((unsigned)(2 * ENDS_WITHIN_S));
        stuck_run(d, stuck, dir);
        int failed = check_report();
        fflush(NULL);
        _exit(failed); /* at once: the frozen thread never ends, and nothing should wait for it */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d stuck: the child %s %d", stuck,
              WIFSIGNALED(status) ? "died by signal" : "exited with", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-stuck-data-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, 256, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        check_stuck(d, 1);
        check_stuck(d, 0);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
