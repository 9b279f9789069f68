/* model_file_json.c — typed, range-checked reads of JSON values for the model-file parsers, and
 * the errors they make: one line naming the file, the scope (layer or section) and the key. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "io/model_file.h"

crew_status crew_mf_error(const crew_mf_where *w, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *scope = w->scope ? w->scope : "";
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s%s%s", w->file, scope, scope[0] ? ": " : "", msg);
}

void crew_mf_quote(const char *s, char *buf, size_t len)
{
    if (len == 0) return;
    buf[0] = '\0';
    if (!s || len < 5) return;
    size_t max = len - 4 < 40 ? len - 4 : 40; /* enough to recognise a typo; room for "..." */
    size_t i = 0;
    for (; s[i] && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (s[i])
        memcpy(buf + i, "...", 4);
    else
        buf[i] = '\0';
}

/* "a string", "a number", ... for "must be X, got Y" messages. */
static const char *kind_of(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "true/false";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "a list";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

const cJSON *crew_mf_get(const crew_mf_where *w, const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v && w->null_is_absent && cJSON_IsNull(v)) return NULL;
    return v;
}

static crew_status missing(const crew_mf_where *w, const char *key)
{
    return crew_mf_error(w, "missing key '%s'", key);
}

crew_status crew_mf_known_keys(const crew_mf_where *w, const cJSON *obj, const char *const *keys, int n)
{
    unsigned long long seen = 0; /* one bit per known key; n <= 64 */
    for (const cJSON *c = obj->child; c; c = c->next) {
        int k = 0;
        while (k < n && !(c->string && strcmp(c->string, keys[k]) == 0)) k++;
        char q[64];
        crew_mf_quote(c->string, q, sizeof q);
        if (k == n) {
            char list[512];
            size_t used = 0;
            list[0] = '\0';
            for (int i = 0; i < n && used < sizeof list; i++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", keys[i]);
            return crew_mf_error(w, "unknown key '%s' (known: %s)", q, list);
        }
        if (k < 64 && (seen >> k & 1ull)) return crew_mf_error(w, "key '%s' is given twice", q);
        if (k < 64) seen |= 1ull << k;
    }
    return CREW_OK;
}

crew_status crew_mf_int(const crew_mf_where *w, const cJSON *obj, const char *key, int required, int64_t lo,
                        int64_t hi, int64_t *out)
{
    const cJSON *v = crew_mf_get(w, obj, key);
    if (!v) return required ? missing(w, key) : CREW_OK;
    if (!cJSON_IsNumber(v)) return crew_mf_error(w, "key '%s' must be an integer, got %s", key, kind_of(v));
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return crew_mf_error(w, "key '%s' must be an integer, got %g", key, d);
    if (d < (double)lo || d > (double)hi)
        return crew_mf_error(w, "key '%s' must be an integer in [%lld, %lld], got %.0f", key, (long long)lo,
                             (long long)hi, d);
    *out = (int64_t)d;
    return CREW_OK;
}

crew_status crew_mf_real(const crew_mf_where *w, const cJSON *obj, const char *key, int required, double lo,
                         double hi, const char *bounds, double *out)
{
    const cJSON *v = crew_mf_get(w, obj, key);
    if (!v) return required ? missing(w, key) : CREW_OK;
    if (!cJSON_IsNumber(v)) return crew_mf_error(w, "key '%s' must be a number, got %s", key, kind_of(v));
    double d = v->valuedouble;
    int low_ok = bounds[0] == '[' ? d >= lo : d > lo;
    int high_ok = bounds[1] == ']' ? d <= hi : d < hi;
    if (!isfinite(d) || !low_ok || !high_ok) {
        if (isinf(hi))
            return crew_mf_error(w, "key '%s' must be %s %g, got %g", key, bounds[0] == '[' ? ">=" : ">", lo, d);
        return crew_mf_error(w, "key '%s' must be in %c%g, %g%c, got %g", key, bounds[0], lo, hi, bounds[1], d);
    }
    if (fabs(d) > 3.4e38) return crew_mf_error(w, "key '%s' is too large for a float: %g", key, d);
    *out = d;
    return CREW_OK;
}

crew_status crew_mf_bool(const crew_mf_where *w, const cJSON *obj, const char *key, int *out)
{
    const cJSON *v = crew_mf_get(w, obj, key);
    if (!v) return CREW_OK;
    if (!cJSON_IsBool(v)) return crew_mf_error(w, "key '%s' must be true or false, got %s", key, kind_of(v));
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return CREW_OK;
}

crew_status crew_mf_string(const crew_mf_where *w, const cJSON *obj, const char *key, int required,
                           const char **out)
{
    const cJSON *v = crew_mf_get(w, obj, key);
    if (!v) return required ? missing(w, key) : CREW_OK;
    if (!cJSON_IsString(v) || !v->valuestring)
        return crew_mf_error(w, "key '%s' must be a string, got %s", key, kind_of(v));
    *out = v->valuestring;
    return CREW_OK;
}

static int pair_item(const cJSON *v, int hi, int *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < 1 || d > hi) return 0;
    *out = (int)d;
    return 1;
}

crew_status crew_mf_pair(const crew_mf_where *w, const cJSON *obj, const char *key, int required, int hi,
                         int out[2])
{
    const cJSON *v = crew_mf_get(w, obj, key);
    if (!v) return required ? missing(w, key) : CREW_OK;
    int a, b;
    if (cJSON_IsNumber(v) && pair_item(v, hi, &a)) {
        out[0] = out[1] = a;
        return CREW_OK;
    }
    if (cJSON_IsArray(v) && v->child && v->child->next && !v->child->next->next && pair_item(v->child, hi, &a) &&
        pair_item(v->child->next, hi, &b)) {
        out[0] = a;
        out[1] = b;
        return CREW_OK;
    }
    if (cJSON_IsNumber(v))
        return crew_mf_error(w, "key '%s' must be an integer in [1, %d], got %g", key, hi, v->valuedouble);
    return crew_mf_error(w, "key '%s' must be an integer or a list of two integers in [1, %d], got %s", key, hi,
                         kind_of(v));
}

crew_status crew_mf_enum(const crew_mf_where *w, const cJSON *obj, const char *key, int required,
                         const char *const *names, const int *values, int n, int *out)
{
    const char *s = NULL;
    CREW_TRY(crew_mf_string(w, obj, key, required, &s));
    if (!s) return CREW_OK;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = values[i];
            return CREW_OK;
        }
    char list[256], q[64];
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", i ? ", " : "", names[i]);
    crew_mf_quote(s, q, sizeof q);
    return crew_mf_error(w, "key '%s' must be one of %s, got '%s'", key, list, q);
}

crew_status crew_mf_activation(const crew_mf_where *w, const cJSON *obj, const char *key, int required,
                               crew_activation *out)
{
    static const char *const names[] = {"linear", "relu", "gelu", "tanh", "sigmoid", "softmax", "gelu_tanh"};
    static const int values[] = {CREW_ACT_NONE, CREW_ACT_RELU,    CREW_ACT_GELU,
                                 CREW_ACT_TANH, CREW_ACT_SIGMOID, CREW_ACT_SOFTMAX, CREW_ACT_GELU_TANH};
    int v = (int)*out;
    CREW_TRY(crew_mf_enum(w, obj, key, required, names, values, 7, &v));
    *out = (crew_activation)v;
    return CREW_OK;
}

crew_status crew_mf_padding(const crew_mf_where *w, const cJSON *obj, const char *key, crew_padding *out)
{
    static const char *const names[] = {"valid", "same"};
    static const int values[] = {CREW_PAD_VALID, CREW_PAD_SAME};
    int v = (int)*out;
    CREW_TRY(crew_mf_enum(w, obj, key, 0, names, values, 2, &v));
    *out = (crew_padding)v;
    return CREW_OK;
}

crew_status crew_mf_name(const crew_mf_where *w, const cJSON *obj, const char *key, const char **out)
{
    const char *s = NULL;
    CREW_TRY(crew_mf_string(w, obj, key, 0, &s));
    if (!s) return CREW_OK;
    size_t n = strlen(s);
    /* Layer names become safetensors keys "<name>.<param>": keep them plain. */
    int ok = n >= 1 && n <= 63;
    for (size_t i = 0; ok && i < n; i++) {
        char c = s[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
             c == '.';
    }
    if (!ok) {
        char q[64];
        crew_mf_quote(s, q, sizeof q);
        return crew_mf_error(w, "key '%s' must be 1 to 63 characters of A-Z a-z 0-9 _ . -, got '%s'", key, q);
    }
    *out = s;
    return CREW_OK;
}

crew_status crew_mf_shape(const crew_mf_where *w, const cJSON *arr, const char *key, int skip_first,
                          int64_t dims[3], int *ndim)
{
    if (!cJSON_IsArray(arr))
        return crew_mf_error(w, "key '%s' must be a list of integers, got %s", key, kind_of(arr));
    const cJSON *c = arr->child;
    if (skip_first) {
        if (!c || !(cJSON_IsNull(c) || cJSON_IsNumber(c)))
            return crew_mf_error(w, "key '%s' must start with the batch axis (null or a number)", key);
        c = c->next;
    }
    int n = 0;
    double size = 1.0;
    for (; c; c = c->next, n++) {
        if (n == 3) return crew_mf_error(w, "key '%s' has more than 3 axes (besides the batch axis)", key);
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble != floor(c->valuedouble) ||
            c->valuedouble < 1 || c->valuedouble > CREW_MF_MAX_SIZE)
            return crew_mf_error(w, "key '%s': axis %d must be an integer in [1, %d]", key, n, CREW_MF_MAX_SIZE);
        dims[n] = (int64_t)c->valuedouble;
        size *= c->valuedouble;
    }
    if (n == 0) return crew_mf_error(w, "key '%s' must have at least one axis", key);
    if (size > (double)CREW_MF_MAX_SAMPLE)
        return crew_mf_error(w, "key '%s' describes %.0f values per sample; at most %lld are supported", key, size,
                             (long long)CREW_MF_MAX_SAMPLE);
    *ndim = n;
    return CREW_OK;
}

/* ------------------------------------------------------------------ building */

/* Sizes as doubles: exact far beyond the limits, and they cannot overflow. */
static double shape_size(const crew_shape *s)
{
    double n = 1.0;
    for (int i = 0; i < s->ndim; i++) n *= (double)s->dim[i];
    return n;
}

static crew_status check_sizes(const crew_model *m, int first, const crew_mf_where *w)
{
    for (int i = first; i < m->n_layers; i++) {
        double out = shape_size(&m->layers[i]->out);
        if (out > (double)CREW_MF_MAX_SAMPLE)
            return crew_mf_error(w, "output of %.0f values per sample is more than the %lld supported", out,
                                 (long long)CREW_MF_MAX_SAMPLE);
    }
    double total = 0.0;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i]->n_params; j++)
            if (crew_param_owned(&m->layers[i]->params[j])) total += shape_size(&m->layers[i]->params[j].shape);
    if (total > (double)CREW_MF_MAX_PARAMS)
        return crew_mf_error(w, "the model reaches %.0f parameters; at most %lld are supported", total,
                             (long long)CREW_MF_MAX_PARAMS);
    return CREW_OK;
}

crew_status crew_mf_add_layer(crew_model *m, const crew_layer_spec *spec, const crew_mf_where *w)
{
    int first = m->n_layers;
    crew_status s = crew_model_add(m, spec);
    if (!s) return check_sizes(m, first, w);
    /* crew_model_add says "layer <model index> (<name>): ..."; keep only what follows. */
    const char *msg = crew_status_message(s);
    const char *rest = msg;
    if (strncmp(msg, "layer ", 6) == 0) {
        const char *colon = strstr(msg, ": ");
        if (colon) rest = colon + 2;
    }
    const char *scope = w->scope ? w->scope : "";
    crew_status e = crew_errorf(crew_status_code(s), "%s: %s%s%s", w->file, scope, scope[0] ? ": " : "", rest);
    crew_status_free(s);
    return e;
}

crew_status crew_mf_check_optimizer(const crew_mf_where *w, crew_optimizer_spec *spec)
{
    crew_status s = crew_optimizer_spec_check(spec);
    if (!s) return CREW_OK;
    /* Its messages already name the section and key ("optimizer: key 'lr' ..."). */
    crew_status e = crew_errorf(CREW_CODE_BAD_INPUT, "%s: %s", w->file, crew_status_message(s));
    crew_status_free(s);
    return e;
}
