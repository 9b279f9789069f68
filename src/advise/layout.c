/* layout.c — replicas against BLAS threads: the same cores and global batch as R replicas of
 * cores / R threads each, for every R that divides the cores, one short trial each; and the
 * choice kept in the figures' cache (peak_cache.h).
 *
 * Why measure: which wins depends on the model and the machine. Replicas side by side keep each
 * GEMM on one core and overlap everything else (loading, activations, the optimizer), but each
 * GEMM has fewer rows and every replica runs the whole optimizer; one replica of several threads
 * has the larger GEMMs OpenBLAS parallelises well and one optimizer pass, but its other passes run
 * on one core. On the 2-core VM of docs/PERFORMANCE.md two replicas won for both examples; a
 * wider MLP or a machine with more cores can go the other way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "advise/peak_cache.h"
#include "core/status.h"
#include "crew.h"

static int64_t default_batch(const crew_model *m, const crew_scale_options *o)
{
    if (o->batch_per_device > 0) return o->batch_per_device;
    crew_fit_options f;
    crew_model_default_fit((crew_model *)m, &f);
    return f.batch_per_device;
}

crew_status crew_layout_measure(crew_model *m, const crew_dataset *train, const crew_scale_options *o, int cores,
                                crew_layout_choice *out)
{
    if (!m || !train || !o || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_layout_measure: NULL argument");
    *out = (crew_layout_choice){0};
    if (cores < 1 || cores > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "layouts of %d cores: expected 1 to 1024", cores);
    crew_scale_options t = *o;
    const int64_t b = default_batch(m, o);
    int fastest = -1;
    /* every split of the cores, then the one replica per core again, sharded */
    for (int r = cores; r >= 0 && out->n < CREW_LAYOUT_MAX; r--) {
        const int sharded = r == 0;
        if (sharded && cores == 1) break;
        const int replicas = sharded ? cores : r;
        if (cores % replicas || (!sharded && out->n >= CREW_LAYOUT_MAX - 1)) continue; /* room for the sharded */
        crew_layout_trial *lt = &out->trials[out->n];
        *lt = (crew_layout_trial){.replicas = replicas, .threads_per_device = cores / replicas, .shard_optimizer = sharded,
                                  .batch_per_device = b * (cores / replicas)};
        t.threads_per_device = lt->threads_per_device;
        t.batch_per_device = lt->batch_per_device;
        t.shard_optimizer = sharded;
        crew_scale_trial trial;
        crew_status s = crew_scale_measure(m, train, &t, replicas, &trial);
        if (s)
            return crew_error_prefix(s, "layout %d replica%s x %d thread%s%s: ", replicas, replicas == 1 ? "" : "s",
                                     lt->threads_per_device, lt->threads_per_device == 1 ? "" : "s",
                                     sharded ? ", sharded" : "");
        lt->samples_per_s = trial.samples_per_s;
        if (sharded) {
            out->shard_speedup = out->trials[0].samples_per_s > 0 ? lt->samples_per_s / out->trials[0].samples_per_s : 1.0;
        } else if (fastest < 0 || lt->samples_per_s > out->trials[fastest].samples_per_s) {
            fastest = out->n;
        }
        out->n++;
    }
    const crew_layout_trial *best = &out->trials[fastest];
    out->replicas = best->replicas;
    out->threads_per_device = best->threads_per_device;
    out->batch_per_device = best->batch_per_device;
    out->speedup = out->trials[0].samples_per_s > 0 ? best->samples_per_s / out->trials[0].samples_per_s : 1.0;
    if (cores == 1) out->shard_speedup = 1.0;
    out->shard_optimizer = out->shard_speedup > 1.03;
    return CREW_OK;
}

/* The cache's keys of a choice: its replicas, its speedup, and sharding's. */
#define KEYS 3
static void layout_keys(uint64_t model_key, int cores, int64_t batch, char keys[KEYS][CREW_PEAK_KEY_MAX])
{
    static const char *const what[KEYS] = {"replicas", "speedup", "shard"};
    char base[CREW_PEAK_KEY_MAX];
    crew_peak_cache_key("cpu", 0, base, sizeof base);
    for (int i = 0; i < KEYS; i++)
        snprintf(keys[i], CREW_PEAK_KEY_MAX, "layout|%.280s|model=%016llx|cores=%d|batch=%lld|%s", base,
                 (unsigned long long)model_key, cores, (long long)batch, what[i]);
}

crew_status crew_layout_cached(const char *cache_path, uint64_t model_key, crew_model *m, const crew_dataset *train,
                               const crew_scale_options *o, int cores, int measure, crew_layout_choice *out,
                               int *found)
{
    if (!o || !out || !found || (measure && (!m || !train)))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_layout_cached: NULL argument");
    *out = (crew_layout_choice){0};
    *found = 0;
    if (cores < 1 || cores > 1024)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "layouts of %d cores: expected 1 to 1024", cores);
    if (o->batch_per_device <= 0 && !m)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_layout_cached: the per-device batch, or the model");
    const int64_t b = o->batch_per_device > 0 ? o->batch_per_device : default_batch(m, o);
    char keys[KEYS][CREW_PEAK_KEY_MAX];
    layout_keys(model_key, cores, b, keys);
    size_t n = 0;
    char *text = crew_cache_read(cache_path, &n);
    double replicas = 0.0, speedup = 0.0, shard = 0.0;
    if (measure < 2 && text && crew_peak_cache_find(text, n, keys[0], &replicas) &&
        crew_peak_cache_find(text, n, keys[1], &speedup) && crew_peak_cache_find(text, n, keys[2], &shard) &&
        replicas == floor(replicas) && replicas >= 1 && (int)replicas <= cores && cores % (int)replicas == 0) {
        free(text);
        out->replicas = (int)replicas;
        out->threads_per_device = cores / out->replicas;
        out->batch_per_device = b * out->threads_per_device;
        out->speedup = speedup;
        out->shard_speedup = shard;
        out->shard_optimizer = shard > 1.03;
        *found = 1;
        return CREW_OK;
    }
    crew_status s = CREW_OK;
    if (measure) {
        crew_scale_options t = *o;
        t.batch_per_device = b;
        s = crew_layout_measure(m, train, &t, cores, out);
        if (!s) {
            const char *const k[KEYS] = {keys[0], keys[1], keys[2]};
            const double v[KEYS] = {(double)out->replicas, out->speedup > 0 ? out->speedup : 1.0,
                                    out->shard_speedup > 0 ? out->shard_speedup : 1.0};
            crew_cache_write(cache_path, text, n, k, v, KEYS);
            *found = 1;
        }
    }
    free(text);
    return s;
}
