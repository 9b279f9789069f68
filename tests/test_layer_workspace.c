/* test_layer_workspace.c — the layers' workspace op: the one statement of each layer's scratch
 * memory, which crew_layer_reserve allocates and the memory planner counts.
 *
 * - what each layer type asks for, buffer by buffer, against the sizes written out by hand
 *   (im2col columns, arg-maxes, masks, normalisation statistics), so a change to a layer's
 *   workspace is a deliberate change to this file too;
 * - what crew_layer_reserve really allocates, seen through a backend that counts its allocations
 *   (rounded as the CPU backend rounds them), against crew_mem_layer_workspace: the planner's
 *   figure and the allocation agree to the byte, for several batch sizes, and a second reserve
 *   replaces the buffers rather than adding to them;
 * - what crew_model_reserve allocates for a whole model (activations, gradient ping-pong buffers,
 *   labels, row losses, workspace) against the planner's figure, to the byte (crew_model_buffers
 *   is the one statement of the model's own buffers);
 * - a training pass over every layer type with workspace reserved this way (the sizes suffice),
 *   and again with every gradient written over its parameter's value (ZeRO-3's units): the same
 *   gradients, bit for bit (each layer reads a value before writing its gradient, or keeps a copy);
 * - a GPT's transformer block, its attention probabilities float32 and (--precision bf16) bfloat16;
 * - the layers' scratch shared in a model: one buffer per slot, the largest any layer asks for;
 * - layer norm behind parameter-free layers (dropout, flatten): the model's backward passes it no
 *   dx there just as at layer 0, so it needs its spare input-gradient buffer there too; the
 *   sizes, a training pass and a few steps of crew_model_fit (two replicas: clones) show it has. */
#include <stdlib.h>
#include <string.h>

#include "advise/memory_plan.h"
#include "check.h"
#include "core/status.h"
#include "nn/model.h"
#include "synthetic.h"
#include "train/rank.h"

/* ---------------------------------------------------------------- a backend that counts */

#define MAX_LIVE 256

typedef struct counting {
    crew_backend cpu;
    crew_backend_ops ops;
    void *ptr[MAX_LIVE];
    int64_t bytes[MAX_LIVE];
    int64_t live;           /* bytes held, each allocation rounded as the CPU backend rounds it */
    int overflow;
} counting;

/* Every op gets the inner device's ctx (the ops other than alloc and free are the device's own),
 * so alloc and free find the count here. */
static counting counter;

static crew_status counting_alloc(void *ctx, crew_dtype t, int64_t n, void **out)
{
    counting *c = &counter;
    CREW_TRY(c->cpu.ops->alloc(ctx, t, n, out));
    for (int i = 0; i < MAX_LIVE; i++)
        if (!c->ptr[i]) {
            c->ptr[i] = *out;
            c->bytes[i] = crew_mem_alloc_bytes(n, (int64_t)crew_dtype_size(t));
            c->live += c->bytes[i];
            return CREW_OK;
        }
    c->overflow = 1;
    return CREW_OK;
}

static void counting_free(void *ctx, void *p)
{
    counting *c = &counter;
    if (!p) return;
    for (int i = 0; i < MAX_LIVE; i++)
        if (c->ptr[i] == p) {
            c->live -= c->bytes[i];
            c->ptr[i] = NULL;
            break;
        }
    c->cpu.ops->free(ctx, p);
}

/* The models given it never close it (they did not open it); the next call, or main, does. */
static crew_backend counting_backend(void)
{
    crew_device_close(&counter.cpu);
    memset(&counter, 0, sizeof counter);
    crew_status s = crew_device_open("cpu", 0, NULL, &counter.cpu);
    CHECK_OK(s);
    counter.ops = *counter.cpu.ops;
    counter.ops.alloc = counting_alloc;
    counter.ops.free = counting_free;
    return (crew_backend){.ops = &counter.ops, .ctx = counter.cpu.ctx};
}

/* ---------------------------------------------------------------- the models */

/* Every layer type with a workspace, some twice in different places: layer norm first (it keeps
 * a spare input-gradient buffer there) and behind trainable layers (no spare); conv with strides, 'valid' and 'same', with
 * and without bias; pooling 'same'. Input [15, 13, 3]. */
static crew_model *image_model(void)
{
    crew_model *m = NULL;
    crew_layer_spec layers[] = {
        {.type = CREW_LAYER_LAYER_NORM},                                                   /* 0 */
        {.type = CREW_LAYER_CONV2D, .filters = 7, .kernel = {3, 5}, .strides = {2, 1},
         .activation = CREW_ACT_RELU},                                                     /* 1, 2: (7, 9, 7) */
        {.type = CREW_LAYER_BATCH_NORM},                                                   /* 3 */
        {.type = CREW_LAYER_MAX_POOL2D, .padding = CREW_PAD_SAME},                         /* 4: (4, 5, 7) */
        {.type = CREW_LAYER_CONV2D, .filters = 5, .kernel = {3, 3}, .padding = CREW_PAD_SAME,
         .no_bias = 1},                                                                    /* 5: (4, 5, 5) */
        {.type = CREW_LAYER_AVG_POOL2D, .padding = CREW_PAD_SAME},                         /* 6: (2, 3, 5) */
        {.type = CREW_LAYER_LAYER_NORM},                                                   /* 7 */
        {.type = CREW_LAYER_DROPOUT, .rate = 0.25f},                                       /* 8 */
        {.type = CREW_LAYER_GLOBAL_AVG_POOL2D},                                            /* 9: (5,) */
        {.type = CREW_LAYER_DENSE, .units = 11, .activation = CREW_ACT_TANH},             /* 10, 11 */
        {.type = CREW_LAYER_DROPOUT, .rate = 0.1f},                                        /* 12 */
        {.type = CREW_LAYER_FLATTEN},                                                      /* 13 */
        {.type = CREW_LAYER_DENSE, .units = 4},                                            /* 14 */
    };
    crew_status s = crew_model_create((int64_t[]){15, 13, 3}, 3, &m);
    for (size_t i = 0; !s && i < sizeof layers / sizeof *layers; i++) s = crew_model_add(m, &layers[i]);
    CHECK_OK(s);
    return m;
}

/* Token ids [9] → embedding [9, 6] → layer norm per token → dense. */
static crew_model *token_model(void)
{
    crew_model *m = NULL;
    crew_status s = crew_model_create((int64_t[]){9}, 1, &m);
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_EMBEDDING, .vocab = 50, .dim = 6});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_LAYER_NORM});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 4});
    CHECK_OK(s);
    return m;
}

/* A GPT: token embedding [9 positions, 8] → two transformer blocks (2 heads) → layer norm → LM
 * head over 50 tokens; the others are the same set for --precision bf16, --attention recompute and
 * both (crew_model_set_storage). */
static crew_model *gpt_model(void)
{
    crew_model *m = NULL;
    crew_layer_spec layers[] = {
        {.type = CREW_LAYER_GPT_EMBEDDING, .vocab = 50, .dim = 8},
        {.type = CREW_LAYER_TRANSFORMER_BLOCK, .heads = 2, .blocks = 2},
        {.type = CREW_LAYER_TRANSFORMER_BLOCK, .heads = 2, .blocks = 2},
        {.type = CREW_LAYER_LAYER_NORM, .epsilon = 1e-5f},
        {.type = CREW_LAYER_LM_HEAD},
    };
    crew_status s = crew_model_create((int64_t[]){9}, 1, &m);
    for (size_t i = 0; !s && i < sizeof layers / sizeof *layers; i++) s = crew_model_add(m, &layers[i]);
    CHECK_OK(s);
    return m;
}

static crew_model *gpt_model_as(int bf16, int att_recompute)
{
    crew_model *m = gpt_model();
    if (m) crew_model_set_storage(m, &(crew_act_storage){.bf16 = bf16, .att_recompute = att_recompute});
    return m;
}

static crew_model *gpt_model_bf16(void) { return gpt_model_as(1, 0); }
static crew_model *gpt_model_recompute(void) { return gpt_model_as(0, 1); }
static crew_model *gpt_model_bf16_recompute(void) { return gpt_model_as(1, 1); }

/* Parameter-free layers first: dropout → layer norm → flatten → dense → layer norm → dense, input
 * [SYN_SIDE, SYN_SIDE, 1] (the synthetic dataset's images). Nothing before the first layer norm
 * has parameters, so backward calls it without dx; the second sits behind a dense layer. */
static crew_model *free_first_model(void)
{
    crew_model *m = NULL;
    crew_layer_spec layers[] = {
        {.type = CREW_LAYER_DROPOUT, .rate = 0.1f},      /* 0 */
        {.type = CREW_LAYER_LAYER_NORM},                 /* 1: per pixel, one channel */
        {.type = CREW_LAYER_FLATTEN},                    /* 2: (144,) */
        {.type = CREW_LAYER_DENSE, .units = 6},          /* 3 */
        {.type = CREW_LAYER_LAYER_NORM},                 /* 4 */
        {.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}, /* 5 */
    };
    crew_status s = crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m);
    for (size_t i = 0; !s && i < sizeof layers / sizeof *layers; i++) s = crew_model_add(m, &layers[i]);
    CHECK_OK(s);
    return m;
}

/* ---------------------------------------------------------------- the checks */

static void expect4(const crew_model *m, int layer, int64_t rows, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    int64_t n[CREW_LAYER_MAX_WORK];
    crew_layer_workspace(m->layers[layer], rows, n);
    CHECK_MSG(n[0] == n0 && n[1] == n1 && n[2] == n2 && n[3] == n3 && n[4] == 0,
              "layer %d (%s), %lld rows: workspace {%lld, %lld, %lld, %lld, %lld}, expected {%lld, %lld, %lld, %lld, 0}",
              layer, m->layers[layer]->name, (long long)rows, (long long)n[0], (long long)n[1], (long long)n[2],
              (long long)n[3], (long long)n[4], (long long)n0, (long long)n1, (long long)n2, (long long)n3);
}
static void expect(const crew_model *m, int layer, int64_t rows, int64_t n0, int64_t n1, int64_t n2)
{
    expect4(m, layer, rows, n0, n1, n2, 0);
}

/* The sizes by hand, from the shapes in image_model's comments. */
static void check_image_sizes(const crew_model *m)
{
    for (int64_t rows = 1; rows <= 64; rows *= 4) {
        expect4(m, 0, rows, rows * 15 * 13, rows * 15 * 13, rows * 15 * 13 * 3, 3); /* mean, rstd; spare dx; gamma */
        expect(m, 1, rows, rows * 7 * 9 * (3 * 5 * 3), 0, 0);                   /* im2col columns */
        expect(m, 2, rows, 0, 0, 0);
        expect(m, 3, rows, 2 * 7, 4 * 7 * 2, 7);     /* per channel, any batch: mean, var; 4 double sums; gamma */
        expect(m, 4, rows, rows * 4 * 5 * 7, 0, 0);                             /* arg-maxes */
        expect(m, 5, rows, rows * 4 * 5 * (3 * 3 * 7), 0, 0);
        expect(m, 6, rows, 0, 0, 0);
        expect4(m, 7, rows, rows * 2 * 3, rows * 2 * 3, 0, 5);                  /* backward passes dx here */
        expect(m, 8, rows, rows * 2 * 3 * 5, 0, 0);                             /* mask */
        for (int i = 9; i <= 11; i++) expect(m, i, rows, 0, 0, 0);
        expect(m, 12, rows, rows * 11, 0, 0);
        for (int i = 13; i <= 14; i++) expect(m, i, rows, 0, 0, 0);
    }
    /* A conv works a chunk of samples at a time: its columns stop growing at 1 MB (262144
     * floats), here 262144 / 2835 = 92 samples. */
    expect(m, 1, 92, 92 * 2835, 0, 0);
    expect(m, 1, 93, 92 * 2835, 0, 0);
    expect(m, 1, 1000, 92 * 2835, 0, 0);
}

static void check_token_sizes(const crew_model *m)
{
    for (int64_t rows = 1; rows <= 64; rows *= 4) {
        expect(m, 0, rows, 0, 0, 0);
        expect4(m, 1, rows, rows * 9, rows * 9, 0, 6); /* one position per token; gamma */
        expect(m, 2, rows, 0, 0, 0);
        expect(m, 3, rows, 0, 0, 0);
    }
}

/* The block's buffers (layer_transformer.c's W_*), n = 9·rows positions of width 8, the
 * probabilities and their gradient rows·2·9·9 values, no dropout masks, a gamma's copy (8). In bfloat16 (s.bf16), ln_1,
 * the attention output, ln_2, the GELU's output and the probabilities two to a 4-byte element;
 * recomputed (s.att_recompute), the probabilities in W_ATT_RE (16) instead of W_ATT (3). */
static void gpt_block_want(int64_t rows, crew_act_storage s, int64_t want[CREW_LAYER_MAX_WORK])
{
    int64_t n = 9 * rows, att = rows * 2 * 9 * 9, c = s.bf16 ? 4 * n : 8 * n, p = s.bf16 ? (att + 1) / 2 : att;
    int64_t w[CREW_LAYER_MAX_WORK] = {c, 2 * n, 24 * n, s.att_recompute ? 0 : p, c, 8 * n, c, 2 * n, 32 * n,
                                      s.bf16 ? 16 * n : 32 * n, 32 * n, 8 * n, 8 * n, att, 0, 0,
                                      s.att_recompute ? p : 0, 8};
    memcpy(want, w, sizeof w);
}

static void check_gpt_sizes(const crew_model *m)
{
    for (int b = 1; b <= 2; b++) { /* the two blocks */
        const crew_layer *block = m->layers[b];
        for (int64_t rows = 1; rows <= 64; rows *= 4)
            for (int as = -1; as < 4; as++) { /* as the layer is set, then the planner's view of each storage */
                crew_act_storage s = as < 0 ? block->store : (crew_act_storage){as & 1, as >> 1, 0};
                int64_t want[CREW_LAYER_MAX_WORK], got[CREW_LAYER_MAX_WORK];
                gpt_block_want(rows, s, want);
                if (as >= 0)
                    crew_layer_workspace_as(block, rows, &s, got);
                else
                    crew_layer_workspace(block, rows, got);
                for (int k = 0; k < CREW_LAYER_MAX_WORK; k++)
                    CHECK_MSG(got[k] == want[k], "block %d (%s%s%s), %lld rows: work[%d] %lld, expected %lld", b,
                              s.bf16 ? "bf16" : "fp32", s.att_recompute ? ", recomputed" : "",
                              as >= 0 ? ", crew_layer_workspace_as" : "", (long long)rows, k, (long long)got[k],
                              (long long)want[k]);
            }
    }
}

/* The spare dx buffer follows needs_input_grad, which is 0 up to the first layer with trainable
 * parameters, wherever that layer is (here index 1, not 0). */
static void check_free_first_sizes(const crew_model *m)
{
    const int needs[] = {0, 0, 1, 1, 1, 1};
    for (int i = 0; i < m->n_layers; i++)
        CHECK_MSG(m->layers[i]->needs_input_grad == needs[i], "layer %d (%s): needs_input_grad %d, expected %d", i,
                  m->layers[i]->name, m->layers[i]->needs_input_grad, needs[i]);
    int64_t px = SYN_SIDE * SYN_SIDE;
    for (int64_t rows = 1; rows <= 64; rows *= 4) {
        expect(m, 0, rows, rows * px, 0, 0);                   /* mask */
        expect4(m, 1, rows, rows * px, rows * px, rows * px, 1); /* mean, rstd; spare dx: no dx comes */
        expect(m, 2, rows, 0, 0, 0);
        expect(m, 3, rows, 0, 0, 0);
        expect4(m, 4, rows, rows, rows, 0, 6);                 /* behind dense: backward passes dx */
        expect(m, 5, rows, 0, 0, 0);
    }
}

/* The storage m's layers are set for (crew_model_set_storage sets every layer alike). */
static crew_act_storage storage_of(const crew_model *m)
{
    return m->n_layers > 0 ? m->layers[0]->store : (crew_act_storage){0, 0, 0};
}

/* A model's layers share their scratch (crew_layer_ops.scratch): after crew_model_reserve, every
 * layer with slot k's scratch points at the model's one buffer for it, which is as large as the
 * largest asks, and no other slot is shared. m is a fresh model, freed here. */
static void check_scratch_shared(crew_model *m, const char *what)
{
    CHECK_OK(crew_model_reserve(m, 5));
    int64_t sizes[CREW_LAYER_MAX_WORK];
    crew_model_scratch_sizes(m, 5, NULL, sizes);
    int shared = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        int64_t n[CREW_LAYER_MAX_WORK];
        crew_layer_workspace(l, 5, n);
        for (int k = 0; k < CREW_LAYER_MAX_WORK; k++) {
            int scratch = (l->ops->scratch >> k) & 1;
            if (n[k] <= 0) continue;
            CHECK_MSG((l->work[k] == m->scratch[k]) == scratch && (int)((l->work_shared >> k) & 1u) == scratch,
                      "%s: layer %d (%s), work[%d]: shared %d, scratch %d", what, i, l->name, k,
                      l->work[k] == m->scratch[k], scratch);
            CHECK_MSG(!scratch || n[k] <= sizes[k], "%s: layer %d, work[%d]: %lld values, the shared buffer %lld",
                      what, i, k, (long long)n[k], (long long)sizes[k]);
            shared += scratch;
        }
    }
    CHECK_MSG(shared > 0, "%s: no layer shares scratch", what);
    crew_model_free(m);
}

/* What crew_layer_reserve allocates is, to the byte, what the planner counts. */
static void check_reserve_matches_plan(crew_model *m, const char *what)
{
    crew_backend be = counting_backend();
    crew_mem_model mm;
    crew_mem_model_init(&mm, m, storage_of(m), 0.0);
    const int64_t rows[] = {1, 3, 37, 128, 5}; /* up and down: each reserve replaces the last */
    for (int i = 0; i < m->n_layers; i++) {
        crew_layer *l = m->layers[i];
        int64_t base = counter.live;
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
            CHECK_OK(crew_layer_reserve(l, &be, rows[r]));
            /* alone, outside a model, the layer allocates its scratch too */
            int64_t scratch[CREW_LAYER_MAX_WORK];
            crew_mem_layer_scratch(&mm, i, rows[r], scratch);
            int64_t planned = crew_mem_layer_workspace(&mm, i, rows[r]) + crew_mem_scratch_bytes(scratch);
            CHECK_MSG(counter.live - base == planned, "%s: layer %d (%s), %lld rows: reserve allocated %lld bytes, "
                      "the plan counts %lld", what, i, l->name, (long long)rows[r], (long long)(counter.live - base),
                      (long long)planned);
            CHECK(l->reserved_rows == rows[r]);
            int64_t n[CREW_LAYER_MAX_WORK];
            crew_layer_workspace(l, rows[r], n);
            for (int k = 0; k < CREW_LAYER_MAX_WORK; k++)
                CHECK_MSG((l->work[k] != NULL) == (n[k] > 0), "%s: layer %d, work[%d]: allocated %d, asked %lld",
                          what, i, k, l->work[k] != NULL, (long long)n[k]);
        }
        l->ops->release(l, &be);
        CHECK_MSG(counter.live == base, "%s: layer %d (%s): release left %lld bytes", what, i, l->name,
                  (long long)(counter.live - base));
    }
    CHECK(!counter.overflow);
}

/* What crew_model_reserve allocates (the gradient buffer, the model's other buffers and every
 * layer's workspace) is, to the byte, the planner's gradients, activations and workspace less the
 * rank's scratch for small all-reduces, which rank.c allocates. m is a fresh model, freed here. */
static void check_model_reserve_matches_plan(crew_model *m, const char *what)
{
    m->be = counting_backend();
    m->has_backend = 1;
    crew_status s = crew_model_layout(m);
    CHECK_OK(s);
    crew_mem_model mm;
    crew_mem_model_init(&mm, m, storage_of(m), 0.0);
    int64_t base = counter.live;
    const int64_t rows[] = {1, 3, 37, 128}; /* reserve only grows; each replaces the last */
    for (size_t r = 0; !s && r < sizeof rows / sizeof *rows; r++) {
        CHECK_OK(crew_model_reserve(m, rows[r]));
        crew_mem_costs c;
        crew_mem_replica(&mm, rows[r], 1, 1, CREW_SHARD_NONE, &c);
        int64_t scratch = crew_mem_alloc_bytes(crew_rank_scratch_size(1, crew_model_named_params(m, NULL, 0)),
                                               (int64_t)sizeof(double));
        int64_t planned = c.gradient + c.activation + c.workspace - scratch;
        CHECK_MSG(counter.live - base == planned, "%s, %lld rows: crew_model_reserve allocated %lld bytes, the plan "
                  "counts %lld", what, (long long)rows[r], (long long)(counter.live - base), (long long)planned);
    }
    CHECK(!counter.overflow);
    crew_model_free(m);
    CHECK_MSG(counter.live == 0, "%s: the model left %lld bytes allocated", what, (long long)counter.live);
}

/* A training step through every layer on workspace sized by the op, all buffers counted. */
/* The pass again with every gradient written over its parameter's value, as ZeRO-3 writes a
 * gathered unit's (nn/layer.h: each layer reads a value before it writes its gradient, or keeps a
 * copy): the values' buffer then holds the first pass's gradients, bit for bit. Where the model
 * can compute its tied gradients late (ZeRO-3 without overlap: crew_model.tied_grads_late), a third
 * pass does so, from the same values: the same bits again. */
static void check_grads_over_values(crew_model *m, crew_pass *p, const char *what)
{
    const crew_backend_ops *o = m->be.ops;
    const int64_t n = m->n_params;
    float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    float *values = malloc((size_t)n * sizeof *values);
    if (!want || !got || !values) abort();
    CHECK_OK(o->download(m->be.ctx, want, m->grads, n, CREW_DT_F32));
    CHECK_OK(o->download(m->be.ctx, values, m->params, n, CREW_DT_F32));
    int tied = 0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            crew_param *q = &m->layers[i]->params[j];
            if (q->trainable && !q->tied) q->grad = q->value;
            tied |= q->tied;
        }
    crew_model_point_tied(m);
    const int late_ok = crew_model_tied_late_ok(m);
    CHECK_MSG(late_ok == tied, "%s: a tied lm_head at the top, yet its gradient cannot come late (%d)", what, late_ok);
    for (int late = 0; late <= late_ok; late++) {
        m->tied_grads_late = late;
        CHECK_OK(o->upload(m->be.ctx, NULL, m->params, values, n, CREW_DT_F32));
        double loss = 0.0, correct = 0.0;
        crew_status s = crew_model_forward(m, p);
        if (!s) s = crew_model_loss(m, p, 1.0f / (float)p->rows, &loss, &correct);
        if (!s) s = crew_model_backward(m, p, NULL, NULL);
        CHECK_OK(s);
        CHECK_OK(o->download(m->be.ctx, got, m->params, n, CREW_DT_F32));
        int64_t first = -1;
        for (int64_t i = 0; i < n && first < 0; i++)
            if (memcmp(&got[i], &want[i], sizeof *got) != 0) first = i;
        CHECK_MSG(first < 0, "%s: the gradients written over the values%s differ from the first pass's at value %lld "
                  "of %lld", what, late ? ", the tied ones late," : "", (long long)first, (long long)n);
    }
    m->tied_grads_late = 0;
    free(values);
    free(want);
    free(got);
}

static void check_training_pass(crew_model *m, int64_t rows, int token_ids, const char *what)
{
    m->be = counting_backend();
    m->has_backend = 1;
    crew_status s = crew_model_init_params(m, 7);
    if (!s) s = crew_model_reserve(m, rows);
    int failed = s != CREW_OK;
    CHECK_OK(s);
    if (failed) return;
    int64_t in = rows * crew_shape_size(&m->input), classes = crew_model_classes(m);
    float *x = malloc((size_t)in * sizeof *x);
    if (!x) abort();
    for (int64_t i = 0; i < in; i++) x[i] = token_ids ? (float)(i % 50) : (float)((i * 37) % 101) / 50.0f - 1.0f;
    int64_t ids[128];
    int32_t y[128];
    for (int64_t r = 0; r < rows; r++) {
        y[r] = (int32_t)(r % classes);
        ids[r] = r;
    }
    const crew_backend_ops *o = m->be.ops;
    CHECK_OK(o->upload(m->be.ctx, NULL, m->act[0], x, in, CREW_DT_F32));
    CHECK_OK(o->upload(m->be.ctx, NULL, m->labels, y, rows, CREW_DT_I32));
    CHECK_OK(o->upload(m->be.ctx, NULL, m->sample_ids, ids, rows, CREW_DT_I64));
    CHECK_OK(o->sync(m->be.ctx, NULL));
    free(x);
    crew_pass p = {.be = &m->be, .rows = rows, .training = 1, .seed = 3, .step = 1, .sample_ids = m->sample_ids,
                   .total_rows = (double)rows};
    double loss = 0.0, correct = 0.0;
    s = crew_model_forward(m, &p);
    if (!s) s = crew_model_loss(m, &p, 1.0f / (float)rows, &loss, &correct);
    if (!s) s = crew_model_backward(m, &p, NULL, NULL);
    CHECK_OK(s);
    CHECK_MSG(loss > 0.0 && loss < 1e3 * (double)rows, "loss %g", loss);
    if (!s) check_grads_over_values(m, &p, what);
    crew_model_free(m);
    CHECK_MSG(counter.live == 0, "the model left %lld bytes allocated", (long long)counter.live);
}

/* A few optimizer steps of the real training loop on two replicas (clones of m, whose layers
 * are appended anew): before needs_input_grad, the layer norm at index 1 had no spare buffer and
 * step 1 failed with "layer 1 (...): no buffer for the input gradient". */
static void check_fit_steps(void)
{
    char dir[] = "/tmp/crew_ln_fitXXXXXX", data[400];
    if (syn_make_dataset(dir, 96, data, sizeof data) != 0) {
        CHECK_MSG(0, "could not write the synthetic dataset");
        return;
    }
    crew_model *m = free_first_model();
    crew_dataset *d = NULL;
    crew_status s = m ? crew_dataset_open(data, "train", &d) : CREW_OK;
    crew_fit_result r = {0};
    if (m && !s) {
        crew_fit_options o;
        crew_model_default_fit(m, &o);
        o.devices = 2;
        o.batch_per_device = 8;
        o.epochs = 1;
        o.max_steps = 4;
        o.loader_threads = 1;
        s = crew_model_fit(m, d, &o, &r);
    }
    CHECK_MSG(s == CREW_OK, "fit: %s", crew_status_message(s));
    if (!s) {
        CHECK_MSG(r.steps == 4, "fit ran %lld steps, expected 4", (long long)r.steps);
        CHECK_MSG(r.train_loss > 0.0f && r.train_loss < 10.0f, "train loss %g", (double)r.train_loss);
    }
    crew_status_free(s);
    crew_dataset_free(d);
    crew_model_free(m);
    syn_remove(dir);
}

/* Relu, tanh and sigmoid behind a layer that is not an activation write over their input:
 * act[i + 1] is act[i] and the plan counts no activation for them (image model: 2 the conv's
 * relu, 11 the dense's tanh). An activation first (the model's input is data), one whose
 * derivative needs its input (gelu), or one behind another activation (whose output that one's
 * backward reads) keeps a buffer of its own. A flatten below the top hands its input through
 * (image model: 13), as does a relu in place right before a max pool, which then pools relu(x)
 * (its relu_in): act[i + 1] is act[i] for those too. want[i]: 1 in place, 2 hands through,
 * 3 both. */
static void check_in_place(const crew_model *m, const int *want, const char *what)
{
    for (int i = 0; i < m->n_layers; i++) {
        int in_place = crew_model_layer_in_place(m, i), passes = crew_model_layer_passes(m, i);
        int alias = in_place || passes;
        CHECK_MSG(in_place + 2 * passes == want[i], "%s: layer %d (%s) in place %d, hands through %d, expected %d", what,
                  i, m->layers[i]->name, in_place, passes, want[i]);
        CHECK_MSG((m->act[i + 1] == m->act[i]) == alias && (crew_model_layer_act_size(m, i, 5) == 0) == alias,
                  "%s: layer %d (%s): buffers do not follow in-place %d, hands through %d", what, i,
                  m->layers[i]->name, in_place, passes);
        const int relu_in = i + 1 < m->n_layers && m->layers[i + 1]->relu_in;
        CHECK_MSG(relu_in == (passes && m->layers[i]->spec.type == CREW_LAYER_ACTIVATION),
                  "%s: layer %d (%s) hands through %d, the pool after it takes relu in %d", what, i, m->layers[i]->name,
                  passes, relu_in);
    }
}

static void check_in_place_models(void)
{
    crew_model *image = image_model();
    if (!image) return;
    crew_status s = crew_model_init_params(image, 1);
    if (!s) s = crew_model_reserve(image, 37);
    if (!s) s = crew_model_reserve(image, 128); /* again, larger: the aliases follow their owners */
    CHECK_OK(s);
    const int image_want[15] = {[2] = 1, [11] = 1, [13] = 2};
    if (image->act) check_in_place(image, image_want, "image model");
    crew_model_free(image);
    crew_model *m = NULL;
    s = crew_model_create((int64_t[]){6}, 1, &m);
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_ACTIVATION, .activation = CREW_ACT_RELU});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 5, .activation = CREW_ACT_GELU});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 4, .activation = CREW_ACT_SIGMOID});
    if (!s) s = crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_ACTIVATION, .activation = CREW_ACT_TANH});
    if (!s) s = crew_model_init_params(m, 1);
    if (!s) s = crew_model_reserve(m, 5);
    CHECK_OK(s);
    const int want[6] = {0, 0, 0, 0, 1, 0}; /* relu first, dense, gelu, dense, sigmoid, tanh behind it */
    if (m && m->n_layers == 6 && m->act) check_in_place(m, want, "relu first, gelu, sigmoid, tanh");
    crew_model_free(m);
    /* examples/fashion_cnn.json's layers: each conv's relu folds into its pool; the flatten hands
     * through; the dense's relu, before dropout, only writes in place */
    m = NULL;
    s = crew_model_create((int64_t[]){8, 8, 1}, 3, &m);
    const crew_layer_spec cnn[] = {
        {.type = CREW_LAYER_CONV2D, .filters = 3, .kernel = {3, 3}, .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_MAX_POOL2D},
        {.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {3, 3}, .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_MAX_POOL2D},
        {.type = CREW_LAYER_FLATTEN},
        {.type = CREW_LAYER_DENSE, .units = 5, .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_DROPOUT, .rate = 0.5f},
        {.type = CREW_LAYER_DENSE, .units = 3},
    };
    for (size_t i = 0; !s && i < sizeof cnn / sizeof *cnn; i++) s = crew_model_add(m, &cnn[i]);
    if (!s) s = crew_model_init_params(m, 1);
    if (!s) s = crew_model_reserve(m, 5);
    CHECK_OK(s);
    const int cnn_want[10] = {0, 3, 0, 0, 3, 0, 2, 0, 1, 0};
    if (m && m->n_layers == 10 && m->act) check_in_place(m, cnn_want, "CNN");
    /* the first convolution (9 taps, its input data) takes in its relu and pool; the second, whose
     * input needs a gradient, does not */
    for (int i = 0; m && i < m->n_layers; i++)
        CHECK_MSG(crew_model_layer_absorbs(m, i) == (i == 0), "CNN: layer %d (%s) absorbs %d", i, m->layers[i]->name,
                  crew_model_layer_absorbs(m, i));
    crew_model_free(m);
    /* a flatten first hands the model's input through, so the relu behind it may not write over
     * it (the caller's data), nor hand it through to the pool; a flatten on top does not hand
     * through (the loss writes over the logits) */
    m = NULL;
    s = crew_model_create((int64_t[]){4, 4, 2}, 3, &m);
    const crew_layer_spec first[] = {
        {.type = CREW_LAYER_FLATTEN},
        {.type = CREW_LAYER_ACTIVATION, .activation = CREW_ACT_RELU},
        {.type = CREW_LAYER_DENSE, .units = 6},
        {.type = CREW_LAYER_FLATTEN},
    };
    for (size_t i = 0; !s && i < sizeof first / sizeof *first; i++) s = crew_model_add(m, &first[i]);
    if (!s) s = crew_model_init_params(m, 1);
    if (!s) s = crew_model_reserve(m, 5);
    CHECK_OK(s);
    const int first_want[4] = {2, 0, 0, 0};
    if (m && m->n_layers == 4 && m->act) check_in_place(m, first_want, "flatten first, relu, dense, flatten");
    crew_model_free(m);
}

/* The models, each with the sizes written out for it. */
static const struct {
    const char *what;
    crew_model *(*build)(void);
    void (*check_sizes)(const crew_model *m);
    int token_ids; /* the input is token ids, not pixels */
} MODELS[] = {
    {"image model", image_model, check_image_sizes, 0},
    {"token model", token_model, check_token_sizes, 1},
    {"parameter-free layers first", free_first_model, check_free_first_sizes, 0},
    {"GPT", gpt_model, check_gpt_sizes, 1},
    {"GPT, bf16 activations", gpt_model_bf16, check_gpt_sizes, 1},
    {"GPT, attention recomputed", gpt_model_recompute, check_gpt_sizes, 1},
    {"GPT, bf16 and attention recomputed", gpt_model_bf16_recompute, check_gpt_sizes, 1},
};

int main(void)
{
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        crew_model *m = MODELS[i].build();
        if (!m) continue;
        MODELS[i].check_sizes(m);
        check_reserve_matches_plan(m, MODELS[i].what);
        crew_model *fresh = MODELS[i].build();
        if (fresh) check_model_reserve_matches_plan(fresh, MODELS[i].what);
        check_training_pass(m, 37, MODELS[i].token_ids, MODELS[i].what);
    }
    check_scratch_shared(image_model(), "image model (two convolutions)");
    check_scratch_shared(gpt_model(), "GPT (two blocks)");
    check_scratch_shared(gpt_model_bf16_recompute(), "GPT (two blocks, bf16, attention recomputed)");
    check_in_place_models();
    check_fit_steps();
    crew_device_close(&counter.cpu);
    return check_report();
}
