/* file_hash.h — size and XXH3-64 of a whole file, streamed. */
#ifndef CREW_CORE_FILE_HASH_H
#define CREW_CORE_FILE_HASH_H

#include <stdint.h>

#include "crew.h"

/* crew_file_hash is public (crew.h): the CLI fingerprints the files of an MPI run with it. */

#endif
