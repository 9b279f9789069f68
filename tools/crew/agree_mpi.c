/* agree_mpi.c — what every process of `mpirun ... crew train` (or verify) must agree on before it trains:
 * the same crew, the same model file, the same dataset and the same options. A mismatch is bad
 * input (exit 2) on every process, naming the MPI rank that differs and both values. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define AGREE_TIMEOUT_S 60.0

/* "size 1234, xxh3 0123abcd..." of a file, or why it cannot be read. */
static void describe_file(const char *path, char *buf, size_t len)
{
    int64_t bytes = 0;
    uint64_t h = 0;
    crew_status s = crew_file_hash(path, &bytes, &h);
    if (s)
        snprintf(buf, len, "unreadable (%s)", crew_status_message(s));
    else
        snprintf(buf, len, "%" PRId64 " bytes, xxh3 %016" PRIx64, bytes, h);
    crew_status_free(s);
}

/* A mismatch is found by every process alike: rank 0 says it, and all end without an abort. */
static int agree(const char *verb, const crew_process_group *g, const char *what, const char *value)
{
    crew_status s = crew_group_agree(g, what, value, AGREE_TIMEOUT_S);
    if (!s) return 0;
    if (crew_status_code(s) != CREW_CODE_BAD_INPUT) return cli_fail(verb, s); /* a process missing */
    cli_mpi_failed_together();
    if (crew_group_rank(g) == 0) return cli_fail(verb, s);
    crew_status_free(s);
    return 2;
}

int cli_agree_run(const char *verb, const crew_process_group *g, int argc, char **argv, const char *model,
                  const char *data, const char *init_weights)
{
    char value[600];
    int rc = agree(verb, g, "crew version", crew_version());
    if (!rc) {
        describe_file(model, value, sizeof value);
        rc = agree(verb, g, "model file", value);
    }
    if (!rc) {
        char manifest[1100];
        snprintf(manifest, sizeof manifest, "%s/manifest.json", data);
        describe_file(manifest, value, sizeof value);
        rc = agree(verb, g, "dataset manifest", value);
    }
    if (!rc && init_weights) {
        describe_file(init_weights, value, sizeof value);
        rc = agree(verb, g, "initial weights", value);
    }
    if (!rc) {
        size_t used = 0;
        value[0] = '\0';
        for (int i = 1; i < argc && used < sizeof value; i++)
            used += (size_t)snprintf(value + used, sizeof value - used, "%s%s", i > 1 ? " " : "", argv[i]);
        rc = agree(verb, g, "options", value);
    }
    return rc;
}
