/* memory_plan.c — a replica's bytes from the model's structure, buffer by buffer as training
 * allocates them (see memory_plan.h), and crew_model_plan_memory, which adds them up. */
#include "advise/memory_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/options.h"
#include "core/status.h"
#include "nn/layer.h"
#include "train/rank.h"
#include "train/step.h"

#define F32 ((int64_t)sizeof(float))
#define CREW_MEM_MAX_REPLICAS 1024 /* resolve()'s limit, and the verdict's (MAX_SHARDS) */

int64_t crew_mem_alloc_bytes(int64_t n, int64_t elem)
{
    if (n <= 0) n = 1; /* the CPU backend allocates at least one element */
    return (n * elem + 63) / 64 * 64;
}

/* The widest unit but the pinned one, and the pinned one (crew_model_units). */
static void unit_sizes(crew_mem_model *mm, double unit_mb)
{
    const int64_t target = crew_bucket_values(unit_mb > 0.0 ? unit_mb : CREW_SHARD_UNIT_MB);
    const int n = crew_model_units(mm->m, target, NULL, 0);
    crew_unit *u = malloc((size_t)n * sizeof *u + 1);
    if (!u) return; /* counted as none: a plan off by the units, not a failure */
    crew_model_units(mm->m, target, u, n);
    crew_model_unit_widths(u, n, &mm->unit_widest, &mm->unit_pinned);
    free(u);
    mm->unit_tied_late = crew_model_tied_late_ok(mm->m);
}

void crew_mem_model_init(crew_mem_model *mm, const crew_model *m, crew_act_storage store, double unit_mb)
{
    memset(mm, 0, sizeof *mm);
    mm->m = m;
    mm->store = store;
    unit_sizes(mm, unit_mb);
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++) {
            const crew_param *p = &m->layers[i]->params[j];
            if (!crew_param_owned(p)) continue;
            *(p->trainable ? &mm->n_params : &mm->n_state) += crew_shape_size(&p->shape);
        }
    crew_compile_options c;
    if (m->compiled)
        c = m->compile;
    else
        crew_model_default_compile(m, &c);
    static const char *const names[] = {"", "SGD", "AdamW", "LAMB", "LARS"}; /* crew_optimizer_type's order */
    const int momentum = c.optimizer.momentum > 0.0f && c.optimizer.type == CREW_OPT_SGD;
    mm->slots = crew_optimizer_slots(&c.optimizer);
    mm->optimizer = momentum ? "SGD with momentum" : names[c.optimizer.type <= CREW_OPT_LARS ? c.optimizer.type : 0];
    mm->in_size = crew_shape_size(&m->input);
}

int64_t crew_mem_layer_weights(const crew_mem_model *mm, int i, int shards)
{
    const crew_layer *l = mm->m->layers[i];
    int64_t bytes = 0;
    for (int j = 0; j < l->n_params; j++) {
        if (!crew_param_owned(&l->params[j])) continue;
        int64_t n = crew_shape_size(&l->params[j].shape);
        if (!l->params[j].trainable) {
            bytes += n * F32;
            continue;
        }
        /* value, gradient, and this replica's share of the optimizer's slots */
        bytes += 2 * n * F32 + mm->slots * ((n + shards - 1) / shards) * F32;
    }
    return bytes;
}

int64_t crew_mem_layer_activation(const crew_mem_model *mm, int i, int64_t rows)
{
    int64_t n = crew_model_layer_act_size_as(mm->m, i, rows, &mm->store);
    return n ? crew_mem_alloc_bytes(n, F32) : 0; /* 0: written over its input, nothing allocated */
}

/* Each buffer the layer's workspace op asks for, its scratch aside, as crew_layer_reserve_shared
 * allocates it: one backend allocation per buffer, each rounded up on its own. */
int64_t crew_mem_layer_workspace(const crew_mem_model *mm, int i, int64_t rows)
{
    int64_t n[CREW_LAYER_MAX_WORK], bytes = 0;
    const crew_layer *l = mm->m->layers[i];
    crew_layer_workspace_as(l, rows, &mm->store, n);
    for (int k = 0; k < CREW_LAYER_MAX_WORK; k++)
        if (n[k] > 0 && !(l->ops->scratch & (1u << k))) bytes += crew_mem_alloc_bytes(n[k], F32);
    return bytes;
}

void crew_mem_layer_scratch(const crew_mem_model *mm, int i, int64_t rows, int64_t n[CREW_LAYER_MAX_WORK])
{
    const crew_layer *l = mm->m->layers[i];
    crew_layer_workspace_as(l, rows, &mm->store, n);
    for (int k = 0; k < CREW_LAYER_MAX_WORK; k++)
        if (!(l->ops->scratch & (1u << k))) n[k] = 0;
}

int64_t crew_mem_scratch_bytes(const int64_t n[CREW_LAYER_MAX_WORK])
{
    int64_t bytes = 0;
    for (int k = 0; k < CREW_LAYER_MAX_WORK; k++)
        if (n[k] > 0) bytes += crew_mem_alloc_bytes(n[k], F32);
    return bytes;
}

/* ZeRO-2/3 (rank_units.c on replica 0): its shard of the summed gradient (a buffer of the widest
 * shard), the units' gradient buffers and under ZeRO-3 its shard of the parameters and the
 * gathered units' buffers, as crew_units_layout_for says; the optimizer state of its shard. */
static void sharded_weights(const crew_mem_model *mm, int devices, int shard, crew_mem_costs *out)
{
    int64_t bounds[CREW_MEM_MAX_REPLICAS + 1], widest = 0; /* replica 0's shard, and the widest */
    if (devices > CREW_MEM_MAX_REPLICAS) devices = CREW_MEM_MAX_REPLICAS; /* resolve() refuses more */
    crew_shard_bounds(mm->n_params, devices, bounds);
    for (int q = 0; q < devices; q++)
        if (bounds[q + 1] - bounds[q] > widest) widest = bounds[q + 1] - bounds[q];
    const int64_t own = bounds[1];
    crew_units_layout lay;
    crew_units_layout_for(mm->unit_widest, mm->unit_pinned, mm->unit_tied_late, shard, mm->unit_overlap, &lay);
    const int64_t slots = lay.slots * crew_mem_alloc_bytes(lay.slot_values, F32);
    const int64_t pinned = lay.pinned ? crew_mem_alloc_bytes(lay.pinned, F32) : 0;
    out->gradient = crew_mem_alloc_bytes(widest, F32) + (lay.slot_grads ? slots : 0) + (lay.pinned_grads ? pinned : 0);
    out->param = crew_mem_alloc_bytes(mm->n_state, F32) + (lay.params ? crew_mem_alloc_bytes(own, F32) + slots + pinned
                                                                      : crew_mem_alloc_bytes(mm->n_params, F32));
    if (mm->slots) out->optimizer = mm->slots * crew_mem_alloc_bytes(own, F32);
}

void crew_mem_replica(const crew_mem_model *mm, int64_t batch, int devices, int accumulation, int shard,
                      crew_mem_costs *out)
{
    const crew_model *m = mm->m;
    memset(out, 0, sizeof *out);
    const int shards = shard >= CREW_SHARD_OPTIMIZER && devices > 1 ? devices : 1;
    out->param = crew_mem_alloc_bytes(mm->n_params, F32) + crew_mem_alloc_bytes(mm->n_state, F32);
    out->gradient = crew_mem_alloc_bytes(mm->n_params, F32);
    if (mm->slots) out->optimizer = mm->slots * crew_mem_alloc_bytes((mm->n_params + shards - 1) / shards, F32);
    if (shard >= CREW_SHARD_GRADIENTS && devices > 1) sharded_weights(mm, devices, shard, out);
    /* crew_model_reserve's buffers, each its own allocation: the input's activation here, the
     * layers' outputs with the layers; the ping-pong buffers, labels, sample ids and row losses
     * count as workspace, with the rank's scratch for the small all-reduces. */
    crew_model_buffer_sizes n;
    crew_model_buffers(m, batch, &n);
    out->activation = crew_mem_alloc_bytes(n.act_input, F32);
    for (int i = 0; i < m->n_layers; i++) {
        out->activation += crew_mem_layer_activation(mm, i, batch);
        out->workspace += crew_mem_layer_workspace(mm, i, batch);
    }
    int64_t scratch[CREW_LAYER_MAX_WORK];
    crew_model_scratch_sizes(m, batch, &mm->store, scratch);
    out->workspace += crew_mem_scratch_bytes(scratch); /* the layers' shared scratch */
    out->workspace += crew_mem_alloc_bytes(n.dbuf[0], F32) + crew_mem_alloc_bytes(n.dbuf[1], F32) +
                      crew_mem_alloc_bytes(n.labels, (int64_t)sizeof(int32_t)) +
                      crew_mem_alloc_bytes(n.sample_ids, (int64_t)sizeof(int64_t)) + crew_mem_alloc_bytes(n.row_loss, F32);
    out->workspace += crew_mem_alloc_bytes(crew_rank_scratch_size(devices, crew_model_named_params(m, NULL, 0)),
                                           (int64_t)sizeof(double));
    /* One replica keeps a running sum; several keep every earlier micro-batch apart, so that
     * the all-reduce can add them in the fixed order (docs/ARCHITECTURE.md, determinism). */
    if (accumulation > 1)
        out->accumulation = (devices > 1 ? accumulation - 1 : 1) * crew_mem_alloc_bytes(mm->n_params, F32);
    out->total = out->param + out->gradient + out->optimizer + out->activation + out->workspace + out->accumulation;
}

int64_t crew_mem_host(const crew_mem_model *mm, int devices, int64_t global_batch, int prefetch, int64_t train_samples,
                      int64_t dataset_bytes)
{
    /* The rings of every rank's loader: all micro-batches of `prefetch` steps, samples as float32
     * plus labels and ids; each rank's loader also keeps two epochs' sample orders. The datasets'
     * own copies of their samples, as the caller measured them. And the caller's model, which a
     * run starts from and ends in: parameters and state. */
    int64_t ring = (int64_t)prefetch * global_batch * (mm->in_size * F32 + (int64_t)sizeof(int32_t) + (int64_t)sizeof(int64_t));
    int64_t caller = crew_mem_alloc_bytes(mm->n_params, F32) + crew_mem_alloc_bytes(mm->n_state, F32);
    return ring + (int64_t)devices * 2 * train_samples * (int64_t)sizeof(int64_t) + dataset_bytes + caller;
}

static int64_t physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (int64_t)pages * page : 0;
}

/* The asked plan's numbers; errors name the option that is wrong. */
static crew_status resolve(const crew_model *m, const crew_memory_options *o, crew_memory_plan *p)
{
    crew_fit_options d;
    crew_model_default_fit(m, &d);
    p->devices = o->devices > 0 ? o->devices : 1;
    p->batch_per_device = o->batch_per_device > 0 ? o->batch_per_device : d.batch_per_device;
    if (p->devices > 1024 || p->batch_per_device > (1 << 20) || o->devices < 0 || o->batch_per_device < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "devices must be in [1, 1024] and the batch per device in "
                           "[1, 1048576], got %d and %lld", o->devices, (long long)o->batch_per_device);
    int64_t round = (int64_t)p->devices * p->batch_per_device;
    p->global_batch = o->global_batch > 0 ? o->global_batch : round;
    if (o->global_batch < 0 || p->global_batch % round != 0 || p->global_batch / round > (1 << 20))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "global batch %lld is not a multiple of devices (%d) x batch "
                           "per device (%lld) = %lld", (long long)p->global_batch, p->devices,
                           (long long)p->batch_per_device, (long long)round);
    if (o->device_memory_bytes < 0 || o->train_samples < 0 || o->prefetch < 0 || o->prefetch > 1024 ||
        o->dataset_bytes < 0)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "device memory, training samples, prefetch and the datasets' "
                           "bytes must not be negative (prefetch at most 1024)");
    if (o->precision != CREW_PRECISION_FP32 && o->precision != CREW_PRECISION_BF16)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "precision %d: expected fp32 or bf16", o->precision);
    p->accumulation = (int)(p->global_batch / round);
    p->precision = o->precision;
    if (o->attention_recompute != 0 && o->attention_recompute != 1)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "attention_recompute %d: expected 0 or 1", o->attention_recompute);
    p->attention_recompute = o->attention_recompute;
    /* Not given: a GPU's own memory as its kind reports it, else the host's, which CPU replicas share. */
    const crew_device_kind *kind = crew_device_kind_find(o->device_kind ? o->device_kind : "cpu");
    int64_t own = !o->device_memory_bytes && kind && kind->memory_bytes ? kind->memory_bytes(0) : 0;
    p->shared_memory = o->device_memory_bytes == 0 && own == 0;
    p->device_memory_bytes = o->device_memory_bytes ? o->device_memory_bytes : own ? own : physical_memory();
    if (p->device_memory_bytes <= 0)
        return crew_errorf(CREW_CODE_IO, "could not read this machine's physical memory; give the device memory");
    return CREW_OK;
}

static crew_status fill_layers(const crew_mem_model *mm, int shards, crew_memory_plan *p)
{
    const crew_model *m = mm->m;
    p->layers = calloc((size_t)m->n_layers, sizeof *p->layers);
    if (!p->layers) return CREW_OOM();
    p->n_layers = m->n_layers;
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        crew_memory_layer *ml = &p->layers[i];
        snprintf(ml->name, sizeof ml->name, "%s", l->name);
        ml->type = crew_layer_type_name(l->spec.type);
        crew_shape_format(&l->out, ml->shape, sizeof ml->shape);
        for (int j = 0; j < l->n_params; j++)
            if (l->params[j].trainable && crew_param_owned(&l->params[j]))
                ml->params += crew_shape_size(&l->params[j].shape);
        ml->weight_bytes = crew_mem_layer_weights(mm, i, shards);
        ml->activation_bytes = crew_mem_layer_activation(mm, i, p->batch_per_device);
        ml->workspace_bytes = crew_mem_layer_workspace(mm, i, p->batch_per_device);
    }
    return CREW_OK;
}

void crew_memory_options_init(crew_memory_options *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

int crew_memory_shard_level(const crew_memory_options *o)
{
    if (o->shard > CREW_SHARD_NONE && o->shard <= CREW_SHARD_PARAMETERS) return o->shard;
    return o->optimizer_sharding ? CREW_SHARD_OPTIMIZER : CREW_SHARD_NONE;
}

/* The plan for options o as they are. */
static crew_status plan_as_asked(const crew_model *m, const crew_memory_options *o, crew_memory_plan *p)
{
    memset(p, 0, sizeof *p);
    CREW_TRY(resolve(m, o, p));
    crew_mem_model mm;
    crew_mem_model_init(&mm, m, crew_act_storage_for(o->precision, o->attention_recompute, o->device_kind), o->shard_unit_mb);
    mm.unit_overlap = o->shard_overlap != 0;
    const int shard = crew_memory_shard_level(o), shards = shard && p->devices > 1 ? p->devices : 1;
    crew_mem_costs c;
    crew_mem_replica(&mm, p->batch_per_device, p->devices, p->accumulation, shard, &c);
    p->param_bytes = c.param;
    p->gradient_bytes = c.gradient;
    p->optimizer_bytes = c.optimizer;
    p->optimizer = mm.optimizer;
    p->optimizer_slots = mm.slots;
    p->activation_bytes = c.activation;
    p->workspace_bytes = c.workspace;
    p->accumulation_bytes = c.accumulation;
    p->bytes_per_device = c.total;
    crew_fit_options d;
    crew_model_default_fit(m, &d);
    p->host_bytes = crew_mem_host(&mm, p->devices, p->global_batch, o->prefetch > 0 ? o->prefetch : d.prefetch,
                                  o->train_samples, o->dataset_bytes);
    p->total_bytes = (int64_t)p->devices * p->bytes_per_device + p->host_bytes;
    p->fits = p->shared_memory ? p->total_bytes <= p->device_memory_bytes : p->bytes_per_device <= p->device_memory_bytes;
    crew_status s = fill_layers(&mm, shards, p);
    if (!s) s = crew_mem_verdict(&mm, o, p);
    if (s) crew_memory_plan_release(p);
    return s;
}

static int has_attention(const crew_model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i]->spec.type == CREW_LAYER_TRANSFORMER_BLOCK) return 1;
    return 0;
}

/* b is the better verdict than a: a rung earlier on the ladder, or on the smaller-batch rung a
 * larger batch. */
static int better(const crew_memory_plan *b, const crew_memory_plan *a)
{
    if (b->verdict != a->verdict) return b->verdict < a->verdict;
    return b->verdict == CREW_MEMORY_SMALLER_BATCH && b->advised_batch > a->advised_batch;
}

crew_status crew_model_plan_memory(const crew_model *m, const crew_memory_options *given, crew_memory_plan *p)
{
    if (!p) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_plan_memory: NULL plan");
    memset(p, 0, sizeof *p);
    if (!m || !given) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_plan_memory: NULL argument");
    crew_memory_options opts;
    crew_memory_options_init(&opts);
    CREW_TRY(crew_options_take(&opts, sizeof opts, given, "crew_memory_options"));
    if (m->n_layers == 0) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the model has no layers");
    CREW_TRY(plan_as_asked(m, &opts, p));
    /* Recomputing the attention probabilities changes no bit of a run: where the model does not
     * fit as asked, the planner advises it when that fits better. */
    if (p->verdict == CREW_MEMORY_FITS || opts.attention_recompute || !has_attention(m)) return CREW_OK;
    crew_memory_options re = opts;
    re.attention_recompute = 1;
    crew_memory_plan q;
    crew_status s = plan_as_asked(m, &re, &q);
    if (s || !better(&q, p)) {
        crew_status_free(s);
        if (!s) crew_memory_plan_release(&q);
        return CREW_OK;
    }
    crew_memory_plan_release(p);
    *p = q;
    static const char prefix[] = "with --attention recompute (the same bits), ";
    const size_t k = sizeof prefix - 1, room = sizeof p->verdict_text - 1 - k;
    size_t n = strlen(p->verdict_text);
    if (n > room) n = room;
    memmove(p->verdict_text + k, p->verdict_text, n);
    memcpy(p->verdict_text, prefix, k);
    p->verdict_text[k + n] = '\0';
    return CREW_OK;
}

void crew_memory_plan_release(crew_memory_plan *p)
{
    if (!p) return;
    free(p->layers);
    p->layers = NULL;
    p->n_layers = 0;
}
