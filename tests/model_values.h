/* model_values.h — host copies of a model's values, for tests that compare or change them.
 * A model's buffers are device memory: tests read and write them only through the backend, as
 * the library does (the guarded build, make guard, traps anything else). */
#ifndef CREW_TESTS_MODEL_VALUES_H
#define CREW_TESTS_MODEL_VALUES_H

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/model.h"

/* n floats at device address src of m's backend, in a fresh host array (free it). */
static inline float *mv_download(const crew_model *m, const float *src, int64_t n)
{
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h) abort();
    CHECK_OK(crew_dev_download_f32(&m->be, h, src, n));
    return h;
}

static inline void mv_upload(crew_model *m, float *dst, const float *host, int64_t n)
{
    CHECK_OK(crew_dev_upload_f32(&m->be, dst, host, n));
    CHECK_OK(m->be.ops->sync(m->be.ctx, NULL));
}

/* n elements of type t (labels int32, sample ids int64) into device address dst. */
static inline void mv_upload_as(crew_model *m, void *dst, const void *host, int64_t n, crew_dtype t)
{
    CHECK_OK(m->be.ops->upload(m->be.ctx, NULL, dst, host, n, t));
    CHECK_OK(m->be.ops->sync(m->be.ctx, NULL));
}

/* The one float at device address p (NaN when the download fails), and setting it: a finite
 * difference perturbs and restores one parameter this way. */
static inline float mv_get(const crew_model *m, const float *p)
{
    float v = NAN;
    CHECK_OK(crew_dev_download_f32(&m->be, &v, p, 1));
    return v;
}

static inline void mv_set(crew_model *m, float *p, float v) { mv_upload(m, p, &v, 1); }

/* The first n labels, in a fresh host array (free it). */
static inline int32_t *mv_labels(const crew_model *m, int64_t n)
{
    int32_t *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h) abort();
    CHECK_OK(m->be.ops->download(m->be.ctx, h, m->labels, n, CREW_DT_I32));
    return h;
}

static inline float *mv_params(const crew_model *m) { return mv_download(m, m->params, m->n_params); }
static inline float *mv_grads(const crew_model *m) { return mv_download(m, m->grads, m->n_params); }
static inline float *mv_state(const crew_model *m) { return mv_download(m, m->state, m->n_state); }
/* One parameter's values. */
static inline float *mv_tensor(const crew_model *m, const crew_param *p)
{
    return mv_download(m, p->value, crew_shape_size(&p->shape));
}

/* 1 when a and b hold bitwise the same parameters and state. */
static inline int mv_equal(const crew_model *a, const crew_model *b)
{
    if (a->n_params != b->n_params || a->n_state != b->n_state) return 0;
    float *pa = mv_params(a), *pb = mv_params(b), *sa = mv_state(a), *sb = mv_state(b);
    int same = memcmp(pa, pb, (size_t)a->n_params * sizeof *pa) == 0 && memcmp(sa, sb, (size_t)a->n_state * sizeof *sa) == 0;
    free(pa);
    free(pb);
    free(sa);
    free(sb);
    return same;
}

#endif
