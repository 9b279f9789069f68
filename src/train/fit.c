/* fit.c — the training loop: N replicas, each on its own thread with its own copy of the model,
 * each taking its slice of every global batch; gradients summed across replicas in rank order;
 * identical optimizer steps everywhere. Rank 0 runs on the caller's thread and reports progress
 * through the caller's callbacks.
 *
 * Micro-batch m of a step holds rows [m·B, (m+1)·B) of the step's global batch; replica r owns
 * micro-batches r·k … r·k+k−1 (k = accumulation). Its gradient is summed locally in that order,
 * then across replicas in rank order, so the result equals one replica accumulating all of
 * them in order, bit for bit (docs/ARCHITECTURE.md, determinism). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "train/step.h"
#include "train/train.h"

#define DEFAULT_TIMEOUT_S 300.0
#define DEFAULT_BUCKET_MB 25.0

typedef struct fit_run {
    const crew_dataset *train;
    const crew_fit_options *opts;
    crew_fit_plan plan;
    crew_lr_plan lr;
    crew_fit_result *result;
    double timeout_s;
    double train_s;     /* time in training steps, evaluation excluded (rank 0's clock) */
} fit_run;

typedef struct replica {
    int rank;
    crew_model *m;
    crew_comm comm;
    fit_run *run;
    int64_t *perm;      /* [train samples] this epoch's order */
    crew_comm_worker worker;
    int has_worker;     /* only with more than one replica */
    crew_stepper stepper;
    crew_status status;
    pthread_t thread;
} replica;

static void gather_train(void *user, const int64_t *ids, int64_t rows, float *x, int32_t *labels)
{
    crew_dataset_gather(user, ids, rows, x, labels);
}

/* A small all-reduce (metrics, evaluation sums) through the replica's communication thread. */
static crew_status reduce_f64(replica *r, double *v, int64_t n)
{
    if (!r->has_worker) return CREW_OK;
    return crew_comm_worker_allreduce(&r->worker, v, n, CREW_COMM_F64, CREW_REDUCE_SUM);
}

static crew_status train_step(replica *r, int64_t epoch_step, int64_t step, crew_step_totals *t,
                              crew_step_times *times)
{
    const crew_fit_plan *p = &r->run->plan;
    crew_model *m = r->m;
    float *grad;
    memset(t, 0, sizeof *t);
    memset(times, 0, sizeof *times);
    CREW_TRY(crew_stepper_gradients(&r->stepper, r->perm + epoch_step * p->global_batch, p->seed, step, gather_train,
                                    (void *)r->run->train, &grad, t, times));
    double t0 = crew_now();
    if (r->rank == 0 && r->run->opts->cancel && *r->run->opts->cancel) t->stop = 1.0;
    CREW_TRY(reduce_f64(r, &t->loss_sum, 3));
    if (!isfinite(t->loss_sum))
        return crew_errorf(CREW_CODE_NUMERIC, "step %lld: the loss is %s; stopping before the update",
                           (long long)step + 1, isnan(t->loss_sum) ? "NaN" : "infinite");
    float lr = crew_lr_at(&r->run->lr, step);
    crew_optimizer_step(&m->opt, &m->be, m->params, grad, lr, NULL);
    times->optimizer_s = crew_now() - t0;
    return CREW_OK;
}

/* Every replica evaluates its share of the test set; the sums are all-reduced. */
static crew_status evaluate_shared(replica *r, const crew_dataset *d, float *loss, float *acc)
{
    int64_t n = crew_dataset_size(d), size = r->comm.size;
    int64_t lo = n * r->rank / size, hi = n * (r->rank + 1) / size;
    double sums[2] = {0.0, 0.0};
    int64_t correct = 0;
    /* Evaluation reuses the training batch size: the activations are already sized for it. */
    CREW_TRY(crew_eval_range(r->m, d, lo, hi, r->run->plan.batch_per_device, &sums[0], &correct));
    sums[1] = (double)correct;
    CREW_TRY(reduce_f64(r, sums, 2));
    *loss = (float)(sums[0] / (double)n);
    *acc = (float)(sums[1] / (double)n);
    return CREW_OK;
}

static void report_step(const replica *r, int epoch, int64_t epoch_step, int64_t step, const crew_step_totals *t,
                        const crew_step_times *times, double step_s, double epoch_start)
{
    const crew_fit_options *o = r->run->opts;
    const crew_fit_plan *p = &r->run->plan;
    if (r->rank != 0 || !o->on_step) return;
    crew_step_info info = {
        .step = step + 1,
        .steps_total = p->total_steps,
        .epoch = epoch,
        .epoch_step = epoch_step + 1,
        .epoch_steps = p->steps_per_epoch,
        .loss = (float)(t->loss_sum / (double)p->global_batch),
        .accuracy = (float)(t->correct / (double)p->global_batch),
        .lr = crew_lr_at(&r->run->lr, step),
        .step_s = step_s,
        .elapsed_s = crew_now() - epoch_start,
        .data_s = times->data_s,
        .forward_s = times->forward_s,
        .backward_s = times->backward_s,
        .comm_exposed_s = times->comm_exposed_s,
        .comm_hidden_s = times->comm_hidden_s,
        .optimizer_s = times->optimizer_s,
    };
    o->on_step(o->user, &info);
}

static crew_status run_epoch(replica *r, int epoch, int64_t *step, int *stopped)
{
    const crew_fit_plan *p = &r->run->plan;
    const crew_fit_options *o = r->run->opts;
    crew_fit_result *res = r->run->result;
    crew_epoch_order(p->seed, epoch, p->train_samples, r->perm);
    double start = crew_now(), loss = 0.0, correct = 0.0;
    int64_t steps = 0;
    for (int64_t es = 0; es < p->steps_per_epoch && *step < p->total_steps; es++) {
        double t0 = crew_now();
        crew_step_totals t;
        crew_step_times times;
        CREW_TRY(train_step(r, es, *step, &t, &times));
        loss += t.loss_sum;
        correct += t.correct;
        steps++;
        report_step(r, epoch, es, *step, &t, &times, crew_now() - t0, start);
        ++*step;
        if (t.stop > 0.0) {
            *stopped = 1;
            break;
        }
    }
    crew_epoch_info info = {.epoch = epoch, .epochs = p->epochs, .steps = steps, .test_loss = NAN, .test_accuracy = NAN};
    info.wall_s = crew_now() - start;
    if (r->rank == 0) r->run->train_s += info.wall_s;
    double samples = (double)steps * (double)p->global_batch;
    info.train_loss = steps ? (float)(loss / samples) : NAN;
    info.train_accuracy = steps ? (float)(correct / samples) : NAN;
    info.samples_per_s = info.wall_s > 0.0 ? samples / info.wall_s : 0.0;
    if (o->test) CREW_TRY(evaluate_shared(r, o->test, &info.test_loss, &info.test_accuracy));
    if (r->rank == 0) {
        res->epochs = epoch + 1;
        res->train_loss = info.train_loss;
        res->train_accuracy = info.train_accuracy;
        res->test_loss = info.test_loss;
        res->test_accuracy = info.test_accuracy;
        if (o->on_epoch) o->on_epoch(o->user, &info);
    }
    return CREW_OK;
}

static crew_status replica_train(replica *r)
{
    crew_model *m = r->m;
    const fit_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    /* Replica 0's parameters and state are the run's starting point. */
    CREW_TRY(crew_broadcast(&r->comm, m->params, m->n_params, CREW_COMM_F32, 0, run->timeout_s));
    CREW_TRY(crew_broadcast(&r->comm, m->state, m->n_state, CREW_COMM_F32, 0, run->timeout_s));
    if (p->devices > 1) {
        CREW_TRY(crew_comm_worker_start(&r->worker, r->comm, run->timeout_s));
        r->has_worker = 1;
    }
    int groups = run->opts->emulate_devices > 1 ? run->opts->emulate_devices : 1;
    int sync_bn = run->opts->sync_batch_norm < 0 ? p->devices > 1 : run->opts->sync_batch_norm;
    double bucket_mb = run->opts->bucket_mb > 0 ? run->opts->bucket_mb : DEFAULT_BUCKET_MB;
    CREW_TRY(crew_stepper_init(&r->stepper, m, r->has_worker ? &r->worker : NULL, r->rank, p->devices,
                               p->batch_per_device, p->accumulation / groups, groups, bucket_mb, sync_bn));
    int64_t step = 0;
    int stopped = 0;
    for (int epoch = 0; epoch < p->epochs && step < p->total_steps && !stopped; epoch++)
        CREW_TRY(run_epoch(r, epoch, &step, &stopped));
    if (r->rank == 0) r->run->result->steps = step;
    return CREW_OK;
}

static void *replica_thread(void *arg)
{
    replica *r = arg;
    r->status = replica_train(r);
    if (r->status) r->comm.ops->abort(r->comm.ctx, r->rank);
    return NULL;
}

static crew_status prepare_replica(replica *r, crew_model *m, const crew_fit_plan *p)
{
    r->m = m;
    CREW_TRY(crew_model_reserve(m, p->batch_per_device));
    r->perm = malloc((size_t)p->train_samples * sizeof *r->perm);
    if (!r->perm) return CREW_OOM();
    if (!m->compiled || m->opt.n != m->n_params) CREW_TRY(crew_model_compile(m, &m->compile));
    return CREW_OK;
}

static void release_replica(replica *r, int owns_model)
{
    if (!r->m) return;
    crew_comm_worker_stop(&r->worker);
    crew_stepper_release(&r->stepper);
    free(r->perm);
    if (owns_model) crew_model_free(r->m);
}

/* The first real error: a rank that failed by itself, not one that was told another failed. */
static crew_status first_error(replica *reps, int n)
{
    crew_status keep = CREW_OK;
    for (int i = 0; i < n; i++) {
        if (!reps[i].status) continue;
        if (!keep || (crew_status_code(keep) == CREW_CODE_TIMEOUT && crew_status_code(reps[i].status) != CREW_CODE_TIMEOUT)) {
            crew_status_free(keep);
            keep = reps[i].status;
        } else {
            crew_status_free(reps[i].status);
        }
        reps[i].status = CREW_OK;
    }
    return keep;
}

static crew_status setup(crew_model *m, fit_run *run, const crew_fit_options *opts)
{
    if (!m->compiled) {
        crew_compile_options c;
        crew_model_default_compile(m, &c);
        CREW_TRY(crew_model_compile(m, &c));
    }
    CREW_TRY(crew_model_plan_fit(m, run->train, opts, &run->plan));
    CREW_TRY(crew_cpu_backend_create(opts->threads_per_device, &m->be));
    run->lr = crew_lr_plan_of(&run->plan, &m->compile.optimizer);
    run->timeout_s = opts->collective_timeout_s > 0 ? opts->collective_timeout_s : DEFAULT_TIMEOUT_S;
    if (!m->initialized) CREW_TRY(crew_model_init_params(m, run->plan.seed));
    return CREW_OK;
}

crew_status crew_model_fit(crew_model *m, const crew_dataset *train, const crew_fit_options *opts,
                           crew_fit_result *result)
{
    if (!m || !train || !opts || !result) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_fit: NULL argument");
    memset(result, 0, sizeof *result);
    result->test_loss = result->test_accuracy = NAN;
    fit_run run = {.train = train, .opts = opts, .result = result};
    CREW_TRY(setup(m, &run, opts));
    const int n = run.plan.devices;
    crew_local_comm *lc;
    CREW_TRY(crew_local_comm_create(n, &lc));
    replica *reps = calloc((size_t)n, sizeof *reps);
    if (!reps) {
        crew_local_comm_free(lc);
        return CREW_OOM();
    }
    crew_status s = CREW_OK;
    int prepared = 0;
    for (int i = 0; i < n && !s; i++, prepared++) {
        reps[i] = (replica){.rank = i, .comm = crew_local_comm_rank(lc, i), .run = &run};
        crew_model *rm = m;
        if (i > 0) s = crew_model_clone(m, &rm);
        if (!s) {
            if (i > 0) rm->compile = m->compile;
            s = prepare_replica(&reps[i], rm, &run.plan);
        }
    }
    double start = crew_now();
    int started = 0;
    for (int i = 1; i < n && !s; i++, started++)
        if (pthread_create(&reps[i].thread, NULL, replica_thread, &reps[i]) != 0)
            s = crew_errorf(CREW_CODE_INTERNAL, "could not start the thread of replica %d", i);
    if (!s) {
        replica_thread(&reps[0]);
    } else if (started) {
        reps[0].comm.ops->abort(reps[0].comm.ctx, 0);
    }
    for (int i = 1; i <= started; i++) pthread_join(reps[i].thread, NULL);
    if (!s) s = first_error(reps, n);
    else crew_status_free(first_error(reps, n));
    result->wall_s = crew_now() - start;
    result->samples_per_s = run.train_s > 0 ? (double)result->steps * (double)run.plan.global_batch / run.train_s : 0;
    for (int i = 0; i < prepared; i++) release_replica(&reps[i], i > 0);
    free(reps);
    crew_local_comm_free(lc);
    return s;
}
