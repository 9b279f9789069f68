/* npy.h — NumPy .npy files (format versions 1.0, 2.0 and 3.0): reading by memory map, writing.
 * Only little-endian C-order arrays of the dtypes crew uses. Every malformed header, a dtype or
 * shape the caller did not expect, and a file shorter than its header promises is an error
 * naming the file. */
#ifndef CREW_DATA_NPY_H
#define CREW_DATA_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"

typedef enum crew_npy_dtype {
    CREW_DTYPE_U8 = 1,  /* '|u1' */
    CREW_DTYPE_I32,     /* '<i4' */
    CREW_DTYPE_F32,     /* '<f4' */
    CREW_DTYPE_U16,     /* '<u2' */
    CREW_DTYPE_I64,     /* '<i8' */
} crew_npy_dtype;

size_t crew_npy_dtype_size(crew_npy_dtype t);
const char *crew_npy_dtype_descr(crew_npy_dtype t); /* "|u1", "<f4", ... */
const char *crew_npy_dtype_name(crew_npy_dtype t);  /* "uint8", "float32", ... as manifest.json spells them */
/* The dtype named "uint8", "int32", "float32", "uint16" or "int64": 1, else 0. */
int crew_npy_dtype_from_name(const char *name, crew_npy_dtype *out);

#define CREW_NPY_MAX_DIMS 8

typedef struct crew_npy {
    crew_npy_dtype dtype;
    int ndim;
    int64_t shape[CREW_NPY_MAX_DIMS];
    int64_t count;          /* elements */
    const void *data;       /* into the mapping */
    void *map;              /* whole file mapping */
    size_t map_len;
} crew_npy;

/* Maps path read-only and parses its header. */
crew_status crew_npy_open(const char *path, crew_npy *out);
/* Parses a .npy image already in memory (no copy: out->data points into buf). */
crew_status crew_npy_parse(const void *buf, size_t len, const char *what, crew_npy *out);
void crew_npy_close(crew_npy *a);

/* Writes an array to path (the caller handles atomicity of the directory). */
crew_status crew_npy_write(const char *path, crew_npy_dtype dtype, int ndim, const int64_t *shape, const void *data);

#endif
