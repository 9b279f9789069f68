/* safetensors.h — reading and writing safetensors files: an 8-byte little-endian header length,
 * a JSON header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"key": "value"}}, then the raw little-endian tensor bytes.
 * The format PyTorch, NumPy and Hugging Face tools read without executing code. */
#ifndef CREW_IO_SAFETENSORS_H
#define CREW_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"

#define CREW_ST_MAX_DIMS 8

typedef enum crew_st_dtype { CREW_ST_F32 = 1, CREW_ST_I32, CREW_ST_I64, CREW_ST_U8 } crew_st_dtype;

typedef struct crew_st_tensor {
    char name[128];
    crew_st_dtype dtype;
    int ndim;
    int64_t shape[CREW_ST_MAX_DIMS];
    int64_t count;        /* elements */
    const void *data;     /* into the file's bytes (reader) or the caller's (writer); the reader's
                           * may be unaligned: memcpy before reading values */
} crew_st_tensor;

/* A file read whole into memory, its header parsed and checked: every tensor's offsets inside
 * the data section, sizes matching dtype × shape, no overlaps. */
typedef struct crew_st_file {
    uint8_t *bytes;
    size_t len;
    crew_st_tensor *tensors;
    int n_tensors;
    /* Added with the implementation (src/io/safetensors.c): */
    int owns_bytes;       /* 1: bytes came from crew_st_read and crew_st_free frees them */
    char **metadata;      /* [2 * n_metadata]: key, value, key, value, ... from "__metadata__" */
    int n_metadata;
} crew_st_file;

/* Largest header accepted (the reference implementation's limit). */
#define CREW_ST_MAX_HEADER 100000000u

crew_status crew_st_read(const char *path, crew_st_file *out);
/* The same from memory (bytes are borrowed, not freed by crew_st_free). */
crew_status crew_st_parse(const uint8_t *bytes, size_t len, const char *what, crew_st_file *out);
const crew_st_tensor *crew_st_find(const crew_st_file *f, const char *name);
void crew_st_free(crew_st_file *f);
/* The "__metadata__" value for key, or NULL. */
const char *crew_st_metadata(const crew_st_file *f, const char *key);
/* Bytes per element: 4, 4, 8, 1; 0 for an unknown dtype. */
size_t crew_st_dtype_size(crew_st_dtype dtype);
/* "F32", ...; "?" for an unknown dtype. */
const char *crew_st_dtype_name(crew_st_dtype dtype);

/* Writes tensors atomically (temporary file, fsync, rename). metadata: NULL-terminated
 * key/value pairs ({"k1", "v1", "k2", "v2", NULL}) or NULL. */
crew_status crew_st_write(const char *path, const crew_st_tensor *tensors, int n, const char *const *metadata);

#endif
