/* cmd_sample.c — crew sample MODEL.json --weights W --prompt TEXT [--tokens N --temperature T --seed S]
 *
 * Text from a trained language model, so a person sees what it learned. A byte-level model
 * (vocabulary 256, what crew prep text makes) takes the prompt as text and prints text; a model
 * of another vocabulary (GPT-2's BPE tokens) has no tokenizer here and takes and prints token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew sample MODEL.json --weights FILE --prompt TEXT [--tokens 200] [--temperature 0.8] [--seed 1]\n"
    "\n"
    "Continues TEXT with tokens drawn from a trained language model (a gpt model file) and prints\n"
    "the prompt and its continuation. A byte-level model (vocabulary 256) reads and writes text;\n"
    "for another vocabulary, --prompt is a list of token ids (\"464,3290\") and ids are printed.\n"
    "--temperature 0 always takes the most likely token; the same --seed gives the same text.\n";

typedef struct sample_args {
    const char *model, *weights, *prompt;
    int64_t tokens, seed;
    double temperature;
} sample_args;

static const cli_flag_spec sample_flags[] = {
    CLI_STRING_FLAG(sample_args, "--weights", weights),
    CLI_STRING_FLAG(sample_args, "--prompt", prompt),
    CLI_INT_FLAG(sample_args, "--tokens", tokens, 0, 1 << 20),
    CLI_FLOAT_FLAG(sample_args, "--temperature", temperature, 0.0, 100.0),
    CLI_INT_FLAG(sample_args, "--seed", seed, 0, INT64_MAX),
};

/* "464,3290" → ids; 0 after printing the error. */
static int parse_ids(const char *text, int32_t *ids, int64_t cap, int64_t *n)
{
    *n = 0;
    for (const char *p = text; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || *n == cap || (*end && *end != ',')) {
            cli_usage_error("sample", "--prompt: a model without a byte vocabulary takes token ids like 464,3290");
            return 0;
        }
        ids[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return 1;
}

static void print_tokens(const int32_t *t, int64_t n, int bytes, int *first)
{
    for (int64_t i = 0; i < n; i++) {
        if (bytes) putchar(t[i]);
        else printf(*first ? "%d" : ",%d", t[i]);
        *first = 0;
    }
}

int cli_sample(int argc, char **argv)
{
    sample_args a = {.tokens = 200, .temperature = 0.8, .seed = 1};
    int parsed = cli_parse_args("sample", usage_text, sample_flags, CLI_COUNT(sample_flags), argc, argv, &a, &a.model);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!a.model) return cli_usage_error("sample", "missing MODEL.json");
    if (!a.weights || !*a.weights) return cli_usage_error("sample", "missing --weights FILE");
    if (!a.prompt || !*a.prompt) return cli_usage_error("sample", "missing --prompt TEXT (at least one character)");

    crew_model *m = NULL;
    crew_status s = crew_model_load_file(a.model, &m);
    if (s) return cli_fail("sample", s);
    int64_t vocab = crew_model_vocab(m), len = (int64_t)strlen(a.prompt), n = 0;
    if (!vocab) {
        crew_model_free(m);
        return cli_usage_error("sample", "the model is not a language model (it has no lm_head: use a gpt model file)");
    }
    if ((s = crew_model_load_weights(m, a.weights))) {
        crew_model_free(m);
        return cli_fail("sample", s);
    }
    int bytes = vocab == 256;
    int32_t *prompt = malloc((size_t)len * sizeof *prompt), *out = malloc((size_t)(a.tokens + 1) * sizeof *out);
    int rc = 0;
    if (!prompt || !out) {
        fprintf(stderr, "crew sample: out of memory for %lld tokens\n", (long long)(len + a.tokens));
        rc = 1;
    } else if (bytes) {
        for (int64_t i = 0; i < len; i++) prompt[i] = (unsigned char)a.prompt[i];
        n = len;
    } else if (!parse_ids(a.prompt, prompt, len, &n)) {
        rc = 2;
    }
    if (!rc) s = crew_model_generate(m, prompt, n, a.tokens, (float)a.temperature, (uint64_t)a.seed, out);
    if (!rc && s) rc = cli_fail("sample", s);
    if (!rc) {
        int first = 1;
        print_tokens(prompt, n, bytes, &first);
        print_tokens(out, a.tokens, bytes, &first);
        putchar('\n');
    }
    free(out);
    free(prompt);
    crew_model_free(m);
    return rc;
}
