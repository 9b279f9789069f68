/* bench_conv.c — each convolution of a model file, both ways a device can run it: im2col + GEMM (the
 * layer's chunks) and the device's convolution library (cuDNN), a forward and a backward pass at
 * one micro-batch, and which was faster, layer shape by layer shape.
 *
 *   bench_conv MODEL.json [--kind cuda] [--batch B] [--precision fp32|bf16]
 *
 * It is crew_conv_choose measuring anew (the figures --conv auto takes, without the cache): the
 * layers' own code on a replica of the model on one device of the kind. A kind without a library
 * (the CPU kinds) gets no figures. Prints one line per layer, then one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crew.h"

typedef struct args {
    const char *model, *kind;
    int64_t batch;
    int precision;
} args;

static int parse(int argc, char **argv, args *a)
{
    *a = (args){.kind = "cuda", .batch = 64, .precision = CREW_PRECISION_FP32};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kind") && i + 1 < argc)
            a->kind = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            a->batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc)
            a->precision = !strcmp(argv[++i], "bf16") ? CREW_PRECISION_BF16 : CREW_PRECISION_FP32;
        else if (argv[i][0] != '-' && !a->model)
            a->model = argv[i];
        else
            return 0;
    }
    return a->model && a->batch > 0;
}

int main(int argc, char **argv)
{
    args a;
    if (!parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench_conv MODEL.json [--kind cuda] [--batch B] [--precision fp32|bf16]\n");
        return 2;
    }
    crew_model *m = NULL;
    crew_conv_choice *c = calloc(1, sizeof *c);
    crew_status s = c ? crew_model_load_file(a.model, &m) : NULL;
    if (!c) {
        fprintf(stderr, "bench_conv: out of memory\n");
        return 1;
    }
    if (!s) s = crew_conv_choose(m, a.kind, a.batch, a.precision, NULL, 2, c);
    if (s) {
        fprintf(stderr, "bench_conv: %s\n", crew_status_message(s));
        crew_status_free(s);
        crew_model_free(m);
        free(c);
        return 1;
    }
    if (!c->library[0]) printf("%s has no convolution library: its convolutions are im2col + GEMM\n", a.kind);
    printf("%-14s %-40s %12s %12s  %s\n", "layer", "shape", "im2col ms", "library ms", "faster");
    for (int i = 0; i < c->n; i++) {
        const crew_conv_layer_choice *l = &c->layers[i];
        char lib[32] = "-";
        if (l->measured && l->supported) snprintf(lib, sizeof lib, "%.3f", 1e3 * l->library_s);
        printf("%-14s %-40s %12.3f %12s  %s\n", l->name, l->shape, 1e3 * l->im2col_s, lib,
               l->by_library ? "library" : "im2col");
    }
    printf("{\"kind\":\"%s\",\"library\":\"%s\",\"batch\":%lld,\"precision\":\"%s\",\"layers\":[", a.kind, c->library,
           (long long)a.batch, a.precision == CREW_PRECISION_BF16 ? "bf16" : "fp32");
    for (int i = 0; i < c->n; i++) {
        const crew_conv_layer_choice *l = &c->layers[i];
        printf("%s{\"layer\":\"%s\",\"shape\":\"%s\",\"im2col_s\":%.6g,\"library_s\":%.6g,\"faster\":\"%s\"}",
               i ? "," : "", l->name, l->shape, l->im2col_s, l->supported ? l->library_s : -1.0,
               l->by_library ? "library" : "im2col");
    }
    printf("]}\n");
    crew_model_free(m);
    free(c);
    return 0;
}
