/* cmd_scale.c — crew scale MODEL.json --data DIR --devices KIND:1,2[,...] [options] */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew scale MODEL.json --data DIR --devices KIND:1,2[,...] [options]\n"
    "\n"
    "Runs short training trials at each replica count (warm-up steps excluded, repeated), fits a\n"
    "cost model to them (compute per replica, data waiting, all-reduce as alpha + 2(N-1)/N S/beta\n"
    "with S the gradient bytes), projects throughput to larger counts and to another link, and\n"
    "says how many devices are worth it: one when one device trains the epochs within --worth-it,\n"
    "else the largest count whose projected efficiency stays at or above 75%, with the reason\n"
    "scaling stalls beyond it.\n"
    "\n"
    "  --data DIR               dataset directory (its training split sizes the epochs)\n"
    "  --devices KIND:1,2,...   replica counts to measure on that kind of device [cpu:1,2]; on a\n"
    "                           GPU kind the link between two devices is measured as a run would\n"
    "                           cross it (NCCL, or host copies) and so are the host<->device copies\n"
    "  --precision fp32|bf16    the trials' GEMMs (crew train --precision) [fp32]\n"
    "  --conv auto|im2col|library|WAY,...  the trials' convolutions (crew train --conv) [auto]\n"
    "  --batch-per-device B     samples per replica per step [model file's, else 32]\n"
    "  --steps K                measured steps per repeat [20]\n"
    "  --warmup K               steps run before measuring [3]\n"
    "  --repeats R              repeats per count; the median is reported with the spread [3]\n"
    "  --epochs E               epochs the time estimate is for [model file's, else 1]\n"
    "  --link RATE              project also to devices joined by this link: 25Gbit, 100Gbit/s,\n"
    "                           450GB/s (bit or B, decimal prefixes; KiB/MiB/GiB binary)\n"
    "  --latency T              that link's latency per all-reduce: 5us, 0.2ms [5us]\n"
    "  --worth-it T             one device is enough when it trains E epochs within T: 90s, 30m,\n"
    "                           1h, 2d [1h]\n"
    "  --project 1,2,4,...      counts to project to [1,2,4,8,16,32,64]\n"
    "  --price P                what a device-hour costs (2.50/h, 0.04/min): the projection says\n"
    "                           what each count's run costs, beside its device-hours\n"
    "  --from RUN_DIR           the gradient noise scale of that run (its metrics.jsonl; crew train\n"
    "                           measures it): the projection says what each count's global batch is\n"
    "                           worth in progress, the time to the asked epochs' result, and up to\n"
    "                           which count more devices cut it; without --from the trials' own\n"
    "                           (short, so rough) measurement is used when there is one\n"
    "  --json                   end with one JSON line (docs/ADVISOR.md)\n"
    "\n"
    "Under mpirun (mpirun -np P crew scale ...) the trials are process 0 alone and all P processes\n"
    "with one replica each, the MPI link between them is measured (latency and bandwidth of its\n"
    "all-reduce), the cost model is fitted to it and projects more processes over it; process 0\n"
    "prints the one verdict.\n";

#define MAX_COUNTS 32

typedef struct scale_args {
    const char *model, *data;
    int counts[MAX_COUNTS], n_counts;
    int project[MAX_COUNTS], n_project;
    int64_t batch, steps, warmup, repeats, epochs;
    int have_link, json;
    crew_link link;
    const char *link_label;     /* the projection's second column: "devices joined by the --link" */
    int mpi_processes;          /* under mpirun: the processes, and `link` is their measured MPI link */
    double worth_it_s;
    double price_per_hour;      /* per device-hour, --price; 0: none given */
    char kind[32];              /* the devices' kind, --devices KIND:... */
    int precision;
    cli_conv conv;              /* as given; cli_scale puts the ways --conv auto measured in conv.ways */
    const char *from;           /* --from RUN_DIR: the run whose gradient noise scale to project with */
} scale_args;

/* "1,2,4" into out (ascending, distinct, each in [1, 1024]). */
static int parse_counts(const char *flag, const char *text, int *out, int *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 1024 || (*end && *end != ',') || *n == MAX_COUNTS ||
            (*n && v <= out[*n - 1])) {
            cli_usage_error("scale", "%s takes ascending counts in [1, 1024] separated by commas (at most %d), got '%s'",
                            flag, MAX_COUNTS, text);
            return 0;
        }
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) cli_usage_error("scale", "%s needs at least one count", flag);
    return *n > 0;
}

/* A number followed by a unit from the table; returns 0 when the text is not one. */
typedef struct unit { const char *suffix; double factor; } unit;
static int parse_with_units(const char *text, const unit *units, size_t n_units, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !isfinite(v) || v <= 0) return 0;
    for (size_t i = 0; i < n_units; i++)
        if (!strcmp(end, units[i].suffix)) {
            *out = v * units[i].factor;
            return 1;
        }
    return 0;
}

/* Bytes per second: "25Gbit", "25Gb/s", "100Gbit/s", "450GB/s", "1.5GiB/s". */
static int parse_rate(const char *text, double *out)
{
    static const char *const prefixes[] = {"", "K", "M", "G", "T"};
    unit units[5 * 10];
    char names[5 * 10][16];
    size_t n = 0;
    for (int p = 0; p < 5; p++) {
        double dec = pow(1e3, p), bin = pow(1024.0, p);
        const char *forms[10] = {"bit", "bit/s", "b/s", "bps", "B/s", "Bps", "iB/s", "ibit/s", "b", "B"};
        double factors[10] = {dec / 8, dec / 8, dec / 8, dec / 8, dec, dec, bin, bin / 8, dec / 8, dec};
        for (int f = 0; f < 10; f++) {
            if (p == 0 && (f == 6 || f == 7)) continue;
            snprintf(names[n], sizeof names[n], "%s%s", prefixes[p], forms[f]);
            units[n] = (unit){names[n], factors[f]};
            n++;
        }
    }
    return parse_with_units(text, units, n, out);
}

static int parse_time(const char *text, double *out)
{
    static const unit units[] = {{"", 1}, {"s", 1}, {"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"m", 60},
                                 {"min", 60}, {"h", 3600}, {"d", 86400}};
    return parse_with_units(text, units, sizeof units / sizeof units[0], out);
}

static int parse_devices(const char *verb, const char *v, void *args)
{
    scale_args *a = args;
    const char *colon = strchr(v, ':');
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof a->kind) {
        cli_usage_error(verb, "--devices takes KIND:1,2,... (cpu:1,2), got '%s'", v);
        return 0;
    }
    snprintf(a->kind, sizeof a->kind, "%.*s", (int)(colon - v), v);
    crew_status s = crew_device_kind_about(a->kind, NULL, NULL);
    if (s) {
        cli_usage_error(verb, "--devices %s: %s", v, crew_status_message(s));
        crew_status_free(s);
        return 0;
    }
    return parse_counts("--devices", colon + 1, a->counts, &a->n_counts);
}

static int parse_project(const char *verb, const char *v, void *args)
{
    (void)verb;
    scale_args *a = args;
    return parse_counts("--project", v, a->project, &a->n_project);
}

static int parse_link(const char *verb, const char *v, void *args)
{
    scale_args *a = args;
    if (!parse_rate(v, &a->link.bytes_per_s)) {
        cli_usage_error(verb, "--link takes a rate such as 25Gbit, 100Gbit/s or 450GB/s, got '%s'", v);
        return 0;
    }
    a->have_link = 1;
    return 1;
}

static int parse_latency(const char *verb, const char *v, void *args)
{
    scale_args *a = args;
    if (parse_time(v, &a->link.alpha_s) && a->link.alpha_s <= 10) return 1;
    cli_usage_error(verb, "--latency takes a time such as 5us or 0.2ms, got '%s'", v);
    return 0;
}

static int parse_worth_it(const char *verb, const char *v, void *args)
{
    if (parse_time(v, &((scale_args *)args)->worth_it_s)) return 1;
    cli_usage_error(verb, "--worth-it takes a time such as 90s, 30m, 1h or 2d, got '%s'", v);
    return 0;
}

/* "2.50/h", "$2.5", "0.04/min", "0.0007/s": a price per device and time, into one per hour. */
static int parse_price(const char *verb, const char *v, void *args)
{
    scale_args *a = args;
    const char *p = v[0] == '$' ? v + 1 : v;
    char *end = NULL;
    errno = 0;
    double x = strtod(p, &end);
    double per = 1.0; /* hours per unit of the suffix */
    if (end && (!strcmp(end, "") || !strcmp(end, "/h") || !strcmp(end, "/hour")))
        per = 1.0;
    else if (end && (!strcmp(end, "/min") || !strcmp(end, "/m")))
        per = 1.0 / 60.0;
    else if (end && !strcmp(end, "/s"))
        per = 1.0 / 3600.0;
    else
        end = NULL;
    if (!end || end == p || errno || !(x > 0.0 && x < 1e9)) {
        cli_usage_error(verb, "--price takes a price per device-hour such as 2.50/h, 0.04/min or 2.5, got '%s'", v);
        return 0;
    }
    a->price_per_hour = x / per;
    return 1;
}

static int parse_conv(const char *verb, const char *v, void *args)
{
    return cli_parse_conv(verb, v, &((scale_args *)args)->conv);
}

static const cli_flag_spec scale_flags[] = {
    CLI_SWITCH_FLAG(scale_args, "--json", json),
    CLI_STRING_FLAG(scale_args, "--data", data),
    CLI_STRING_FLAG(scale_args, "--from", from),
    CLI_CUSTOM_FLAG("--devices", parse_devices),
    CLI_CHOICE_FLAG(scale_args, "--precision", precision, cli_precisions),
    CLI_CUSTOM_FLAG("--conv", parse_conv),
    CLI_CUSTOM_FLAG("--project", parse_project),
    CLI_INT_FLAG(scale_args, "--batch-per-device", batch, 1, 1 << 20),
    CLI_INT_FLAG(scale_args, "--steps", steps, 1, 100000),
    CLI_INT_FLAG(scale_args, "--warmup", warmup, 0, 100000),
    CLI_INT_FLAG(scale_args, "--repeats", repeats, 1, 64),
    CLI_INT_FLAG(scale_args, "--epochs", epochs, 1, 1000000),
    CLI_CUSTOM_FLAG("--link", parse_link),
    CLI_CUSTOM_FLAG("--latency", parse_latency),
    CLI_CUSTOM_FLAG("--worth-it", parse_worth_it),
    CLI_CUSTOM_FLAG("--price", parse_price),
};

/* Returns 0 to go on, -1 after --help, or the exit status. */
static int parse_args(int argc, char **argv, scale_args *a)
{
    memset(a, 0, sizeof *a);
    a->counts[0] = 1, a->counts[1] = 2, a->n_counts = 2;
    static const int project[] = {1, 2, 4, 8, 16, 32, 64};
    memcpy(a->project, project, sizeof project);
    a->n_project = 7;
    a->link.alpha_s = 5e-6;
    a->worth_it_s = 3600;
    a->link_label = "devices joined by the --link";
    snprintf(a->kind, sizeof a->kind, "cpu");
    int parsed = cli_parse_args("scale", usage_text, scale_flags, CLI_COUNT(scale_flags), argc, argv, a, &a->model);
    if (parsed) return parsed;
    if (!a->model) return cli_usage_error("scale", "missing MODEL.json");
    if (!a->data) return cli_usage_error("scale", "missing --data DIR");
    return 0;
}

/* ---- output */

/* The FLOP rate of a trial, and its fraction of the peak of its replicas (one device's measured
 * GEMM rate each, as many as have a core of their own). */
typedef struct flop_rates {
    double per_sample;      /* crew_model_flops: total */
    double device_peak;     /* GFLOP/s of one device; 0: not measured */
    int cores;
} flop_rates;

static double trial_gflops(const flop_rates *fr, const crew_scale_trial *t)
{
    return fr->per_sample * t->samples_per_s / 1e9;
}

static double trial_peak_fraction(const flop_rates *fr, const crew_scale_trial *t)
{
    int own = t->devices < fr->cores ? t->devices : fr->cores;
    return fr->device_peak > 0 ? trial_gflops(fr, t) / (fr->device_peak * (own > 0 ? own : 1)) : NAN;
}

static void print_trials(const crew_scale_trial *t, int n, const flop_rates *fr)
{
    printf("\n%7s %12s %11s %8s %8s %10s %8s %8s %8s %7s %8s %8s %7s %7s %7s\n", "devices", "global batch",
           "samples/s", "GFLOP/s", "of peak", "spread", "speedup", "efficiency", "step ms", "data", "compute", "exposed",
           "hidden", "update", "other");
    for (int i = 0; i < n; i++) {
        double spread = 100 * (t[i].samples_per_s_hi - t[i].samples_per_s_lo) / t[i].samples_per_s;
        printf("%7d %12lld %11.0f %8.1f %7.0f%% %7.1f%% %8.2f %9.0f%% %8.2f %7.2f %8.2f %8.2f %7.2f %7.2f %7.2f\n",
               t[i].devices, (long long)t[i].global_batch, t[i].samples_per_s, trial_gflops(fr, &t[i]),
               100 * trial_peak_fraction(fr, &t[i]), spread, t[i].speedup, 100 * t[i].efficiency, 1e3 * t[i].step_s,
               1e3 * t[i].data_s, 1e3 * t[i].compute_s, 1e3 * t[i].comm_exposed_s, 1e3 * t[i].comm_hidden_s,
               1e3 * t[i].optimizer_s, 1e3 * t[i].other_s);
    }
    printf("(samples/s: the median of the repeats; GFLOP/s: %.3g GFLOP per sample (dense and convolution layers,\n"
           " forward and backward) at that rate; of peak: of %.1f GFLOP/s, one device's measured GEMM rate, per replica\n"
           " with a core of its own; spread: slowest to fastest repeat; times: medians per step of replica 0, in ms;\n"
           " compute = forward + backward; exposed/hidden: all-reduce after/during backward)\n",
           fr->per_sample / 1e9, fr->device_peak);
}

/* unit: what the replicas share, "cores" or a GPU kind's "devices" */
static void print_model(const crew_scale_model *cm, const char *link_name, const char *unit)
{
    printf("\ncost model: step(N) = compute / speed(N) + data + (1 - h)(alpha + 2(N-1)/N S/beta) + alpha [+ sync(N)]\n");
    printf("  compute %.2f ms per replica per step (forward, backward, update), data wait %.2f ms,\n",
           1e3 * cm->compute_s, 1e3 * cm->data_s);
    printf("  S = %.2f MB of gradients, hidden behind the backward pass h = %.0f%%; on devices of their own\n"
           "  sync(N) = jitter x E[max of N normals] with a compute jitter of %.2f ms\n", cm->gradient_bytes / 1e6,
           100 * cm->hidden_fraction, 1e3 * cm->jitter_s);
    printf("  %s: alpha = %.1f us, beta = %.2f GB/s (%s)\n", link_name, 1e6 * cm->link.alpha_s,
           cm->link.bytes_per_s / 1e9, cm->link_note);
    printf("  this machine: %d %s; speed(%d) = %.0f%%: %d replicas in lockstep each step at that fraction of one\n"
           "  alone (%s; it holds the waits for the slowest); beyond %d they take turns\n", cm->cores, unit, cm->cores,
           100 * cm->parallel_speed, cm->cores,
           cm->speed_fitted ? "fitted to the trials" : !strcmp(unit, "cores") ? "lockstep probe" : "not measured",
           cm->cores);
}

/* One projected count's columns; price_per_hour 0: no cost column. */
static void print_point(const crew_scale_point *p, double price_per_hour, int noise)
{
    char d[32];
    double hours = p->devices * p->epochs_s / 3600.0;
    printf(" %11.0f %5.0f%% %9.2f %9s %9.3g", p->samples_per_s, 100 * p->efficiency, 1e3 * p->step_s,
           crew_format_duration(p->epochs_s, d, sizeof d), hours);
    if (price_per_hour > 0) printf(" %9.2f", hours * price_per_hour);
    if (noise)
        printf(" %6.2f %7.0f %9s", p->statistical_efficiency, p->goodput,
               crew_format_duration(p->to_target_s, d, sizeof d));
}

static void print_projection(const scale_args *a, const crew_scale_model *cm, int64_t samples)
{
    printf("\nprojection (per-device batch %lld; %lld epoch%s of %lld samples; evaluation not included):\n",
           (long long)cm->batch_per_device, (long long)a->epochs, a->epochs == 1 ? "" : "s", (long long)samples);
    const int price = a->price_per_hour > 0;
    const int noise = cm->noise_scale > 0;
    const int width = 48 + (price ? 10 : 0) + (noise ? 24 : 0);
    printf("%7s | %-*s", "", width, "this machine");
    if (a->have_link) printf(" | %s", a->link_label);
    printf("\n%7s |", "devices");
    for (int block = 0; block < 1 + a->have_link; block++) {
        printf("%s %11s %6s %9s %9s %9s", block ? " |" : "", "samples/s", "eff", "step ms", "time", "dev-hours");
        if (price) printf(" %9s", "cost");
        if (noise) printf(" %6s %7s %9s", "E(M)", "goodput", "to result");
    }
    printf("\n");
    for (int i = 0; i < a->n_project; i++) {
        crew_scale_point p, q;
        crew_scale_predict(cm, NULL, a->project[i], samples, (int)a->epochs, &p);
        printf("%7d |", p.devices);
        print_point(&p, price ? a->price_per_hour : 0, noise);
        if (a->have_link) {
            crew_scale_predict(cm, &a->link, a->project[i], samples, (int)a->epochs, &q);
            printf(" |");
            print_point(&q, price ? a->price_per_hour : 0, noise);
        }
        printf("\n");
    }
    printf("(dev-hours: devices x time%s; this machine: %d cores shared by the replicas, beyond them they take turns",
           price ? ", cost: dev-hours x --price" : "", cm->cores);
    if (a->have_link)
        printf("; --link: %.2f GB/s, %.1f us latency, every device computing like one replica here", a->link.bytes_per_s / 1e9,
               1e6 * a->link.alpha_s);
    if (noise)
        printf(";\n E(M): what a sample at that global batch M is worth in progress against one at %lld, (B + %lld) / "
               "(B + M) with B the noise scale; goodput: samples/s x E(M); to result: the time to the progress the "
               "epochs make at %lld, a conservative figure: against real runs B_simple understated what a larger "
               "batch is worth, docs/ADVISOR.md", (long long)cm->noise_batch, (long long)cm->noise_batch, (long long)cm->noise_batch);
    printf(")\n");
}

static void json_num(const char *key, double v, int comma)
{
    char b[32];
    printf("\"%s\":%s%s", key, cli_json_number(v, b, sizeof b), comma ? "," : "");
}

static void print_json_trials(const crew_scale_trial *t, int n, const flop_rates *fr)
{
    printf("\"trials\":[");
    for (int i = 0; i < n; i++) {
        printf("%s{\"devices\":%d,\"global_batch\":%lld,\"repeats\":%d,\"steps\":%lld,", i ? "," : "", t[i].devices,
               (long long)t[i].global_batch, t[i].repeats, (long long)t[i].steps);
        json_num("samples_per_s", t[i].samples_per_s, 1);
        json_num("samples_per_s_lo", t[i].samples_per_s_lo, 1);
        json_num("samples_per_s_hi", t[i].samples_per_s_hi, 1);
        json_num("gflops", trial_gflops(fr, &t[i]), 1);
        json_num("peak_fraction", trial_peak_fraction(fr, &t[i]), 1);
        json_num("speedup", t[i].speedup, 1);
        json_num("efficiency", t[i].efficiency, 1);
        json_num("step_s", t[i].step_s, 1);
        json_num("data_s", t[i].data_s, 1);
        json_num("compute_s", t[i].compute_s, 1);
        json_num("comm_exposed_s", t[i].comm_exposed_s, 1);
        json_num("comm_hidden_s", t[i].comm_hidden_s, 1);
        json_num("optimizer_s", t[i].optimizer_s, 1);
        json_num("other_s", t[i].other_s, 1);
        json_num("compute_jitter_s", t[i].compute_jitter_s, 0);
        printf("}");
    }
    printf("],");
}

static void print_json_point(const crew_scale_point *p, double price_per_hour)
{
    printf("{\"devices\":%d,\"global_batch\":%lld,", p->devices, (long long)p->global_batch);
    double hours = p->devices * p->epochs_s / 3600.0;
    json_num("device_hours", hours, 1);
    json_num("cost", price_per_hour > 0 ? hours * price_per_hour : NAN, 1);
    json_num("samples_per_s", p->samples_per_s, 1);
    json_num("speedup", p->speedup, 1);
    json_num("efficiency", p->efficiency, 1);
    json_num("step_s", p->step_s, 1);
    json_num("comm_s", p->comm_s, 1);
    json_num("sync_s", p->sync_s, 1);
    json_num("shared_cores_s", p->shared_cores_s, 1);
    json_num("statistical_efficiency", p->statistical_efficiency, 1);
    json_num("goodput", p->goodput, 1);
    json_num("to_target_s", p->to_target_s, 1);
    json_num("to_target_steps", p->to_target_steps, 1);
    json_num("epochs_s", p->epochs_s, 0);
    printf("}");
}

/* The layouts of this machine's cores: replicas against BLAS threads at one global batch. */
static void print_layouts(const crew_layout_choice *c, int cores)
{
    if (c->n < 2) return;
    printf("\nlayouts of the %d cores at a global batch of %lld (crew train --layout auto takes the fastest; the "
           "last bits differ between them):\n", cores, (long long)(c->trials[0].batch_per_device * c->trials[0].replicas));
    for (int i = 0; i < c->n; i++) {
        const crew_layout_trial *t = &c->trials[i];
        const int shard_wins = c->shard_optimizer && c->shard_speedup > c->speedup;
        const int fastest = t->shard_optimizer ? shard_wins : !shard_wins && t->replicas == c->replicas;
        printf("  %3d replica%s x %2d BLAS thread%s%s, batch %5lld per device: %9.0f samples/s (%.2fx)%s\n",
               t->replicas, t->replicas == 1 ? " " : "s", t->threads_per_device, t->threads_per_device == 1 ? " " : "s",
               t->shard_optimizer ? ", optimizer sharded" : "", (long long)t->batch_per_device, t->samples_per_s,
               t->samples_per_s / c->trials[0].samples_per_s, fastest ? "  fastest" : "");
    }
}

static void print_json_layouts(const crew_layout_choice *c)
{
    printf("\"layouts\":[");
    for (int i = 0; i < c->n; i++) {
        printf("%s{\"replicas\":%d,\"threads_per_device\":%d,\"shard_optimizer\":%d,\"batch_per_device\":%lld,",
               i ? "," : "", c->trials[i].replicas, c->trials[i].threads_per_device, c->trials[i].shard_optimizer,
               (long long)c->trials[i].batch_per_device);
        json_num("samples_per_s", c->trials[i].samples_per_s, 0);
        printf("}");
    }
    printf("],");
}

static void print_json(const scale_args *a, const crew_scale_trial *t, int n, const flop_rates *fr,
                       const crew_scale_model *cm, int64_t samples, const crew_scale_advice *adv,
                       const crew_scale_advice *here, const crew_layout_choice *layouts, const char *noise_source)
{
    printf("{\"model\":");
    crew_json_write_string(stdout, a->model);
    printf(",\"data\":");
    crew_json_write_string(stdout, a->data);
    printf(",\"batch_per_device\":%lld,\"train_samples\":%lld,\"epochs\":%lld,\"gradient_bytes\":%lld,",
           (long long)cm->batch_per_device, (long long)samples, (long long)a->epochs, (long long)cm->gradient_bytes);
    print_json_trials(t, n, fr);
    print_json_layouts(layouts);
    if (a->mpi_processes) {
        printf("\"mpi\":{\"processes\":%d,", a->mpi_processes);
        json_num("alpha_s", a->link.alpha_s, 1);
        json_num("bytes_per_s", a->link.bytes_per_s, 0);
        printf("},");
    } else {
        printf("\"mpi\":null,");
    }
    printf("\"cost_model\":{");
    json_num("compute_s", cm->compute_s, 1);
    json_num("data_s", cm->data_s, 1);
    json_num("jitter_s", cm->jitter_s, 1);
    json_num("hidden_fraction", cm->hidden_fraction, 1);
    json_num("alpha_s", cm->link.alpha_s, 1);
    json_num("bytes_per_s", cm->link.bytes_per_s, 1);
    json_num("parallel_speed", cm->parallel_speed, 1);
    printf("\"speed_fitted\":%d,\"cores\":%d,\"link_fitted\":%d,\"link_note\":", cm->speed_fitted, cm->cores,
           cm->link_fitted);
    crew_json_write_string(stdout, cm->link_note);
    printf("},\"projection\":[");
    for (int i = 0; i < a->n_project; i++) {
        crew_scale_point p;
        crew_scale_predict(cm, NULL, a->project[i], samples, (int)a->epochs, &p);
        printf("%s", i ? "," : "");
        print_json_point(&p, a->price_per_hour);
    }
    printf("],\"link_projection\":[");
    for (int i = 0; a->have_link && i < a->n_project; i++) {
        crew_scale_point p;
        crew_scale_predict(cm, &a->link, a->project[i], samples, (int)a->epochs, &p);
        printf("%s", i ? "," : "");
        print_json_point(&p, a->price_per_hour);
    }
    printf("],\"recommended_devices\":%d,", adv->recommended_devices);
    json_num("one_device_s", adv->one_device_s, 1);
    json_num("recommended_s", adv->recommended_s, 1);
    printf("\"reason\":");
    crew_json_write_string(stdout, adv->reason);
    printf(",\"stall_devices\":%d,\"stall\":", adv->stall_devices);
    crew_json_write_string(stdout, adv->stall);
    printf(",\"machine_stall_devices\":%d,\"machine_stall\":", here->stall_devices);
    crew_json_write_string(stdout, here->stall);
    printf(",");
    json_num("noise_scale", cm->noise_scale, 1);
    printf("\"noise_batch\":%lld,\"noise_source\":", (long long)cm->noise_batch);
    crew_json_write_string(stdout, noise_source);
    printf(",\"goodput_devices\":%d,", adv->goodput_devices);
    json_num("goodput_s", adv->goodput_s, 1);
    printf("\"pays_until_devices\":%d,\"goodput_reason\":", adv->pays_until_devices);
    crew_json_write_string(stdout, adv->goodput_reason);
    printf("}\n");
}

/* ---- the run */

#define TRY(expr)                  \
    do {                           \
        crew_status try_s_ = (expr); \
        if (try_s_) return try_s_; \
    } while (0)

static void on_repeat(void *user, int devices, int repeat, double samples_per_s)
{
    (void)user;
    fprintf(stderr, "  %d replica%s, repeat %d: %.0f samples/s\n", devices, devices == 1 ? "" : "s", repeat + 1,
            samples_per_s);
}

/* Process 0's outcome s of `what`, told to the group's others (waiting up to timeout_s): every
 * process returns an error when it failed, process 0 its own. */
static crew_status share_outcome(const crew_process_group *g, const char *what, crew_status s, double timeout_s)
{
    char how[200] = "ok";
    if (s) snprintf(how, sizeof how, "failed: %.180s", crew_status_message(s));
    crew_status agreed = crew_group_agree(g, what, how, timeout_s);
    if (s) {
        crew_status_free(agreed);
        return s;
    }
    return agreed;
}

/* Under mpirun: the trial of process 0 alone (the others wait for it, then learn how it went),
 * and the trial of every process with one replica each. */
static crew_status measure_processes(const crew_scale_options *o, const crew_process_group *g, crew_model *m,
                                     crew_dataset *train, crew_scale_trial *t)
{
    crew_status s = CREW_OK;
    if (crew_group_rank(g) == 0) s = crew_scale_measure(m, train, o, 1, &t[0]);
    TRY(share_outcome(g, "the trial of process 0 alone", s, 3600.0));
    crew_scale_options across = *o;
    across.group = g;
    return crew_scale_measure(m, train, &across, 1, &t[1]);
}

/* The devices the replicas share: a GPU kind's GPUs, else this machine's cores. */
static int shared_devices(const char *kind, int *own_memory)
{
    int available = 0;
    crew_status s = crew_device_kind_about(kind, &available, own_memory);
    crew_status_free(s);
    return *own_memory ? available : crew_cpu_cores();
}

static crew_status measure(const scale_args *a, crew_model *m, crew_dataset *train, const crew_process_group *g,
                           crew_scale_trial *t, crew_scale_model *cm, crew_link *mpi_link, crew_link copies[2])
{
    crew_scale_options o;
    crew_scale_options_init(&o);
    o.batch_per_device = a->batch;
    o.warmup_steps = a->warmup;
    o.steps = a->steps;
    o.repeats = (int)a->repeats;
    o.threads_per_device = 1;
    o.on_repeat = crew_group_rank(g) == 0 ? on_repeat : NULL;
    o.device_kind = a->kind;
    o.precision = a->precision;
    o.conv = a->conv.way >= 0 ? a->conv.way : CREW_CONV_AUTO;
    o.conv_choice = a->conv.ways[0] ? a->conv.ways : NULL;
    int own_memory = 0, cores = shared_devices(a->kind, &own_memory);
    if (g) {
        TRY(measure_processes(&o, g, m, train, t));
        TRY(crew_scale_measure_group_link(g, crew_model_param_count(m) * (int64_t)sizeof(float), mpi_link));
        if (crew_group_rank(g) != 0) return CREW_OK; /* the figures and the verdict are process 0's */
    } else {
        for (int i = 0; i < a->n_counts; i++) TRY(crew_scale_measure(m, train, &o, a->counts[i], &t[i]));
    }
    /* Without a trial on 2 to `cores` replicas, the lockstep probe says how the cores share; its
     * rounds last as long as a replica's step of compute. */
    int within = 0;
    for (int i = 0; i < a->n_counts; i++) within |= a->counts[i] > 1 && a->counts[i] <= cores;
    double speed = 1.0, round_s = t[0].compute_s + t[0].optimizer_s;
    if (cores > 1 && !within && !own_memory) /* CPU cores share units; GPUs of their own do not */
        TRY(crew_scale_probe_parallel((int)cores, 1.0, crew_model_param_count(m) + 1, round_s > 1e-4 ? round_s : 1e-4,
                                      &speed));
    crew_scale_analyse(t, a->n_counts);
    int64_t grad_bytes = crew_model_param_count(m) * (int64_t)sizeof(float);
    int above_one = 0;
    for (int i = 0; i < a->n_counts; i++) above_one += a->counts[i] > 1;
    /* replaced by the benchmark whenever the trials cannot fit the link */
    crew_link shared = {.alpha_s = 5e-6, .bytes_per_s = 5e9, .name = "shared memory"};
    if (own_memory) snprintf(shared.name, sizeof shared.name, "the link between two %s devices", a->kind);
    if (g)
        shared = *mpi_link; /* the trials' all-reduce ran over it */
    else if (above_one < 2)
        TRY(crew_scale_measure_device_link(a->kind, grad_bytes > 4 ? grad_bytes : 4, &shared));
    if (own_memory && !g) /* what each micro-batch's input, and each all-reduce through the host, pays */
        TRY(crew_scale_measure_copies(a->kind, grad_bytes > 4 ? grad_bytes : 4, &copies[0], &copies[1]));
    return crew_scale_fit(t, a->n_counts, grad_bytes, &shared, (int)cores, speed, cm);
}

/* --from RUN_DIR's noise scale, read by process 0 before any trial runs (a bad directory fails
 * at once, on every process). */
static crew_status read_from(const scale_args *a, const crew_process_group *g, double *noise, int64_t *batch)
{
    *noise = NAN, *batch = 0;
    if (!a->from) return CREW_OK;
    crew_status s = crew_group_rank(g) == 0 ? crew_run_noise_scale(a->from, noise, batch) : CREW_OK;
    return g ? share_outcome(g, "reading --from", s, 600.0) : s;
}

/* The noise scale the projection counts: --from's, else that of the trial with the most replicas
 * that measured one. Says where it came from in source ("" for none). */
static void choose_noise(const scale_args *a, double from_noise, int64_t from_batch, const crew_scale_trial *t,
                         crew_scale_model *cm, char *source, size_t len)
{
    source[0] = 0;
    if (a->from) {
        cm->noise_scale = from_noise, cm->noise_batch = from_batch;
        snprintf(source, len, "run %s", a->from);
        return;
    }
    for (int i = a->n_counts - 1; i >= 0; i--)
        if (isfinite(t[i].noise_scale) && t[i].noise_scale > 0) {
            cm->noise_scale = t[i].noise_scale, cm->noise_batch = t[i].global_batch;
            snprintf(source, len, "trial of %d replica%s", t[i].devices, t[i].devices == 1 ? "" : "s");
            return;
        }
}

static void print_noise(const scale_args *a, const crew_scale_model *cm, const char *source)
{
    if (!source[0]) {
        printf("\ngradient noise scale: not measured (a trial needs two or more replicas, or micro-batches, to "
               "measure it; --from RUN_DIR takes a run's): the projection counts samples, not progress\n");
        return;
    }
    printf("\ngradient noise scale: B = %.3g samples, measured at a global batch of %lld (%s", cm->noise_scale,
           (long long)cm->noise_batch, source);
    if (a->from)
        printf(": its last measurement. B grows as training goes on: a run's late figure plans its late epochs)\n");
    else
        printf(": %lld repeat%s of %lld steps from the seed, a rough early figure; B grows as training goes on, and "
               "--from RUN_DIR takes a real run's)\n", (long long)a->repeats, a->repeats == 1 ? "" : "s",
               (long long)a->steps);
}

int cli_scale(int argc, char **argv)
{
    scale_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    crew_model *m = NULL;
    crew_dataset *train = NULL;
    crew_scale_trial t[MAX_COUNTS];
    crew_scale_model cm;
    /* Under mpirun: trials of process 0 alone and of every process (one replica each), the MPI
     * link measured between them, and the projection to more processes over it. */
    const crew_process_group *g = cli_group();
    if (g && a.have_link)
        return cli_usage_error("scale", "under mpirun the link is the MPI one between the processes, measured: "
                                        "leave out --link and --latency");
    if (g && (rc = cli_agree_run("scale", g, argc, argv, a.model, a.data, NULL))) return rc;
    const int lead = crew_group_rank(g) == 0;
    crew_link mpi_link = {0}, copies[2] = {{0}};
    if (g) {
        a.counts[0] = 1, a.counts[1] = crew_group_size(g), a.n_counts = 2;
    }
    if (lead) cli_warn_slow_blas("scale");
    double from_noise;
    int64_t from_batch;
    crew_status s = read_from(&a, g, &from_noise, &from_batch);
    if (!s) s = crew_model_load_file(a.model, &m);
    if (!s) s = crew_dataset_open_for(m, a.data, "train", &train);
    if (!s && lead) cli_note_dataset("scale", train);
    if (!s && !a.epochs) {
        crew_fit_options d;
        crew_model_default_fit(m, &d);
        a.epochs = d.epochs;
    }
    if (!s && lead) { /* --conv auto: measured once, then every trial's ways */
        crew_fit_options f;
        crew_conv_choice *conv = NULL;
        crew_model_default_fit(m, &f);
        f.device_kind = a.kind;
        f.precision = a.precision;
        if (a.batch) f.batch_per_device = a.batch;
        if ((rc = cli_conv_apply("scale", &a.conv, m, 1, &f, &conv))) {
            crew_dataset_free(train);
            crew_model_free(m);
            return rc;
        }
        if (f.conv_choice && f.conv_choice != a.conv.ways) snprintf(a.conv.ways, sizeof a.conv.ways, "%s", f.conv_choice);
        if (conv && !a.json) {
            printf("scale %s on %s:\n", a.model, a.kind);
            cli_print_conv_choice(conv, f.batch_per_device);
        }
        free(conv);
    }
    for (int i = 0; i < a.n_counts && !s; i++) { /* every count's plan holds before any trial runs */
        crew_fit_options f;
        crew_fit_plan plan;
        crew_model_default_fit(m, &f);
        f.devices = a.counts[i];
        f.device_kind = a.kind;
        f.precision = a.precision;
        f.conv = a.conv.way >= 0 ? a.conv.way : CREW_CONV_AUTO;
        f.conv_choice = a.conv.ways[0] ? a.conv.ways : NULL;
        if (a.batch) f.batch_per_device = a.batch;
        s = crew_model_plan_fit(m, train, &f, &plan);
    }
    if (!s) {
        if (g && lead)
            fprintf(stderr, "crew scale: trials of %s on process 0 alone and on all %d MPI processes\n", a.model,
                    crew_group_size(g));
        else if (!g)
            fprintf(stderr, "crew scale: trials of %s at %d replica count%s\n", a.model, a.n_counts,
                    a.n_counts == 1 ? "" : "s");
        s = measure(&a, m, train, g, t, &cm, &mpi_link, copies);
    }
    /* In one process: replicas against BLAS threads on every core, measured anew (and cached for
     * crew train's --layout auto and its hint). Under mpirun a process's cores are the user's. */
    crew_layout_choice layouts = {0};
    const int cores = crew_cpu_cores();
    if (!s && !g && cores > 1 && !strcmp(a.kind, "cpu")) {
        int found = 0, cached = 0;
        fprintf(stderr, "crew scale: the layouts of %d cores, replicas against BLAS threads\n", cores);
        s = cli_layout(a.model, train, cores, a.batch, 2, &layouts, &found, &cached);
    }
    if (g && !s && lead) { /* the projection over more processes: the link just measured */
        a.link = mpi_link;
        a.have_link = 1;
        a.link_label = "processes joined by the MPI link";
        a.mpi_processes = crew_group_size(g);
    }
    if (s) {
        rc = cli_fail("scale", s);
    } else if (!lead) {
        rc = 0; /* the verdict is process 0's */
    } else {
        int64_t samples = crew_dataset_size(train);
        char noise_source[4200];
        choose_noise(&a, from_noise, from_batch, t, &cm, noise_source, sizeof noise_source);
        crew_scale_advice adv, here;
        crew_scale_advise(&cm, a.have_link ? &a.link : NULL, a.project, a.n_project, samples, (int)a.epochs,
                          a.worth_it_s, &adv);
        crew_scale_advise(&cm, NULL, a.project, a.n_project, samples, (int)a.epochs, a.worth_it_s, &here);
        printf("scaling of %s on %s: per-device batch %lld\n", a.model, a.data, (long long)cm.batch_per_device);
        if (g)
            printf("across %d MPI processes, one replica each; the MPI link between them, measured: %.1f us, %.2f GB/s\n",
                   crew_group_size(g), 1e6 * mpi_link.alpha_s, mpi_link.bytes_per_s / 1e9);
        int own_memory = 0;
        flop_rates fr = {.cores = shared_devices(a.kind, &own_memory)};
        crew_flops f;
        if (crew_model_flops(m, &f) == CREW_OK) fr.per_sample = f.total;
        crew_run_peak(a.kind, 1, 1, 1, &fr.device_peak); /* the trials' devices: one BLAS thread each */
        print_trials(t, a.n_counts, &fr);
        print_layouts(&layouts, cores);
        print_model(&cm, cm.link.name[0] ? cm.link.name : "shared memory", own_memory ? "devices" : "cores");
        if (copies[0].bytes_per_s > 0)
            printf("  %s:0's copies of the gradients' size from pinned host memory: up %.2f GB/s (%.1f us for one "
                   "value), down %.2f GB/s (%.1f us)\n", a.kind, copies[0].bytes_per_s / 1e9, 1e6 * copies[0].alpha_s,
                   copies[1].bytes_per_s / 1e9, 1e6 * copies[1].alpha_s);
        print_noise(&a, &cm, noise_source);
        print_projection(&a, &cm, samples);
        printf("\nrecommendation%s%s%s: %s\n", a.have_link ? " (" : "", a.have_link ? a.link_label : "",
               a.have_link ? ")" : "", adv.reason);
        if (adv.stall[0]) printf("%s\n", adv.stall);
        if (a.have_link && here.stall[0]) printf("on this machine, %s\n", here.stall);
        if (adv.goodput_reason[0]) printf("time to the result%s: %s\n", a.have_link ? " (over the link)" : "", adv.goodput_reason);
        if (a.json) print_json(&a, t, a.n_counts, &fr, &cm, samples, &adv, &here, &layouts, noise_source);
        rc = 0;
    }
    crew_dataset_free(train);
    crew_model_free(m);
    return rc;
}
