/* generate.c — text from a trained language model (crew_model_generate in crew.h): one forward
 * pass over the last `context` tokens for each new token, the next token drawn from the last
 * position's distribution. Simple rather than fast (no key/value cache): a person reading
 * samples of gpt_tiny waits milliseconds a token. */
#include <math.h>
#include <stdlib.h>

#include "core/rng.h"
#include "core/status.h"
#include "train/train.h"

static const crew_layer *lm_head(const crew_model *m)
{
    const crew_layer *l = m->n_compute ? m->layers[m->n_compute - 1] : NULL;
    return l && l->spec.type == CREW_LAYER_LM_HEAD ? l : NULL;
}

int64_t crew_model_vocab(const crew_model *m) { return m && lm_head(m) ? lm_head(m)->spec.vocab : 0; }

int64_t crew_model_context(const crew_model *m) { return m && lm_head(m) ? m->input.dim[0] : 0; }

crew_status crew_dataset_open_for(const crew_model *m, const char *dir, const char *split, crew_dataset **out)
{
    CREW_TRY(crew_dataset_open(dir, split, out));
    if (!crew_dataset_is_tokens(*out) || !crew_model_context(m)) return CREW_OK;
    crew_status s = crew_dataset_set_context(*out, crew_model_context(m));
    if (s) {
        crew_dataset_free(*out);
        *out = NULL;
    }
    return s;
}

/* Index drawn from probs [vocab] sharpened by 1/temperature, with uniform u in [0, 1). */
static int32_t draw(const float *probs, int64_t vocab, float temperature, double u, double *w)
{
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; i++)
        if (probs[i] > probs[best]) best = i;
    if (temperature <= 0.0f) return (int32_t)best;
    /* p^(1/t) relative to the largest, in logs: no underflow to an all-zero row */
    double total = 0.0, lb = log((double)probs[best]);
    for (int64_t i = 0; i < vocab; i++) {
        w[i] = probs[i] > 0.0f ? exp((log((double)probs[i]) - lb) / (double)temperature) : 0.0;
        total += w[i];
    }
    double target = u * total, acc = 0.0;
    for (int64_t i = 0; i < vocab; i++) {
        acc += w[i];
        if (target < acc) return (int32_t)i;
    }
    return (int32_t)best;
}

crew_status crew_model_generate(crew_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                                float temperature, uint64_t seed, int32_t *out)
{
    if (!m || !prompt || (!out && n_new)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_generate: NULL argument");
    int64_t V = crew_model_vocab(m), T = crew_model_context(m);
    if (!V) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "generate: the model is not a language model (no lm_head)");
    if (n_prompt < 1) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "generate: the prompt needs at least one token");
    if (n_new < 0 || n_new > (1 << 24) || !(temperature >= 0.0f) || !isfinite(temperature))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "generate: token count or temperature out of range");
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return crew_errorf(CREW_CODE_BAD_INPUT, "generate: prompt token %lld is %d, outside the vocabulary [0, %lld)",
                               (long long)i, prompt[i], (long long)V);
    int64_t n = n_prompt + n_new;
    int32_t *hist = malloc((size_t)n * sizeof *hist);
    float *x = malloc((size_t)T * sizeof *x), *probs = malloc((size_t)(T * V) * sizeof *probs);
    double *w = malloc((size_t)V * sizeof *w);
    crew_status s = hist && x && probs && w ? CREW_OK : CREW_OOM();
    for (int64_t i = 0; !s && i < n_prompt; i++) hist[i] = prompt[i];
    for (int64_t k = n_prompt; !s && k < n; k++) {
        int64_t from = k > T ? k - T : 0, len = k - from;
        for (int64_t t = 0; t < T; t++) x[t] = t < len ? (float)hist[from + t] : 0.0f;
        s = crew_model_predict(m, x, 1, probs);
        if (s) break;
        hist[k] = draw(probs + (len - 1) * V, V, temperature, (double)crew_rng_uniform(crew_rng_key(seed, CREW_STREAM_SAMPLE, 0, 0), (uint64_t)k), w);
        out[k - n_prompt] = hist[k];
    }
    free(w);
    free(probs);
    free(x);
    free(hist);
    return s;
}
