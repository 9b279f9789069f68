/* test_prep_shards.c — crew prep shards on folders of llm.c token shards made here with
 * crew_tokens_write and named as llm.c's data scripts name them: which files become which split
 * and in what order, the shards hard-linked (or copied across file systems) under llm.c's names,
 * the manifest's tokens section, the dataset's windows and their tokens; and every kind of bad
 * input a CREW_CODE_BAD_INPUT error naming the file, with no output or temporary directory left. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "data/dataset.h"
#include "data/manifest.h"
#include "data/tokens.h"

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* dir/name into buf (512 bytes; the fixtures' paths are far shorter); returns buf. */
static char *join(char *buf, const char *dir, const char *name)
{
    snprintf(buf, 512, "%.250s/%.250s", dir, name);
    return buf;
}

/* Expects a CREW_CODE_BAD_INPUT error whose message contains needle. */
#define CHECK_BAD_INPUT(expr, needle)                                                                        \
    do {                                                                                                     \
        crew_status s_ = (expr);                                                                             \
        CHECK_MSG(crew_status_code(s_) == CREW_CODE_BAD_INPUT, "code %d: %s", (int)crew_status_code(s_),     \
                  s_ ? crew_status_message(s_) : "(no error)");                                              \
        if (s_) CHECK_MSG(strstr(crew_status_message(s_), (needle)) != NULL, "message '%s' lacks '%s'",      \
                          crew_status_message(s_), (needle));                                                \
        crew_status_free(s_);                                                                                \
    } while (0)


/* A failed prep leaves neither OUT nor OUT.tmp-*. */
static void check_nothing_left(const char *out)
{
    CHECK_MSG(!path_exists(out), "%s exists after a failed prep", out);
    CHECK(temp_dirs_in(tmp_dir) == 0);
}

/* Token i of fixture shard `which`: spread over GPT-2's vocabulary, distinct between shards. */
static uint16_t tok(int which, int64_t i) { return (uint16_t)((which * 7919 + i * 104729) % 50257); }

static void write_shard(const char *dir, const char *name, int which, int64_t n)
{
    uint16_t *t = malloc(sizeof *t * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) t[i] = tok(which, i);
    char path[512];
    CHECK_OK(crew_tokens_write(join(path, dir, name), t, n));
    free(t);
}

/* llm.c's fineweb.py names: val first as 000000, then train from 000001; written out of order. */
enum { A = 100, B = 50, C = 40, T = 16 };

static void make_source(const char *src)
{
    mkdir(src, 0755);
    write_shard(src, "x_train_000002.bin", 2, B);
    write_shard(src, "x_val_000000.bin", 3, C);
    write_shard(src, "x_train_000001.bin", 1, A);
    char path[512];
    write_file(join(path, src, "README.txt"), "not a shard\n", 12);
    write_file(join(path, src, "x_train_000003.bin.part"), "half a download", 15); /* not .bin: ignored */
    write_file(join(path, src, "tokenizer.bin"), "neither split", 13);           /* no _train/_val: ignored */
    mkdir(join(path, src, "old_train.bin"), 0755);                               /* not a regular file */
}

static void check_window(const crew_dataset *d, int64_t window, int which, int64_t from)
{
    float x[T];
    int32_t y[T];
    crew_dataset_gather(d, &window, 1, x, y);
    int bad = 0;
    for (int j = 0; j < T; j++) bad += x[j] != (float)tok(which, from + j) || y[j] != tok(which, from + j + 1);
    CHECK_MSG(bad == 0, "window %lld: %d tokens differ", (long long)window, bad);
}

/* Same inode: the shard was hard-linked. */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static void check_manifest(const char *src, const char *out)
{
    crew_manifest m;
    CHECK_OK(crew_manifest_read(out, &m));
    CHECK(!strcmp(m.name, "gpt2-mini"));
    CHECK(m.has_tokens && m.n_splits == 0 && m.tokens.vocab == 50257 && m.tokens.seq_len == T);
    CHECK(m.tokens.n_shards == 3);
    static const struct {
        const char *split, *file, *from;
        int64_t tokens;
    } want[] = {{"train", "train_000000.bin", "x_train_000001.bin", A},
                {"train", "train_000001.bin", "x_train_000002.bin", B},
                {"val", "val_000000.bin", "x_val_000000.bin", C}};
    for (int i = 0; i < 3 && i < m.tokens.n_shards; i++) {
        const crew_manifest_shard *sh = &m.tokens.shards[i];
        char path[512], from[512];
        CHECK_MSG(!strcmp(sh->split, want[i].split) && !strcmp(sh->file, want[i].file) && sh->tokens == want[i].tokens,
                  "shard %d: %s %s %lld", i, sh->split, sh->file, (long long)sh->tokens);
        int64_t bytes = 0;
        uint64_t xxh3 = 0;
        CHECK_OK(crew_file_hash(join(path, out, sh->file), &bytes, &xxh3));
        CHECK(sh->bytes == bytes && bytes == 1024 + 2 * want[i].tokens && sh->xxh3 == xxh3);
        CHECK_MSG(same_file(path, join(from, src, want[i].from)), "%s is not a hard link of %s", path, from);
    }
    crew_manifest_free(&m);
}

static void test_shards(void)
{
    char src[512], out[512];
    join(src, tmp_dir, "gpt2-mini");
    make_source(src);
    progress_log log = {0};
    char src_slash[520];
    snprintf(src_slash, sizeof src_slash, "%s/", src); /* the name is still the folder's */
    CHECK_OK(crew_prep_shards(src_slash, 50257, T, join(out, tmp_dir, "mini-out"), on_progress, &log));
    CHECK(log.calls > 2 && log.bad == 0 && log.last_done == log.last_total);
    CHECK(temp_dirs_in(tmp_dir) == 0);
    check_manifest(src, out);
    char path[512];
    CHECK(!path_exists(join(path, out, "README.txt")) && !path_exists(join(path, out, "train_000002.bin")));
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(out, "train", &d));
    if (d) {
        CHECK(crew_dataset_is_tokens(d) && crew_dataset_classes(d) == 50257);
        CHECK(crew_dataset_size(d) == (A - 1) / T + (B - 1) / T);
        check_window(d, 0, 1, 0);
        check_window(d, 5, 1, 5 * T);
        check_window(d, (A - 1) / T, 2, 0); /* the first window of the second shard */
        check_window(d, (A - 1) / T + 2, 2, 2 * T);
        CHECK_OK(crew_dataset_verify(d));
        crew_dataset_free(d);
        d = NULL;
    }
    CHECK_OK(crew_dataset_open(out, "val", &d));
    CHECK(d && crew_dataset_size(d) == (C - 1) / T);
    if (d) check_window(d, 1, 3, T);
    crew_dataset_free(d);
    CHECK_ERR(crew_prep_shards(src, 50257, T, out, NULL, NULL), "already exists");

    /* Train shards only: a dataset without a val split. */
    join(path, src, "x_val_000000.bin");
    CHECK(rename(path, join(out, tmp_dir, "val-aside.bin")) == 0);
    CHECK_OK(crew_prep_shards(src, 50257, T, join(out, tmp_dir, "mini-train"), NULL, NULL));
    d = NULL;
    CHECK_ERR(crew_dataset_open(out, "val", &d), "no 'val' shards");
    CHECK_OK(crew_dataset_open(out, "train", &d));
    CHECK(d && crew_dataset_size(d) == (A - 1) / T + (B - 1) / T);
    crew_dataset_free(d);
    CHECK(rename(join(out, tmp_dir, "val-aside.bin"), path) == 0);
    /* tinyshakespeare.py's names, and a vocabulary just large enough. */
    char ts[512];
    join(ts, tmp_dir, "tinyshakespeare");
    mkdir(ts, 0755);
    write_shard(ts, "tiny_shakespeare_val.bin", 5, 20);
    write_shard(ts, "tiny_shakespeare_train.bin", 4, 30);
    int vocab = 0;
    for (int i = 0; i < 30; i++) vocab = tok(4, i) + 1 > vocab ? tok(4, i) + 1 : vocab;
    for (int i = 0; i < 20; i++) vocab = tok(5, i) + 1 > vocab ? tok(5, i) + 1 : vocab;
    CHECK_OK(crew_prep_shards(ts, vocab, 19, join(out, tmp_dir, "ts-out"), NULL, NULL));
    CHECK(path_exists(join(path, out, "train_000000.bin")) && path_exists(join(path, out, "val_000000.bin")));
    CHECK_BAD_INPUT(crew_prep_shards(ts, vocab - 1, 19, join(out, tmp_dir, "ts-small"), NULL, NULL),
                    "is outside the vocabulary");
    check_nothing_left(out);
}

/* Where another file system is at hand (/dev/shm, a tmpfs), a link fails and the shard is copied. */
static void test_copy_across_file_systems(void)
{
    struct stat a, b;
    if (stat("/dev/shm", &a) != 0 || stat(tmp_dir, &b) != 0 || a.st_dev == b.st_dev || access("/dev/shm", W_OK) != 0) {
        printf("skipped the copy test: no second file system\n");
        return;
    }
    char src[64] = "/dev/shm/crew-shards-XXXXXX", out[512], path[512], from[512];
    if (!mkdtemp(src)) return;
    write_shard(src, "f_train_000001.bin", 6, 64);
    CHECK_OK(crew_prep_shards(src, 50257, 8, join(out, tmp_dir, "copied"), NULL, NULL));
    join(path, out, "train_000000.bin");
    join(from, src, "f_train_000001.bin");
    CHECK(!same_file(path, from));
    size_t la = 0, lb = 0;
    uint8_t *x = read_file(path, &la), *y = read_file(from, &lb);
    CHECK(x && y && la == lb && la == 1024 + 128 && memcmp(x, y, la) == 0);
    free(x);
    free(y);
    rm_tree(src);
}

static void test_errors(void)
{
    char src[512], out[512], path[512];
    join(src, tmp_dir, "bad");
    join(out, tmp_dir, "bad-out");
    mkdir(src, 0755);
    /* Nothing named as a train shard: val shards and other files do not make a dataset. */
    write_shard(src, "x_val_000000.bin", 1, 40);
    write_file(join(path, src, "notes.txt"), "x", 1);
    write_shard(src, "train.bin", 1, 40); /* "train" without the "_" is not llm.c's name */
    CHECK_BAD_INPUT(crew_prep_shards(src, 50257, 8, out, NULL, NULL), "bad: no llm.c train shards");
    check_nothing_left(out);
    /* A wrong magic. */
    write_shard(src, "x_train_000001.bin", 2, 40);
    write_shard(src, "x_train_000002.bin", 3, 40);
    join(path, src, "x_train_000002.bin");
    FILE *f = fopen(path, "r+b");
    CHECK(f && fwrite("\x01\x02\x03\x04", 1, 4, f) == 4);
    if (f) fclose(f);
    CHECK_BAD_INPUT(crew_prep_shards(src, 50257, 8, out, NULL, NULL), "x_train_000002.bin: not an llm.c token shard");
    check_nothing_left(out);
    /* A truncated shard. */
    write_shard(src, "x_train_000002.bin", 3, 40);
    CHECK(truncate(path, 1024 + 2 * 40 - 3) == 0);
    CHECK_BAD_INPUT(crew_prep_shards(src, 50257, 8, out, NULL, NULL), "x_train_000002.bin: header says 40 tokens");
    check_nothing_left(out);
    /* A file shorter than the header. */
    CHECK(truncate(path, 100) == 0);
    CHECK_BAD_INPUT(crew_prep_shards(src, 50257, 8, out, NULL, NULL), "x_train_000002.bin: 100 bytes is shorter");
    check_nothing_left(out);
    /* A token outside the vocabulary, at index 7 of the val shard (the others lie in [0, 1000)). */
    uint16_t t[40];
    for (int i = 0; i < 40; i++) t[i] = (uint16_t)(i * 25);
    CHECK_OK(crew_tokens_write(join(path, src, "x_train_000001.bin"), t, 40));
    CHECK_OK(crew_tokens_write(join(path, src, "x_train_000002.bin"), t, 40));
    t[7] = 1000;
    CHECK_OK(crew_tokens_write(join(path, src, "x_val_000000.bin"), t, 40));
    CHECK_BAD_INPUT(crew_prep_shards(src, 1000, 8, out, NULL, NULL),
                    "x_val_000000.bin: token 1000 at index 7 is outside the vocabulary [0, 1000)");
    check_nothing_left(out);
    CHECK_OK(crew_prep_shards(src, 1001, 8, out, NULL, NULL)); /* every shard is fine at vocab 1001 */
    rm_tree(out);
    /* No shard of a split long enough for one window and its targets. */
    CHECK_BAD_INPUT(crew_prep_shards(src, 1001, 40, out, NULL, NULL), "no train shard holds seq_len + 1 = 41 tokens");
    check_nothing_left(out);
    write_shard(src, "x_train_000003.bin", 4, 41);
    CHECK_BAD_INPUT(crew_prep_shards(src, 50257, 40, out, NULL, NULL), "no val shard holds seq_len + 1 = 41 tokens");
    check_nothing_left(out);
    /* A name claiming both splits. */
    write_shard(src, "x_train_val.bin", 4, 41);
    CHECK_BAD_INPUT(crew_prep_shards(src, 50257, 8, out, NULL, NULL), "x_train_val.bin: the name has both");
    check_nothing_left(out);
    remove(join(path, src, "x_train_val.bin"));
    /* A missing folder; arguments out of range. */
    CHECK_BAD_INPUT(crew_prep_shards(join(path, tmp_dir, "no-such"), 50257, 8, out, NULL, NULL), "no-such");
    CHECK_ERR(crew_prep_shards(src, 1, 8, out, NULL, NULL), "vocab must be in [2, 65536]");
    CHECK_ERR(crew_prep_shards(src, 65537, 8, out, NULL, NULL), "vocab must be in [2, 65536]");
    CHECK_ERR(crew_prep_shards(src, 50257, 0, out, NULL, NULL), "seq_len must be in");
    CHECK_ERR(crew_prep_shards(NULL, 50257, 8, out, NULL, NULL), "required");
    check_nothing_left(out);
    CHECK_OK(crew_prep_shards(src, 65536, 8, out, NULL, NULL));
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/crew-shards-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    test_shards();
    test_copy_across_file_systems();
    test_errors();
    rm_tree(tmp_dir);
    return check_report();
}
