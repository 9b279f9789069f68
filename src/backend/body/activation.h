/* activation.h — the activations, their derivatives and dropout, an element at a time (backend.h's
 * act_forward, act_backward, dropout_forward). The CPU runs each activation's formula in a loop of
 * its own (the switch outside the loop, so each loop vectorises); a kernel thread runs the switch
 * per element (crew_body_act_forward). body.h says what a body is. */
#ifndef CREW_BACKEND_BODY_ACTIVATION_H
#define CREW_BACKEND_BODY_ACTIVATION_H

#include "backend/body/body.h"
#include "backend/exp_poly.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "core/rng.h"
#ifdef __cplusplus
}
#endif

#define CREW_SQRT1_2 0.70710678118654752440f
#define CREW_INV_SQRT_2PI 0.39894228040143267794f
#define CREW_SQRT_2_OVER_PI 0.79788456080286535588f
#define CREW_GELU_CUBIC 0.044715f

CREW_BODY float crew_act_relu(float x) { return x > 0.0f ? x : 0.0f; }

/* erf's GELU: x·Φ(x) */
CREW_BODY float crew_act_gelu(float x) { return 0.5f * x * (1.0f + erff(x * CREW_SQRT1_2)); }

/* GELU's tanh form: 0.5·(1 + tanh u) is σ(2u), one exp instead of tanhf (whose expm1f took 40% of
 * a GPT's forward pass), with no cancellation, and crew_exp_poly vectorises */
CREW_BODY float crew_act_gelu_tanh(float x)
{
    float u = CREW_SQRT_2_OVER_PI * (x + CREW_GELU_CUBIC * x * x * x);
    return x / (1.0f + crew_exp_poly(-2.0f * u));
}

/* Never exponentiates a large positive number. */
CREW_BODY float crew_act_sigmoid(float x)
{
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* y = act(x); linear for anything else (softmax never reaches here: fused into the loss) */
CREW_BODY float crew_act_forward_of(crew_activation act, float x)
{
    switch (act) {
    case CREW_ACT_RELU: return crew_act_relu(x);
    case CREW_ACT_GELU: return crew_act_gelu(x);
    case CREW_ACT_GELU_TANH: return crew_act_gelu_tanh(x);
    case CREW_ACT_TANH: return tanhf(x);
    case CREW_ACT_SIGMOID: return crew_act_sigmoid(x);
    default: return x;
    }
}

CREW_BODY void crew_body_act_forward(crew_activation act, const float *x, float *y, int64_t i)
{
    y[i] = crew_act_forward_of(act, x[i]);
}

/* The derivatives, as dx = f(dy, ...) of what each reads. ReLU reads y (y > 0 exactly where
 * x > 0; the model may have written y over x), tanh and sigmoid read y, the GELUs read x. */
CREW_BODY float crew_act_relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

/* d/dx x·Φ(x) = Φ(x) + x·φ(x) */
CREW_BODY float crew_act_gelu_slope(float x)
{
    float cdf = 0.5f * (1.0f + erff(x * CREW_SQRT1_2));
    float pdf = CREW_INV_SQRT_2PI * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

/* d/dx of x·σ(2u), u = √(2/π)(x + 0.044715x³): σ + 2x·σ(1 − σ)·u' */
CREW_BODY float crew_act_gelu_tanh_slope(float x)
{
    float u = CREW_SQRT_2_OVER_PI * (x + CREW_GELU_CUBIC * x * x * x);
    float sg = 1.0f / (1.0f + crew_exp_poly(-2.0f * u));
    float du = CREW_SQRT_2_OVER_PI * (1.0f + 3.0f * CREW_GELU_CUBIC * x * x);
    return sg + 2.0f * x * sg * (1.0f - sg) * du;
}

CREW_BODY float crew_act_tanh_grad(float y, float dy) { return dy * (1.0f - y * y); }
CREW_BODY float crew_act_sigmoid_grad(float y, float dy) { return dy * y * (1.0f - y); }

/* act'(x), from x alone: what act_forward_slope keeps for backward (backend.h). For the GELUs,
 * dy · this is act_backward's dx bit for bit (the same function of the same x, multiplied last). */
CREW_BODY float crew_act_slope_of(crew_activation act, float x)
{
    switch (act) {
    case CREW_ACT_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case CREW_ACT_GELU: return crew_act_gelu_slope(x);
    case CREW_ACT_GELU_TANH: return crew_act_gelu_tanh_slope(x);
    case CREW_ACT_TANH: {
        float t = tanhf(x);
        return 1.0f - t * t;
    }
    case CREW_ACT_SIGMOID: {
        float s = crew_act_sigmoid(x);
        return s * (1.0f - s);
    }
    default: return 1.0f;
    }
}

/* y[i] and slope[i] from x[i], read first: either output may be x (backend.h) */
CREW_BODY void crew_body_act_forward_slope(crew_activation act, const float *x, float *y, float *slope, int64_t i)
{
    const float xi = x[i];
    y[i] = crew_act_forward_of(act, xi);
    slope[i] = crew_act_slope_of(act, xi);
}

/* dx[i] from what the activation reads: x[i] or y[i], never the other (either may be stale). */
CREW_BODY void crew_body_act_backward(crew_activation act, const float *x, const float *y, const float *dy, float *dx,
                                      int64_t i)
{
    switch (act) {
    case CREW_ACT_RELU: dx[i] = crew_act_relu_grad(y[i], dy[i]); break;
    case CREW_ACT_GELU: dx[i] = dy[i] * crew_act_gelu_slope(x[i]); break;
    case CREW_ACT_GELU_TANH: dx[i] = dy[i] * crew_act_gelu_tanh_slope(x[i]); break;
    case CREW_ACT_TANH: dx[i] = crew_act_tanh_grad(y[i], dy[i]); break;
    case CREW_ACT_SIGMOID: dx[i] = crew_act_sigmoid_grad(y[i], dy[i]); break;
    default: dx[i] = dy[i]; break;
    }
}

/* Dropout (backend.h): row r is sample sample_ids[r], whose mask depends on the sample alone, not
 * on its row in this batch; element j is kept when its uniform draw is >= rate, then scaled. */
CREW_BODY float crew_dropout_keep_scale(float rate) { return 1.0f / (1.0f - rate); }

CREW_BODY uint64_t crew_dropout_row_key(uint64_t key, int64_t sample)
{
    return crew_rng_key(key, (uint64_t)sample, 0, 0);
}

CREW_BODY float crew_dropout_mask(uint64_t row_key, int64_t j, float rate, float keep_scale)
{
    return crew_rng_uniform(row_key, (uint64_t)j) >= rate ? keep_scale : 0.0f;
}

/* Element i of x [rows, cols]: its mask (0 or keep_scale, for backward) and y. */
CREW_BODY void crew_body_dropout(const float *x, float *y, float *mask, int64_t cols, float rate, float keep_scale,
                                 uint64_t key, const int64_t *sample_ids, int64_t i)
{
    const int64_t r = i / cols, j = i % cols;
    const float m = crew_dropout_mask(crew_dropout_row_key(key, sample_ids[r]), j, rate, keep_scale);
    mask[i] = m;
    y[i] = x[i] * m;
}

#endif
