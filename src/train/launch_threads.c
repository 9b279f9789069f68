/* launch_threads.c — the threads launcher: every rank of a run as a thread of this process.
 *
 * It opens one device per rank (never shared) and one in-process communicator with each rank's
 * device attached to its handle, and runs the rank program on a thread per rank. The calling
 * thread supervises: a rank that fails aborts the communicator, so the others stop at their next
 * collective instead of waiting for its deadline, and a rank waiting for one that never comes
 * fails by the collective deadline and names it.
 *
 * A rank that never returns (a thread stopped by a debugger, stuck in a driver or in the kernel)
 * must not hold the run: once one rank has failed, the others get a grace to come back, and any
 * that does not is left behind. Its loader is shut down first (its producer threads end), so
 * nothing of it reads the caller's dataset any more; what it may still touch stays alive: the
 * launch itself (devices, loaders, communicator, the copy of the run's description) is freed by
 * whoever leaves last, and a rank 0 left behind finds the sinks locked for good (the launcher
 * takes their lock) should it wake. Its thread is detached and its memory leaked: the run is over
 * and has failed, and a process that ends then (the CLI exits 1) ends the thread too. A rank that
 * stopped inside its evaluation, reading the test set, is the one case left unguarded. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"
#include "core/cpu.h"
#include "core/status.h"
#include "core/thread_name.h"
#include "core/timer.h"
#include "data/loader.h"
#include "train/pipeline.h"
#include "train/run.h"

/* How long the other ranks may take to return once one has failed: a healthy rank told by the
 * aborted communicator returns at its next collective, within a step; longer means stuck. At
 * most the collective deadline, the time a rank may take to reach a collective at all. */
#define GRACE_S 5.0
/* How long the launcher tries to enter rank 0's sink section when rank 0 was left behind: a rank
 * 0 stopped inside one (writing metrics, a checkpoint) holds it. */
#define SINKS_WAIT_S 1.0

typedef struct launch launch;

typedef struct rank_slot {
    crew_rank_ctx ctx;
    launch *l;
    int opened;                 /* ctx.device is open */
    int started;                /* thread runs */
    int finished;               /* the rank program returned (under l->mu) */
    int finished_as;            /* 1, 2, ...: its place among the ranks that returned (under l->mu) */
    /* a device the host cannot reach (a GPU): its handles stage through host memory */
    crew_staged_comm *staged, *stage_staged;
    crew_status status;
    pthread_t thread;
} rank_slot;

/* Everything a rank thread may touch besides the caller's objects (model, dataset, callbacks):
 * on the heap, freed by the last of the launcher and the rank threads to leave. */
struct launch {
    pthread_mutex_t mu;
    pthread_cond_t changed;     /* a rank finished */
    int users;                  /* the launcher + the rank threads still running */
    int n, finished;            /* this process's ranks */
    int first, size;            /* global rank of ranks[0], and of the run: n, 0 without a process group */
    rank_slot *ranks;           /* [n] */
    crew_local_comm *lc;
    crew_mpi_comm *mc;          /* between processes, over lc; NULL without a process group */
    crew_nccl_clique *nccl;     /* the ranks' communicator instead, with plan.nccl */
    int device_base;            /* ranks[i] opens device device_base + i: this process's share of its
                                   machine's GPUs when several processes run on one */
    /* A pipeline: [stages] each stage's communicator of its replicas: its ranks in this process
     * (stage_lc, NULL for a stage this process has none of), joined to the other processes' by
     * stage_mc (NULL in one process) */
    crew_local_comm **stage_lc;
    crew_mpi_comm **stage_mc;
    int stages;                 /* 1 without a pipeline */
    /* With plan.bind_cores, [n · threads_per_device]: local rank i's thread, and its loader's,
     * run on CPUs cpus[i·T, (i+1)·T); NULL unbound */
    int *cpus;
    crew_run run;               /* the ranks' copy of the run's description */
    crew_fit_options opts;      /* and of its options */
};

static void launch_free(launch *l)
{
#ifdef CREW_HAVE_NCCL
    crew_nccl_clique_free(l->nccl); /* before the devices whose streams it waits on */
#endif
    for (int i = 0; l->ranks && i < l->n; i++) {
        crew_loader_free(l->ranks[i].ctx.loader);
        crew_staged_comm_free(l->ranks[i].staged);
        crew_staged_comm_free(l->ranks[i].stage_staged);
        if (l->ranks[i].opened) crew_device_close(&l->ranks[i].ctx.device);
        crew_status_free(l->ranks[i].status);
    }
    free(l->ranks);
    for (int s = 0; l->stage_mc && s < l->stages; s++) crew_mpi_comm_free(l->stage_mc[s]);
    free(l->stage_mc);
    for (int s = 0; l->stage_lc && s < l->stages; s++) crew_local_comm_free(l->stage_lc[s]);
    free(l->stage_lc);
    crew_mpi_comm_free(l->mc);
    crew_local_comm_free(l->lc);
    free(l->cpus);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->changed);
    free(l);
}

/* One user leaves; the last one frees the launch. */
static void launch_leave(launch *l)
{
    pthread_mutex_lock(&l->mu);
    int last = --l->users == 0;
    pthread_mutex_unlock(&l->mu);
    if (last) launch_free(l);
}

/* Local rank i's CPUs (l->cpus), NULL unbound. */
static const int *rank_cpus(const launch *l, int i)
{
    return l->cpus ? l->cpus + (size_t)i * (size_t)l->run.plan.threads_per_device : NULL;
}

/* The rank's thread onto its cores (plan.bind_cores), before it starts the threads that inherit
 * the binding: its BLAS library's, its communication thread. */
static crew_status bind_rank(const launch *l, const rank_slot *r)
{
    const int i = r->ctx.rank - l->first, t = l->run.plan.threads_per_device;
    const int *cpus = rank_cpus(l, i);
    if (!cpus) return CREW_OK;
    int err = crew_cpu_bind_self(cpus, t);
    if (!err) return CREW_OK;
    return crew_errorf(CREW_CODE_IO, "rank %d: its thread could not be bound to CPU %d%s: %s (--bind-cores off leaves "
                       "the threads unbound)", r->ctx.rank, cpus[0], t > 1 ? " and the next" : "", strerror(err));
}

static void *rank_thread(void *arg)
{
    rank_slot *r = arg;
    launch *l = r->l;
    crew_thread_name("rank", r->ctx.rank);
    crew_status s = bind_rank(l, r);
    if (!s) s = crew_rank_main(&r->ctx);
    if (s) {
        r->ctx.comm.ops->abort(r->ctx.comm.ctx, r->ctx.rank);
        if (l->stages > 1) r->ctx.stage_comm.ops->abort(r->ctx.stage_comm.ctx, r->ctx.stage_comm.rank);
    }
    pthread_mutex_lock(&l->mu);
    r->status = s;
    r->finished = 1;
    r->finished_as = ++l->finished;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
    launch_leave(l);
    return NULL;
}

/* The first real error: a rank that failed by itself, not one that was told another failed. A
 * timeout is a symptom (of another rank's absence) when there is any other error; among errors of
 * the same kind, the rank that returned first failed first: the others learnt it from it (a rank
 * whose loader timed out, say, then the ranks waiting for it at a collective). Takes the statuses
 * of the finished ranks. */
static crew_status first_error(launch *l)
{
    crew_status keep = CREW_OK;
    int keep_as = 0;
    for (int i = 0; i < l->n; i++) {
        rank_slot *r = &l->ranks[i];
        if (!r->finished || !r->status) continue;
        int keep_timeout = crew_status_code(keep) == CREW_CODE_TIMEOUT,
            timeout = crew_status_code(r->status) == CREW_CODE_TIMEOUT;
        if (!keep || (keep_timeout && !timeout) || (keep_timeout == timeout && r->finished_as < keep_as)) {
            crew_status_free(keep);
            keep = r->status;
            keep_as = r->finished_as;
        } else {
            crew_status_free(r->status);
        }
        r->status = CREW_OK;
    }
    return keep;
}

/* Waits until every started rank has finished, or for a grace after the first one failed.
 * Returns how many ranks were left behind. Called with l->mu held. */
static int supervise(launch *l, int started)
{
    const double grace = l->run.timeout_s < GRACE_S ? l->run.timeout_s : GRACE_S;
    double grace_until = 0.0;
    for (;;) {
        int failed = 0;
        for (int i = 0; i < started; i++) failed |= l->ranks[i].finished && l->ranks[i].status;
        if (l->finished == started) return 0;
        if (failed && grace_until == 0.0) grace_until = crew_now() + grace;
        if (grace_until > 0.0 && crew_now() >= grace_until) return started - l->finished;
        struct timespec ts;
        crew_deadline_after(grace_until > 0.0 ? grace_until - crew_now() : 3600.0, &ts);
        pthread_cond_timedwait(&l->changed, &l->mu, &ts);
    }
}

/* "ranks 0, 2" of the ranks not finished, into buf. */
static void left_behind(const launch *l, int started, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < started && used < len; i++)
        if (!l->ranks[i].finished) used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? ", " : "", l->first + i);
}

/* A rank 0 left behind: take its sinks for good, or find it stopped inside them. */
static void hold_sinks(crew_run_sinks *sinks, crew_status s)
{
    struct timespec ts;
    crew_deadline_after(SINKS_WAIT_S, &ts);
    sinks->rank0_left = 1;
    if (pthread_mutex_timedlock(&sinks->lock, &ts) != 0) {
        sinks->monitor_lost = 1;
        return;
    }
    /* Rank 0 cannot say that it hung: say it for it. */
    if (sinks->monitor)
        crew_status_free(crew_monitor_event(sinks->monitor, CREW_EVENT_HANG, -1, 0, NAN, "%s", crew_status_message(s)));
}

/* How many of process q's ranks are stage st's (n ranks per process, numbered process by process). */
static int stage_ranks_of(const launch *l, int q, int st)
{
    int count = 0;
    for (int g = q * l->n; g < (q + 1) * l->n; g++) count += g % l->stages == st;
    return count;
}
static int stage_ranks_here(const launch *l, int st) { return stage_ranks_of(l, l->first / l->n, st); }

/* The pipeline's stage communicators: stage st joins ranks d · stages + st of every replica d,
 * which are the same number in every process that has any (the layouts crew_pipeline_plan
 * allows: whole replicas in each process, or an equal share of one replica's stages), so that a
 * stage's rank d is its local rank d mod that number. Across processes, an MPI communicator over
 * those processes, of id st + 1 (the run's is 0), joins them. */
static crew_status make_stage_comms(launch *l, const crew_process_group *g)
{
    const int processes = crew_group_size(g);
    l->stage_lc = calloc((size_t)l->stages, sizeof *l->stage_lc);
    l->stage_mc = calloc((size_t)l->stages, sizeof *l->stage_mc);
    int *members = calloc((size_t)processes, sizeof *members);
    crew_status s = l->stage_lc && l->stage_mc && members ? CREW_OK : CREW_OOM();
    for (int st = 0; st < l->stages && !s; st++) {
        const int here = stage_ranks_here(l, st);
        if (!here) continue;
        int n_members = 0;
        for (int q = 0; q < processes; q++)
            if (stage_ranks_of(l, q, st)) {
                if (stage_ranks_of(l, q, st) != here)
                    s = crew_errorf(CREW_CODE_INTERNAL, "pipeline stage %d: %d ranks in MPI rank %d, %d in this one", st,
                                    stage_ranks_of(l, q, st), q, here);
                members[n_members++] = q;
            }
        if (!s) s = crew_local_comm_create(here, &l->stage_lc[st]);
        if (!s && n_members > 1)
            s = crew_mpi_comm_create_subset(g, l->stage_lc[st], here, members, n_members, st + 1, &l->stage_mc[st]);
    }
    free(members);
    return s;
}

/* Opens local rank i's device, attaches it to its communicator handle and makes its loader (of
 * the global rank's micro-batches). */
static crew_status open_rank(launch *l, rank_slot *r, int i)
{
    crew_device_options dev = {.blas_threads = l->run.plan.threads_per_device,
                               .precision = (crew_precision)l->run.plan.precision,
                               .conv_library = strchr(l->run.plan.conv_choice, 'l') != NULL,
                               .sum_block = l->run.hooks.sum_block};
    CREW_TRY(crew_device_open(l->run.plan.device_kind, l->device_base + i, &dev, &r->ctx.device));
    r->opened = 1;
    const int *cpus = rank_cpus(l, i), n_cpus = cpus ? l->run.plan.threads_per_device : 0;
    if (l->run.plan.nccl)
        return crew_run_open_loader(&l->run, l->first + i, l->size, &r->ctx.device, cpus, n_cpus, &r->ctx.loader);
    /* A device the host threads cannot reach takes part through host copies (comm_staged.c). */
    const crew_backend *reach = crew_comm_needs_staging(&r->ctx.device) ? NULL : &r->ctx.device;
    CREW_TRY(crew_local_comm_attach(l->lc, i, reach));
    r->ctx.comm = l->mc ? crew_mpi_comm_rank(l->mc, i) : crew_local_comm_rank(l->lc, i);
    if (!reach) {
        CREW_TRY(crew_staged_comm_create(r->ctx.comm, &r->ctx.device, &r->staged));
        r->ctx.comm = crew_staged_comm_rank(r->staged);
    }
    if (l->stages > 1) { /* every stage of a replica reads the replica's micro-batches */
        const int st = r->ctx.stage, local = r->ctx.replica % stage_ranks_here(l, st);
        CREW_TRY(crew_local_comm_attach(l->stage_lc[st], local, reach));
        r->ctx.stage_comm = l->stage_mc[st] ? crew_mpi_comm_rank(l->stage_mc[st], local)
                                            : crew_local_comm_rank(l->stage_lc[st], local);
        if (!reach) {
            CREW_TRY(crew_staged_comm_create(r->ctx.stage_comm, &r->ctx.device, &r->stage_staged));
            r->ctx.stage_comm = crew_staged_comm_rank(r->stage_staged);
        }
        return crew_run_open_loader(&l->run, r->ctx.replica, l->run.plan.devices, &r->ctx.device, cpus, n_cpus,
                                    &r->ctx.loader);
    }
    return crew_run_open_loader(&l->run, l->first + i, l->size, &r->ctx.device, cpus, n_cpus, &r->ctx.loader);
}

/* What each process tells the others before its ranks open: its host, so that processes sharing
 * a machine open different GPUs, and from process 0, NCCL's unique id. */
typedef struct launch_card {
    char host[64];
    int nccl;                   /* the process planned NCCL (the plans agree, or the run fails here) */
    int has_id;
    crew_nccl_id id;
} launch_card;

/* This process's place among the processes on its machine (0 in one process), and process 0's
 * NCCL id when the run talks through NCCL (made here in one process). */
static crew_status meet_processes(const crew_process_group *g, const crew_fit_plan *plan, double timeout_s,
                                  int *node_index, crew_nccl_id *id)
{
    const int processes = crew_group_size(g), me = crew_group_rank(g);
    launch_card mine = {0};
    *node_index = 0;
    snprintf(mine.host, sizeof mine.host, "%s", crew_group_host(g));
    mine.nccl = plan->nccl;
#ifdef CREW_HAVE_NCCL
    if (plan->nccl && me == 0) {
        CREW_TRY(crew_nccl_id_new(&mine.id));
        mine.has_id = 1;
    }
#else
    (void)plan;
#endif
    if (processes == 1) {
        *id = mine.id;
        return CREW_OK;
    }
    launch_card *all = calloc((size_t)processes, sizeof *all);
    if (!all) return CREW_OOM();
    crew_status s = crew_group_allgather_bytes(g, &mine, all, sizeof mine, timeout_s, "the start of the ranks");
    for (int q = 0; q < me && !s; q++) *node_index += strcmp(all[q].host, mine.host) == 0;
    for (int q = 0; q < processes && !s; q++) /* each plans alone, from the GPUs it sees */
        if (all[q].nccl != mine.nccl)
            s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "MPI rank %d (host %.64s) planned %s, this one (MPI rank %d) %s: "
                            "the processes see different GPUs; give --comm host or --comm nccl", q, all[q].host,
                            all[q].nccl ? "NCCL" : "the host's communicator", me,
                            mine.nccl ? "NCCL" : "the host's communicator");
    if (!s && plan->nccl && !all[0].has_id) s = crew_errorf(CREW_CODE_INTERNAL, "MPI rank 0 sent no NCCL id");
    if (!s) *id = all[0].id;
    free(all);
    return s;
}

/* The ranks' NCCL communicator (plan.nccl), opened together once every rank's GPU is. */
static crew_status open_nccl(launch *l, const crew_nccl_id *id)
{
#ifdef CREW_HAVE_NCCL
    crew_backend *devices = calloc((size_t)l->n, sizeof *devices);
    if (!devices) return CREW_OOM();
    for (int i = 0; i < l->n; i++) devices[i] = l->ranks[i].ctx.device;
    crew_status s = crew_nccl_clique_create(id, l->size, l->first, l->n, devices, l->run.plan.unordered_allreduce,
                                            l->run.timeout_s, &l->nccl);
    free(devices);
    for (int i = 0; i < l->n && !s; i++) l->ranks[i].ctx.comm = crew_nccl_clique_rank(l->nccl, i);
    return s;
#else
    (void)l, (void)id;
    return crew_errorf(CREW_CODE_INTERNAL, "this build of crew has no NCCL");
#endif
}

/* The first `want` CPUs of the launching thread's affinity mask (the process's, which the ranks'
 * and the loaders' threads inherit), for plan.bind_cores. */
static crew_status list_cpus(launch *l, int want)
{
    l->cpus = malloc((size_t)want * sizeof *l->cpus);
    if (!l->cpus) return CREW_OOM();
    int n = crew_cpu_list(l->cpus, want);
    if (n < want)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "binding the ranks to cores: they need %d CPUs, and this thread "
                           "may run on %d (its affinity mask changed since the plan?)", want, n);
    return CREW_OK;
}

static crew_status launch_create(const crew_run *run, crew_run_sinks *sinks, launch **out)
{
    const crew_process_group *g = run->opts->group;
    const int processes = crew_group_size(g), stages = run->plan.stages > 1 ? run->plan.stages : 1;
    const int n = run->plan.devices * stages / processes; /* a whole number (crew_pipeline_plan) */
    launch *l = calloc(1, sizeof *l);
    if (!l) return CREW_OOM();
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->changed, NULL);
    l->users = 1;
    l->n = n;
    l->first = crew_group_rank(g) * n;
    l->size = run->plan.devices * stages;
    l->stages = stages;
    l->run = *run;
    l->opts = *run->opts;
    l->run.opts = &l->opts;
    l->ranks = calloc((size_t)n, sizeof *l->ranks);
    crew_nccl_id id;
    int node_index = 0;
    crew_status s = l->ranks ? meet_processes(g, &run->plan, run->timeout_s, &node_index, &id) : CREW_OOM();
    l->device_base = node_index * n;
    /* NCCL refuses two ranks on one GPU: the processes of a machine must find enough of them */
    const int gpus = crew_device_kind_find(run->plan.device_kind)->available();
    if (!s && run->plan.nccl && l->device_base + n > gpus)
        s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "NCCL needs a GPU of its own for every rank: this process is the "
                        "number %d on its machine, with %d ranks from GPU %d on, and the machine shows %d GPUs; give "
                        "fewer ranks per machine, or --comm host", node_index + 1, n, l->device_base, gpus);
    if (!s && run->plan.bind_cores) s = list_cpus(l, n * run->plan.threads_per_device);
    if (!s) s = crew_local_comm_create(n, &l->lc);
    if (!s && processes > 1 && !run->plan.nccl) s = crew_mpi_comm_create(g, l->lc, n, &l->mc);
    if (!s && l->mc) crew_mpi_comm_set_unordered(l->mc, run->plan.unordered_allreduce);
    if (!s && l->mc && stages > 1) crew_mpi_comm_name_ranks(l->mc, "rank"); /* a rank is a stage of a replica */
    if (!s && stages > 1) s = make_stage_comms(l, g);
    for (int i = 0; i < n && !s; i++) {
        rank_slot *r = &l->ranks[i];
        r->l = l;
        /* Global rank 0 alone has the sinks: on process 0 of a group. */
        r->ctx = (crew_rank_ctx){.rank = l->first + i, .size = l->size, .run = &l->run,
                                 .sinks = l->first + i == 0 ? sinks : NULL, .stage = (l->first + i) % stages,
                                 .replica = (l->first + i) / stages,
                                 .own_model = i == 0 && l->first != 0 && sinks ? sinks->model : NULL};
        s = open_rank(l, r, i);
    }
    if (!s && run->plan.nccl) s = open_nccl(l, &id);
    if (s) {
        launch_free(l);
        return s;
    }
    *out = l;
    return CREW_OK;
}

crew_status crew_launch_threads(const crew_run *run, crew_run_sinks *sinks)
{
    launch *l = NULL;
    CREW_TRY(launch_create(run, sinks, &l));
    crew_status s = CREW_OK;
    int started = 0;
    for (int i = 0; i < l->n && !s; i++) {
        pthread_mutex_lock(&l->mu);
        l->users++; /* before the thread can leave */
        pthread_mutex_unlock(&l->mu);
        if (pthread_create(&l->ranks[i].thread, NULL, rank_thread, &l->ranks[i]) != 0) {
            launch_leave(l); /* drop the thread's share again: it never ran */
            s = crew_errorf(CREW_CODE_INTERNAL, "could not start the thread of rank %d", i);
        } else {
            l->ranks[i].started = 1;
            started = i + 1;
        }
    }
    if (s && started) l->ranks[0].ctx.comm.ops->abort(l->ranks[0].ctx.comm.ctx, l->first);
    pthread_mutex_lock(&l->mu);
    int stuck = supervise(l, started);
    char who[256];
    left_behind(l, started, who, sizeof who);
    crew_status err = first_error(l);
    int rank0_stuck = started > 0 && !l->ranks[0].finished && l->first == 0;
    pthread_mutex_unlock(&l->mu);
    /* The finished threads are about to exit (or have); the others are left behind. */
    for (int i = 0; i < started; i++) {
        if (l->ranks[i].finished)
            pthread_join(l->ranks[i].thread, NULL);
        else
            pthread_detach(l->ranks[i].thread);
    }
    /* Every loader's producers end before the caller may free the dataset, also those whose rank
     * finished: the launch, and so their memory, may outlive this call. */
    for (int i = 0; i < l->n; i++) crew_loader_shutdown(l->ranks[i].ctx.loader);
    if (!s) s = err;
    else crew_status_free(err);
    if (stuck) {
        /* Only a failure starts the grace, so there is one to report. */
        s = crew_error_prefix(s, "rank%s %s never returned after the run failed and %s left behind; ",
                              stuck > 1 ? "s" : "", who, stuck > 1 ? "were" : "was");
        if (rank0_stuck) hold_sinks(sinks, s);
    }
    launch_leave(l);
    return s;
}
