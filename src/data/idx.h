/* idx.h — MNIST-style IDX files (LeCun's format), gzipped or raw.
 *
 * An IDX file is: two zero bytes, a type byte (0x08 = unsigned byte), a byte giving the number of
 * dimensions, one big-endian uint32 per dimension, then the elements in row-major order. Labels
 * are 0x00000801 ([N]) and images 0x00000803 ([N, rows, cols]). Only unsigned-byte files are
 * read: that is what every MNIST-family dataset ships. */
#ifndef CREW_DATA_IDX_H
#define CREW_DATA_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"

#define CREW_IDX_MAX_DIMS 4
/* Refuse payloads over 4 GiB: no MNIST-style file comes near, and it stops a hostile header
 * from making the reader allocate absurdly. */
#define CREW_IDX_MAX_BYTES ((int64_t)4 << 30)

typedef struct crew_idx {
    int ndim;                        /* 1..CREW_IDX_MAX_DIMS */
    int64_t dims[CREW_IDX_MAX_DIMS]; /* e.g. {60000, 28, 28} */
    int64_t count;                   /* elements: the product of dims */
    uint8_t *data;                   /* [count] unsigned bytes, malloc'd; crew_idx_free releases */
} crew_idx;

/* Reads and checks a whole IDX file; gzip (magic 1f 8b) is detected and inflated. */
crew_status crew_idx_read(const char *path, crew_idx *out);
/* The same from bytes in memory; `what` names the source in error messages. */
crew_status crew_idx_parse(const void *buf, size_t len, const char *what, crew_idx *out);
void crew_idx_free(crew_idx *x);

#endif
