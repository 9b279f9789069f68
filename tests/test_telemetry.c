/* test_telemetry.c — no multi-device failure stays quiet. Each failure is caused on purpose
 * through the test-only fault hooks (train/hooks.h, outside crew.h) and must come back as the right event and
 * outcome:
 * - the straggler detector, fed made-up step records through the monitor: a replica whose compute
 *   is above the others' median by more than the threshold is reported once per window, by rank,
 *   with its window and how much slower it was; no other replica is, nor one below the threshold;
 * - a replica slowed on purpose in a real run is reported as a straggler, by rank, and no other is
 *   (the delay is added to its measured compute exactly, and is over 100 times the other
 *   replica's compute, so no load on the machine can change the verdict);
 * - NaN gradients stop the run (exit code NUMERIC) or, with on_nan = skip, skip one update;
 * - a replica whose parameters change behind its back is caught by the drift check, naming the
 *   tensor; the run stops with DIVERGED;
 * - a replica that stops arriving is named within the collective deadline, with step and phase
 *   (the run's error is the deadline's report, not the stalled replica's own; the run must end,
 *   within a bound no loaded machine comes near: 60 s for a 1 s deadline);
 * - metrics.jsonl holds run, step (with every replica), epoch and summary lines, and the
 *   TensorBoard file holds a train/loss point per step (read back with the C reader);
 * - the monitor reports a loss spike. */
#include <string.h>

#include "check.h"
#include "fault_hooks.h"
#include "core/timer.h"
#include "synthetic.h"
#include "telemetry/monitor.h"
#include "telemetry/tb_reader.h"
#include "train/hooks.h"

typedef struct seen {
    int count[16];
    int rank_count[16][8];
    char last[16][512];
    int64_t last_step[16];
    double last_value[16];
} seen;

static void on_event(void *user, const crew_event_info *e)
{
    seen *s = user;
    if (e->kind < 0 || e->kind >= 16) return;
    s->count[e->kind]++;
    if (e->rank >= 0 && e->rank < 8) s->rank_count[e->kind][e->rank]++;
    snprintf(s->last[e->kind], sizeof s->last[e->kind], "%s", e->message);
    s->last_step[e->kind] = e->step;
    s->last_value[e->kind] = e->value;
}

static crew_model *small_model(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {3, 3},
                                                  .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    return m;
}

/* Trains a fresh small model for `steps` steps on 2 replicas with the given faults. */
static crew_status run(const crew_dataset *d, const crew_fit_faults *faults, int64_t steps, crew_fit_options *extra,
                       seen *s, crew_fit_result *r)
{
    crew_model *m = small_model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    if (extra) o = *extra;
    o.devices = 2;
    o.batch_per_device = 8;
    o.max_steps = steps;
    o.epochs = 100;
    o.on_event = on_event;
    o.user = s;
    memset(s, 0, sizeof *s);
    memset(r, 0, sizeof *r);
    crew_fit *f = NULL;
    crew_status st = crew_fit_prepare(m, d, &o, &f);
    if (!st) {
        fault_hooks_set(f, faults);
        st = crew_fit_run(f, r);
    }
    crew_fit_free(f);
    crew_model_free(m);
    return st;
}

static crew_fit_options defaults(void)
{
    crew_model *m = small_model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    crew_model_free(m);
    return o;
}

/* The straggler detector on made-up step records: n replicas, steps first..last, where replica r's
 * forward + backward takes compute[r] seconds of each step; every step lasts 15 ms with no wait for
 * data or communication, so a summary can only be about compute or a straggler. */
static void feed(crew_monitor *m, int n, int64_t first, int64_t last, const double *compute)
{
    crew_step_times t[8];
    for (int64_t step = first; step <= last; step++) {
        for (int r = 0; r < n; r++)
            t[r] = (crew_step_times){.forward_s = compute[r] / 3, .backward_s = 2 * compute[r] / 3};
        crew_step_record rec = {.step = step, .loss = 1.0f, .global_batch = 8 * n, .step_s = 0.015, .n_replicas = n,
                                .replicas = t};
        CHECK_OK(crew_monitor_step(m, &rec));
    }
}

static crew_monitor *open_monitor(int n, int64_t window, double threshold, seen *s)
{
    memset(s, 0, sizeof *s);
    crew_monitor_config cfg = {.straggler_window = window, .straggler_threshold = threshold, .on_event = on_event,
                               .user = s};
    crew_fit_plan plan = {.devices = n, .global_batch = 8 * n, .total_steps = 100};
    crew_monitor *m = NULL;
    CHECK_OK(crew_monitor_open(&cfg, &plan, &m));
    return m;
}

static void test_straggler_detector(void)
{
    seen s;
    crew_fit_result r;
    /* 3 replicas, windows of 5 steps: replica 1 computes 30% longer than the others in both. */
    crew_monitor *m = open_monitor(3, 5, 0, &s);
    if (!m) return;
    feed(m, 3, 1, 10, (double[]){0.010, 0.013, 0.010});
    CHECK_MSG(s.rank_count[CREW_EVENT_STRAGGLER][1] == 2 && s.count[CREW_EVENT_STRAGGLER] == 2,
              "replica 1 reported %d times in 2 windows, %d reports in all", s.rank_count[CREW_EVENT_STRAGGLER][1],
              s.count[CREW_EVENT_STRAGGLER]);
    CHECK_MSG(strstr(s.last[CREW_EVENT_STRAGGLER], "replica 1 was 30% slower than the median of the others over steps "
                                                   "6-10") != NULL, "%s", s.last[CREW_EVENT_STRAGGLER]);
    CHECK(s.last_step[CREW_EVENT_STRAGGLER] == 10 && fabs(s.last_value[CREW_EVENT_STRAGGLER] - 0.3) < 1e-9);
    memset(&r, 0, sizeof r);
    CHECK_OK(crew_monitor_finish(m, &r));
    CHECK_MSG(strstr(r.bottleneck, "straggler: replica 1 was 30% slower than the others") == r.bottleneck, "%s",
              r.bottleneck);
    crew_monitor_close(m);

    /* Slow only in the second window: one report, naming that window. */
    m = open_monitor(3, 5, 0, &s);
    if (!m) return;
    feed(m, 3, 1, 5, (double[]){0.010, 0.010, 0.010});
    feed(m, 3, 6, 10, (double[]){0.010, 0.010, 0.015});
    CHECK_MSG(s.rank_count[CREW_EVENT_STRAGGLER][2] == 1 && s.count[CREW_EVENT_STRAGGLER] == 1, "%d reports",
              s.count[CREW_EVENT_STRAGGLER]);
    CHECK_MSG(strstr(s.last[CREW_EVENT_STRAGGLER], "replica 2 was 50% slower than the median of the others over steps "
                                                   "6-10") != NULL, "%s", s.last[CREW_EVENT_STRAGGLER]);
    crew_monitor_close(m);

    /* Below the default threshold of 20%: nobody; the same records with a threshold of 10%: replica 0.
     * A window that is not complete yet says nothing. */
    m = open_monitor(3, 5, 0, &s);
    if (!m) return;
    feed(m, 3, 1, 9, (double[]){0.0115, 0.010, 0.010});
    CHECK_MSG(s.count[CREW_EVENT_STRAGGLER] == 0, "15%% slower reported against a threshold of 20%%: %s",
              s.last[CREW_EVENT_STRAGGLER]);
    memset(&r, 0, sizeof r);
    CHECK_OK(crew_monitor_finish(m, &r));
    CHECK_MSG(strstr(r.bottleneck, "compute-bound") == r.bottleneck, "%s", r.bottleneck);
    crew_monitor_close(m);
    m = open_monitor(3, 5, 0.1, &s);
    if (!m) return;
    feed(m, 3, 1, 9, (double[]){0.0115, 0.010, 0.010});
    CHECK_MSG(s.rank_count[CREW_EVENT_STRAGGLER][0] == 1 && s.count[CREW_EVENT_STRAGGLER] == 1 &&
              s.last_step[CREW_EVENT_STRAGGLER] == 5, "threshold 10%%: %d reports, the last at step %lld",
              s.count[CREW_EVENT_STRAGGLER], (long long)s.last_step[CREW_EVENT_STRAGGLER]);
    crew_monitor_close(m);

    /* Two replicas: the slow one is named, the other (a third faster than it) is not. */
    m = open_monitor(2, 4, 0, &s);
    if (!m) return;
    feed(m, 2, 1, 8, (double[]){0.012, 0.008});
    CHECK_MSG(s.rank_count[CREW_EVENT_STRAGGLER][0] == 2 && s.rank_count[CREW_EVENT_STRAGGLER][1] == 0,
              "replica 0 reported %d times, replica 1 %d times", s.rank_count[CREW_EVENT_STRAGGLER][0],
              s.rank_count[CREW_EVENT_STRAGGLER][1]);
    CHECK(fabs(s.last_value[CREW_EVENT_STRAGGLER] - 0.5) < 1e-9);
    crew_monitor_close(m);

    /* The default window is 50 steps. */
    m = open_monitor(2, 0, 0, &s);
    if (!m) return;
    feed(m, 2, 1, 49, (double[]){0.010, 0.020});
    CHECK(s.count[CREW_EVENT_STRAGGLER] == 0);
    feed(m, 2, 50, 50, (double[]){0.010, 0.020});
    CHECK(s.rank_count[CREW_EVENT_STRAGGLER][1] == 1 && strstr(s.last[CREW_EVENT_STRAGGLER], "steps 1-50"));
    crew_monitor_close(m);
}

/* The same detector in a real run on 2 replicas: replica 1 sleeps 0.1 s in every backward pass,
 * counted into its compute exactly; replica 0's compute (well under 1 ms for this model) would have
 * to average over 80 ms a step for a verdict to change. */
static void test_straggler(const crew_dataset *d)
{
    crew_fit_faults f = {.slow_rank = 1, .slow_s = 0.1, .stall_rank = -1, .corrupt_rank = -1};
    crew_fit_options o = defaults();
    o.straggler_window = 5;
    seen s;
    crew_fit_result r;
    CHECK_OK(run(d, &f, 10, &o, &s, &r));
    CHECK_MSG(s.rank_count[CREW_EVENT_STRAGGLER][1] == 2, "replica 1 reported %d times in 2 windows",
              s.rank_count[CREW_EVENT_STRAGGLER][1]);
    CHECK_MSG(s.rank_count[CREW_EVENT_STRAGGLER][0] == 0, "replica 0 reported as a straggler too");
    CHECK(strstr(s.last[CREW_EVENT_STRAGGLER], "replica 1 was") != NULL);
    CHECK_MSG(strstr(r.bottleneck, "replica 1") || strstr(r.bottleneck, "communication-bound"),
              "the summary should name the straggler or the wait it causes: %s", r.bottleneck);
}

static void test_nan(const crew_dataset *d)
{
    crew_fit_faults f = {.slow_rank = -1, .stall_rank = -1, .corrupt_rank = -1, .nan_step = 3};
    seen s;
    crew_fit_result r;
    crew_status st = run(d, &f, 6, NULL, &s, &r);
    CHECK(crew_status_code(st) == CREW_CODE_NUMERIC);
    CHECK(st && strstr(crew_status_message(st), "step 3"));
    crew_status_free(st);
    CHECK(s.count[CREW_EVENT_NAN] == 1 && r.steps == 0);

    crew_fit_options o = defaults();
    o.on_nan = CREW_ON_NAN_SKIP;
    CHECK_OK(run(d, &f, 6, &o, &s, &r));
    CHECK(r.steps == 6 && r.skipped_updates == 1 && s.count[CREW_EVENT_SKIPPED_UPDATE] == 1);
}

static void test_drift(const crew_dataset *d)
{
    crew_fit_faults f = {.slow_rank = -1, .stall_rank = -1, .corrupt_rank = 1, .corrupt_step = 4};
    crew_fit_options o = defaults();
    o.drift_check_every = 2;
    seen s;
    crew_fit_result r;
    crew_status st = run(d, &f, 8, &o, &s, &r);
    CHECK(crew_status_code(st) == CREW_CODE_DIVERGED);
    CHECK_MSG(st && strstr(crew_status_message(st), "tensor 'conv2d.kernel' differs between replica 0 and replica 1"),
              "%s", crew_status_message(st));
    CHECK(st && strstr(crew_status_message(st), "step 4"));
    crew_status_free(st);
    CHECK(s.rank_count[CREW_EVENT_DIVERGENCE][1] == 1);
    /* Without the fault the same checks pass quietly. */
    f.corrupt_rank = -1;
    CHECK_OK(run(d, &f, 8, &o, &s, &r));
    CHECK(s.count[CREW_EVENT_DIVERGENCE] == 0);
}

/* Replica 1 stops arriving at step 3 (it sleeps the deadline + 2 s, then fails by itself): rank 0's
 * collective deadline of 1 s names it, with the step and the phase, and that report is the run's
 * error. How long the run took is bounded only by what no loaded machine comes near (60 s): the
 * stalled replica's own sleep sets its length, not the detection. */
static void test_hang(const crew_dataset *d)
{
    crew_fit_faults f = {.slow_rank = -1, .stall_rank = 1, .stall_step = 3, .corrupt_rank = -1};
    crew_fit_options o = defaults();
    o.collective_timeout_s = 1.0;
    seen s;
    crew_fit_result r;
    double start = crew_now();
    crew_status st = run(d, &f, 6, &o, &s, &r);
    double took = crew_now() - start;
    CHECK(crew_status_code(st) == CREW_CODE_TIMEOUT);
    const char *msg = crew_status_message(st);
    CHECK_MSG(st && strstr(msg, "step 3, ") && strstr(msg, "all-reduce: ") &&
              strstr(msg, "rank 1 did not arrive within 1 s"), "%s", msg);
    CHECK_MSG(st && !strstr(msg, "stalled on purpose"), "the run's error is the stalled replica's own: %s", msg);
    crew_status_free(st);
    CHECK(s.count[CREW_EVENT_HANG] == 1 && s.last_step[CREW_EVENT_HANG] == 3);
    CHECK_MSG(strstr(s.last[CREW_EVENT_HANG], "rank 1 did not arrive") != NULL, "%s", s.last[CREW_EVENT_HANG]);
    CHECK_MSG(took < 60.0, "the stalled run took %.1f s to end (deadline 1 s, the stalled replica sleeps 3 s)", took);
}

typedef struct tb_count {
    int loss_points;
    int64_t last_step;
} tb_count;

static crew_status count_loss(const crew_tb_point *p, void *user)
{
    tb_count *c = user;
    if (strcmp(p->tag, "train/loss") == 0) {
        c->loss_points++;
        c->last_step = p->step;
    }
    return CREW_OK;
}

static void test_files(const crew_dataset *d, const char *dir)
{
    char run_dir[400], path[500];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    crew_fit_options o = defaults();
    o.run_dir = run_dir;
    seen s;
    crew_fit_result r;
    crew_fit_faults none = {.slow_rank = -1, .stall_rank = -1, .corrupt_rank = -1};
    CHECK_OK(run(d, &none, 7, &o, &s, &r));
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char line[8192];
    int lines = 0, steps = 0, two_replicas = 0, run_first = 0, summary_last = 0, epochs = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (lines == 0) run_first = strstr(line, "{\"type\":\"run\"") == line;
        summary_last = strstr(line, "{\"type\":\"summary\"") == line;
        if (strstr(line, "{\"type\":\"step\"") == line) {
            steps++;
            two_replicas += strstr(line, "{\"rank\":0,") && strstr(line, "{\"rank\":1,");
        }
        epochs += strstr(line, "{\"type\":\"epoch\"") == line;
        lines++;
    }
    if (f) fclose(f);
    CHECK(run_first && summary_last && epochs == 1);
    CHECK_MSG(steps == 7 && two_replicas == 7, "%d step lines, %d with both replicas", steps, two_replicas);
    /* TensorBoard: the one event file in run/tb. */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/tb/events.out.tfevents.* > %s/tbname", run_dir, dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/tbname", dir);
    f = fopen(path, "r");
    char tb[600] = "";
    if (f && fgets(tb, sizeof tb, f)) tb[strcspn(tb, "\n")] = '\0';
    if (f) fclose(f);
    tb_count c = {0};
    CHECK_OK(crew_tb_read(tb, count_loss, &c));
    CHECK_MSG(c.loss_points == 7 && c.last_step == 7, "%d train/loss points, last at step %lld", c.loss_points,
              (long long)c.last_step);
}

static void test_loss_spike(void)
{
    seen s = {0};
    crew_monitor_config cfg = {.on_event = on_event, .user = &s};
    crew_fit_plan plan = {.devices = 1, .global_batch = 8, .total_steps = 100};
    crew_monitor *m = NULL;
    CHECK_OK(crew_monitor_open(&cfg, &plan, &m));
    crew_step_times t = {.forward_s = 0.01, .backward_s = 0.02};
    for (int i = 1; i <= 40 && m; i++) {
        float loss = i == 40 ? 5.0f : 1.0f + 0.01f * (float)(i % 5);
        crew_step_record rec = {.step = i, .loss = loss, .global_batch = 8, .step_s = 0.04, .n_replicas = 1,
                                .replicas = &t};
        CHECK_OK(crew_monitor_step(m, &rec));
    }
    CHECK(s.count[CREW_EVENT_LOSS_SPIKE] == 1 && strstr(s.last[CREW_EVENT_LOSS_SPIKE], "step 40"));
    crew_monitor_close(m);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-telemetry-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, 256, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        test_straggler(d);
        test_nan(d);
        test_drift(d);
        test_hang(d);
        test_files(d, dir);
    }
    test_straggler_detector();
    test_loss_spike();
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
