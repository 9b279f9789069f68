/* model_file_gpt.c — crew's "gpt" block: one entry of a model file that stands for a whole
 * GPT-2-style language model, so a person writes its five numbers rather than every layer:
 *
 *   {"type": "gpt", "layers": 6, "heads": 6, "width": 384, "context": 256, "vocab": 256}
 *
 * becomes gpt_embedding (token + position), `layers` transformer blocks block_0 … block_{L−1},
 * a final layer norm ln_f (epsilon 1e-5) and an lm_head tied to the token embedding; with
 * "dropout" (GPT-2's resid_pdrop, [0, 1), 0 by default) a dropout layer after the embedding and
 * in each block's two residual branches (attention probabilities are not dropped). The model's
 * input is [context] token ids; input_shape may be left out (the block gives it). */
#include <string.h>

#include "io/model_file.h"

#define GPT_MAX_LAYERS 256
#define GPT_MAX_WIDTH 65536
#define GPT_MAX_CONTEXT 65536
#define GPT_MAX_VOCAB 65536 /* token shards hold uint16 ids */

typedef struct gpt_config {
    int64_t layers, heads, width, context, vocab;
    double dropout; /* GPT-2's embedding and residual dropout [0] */
} gpt_config;

static const char *const GPT_KEYS[] = {"type", "name", "layers", "heads", "width", "context", "vocab", "dropout"};

static crew_status read_config(const crew_mf_where *w, const cJSON *obj, gpt_config *g)
{
    CREW_TRY(crew_mf_known_keys(w, obj, GPT_KEYS, (int)(sizeof GPT_KEYS / sizeof GPT_KEYS[0])));
    const char *name = NULL;
    CREW_TRY(crew_mf_name(w, obj, "name", &name));
    if (name) return crew_mf_error(w, "key 'name': a gpt block names its layers itself (gpt_embedding, block_0, ...)");
    CREW_TRY(crew_mf_int(w, obj, "layers", 1, 1, GPT_MAX_LAYERS, &g->layers));
    CREW_TRY(crew_mf_int(w, obj, "heads", 1, 1, GPT_MAX_WIDTH, &g->heads));
    CREW_TRY(crew_mf_int(w, obj, "width", 1, 1, GPT_MAX_WIDTH, &g->width));
    CREW_TRY(crew_mf_int(w, obj, "context", 1, 1, GPT_MAX_CONTEXT, &g->context));
    CREW_TRY(crew_mf_int(w, obj, "vocab", 1, 2, GPT_MAX_VOCAB, &g->vocab));
    g->dropout = 0.0;
    CREW_TRY(crew_mf_real(w, obj, "dropout", 0, 0.0, 1.0, "[)", &g->dropout));
    if (g->width % g->heads)
        return crew_mf_error(w, "width %lld is not divisible by its %lld heads", (long long)g->width,
                             (long long)g->heads);
    return CREW_OK;
}

int crew_mf_is_gpt(const cJSON *item)
{
    const cJSON *t = cJSON_IsObject(item) ? cJSON_GetObjectItemCaseSensitive(item, "type") : NULL;
    return cJSON_IsString(t) && strcmp(t->valuestring, "gpt") == 0;
}

crew_status crew_mf_gpt_context(const crew_mf_where *w, const cJSON *item, int64_t *context)
{
    gpt_config g;
    CREW_TRY(read_config(w, item, &g));
    *context = g.context;
    return CREW_OK;
}

crew_status crew_mf_add_gpt(crew_model *m, const cJSON *item, const crew_mf_where *w)
{
    gpt_config g;
    CREW_TRY(read_config(w, item, &g));
    if (m->n_layers) return crew_mf_error(w, "a gpt block must be the model's first layer");
    if (m->input.ndim != 1 || m->input.dim[0] != g.context)
        return crew_mf_error(w, "input_shape must be [%lld] (the context: token ids), or left out", (long long)g.context);
    CREW_TRY(crew_mf_add_layer(m, &(crew_layer_spec){.type = CREW_LAYER_GPT_EMBEDDING, .name = "gpt_embedding",
                                                     .vocab = g.vocab, .dim = g.width}, w));
    if (g.dropout > 0.0) /* on the embeddings, as GPT-2 */
        CREW_TRY(crew_mf_add_layer(m, &(crew_layer_spec){.type = CREW_LAYER_DROPOUT, .name = "drop",
                                                         .rate = (float)g.dropout}, w));
    for (int64_t i = 0; i < g.layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "block_%lld", (long long)i);
        crew_layer_spec b = {.type = CREW_LAYER_TRANSFORMER_BLOCK, .name = name, .heads = g.heads,
                             .blocks = (int)g.layers, .rate = (float)g.dropout};
        CREW_TRY(crew_mf_add_layer(m, &b, w));
    }
    CREW_TRY(crew_mf_add_layer(m, &(crew_layer_spec){.type = CREW_LAYER_LAYER_NORM, .name = "ln_f", .epsilon = 1e-5f}, w));
    return crew_mf_add_layer(m, &(crew_layer_spec){.type = CREW_LAYER_LM_HEAD, .name = "lm_head", .tie = "gpt_embedding"}, w);
}
