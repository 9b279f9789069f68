/* test_model_file.c — model files: the two example models, the Keras fixtures written by
 * tools/make_keras_fixtures.py (their parameter counts are Keras's own count_params()), and bad
 * files whose errors must name the file, the layer index and the key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "nn/model.h"
#include "core/json_text.h"
#include "io/model_file.h"

static char tmp_dir[256];
static char path_buf[512];

static const char *source_path(const char *rel)
{
    const char *root = getenv("CREW_SOURCE_DIR");
    snprintf(path_buf, sizeof path_buf, "%s/%s", root ? root : "..", rel);
    return path_buf;
}

/* Writes text to <tmp_dir>/<name> and returns the path (valid until the next call). */
static const char *write_tmp(const char *name, const char *text)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path_buf, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path_buf);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return path_buf;
}

/* Loads a crew-format file from text and expects an error naming the file and `needle` (and
 * `needle2` when not NULL). */
static void expect_bad(const char *name, const char *text, const char *needle, const char *needle2)
{
    const char *path = write_tmp(name, text);
    crew_model *m = (crew_model *)1;
    crew_status s = crew_model_load_file(path, &m);
    CHECK_MSG(s != CREW_OK, "%s: expected an error", name);
    CHECK_MSG(m == NULL, "%s: *out must be NULL on error", name);
    if (s) {
        const char *msg = crew_status_message(s);
        if (getenv("CREW_TEST_VERBOSE")) printf("%s\n", msg);
        CHECK_MSG(strstr(msg, name) != NULL, "%s: message '%s' lacks the file name", name, msg);
        CHECK_MSG(strstr(msg, needle) != NULL, "%s: message '%s' lacks '%s'", name, msg, needle);
        if (needle2) CHECK_MSG(strstr(msg, needle2) != NULL, "%s: message '%s' lacks '%s'", name, msg, needle2);
        CHECK_MSG(strchr(msg, '\n') == NULL, "%s: message '%s' is more than one line", name, msg);
        CHECK_MSG(crew_status_code(s) == CREW_CODE_BAD_INPUT, "%s: code %d", name, (int)crew_status_code(s));
    }
    crew_status_free(s);
    crew_model_free(m == (crew_model *)1 ? NULL : m);
    unlink(path_buf);
}

/* A crew-format model on input [28, 28, 1] with the given layers and extra top-level keys. */
static const char *crew_text(const char *layers, const char *extra)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "{\"input_shape\": [28, 28, 1], \"layers\": [%s]%s%s}", layers, extra[0] ? ", " : "",
             extra);
    return buf;
}

/* A Keras Sequential model on input (8, 8, 3) whose second layer is `layer`. */
static const char *keras_text(const char *layer)
{
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"module\": \"keras\", \"class_name\": \"Sequential\", \"config\": {\"name\": \"seq\", \"layers\": ["
             "{\"class_name\": \"InputLayer\", \"config\": {\"batch_shape\": [null, 8, 8, 3], \"name\": \"input_layer\"}},"
             "%s]}}",
             layer);
    return buf;
}

static void remove_tmp(const char *name)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", tmp_dir, name);
    unlink(path_buf);
}

static crew_model *load_ok(const char *path)
{
    crew_model *m = NULL;
    crew_status s = crew_model_load_file(path, &m);
    CHECK_MSG(s == CREW_OK && m != NULL, "loading %s: %s", path, crew_status_message(s));
    crew_status_free(s);
    return m;
}

/* ------------------------------------------------------------------ good files */

static void test_fashion_mlp(void)
{
    crew_model *m = load_ok(source_path("examples/fashion_mlp.json"));
    if (!m) return;
    /* flatten, dense, dense_act, dense_1, dense_1_act, dense_2 */
    CHECK(crew_model_layer_count(m) == 6);
    CHECK(crew_model_param_count(m) == 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
    CHECK(crew_model_param_count(m) == 269322);
    CHECK(strcmp(m->name, "fashion_mlp") == 0);
    CHECK(strcmp(m->layers[1]->name, "dense") == 0 && strcmp(m->layers[2]->name, "dense_act") == 0);
    CHECK(m->layers[2]->spec.activation == CREW_ACT_RELU);
    CHECK(crew_model_output_size(m) == 10);
    const crew_model_defaults *d = &m->defaults;
    CHECK(d->has_compile && d->compile.loss == CREW_LOSS_SOFTMAX_CROSS_ENTROPY);
    CHECK(d->compile.optimizer.type == CREW_OPT_ADAMW);
    CHECK(fabsf(d->compile.optimizer.lr - 1e-3f) < 1e-9f);
    CHECK(d->compile.optimizer.base_batch == 128 && d->compile.optimizer.scaling == CREW_SCALE_SQRT);
    CHECK(d->compile.optimizer.beta1 == 0.9 && d->compile.optimizer.beta2 == 0.999);
    CHECK(d->epochs == 10 && d->batch_per_device == 128 && d->has_seed && d->seed == 1);
    crew_model_free(m);
}

static void test_fashion_cnn(void)
{
    crew_model *m = load_ok(source_path("examples/fashion_cnn.json"));
    if (!m) return;
    /* conv2d, act, pool, conv2d_1, act, pool, flatten, dense, act, dropout, dense_1 */
    CHECK(crew_model_layer_count(m) == 11);
    int64_t conv1 = 3 * 3 * 1 * 32 + 32, conv2 = 3 * 3 * 32 * 64 + 64;
    int64_t dense1 = 7 * 7 * 64 * 128 + 128, dense2 = 128 * 10 + 10;
    CHECK(crew_model_param_count(m) == conv1 + conv2 + dense1 + dense2);
    CHECK(crew_model_param_count(m) == 421642);
    CHECK(m->layers[0]->spec.kernel[0] == 3 && m->layers[0]->spec.padding == CREW_PAD_SAME);
    CHECK(m->layers[5]->out.ndim == 3 && m->layers[5]->out.dim[0] == 7 && m->layers[5]->out.dim[2] == 64);
    CHECK(m->layers[9]->spec.type == CREW_LAYER_DROPOUT && fabsf(m->layers[9]->spec.rate - 0.3f) < 1e-7f);
    const crew_model_defaults *d = &m->defaults;
    CHECK(d->has_compile && d->compile.optimizer.schedule == CREW_SCHED_COSINE);
    CHECK(fabsf(d->compile.optimizer.weight_decay - 1e-4f) < 1e-10f);
    CHECK(d->epochs == 4 && d->batch_per_device == 64 && d->compile.optimizer.base_batch == 64);
    crew_model_free(m);
}

/* A minimal file: no compile or training settings leaves the defaults unset. */
static void test_minimal_and_options(void)
{
    crew_model *m = load_ok(write_tmp("min.json", "{\"input_shape\": [4], \"layers\": [{\"type\": \"dense\", "
                                                  "\"units\": 3, \"use_bias\": false, \"name\": \"out\"}]}"));
    if (m) {
        CHECK(crew_model_param_count(m) == 12);
        CHECK(strcmp(m->layers[0]->name, "out") == 0);
        CHECK(!m->defaults.has_compile && m->defaults.epochs == 0 && !m->defaults.has_seed);
        crew_model_free(m);
    }
    m = load_ok(write_tmp("sgd.json", crew_text("{\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 10, "
                                                "\"activation\": \"softmax\"}",
                                                "\"optimizer\": {\"type\": \"sgd\", \"momentum\": 0.9, \"nesterov\": "
                                                "true, \"schedule\": {\"type\": \"step\", \"step_size\": 100}}")));
    if (m) {
        const crew_optimizer_spec *o = &m->defaults.compile.optimizer;
        CHECK(m->defaults.has_compile && o->type == CREW_OPT_SGD && fabsf(o->lr - 0.01f) < 1e-9f);
        CHECK(o->nesterov && o->schedule == CREW_SCHED_STEP && o->step_size == 100 && fabsf(o->gamma - 0.1f) < 1e-7f);
        CHECK(m->layers[2]->spec.activation == CREW_ACT_SOFTMAX);
        crew_model_free(m);
    }
    m = load_ok(write_tmp("nets.json", crew_text("{\"type\": \"conv2d\", \"filters\": 4, \"kernel_size\": [3, 1], "
                                                 "\"strides\": 2}, {\"type\": \"batch_norm\", \"momentum\": 0.9}, "
                                                 "{\"type\": \"avg_pool2d\", \"pool_size\": [2, 1], \"padding\": "
                                                 "\"same\"}, {\"type\": \"global_avg_pool2d\"}, {\"type\": "
                                                 "\"layer_norm\", \"epsilon\": 1e-5}, {\"type\": \"activation\", "
                                                 "\"activation\": \"gelu\"}, {\"type\": \"dense\", \"units\": 2}",
                                                 "\"loss\": \"sparse_categorical_crossentropy\"")));
    if (m) {
        CHECK(m->layers[0]->out.dim[0] == 13 && m->layers[0]->out.dim[1] == 14); /* valid, strides 2 */
        CHECK(m->layers[1]->spec.momentum == 0.9f && m->layers[1]->spec.epsilon == 1e-3f);
        CHECK(m->layers[2]->out.dim[0] == 7 && m->layers[2]->out.dim[1] == 14);
        CHECK(m->defaults.has_compile && m->defaults.compile.optimizer.type == CREW_OPT_ADAMW);
        crew_model_free(m);
    }
    remove_tmp("min.json");
    remove_tmp("sgd.json");
    remove_tmp("nets.json");
}

/* LAMB and LARS in crew's format (their defaults and keys), and Keras's Lamb. */
static void test_layerwise_optimizers(void)
{
    const char *flat = "{\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 3}";
    crew_model *m = load_ok(write_tmp("lamb.json", crew_text(flat, "\"optimizer\": {\"type\": \"lamb\", "
                                                                 "\"weight_decay\": 0.01}")));
    if (m) {
        const crew_optimizer_spec *o = &m->defaults.compile.optimizer;
        CHECK(o->type == CREW_OPT_LAMB && fabsf(o->lr - 1e-3f) < 1e-9f && o->beta1 == 0.9 && o->beta2 == 0.999);
        CHECK(fabsf(o->eps - 1e-6f) < 1e-12f && fabsf(o->weight_decay - 0.01f) < 1e-9f);
        crew_model_free(m);
    }
    m = load_ok(write_tmp("lars.json", crew_text(flat, "\"optimizer\": {\"type\": \"lars\", \"lr\": 2, "
                                                       "\"trust\": 0.002, \"weight_decay\": 5e-4}")));
    if (m) {
        const crew_optimizer_spec *o = &m->defaults.compile.optimizer;
        CHECK(o->type == CREW_OPT_LARS && o->lr == 2.0f && fabsf(o->trust - 0.002f) < 1e-9f && o->momentum == 0.9f);
        CHECK(o->eps == 0.0f && !o->nesterov);
        crew_model_free(m);
    }
    expect_bad("lamb_mom.json", crew_text(flat, "\"optimizer\": {\"type\": \"lamb\", \"momentum\": 0.9}"),
               "optimizer", "unknown key 'momentum'");
    expect_bad("sgd_trust.json", crew_text(flat, "\"optimizer\": {\"type\": \"sgd\", \"trust\": 0.1}"), "optimizer",
               "unknown key 'trust'");
    expect_bad("lars_trust.json", crew_text(flat, "\"optimizer\": {\"type\": \"lars\", \"trust\": 0}"),
               "optimizer", "trust");
    static const char keras[] =
        "{\"class_name\": \"Sequential\", \"config\": {\"layers\": [{\"class_name\": \"Dense\", \"config\": "
        "{\"units\": 3}}]}, \"build_config\": {\"input_shape\": [null, 5]}, \"compile_config\": {\"loss\": "
        "\"sparse_categorical_crossentropy\", \"optimizer\": {\"class_name\": \"Lamb\", \"config\": "
        "{\"learning_rate\": 0.002, \"beta_1\": 0.9, \"beta_2\": 0.999, \"epsilon\": 1e-07}}}}";
    m = load_ok(write_tmp("klamb.json", keras));
    if (m) {
        const crew_optimizer_spec *o = &m->defaults.compile.optimizer;
        CHECK(m->defaults.has_compile && o->type == CREW_OPT_LAMB && fabsf(o->lr - 0.002f) < 1e-9f);
        CHECK(fabsf(o->eps - 1e-7f) < 1e-13f);
        crew_model_free(m);
    }
    remove_tmp("lamb.json");
    remove_tmp("lars.json");
    remove_tmp("klamb.json");
}

static void test_keras_fixtures(void)
{
    crew_model *m = load_ok(source_path("tests/fixtures/keras/fashion_mlp.json"));
    if (m) {
        CHECK(crew_model_param_count(m) == 269322); /* Keras count_params() */
        CHECK(crew_model_layer_count(m) == 7);      /* ... dense_2, dense_2_act (softmax) */
        CHECK(strcmp(m->name, "fashion_mlp") == 0 && strcmp(m->layers[1]->name, "dense") == 0);
        CHECK(m->layers[6]->spec.activation == CREW_ACT_SOFTMAX);
        const crew_optimizer_spec *o = &m->defaults.compile.optimizer;
        CHECK(m->defaults.has_compile && o->type == CREW_OPT_ADAMW && fabsf(o->lr - 1e-3f) < 1e-9f);
        CHECK(fabsf(o->eps - 1e-7f) < 1e-12f && o->weight_decay == 0.0f);
        crew_model_free(m);
    }
    m = load_ok(source_path("tests/fixtures/keras/small_cnn.json"));
    if (m) {
        /* Keras count_params() is 5290 with the 96 batch-norm moving statistics; crew counts the
         * trainable ones, 5194 as Keras's trainable_weights. */
        CHECK(crew_model_param_count(m) == 5194);
        CHECK(m->n_layers == 12 && strcmp(m->layers[4]->name, "conv2d_1") == 0 && m->layers[4]->spec.no_bias);
        CHECK(m->layers[5]->spec.momentum == 0.9f && fabsf(m->layers[5]->spec.epsilon - 1e-5f) < 1e-12f);
        CHECK(m->layers[9]->spec.type == CREW_LAYER_DROPOUT && m->layers[9]->spec.rate == 0.25f);
        const crew_optimizer_spec *o = &m->defaults.compile.optimizer;
        CHECK(m->defaults.has_compile && o->type == CREW_OPT_SGD && o->nesterov && fabsf(o->momentum - 0.9f) < 1e-7f);
        CHECK(fabsf(o->lr - 0.01f) < 1e-9f);
        crew_model_free(m);
    }
    m = load_ok(source_path("tests/fixtures/keras/token_model.json"));
    if (m) {
        CHECK(crew_model_param_count(m) == 804);
        CHECK(m->input.ndim == 1 && m->input.dim[0] == 12);
        CHECK(m->layers[0]->out.ndim == 2 && m->layers[0]->out.dim[1] == 8);
        CHECK(crew_model_output_size(m) == 4);
        CHECK(!m->defaults.has_compile); /* never compiled in Keras */
        crew_model_free(m);
    }
}

/* A Functional model whose layers form one chain is read as the Sequential model it equals (the
 * fixture's count_params() is Keras's); one that branches is refused naming the layer, and so is
 * every way a chain can break: a layer called twice, one fed from further back, two inputs. The
 * same text parses from memory (crew_model_parse_json, what the Python package calls). */
static void test_keras_functional(void)
{
    crew_model *m = load_ok(source_path("tests/fixtures/keras/functional_cnn.json"));
    if (m) {
        CHECK(crew_model_param_count(m) == 13610);
        CHECK(strcmp(m->name, "functional_cnn") == 0 && strcmp(m->layers[0]->name, "conv2d") == 0);
        CHECK(m->input.ndim == 3 && m->input.dim[0] == 28 && m->input.dim[2] == 1);
        CHECK(m->defaults.has_compile && m->defaults.compile.optimizer.type == CREW_OPT_ADAMW);
        crew_model_free(m);
    }
    crew_model *r = (crew_model *)1;
    CHECK_ERR(crew_model_load_file(source_path("tests/fixtures/keras/functional_residual.json"), &r),
              "layer 2 ('add') takes 2 inputs: crew imports Functional models whose layers form one chain");
    CHECK(r == NULL);
    const char *head = "{\"class_name\": \"Functional\", \"config\": {\"name\": \"f\", \"layers\": ["
                       "{\"class_name\": \"InputLayer\", \"name\": \"in\", \"config\": {\"batch_shape\": [null, 4], "
                       "\"name\": \"in\"}, \"inbound_nodes\": []},";
#define KT(layer, from) "{\"class_name\": \"Dense\", \"name\": \"" layer "\", \"config\": {\"name\": \"" layer "\", " \
    "\"units\": 4}, \"inbound_nodes\": [{\"args\": [{\"class_name\": \"__keras_tensor__\", \"config\": " \
    "{\"keras_history\": [\"" from "\", 0, 0]}}], \"kwargs\": {}}]}"
    char text[4096];
    snprintf(text, sizeof text, "%s%s, %s]%s", head, KT("a", "in"), KT("b", "a"),
             ", \"input_layers\": [[\"in\", 0, 0]], \"output_layers\": [[\"b\", 0, 0]]}}");
    CHECK_OK(crew_model_parse_json(text, strlen(text), "chain.json", &m));
    CHECK(m && crew_model_param_count(m) == 40);
    crew_model_free(m);
    snprintf(text, sizeof text, "%s%s, %s, %s]%s", head, KT("a", "in"), KT("b", "a"), KT("c", "a"),
             ", \"input_layers\": [[\"in\", 0, 0]], \"output_layers\": [[\"c\", 0, 0]]}}");
    expect_bad("fork.json", text, "layer 3 ('c') takes the output of 'a', not of the layer before it ('b')", NULL);
    snprintf(text, sizeof text, "%s%s, %s]%s", head, KT("a", "in"), KT("b", "a"),
             ", \"input_layers\": [[\"in\", 0, 0]], \"output_layers\": [[\"a\", 0, 0]]}}");
    expect_bad("output.json", text, "'config.output_layers' must name the one output, the last layer", NULL);
    snprintf(text, sizeof text, "%s%s]%s", head, KT("a", "in"), ", \"output_layers\": [[\"a\", 0, 0]]}}");
    expect_bad("noinput.json", text, "'config.input_layers' must name the one input", NULL);
    snprintf(text, sizeof text, "%s%s]%s", head,
             "{\"class_name\": \"Dense\", \"name\": \"a\", \"config\": {\"units\": 4}, \"inbound_nodes\": [{}, {}]}",
             ", \"input_layers\": [[\"in\", 0, 0]], \"output_layers\": [[\"a\", 0, 0]]}}");
    expect_bad("twice.json", text, "layer 1 ('a') is called more than once", NULL);
#undef KT
}

/* Keras settings crew cannot run exactly leave the defaults unset instead of failing. */
static void test_keras_compile_unmapped(void)
{
    static const char text[] =
        "{\"class_name\": \"Sequential\", \"config\": {\"layers\": [{\"class_name\": \"Dense\", \"config\": "
        "{\"units\": 3, \"activation\": null, \"kernel_regularizer\": null}}]}, \"build_config\": {\"input_shape\": "
        "[null, 5]}, \"compile_config\": {\"loss\": \"sparse_categorical_crossentropy\", \"optimizer\": "
        "{\"class_name\": \"RMSprop\", \"config\": {\"learning_rate\": 0.001}}}}";
    crew_model *m = load_ok(write_tmp("rms.json", text));
    if (m) {
        CHECK(crew_model_param_count(m) == 18 && !m->defaults.has_compile);
        crew_model_free(m);
    }
    remove_tmp("rms.json");
}

/* ------------------------------------------------------------------ bad files */

static void test_bad_crew_files(void)
{
    expect_bad("notjson.json", "{\"input_shape\": [28, 28, 1], \"layers\": [", "not valid JSON", "line 1");
    expect_bad("trailing.json", "{\"input_shape\": [4], \"layers\": [{\"type\": \"flatten\"}]} x", "not valid JSON",
               NULL);
    expect_bad("empty.json", "  \n", "empty", NULL);
    expect_bad("array.json", "[1, 2]", "top level must be a JSON object", NULL);
    expect_bad("topkey.json", crew_text("{\"type\": \"flatten\"}", "\"lerning\": 1"), "unknown key 'lerning'", NULL);
    expect_bad("type.json", crew_text("{\"type\": \"flatten\"}, {\"type\": \"lstm\", \"units\": 4}", ""), "layer 1",
               "unknown layer type 'lstm'");
    expect_bad("nounits.json", crew_text("{\"type\": \"flatten\"}, {\"type\": \"dense\"}", ""), "layer 1 (dense)",
               "missing key 'units'");
    expect_bad("strunits.json", crew_text("{\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": \"10\"}", ""),
               "layer 1 (dense)", "key 'units' must be an integer");
    expect_bad("zerounits.json", crew_text("{\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 0}", ""),
               "layer 1 (dense)", "key 'units'");
    expect_bad("hugeunits.json", crew_text("{\"type\": \"dense\", \"units\": 33554432}", ""), "layer 0",
               "key 'units'");
    expect_bad("filters.json", crew_text("{\"type\": \"conv2d\", \"filters\": 3.5, \"kernel_size\": 3}", ""),
               "layer 0 (conv2d)", "key 'filters' must be an integer");
    expect_bad("kernel.json",
               "{\"input_shape\": [2, 2, 1], \"layers\": [{\"type\": \"conv2d\", \"filters\": 4, \"kernel_size\": 3}]}",
               "layer 0 (conv2d)", "larger than the input");
    expect_bad("dropout.json", crew_text("{\"type\": \"dropout\", \"rate\": -0.1}", ""), "layer 0 (dropout)",
               "key 'rate'");
    expect_bad("layerkey.json", crew_text("{\"type\": \"dense\", \"units\": 4, \"unit\": 5}", ""), "layer 0 (dense)",
               "unknown key 'unit'");
    expect_bad("dup.json", crew_text("{\"type\": \"dense\", \"units\": 4, \"units\": 5}", ""), "layer 0 (dense)",
               "given twice");
    expect_bad("act.json", crew_text("{\"type\": \"dense\", \"units\": 4, \"activation\": \"swish\"}", ""),
               "layer 0 (dense)", "key 'activation'");
    expect_bad("softmax.json",
               crew_text("{\"type\": \"flatten\"}, {\"type\": \"activation\", \"activation\": \"softmax\"}, "
                         "{\"type\": \"dense\", \"units\": 2}",
                         ""),
               "layer 1 (activation)", "softmax");
    expect_bad("name.json", crew_text("{\"type\": \"flatten\", \"name\": \"a b\"}", ""), "layer 0 (flatten)",
               "key 'name'");
    /* The index is the file's: two dense layers with activations are four model layers. */
    expect_bad("index.json",
               "{\"input_shape\": [4], \"layers\": [{\"type\": \"dense\", \"units\": 4, \"activation\": \"relu\"}, "
               "{\"type\": \"dense\", \"units\": 4, \"activation\": \"relu\"}, {\"type\": \"max_pool2d\"}]}",
               "layer 2 (max_pool2d)", "height, width, channels");
    expect_bad("params.json",
               "{\"input_shape\": [16], \"layers\": [{\"type\": \"dense\", \"units\": 16777216}, "
               "{\"type\": \"dense\", \"units\": 16777216}]}",
               "layer 1 (dense)", "parameters");
    expect_bad("shape.json", "{\"input_shape\": [28, 0], \"layers\": [{\"type\": \"flatten\"}]}", "input_shape",
               "axis 1");
    expect_bad("noshape.json", "{\"layers\": [{\"type\": \"flatten\"}]}", "missing key 'input_shape'", NULL);
    expect_bad("nolayers.json", "{\"input_shape\": [3], \"layers\": []}", "key 'layers'", NULL);
}

/* cJSON decodes \u0000 into a NUL and returns C strings, so "a\u0000b" would read as "a" and pass
 * the name rule (1-63 of A-Z a-z 0-9 _ . -) checked on what it returns. A NUL anywhere in a
 * string is refused before parsing, so every name is checked on all its decoded bytes. */
static void test_nul_in_strings(void)
{
    expect_bad("nulname.json", "{\"name\": \"a\\u0000b\", \"input_shape\": [3], \"layers\": [{\"type\": \"flatten\"}]}",
               "line 1, column 12", "\\u0000");
    expect_bad("nullayer.json", crew_text("{\"type\": \"flatten\", \"name\": \"f\\u0000../x\"}", ""), "\\u0000", NULL);
    expect_bad("nulonly.json", crew_text("{\"type\": \"flatten\", \"name\": \"\\u0000\"}", ""), "\\u0000", NULL);
    expect_bad("nultype.json", crew_text("{\"type\": \"flatten\\u0000junk\"}", ""), "\\u0000", NULL);
    expect_bad("nulkey.json", crew_text("{\"type\": \"dense\", \"units\": 4, \"units\\u0000\": 5}", ""), "\\u0000",
               NULL);
    expect_bad("nulline.json", "{\"input_shape\": [3],\n \"layers\": [{\"type\": \"flatten\",\n  \"name\": \"x\\u0000\"}]}",
               "line 3, column 13", NULL);
    expect_bad("nulkeras.json",
               keras_text("{\"class_name\": \"Flatten\", \"config\": {\"name\": \"flat\\u0000ten\"}}"), "\\u0000", NULL);
    /* Other escapes stay what they are: "\\u0000" is a backslash and "u0000", which the name rule
     * refuses as a backslash; in an ignored Keras string it is harmless. */
    expect_bad("backslash.json", crew_text("{\"type\": \"flatten\", \"name\": \"a\\\\u0000\"}", ""), "key 'name'",
               "a\\u0000");
    crew_model *m = load_ok(write_tmp("module.json", keras_text("{\"module\": \"keras\\\\u0000layers\", \"class_name\": "
                                                                "\"Flatten\", \"config\": {\"name\": \"f\"}}")));
    CHECK(m != NULL);
    crew_model_free(m);
    remove_tmp("module.json");
    /* The scanner alone: raw and escaped NULs, escaped quotes and backslashes, NULs outside strings. */
    int esc = -1;
    CHECK(crew_json_find_nul("{\"a\": \"b\"}", 10, &esc) == (size_t)-1);
    CHECK(crew_json_find_nul("\"\\u0000\"", 8, &esc) == 1 && esc == 1);
    CHECK(crew_json_find_nul("\"\\\\u0000\"", 9, &esc) == (size_t)-1);
    CHECK(crew_json_find_nul("\"\\\"\\u0000\"", 10, &esc) == 3 && esc == 1);
    CHECK(crew_json_find_nul("\"\\\\\\u0000\"", 10, &esc) == 3 && esc == 1);
    CHECK(crew_json_find_nul("\"\\u0001\" \\u0000", 15, &esc) == (size_t)-1); /* outside a string: JSON's error */
    CHECK(crew_json_find_nul("\"ab\0\"", 5, &esc) == 3 && esc == 0);
    CHECK(crew_json_find_nul("\"\\u000", 6, &esc) == (size_t)-1);
}

static void test_bad_crew_compile(void)
{
    const char *flat = "{\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 10}";
    expect_bad("optkey.json", crew_text(flat, "\"optimizer\": {\"type\": \"adamw\", \"lerning_rate\": 0.1}"),
               "optimizer", "unknown key 'lerning_rate'");
    expect_bad("lr0.json", crew_text(flat, "\"optimizer\": {\"type\": \"adamw\", \"lr\": 0}"), "optimizer",
               "key 'lr'");
    expect_bad("lrneg.json", crew_text(flat, "\"optimizer\": {\"type\": \"sgd\", \"lr\": -1}"), "optimizer",
               "key 'lr'");
    expect_bad("sgdbeta.json", crew_text(flat, "\"optimizer\": {\"type\": \"sgd\", \"beta1\": 0.5}"), "optimizer",
               "unknown key 'beta1'");
    expect_bad("opttype.json", crew_text(flat, "\"optimizer\": {\"type\": \"adam\"}"), "optimizer", "key 'type'");
    expect_bad("scaling.json", crew_text(flat, "\"optimizer\": {\"type\": \"adamw\", \"lr_scaling\": \"sqrt\"}"),
               "optimizer", "base_batch");
    expect_bad("sched.json",
               crew_text(flat, "\"optimizer\": {\"type\": \"adamw\", \"schedule\": {\"type\": \"step\"}}"), "schedule",
               "missing key 'step_size'");
    expect_bad("minlr.json",
               crew_text(flat, "\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.001, \"schedule\": {\"type\": "
                               "\"cosine\", \"min_lr\": 0.1}}"),
               "schedule", "min_lr");
    expect_bad("loss.json", crew_text(flat, "\"loss\": \"mse\""), "key 'loss'", NULL);
    expect_bad("epochs.json", crew_text(flat, "\"training\": {\"epochs\": 0}"), "training", "key 'epochs'");
    expect_bad("trainkey.json", crew_text(flat, "\"training\": {\"batch_size\": 32}"), "training",
               "unknown key 'batch_size'");
}

static void test_bad_keras_files(void)
{
    expect_bad("chfirst.json",
               keras_text("{\"class_name\": \"Conv2D\", \"config\": {\"name\": \"conv2d\", \"filters\": 4, "
                          "\"kernel_size\": [3, 3], \"data_format\": \"channels_first\"}}"),
               "layer 1 (conv2d)", "channels_first");
    expect_bad("lstm.json", keras_text("{\"class_name\": \"LSTM\", \"config\": {\"name\": \"lstm\", \"units\": 4}}"),
               "layer 1 (lstm)", "'LSTM' is not supported");
    expect_bad("dilation.json",
               keras_text("{\"class_name\": \"Conv2D\", \"config\": {\"filters\": 4, \"kernel_size\": 3, "
                          "\"dilation_rate\": [2, 2]}}"),
               "layer 1 (Conv2D)", "dilation_rate");
    expect_bad("groups.json",
               keras_text("{\"class_name\": \"Conv2D\", \"config\": {\"filters\": 4, \"kernel_size\": 3, "
                          "\"groups\": 3}}"),
               "layer 1", "groups");
    expect_bad("bnaxis.json", keras_text("{\"class_name\": \"BatchNormalization\", \"config\": {\"axis\": 1}}"),
               "layer 1", "key 'axis'");
    expect_bad("center.json", keras_text("{\"class_name\": \"LayerNormalization\", \"config\": {\"center\": false}}"),
               "layer 1", "key 'center'");
    expect_bad("reg.json",
               keras_text("{\"class_name\": \"Dense\", \"config\": {\"name\": \"d\", \"units\": 4, "
                          "\"kernel_regularizer\": {\"class_name\": \"L2\", \"config\": {\"l2\": 0.01}}}}"),
               "layer 1 (d)", "kernel_regularizer");
    expect_bad("kact.json",
               keras_text("{\"class_name\": \"Dense\", \"config\": {\"units\": 4, \"activation\": \"selu\"}}"),
               "layer 1", "key 'activation'");
    expect_bad("frozen.json",
               keras_text("{\"class_name\": \"Dense\", \"config\": {\"units\": 4, \"trainable\": false}}"), "layer 1",
               "trainable");
    expect_bad("mask.json",
               keras_text("{\"class_name\": \"Embedding\", \"config\": {\"input_dim\": 5, \"output_dim\": 2, "
                          "\"mask_zero\": true}}"),
               "layer 1", "mask_zero");
    expect_bad("kinput.json", keras_text("{\"class_name\": \"InputLayer\", \"config\": {\"batch_shape\": [null, 3]}}"),
               "layer 1", "InputLayer");
    expect_bad("functional.json", "{\"class_name\": \"Functional\", \"config\": {}}", "'config.layers' must be a list",
               NULL);
    expect_bad("subclassed.json", "{\"class_name\": \"MyModel\", \"config\": {}}", "'MyModel' is not supported",
               "Functional ones whose layers form one chain");
    expect_bad("noinput.json", "{\"class_name\": \"Sequential\", \"config\": {\"layers\": [{\"class_name\": "
                               "\"Dense\", \"config\": {\"units\": 2}}]}}",
               "no input shape", NULL);
}

static void test_io_and_api(void)
{
    crew_model *m = (crew_model *)1;
    crew_status s = crew_model_load_file("no/such/model.json", &m);
    CHECK(crew_status_code(s) == CREW_CODE_IO && m == NULL);
    CHECK(s && strstr(crew_status_message(s), "no/such/model.json") != NULL);
    crew_status_free(s);
    s = crew_model_load_file(tmp_dir, &m); /* a directory */
    CHECK(s != CREW_OK && m == NULL);
    crew_status_free(s);
    /* parse_json takes text that is not NUL-terminated. */
    const char text[] = "{\"input_shape\": [3], \"layers\": [{\"type\": \"dense\", \"units\": 2}]}GARBAGE";
    CHECK_OK(crew_model_parse_json(text, sizeof text - 1 - 7, "inline", &m));
    if (m) CHECK(crew_model_param_count(m) == 8);
    crew_model_free(m);
    CHECK_ERR(crew_model_parse_json(text, sizeof text - 1, "inline", &m), "inline: not valid JSON");
    CHECK_ERR(crew_model_parse_json("{\"a\"\0}", 6, "nul", &m), "NUL");
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/crew_model_file_XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fashion_mlp();
    test_fashion_cnn();
    test_minimal_and_options();
    test_keras_fixtures();
    test_keras_functional();
    test_layerwise_optimizers();
    test_keras_compile_unmapped();
    test_bad_crew_files();
    test_nul_in_strings();
    test_bad_crew_compile();
    test_bad_keras_files();
    test_io_and_api();
    rmdir(tmp_dir);
    return check_report();
}
