/* cpu_norm.c — batch normalisation (split into reductions and applications, so the reductions
 * can be all-reduced for synchronised batch norm) and layer normalisation. x is [rows, c].
 * The formulas are backend/body/norm.h's, which the CUDA kernels run too: the column sums here
 * walk rows outer and columns inner (contiguous), the kernels a column at a time, each column's
 * terms in the same order; layer norm sums each row in the order of the kernels' warp
 * (cpu_lanes.h), so its bits are a GPU's. */
#include <string.h>

#include "backend/body/norm.h"
#include "backend/cpu/cpu_lanes.h"
#include "backend/cpu/cpu_ops.h"

/* Per-channel factors are computed for this many channels at a time, on the stack. */
#define CHUNK 256

void cpu_bn_col_sum(void *ctx, const float *x, int64_t rows, int64_t c, double *out)
{
    (void)ctx;
    for (int64_t j = 0; j < c; j++) out[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * c;
        for (int64_t j = 0; j < c; j++) out[j] += (double)row[j];
    }
}

void cpu_col_sqdev(void *ctx, const float *x, const float *mean, int64_t rows, int64_t c, double *out)
{
    (void)ctx;
    for (int64_t j = 0; j < c; j++) out[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * c;
        for (int64_t j = 0; j < c; j++) out[j] += crew_bn_sqdev_term(row[j], mean[j]);
    }
}

void cpu_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) crew_body_bn_scale_sums(alpha, x, y, i);
}

void cpu_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                    const float *beta, float eps, float *y, int64_t rows, int64_t c)
{
    (void)ctx;
    float scale[CHUNK], shift[CHUNK];
    for (int64_t c0 = 0; c0 < c; c0 += CHUNK) {
        int64_t n = c - c0 < CHUNK ? c - c0 : CHUNK;
        for (int64_t j = 0; j < n; j++)
            crew_bn_forward_factors(gamma[c0 + j], beta[c0 + j], mean[c0 + j], var[c0 + j], eps, &scale[j], &shift[j]);
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * c + c0;
            float *yr = y + r * c + c0;
            for (int64_t j = 0; j < n; j++) yr[j] = crew_bn_forward_apply(xr[j], scale[j], shift[j]);
        }
    }
}

void cpu_bn_backward_sums(void *ctx, const float *dy, const float *x, const float *mean, int64_t rows,
                          int64_t c, double *sum_dy, double *sum_dy_xmu)
{
    (void)ctx;
    for (int64_t j = 0; j < c; j++) sum_dy[j] = sum_dy_xmu[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * c, *xr = x + r * c;
        for (int64_t j = 0; j < c; j++) {
            sum_dy[j] += (double)dyr[j];
            sum_dy_xmu[j] += crew_bn_dy_xmu_term(dyr[j], xr[j], mean[j]);
        }
    }
}

void cpu_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                     const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                     double count, float *dx, int64_t rows, int64_t c)
{
    (void)ctx;
    /* the per-channel factors (crew_bn_backward_factors) a chunk of channels at a time */
    float k_dy[CHUNK], k_mean[CHUNK], k_x[CHUNK], means[CHUNK];
    for (int64_t c0 = 0; c0 < c; c0 += CHUNK) {
        int64_t n = c - c0 < CHUNK ? c - c0 : CHUNK;
        for (int64_t j = 0; j < n; j++) {
            crew_bn_backward_factors(var[c0 + j], gamma[c0 + j], eps, sum_dy[c0 + j], sum_dy_xmu[c0 + j], count,
                                     &k_dy[j], &k_mean[j], &k_x[j]);
            means[j] = mean[c0 + j];
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = dy + r * c + c0, *xr = x + r * c + c0;
            float *dxr = dx + r * c + c0;
            for (int64_t j = 0; j < n; j++)
                dxr[j] = crew_bn_backward_apply(dyr[j], xr[j], means[j], k_dy[j], k_mean[j], k_x[j]);
        }
    }
}

void cpu_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy,
                        const double *sum_dy_xmu, float *dgamma, float *dbeta, int64_t c)
{
    (void)ctx;
    for (int64_t j = 0; j < c; j++) crew_body_bn_param_grads(var, eps, sum_dy, sum_dy_xmu, dgamma, dbeta, j);
}

void cpu_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                           float *y, float *mean, float *rstd, int64_t rows, int64_t c)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        float p[CPU_LANES];
        cpu_lanes_zero(p);
        cpu_lanes_add(p, xr, c);
        const float m = cpu_lanes_sum(p) / (float)c;
        cpu_lanes_zero(p);
        cpu_lanes_add_terms(p, xr, c, crew_ln_sqdev_term, m);
        const float s = crew_ln_rstd(cpu_lanes_sum(p) / (float)c, eps);
        crew_ln_lane_forward(xr, gamma, beta, m, s, yr, c, 0, 1);
        mean[r] = m;
        rstd[r] = s;
    }
}

void cpu_layernorm_backward(void *ctx, const float *dy, const float *x, const float *gamma,
                            const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                            int64_t rows, int64_t c)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * c, *xr = x + r * c;
        float *dxr = dx + r * c;
        const float m = mean[r], s = rstd[r];
        /* the lanes' sums of dxhat and dxhat·xhat (crew_ln_lane_grad_sums'), in one pass with
         * crew_body_layernorm_params' terms a row at a time */
        float pg[CPU_LANES], pgx[CPU_LANES];
        cpu_lanes_zero(pg);
        cpu_lanes_zero(pgx);
        for (int64_t j0 = 0; j0 < c; j0 += CPU_LANES) {
            const int64_t w = cpu_lanes_width(c, j0);
            for (int64_t l = 0; l < w; l++) {
                const int64_t j = j0 + l;
                float g, gx;
                crew_ln_grad_terms(dyr[j], xr[j], gamma[j], m, s, &g, &gx);
                pg[l] += g;
                pgx[l] += gx;
                dgamma[j] += dyr[j] * crew_ln_xhat(xr[j], m, s);
                dbeta[j] += dyr[j];
            }
        }
        crew_ln_lane_dx(dyr, xr, gamma, m, s, cpu_lanes_sum(pg) / (float)c, cpu_lanes_sum(pgx) / (float)c, dxr, c, 0,
                        1);
    }
}
