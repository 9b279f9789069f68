/* shape.h — the shape of one sample (no batch axis) flowing between layers. */
#ifndef CREW_CORE_SHAPE_H
#define CREW_CORE_SHAPE_H

#include <stdint.h>
#include <stdio.h>

#define CREW_MAX_DIMS 4

typedef struct crew_shape {
    int ndim;                    /* 1..CREW_MAX_DIMS */
    int64_t dim[CREW_MAX_DIMS];  /* e.g. {H, W, C} for an image, {F} for features */
} crew_shape;

static inline int64_t crew_shape_size(const crew_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dim[i];
    return n;
}

static inline crew_shape crew_shape1(int64_t a) { return (crew_shape){1, {a, 0, 0, 0}}; }
static inline crew_shape crew_shape3(int64_t a, int64_t b, int64_t c)
{
    return (crew_shape){3, {a, b, c, 0}};
}

/* "(28, 28, 1)" */
static inline void crew_shape_format(const crew_shape *s, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < s->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)s->dim[i]);
    if (used < len) snprintf(buf + used, len - used, s->ndim == 1 ? ",)" : ")");
}

#endif
