/* cli_output.c — printing shared by the verbs: the training plan and JSON values. */
#include <math.h>
#include <stdio.h>

#include "cli.h"

const char *cli_json_number(double v, char *buf, size_t len)
{
    if (!isfinite(v))
        snprintf(buf, len, "null");
    else
        snprintf(buf, len, "%.6g", v);
    return buf;
}

static const char *scaling_name(crew_lr_scaling s)
{
    return s == CREW_SCALE_LINEAR ? "linear" : s == CREW_SCALE_SQRT ? "sqrt" : "none";
}

/* The ways of the convolution layers, where any runs by the device's library. */
static void print_convolutions(const crew_fit_plan *p)
{
    int n = 0, by_library = 0;
    for (const char *c = p->conv_choice; *c; c++) n++, by_library += *c == 'l';
    if (!by_library) return;
    const char *library = crew_device_kind_conv_library(p->device_kind, NULL);
    char how[32] = ", chosen per layer"; /* --conv auto's measurements, or a list */
    if (p->conv != CREW_CONV_AUTO) snprintf(how, sizeof how, " (--conv %s)", (unsigned)p->conv < 3 ? cli_conv_ways[p->conv] : "?");
    printf("      convolutions%s: %d of %d layers by %s where it runs their shape, the rest im2col + GEMM ('%s')\n", how,
           by_library, n, library ? library : "the device's library", p->conv_choice);
}

void cli_print_plan(const crew_fit_plan *p, const char *devices)
{
    printf("plan: %s (%d replica%s x %d BLAS thread%s), batch %lld per device x %d accumulation = global batch %lld\n",
           devices, p->devices, p->devices == 1 ? "" : "s", p->threads_per_device, p->threads_per_device == 1 ? "" : "s",
           (long long)p->batch_per_device, p->accumulation, (long long)p->global_batch);
    printf("      %lld samples: %lld steps per epoch x %d epoch%s = %lld steps; seed %llu\n", (long long)p->train_samples,
           (long long)p->steps_per_epoch, p->epochs, p->epochs == 1 ? "" : "s", (long long)p->total_steps,
           (unsigned long long)p->seed);
    printf("      learning rate %g (tuned for batch %lld) x %.4g (%s rule) = %g", (double)p->base_lr,
           (long long)p->base_batch, (double)p->lr_factor, scaling_name(p->scaling), (double)p->scaled_lr);
    if (p->warmup_steps)
        printf(", warmup %lld steps from %g\n", (long long)p->warmup_steps, (double)p->warmup_start_lr);
    else
        printf(", no warmup\n");
    if (p->stages > 1) {
        char stages[512];
        cli_pipeline_stages_text(p, stages, sizeof stages);
        printf("      pipeline: %d stages x %d replica%s = %d devices, %s schedule, %d micro-batches per step "
               "(ideal bubble %.0f%%)\n      %s\n",
               p->stages, p->devices, p->devices == 1 ? "" : "s", p->stages * p->devices,
               p->pipeline_schedule == CREW_PIPELINE_GPIPE ? "GPipe" : "1F1B", p->accumulation,
               100.0 * (double)(p->stages - 1) / (double)(p->accumulation + p->stages - 1), stages);
        if (p->processes > 1 && p->pipeline_processes > 1)
            printf("      across %d processes: each replica's stages span %d of them, %d stage%s in each; activations "
                   "go between them over MPI\n", p->processes, p->pipeline_processes, p->stages / p->pipeline_processes,
                   p->stages / p->pipeline_processes == 1 ? "" : "s");
        else if (p->processes > 1)
            printf("      across %d processes: %d whole replica%s in each; each stage's gradients summed over MPI\n",
                   p->processes, p->devices / p->processes, p->devices / p->processes == 1 ? "" : "s");
    }
    if (p->shard_optimizer)
        printf("      optimizer state sharded across the %d replicas (--shard-optimizer): each keeps and updates 1/%d\n"
               "      of it; gradients reduce-scattered, parameters all-gathered, the same weights bit for bit\n",
               p->devices, p->devices);
    if (p->precision == CREW_PRECISION_BF16)
        printf("      precision bf16: GEMM operands rounded to bfloat16, float32 sums; attention probabilities\n"
               "      kept in bfloat16; weights, gradients, optimizer state and other activations float32\n");
    if (p->attention_recompute)
        printf("      attention probabilities recomputed in backward (--attention recompute): one buffer for\n"
               "      all transformer blocks, the same bits\n");
    print_convolutions(p);
    if (p->nccl)
        printf("      collectives by NCCL, each replica on a GPU of its own%s\n",
               p->unordered_allreduce ? "" : ": crew's ordered sums from NCCL's sends, the same bits as one GPU accumulating");
    if (p->unordered_allreduce && p->nccl)
        printf("      all-reduce: NCCL's own (--allreduce fast): the order of its sums, so the last bits of the\n"
               "      weights, may change with the GPU count, the topology and the NCCL version\n");
    else if (p->unordered_allreduce)
        printf("      all-reduce between the processes: MPI's own (--allreduce fast): the order of its sums, so the\n"
               "      last bits of the weights, may change with the process count and the MPI library\n");
}
