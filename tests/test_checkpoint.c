/* test_checkpoint.c — checkpoints as a resumed run meets them (docs/CHECKPOINTS.md):
 * - state.json carries, besides the batch and learning-rate plan, everything else that changes
 *   the numbers (augmentation, the last partial batch, synchronised batch norm, the NaN policy,
 *   BLAS threads per replica, the precision, the convolutions' ways) and reads it back the same;
 *   a bad way in state.json, and a checkpoint from before the ways, are read as documented;
 * - a write that fails (a file size limit stands for a full disk) leaves the out-parameter naming
 *   the last checkpoint that was committed, and no partial checkpoint behind;
 * - a damaged checkpoint (no COMPLETE marker) is set aside and the previous one used;
 * - an intact checkpoint of another model whose tensors have the same names and shapes (another
 *   activation, dropout rate or weight decay) is refused with the difference named, and neither
 *   it nor any older checkpoint is renamed, moved or tried;
 * - nothing outside the checkpoints' directory is removed through a symbolic link in it (a dead
 *   writer's temporary, an old checkpoint pruned);
 * - a resume's note past many damaged checkpoints names the one used first and summarises the
 *   rest: it never ends mid-sentence;
 * - state.json names the CPU GEMM library that wrote it; a resume under another one, or from a
 *   checkpoint that does not say, goes on and its note says the last bits will differ. */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "fs_helpers.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "synthetic.h"
#include "train/checkpoint.h"
#include "train/checkpoint_json.h"
#include "train/train.h"

typedef struct model_variant {
    crew_activation activation;
    float dropout;
    float weight_decay;
} model_variant;

static const model_variant base_model = {CREW_ACT_RELU, 0.25f, 1e-4f};

/* dense(12, activation) → dropout → dense(10) on vectors of 6, AdamW, initialised from a seed. */
static crew_model *make_model(model_variant v)
{
    crew_model *m = NULL;
    crew_layer_spec layers[] = {
        {.type = CREW_LAYER_DENSE, .units = 12, .activation = v.activation},
        {.type = CREW_LAYER_DROPOUT, .rate = v.dropout},
        {.type = CREW_LAYER_DENSE, .units = 10},
    };
    crew_status s = crew_model_create((int64_t[]){6}, 1, &m);
    for (size_t i = 0; !s && i < sizeof layers / sizeof *layers; i++) s = crew_model_add(m, &layers[i]);
    crew_compile_options c = {.loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY,
                              .optimizer = {.type = CREW_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9, .beta2 = 0.999,
                                            .eps = 1e-8f, .weight_decay = v.weight_decay}};
    if (!s) s = crew_model_compile(m, &c);
    if (!s) s = crew_model_layout(m);
    if (!s) s = crew_model_init_params(m, 5);
    CHECK_OK(s);
    return m;
}

static crew_checkpoint_state make_state(int64_t step)
{
    crew_checkpoint_state st = {.step = step};
    crew_fit_plan *p = &st.plan;
    snprintf(p->device_kind, sizeof p->device_kind, "cpu");
    p->devices = 1;
    p->threads_per_device = 2;
    p->batch_per_device = 4;
    p->accumulation = 1;
    p->global_batch = 4;
    p->train_samples = 42;
    p->steps_per_epoch = 11;
    p->epochs = 10;
    p->total_steps = 110;
    p->seed = 7;
    p->base_lr = 1e-3f;
    p->base_batch = 4;
    p->lr_factor = 1.0f;
    p->augment = (crew_augment_options){.crop_padding = 2, .flip = 1};
    p->pad_last_batch = 1;
    p->sync_batch_norm = 1;
    p->on_nan = CREW_ON_NAN_SKIP;
    p->precision = CREW_PRECISION_BF16;
    p->conv = CREW_CONV_LIBRARY;
    snprintf(p->conv_choice, sizeof p->conv_choice, "lil");
    st.lr = (crew_lr_plan){.schedule = CREW_SCHED_COSINE, .peak_lr = 1e-3f, .total_steps = 110};
    return st;
}

typedef struct fixture {
    char dir[256], root[300];
    crew_model *m;
    crew_optimizer opt;
} fixture;

static int fixture_open(fixture *fx)
{
    snprintf(fx->dir, sizeof fx->dir, "/tmp/crew-test-checkpoint-XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    snprintf(fx->root, sizeof fx->root, "%s/checkpoints", fx->dir);
    fx->m = make_model(base_model);
    if (!fx->m) return -1;
    crew_status s = crew_optimizer_init(&fx->opt, &fx->m->compile.optimizer, &fx->m->be, fx->m->n_params);
    CHECK_OK(s);
    return s ? -1 : 0;
}

static void fixture_close(fixture *fx)
{
    crew_optimizer_release(&fx->opt, &fx->m->be);
    crew_model_free(fx->m);
    syn_remove(fx->dir);
}

static void write_step(fixture *fx, int64_t step, char *path, size_t len)
{
    crew_checkpoint_state st = make_state(step);
    CHECK_OK(crew_checkpoint_write(fx->root, fx->m, &fx->opt, &st, 5, path, len));
}

static void test_state_round_trip(fixture *fx)
{
    char path[700], dir[700];
    write_step(fx, 11, path, sizeof path);
    snprintf(dir, sizeof dir, "%s/step-00000011", fx->root);
    CHECK(strcmp(path, dir) == 0);
    crew_checkpoint_state want = make_state(11), got;
    CHECK_OK(crew_checkpoint_read_state(dir, &got));
    CHECK(got.has_options == 1);
    CHECK(got.step == 11 && got.plan.total_steps == 110 && got.plan.seed == 7);
    CHECK(got.plan.threads_per_device == want.plan.threads_per_device);
    CHECK(got.plan.augment.crop_padding == 2 && got.plan.augment.flip == 1);
    CHECK(got.plan.pad_last_batch == 1 && got.plan.sync_batch_norm == 1 && got.plan.on_nan == CREW_ON_NAN_SKIP);
    CHECK(got.plan.precision == CREW_PRECISION_BF16);
    CHECK(got.plan.conv == CREW_CONV_LIBRARY && strcmp(got.plan.conv_choice, "lil") == 0);
    crew_fit_options o = {.devices = 1};
    CHECK_OK(crew_resume_options(&o, &got));
    CHECK_MSG(o.precision == CREW_PRECISION_BF16, "a resumed run does not take its checkpoint's precision");
    CHECK_MSG(o.conv == CREW_CONV_LIBRARY, "a resumed run does not take its checkpoint's way of convolving");
}

/* Checkpoint dir's state.json as a string in out[cap] ("" when it cannot be read). */
static void state_text(const char *dir, char *out, size_t cap)
{
    char path[800];
    snprintf(path, sizeof path, "%s/state.json", dir);
    size_t n = 0;
    uint8_t *b = read_file(path, &n);
    n = b && n < cap ? n : 0;
    if (b) memcpy(out, b, n);
    out[n] = '\0';
    free(b);
}

/* text with its first `from` replaced by `to`, into out; 0 when it has no `from`. */
static int replaced(const char *text, const char *from, const char *to, char *out, size_t len)
{
    const char *at = strstr(text, from);
    return at && (size_t)snprintf(out, len, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from)) < len;
}

/* The ways of convolving in state.json: a way crew does not know, or ways that are not 'l' and
 * 'i', are refused with the key named; a checkpoint from before them (the flag conv_library, or
 * nothing) reads as every layer one way. */
static void test_conv_keys(fixture *fx)
{
    char dir[700], text[16384], edited[16384], again[16384];
    snprintf(dir, sizeof dir, "%s/step-00000011", fx->root);
    state_text(dir, text, sizeof text);
    const struct {
        const char *from, *to, *needle;
    } bad[] = { /* cJSON writes a tab after the colon */
        {"\"conv\":\t\"library\"", "\"conv\":\t\"winograd\"", "key 'conv' must be"},
        {"\"conv_choice\":\t\"lil\"", "\"conv_choice\":\t\"lxl\"", "key 'conv_choice' must be"},
        {"\"conv_choice\":\t\"lil\"", "\"conv_choice\":\t7", "key 'conv_choice' must be a string"},
    };
    crew_checkpoint_state got;
    crew_checkpoint_file_sum sums[CREW_CHECKPOINT_FILES];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(replaced(text, bad[i].from, bad[i].to, edited, sizeof edited), "state.json has no %s", bad[i].from);
        crew_status s = crew_checkpoint_state_parse(edited, "state.json", &got, sums);
        CHECK_MSG(s && crew_status_code(s) == CREW_CODE_BAD_INPUT && strstr(crew_status_message(s), bad[i].needle),
                  "%s: %s", bad[i].to, crew_status_message(s));
        crew_status_free(s);
    }
    /* older checkpoints: the flag, or nothing */
    CHECK(replaced(text, "\"conv\":\t\"library\",", "\"conv_library\":\ttrue,", edited, sizeof edited));
    CHECK(replaced(edited, "\"conv_choice\":\t\"lil\"", "\"unrelated\":\t7", again, sizeof again));
    CHECK_OK(crew_checkpoint_state_parse(again, "state.json", &got, sums));
    CHECK(got.plan.conv == CREW_CONV_LIBRARY && got.plan.conv_choice[0] == '\0');
    CHECK(replaced(again, "\"conv_library\":\ttrue,", "", edited, sizeof edited));
    CHECK_OK(crew_checkpoint_state_parse(edited, "state.json", &got, sums));
    CHECK(got.plan.conv == CREW_CONV_IM2COL && got.plan.conv_choice[0] == '\0');
}

/* A file size limit makes the next checkpoint's first file fail, as a full disk would. */
static void test_failed_write_names_the_last_committed(fixture *fx)
{
    char path[700], want[700];
    write_step(fx, 22, path, sizeof path);
    snprintf(want, sizeof want, "%s/step-00000022", fx->root);
    CHECK(strcmp(path, want) == 0);
    struct rlimit old, tiny;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    tiny = old;
    tiny.rlim_cur = 64;
    signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead of killing the test */
    CHECK(setrlimit(RLIMIT_FSIZE, &tiny) == 0);
    crew_checkpoint_state st = make_state(33);
    crew_status s = crew_checkpoint_write(fx->root, fx->m, &fx->opt, &st, 5, path, sizeof path);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK_MSG(s != CREW_OK, "a checkpoint was written past a 64-byte file size limit");
    crew_status_free(s);
    CHECK_MSG(strcmp(path, want) == 0, "after the failed write the last checkpoint is reported as %s, not %s", path, want);
    char failed[700];
    snprintf(failed, sizeof failed, "%s/step-00000033", fx->root);
    CHECK(!path_exists(failed));
    CHECK(temp_dirs_in(fx->root) == 0);
}

/* How many entries of root have ".refused-" in their name. */
static int set_aside_in(const char *root)
{
    DIR *d = opendir(root);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".refused-")) n++;
    if (d) closedir(d);
    return n;
}

static void expect_refused(fixture *fx, model_variant v, const char *needle)
{
    crew_model *other = make_model(v);
    crew_optimizer opt;
    if (!other) return;
    CHECK_OK(crew_optimizer_init(&opt, &other->compile.optimizer, &other->be, other->n_params));
    crew_checkpoint_state st;
    char note[1024];
    crew_status s = crew_checkpoint_resume(fx->root, other, &opt, &st, note, sizeof note);
    CHECK_MSG(s != CREW_OK, "a checkpoint of another model (%s) was loaded", needle);
    if (s) {
        const char *msg = crew_status_message(s);
        CHECK_MSG(strstr(msg, "belongs to another model") && strstr(msg, needle), "message: %s", msg);
        CHECK_MSG(crew_status_code(s) == CREW_CODE_BAD_INPUT, "code %d", (int)crew_status_code(s));
    }
    crew_status_free(s);
    char dir[700];
    for (int step = 11; step <= 22; step += 11) {
        snprintf(dir, sizeof dir, "%s/step-%08d/COMPLETE", fx->root, step);
        CHECK_MSG(path_exists(dir), "%s is gone after a refusal", dir);
    }
    CHECK(set_aside_in(fx->root) == 0);
    crew_optimizer_release(&opt, &other->be);
    crew_model_free(other);
}

static void test_other_model_refused_untouched(fixture *fx)
{
    expect_refused(fx, (model_variant){CREW_ACT_TANH, 0.25f, 1e-4f}, "activation is relu in the checkpoint's run, tanh");
    expect_refused(fx, (model_variant){CREW_ACT_RELU, 0.5f, 1e-4f}, "rate");
    expect_refused(fx, (model_variant){CREW_ACT_RELU, 0.25f, 1e-2f}, "weight_decay");
}

static void test_damaged_set_aside(fixture *fx)
{
    char marker[700];
    snprintf(marker, sizeof marker, "%s/step-00000022/COMPLETE", fx->root);
    CHECK(unlink(marker) == 0);
    crew_checkpoint_state st;
    char note[1024];
    CHECK_OK(crew_checkpoint_resume(fx->root, fx->m, &fx->opt, &st, note, sizeof note));
    CHECK_MSG(st.step == 11, "resumed from step %lld", (long long)st.step);
    CHECK_MSG(strstr(note, "incomplete") && strstr(note, "falling back"), "note: %s", note);
    CHECK(set_aside_in(fx->root) == 1);
}

/* A resume past more damaged checkpoints than its note holds: the checkpoint used comes first,
 * those set aside are listed whole while they fit and counted after, and the note ends with its
 * sentence, at any length. */
static void test_long_note_summarised(void)
{
    fixture fx;
    if (fixture_open(&fx) != 0) return;
    char path[700], marker[700];
    for (int step = 1; step <= 10; step++) {
        crew_checkpoint_state st = make_state(step);
        CHECK_OK(crew_checkpoint_write(fx.root, fx.m, &fx.opt, &st, 20, path, sizeof path));
    }
    for (int step = 3; step <= 10; step++) {
        snprintf(marker, sizeof marker, "%s/step-%08d/COMPLETE", fx.root, step);
        CHECK(unlink(marker) == 0);
    }
    crew_checkpoint_state st;
    char note[420];
    CHECK_OK(crew_checkpoint_resume(fx.root, fx.m, &fx.opt, &st, note, sizeof note));
    char want[400];
    snprintf(want, sizeof want, "resumed from %s/step-00000002 (step 2), falling back past 8 damaged checkpoints", fx.root);
    size_t n = strlen(note);
    CHECK_MSG(!strncmp(note, want, strlen(want)) && strstr(note, "refused step-00000010, incomplete") &&
                  strstr(note, " more (step-") && n > 0 && note[n - 1] == ')',
              "the note: '%s'", note);
    CHECK(set_aside_in(fx.root) == 8);
    fixture_close(&fx);
}

/* A directory outside the run, with files of the names a checkpoint holds. */
static void make_victim(const char *dir)
{
    static const char *const names[] = {"model.safetensors", "optimizer.safetensors", "state.json", "COMPLETE", "notes"};
    char path[700];
    CHECK(mkdir(dir, 0755) == 0);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        write_file(path, "keep me\n", 8);
    }
}

static int victim_intact(const char *dir)
{
    static const char *const names[] = {"model.safetensors", "optimizer.safetensors", "state.json", "COMPLETE", "notes"};
    char path[700];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!path_exists(path)) return 0;
    }
    return 1;
}

/* Nothing outside the checkpoints' directory is removed through a symbolic link in it: not by the
 * clean-up of a dead writer's temporary (step-*.tmp-<pid> as a link to a directory), nor by the
 * pruning of old checkpoints (an old step-* as a link). The links themselves are left alone. */
static void test_links_never_followed(void)
{
    fixture fx;
    if (fixture_open(&fx) != 0) return;
    char victim[400], link[700], path[700], note[1024];
    snprintf(victim, sizeof victim, "%s/victim", fx.dir);
    make_victim(victim);
    write_step(&fx, 2, path, sizeof path);
    write_step(&fx, 4, path, sizeof path);
    /* a pid no process has (above any pid_max): its "writer" is dead */
    snprintf(link, sizeof link, "%s/step-00000006.tmp-2147483646", fx.root);
    CHECK(symlink(victim, link) == 0);
    crew_checkpoint_state st;
    CHECK_OK(crew_checkpoint_resume(fx.root, fx.m, &fx.opt, &st, note, sizeof note));
    CHECK_MSG(victim_intact(victim), "the clean-up of a stale temporary removed files through a link (note: %s)", note);
    CHECK_MSG(strstr(note, "left step-00000006.tmp-2147483646 alone (a symbolic link"), "note: %s", note);
    struct stat sb;
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    snprintf(link, sizeof link, "%s/step-00000001", fx.root);
    CHECK(symlink(victim, link) == 0);
    crew_checkpoint_state next = make_state(8);
    CHECK_OK(crew_checkpoint_write(fx.root, fx.m, &fx.opt, &next, 1, path, sizeof path));
    CHECK_MSG(victim_intact(victim), "pruning removed files through a step directory that is a link");
    snprintf(path, sizeof path, "%s/step-00000002", fx.root);
    CHECK_MSG(!path_exists(path), "pruning to 1 kept step 2");
    /* A checkpoint's file that is a link is refused untouched (never read, nor set aside as
     * damaged), and so is a step directory that is one when it is written. */
    char state[700];
    snprintf(state, sizeof state, "%s/step-00000008/state.json", fx.root);
    CHECK(unlink(state) == 0 && symlink("/etc/passwd", state) == 0);
    crew_status s = crew_checkpoint_resume(fx.root, fx.m, &fx.opt, &st, note, sizeof note);
    CHECK_MSG(s && crew_status_code(s) == CREW_CODE_BAD_INPUT &&
                  strstr(crew_status_message(s), "state.json is a symbolic link (to /etc/passwd)"),
              "a linked state.json: %s", crew_status_message(s));
    crew_status_free(s);
    CHECK(set_aside_in(fx.root) == 0);
    snprintf(link, sizeof link, "%s/step-00000010", fx.root);
    CHECK(symlink(victim, link) == 0);
    crew_checkpoint_state ten = make_state(10);
    s = crew_checkpoint_write(fx.root, fx.m, &fx.opt, &ten, 1, path, sizeof path);
    CHECK_MSG(s && strstr(crew_status_message(s), "step-00000010 is a symbolic link"), "a linked step: %s",
              crew_status_message(s));
    crew_status_free(s);
    CHECK(victim_intact(victim));
    fixture_close(&fx);
}

/* Rewrites state.json of checkpoint `dir` as `text`, with the COMPLETE marker that matches it (as a
 * crew that wrote that text would have). */
static void rewrite_state(const char *dir, const char *text)
{
    char path[800], marker[64];
    snprintf(path, sizeof path, "%s/state.json", dir);
    write_file(path, text, strlen(text));
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    snprintf(marker, sizeof marker, "%016" PRIx64 "\n", (uint64_t)XXH3_64bits(text, strlen(text)));
    write_file(path, marker, strlen(marker));
}

/* The CPU GEMM library that wrote a checkpoint is in state.json; a resume under the same one says
 * nothing of it, under another one (or from an older crew's checkpoint, which does not say) its
 * note says the last bits will differ from a run never stopped, and the run goes on. */
static void test_gemm_recorded(void)
{
    fixture fx;
    if (fixture_open(&fx) != 0) return;
    char here[160], path[800], dir[700], note[1024], text[16384], edited[16384];
    crew_blas_describe(here, sizeof here);
    write_step(&fx, 3, path, sizeof path);
    crew_checkpoint_state st;
    CHECK_OK(crew_checkpoint_resume(fx.root, fx.m, &fx.opt, &st, note, sizeof note));
    CHECK_MSG(strcmp(st.gemm, here) == 0, "state.json's gemm '%s', this crew's '%s'", st.gemm, here);
    CHECK_MSG(!strstr(note, "last bits"), "the same GEMM library, yet: %s", note);

    crew_checkpoint_state other = make_state(4);
    snprintf(other.gemm, sizeof other.gemm, "a GEMM library of another build");
    CHECK_OK(crew_checkpoint_write(fx.root, fx.m, &fx.opt, &other, 5, path, sizeof path));
    CHECK_OK(crew_checkpoint_resume(fx.root, fx.m, &fx.opt, &st, note, sizeof note));
    CHECK_MSG(st.step == 4 && strstr(note, "resumed from ") == note, "note: %s", note);
    char want[400];
    snprintf(want, sizeof want, "it was written under a GEMM library of another build and this crew runs %s: the run "
             "goes on, with other last bits than a run never stopped", here);
    CHECK_MSG(strstr(note, want), "note: %s", note);

    /* an older crew's state.json, without the key */
    snprintf(dir, sizeof dir, "%s/step-00000004", fx.root);
    state_text(dir, text, sizeof text);
    CHECK(replaced(text, "\"gemm\":\t\"a GEMM library of another build\",", "", edited, sizeof edited));
    rewrite_state(dir, edited);
    CHECK_OK(crew_checkpoint_resume(fx.root, fx.m, &fx.opt, &st, note, sizeof note));
    CHECK_MSG(st.step == 4 && st.gemm[0] == '\0', "step %lld, gemm '%s'", (long long)st.step, st.gemm);
    CHECK_MSG(strstr(note, "it does not say which CPU GEMM library its crew ran") && strstr(note, here) &&
              strstr(note, "other last bits than a run never stopped"), "note: %s", note);
    fixture_close(&fx);
}

int main(void)
{
    fixture fx;
    if (fixture_open(&fx) != 0) {
        check_report();
        return 1;
    }
    test_state_round_trip(&fx);
    test_failed_write_names_the_last_committed(&fx);
    test_other_model_refused_untouched(&fx);
    test_conv_keys(&fx);
    test_damaged_set_aside(&fx);
    fixture_close(&fx);
    test_links_never_followed();
    test_long_note_summarised();
    test_gemm_recorded();
    return check_report();
}
