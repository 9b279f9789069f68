/* pipeline_rank.c — the rank program of one pipeline stage (pipeline.h): its layers on its device,
 * the schedule's passes of every step, the stage's gradient all-reduce with the same stage of the
 * other replicas, the update of its own parameters and optimizer state.
 *
 * What the run shares goes over the run's communicator (all D·K ranks): each step's metrics
 * matrix (as loop.c's, with a row per rank), and the whole model gathered by global rank 0
 * (stage 0 of replica 0) into the caller's model, in host memory, when it evaluates, saves a
 * checkpoint and ends: the stages of replica 0 send their slices, which are contiguous in the
 * whole model's buffers (model_stage.c), through a staging buffer on rank 0's device the size of
 * the largest slice, so no device ever holds more than its stage. The checkpoints and weights of
 * a pipeline are a data-parallel run's, and a run resumes on any layout. Rank 0 decides when a checkpoint is due and says so in its row of the step's metrics,
 * so every rank gathers at the same step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/checkpoint.h"
#include "train/pipeline.h"
#include "train/step.h"
#include "train/train.h"

enum { M_LOSS, M_CORRECT, M_STOP, M_DUE, M_NONFINITE, M_TIMES, FIELDS = M_TIMES + CREW_STEP_TIMES_FIELDS };
_Static_assert(FIELDS == CREW_PIPELINE_METRIC_FIELDS, "the pipeline's metric row");

/* Message tags: a micro-batch's activation (forward) and gradient (backward), and the gathered
 * buffers (parameters, state, optimizer moments) of each stage. */
#define TAG_FORWARD(j) (2 * (j))
#define TAG_BACKWARD(j) (2 * (j) + 1)
#define TAG_GATHER(s, b) ((1 << 30) + 4 * (s) + (b))
#define TAG_TIMELINE(s) ((1 << 29) + (s))
#define TAG_START(b) ((1 << 28) + (b))

typedef struct stage_rank {
    int rank, size;                 /* of the run: rank = replica · stages + stage */
    int stage, stages, replica, replicas;
    const crew_run *run;
    crew_run_sinks *sinks;          /* global rank 0 only */
    const crew_backend *be;
    crew_comm world;                /* every rank of the run */
    crew_comm group;                /* this stage of every replica */
    crew_model **slot;              /* [n_slots] activation sets; slot[0] owns the stage's values */
    int n_slots;
    crew_optimizer opt;
    crew_comm_worker worker;
    int has_worker;
    crew_stepper stepper;
    crew_loader *loader;
    crew_queue *copy_q;
    crew_pipe_op *ops;              /* [2 · accumulation] this stage's passes of a step */
    int64_t rows;                   /* per micro-batch */
    int64_t in_values, out_values;  /* per sample: the stage's input and output */
    /* where every stage's values lie in the whole model's buffers: [stages + 1] */
    int64_t *param_at, *state_at;
    double *dev_scratch;            /* [size · FIELDS] device */
    double *metrics;                /* [size · FIELDS] host */
    crew_step_times *times;         /* [size] */
    double busy_s, step_s;          /* this run's forward and backward time, and its steps' */
    /* the timeline of the step's passes (crew_now() at each start and end), sent to rank 0 for
     * the sampled steps: host [2 · 2 · accumulation], device [same] */
    double *tl, *tl_dev;
    double *tl_all;                 /* rank 0: [stages × 2 · 2 · accumulation] host */
    crew_pipe_timing *tl_ops;       /* rank 0: [stages × 2 · accumulation] */
    crew_pipe_op *tl_order;         /* rank 0: [2 · accumulation] a stage's order of passes */
    /* global rank 0: the optimizer state of the whole model in host memory (on the caller's
     * model's device; the caller's model holds the values), gathered from the stages through
     * staging, [largest slice] on rank 0's device */
    crew_optimizer whole_opt;
    int has_whole_opt;
    float *staging;
    int64_t staging_n;
    int64_t gathered_step;          /* the step after which the last gather ran (-1: none) */
} stage_rank;

static int first_stage(const stage_rank *r) { return r->stage == 0; }
static int last_stage(const stage_rank *r) { return r->stage == r->stages - 1; }

/* ------------------------------------------------------------------ set-up */

static crew_status copy_start_optimizer(stage_rank *r)
{
    const crew_run *run = r->run;
    if (!run->start_opt) return CREW_OK;
    int64_t at = r->param_at[r->stage], n = r->opt.n;
    for (int i = 0; i < 2; i++)
        if (r->opt.slot[i] && run->start_opt->slot[i])
            CREW_TRY(crew_dev_transfer_f32(r->be, r->opt.slot[i], &run->start->be, run->start_opt->slot[i] + at, n));
    r->opt.t = run->start_opt->t;
    return CREW_OK;
}

static crew_status set_up(stage_rank *r)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    const crew_model *start = run->start;
    const int k = p->accumulation;
    r->param_at = calloc((size_t)r->stages + 1, sizeof *r->param_at);
    r->state_at = calloc((size_t)r->stages + 1, sizeof *r->state_at);
    r->ops = calloc((size_t)2 * (size_t)k, sizeof *r->ops);
    r->n_slots = crew_pipeline_slots((crew_pipeline_schedule)p->pipeline_schedule, r->stages, r->stage, k);
    r->slot = calloc((size_t)r->n_slots, sizeof *r->slot);
    r->metrics = calloc((size_t)r->size * FIELDS, sizeof *r->metrics);
    r->times = calloc((size_t)r->size, sizeof *r->times);
    r->tl = calloc((size_t)4 * (size_t)k, sizeof *r->tl);
    if (!r->param_at || !r->state_at || !r->ops || !r->slot || !r->metrics || !r->times || !r->tl) return CREW_OOM();
    for (int s = 0; s < r->stages; s++) crew_model_stage_offsets(start, p->stage_first[s], &r->param_at[s], &r->state_at[s]);
    r->param_at[r->stages] = start->n_params;
    r->state_at[r->stages] = start->n_state;
    crew_pipeline_ops((crew_pipeline_schedule)p->pipeline_schedule, r->stages, r->stage, k, r->ops);

    CREW_TRY(crew_model_stage(start, p->stage_first[r->stage], p->stage_first[r->stage + 1], r->be, &r->slot[0]));
    crew_model_set_conv_ways(r->slot[0], start, p->conv_choice); /* before the views, which copy them */
    crew_act_storage store = crew_act_storage_for(p->precision, p->attention_recompute);
    crew_model_set_storage(r->slot[0], &store);
    r->rows = p->batch_per_device;
    CREW_TRY(crew_model_reserve(r->slot[0], r->rows));
    for (int i = 1; i < r->n_slots; i++) CREW_TRY(crew_model_view(r->slot[0], r->rows, &r->slot[i]));
    crew_model *m = r->slot[0];
    r->in_values = crew_shape_size(&m->input);
    crew_shape out = crew_model_output_shape(m);
    r->out_values = crew_shape_size(&out);
    CREW_TRY(crew_optimizer_init(&r->opt, &m->compile.optimizer, r->be, m->n_params));
    CREW_TRY(copy_start_optimizer(r));
    CREW_TRY(r->be->ops->alloc(r->be->ctx, CREW_DT_F64, (int64_t)r->size * FIELDS, (void **)&r->dev_scratch));
    CREW_TRY(r->be->ops->queue_create(r->be->ctx, &r->copy_q));
    CREW_TRY(r->be->ops->alloc(r->be->ctx, CREW_DT_F64, (int64_t)4 * k, (void **)&r->tl_dev));
    if (r->replicas > 1) {
        CREW_TRY(crew_comm_worker_start(&r->worker, r->group, run->timeout_s));
        r->has_worker = 1;
    }
    CREW_TRY(crew_stepper_init(&r->stepper, m, r->has_worker ? &r->worker : NULL, r->replica, r->replicas, r->rows, k,
                               run->bucket_mb, run->sync_bn));
    if (r->sinks) {
        crew_model *w = r->sinks->model;
        CREW_TRY(crew_optimizer_init(&r->whole_opt, &m->compile.optimizer, &w->be, w->n_params));
        r->has_whole_opt = 1;
        for (int s = 0; s < r->stages; s++) {
            int64_t np = r->param_at[s + 1] - r->param_at[s], ns = r->state_at[s + 1] - r->state_at[s];
            if (np > r->staging_n) r->staging_n = np;
            if (ns > r->staging_n) r->staging_n = ns;
        }
        CREW_TRY(crew_dev_alloc_f32(r->be, r->staging_n, &r->staging));
        r->tl_all = calloc((size_t)r->stages * 4 * (size_t)k, sizeof *r->tl_all);
        r->tl_ops = calloc((size_t)r->stages * 2 * (size_t)k, sizeof *r->tl_ops);
        r->tl_order = calloc((size_t)2 * (size_t)k, sizeof *r->tl_order);
        if (!r->tl_all || !r->tl_ops || !r->tl_order) return CREW_OOM();
    }
    return CREW_OK;
}

/* Across processes the caller's model is a different one in each process, and only process 0's
 * holds the run's starting point (a resumed run's checkpoint is read there alone): global rank 0
 * sends every rank of the other processes its stage's slice of the parameters, the state and,
 * when resumed, the optimizer state, as rank.c's broadcast does for data parallelism. A header
 * ({optimizer state follows, its step}) comes first; the values go through rank 0's staging. */
static crew_status share_start(stage_rank *r)
{
    const crew_run *run = r->run;
    const int per_process = r->size / (run->plan.processes > 1 ? run->plan.processes : 1);
    if (per_process == r->size || (r->rank != 0 && r->rank < per_process)) return CREW_OK;
    const double timeout = run->timeout_s;
    crew_model *m = r->slot[0];
    if (r->rank != 0) {
        double head[2];
        CREW_TRY(crew_recv(&r->world, r->dev_scratch, 2, CREW_COMM_F64, 0, TAG_START(0), timeout));
        CREW_TRY(r->be->ops->download(r->be->ctx, head, r->dev_scratch, 2, CREW_DT_F64));
        if (m->n_params) CREW_TRY(crew_recv(&r->world, m->params, m->n_params, CREW_COMM_F32, 0, TAG_START(1), timeout));
        if (m->n_state) CREW_TRY(crew_recv(&r->world, m->state, m->n_state, CREW_COMM_F32, 0, TAG_START(2), timeout));
        for (int i = 0; i < 2 && head[0] != 0.0 && r->opt.n; i++)
            if (r->opt.slot[i])
                CREW_TRY(crew_recv(&r->world, r->opt.slot[i], r->opt.n, CREW_COMM_F32, 0, TAG_START(3 + i), timeout));
        r->opt.t = (int64_t)head[1];
        return CREW_OK;
    }
    const crew_model *start = run->start;
    const crew_optimizer *so = run->start_opt;
    const double head[2] = {so ? 1.0 : 0.0, so ? (double)so->t : 0.0};
    CREW_TRY(r->be->ops->upload(r->be->ctx, NULL, r->dev_scratch, head, 2, CREW_DT_F64));
    for (int g = per_process; g < r->size; g++) {
        const int st = g % r->stages;
        const int64_t pa = r->param_at[st], np = r->param_at[st + 1] - pa, sa = r->state_at[st],
                      ns = r->state_at[st + 1] - sa;
        CREW_TRY(crew_send(&r->world, r->dev_scratch, 2, CREW_COMM_F64, g, TAG_START(0), timeout));
        const float *from[4] = {start->params + pa, start->n_state ? start->state + sa : NULL,
                                so && so->slot[0] ? so->slot[0] + pa : NULL, so && so->slot[1] ? so->slot[1] + pa : NULL};
        const int64_t count[4] = {np, ns, np, np};
        for (int b = 0; b < 4; b++) {
            /* what the receiver expects: the values it has any of, the moments its optimizer keeps */
            if (!count[b] || !from[b]) continue;
            CREW_TRY(crew_dev_transfer_f32(r->be, r->staging, &start->be, from[b], count[b]));
            CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
            CREW_TRY(crew_send(&r->world, r->staging, count[b], CREW_COMM_F32, g, TAG_START(1 + b), timeout));
        }
    }
    return CREW_OK;
}

static void tear_down(stage_rank *r)
{
    crew_comm_worker_stop(&r->worker);
    crew_stepper_release(&r->stepper);
    if (r->copy_q) r->be->ops->queue_destroy(r->be->ctx, r->copy_q);
    crew_dev_free(r->be, r->dev_scratch);
    crew_dev_free(r->be, r->tl_dev);
    free(r->tl);
    free(r->tl_all);
    free(r->tl_ops);
    free(r->tl_order);
    crew_optimizer_release(&r->opt, r->be);
    if (r->has_whole_opt) crew_optimizer_release(&r->whole_opt, &r->sinks->model->be);
    crew_dev_free(r->be, r->staging);
    for (int i = r->n_slots - 1; r->slot && i >= 0; i--) crew_model_free(r->slot[i]); /* views before their owner */
    free(r->slot);
    free(r->ops);
    free(r->param_at);
    free(r->state_at);
    free(r->metrics);
    free(r->times);
}

/* ------------------------------------------------------------------ one step's passes */

typedef struct step_ctx {
    int epoch;
    int64_t epoch_step, step; /* step: 0-based, for dropout */
    crew_step_totals tot;
    crew_step_times times;
} step_ctx;

static crew_status recv_timed(stage_rank *r, void *buf, int64_t n, int peer, int tag, crew_step_times *t)
{
    double t0 = crew_now();
    crew_status s = crew_recv(&r->world, buf, n, CREW_COMM_F32, peer, tag, r->run->timeout_s);
    t->comm_exposed_s += crew_now() - t0;
    return s;
}

/* The device's compute must be done before a send reads its output from the host. */
static crew_status send_after(stage_rank *r, const void *buf, int64_t n, int peer, int tag)
{
    CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
    return crew_send(&r->world, buf, n, CREW_COMM_F32, peer, tag, r->run->timeout_s);
}

/* Micro-batch `micro` of the step from the loader into the slot: the input on the first stage,
 * the labels on the last, the sample ids (dropout's masks) on every stage. */
static crew_status load(stage_rank *r, crew_model *m, step_ctx *c, int micro)
{
    const crew_backend_ops *o = r->be->ops;
    void *ctx = r->be->ctx;
    int index = r->replica * r->run->plan.accumulation + micro;
    double t0 = crew_now(), waited = 0.0;
    crew_loader_batch lb;
    CREW_TRY(crew_error_prefix(crew_loader_take(r->loader, c->epoch, c->epoch_step, index, &lb, &waited),
                               "stage %d of replica %d, ", r->stage, r->replica));
    /* after the work that may still read the slot's buffers on a GPU (loop.c's next_batch) */
    crew_status s = o->queue_wait(ctx, r->copy_q, NULL);
    if (!s && first_stage(r)) s = o->upload(ctx, r->copy_q, m->act[0], lb.x, r->rows * r->in_values, CREW_DT_F32);
    if (!s && last_stage(r))
        s = o->upload(ctx, r->copy_q, m->labels, lb.y, r->rows * crew_model_positions(m), CREW_DT_I32);
    if (!s) s = o->upload(ctx, r->copy_q, m->sample_ids, lb.ids, r->rows, CREW_DT_I64);
    if (!s) s = o->queue_wait(ctx, NULL, r->copy_q);
    if (!s) s = o->sync(ctx, r->copy_q);
    crew_loader_release(r->loader, c->epoch, c->epoch_step, index);
    c->times.data_s += crew_now() - t0;
    return s;
}

/* Synchronised batch norm: the statistics summed over this stage of every replica, which run
 * the same schedule, so their collectives come in the same order. */
static crew_status sync_sum(void *user, double *buf, int64_t n)
{
    stage_rank *r = user;
    return crew_comm_worker_allreduce(&r->worker, buf, n, CREW_COMM_F64, CREW_REDUCE_SUM);
}

static crew_pass pass_of(stage_rank *r, crew_model *m, const step_ctx *c)
{
    crew_pass p = {.be = r->be, .rows = r->rows, .training = 1, .seed = r->run->plan.seed, .step = c->step,
                   .sample_ids = m->sample_ids, .total_rows = (double)r->rows};
    if (r->stepper.sync_bn) {
        p.sync_sum = sync_sum;
        p.sync_user = r;
        p.total_rows = (double)r->rows * r->replicas;
    }
    return p;
}

/* Pass i of the step (micro-batch `micro`): its timeline entry spans the compute and the send,
 * not the waits for data and for the neighbour. */
static crew_status forward(stage_rank *r, step_ctx *c, int i, int micro)
{
    crew_model *m = r->slot[micro % r->n_slots];
    CREW_TRY(load(r, m, c, micro));
    if (!first_stage(r)) CREW_TRY(recv_timed(r, m->act[0], r->rows * r->in_values, r->rank - 1, TAG_FORWARD(micro), &c->times));
    crew_pass pass = pass_of(r, m, c);
    double t0 = r->tl[2 * i] = crew_now();
    CREW_TRY(crew_model_forward(m, &pass));
    if (last_stage(r)) {
        double loss = 0.0, correct = 0.0;
        CREW_TRY(crew_model_loss(m, &pass, 1.0f / (float)r->run->plan.global_batch, &loss, &correct));
        c->tot.loss_sum += loss;
        c->tot.correct += correct;
    }
    c->times.forward_s += crew_now() - t0;
    if (!last_stage(r))
        CREW_TRY(send_after(r, m->act[m->n_compute], r->rows * r->out_values, r->rank + 1, TAG_FORWARD(micro)));
    r->tl[2 * i + 1] = crew_now();
    return CREW_OK;
}

static crew_status backward(stage_rank *r, step_ctx *c, int i, int micro)
{
    crew_model *m = r->slot[micro % r->n_slots];
    if (!last_stage(r))
        CREW_TRY(recv_timed(r, m->dbuf[0], r->rows * r->out_values, r->rank + 1, TAG_BACKWARD(micro), &c->times));
    crew_pass pass = pass_of(r, m, c);
    double t0 = r->tl[2 * i] = crew_now();
    CREW_TRY(crew_stepper_backward(&r->stepper, m, micro, &pass));
    c->times.backward_s += crew_now() - t0;
    if (!first_stage(r))
        CREW_TRY(send_after(r, crew_model_input_grad(m), r->rows * r->in_values, r->rank - 1, TAG_BACKWARD(micro)));
    r->tl[2 * i + 1] = crew_now();
    return CREW_OK;
}

/* The schedule's passes, then the stage's gradients summed over the replicas. */
static crew_status gradients(stage_rank *r, step_ctx *c, float **grad)
{
    crew_stepper_begin(&r->stepper);
    crew_status s = CREW_OK;
    for (int i = 0; i < 2 * r->run->plan.accumulation && !s; i++)
        s = r->ops[i].backward ? backward(r, c, i, r->ops[i].micro) : forward(r, c, i, r->ops[i].micro);
    return crew_stepper_finish(&r->stepper, s, &c->times, grad);
}

/* ------------------------------------------------------------------ the whole model on rank 0 */

/* One slice (n values, at `at` in the whole model's buffer `into`, host memory of the caller's
 * model's device) from stage s of replica 0: its own buffer on rank 0, else received through
 * staging. */
static crew_status take_slice(stage_rank *r, int s, int b, const float *own, float *into, int64_t at, int64_t n)
{
    const crew_backend *host = &r->sinks->model->be;
    if (n == 0) return CREW_OK;
    if (s == 0) return crew_dev_transfer_f32(host, into + at, r->be, own, n);
    CREW_TRY(crew_recv(&r->world, r->staging, n, CREW_COMM_F32, s, TAG_GATHER(s, b), r->run->timeout_s));
    return crew_dev_transfer_f32(host, into + at, r->be, r->staging, n);
}

/* Replica 0's stages send their values after 1-based `step` to global rank 0, which puts them in
 * place in the caller's model and the host optimizer state; every replica holds the same values, so one copy is enough. */
static crew_status gather(stage_rank *r, int64_t step)
{
    /* Nothing ran since the last one (the last step's checkpoint, then the epoch's evaluation,
     * then the end of the run): every rank knows the step, so all skip together. */
    if (step == r->gathered_step) return CREW_OK;
    r->gathered_step = step;
    if (r->replica != 0) return CREW_OK;
    const double timeout = r->run->timeout_s;
    crew_model *m = r->slot[0];
    if (r->rank != 0) {
        CREW_TRY(send_after(r, m->params, m->n_params, 0, TAG_GATHER(r->stage, 0)));
        if (m->n_state) CREW_TRY(crew_send(&r->world, m->state, m->n_state, CREW_COMM_F32, 0, TAG_GATHER(r->stage, 1), timeout));
        for (int i = 0; i < 2 && m->n_params; i++)
            if (r->opt.slot[i])
                CREW_TRY(crew_send(&r->world, r->opt.slot[i], r->opt.n, CREW_COMM_F32, 0, TAG_GATHER(r->stage, 2 + i),
                                   timeout));
        return CREW_OK;
    }
    CREW_TRY(r->be->ops->sync(r->be->ctx, NULL));
    pthread_mutex_lock(&r->sinks->lock); /* the caller's model */
    crew_model *w = r->sinks->model;
    crew_status st = CREW_OK;
    for (int s = 0; s < r->stages && !st; s++) {
        int64_t pa = r->param_at[s], np = r->param_at[s + 1] - pa, sa = r->state_at[s], ns = r->state_at[s + 1] - sa;
        st = take_slice(r, s, 0, m->params, w->params, pa, np);
        if (!st) st = take_slice(r, s, 1, m->state, w->state, sa, ns);
        for (int i = 0; i < 2 && !st; i++)
            if (r->whole_opt.slot[i]) st = take_slice(r, s, 2 + i, r->opt.slot[i], r->whole_opt.slot[i], pa, np);
    }
    r->whole_opt.t = r->opt.t;
    w->initialized = 1;
    pthread_mutex_unlock(&r->sinks->lock);
    return st;
}

/* Test hook (verify's first-step check): the first step's summed gradients of every stage into
 * the caller's [n_params], on rank 0, from replica 0's stages. */
static crew_status gather_first_grads(stage_rank *r, const float *grad)
{
    float *host = r->run->hooks.first_grads;
    if (!host || r->replica != 0) return CREW_OK;
    int64_t n = r->slot[0]->n_params;
    if (r->rank != 0) return n ? send_after(r, grad, n, 0, TAG_GATHER(r->stage, 0)) : CREW_OK;
    pthread_mutex_lock(&r->sinks->lock); /* the caller's memory */
    crew_status st = n ? crew_dev_download_f32(r->be, host, grad, n) : CREW_OK;
    for (int s = 1; s < r->stages && !st; s++) {
        int64_t at = r->param_at[s], ns = r->param_at[s + 1] - at;
        if (!ns) continue;
        st = crew_recv(&r->world, r->staging, ns, CREW_COMM_F32, s, TAG_GATHER(s, 0), r->run->timeout_s);
        if (!st) st = crew_dev_download_f32(r->be, host + at, r->staging, ns);
    }
    pthread_mutex_unlock(&r->sinks->lock);
    return st;
}

/* ------------------------------------------------------------------ steps and epochs */

static crew_status allreduce_metrics(stage_rank *r)
{
    const crew_backend *be = r->be;
    int64_t n = (int64_t)r->size * FIELDS;
    CREW_TRY(be->ops->upload(be->ctx, NULL, r->dev_scratch, r->metrics, n, CREW_DT_F64));
    CREW_TRY(crew_allreduce(&r->world, r->dev_scratch, n, CREW_COMM_F64, CREW_REDUCE_SUM, r->run->timeout_s));
    return be->ops->download(be->ctx, r->metrics, r->dev_scratch, n, CREW_DT_F64);
}

static int cancel_requested(const stage_rank *r)
{
    if (!r->sinks || !r->run->opts->cancel) return 0;
    pthread_mutex_lock(&r->sinks->lock);
    int stop = __atomic_load_n(r->run->opts->cancel, __ATOMIC_RELAXED) != 0; /* a signal handler may set it */
    pthread_mutex_unlock(&r->sinks->lock);
    return stop;
}

static crew_status sink_event(const stage_rank *r, crew_event_kind kind, int64_t step, const char *msg)
{
    if (!r->sinks) return CREW_OK;
    pthread_mutex_lock(&r->sinks->lock);
    crew_status s = crew_monitor_event(r->sinks->monitor, kind, step, -1, NAN, "%s", msg);
    pthread_mutex_unlock(&r->sinks->lock);
    return s;
}

static crew_status write_checkpoint(stage_rank *r, int64_t step)
{
    CREW_TRY(gather(r, step));
    if (!r->sinks) return CREW_OK;
    const crew_fit_options *o = r->run->opts;
    crew_checkpoint_state st = {.step = step, .plan = r->run->plan, .lr = r->run->lr};
    pthread_mutex_lock(&r->sinks->lock);
    crew_status s = crew_checkpoint_write(o->checkpoint_dir, r->sinks->model, &r->whole_opt, &st, o->keep_checkpoints,
                                          r->sinks->result->last_checkpoint, sizeof r->sinks->result->last_checkpoint);
    r->sinks->last_checkpoint_time = crew_now();
    pthread_mutex_unlock(&r->sinks->lock);
    return s;
}

/* A step whose timeline goes into metrics.jsonl: every TIMELINE_EVERY-th and the last. */
#define TIMELINE_EVERY 100

static int timeline_step(const stage_rank *r, int64_t step)
{
    return step % TIMELINE_EVERY == 0 || step == r->run->plan.total_steps;
}

/* The stages of replica 0 send their passes' times to rank 0, which writes the step's timeline
 * (after the metrics all-reduce: everyone's forward and backward times are in r->times). */
static crew_status send_timeline(stage_rank *r, int64_t step, double step_s)
{
    if (r->replica != 0) return CREW_OK;
    const int k = r->run->plan.accumulation, n = 4 * k;
    const double timeout = r->run->timeout_s;
    const crew_backend_ops *o = r->be->ops;
    if (r->rank != 0) {
        CREW_TRY(o->upload(r->be->ctx, NULL, r->tl_dev, r->tl, n, CREW_DT_F64));
        CREW_TRY(o->sync(r->be->ctx, NULL));
        return crew_send(&r->world, r->tl_dev, n, CREW_COMM_F64, 0, TAG_TIMELINE(r->stage), timeout);
    }
    memcpy(r->tl_all, r->tl, (size_t)n * sizeof *r->tl);
    for (int s = 1; s < r->stages; s++) {
        CREW_TRY(crew_recv(&r->world, r->tl_dev, n, CREW_COMM_F64, s, TAG_TIMELINE(s), timeout));
        CREW_TRY(o->download(r->be->ctx, r->tl_all + (size_t)s * n, r->tl_dev, n, CREW_DT_F64));
    }
    double t0 = r->tl_all[0], bubble = 0.0, most = -1.0;
    for (int i = 0; i < r->stages * 2 * k; i++) t0 = r->tl_all[2 * i] < t0 ? r->tl_all[2 * i] : t0;
    int slowest = 0, n_ops = 0;
    crew_pipe_op *so = r->tl_order;
    for (int s = 0; s < r->stages; s++) {
        double busy = crew_step_compute_s(&r->times[s]); /* rank s is stage s of replica 0 */
        bubble += step_s > 0 ? (1.0 - busy / step_s) / r->stages : 0.0;
        if (busy > most) most = busy, slowest = s;
        /* the stage's order of passes, as it ran them */
        crew_pipeline_ops((crew_pipeline_schedule)r->run->plan.pipeline_schedule, r->stages, s, k, so);
        for (int i = 0; i < 2 * k; i++) {
            const double *t = r->tl_all + (size_t)s * n + 2 * i;
            r->tl_ops[n_ops++] = (crew_pipe_timing){s, so[i].micro, so[i].backward, t[0] - t0, t[1] - t0};
        }
    }
    const crew_fit_plan *p = &r->run->plan;
    crew_pipeline_record rec = {step, r->stages, r->replicas, k, p->pipeline_schedule == CREW_PIPELINE_GPIPE,
                                crew_pipeline_ideal_bubble(r->stages, k), bubble, step_s, slowest, n_ops, r->tl_ops};
    pthread_mutex_lock(&r->sinks->lock);
    crew_status st = crew_monitor_pipeline(r->sinks->monitor, &rec);
    pthread_mutex_unlock(&r->sinks->lock);
    return st;
}

/* The drift check: each stage's parameters, state (when batch norm is synchronised) and optimizer
 * moments hashed on every replica and compared with replica 0's of the same stage. */
static crew_status check_drift(stage_rank *r, int64_t step)
{
    crew_model *m = r->slot[0];
    const crew_fit_faults *f = &r->run->hooks.faults;
    if (f->corrupt_step == step && f->corrupt_rank == r->rank && m->n_params) { /* test fault */
        float v;
        CREW_TRY(crew_dev_download_f32(r->be, &v, m->params, 1));
        v += 1e-3f;
        CREW_TRY(crew_dev_upload_f32(r->be, m->params, &v, 1));
    }
    const float *buf[4] = {m->params, r->run->sync_bn ? m->state : NULL, r->opt.slot[0], r->opt.slot[1]};
    const int64_t n[4] = {m->n_params, m->n_state, r->opt.n, r->opt.n};
    static const char *const what[4] = {"parameters", "state", "optimizer's first moment", "optimizer's second moment"};
    double *row = r->metrics;
    memset(row, 0, (size_t)r->size * FIELDS * sizeof *row);
    for (int i = 0; i < 4; i++) {
        uint64_t x = 0;
        if (buf[i] && n[i] > 0) CREW_TRY(r->be->ops->hash(r->be->ctx, buf[i], n[i], CREW_DT_F32, &x));
        row[(size_t)r->rank * FIELDS + 2 * i] = (double)(uint32_t)(x >> 32); /* halves are exact in a double */
        row[(size_t)r->rank * FIELDS + 2 * i + 1] = (double)(uint32_t)x;
    }
    CREW_TRY(crew_error_prefix(allreduce_metrics(r), "step %lld, replica drift check: ", (long long)step));
    for (int st = 0; st < r->stages; st++) /* every rank judges every stage: they all stop alike */
    for (int d = 1; d < r->replicas; d++)
        for (int i = 0; i < 4; i++) {
            const double *a = row + (size_t)st * FIELDS + 2 * i;
            const double *b = row + ((size_t)d * r->stages + st) * FIELDS + 2 * i;
            if (a[0] == b[0] && a[1] == b[1]) continue;
            char msg[200];
            snprintf(msg, sizeof msg, "step %lld: replicas diverged: the %s of stage %d differ between replica 0 and "
                     "replica %d", (long long)step, what[i], st, d);
            CREW_TRY(sink_event(r, CREW_EVENT_DIVERGENCE, step, msg));
            return crew_errorf(CREW_CODE_DIVERGED, "%s", msg);
        }
    return CREW_OK;
}

typedef struct step_out {
    double loss, correct;
    int stop, skipped;
} step_out;

static crew_status report_step(stage_rank *r, const step_ctx *c, int64_t step, double step_s, double epoch_start,
                               int skipped)
{
    const crew_run *run = r->run;
    const crew_fit_plan *p = &run->plan;
    if (!r->sinks) return CREW_OK;
    double loss = 0.0, correct = 0.0;
    for (int q = 0; q < r->size; q++) {
        loss += r->metrics[(size_t)q * FIELDS + M_LOSS];
        correct += r->metrics[(size_t)q * FIELDS + M_CORRECT];
    }
    float lr = crew_lr_at(&run->lr, step - 1);
    crew_step_record rec = {step, c->epoch, crew_unix_now(), (float)(loss / (double)p->global_batch),
                            (float)(correct / (double)p->global_batch), lr, p->global_batch, step_s, skipped, r->size,
                            r->times};
    pthread_mutex_lock(&r->sinks->lock);
    crew_status s = crew_monitor_step(r->sinks->monitor, &rec);
    if (!s && run->opts->on_step) {
        const crew_step_times *t = &r->times[0];
        crew_step_info info = {step, p->total_steps, c->epoch, c->epoch_step + 1, p->steps_per_epoch, rec.loss,
                               rec.accuracy, lr, step_s, crew_now() - epoch_start, t->data_s, t->forward_s,
                               t->backward_s, t->comm_exposed_s, t->comm_hidden_s, t->optimizer_s};
        run->opts->on_step(run->opts->user, &info);
    }
    pthread_mutex_unlock(&r->sinks->lock);
    return s;
}

/* Test fault: a stage that stops arriving (it sleeps past the deadline, then fails by itself), as
 * a stuck device would. */
static crew_status inject_stall(const stage_rank *r, int64_t step)
{
    const crew_fit_faults *f = &r->run->hooks.faults;
    if (f->stall_step != step || f->stall_rank != r->rank) return CREW_OK;
    struct timespec ts = {(time_t)(r->run->timeout_s + 2.0), 0};
    nanosleep(&ts, NULL);
    return crew_errorf(CREW_CODE_TIMEOUT, "rank %d stalled on purpose at step %lld (test fault)", r->rank,
                       (long long)step);
}

/* A failed step: its place, and on rank 0 a missed deadline reported as a hang event first. */
static crew_status step_error(const stage_rank *r, crew_status s, int64_t step)
{
    s = crew_error_prefix(s, "step %lld, stage %d of replica %d: ", (long long)step, r->stage, r->replica);
    if (crew_status_code(s) == CREW_CODE_TIMEOUT && r->sinks) {
        pthread_mutex_lock(&r->sinks->lock);
        crew_status_free(crew_monitor_event(r->sinks->monitor, CREW_EVENT_HANG, step, -1, NAN, "%s",
                                            crew_status_message(s)));
        pthread_mutex_unlock(&r->sinks->lock);
    }
    return s;
}

/* One optimizer step; `step` is 1-based. */
static crew_status train_step(stage_rank *r, int epoch, int64_t epoch_step, int64_t step, double epoch_start,
                              step_out *out)
{
    const crew_run *run = r->run;
    double t0 = crew_now();
    step_ctx c = {.epoch = epoch, .epoch_step = epoch_step, .step = step - 1};
    float *grad = NULL;
    crew_status s = inject_stall(r, step);
    if (!s) s = gradients(r, &c, &grad);
    if (s) return step_error(r, s, step);
    if (step == run->start_step + 1) CREW_TRY(gather_first_grads(r, grad));
    double t1 = crew_now();
    int finite = 1;
    if (r->slot[0]->n_params) CREW_TRY(r->be->ops->all_finite(r->be->ctx, grad, r->slot[0]->n_params, &finite));
    memset(r->metrics, 0, (size_t)r->size * FIELDS * sizeof *r->metrics);
    double *row = r->metrics + (size_t)r->rank * FIELDS;
    row[M_LOSS] = c.tot.loss_sum;
    row[M_CORRECT] = c.tot.correct;
    row[M_STOP] = cancel_requested(r);
    row[M_DUE] = crew_run_checkpoint_due(r->run, r->sinks, step, row[M_STOP] > 0);
    row[M_NONFINITE] = !finite;
    c.times.optimizer_s = crew_now() - t1; /* the update's own time joins the next step's rows */
    memcpy(row + M_TIMES, &c.times, sizeof c.times);
    s = allreduce_metrics(r);
    if (s) return step_error(r, crew_error_prefix(s, "metrics all-reduce: "), step);
    int bad = 0;
    for (int q = 0; q < r->size; q++) {
        bad |= r->metrics[(size_t)q * FIELDS + M_NONFINITE] > 0;
        memcpy(&r->times[q], r->metrics + (size_t)q * FIELDS + M_TIMES, sizeof r->times[q]);
    }
    out->stop = r->metrics[M_STOP] > 0;
    out->skipped = bad;
    if (bad) {
        int stop = run->opts->on_nan == CREW_ON_NAN_STOP;
        char msg[160];
        snprintf(msg, sizeof msg, "step %lld: the gradients hold NaN or infinity; %s", (long long)step,
                 stop ? "stopping before the update" : "this update is skipped");
        CREW_TRY(sink_event(r, stop ? CREW_EVENT_NAN : CREW_EVENT_SKIPPED_UPDATE, step, msg));
        if (stop)
            return crew_errorf(CREW_CODE_NUMERIC, "step %lld: the gradients hold NaN or infinity; stopped before the "
                               "update (--on-nan skip would skip such steps instead)", (long long)step);
    } else if (r->slot[0]->n_params) {
        double t2 = crew_now();
        CREW_TRY(crew_optimizer_step(&r->opt, r->be, r->slot[0]->params, grad, crew_lr_at(&run->lr, step - 1), NULL));
        r->times[r->rank].optimizer_s += crew_now() - t2;
    } else {
        r->opt.t++; /* a stage without parameters counts the update too, for the checkpoint */
    }
    out->loss = out->correct = 0.0;
    for (int q = 0; q < r->size; q++) {
        out->loss += r->metrics[(size_t)q * FIELDS + M_LOSS];
        out->correct += r->metrics[(size_t)q * FIELDS + M_CORRECT];
    }
    double step_s = crew_now() - t0;
    r->step_s += step_s;
    r->busy_s += c.times.forward_s + c.times.backward_s;
    CREW_TRY(report_step(r, &c, step, step_s, epoch_start, bad));
    if (timeline_step(r, step)) CREW_TRY(send_timeline(r, step, step_s));
    if (r->metrics[M_DUE] > 0) CREW_TRY(write_checkpoint(r, step));
    /* last: it reuses the metrics matrix */
    if (run->drift_every > 0 && step % run->drift_every == 0) CREW_TRY(check_drift(r, step));
    return CREW_OK;
}

static crew_status finish_epoch(stage_rank *r, crew_epoch_info *info, int64_t step)
{
    const crew_fit_options *o = r->run->opts;
    if (o->test) {
        CREW_TRY(gather(r, step));
        if (r->sinks) { /* rank 0 alone evaluates the gathered model on the host; the others wait at the next step */
            double sums[2] = {0.0, 0.0};
            int64_t n = crew_dataset_size(o->test);
            pthread_mutex_lock(&r->sinks->lock);
            crew_model *w = r->sinks->model;
            crew_status s = crew_eval_range(w, o->test, 0, n, r->rows, &sums[0], &sums[1]);
            info->test_bits = crew_model_positions(w) > 1 ? (float)(sums[0] / (double)n / log(2.0)) : NAN;
            pthread_mutex_unlock(&r->sinks->lock);
            CREW_TRY(s);
            info->test_loss = (float)(sums[0] / (double)n);
            info->test_accuracy = (float)(sums[1] / (double)n);
        }
    }
    if (!r->sinks) return CREW_OK;
    pthread_mutex_lock(&r->sinks->lock);
    crew_status s = crew_run_sinks_epoch(r->sinks, o, info);
    pthread_mutex_unlock(&r->sinks->lock);
    return s;
}

static crew_status run_epoch(stage_rank *r, int epoch, int64_t *step, int *stopped)
{
    const crew_fit_plan *p = &r->run->plan;
    int64_t from = *step - (int64_t)epoch * p->steps_per_epoch;
    CREW_TRY(crew_loader_start_epoch(r->loader, epoch, from));
    double start = crew_now(), loss = 0.0, correct = 0.0;
    int64_t steps = 0;
    for (int64_t es = from; es < p->steps_per_epoch && *step < p->total_steps && !*stopped; es++) {
        step_out so = {0};
        CREW_TRY(train_step(r, epoch, es, *step + 1, start, &so));
        ++*step;
        loss += so.loss;
        correct += so.correct;
        steps++;
        if (r->sinks) {
            pthread_mutex_lock(&r->sinks->lock);
            r->sinks->result->skipped_updates += so.skipped;
            pthread_mutex_unlock(&r->sinks->lock);
        }
        *stopped = so.stop;
    }
    crew_epoch_info info = crew_run_epoch_info(r->run, epoch, steps, crew_now() - start, loss, correct);
    if (r->sinks) {
        pthread_mutex_lock(&r->sinks->lock);
        r->sinks->train_s += info.wall_s;
        pthread_mutex_unlock(&r->sinks->lock);
    }
    return finish_epoch(r, &info, *step);
}

/* The measured bubble: the share of the steps' time in which a stage did not compute (waiting for
 * its neighbours, for data, for the all-reduces and the update), the mean over the stages of
 * replica 0, next to the schedule's ideal; rank 0 reports it once, naming the busiest stage. */
static crew_status report_bubble(stage_rank *r, int64_t steps)
{
    double *row = r->metrics;
    memset(row, 0, (size_t)r->size * FIELDS * sizeof *row);
    if (r->replica == 0) {
        int64_t in_use = 0, peak = 0;
        if (r->be->ops->memory_used) r->be->ops->memory_used(r->be->ctx, &in_use, &peak);
        row[(size_t)r->rank * FIELDS] = r->busy_s;
        row[(size_t)r->rank * FIELDS + 1] = r->step_s;
        row[(size_t)r->rank * FIELDS + 2] = (double)peak; /* exact below 2^53 bytes */
    }
    CREW_TRY(allreduce_metrics(r));
    if (!r->sinks || steps == 0) return CREW_OK;
    double idle = 0.0, most = -1.0;
    int busiest = 0;
    for (int s = 0; s < r->stages; s++) {
        double busy = row[(size_t)s * FIELDS], total = row[(size_t)s * FIELDS + 1];
        idle += total > 0 ? (1.0 - busy / total) / r->stages : 0.0;
        if (busy > most) most = busy, busiest = s;
    }
    const crew_fit_plan *p = &r->run->plan;
    pthread_mutex_lock(&r->sinks->lock);
    crew_fit_result *res = r->sinks->result;
    res->stages = r->stages;
    res->bubble_fraction = idle;
    res->bottleneck_stage = busiest;
    for (int s = 0; s < r->stages; s++) res->stage_peak_bytes[s] = (int64_t)row[(size_t)s * FIELDS + 2];
    pthread_mutex_unlock(&r->sinks->lock);
    char msg[320];
    snprintf(msg, sizeof msg, "pipeline of %d stages, %s schedule, %d micro-batches per step: the stages computed "
             "%.0f%% of each step and waited %.0f%% (the ideal bubble is %.0f%%); stage %d is the bottleneck (%.4f s "
             "of forward and backward a step)", r->stages, p->pipeline_schedule == CREW_PIPELINE_GPIPE ? "GPipe" : "1F1B",
             p->accumulation, 100.0 * (1.0 - idle), 100.0 * idle,
             100.0 * crew_pipeline_ideal_bubble(r->stages, p->accumulation), busiest, most / (double)steps);
    return sink_event(r, CREW_EVENT_INFO, r->run->start_step + steps, msg);
}

static crew_status train(stage_rank *r)
{
    const crew_fit_plan *p = &r->run->plan;
    int64_t step = r->run->start_step;
    int stopped = 0;
    for (int epoch = (int)(step / p->steps_per_epoch); epoch < p->epochs && step < p->total_steps && !stopped; epoch++)
        CREW_TRY(run_epoch(r, epoch, &step, &stopped));
    CREW_TRY(report_bubble(r, step - r->run->start_step));
    CREW_TRY(gather(r, step));
    if (r->sinks) {
        pthread_mutex_lock(&r->sinks->lock);
        r->sinks->result->steps = step;
        crew_status s = CREW_OK; /* the caller's model holds the values already (gather) */
        if (r->run->hooks.final_moments) { /* m then v, [2 × n_params] */
            int64_t n = r->sinks->model->n_params;
            for (int i = 0; i < 2 && !s; i++) {
                float *host = r->run->hooks.final_moments + (size_t)i * (size_t)n;
                if (r->whole_opt.slot[i])
                    s = crew_dev_download_f32(&r->sinks->model->be, host, r->whole_opt.slot[i], n);
                else
                    memset(host, 0, (size_t)n * sizeof *host);
            }
        }
        pthread_mutex_unlock(&r->sinks->lock);
        CREW_TRY(s);
    }
    return CREW_OK;
}

crew_status crew_pipeline_rank_main(const crew_rank_ctx *ctx)
{
    const crew_fit_plan *p = &ctx->run->plan;
    stage_rank r = {.rank = ctx->rank, .size = ctx->size, .stage = ctx->stage, .stages = p->stages,
                    .replica = ctx->replica, .replicas = p->devices, .run = ctx->run, .sinks = ctx->sinks,
                    .be = &ctx->device, .world = ctx->comm, .group = ctx->stage_comm, .loader = ctx->loader,
                    .gathered_step = -1};
    crew_status s = set_up(&r);
    if (!s) s = share_start(&r);
    if (s) s = crew_error_prefix(s, "stage %d of replica %d: ", r.stage, r.replica);
    if (!s) s = train(&r);
    tear_down(&r);
    return s;
}
