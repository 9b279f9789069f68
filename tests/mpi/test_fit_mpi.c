/* test_fit_mpi.c — the run's detectors across processes, under mpirun -np 2 (one replica each):
 *
 * - a straggler: replica 1 (on process 1) sleeps 30 ms in each backward pass; process 0, which
 *   owns the run's record, reports a straggler event naming replica 1 with its figures;
 * - replica drift: replica 1's first parameter moves at step 3; with the drift check every step,
 *   the run fails at step 3 on both processes with CREW_CODE_DIVERGED naming replica 1;
 * - the same run without a fault passes the drift check at every step on both processes;
 * - a 2-stage pipeline with a stage on each process equals the same pipeline in one process, bit
 *   for bit, and a stage that stalls is named by the other process within the deadline.
 *
 * Each process writes the same synthetic dataset to a directory of its own. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "fault_hooks.h"
#include "core/status.h"
#include "nn/model.h"
#include "small_cnn.h"
#include "synthetic.h"
#include "train/hooks.h"

#define TIMEOUT_S 60.0

typedef struct events {
    int stragglers, straggler_rank;
    char message[512];
} events;

static void on_event(void *user, const crew_event_info *e)
{
    events *ev = user;
    if (e->kind != CREW_EVENT_STRAGGLER) return;
    ev->stragglers++;
    ev->straggler_rank = e->rank;
    snprintf(ev->message, sizeof ev->message, "%s", e->message);
}

static crew_model *model(void)
{
    const crew_optimizer_spec sgd = {.type = CREW_OPT_SGD, .lr = 0.05f, .momentum = 0.9f};
    crew_model *m = small_cnn(0, 0.0f, &sgd);
    if (m) CHECK_OK(crew_model_init_params(m, 5));
    return m;
}

/* m trained with o and the faults: the fit's status. */
static crew_status fit(crew_model *m, const crew_dataset *d, const crew_fit_options *o, const crew_fit_faults *faults)
{
    crew_fit *f = NULL;
    crew_fit_result r;
    crew_status s = crew_fit_prepare(m, d, o, &f);
    if (!s) {
        fault_hooks_set(f, faults);
        s = crew_fit_run(f, &r);
    }
    crew_fit_free(f);
    return s;
}

/* One run of `steps` steps on the group, faults as given: the fit's status. */
static crew_status run(const crew_process_group *g, const crew_dataset *d, int64_t steps, const crew_fit_faults *faults,
                       int64_t drift_every, events *ev)
{
    crew_model *m = model();
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = 1;
    o.batch_per_device = 8;
    o.max_steps = steps;
    o.group = g;
    o.collective_timeout_s = TIMEOUT_S;
    o.drift_check_every = drift_every;
    o.straggler_window = 10;
    o.on_event = on_event;
    o.user = ev;
    crew_status s = fit(m, d, &o, faults);
    crew_model_free(m);
    return s;
}

/* A 2-stage pipeline of the small CNN (batch norm, dropout) on 4 micro-batches of 8 a step: on
 * the group, each process one stage (pipeline_processes 2), or with no group, both stages as
 * threads of this process. Returns the fit's status; the trained parameters (process 0's) into
 * params[n_params], when given. */
static crew_status run_pipeline(const crew_process_group *g, const crew_dataset *d, const crew_fit_faults *faults,
                                double timeout_s, float *params, int64_t *n_params)
{
    const crew_optimizer_spec sgd = {.type = CREW_OPT_SGD, .lr = 0.05f, .momentum = 0.9f};
    crew_model *m = small_cnn(1, 0.2f, &sgd);
    if (!m) return crew_errorf(CREW_CODE_INTERNAL, "no model");
    CHECK_OK(crew_model_init_params(m, 5));
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = 1;
    o.batch_per_device = 8;
    o.global_batch = 32;
    o.max_steps = 6;
    o.pipeline_stages = 2;
    o.pipeline_processes = g ? 2 : 0;
    o.group = g;
    o.collective_timeout_s = timeout_s;
    crew_status s = fit(m, d, &o, faults);
    if (!s && params) {
        *n_params = m->n_params;
        s = crew_dev_download_f32(&m->be, params, m->params, m->n_params); /* device memory (make guard traps reads) */
    }
    crew_model_free(m);
    return s;
}

/* A pipeline whose stages are on different processes (activations and their gradients over MPI)
 * ends with the parameters of the same pipeline in one process, bit for bit; a stage that stops
 * is named by the other process within the deadline, and both fail. */
static void check_pipeline(const crew_process_group *g, const crew_dataset *d, const crew_fit_faults *none, int p)
{
    static float spread[4096], local[4096];
    int64_t n_spread = 0, n_local = 0;
    CHECK_OK(run_pipeline(g, d, none, TIMEOUT_S, spread, &n_spread));
    if (p == 0) {
        CHECK_OK(run_pipeline(NULL, d, none, TIMEOUT_S, local, &n_local));
        CHECK_MSG(n_spread == n_local && n_spread > 0 && n_spread <= 4096 &&
                      memcmp(spread, local, (size_t)n_spread * sizeof *spread) == 0,
                  "a pipeline across 2 processes differs from the same pipeline in one (%lld, %lld parameters)",
                  (long long)n_spread, (long long)n_local);
    }
    crew_fit_faults stall = *none;
    stall.stall_rank = 1;
    stall.stall_step = 3;
    crew_status s = run_pipeline(g, d, &stall, 3.0, NULL, NULL);
    const char *msg = s ? crew_status_message(s) : "the run passed";
    if (p == 0)
        CHECK_MSG(s && strstr(msg, "rank 1 (MPI rank 1, host ") && strstr(msg, "within 3 s"),
                  "process 0: a stalled stage on process 1 is not named: %s", msg);
    else
        CHECK_MSG(s && strstr(msg, "stalled on purpose"), "process 1: %s", msg);
    crew_status_free(s);
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm world = MPI_COMM_WORLD;
    crew_process_group *g = NULL;
    CHECK_OK(crew_group_open_mpi(&world, TIMEOUT_S, &g));
    int p = g ? crew_group_rank(g) : -1, size = g ? crew_group_size(g) : 0;
    CHECK_MSG(size == 2, "this test runs on 2 processes, got %d", size);
    char dir[64] = "/tmp/crew-test-fit-mpi-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, 256, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (g && d && size == 2) {
        const crew_fit_faults none = {.slow_rank = -1, .stall_rank = -1, .freeze_rank = -1, .corrupt_rank = -1};
        /* no fault: the replicas' hashes agree after every step (the drift check every step) */
        events ev = {0};
        CHECK_OK(run(g, d, 12, &none, 1, &ev));
        /* a straggler on process 1, reported by process 0 */
        crew_fit_faults slow = none;
        slow.slow_rank = 1;
        slow.slow_s = 0.03;
        ev = (events){0};
        CHECK_OK(run(g, d, 30, &slow, 0, &ev));
        if (p == 0)
            CHECK_MSG(ev.stragglers >= 1 && ev.straggler_rank == 1 && strstr(ev.message, "replica 1"),
                      "no straggler event for replica 1 on process 1 (%d events, rank %d: %s)", ev.stragglers,
                      ev.straggler_rank, ev.message);
        else
            CHECK_MSG(ev.stragglers == 0, "process %d reported events: only process 0 owns the record", p);
        /* drift: replica 1's values move at step 3; both processes fail there, naming it */
        crew_fit_faults drift = none;
        drift.corrupt_rank = 1;
        drift.corrupt_step = 3;
        ev = (events){0};
        crew_status s = run(g, d, 12, &drift, 1, &ev);
        CHECK_MSG(crew_status_code(s) == CREW_CODE_DIVERGED && strstr(crew_status_message(s), "step 3") &&
                      strstr(crew_status_message(s), "replica 1"),
                  "process %d: drift of replica 1: %s", p, s ? crew_status_message(s) : "the run passed");
        crew_status_free(s);
        check_pipeline(g, d, &none, p);
    }
    crew_dataset_free(d);
    syn_remove(dir);
    crew_group_close(g);
    int failed = check_report() != 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (p == 0) printf("2 processes: %s\n", any ? "FAILED" : "a straggler and a drifting replica reported across processes; a pipeline across them as in one");
    MPI_Finalize();
    return any;
}
