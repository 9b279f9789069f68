/* test_conv_choice.c — the way each convolution layer computes (crew_conv_choose, the plan's
 * conv_choice), on cpu-remote, whose direct sums stand in for a GPU's library:
 * - measuring times both ways of every layer the library runs, and only im2col for a layer it
 *   does not (TensorFlow's uneven 'same' padding); the figures go to the cache, two lines a layer,
 *   and the next call takes them from there without measuring;
 * - the cache decides: figures written into it (the last line of a key wins) make the choice,
 *   lines that do not parse are skipped, and the key holds the micro-batch and the precision;
 * - measure 0 never measures; a kind without a library (cpu) chooses im2col and writes nothing;
 * - bad arguments are errors;
 * - the plan takes a list of ways as given (checked against the model and the kind), and without
 *   one resolves im2col, library and auto (never the stand-in for speed) per layer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "crew.h"
#include "synthetic.h"

/* conv 3x3 same (the stand-in runs it) → conv 2x2 same (uneven padding: it does not) → conv 3x3
 * valid → flatten → dense, on synthetic.h's 12x12 images. */
static crew_model *three_convs(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    if (!m) return NULL;
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 3, .kernel = {3, 3},
                                                  .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 4, .kernel = {2, 2},
                                                  .padding = CREW_PAD_SAME, .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_CONV2D, .filters = 2, .kernel = {3, 3},
                                                  .padding = CREW_PAD_VALID}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    return m;
}

static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    if (f) fclose(f);
    return n;
}

static void append(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The cache line of layer i's key `what` ("im2col", "library"): its key, from the file. */
static int key_of(const char *path, int layer_filters, const char *what, char *key, size_t len)
{
    FILE *f = fopen(path, "r");
    char line[512], f_part[32], w_part[32];
    int found = 0;
    snprintf(f_part, sizeof f_part, "|f%d|", layer_filters);
    snprintf(w_part, sizeof w_part, "|%s ", what);
    while (f && !found && fgets(line, sizeof line, f))
        if (strstr(line, f_part) && strstr(line, w_part)) {
            *strstr(line, w_part) = '\0';
            found = strlen(line) + strlen(what) + 2 <= len;
            if (found) snprintf(key, len, "%.*s|%s", (int)(len / 2), line, what);
        }
    if (f) fclose(f);
    return found;
}

static void test_measure_and_cache(const char *cache)
{
    crew_model *m = three_convs();
    crew_conv_choice c;
    /* nothing cached, nothing measured: im2col throughout */
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_FP32, cache, 0, &c));
    CHECK(c.n == 3 && strcmp(c.ways, "iii") == 0 && !c.layers[0].measured && access(cache, F_OK) != 0);
    CHECK(strstr(c.library, "direct sums") != NULL);
    /* the activations are layers of their own: conv2d_1 is the model's third */
    CHECK_MSG(strcmp(c.layers[1].name, "conv2d_1") == 0 && c.layers[1].layer == 2, "layer %d: %s", c.layers[1].layer,
              c.layers[1].name);
    CHECK_MSG(strstr(c.layers[0].shape, "12x12x1 -> 12x12x3, 3x3 stride 1") != NULL, "shape: %s", c.layers[0].shape);

    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_FP32, cache, 1, &c));
    for (int i = 0; i < 3; i++) {
        const crew_conv_layer_choice *l = &c.layers[i];
        CHECK_MSG(l->measured && !l->cached && l->im2col_s > 0, "layer %d not measured", i);
        CHECK_MSG(l->supported == (i != 1), "layer %d supported %d", i, l->supported);
        CHECK(l->supported ? l->library_s > 0 : l->library_s == 0);
        CHECK(l->by_library == (l->supported && l->library_s < l->im2col_s));
        CHECK(c.ways[i] == (l->by_library ? 'l' : 'i'));
    }
    CHECK_MSG(count_lines(cache, "conv|") == 6, "%d cache lines", count_lines(cache, "conv|"));
    CHECK(count_lines(cache, "|unsupported ") == 1 && count_lines(cache, "|f4|") == 2);
    const double first_im2col = c.layers[0].im2col_s;

    /* the second call reads what the first wrote */
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_FP32, cache, 1, &c));
    for (int i = 0; i < 3; i++) CHECK_MSG(c.layers[i].measured && c.layers[i].cached, "layer %d not from the cache", i);
    CHECK(fabs(c.layers[0].im2col_s - first_im2col) <= 1e-5 * first_im2col);
    CHECK(count_lines(cache, "conv|") == 6);

    /* figures written into the cache decide: the library far faster for layer 0, slower for 2 */
    char k0[1100], k2[1100], text[8192];
    CHECK(key_of(cache, 3, "library", k0, sizeof k0) && key_of(cache, 2, "library", k2, sizeof k2));
    snprintf(text, sizeof text, "%s 1e-08\n%s 1000\n", k0, k2);
    append(cache, text);
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_FP32, cache, 0, &c));
    CHECK_MSG(strcmp(c.ways, "lii") == 0, "ways '%s' from the cache", c.ways);
    /* lines that do not parse are skipped: the last good line of each key still decides */
    snprintf(text, sizeof text, "%s -3\n%s nan\n%s  1e-8\n%s 1e-08x\n%s\n%.40s 7\n\n", k2, k2, k2, k2, k2, k2);
    append(cache, text);
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_FP32, cache, 0, &c));
    CHECK_MSG(strcmp(c.ways, "lii") == 0, "ways '%s' after bad lines", c.ways);
    /* the key holds the micro-batch and the precision */
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 9, CREW_PRECISION_FP32, cache, 0, &c));
    CHECK(strcmp(c.ways, "iii") == 0 && !c.layers[0].measured);
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_BF16, cache, 0, &c));
    CHECK(strcmp(c.ways, "iii") == 0 && !c.layers[0].measured);
    /* measure 2: anew, whatever the cache holds (the library is slow here: im2col wins) */
    CHECK_OK(crew_conv_choose(m, "cpu-remote", 8, CREW_PRECISION_FP32, NULL, 2, &c));
    CHECK(!c.layers[0].cached && c.layers[0].measured);

    /* a kind without a library: im2col, nothing measured or written */
    const int lines = count_lines(cache, "conv|");
    CHECK_OK(crew_conv_choose(m, "cpu", 8, CREW_PRECISION_FP32, cache, 1, &c));
    CHECK(c.n == 3 && strcmp(c.ways, "iii") == 0 && c.library[0] == '\0' && !c.layers[0].measured);
    CHECK(count_lines(cache, "conv|") == lines);

    crew_status s = crew_conv_choose(m, "cpu-remote", 0, CREW_PRECISION_FP32, cache, 1, &c);
    CHECK(s && crew_status_code(s) == CREW_CODE_INVALID_ARGUMENT);
    crew_status_free(s);
    s = crew_conv_choose(m, "cpu-remote", 8, 7, cache, 1, &c);
    CHECK(s && strstr(crew_status_message(s), "precision 7"));
    crew_status_free(s);
    s = crew_conv_choose(m, "tpu", 8, CREW_PRECISION_FP32, cache, 1, &c);
    CHECK(s && strstr(crew_status_message(s), "unknown device kind 'tpu'"));
    crew_status_free(s);
    crew_model_free(m);
}

/* The plan's ways from the options, on a dataset of the model's shape. */
static crew_status plan_ways(crew_model *m, const crew_dataset *d, const char *kind, int conv, const char *choice,
                             crew_fit_plan *p)
{
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.device_kind = kind;
    o.conv = conv;
    o.conv_choice = choice;
    o.batch_per_device = 8;
    return crew_model_plan_fit(m, d, &o, p);
}

static void expect_plan_error(crew_model *m, const crew_dataset *d, const char *kind, int conv, const char *choice,
                              const char *needle)
{
    crew_fit_plan p;
    crew_status s = plan_ways(m, d, kind, conv, choice, &p);
    CHECK_MSG(s && strstr(crew_status_message(s), needle), "%s %d '%s': %s", kind, conv, choice ? choice : "(null)",
              crew_status_message(s));
    crew_status_free(s);
}

static void test_plan(const crew_dataset *d)
{
    crew_model *m = three_convs();
    crew_fit_plan p;
    CHECK_OK(plan_ways(m, d, "cpu-remote", CREW_CONV_AUTO, "lil", &p));
    CHECK(strcmp(p.conv_choice, "lil") == 0 && p.conv == CREW_CONV_AUTO);
    CHECK_OK(plan_ways(m, d, "cpu-remote", CREW_CONV_AUTO, NULL, &p));
    CHECK_MSG(strcmp(p.conv_choice, "iii") == 0, "auto on cpu-remote: '%s'", p.conv_choice);
    CHECK_OK(plan_ways(m, d, "cpu-remote", CREW_CONV_LIBRARY, NULL, &p));
    CHECK(strcmp(p.conv_choice, "lll") == 0 && p.conv == CREW_CONV_LIBRARY);
    CHECK_OK(plan_ways(m, d, "cpu", CREW_CONV_IM2COL, NULL, &p));
    CHECK(strcmp(p.conv_choice, "iii") == 0);
    CHECK_OK(plan_ways(m, d, "cpu", CREW_CONV_AUTO, "iii", &p));
    expect_plan_error(m, d, "cpu", CREW_CONV_AUTO, "lii", "--conv library on cpu: its devices have no convolution library");
    expect_plan_error(m, d, "cpu", CREW_CONV_LIBRARY, NULL, "--conv library on cpu");
    expect_plan_error(m, d, "cpu-remote", CREW_CONV_AUTO, "li", "3 of them");
    expect_plan_error(m, d, "cpu-remote", CREW_CONV_AUTO, "lxl", "expected one way per convolution layer");
    expect_plan_error(m, d, "cpu-remote", 9, NULL, "conv 9: expected auto, im2col or library");
    crew_model_free(m);
}

int main(void)
{
    char dir[] = "/tmp/crew-test-conv-XXXXXX", data[300], cache[400];
    if (syn_make_dataset(dir, 64, data, sizeof data) != 0) {
        CHECK_MSG(0, "could not make the synthetic dataset");
        return check_report();
    }
    snprintf(cache, sizeof cache, "%s/peaks", dir);
    test_measure_and_cache(cache);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) test_plan(d);
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
