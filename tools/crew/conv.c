/* conv.c — --conv for crew train, verify and scale: the way each convolution layer computes, and
 * for --conv auto on a GPU the measurement per layer shape, kept in the figures' cache so that
 * every run on the machine chooses alike (crew_conv_choose). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *const cli_conv_ways[] = {"auto", "im2col", "library", NULL};

/* One way's name: "im2col" or "library" ("cudnn" is the library's name on a GPU): 'i', 'l' or 0. */
static char way_letter(const char *w, size_t n)
{
    if (n == 6 && !strncmp(w, "im2col", n)) return 'i';
    if ((n == 7 && !strncmp(w, "library", n)) || (n == 5 && !strncmp(w, "cudnn", n))) return 'l';
    return 0;
}

int cli_parse_conv(const char *verb, const char *text, cli_conv *out)
{
    out->way = -1;
    out->ways[0] = '\0';
    if (!strcmp(text, "auto")) {
        out->way = CREW_CONV_AUTO;
        return 1;
    }
    if (!strchr(text, ',')) {
        char w = way_letter(text, strlen(text));
        if (w) {
            out->way = w == 'l' ? CREW_CONV_LIBRARY : CREW_CONV_IM2COL;
            return 1;
        }
    } else {
        size_t n = 0;
        for (const char *p = text;; p++) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            char w = way_letter(p, len);
            if (!w || n == CREW_MAX_CONV_LAYERS) break;
            out->ways[n++] = w;
            if (!end) {
                out->ways[n] = '\0';
                return 1;
            }
            p = end;
        }
        out->ways[0] = '\0';
    }
    cli_usage_error(verb, "--conv takes auto, im2col, library (cudnn) or one of im2col|library per convolution "
                    "layer, comma-separated (at most %d), got '%.60s'", CREW_MAX_CONV_LAYERS, text);
    return 0;
}

int cli_conv_apply(const char *verb, const cli_conv *c, crew_model *m, int measure, crew_fit_options *o,
                   crew_conv_choice **table)
{
    *table = NULL;
    if (c->way >= 0) o->conv = c->way;
    if (c->ways[0]) {
        o->conv_choice = c->ways;
        return 0;
    }
    int measured = 0;
    if (!measure || o->conv != CREW_CONV_AUTO || !crew_device_kind_conv_library(o->device_kind, &measured) || !measured)
        return 0; /* the plan resolves it: the way asked, or im2col */
    crew_conv_choice *t = calloc(1, sizeof *t);
    if (!t) {
        fprintf(stderr, "crew %s: no memory for the convolutions' choice\n", verb);
        return 1;
    }
    char path[4096];
    const char *cache = crew_cache_path(path, sizeof path) ? path : NULL;
    crew_status s = crew_conv_choose(m, o->device_kind, o->batch_per_device, o->precision, cache, 1, t);
    if (s || t->n == 0) {
        free(t);
        return s ? cli_fail(verb, s) : 0;
    }
    o->conv_choice = t->ways;
    *table = t;
    return 0;
}

void cli_print_conv_choice(const crew_conv_choice *t, int64_t rows)
{
    if (t->unavailable[0]) {
        printf("      convolutions (--conv auto): im2col + GEMM, %s would not open: %s\n", t->library, t->unavailable);
        return;
    }
    printf("      convolutions (--conv auto): %s against im2col + GEMM, a forward and backward pass of %lld samples\n",
           t->library, (long long)rows);
    for (int i = 0; i < t->n; i++) {
        const crew_conv_layer_choice *c = &t->layers[i];
        char lib[48];
        if (c->supported)
            snprintf(lib, sizeof lib, "%.3f ms", 1e3 * c->library_s);
        else
            snprintf(lib, sizeof lib, "does not run it");
        printf("        %-14s %-40s im2col %.3f ms, %s %s: %s%s\n", c->name, c->shape, 1e3 * c->im2col_s, t->library, lib,
               c->by_library ? t->library : "im2col", c->cached ? " (cached)" : "");
    }
}
