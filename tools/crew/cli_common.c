/* cli_common.c — what every verb shares: error lines, exit statuses, flag parsing. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

int cli_fail(const char *verb, crew_status s)
{
    crew_code code = crew_status_code(s);
    fprintf(stderr, "crew %s: %s\n", verb, crew_status_message(s));
    crew_status_free(s);
    switch (code) {
    case CREW_CODE_OK: return 0;
    case CREW_CODE_INVALID_ARGUMENT:
    case CREW_CODE_BAD_INPUT:
    case CREW_CODE_IO: return 2;
    default: return 1;
    }
}

void cli_note_dataset(const char *verb, const crew_dataset *d)
{
    /* A train and a test split share the manifest: each line is said once. */
    static char said[8][512];
    const char *note = crew_dataset_note(d);
    while (note && *note) {
        size_t n = strcspn(note, "\n");
        int seen = 0;
        for (int i = 0; i < 8 && said[i][0] && !seen; i++) seen = strlen(said[i]) == n && !strncmp(said[i], note, n);
        if (!seen) {
            fprintf(stderr, "crew %s: note: %.*s\n", verb, (int)n, note);
            for (int i = 0; i < 8; i++)
                if (!said[i][0]) {
                    snprintf(said[i], sizeof said[i], "%.*s", (int)n, note);
                    break;
                }
        }
        note += n + (note[n] == '\n');
    }
}

void cli_warn_slow_blas(const char *verb)
{
    char advice[512];
    if (crew_blas_check(advice, sizeof advice)) fprintf(stderr, "crew %s: warning: %s\n", verb, advice);
}

int cli_usage_error(const char *verb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "crew %s: ", verb);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (crew %s --help)\n", verb);
    va_end(ap);
    return 2;
}

int cli_parse_int(const char *verb, const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || *end || errno) {
        cli_usage_error(verb, "%s needs an integer, got '%s'", flag, text ? text : "");
        return 0;
    }
    if (v < lo || v > hi) {
        cli_usage_error(verb, "%s must be in [%lld, %lld], got %lld", flag, (long long)lo, (long long)hi, v);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_float(const char *verb, const char *flag, const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v)) {
        cli_usage_error(verb, "%s needs a number, got '%s'", flag, text ? text : "");
        return 0;
    }
    if (v < lo || v > hi) {
        cli_usage_error(verb, "%s must be in [%g, %g], got %g", flag, lo, hi, v);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_flag(int argc, char **argv, int *i, const char *flag, const char **value)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0) return 0;
    if (argv[*i][n] == '=') {
        *value = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0') return 0;
    if (*i + 1 >= argc) return -1;
    *value = argv[++*i];
    return 1;
}

/* The value of one table flag into its field of args; 0 after printing the error. */
static int store_flag(const char *verb, const cli_flag_spec *f, const char *v, void *args)
{
    char *field = (char *)args + f->field;
    int choice;
    switch (f->kind) {
    case CLI_SWITCH: *(int *)field = 1; return 1;
    case CLI_STRING: *(const char **)field = v; return 1;
    case CLI_INT: return cli_parse_int(verb, f->name, v, f->lo, f->hi, (int64_t *)field);
    case CLI_FLOAT: return cli_parse_float(verb, f->name, v, f->flo, f->fhi, (double *)field);
    case CLI_CHOICE:
        if ((choice = cli_parse_choice(verb, f->name, v, f->choices)) < 0) return 0;
        *(int *)field = choice;
        return 1;
    case CLI_CUSTOM: return f->parse(verb, v, args);
    }
    return 0;
}

int cli_parse_flag(const char *verb, const cli_flag_spec *flags, size_t n, int argc, char **argv, int *i, void *args)
{
    for (size_t k = 0; k < n; k++) {
        const char *v = NULL;
        int r = flags[k].kind == CLI_SWITCH ? !strcmp(argv[*i], flags[k].name)
                                            : cli_flag(argc, argv, i, flags[k].name, &v);
        if (r < 0) {
            cli_usage_error(verb, "%s needs a value", argv[*i]);
            return -1;
        }
        if (r) return store_flag(verb, &flags[k], v, args) ? 1 : -1;
    }
    return 0;
}

int cli_parse_devices(const char *verb, const char *text, char *kind, size_t kind_len, int64_t *n)
{
    int count = 0;
    crew_status s = crew_devices_parse(text, kind, kind_len, &count);
    if (s) {
        cli_usage_error(verb, "%s", crew_status_message(s));
        crew_status_free(s);
        return 0;
    }
    *n = count;
    return 1;
}

/* "512M", "8G", "24GiB", "1.5GB", "1000000"; returns 0 (after printing) when malformed. */
int cli_parse_size(const char *verb, const char *flag, const char *text, int64_t *out)
{
    static const struct { const char *suffix; double factor; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3}, {"M", 1048576.0}, {"MiB", 1048576.0},
        {"MB", 1e6}, {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9}, {"T", 1099511627776.0},
        {"TiB", 1099511627776.0}, {"TB", 1e12}};
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end != text && !errno && isfinite(v) && v > 0)
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcasecmp(end, units[i].suffix) && v * units[i].factor >= 1.0 && v * units[i].factor < 9e18) {
                *out = (int64_t)(v * units[i].factor);
                return 1;
            }
    cli_usage_error(verb, "%s takes a size such as 512M, 8G or 24GiB, got '%s'", flag, text);
    return 0;
}

const char *const cli_schedules[] = {"1f1b", "gpipe", NULL};
const char *const cli_precisions[] = {"fp32", "bf16", NULL};
const char *const cli_attention_ways[] = {"store", "recompute", NULL};


/* The stages that the flags name: --pipeline K, else one more than --stages has commas. */
static int64_t pipeline_stages_of(const cli_pipeline *p)
{
    int64_t k = p->stages > 1 ? p->stages : 1;
    if (!p->stages && p->split)
        for (const char *c = p->split; *c; c++) k += *c == ',';
    return k;
}

int cli_pipeline_replicas(const char *verb, cli_pipeline *p, int64_t devices, int processes, int64_t *replicas)
{
    int piped = p->stages > 1 || p->split;
    if (!piped && (p->schedule >= 0 || p->micro_batches)) {
        cli_usage_error(verb, "--schedule and --micro-batches shape a pipeline: give --pipeline K (or --stages)");
        return 0;
    }
    const int64_t k = pipeline_stages_of(p);
    p->span = 1;
    if (devices % k != 0 && processes > 1 && k % devices == 0) { /* a replica across k / devices processes */
        if (processes % (k / devices) != 0) {
            cli_usage_error(verb, "%d processes cannot hold replicas of %lld pipeline stages that span %lld processes "
                            "each (%lld device%s per process): give a multiple of %lld processes", processes,
                            (long long)k, (long long)(k / devices), (long long)devices, devices == 1 ? "" : "s",
                            (long long)(k / devices));
            return 0;
        }
        p->span = (int)(k / devices);
        *replicas = 1;
        return 1;
    }
    if (devices % k != 0) {
        if (processes > 1)
            cli_usage_error(verb, "%lld devices per process cannot hold replicas of %lld pipeline stages: give a multiple "
                            "or a divisor of %lld devices per process", (long long)devices, (long long)k, (long long)k);
        else
            cli_usage_error(verb, "%lld devices cannot hold replicas of %lld pipeline stages: give a multiple of %lld "
                            "devices", (long long)devices, (long long)k, (long long)k);
        return 0;
    }
    *replicas = devices / k;
    return 1;
}

void cli_pipeline_apply(const cli_pipeline *p, int global_given, int processes, crew_fit_options *o)
{
    const int64_t k = pipeline_stages_of(p);
    if (k <= 1) return;
    o->pipeline_stages = (int)k;
    o->pipeline_split = p->split;
    o->pipeline_schedule = p->schedule >= 0 ? p->schedule : CREW_PIPELINE_1F1B;
    o->pipeline_processes = p->span > 1 ? p->span : 0;
    /* K micro-batches by default: the global batch that data parallelism on the same devices has */
    int64_t m = p->micro_batches ? p->micro_batches : k;
    int64_t replicas = p->span > 1 ? processes / p->span : (int64_t)o->devices * (processes > 1 ? processes : 1);
    if (!global_given || p->micro_batches) o->global_batch = replicas * o->batch_per_device * m;
}

int cli_parse_choice(const char *verb, const char *flag, const char *text, const char *const *choices)
{
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; choices[i]; i++) {
        if (!strcmp(text, choices[i])) return i;
        used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s", i ? ", " : "", choices[i]);
    }
    cli_usage_error(verb, "%s takes one of %s, got '%s'", flag, list, text);
    return -1;
}

int cli_parse_augment(const char *verb, const char *text, crew_augment_options *out)
{
    crew_augment_options a = {0};
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t pad;
        if (!strcmp(tok, "none")) continue;
        if (!strcmp(tok, "flip")) {
            a.flip = 1;
        } else if (!strncmp(tok, "crop=", 5)) {
            if (!cli_parse_int(verb, "--augment crop=P", tok + 5, 0, 1024, &pad)) return 0;
            a.crop_padding = (int)pad;
        } else {
            cli_usage_error(verb, "--augment takes crop=P, flip or none (comma-separated), got '%s'", tok);
            return 0;
        }
    }
    *out = a;
    return 1;
}

int cli_parse_args(const char *verb, const char *usage, const cli_flag_spec *flags, size_t n, int argc, char **argv,
                   void *args, const char **positional)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return -1;
        }
        int r = cli_parse_flag(verb, flags, n, argc, argv, &i, args);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (argv[i][0] == '-') return cli_usage_error(verb, "unknown option '%s'", argv[i]);
        if (*positional) return cli_usage_error(verb, "unexpected argument '%s'", argv[i]);
        *positional = argv[i];
    }
    return 0;
}
