/* prep_text.c — crew prep for text as byte tokens, stored as llm.c token shards.
 *
 * Every byte of the file is one token (vocabulary 256), so no tokenizer is needed and any file
 * works. The last test_fraction of the bytes (rounded; a contiguous tail, since shuffling text
 * would destroy it) becomes the val split, the rest the train split. A split longer than
 * SHARD_TOKENS is cut into equal shards (llm.c's fineweb script uses 100M-token shards), named
 * as llm.c names them: train_000000.bin, train_000001.bin, ..., val_000000.bin. manifest.json
 * records the shards (data/manifest.h, "tokens"). Written atomically like every prep. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/status.h"
#include "core/atomic_dir.h"
#include "data/prep_common.h"
#include "data/tokens.h"

#define SHARD_TOKENS ((int64_t)100000000)
#define CHUNK_TOKENS ((int64_t)1 << 24) /* one progress step each */
#define MAX_SEQ_LEN ((int64_t)1 << 24)

typedef struct text_split {
    const char *name; /* "train", "val" */
    const uint8_t *bytes;
    int64_t n;
    int shards;
} text_split;

static int shard_count(int64_t n) { return (int)((n + SHARD_TOKENS - 1) / SHARD_TOKENS); }

/* Shard k of a split holds tokens [k·n/shards, (k+1)·n/shards): equal within one token. */
static int64_t shard_start(const text_split *sp, int k) { return (int64_t)((__int128)sp->n * k / sp->shards); }

static crew_status write_shard(const crew_atomic_dir *ad, const text_split *sp, int k, crew_manifest_shard *sh,
                               crew_prep_progress *pr)
{
    char path[1200];
    int64_t from = shard_start(sp, k), n = shard_start(sp, k + 1) - from;
    snprintf(sh->split, sizeof sh->split, "%s", sp->name);
    snprintf(sh->file, sizeof sh->file, "%s_%06d.bin", sp->name, k);
    sh->tokens = n;
    CREW_TRY(crew_atomic_dir_file(ad, sh->file, path, sizeof path));
    crew_tokens_writer w;
    CREW_TRY(crew_tokens_writer_begin(path, n, &w));
    crew_status s = CREW_OK;
    for (int64_t at = 0; !s && at < n; at += CHUNK_TOKENS) {
        crew_prep_tick(pr, sh->file);
        s = crew_tokens_writer_append_bytes(&w, sp->bytes + from + at, n - at < CHUNK_TOKENS ? n - at : CHUNK_TOKENS);
    }
    if (s) {
        crew_tokens_writer_abort(&w);
        return s;
    }
    CREW_TRY(crew_tokens_writer_finish(&w));
    crew_manifest_array hashed;
    CREW_TRY(crew_manifest_hash_file(path, &hashed));
    sh->bytes = hashed.bytes;
    sh->xxh3 = hashed.xxh3;
    return CREW_OK;
}

static crew_status write_all(const char *out_dir, const text_split *splits, int n_splits, crew_manifest *m,
                             crew_prep_progress *pr)
{
    crew_atomic_dir ad;
    CREW_TRY(crew_atomic_dir_begin(out_dir, &ad));
    crew_status s = CREW_OK;
    for (int i = 0; i < n_splits && !s; i++)
        for (int k = 0; k < splits[i].shards && !s; k++)
            s = write_shard(&ad, &splits[i], k, &m->tokens.shards[m->tokens.n_shards++], pr);
    return crew_prep_commit(&ad, m, s, pr);
}

/* The train and (when fraction > 0) val splits, each long enough for one sequence and its target. */
static crew_status plan_splits(const char *file, const uint8_t *bytes, int64_t n, int64_t seq_len, double fraction,
                               text_split *splits, int *n_splits)
{
    int64_t n_val = fraction > 0 ? (int64_t)floor((double)n * fraction + 0.5) : 0;
    splits[0] = (text_split){"train", bytes, n - n_val, 0};
    splits[1] = (text_split){"val", bytes + (n - n_val), n_val, 0};
    *n_splits = fraction > 0 ? 2 : 1;
    for (int i = 0; i < *n_splits; i++) {
        if (splits[i].n < seq_len + 1)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %lld bytes leave the %s split %lld tokens, fewer than seq_len + 1 "
                               "= %lld (a shorter --seq-len or a longer text)", file, (long long)n, splits[i].name,
                               (long long)splits[i].n, (long long)(seq_len + 1));
        splits[i].shards = shard_count(splits[i].n);
    }
    return CREW_OK;
}

crew_status crew_prep_text(const char *file, int64_t seq_len, double test_fraction, const char *out_dir,
                           crew_progress_fn progress, void *user)
{
    if (!file || !out_dir) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_text: file and out_dir are required");
    if (seq_len < 1 || seq_len > MAX_SEQ_LEN)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "seq_len must be in [1, %lld], not %lld", (long long)MAX_SEQ_LEN,
                           (long long)seq_len);
    if (!(test_fraction >= 0 && test_fraction < 1))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "the test fraction must be in [0, 1), not %g", test_fraction);
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    void *map;
    size_t len;
    CREW_TRY(crew_prep_map_file(file, &map, &len));
    text_split splits[2];
    int n_splits;
    crew_manifest m;
    memset(&m, 0, sizeof m);
    crew_status s = plan_splits(file, map, (int64_t)len, seq_len, test_fraction, splits, &n_splits);
    int64_t steps = 1, total_shards = 0; /* steps: at least the chunks written, and the commit */
    for (int i = 0; !s && i < n_splits; i++) {
        steps += splits[i].shards + splits[i].n / CHUNK_TOKENS;
        total_shards += splits[i].shards;
    }
    if (!s) {
        snprintf(m.name, sizeof m.name, "text");
        m.has_tokens = 1;
        m.tokens = (crew_manifest_tokens){.vocab = 256, .seq_len = seq_len};
        if (!(m.tokens.shards = calloc((size_t)total_shards, sizeof *m.tokens.shards))) s = CREW_OOM();
    }
    if (!s) {
        crew_prep_progress pr = {.fn = progress, .user = user, .total = steps};
        s = write_all(out_dir, splits, n_splits, &m, &pr);
        if (!s) crew_prep_done(&pr);
    }
    crew_manifest_free(&m);
    munmap(map, len);
    return s;
}
