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

crew_status crew_model_flops(const crew_model *m, crew_flops *out)
{
    if (!m || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_model_flops: NULL argument");
    *out = (crew_flops){0};
    for (int i = 0; i < m->n_layers; i++) {
        const crew_layer *l = m->layers[i];
        double f;
        if (l->spec.type == CREW_LAYER_DENSE || l->spec.type == CREW_LAYER_CONV2D) {
            f = 2.0 * gemm_macs(l);
        } else if (l->spec.type == CREW_LAYER_TRANSFORMER_BLOCK) {
            /* per sample of T positions, width C: the four dense GEMMs (C·3C + C·C + C·4C + 4C·C
             * multiply-adds a position) and attention's q·kᵀ and att·v, each T × T × C (over the
             * whole square, as the backends compute it) */
            double T = (double)l->in.dim[0], C = (double)l->in.dim[1];
            f = 2.0 * (T * 12.0 * C * C + 2.0 * T * T * C);
        } else if (l->spec.type == CREW_LAYER_LM_HEAD) {
            f = 2.0 * (double)crew_shape_size(&l->out) * (double)l->spec.dim; /* [T, C] · [C, V] */
        } else {
            continue;
        }
        out->forward += f;
        out->backward += f * (l->needs_input_grad ? 2.0 : 1.0); /* dW, and dX where it is needed */
    }
    out->total = out->forward + out->backward;
    return CREW_OK;
}
