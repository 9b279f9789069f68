/* tb_writer.h — TensorBoard event files, written without a protobuf library.
 *
 *   crew_tb_writer *tb;
 *   CREW_TRY(crew_tb_open("runs/r1/tb", &tb));   // creates the directory and a new event file
 *   s = crew_tb_scalar(tb, "train/loss", step, wall_time, loss);
 *   s = crew_tb_scalars(tb, step, wall_time, tags, values, n);   // n values in one event
 *   s = crew_tb_flush(tb);                        // e.g. once per epoch
 *   crew_tb_close(tb);
 *
 * The file, events.out.tfevents.<unix seconds>.<host>.<pid>.crew, is a TFRecord file: each
 * record is
 *   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
 *   length bytes of data          | uint32 masked CRC-32C of the data
 * and each record's data is a serialized tensorflow.Event (tensorflow/core/util/event.proto):
 *   Event      { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
 *                SessionLog session_log = 7; }
 *   Summary    { repeated Value value = 1; }
 *   Value      { string tag = 1; float simple_value = 2; }
 *   SessionLog { SessionStatus status = 1; string msg = 3; }   // START = 1
 * The first record carries file_version "brain.Event:2" and no summary.
 *
 * Writes are buffered (stdio); TensorBoard sees them after crew_tb_flush or crew_tb_close. After
 * a failed write (a full disk) the writer refuses further writes, so the file never holds a
 * record after a damaged one. One writer must not be used from two threads at once. */
#ifndef CREW_TELEMETRY_TB_WRITER_H
#define CREW_TELEMETRY_TB_WRITER_H

#include <stdint.h>

#include "crew.h"

/* Field numbers of the messages above (the reader uses them too). */
enum {
    CREW_TB_EVENT_WALL_TIME = 1,    /* double, wire type fixed64 */
    CREW_TB_EVENT_STEP = 2,         /* int64, wire type varint */
    CREW_TB_EVENT_FILE_VERSION = 3, /* string */
    CREW_TB_EVENT_SUMMARY = 5,      /* Summary message */
    CREW_TB_EVENT_SESSION_LOG = 7,  /* SessionLog message */
    CREW_TB_SESSION_STATUS = 1,     /* SessionLog.status, an enum (varint) */
    CREW_TB_SESSION_MSG = 3,        /* SessionLog.msg, a string */
    CREW_TB_SESSION_START = 1,      /* SessionLog.SessionStatus START */
    CREW_TB_SUMMARY_VALUE = 1,      /* repeated Value message */
    CREW_TB_VALUE_TAG = 1,          /* string */
    CREW_TB_VALUE_SIMPLE_VALUE = 2, /* float, wire type fixed32 */
};

#define CREW_TB_FILE_VERSION "brain.Event:2"
#define CREW_TB_RECORD_HEADER 12 /* bytes: length and its CRC */
#define CREW_TB_RECORD_FOOTER 4  /* bytes: the data's CRC */

typedef struct crew_tb_writer crew_tb_writer;

/* Creates dir (and missing parents) and a new event file in it, and writes the file_version
 * record. An existing file is never overwritten. */
crew_status crew_tb_open(const char *dir, crew_tb_writer **out);
/* Creates (or truncates) the event file at exactly `path` and writes the file_version record.
 * For tools and tests (e.g. /dev/full); training runs use crew_tb_open. */
crew_status crew_tb_open_file(const char *path, crew_tb_writer **out);

/* The path of the event file being written. */
const char *crew_tb_path(const crew_tb_writer *w);

/* Unix time in seconds (CLOCK_REALTIME), what TensorBoard expects as wall_time. Not crew_now(),
 * which is a monotonic clock with an arbitrary origin. */
double crew_tb_wall_time(void);

/* One event holding one scalar. Any non-empty tag string works ("replica/3/compute_s"); any
 * float value, NaN and infinities included. wall_time is Unix time in seconds. */
crew_status crew_tb_scalar(crew_tb_writer *w, const char *tag, int64_t step, double wall_time, float value);
/* One event holding n scalars (tags [n], values [n]) of the same step: smaller files than n
 * separate events, and TensorBoard shows them the same way. */
crew_status crew_tb_scalars(crew_tb_writer *w, int64_t step, double wall_time, const char *const *tags,
                            const float *values, int n);

/* A SessionLog START event at `step` (msg may be NULL): a restart from a checkpoint. TensorBoard
 * then drops every point it has read at `step` or later, from this file and the ones before it,
 * so the steps a resumed run runs again are drawn once (TensorFlow marks its restarts the same
 * way). */
crew_status crew_tb_session_start(crew_tb_writer *w, int64_t step, double wall_time, const char *msg);

/* Hands buffered records to the operating system, so TensorBoard can read them. */
crew_status crew_tb_flush(crew_tb_writer *w);
/* Flushes and closes; accepts NULL. It cannot report a failure: call crew_tb_flush first when
 * the last records matter. */
void crew_tb_close(crew_tb_writer *w);

#endif
