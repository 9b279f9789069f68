/* test_fit_mpi.c — the run's detectors across processes, under mpirun -np 2 (one replica each):
 *
 * - a straggler: replica 1 (on process 1) sleeps 30 ms in each backward pass; process 0, which
 *   owns the run's record, reports a straggler event naming replica 1 with its figures;
 * - replica drift: replica 1's first parameter moves at step 3; with the drift check every step,
 *   the run fails at step 3 on both processes with CREW_CODE_DIVERGED naming replica 1;
 * - the same run without a fault passes the drift check at every step on both processes.
 *
 * Each process writes the same synthetic dataset to a directory of its own. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
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
    crew_fit *f = NULL;
    crew_fit_result r;
    crew_status s = crew_fit_prepare(m, d, &o, &f);
    if (!s) {
        crew_fit_hooks_of(f)->faults = *faults;
        s = crew_fit_run(f, &r);
    }
    crew_fit_free(f);
    crew_model_free(m);
    return s;
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
    }
    crew_dataset_free(d);
    syn_remove(dir);
    crew_group_close(g);
    int failed = check_report() != 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (p == 0) printf("2 processes: %s\n", any ? "FAILED" : "a straggler and a drifting replica reported across processes");
    MPI_Finalize();
    return any;
}
