/* model_flops.c — a model's FLOPs per sample, from its layers (crew_model_flops in crew.h). */
#include "core/status.h"
#include "nn/model.h"

/* Multiply-adds per sample of a GEMM layer's forward pass: each kernel value meets each position
 * of the output that shares it (dense: kernel [in, units], positions out / units; conv2d: kernel
 * [KH, KW, C, F], positions OH × OW). */
static double gemm_macs(const crew_layer *l)
{
    const crew_shape *k = &l->params[0].shape;
    int64_t channels = l->out.dim[l->out.ndim - 1];
    double positions = channels > 0 ? (double)crew_shape_size(&l->out) / (double)channels : 0.0;
    return (double)crew_shape_size(k) * positions;
}

/* Layer l's forward FLOPs per sample; 0 for a layer without GEMMs. */
static double forward_flops(const crew_layer *l)
{
    if (l->spec.type == CREW_LAYER_DENSE || l->spec.type == CREW_LAYER_CONV2D) return 2.0 * gemm_macs(l);
    if (l->spec.type == CREW_LAYER_TRANSFORMER_BLOCK) {
        /* per sample of T positions, width C: the four dense GEMMs (C·3C + C·C + C·4C + 4C·C
         * multiply-adds a position) and attention's q·kᵀ and att·v, each T × T × C (over the
         * whole square, as the backends compute it) */
        double T = (double)l->in.dim[0], C = (double)l->in.dim[1];
        return 2.0 * (T * 12.0 * C * C + 2.0 * T * T * C);
    }
    if (l->spec.type == CREW_LAYER_LM_HEAD)
        return 2.0 * (double)crew_shape_size(&l->out) * (double)l->spec.dim; /* [T, C] · [C, V] */
    return 0.0;
}

/* Backward: dW, and dX where it is needed. */
static double backward_flops(const crew_layer *l) { return forward_flops(l) * (l->needs_input_grad ? 2.0 : 1.0); }

double crew_model_layer_flops(const crew_model *m, int i)
{
    return forward_flops(m->layers[i]) + backward_flops(m->layers[i]);
}

crew_status crew_model_flops(const crew_model *m, crew_flops *out)
{
    if (!m || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_flops: NULL argument");
    *out = (crew_flops){0};
    for (int i = 0; i < m->n_layers; i++) {
        out->forward += forward_flops(m->layers[i]);
        out->backward += backward_flops(m->layers[i]);
    }
    out->total = out->forward + out->backward;
    return CREW_OK;
}
