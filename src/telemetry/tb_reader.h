/* tb_reader.h — reading the scalars of TensorBoard event files (TFRecord framing of
 * tensorflow.Event messages; the format is described in tb_writer.h).
 *
 * Event files may come from anywhere (another program, a damaged disk), so the reader checks
 * everything: both CRCs of every record, that each record lies wholly inside the file, that its
 * length is sane, and that the protobuf inside is well formed (varints of at most 10 bytes, field
 * numbers in range, lengths inside their message, known fields of the right wire type). Unknown
 * fields of every wire type (varint, fixed64, length-delimited, fixed32) are skipped, so files
 * written by TensorFlow or PyTorch read fine. Errors name the file, the record's index and its
 * byte offset: "x.tfevents: record 7 at offset 412: data CRC mismatch (...)".
 *
 * Only simple_value scalars are reported, and (to a reader that asks) SessionLog START events,
 * which mark a restart. Values of other kinds (histograms, images, and the tensor-valued scalars of
 * TF2's tf.summary) are skipped without looking inside. */
#ifndef CREW_TELEMETRY_TB_READER_H
#define CREW_TELEMETRY_TB_READER_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"

/* No event holds more than this many bytes; a larger record length is taken as damage. */
#define CREW_TB_MAX_RECORD ((uint64_t)1 << 30)

/* One scalar, as handed to a callback. */
typedef struct crew_tb_point {
    const char *tag;  /* NUL-terminated; valid only during the callback */
    size_t tag_len;   /* bytes of tag (data from outside may hold NUL bytes inside it) */
    int64_t step;
    double wall_time; /* Unix time, seconds */
    float value;
    int64_t record;   /* index of the record (event) holding it; record 0 is usually file_version */
} crew_tb_point;

/* Called for every scalar in file order; returning an error stops the read and passes it on. */
typedef crew_status (*crew_tb_callback)(const crew_tb_point *p, void *user);

/* Called for every SessionLog START event (a restart from a checkpoint at `step`), before the
 * event's own scalars, if it has any. */
typedef crew_status (*crew_tb_start_callback)(int64_t step, double wall_time, void *user);

typedef struct crew_tb_parse_options {
    crew_tb_callback on_scalar;   /* may be NULL */
    crew_tb_start_callback on_start; /* may be NULL */
    void *user;
    /* A last record that the file ends inside (a writer still at work, or one that was killed)
     * ends the file instead of being an error, as in TensorBoard. Damage is still an error. */
    int torn_tail_ok;
} crew_tb_parse_options;

/* crew_tb_parse with options; *torn_bytes (if not NULL) is the size of a torn last record that
 * was left out (0: none). */
crew_status crew_tb_parse_with(const void *buf, size_t len, const char *what, const crew_tb_parse_options *o,
                               int64_t *records, size_t *torn_bytes);
/* Parses an event file image in memory; `what` names it in errors. cb may be NULL to only
 * validate. On success *records (if not NULL) is the number of records. */
crew_status crew_tb_parse(const void *buf, size_t len, const char *what, crew_tb_callback cb, void *user,
                          int64_t *records);
/* Maps the file at path and parses it. */
crew_status crew_tb_read(const char *path, crew_tb_callback cb, void *user);

/* A whole file's scalars, owned. */
typedef struct crew_tb_scalar_list {
    crew_tb_point *points; /* [count]; each tag is a malloc'd copy */
    int64_t count;
    int64_t records;       /* records in the file(s) */
    /* crew_tb_read_run only: */
    int files;             /* event files read */
    int64_t restarts;      /* SessionLog START events */
    int64_t purged;        /* points dropped by them */
    int64_t torn_bytes;    /* bytes of torn last records left out */
} crew_tb_scalar_list;

/* Reads every scalar of the file at path. On error *out is empty. */
crew_status crew_tb_read_all(const char *path, crew_tb_scalar_list *out);
/* Reads a run's event files (every file in dir whose name holds "tfevents", in name order) the way
 * TensorBoard shows them: a SessionLog START at step s drops the points read before it at step s
 * or later (a resumed run's re-run steps are then there once, with the re-run's values), and a
 * file's torn last record is left out. On error *out is empty. */
crew_status crew_tb_read_run(const char *dir, crew_tb_scalar_list *out);
void crew_tb_scalar_list_free(crew_tb_scalar_list *l);

#endif
