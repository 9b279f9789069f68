/* model_file.h — reading model files: crew's JSON format (model_file.c) and Keras 3
 * Sequential model.to_json() (model_file_keras.c). Internal; the public entry point is
 * crew_model_load_file in crew.h.
 *
 * Every error is one line: "<file>: <scope>: <what is wrong>", where the scope names the layer
 * ("layer 2 (conv2d)") or the section ("optimizer", "training") and the message names the key.
 * The typed readers below live in model_file_json.c. */
#ifndef CREW_IO_MODEL_FILE_H
#define CREW_IO_MODEL_FILE_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "core/status.h"
#include "crew.h"
#include "nn/model.h"
#include "optim/optimizer.h" /* the compile section is checked as crew_model_compile checks it */

/* Limits that keep a hostile file from asking for absurd sizes or slow builds. */
#define CREW_MF_MAX_FILE_BYTES (16 << 20)      /* a model file is a few KiB */
#define CREW_MF_MAX_LAYERS 256                 /* entries in a file's layer list */
#define CREW_MF_MAX_SIZE (1 << 24)             /* units, filters, any axis, vocabulary, ... */
#define CREW_MF_MAX_WINDOW 4096                /* kernel, pool and stride sides */
#define CREW_MF_MAX_SAMPLE ((int64_t)1 << 28)  /* values in one sample at any layer's output */
#define CREW_MF_MAX_PARAMS ((int64_t)1 << 32)  /* parameters and state values of the model */

/* Builds a model from a parsed crew-format root object / Keras Sequential root object. */
crew_status crew_model_from_crew_json(const cJSON *root, const char *what, crew_model **out);
crew_status crew_model_from_keras_json(const cJSON *root, const char *what, crew_model **out);

/* ------------------------------------------------------------------ helpers shared by both */

/* Where a value sits, for messages. */
typedef struct crew_mf_where {
    const char *file;  /* the path (or name) of the file */
    const char *scope; /* "layer 2 (conv2d)", "optimizer", ...; "" at the top level */
    int null_is_absent; /* Keras writes null for "use the default"; crew's format calls it an error */
} crew_mf_where;

/* "<file>: <scope>: <message>" with code CREW_CODE_BAD_INPUT. */
crew_status crew_mf_error(const crew_mf_where *w, const char *fmt, ...) CREW_PRINTF(2, 3);

/* A printable, length-limited copy of a string from the file, for messages. */
void crew_mf_quote(const char *s, char *buf, size_t len);

/* The item under key, or NULL when absent (or null, where null_is_absent). */
const cJSON *crew_mf_get(const crew_mf_where *w, const cJSON *obj, const char *key);

/* Fails on any key of obj that is not in keys[0..n), and on a key given twice. */
crew_status crew_mf_known_keys(const crew_mf_where *w, const cJSON *obj, const char *const *keys, int n);

/* Typed readers. Each leaves *out unchanged when the key is absent and fails with a message
 * naming the key on a wrong type or an out-of-range value. `required` makes absence an error. */
crew_status crew_mf_int(const crew_mf_where *w, const cJSON *obj, const char *key, int required, int64_t lo,
                        int64_t hi, int64_t *out);
/* A finite number in the interval described by bounds: "[]", "[)", "(]" or "()". */
crew_status crew_mf_real(const crew_mf_where *w, const cJSON *obj, const char *key, int required, double lo,
                         double hi, const char *bounds, double *out);
crew_status crew_mf_bool(const crew_mf_where *w, const cJSON *obj, const char *key, int *out);
crew_status crew_mf_string(const crew_mf_where *w, const cJSON *obj, const char *key, int required,
                           const char **out);
/* An integer or a list of two integers in [1, hi]: kernel_size, strides, pool_size. */
crew_status crew_mf_pair(const crew_mf_where *w, const cJSON *obj, const char *key, int required, int hi,
                         int out[2]);
/* One of the names in names[0..n), mapped to values[i]. */
crew_status crew_mf_enum(const crew_mf_where *w, const cJSON *obj, const char *key, int required,
                         const char *const *names, const int *values, int n, int *out);
/* "linear", "relu", "gelu", "tanh", "sigmoid", "softmax". */
crew_status crew_mf_activation(const crew_mf_where *w, const cJSON *obj, const char *key, int required,
                               crew_activation *out);
/* "valid" or "same". */
crew_status crew_mf_padding(const crew_mf_where *w, const cJSON *obj, const char *key, crew_padding *out);
/* A model or layer name: 1 to 63 characters of [A-Za-z0-9_.-]. */
crew_status crew_mf_name(const crew_mf_where *w, const cJSON *obj, const char *key, const char **out);
/* Input shape axes: a list of 1..3 integers in [1, 2^24] whose product is at most
 * CREW_MF_MAX_SAMPLE. skip_first drops a leading batch axis (null or a number). */
crew_status crew_mf_shape(const crew_mf_where *w, const cJSON *arr, const char *key, int skip_first,
                          int64_t dims[3], int *ndim);

/* Appends one layer. An error from crew_model_add is re-labelled with the file and the layer's
 * index in the file (the model's own index counts fused activations too, so it can differ).
 * Also checks the new layers' output and parameter sizes against the limits above. */
crew_status crew_mf_add_layer(crew_model *m, const crew_layer_spec *spec, const crew_mf_where *w);

/* Checks and completes an optimizer spec built from a file (crew_optimizer_spec_check). */
crew_status crew_mf_check_optimizer(const crew_mf_where *w, crew_optimizer_spec *spec);

/* The "gpt" block (model_file_gpt.c): whether a layer entry is one, the context it declares, and
 * its layers appended to m (which must have none yet and take [context] as input). */
int crew_mf_is_gpt(const cJSON *item);
crew_status crew_mf_gpt_context(const crew_mf_where *w, const cJSON *item, int64_t *context);
crew_status crew_mf_add_gpt(crew_model *m, const cJSON *item, const crew_mf_where *w);

#endif
