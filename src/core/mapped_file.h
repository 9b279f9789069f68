/* mapped_file.h — a whole regular file mapped read-only, for the readers of outside data. */
#ifndef CREW_CORE_MAPPED_FILE_H
#define CREW_CORE_MAPPED_FILE_H

#include <stddef.h>

#include "crew.h"

/* Maps path read-only into *map, its size into *len. An empty file gives map NULL and len 0 (mmap
 * refuses zero lengths); the caller checks the size it needs. Errors name the path: IO for open,
 * stat and mmap failures (with the system's reason), BAD_INPUT for something not a regular file. */
crew_status crew_map_file(const char *path, void **map, size_t *len);
void crew_unmap_file(void *map, size_t len); /* accepts NULL */

#endif
