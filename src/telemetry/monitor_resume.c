/* monitor_resume.c — what a resumed run appends to metrics.jsonl.
 *
 * A run that was killed (SIGKILL, a lost node, a full disk) can leave its record ending in half a
 * line, and it has usually logged steps after its last checkpoint. The resumed run starts again
 * from the checkpoint, so:
 *
 * - before it appends anything, the torn last line is cut off (a line that lacks only its newline
 *   is completed instead), so the record stays one JSON object per line;
 * - before its first step line it writes a "resume" line that says from which checkpoint it
 *   started and which logged steps it runs again. Readers take the later lines of those steps in
 *   place of the earlier ones (docs/METRICS.md, "Resumed runs"); TensorBoard gets a SessionLog
 *   START at the first re-run step, which makes it drop the earlier points from that step on.
 *
 * The checkpoint's step is not known when the monitor opens; it is the step before the first step
 * record (the training loop starts right after the checkpoint), so the line waits for it. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "core/timer.h"
#include "telemetry/monitor_internal.h"

#define STEP_PREFIX "{\"type\":\"step\",\"step\":" /* how monitor.c begins every step line */
#define MAX_TAIL (4 << 20)                          /* a longer line is no line a reader takes */

/* The step of a line that begins like monitor.c's step lines, or -1. */
static int64_t step_of(const char *line, size_t len)
{
    size_t k = sizeof STEP_PREFIX - 1;
    if (len <= k || memcmp(line, STEP_PREFIX, k) != 0) return -1;
    int64_t v = 0;
    size_t i = k;
    for (; i < len && i < k + 18 && line[i] >= '0' && line[i] <= '9'; i++) v = v * 10 + (line[i] - '0');
    return i > k ? v : -1;
}

/* The bytes after the last newline: a complete line without its newline (completed), or a torn
 * one (cut off). */
static crew_status settle_tail(crew_monitor *m, int fd, off_t line_end, off_t size)
{
    off_t tail = size - line_end;
    int whole = 0;
    if (tail <= MAX_TAIL) {
        char *buf = malloc((size_t)tail + 1);
        if (!buf) return CREW_OOM();
        ssize_t got = pread(fd, buf, (size_t)tail, line_end);
        int err = errno;
        if (got != (ssize_t)tail) {
            free(buf);
            return crew_errorf(CREW_CODE_IO, "%s: read failed: %s", m->path, got < 0 ? strerror(err) : "the file shrank");
        }
        buf[tail] = '\0';
        cJSON *o = cJSON_ParseWithOpts(buf, NULL, 1);
        whole = cJSON_IsObject(o);
        cJSON_Delete(o);
        int64_t step = whole ? step_of(buf, (size_t)tail) : -1;
        if (step >= 0) m->logged_through = step;
        free(buf);
    }
    if (whole) {
        m->torn_completed = 1;
        return CREW_OK;
    }
    if (ftruncate(fd, line_end) != 0)
        return crew_errorf(CREW_CODE_IO, "%s: cannot cut off its torn last line (%lld bytes): %s", m->path,
                           (long long)tail, strerror(errno));
    m->torn_bytes = tail;
    return CREW_OK;
}

crew_status crew_monitor_resume_scan(crew_monitor *m, int fd)
{
    m->resume_pending = 1;
    struct stat st;
    if (fstat(fd, &st) != 0) return crew_errorf(CREW_CODE_IO, "%s: %s", m->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return CREW_OK; /* a pipe or a device: nothing to read back */
    enum { CHUNK = 1 << 16, KEEP = 64 };
    char *chunk = malloc(CHUNK);
    if (!chunk) return CREW_OOM();
    char head[KEEP]; /* the first bytes of the current line: enough for its step */
    size_t head_len = 0;
    off_t off = 0, line_end = 0;
    crew_status s = CREW_OK;
    for (;;) {
        ssize_t got = pread(fd, chunk, CHUNK, off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            s = crew_errorf(CREW_CODE_IO, "%s: read failed: %s", m->path, strerror(errno));
            break;
        }
        if (got == 0) break;
        for (ssize_t i = 0; i < got; i++) {
            if (chunk[i] == '\n') {
                int64_t step = step_of(head, head_len);
                if (step >= 0) m->logged_through = step;
                head_len = 0;
                line_end = off + i + 1;
            } else if (head_len < KEEP) {
                head[head_len++] = chunk[i];
            }
        }
        off += got;
    }
    free(chunk);
    if (!s && off > line_end) s = settle_tail(m, fd, line_end, off);
    return s;
}

/* "steps 41-47" or "step 41". */
static void step_range(char *buf, size_t len, int64_t first, int64_t last)
{
    if (first == last) snprintf(buf, len, "step %lld", (long long)first);
    else snprintf(buf, len, "steps %lld-%lld", (long long)first, (long long)last);
}

crew_status crew_monitor_resume_line(crew_monitor *m, int64_t first_step)
{
    m->resume_pending = 0;
    if (!m->has_file) return CREW_OK;
    int64_t ckpt = first_step - 1, logged = m->logged_through;
    char msg[400], range[64];
    int n;
    if (first_step <= 0)
        n = snprintf(msg, sizeof msg, "resumed, but no step ran after the restart");
    else if (logged > ckpt) {
        step_range(range, sizeof range, ckpt + 1, logged);
        n = snprintf(msg, sizeof msg,
                     "resumed from the checkpoint at step %lld: %s, which the interrupted run had logged, %s run "
                     "again; their new lines replace the earlier ones",
                     (long long)ckpt, range, ckpt + 1 == logged ? "was" : "were");
    } else if (logged == ckpt)
        n = snprintf(msg, sizeof msg, "resumed from the checkpoint at step %lld: no logged step is run again",
                     (long long)ckpt);
    else {
        step_range(range, sizeof range, logged + 1, ckpt);
        n = snprintf(msg, sizeof msg,
                     "resumed from the checkpoint at step %lld: %s %s not in this record (the interrupted run's "
                     "last lines were lost)",
                     (long long)ckpt, range, logged + 1 == ckpt ? "is" : "are");
    }
    if (n > 0 && (size_t)n < sizeof msg && m->torn_bytes > 0)
        snprintf(msg + n, sizeof msg - (size_t)n, "; a torn last line of %lld bytes was cut off",
                 (long long)m->torn_bytes);
    else if (n > 0 && (size_t)n < sizeof msg && m->torn_completed)
        snprintf(msg + n, sizeof msg - (size_t)n, "; the last line lacked its newline, which was added");

    crew_text_file *f = &m->jsonl;
    crew_text_printf(f, "{\"type\":\"resume\",\"time\":%.3f,", crew_unix_now());
    if (first_step > 0) crew_text_printf(f, "\"checkpoint_step\":%lld,", (long long)ckpt);
    else crew_text_puts(f, "\"checkpoint_step\":null,");
    crew_text_printf(f, "\"logged_through\":%lld,", (long long)logged);
    if (first_step > 0 && logged > ckpt)
        crew_text_printf(f, "\"rerun_first\":%lld,\"rerun_last\":%lld,", (long long)ckpt + 1, (long long)logged);
    else
        crew_text_puts(f, "\"rerun_first\":null,\"rerun_last\":null,");
    crew_text_printf(f, "\"torn_bytes\":%lld,\"message\":", (long long)m->torn_bytes);
    crew_text_json_string(f, msg);
    crew_text_putc(f, '}');
    CREW_TRY(crew_text_end_line(f));
    return first_step > 0 ? crew_monitor_tb_restart(m, first_step, msg) : CREW_OK;
}
