/* test_weights.c — saving and loading a model's weights: a bitwise round trip of every
 * parameter and batch-norm statistic, the tensor names and Keras shapes in the file, and loads
 * that must fail (other shapes, missing or extra tensors, truncated or corrupted files) while
 * leaving the model's weights exactly as they were. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "io/safetensors.h"
#include "nn/model.h"

static char dir[64];

/* input (8, 8, 1) → conv2d 4×3×3 same relu → batch norm → max pool → flatten → dense(units) */
static crew_model *make_model(int64_t units)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){8, 8, 1}, 3, &m));
    if (!m) return NULL;
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {3, 3},
                                                  .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_BATCH_NORM}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_MAX_POOL2D}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = units}));
    return m;
}

/* All parameters then all state, downloaded to the host: [n_params + n_state]. */
static float *snapshot(const crew_model *m)
{
    float *h = malloc((size_t)(m->n_params + m->n_state + 1) * sizeof(float));
    CHECK_OK(crew_dev_download_f32(&m->be, h, m->params, m->n_params));
    CHECK_OK(crew_dev_download_f32(&m->be, h + m->n_params, m->state, m->n_state));
    return h;
}

static void restore(crew_model *m, const float *h)
{
    CHECK_OK(crew_dev_upload_f32(&m->be, m->params, h, m->n_params));
    CHECK_OK(crew_dev_upload_f32(&m->be, m->state, h + m->n_params, m->n_state));
}

static int same_bits(const crew_model *m, const float *h)
{
    float *now = snapshot(m);
    int same = memcmp(now, h, (size_t)(m->n_params + m->n_state) * sizeof(float)) == 0;
    free(now);
    return same;
}

static void spill(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(b, 1, len, f);
    fclose(f);
}

/* The file holds every parameter, state included, under Keras names and layouts. */
static void check_file_layout(const char *path)
{
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[4];
    } want[] = {
        {"conv2d.kernel", 4, {3, 3, 1, 4}},       {"conv2d.bias", 1, {4}},
        {"batch_normalization.gamma", 1, {4}},    {"batch_normalization.beta", 1, {4}},
        {"batch_normalization.moving_mean", 1, {4}}, {"batch_normalization.moving_variance", 1, {4}},
        {"dense.kernel", 2, {64, 10}},            {"dense.bias", 1, {10}},
    };
    crew_st_file f;
    CHECK_OK(crew_st_read(path, &f));
    CHECK(f.n_tensors == (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const crew_st_tensor *t = crew_st_find(&f, want[i].name);
        CHECK_MSG(t != NULL, "tensor %s missing", want[i].name);
        if (!t) continue;
        CHECK(t->dtype == CREW_ST_F32 && t->ndim == want[i].ndim);
        for (int d = 0; d < want[i].ndim; d++) CHECK(t->shape[d] == want[i].shape[d]);
    }
    CHECK(crew_st_metadata(&f, "format") && strcmp(crew_st_metadata(&f, "format"), "crew") == 0);
    CHECK(crew_st_metadata(&f, "model") && strcmp(crew_st_metadata(&f, "model"), "sequential") == 0);
    crew_st_free(&f);
}

/* Rewrites m's weights as a file with one tensor dropped (skip) or one extra/retyped tensor. */
static void write_variant(const crew_model *m, const char *path, const char *skip, int add_extra, int retype)
{
    crew_named_param np[16];
    int n = crew_model_named_params(m, np, 16);
    crew_st_tensor t[17];
    float *h = snapshot(m);
    static const int32_t extra_data[3] = {1, 2, 3};
    int k = 0;
    for (int i = 0; i < n && i < 16; i++) {
        if (skip && strcmp(np[i].name, skip) == 0) continue;
        const crew_param *p = np[i].param;
        t[k] = (crew_st_tensor){.dtype = CREW_ST_F32, .ndim = p->shape.ndim, .count = crew_shape_size(&p->shape)};
        memcpy(t[k].name, np[i].name, sizeof t[k].name);
        for (int d = 0; d < p->shape.ndim; d++) t[k].shape[d] = p->shape.dim[d];
        t[k].data = h + (p->trainable ? 0 : m->n_params) + p->offset;
        if (retype && strcmp(np[i].name, "conv2d.bias") == 0) t[k].dtype = CREW_ST_I32; /* same byte size */
        k++;
    }
    if (add_extra)
        t[k++] = (crew_st_tensor){.name = "extra.kernel", .dtype = CREW_ST_I32, .ndim = 1, .shape = {3}, .count = 3,
                                  .data = extra_data};
    CHECK_OK(crew_st_write(path, t, k, NULL));
    free(h);
}

static void check_refused(crew_model *m, const char *path, const char *needle, const float *before)
{
    CHECK_ERR(crew_model_load_weights(m, path), needle);
    CHECK_MSG(same_bits(m, before), "weights changed by a failed load (%s)", needle);
}

/* Flipping any header byte must fail or load the same values; never crash, never half-load. */
static void corrupt_header(crew_model *victim, const float *victim_before, const float *good, const char *src,
                           const char *path)
{
    size_t len = 0;
    uint8_t *b = read_file(src, &len);
    CHECK(b && len > 8);
    if (!b || len <= 8) return;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    int refused = 0, loaded = 0;
    for (size_t i = 0; i < 8 + hlen; i++)
        for (int bit = 0; bit < 8; bit += 7) { /* bit 0 and bit 7 */
            b[i] ^= (uint8_t)(1u << bit);
            spill(path, b, len);
            crew_status s = crew_model_load_weights(victim, path);
            b[i] ^= (uint8_t)(1u << bit);
            if (s) {
                refused++;
                CHECK_MSG(same_bits(victim, victim_before), "byte %zu bit %d: failed load changed weights", i, bit);
                /* bit 7 makes the header invalid UTF-8 (or the length absurd): always refused */
                CHECK_MSG(bit == 0 || crew_status_code(s) == CREW_CODE_BAD_INPUT, "byte %zu: %s", i,
                          crew_status_message(s));
            } else {
                loaded++;
                CHECK_MSG(bit == 0, "byte %zu bit 7 flipped was accepted", i);
                CHECK_MSG(same_bits(victim, good), "byte %zu: loaded other values", i);
                restore(victim, victim_before);
            }
            crew_status_free(s);
        }
    CHECK(refused > 0);
    printf("header corruption: %d flips refused, %d loaded unchanged values (metadata text)\n", refused, loaded);
    free(b);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/crew_w_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char path[128], other[128];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    snprintf(other, sizeof other, "%s/bad.safetensors", dir);

    crew_model *a = make_model(10), *b = make_model(10), *c = make_model(12);
    if (!a || !b || !c) return check_report();
    CHECK_ERR(crew_model_save_weights(a, path), "no weights to save yet");
    CHECK_OK(crew_model_init_params(a, 7));
    /* Give the batch-norm statistics values of their own so that the state's round trip shows. */
    float stats[8] = {0.5f, -1.25f, 3.0f, 1e-7f, 2.0f, 0.125f, 9.5f, 1.0f};
    CHECK(a->n_state == 8);
    CHECK_OK(crew_dev_upload_f32(&a->be, a->state, stats, 8));
    CHECK_OK(crew_model_save_weights(a, path));
    check_file_layout(path);

    /* b has never been laid out or initialised: the load does both. */
    CHECK(!b->initialized);
    CHECK_OK(crew_model_load_weights(b, path));
    CHECK(b->initialized);
    float *good = snapshot(a);
    CHECK(same_bits(b, good));

    /* A model with another dense width: refused, naming the tensor and both shapes. */
    CHECK_OK(crew_model_init_params(c, 9));
    float *c_before = snapshot(c);
    check_refused(c, path, "tensor 'dense.kernel' has shape [64, 10] in the file but the model needs [64, 12]",
                  c_before);

    /* From here b holds other values, so that an unchanged model is told apart from a loaded one. */
    CHECK_OK(crew_model_init_params(b, 8));
    float *b_before = snapshot(b);
    CHECK(!same_bits(b, good));

    size_t len = 0;
    uint8_t *bytes = read_file(path, &len);
    spill(other, bytes, len - 7);
    check_refused(b, other, "run past the data section", b_before);
    spill(other, bytes, 5);
    check_refused(b, other, "file is 5 bytes", b_before);
    free(bytes);
    write_variant(a, other, "dense.bias", 0, 0);
    check_refused(b, other, "tensor 'dense.bias' (shape [10] in the model) is missing from the file", b_before);
    write_variant(a, other, NULL, 1, 0);
    check_refused(b, other, "tensor 'extra.kernel' (shape [3]) is in the file but the model has no such parameter",
                  b_before);
    write_variant(a, other, NULL, 0, 1);
    check_refused(b, other, "tensor 'conv2d.bias' has dtype I32 [4] in the file but the model needs F32 [4]",
                  b_before);
    snprintf(other, sizeof other, "%s/absent.safetensors", dir);
    check_refused(b, other, "absent.safetensors: cannot open", b_before);
    snprintf(other, sizeof other, "%s/bad.safetensors", dir);

    corrupt_header(b, b_before, good, path, other);

    unlink(path);
    unlink(other);
    rmdir(dir);
    free(good);
    free(b_before);
    free(c_before);
    crew_model_free(a);
    crew_model_free(b);
    crew_model_free(c);
    return check_report();
}
