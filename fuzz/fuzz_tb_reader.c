/* fuzz_tb_reader.c — crew_tb_parse on arbitrary bytes: it must never crash, hang or read outside
 * the input; every scalar it reports has a NUL-terminated tag of tag_len readable bytes, every
 * record it accepts takes at least the 16 bytes of TFRecord framing, and failures are
 * CREW_CODE_BAD_INPUT.
 *
 * Random bytes almost never carry valid CRCs, so each input is parsed twice: as it is (the
 * framing checks), and cut into 1-4 payloads that this harness frames with correct CRCs (so the
 * protobuf walk of Event, Summary and Value sees arbitrary bytes too). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "telemetry/crc32c.h"
#include "telemetry/tb_reader.h"

typedef struct seen {
    int64_t points;
    int64_t last_record;
} seen;

static crew_status check_point(const crew_tb_point *p, void *user)
{
    seen *s = user;
    if (!p->tag || p->tag[p->tag_len] != '\0' || p->record < s->last_record) __builtin_trap();
    volatile uint8_t acc = 0;
    for (size_t i = 0; i < p->tag_len; i++) acc ^= (uint8_t)p->tag[i]; /* ASan checks the bytes */
    (void)acc;
    s->last_record = p->record;
    s->points++;
    return CREW_OK;
}

static void parse_and_check(const uint8_t *data, size_t size)
{
    seen s = {0, 0};
    int64_t records = -1;
    crew_status st = crew_tb_parse(data, size, "fuzz.tfevents", check_point, &s, &records);
    int ok = st == CREW_OK;
    if (ok && (records < 0 || (uint64_t)records * 16 > size)) __builtin_trap();
    if (!ok && crew_status_code(st) != CREW_CODE_BAD_INPUT) __builtin_trap();
    crew_status_free(st);
    /* Validating without a callback must agree. */
    crew_status again = crew_tb_parse(data, size, "fuzz.tfevents", NULL, NULL, NULL);
    if ((again == CREW_OK) != ok) __builtin_trap();
    crew_status_free(again);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* data[0] % 4 + 1 payloads of the rest, each framed as a valid TFRecord. */
static void parse_reframed(const uint8_t *data, size_t size)
{
    if (size < 1) return;
    size_t k = (size_t)(data[0] % 4) + 1, rest = size - 1;
    uint8_t *buf = malloc(rest + 16 * k);
    if (!buf) return;
    size_t out = 0, in = 1;
    for (size_t i = 0; i < k; i++) {
        size_t n = i + 1 < k ? rest / k : size - in;
        put_le(buf + out, n, 8);
        put_le(buf + out + 8, crew_crc32c_mask(crew_crc32c(buf + out, 8)), 4);
        memcpy(buf + out + 12, data + in, n);
        put_le(buf + out + 12 + n, crew_crc32c_mask(crew_crc32c(data + in, n)), 4);
        out += 16 + n;
        in += n;
    }
    parse_and_check(buf, out);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_and_check(data, size);
    parse_reframed(data, size);
    return 0;
}
