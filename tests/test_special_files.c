/* test_special_files.c — every reader of outside data refuses a path that is not a regular file
 * (a FIFO, a directory, a character device, a socket), promptly and with one message naming the
 * path and what it is: "DIR/train_x.npy: not a regular file (a FIFO)".
 *
 * A reader that opened a FIFO for reading the ordinary way would wait for a writer forever, so
 * every call runs in a forked child under alarm(): the alarm is only a safety net that turns a
 * hang into a failed check (a prompt refusal never comes near it); nothing here measures time.
 *
 * Each reader is reached through its own entry point (npy, IDX raw and through crew prep, the
 * manifest, a dataset's arrays, model files, safetensors weights, llm.c
 * token shards, TensorBoard event files, images alone and in a folder scan, CSV, text, CIFAR-10
 * batches and batches.meta.txt, the file hash), and also on an empty file (a clear error naming
 * the path, never a crash) and on a file whose size is not what it says. */
#define _XOPEN_SOURCE 700 /* nftw, mkfifo, symlink */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "fs_helpers.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/manifest.h"
#include "data/image_decode.h"
#include "data/npy.h"
#include "data/tokens.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "telemetry/tb_reader.h"

#ifndef SAFETY_NET_S
#define SAFETY_NET_S 20 /* the child is killed after this; a prompt refusal takes microseconds */
#endif

static char root[128];

/* The kinds of special file planted in place of an input, and what the message must call them. */
typedef enum { K_FIFO, K_DIR, K_CHAR, K_SOCKET, K_EMPTY, K_COUNT } kind;
static const char *const kind_name[K_COUNT] = {"fifo", "dir", "char", "socket", "empty"};
static const char *const kind_says[K_COUNT] = {"not a regular file (a FIFO)", "not a regular file (a directory)",
                                               "not a regular file (a character device)",
                                               "not a regular file (a socket)", NULL};

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* root/name into buf (512 bytes); returns buf. */
static char *at(char *buf, const char *name)
{
    snprintf(buf, 512, "%s/%s", root, name);
    return buf;
}

static void mkdir_ok(const char *path) { CHECK_MSG(mkdir(path, 0755) == 0, "mkdir %s: %s", path, strerror(errno)); }

/* Plants a special file of kind k at path (which must not exist). */
static void plant(const char *path, kind k)
{
    int ok = 0;
    switch (k) {
    case K_FIFO: ok = mkfifo(path, 0644) == 0; break;
    case K_DIR: ok = mkdir(path, 0755) == 0; break;
    case K_CHAR: ok = symlink("/dev/zero", path) == 0; break; /* followed, as any input path is */
    case K_SOCKET: {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        ok = fd >= 0 && strlen(path) < sizeof a.sun_path;
        if (ok) {
            memcpy(a.sun_path, path, strlen(path) + 1);
            ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0; /* the socket file stays after close */
        }
        if (fd >= 0) close(fd);
        break;
    }
    case K_EMPTY: write_file(path, "", 0); ok = 1; break;
    default: break;
    }
    CHECK_MSG(ok, "could not make a %s at %s: %s", kind_name[k], path, strerror(errno));
}

/* A reader call on one path. ctx is the case's own setting (an output directory, a model). */
typedef crew_status (*reader)(const char *arg, void *ctx);

/* Runs call(arg) in a child under the safety-net alarm and expects an error whose message holds
 * "PATH: SAYS" (the planted path and the kind's wording; for an empty file, the path). */
static void expect_refused(const char *label, reader call, const char *arg, void *ctx, const char *path, kind k)
{
    char needle[700];
    if (kind_says[k]) snprintf(needle, sizeof needle, "%s: %s", path, kind_says[k]);
    else snprintf(needle, sizeof needle, "%s", path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(SAFETY_NET_S);
        crew_status s = call(arg, ctx);
        const char *msg = s ? crew_status_message(s) : NULL;
        int ok = msg && strstr(msg, needle) && !strchr(msg, '\n') &&
                 (crew_status_code(s) == CREW_CODE_BAD_INPUT || crew_status_code(s) == CREW_CODE_IO);
        if (!ok)
            fprintf(stderr, "%s on a %s: got %s%s%s, expected an error holding '%s'\n", label, kind_name[k],
                    msg ? "'" : "", msg ? msg : "success", msg ? "'" : "", needle);
        crew_status_free(s);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        CHECK_MSG(0, "%s on a %s (%s): blocked until the %d s safety net fired", label, kind_name[k], path,
                  SAFETY_NET_S);
    else if (WIFSIGNALED(st))
        CHECK_MSG(0, "%s on a %s (%s): killed by signal %d", label, kind_name[k], path, WTERMSIG(st));
    else
        CHECK_MSG(WEXITSTATUS(st) == 0, "%s on a %s (%s): wrong result (above)", label, kind_name[k], path);
}

/* ---------------------------------------------------------------- readers given a file path */

static crew_status r_npy(const char *p, void *c)
{
    (void)c;
    crew_npy a;
    crew_status s = crew_npy_open(p, &a);
    if (!s) crew_npy_close(&a);
    return s;
}

static crew_status r_idx(const char *p, void *c)
{
    (void)c;
    crew_idx x;
    crew_status s = crew_idx_read(p, &x);
    if (!s) crew_idx_free(&x);
    return s;
}

static crew_status r_model(const char *p, void *c)
{
    (void)c;
    crew_model *m = NULL;
    crew_status s = crew_model_load_file(p, &m);
    crew_model_free(m);
    return s;
}

static crew_status r_safetensors(const char *p, void *c)
{
    (void)c;
    crew_st_file f;
    crew_status s = crew_st_read(p, &f);
    if (!s) crew_st_free(&f);
    return s;
}

static crew_status r_weights(const char *p, void *c) { return crew_model_load_weights(c, p); }

static crew_status r_tokens(const char *p, void *c)
{
    (void)c;
    crew_token_shard sh;
    crew_status s = crew_tokens_open(p, &sh);
    if (!s) crew_tokens_close(&sh);
    return s;
}

static crew_status r_tensorboard(const char *p, void *c)
{
    (void)c;
    return crew_tb_read(p, NULL, NULL);
}

static crew_status r_image(const char *p, void *c)
{
    (void)c;
    crew_image img;
    crew_status s = crew_image_read(p, &img);
    if (!s) crew_image_free(&img);
    return s;
}

static crew_status r_hash(const char *p, void *c)
{
    (void)c;
    int64_t bytes;
    uint64_t h;
    crew_status s = crew_file_hash(p, &bytes, &h);
    /* An empty regular file hashes fine: there the test wants the error of the readers. */
    if (!s) s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: hashed %lld bytes", p, (long long)bytes);
    return s;
}

static crew_status r_prep_csv(const char *p, void *out) { return crew_prep_csv(p, "y", 0.5, 0, out, NULL, NULL); }
static crew_status r_prep_text(const char *p, void *out) { return crew_prep_text(p, 8, 0.1, out, NULL, NULL); }
static crew_status r_prep_idx(const char *p, void *out) { return crew_prep_idx(p, p, NULL, NULL, out, NULL, NULL); }

/* ---------------------------------------------------------------- readers given a directory */

static crew_status r_manifest(const char *dir, void *c)
{
    (void)c;
    crew_manifest m;
    crew_status s = crew_manifest_read(dir, &m);
    if (!s) crew_manifest_free(&m);
    return s;
}

static crew_status r_dataset(const char *dir, void *c)
{
    (void)c;
    crew_dataset *d = NULL;
    crew_status s = crew_dataset_open(dir, "train", &d);
    crew_dataset_free(d);
    return s;
}

static crew_status r_fashion(const char *dir, void *out) { return crew_prep_fashion_mnist(dir, out, NULL, NULL); }
static crew_status r_cifar(const char *dir, void *out) { return crew_prep_cifar10(dir, out, NULL, NULL); }

static crew_status r_images(const char *dir, void *out)
{
    crew_image_prep_options o = {.height = 4, .width = 4, .channels = 1, .test_fraction = 0.5, .seed = 0};
    return crew_prep_images(dir, &o, out, NULL, NULL);
}

/* ---------------------------------------------------------------- fixtures */

static const char csv_text[] = "a,y\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n";

/* A small valid dataset directory at dir (from a CSV, through crew prep). */
static void make_dataset(const char *dir)
{
    char csv[512];
    at(csv, "fixture.csv");
    write_file(csv, csv_text, sizeof csv_text - 1);
    CHECK_OK(crew_prep_csv(csv, "y", 0.5, 0, dir, NULL, NULL));
}

/* The six CIFAR-10 batches of one record each, label 0; batches.meta.txt is left to the case. */
static void make_cifar(const char *dir)
{
    static const char *const names[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                        "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
    static uint8_t record[3073];
    char p[600];
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        write_file(p, record, sizeof record);
    }
}

/* An output directory that does not exist yet, unique per case: a refused input must leave none. */
static char *out_dir(char *buf, const char *label, kind k)
{
    snprintf(buf, 512, "%s/out-%s-%s", root, label, kind_name[k]);
    return buf;
}

static void check_no_output(const char *out)
{
    CHECK_MSG(!path_exists(out), "%s was written although the input was refused", out);
}

static void test_path_readers(kind k, crew_model *mlp)
{
    static const struct {
        const char *label;
        reader call;
        int out; /* ctx is a fresh output directory */
    } cases[] = {
        {"crew_npy_open", r_npy, 0},          {"crew_idx_read", r_idx, 0},
        {"crew_model_load_file", r_model, 0}, {"crew_st_read", r_safetensors, 0},
        {"crew_model_load_weights", r_weights, 0}, {"crew_tokens_open", r_tokens, 0},
        {"crew_tb_read", r_tensorboard, 0},   {"crew_image_read", r_image, 0},
        {"crew_file_hash", r_hash, 0},        {"crew_prep_csv", r_prep_csv, 1},
        {"crew_prep_text", r_prep_text, 1},   {"crew_prep_idx", r_prep_idx, 1},
    };
    char path[512], name[64], out[512];
    snprintf(name, sizeof name, "input-%s.bin", kind_name[k]);
    plant(at(path, name), k);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (k == K_EMPTY && cases[i].call == r_tensorboard) continue; /* an empty event file holds no records */
        void *ctx = cases[i].call == r_weights ? (void *)mlp : NULL;
        if (cases[i].out) ctx = out_dir(out, cases[i].label, k);
        expect_refused(cases[i].label, cases[i].call, path, ctx, path, k);
        if (cases[i].out) check_no_output(out);
    }
    /* The device itself, not only a link to one. */
    if (k == K_CHAR) {
        expect_refused("crew_npy_open", r_npy, "/dev/null", NULL, "/dev/null", k);
        expect_refused("crew_model_load_file", r_model, "/dev/urandom", NULL, "/dev/urandom", k);
        expect_refused("crew_file_hash", r_hash, "/dev/zero", NULL, "/dev/zero", k);
    }
}

static void test_dir_readers(kind k)
{
    char dir[512], name[64], path[600], out[512];

    snprintf(name, sizeof name, "manifest-%s", kind_name[k]);
    mkdir_ok(at(dir, name));
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    plant(path, k);
    expect_refused("crew_manifest_read", r_manifest, dir, NULL, path, k);

    /* The case: a FIFO (or the like) in place of train_x.npy. */
    snprintf(name, sizeof name, "dataset-%s", kind_name[k]);
    make_dataset(at(dir, name));
    snprintf(path, sizeof path, "%s/train_x.npy", dir);
    CHECK(unlink(path) == 0);
    plant(path, k);
    expect_refused("crew_dataset_open", r_dataset, dir, NULL, path, k);

    snprintf(name, sizeof name, "fashion-%s", kind_name[k]);
    mkdir_ok(at(dir, name));
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    plant(path, k);
    expect_refused("crew_prep_fashion_mnist", r_fashion, dir, out_dir(out, "fashion", k), path, k);
    check_no_output(out);

    snprintf(name, sizeof name, "cifar-batch-%s", kind_name[k]);
    mkdir_ok(at(dir, name));
    make_cifar(dir);
    snprintf(path, sizeof path, "%s/data_batch_3.bin", dir);
    CHECK(unlink(path) == 0);
    plant(path, k);
    expect_refused("crew_prep_cifar10 (a batch)", r_cifar, dir, out_dir(out, "cifar-batch", k), path, k);
    check_no_output(out);

    snprintf(name, sizeof name, "cifar-meta-%s", kind_name[k]);
    mkdir_ok(at(dir, name));
    make_cifar(dir);
    snprintf(path, sizeof path, "%s/batches.meta.txt", dir);
    plant(path, k);
    expect_refused("crew_prep_cifar10 (batches.meta.txt)", r_cifar, dir, out_dir(out, "cifar-meta", k), path, k);
    check_no_output(out);

    /* A folder scan: a nested folder named like an image is skipped, as every nested folder is;
     * anything else named like an image must be one. */
    if (k != K_DIR) {
        snprintf(name, sizeof name, "images-%s", kind_name[k]);
        mkdir_ok(at(dir, name));
        snprintf(path, sizeof path, "%s/cat", dir);
        mkdir_ok(path);
        snprintf(path, sizeof path, "%s/cat/a.png", dir);
        plant(path, k);
        expect_refused("crew_prep_images", r_images, dir, out_dir(out, "images", k), path, k);
        check_no_output(out);
    }
}

/* A file whose size changes while it is read: what stat said is not what read() gives. A file
 * in /proc is the deterministic case (its size says 0, its reads give text), standing for one that
 * another process grows or truncates meanwhile. */
static void test_size_changes(void)
{
    const char *proc = "/proc/self/status";
    struct stat st;
    if (stat(proc, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 0) {
        printf("skipped: %s is not a zero-sized regular file here\n", proc);
        return;
    }
    crew_model *m = NULL;
    CHECK_ERR(crew_model_load_file(proc, &m), "/proc/self/status: changed size while being read (0 bytes when opened)");
    crew_idx x;
    CHECK_ERR(crew_idx_read(proc, &x), "/proc/self/status: changed size while being read");
    crew_image img;
    CHECK_ERR(crew_image_read(proc, &img), "/proc/self/status: changed size while being read");
    int64_t bytes;
    uint64_t h;
    CHECK_ERR(crew_file_hash(proc, &bytes, &h), "/proc/self/status: changed size while being read");
}

int main(void)
{
    /* Short: a socket's path must fit sun_path (108 bytes). */
    snprintf(root, sizeof root, "/tmp/crew_special_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    crew_model *mlp = NULL;
    const char model[] = "{\"input_shape\": [3], \"layers\": [{\"type\": \"dense\", \"units\": 2}]}";
    CHECK_OK(crew_model_parse_json(model, sizeof model - 1, "inline", &mlp));
    for (int k = 0; k < K_COUNT; k++) {
        test_path_readers((kind)k, mlp);
        if (k != K_EMPTY) test_dir_readers((kind)k);
    }
    test_size_changes();
    crew_model_free(mlp);
    rm_tree(root);
    return check_report();
}
