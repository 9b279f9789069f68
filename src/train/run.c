/* run.c — what every launcher does for the ranks it starts, whatever they run on. */
#include <math.h>

#include "core/timer.h"
#include "data/loader.h"
#include "train/run.h"

/* The run's K loader threads shared out over the ranks, at least one each. */
static int loader_threads(const crew_run *run, int rank, int size)
{
    int k = run->opts->loader_threads > 0 ? run->opts->loader_threads : 1;
    int mine = k / size + (rank < k % size);
    return mine > 0 ? mine : 1;
}

/* The loader's slots in the rank's device's staging memory (pinned on a GPU), as floats: enough
 * of them for the bytes asked, 4-byte aligned or better, which inputs, labels and ids need. */
static void *staging_alloc(void *user, size_t bytes)
{
    const crew_backend *be = user;
    void *p = NULL;
    crew_status s = be->ops->host_alloc(be->ctx, CREW_DT_F32, (int64_t)((bytes + 3) / 4), &p);
    crew_status_free(s);
    return p;
}

static void staging_free(void *user, void *p)
{
    const crew_backend *be = user;
    be->ops->host_free(be->ctx, p);
}

int crew_run_inputs_in_place(const crew_run *run, const crew_backend *device)
{
    return device && device->ops->in_place && run->plan.stages <= 1;
}

crew_status crew_run_open_loader(const crew_run *run, int rank, int size, const crew_backend *device,
                                 const int *cpus, int n_cpus, crew_loader **out)
{
    const crew_fit_options *o = run->opts;
    int k = run->plan.accumulation;
    int prefetch = (o->prefetch > 0 ? o->prefetch : 2) + crew_run_inputs_in_place(run, device);
    crew_loader_options lo = {.threads = run->plan.loader_inline ? 0 : loader_threads(run, rank, size),
                              .prefetch = prefetch,
                              .augment = crew_augment_of(&o->augment, run->hooks.loader_slow_s),
                              .pad_last = o->pad_last_batch,
                              .reverse_rows = run->hooks.reverse_batch_rows,
                              /* sooner than the collectives: a replica stuck on its data then reports that,
                               * before the others report it missing */
                              .timeout_s = 0.8 * run->timeout_s,
                              .slot_alloc = device ? staging_alloc : NULL,
                              .slot_free = device ? staging_free : NULL,
                              .slot_user = (void *)device,
                              .cpus = cpus,
                              .n_cpus = n_cpus};
    if (run->hooks.rank) { /* test seams (hooks.h) */
        lo.order_epoch = run->hooks.rank->loader_epoch;
        lo.order_user = run->hooks.rank_user;
        lo.order_rank = rank;
        if (run->hooks.rank->loader_rank) rank = run->hooks.rank->loader_rank(run->hooks.rank_user, rank);
    }
    crew_loader_range range = {.batch = run->plan.batch_per_device, .micro = size * k, .first = rank * k, .count = k};
    return crew_loader_create(run->train, &lo, &range, run->plan.seed, out);
}

crew_epoch_info crew_run_epoch_info(const crew_run *run, int epoch, int64_t steps, double wall_s, double loss_sum,
                                    double correct_sum)
{
    const crew_fit_plan *p = &run->plan;
    crew_epoch_info info = {.epoch = epoch, .epochs = p->epochs, .steps = steps, .wall_s = wall_s, .test_loss = NAN,
                            .test_accuracy = NAN, .test_bits = NAN};
    double samples = (double)steps * (double)p->global_batch;
    info.train_loss = steps ? (float)(loss_sum / samples) : NAN;
    info.train_accuracy = steps ? (float)(correct_sum / samples) : NAN;
    info.samples_per_s = wall_s > 0.0 ? samples / wall_s : 0.0;
    return info;
}

crew_status crew_run_sinks_epoch(crew_run_sinks *sinks, const crew_fit_options *o, const crew_epoch_info *info)
{
    crew_fit_result *res = sinks->result;
    res->epochs = info->epoch + 1;
    res->train_loss = info->train_loss;
    res->train_accuracy = info->train_accuracy;
    res->test_loss = info->test_loss;
    res->test_accuracy = info->test_accuracy;
    res->test_bits = info->test_bits;
    crew_status s = crew_monitor_epoch(sinks->monitor, info);
    if (!s && o->on_epoch) o->on_epoch(o->user, info);
    return s;
}

int crew_run_checkpoint_due(const crew_run *run, const crew_run_sinks *sinks, int64_t step, int stopping)
{
    const crew_fit_options *o = run->opts;
    if (!sinks || !o->checkpoint_dir) return 0;
    return stopping || step == run->plan.total_steps || (o->checkpoint_every > 0 && step % o->checkpoint_every == 0) ||
           (o->checkpoint_every_s > 0 && crew_now() - sinks->last_checkpoint_time >= o->checkpoint_every_s);
}
