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
 * Only simple_value scalars are reported. Values of other kinds (histograms, images, and the
 * tensor-valued scalars of TF2's tf.summary) are skipped without looking inside. */
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
    int64_t records;       /* records in the file */
} crew_tb_scalar_list;

/* Reads every scalar of the file at path. On error *out is empty. */
crew_status crew_tb_read_all(const char *path, crew_tb_scalar_list *out);
void crew_tb_scalar_list_free(crew_tb_scalar_list *l);

#endif
