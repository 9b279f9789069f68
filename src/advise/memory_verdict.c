/* memory_verdict.c — what to do about a plan: the ladder from "fits with data parallelism" to
 * "needs model parallelism over k stages", each rung tried only when the ones before it fail.
 *
 *   1. the asked per-device batch fits;
 *   2. a smaller per-device batch that divides it, with gradient accumulation keeping the global
 *      batch (accumulation has its own cost: several replicas keep k − 1 micro-batch gradients);
 *   3. sharding: each of N replicas keeps 1/N of the optimizer state (ZeRO-1), of the gradients too
 *      (ZeRO-2), of the parameters too (ZeRO-3), the fewest replicas and then the lightest level;
 *   4. model parallelism: the layer list cut into k contiguous stages, one per device, the
 *      largest stage as small as it can be;
 * rungs 3 and 4 both keep the asked global batch; sharding (data parallelism) is the verdict when
 * it needs no more devices than were asked for or than the pipeline's stages, else the pipeline;
 *   5. nothing fits: one layer alone is larger than a device.
 * With CPU replicas sharing this machine's memory, rungs 1 and 2 count every replica plus the
 * loader against it; rungs 3 and 4 need devices with memory of their own, so they are stated as
 * machines (or devices) with this much memory each. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "advise/memory_plan.h"
#include "core/status.h"
#include "optim/optimizer.h"

#define MAX_SHARDS 1024
#define CREW_MAX_STAGES 1024

typedef struct ladder {
    const crew_mem_model *mm;
    crew_memory_plan *p;
    int64_t mem;         /* one device's memory */
    int64_t host;        /* host memory: the loaders' buffers, the caller's weights */
    int shard;           /* as asked: a crew_shard_level */
    int no_sharding;     /* crew_memory_options.no_sharding */
    int64_t rows;        /* model parallelism: the micro-batch being tried */
    int64_t *weights;    /* [layers] a layer's parameters, gradients and optimizer state */
    int64_t *width;      /* [layers + 1] per-sample values: width[i] into layer i, width[n] out of the last */
} ladder;

/* A replica on this machine (shared: every replica and the loader count) or on a device of its own. */
static int replica_fits(const ladder *l, int64_t batch, int devices, int accumulation, int shard, int own_device,
                        int64_t *bytes)
{
    crew_mem_costs c;
    crew_mem_replica(l->mm, batch, devices, accumulation, shard, &c);
    *bytes = c.total;
    if (l->p->shared_memory && !own_device) return (int64_t)devices * c.total + l->host <= l->mem;
    return c.total <= l->mem;
}

/* Whether the plan as asked shards anything (one replica shards nothing). */
static int p_sharded(const ladder *l) { return l->shard > CREW_SHARD_NONE && l->p->devices > 1; }

static void say(crew_memory_plan *p, const char *fmt, ...) CREW_PRINTF(2, 3);
static void say(crew_memory_plan *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->verdict_text, sizeof p->verdict_text, fmt, ap);
    va_end(ap);
}

static void fits_as_asked(const ladder *l)
{
    static const char *const with[] = {"", " and sharded optimizer state", " and sharded gradients (ZeRO-2)",
                                       " and sharded parameters (ZeRO-3)"};
    const char *sharded = p_sharded(l) ? with[l->shard] : "";
    crew_memory_plan *p = l->p;
    char per[32], mem[32], total[32], share[32];
    crew_format_bytes(p->bytes_per_device, per, sizeof per);
    crew_format_bytes(p->device_memory_bytes, mem, sizeof mem);
    crew_format_bytes(p->total_bytes, total, sizeof total);
    p->verdict = CREW_MEMORY_FITS;
    p->advised_batch = p->batch_per_device;
    p->advised_accumulation = p->accumulation;
    p->advised_devices = p->devices;
    p->advised_bytes_per_device = p->bytes_per_device;
    if (p->shared_memory)
        say(p, "fits with data parallelism%s: each replica needs %s at a per-device batch of %lld; %d replica%s and "
            "%s host memory need %s of this machine's %s (%s)", sharded, per,
            (long long)p->batch_per_device, p->devices, p->devices > 1 ? "s" : "", p->devices > 1 ? "their" : "its", total,
            mem, crew_format_percent(100.0 * (double)p->total_bytes / (double)p->device_memory_bytes, share, sizeof share));
    else
        say(p, "fits with data parallelism%s: each replica needs %s of the device's %s (%s) at a per-device "
            "batch of %lld", sharded, per, mem,
            crew_format_percent(100.0 * (double)p->bytes_per_device / (double)p->device_memory_bytes, share, sizeof share),
            (long long)p->batch_per_device);
}

/* The divisors of n, largest first, into out (at most cap); returns the count. */
static int divisors(int64_t n, int64_t *out, int cap)
{
    int lo = 0, hi = 0;
    int64_t small[2048], large[2048];
    for (int64_t d = 1; d * d <= n && lo < 2048 && hi < 2048; d++)
        if (n % d == 0) {
            small[lo++] = d;
            if (d != n / d) large[hi++] = n / d;
        }
    int k = 0;
    for (int i = 0; i < hi && k < cap; i++) out[k++] = large[i];
    for (int i = lo - 1; i >= 0 && k < cap; i--) out[k++] = small[i];
    return k;
}

/* Rung 2: the largest batch below the asked one that divides a replica's samples per step and fits. */
static int smaller_batch(const ladder *l)
{
    crew_memory_plan *p = l->p;
    int64_t per_replica = p->global_batch / p->devices, bytes = 0, d[4096];
    int nd = divisors(per_replica, d, 4096);
    for (int i = 0; i < nd; i++) {
        int64_t b = d[i];
        if (b >= p->batch_per_device) continue;
        int k = (int)(per_replica / b);
        if (!replica_fits(l, b, p->devices, k, l->shard, 0, &bytes)) continue;
        char need[32], mem[32];
        crew_format_bytes(bytes, need, sizeof need);
        crew_format_bytes(p->device_memory_bytes, mem, sizeof mem);
        p->verdict = CREW_MEMORY_SMALLER_BATCH;
        p->advised_batch = b;
        p->advised_accumulation = k;
        p->advised_devices = p->devices;
        p->advised_bytes_per_device = bytes;
        say(p, "fits only with a smaller per-device batch: %lld with gradient accumulation over %d micro-batches "
            "keeps the global batch of %lld (--batch-per-device %lld --global-batch %lld); each replica then needs %s "
            "of %s", (long long)b, k, (long long)p->global_batch, (long long)b, (long long)p->global_batch, need, mem);
        return 1;
    }
    return 0;
}

/* Rung 3: sharding. The fewest replicas, and at that count the least sharding (the optimizer
 * state; the gradients too; the parameters too), that make one fit, each on a device of its own,
 * keeping the asked global batch: n replicas of micro-batches of b (a divisor of the asked
 * per-device batch), accumulating k, with n · b · k the global batch. Fewer replicas come first
 * (the asked count is the user's), then the lighter level: ZeRO-1 and ZeRO-2 move what data
 * parallelism moves, ZeRO-3 about 1.5 times it (each unit's parameters gathered twice a step). */
typedef struct shard_choice {
    int n, k, level;
    int64_t b, bytes;
    int stages, micro;   /* the pipeline that would also fit (0: none): its stages and micro-batches a step */
} shard_choice;

static int find_sharding(const ladder *l, shard_choice *out)
{
    crew_memory_plan *p = l->p;
    if (l->no_sharding) return 0;
    int64_t bytes = 0, d[4096];
    int nd = divisors(p->batch_per_device, d, 4096);
    /* LAMB and LARS shard their optimizer state only (rank_units.c needs whole tensors for them) */
    const int top = crew_optimizer_layerwise(&l->mm->m->compile.optimizer) ? CREW_SHARD_OPTIMIZER : CREW_SHARD_PARAMETERS;
    for (int n = p->devices > 1 ? p->devices : 2; n <= MAX_SHARDS && n <= p->global_batch; n++)
        for (int level = l->mm->slots ? CREW_SHARD_OPTIMIZER : CREW_SHARD_GRADIENTS; level <= top; level++)
            for (int i = 0; i < nd; i++) {
                int64_t b = d[i];
                if (p->global_batch % ((int64_t)n * b) != 0) continue;
                int k = (int)(p->global_batch / ((int64_t)n * b));
                if (!replica_fits(l, b, n, k, level, 1, &bytes)) continue;
                *out = (shard_choice){n, k, level, b, bytes, 0, 0};
                return 1;
            }
    return 0;
}

static void sharding(const ladder *l, const shard_choice *c)
{
    static const char *const what[] = {"", "optimizer-state sharding (ZeRO-1)", "gradient sharding (ZeRO-2)",
                                       "parameter sharding (ZeRO-3)"};
    static const char *const keeps[] = {"", "the %s state", "the gradients and %s state",
                                        "the parameters, gradients and %s state"};
    static const char *const traffic[] = {"", "the same traffic as data parallelism", "the same traffic as data "
                                          "parallelism", "about 1.5x the traffic of data parallelism (each unit's "
                                          "parameters gathered before forward and backward)"};
    crew_memory_plan *p = l->p;
    char need[32], mem[32], kept[64], pipe[160] = "";
    if (c->stages > 1) /* 1F1B's bubble: (K − 1) / (M + K − 1) of each step idle */
        snprintf(pipe, sizeof pipe, "; a pipeline of %d stages would idle %.0f%% of each step in its bubble (%d "
                 "micro-batch%s a step)", c->stages, 100.0 * (c->stages - 1) / (c->micro + c->stages - 1), c->micro,
                 c->micro == 1 ? "" : "es");
    crew_format_bytes(c->bytes, need, sizeof need);
    crew_format_bytes(p->device_memory_bytes, mem, sizeof mem);
    snprintf(kept, sizeof kept, keeps[c->level], l->mm->optimizer);
    p->verdict = CREW_MEMORY_SHARD_OPTIMIZER;
    p->advised_shard = c->level;
    p->advised_batch = c->b;
    p->advised_accumulation = c->k;
    p->advised_devices = c->n;
    p->advised_bytes_per_device = c->bytes;
    for (int i = 0; i < p->n_layers; i++) p->layers[i].stage = 0;
    say(p, "fits with %s across %d replicas: each keeps 1/%d of %s and needs %s of %s%s, at a per-device batch of "
        "%lld%s, which keeps the global batch of %lld; %s%s%s (crew train --shard %s on %d replicas)", what[c->level],
        c->n, c->n, kept, need, mem, p->shared_memory ? " (each on a machine like this one)" : "", (long long)c->b,
        c->k > 1 ? " with accumulation" : "", (long long)p->global_batch, traffic[c->level],
        c->level > CREW_SHARD_OPTIMIZER ? ", no lighter sharding fits" : "", pipe, crew_shard_level_name(c->level),
        c->n);
}

/* A layer's bytes in a stage; with several micro-batches per step its gradients are summed in a
 * buffer of their own (backward overwrites them). */
static int64_t layer_cost(const ladder *l, int i)
{
    int micro = (int)(l->p->batch_per_device / l->rows) * l->p->accumulation;
    return l->weights[i] + crew_mem_layer_activation(l->mm, i, l->rows) + crew_mem_layer_workspace(l->mm, i, l->rows) +
           (micro > 1 ? l->p->layers[i].params * 4 : 0);
}

/* The gradient ping-pong buffers of a stage of layers a..b, as crew_model_buffers sizes them: with
 * its activations j = a..e (e = b + 1, or b behind a trailing softmax, which the loss takes in),
 * buffer k holds those that crew_model_grad_slot puts there, as wide as the widest of them; the
 * last stage's loss writes the gradient of act[e] over it, unless its last layer is an activation
 * (crew_model_loss_in_place). */
static int64_t pingpong_bytes(const ladder *l, int a, int b)
{
    const crew_model *m = l->mm->m;
    int e = b == m->n_layers - 1 ? crew_model_computed_layers(m) : b + 1;
    int top = e;
    if (b == m->n_layers - 1 && e > a && m->layers[e - 1]->spec.type != CREW_LAYER_ACTIVATION) top = e - 1;
    int64_t wide[2] = {0, 0};
    for (int j = a; j <= top; j++) {
        const int k = crew_model_grad_slot(m, a, j, e);
        if (k >= 0 && l->width[j] > wide[k]) wide[k] = l->width[j];
    }
    return crew_mem_alloc_bytes(l->rows * wide[0], 4) + crew_mem_alloc_bytes(l->rows * wide[1], 4);
}

/* Packs layers greedily from the front into stages of at most `limit` bytes: a stage holds its
 * layers' weights, outputs and workspace for a micro-batch of l->rows, their shared scratch (the
 * largest of each slot), the input it receives and the gradient ping-pong buffers (pingpong_bytes).
 * Returns the stage count (0 when one layer alone exceeds the limit); first[s] (when
 * not NULL) is stage s's first layer, bytes[s] its size. */
static int pack(const ladder *l, int64_t limit, int *first, int64_t *bytes)
{
    const int n = l->mm->m->n_layers;
    int stages = 0;
    for (int a = 0; a < n;) {
        int64_t sum = 0, size = 0, in = crew_mem_alloc_bytes(l->rows * l->width[a], 4);
        int64_t scratch[CREW_LAYER_MAX_WORK] = {0};
        int b = a;
        for (; b < n; b++) {
            int64_t cost = layer_cost(l, b), with[CREW_LAYER_MAX_WORK];
            crew_mem_layer_scratch(l->mm, b, l->rows, with);
            for (int k = 0; k < CREW_LAYER_MAX_WORK; k++) with[k] = with[k] > scratch[k] ? with[k] : scratch[k];
            int64_t next = sum + cost + crew_mem_scratch_bytes(with) + in + pingpong_bytes(l, a, b);
            if (next > limit) break;
            sum += cost;
            memcpy(scratch, with, sizeof scratch);
            size = next;
        }
        if (b == a) return 0;
        if (first && stages < CREW_MAX_STAGES) first[stages] = a, bytes[stages] = size;
        stages++;
        a = b;
    }
    return stages;
}

static void describe_stages(const ladder *l, int64_t limit, int k)
{
    crew_memory_plan *p = l->p;
    const crew_model *m = l->mm->m;
    int first[CREW_MAX_STAGES];
    int64_t bytes[CREW_MAX_STAGES], largest = 0;
    pack(l, limit, first, bytes);
    char mem[32];
    crew_format_bytes(p->device_memory_bytes, mem, sizeof mem);
    size_t used = (size_t)snprintf(p->verdict_text, sizeof p->verdict_text,
                                   "needs model parallelism over %d pipeline stages of %s each%s, micro-batches of %lld "
                                   "(%d per step keep the global batch of %lld); a balanced split:", k, mem,
                                   p->shared_memory ? " (machines like this one)" : "", (long long)l->rows,
                                   p->advised_accumulation, (long long)p->global_batch);
    for (int s = 0; s < k; s++) {
        int a = first[s], b = s + 1 < k ? first[s + 1] - 1 : m->n_layers - 1;
        if (bytes[s] > largest) largest = bytes[s];
        for (int i = a; i <= b; i++) p->layers[i].stage = s;
        char need[32];
        crew_format_bytes(bytes[s], need, sizeof need);
        if (used < sizeof p->verdict_text)
            used += (size_t)snprintf(p->verdict_text + used, sizeof p->verdict_text - used, "%s stage %d: layers %d-%d "
                                     "(%s .. %s), %s", s ? ";" : "", s, a, b, m->layers[a]->name, m->layers[b]->name, need);
    }
    p->advised_bytes_per_device = largest;
}

/* Rung 4: per micro-batch size (the asked batch and its divisors), the fewest stages that fit;
 * the fewest stages win, then the larger micro-batch; then the smallest largest stage. */
static int model_parallel(ladder *l)
{
    crew_memory_plan *p = l->p;
    int64_t d[4096], best_rows = 0;
    int nd = divisors(p->batch_per_device, d, 4096), best = 0;
    for (int i = 0; i < nd; i++) {
        l->rows = d[i];
        int k = pack(l, l->mem, NULL, NULL);
        /* one stage would be a replica with a smaller batch: rung 2 already said no */
        if (k > 1 && k <= CREW_MAX_STAGES && (!best || k < best)) best = k, best_rows = d[i];
    }
    if (!best) return 0;
    l->rows = best_rows;
    int64_t lo = 1, hi = l->mem; /* the smallest limit that still packs into `best` stages */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int got = pack(l, mid, NULL, NULL);
        if (got != 0 && got <= best)
            hi = mid;
        else
            lo = mid + 1;
    }
    int k = pack(l, lo, NULL, NULL);
    p->verdict = CREW_MEMORY_MODEL_PARALLEL;
    p->advised_batch = best_rows;
    p->advised_accumulation = (int)(p->batch_per_device / best_rows) * p->accumulation;
    p->advised_devices = k;
    describe_stages(l, lo, k);
    return 1;
}

/* The least a replica can need sharded: the heaviest level the optimizer allows, one sample a
 * replica, on each replica count that keeps the global batch (accumulating the rest); 0 where
 * sharding is off or no count keeps it. *n_out: that count, *level_out: that level. */
static int64_t least_sharded(const ladder *l, int *n_out, int *level_out)
{
    const crew_memory_plan *p = l->p;
    if (l->no_sharding) return 0;
    const int level = crew_optimizer_layerwise(&l->mm->m->compile.optimizer) ? CREW_SHARD_OPTIMIZER
                                                                            : CREW_SHARD_PARAMETERS;
    int64_t least = 0, bytes = 0;
    for (int n = 2; n <= MAX_SHARDS && n <= p->global_batch; n++) {
        if (p->global_batch % n != 0) continue;
        replica_fits(l, 1, n, (int)(p->global_batch / n), level, 1, &bytes);
        if (!least || bytes < least) least = bytes, *n_out = n;
    }
    *level_out = level;
    return least;
}

/* Rung 5: even one layer on a device of its own, at a micro-batch of one, is too large, and
 * sharding across as many replicas as the global batch allows does not make one fit either. */
static void too_large(ladder *l)
{
    crew_memory_plan *p = l->p;
    const crew_model *m = l->mm->m;
    l->rows = 1;
    int worst = 0;
    int64_t worst_bytes = 0;
    for (int i = 0; i < m->n_layers; i++) {
        int64_t scratch[CREW_LAYER_MAX_WORK];
        crew_mem_layer_scratch(l->mm, i, l->rows, scratch);
        int64_t bytes = layer_cost(l, i) + crew_mem_scratch_bytes(scratch) + crew_mem_alloc_bytes(l->width[i], 4) +
                        pingpong_bytes(l, i, i);
        if (bytes > worst_bytes) worst = i, worst_bytes = bytes;
    }
    char need[32], mem[32], sharded[200] = "";
    crew_format_bytes(worst_bytes, need, sizeof need);
    crew_format_bytes(p->device_memory_bytes, mem, sizeof mem);
    int n = 0, level = 0;
    const int64_t least = least_sharded(l, &n, &level);
    if (least > 0) { /* how far off the nearest layout is: the one number a user can act on */
        char at[32];
        crew_format_bytes(least, at, sizeof at);
        snprintf(sharded, sizeof sharded, "; sharded, a replica needs %s at the least (%s on %d replicas of one "
                 "sample each, which keep the global batch of %lld)", at,
                 level == CREW_SHARD_PARAMETERS ? "ZeRO-3" : "ZeRO-1", n, (long long)p->global_batch);
    }
    p->verdict = CREW_MEMORY_TOO_LARGE;
    p->advised_batch = 1;
    p->advised_accumulation = (int)p->batch_per_device * p->accumulation;
    p->advised_devices = 0;
    p->advised_bytes_per_device = worst_bytes;
    say(p, "does not fit: layer %d (%s) alone needs %s even for one sample, more than a device's %s%s; it needs "
        "splitting within the layer (tensor parallelism) or devices with more memory", worst, m->layers[worst]->name,
        need, mem, sharded);
}

crew_status crew_mem_verdict(const crew_mem_model *mm, const crew_memory_options *o, crew_memory_plan *p)
{
    const crew_model *m = mm->m;
    ladder l = {mm, p, p->device_memory_bytes, p->host_bytes, crew_memory_shard_level(o), o->no_sharding != 0,
                p->batch_per_device, NULL, NULL};
    l.weights = malloc((size_t)m->n_layers * sizeof *l.weights);
    l.width = malloc(((size_t)m->n_layers + 1) * sizeof *l.width);
    if (!l.weights || !l.width) {
        free(l.weights);
        free(l.width);
        return CREW_OOM();
    }
    for (int i = 0; i < m->n_layers; i++) {
        l.weights[i] = crew_mem_layer_weights(mm, i, 1);
        l.width[i] = crew_shape_size(&m->layers[i]->in);
    }
    l.width[m->n_layers] = crew_shape_size(&m->layers[m->n_layers - 1]->out);
    if (p->fits)
        fits_as_asked(&l);
    else if (!smaller_batch(&l)) {
        /* Sharding and a pipeline both keep the global batch. Sharding, which is data
         * parallelism, wins when it needs no more devices than were asked for or than the
         * pipeline's stages; else the pipeline, which needs fewer. */
        shard_choice sc;
        int shard = find_sharding(&l, &sc), piped = model_parallel(&l);
        if (shard && (!piped || sc.n <= p->devices || sc.n <= p->advised_devices)) {
            sc.stages = piped ? p->advised_devices : 0; /* the pipeline it beats, for the verdict */
            sc.micro = piped ? p->advised_accumulation : 0;
            sharding(&l, &sc);
        }
        else if (!piped)
            too_large(&l);
    }
    free(l.weights);
    free(l.width);
    return CREW_OK;
}
