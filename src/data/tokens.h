/* tokens.h — llm.c token shards: the .bin files llm.c's data scripts (tinyshakespeare.py,
 * fineweb.py, ...) write and its dataloader reads.
 *
 * Layout, exactly as llm.c (dev/data/data_common.py, write_datafile) writes it:
 *   header: 256 little-endian int32 (1024 bytes)
 *     [0] = 20240520   magic
 *     [1] = 1          version: tokens are uint16 (GPT-2 sized vocabularies)
 *     [2] = N          number of tokens
 *     [3..255] = 0
 *   then N little-endian uint16 tokens.
 * The file is exactly 1024 + 2·N bytes: llm.c's loader refuses anything else, and so does crew.
 * (llm.c's version 7 / magic 20240801 shards hold uint32 LLaMA-3 tokens; crew refuses them.) */
#ifndef CREW_DATA_TOKENS_H
#define CREW_DATA_TOKENS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "crew.h"

#define CREW_TOKENS_MAGIC 20240520
#define CREW_TOKENS_VERSION 1
#define CREW_TOKENS_HEADER_INTS 256
#define CREW_TOKENS_HEADER_BYTES (CREW_TOKENS_HEADER_INTS * 4)
/* The count is an int32 in the header. */
#define CREW_TOKENS_MAX_COUNT ((int64_t)INT32_MAX)

typedef struct crew_token_shard {
    int64_t count;          /* tokens */
    const uint16_t *tokens; /* [count], little-endian, into the mapping (or the parsed buffer) */
    void *map;              /* the whole file's mapping; NULL after crew_tokens_parse */
    size_t map_len;
} crew_token_shard;

/* Maps path read-only and checks the header: magic, version 1, and a file exactly as long as the
 * count says. Errors name the file. */
crew_status crew_tokens_open(const char *path, crew_token_shard *out);
/* The same checks on a shard already in memory (no copy: out->tokens points into buf, which must
 * be 2-byte aligned for the tokens to be read through the pointer); `what` names it in errors. */
crew_status crew_tokens_parse(const void *buf, size_t len, const char *what, crew_token_shard *out);
/* Unmaps an opened shard; accepts a zeroed or parsed one. */
void crew_tokens_close(crew_token_shard *s);

/* Writes tokens[0..n) as a shard at path (the caller handles atomicity of the directory). */
crew_status crew_tokens_write(const char *path, const uint16_t *tokens, int64_t n);

/* A shard written piece by piece, for sources too large to widen to uint16 all at once:
 * begin with the final count, append exactly that many tokens, then finish. */
typedef struct crew_tokens_writer {
    FILE *f;
    char path[1024];
    int64_t count, written;
} crew_tokens_writer;

crew_status crew_tokens_writer_begin(const char *path, int64_t count, crew_tokens_writer *w);
crew_status crew_tokens_writer_append(crew_tokens_writer *w, const uint16_t *tokens, int64_t n);
/* Bytes b become tokens b (vocab 256). */
crew_status crew_tokens_writer_append_bytes(crew_tokens_writer *w, const uint8_t *bytes, int64_t n);
/* Closes the file; an error when fewer tokens than promised were appended or a write failed. */
crew_status crew_tokens_writer_finish(crew_tokens_writer *w);
/* Closes without checking, after an earlier error; a no-op once finished. */
void crew_tokens_writer_abort(crew_tokens_writer *w);

#endif
