/* test_flops.c — the FLOP count and the peak:
 *
 * - crew_model_flops of an MLP and of a CNN against the multiply-adds counted by hand: forward,
 *   the weight gradients of every dense and convolution layer, the input gradients only where an
 *   earlier layer needs them; the example CNN's ~25 MFLOP per sample;
 * - crew_measure_peak gives a positive rate and refuses bad arguments;
 * - the peak cache: a first call measures and writes the file, a second reads it; lines of other
 *   keys are kept; a file of garbage, a key whose figure is not a positive finite number, a key
 *   that only starts like ours, and a torn last line are never trusted (measured past, no error);
 *   a cache in a directory that does not exist is measured past too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "advise/peak_cache.h"
#include "check.h"
#include "fs_helpers.h"

static void check_mlp(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){784}, 1, &m));
    if (!m) return;
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 256, .activation = CREW_ACT_RELU}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DROPOUT, .rate = 0.2f}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 10}));
    crew_flops f;
    CHECK_OK(crew_model_flops(m, &f));
    double macs1 = 784.0 * 256, macs2 = 256.0 * 10;
    /* the first layer's input is data: no input gradient */
    CHECK_MSG(f.forward == 2 * (macs1 + macs2) && f.backward == 2 * (macs1 + macs2) + 2 * macs2 &&
                  f.total == f.forward + f.backward,
              "MLP: forward %g, backward %g", f.forward, f.backward);
    crew_model_free(m);
}

static void check_cnn(void)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_load_file("../examples/fashion_cnn.json", &m));
    if (!m) return;
    crew_flops f;
    CHECK_OK(crew_model_flops(m, &f));
    /* conv 3x3x1 -> 32 on 28x28 (same), pool, conv 3x3x32 -> 64 on 14x14, pool, dense 3136 -> 128,
     * dense 128 -> 10 */
    double c1 = 9.0 * 1 * 32 * 784, c2 = 9.0 * 32 * 64 * 196, d1 = 3136.0 * 128, d2 = 128.0 * 10;
    double fwd = 2 * (c1 + c2 + d1 + d2), bwd = fwd + 2 * (c2 + d1 + d2);
    CHECK_MSG(fabs(f.forward - fwd) < 1 && fabs(f.backward - bwd) < 1, "CNN: forward %g (want %g), backward %g (want %g)",
              f.forward, fwd, f.backward, bwd);
    CHECK_MSG(f.total > 24e6 && f.total < 26e6, "the example CNN: %g FLOPs per sample, ~25 M expected", f.total);
    crew_model_free(m);
}

static void check_measure(void)
{
    double g = 0;
    CHECK_OK(crew_measure_peak("cpu", 1, 0.05, &g));
    CHECK_MSG(g > 0.1 && g < 1e6, "measured %g GFLOP/s", g);
    CHECK_ERR(crew_measure_peak("cpu", 0, 0.05, &g), "threads must be >= 1");
    CHECK_ERR(crew_measure_peak("cpu", 1, 0.0, &g), "seconds in (0, 60]");
    CHECK_ERR(crew_measure_peak("gpu", 1, 0.05, &g), "gpu");
}

static void check_parser(void)
{
    double g = -1;
    const char *good = "other|key 7\nkey 12.5\n";
    CHECK(crew_peak_cache_find(good, strlen(good), "key", &g) && g == 12.5);
    const char *later = "key 3\nkey 4\n"; /* the last line of the key wins (a re-measurement) */
    CHECK(crew_peak_cache_find(later, strlen(later), "key", &g) && g == 4);
    const char *bad[] = {"key nan\n", "key inf\n", "key -3\n", "key 0\n", "key 1e10\n", "key 12abc\n", "key \n",
                         "key\n", "keyx 5\n", "ke 5\n", "key  5\n", "\x01\x02\xff key 5", "key 5 6\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = -1;
        CHECK_MSG(!crew_peak_cache_find(bad[i], strlen(bad[i]), "key", &g) && g == -1, "trusted line %zu: '%s'", i,
                  bad[i]);
    }
    const char torn[] = {'k', 'e', 'y', ' ', '5'}; /* no newline, no NUL: the length bounds it */
    CHECK(crew_peak_cache_find(torn, sizeof torn, "key", &g) && g == 5);
    char key[CREW_PEAK_KEY_MAX];
    crew_peak_cache_key("cpu", 2, key, sizeof key);
    CHECK_MSG(strstr(key, "threads=2") && strstr(key, "|cpu|") && !strchr(key, ' '), "key '%s'", key);
}

static int file_has(const char *path, const char *text)
{
    size_t n = 0;
    uint8_t *buf = read_file(path, &n);
    int has = 0;
    for (size_t i = 0; buf && i + strlen(text) <= n && !has; i++) has = memcmp(buf + i, text, strlen(text)) == 0;
    free(buf);
    return has;
}

static void check_cache(void)
{
    char dir[64] = "/tmp/crew-test-flops-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/peaks", dir);
    double g1 = 0, g2 = 0;
    int cached = -1;
    write_file(path, "someone else's 3\n", 17);
    CHECK_OK(crew_peak_cached(path, "cpu", 1, &g1, &cached));
    CHECK(g1 > 0 && cached == 0 && file_has(path, "someone else's 3\n") && file_has(path, "threads=1"));
    CHECK_OK(crew_peak_cached(path, "cpu", 1, &g2, &cached));
    CHECK_MSG(cached == 1 && fabs(g2 - g1) <= 1e-5 * g1, "second call: cached %d, %g vs %g", cached, g2, g1);
    /* garbage of every kind: measured past, and the file is one crew can read again */
    char key[CREW_PEAK_KEY_MAX], line[CREW_PEAK_KEY_MAX + 32];
    crew_peak_cache_key("cpu", 1, key, sizeof key);
    int n = snprintf(line, sizeof line, "\x7f\x45\x4c\x46\n%s nan\n%s", key, key); /* torn: no figure */
    write_file(path, line, (size_t)n);
    CHECK_OK(crew_peak_cached(path, "cpu", 1, &g1, &cached));
    CHECK(g1 > 0 && cached == 0);
    CHECK_OK(crew_peak_cached(path, "cpu", 1, &g2, &cached));
    CHECK(cached == 1);
    char big[70 * 1024];
    memset(big, 'x', sizeof big); /* over the cache's size: not a cache crew wrote, started anew */
    write_file(path, big, sizeof big);
    CHECK_OK(crew_peak_cached(path, "cpu", 1, &g1, &cached));
    CHECK(g1 > 0 && cached == 0 && !file_has(path, "xxxx"));
    /* no such directory: measured, nothing written, no error */
    CHECK_OK(crew_peak_cached("/nonexistent/dir/peaks", "cpu", 1, &g1, &cached));
    CHECK(g1 > 0 && cached == 0);
    CHECK_OK(crew_peak_cached(NULL, "cpu", 1, &g1, NULL));
    remove(path);
    rmdir(dir);
}

int main(void)
{
    check_mlp();
    check_cnn();
    check_measure();
    check_parser();
    check_cache();
    return check_report();
}
