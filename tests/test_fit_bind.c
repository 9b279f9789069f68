/* test_fit_bind.c — ranks bound to cores of their own (crew_fit_options.bind_cores), and where
 * their batches are prepared (crew_fit_options.loader_inline):
 * - the planner binds where every core of the process computes a rank (several of them), leaves
 *   the threads free otherwise and when told off, and refuses "on" where the ranks' threads
 *   outnumber the cores; the plan says which CPUs;
 * - in a bound run each rank's thread and its loader threads run on that rank's CPU, the i-th of
 *   the process's affinity mask, and in an unbound run anywhere in the mask;
 * - the weights are the same bits bound or not;
 * - the planner prepares the batches on the ranks' own threads where every core computes a rank,
 *   with loader threads otherwise and when told off; inline, a run starts no loader thread and
 *   trains to the same bits. */
#define _GNU_SOURCE
#include <dirent.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cpu.h"
#include "model_values.h"
#include "synthetic.h"

enum { SAMPLES = 256, MAX_CPUS = 1024 };

static crew_model *mlp(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 16,
                                                  .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    CHECK_OK(crew_model_compile(m, &(crew_compile_options){
        .loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY, .optimizer = {.type = CREW_OPT_ADAMW, .lr = 0.01f}}));
    return m;
}

static crew_fit_options options_loader(crew_model *m, int devices, int threads, int bind, int loader_inline)
{
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = devices;
    o.threads_per_device = threads;
    o.batch_per_device = 16;
    o.epochs = 1;
    o.max_steps = 4;
    o.bind_cores = bind;
    o.loader_inline = loader_inline;
    return o;
}

static crew_status plan_loader(const crew_dataset *d, int devices, int threads, int bind, int loader_inline,
                               crew_fit_plan *p)
{
    crew_model *m = mlp();
    crew_fit_options o = options_loader(m, devices, threads, bind, loader_inline);
    memset(p, 0, sizeof *p);
    crew_status s = crew_model_plan_fit(m, d, &o, p);
    crew_model_free(m);
    return s;
}

static crew_status plan(const crew_dataset *d, int devices, int threads, int bind, crew_fit_plan *p)
{
    return plan_loader(d, devices, threads, bind, 0, p);
}

static void test_loader_planner(const crew_dataset *d)
{
    const int cores = crew_cpu_cores();
    crew_fit_plan p;
    char text[4096];
    CHECK_OK(plan_loader(d, cores, 1, 0, 0, &p));
    CHECK_MSG(p.loader_inline == 2, "%d replicas on %d cores: the planner's choice is inline (2: its own)", cores,
              cores);
    crew_fit_plan_text(&p, "cpu", text, sizeof text);
    CHECK_MSG(strstr(text, "prepares its own batches as it takes them: every core computes") != NULL, "%s", text);
    CHECK_OK(plan_loader(d, cores, 1, 0, -1, &p));
    CHECK(p.loader_inline == 0); /* off: loader threads */
    crew_fit_plan_text(&p, "cpu", text, sizeof text);
    CHECK_MSG(strstr(text, "prepares its own batches") == NULL, "%s", text);
    if (cores >= 2) {
        CHECK_OK(plan_loader(d, 1, 1, 0, 0, &p));
        CHECK(p.loader_inline == 0); /* a spare core: the loader threads have it */
        CHECK_OK(plan_loader(d, 1, 1, 0, 1, &p));
        CHECK(p.loader_inline == 1); /* on: asked for */
        crew_fit_plan_text(&p, "cpu", text, sizeof text);
        CHECK_MSG(strstr(text, "prepares its own batches as it takes them (--loader-inline on)") != NULL, "%s", text);
    }
    CHECK_ERR(plan_loader(d, 1, 1, 0, 2, &p), "loader_inline 2");
    crew_model *m = mlp(); /* a model file that names its loader threads asks for them */
    m->defaults.loader_threads = 3;
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    CHECK(o.loader_inline == -1 && o.loader_threads == 3);
    crew_model_free(m);
}

static void test_planner(const crew_dataset *d)
{
    const int cores = crew_cpu_cores();
    crew_fit_plan p;
    CHECK_OK(plan(d, cores, 1, -1, &p));
    CHECK(p.bind_cores == 0); /* off */
    CHECK_OK(plan(d, 1, 1, 0, &p));
    CHECK(p.bind_cores == 0); /* one rank: nothing to keep apart */
    CHECK_OK(plan(d, cores + 1, 1, 0, &p));
    CHECK(p.bind_cores == 0); /* more ranks than cores: they share them whatever binds them */
    if (cores >= 2) {
        CHECK_OK(plan(d, cores, 1, 0, &p));
        CHECK_MSG(p.bind_cores == 1, "%d replicas on %d cores: the planner's choice is to bind", cores, cores);
        char text[4096];
        crew_fit_plan_text(&p, "cpu", text, sizeof text);
        CHECK_MSG(strstr(text, "each replica bound to a core of its own") != NULL, "the plan says it:\n%s", text);
    }
    CHECK_OK(plan(d, 1, 1, 1, &p));
    CHECK(p.bind_cores == 1); /* on: one rank too */
    CHECK_ERR(plan(d, cores + 1, 1, 1, &p), "--bind-cores on: ");
    CHECK_ERR(plan(d, 1, cores + 1, 1, &p), "need");
    CHECK_ERR(plan(d, 1, 1, 2, &p), "bind_cores 2");
}

/* What on_step saw of the process's threads at the first step. */
typedef struct seen {
    int cpus[MAX_CPUS], n_cpus; /* the process's mask, as the launcher listed it */
    int bound;                  /* the run binds */
    int checked, wrong;
    unsigned ranks, loaders;    /* bit i: a thread of rank i, or of its loader, was seen */
} seen;

/* Thread `tid` named crew-rank<i> or crew-loader<i> runs on the CPUs it should: cpus[i] bound,
 * the whole mask unbound. A thread a rank starts (a backend's or BLAS library's) carries the
 * rank's name, and its binding, until it names itself. */
static void check_thread(seen *s, pid_t tid, const char *name)
{
    int index = -1, loader = 0;
    if (!strncmp(name, "crew-rank", 9))
        index = atoi(name + 9);
    else if (!strncmp(name, "crew-loader", 11))
        index = atoi(name + 11), loader = 1;
    if (index < 0 || index >= s->n_cpus || index >= 32) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(tid, sizeof set, &set) != 0) return; /* the thread left meanwhile */
    int ok = s->bound ? CPU_COUNT(&set) == 1 && CPU_ISSET(s->cpus[index], &set) : CPU_COUNT(&set) == s->n_cpus;
    if (!ok) {
        s->wrong++;
        fprintf(stderr, "%s runs on %d CPUs%s\n", name, CPU_COUNT(&set),
                s->bound ? ", not only its rank's" : ", not the whole mask");
    }
    if (loader)
        s->loaders |= 1u << index;
    else
        s->ranks |= 1u << index;
}

static void on_step(void *user, const crew_step_info *info)
{
    seen *s = user;
    if (info->step != 1) return;
    s->checked = 1;
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.') continue;
        char path[300], name[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = '\0';
        fclose(f);
        check_thread(s, (pid_t)atoi(e->d_name), name);
    }
    closedir(dir);
}

static crew_model *train(const crew_dataset *d, int devices, int bind, int loader_inline, seen *s)
{
    crew_model *m = mlp();
    crew_fit_options o = options_loader(m, devices, 1, bind, loader_inline);
    o.on_step = on_step;
    o.user = s;
    s->n_cpus = crew_cpu_list(s->cpus, MAX_CPUS);
    crew_fit_plan p;
    CHECK_OK(crew_model_plan_fit(m, d, &o, &p));
    s->bound = p.bind_cores;
    crew_fit_result r;
    CHECK_OK(crew_model_fit(m, d, &o, &r));
    return m;
}

static void test_threads_bound(const crew_dataset *d)
{
    const int devices = crew_cpu_cores() >= 2 ? 2 : 1;
    seen bound = {0}, free_ = {0}, own = {0};
    /* loader threads (-1) in the first two, to see where they run */
    crew_model *a = train(d, devices, 1, -1, &bound), *b = train(d, devices, -1, -1, &free_);
    crew_model *c = train(d, devices, 1, 1, &own);
    CHECK(bound.bound == 1 && free_.bound == 0);
    CHECK(bound.checked && free_.checked);
    const unsigned all = (1u << devices) - 1;
    CHECK_MSG(bound.ranks == all && bound.loaders == all, "bound: the threads of ranks %#x and the loaders of %#x "
              "seen, of %d ranks", bound.ranks, bound.loaders, devices);
    CHECK_MSG(free_.ranks == all && free_.loaders == all, "free: the threads of ranks %#x and the loaders of %#x seen, "
              "of %d ranks", free_.ranks, free_.loaders, devices);
    CHECK(bound.wrong == 0 && free_.wrong == 0);
    CHECK_MSG(mv_equal(a, b), "the weights of a bound run and a free one differ");
    CHECK_MSG(own.checked && own.ranks == all && own.loaders == 0 && own.wrong == 0, "inline: the threads of ranks "
              "%#x and the loaders of %#x seen, of %d ranks", own.ranks, own.loaders, devices);
    CHECK_MSG(mv_equal(a, c), "the weights of a run with loader threads and one preparing its batches inline differ");
    crew_model_free(a);
    crew_model_free(b);
    crew_model_free(c);
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-bind-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) {
        test_planner(d);
        test_loader_planner(d);
        test_threads_bound(d);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
