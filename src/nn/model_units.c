/* model_units.c — the units a sharded replica gathers and reduce-scatters (ZeRO-2/3).
 *
 * A unit is a run of whole layers whose owned trainable parameters are contiguous in the flat
 * buffer (they are laid out in layer order). Units grow forward from the first layer until their
 * parameters reach the target size, so a transformer block (or a conv layer) is a unit of its
 * own and a layer norm joins its neighbour; layers without parameters belong to the unit before
 * them (the first unit starts at layer 0). A layer that another ties a parameter to (a GPT's
 * embedding) is a unit of its own: that unit stays gathered through the step. The result depends only on the model and the target,
 * never on the replica count, so every layout cuts the same units. */
#include "nn/model.h"

/* Layer l's owned trainable values (the tied ones are another layer's). */
static int64_t layer_params(const crew_layer *l)
{
    int64_t n = 0;
    for (int j = 0; j < l->n_params; j++)
        if (l->params[j].trainable && crew_param_owned(&l->params[j])) n += crew_shape_size(&l->params[j].shape);
    return n;
}

/* 1 when some tied parameter of the model points into layer i's parameters. */
static int is_tie_owner(const crew_model *m, int i)
{
    for (int a = 0; a < m->n_layers; a++)
        for (int j = 0; j < m->layers[a]->n_params; j++)
            if (m->layers[a]->params[j].tied && m->layers[a]->params[j].tie_layer == i) return 1;
    return 0;
}

/* The offsets are counted here as the layout assigns them (owned trainable values in layer order),
 * so that a model that is neither laid out nor counted (the memory planner's) has the same units. */
int crew_model_units(const crew_model *m, int64_t target, crew_unit *out, int cap)
{
    int n = 0, closed = 1; /* closed: the next layer with parameters starts a unit */
    int64_t size = 0, at = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const int64_t np = layer_params(m->layers[i]);
        const int owner = np > 0 && is_tie_owner(m, i);
        if (n == 0 || (np > 0 && (closed || size >= target || owner))) {
            if (n < cap) out[n] = (crew_unit){.first = i, .end = i + 1, .lo = at, .hi = at, .pinned = owner};
            n++;
            size = 0;
            closed = 0;
        }
        if (n - 1 < cap) {
            out[n - 1].end = i + 1;
            out[n - 1].hi = at + np;
            out[n - 1].pinned |= owner;
        }
        size += np;
        at += np;
        if (owner) closed = 1; /* a tied parameter's unit stays gathered through the step: alone, as small as it can be */
    }
    return n;
}

void crew_model_unit_widths(const crew_unit *units, int n, int64_t *widest, int64_t *pinned)
{
    *widest = *pinned = 0;
    for (int u = 0; u < n; u++) {
        const int64_t len = units[u].hi - units[u].lo;
        if (units[u].pinned) *pinned = len;
        else if (len > *widest) *widest = len;
    }
}

int crew_model_unit_of(const crew_unit *units, int n, int layer)
{
    for (int u = 0; u < n; u++)
        if (layer >= units[u].first && layer < units[u].end) return u;
    return -1;
}
