/* mapped_file.h — how every reader of outside data opens a file: only a regular file, never
 * blocking on a FIFO or opening a device, and read whole or mapped read-only.
 *
 * The rule lives here so that it holds for every path a user can hand crew (datasets, model
 * files, weights, checkpoints, token shards, crew prep's inputs): anything that is not a regular
 * file after following symbolic links (a FIFO, a directory, a character or block device such as
 * /dev/zero, a socket) is refused with "PATH: not a regular file (a FIFO)", CREW_CODE_BAD_INPUT.
 * The path is stat()ed first, so a device is never opened (opening one can have effects of its
 * own), then opened with O_NONBLOCK, so a FIFO swapped in after the stat cannot block the open,
 * and the descriptor is fstat()ed, so what is read is what was checked. */
#ifndef CREW_CORE_MAPPED_FILE_H
#define CREW_CORE_MAPPED_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "crew.h"

/* "a FIFO", "a directory", "a character device", "a block device", "a socket", "a symbolic
 * link", "a regular file" or "an unknown kind of file", for mode (st_mode). */
const char *crew_file_kind(mode_t mode);

/* Opens path read-only (following symbolic links) if it is a regular file: *fd is then a blocking
 * descriptor the caller closes, *size its size. Errors name the path: "PATH: not a regular file
 * (KIND)" is CREW_CODE_BAD_INPUT; "PATH: cannot open: REASON" (REASON strerror's: "No such file
 * or directory", "Permission denied") is CREW_CODE_IO. *fd is -1 on error. */
crew_status crew_open_regular(const char *path, int *fd, int64_t *size);

/* The whole regular file at path in a malloc'd buffer *buf (the caller frees it) of *len bytes,
 * followed by one NUL byte that *len does not count, so text readers may treat it as a string.
 * A file over max_bytes is CREW_CODE_BAD_INPUT "PATH: N bytes is more than the M LIMIT_WHAT may
 * have" (limit_what e.g. "a model file"); a file whose size changes while it is read (it shrank,
 * it grew, or it is a pseudo-file whose size says nothing) is CREW_CODE_IO "PATH: changed size
 * while being read (N bytes when opened)". Opening as crew_open_regular. */
crew_status crew_read_file(const char *path, int64_t max_bytes, const char *limit_what, uint8_t **buf, size_t *len);

/* Maps path read-only into *map, its size into *len, opened as crew_open_regular. An empty file
 * gives map NULL and len 0 (mmap refuses zero lengths); the caller checks the size it needs. A
 * file whose size changed between the open and the mapping is CREW_CODE_IO "PATH: changed size
 * while being mapped". Other errors name the path: IO for stat and mmap failures (with the
 * system's reason), BAD_INPUT for something not a regular file.
 *
 * What a mapping cannot guard against: a file truncated by someone else while it is mapped makes
 * the next access to a page past the new end raise SIGBUS, which a library without global state
 * (no signal handlers) cannot turn into an error. Growing a mapped file is harmless: the mapping
 * keeps the size it was opened with. */
crew_status crew_map_file(const char *path, void **map, size_t *len);
void crew_unmap_file(void *map, size_t len); /* accepts NULL */

#endif
