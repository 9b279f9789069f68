/* cuda_conv.cu — convolutions by cuDNN, for a device opened with crew_device_options.conv_library
 * (--conv cudnn): the table's conv_* ops (backend.h). The layer asks conv_supported first and runs
 * im2col + GEMM where the answer is no.
 *
 * Layouts. Activations are NHWC, which cuDNN takes as they are (CUDNN_TENSOR_NHWC). The layer's
 * kernel is [KH, KW, C, F] (Keras), cuDNN's NHWC filter [F, KH, KW, C]: the forward and
 * backward-data passes read a transposed copy made first, and the backward-filter pass writes one
 * that is transposed back into the layer's gradient.
 *
 * Determinism. Algorithms come from cuDNN's heuristics (cudnnGet*Algorithm_v7), which depend on
 * the GPU and the shapes only, never on timings, and only those cuDNN marks
 * CUDNN_DETERMINISTIC are taken; the math type is CUDNN_FMA_MATH (float32, no TF32), so a GPU
 * gives the same bits run after run, and N replicas the bits of one replica accumulating the same
 * micro-batches (the algorithm depends on the micro-batch's shape, the same on both). They are not
 * the CPU's bits: another order of the sums (crew verify --against cpu holds them to it).
 *
 * Padding. crew pads as TensorFlow does, which can put one more row or column of zeros at the
 * bottom and right than at the top and left; cuDNN pads both sides alike. The windows are the same
 * wherever cuDNN's output size (with the top and left padding on both sides) is the layer's:
 * conv_supported checks exactly that. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/body/elementwise.h"
#include "backend/cuda/cuda_internal.h"

#ifdef CREW_HAVE_CUDNN
#include <cudnn.h>

extern "C" {
#include "core/status.h"
}

/* The legacy convolution API: deprecated in cuDNN 9 beside the graph API, still its C interface
 * for a single convolution. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define CONV_PLANS 32
#define CONV_WORKSPACE_MAX ((size_t)512 << 20) /* an algorithm needing more is passed over */

/* One geometry's algorithms, chosen once. */
typedef struct conv_plan {
    crew_window g;
    int64_t out_c;
    int usable;                 /* 0: cuDNN has no deterministic algorithm for it here */
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t workspace;           /* the most of the three */
} conv_plan;

struct cuda_conv {
    cudnnHandle_t dnn;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    conv_plan plans[CONV_PLANS];
    int n_plans, next;          /* next: the plan to replace once all are taken */
    float *filter;              /* [F, KH, KW, C] the kernel in cuDNN's layout */
    int64_t filter_cap;
    void *work;
    size_t work_cap;
};

static int same_geometry(const crew_window *a, const crew_window *b)
{
    return a->batch == b->batch && a->in_h == b->in_h && a->in_w == b->in_w && a->in_c == b->in_c &&
           a->out_h == b->out_h && a->out_w == b->out_w && a->k_h == b->k_h && a->k_w == b->k_w &&
           a->stride_h == b->stride_h && a->stride_w == b->stride_w && a->pad_top == b->pad_top &&
           a->pad_left == b->pad_left;
}

/* The descriptors for this geometry; 0 when cuDNN's output size is not the layer's (padding that
 * differs between the sides) or a descriptor is refused. */
static int describe(struct cuda_conv *v, const crew_window *g, int64_t out_c)
{
    if (g->batch > INT32_MAX || g->in_h > INT32_MAX || g->in_w > INT32_MAX || g->in_c > INT32_MAX || out_c > INT32_MAX)
        return 0;
    int n, c, h, w;
    if (cudnnSetTensor4dDescriptor(v->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, (int)g->batch, (int)g->in_c,
                                   (int)g->in_h, (int)g->in_w) != CUDNN_STATUS_SUCCESS ||
        cudnnSetFilter4dDescriptor(v->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, (int)out_c, (int)g->in_c, (int)g->k_h,
                                   (int)g->k_w) != CUDNN_STATUS_SUCCESS ||
        cudnnSetConvolution2dDescriptor(v->conv, (int)g->pad_top, (int)g->pad_left, (int)g->stride_h,
                                        (int)g->stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT) != CUDNN_STATUS_SUCCESS ||
        cudnnSetConvolutionMathType(v->conv, CUDNN_FMA_MATH) != CUDNN_STATUS_SUCCESS ||
        cudnnGetConvolution2dForwardOutputDim(v->conv, v->x, v->w, &n, &c, &h, &w) != CUDNN_STATUS_SUCCESS)
        return 0;
    if (n != g->batch || c != out_c || h != g->out_h || w != g->out_w) return 0;
    return cudnnSetTensor4dDescriptor(v->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, c, h, w) == CUDNN_STATUS_SUCCESS;
}

/* The first result in the heuristics' order that ran, is deterministic, keeps to float32 and
 * fits the workspace; 0 when none does. */
template <typename Perf, typename Algo>
static int pick(const Perf *perf, int count, Algo *algo, size_t *bytes)
{
    for (int i = 0; i < count; i++)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC &&
            perf[i].mathType == CUDNN_FMA_MATH && perf[i].memory <= CONV_WORKSPACE_MAX) {
            *algo = perf[i].algo;
            *bytes = perf[i].memory;
            return 1;
        }
    return 0;
}

/* The three algorithms of a described geometry; 0 when one of them has none to offer. */
static int choose(struct cuda_conv *v, conv_plan *p)
{
    enum { MAX_ALGOS = 16 };
    int n_fwd = 0, n_data = 0, n_filter = 0;
    size_t b1 = 0, b2 = 0, b3 = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[MAX_ALGOS];
    cudnnConvolutionBwdDataAlgoPerf_t data[MAX_ALGOS];
    cudnnConvolutionBwdFilterAlgoPerf_t filter[MAX_ALGOS];
    if (cudnnGetConvolutionForwardAlgorithm_v7(v->dnn, v->x, v->w, v->conv, v->y, MAX_ALGOS, &n_fwd, fwd) !=
            CUDNN_STATUS_SUCCESS ||
        cudnnGetConvolutionBackwardDataAlgorithm_v7(v->dnn, v->w, v->y, v->conv, v->x, MAX_ALGOS, &n_data, data) !=
            CUDNN_STATUS_SUCCESS ||
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(v->dnn, v->x, v->y, v->conv, v->w, MAX_ALGOS, &n_filter,
                                                      filter) != CUDNN_STATUS_SUCCESS)
        return 0;
    if (!pick(fwd, n_fwd, &p->fwd, &b1) || !pick(data, n_data, &p->bwd_data, &b2) ||
        !pick(filter, n_filter, &p->bwd_filter, &b3))
        return 0;
    p->workspace = b1 > b2 ? (b1 > b3 ? b1 : b3) : (b2 > b3 ? b2 : b3);
    return 1;
}

/* The plan of a geometry, made (and its descriptors set) on first sight; NULL without cuDNN. */
static const conv_plan *plan_of(cuda_ctx *c, const crew_window *g, int64_t out_c)
{
    struct cuda_conv *v = c->conv;
    if (!v) return NULL;
    for (int i = 0; i < v->n_plans; i++)
        if (v->plans[i].out_c == out_c && same_geometry(&v->plans[i].g, g)) {
            if (v->plans[i].usable && !describe(v, g, out_c)) return NULL;
            return &v->plans[i];
        }
    conv_plan *p = v->n_plans < CONV_PLANS ? &v->plans[v->n_plans++] : &v->plans[v->next++ % CONV_PLANS];
    memset(p, 0, sizeof *p);
    p->g = *g;
    p->out_c = out_c;
    p->usable = describe(v, g, out_c) && choose(v, p);
    return p;
}

/* The workspace and the transposed filter for a plan, grown as needed (through the table's alloc,
 * so memory_used counts them). 0 when there is no room: the pending error says so. */
static int reserve(cuda_ctx *c, const conv_plan *p)
{
    struct cuda_conv *v = c->conv;
    const int64_t filter = p->g.k_h * p->g.k_w * p->g.in_c * p->out_c;
    if (filter > v->filter_cap) {
        cuda_free(c, v->filter);
        v->filter = NULL;
        v->filter_cap = 0;
        crew_status s = cuda_alloc(c, CREW_DT_F32, filter, (void **)&v->filter);
        if (s) {
            crew_status_free(s);
            cuda_note(c, cudaErrorMemoryAllocation, "cuDNN's filter copy");
            return 0;
        }
        v->filter_cap = filter;
    }
    if (p->workspace > v->work_cap) {
        cuda_free(c, v->work);
        v->work = NULL;
        v->work_cap = 0;
        crew_status s = cuda_alloc(c, CREW_DT_F32, (int64_t)((p->workspace + 3) / 4), &v->work);
        if (s) {
            crew_status_free(s);
            cuda_note(c, cudaErrorMemoryAllocation, "cuDNN's workspace");
            return 0;
        }
        v->work_cap = p->workspace;
    }
    return 1;
}

/* ---- the kernel's two layouts: [KH, KW, C, F] (the layer's) and [F, KH, KW, C] (cuDNN's) */

/* backend/body/elementwise.h: filter[f][r] = kernel[r][f], and back */
__global__ void k_to_filter(const float *kernel, float *filter, int64_t khkwc, int64_t f_count)
{
    const int64_t n = khkwc * f_count;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        crew_body_to_filter(kernel, filter, khkwc, f_count, i);
}

__global__ void k_from_filter(const float *filter, float *kernel, int64_t khkwc, int64_t f_count)
{
    const int64_t n = khkwc * f_count;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        crew_body_from_filter(filter, kernel, khkwc, f_count, i);
}

static void transpose(cuda_ctx *c, const float *in, float *out, const conv_plan *p, int to_filter)
{
    const int64_t khkwc = p->g.k_h * p->g.k_w * p->g.in_c, n = khkwc * p->out_c;
    if (to_filter)
        k_to_filter<<<cuda_blocks(n), CUDA_THREADS, 0, c->stream>>>(in, out, khkwc, p->out_c);
    else
        k_from_filter<<<cuda_blocks(n), CUDA_THREADS, 0, c->stream>>>(in, out, khkwc, p->out_c);
    cuda_launched(c, "transposing a convolution kernel");
}

static void dnn_check(cuda_ctx *c, cudnnStatus_t st, const char *what)
{
    if (st != CUDNN_STATUS_SUCCESS) cuda_note(c, cudaErrorUnknown, what);
}

/* ---- the table's ops */

int cuda_conv_supported(void *ctx, const crew_window *g, int64_t out_c)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c->conv) return 0;
    cuda_enter(c);
    const conv_plan *p = plan_of(c, g, out_c);
    return p && p->usable;
}

/* An op's plan, its descriptors set and its buffers in place; NULL after noting why not. */
static const conv_plan *ready(cuda_ctx *c, const crew_window *g, int64_t out_c)
{
    cuda_enter(c);
    const conv_plan *p = plan_of(c, g, out_c);
    if (!p || !p->usable) {
        cuda_note(c, cudaErrorInvalidValue, "cuDNN convolution of a geometry it does not support");
        return NULL;
    }
    return reserve(c, p) ? p : NULL;
}

void cuda_conv_forward(void *ctx, const float *x, const float *kernel, float *y, const crew_window *g, int64_t out_c)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const conv_plan *p = ready(c, g, out_c);
    if (!p) return;
    struct cuda_conv *v = c->conv;
    transpose(c, kernel, v->filter, p, 1);
    const float one = 1.0f; /* y += x ⋆ kernel: the layer seeded y with the bias */
    dnn_check(c, cudnnConvolutionForward(v->dnn, &one, v->x, x, v->w, v->filter, v->conv, p->fwd, v->work,
                                         p->workspace, &one, v->y, y),
              "cuDNN convolution forward");
}

void cuda_conv_backward_data(void *ctx, const float *dy, const float *kernel, float *dx, const crew_window *g,
                             int64_t out_c)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const conv_plan *p = ready(c, g, out_c);
    if (!p) return;
    struct cuda_conv *v = c->conv;
    transpose(c, kernel, v->filter, p, 1);
    const float one = 1.0f, zero = 0.0f;
    dnn_check(c, cudnnConvolutionBackwardData(v->dnn, &one, v->w, v->filter, v->y, dy, v->conv, p->bwd_data, v->work,
                                              p->workspace, &zero, v->x, dx),
              "cuDNN convolution backward (data)");
}

void cuda_conv_backward_filter(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                               int64_t out_c)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const conv_plan *p = ready(c, g, out_c);
    if (!p) return;
    struct cuda_conv *v = c->conv;
    const float one = 1.0f, zero = 0.0f;
    dnn_check(c, cudnnConvolutionBackwardFilter(v->dnn, &one, v->x, x, v->y, dy, v->conv, p->bwd_filter, v->work,
                                                p->workspace, &zero, v->w, v->filter),
              "cuDNN convolution backward (filter)");
    transpose(c, v->filter, dkernel, p, 0);
}

crew_status cuda_conv_open(cuda_ctx *c)
{
    struct cuda_conv *v = (struct cuda_conv *)calloc(1, sizeof *v);
    if (!v) return CREW_OOM();
    cuda_enter(c);
    cudnnStatus_t st = cudnnCreate(&v->dnn);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(v->dnn, c->stream);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateTensorDescriptor(&v->x);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateTensorDescriptor(&v->y);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateFilterDescriptor(&v->w);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateConvolutionDescriptor(&v->conv);
    c->conv = v; /* cuda_conv_close frees what was made */
    if (st == CUDNN_STATUS_SUCCESS) return CREW_OK;
    cuda_conv_close(c);
    return crew_errorf(CREW_CODE_IO, "cuda:%d: cuDNN could not start: %s", c->device, cudnnGetErrorString(st));
}

void cuda_conv_close(cuda_ctx *c)
{
    struct cuda_conv *v = c->conv;
    if (!v) return;
    cuda_free(c, v->filter);
    cuda_free(c, v->work);
    if (v->conv) cudnnDestroyConvolutionDescriptor(v->conv);
    if (v->w) cudnnDestroyFilterDescriptor(v->w);
    if (v->y) cudnnDestroyTensorDescriptor(v->y);
    if (v->x) cudnnDestroyTensorDescriptor(v->x);
    if (v->dnn) cudnnDestroy(v->dnn);
    free(v);
    c->conv = NULL;
}

#else /* no cuDNN in this build: the ops answer that they cannot */

extern "C" {
#include "core/status.h"
}

crew_status cuda_conv_open(cuda_ctx *c)
{
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "cuda:%d: this build has no cuDNN (it was not found beside the "
                       "CUDA toolkit): convolutions are im2col + cuBLAS", c->device);
}

void cuda_conv_close(cuda_ctx *c) { (void)c; }
int cuda_conv_supported(void *ctx, const crew_window *g, int64_t out_c)
{
    (void)ctx, (void)g, (void)out_c;
    return 0;
}
void cuda_conv_forward(void *ctx, const float *x, const float *kernel, float *y, const crew_window *g, int64_t out_c)
{
    (void)x, (void)kernel, (void)y, (void)g, (void)out_c;
    cuda_note((cuda_ctx *)ctx, cudaErrorNotSupported, "cuDNN convolution (not in this build)");
}
void cuda_conv_backward_data(void *ctx, const float *dy, const float *kernel, float *dx, const crew_window *g,
                             int64_t out_c)
{
    (void)dy, (void)kernel, (void)dx, (void)g, (void)out_c;
    cuda_note((cuda_ctx *)ctx, cudaErrorNotSupported, "cuDNN convolution (not in this build)");
}
void cuda_conv_backward_filter(void *ctx, const float *x, const float *dy, float *dkernel, const crew_window *g,
                               int64_t out_c)
{
    (void)x, (void)dy, (void)dkernel, (void)g, (void)out_c;
    cuda_note((cuda_ctx *)ctx, cudaErrorNotSupported, "cuDNN convolution (not in this build)");
}

#endif
