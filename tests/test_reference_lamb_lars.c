/* test_reference_lamb_lars.c — crew's LAMB and LARS against the papers' formulas computed elsewhere.
 *
 * tools/make_lamb_lars_reference.py ran LAMB (You et al. 2019) and LARS (You et al. 2017, in NVIDIA
 * apex's LARC form over PyTorch's SGD) in float64 NumPy, written from the papers, for 30 steps on
 * fixed gradients of three tensors of different sizes and scales (one starting at zero, whose
 * trust ratio is then 1), at a warmup-then-decay learning rate, and recorded the parameters at the
 * end in tests/fixtures/reference/lamb_lars.safetensors. This test replays the same steps through
 * crew_optimizer_step on device kind "cpu", told where the three tensors lie, and holds every
 * tensor's parameters within 1e-6 of the reference relative to that tensor's largest parameter:
 * crew computes in float32, each step's trust ratio in double from float32 norms. It prints how
 * close each configuration came.
 *
 * Then the same steps through the two halves a shard takes (crew_optimizer_layerwise_begin on the
 * shard's range, the whole buffer gathered, crew_optimizer_layerwise_end), with the buffer cut in
 * 2 and 3 shards at points that split tensors: the parameters equal the unsharded ones, bit for
 * bit, and so does the state of each shard. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/status.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"

#define N 136
#define STEPS 30
#define N_TENSORS 3
#define REL_TOL 1e-6

static const int64_t bounds[N_TENSORS + 1] = {0, 96, 129, 136};

static const char *source_dir(void)
{
    const char *d = getenv("CREW_SOURCE_DIR");
    return d && d[0] ? d : ".."; /* ctest runs tests in tests/ */
}

static float *tensor(const crew_st_file *f, const char *config, const char *name, int64_t count)
{
    char key[64];
    snprintf(key, sizeof key, "%s/%s", config, name);
    const crew_st_tensor *t = crew_st_find(f, key);
    CHECK_MSG(t && t->dtype == CREW_ST_F32 && t->count == count, "fixture: tensor '%s' missing or not F32[%lld]", key,
              (long long)count);
    if (!t || t->dtype != CREW_ST_F32 || t->count != count) return NULL;
    float *copy = malloc((size_t)count * sizeof *copy);
    if (copy) memcpy(copy, t->data, (size_t)count * sizeof *copy);
    return copy;
}

static double number(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

/* The configuration's spec from the fixture's metadata (the hyperparameters the reference used). */
static int spec_of(const crew_st_file *f, const char *config, crew_optimizer_spec *spec)
{
    const char *meta = crew_st_metadata(f, config);
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    CHECK_MSG(cJSON_IsString(kind), "fixture: metadata '%s' missing", config);
    if (!cJSON_IsString(kind)) {
        cJSON_Delete(o);
        return 0;
    }
    const int lamb = strcmp(kind->valuestring, "lamb") == 0;
    *spec = (crew_optimizer_spec){.type = lamb ? CREW_OPT_LAMB : CREW_OPT_LARS, .lr = (float)number(o, "lr"),
                                  .beta1 = number(o, "beta1"), .beta2 = number(o, "beta2"),
                                  .eps = (float)number(o, "eps"), .weight_decay = (float)number(o, "weight_decay"),
                                  .momentum = (float)number(o, "momentum"), .nesterov = (int)number(o, "nesterov"),
                                  .trust = (float)number(o, "trust")};
    cJSON_Delete(o);
    CHECK_OK(crew_optimizer_spec_check(spec));
    return 1;
}

/* The steps through one optimizer of the whole buffer: the parameters at the end into got. */
static void replay(const crew_optimizer_spec *spec, const float *p0, const float *grads, const float *lr, float *got,
                   float *state)
{
    crew_backend be = {0};
    crew_optimizer opt = {0};
    float *p_d = NULL, *g_d = NULL;
    CHECK_OK(crew_device_open("cpu", 0, NULL, &be));
    CHECK_OK(crew_optimizer_init(&opt, spec, &be, N));
    CHECK_OK(crew_optimizer_set_tensors(&opt, bounds, N_TENSORS));
    CHECK_OK(crew_dev_alloc_f32(&be, N, &p_d));
    CHECK_OK(crew_dev_alloc_f32(&be, N, &g_d));
    CHECK_OK(crew_dev_upload_f32(&be, p_d, p0, N));
    for (int t = 0; t < STEPS; t++) {
        CHECK_OK(crew_dev_upload_f32(&be, g_d, grads + (size_t)t * N, N));
        CHECK_OK(crew_optimizer_step(&opt, &be, p_d, g_d, lr[t], NULL));
    }
    CHECK_OK(crew_dev_download_f32(&be, got, p_d, N));
    if (opt.slot[0]) CHECK_OK(crew_dev_download_f32(&be, state, opt.slot[0], N));
    crew_dev_free(&be, p_d);
    crew_dev_free(&be, g_d);
    crew_optimizer_release(&opt, &be);
    crew_device_close(&be);
}

/* The same steps as `shards` shards cut at cuts[] (shards + 1 of them, splitting tensors), each with
 * its own device and optimizer over its range, the whole buffer gathered between the halves (here:
 * every shard's range copied into every device) as the rank program's all-gather does. */
static void replay_sharded(const crew_optimizer_spec *spec, const float *p0, const float *grads, const float *lr,
                           int shards, const int64_t *cuts, float *got, float *state)
{
    crew_backend be[3];
    crew_optimizer opt[3];
    float *p_d[3], *g_d[3], host[N];
    for (int q = 0; q < shards; q++) {
        CHECK_OK(crew_device_open("cpu", q, NULL, &be[q]));
        CHECK_OK(crew_optimizer_init(&opt[q], spec, &be[q], cuts[q + 1] - cuts[q]));
        CHECK_OK(crew_optimizer_set_tensors(&opt[q], bounds, N_TENSORS));
        CHECK_OK(crew_dev_alloc_f32(&be[q], N, &p_d[q]));
        CHECK_OK(crew_dev_alloc_f32(&be[q], N, &g_d[q]));
        CHECK_OK(crew_dev_upload_f32(&be[q], p_d[q], p0, N));
    }
    for (int t = 0; t < STEPS; t++) {
        for (int q = 0; q < shards; q++) {
            CHECK_OK(crew_dev_upload_f32(&be[q], g_d[q], grads + (size_t)t * N, N));
            CHECK_OK(crew_optimizer_layerwise_begin(&opt[q], &be[q], p_d[q], g_d[q], N, cuts[q], lr[t], NULL));
        }
        if (spec->type == CREW_OPT_LAMB) /* gather: shard q's updates into every device's buffer */
            for (int q = 0; q < shards; q++) {
                CHECK_OK(crew_dev_download_f32(&be[q], host, g_d[q] + cuts[q], cuts[q + 1] - cuts[q]));
                for (int d = 0; d < shards; d++)
                    if (d != q) CHECK_OK(crew_dev_upload_f32(&be[d], g_d[d] + cuts[q], host, cuts[q + 1] - cuts[q]));
            }
        for (int q = 0; q < shards; q++)
            CHECK_OK(crew_optimizer_layerwise_end(&opt[q], &be[q], p_d[q], g_d[q], N, cuts[q], lr[t]));
        for (int q = 0; q < shards; q++) { /* and the parameters' all-gather */
            CHECK_OK(crew_dev_download_f32(&be[q], host, p_d[q] + cuts[q], cuts[q + 1] - cuts[q]));
            for (int d = 0; d < shards; d++)
                if (d != q) CHECK_OK(crew_dev_upload_f32(&be[d], p_d[d] + cuts[q], host, cuts[q + 1] - cuts[q]));
        }
    }
    CHECK_OK(crew_dev_download_f32(&be[0], got, p_d[0], N));
    for (int q = 0; q < shards; q++) {
        if (opt[q].slot[0]) CHECK_OK(crew_dev_download_f32(&be[q], state + cuts[q], opt[q].slot[0], cuts[q + 1] - cuts[q]));
        crew_dev_free(&be[q], p_d[q]);
        crew_dev_free(&be[q], g_d[q]);
        crew_optimizer_release(&opt[q], &be[q]);
        crew_device_close(&be[q]);
    }
}

static void run_config(const crew_st_file *f, const char *config)
{
    crew_optimizer_spec spec;
    if (!spec_of(f, config, &spec)) return;
    float *p0 = tensor(f, config, "p0", N), *grads = tensor(f, config, "grads", (int64_t)STEPS * N);
    float *lr = tensor(f, config, "lr", STEPS), *want = tensor(f, config, "p", N);
    if (p0 && grads && lr && want) {
        float got[N], state[N] = {0};
        replay(&spec, p0, grads, lr, got, state);
        double worst = 0.0;
        for (int j = 0; j < N_TENSORS; j++) {
            double diff = 0.0, size = 0.0;
            for (int64_t i = bounds[j]; i < bounds[j + 1]; i++) {
                double d = fabs((double)got[i] - (double)want[i]);
                diff = d == d ? fmax(diff, d) : INFINITY;
                size = fmax(size, fabs((double)want[i]));
            }
            double rel = diff / fmax(size, 1e-30);
            worst = fmax(worst, rel);
            CHECK_MSG(rel <= REL_TOL, "%s: tensor %d ends %.3g (relative to its largest parameter) off the reference",
                      config, j, rel);
        }
        printf("%-14s parameters within %.2g of the reference (relative; allowed %.0e)\n", config, worst, REL_TOL);
        static const int64_t two[] = {0, 50, N}, three[] = {0, 90, 120, N}; /* both cut tensors */
        for (int k = 0; k < 2; k++) {
            float sharded[N], sharded_state[N] = {0};
            replay_sharded(&spec, p0, grads, lr, k ? 3 : 2, k ? three : two, sharded, sharded_state);
            CHECK_MSG(!memcmp(sharded, got, sizeof got) && !memcmp(sharded_state, state, sizeof state),
                      "%s in %d shards: other bits than unsharded", config, k ? 3 : 2);
        }
    }
    free(p0);
    free(grads);
    free(lr);
    free(want);
}

int main(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/reference/lamb_lars.safetensors", source_dir());
    crew_st_file f = {0};
    CHECK_OK(crew_st_read(path, &f));
    const char *meta = crew_st_metadata(&f, "bounds");
    CHECK_MSG(meta && !strcmp(meta, "0,96,129,136"), "fixture: the tensors' bounds are '%s'", meta ? meta : "?");
    for (int c = 0; c < 4; c++) run_config(&f, (const char *[]){"lamb", "lamb_nowd", "lars", "lars_nesterov"}[c]);
    /* what a layer-wise optimizer refuses: no tensors, and one step over a range */
    crew_backend be = {0};
    crew_optimizer opt = {0};
    float *p_d = NULL;
    crew_optimizer_spec spec = {.type = CREW_OPT_LAMB, .lr = 1e-3f};
    CHECK_OK(crew_optimizer_spec_check(&spec));
    CHECK_OK(crew_device_open("cpu", 0, NULL, &be));
    CHECK_OK(crew_optimizer_init(&opt, &spec, &be, N));
    CHECK_OK(crew_dev_alloc_f32(&be, N, &p_d));
    be.ops->fill(be.ctx, p_d, 0.5f, N);
    CHECK_ERR(crew_optimizer_step(&opt, &be, p_d, p_d, 1e-3f, NULL), "lamb has no tensors");
    crew_dev_free(&be, p_d);
    crew_optimizer_release(&opt, &be);
    crew_device_close(&be);
    crew_st_free(&f);
    return check_report();
}
