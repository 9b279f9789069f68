/* prep_shards.c — crew prep for a directory of llm.c GPT-2 token shards, as llm.c's data scripts
 * write them (fineweb.py: fineweb_val_000000.bin, fineweb_train_000001.bin, ...;
 * tinyshakespeare.py: tiny_shakespeare_train.bin, tiny_shakespeare_val.bin).
 *
 * Every regular file of SRC named *.bin with "_train" in its name belongs to the train split,
 * with "_val" to the val split (a name with both is refused), in byte order of the names; other
 * entries are ignored. Two passes: the first opens every shard (crew_tokens_open: magic, version,
 * size), checks each token against the vocabulary and hashes the mapping, so nothing is written
 * before the whole source is known good; the second hard-links each shard into OUT under llm.c's
 * own names (train_000000.bin, ..., val_000000.bin), or copies it where a link is refused (another
 * file system, a file system without hard links). manifest.json records the shards as crew prep
 * text's does (data/manifest.h, "tokens"). Written atomically like every prep. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/atomic_dir.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "data/prep_common.h"
#include "data/tokens.h"

#define MAX_SEQ_LEN ((int64_t)1 << 24)
#define MIN_VOCAB 2

enum { TRAIN, VAL, N_SPLITS };
static const char *const split_names[N_SPLITS] = {"train", "val"};

/* The split a shard's file name puts it in, or -1 when it names none: *.bin with "_train" or "_val". */
static int split_of(const char *name)
{
    size_t n = strlen(name);
    if (n < 4 || strcmp(name + n - 4, ".bin") != 0) return -1;
    int train = strstr(name, "_train") != NULL, val = strstr(name, "_val") != NULL;
    return train ? TRAIN : val ? VAL : -1;
}

static int named_shard(const struct dirent *e) { return split_of(e->d_name) >= 0; }
static int by_bytes(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

/* What the first pass learns about one source shard. */
typedef struct src_shard {
    char path[1024]; /* SRC/name */
    const char *name;
    int split;
} src_shard;

typedef struct shard_plan {
    const char *dir;
    src_shard *src;          /* [n], in manifest order: the train shards, then the val shards */
    int n, count[N_SPLITS];
    int64_t longest[N_SPLITS];
    struct dirent **entries; /* scandir's, which src[].name points into */
    int n_entries;
} shard_plan;

static void plan_free(shard_plan *p)
{
    for (int i = 0; i < p->n_entries; i++) free(p->entries[i]);
    free(p->entries);
    free(p->src);
    memset(p, 0, sizeof *p);
}

/* The regular files of dir named as shards, train before val, each split in byte order. */
static crew_status list_shards(const char *dir, shard_plan *p)
{
    memset(p, 0, sizeof *p);
    p->dir = dir;
    p->n_entries = scandir(dir, &p->entries, named_shard, by_bytes);
    if (p->n_entries < 0) {
        p->n_entries = 0;
        p->entries = NULL;
        return crew_errorf(errno == ENOENT || errno == ENOTDIR ? CREW_CODE_BAD_INPUT : CREW_CODE_IO, "%s: %s", dir,
                           strerror(errno));
    }
    if (p->n_entries && !(p->src = calloc((size_t)p->n_entries, sizeof *p->src))) return CREW_OOM();
    for (int split = 0; split < N_SPLITS; split++)
        for (int i = 0; i < p->n_entries; i++) {
            const char *name = p->entries[i]->d_name;
            if (split_of(name) != split) continue;
            src_shard *sh = &p->src[p->n];
            if ((size_t)snprintf(sh->path, sizeof sh->path, "%s/%s", dir, name) >= sizeof sh->path)
                return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s/%s: path too long", dir, name);
            struct stat st;
            if (stat(sh->path, &st) != 0) return crew_errorf(CREW_CODE_IO, "%s: %s", sh->path, strerror(errno));
            if (!S_ISREG(st.st_mode)) continue; /* a folder or a FIFO named like a shard is not one */
            if (split == TRAIN && strstr(name, "_val"))
                return crew_errorf(CREW_CODE_BAD_INPUT, "%s: the name has both \"_train\" and \"_val\"; which split is "
                                   "it? (rename it)", sh->path);
            sh->name = name;
            sh->split = split;
            p->count[split]++;
            p->n++;
        }
    if (p->count[TRAIN] == 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: no llm.c train shards (regular files *_train*.bin, as llm.c's data "
                           "scripts name them)", dir);
    if (p->n > CREW_MANIFEST_MAX_SHARDS)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: %d shards; a dataset holds at most %d", dir, p->n,
                           CREW_MANIFEST_MAX_SHARDS);
    return CREW_OK;
}

/* First pass, one shard: a valid llm.c shard whose tokens all lie in [0, vocab); its count, size
 * and hash go into the manifest entry. */
static crew_status check_shard(shard_plan *p, int i, int vocab, crew_manifest_shard *out)
{
    const src_shard *src = &p->src[i];
    crew_token_shard sh;
    CREW_TRY(crew_tokens_open(src->path, &sh));
    crew_status s = CREW_OK;
    for (int64_t k = 0; k < sh.count && !s; k++)
        if (sh.tokens[k] >= vocab)
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: token %u at index %lld is outside the vocabulary [0, %d) (a larger "
                            "--vocab?)", src->path, (unsigned)sh.tokens[k], (long long)k, vocab);
    if (!s) {
        int index = src->split == TRAIN ? i : i - p->count[TRAIN];
        snprintf(out->split, sizeof out->split, "%s", split_names[src->split]);
        snprintf(out->file, sizeof out->file, "%s_%06d.bin", split_names[src->split], index);
        out->tokens = sh.count;
        out->bytes = (int64_t)sh.map_len;
        out->xxh3 = XXH3_64bits(sh.map, sh.map_len);
        if (sh.count > p->longest[src->split]) p->longest[src->split] = sh.count;
    }
    crew_tokens_close(&sh);
    return s;
}

/* Copies src to dst (a new file), for when a hard link is refused; the copy must hash as the
 * first pass's mapping did, or the source changed in between. */
static crew_status copy_shard(const char *src, const char *dst, const crew_manifest_shard *want)
{
    void *map;
    size_t len;
    CREW_TRY(crew_map_file(src, &map, &len));
    crew_status s = CREW_OK;
    if ((int64_t)len != want->bytes || XXH3_64bits(map, len) != want->xxh3)
        s = crew_errorf(CREW_CODE_IO, "%s: changed while being prepared", src);
    FILE *f = s ? NULL : fopen(dst, "wb");
    if (!s && !f) s = crew_errorf(CREW_CODE_IO, "%s: %s", dst, strerror(errno));
    if (f) {
        int failed = fwrite(map, 1, len, f) != len;
        failed |= fclose(f) != 0;
        if (failed) s = crew_errorf(CREW_CODE_IO, "%s: write failed: %s", dst, strerror(errno));
    }
    crew_unmap_file(map, len);
    return s;
}

/* Second pass, one shard: OUT.tmp/<file> becomes the source shard, linked or else copied. */
static crew_status place_shard(const crew_atomic_dir *ad, const src_shard *src, const crew_manifest_shard *sh)
{
    char path[1200];
    CREW_TRY(crew_atomic_dir_file(ad, sh->file, path, sizeof path));
    if (linkat(AT_FDCWD, src->path, AT_FDCWD, path, AT_SYMLINK_FOLLOW) != 0) return copy_shard(src->path, path, sh);
    struct stat st;
    if (stat(path, &st) != 0) return crew_errorf(CREW_CODE_IO, "%s: %s", path, strerror(errno));
    if ((int64_t)st.st_size != sh->bytes) return crew_errorf(CREW_CODE_IO, "%s: changed while being prepared", src->path);
    return CREW_OK;
}

static crew_status write_shards(const char *out_dir, const shard_plan *p, crew_manifest *m, crew_prep_progress *pr)
{
    crew_atomic_dir ad;
    CREW_TRY(crew_atomic_dir_begin(out_dir, &ad));
    crew_status s = CREW_OK;
    for (int i = 0; i < p->n && !s; i++) {
        crew_prep_tick(pr, m->tokens.shards[i].file);
        s = place_shard(&ad, &p->src[i], &m->tokens.shards[i]);
    }
    return crew_prep_commit(&ad, m, s, pr);
}

/* The manifest's name: the base name of dir ("data/fineweb10B/" gives "fineweb10B"). */
static void dataset_name(const char *dir, char *name, size_t len)
{
    char buf[PATH_MAX];
    const char *use = dir;
    if (realpath(dir, buf)) use = buf;
    size_t n = strlen(use);
    while (n > 1 && use[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && use[start - 1] != '/') start--;
    if (start == n) snprintf(name, len, "shards"); /* "/" */
    else snprintf(name, len, "%.*s", (int)(n - start), use + start);
}

crew_status crew_prep_shards(const char *src_dir, int vocab, int64_t seq_len, const char *out_dir,
                             crew_progress_fn progress, void *user)
{
    if (!src_dir || !out_dir)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_prep_shards: src_dir and out_dir are required");
    if (vocab < MIN_VOCAB || vocab > CREW_MANIFEST_MAX_VOCAB)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "vocab must be in [%d, %d] (uint16 tokens), not %d", MIN_VOCAB,
                           CREW_MANIFEST_MAX_VOCAB, vocab);
    if (seq_len < 1 || seq_len > MAX_SEQ_LEN)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "seq_len must be in [1, %lld], not %lld", (long long)MAX_SEQ_LEN,
                           (long long)seq_len);
    CREW_TRY(crew_prep_refuse_existing(out_dir));
    shard_plan p;
    crew_manifest m;
    memset(&m, 0, sizeof m);
    crew_status s = list_shards(src_dir, &p);
    if (!s) {
        dataset_name(src_dir, m.name, sizeof m.name);
        m.has_tokens = 1;
        m.tokens = (crew_manifest_tokens){.vocab = vocab, .seq_len = seq_len};
        if (!(m.tokens.shards = calloc((size_t)p.n, sizeof *m.tokens.shards))) s = CREW_OOM();
    }
    /* Steps: each shard checked, then placed, and the commit. */
    crew_prep_progress pr = {.fn = progress, .user = user, .total = 2 * (int64_t)p.n + 1};
    for (int i = 0; i < p.n && !s; i++) {
        crew_prep_tick(&pr, p.src[i].name);
        s = check_shard(&p, i, vocab, &m.tokens.shards[m.tokens.n_shards++]);
    }
    for (int split = 0; split < N_SPLITS && !s; split++)
        if (p.count[split] && p.longest[split] < seq_len + 1)
            s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: no %s shard holds seq_len + 1 = %lld tokens (the longest has %lld; "
                            "a shorter --seq-len)", src_dir, split_names[split], (long long)(seq_len + 1),
                            (long long)p.longest[split]);
    if (!s) s = write_shards(out_dir, &p, &m, &pr);
    if (!s) crew_prep_done(&pr);
    crew_manifest_free(&m);
    plan_free(&p);
    return s;
}
