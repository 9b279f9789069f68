/* links.h — symbolic links where crew reads and writes its own files (docs/CHECKPOINTS.md,
 * "Symbolic links"): a run directory's files are crew's, never a link to somewhere else, so
 * nothing outside the run directory is ever written, removed or read through one. */
#ifndef CREW_CORE_LINKS_H
#define CREW_CORE_LINKS_H

#include <stddef.h>

#include "crew.h"

/* CREW_OK when path is not a symbolic link (a missing path is none either); else a
 * CREW_CODE_BAD_INPUT error "PATH is a symbolic link (to TARGET): WHY". */
crew_status crew_refuse_link(const char *path, const char *why);
/* 1 when path is a symbolic link; its target (as readlink gives it, cut to len) into target. */
int crew_is_link(const char *path, char *target, size_t len);

#endif
