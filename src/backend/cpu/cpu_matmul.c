/* cpu_matmul.c — oneDNN's matmul primitive with its bias in the kernel, for gemm_bias (cpu_gemm.c).
 *
 * A layer's forward product used to be seeded: the bias copied into every row of c, then sgemm
 * with beta = 1 on top. The seeding is a pass that writes all of c before the GEMM reads it back:
 * 4.4% of a gpt_tiny step and 2.3% of the demo CNN's (perf, docs/PERFORMANCE.md). The matmul
 * primitive adds the bias in its epilogue instead, to the finished sum, as cuBLAS's beta = 1 over
 * rows of bias does on a GPU.
 *
 * A primitive is made for one shape (oneDNN compiles its kernel then, 0.3–2 ms), so each context
 * keeps the last few it made, keyed by the shape, the leading dimensions and the thread count the
 * primitive was made for (oneDNN sizes its work for the OpenMP thread count at creation). A
 * training step uses a handful of shapes, the same every step.
 *
 * The primitives' scratch memory is the context's own (oneDNN's user scratchpad mode). In its
 * default mode oneDNN keeps one scratchpad per thread, counted in thread-local variables, and a
 * primitive must run, and be destroyed, on the thread that made it; a context's products may run
 * on another thread than the one before (cpu_gemm.c) and it is closed by whichever rank thread
 * leaves last, which would leave one thread's count short and another's wrapped around. */
#if CREW_GEMM_ONEDNN
#include <dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

/* Enough for a model's forward shapes in training and in evaluation (a transformer has four, a
 * convolution's last chunk of rows may add one). */
#define CACHED 16

typedef struct cached_matmul {
    int64_t m, n, k, lda, ldb, ldc;
    int threads;
    uint64_t used;                  /* the call count when it last ran: the oldest goes first */
    dnnl_primitive_t prim;          /* NULL: the slot is empty */
    /* made without data; each call sets the pointers (scratch: NULL when it needs none) */
    dnnl_memory_t src, weights, bias, dst, scratch;
    size_t scratch_bytes;
} cached_matmul;

struct cpu_matmuls {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    uint64_t calls;
    void *scratch;                  /* the primitives' scratchpad, one at a time: the largest's size */
    size_t scratch_cap;
    cached_matmul slot[CACHED];
};

void omp_set_num_threads(int threads); /* cpu_gemm.c says why it is declared here */

static void release(cached_matmul *c)
{
    if (c->prim) dnnl_primitive_destroy(c->prim);
    if (c->src) dnnl_memory_destroy(c->src);
    if (c->weights) dnnl_memory_destroy(c->weights);
    if (c->bias) dnnl_memory_destroy(c->bias);
    if (c->dst) dnnl_memory_destroy(c->dst);
    if (c->scratch) dnnl_memory_destroy(c->scratch);
    memset(c, 0, sizeof *c);
}

void cpu_matmul_free(struct cpu_matmuls *mm)
{
    if (!mm) return;
    for (int i = 0; i < CACHED; i++) release(&mm->slot[i]);
    if (mm->stream) dnnl_stream_destroy(mm->stream);
    if (mm->engine) dnnl_engine_destroy(mm->engine);
    free(mm->scratch);
    free(mm);
}

/* A row-major [rows, cols] matrix whose rows lie ld values apart. */
static dnnl_status_t describe(dnnl_memory_desc_t *d, int64_t rows, int64_t cols, int64_t ld)
{
    dnnl_dims_t dims = {rows, cols}, strides = {ld, 1};
    return dnnl_memory_desc_init_by_strides(d, 2, dims, dnnl_f32, strides);
}

static dnnl_status_t make(struct cpu_matmuls *mm, cached_matmul *c)
{
    dnnl_memory_desc_t src, weights, bias, dst;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = describe(&src, c->m, c->k, c->lda);
    if (st == dnnl_success) st = describe(&weights, c->k, c->n, c->ldb);
    if (st == dnnl_success) st = describe(&bias, 1, c->n, c->n);
    if (st == dnnl_success) st = describe(&dst, c->m, c->n, c->ldc);
    if (st == dnnl_success) st = dnnl_matmul_desc_init(&desc, &src, &weights, &bias, &dst);
    if (st == dnnl_success) st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &desc, attr, mm->engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&c->prim, pd);
    if (st == dnnl_success) st = dnnl_memory_create(&c->src, &src, mm->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&c->weights, &weights, mm->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&c->bias, &bias, mm->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&c->dst, &dst, mm->engine, DNNL_MEMORY_NONE);
    const dnnl_memory_desc_t *scratch = st == dnnl_success ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    c->scratch_bytes = scratch ? dnnl_memory_desc_get_size(scratch) : 0;
    if (st == dnnl_success && c->scratch_bytes) st = dnnl_memory_create(&c->scratch, scratch, mm->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && c->scratch_bytes > mm->scratch_cap) { /* grown for the largest, 64-byte aligned */
        free(mm->scratch);
        mm->scratch_cap = 0;
        if (!(mm->scratch = aligned_alloc(64, (c->scratch_bytes + 63) & ~(size_t)63)))
            st = dnnl_out_of_memory;
        else
            mm->scratch_cap = c->scratch_bytes;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) release(c);
    return st;
}

/* The context's primitive for this shape: found, or made in the slot used longest ago. */
static dnnl_status_t find(struct cpu_matmuls *mm, int threads, int64_t m, int64_t n, int64_t k, int64_t lda,
                          int64_t ldb, int64_t ldc, cached_matmul **out)
{
    cached_matmul *oldest = &mm->slot[0];
    for (int i = 0; i < CACHED; i++) {
        cached_matmul *c = &mm->slot[i];
        if (c->prim && c->m == m && c->n == n && c->k == k && c->lda == lda && c->ldb == ldb && c->ldc == ldc &&
            c->threads == threads) {
            *out = c;
            return dnnl_success;
        }
        if (!c->prim || (oldest->prim && c->used < oldest->used)) oldest = c;
    }
    release(oldest);
    *oldest = (cached_matmul){.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .threads = threads};
    *out = oldest;
    return make(mm, oldest);
}

int cpu_matmul_bias(cpu_ctx *x, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                    int64_t ldb, const float *bias, float *c, int64_t ldc)
{
    dnnl_status_t st = dnnl_success;
    struct cpu_matmuls *mm = x->matmuls;
    if (!mm) {
        if (!(mm = calloc(1, sizeof *mm))) return dnnl_out_of_memory;
        st = dnnl_engine_create(&mm->engine, dnnl_cpu, 0);
        if (st == dnnl_success) st = dnnl_stream_create(&mm->stream, mm->engine, dnnl_stream_default_flags);
        if (st != dnnl_success) {
            cpu_matmul_free(mm);
            return (int)st;
        }
        x->matmuls = mm;
    }
    /* as sgemm's: the count is per thread, and a context's products may run on another thread */
    omp_set_num_threads(x->blas_threads);
    cached_matmul *p = NULL;
    st = find(mm, x->blas_threads, m, n, k, lda, ldb, ldc, &p);
    if (st != dnnl_success) return (int)st;
    p->used = ++mm->calls;
    /* the primitive only reads a, b and bias (oneDNN's handles are not const) */
    st = dnnl_memory_set_data_handle(p->src, (void *)a);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(p->weights, (void *)b);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(p->bias, (void *)bias);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(p->dst, c);
    if (st == dnnl_success && p->scratch) st = dnnl_memory_set_data_handle(p->scratch, mm->scratch);
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->src},
                                    {DNNL_ARG_WEIGHTS, p->weights},
                                    {DNNL_ARG_BIAS, p->bias},
                                    {DNNL_ARG_DST, p->dst},
                                    {DNNL_ARG_SCRATCHPAD, p->scratch}};
    if (st == dnnl_success) st = dnnl_primitive_execute(p->prim, mm->stream, p->scratch ? 5 : 4, args);
    if (st == dnnl_success) st = dnnl_stream_wait(mm->stream);
    return (int)st;
}
#endif
