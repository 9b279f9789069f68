/* atomic_dir.h — writing a directory all at once: readers see either no OUT or a complete one.
 *
 *   crew_atomic_dir ad;
 *   CREW_TRY(crew_atomic_dir_begin("data/fm", &ad));   // creates data/fm.tmp-<pid>/
 *   ... write files into ad.tmp (crew_atomic_dir_file gives their paths) ...
 *   s = crew_atomic_dir_commit(&ad);                   // fsync files + dir, rename to data/fm
 *   // or on any failure: crew_atomic_dir_abort(&ad);   // removes the temporary directory
 *
 * An existing OUT is never replaced: begin and commit refuse it (the caller removes it first).
 * Missing parent directories of OUT are created. */
#ifndef CREW_CORE_ATOMIC_DIR_H
#define CREW_CORE_ATOMIC_DIR_H

#include <stddef.h>

#include "crew.h"

typedef struct crew_atomic_dir {
    char final[512]; /* OUT, without trailing slashes */
    char tmp[560];   /* OUT.tmp-<pid> while being written; "" once committed or aborted */
} crew_atomic_dir;

/* Refuses an existing out_dir, creates its parents and the temporary directory. */
crew_status crew_atomic_dir_begin(const char *out_dir, crew_atomic_dir *ad);
/* buf = "<tmp>/<name>". */
crew_status crew_atomic_dir_file(const crew_atomic_dir *ad, const char *name, char *buf, size_t len);
/* fsyncs every file and the directory, renames it to its final name and fsyncs the parent.
 * On failure the temporary directory is removed. */
crew_status crew_atomic_dir_commit(crew_atomic_dir *ad);
/* Removes the temporary directory and the files in it; a no-op once committed or aborted. A
 * temporary name that is a symbolic link is left as it is: nothing is removed through it. */
void crew_atomic_dir_abort(crew_atomic_dir *ad);
/* Removes the files directly in dir (not its subdirectories), never through a symbolic link: a dir
 * that is one is left alone, and a link inside it is removed itself, not what it points to. */
void crew_remove_dir_files(const char *dir);

#endif
