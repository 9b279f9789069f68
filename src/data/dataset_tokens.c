/* dataset_tokens.c — a token dataset's split as training samples: windows of `context` tokens
 * from its llm.c shards, each labelled with the tokens that follow (next-token prediction, a
 * loss at every position). The windows are the samples the epoch order shuffles, so a GPT run
 * is sampled by the same seeded, thread-count-independent order as an image run. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/status.h"
#include "data/dataset.h"
#include "data/manifest.h"

/* Windows of a shard of `count` tokens: each needs its context and one token more. */
static int64_t windows_in(int64_t count, int64_t context) { return count > context ? (count - 1) / context : 0; }

static crew_status set_windows(crew_dataset *d, int64_t context)
{
    int64_t longest = 0, n = 0;
    for (int k = 0; k < d->n_shards; k++) {
        d->first_window[k] = n;
        n += windows_in(d->shards[k].count, context);
        if (d->shards[k].count > longest) longest = d->shards[k].count;
    }
    d->first_window[d->n_shards] = n;
    if (n == 0)
        return crew_errorf(CREW_CODE_BAD_INPUT,
                           "%s (%s): a context of %lld tokens needs shards of at least %lld tokens; the longest "
                           "has %lld",
                           d->dir, d->split, (long long)context, (long long)context + 1, (long long)longest);
    d->n = n;
    d->context = context;
    d->label_positions = context;
    d->sample = (crew_shape){1, {context}};
    return CREW_OK;
}

/* Every token must lie in the vocabulary: a bad id would index past an embedding table. */
static crew_status check_tokens(const crew_dataset *d, int k)
{
    const crew_token_shard *sh = &d->shards[k];
    for (int64_t i = 0; i < sh->count; i++)
        if ((int64_t)sh->tokens[i] >= d->classes)
            return crew_errorf(CREW_CODE_BAD_INPUT, "%s/%s: token %u at index %lld is outside the vocabulary [0, %d)",
                               d->dir, d->shard_file[k], (unsigned)sh->tokens[i], (long long)i, d->classes);
    return CREW_OK;
}

static crew_status open_shard(crew_dataset *d, const crew_manifest_shard *ms, int k)
{
    char path[1024];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", d->dir, ms->file) >= sizeof path)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s/%s: path too long", d->dir, ms->file);
    snprintf(d->shard_file[k], sizeof d->shard_file[k], "%s", ms->file);
    d->shard_xxh3[k] = ms->xxh3;
    CREW_TRY(crew_tokens_open(path, &d->shards[k]));
    d->n_shards = k + 1; /* closed from here on */
    if (d->shards[k].count != ms->tokens)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: holds %lld tokens but %s says %lld", path,
                           (long long)d->shards[k].count, CREW_MANIFEST_FILE, (long long)ms->tokens);
    return check_tokens(d, k);
}

crew_status crew_dataset_open_tokens(crew_dataset *d, const crew_manifest *m, const char *split)
{
    const char *want = strcmp(split, "test") == 0 ? "val" : split;
    int count = 0;
    for (int i = 0; i < m->tokens.n_shards; i++) count += strcmp(m->tokens.shards[i].split, want) == 0;
    if (count == 0)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s is a token dataset with no '%s' shards", d->dir, want);
    d->tokens = 1;
    d->classes = m->tokens.vocab;
    snprintf(d->name, sizeof d->name, "%s", m->name);
    d->shards = calloc((size_t)count, sizeof *d->shards);
    d->first_window = calloc((size_t)count + 1, sizeof *d->first_window);
    d->shard_xxh3 = calloc((size_t)count, sizeof *d->shard_xxh3);
    d->shard_file = calloc((size_t)count, sizeof *d->shard_file);
    if (!d->shards || !d->first_window || !d->shard_xxh3 || !d->shard_file) return CREW_OOM();
    int k = 0;
    for (int i = 0; i < m->tokens.n_shards; i++)
        if (strcmp(m->tokens.shards[i].split, want) == 0) CREW_TRY(open_shard(d, &m->tokens.shards[i], k++));
    return set_windows(d, m->tokens.seq_len);
}

void crew_dataset_close_tokens(crew_dataset *d)
{
    for (int k = 0; k < d->n_shards; k++) crew_tokens_close(&d->shards[k]);
    free(d->shards);
    free(d->first_window);
    free(d->shard_xxh3);
    free(d->shard_file);
}

crew_status crew_dataset_set_context(crew_dataset *d, int64_t context)
{
    if (!d) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_dataset_set_context: NULL dataset");
    if (!d->tokens)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%s (%s) is not a token dataset: its samples have no context",
                           d->dir, d->split);
    if (context < 1 || context > (1 << 24))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "context must be in [1, 2^24], got %lld", (long long)context);
    return set_windows(d, context);
}

int crew_dataset_is_tokens(const crew_dataset *d) { return d && d->tokens; }

crew_status crew_dataset_verify_tokens(const crew_dataset *d)
{
    for (int k = 0; k < d->n_shards; k++) {
        uint64_t have = XXH3_64bits(d->shards[k].map, d->shards[k].map_len);
        if (have != d->shard_xxh3[k])
            return crew_errorf(CREW_CODE_BAD_INPUT,
                               "%s/%s: content hash %016llx does not match %s's %016llx (the file is corrupt or was "
                               "modified)",
                               d->dir, d->shard_file[k], (unsigned long long)have, CREW_MANIFEST_FILE,
                               (unsigned long long)d->shard_xxh3[k]);
    }
    return CREW_OK;
}

/* The shard holding window w: the last k with first_window[k] <= w. */
static int shard_of(const crew_dataset *d, int64_t w)
{
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first_window[mid] <= w) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void crew_dataset_gather_tokens(const crew_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y)
{
    const int64_t T = d->context;
    for (int64_t i = 0; i < n; i++) {
        int k = shard_of(d, idx[i]);
        const uint16_t *t = d->shards[k].tokens + (idx[i] - d->first_window[k]) * T;
        for (int64_t j = 0; j < T; j++) {
            if (x) x[i * T + j] = (float)t[j];
            if (y) y[i * T + j] = (int32_t)t[j + 1];
        }
    }
}
