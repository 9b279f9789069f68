/* test_tokens.c — llm.c token shards: a round trip through crew_tokens_write / crew_tokens_open,
 * a shard built byte by byte exactly as llm.c's write_datafile lays it out (read unchanged, and
 * crew's writer producing the identical bytes), the streaming writer's bookkeeping, and every
 * malformed shard an error naming the file. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "data/tokens.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

static void tmp_path(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", tmp_dir, name); }

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* What llm.c writes: np.zeros(256, int32) header with [0] magic, [1] version, [2] count, then
 * the tokens as uint16, both little-endian (tobytes() on x86). */
static uint8_t *llmc_bytes(uint32_t magic, uint32_t version, uint32_t count, const uint16_t *tok, int64_t n, size_t *len)
{
    *len = 1024 + 2 * (size_t)n;
    uint8_t *b = calloc(1, *len);
    put32(b, magic);
    put32(b + 4, version);
    put32(b + 8, count);
    for (int64_t i = 0; i < n; i++) {
        b[1024 + 2 * i] = (uint8_t)(tok[i] & 0xff);
        b[1024 + 2 * i + 1] = (uint8_t)(tok[i] >> 8);
    }
    return b;
}

static void test_round_trip(void)
{
    enum { N = 70000 }; /* more than one of the writer's 4096-token chunks */
    uint16_t *tok = malloc(sizeof *tok * N);
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i * 2654435761u >> 16);
    tok[0] = 0;
    tok[1] = 65535;
    char path[128];
    tmp_path(path, sizeof path, "round.bin");
    CHECK_OK(crew_tokens_write(path, tok, N));
    crew_token_shard sh;
    CHECK_OK(crew_tokens_open(path, &sh));
    CHECK(sh.count == N);
    CHECK(sh.map_len == 1024 + 2 * (size_t)N);
    CHECK(sh.tokens && memcmp(sh.tokens, tok, sizeof *tok * N) == 0);
    crew_tokens_close(&sh);
    CHECK(sh.tokens == NULL && sh.map == NULL);
    /* An empty shard is valid: header only. */
    tmp_path(path, sizeof path, "empty_tokens.bin");
    CHECK_OK(crew_tokens_write(path, NULL, 0));
    CHECK_OK(crew_tokens_open(path, &sh));
    CHECK(sh.count == 0);
    crew_tokens_close(&sh);
    free(tok);
}

static void test_llmc_layout(void)
{
    const uint16_t tok[] = {50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 0, 65535};
    const int64_t n = sizeof tok / sizeof tok[0];
    size_t len;
    uint8_t *want = llmc_bytes(20240520, 1, (uint32_t)n, tok, n, &len);
    char hand[128], ours[128];
    tmp_path(hand, sizeof hand, "llmc_val_000000.bin");
    write_file(hand, want, len);
    crew_token_shard sh;
    CHECK_OK(crew_tokens_open(hand, &sh));
    CHECK(sh.count == n);
    for (int64_t i = 0; i < n && sh.tokens; i++) CHECK_MSG(sh.tokens[i] == tok[i], "token %lld", (long long)i);
    crew_tokens_close(&sh);
    /* crew's writer produces the very same bytes. */
    tmp_path(ours, sizeof ours, "crew_val_000000.bin");
    CHECK_OK(crew_tokens_write(ours, tok, n));
    size_t got_len = 0;
    uint8_t *got = read_file(ours, &got_len);
    CHECK(got && got_len == len && memcmp(got, want, len) == 0);
    /* And parsing from memory agrees. */
    CHECK_OK(crew_tokens_parse(want, len, "mem", &sh));
    CHECK(sh.count == n && sh.map == NULL && sh.tokens[0] == 50256);
    free(got);
    free(want);
}

static void expect_bad(const char *name, uint32_t magic, uint32_t version, uint32_t count, int64_t n, size_t cut,
                       const char *needle)
{
    uint16_t tok[64] = {0};
    size_t len;
    uint8_t *b = llmc_bytes(magic, version, count, tok, n, &len);
    char path[128];
    tmp_path(path, sizeof path, name);
    write_file(path, b, len - cut);
    crew_token_shard sh;
    CHECK_ERR(crew_tokens_open(path, &sh), name);
    CHECK_ERR(crew_tokens_open(path, &sh), needle);
    CHECK(sh.tokens == NULL && sh.map == NULL);
    CHECK_ERR(crew_tokens_parse(b, len - cut, name, &sh), needle);
    free(b);
}

static void test_bad_shards(void)
{
    expect_bad("magic.bin", 20240326, 1, 10, 10, 0, "not an llm.c token shard");
    expect_bad("version.bin", 20240520, 2, 10, 10, 0, "version 2 is not supported");
    expect_bad("llama3.bin", 20240801, 7, 10, 10, 0, "LLaMA-3");
    expect_bad("count.bin", 20240520, 1, 50, 10, 0, "header says 50 tokens");
    expect_bad("count.bin", 20240520, 1, 50, 10, 0, "truncated");
    expect_bad("trailing.bin", 20240520, 1, 5, 10, 0, "trailing data");
    expect_bad("negative.bin", 20240520, 1, 0xffffffffu, 10, 0, "negative token count");
    expect_bad("cut.bin", 20240520, 1, 10, 10, 3, "truncated");
    expect_bad("short.bin", 20240520, 1, 0, 0, 1000, "shorter than the 1024-byte header");
    char path[128];
    tmp_path(path, sizeof path, "zero.bin");
    write_file(path, "", 0);
    crew_token_shard sh;
    CHECK_ERR(crew_tokens_open(path, &sh), "zero.bin: 0 bytes");
    tmp_path(path, sizeof path, "no-such.bin");
    CHECK_ERR(crew_tokens_open(path, &sh), "no-such.bin");
    CHECK_ERR(crew_tokens_open(tmp_dir, &sh), "not a regular file");
}

static void test_writer(void)
{
    char path[128];
    tmp_path(path, sizeof path, "stream.bin");
    crew_tokens_writer w;
    const uint8_t bytes[] = {'h', 'i', 0, 255};
    const uint16_t more[] = {1000, 2};
    CHECK_OK(crew_tokens_writer_begin(path, 6, &w));
    CHECK_OK(crew_tokens_writer_append_bytes(&w, bytes, 4));
    CHECK_ERR(crew_tokens_writer_append(&w, more, 3), "overruns");
    CHECK_OK(crew_tokens_writer_append(&w, more, 2));
    CHECK_OK(crew_tokens_writer_finish(&w));
    crew_token_shard sh;
    CHECK_OK(crew_tokens_open(path, &sh));
    const uint16_t want[] = {'h', 'i', 0, 255, 1000, 2};
    CHECK(sh.count == 6 && memcmp(sh.tokens, want, sizeof want) == 0);
    crew_tokens_close(&sh);
    /* Fewer tokens than promised: finish says so. */
    CHECK_OK(crew_tokens_writer_begin(path, 5, &w));
    CHECK_OK(crew_tokens_writer_append_bytes(&w, bytes, 4));
    CHECK_ERR(crew_tokens_writer_finish(&w), "4 tokens written but the header promises 5");
    CHECK_ERR(crew_tokens_writer_begin(path, (int64_t)INT32_MAX + 1, &w), "do not fit one shard");
    tmp_path(path, sizeof path, "no-such-dir/x.bin");
    CHECK_ERR(crew_tokens_write(path, more, 2), "no-such-dir/x.bin");
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew-tokens-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    test_round_trip();
    test_llmc_layout();
    test_bad_shards();
    test_writer();
    nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
