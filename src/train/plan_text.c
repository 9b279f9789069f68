/* plan_text.c — a fit's plan in words (crew_fit_plan_text): the lines crew train and crew.fit
 * print before a run starts, so that both front ends say the same. */
#include <stdarg.h>
#include <stdio.h>

#include "core/cpu.h"
#include "core/status.h"
#include "crew.h"

typedef struct text_out {
    char *buf;
    size_t len, used;
} text_out;

static void put(text_out *t, const char *fmt, ...) CREW_PRINTF(2, 3);
static void put(text_out *t, const char *fmt, ...)
{
    if (t->used >= t->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
    va_end(ap);
    t->used = n < 0 ? t->len : t->used + (size_t)n;
}

static const char *scaling_name(crew_lr_scaling s)
{
    return s == CREW_SCALE_LINEAR ? "linear" : s == CREW_SCALE_SQRT ? "sqrt" : "none";
}

/* The ways of the convolution layers, where any runs by the device's library. */
static void convolutions(text_out *t, const crew_fit_plan *p)
{
    static const char *const ways[] = {"auto", "im2col", "library"}; /* crew_conv_way's order */
    int n = 0, by_library = 0;
    for (const char *c = p->conv_choice; *c; c++) n++, by_library += *c == 'l';
    if (!by_library) return;
    const char *library = crew_device_kind_conv_library(p->device_kind, NULL);
    char how[32] = ", chosen per layer"; /* --conv auto's measurements, or a list */
    if (p->conv != CREW_CONV_AUTO) snprintf(how, sizeof how, " (--conv %s)", (unsigned)p->conv < 3 ? ways[p->conv] : "?");
    put(t, "      convolutions%s: %d of %d layers by %s where it runs their shape, the rest im2col + GEMM ('%s')\n", how,
        by_library, n, library ? library : "the device's library", p->conv_choice);
}

static void pipeline(text_out *t, const crew_fit_plan *p)
{
    put(t, "      pipeline: %d stages x %d replica%s = %d devices, %s schedule, %d micro-batches per step "
           "(ideal bubble %.0f%%)\n      ",
        p->stages, p->devices, p->devices == 1 ? "" : "s", p->stages * p->devices,
        p->pipeline_schedule == CREW_PIPELINE_GPIPE ? "GPipe" : "1F1B", p->accumulation,
        100.0 * (double)(p->stages - 1) / (double)(p->accumulation + p->stages - 1));
    for (int s = 0; s < p->stages; s++)
        put(t, "%sstage %d: layers %d-%d", s ? ", " : "", s, p->stage_first[s], p->stage_first[s + 1] - 1);
    put(t, "\n");
    if (p->processes > 1 && p->pipeline_processes > 1)
        put(t, "      across %d processes: each replica's stages span %d of them, %d stage%s in each; activations go "
               "between them over MPI\n", p->processes, p->pipeline_processes, p->stages / p->pipeline_processes,
            p->stages / p->pipeline_processes == 1 ? "" : "s");
    else if (p->processes > 1)
        put(t, "      across %d processes: %d whole replica%s in each; each stage's gradients summed over MPI\n",
            p->processes, p->devices / p->processes, p->devices / p->processes == 1 ? "" : "s");
}

/* Where the replicas' gradients are summed: one bucket after backward, or several beside it. */
static void buckets(text_out *t, const crew_fit_plan *p)
{
    if (p->buckets < 1 || p->shard >= CREW_SHARD_GRADIENTS) return; /* sharding()'s units say it */
    const char *stage = p->stages > 1 ? " per stage" : "", *how = p->shard_optimizer ? "reduce-scattered" : "all-reduced";
    if (p->bucket_rule == CREW_BUCKETS_BUSY_CORES) {
        put(t, "      gradients %s in one bucket%s by the replicas' own threads after backward: every core\n"
               "      computes, so a communication thread would take time from them\n", how, stage);
        return;
    }
    if (p->bucket_rule == CREW_BUCKETS_HOSTS && p->buckets > 1) {
        put(t, "      gradients %s in %d buckets%s of %g MiB, each on a communication thread as soon as backward\n"
               "      has completed it: the processes are on several hosts, and buckets of about 1/16 of the\n"
               "      gradients put the last layers' on the network while the first layers' backward runs\n",
            how, p->buckets, stage, p->bucket_mb);
        return;
    }
    const char *why = p->bucket_rule == CREW_BUCKETS_ASKED   ? "--bucket-mb"
                      : p->bucket_rule == CREW_BUCKETS_HOSTS ? "the smallest across hosts"
                                                             : "as PyTorch DDP";
    char size[64];
    snprintf(size, sizeof size, "%g MiB (%s)", p->bucket_mb, why);
    if (p->buckets == 1)
        put(t, "      gradients %s in one bucket%s of %s by the replicas' own threads after backward\n", how, stage,
            size);
    else
        put(t, "      gradients %s in %d buckets%s of %s, each on a communication thread as soon as\n"
               "      backward has completed it\n", how, p->buckets, stage, size);
}

/* cpus[0 .. n) as ranges: "0-3, 8-11". */
static void put_cpus(text_out *t, const int *cpus, int n)
{
    for (int i = 0, j; i < n; i = j + 1) {
        for (j = i; j + 1 < n && cpus[j + 1] == cpus[j] + 1; j++) continue;
        if (j > i)
            put(t, "%s%d-%d", i ? ", " : "", cpus[i], cpus[j]);
        else
            put(t, "%s%d", i ? ", " : "", cpus[i]);
    }
}

/* The cores the ranks are bound to (crew_fit_plan.bind_cores): the first ranks × threads CPUs of the
 * process's affinity mask, in rank order. */
static void binding(text_out *t, const crew_fit_plan *p)
{
    if (!p->bind_cores) return;
    const int ranks = p->devices * (p->stages > 1 ? p->stages : 1), want = ranks * p->threads_per_device;
    int cpus[1024];
    const int n = crew_cpu_list(cpus, want < 1024 ? want : 1024);
    const char *who = p->stages > 1 ? "rank" : "replica";
    if (ranks == 1) {
        put(t, "      the %s's thread%s bound to CPU%s ", who, p->threads_per_device > 1 ? "s" : "", want > 1 ? "s" : "");
        put_cpus(t, cpus, n);
        put(t, p->loader_inline ? "\n" : ", its loader threads with it\n");
        return;
    }
    char cores[32] = "a core";
    if (p->threads_per_device > 1) snprintf(cores, sizeof cores, "%d cores", p->threads_per_device);
    put(t, "      each %s bound to %s of its own%s (CPUs ", who, cores, p->loader_inline ? "" : ", its loader threads with it");
    put_cpus(t, cpus, n);
    put(t, ", in rank order)\n");
}

/* Where the batches are prepared, when not by loader threads (crew_fit_plan.loader_inline). */
static void loader(text_out *t, const crew_fit_plan *p)
{
    if (!p->loader_inline) return;
    const char *who = p->stages > 1 ? "rank" : "replica";
    if (p->loader_inline == 2)
        put(t, "      each %s prepares its own batches as it takes them: every core computes, so a loader\n"
               "      thread would take turns with a %s (--loader-inline off for threads)\n", who, who);
    else
        put(t, "      each %s prepares its own batches as it takes them (--loader-inline on)\n", who);
}

/* What the replicas shard (ZeRO-1/2/3), and how the units move. */
static void sharding(text_out *t, const crew_fit_plan *p)
{
    if (p->shard == CREW_SHARD_OPTIMIZER)
        put(t, "      optimizer state sharded across the %d replicas (--shard optimizer, ZeRO-1): each keeps and\n"
               "      updates 1/%d of it; gradients reduce-scattered, parameters all-gathered, the same weights bit\n"
               "      for bit\n", p->devices, p->devices);
    if (p->shard < CREW_SHARD_GRADIENTS) return;
    const int zero3 = p->shard == CREW_SHARD_PARAMETERS;
    put(t, "      --shard %s (ZeRO-%d): each of the %d replicas keeps 1/%d of the %s\n",
        crew_shard_level_name(p->shard), zero3 ? 3 : 2, p->devices, p->devices,
        zero3 ? "parameters, gradients and optimizer state" : "gradients and optimizer state");
    put(t, "      in %d units of about %g MiB of layers%s\n", p->shard_units, p->shard_unit_mb,
        p->shard_pinned_unit >= 0 ? " (one, holding a tied weight, kept through the step)" : "");
    if (zero3)
        put(t, "      each gathered before it runs, forward and backward, and its gradient reduce-scattered as\n"
               "      backward completes it; the same weights bit for bit\n%s",
            p->shard_overlap ? "" : "      backward writes a unit's gradient over its gathered parameters, no buffer of its own\n");
    else
        put(t, "      each unit's gradient reduce-scattered as backward completes it, the parameters all-gathered\n"
               "      after the update; the same weights bit for bit\n");
    if (p->shard_tied_late)
        put(t, "      the tied token table a unit like the others: %sits lm_head part of the gradient\n"
               "      computed just before the embedding's backward\n",
            zero3 ? "gathered again for the lm_head, " : "");
    put(t, "      %s\n", p->shard_overlap ? "the units' collectives on a communication thread, overlapping compute (two "
                                            "buffers of a unit)"
                                          : "the units' collectives on the replicas' own threads: every core computes\n"
                                            "      (--shard-overlap on would run them on a communication thread beside\n"
                                            "      compute)");
    if (p->accumulation > 1)
        put(t, "      with %d micro-batches a replica, the earlier micro-batches' gradients are kept whole for the\n"
               "      ordered sum\n", p->accumulation);
}

size_t crew_fit_plan_text(const crew_fit_plan *p, const char *devices, char *buf, size_t len)
{
    text_out t = {buf, len, 0};
    if (len) buf[0] = '\0';
    put(&t, "plan: %s (%d replica%s x %d BLAS thread%s), batch %lld per device x %d accumulation = global batch %lld\n",
        devices, p->devices, p->devices == 1 ? "" : "s", p->threads_per_device, p->threads_per_device == 1 ? "" : "s",
        (long long)p->batch_per_device, p->accumulation, (long long)p->global_batch);
    put(&t, "      %lld samples: %lld steps per epoch x %d epoch%s = %lld steps; seed %llu\n", (long long)p->train_samples,
        (long long)p->steps_per_epoch, p->epochs, p->epochs == 1 ? "" : "s", (long long)p->total_steps,
        (unsigned long long)p->seed);
    put(&t, "      learning rate %g (tuned for batch %lld) x %.4g (%s rule) = %g", (double)p->base_lr,
        (long long)p->base_batch, (double)p->lr_factor, scaling_name(p->scaling), (double)p->scaled_lr);
    if (p->warmup_steps) put(&t, ", warmup %lld steps from %g\n", (long long)p->warmup_steps, (double)p->warmup_start_lr);
    else put(&t, ", no warmup\n");
    if (p->stages > 1) pipeline(&t, p);
    sharding(&t, p);
    if (p->precision == CREW_PRECISION_BF16)
        put(&t, "      precision bf16: GEMM operands rounded to bfloat16, float32 sums; attention probabilities\n"
                "      kept in bfloat16; weights, gradients, optimizer state and other activations float32\n");
    if (p->attention_recompute)
        put(&t, "      attention probabilities recomputed in backward (--attention recompute): one buffer for\n"
                "      all transformer blocks, the same bits\n");
    convolutions(&t, p);
    buckets(&t, p);
    binding(&t, p);
    loader(&t, p);
    if (p->nccl)
        put(&t, "      collectives by NCCL, each replica on a GPU of its own%s\n",
            p->unordered_allreduce ? "" : ": crew's ordered sums from NCCL's sends, the same bits as one GPU accumulating");
    if (p->unordered_allreduce && p->nccl)
        put(&t, "      all-reduce: NCCL's own (--allreduce fast): the order of its sums, so the last bits of the\n"
                "      weights, may change with the GPU count, the topology and the NCCL version\n");
    else if (p->unordered_allreduce)
        put(&t, "      all-reduce between the processes: MPI's own (--allreduce fast): the order of its sums, so the\n"
                "      last bits of the weights, may change with the process count and the MPI library\n");
    return t.used;
}
