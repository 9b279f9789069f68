/* fuzz_report.c — crew_report_write (crew report) on arbitrary bytes as RUN_DIR/metrics.jsonl:
 * it must never crash, hang or leak, and fails only with CREW_CODE_BAD_INPUT, in one line that
 * names the file. The whole of it runs: both readings of the file, the page and every chart, and
 * no attribute of the page it writes holds a nan or an inf (report_svg.c promises finite
 * coordinates; no attribute carries text from the file).
 *
 * The reader takes a path, so each input is written to metrics.jsonl in a directory of this
 * process's own (made once, removed at exit). Random bytes seldom make a pipeline line whose keys
 * all check out, so the first byte picks how the rest is used:
 *   0: as the file itself;
 *   1: as the rest of a pipeline line, after {"type":"pipeline",
 *   2: as the passes of a pipeline line of 1-4 stages and 1-4 micro-batches (the second byte),
 *      between its "ops":[ and ]};
 *   3: as numbers: a pipeline line's shape and time scale (3 bytes), then 5 bytes per pass, mostly
 *      valid ones, so that the timeline is drawn from odd times (nulls, 1e999, huge and tiny). */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "crew.h"

static char run_dir[64];
static char metrics_path[128];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_run_dir(void) { nftw(run_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(run_dir, sizeof run_dir, "%s/crew_fuzz_report_XXXXXX", tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(run_dir)) __builtin_trap();
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", run_dir);
    atexit(remove_run_dir);
    return 0;
}

/* metrics.jsonl: head, then data[0, size), then tail. */
static void write_metrics(const char *head, const uint8_t *data, size_t size, const char *tail)
{
    FILE *f = fopen(metrics_path, "wb");
    if (!f) __builtin_trap();
    fputs(head, f);
    if (size) fwrite(data, 1, size, f);
    fputs(tail, f);
    if (fclose(f) != 0) __builtin_trap();
}

/* One pass from 5 bytes: stage, micro-batch, pass, start, duration. 255 is out of range, and
 * 254 an odd time (1e999; an end before the start). */
static void write_pass(FILE *f, const uint8_t *b, int stages, int micro, double scale, int first)
{
    fprintf(f, "%s{\"stage\":%d,\"micro\":%d,\"pass\":\"%s\",", first ? "" : ",", b[0] == 255 ? stages : b[0] % stages,
            b[1] == 255 ? micro : b[1] % micro, b[2] == 255 ? "sideways" : b[2] % 2 ? "backward" : "forward");
    double start = b[3] * scale;
    if (b[3] == 255) fputs("\"start_s\":null,", f);
    else if (b[3] == 254) fputs("\"start_s\":1e999,", f);
    else fprintf(f, "\"start_s\":%.17g,", start);
    if (b[4] == 255) fputs("\"end_s\":null}", f);
    else fprintf(f, "\"end_s\":%.17g}", b[4] == 254 ? start - scale : start + b[4] * scale);
}

static void write_structured(const uint8_t *data, size_t size)
{
    uint8_t shape[3] = {0, 0, 0};
    memcpy(shape, data, size < 3 ? size : 3);
    int stages = shape[0] % 64 + 1, micro = shape[1] % 16 + 1;
    double scale = 1e-9 * (double)(1ull << (shape[2] % 64)); /* a nanosecond to 10^10 s a unit */
    FILE *f = fopen(metrics_path, "wb");
    if (!f) __builtin_trap();
    fprintf(f, "{\"type\":\"pipeline\",\"step\":1,\"stages\":%d,\"micro_batches\":%d,\"slowest_stage\":%d,", stages, micro,
            shape[2] % stages);
    if (shape[2] & 64) fputs("\"step_s\":null,\"ops\":[", f);
    else fprintf(f, "\"step_s\":%.17g,\"bubble\":0.5,\"ideal_bubble\":0.25,\"ops\":[", 100 * scale);
    for (size_t i = 3; i + 5 <= size && (i - 3) / 5 < 2 * (size_t)stages * (size_t)micro; i += 5)
        write_pass(f, data + i, stages, micro, scale, i == 3);
    fputs("]}\n", f);
    if (fclose(f) != 0) __builtin_trap();
}

/* The report written: no attribute value ( ="..." ) says nan or inf. */
static void check_page(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/report.html", run_dir);
    FILE *f = fopen(path, "rb");
    if (!f) __builtin_trap();
    char *page = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 65536 + 1 > cap) {
            cap = 2 * cap + 65536 + 1;
            char *p = realloc(page, cap);
            if (!p) __builtin_trap();
            page = p;
        }
        got = fread(page + len, 1, 65536, f);
        len += got;
    } while (got > 0);
    fclose(f);
    page[len] = '\0';
    for (const char *a = strstr(page, "=\""); a; a = strstr(a, "=\"")) {
        const char *end = strchr(a + 2, '"');
        if (!end) break;
        for (const char *c = a + 2; c + 3 <= end; c++)
            if (!strncmp(c, "nan", 3) || !strncmp(c, "inf", 3)) __builtin_trap();
        a = end + 1;
    }
    free(page);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char head[160];
    int mode = size ? data[0] % 4 : 0;
    if (mode == 0) {
        write_metrics("", data, size, "");
    } else if (mode == 1) {
        write_metrics("{\"type\":\"pipeline\",", data + 1, size - 1, "\n");
    } else if (mode == 3) {
        write_structured(data + 1, size - 1);
    } else {
        int shape = size > 1 ? data[1] : 0;
        snprintf(head, sizeof head, "{\"type\":\"run\"}\n{\"type\":\"pipeline\",\"step\":1,\"stages\":%d,"
                                    "\"micro_batches\":%d,\"step_s\":0.01,\"slowest_stage\":0,\"ops\":[",
                 shape % 4 + 1, shape / 4 % 4 + 1);
        write_metrics(head, data + (size > 1 ? 2 : 1), size > 1 ? size - 2 : 0, "]}\n");
    }
    crew_status s = crew_report_write(run_dir, NULL);
    if (!s) check_page();
    if (s) {
        const char *msg = crew_status_message(s);
        if (crew_status_code(s) != CREW_CODE_BAD_INPUT || !strstr(msg, metrics_path) || strchr(msg, '\n'))
            __builtin_trap();
    }
    crew_status_free(s);
    return 0;
}
