/* test_loader.c — the prefetching loader:
 * - results do not depend on the loader thread count or the prefetch depth (bitwise the same
 *   parameters with K = 1 and K = 4, and prefetch 1 and 6, augmentations on), nor on whether the
 *   replicas prepare their batches themselves (inline, K = 0);
 * - inline, a take fills its micro-batch; a ring place still held, or a micro-batch taken twice,
 *   is an error naming them;
 * - the input-bound detector, fed made-up step records through the monitor: the slowest replica's
 *   wait for data above 5% of the steps of a window is reported once, with the remedies, and
 *   the run's summary says input-bound; below it, or only in the first steps (the pipeline
 *   filling), it is not;
 * - a deliberately slow augmentation (one loader thread sleeping 20 ms a sample, 160 ms a batch,
 *   for a model that computes a step in well under 1 ms) makes a real run input-bound and says
 *   so; the same run with 32 loader threads gives the same parameters. Whether 32 threads keep
 *   up is a claim about speed: bench/bench_input_bound.c measures it (docs/PERFORMANCE.md);
 * - the last partial global batch is dropped, or padded the same way for every replica;
 * - a rank's loader serves only its range of micro-batches, and the ranks' loaders together hand
 *   out exactly what one loader of every micro-batch does;
 * - augmentations are a function of (seed, epoch, sample) alone, and crop/flip move pixels as
 *   documented;
 * - a CPU replica reads its inputs in the loader's slots (no copy) and holds them until the step
 *   ends: at prefetch 1, 2 micro-batches a replica and augmentations on, its parameters are
 *   bitwise those of the guarded CPU kind, which uploads every micro-batch (a slot given back or
 *   refilled under the passes would change them). */
#include <string.h>

#include "check.h"
#include "data/augment.h"
#include "data/loader.h"
#include "model_values.h"
#include "nn/model.h"
#include "synthetic.h"
#include "telemetry/monitor.h"
#include "train/hooks.h"

typedef struct events {
    int input_bound;
    int64_t step;      /* of the last input-bound event */
    double value;
    char message[512];
} events;

static void on_event(void *user, const crew_event_info *e)
{
    events *ev = user;
    if (e->kind != CREW_EVENT_INPUT_BOUND) return;
    ev->input_bound++;
    ev->step = e->step;
    ev->value = e->value;
    snprintf(ev->message, sizeof ev->message, "%s", e->message);
}

static crew_model *small_model(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {3, 3},
                                                  .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DROPOUT, .rate = 0.1f}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    return m;
}

static crew_model *train(const crew_dataset *d, int threads, int prefetch, int devices, crew_augment_options aug,
                         double slow_s, int64_t steps, events *ev, crew_fit_result *r, int64_t window)
{
    crew_model *m = small_model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = devices;
    o.batch_per_device = 8;
    o.max_steps = steps;
    o.epochs = 1000;
    o.loader_inline = threads ? -1 : 1; /* threads 0: each replica prepares its own batches */
    if (threads) o.loader_threads = threads;
    o.prefetch = prefetch;
    o.augment = aug;
    o.straggler_window = window;
    o.on_event = on_event;
    o.user = ev;
    crew_fit *f = NULL;
    CHECK_OK(crew_fit_prepare(m, d, &o, &f));
    if (f) crew_fit_hooks_of(f)->loader_slow_s = slow_s;
    if (f) CHECK_OK(crew_fit_run(f, r));
    crew_fit_free(f);
    return m;
}

static crew_model *train_on(const crew_dataset *d, const char *kind, int prefetch)
{
    crew_model *m = small_model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.device_kind = kind;
    o.devices = 2;
    o.batch_per_device = 8;
    o.global_batch = 32; /* 2 micro-batches a replica */
    o.max_steps = 30;
    o.epochs = 1000;
    o.loader_threads = 2;
    o.prefetch = prefetch;
    o.augment = (crew_augment_options){.crop_padding = 2, .flip = 1};
    crew_fit_result r;
    CHECK_OK(crew_model_fit(m, d, &o, &r));
    return m;
}

static void test_inputs_in_place(const crew_dataset *d)
{
    crew_model *plain = train_on(d, "cpu", 1), *guarded = train_on(d, "cpu-guarded", 1);
    CHECK_MSG(mv_equal(plain, guarded), "inputs read in place (cpu) and uploaded (cpu-guarded) give different "
              "parameters");
    crew_model_free(plain);
    crew_model_free(guarded);
}

static void test_independent_of_threads(const crew_dataset *d)
{
    crew_augment_options aug = {.crop_padding = 2, .flip = 1};
    events ev = {0};
    crew_fit_result r;
    crew_model *a = train(d, 1, 1, 2, aug, 0, 40, &ev, &r, 20);
    crew_model *b = train(d, 4, 6, 2, aug, 0, 40, &ev, &r, 20);
    crew_model *c = train(d, 0, 1, 2, aug, 0, 40, &ev, &r, 20);
    CHECK_MSG(mv_equal(a, b), "K=1/prefetch 1 and K=4/prefetch 6 give different parameters");
    CHECK_MSG(mv_equal(a, c), "loader threads and batches prepared inline give different parameters");
    crew_model_free(a);
    crew_model_free(b);
    crew_model_free(c);
}

/* Made-up records of `steps` steps of 10 ms on n replicas, where replica r waits data[r] of each
 * step for its batches (the rest of the step computing); steps up to `until` wait, later ones do
 * not. The events go to *ev, the summary to *res. */
static void detect(int n, int64_t window, double fraction, int64_t steps, int64_t until, const double *data,
                   events *ev, crew_fit_result *res)
{
    memset(ev, 0, sizeof *ev);
    memset(res, 0, sizeof *res);
    crew_monitor_config cfg = {.straggler_window = window, .input_bound_fraction = fraction, .on_event = on_event,
                               .user = ev};
    crew_fit_plan plan = {.devices = n, .global_batch = 8 * n, .total_steps = steps};
    crew_monitor *m = NULL;
    CHECK_OK(crew_monitor_open(&cfg, &plan, &m));
    if (!m) return;
    crew_step_times t[4];
    for (int64_t step = 1; step <= steps; step++) {
        for (int r = 0; r < n; r++) {
            double wait = step <= until ? data[r] : 0.0;
            double compute = 0.010 - wait;
            t[r] = (crew_step_times){.data_s = wait, .forward_s = compute / 3, .backward_s = 2 * compute / 3};
        }
        crew_step_record rec = {.step = step, .loss = 1.0f, .global_batch = 8 * n, .step_s = 0.010, .n_replicas = n,
                                .replicas = t};
        CHECK_OK(crew_monitor_step(m, &rec));
    }
    CHECK_OK(crew_monitor_finish(m, res));
    crew_monitor_close(m);
}

static void test_input_bound_detector(void)
{
    events ev;
    crew_fit_result r;
    /* 40% of every step waiting, windows of 20: reported once (not again for the second window),
     * at the end of the first; its steps 1-5 fill the pipeline and are left out, so 15 x 4 ms of
     * 20 x 10 ms. The summary: 35 x 4 ms of 40 x 10 ms. */
    detect(1, 20, 0, 40, 40, (double[]){0.004}, &ev, &r);
    CHECK_MSG(ev.input_bound == 1 && ev.step == 20 && fabs(ev.value - 0.3) < 1e-9, "%d events, the last at step %lld "
              "with %g", ev.input_bound, (long long)ev.step, ev.value);
    CHECK_MSG(strstr(ev.message, "input-bound: replicas waited 30% of each step for data over steps 1-20") &&
              strstr(ev.message, "--loader-threads") && strstr(ev.message, "--prefetch"), "%s", ev.message);
    CHECK_MSG(fabs(r.data_fraction - 0.35) < 1e-9 && strstr(r.bottleneck, "input-bound: replicas waited 35%")
              == r.bottleneck, "data %g: %s", r.data_fraction, r.bottleneck);
    /* 4%: under the default 5%. */
    detect(1, 20, 0, 40, 40, (double[]){0.0004}, &ev, &r);
    CHECK_MSG(ev.input_bound == 0, "4%% reported: %s", ev.message);
    CHECK_MSG(strstr(r.bottleneck, "compute-bound") == r.bottleneck, "%s", r.bottleneck);
    /* Waiting only while the pipeline fills (steps 1-5), 90% of those steps: not input-bound. */
    detect(1, 20, 0, 40, 5, (double[]){0.009}, &ev, &r);
    CHECK_MSG(ev.input_bound == 0 && r.data_fraction == 0.0, "%d events, data %g", ev.input_bound, r.data_fraction);
    /* Two replicas: the slowest one's wait counts (replica 1 waits, replica 0 does not). */
    detect(2, 10, 0, 10, 10, (double[]){0.0, 0.003}, &ev, &r);
    CHECK_MSG(ev.input_bound == 1 && fabs(ev.value - 0.15) < 1e-9, "%d events, %g", ev.input_bound, ev.value);
    /* The threshold is an option: 40% of each step against 50%. */
    detect(1, 20, 0.5, 40, 40, (double[]){0.004}, &ev, &r);
    CHECK_MSG(ev.input_bound == 0 && !strstr(r.bottleneck, "input-bound"), "%s", r.bottleneck);
}

static void test_input_bound(const crew_dataset *d)
{
    /* 20 ms per sample: one thread prepares an 8-sample micro-batch in 160 ms or more (sleeping, so
     * a busy machine only makes it longer), while the light model computes a step in well under a
     * millisecond. The window of 10 steps leaves out the first 5, so the one window measures about
     * half of 10 steps of waiting: far above the 5% threshold unless the model's step took over
     * 100 times its usual time (a sanitizer's build, on a loaded machine, is far from that). 32
     * threads must give the same parameters. */
    crew_augment_options none = {0};
    events one = {0}, many = {0};
    crew_fit_result r1, r2;
    crew_model *a = train(d, 1, 2, 1, none, 0.020, 12, &one, &r1, 10);
    crew_model *b = train(d, 32, 32, 1, none, 0.020, 12, &many, &r2, 10);
    CHECK_MSG(one.input_bound == 1 && one.step == 10, "one slow loader thread: %d input-bound events (data %.0f%%)",
              one.input_bound, 100 * r1.data_fraction);
    CHECK_MSG(strstr(r1.bottleneck, "input-bound") != NULL, "summary: %s", r1.bottleneck);
    CHECK_MSG(mv_equal(a, b), "1 and 32 slow loader threads give different parameters");
    CHECK(r2.steps == 12);
    /* Inline the replica's own thread sleeps those 160 ms a batch: the same verdict, with the
     * remedies of a run that has no loader threads to add. */
    events own = {0};
    crew_fit_result r3;
    crew_model *c = train(d, 0, 2, 1, none, 0.020, 12, &own, &r3, 10);
    CHECK_MSG(own.input_bound == 1 && strstr(own.message, "preparing their own batches") &&
                  strstr(own.message, "--loader-inline off") && !strstr(own.message, "--loader-threads"),
              "inline, slow: %d input-bound events: %s", own.input_bound, own.message);
    CHECK_MSG(mv_equal(a, c), "a slow loader thread and the same work inline give different parameters");
    crew_model_free(a);
    crew_model_free(b);
    crew_model_free(c);
}

static void test_last_batch(const crew_dataset *d)
{
    /* 100 samples, global batch 32: 3 full steps; padding adds a 4th made of 4 leftovers and 28
     * samples from the start of the epoch's order, the same for every replica's slice. */
    crew_loader_options drop = {.threads = 2, .prefetch = 2}, pad = {.threads = 2, .prefetch = 2, .pad_last = 1};
    crew_loader *l = NULL;
    crew_loader_range all4 = {.batch = 8, .micro = 4, .first = 0, .count = 4};
    CHECK_OK(crew_loader_create(d, &drop, &all4, 9, &l));
    CHECK(l && crew_loader_steps_per_epoch(l) == 3);
    crew_loader_free(l);
    CHECK_OK(crew_loader_create(d, &pad, &all4, 9, &l));
    CHECK(l && crew_loader_steps_per_epoch(l) == 4);
    if (!l) return;
    CHECK_OK(crew_loader_start_epoch(l, 0, 0));
    int64_t first[8], seen[100] = {0};
    double wait;
    for (int64_t step = 0; step < 4; step++)
        for (int i = 0; i < 4; i++) {
            crew_loader_batch b;
            CHECK_OK(crew_loader_take(l, 0, step, i, &b, &wait));
            for (int k = 0; k < 8; k++) seen[b.ids[k]]++;
            if (step == 0 && i == 0) memcpy(first, b.ids, sizeof first);
            if (step == 3 && i == 1) CHECK(memcmp(b.ids, first + 4, 4 * sizeof *b.ids) == 0); /* wrapped around */
            crew_loader_release(l, 0, step, i);
        }
    int all = 1, twice = 0;
    for (int k = 0; k < 100; k++) {
        all &= seen[k] >= 1;
        twice += seen[k] == 2;
    }
    CHECK_MSG(all && twice == 28, "every sample once, 28 of them twice: %d", twice);
    crew_loader_free(l);
}

/* reverse_rows (crew verify's rounding reference): each micro-batch holds the same samples, in
 * reverse order, with the matching pixels and labels. */
static void test_reverse_rows(const crew_dataset *d)
{
    enum { B = 8, PX = SYN_SIDE * SYN_SIDE };
    crew_loader_options fwd = {.threads = 2, .prefetch = 2}, rev = {.threads = 1, .prefetch = 3, .reverse_rows = 1};
    crew_loader *a = NULL, *b = NULL;
    crew_loader_range two = {.batch = B, .micro = 2, .first = 0, .count = 2};
    CHECK_OK(crew_loader_create(d, &fwd, &two, 9, &a));
    CHECK_OK(crew_loader_create(d, &rev, &two, 9, &b));
    if (a && b) {
        CHECK_OK(crew_loader_start_epoch(a, 0, 0));
        CHECK_OK(crew_loader_start_epoch(b, 0, 0));
        double wait;
        int same = 1;
        for (int64_t step = 0; step < 3; step++)
            for (int i = 0; i < 2; i++) {
                crew_loader_batch fa, fb;
                CHECK_OK(crew_loader_take(a, 0, step, i, &fa, &wait));
                CHECK_OK(crew_loader_take(b, 0, step, i, &fb, &wait));
                for (int r = 0; r < B; r++)
                    same &= fb.ids[r] == fa.ids[B - 1 - r] && fb.y[r] == fa.y[B - 1 - r] &&
                            memcmp(fb.x + r * PX, fa.x + (B - 1 - r) * PX, PX * sizeof(float)) == 0;
                crew_loader_release(a, 0, step, i);
                crew_loader_release(b, 0, step, i);
            }
        CHECK_MSG(same, "reverse_rows: a micro-batch is not the forward one reversed");
    }
    crew_loader_free(a);
    crew_loader_free(b);
}

/* slot_alloc (a device's pinned staging memory in a run): every slot comes from it and goes back
 * to it, and the batches are the malloc'd loader's, byte for byte. */
typedef struct slot_counter {
    int allocated, freed;
} slot_counter;

static void *count_alloc(void *user, size_t bytes)
{
    ((slot_counter *)user)->allocated++;
    return malloc(bytes);
}

static void count_free(void *user, void *p)
{
    ((slot_counter *)user)->freed++;
    free(p);
}

static void test_slot_memory(const crew_dataset *d)
{
    enum { B = 8, PX = SYN_SIDE * SYN_SIDE };
    slot_counter c = {0};
    crew_loader_options plain = {.threads = 2, .prefetch = 2},
                        staged = {.threads = 2, .prefetch = 3, .slot_alloc = count_alloc, .slot_free = count_free,
                                  .slot_user = &c};
    crew_loader *a = NULL, *b = NULL;
    crew_loader_range two = {.batch = B, .micro = 2, .first = 0, .count = 2};
    CHECK_OK(crew_loader_create(d, &plain, &two, 9, &a));
    CHECK_OK(crew_loader_create(d, &staged, &two, 9, &b));
    CHECK_MSG(c.allocated == 3 * 2 * 3, "%d slot arrays from slot_alloc, want prefetch x count x 3 = 18", c.allocated);
    if (a && b) {
        CHECK_OK(crew_loader_start_epoch(a, 0, 0));
        CHECK_OK(crew_loader_start_epoch(b, 0, 0));
        double wait;
        int same = 1;
        for (int64_t step = 0; step < 4; step++)
            for (int i = 0; i < 2; i++) {
                crew_loader_batch fa, fb;
                CHECK_OK(crew_loader_take(a, 0, step, i, &fa, &wait));
                CHECK_OK(crew_loader_take(b, 0, step, i, &fb, &wait));
                same &= !memcmp(fa.ids, fb.ids, B * sizeof *fa.ids) && !memcmp(fa.y, fb.y, B * sizeof *fa.y) &&
                        !memcmp(fa.x, fb.x, B * PX * sizeof(float));
                crew_loader_release(a, 0, step, i);
                crew_loader_release(b, 0, step, i);
            }
        CHECK_MSG(same, "the loader with slot_alloc gave other batches");
    }
    crew_loader_free(a);
    crew_loader_free(b);
    CHECK_MSG(c.freed == c.allocated, "%d slot arrays allocated, %d freed", c.allocated, c.freed);
}

/* A loader of one micro-batch of 8 a step (seed 9), its first epoch started; NULL (and a failed
 * check) if it could not be made. */
static crew_loader *one_batch_loader(const crew_dataset *d, const crew_loader_options *o)
{
    crew_loader_range one = {.batch = 8, .micro = 1, .first = 0, .count = 1};
    crew_loader *l = NULL;
    CHECK_OK(crew_loader_create(d, o, &one, 9, &l));
    if (l) CHECK_OK(crew_loader_start_epoch(l, 0, 0));
    return l;
}

/* A micro-batch the loader will never fill (its ring is full of steps still held) times out with
 * an error naming it, instead of waiting for ever: a rank that asks for the wrong step. */
static void test_take_deadline(const crew_dataset *d)
{
    crew_loader_options o = {.threads = 1, .prefetch = 2, .timeout_s = 0.2};
    crew_loader *l = one_batch_loader(d, &o);
    if (!l) return;
    crew_loader_batch b;
    double wait;
    CHECK_OK(crew_loader_take(l, 0, 0, 0, &b, &wait)); /* held, never released */
    CHECK_OK(crew_loader_take(l, 0, 1, 0, &b, &wait)); /* the ring's other step, also held */
    crew_status s = crew_loader_take(l, 0, 2, 0, &b, &wait); /* needs step 0's room back */
    CHECK_MSG(crew_status_code(s) == CREW_CODE_TIMEOUT && wait >= 0.2 &&
                  strstr(crew_status_message(s), "micro-batch 0 of step 3 (epoch 1) was not ready within 0.2 s"),
              "a micro-batch that cannot come: %s after %.2f s", crew_status_message(s), wait);
    crew_status_free(s);
    crew_loader_release(l, 0, 0, 0);
    CHECK_OK(crew_loader_take(l, 0, 2, 0, &b, &wait)); /* its room freed, it comes */
    crew_loader_free(l);
}

/* One loader of all 6 micro-batches of a step against three rank loaders of 2 each (ranks × 2
 * accumulation), over two epochs and a resume mid-epoch: the same samples, pixels and labels. A
 * micro-batch outside a loader's range is refused. */
static void test_ranges(const crew_dataset *d, int rank_threads)
{
    enum { B = 4, PX = SYN_SIDE * SYN_SIDE, MICRO = 6 };
    crew_loader_options o = {.threads = 2, .prefetch = 2, .augment = {.crop_padding = 1, .flip = 1}};
    crew_loader_options ro = o;
    ro.threads = rank_threads; /* 0: each rank's take fills its micro-batch (inline) */
    crew_loader *whole = NULL, *rank[3] = {NULL, NULL, NULL};
    crew_loader_range all = {.batch = B, .micro = MICRO, .first = 0, .count = MICRO};
    CHECK_OK(crew_loader_create(d, &o, &all, 7, &whole));
    for (int r = 0; r < 3; r++) {
        crew_loader_range mine = {.batch = B, .micro = MICRO, .first = 2 * r, .count = 2};
        CHECK_OK(crew_loader_create(d, &ro, &mine, 7, &rank[r]));
    }
    crew_loader_range bad = {.batch = B, .micro = MICRO, .first = 5, .count = 2};
    crew_loader *none = NULL;
    CHECK_ERR(crew_loader_create(d, &o, &bad, 7, &none), "not a range of a step");
    if (!whole || !rank[0] || !rank[1] || !rank[2]) return;
    int64_t steps = crew_loader_steps_per_epoch(whole), start = 2; /* as a run resumed at step 2 */
    CHECK_OK(crew_loader_start_epoch(whole, 0, start));
    for (int r = 0; r < 3; r++) CHECK_OK(crew_loader_start_epoch(rank[r], 0, start));
    int same = 1;
    double wait;
    for (int epoch = 0; epoch < 2; epoch++)
        for (int64_t step = epoch ? 0 : start; step < steps; step++)
            for (int i = 0; i < MICRO; i++) {
                crew_loader *mine = rank[i / 2];
                crew_loader_batch w, m;
                CHECK_OK(crew_loader_take(whole, epoch, step, i, &w, &wait));
                CHECK_OK(crew_loader_take(mine, epoch, step, i, &m, &wait));
                same &= memcmp(w.ids, m.ids, B * sizeof *w.ids) == 0 && memcmp(w.y, m.y, B * sizeof *w.y) == 0 &&
                        memcmp(w.x, m.x, B * PX * sizeof *w.x) == 0;
                crew_loader_release(whole, epoch, step, i);
                crew_loader_release(mine, epoch, step, i);
            }
    CHECK_MSG(same, "the rank loaders' micro-batches (%d threads each) differ from one loader's", rank_threads);
    crew_loader_batch b;
    CHECK_ERR(crew_loader_take(rank[0], 2, 0, 3, &b, &wait), "not one of [0, 2)");
    crew_loader_free(whole);
    for (int r = 0; r < 3; r++) crew_loader_free(rank[r]);
}

/* Inline (no producer threads), a take fills its micro-batch, into its step's place in the ring:
 * a place still held by another step, or a micro-batch taken twice, is an error naming them (a
 * producer would wait for ever instead, test_take_deadline), and a stopped loader hands out
 * nothing. */
static void test_inline_take(const crew_dataset *d)
{
    crew_loader_options o = {.threads = 0, .prefetch = 2};
    crew_loader *l = one_batch_loader(d, &o);
    if (!l) return;
    crew_loader_batch b;
    double wait;
    CHECK_OK(crew_loader_take(l, 0, 0, 0, &b, &wait)); /* held, never released */
    CHECK_ERR(crew_loader_take(l, 0, 0, 0, &b, &wait), "micro-batch 0 of step 1 (epoch 1) is taken twice");
    CHECK_OK(crew_loader_take(l, 0, 1, 0, &b, &wait));
    CHECK_ERR(crew_loader_take(l, 0, 2, 0, &b, &wait), "micro-batch 0 of step 3 (epoch 1) needs the place in the "
              "ring of step 1 (epoch 1), whose micro-batches were not all released");
    crew_loader_release(l, 0, 0, 0);
    CHECK_OK(crew_loader_take(l, 0, 2, 0, &b, &wait)); /* its place freed, it comes */
    crew_loader_release(l, 0, 1, 0);
    crew_loader_release(l, 0, 2, 0);
    crew_loader_shutdown(l);
    crew_status s = crew_loader_take(l, 0, 3, 0, &b, &wait);
    CHECK_MSG(crew_status_code(s) == CREW_CODE_CANCELLED, "a stopped inline loader: %s", crew_status_message(s));
    crew_status_free(s);
    crew_loader_free(l);
    o.threads = -1;
    crew_loader_range one = {.batch = 8, .micro = 1, .first = 0, .count = 1};
    CHECK_ERR(crew_loader_create(d, &o, &one, 9, &l), "loader threads must be in [0 (inline), 256], got -1");
}

static void test_augment(void)
{
    crew_shape sh = crew_shape3(3, 3, 1);
    float scratch[9];
    crew_augment flip = {.flip = 1}, crop = {.crop_padding = 1};
    int flipped = 0, shifted = 0;
    for (int64_t id = 0; id < 64; id++) {
        float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, again[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        crew_augment_sample(&flip, &sh, x, scratch, 5, 0, id);
        crew_augment_sample(&flip, &sh, again, scratch, 5, 0, id);
        CHECK(memcmp(x, again, sizeof x) == 0); /* the same key, the same result */
        if (x[0] == 3 && x[2] == 1 && x[4] == 5) flipped++;
        else CHECK(x[0] == 1 && x[8] == 9);
        float c[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        crew_augment_sample(&crop, &sh, c, scratch, 5, 0, id);
        float sum = 0;
        for (int k = 0; k < 9; k++) sum += c[k];
        shifted += sum != 45.0f; /* a shift drops a row or column into the zero padding */
        CHECK(c[4] != 0.0f);     /* the centre always stays inside the image */
    }
    CHECK_MSG(flipped > 16 && flipped < 48, "%d of 64 flipped", flipped);
    CHECK_MSG(shifted > 40, "%d of 64 shifted", shifted);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-loader-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, 100, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        test_independent_of_threads(d);
        test_inputs_in_place(d);
        test_input_bound_detector();
        test_input_bound(d);
        test_last_batch(d);
        test_reverse_rows(d);
        test_slot_memory(d);
        test_take_deadline(d);
        test_ranges(d, 2);
        test_ranges(d, 0);
        test_inline_take(d);
    }
    test_augment();
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
