/* test_fit_seam.c — the rank/device seam, proven from the training side (docs/ARCHITECTURE.md,
 * "Ranks, devices and launchers"):
 * - training on the guarded device kind, whose memory traps any host access, gives bitwise the
 *   weights of the plain CPU kind, for 1 and 2 ranks, with accumulation, dropout and batch norm;
 *   a run cancelled on one kind resumes on the other bit for bit (on the same rank count: with
 *   batch norm, N ranks share their statistics and one accumulating rank does not);
 * - planted bugs that break the seam are caught by the guard, and go unnoticed without it:
 *   (a) host code reading a parameter straight from device memory (the host_touch_step fault)
 *       kills the run by SIGSEGV on cpu-guarded, and trains on quietly on cpu;
 *   (b) a micro-batch's upload not ordered before the compute that reads it (skip_copy_wait)
 *       changes the weights on cpu-guarded, whose side queues copy only when waited for, and
 *       nothing on cpu, which copies at once;
 * - an unknown device kind is an error that lists the kinds built in. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "fault_hooks.h"
#include "model_values.h"
#include "synthetic.h"
#include "train/hooks.h"

enum { SAMPLES = 256, STEPS = 8 };

/* In a build with -DCREW_GUARD=ON (make guard) kind "cpu" is guarded too: there is no plain kind to
 * show that the planted bugs go unnoticed without the guard. */
#ifdef CREW_GUARD
static const int plain_is_guarded = 1;
#else
static const int plain_is_guarded = 0;
#endif

/* conv → batch norm → relu → pool → dense → dropout → dense: every kind of buffer a step uses. */
static crew_model *small_cnn(void)
{
    crew_model *m = NULL;
    crew_layer_spec layers[] = {
        {.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {3, 3}, .padding = CREW_PAD_SAME},
        {.type = CREW_LAYER_BATCH_NORM},
        {.type = CREW_LAYER_ACTIVATION, .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_MAX_POOL2D},
        {.type = CREW_LAYER_FLATTEN},
        {.type = CREW_LAYER_DENSE, .units = 16, .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_DROPOUT, .rate = 0.25f},
        {.type = CREW_LAYER_DENSE, .units = SYN_CLASSES},
    };
    crew_status s = crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m);
    for (size_t i = 0; !s && i < sizeof layers / sizeof *layers; i++) s = crew_model_add(m, &layers[i]);
    CHECK_OK(s);
    return m;
}

typedef struct run_spec {
    const char *kind;
    int devices;
    int64_t global;             /* global batch; 8 per device */
    const crew_fit_faults *faults;
    const char *checkpoints;    /* checkpoint directory, or NULL */
    int resume;
    int64_t stop_after;         /* cancel after this step (0: run to the end) */
    int epochs;                 /* whole epochs instead of STEPS steps (0: STEPS) */
    int stop_epoch;             /* cancel at the end of this 1-based epoch, from on_epoch (0: not) */
    int64_t steps_done;         /* out: the steps the fit ran */
} run_spec;

typedef struct stopper {
    volatile int cancel;
    int64_t after;
    int epoch;
} stopper;

static void on_step(void *user, const crew_step_info *info)
{
    stopper *st = user;
    if (st->after && info->step == st->after) st->cancel = 1;
}

/* What Keras's EarlyStopping does through crew.fit: the flag set from the epoch's callback. */
static void on_epoch(void *user, const crew_epoch_info *info)
{
    stopper *st = user;
    if (st->epoch && info->epoch + 1 == st->epoch) st->cancel = 1;
}

/* Trains a fresh model as the spec says; returns it (NULL when the fit failed: *status says). */
static crew_model *train(const crew_dataset *d, run_spec *r, crew_status *status)
{
    crew_model *m = small_cnn();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.device_kind = r->kind;
    o.devices = r->devices;
    o.batch_per_device = 8;
    o.global_batch = r->global;
    o.max_steps = STEPS;
    o.epochs = 100;
    o.seed = 11;
    o.drift_check_every = 2;
    o.loader_threads = 2;
    o.checkpoint_dir = r->checkpoints;
    o.resume = r->resume;
    if (r->epochs) o.epochs = r->epochs, o.max_steps = 0;
    stopper st = {.after = r->stop_after, .epoch = r->stop_epoch};
    o.cancel = &st.cancel;
    o.on_step = on_step;
    o.on_epoch = on_epoch;
    o.user = &st;
    crew_fit *f = NULL;
    crew_fit_result res = {0};
    crew_status s = crew_fit_prepare(m, d, &o, &f);
    if (!s && r->faults) fault_hooks_set(f, r->faults);
    if (!s) s = crew_fit_run(f, &res);
    r->steps_done = res.steps;
    crew_fit_free(f);
    *status = s;
    if (s) {
        crew_model_free(m);
        return NULL;
    }
    return m;
}

static crew_model *train_ok(const crew_dataset *d, run_spec *r)
{
    crew_status s;
    crew_model *m = train(d, r, &s);
    CHECK_MSG(!s, "%s:%d, global batch %lld: %s", r->kind, r->devices, (long long)r->global, crew_status_message(s));
    crew_status_free(s);
    return m;
}

static void check_same(const crew_dataset *d, run_spec *a, run_spec *b, const char *what)
{
    crew_model *ma = train_ok(d, a), *mb = train_ok(d, b);
    if (ma && mb) CHECK_MSG(mv_equal(ma, mb), "%s: the weights differ", what);
    crew_model_free(ma);
    crew_model_free(mb);
}

static void test_kinds_agree(const crew_dataset *d)
{
    run_spec plain1 = {.kind = "cpu", .devices = 1, .global = 16};
    run_spec guard1 = {.kind = "cpu-guarded", .devices = 1, .global = 16};
    /* accumulation 2 on each rank */
    run_spec plain2 = {.kind = "cpu", .devices = 2, .global = 32};
    run_spec guard2 = {.kind = "cpu-guarded", .devices = 2, .global = 32};
    check_same(d, &plain1, &guard1, "1 rank, cpu vs cpu-guarded");
    check_same(d, &plain2, &guard2, "2 ranks x 2 micro-batches, cpu vs cpu-guarded");
}

/* A checkpoint directory of a test's own (dir: a mkdtemp template); 0 when none could be made. */
static int temp_dir(char *dir)
{
    if (mkdtemp(dir)) return 1;
    CHECK_MSG(0, "mkdtemp failed");
    return 0;
}

/* The end of a stop-and-resume test: its three runs' models freed, its directory removed. */
static void done_with(const char *dir, crew_model *whole, crew_model *stopped, crew_model *resumed)
{
    crew_model_free(whole);
    crew_model_free(stopped);
    crew_model_free(resumed);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* Cancelled at step 3 on 2 guarded ranks, resumed on 2 plain ranks: the uninterrupted run's bits. */
static void test_resume_across_kinds(const crew_dataset *d)
{
    char dir[] = "/tmp/crew-test-seam-XXXXXX";
    if (!temp_dir(dir)) return;
    run_spec whole = {.kind = "cpu", .devices = 2, .global = 32};
    run_spec first = {.kind = "cpu-guarded", .devices = 2, .global = 32, .checkpoints = dir, .stop_after = 3};
    run_spec rest = {.kind = "cpu", .devices = 2, .global = 32, .checkpoints = dir, .resume = 1};
    crew_model *ref = train_ok(d, &whole), *stopped = train_ok(d, &first), *resumed = train_ok(d, &rest);
    if (ref && resumed) CHECK_MSG(mv_equal(ref, resumed), "cancelled on cpu-guarded:2, resumed on cpu:2: weights differ");
    done_with(dir, ref, stopped, resumed);
}

/* A stop asked for by the epoch's callback ends the run at that epoch's end, before the next
 * epoch's first step, on every replica, with the stop checkpoint of that step; resumed, the run
 * ends with the uninterrupted run's bits. */
static void test_stop_at_epoch_end(const crew_dataset *d)
{
    char dir[] = "/tmp/crew-test-seam-XXXXXX";
    if (!temp_dir(dir)) return;
    const int64_t per_epoch = SAMPLES / 32;
    run_spec whole = {.kind = "cpu", .devices = 2, .global = 32, .epochs = 3};
    run_spec first = {.kind = "cpu", .devices = 2, .global = 32, .checkpoints = dir, .epochs = 3, .stop_epoch = 1};
    run_spec rest = {.kind = "cpu", .devices = 2, .global = 32, .checkpoints = dir, .resume = 1, .epochs = 3};
    crew_model *ref = train_ok(d, &whole), *stopped = train_ok(d, &first);
    CHECK_MSG(first.steps_done == per_epoch, "stopped at the end of epoch 1 after %lld steps, not its %lld",
              (long long)first.steps_done, (long long)per_epoch);
    char path[160];
    snprintf(path, sizeof path, "%s/step-%08lld/COMPLETE", dir, (long long)per_epoch);
    CHECK_MSG(access(path, F_OK) == 0, "no stop checkpoint %s", path);
    crew_model *resumed = train_ok(d, &rest);
    CHECK_MSG(whole.steps_done == rest.steps_done, "the uninterrupted run ended at step %lld, the resumed one at %lld",
              (long long)whole.steps_done, (long long)rest.steps_done);
    if (ref && resumed) CHECK_MSG(mv_equal(ref, resumed), "stopped at an epoch's end and resumed: weights differ");
    done_with(dir, ref, stopped, resumed);
}

/* The signal that ended a child training with the given faults, or 0 when it exited. */
static int child_death(const crew_dataset *d, run_spec *r)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* an expected crash leaves no core file behind */
        signal(SIGSEGV, SIG_DFL);         /* sanitizers would report and exit instead of dying by it */
        crew_status s;
        crew_model *m = train(d, r, &s);
        crew_model_free(m);
        _exit(s ? 3 : 0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

static void test_planted_host_access(const crew_dataset *d)
{
    crew_fit_faults touch = {.slow_rank = -1, .stall_rank = -1, .corrupt_rank = -1, .host_touch_step = 2};
    run_spec guarded = {.kind = "cpu-guarded", .devices = 2, .global = 16, .faults = &touch};
    run_spec plain = {.kind = "cpu", .devices = 2, .global = 16, .faults = &touch};
    int sig = child_death(d, &guarded);
    CHECK_MSG(sig == SIGSEGV, "a host read of device memory on cpu-guarded ended with signal %d, not SIGSEGV", sig);
    if (plain_is_guarded) return;
    sig = child_death(d, &plain);
    CHECK_MSG(sig == 0, "the same read on cpu should go unnoticed, but ended with signal %d", sig);
}

static void test_planted_unordered_copy(const crew_dataset *d)
{
    crew_fit_faults skip = {.slow_rank = -1, .stall_rank = -1, .corrupt_rank = -1, .skip_copy_wait = 1};
    run_spec ref = {.kind = "cpu", .devices = 2, .global = 16};
    run_spec plain = {.kind = "cpu", .devices = 2, .global = 16, .faults = &skip};
    run_spec guarded = {.kind = "cpu-guarded", .devices = 2, .global = 16, .faults = &skip};
    crew_model *r = train_ok(d, &ref), *p = train_ok(d, &plain), *g = train_ok(d, &guarded);
    if (r && p && !plain_is_guarded)
        CHECK_MSG(mv_equal(r, p), "without the wait, the plain CPU kind should still copy in time");
    if (r && g) CHECK_MSG(!mv_equal(r, g), "cpu-guarded: an upload the compute queue never waited for went unnoticed");
    crew_model_free(r);
    crew_model_free(p);
    crew_model_free(g);
}

static void test_unknown_kind(const crew_dataset *d)
{
    run_spec gpu = {.kind = "gpu", .devices = 1, .global = 8};
    crew_status s;
    crew_model *m = train(d, &gpu, &s);
    CHECK(!m && crew_status_code(s) == CREW_CODE_INVALID_ARGUMENT);
    CHECK_MSG(s && strstr(crew_status_message(s), "unknown device kind 'gpu': this build of crew has cpu, cpu-guarded"),
              "%s", crew_status_message(s));
    crew_status_free(s);
    char kind[16];
    int n = 0;
    CHECK_OK(crew_devices_parse("cpu-guarded:3", kind, sizeof kind, &n));
    CHECK(strcmp(kind, "cpu-guarded") == 0 && n == 3);
#ifdef CREW_HAVE_CUDA
    /* a build with the CUDA kind: cuda:N parses; without a GPU it has no device to open */
    CHECK_OK(crew_devices_parse("cuda:2", kind, sizeof kind, &n));
    CHECK(strcmp(kind, "cuda") == 0 && n == 2);
    if (crew_cuda_device_count() == 0) {
        CHECK_ERR(crew_devices_parse("cuda", kind, sizeof kind, &n), "no device of that kind is available");
        run_spec cuda = {.kind = "cuda", .devices = 1, .global = 8};
        m = train(d, &cuda, &s);
        CHECK_MSG(!m && s && strstr(crew_status_message(s), "no CUDA GPU visible"), "%s",
                  s ? crew_status_message(s) : "trained on cuda without a GPU");
        crew_status_free(s);
        crew_model_free(m);
    }
#else
    CHECK_ERR(crew_devices_parse("cuda:2", kind, sizeof kind, &n), "unknown device kind 'cuda'");
#endif
    CHECK_ERR(crew_devices_parse("cpu:0", kind, sizeof kind, &n), "takes N in [1, 1024]");
}

/* Which communicator a plan picks (crew_fit_options.communicator): NCCL only where the kind has it
 * and every replica has a GPU of its own; the host's otherwise, and asking for NCCL where it
 * cannot be is an error saying why. */
static void test_communicator_plan(const crew_dataset *d)
{
    crew_model *m = small_cnn();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = 2;
    o.batch_per_device = 8;
    crew_fit_plan p;
    CHECK_OK(crew_model_plan_fit(m, d, &o, &p));
    CHECK_MSG(!p.nccl, "cpu:2 planned NCCL");
    o.communicator = CREW_COMMUNICATOR_NCCL;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &p), "--comm nccl on cpu:2: its device kind has no NCCL");
    o.communicator = 7;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &p), "communicator 7: expected auto, host or nccl");
#if defined(CREW_HAVE_CUDA) && defined(CREW_HAVE_NCCL)
    o.device_kind = "cuda";
    o.communicator = CREW_COMMUNICATOR_AUTO;
    CHECK_OK(crew_model_plan_fit(m, d, &o, &p));
    const int gpus = crew_cuda_device_count();
    CHECK_MSG(p.nccl == (gpus >= 2), "cuda:2 with %d GPUs: nccl %d", gpus, p.nccl);
    o.communicator = CREW_COMMUNICATOR_HOST;
    CHECK_OK(crew_model_plan_fit(m, d, &o, &p));
    CHECK_MSG(!p.nccl, "--comm host planned NCCL");
    o.communicator = CREW_COMMUNICATOR_NCCL;
    o.pipeline_stages = 2;
    CHECK_ERR(crew_model_plan_fit(m, d, &o, &p), "a pipeline's stages talk through the host's communicator");
    o.pipeline_stages = 0;
    if (gpus == 0) CHECK_ERR(crew_model_plan_fit(m, d, &o, &p), "no GPU is visible");
    if (gpus == 1) CHECK_ERR(crew_model_plan_fit(m, d, &o, &p), "more replicas than GPUs");
#endif
    crew_model_free(m);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-seam-data-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (plain_is_guarded) printf("kind cpu is guarded in this build: the plain-backend halves are left out\n");
    if (d) {
        test_kinds_agree(d);
        test_resume_across_kinds(d);
        test_stop_at_epoch_end(d);
        test_planted_host_access(d);
        test_planted_unordered_copy(d);
        test_unknown_kind(d);
        test_communicator_plan(d);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
