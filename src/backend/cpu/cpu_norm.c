/* cpu_norm.c — batch normalisation (split into reductions and applications, so the reductions
 * can be all-reduced for synchronised batch norm) and layer normalisation. x is [rows, c]. */
#include <math.h>
#include <string.h>

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
        for (int64_t j = 0; j < c; j++) {
            float d = row[j] - mean[j];
            out[j] += (double)(d * d);
        }
    }
}

void cpu_bn_scale_sums(void *ctx, int64_t n, double alpha, const double *x, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) y[i] = (float)(alpha * x[i]);
}

void cpu_bn_forward(void *ctx, const float *x, const float *mean, const float *var, const float *gamma,
                    const float *beta, float eps, float *y, int64_t rows, int64_t c)
{
    (void)ctx;
    float scale[CHUNK], shift[CHUNK];
    for (int64_t c0 = 0; c0 < c; c0 += CHUNK) {
        int64_t n = c - c0 < CHUNK ? c - c0 : CHUNK;
        for (int64_t j = 0; j < n; j++) {
            scale[j] = gamma[c0 + j] / sqrtf(var[c0 + j] + eps);
            shift[j] = beta[c0 + j] - mean[c0 + j] * scale[j];
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * c + c0;
            float *yr = y + r * c + c0;
            for (int64_t j = 0; j < n; j++) yr[j] = xr[j] * scale[j] + shift[j];
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
            sum_dy_xmu[j] += (double)(dyr[j] * (xr[j] - mean[j]));
        }
    }
}

void cpu_bn_backward(void *ctx, const float *dy, const float *x, const float *mean, const float *var,
                     const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                     double count, float *dx, int64_t rows, int64_t c)
{
    (void)ctx;
    /* dx = gamma·istd · (dy − Σdy/N − (x−mean)·istd²·Σdy(x−mean)/N); the per-channel factors in
     * double, from the double sums, each rounded to float once */
    float k_dy[CHUNK], k_mean[CHUNK], k_x[CHUNK], means[CHUNK];
    for (int64_t c0 = 0; c0 < c; c0 += CHUNK) {
        int64_t n = c - c0 < CHUNK ? c - c0 : CHUNK;
        for (int64_t j = 0; j < n; j++) {
            double istd = 1.0 / sqrt((double)(var[c0 + j] + eps)), k = (double)gamma[c0 + j] * istd;
            k_dy[j] = (float)k;
            k_mean[j] = (float)(k * sum_dy[c0 + j] / count);
            k_x[j] = (float)(k * istd * istd * sum_dy_xmu[c0 + j] / count);
            means[j] = mean[c0 + j];
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = dy + r * c + c0, *xr = x + r * c + c0;
            float *dxr = dx + r * c + c0;
            for (int64_t j = 0; j < n; j++) dxr[j] = k_dy[j] * dyr[j] - k_mean[j] - k_x[j] * (xr[j] - means[j]);
        }
    }
}

void cpu_bn_param_grads(void *ctx, const float *var, float eps, const double *sum_dy,
                        const double *sum_dy_xmu, float *dgamma, float *dbeta, int64_t c)
{
    (void)ctx;
    for (int64_t j = 0; j < c; j++) {
        dgamma[j] += (float)(sum_dy_xmu[j] / sqrt((double)(var[j] + eps)));
        dbeta[j] += (float)sum_dy[j];
    }
}

void cpu_layernorm_forward(void *ctx, const float *x, const float *gamma, const float *beta, float eps,
                           float *y, float *mean, float *rstd, int64_t rows, int64_t c)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        float m = 0.0f, v = 0.0f;
        for (int64_t j = 0; j < c; j++) m += xr[j];
        m /= (float)c;
        for (int64_t j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m);
        v /= (float)c;
        float s = 1.0f / sqrtf(v + eps);
        for (int64_t j = 0; j < c; j++) yr[j] = (xr[j] - m) * s * gamma[j] + beta[j];
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
        float m = mean[r], s = rstd[r];
        float mean_g = 0.0f, mean_gx = 0.0f; /* means of dxhat and dxhat·xhat */
        for (int64_t j = 0; j < c; j++) {
            float xhat = (xr[j] - m) * s;
            float g = dyr[j] * gamma[j];
            mean_g += g;
            mean_gx += g * xhat;
            dgamma[j] += dyr[j] * xhat;
            dbeta[j] += dyr[j];
        }
        mean_g /= (float)c;
        mean_gx /= (float)c;
        for (int64_t j = 0; j < c; j++) {
            float xhat = (xr[j] - m) * s;
            dxr[j] = s * (dyr[j] * gamma[j] - mean_g - xhat * mean_gx);
        }
    }
}
