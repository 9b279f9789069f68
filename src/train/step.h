/* step.h — one replica's share of one optimizer step.
 *
 * The replica runs its micro-batches; as the backward pass of the last one completes each
 * gradient bucket (a contiguous range of the flat gradient buffer, counted from its end), the
 * bucket's all-reduce starts on the communication thread while earlier layers still compute.
 *
 * Summation order (the determinism contract): the global batch is a sequence of micro-batches;
 * replica r owns micro-batches r·k … r·k+k−1 (k = accumulation), and the gradient is their sum
 * in sequence order, whatever the number of replicas: one replica adds them up one by one; with
 * several, each keeps its k micro-batch gradients apart and the ordered all-reduce sums all of
 * them in (rank, index) order. So any replica count with the same micro-batches gives the same
 * bits. */
#ifndef CREW_TRAIN_STEP_H
#define CREW_TRAIN_STEP_H

#include "comm/comm_worker.h"
#include "crew.h"
#include "nn/model.h"
#include "telemetry/record.h"
#include "train/hooks.h"


typedef struct crew_stepper {
    crew_model *m;
    crew_comm_worker *worker;   /* NULL with one replica: nothing to reduce */
    int rank, replicas;
    int64_t batch;              /* rows per micro-batch */
    int accumulation;           /* micro-batches per replica per step */
    int64_t global_batch;
    int sync_bn;
    /* the run's test seams (hooks.h: accumulates, bucket); NULL in real runs */
    const crew_rank_hooks *hooks;
    void *hooks_user;
    crew_hook_rank *who;
    float *acc;                 /* [n_params] one replica, k > 1: the running sum */
    float **saved;              /* [k − 1][n_params] several replicas, k > 1: earlier micro-batches */
    /* buckets, numbered from the end of the buffer: bucket b = [lo[b], hi[b]) */
    int n_buckets;
    int64_t *lo, *hi;
    crew_comm_request *reqs;
    float **parts;              /* [n_buckets × k] the inputs of each bucket's ordered all-reduce */
    /* optimizer sharding (crew_stepper_shard): bucket b is reduce-scattered, rank r receiving its
     * part of the bucket, bucket_bounds[b · (replicas + 1) + r] .. [+ r + 1] (relative to lo[b]);
     * NULL: all-reduced */
    int64_t *bucket_bounds;
    /* The gradient noise scale's input (telemetry/noise_scale.h), when the step measures it: the sum
     * over this replica's micro-batches of |g|² of each one's gradient, summed as backward completes
     * each range of it (before it is added up or reduced); the first error of those sums. */
    int measure;
    double sq_small;
    crew_status measure_status;
    /* during a backward pass */
    int launched;
    int64_t done_from;          /* gradients in [done_from, n_params) are final for this micro-batch */
    int micro;
    float *final;               /* the buffer holding the summed gradient */
} crew_stepper;

/* Gradient buckets when none is asked for: as PyTorch DDP. */
#define CREW_DEFAULT_BUCKET_MB 25.0

/* Values per bucket of `bucket_mb` MiB, and the buckets n_params values make. */
int64_t crew_bucket_values(double bucket_mb);
int crew_bucket_count(int64_t n_params, double bucket_mb);
/* The smallest bucket size (in MiB, a multiple of 1/1024) that holds n_params values in one bucket. */
double crew_one_bucket_mb(int64_t n_params);
/* Buckets for processes on several hosts: n_params values in about CREW_HOSTS_BUCKETS of them (a
 * multiple of 1/1024 MiB), none under CREW_HOSTS_BUCKET_MIN_MB (a message's latency would outweigh
 * its bytes) nor over PyTorch DDP's 25 MB (a large model's buckets, as DDP's). Over a 1 Gbit/s link
 * 16 of the CNN's were the fastest of 1 to 34 (docs/PERFORMANCE.md, "Buckets across hosts"). */
#define CREW_HOSTS_BUCKETS 16
#define CREW_HOSTS_BUCKET_MIN_MB (64.0 / 1024.0)
double crew_hosts_bucket_mb(int64_t n_params);

crew_status crew_stepper_init(crew_stepper *s, crew_model *m, crew_comm_worker *worker, int rank, int replicas,
                              int64_t batch, int accumulation, double bucket_mb, int sync_bn);
void crew_stepper_release(crew_stepper *s);

/* Optimizer-state sharding (ZeRO stage 1): rank r owns parameters [bounds[r], bounds[r + 1]) of
 * the flat buffer, bounds [ranks + 1] from 0 to n_params, each start a multiple of
 * CREW_SHARD_ALIGN values (so a shard's vector loops run as the whole buffer's do). */
#define CREW_SHARD_ALIGN 16
void crew_shard_bounds(int64_t n_params, int ranks, int64_t *bounds);
/* From now on the stepper's buckets are reduce-scattered along `bounds` (crew_shard_bounds,
 * [replicas + 1]): the gradient it leaves holds the full sum in this rank's shard only (the rest is
 * this rank's own micro-batches'), the same bits there as an all-reduce would leave. */
crew_status crew_stepper_shard(crew_stepper *s, const int64_t *bounds);

/* The test seams the stepper consults (crew_rank_hooks.accumulates and .bucket), for rank `who`. */
void crew_stepper_hooks(crew_stepper *s, const crew_rank_hooks *hooks, void *user, crew_hook_rank *who);

/* A step, in the parts the rank program's schedule interleaves with its forward passes: begin
 * (measure: sum the micro-batches' squared gradient norms into sq_small),
 * then the backward pass of each of the replica's micro-batches in order (micro 0, 1, ..., on s->m
 * or a view of it: crew_model_view, whose gradients are s->m's), then finish, which waits for the
 * buckets and leaves the reduced gradient in *grad. finish takes the status of the passes (an
 * error still waits for the buckets in flight) and returns the first error. */
void crew_stepper_begin(crew_stepper *s, int measure);
crew_status crew_stepper_backward(crew_stepper *s, crew_model *view, int micro, const crew_pass *p);
crew_status crew_stepper_finish(crew_stepper *s, crew_status passes, crew_step_times *times, float **grad);

#endif
