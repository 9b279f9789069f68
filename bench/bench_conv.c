/* bench_conv.c — each convolution of a model file, both ways a device can run it: im2col + GEMM (the
 * layer's chunks) and the device's convolution library (cuDNN: --conv cudnn), forward and backward
 * at one batch, and which was faster, layer shape by layer shape.
 *
 *   bench_conv MODEL.json [--kind cuda] [--batch B] [--reps R]
 *
 * It runs the layers' own code (the conv layer's forward and backward on a replica of the model
 * on the device), so what it times is what training runs. A kind without a library (the CPU
 * kinds) gets the im2col column alone. Prints one line per layer, then one JSON line. The choice
 * per shape that crew could make from these figures is not made yet (docs/GPU.md): --conv cudnn
 * asks for the library wherever it runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "core/timer.h"
#include "crew.h"
#include "nn/model.h"

typedef struct args {
    const char *model, *kind;
    int64_t batch;
    int reps;
} args;

static int parse(int argc, char **argv, args *a)
{
    *a = (args){.kind = "cuda", .batch = 64, .reps = 20};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kind") && i + 1 < argc)
            a->kind = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            a->batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            a->reps = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !a->model)
            a->model = argv[i];
        else
            return 0;
    }
    return a->model && a->batch > 0 && a->reps > 0;
}

/* Seconds per forward + backward of layer i of the replica r, its buffers made here. */
static crew_status time_layer(crew_model *r, int i, int64_t batch, int reps, double *seconds)
{
    const crew_backend *be = &r->be;
    crew_layer *l = r->layers[i];
    const int64_t nx = batch * crew_shape_size(&l->in), ny = batch * crew_shape_size(&l->out);
    float *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
    crew_status s = crew_dev_alloc_f32(be, nx, &x);
    if (!s) s = crew_dev_alloc_f32(be, ny, &y);
    if (!s) s = crew_dev_alloc_f32(be, ny, &dy);
    if (!s) s = crew_dev_alloc_f32(be, nx, &dx);
    if (!s) {
        be->ops->fill(be->ctx, x, 0.5f, nx);
        be->ops->fill(be->ctx, dy, 0.25f, ny);
    }
    crew_pass p = {.be = be, .rows = batch, .training = 1, .total_rows = (double)batch};
    double t0 = 0.0;
    for (int k = -3; k < reps && !s; k++) { /* three warm-up rounds: the library picks its algorithms */
        if (k == 0) {
            s = be->ops->sync(be->ctx, NULL);
            t0 = crew_now();
        }
        if (!s) s = l->ops->forward(l, &p, x, y);
        if (!s) s = l->ops->backward(l, &p, x, y, dy, dx);
    }
    if (!s) s = be->ops->sync(be->ctx, NULL);
    *seconds = (crew_now() - t0) / reps;
    crew_dev_free(be, x);
    crew_dev_free(be, y);
    crew_dev_free(be, dy);
    crew_dev_free(be, dx);
    return s;
}

/* A replica of m on a device of the kind, with or without its convolution library. */
static crew_status replica(const crew_model *m, const char *kind, int library, int64_t batch, crew_backend *be,
                           crew_model **out)
{
    crew_device_options o = {.blas_threads = 1, .conv_library = library};
    CREW_TRY(crew_device_open(kind, 0, &o, be));
    crew_status s = crew_model_clone(m, be, out);
    if (!s) s = crew_model_reserve(*out, batch);
    return s;
}

int main(int argc, char **argv)
{
    args a;
    if (!parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench_conv MODEL.json [--kind cuda] [--batch B] [--reps R]\n");
        return 2;
    }
    crew_model *m = NULL, *plain = NULL, *lib = NULL;
    crew_backend be_plain = {0}, be_lib = {0};
    crew_status s = crew_model_load_file(a.model, &m);
    if (!s) s = crew_model_layout(m);
    if (!s) s = crew_model_init_params(m, 1);
    if (!s) s = replica(m, a.kind, 0, a.batch, &be_plain, &plain);
    crew_status no_lib = s ? CREW_OK : replica(m, a.kind, 1, a.batch, &be_lib, &lib);
    if (s) {
        fprintf(stderr, "bench_conv: %s\n", crew_status_message(s));
        return 1;
    }
    if (no_lib) printf("%s has no convolution library here: %s\n", a.kind, crew_status_message(no_lib));
    printf("%-12s %-28s %12s %12s  %s\n", "layer", "shape (in -> filters, window)", "im2col ms", "library ms",
           "faster");
    char json[4096];
    size_t used = (size_t)snprintf(json, sizeof json, "{\"kind\":\"%s\",\"batch\":%lld,\"layers\":[", a.kind,
                                   (long long)a.batch);
    int first = 1;
    for (int i = 0; i < m->n_layers && !s; i++) {
        const crew_layer *l = m->layers[i];
        if (l->spec.type != CREW_LAYER_CONV2D) continue;
        double t_plain = 0.0, t_lib = 0.0;
        s = time_layer(plain, i, a.batch, a.reps, &t_plain);
        if (!s && lib) s = time_layer(lib, i, a.batch, a.reps, &t_lib);
        if (s) break;
        char shape[64];
        snprintf(shape, sizeof shape, "%lldx%lldx%lld -> %lld, %lldx%lld", (long long)l->in.dim[0],
                 (long long)l->in.dim[1], (long long)l->in.dim[2], (long long)l->spec.filters,
                 (long long)l->spec.kernel[0], (long long)l->spec.kernel[1]);
        const int library_won = lib && t_lib < t_plain;
        char lib_ms[32] = "-";
        if (lib) snprintf(lib_ms, sizeof lib_ms, "%.3f", 1e3 * t_lib);
        printf("%-12s %-28s %12.3f %12s  %s\n", l->name, shape, 1e3 * t_plain, lib_ms,
               library_won ? "library" : "im2col");
        if (used < sizeof json)
            used += (size_t)snprintf(json + used, sizeof json - used,
                                     "%s{\"layer\":\"%s\",\"shape\":\"%s\",\"im2col_s\":%.6g,\"library_s\":%.6g,"
                                     "\"faster\":\"%s\"}", first ? "" : ",", l->name, shape, t_plain,
                                     lib ? t_lib : -1.0, library_won ? "library" : "im2col");
        first = 0;
    }
    if (s) fprintf(stderr, "bench_conv: %s\n", crew_status_message(s));
    else if (used < sizeof json) printf("%s]}\n", json);
    crew_model_free(plain);
    crew_model_free(lib);
    crew_model_free(m);
    crew_device_close(&be_plain);
    crew_device_close(&be_lib);
    crew_status_free(no_lib);
    return s ? 1 : 0;
}
