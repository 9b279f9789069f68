/* test_verify_planted.c — the proof, proven: crew verify, with its default options, FAILs on each
 * bug planted in the split of the work (train/hooks.h lists them, each where a real one would sit)
 * and PASSes without them, at N = 2 and 4, on a CNN with dropout and on a CNN with batch norm,
 * both trained with AdamW and a warmup. The correct build also passes --against cpu (the full-batch
 * run on another device of the kind), which fails when that device computes in lower precision.
 *
 * Each bug is tried on the models it can affect: a dropout bug needs dropout, a batch-norm bug
 * batch norm. The table printed at the end says which of verify's checks caught each bug (the
 * first that failed, in the order: a run that stopped, the bitwise paths, the first step, the
 * rounding reference, the trajectory); docs/VERIFY.md shows it. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "train/verify.h"

#include "small_cnn.h"
#include "synthetic.h"

enum { SAMPLES = 448 };

/* small_cnn.h's CNN, with dropout 0.3 or with batch norm; AdamW with a warmup of 4 steps (so
 * that a skipped warmup changes something). */
static crew_model *model(int batch_norm)
{
    crew_compile_options c;
    crew_model_default_compile(NULL, &c); /* AdamW */
    c.optimizer.warmup_steps = 4;
    return small_cnn(batch_norm, batch_norm ? 0.0f : 0.3f, &c.optimizer);
}

/* Which check failed first: the verdict's own order. */
static const char *caught_by(const crew_verify_result *r)
{
    if (r->failure[0]) return "a run stopped";
    if (!r->bitwise_equal) return "paths (bitwise)";
    if (!r->first_step_ok) return "first step";
    if (!r->reference_ok) return "rounding reference";
    if (!r->full_batch_ok) return "trajectory";
    if (r->against_kind[0] && !r->against_first_step_ok) return "--against, first step";
    if (r->against_kind[0] && !r->against_ok) return "--against, trajectory";
    return "NOTHING";
}

static int applies(crew_planted_bug b, int batch_norm)
{
    if (b == CREW_PLANT_DROPOUT_BY_ROW) return !batch_norm;
    if (b == CREW_PLANT_LOCAL_BN_STATS) return batch_norm;
    if (b == CREW_PLANT_WRONG_LOADER_SLOT) return !batch_norm; /* waits out a deadline: once is enough */
    if (b == CREW_PLANT_AGAINST_LOW_PRECISION) return !batch_norm;
    return 1;
}

/* verify --against cpu where it has something to judge: the other device's bug, and the correct
 * build (which must pass it too). */
static const char *against_for(crew_planted_bug b)
{
    return b == CREW_PLANT_NONE || b == CREW_PLANT_AGAINST_LOW_PRECISION ? "cpu" : NULL;
}

/* crew verify's defaults (20 steps, the model's batch) on n replicas; returns the verdict. */
static int verify(const crew_dataset *d, int batch_norm, int n, crew_planted_bug b, crew_verify_result *r)
{
    crew_model *m = model(batch_norm);
    if (!m) return -1;
    crew_verify_options o;
    crew_verify_options_init(&o);
    o.devices = n;
    o.against_kind = against_for(b);
    memset(r, 0, sizeof *r);
    crew_status s = crew_verify_planted(m, d, &o, b, r);
    int pass = s ? -1 : r->pass;
    CHECK_MSG(!s, "%s, N=%d, %s: %s", batch_norm ? "batch-norm CNN" : "dropout CNN", n, crew_planted_bug_name(b),
              crew_status_message(s));
    crew_status_free(s);
    crew_model_free(m);
    return pass;
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-planted-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, SAMPLES, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (!d) return check_report();
    printf("%-56s %-15s %2s  %s\n", "planted bug", "model", "N", "verify");
    for (int bn = 0; bn <= 1; bn++)
        for (int n = 2; n <= 4; n += 2)
            for (int b = 0; b < CREW_PLANT_COUNT; b++) {
                if (!applies((crew_planted_bug)b, bn)) continue;
                crew_verify_result r;
                int pass = verify(d, bn, n, (crew_planted_bug)b, &r);
                const char *name = crew_planted_bug_name((crew_planted_bug)b);
                printf("%-56s %-15s %2d  %s%s%s\n", name, bn ? "batch-norm CNN" : "dropout CNN", n,
                       pass == 1 ? "PASS" : pass == 0 ? "FAIL, caught by " : "ERROR",
                       pass == 0 ? caught_by(&r) : "", r.failure[0] ? "" : "");
                if (r.failure[0]) printf("    %s\n", r.failure);
                if (b == CREW_PLANT_NONE)
                    CHECK_MSG(pass == 1, "%s, N=%d, no bug: verify did not pass (%s; first step %s %g of its bound)",
                              bn ? "batch-norm CNN" : "dropout CNN", n, caught_by(&r), r.first_step_decided_by,
                              r.first_step_ratio);
                else
                    CHECK_MSG(pass == 0, "%s, N=%d: verify passed with the bug '%s' planted",
                              bn ? "batch-norm CNN" : "dropout CNN", n, name);
                if (b == CREW_PLANT_NONE) /* the JSON's account of what ran */
                    CHECK_MSG(r.paths == 4 && r.replicas_compared == n && r.replica_checks == (bn ? 5 : 4) * r.steps &&
                                  r.path[2].accumulation == 2 && r.path[1].buckets > 1,
                              "paths %d, replicas %d, checks %lld", r.paths, r.replicas_compared,
                              (long long)r.replica_checks);
            }
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
