/* file_hash.h — size and XXH3-64 of a whole file, streamed. */
#ifndef CREW_CORE_FILE_HASH_H
#define CREW_CORE_FILE_HASH_H

#include <stdint.h>

#include "crew.h"

/* Opens path as crew_open_regular does (a FIFO, a device or a directory is refused, never read);
 * a file whose size changes while it is hashed is CREW_CODE_IO, naming the path. */
crew_status crew_file_hash(const char *path, int64_t *bytes, uint64_t *xxh3);

#endif
