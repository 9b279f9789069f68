/* tokens.c — reading and writing llm.c token shards (layout in tokens.h).
 *
 * Reading maps the file and checks the three header fields that matter against the file's
 * length before handing out a pointer into it, so a short, padded or foreign file is an error
 * naming it, never a read past the end. Writing spells out every integer little-endian, byte by
 * byte, so the files are the same whatever the host. */
#include "data/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mapped_file.h"
#include "core/status.h"

#define LLAMA3_MAGIC 20240801 /* llm.c's uint32-token shards (version 7) */

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static void put_le32(uint8_t *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
}

crew_status crew_tokens_parse(const void *buf, size_t len, const char *what, crew_token_shard *out)
{
    if (!out || (!buf && len)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tokens_parse: NULL argument");
    if (!what) what = "token shard";
    memset(out, 0, sizeof *out);
    const uint8_t *p = buf;
    if (len < CREW_TOKENS_HEADER_BYTES)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %zu bytes is shorter than the %d-byte header of an llm.c token shard",
                           what, len, CREW_TOKENS_HEADER_BYTES);
    int32_t magic = le32(p), version = le32(p + 4), count = le32(p + 8);
    if (magic == LLAMA3_MAGIC)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: an llm.c LLaMA-3 shard (uint32 tokens, magic %d); crew reads only "
                           "version 1 shards of uint16 tokens", what, magic);
    if (magic != CREW_TOKENS_MAGIC)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: not an llm.c token shard (magic %d, expected %d)", what, magic,
                           CREW_TOKENS_MAGIC);
    if (version != CREW_TOKENS_VERSION)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: token shard version %d is not supported (crew reads version %d: "
                           "uint16 tokens)", what, version, CREW_TOKENS_VERSION);
    if (count < 0) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: negative token count %d in the header", what, count);
    uint64_t want = CREW_TOKENS_HEADER_BYTES + 2 * (uint64_t)count;
    if (want > len)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header says %d tokens (%llu bytes) but the file holds %zu bytes "
                           "(truncated?)", what, count, (unsigned long long)want, len);
    if (want < len)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: header says %d tokens (%llu bytes) but the file holds %zu bytes "
                           "(trailing data)", what, count, (unsigned long long)want, len);
    out->count = count;
    out->tokens = (const uint16_t *)(const void *)(p + CREW_TOKENS_HEADER_BYTES);
    return CREW_OK;
}

crew_status crew_tokens_open(const char *path, crew_token_shard *out)
{
    if (!path || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tokens_open: NULL argument");
    memset(out, 0, sizeof *out);
    void *map;
    size_t len;
    CREW_TRY(crew_map_file(path, &map, &len));
    if (len < CREW_TOKENS_HEADER_BYTES) {
        crew_unmap_file(map, len);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %zu bytes is shorter than the %d-byte header of an llm.c token shard",
                           path, len, CREW_TOKENS_HEADER_BYTES);
    }
    crew_status s = crew_tokens_parse(map, len, path, out);
    if (s) {
        munmap(map, len);
        return s;
    }
    out->map = map;
    out->map_len = len;
    return CREW_OK;
}

void crew_tokens_close(crew_token_shard *s)
{
    if (!s) return;
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- writing */

crew_status crew_tokens_writer_begin(const char *path, int64_t count, crew_tokens_writer *w)
{
    if (!path || !w) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tokens_writer_begin: NULL argument");
    memset(w, 0, sizeof *w);
    if (count < 0 || count > CREW_TOKENS_MAX_COUNT)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: %lld tokens do not fit one shard (at most %lld)", path,
                           (long long)count, (long long)CREW_TOKENS_MAX_COUNT);
    if ((size_t)snprintf(w->path, sizeof w->path, "%s", path) >= sizeof w->path)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: path too long", path);
    uint8_t head[CREW_TOKENS_HEADER_BYTES] = {0};
    put_le32(head, CREW_TOKENS_MAGIC);
    put_le32(head + 4, CREW_TOKENS_VERSION);
    put_le32(head + 8, (int32_t)count);
    w->f = fopen(path, "wb");
    if (!w->f) return crew_errorf(CREW_CODE_IO, "%s: %s", path, strerror(errno));
    w->count = count;
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head) {
        crew_status s = crew_errorf(CREW_CODE_IO, "%s: write failed: %s", path, strerror(errno));
        crew_tokens_writer_abort(w);
        return s;
    }
    return CREW_OK;
}

/* Appends n tokens from src: uint16 tokens when wide, else bytes (each byte one token), written
 * little-endian through a small buffer. */
static crew_status append(crew_tokens_writer *w, const void *src, int wide, int64_t n)
{
    if (!w || !w->f) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "token shard writer: not open");
    if (!src && n) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: NULL tokens", w->path);
    if (n < 0 || n > w->count - w->written)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s: appending %lld tokens overruns the %lld promised", w->path,
                           (long long)n, (long long)w->count);
    const uint16_t *t16 = src;
    const uint8_t *t8 = src;
    uint8_t chunk[8192];
    const int64_t per = (int64_t)sizeof chunk / 2;
    for (int64_t at = 0; at < n; at += per) {
        int64_t m = n - at < per ? n - at : per;
        for (int64_t k = 0; k < m; k++) {
            uint16_t v = wide ? t16[at + k] : t8[at + k];
            chunk[2 * k] = (uint8_t)v;
            chunk[2 * k + 1] = (uint8_t)(v >> 8);
        }
        if (fwrite(chunk, 2, (size_t)m, w->f) != (size_t)m)
            return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", w->path, strerror(errno));
    }
    w->written += n;
    return CREW_OK;
}

crew_status crew_tokens_writer_append(crew_tokens_writer *w, const uint16_t *tokens, int64_t n)
{
    return append(w, tokens, 1, n);
}

crew_status crew_tokens_writer_append_bytes(crew_tokens_writer *w, const uint8_t *bytes, int64_t n)
{
    return append(w, bytes, 0, n);
}

crew_status crew_tokens_writer_finish(crew_tokens_writer *w)
{
    if (!w || !w->f) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "token shard writer: not open");
    int failed = ferror(w->f);
    failed |= fclose(w->f) != 0;
    w->f = NULL;
    if (failed) return crew_errorf(CREW_CODE_IO, "%s: write failed: %s", w->path, strerror(errno));
    if (w->written != w->count)
        return crew_errorf(CREW_CODE_INTERNAL, "%s: %lld tokens written but the header promises %lld", w->path,
                           (long long)w->written, (long long)w->count);
    return CREW_OK;
}

void crew_tokens_writer_abort(crew_tokens_writer *w)
{
    if (!w || !w->f) return;
    fclose(w->f);
    w->f = NULL;
}

crew_status crew_tokens_write(const char *path, const uint16_t *tokens, int64_t n)
{
    if (!tokens && n) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_tokens_write: NULL tokens");
    crew_tokens_writer w;
    CREW_TRY(crew_tokens_writer_begin(path, n, &w));
    crew_status s = crew_tokens_writer_append(&w, tokens, n);
    if (s) {
        crew_tokens_writer_abort(&w);
        return s;
    }
    return crew_tokens_writer_finish(&w);
}
