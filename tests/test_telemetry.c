/* test_telemetry.c — no multi-device failure stays quiet. Each failure is caused on purpose
 * through the test-only fault hooks (train/hooks.h, outside crew.h) and must come back as the right event and
 * outcome:
 * - a replica slowed on purpose is reported as a straggler, by rank, and no other is;
 * - NaN gradients stop the run (exit code NUMERIC) or, with on_nan = skip, skip one update;
 * - a replica whose parameters change behind its back is caught by the drift check, naming the
 *   tensor; the run stops with DIVERGED;
 * - a replica that stops arriving is named within the collective deadline, with step and phase;
 * - metrics.jsonl holds run, step (with every replica), epoch and summary lines, and the
 *   TensorBoard file holds a train/loss point per step (read back with the C reader);
 * - the monitor reports a loss spike. */
#include <string.h>

#include "check.h"
#include "core/timer.h"
#include "synthetic.h"
#include "telemetry/monitor.h"
#include "telemetry/tb_reader.h"
#include "train/hooks.h"

typedef struct seen {
    int count[16];
    int rank_count[16][8];
    char last[16][512];
} seen;

static void on_event(void *user, const crew_event_info *e)
{
    seen *s = user;
    if (e->kind < 0 || e->kind >= 16) return;
    s->count[e->kind]++;
    if (e->rank >= 0 && e->rank < 8) s->rank_count[e->kind][e->rank]++;
    snprintf(s->last[e->kind], sizeof s->last[e->kind], "%s", e->message);
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
        crew_fit_hooks_of(f)->faults = *faults;
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

static void test_straggler(const crew_dataset *d)
{
    crew_fit_faults f = {.slow_rank = 1, .slow_s = 0.03, .stall_rank = -1, .corrupt_rank = -1};
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
    CHECK_MSG(st && strstr(msg, "step 3") && strstr(msg, "rank 1 did not arrive"), "%s", msg);
    crew_status_free(st);
    CHECK(s.count[CREW_EVENT_HANG] == 1);
    CHECK_MSG(took < 6.0, "the stalled run took %.1f s to end (deadline 1 s, the stalled replica sleeps 3 s)", took);
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
    test_loss_spike();
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
