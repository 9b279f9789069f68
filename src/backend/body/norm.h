/* norm.h — batch norm's and layer norm's bodies (backend.h's bn_* and layernorm_* ops) over x
 * [rows, c].
 *
 * Batch norm's reductions are column sums in double: a kernel thread takes column j and walks the
 * rows in order (crew_body_bn_col_sum, ...); the CPU walks rows outer and columns inner, which
 * adds the same terms (crew_bn_*_term) in the same order into every column. Its applications
 * compute per-channel factors in double or float (crew_bn_*_factors), which the CPU computes a
 * chunk of channels at a time and a kernel thread per element, then one formula per element.
 *
 * Layer norm runs along a row: a warp per row on a GPU, whose lanes take elements lane, lane + 32,
 * ... (crew_ln_lane_*); the CPU keeps the 32 lanes' partials side by side and folds them as the
 * warp does (backend/cpu/cpu_lanes.h), from the same per-element terms, so the two agree bit for
 * bit (tests/test_kernel_bodies.c). Its parameters' gradients are column sums again (crew_body_layernorm_params, bit for bit the
 * CPU's). body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_NORM_H
#define CREW_BACKEND_BODY_NORM_H

#include "backend/body/body.h"

/* ---- batch norm */

CREW_BODY double crew_bn_sqdev_term(float x, float mean)
{
    float d = x - mean;
    return (double)(d * d);
}

CREW_BODY double crew_bn_dy_xmu_term(float dy, float x, float mean) { return (double)(dy * (x - mean)); }

/* out[j] = Σ_r x[r, j] */
CREW_BODY void crew_body_bn_col_sum(const float *x, int64_t rows, int64_t c, double *out, int64_t j)
{
    double s = 0.0;
    for (int64_t r = 0; r < rows; r++) s += (double)x[r * c + j];
    out[j] = s;
}

/* out[j] = Σ_r (x[r, j] − mean[j])² */
CREW_BODY void crew_body_col_sqdev(const float *x, const float *mean, int64_t rows, int64_t c, double *out, int64_t j)
{
    double s = 0.0;
    for (int64_t r = 0; r < rows; r++) s += crew_bn_sqdev_term(x[r * c + j], mean[j]);
    out[j] = s;
}

CREW_BODY void crew_body_bn_scale_sums(double alpha, const double *x, float *y, int64_t i)
{
    y[i] = (float)(alpha * x[i]);
}

/* y = x·scale + shift, scale = γ/√(var + eps), shift = β − mean·scale */
CREW_BODY void crew_bn_forward_factors(float gamma, float beta, float mean, float var, float eps, float *scale,
                                       float *shift)
{
    *scale = gamma / sqrtf(var + eps);
    *shift = beta - mean * *scale;
}

CREW_BODY float crew_bn_forward_apply(float x, float scale, float shift) { return x * scale + shift; }

CREW_BODY void crew_body_bn_forward(const float *x, const float *mean, const float *var, const float *gamma,
                                    const float *beta, float eps, float *y, int64_t c, int64_t i)
{
    const int64_t j = i % c;
    float scale, shift;
    crew_bn_forward_factors(gamma[j], beta[j], mean[j], var[j], eps, &scale, &shift);
    y[i] = crew_bn_forward_apply(x[i], scale, shift);
}

/* sum_dy[j] = Σ_r dy, sum_dy_xmu[j] = Σ_r dy·(x − mean[j]) */
CREW_BODY void crew_body_bn_backward_sums(const float *dy, const float *x, const float *mean, int64_t rows, int64_t c,
                                          double *sum_dy, double *sum_dy_xmu, int64_t j)
{
    double a = 0.0, b = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        a += (double)dy[r * c + j];
        b += crew_bn_dy_xmu_term(dy[r * c + j], x[r * c + j], mean[j]);
    }
    sum_dy[j] = a;
    sum_dy_xmu[j] = b;
}

/* dx = γ·istd · (dy − Σdy/N − (x−mean)·istd²·Σdy(x−mean)/N), as k_dy·dy − k_mean − k_x·(x −
 * mean): the per-channel factors in double, from the double sums, each rounded to float once. */
CREW_BODY void crew_bn_backward_factors(float var, float gamma, float eps, double sum_dy, double sum_dy_xmu,
                                        double count, float *k_dy, float *k_mean, float *k_x)
{
    double istd = 1.0 / sqrt((double)(var + eps)), k = (double)gamma * istd;
    *k_dy = (float)k;
    *k_mean = (float)(k * sum_dy / count);
    *k_x = (float)(k * istd * istd * sum_dy_xmu / count);
}

CREW_BODY float crew_bn_backward_apply(float dy, float x, float mean, float k_dy, float k_mean, float k_x)
{
    return k_dy * dy - k_mean - k_x * (x - mean);
}

CREW_BODY void crew_body_bn_backward(const float *dy, const float *x, const float *mean, const float *var,
                                     const float *gamma, float eps, const double *sum_dy, const double *sum_dy_xmu,
                                     double count, float *dx, int64_t c, int64_t i)
{
    const int64_t j = i % c;
    float k_dy, k_mean, k_x;
    crew_bn_backward_factors(var[j], gamma[j], eps, sum_dy[j], sum_dy_xmu[j], count, &k_dy, &k_mean, &k_x);
    dx[i] = crew_bn_backward_apply(dy[i], x[i], mean[j], k_dy, k_mean, k_x);
}

/* accumulates dgamma[j], dbeta[j] from the sums */
CREW_BODY void crew_body_bn_param_grads(const float *var, float eps, const double *sum_dy, const double *sum_dy_xmu,
                                        float *dgamma, float *dbeta, int64_t j)
{
    dgamma[j] += (float)(sum_dy_xmu[j] / sqrt((double)(var[j] + eps)));
    dbeta[j] += (float)sum_dy[j];
}

/* ---- layer norm: y = (x − m)·s·γ + β over each row, m its mean, s = 1/√(var + eps) */

CREW_BODY float crew_ln_xhat(float x, float m, float s) { return (x - m) * s; }
CREW_BODY float crew_ln_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

/* A lane's partial sums of row xr [c]: of x, and of (x − m)² */
CREW_BODY float crew_ln_lane_sum(const float *xr, int64_t c, int64_t lane, int64_t lanes)
{
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += lanes) s += xr[j];
    return s;
}

CREW_BODY float crew_ln_sqdev_term(float x, float m) { return (x - m) * (x - m); }

CREW_BODY float crew_ln_lane_sqdev(const float *xr, int64_t c, float m, int64_t lane, int64_t lanes)
{
    float v = 0.0f;
    for (int64_t j = lane; j < c; j += lanes) v += crew_ln_sqdev_term(xr[j], m);
    return v;
}

/* The lane's elements of y's row, from the row's mean m and rstd s */
CREW_BODY void crew_ln_lane_forward(const float *xr, const float *gamma, const float *beta, float m, float s,
                                    float *yr, int64_t c, int64_t lane, int64_t lanes)
{
    for (int64_t j = lane; j < c; j += lanes) yr[j] = crew_ln_xhat(xr[j], m, s) * gamma[j] + beta[j];
}

/* Backward: g = dy·γ (d loss / d xhat). An element's terms of the two sums, g and g·xhat */
CREW_BODY void crew_ln_grad_terms(float dy, float x, float gamma, float m, float s, float *g, float *gx)
{
    const float xhat = crew_ln_xhat(x, m, s);
    *g = dy * gamma;
    *gx = *g * xhat;
}

/* A lane's partial sums of g and of g·xhat */
CREW_BODY void crew_ln_lane_grad_sums(const float *dyr, const float *xr, const float *gamma, float m, float s,
                                      int64_t c, int64_t lane, int64_t lanes, float *sum_g, float *sum_gx)
{
    float a = 0.0f, b = 0.0f;
    for (int64_t j = lane; j < c; j += lanes) {
        float g, gx;
        crew_ln_grad_terms(dyr[j], xr[j], gamma[j], m, s, &g, &gx);
        a += g;
        b += gx;
    }
    *sum_g = a;
    *sum_gx = b;
}

/* The lane's elements of dx's row from the means of g and g·xhat; each reads and writes only its
 * own element, so dx may be dy (backend.h) */
CREW_BODY void crew_ln_lane_dx(const float *dyr, const float *xr, const float *gamma, float m, float s, float mean_g,
                               float mean_gx, float *dxr, int64_t c, int64_t lane, int64_t lanes)
{
    for (int64_t j = lane; j < c; j += lanes) {
        float xhat = crew_ln_xhat(xr[j], m, s);
        dxr[j] = s * (dyr[j] * gamma[j] - mean_g - xhat * mean_gx);
    }
}

/* dgamma[j] += Σ_r dy·xhat, dbeta[j] += Σ_r dy: column j over the rows in order */
CREW_BODY void crew_body_layernorm_params(const float *dy, const float *x, const float *mean, const float *rstd,
                                          float *dgamma, float *dbeta, int64_t rows, int64_t c, int64_t j)
{
    float g = dgamma[j], b = dbeta[j];
    for (int64_t r = 0; r < rows; r++) {
        g += dy[r * c + j] * crew_ln_xhat(x[r * c + j], mean[r], rstd[r]);
        b += dy[r * c + j];
    }
    dgamma[j] = g;
    dbeta[j] = b;
}

#endif
