/* evaluate.c — compile, evaluate and predict on one replica. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "data/dataset.h"
#include "train/train.h"

crew_status crew_model_compile(crew_model *m, const crew_compile_options *opts)
{
    if (!m || !opts) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_compile: NULL argument");
    if (opts->loss != CREW_LOSS_SOFTMAX_CROSS_ENTROPY)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "compile: unknown loss %d", (int)opts->loss);
    crew_compile_options c = *opts;
    CREW_TRY(crew_optimizer_spec_check(&c.optimizer));
    CREW_TRY(crew_model_layout(m));
    crew_shape out = crew_model_output_shape(m);
    if (out.ndim != 1 && m->layers[m->n_compute - 1]->spec.type != CREW_LAYER_LM_HEAD)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "compile: cross-entropy needs a vector of logits per sample (or an lm_head's at every "
                           "position); the last layer gives %d axes",
                           out.ndim);
    m->compile = c; /* the state itself is made by each fit, on each rank's device */
    m->compiled = 1;
    return CREW_OK;
}

crew_status crew_eval_range(crew_model *m, const crew_dataset *d, int64_t lo, int64_t hi, int64_t batch,
                            double *loss_sum, double *correct)
{
    CREW_TRY(crew_model_reserve(m, batch));
    const crew_backend *be = &m->be;
    int64_t in = crew_shape_size(&m->input), pos = crew_model_positions(m);
    int64_t *idx = malloc((size_t)batch * sizeof *idx);
    int32_t *y = malloc((size_t)(batch * pos) * sizeof *y);
    float *x = NULL;
    crew_status s = idx && y ? be->ops->host_alloc(be->ctx, CREW_DT_F32, batch * in, (void **)&x) : CREW_OOM();
    *loss_sum = 0.0;
    *correct = 0.0;
    for (int64_t start = lo; start < hi && !s; start += batch) {
        int64_t rows = hi - start < batch ? hi - start : batch;
        for (int64_t r = 0; r < rows; r++) idx[r] = start + r;
        crew_dataset_gather(d, idx, rows, x, y);
        s = be->ops->upload(be->ctx, NULL, m->act[0], x, rows * in, CREW_DT_F32);
        if (!s) s = be->ops->upload(be->ctx, NULL, m->labels, y, rows * pos, CREW_DT_I32);
        crew_pass p = {.be = be, .rows = rows, .training = 0, .forward_only = 1};
        if (!s) s = crew_model_forward(m, &p);
        double l = 0.0, c = 0.0;
        if (!s) s = crew_model_loss(m, &p, 1.0f, &l, &c); /* synchronous: x and y may be refilled after */
        *loss_sum += l;
        *correct += c;
    }
    if (x) be->ops->host_free(be->ctx, x);
    free(y);
    free(idx);
    return s;
}

crew_status crew_model_evaluate(crew_model *m, const crew_dataset *d, int64_t batch, crew_eval_result *r)
{
    memset(r, 0, sizeof *r);
    if (!m || !d) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_evaluate: NULL argument");
    if (batch <= 0) batch = 256;
    CREW_TRY(crew_model_layout(m));
    CREW_TRY(crew_check_dataset(m, d));
    if (!m->initialized)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "evaluate: the model has no weights yet (train or load them)");
    double loss = 0.0, correct = 0.0;
    int64_t n = crew_dataset_size(d);
    CREW_TRY(crew_eval_range(m, d, 0, n, batch, &loss, &correct));
    r->samples = n;
    r->loss = n ? (float)(loss / (double)n) : NAN;
    r->accuracy = n ? (float)(correct / (double)n) : NAN;
    return CREW_OK;
}

crew_status crew_model_predict(crew_model *m, const float *x, int64_t n, float *probs)
{
    if (!m || (!x && n) || (!probs && n)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_predict: NULL argument");
    CREW_TRY(crew_model_layout(m));
    if (!m->initialized)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "predict: the model has no weights yet (train or load them)");
    /* at most 256 samples a pass, and no more than asked for: a language model's logits are
     * [context, vocab] a sample (GPT-2's 1024 × 50257), and generation predicts one at a time */
    const int64_t batch = n < 1 ? 1 : n < 256 ? n : 256, in = crew_shape_size(&m->input), classes = crew_model_classes(m);
    const int64_t pos = crew_model_positions(m), out = pos * classes; /* per sample */
    CREW_TRY(crew_model_reserve(m, batch));
    const crew_backend_ops *o = m->be.ops;
    for (int64_t start = 0; start < n; start += batch) {
        int64_t rows = n - start < batch ? n - start : batch;
        CREW_TRY(crew_dev_upload_f32(&m->be, m->act[0], x + start * in, rows * in));
        crew_pass p = {.be = &m->be, .rows = rows, .training = 0, .forward_only = 1};
        CREW_TRY(crew_model_forward(m, &p));
        o->softmax(m->be.ctx, m->act[m->n_compute], m->act[m->n_compute], rows * pos, classes); /* in place */
        CREW_TRY(crew_dev_download_f32(&m->be, probs + start * out, m->act[m->n_compute], rows * out));
    }
    return CREW_OK;
}
