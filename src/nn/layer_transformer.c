/* layer_transformer.c — one GPT-2 transformer block over x [T, C] per sample (pre-norm):
 *   r = x + attn(ln_1(x)) · W_proj + b_proj
 *   y = r + gelu_tanh(ln_2(r) · W_fc + b_fc) · W_mlp_proj + b_mlp_proj
 * attn: causal multi-head self-attention (backend.h, attention_forward) over
 * qkv = ln_1(x) · W_attn + b_attn, [T, 3C]. Kernels are [in, out] (crew's layout for every dense
 * kernel). Init as GPT-2: kernels N(0, 0.02²), the two residual projections N(0, (0.02/√(2·blocks))²),
 * biases 0, layer norms 1 and 0; layer norm's epsilon 1e-5.
 *
 * With spec.rate > 0, each branch's output is dropped out (GPT-2's residual dropout) before it
 * joins the stream, in training only, by masks of (seed, step, layer, branch, sample, position).
 *
 * One layer rather than a dozen: the block's two residual branches need the block's input
 * twice, which a sequential model of single-input layers cannot say. Its work buffers (below)
 * keep what backward needs; n = rows · T positions, H heads.
 *
 * --precision bf16 (store.bf16): the buffers marked "bf16" below hold bfloat16. Only GEMMs read
 * them, and a bf16 run's GEMMs round their operands to bfloat16 anyway, so storing them rounded
 * changes no bit of the run and halves their bytes (gemm_typed reads them as they are). Each is
 * computed in float32 into backward's scratch (W_DC, W_D4C: idle in forward) and then rounded
 * into its buffer. The attention probabilities are stored so too; their softmax's backward then
 * reads the rounded values (backend.h, attention_forward).
 *
 * --attention recompute (store.att_recompute): the probabilities go to W_ATT_RE, scratch the model
 * shares among its layers, instead of W_ATT, and backward computes them again from the q and k it
 * kept (attention_forward without y: the same GEMM and softmax, so the same bits) before it needs
 * them. One [rows, H, T, T] buffer for the whole model instead of one per block, for one more
 * q·kᵀ GEMM and softmax per block in backward. */
#include <math.h>

#include "core/rng.h"
#include "core/status.h"
#include "nn/layer.h"

enum {
    P_LN1_G, P_LN1_B, P_ATTN_K, P_ATTN_B, P_PROJ_K, P_PROJ_B,
    P_LN2_G, P_LN2_B, P_FC_K, P_FC_B, P_MLP_PROJ_K, P_MLP_PROJ_B,
};

enum {
    W_LN1,      /* [n, C]   ln_1(x); bf16 */
    W_LN1_STAT, /* [2n]     its mean | rstd */
    W_QKV,      /* [n, 3C] */
    W_ATT,      /* [rows, H, T, T] attention probabilities; bf16 */
    W_ATTY,     /* [n, C]   attention output, heads side by side; bf16 */
    W_RES,      /* [n, C]   r, the residual stream after attention */
    W_LN2,      /* [n, C]   ln_2(r); bf16 */
    W_LN2_STAT, /* [2n] */
    W_FC,       /* [n, 4C]  before GELU; once GELU has run (but in a forward-only pass), its slope */
    W_GELU,     /* [n, 4C]  after GELU; bf16 */
    W_D4C,      /* [n, 4C]  backward: d before GELU, the masked d of the attention branch, d qkv,
                   then d x when no dx comes; forward (bf16): GELU's output in float32 */
    W_DC,       /* [n, C]   backward: d ln_2, d attention output, d ln_1; forward (bf16): ln_1,
                   the attention output and ln_2 in float32 */
    W_DRES,     /* [n, C]   backward: d r */
    W_DATT,     /* [rows, H, T, T] backward scratch; forward's, for bfloat16 probabilities' scores */
    W_DROP1,    /* [n, C]   dropout masks of the attention and MLP branches (rate > 0 only) */
    W_DROP2,
    W_ATT_RE,   /* [rows, H, T, T] the probabilities when backward recomputes them; bf16 */
    W_GAMMA,    /* [C]      backward: a layer norm's gamma, kept where its gradient is written over it */
    N_WORK
};

#define LN_EPS 1e-5f
_Static_assert(N_WORK <= CREW_LAYER_MAX_WORK, "a transformer block's work buffers");

static int64_t T_of(const crew_layer *l) { return l->in.dim[0]; }
static int64_t C_of(const crew_layer *l) { return l->in.dim[1]; }

static crew_status block_build(crew_layer *l)
{
    if (l->in.ndim != 2)
        return crew_errorf(CREW_CODE_BAD_INPUT, "input must be [context, width], got %d axes", l->in.ndim);
    int64_t C = C_of(l), H = l->spec.heads;
    if (H <= 0) return crew_errorf(CREW_CODE_BAD_INPUT, "key 'heads' must be a positive integer, got %lld", (long long)H);
    if (C % H)
        return crew_errorf(CREW_CODE_BAD_INPUT, "width %lld is not divisible by its %lld heads", (long long)C,
                           (long long)H);
    if (!(l->spec.rate >= 0.0f && l->spec.rate < 1.0f))
        return crew_errorf(CREW_CODE_BAD_INPUT, "key 'dropout' must be in [0, 1), got %g", (double)l->spec.rate);
    int blocks = l->spec.blocks > 0 ? l->spec.blocks : 1;
    float proj_std = 0.02f / sqrtf(2.0f * (float)blocks);
    l->out = l->in;
    crew_layer_declare(l, "ln1_gamma", crew_shape1(C), 1, CREW_INIT_ONES, 0, 0);
    crew_layer_declare(l, "ln1_beta", crew_shape1(C), 1, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare_normal(l, "attn_kernel", (crew_shape){2, {C, 3 * C}}, 0.02f);
    crew_layer_declare(l, "attn_bias", crew_shape1(3 * C), 1, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare_normal(l, "attn_proj_kernel", (crew_shape){2, {C, C}}, proj_std);
    crew_layer_declare(l, "attn_proj_bias", crew_shape1(C), 1, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare(l, "ln2_gamma", crew_shape1(C), 1, CREW_INIT_ONES, 0, 0);
    crew_layer_declare(l, "ln2_beta", crew_shape1(C), 1, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare_normal(l, "mlp_kernel", (crew_shape){2, {C, 4 * C}}, 0.02f);
    crew_layer_declare(l, "mlp_bias", crew_shape1(4 * C), 1, CREW_INIT_ZEROS, 0, 0);
    crew_layer_declare_normal(l, "mlp_proj_kernel", (crew_shape){2, {4 * C, C}}, proj_std);
    crew_layer_declare(l, "mlp_proj_bias", crew_shape1(C), 1, CREW_INIT_ZEROS, 0, 0);
    return CREW_OK;
}

static void block_workspace(const crew_layer *l, int64_t rows, int64_t w[CREW_LAYER_MAX_WORK])
{
    int64_t T = T_of(l), C = C_of(l), n = rows * T, att = rows * l->spec.heads * T * T;
    w[W_LN1] = w[W_ATTY] = w[W_RES] = w[W_LN2] = w[W_DC] = w[W_DRES] = n * C;
    w[W_LN1_STAT] = w[W_LN2_STAT] = 2 * n;
    w[W_QKV] = 3 * n * C;
    w[W_FC] = w[W_GELU] = w[W_D4C] = 4 * n * C;
    w[W_ATT] = w[W_DATT] = att;
    w[W_GAMMA] = C;
    if (l->store.bf16) { /* two bfloat16 values to a 4-byte element */
        w[W_LN1] = w[W_ATTY] = w[W_LN2] = (n * C + 1) / 2;
        w[W_GELU] = (4 * n * C + 1) / 2;
        w[W_ATT] = (att + 1) / 2;
    }
    if (l->store.att_recompute) {
        w[W_ATT_RE] = w[W_ATT];
        w[W_ATT] = 0;
    }
    if (l->spec.rate > 0.0f) w[W_DROP1] = w[W_DROP2] = n * C;
}

static int dropping(const crew_layer *l, const crew_pass *p) { return p->training && l->spec.rate > 0.0f; }

/* branch [rows, T·C] := branch · mask, the mask drawn for (seed, step, this layer, branch k) */
static void drop(crew_layer *l, const crew_pass *p, float *branch, float *mask, uint64_t k)
{
    uint64_t key = crew_rng_key(crew_rng_key(p->seed, CREW_STREAM_DROPOUT, (uint64_t)p->step, (uint64_t)l->index), k, 0, 0);
    p->be->ops->dropout_forward(p->be->ctx, branch, branch, mask, p->rows, crew_shape_size(&l->in), l->spec.rate, key,
                                p->sample_ids);
}

/* The element type of the buffers marked bf16 above. */
static crew_dtype kept_type(const crew_layer *l) { return l->store.bf16 ? CREW_DT_BF16 : CREW_DT_F32; }

/* Where the attention probabilities are: kept from forward, or recomputed into shared scratch. */
static float *att_buffer(crew_layer *l) { return l->work[l->store.att_recompute ? W_ATT_RE : W_ATT]; }

static float *val(crew_layer *l, int i) { return l->params[i].value; }
static float *grad(crew_layer *l, int i) { return l->params[i].grad; }

/* y [n, out] = x [n, in] · kernel [in, out] + bias (added to the finished sum); x of type xt */
static void dense(const crew_pass *p, const void *x, crew_dtype xt, const float *kernel, const float *bias, float *y,
                  int64_t n, int64_t in, int64_t out)
{
    const crew_backend_ops *o = p->be->ops;
    o->gemm_bias(p->be->ctx, n, out, in, x, xt, in, kernel, out, bias, y, out);
}

/* dx = dy · kernelᵀ when dx is given, then d kernel = xᵀ · dy, d bias = Σ_rows dy (both
 * overwritten; under ZeRO-3 written over the kernel and the bias, layer.h) */
static void dense_back(const crew_pass *p, const void *x, crew_dtype xt, const float *dy, const float *kernel,
                       float *dkernel, float *dbias, float *dx, int64_t n, int64_t in, int64_t out)
{
    const crew_backend_ops *o = p->be->ops;
    if (dx) o->gemm(p->be->ctx, 0, 1, n, in, out, 1.0f, dy, out, kernel, out, 0.0f, dx, in);
    o->gemm_typed(p->be->ctx, 1, 0, in, out, n, 1.0f, x, xt, in, dy, CREW_DT_F32, out, 0.0f, dkernel, out);
    o->col_sum(p->be->ctx, dy, n, out, dbias, 0);
}

/* Where an op writes a buffer marked bf16: the buffer itself in float32, else float scratch. */
static float *staged(crew_layer *l, int buf, int scratch) { return l->store.bf16 ? l->work[scratch] : l->work[buf]; }

/* The buffer's values, written at staged(l, buf, scratch), into the buffer as bfloat16 (bf16 only). */
static void keep(crew_layer *l, const crew_pass *p, int buf, int scratch, int64_t count)
{
    if (l->store.bf16) p->be->ops->to_bf16(p->be->ctx, l->work[scratch], (crew_bf16 *)l->work[buf], count);
}

static crew_status block_forward(crew_layer *l, const crew_pass *p, const float *x, float *y)
{
    const crew_backend_ops *o = p->be->ops;
    void *ctx = p->be->ctx;
    int64_t T = T_of(l), C = C_of(l), H = l->spec.heads, n = p->rows * T;
    float **w = l->work;
    const crew_dtype kt = kept_type(l);
    o->layernorm_forward(ctx, x, val(l, P_LN1_G), val(l, P_LN1_B), LN_EPS, staged(l, W_LN1, W_DC), w[W_LN1_STAT],
                         w[W_LN1_STAT] + n, n, C);
    keep(l, p, W_LN1, W_DC, n * C);
    dense(p, w[W_LN1], kt, val(l, P_ATTN_K), val(l, P_ATTN_B), w[W_QKV], n, C, 3 * C);
    o->attention_forward(ctx, w[W_QKV], att_buffer(l), kt, w[W_DATT], staged(l, W_ATTY, W_DC), p->rows, T, H,
                         C / H);
    keep(l, p, W_ATTY, W_DC, n * C);
    dense(p, w[W_ATTY], kt, val(l, P_PROJ_K), val(l, P_PROJ_B), w[W_RES], n, C, C);
    if (dropping(l, p)) drop(l, p, w[W_RES], w[W_DROP1], 1);
    o->axpby(ctx, n * C, 1.0f, x, 1.0f, w[W_RES]); /* r = x + attention branch */
    o->layernorm_forward(ctx, w[W_RES], val(l, P_LN2_G), val(l, P_LN2_B), LN_EPS, staged(l, W_LN2, W_DC),
                         w[W_LN2_STAT], w[W_LN2_STAT] + n, n, C);
    keep(l, p, W_LN2, W_DC, n * C);
    dense(p, w[W_LN2], kt, val(l, P_FC_K), val(l, P_FC_B), w[W_FC], n, C, 4 * C);
    /* GELU's input is read by nothing after it but its derivative: the slope goes over it, so that
     * backward is one product (backend.h, act_forward_slope: the bits of act_backward) */
    if (p->forward_only)
        o->act_forward(ctx, CREW_ACT_GELU_TANH, w[W_FC], staged(l, W_GELU, W_D4C), 4 * n * C);
    else
        o->act_forward_slope(ctx, CREW_ACT_GELU_TANH, w[W_FC], staged(l, W_GELU, W_D4C), w[W_FC], 4 * n * C);
    keep(l, p, W_GELU, W_D4C, 4 * n * C);
    dense(p, w[W_GELU], kt, val(l, P_MLP_PROJ_K), val(l, P_MLP_PROJ_B), y, n, 4 * C, C);
    if (dropping(l, p)) drop(l, p, y, w[W_DROP2], 2);
    o->axpby(ctx, n * C, 1.0f, w[W_RES], 1.0f, y); /* y = r + MLP branch */
    return CREW_OK;
}

static crew_status block_backward(crew_layer *l, const crew_pass *p, const float *x, const float *y,
                                  const float *dy, float *dx)
{
    (void)y;
    const crew_backend_ops *o = p->be->ops;
    void *ctx = p->be->ctx;
    int64_t T = T_of(l), C = C_of(l), H = l->spec.heads, n = p->rows * T;
    float **w = l->work;
    const crew_dtype kt = kept_type(l);
    /* MLP branch: dy reaches it (through its dropout mask) and, unchanged, the residual stream r */
    const float *dmlp = dy;
    if (dropping(l, p)) {
        o->mul(ctx, n * C, dy, w[W_DROP2], w[W_DC]);
        dmlp = w[W_DC];
    }
    dense_back(p, w[W_GELU], kt, dmlp, val(l, P_MLP_PROJ_K), grad(l, P_MLP_PROJ_K), grad(l, P_MLP_PROJ_B), w[W_D4C],
               n, 4 * C, C);
    /* through GELU: d before it = d after it · the slope forward left in W_FC */
    o->mul(ctx, 4 * n * C, w[W_D4C], w[W_FC], w[W_D4C]);
    dense_back(p, w[W_LN2], kt, w[W_D4C], val(l, P_FC_K), grad(l, P_FC_K), grad(l, P_FC_B), w[W_DC], n, C, 4 * C);
    const float *gamma2 = crew_layer_value_kept(l, p, P_LN2_G, w[W_GAMMA]);
    o->fill(ctx, grad(l, P_LN2_G), 0.0f, C);
    o->fill(ctx, grad(l, P_LN2_B), 0.0f, C);
    o->layernorm_backward(ctx, w[W_DC], w[W_RES], gamma2, w[W_LN2_STAT], w[W_LN2_STAT] + n, w[W_DRES],
                          grad(l, P_LN2_G), grad(l, P_LN2_B), n, C);
    o->axpby(ctx, n * C, 1.0f, dy, 1.0f, w[W_DRES]); /* d r = through ln_2 + the residual's dy */
    /* attention branch; W_D4C, spent by now, takes the masked gradient */
    const float *dattn = w[W_DRES];
    if (dropping(l, p)) {
        o->mul(ctx, n * C, w[W_DRES], w[W_DROP1], w[W_D4C]);
        dattn = w[W_D4C];
    }
    dense_back(p, w[W_ATTY], kt, dattn, val(l, P_PROJ_K), grad(l, P_PROJ_K), grad(l, P_PROJ_B), w[W_DC], n, C, C);
    if (l->store.att_recompute) /* the probabilities again, as forward computed them (no y) */
        o->attention_forward(ctx, w[W_QKV], att_buffer(l), kt, w[W_DATT], NULL, p->rows, T, H, C / H);
    o->attention_backward(ctx, w[W_DC], w[W_QKV], att_buffer(l), kt, w[W_DATT], w[W_D4C], p->rows, T, H, C / H);
    dense_back(p, w[W_LN1], kt, w[W_D4C], val(l, P_ATTN_K), grad(l, P_ATTN_K), grad(l, P_ATTN_B), w[W_DC], n, C,
               3 * C);
    const float *gamma1 = crew_layer_value_kept(l, p, P_LN1_G, w[W_GAMMA]);
    o->fill(ctx, grad(l, P_LN1_G), 0.0f, C);
    o->fill(ctx, grad(l, P_LN1_B), 0.0f, C);
    /* without a dx to write (nothing upstream trains), W_D4C, spent by now, takes it */
    float *dxo = dx ? dx : w[W_D4C];
    o->layernorm_backward(ctx, w[W_DC], x, gamma1, w[W_LN1_STAT], w[W_LN1_STAT] + n, dxo, grad(l, P_LN1_G),
                          grad(l, P_LN1_B), n, C);
    if (dx) o->axpby(ctx, n * C, 1.0f, w[W_DRES], 1.0f, dx); /* dx = through ln_1 + the residual's d r */
    return CREW_OK;
}

/* backward's four buffers, which forward also uses for its float32 staging and scores, the
 * probabilities that backward recomputes, and backward's copy of a gamma */
const crew_layer_ops crew_transformer_block_ops = {.build = block_build,
                                                   .workspace = block_workspace,
                                                   .forward = block_forward,
                                                   .backward = block_backward,
                                                   .release = crew_layer_free_work,
                                                   .scratch = 1u << W_D4C | 1u << W_DC | 1u << W_DRES | 1u << W_DATT |
                                                             1u << W_ATT_RE | 1u << W_GAMMA};
