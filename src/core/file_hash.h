/* file_hash.h — size and XXH3-64 of a whole file, streamed. */
#ifndef CREW_CORE_FILE_HASH_H
#define CREW_CORE_FILE_HASH_H

#include <stdint.h>

#include "crew.h"

crew_status crew_file_hash(const char *path, int64_t *bytes, uint64_t *xxh3);

#endif
