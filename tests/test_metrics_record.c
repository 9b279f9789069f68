/* test_metrics_record.c — the run record (metrics.jsonl and tb/) as files, through the monitor API
 * (src/telemetry/monitor.h):
 *
 * - a run killed mid-line and resumed from a checkpoint behind what it had logged: the resumed
 *   record parses line by line, says which steps were run again, and the report and the
 *   TensorBoard reader show each step once, with the re-run's figures;
 * - the report reader leaves out a torn last line (a run still writing, or killed), and reads the
 *   files an older crew left (a resumed run's line appended to a torn one, no resume line);
 * - a full disk and a file-size limit are reported with their real reason (ENOSPC, EFBIG) and the
 *   file's name, by metrics.jsonl, the TensorBoard writer and the report alike;
 * - the keys of every line type written, and the TensorBoard tags, are the ones docs/METRICS.md and
 *   docs/TENSORBOARD.md show, so the docs cannot drift from the files. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "telemetry/monitor.h"
#include "telemetry/report.h"
#include "telemetry/tb_reader.h"
#include "telemetry/tb_writer.h"
#include "telemetry/text_file.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

/* A fresh directory tmp_dir/name. */
static const char *fresh_dir(const char *name)
{
    static char path[160];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    nftw(path, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    mkdir(path, 0755);
    return path;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)(n > 0 ? n : 0) + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

static const crew_fit_plan plan2 = {.devices = 2, .batch_per_device = 4, .accumulation = 1, .global_batch = 8,
                                    .steps_per_epoch = 30, .epochs = 2, .total_steps = 60, .base_lr = 0.01f,
                                    .scaled_lr = 0.01f, .warmup_steps = 5, .flops_per_sample = 1e6, .peak_gflops = 100};

static crew_status open_monitor(const char *dir, int append, crew_monitor **m)
{
    crew_monitor_config cfg = {.run_dir = dir, .append = append, .straggler_window = 1000};
    return crew_monitor_open(&cfg, &plan2, m);
}

/* One step of two replicas with a given loss. */
static crew_status step(crew_monitor *m, int64_t s, float loss, int skipped)
{
    crew_step_times t[2] = {{.data_s = 0.001, .forward_s = 0.01, .backward_s = 0.02, .comm_exposed_s = 0.001,
                             .comm_hidden_s = 0.002, .optimizer_s = 0.001},
                            {.data_s = 0.001, .forward_s = 0.011, .backward_s = 0.021, .comm_exposed_s = 0.001,
                             .comm_hidden_s = 0.002, .optimizer_s = 0.001}};
    crew_step_record r = {.step = s, .epoch = (int)((s - 1) / 30), .time = 1764504000.0 + (double)s, .loss = loss,
                          .accuracy = 0.5f, .lr = 0.01f, .global_batch = 8, .step_s = 0.04, .skipped = skipped,
                          .n_replicas = 2, .replicas = t};
    if (s == 3) /* a step that measured the gradient noise scale: |G|² 2, tr(Σ) 32 */
        r.grad_sq_small = 10.0, r.grad_sq_big = 6.0, r.small_batch = 4;
    return crew_monitor_step(m, &r);
}

static crew_status epoch(crew_monitor *m, int e)
{
    crew_epoch_info info = {.epoch = e, .epochs = 2, .steps = 30, .train_loss = 0.5f, .train_accuracy = 0.8f,
                            .test_loss = 0.4f + 0.1f * (float)e, .test_accuracy = 0.85f, .wall_s = 1.2,
                            .samples_per_s = 200};
    return crew_monitor_epoch(m, &info);
}

static float loss_a(int64_t s) { return 1.0f + 0.01f * (float)s; }  /* the killed run's losses */
static float loss_b(int64_t s) { return 10.0f + 0.01f * (float)s; } /* the resumed run's: told apart */

/* The one file in dir whose name holds "tfevents" into buf; 0 when there is exactly one. */
static int only_event_file(const char *dir, char *buf, size_t len)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int found = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, "tfevents")) {
            snprintf(buf, len, "%s/%s", dir, e->d_name);
            found++;
        }
    closedir(d);
    return found == 1 ? 0 : -1;
}

static const cJSON *item(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = item(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -999;
}

/* ---------------------------------------------------------------- a killed run, resumed */

/* Run A logs steps 1-47 (an epoch at 30, an event at 45) and is killed while writing step 48: its
 * record ends in half a line and its event file in half a record. Run B resumes from the
 * checkpoint at step 40, so it runs steps 41-47 again, and goes on to step 60. */
static void write_killed_and_resumed(const char *dir, int64_t *torn_len)
{
    crew_monitor *m = NULL;
    CHECK_OK(open_monitor(dir, 0, &m));
    if (!m) return;
    for (int64_t s = 1; s <= 47; s++) {
        CHECK_OK(step(m, s, loss_a(s), 0));
        if (s == 30) CHECK_OK(epoch(m, 0));
    }
    CHECK_OK(crew_monitor_event(m, CREW_EVENT_LOSS_SPIKE, 45, -1, 7.0, "run A's event at step 45"));
    crew_monitor_close(m);

    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    static const char torn[] = "{\"type\":\"step\",\"step\":48,\"epoch\":1,\"time\":1764504048.000,\"loss\":1.4";
    FILE *f = fopen(path, "ab");
    CHECK(f && fwrite(torn, 1, sizeof torn - 1, f) == sizeof torn - 1);
    if (f) fclose(f);
    *torn_len = (int64_t)sizeof torn - 1;

    /* Its event file: cut inside the last record, and named for an earlier second, as a file
     * written before the restart would be (both runs here are one process in one second). */
    char tb[300], ev[600], old[600];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    CHECK(only_event_file(tb, ev, sizeof ev) == 0);
    struct stat st;
    CHECK(stat(ev, &st) == 0 && st.st_size > 100);
    CHECK(truncate(ev, st.st_size - 7) == 0);
    snprintf(old, sizeof old, "%s/events.out.tfevents.1000000000.killed.1.crew", tb);
    CHECK(rename(ev, old) == 0);

    CHECK_OK(open_monitor(dir, 1, &m));
    if (!m) return;
    for (int64_t s = 41; s <= 60; s++) {
        CHECK_OK(step(m, s, loss_b(s), 0));
        if (s == 50) CHECK_OK(crew_monitor_event(m, CREW_EVENT_INFO, 50, -1, NAN, "run B's event at step 50"));
    }
    CHECK_OK(epoch(m, 1));
    crew_fit_result res = {.steps = 60, .epochs = 2, .test_accuracy = 0.85, .test_loss = 0.5};
    CHECK_OK(crew_monitor_finish(m, &res));
    crew_monitor_close(m);
}

/* Every line is a JSON object ending in a newline; returns the resume lines' count and the last one
 * (caller deletes), and counts run lines. */
static int check_lines(const char *path, cJSON **resume, int *runs)
{
    size_t len = 0;
    char *text = slurp(path, &len);
    CHECK(text && len > 0 && text[len - 1] == '\n');
    int resumes = 0, bad = 0;
    *resume = NULL;
    *runs = 0;
    for (char *line = text, *nl; text && (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o)) {
            if (!bad++) fprintf(stderr, "not a JSON object: %.120s\n", line);
        }
        const cJSON *type = item(o, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "run")) (*runs)++;
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "resume")) {
            resumes++;
            cJSON_Delete(*resume);
            *resume = o;
            o = NULL;
        }
        cJSON_Delete(o);
    }
    CHECK_MSG(bad == 0, "%d lines of %s are not JSON objects", bad, path);
    free(text);
    return resumes;
}

static void test_resume_after_kill(void)
{
    const char *dir = fresh_dir("resumed");
    int64_t torn = 0;
    write_killed_and_resumed(dir, &torn);
    char path[300], msg[200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);

    /* The file: whole lines only, two runs, one resume line saying what was run again. */
    cJSON *resume = NULL;
    int runs = 0;
    CHECK(check_lines(path, &resume, &runs) == 1 && runs == 2);
    CHECK(num(resume, "checkpoint_step") == 40 && num(resume, "logged_through") == 47);
    CHECK(num(resume, "rerun_first") == 41 && num(resume, "rerun_last") == 47 && num(resume, "torn_bytes") == (double)torn);
    const cJSON *m = item(resume, "message");
    snprintf(msg, sizeof msg, "a torn last line of %lld bytes was cut off", (long long)torn);
    CHECK_MSG(cJSON_IsString(m) && strstr(m->valuestring, "checkpoint at step 40") &&
                  strstr(m->valuestring, "steps 41-47") && strstr(m->valuestring, "run again") &&
                  strstr(m->valuestring, msg),
              "resume message: %s", cJSON_IsString(m) ? m->valuestring : "(none)");
    cJSON_Delete(resume);

    /* The report's reading: each step once, with the re-run's loss; run A's event about a re-run
     * step is gone, run B's is there. */
    crew_report_data d;
    CHECK_OK(crew_report_read(path, &d));
    CHECK_MSG(d.step_lines == 60 && d.last_step == 60 && d.bucket_steps == 1 && d.buckets == 60,
              "%lld step lines, last %lld, %d buckets of %lld", (long long)d.step_lines, (long long)d.last_step,
              d.buckets, (long long)d.bucket_steps);
    int once = 1, values = 1;
    for (int i = 0; i < d.buckets; i++) {
        once &= d.bucket[i].steps == 1;
        float want = i + 1 <= 40 ? loss_a(i + 1) : loss_b(i + 1);
        values &= fabs(d.bucket[i].loss_sum - want) < 1e-4;
    }
    CHECK_MSG(once && values, "steps counted once: %d, with the right run's loss: %d", once, values);
    CHECK(d.replaced_lines == 8); /* steps 41-47 and the event at 45 */
    CHECK(d.total_events == 1 && d.n_events == 1 && strstr(d.events[0].message, "run B's"));
    CHECK(d.n_epochs == 2 && d.epochs_seen[0].end_step == 30 && d.epochs_seen[1].end_step == 60);
    CHECK(d.n_resumes == 1 && d.resumes[0].checkpoint_step == 40 && strstr(d.resumes[0].message, "steps 41-47"));
    CHECK(d.has_summary && d.torn_bytes == 0 && d.torn_lines == 0);
    crew_report_data_free(&d);

    CHECK_OK(crew_report_write(dir, NULL));
    snprintf(path, sizeof path, "%s/report.html", dir);
    char *html = slurp(path, NULL);
    CHECK(html && strstr(html, "<b>Resumed:</b> resumed from the checkpoint at step 40: steps 41-47"));
    CHECK(html && strstr(html, "7 lines about steps") == NULL && strstr(html, "8 lines about steps"));
    free(html);

    /* TensorBoard: the killed run's file ends in half a record; the resumed run's starts with a
     * SessionLog START at step 41, so every tag has each step once, from the right run. */
    char tb[300];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    crew_tb_scalar_list l;
    CHECK_OK(crew_tb_read_run(tb, &l));
    CHECK(l.files == 2 && l.restarts == 1 && l.torn_bytes > 0);
    int loss_points = 0, loss_ok = 1, test_points = 0, test_ok = 1;
    int seen[61] = {0};
    for (int64_t i = 0; i < l.count; i++) {
        const crew_tb_point *p = &l.points[i];
        if (!strcmp(p->tag, "train/loss")) {
            loss_points++;
            if (p->step < 1 || p->step > 60 || seen[p->step]++) loss_ok = 0;
            else if (p->value != (p->step <= 40 ? loss_a(p->step) : loss_b(p->step))) loss_ok = 0;
        }
        if (!strcmp(p->tag, "test/loss")) { /* at the steps the epochs ended */
            test_points++;
            test_ok &= p->step == 30 || p->step == 60;
        }
    }
    CHECK_MSG(loss_points == 60 && loss_ok, "train/loss: %d points, each step once with its run's value: %d",
              loss_points, loss_ok);
    CHECK_MSG(test_points == 2 && test_ok, "test/loss: %d points, at steps 30 and 60: %d", test_points, test_ok);
    crew_tb_scalar_list_free(&l);
}

/* A resumed run whose checkpoint is ahead of the record (the killed run's last lines never reached
 * the disk), and one whose last line lacks only its newline. */
static void test_resume_edges(void)
{
    const char *dir = fresh_dir("lost-lines");
    crew_monitor *m = NULL;
    CHECK_OK(open_monitor(dir, 0, &m));
    for (int64_t s = 1; m && s <= 30; s++) CHECK_OK(step(m, s, loss_a(s), 0));
    crew_monitor_close(m);
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "ab"); /* a whole event line, all but its newline */
    CHECK(f && fputs("{\"type\":\"event\",\"step\":30,\"kind\":\"info\",\"message\":\"last words\"}", f) >= 0);
    if (f) fclose(f);
    CHECK_OK(open_monitor(dir, 1, &m));
    for (int64_t s = 41; m && s <= 45; s++) CHECK_OK(step(m, s, loss_b(s), 0));
    crew_monitor_close(m);
    cJSON *resume = NULL;
    int runs = 0;
    CHECK(check_lines(path, &resume, &runs) == 1 && runs == 2);
    const cJSON *msg = item(resume, "message");
    CHECK_MSG(cJSON_IsString(msg) && strstr(msg->valuestring, "steps 31-40 are not in this record") &&
                  strstr(msg->valuestring, "lacked its newline"),
              "%s", cJSON_IsString(msg) ? msg->valuestring : "(none)");
    CHECK(num(resume, "torn_bytes") == 0 && cJSON_IsNull(item(resume, "rerun_first")));
    cJSON_Delete(resume);
    crew_report_data d;
    CHECK_OK(crew_report_read(path, &d));
    CHECK(d.step_lines == 35 && d.replaced_lines == 0 && d.total_events == 1);
    crew_report_data_free(&d);

    /* A resumed run in which no step ran still says it resumed. */
    CHECK_OK(open_monitor(dir, 1, &m));
    crew_fit_result res = {.steps = 0};
    if (m) CHECK_OK(crew_monitor_finish(m, &res));
    crew_monitor_close(m);
    CHECK(check_lines(path, &resume, &runs) == 2 && runs == 3);
    CHECK(cJSON_IsNull(item(resume, "checkpoint_step")));
    cJSON_Delete(resume);
    CHECK_OK(crew_report_read(path, &d));
    CHECK(d.step_lines == 35 && d.has_summary && d.n_resumes == 2);
    crew_report_data_free(&d);
}

/* ---------------------------------------------------------------- the report's reader */

static void write_text(const char *dir, const char *text)
{
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fputs(text, f) >= 0);
    if (f) fclose(f);
}

static void test_report_torn_lines(void)
{
    /* A run still writing (or killed): the last line is half there. */
    const char *dir = fresh_dir("torn-tail");
    write_text(dir, "{\"type\":\"run\",\"devices\":1}\n"
                    "{\"type\":\"step\",\"step\":1,\"loss\":0.9,\"replicas\":[{\"rank\":0,\"forward_s\":0.1}]}\n"
                    "{\"type\":\"step\",\"step\":2,\"loss\":0.8,\"replicas\":[{\"rank\":0,\"forw");
    CHECK_OK(crew_report_write(dir, NULL));
    char path[300];
    snprintf(path, sizeof path, "%s/report.html", dir);
    char *html = slurp(path, NULL);
    CHECK(html && strstr(html, "The last line of metrics.jsonl is incomplete (62 bytes)"));
    free(html);
    /* Only the last line may be torn: the same half line with a newline after it is an error. */
    write_text(dir, "{\"type\":\"step\",\"step\":1}\n{\"type\":\"step\",\"step\":2,\"loss\":0.8,\"repl\n");
    CHECK_ERR(crew_report_write(dir, NULL), "metrics.jsonl line 2: not valid JSON");

    /* What an older crew left: the killed run's half line with the resumed run's run line appended
     * to it, no resume line, and steps 3-4 logged twice. */
    dir = fresh_dir("legacy");
    write_text(dir, "{\"type\":\"run\",\"devices\":1}\n"
                    "{\"type\":\"step\",\"step\":1,\"loss\":1.1}\n{\"type\":\"step\",\"step\":2,\"loss\":1.2}\n"
                    "{\"type\":\"step\",\"step\":3,\"loss\":1.3}\n{\"type\":\"step\",\"step\":4,\"loss\":1.4}\n"
                    "{\"type\":\"step\",\"step\":5,\"lo{\"type\":\"run\",\"devices\":1}\n"
                    "{\"type\":\"event\",\"step\":2,\"kind\":\"info\",\"message\":\"resumed from step 2\"}\n"
                    "{\"type\":\"step\",\"step\":3,\"loss\":2.3}\n{\"type\":\"step\",\"step\":4,\"loss\":2.4}\n"
                    "{\"type\":\"step\",\"step\":5,\"loss\":2.5}\n{\"type\":\"summary\",\"steps\":5}\n");
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    crew_report_data d;
    CHECK_OK(crew_report_read(path, &d));
    CHECK_MSG(d.step_lines == 5 && d.replaced_lines == 2 && d.torn_lines == 1 && d.first_torn_line == 6,
              "%lld steps, %lld replaced, %lld torn lines", (long long)d.step_lines, (long long)d.replaced_lines,
              (long long)d.torn_lines);
    CHECK(d.buckets == 5 && fabs(d.bucket[2].loss_sum - 2.3) < 1e-9 && fabs(d.bucket[1].loss_sum - 1.2) < 1e-9);
    CHECK(d.n_resumes == 1 && d.resumes[0].checkpoint_step == 2 && strstr(d.resumes[0].message, "steps 3-4"));
    crew_report_data_free(&d);
    CHECK_OK(crew_report_write(dir, NULL));

    /* A hostile line of nothing but line starts: one more parse to look for a whole line after the
     * torn one, not one per start (which would take hours), and then an error. */
    dir = fresh_dir("starts");
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; f && i < 400000; i++) fputs("{\"type\":", f);
    if (f) fputs("\n", f), fclose(f);
    CHECK_ERR(crew_report_write(dir, NULL), "line 1: not valid JSON");
}

/* ---------------------------------------------------------------- full disks */

/* Runs fn in a child process whose files may not grow past limit bytes (SIGXFSZ ignored, so that
 * writes fail with EFBIG instead of killing it), and returns the message it reported ("" if none). */
static void in_small_child(rlim_t limit, void (*fn)(const char *arg, char *msg, size_t len), const char *arg,
                           char *msg, size_t len)
{
    int fds[2];
    msg[0] = '\0';
    if (pipe(fds) != 0) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        char out[1024] = "";
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) snprintf(out, sizeof out, "setrlimit: %s", strerror(errno));
        else fn(arg, out, sizeof out);
        ssize_t w = write(fds[1], out, strlen(out));
        _exit(w < 0);
    }
    close(fds[1]);
    ssize_t got = 0, n;
    while (pid > 0 && (size_t)got + 1 < len && (n = read(fds[0], msg + got, len - 1 - (size_t)got)) > 0) got += n;
    msg[got > 0 ? got : 0] = '\0';
    close(fds[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    CHECK_MSG(pid > 0 && WIFEXITED(status), "the child did not exit normally");
}

/* Steps until a write fails; with `events`, an event every 5 steps, each of which flushes
 * metrics.jsonl, so that it reaches the limit before the event file does. */
static void monitor_until_full_with(const char *dir, int events, char *msg, size_t len)
{
    crew_monitor *m = NULL;
    crew_status s = open_monitor(dir, 0, &m);
    for (int64_t i = 1; !s && i <= 100000; i++) {
        s = step(m, i, loss_a(i), 0);
        if (!s && events && i % 5 == 0) s = crew_monitor_event(m, CREW_EVENT_INFO, i, -1, NAN, "step %lld", (long long)i);
    }
    if (!s && m) {
        crew_fit_result res = {.steps = 1};
        s = crew_monitor_finish(m, &res);
    }
    snprintf(msg, len, "%s", s ? crew_status_message(s) : "no error");
    crew_status_free(s);
    crew_monitor_close(m);
}

static void monitor_until_full(const char *dir, char *msg, size_t len) { monitor_until_full_with(dir, 1, msg, len); }
static void steps_until_full(const char *dir, char *msg, size_t len) { monitor_until_full_with(dir, 0, msg, len); }

static void tb_until_full(const char *path, char *msg, size_t len)
{
    crew_tb_writer *w = NULL;
    crew_status s = crew_tb_open_file(path, &w);
    for (int64_t i = 1; !s && i <= 100000; i++) s = crew_tb_scalar(w, "train/loss", i, 1.0, 0.5f);
    if (!s) s = crew_tb_flush(w);
    snprintf(msg, len, "%s", s ? crew_status_message(s) : "no error");
    crew_status_free(s);
    crew_tb_close(w);
}

static void report_until_full(const char *dir, char *msg, size_t len)
{
    crew_status s = crew_report_write(dir, NULL);
    snprintf(msg, len, "%s", s ? crew_status_message(s) : "no error");
    crew_status_free(s);
}

static int has_temp_file(const char *dir)
{
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));) found += strstr(e->d_name, ".tmp-") != NULL;
    if (d) closedir(d);
    return found;
}

static void test_full_disk(void)
{
    char msg[1024], want[400], path[300];

    /* A file-size limit: EFBIG, at the file that hit it. The record it leaves still reads. */
    const char *dir = fresh_dir("fsize");
    in_small_child(20000, monitor_until_full, dir, msg, sizeof msg);
    snprintf(want, sizeof want, "%s/metrics.jsonl: write failed: %s", dir, strerror(EFBIG));
    CHECK_MSG(strstr(msg, want) != NULL, "got '%s', expected '%s'", msg, want);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    crew_report_data d;
    CHECK_OK(crew_report_read(path, &d));
    CHECK(d.step_lines > 10);
    crew_report_data_free(&d);

    /* Step lines alone: whichever file reaches the limit first, the reason is EFBIG (not the
     * "Success" of an errno that the next write had reset). */
    dir = fresh_dir("fsize-steps");
    in_small_child(20000, steps_until_full, dir, msg, sizeof msg);
    snprintf(want, sizeof want, ": %s", strerror(EFBIG));
    CHECK_MSG(strstr(msg, dir) && strstr(msg, want) && !strstr(msg, "Success"), "got '%s'", msg);

    snprintf(path, sizeof path, "%s/tb.tfevents", dir);
    in_small_child(20000, tb_until_full, path, msg, sizeof msg);
    snprintf(want, sizeof want, "%s: write: %s", path, strerror(EFBIG));
    CHECK_MSG(strstr(msg, want) != NULL, "got '%s', expected '%s'", msg, want);

    /* The report: a page of 300 steps does not fit in 8 kB. */
    dir = fresh_dir("fsize-report");
    crew_monitor *m = NULL;
    CHECK_OK(open_monitor(dir, 0, &m));
    for (int64_t i = 1; m && i <= 300; i++) CHECK_OK(step(m, i, loss_a(i), 0));
    crew_monitor_close(m);
    in_small_child(8192, report_until_full, dir, msg, sizeof msg);
    snprintf(want, sizeof want, "%s/report.html: write failed: %s", dir, strerror(EFBIG));
    CHECK_MSG(strstr(msg, want) != NULL, "got '%s', expected '%s'", msg, want);
    snprintf(path, sizeof path, "%s/report.html", dir);
    CHECK(access(path, F_OK) != 0 && !has_temp_file(dir));

    /* A full disk: ENOSPC, through a metrics.jsonl that is a device node like /dev/full (made with
     * mknod: a symbolic link to /dev/full is refused, as every link in a run directory is), or,
     * where this process may not make device nodes, through the record's writer on /dev/full. */
    struct stat full;
    if (access("/dev/full", W_OK) == 0 && stat("/dev/full", &full) == 0) {
        dir = fresh_dir("full");
        snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
        CHECK(symlink("/dev/full", path) == 0);
        crew_status s = open_monitor(dir, 0, &m);
        CHECK_MSG(s && strstr(crew_status_message(s), "metrics.jsonl is a symbolic link (to /dev/full)"), "%s",
                  s ? crew_status_message(s) : "no error");
        crew_status_free(s);
        CHECK(unlink(path) == 0);
        if (mknod(path, S_IFCHR | 0666, full.st_rdev) != 0) {
            int fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
            crew_text_file t;
            CHECK_OK(crew_text_attach(&t, fd, path));
            crew_text_puts(&t, "{\"type\":\"step\"}");
            s = crew_text_end_line(&t);
            snprintf(want, sizeof want, "%s/metrics.jsonl: write failed: %s", dir, strerror(ENOSPC));
            CHECK_MSG(s && strstr(crew_status_message(s), want), "%s", s ? crew_status_message(s) : "no error");
            crew_status_free(s);
            crew_status_free(crew_text_close(&t, 0));
            return;
        }
        monitor_until_full(dir, msg, sizeof msg);
        snprintf(want, sizeof want, "%s/metrics.jsonl: write failed: %s", dir, strerror(ENOSPC));
        CHECK_MSG(strstr(msg, want) != NULL, "got '%s', expected '%s'", msg, want);
        /* Appending to it: a device is not read back, and the failure is the same. */
        s = open_monitor(dir, 1, &m);
        CHECK_MSG(s && strstr(crew_status_message(s), want), "%s", s ? crew_status_message(s) : "no error");
        crew_status_free(s);
    }
}

/* ---------------------------------------------------------------- the docs and the files */

/* The keys of the objects in json (one or more, one after another) by "type", into keys[type]:
 * a cJSON object of type -> object of key -> true. Replicas' keys go under "replica". */
static void collect_keys(cJSON *keys, const char *json, const char *where)
{
    const char *p = json;
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        if (!*p) break;
        const char *end = NULL;
        cJSON *o = cJSON_ParseWithOpts(p, &end, 0);
        CHECK_MSG(cJSON_IsObject(o), "%s: not JSON near '%.60s'", where, p);
        if (!o || !end) break;
        p = end;
        const cJSON *type = item(o, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "(no type)";
        cJSON *set = cJSON_GetObjectItemCaseSensitive(keys, t);
        if (!set) cJSON_AddItemToObject(keys, t, set = cJSON_CreateObject());
        for (const cJSON *k = o->child; k; k = k->next) {
            if (!item(set, k->string)) cJSON_AddTrueToObject(set, k->string);
            /* the objects of a step's "replicas" and of a pipeline line's "ops" */
            const char *inner = !strcmp(k->string, "replicas") ? "replica" : !strcmp(k->string, "ops") ? "op" : NULL;
            if (inner && cJSON_IsArray(k)) {
                cJSON *rs = cJSON_GetObjectItemCaseSensitive(keys, inner);
                if (!rs) cJSON_AddItemToObject(keys, inner, rs = cJSON_CreateObject());
                for (const cJSON *r = k->child; r; r = r->next)
                    for (const cJSON *rk = r->child; rk; rk = rk->next)
                        if (!item(rs, rk->string)) cJSON_AddTrueToObject(rs, rk->string);
            }
        }
        cJSON_Delete(o);
    }
}

/* Every ```json block of a Markdown file. */
static void doc_keys(cJSON *keys, const char *md, const char *where)
{
    for (const char *p = strstr(md, "```json\n"); p; p = strstr(p, "```json\n")) {
        p += 8;
        const char *end = strstr(p, "```");
        if (!end) break;
        char *block = strndup(p, (size_t)(end - p));
        collect_keys(keys, block, where);
        free(block);
        p = end + 3;
    }
}

static void compare_sets(const cJSON *written, const cJSON *documented)
{
    for (const cJSON *t = written->child; t; t = t->next) {
        const cJSON *doc = item(documented, t->string);
        CHECK_MSG(doc != NULL, "metrics.jsonl has \"%s\" lines, which docs/METRICS.md does not show", t->string);
        for (const cJSON *k = t->child; doc && k; k = k->next)
            CHECK_MSG(item(doc, k->string) != NULL, "\"%s\" lines hold \"%s\", which docs/METRICS.md does not show",
                      t->string, k->string);
    }
    for (const cJSON *t = documented->child; t; t = t->next) {
        const cJSON *got = item(written, t->string);
        CHECK_MSG(got != NULL, "docs/METRICS.md shows \"%s\" lines, which crew does not write", t->string);
        for (const cJSON *k = t->child; got && k; k = k->next)
            CHECK_MSG(item(got, k->string) != NULL, "docs/METRICS.md shows \"%s\" in \"%s\" lines, which crew does not "
                      "write", k->string, t->string);
    }
}

/* The tags of the "## Tags" table of TENSORBOARD.md: backticked names in the first column, each
 * "<r>" standing for a replica's number. Returns how many; tags[i] point into md (NUL-cut). */
static int doc_tags(char *md, char **tags, int max)
{
    char *p = strstr(md, "## Tags");
    char *end = p ? strstr(p + 7, "\n## ") : NULL;
    if (!p || !end) return 0;
    *end = '\0';
    int n = 0;
    for (char *line = p; line; ) {
        char *next = strchr(line + 1, '\n'); /* found before this line is cut up */
        if (!strncmp(line, "\n| `", 4)) {
            char *cell_end = strchr(line + 3, '|');
            for (char *q = line + 3; q && cell_end && q < cell_end && n < max;) {
                char *close = strchr(q + 1, '`');
                if (!close || close > cell_end) break;
                *close = '\0';
                tags[n++] = q + 1;
                q = strchr(close + 1, '`');
            }
        }
        line = next;
    }
    return n;
}

/* tag matches pattern, where "<r>" stands for one or more digits. */
static int tag_matches(const char *tag, const char *pattern)
{
    const char *r = strstr(pattern, "<r>");
    if (!r) return !strcmp(tag, pattern);
    size_t head = (size_t)(r - pattern);
    if (strncmp(tag, pattern, head) != 0) return 0;
    const char *t = tag + head;
    if (*t < '0' || *t > '9') return 0;
    while (*t >= '0' && *t <= '9') t++;
    return !strcmp(t, r + 3);
}

static void test_documented_keys(void)
{
    /* A record with every kind of line: a run that is stopped after a skipped update, an event and
     * an epoch, then resumed (one step run again), finished. */
    const char *dir = fresh_dir("keys");
    crew_monitor *m = NULL;
    CHECK_OK(open_monitor(dir, 0, &m));
    if (!m) return;
    CHECK_OK(step(m, 1, 1.0f, 0));
    CHECK_OK(step(m, 2, NAN, 1));
    CHECK_OK(crew_monitor_event(m, CREW_EVENT_SKIPPED_UPDATE, 2, 1, 3.0, "skipped"));
    CHECK_OK(epoch(m, 0));
    crew_monitor_close(m);
    CHECK_OK(open_monitor(dir, 1, &m));
    if (!m) return;
    CHECK_OK(step(m, 2, 1.0f, 0));
    CHECK_OK(step(m, 3, 1.0f, 0));
    const crew_pipe_timing ops[2] = {{0, 0, 0, 0.0, 0.001}, {0, 0, 1, 0.001, 0.003}};
    const crew_pipeline_record pipe = {3, 1, 1, 1, 0, 0.0, 0.1, 0.004, 0, 2, ops};
    CHECK_OK(crew_monitor_pipeline(m, &pipe));
    crew_fit_result res = {.steps = 3, .epochs = 1};
    CHECK_OK(crew_monitor_finish(m, &res));
    crew_monitor_close(m);

    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *record = slurp(path, NULL);
    const char *src = getenv("CREW_SOURCE_DIR");
    char doc_path[600];
    snprintf(doc_path, sizeof doc_path, "%s/docs/METRICS.md", src ? src : "..");
    char *md = slurp(doc_path, NULL);
    CHECK_MSG(record && md, "cannot read %s or %s", path, doc_path);
    if (record && md) {
        cJSON *written = cJSON_CreateObject(), *documented = cJSON_CreateObject();
        collect_keys(written, record, path);
        doc_keys(documented, md, doc_path);
        CHECK(cJSON_GetArraySize(written) == 9); /* run, step, event, epoch, resume, pipeline, summary; replica, op */
        compare_sets(written, documented);
        cJSON_Delete(written);
        cJSON_Delete(documented);
    }
    free(record);
    free(md);

    /* TensorBoard tags, written and documented. */
    snprintf(doc_path, sizeof doc_path, "%s/docs/TENSORBOARD.md", src ? src : "..");
    md = slurp(doc_path, NULL);
    char *tags[64];
    int n = md ? doc_tags(md, tags, 64) : 0;
    CHECK_MSG(n >= 10, "%s: %d tags found in its table", doc_path, n);
    int matched[64] = {0};
    snprintf(path, sizeof path, "%s/tb", dir);
    crew_tb_scalar_list l;
    CHECK_OK(crew_tb_read_run(path, &l));
    for (int64_t i = 0; i < l.count; i++) {
        int found = 0, said = 0;
        for (int k = 0; k < n; k++)
            if (tag_matches(l.points[i].tag, tags[k])) found = matched[k] = 1;
        for (int64_t j = 0; !found && j < i && !said; j++) said = !strcmp(l.points[j].tag, l.points[i].tag);
        if (!said) CHECK_MSG(found, "tag %s is written but not in docs/TENSORBOARD.md", l.points[i].tag);
    }
    for (int k = 0; k < n; k++) CHECK_MSG(matched[k], "docs/TENSORBOARD.md lists %s, which crew does not write", tags[k]);
    crew_tb_scalar_list_free(&l);
    free(md);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew_test_record_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_resume_after_kill();
    test_resume_edges();
    test_report_torn_lines();
    test_full_disk();
    test_documented_keys();
    nftw(tmp_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
