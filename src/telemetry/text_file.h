/* text_file.h — a text file written through write(2) with a buffer of its own, for metrics.jsonl
 * and the report.
 *
 * Why not a stdio FILE: a FILE reports a failed write (a full disk, a file-size limit) only as
 * its error flag, often at a later fprintf or at fflush, and by then errno may hold anything
 * (another call set it, or a successful one left it at 0: "write failed: Success"). Here errno is
 * read at the write(2) that failed, kept, and every later call reports the same reason. After a
 * failure nothing more is written, so the file ends in at most one torn line, which the readers
 * of metrics.jsonl leave out (docs/METRICS.md).
 *
 * A line is collected in memory and handed to the kernel in one write(2) when it ends
 * (crew_text_end_line), so a run that is killed leaves whole lines, every one it finished, and
 * only a write that fails half way (a full disk) leaves a torn one. Not for use from two threads
 * at once. */
#ifndef CREW_TELEMETRY_TEXT_FILE_H
#define CREW_TELEMETRY_TEXT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"
#include "core/status.h"

typedef struct crew_text_file {
    int fd;          /* -1: closed */
    char *path;      /* for messages */
    char *buf;       /* [cap]: text not yet written */
    size_t len, cap;
    int err;         /* errno of the first failure (ENOMEM for a failed buffer), 0 while all is well */
} crew_text_file;

/* Takes over fd (opened for writing by the caller) as `path`. Only fails for lack of memory, and
 * then closes fd. */
crew_status crew_text_attach(crew_text_file *t, int fd, const char *path);

/* Adds text to the buffer. Failures are kept and reported by the next end_line / flush / status. */
void crew_text_printf(crew_text_file *t, const char *fmt, ...) CREW_PRINTF(2, 3);
void crew_text_puts(crew_text_file *t, const char *s);
void crew_text_putc(crew_text_file *t, char c);
/* s as a JSON string, quotes included: " and \ escaped, bytes below 0x20 as \u00XX. */
void crew_text_json_string(crew_text_file *t, const char *s);

/* Ends a line ('\n') and writes it out. */
crew_status crew_text_end_line(crew_text_file *t);
/* Writes everything buffered. */
crew_status crew_text_flush(crew_text_file *t);
/* The first failure so far as "PATH: write failed: REASON", or CREW_OK. */
crew_status crew_text_status(const crew_text_file *t);
/* Flushes, fsyncs when `sync`, and closes; reports the first failure of the file's life (close's
 * own included). Safe on a file that was never attached or is closed already. */
crew_status crew_text_close(crew_text_file *t, int sync);

#endif
