/* cpu_optim.c — optimiser updates, one pass over the flat parameter buffer: the bodies of
 * backend/body/optim.h (their arithmetic is explained there), which the CUDA kernels run too,
 * with subnormals flushed to zero (cpu_denormals.h says why). */
#include "backend/body/optim.h"
#include "backend/cpu/cpu_denormals.h"
#include "backend/cpu/cpu_ops.h"

void cpu_sgd_update(void *ctx, float *restrict param, const float *restrict grad, float *restrict velocity, int64_t n,
                    float lr, float momentum, int nesterov, float weight_decay)
{
    (void)ctx;
    cpu_fp_mode was = cpu_flush_denormals();
    for (int64_t i = 0; i < n; i++) crew_body_sgd(param, grad, velocity, lr, momentum, nesterov, weight_decay, i);
    cpu_restore_fp_mode(was);
}

/* Up to this many values the update computes √v / √(1 − β2ᵗ) through the reciprocal in double
 * (optim.h: the same bits as the division), beyond it divides. Both loops give the same floats; they
 * differ in speed only. Measured (bench/bench_optim, one Sapphire Rapids core, docs/PERFORMANCE.md):
 * at 134656 values (the 2-replica MLP's shard), whose four arrays stay in the core's cache, the
 * division's divider is the bottleneck and the reciprocal is 1.16-1.20x faster; from 269322 on the
 * loop waits for memory and they are even, and at 4M values the reciprocal's loop was 9% slower. */
#define CPU_ADAM_RECIPROCAL_MAX ((int64_t)1 << 18)

void cpu_adamw_update(void *ctx, float *restrict param, const float *restrict grad, float *restrict m,
                      float *restrict v, int64_t n, const crew_adamw_consts *k)
{
    (void)ctx;
    const crew_adamw_consts kc = *k; /* a copy the loop's stores cannot alias */
    cpu_fp_mode was = cpu_flush_denormals();
    const double rc = 1.0 / (double)kc.bias_c2_sqrt;
    if (n <= CPU_ADAM_RECIPROCAL_MAX)
        for (int64_t i = 0; i < n; i++) crew_body_adamw_rc(param, grad, m, v, kc, rc, i);
    else
        for (int64_t i = 0; i < n; i++) crew_body_adamw(param, grad, m, v, kc, i);
    cpu_restore_fp_mode(was);
}

/* u may be grad itself: each element is read before it is written, and nothing else reads it. */
void cpu_adam_direction(void *ctx, const float *grad, float *restrict m, float *restrict v, float *u, int64_t n,
                        const crew_adamw_consts *k)
{
    (void)ctx;
    const crew_adamw_consts kc = *k;
    cpu_fp_mode was = cpu_flush_denormals();
    const double rc = 1.0 / (double)kc.bias_c2_sqrt;
    if (n <= CPU_ADAM_RECIPROCAL_MAX)
        for (int64_t i = 0; i < n; i++) crew_body_adam_direction_rc(grad, m, v, u, kc, rc, i);
    else
        for (int64_t i = 0; i < n; i++) crew_body_adam_direction(grad, m, v, u, kc, i);
    cpu_restore_fp_mode(was);
}
