/* weights.c — a model's parameters to and from a safetensors file.
 *
 * One F32 tensor per parameter, trainable or not (batch-norm moving statistics included), named
 * "<layer name>.<param name>" in Keras layouts, plus metadata {"format": "crew", "model": name}.
 * Values travel through the backend's download/upload, so a device backend works unchanged.
 *
 * Loading demands an exact match — the same set of names, each with dtype F32 and the model's
 * shape — and checks everything before it writes anything, so a failed load leaves the model's
 * weights as they were. Metadata is not checked: files from other tools load when they match.
 * A run's weights also say how far it got ("steps", "total_steps", "finished"), which crew eval
 * reads to warn about an unfinished run's weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/safetensors.h"
#include "nn/model.h"

/* "[784, 256]" */
static void shape_text(const int64_t *dim, int ndim, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)dim[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

/* Every named parameter of m, in layer order; *out is malloc'd (NULL when there are none). */
static crew_status list_params(const crew_model *m, crew_named_param **out, int *n)
{
    *out = NULL;
    *n = crew_model_named_params(m, NULL, 0);
    if (*n == 0) return CREW_OK;
    *out = calloc((size_t)*n, sizeof **out);
    if (!*out) return CREW_OOM();
    crew_model_named_params(m, *out, *n);
    return CREW_OK;
}

/* ------------------------------------------------------------------ save */

/* Downloads every parameter into one host buffer and describes it as F32 tensors. */
static crew_status gather(const crew_model *m, const crew_named_param *np, int n, crew_st_tensor *t, float **host)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += crew_shape_size(&np[i].param->shape);
    *host = malloc((size_t)(total ? total : 1) * sizeof(float));
    if (!*host) return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "out of memory for %lld weights", (long long)total);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const crew_param *p = np[i].param;
        int64_t count = crew_shape_size(&p->shape);
        CREW_TRY(crew_dev_download_f32(&m->be, *host + at, p->value, count));
        memcpy(t[i].name, np[i].name, sizeof t[i].name);
        t[i].dtype = CREW_ST_F32;
        t[i].ndim = p->shape.ndim;
        for (int d = 0; d < p->shape.ndim; d++) t[i].shape[d] = p->shape.dim[d];
        t[i].count = count;
        t[i].data = *host + at;
        at += count;
    }
    return CREW_OK;
}

/* extra: metadata key/value pairs after format and model, NULL-terminated (or NULL). */
static crew_status save_weights(const crew_model *m, const char *path, const char *const *extra)
{
    if (!m || !path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_save_weights: NULL argument");
    if (!m->laid_out || !m->initialized)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "%s: model '%s' has no weights to save yet (initialise, train or load them first)", path,
                           m->name);
    crew_named_param *np;
    int n;
    CREW_TRY(list_params(m, &np, &n));
    crew_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    float *host = NULL;
    crew_status s = t ? gather(m, np, n, t, &host) : CREW_OOM();
    const char *meta[16] = {"format", "crew", "model", m->name};
    for (int i = 0; extra && extra[i] && i < 10; i++) meta[4 + i] = extra[i];
    if (!s) s = crew_st_write(path, t, n, meta);
    free(host);
    free(t);
    free(np);
    return s;
}

crew_status crew_model_save_weights(const crew_model *m, const char *path) { return save_weights(m, path, NULL); }

crew_status crew_model_save_weights_progress(const crew_model *m, const char *path, int64_t steps, int64_t total_steps)
{
    if (steps < 0 || total_steps < steps)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: step %lld of %lld is not a run's progress", path ? path : "?",
                           (long long)steps, (long long)total_steps);
    char done[24], total[24];
    snprintf(done, sizeof done, "%lld", (long long)steps);
    snprintf(total, sizeof total, "%lld", (long long)total_steps);
    const char *extra[] = {"steps", done, "total_steps", total, "finished", steps == total_steps ? "true" : "false",
                           NULL};
    return save_weights(m, path, extra);
}

/* A metadata value that is a non-negative decimal integer, else -1. */
static int64_t meta_count(const crew_st_file *f, const char *key)
{
    const char *v = crew_st_metadata(f, key);
    if (!v || !*v || strlen(v) > 18 || strspn(v, "0123456789") != strlen(v)) return -1;
    return (int64_t)strtoll(v, NULL, 10);
}

crew_status crew_weights_progress(const char *path, int64_t *steps, int64_t *total_steps)
{
    if (!path || !steps || !total_steps) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_weights_progress: NULL argument");
    *steps = *total_steps = -1;
    crew_st_file f;
    crew_status s = crew_st_read(path, &f);
    int64_t done = s ? -1 : meta_count(&f, "steps"), total = s ? -1 : meta_count(&f, "total_steps");
    crew_st_free(&f); /* as crew_model_load_weights: safe after a failed read too */
    if (s) return s;
    if (done >= 0 && total >= done) { /* anything else is not a progress this file can vouch for */
        *steps = done;
        *total_steps = total;
    }
    return CREW_OK;
}

/* ------------------------------------------------------------------ load */

static int has_param(const crew_named_param *np, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(np[i].name, name) == 0) return 1;
    return 0;
}

/* The file's tensor for one model parameter, present with dtype F32 and the same shape. */
static crew_status match_param(const crew_st_file *f, const crew_named_param *np, const char *path)
{
    char want[160], have[160];
    shape_text(np->param->shape.dim, np->param->shape.ndim, want, sizeof want);
    const crew_st_tensor *t = crew_st_find(f, np->name);
    if (!t)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s' (shape %s in the model) is missing from the file",
                           path, np->name, want);
    shape_text(t->shape, t->ndim, have, sizeof have);
    if (t->dtype != CREW_ST_F32)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s: tensor '%s' has dtype %s %s in the file but the model needs F32 %s", path,
                           np->name, crew_st_dtype_name(t->dtype), have, want);
    const crew_shape *s = &np->param->shape;
    int same = t->ndim == s->ndim;
    for (int d = 0; same && d < s->ndim; d++) same = t->shape[d] == s->dim[d];
    if (!same)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: tensor '%s' has shape %s in the file but the model needs %s", path,
                           np->name, have, want);
    return CREW_OK;
}

static crew_status check_match(const crew_st_file *f, const crew_named_param *np, int n, const char *path)
{
    for (int i = 0; i < n; i++) CREW_TRY(match_param(f, &np[i], path));
    for (int i = 0; i < f->n_tensors; i++)
        if (!has_param(np, n, f->tensors[i].name)) {
            char have[160];
            shape_text(f->tensors[i].shape, f->tensors[i].ndim, have, sizeof have);
            return crew_errorf(CREW_CODE_BAD_INPUT,
                               "%s: tensor '%s' (shape %s) is in the file but the model has no such parameter", path,
                               f->tensors[i].name, have);
        }
    return CREW_OK;
}

/* Copies every matched tensor into the model. The staging buffer is allocated first, so once
 * the first upload happens only the device itself can fail half-way. File data may be unaligned:
 * memcpy. */
static crew_status copy_in(crew_model *m, const crew_st_file *f, const crew_named_param *np, int n)
{
    int64_t largest = 1;
    for (int i = 0; i < n; i++) {
        int64_t c = crew_shape_size(&np[i].param->shape);
        if (c > largest) largest = c;
    }
    float *host = malloc((size_t)largest * sizeof(float));
    if (!host) return crew_errorf(CREW_CODE_OUT_OF_MEMORY, "out of memory for %lld weights", (long long)largest);
    crew_status s = CREW_OK;
    for (int i = 0; i < n && !s; i++) {
        const crew_st_tensor *t = crew_st_find(f, np[i].name);
        if (t->count) memcpy(host, t->data, (size_t)t->count * sizeof(float));
        s = crew_dev_upload_f32(&m->be, np[i].param->value, host, t->count);
        if (!s) s = m->be.ops->sync(m->be.ctx, NULL); /* host is reused for the next tensor */
    }
    free(host);
    return s;
}

crew_status crew_model_load_weights(crew_model *m, const char *path)
{
    if (!m || !path) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_load_weights: NULL argument");
    CREW_TRY(crew_model_layout(m));
    crew_named_param *np;
    int n;
    CREW_TRY(list_params(m, &np, &n));
    crew_st_file f;
    crew_status s = crew_st_read(path, &f);
    if (!s) s = check_match(&f, np, n, path);
    if (!s) s = copy_in(m, &f, np, n);
    if (!s) m->initialized = 1;
    crew_st_free(&f);
    free(np);
    return s;
}

/* ------------------------------------------------------------------ in memory */

int crew_model_tensor_count(const crew_model *m) { return m ? crew_model_named_params(m, NULL, 0) : 0; }

int crew_model_tensor_info(const crew_model *m, int i, char *name, size_t name_len, int64_t shape[8])
{
    int n = crew_model_tensor_count(m);
    if (i < 0 || i >= n) return 0;
    crew_named_param *np;
    if (list_params(m, &np, &n)) return 0;
    const crew_shape *s = &np[i].param->shape;
    if (name && name_len) snprintf(name, name_len, "%s", np[i].name);
    for (int d = 0; d < s->ndim; d++) shape[d] = s->dim[d];
    int ndim = s->ndim;
    free(np);
    return ndim;
}

crew_status crew_model_get_tensors(const crew_model *m, float *const *values)
{
    if (!m || !values) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_get_tensors: NULL argument");
    if (!m->laid_out || !m->initialized)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "model '%s' has no weights to read yet (initialise, train or load them first)", m->name);
    crew_named_param *np;
    int n;
    CREW_TRY(list_params(m, &np, &n));
    crew_status s = CREW_OK;
    for (int i = 0; i < n && !s; i++)
        if (!values[i]) s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_get_tensors: no buffer for '%s'", np[i].name);
    for (int i = 0; i < n && !s; i++)
        s = crew_dev_download_f32(&m->be, values[i], np[i].param->value, crew_shape_size(&np[i].param->shape));
    free(np);
    return s;
}

crew_status crew_model_set_tensors(crew_model *m, const float *const *values)
{
    if (!m || !values) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_set_tensors: NULL argument");
    CREW_TRY(crew_model_layout(m));
    crew_named_param *np;
    int n;
    CREW_TRY(list_params(m, &np, &n));
    crew_status s = CREW_OK;
    for (int i = 0; i < n && !s; i++)
        if (!values[i]) s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_set_tensors: no values for '%s'", np[i].name);
    for (int i = 0; i < n && !s; i++) {
        s = crew_dev_upload_f32(&m->be, np[i].param->value, values[i], crew_shape_size(&np[i].param->shape));
        if (!s) s = m->be.ops->sync(m->be.ctx, NULL); /* the caller may reuse its buffers once this returns */
    }
    if (!s) m->initialized = 1;
    free(np);
    return s;
}
