/* scaling_trial.c — short training runs at one replica count, timed from the step breakdown that
 * rank 0 reports through on_step, and the statistics they are summarised with. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "advise/scaling.h"
#include "core/options.h"
#include "core/status.h"

#define DEFAULT_WARMUP 3
#define DEFAULT_STEPS 20
#define DEFAULT_REPEATS 3

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double crew_scale_median(double *v, int64_t n)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double crew_scale_robust_sigma(double *v, int64_t n)
{
    if (n <= 1) return 0.0;
    double med = crew_scale_median(v, n);
    for (int64_t i = 0; i < n; i++) v[i] = fabs(v[i] - med);
    return 1.4826 * crew_scale_median(v, n);
}

double crew_scale_expected_max(int n)
{
    /* Tabulated for powers of two (Tippett 1925); between them, interpolated in log2(n). */
    static const double table[] = {0.0, 0.5642, 1.0294, 1.4236, 1.7660, 2.0697, 2.3433, 2.5922, 2.8209, 3.0326, 3.2296};
    if (n <= 1) return 0.0;
    double l = log2((double)n);
    int i = (int)l;
    if (i >= 10) return table[10] + 0.2 * (l - 10.0); /* grows like sqrt(2 ln n): slowly */
    return table[i] + (l - i) * (table[i + 1] - table[i]);
}

/* The measured steps of every repeat, one array per field. */
enum { F_STEP, F_DATA, F_COMPUTE, F_EXPOSED, F_HIDDEN, F_OPT, F_OTHER, F_FIELDS };

typedef struct trial_log {
    int64_t warmup;
    int64_t n, cap;
    double *v[F_FIELDS];          /* [cap] each */
    double repeat_samples;        /* samples and seconds of the measured steps of this repeat */
    double repeat_s;
    int64_t global_batch;
    double last_cpu, last_wall;   /* replica 0's thread CPU clock and the wall clock at the last step */
    double last_process;          /* the process's CPU clock at the last step */
    double cpu_s, wall_s;         /* over the measured steps of every repeat */
    double noise[64];             /* each repeat's gradient noise scale (NaN: none) */
    int n_noise;
    double process_s;
    int64_t intervals;            /* steps the clocks were read across */
} trial_log;

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_step(void *user, const crew_step_info *s)
{
    trial_log *t = user;
    /* on_step runs on replica 0's thread: its CPU clock says how much of a core the replica got */
    double cpu = clock_s(CLOCK_THREAD_CPUTIME_ID), wall = clock_s(CLOCK_MONOTONIC), proc = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (s->step > t->warmup + 1)
        t->cpu_s += cpu - t->last_cpu, t->wall_s += wall - t->last_wall, t->process_s += proc - t->last_process,
        t->intervals++;
    t->last_cpu = cpu, t->last_wall = wall, t->last_process = proc;
    if (s->step <= t->warmup || t->n >= t->cap) return;
    double compute = s->forward_s + s->backward_s;
    double parts = s->data_s + compute + s->comm_exposed_s + s->optimizer_s;
    double row[F_FIELDS] = {s->step_s, s->data_s, compute, s->comm_exposed_s, s->comm_hidden_s, s->optimizer_s,
                            s->step_s > parts ? s->step_s - parts : 0.0};
    for (int f = 0; f < F_FIELDS; f++) t->v[f][t->n] = row[f];
    t->n++;
    t->repeat_samples += (double)t->global_batch;
    t->repeat_s += s->step_s;
}

static crew_status run_repeat(crew_model *m, const crew_dataset *train, const crew_scale_options *o, int devices,
                              trial_log *log, double *samples_per_s)
{
    crew_fit_options f;
    crew_model_default_fit(m, &f);
    f.devices = devices;
    f.group = o->group;
    if (o->batch_per_device > 0) f.batch_per_device = o->batch_per_device;
    f.threads_per_device = o->threads_per_device > 0 ? o->threads_per_device : 1;
    f.shard_optimizer = o->shard_optimizer;
    f.device_kind = o->device_kind;
    f.precision = o->precision;
    f.conv = o->conv;
    f.conv_choice = o->conv_choice;
    f.epochs = 1000; /* max_steps ends the run; a small dataset simply wraps into the next epoch */
    f.max_steps = log->warmup + (o->steps > 0 ? o->steps : DEFAULT_STEPS);
    f.drift_check_every = -1;
    f.on_step = on_step;
    f.user = log;
    log->global_batch = (int64_t)devices * crew_group_size(o->group) * f.batch_per_device;
    log->repeat_samples = log->repeat_s = 0.0;
    crew_fit_result r;
    CREW_TRY(crew_model_fit(m, train, &f, &r));
    if (log->n_noise < 64 && isfinite(r.noise_scale)) log->noise[log->n_noise++] = r.noise_scale;
    if (crew_group_rank(o->group) != 0) { /* the steps are reported on process 0 alone */
        *samples_per_s = 0.0;
        return CREW_OK;
    }
    if (log->repeat_s <= 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the trial on %d replica%s measured no step (warm-up %lld steps)",
                           devices, devices == 1 ? "" : "s", (long long)log->warmup);
    *samples_per_s = log->repeat_samples / log->repeat_s;
    return CREW_OK;
}

static void summarise(trial_log *log, const double *rates, int repeats, crew_scale_trial *out)
{
    double sorted[64];
    memcpy(sorted, rates, (size_t)repeats * sizeof *rates);
    out->samples_per_s = crew_scale_median(sorted, repeats);
    out->samples_per_s_lo = sorted[0];
    out->samples_per_s_hi = sorted[repeats - 1];
    double *field[F_FIELDS] = {&out->step_s, &out->data_s, &out->compute_s, &out->comm_exposed_s,
                               &out->comm_hidden_s, &out->optimizer_s, &out->other_s};
    for (int f = 0; f < F_FIELDS; f++) {
        if (f == F_COMPUTE) continue;
        *field[f] = crew_scale_median(log->v[f], log->n);
    }
    out->compute_s = crew_scale_median(log->v[F_COMPUTE], log->n);
    out->compute_jitter_s = crew_scale_robust_sigma(log->v[F_COMPUTE], log->n);
    out->global_batch = log->global_batch;
    out->cpu_share = log->wall_s > 0 ? log->cpu_s / log->wall_s : 1.0;
    if (out->cpu_share > 1.0) out->cpu_share = 1.0;
    /* every replica's thread takes about what replica 0's does; the rest is the helpers' */
    double helpers = log->process_s - out->devices * log->cpu_s;
    out->helper_cpu_s = log->intervals > 0 && helpers > 0 ? helpers / (double)log->intervals / out->devices : 0.0;
    out->speedup = out->efficiency = NAN;
    /* the repeats' gradient noise scales (short runs, each a few measurements): their median */
    out->noise_scale = log->n_noise ? crew_scale_median(log->noise, log->n_noise) : NAN;
}

void crew_scale_options_init(crew_scale_options *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

crew_status crew_scale_measure(crew_model *m, const crew_dataset *train, const crew_scale_options *given, int devices,
                               crew_scale_trial *out)
{
    if (!out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_measure: NULL result");
    memset(out, 0, sizeof *out);
    if (!m || !train || !given) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_scale_measure: NULL argument");
    crew_scale_options opts;
    crew_scale_options_init(&opts);
    CREW_TRY(crew_options_take(&opts, sizeof opts, given, "crew_scale_options"));
    const crew_scale_options *o = &opts;
    int repeats = o->repeats > 0 ? o->repeats : DEFAULT_REPEATS;
    int64_t steps = o->steps > 0 ? o->steps : DEFAULT_STEPS;
    if (repeats > 64 || steps > 100000 || o->warmup_steps < 0 || o->warmup_steps > 100000 || devices < 1 || devices > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "trials take 1 to 64 repeats of 1 to 100000 steps after at most "
                           "100000 warm-up steps, on 1 to 1024 replicas");
    trial_log log = {.warmup = o->warmup_steps > 0 ? o->warmup_steps : DEFAULT_WARMUP, .cap = steps * repeats};
    crew_status s = CREW_OK;
    for (int f = 0; f < F_FIELDS && !s; f++)
        if (!(log.v[f] = calloc((size_t)log.cap, sizeof(double)))) s = CREW_OOM();
    double rates[64];
    for (int r = 0; r < repeats && !s; r++) {
        s = run_repeat(m, train, o, devices, &log, &rates[r]);
        if (!s && o->on_repeat) o->on_repeat(o->user, devices * crew_group_size(o->group), r, rates[r]);
    }
    if (!s) {
        out->devices = devices * crew_group_size(o->group);
        out->repeats = repeats;
        out->steps = log.n / repeats;
        summarise(&log, rates, repeats, out);
    }
    for (int f = 0; f < F_FIELDS; f++) free(log.v[f]);
    return s ? crew_error_prefix(s, "scaling trial on %d replica%s: ", devices, devices == 1 ? "" : "s") : CREW_OK;
}

void crew_scale_analyse(crew_scale_trial *trials, int n)
{
    const crew_scale_trial *one = NULL;
    for (int i = 0; i < n; i++)
        if (trials[i].devices == 1) one = &trials[i];
    for (int i = 0; i < n; i++) {
        if (!one || one->samples_per_s <= 0) {
            trials[i].speedup = trials[i].efficiency = NAN;
            continue;
        }
        trials[i].speedup = trials[i].samples_per_s / one->samples_per_s;
        trials[i].efficiency = trials[i].speedup / trials[i].devices;
    }
}
