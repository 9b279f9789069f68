/* noise_scale.c — the gradient noise scale's estimators and their smoothing (noise_scale.h). */
#include "telemetry/noise_scale.h"

#include <math.h>
#include <stdio.h>

void crew_noise_scale_init(crew_noise_scale *ns, int64_t every)
{
    *ns = (crew_noise_scale){.decay = pow(CREW_NOISE_SCALE_DECAY, (double)(every > 1 ? every : 1)), .g2 = NAN,
                             .trace = NAN, .b_simple = NAN};
}

void crew_noise_scale_estimates(double small_sq, int64_t b, double big_sq, int64_t B, double *g2, double *trace)
{
    const double bs = (double)b, bb = (double)B;
    *g2 = (bb * big_sq - bs * small_sq) / (bb - bs);
    *trace = (small_sq - big_sq) / (1.0 / bs - 1.0 / bb);
}

void crew_noise_scale_add(crew_noise_scale *ns, double small_sq, int64_t b, double big_sq, int64_t B)
{
    if (!(isfinite(small_sq) && isfinite(big_sq)) || b < 1 || B <= b) return;
    double g2, trace;
    crew_noise_scale_estimates(small_sq, b, big_sq, B, &g2, &trace);
    const double d = ns->decay;
    ns->ema_g2 = d * ns->ema_g2 + (1.0 - d) * g2;
    ns->ema_trace = d * ns->ema_trace + (1.0 - d) * trace;
    ns->weight = d * ns->weight + (1.0 - d);
    ns->steps++;
    ns->g2 = ns->ema_g2 / ns->weight;
    ns->trace = ns->ema_trace / ns->weight;
    /* A smoothed |G|² that is not positive yet (noise dominating the first steps) gives no ratio. */
    ns->b_simple = ns->g2 > 0.0 ? ns->trace / ns->g2 : NAN;
}

void crew_noise_scale_text(const crew_noise_scale *ns, int64_t global_batch, int64_t small_batch, int64_t every,
                           char *buf, size_t len)
{
    const long long B = (long long)global_batch;
    if (every <= 0 && global_batch <= small_batch) {
        snprintf(buf, len, "gradient noise scale: not measured: each step is one micro-batch of %lld samples, with no "
                 "smaller batch to hold it against (2 replicas, or --global-batch %lld on one, measure it)", B, 2 * B);
        return;
    }
    if (every <= 0) {
        snprintf(buf, len, "gradient noise scale: not measured (turned off)");
        return;
    }
    if (ns->steps == 0) {
        snprintf(buf, len, "gradient noise scale: no step measured it");
        return;
    }
    if (!isfinite(ns->b_simple)) {
        snprintf(buf, len, "gradient noise scale: too large to estimate (over the last steps measured, %lld in all, "
                 "the gradients' noise drowns their signal |G|^2): the global batch of %lld is likely far below it, "
                 "and a larger one would make nearly proportionally more progress a step", (long long)ns->steps, B);
        return;
    }
    const double ratio = (double)global_batch / ns->b_simple;
    const char *says = ratio < 0.1   ? "a larger global batch would make nearly proportionally more progress a step: "
                                       "more devices, at a learning rate scaled with the batch, pay"
                       : ratio < 1.0 ? "a larger global batch still makes more progress a step, with diminishing "
                                       "returns past the noise scale"
                                     : "past the noise scale a larger batch makes little more progress a step: more "
                                       "devices buy samples per second, not time to a result";
    /* the averages' time constant is about 100 training steps, whatever `every` is */
    char over[96];
    const char *one_in = every > 1 ? ", one in " : "";
    char gap[24] = "";
    if (every > 1) snprintf(gap, sizeof gap, "%lld", (long long)every);
    if (ns->steps * every > 100)
        snprintf(over, sizeof over, "smoothed over about the last 100 steps; %lld measured%s%s", (long long)ns->steps,
                 one_in, gap);
    else
        snprintf(over, sizeof over, "averaged over the %lld step%s measured%s%s", (long long)ns->steps,
                 ns->steps == 1 ? "" : "s", one_in, gap);
    snprintf(buf, len, "gradient noise scale B_simple = %.3g samples (%s); the global batch of %lld is %.2g of it: %s",
             ns->b_simple, over, B, ratio, says);
}
