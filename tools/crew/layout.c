/* layout.c — replicas against BLAS threads per replica on the run's cores, for crew train
 * --layout auto, its hint when another layout measured faster, and crew scale: the choice from
 * the figures' cache, else measured once on a copy of the model (crew_layout_cached). */
#include <stdio.h>

#include "cli.h"

crew_status cli_layout(const char *model_path, const crew_dataset *train, int cores, int64_t batch, int measure,
                       crew_layout_choice *out, int *found, int *cached)
{
    *found = *cached = 0;
    char path[4096];
    const char *cache = crew_cache_path(path, sizeof path) ? path : NULL;
    int64_t bytes = 0;
    uint64_t key = 0;
    crew_status s = crew_file_hash(model_path, &bytes, &key);
    if (s) return s;
    crew_model *probe = NULL;
    crew_scale_options o;
    crew_scale_options_init(&o);
    o.batch_per_device = batch;
    o.warmup_steps = 2;
    o.steps = 8;
    o.repeats = 3;
    if (!batch) { /* the model file's, which the key then needs */
        if ((s = crew_model_load_file(model_path, &probe))) return s;
        crew_fit_options f;
        crew_model_default_fit(probe, &f);
        o.batch_per_device = f.batch_per_device;
    }
    if (measure < 2) s = crew_layout_cached(cache, key, NULL, NULL, &o, cores, 0, out, found);
    *cached = *found;
    if (!s && !*found && measure) {
        if (!probe) s = crew_model_load_file(model_path, &probe); /* its first trial initialises it */
        if (!s) s = crew_layout_cached(cache, key, probe, train, &o, cores, measure, out, found);
    }
    crew_model_free(probe);
    return s;
}

void cli_layout_trials_text(const crew_layout_choice *c, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->n && used < len; i++) {
        const crew_layout_trial *t = &c->trials[i];
        used += (size_t)snprintf(buf + used, len - used, "%s%d replica%s x %d thread%s%s %.0f samples/s", i ? ", " : "",
                                 t->replicas, t->replicas == 1 ? "" : "s", t->threads_per_device,
                                 t->threads_per_device == 1 ? "" : "s", t->shard_optimizer ? " sharded" : "",
                                 t->samples_per_s);
    }
}
