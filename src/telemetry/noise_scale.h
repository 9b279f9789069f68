/* noise_scale.h — the gradient noise scale of a run, from what its replicas already compute
 * (McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training", appendix A).
 *
 * A step's global batch B is made of micro-batches of b samples (a replica's, or one of an
 * accumulation's). Each micro-batch's gradient G_b is an unbiased estimate of the true gradient G
 * with covariance Σ/b; the step's gradient G_B one with Σ/B. So, with S the mean of |G_b|² over
 * the step's micro-batches and L = |G_B|²:
 *     E[S] = |G|² + tr(Σ)/b,   E[L] = |G|² + tr(Σ)/B
 * and two unbiased estimates follow:
 *     |G|² ≈ (B·L − b·S) / (B − b),    tr(Σ) ≈ (S − L) / (1/b − 1/B).
 * Each is noisy step to step (a single step's |G|² estimate can be negative), so each is smoothed
 * on its own, as the paper does, by an exponential moving average (bias-corrected, so that the
 * first steps are not pulled towards zero), and the simple noise scale is their ratio:
 *     B_simple = tr(Σ) / |G|²,
 * the batch size at which the gradient's noise and its signal are equal: well below it, a larger
 * batch makes nearly proportionally more progress per step; well above it, almost none. */
#ifndef CREW_TELEMETRY_NOISE_SCALE_H
#define CREW_TELEMETRY_NOISE_SCALE_H

#include <stddef.h>
#include <stdint.h>

/* The moving averages' weight of the past per step: a time constant of about 100 steps, whatever
 * the steps between measurements. */
#define CREW_NOISE_SCALE_DECAY 0.99

typedef struct crew_noise_scale {
    double decay;                      /* per measurement: CREW_NOISE_SCALE_DECAY^every */
    double ema_g2, ema_trace, weight;  /* the averages, and the bias correction's total weight */
    int64_t steps;                     /* steps measured */
    double g2, trace, b_simple;        /* the smoothed estimates now (NaN before the first step) */
} crew_noise_scale;

/* For a measurement every `every` steps (>= 1). */
void crew_noise_scale_init(crew_noise_scale *ns, int64_t every);
/* One step: S = small_sq (the mean |G_b|² of its micro-batches of b samples), L = big_sq (|G_B|² of
 * its global batch of B > b). Steps with a non-finite figure, or B <= b, are left out. */
void crew_noise_scale_add(crew_noise_scale *ns, double small_sq, int64_t b, double big_sq, int64_t B);
/* The run's figure in words, against its global batch (crew_fit_result.noise_text): its micro-batches
 * of small_batch samples, measured every `every` steps (0: not measured). */
void crew_noise_scale_text(const crew_noise_scale *ns, int64_t global_batch, int64_t small_batch, int64_t every,
                           char *buf, size_t len);
/* The two unbiased estimates of one step alone: *g2 = |G|², *trace = tr(Σ). */
void crew_noise_scale_estimates(double small_sq, int64_t b, double big_sq, int64_t B, double *g2, double *trace);

#endif
