/* bench_mpi_allreduce.c — crew's all-reduce between processes against MPI_Allreduce on the same
 * buffers (docs/PERFORMANCE.md, "MPI all-reduce against MPI_Allreduce (issue 13)").
 *
 *   mpirun -np P bench_mpi_allreduce [--quick] [--reps N] [--markdown]
 *
 * Built only when CMake found MPI. One replica per process (T = 1: an in-process communicator of
 * size 1 with no device, so the buffers are host memory, as on the CPU device kinds), and for
 * float32 buffers of 4 KB, 64 KB, 1 MB, 16 MB and 64 MB four contestants:
 *   mpi       MPI_Allreduce(MPI_IN_PLACE, ..., MPI_FLOAT, MPI_SUM): the library's own algorithm;
 *   crew      crew's all-reduce through the communicator table (ops->allreduce, SUM, F32);
 *   ord k=1   crew's ordered all-reduce, one input per rank (ops->allreduce_ordered);
 *   ord k=2   the same with two inputs per rank (a replica accumulating two micro-batches);
 *   fast      crew's all-reduce with the unordered path (--allreduce fast): each process's own sum,
 *             then MPI_Iallreduce polled against the deadline, with Open MPI's libnbc told to use
 *             its ring (the setting crew's command line makes; left alone when already set).
 * Rank 0 prints, per size, the median time per operation, the bus bandwidth 2(P − 1)/P · bytes /
 * time (nccl-tests' busbw: what each process moves through its link in a ring, so that figures
 * for different P compare, and a ring all-reduce at the link's speed reads as the link's speed;
 * bytes is the output buffer for all four, so k = 2's extra traffic shows as a lower figure) and
 * crew's ratio to MPI_Allreduce (time of MPI over time of crew: 1 is a tie, below 1 crew is slower).
 *
 * Methodology, and why:
 *   - Paired rounds. A round runs every contestant once, back to back, and the order is reversed
 *     every other round: on a shared machine the speed drifts over seconds, and whichever went
 *     first or last would otherwise collect the drift. A warm-up round, not timed, comes first
 *     (crew's leader grows its scratch buffers on its first call; MPI sets up its shared-memory
 *     segments and the tuned collectives pick their algorithm).
 *   - The median of the rounds per size, more rounds for small sizes (a 4 KB operation is tens of
 *     microseconds, and one descheduling of a process costs milliseconds; the median ignores such
 *     outliers without trimming by hand). --quick runs about a tenth as many.
 *   - MPI_Barrier before each timed operation, so that every process enters it together and the
 *     time is the operation's, not the wait for a late peer. Each process times its own call; a
 *     round's time is the slowest process's (the operation is done when the last one is), taken
 *     with one MPI_Reduce (MAX) per size after the timing, outside it.
 *   - The in-place contestants (mpi, crew) start every round from the same input, copied in before
 *     the barrier (untimed): with the sum growing in place the values would change from round to
 *     round, and the copy leaves the buffer in cache to the same degree for both. The ordered ones
 *     write a separate output and leave their inputs alone.
 *   - Every result is checked, outside the timing, and a wrong one ends the run with status 1.
 *     The in-place inputs are small integers held as floats, so every summation order gives the
 *     same exact sum and MPI_Allreduce (whose order is its own) and crew must both equal it. The
 *     ordered inputs are not integers, and the result must equal, bit for bit, the left fold of
 *     every rank's inputs in rank order (rank 0's k inputs, then rank 1's, ...): the determinism
 *     contract (comm.h).
 *   - A line below the table gives the latency floor: MPI_Barrier against crew's barrier (one
 *     1-byte exchange with every peer, the same polled exchange the all-reduce makes twice).
 *   - "Other cores" is the machine's busy CPU during the measurement minus what all the
 *     processes of this run used (/proc/stat; only when every process runs on rank 0's host):
 *     on the shared 2-core machine rerun when it is above about 0.1 core.
 */
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_machine.h"
#include "bench_stats.h"
#include "comm/comm.h"
#include "comm/comm_mpi.h"
#include "core/status.h"
#include "crew.h"

#define N_SIZES 5
#define N_CONTESTANTS 5
#define TIMEOUT_S 120.0

static const int64_t size_bytes[N_SIZES] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
static const int full_reps[N_SIZES] = {1000, 400, 100, 30, 11};
static const int quick_reps[N_SIZES] = {50, 20, 8, 5, 3};
static const char *const names[N_CONTESTANTS] = {"MPI_Allreduce", "crew allreduce", "ordered k=1", "ordered k=2",
                                                  "crew fast"};

typedef struct args {
    int quick, reps, markdown;
} args;

static void usage(FILE *f)
{
    fprintf(f, "usage: mpirun -np P bench_mpi_allreduce [--quick] [--reps N] [--markdown]\n"
               "  --quick      about a tenth of the rounds (50 at 4 KB down to 3 at 64 MB; else 1000 down to 11)\n"
               "  --reps N     N rounds at every size instead\n"
               "  --markdown   the table as Markdown rows\n");
}

static int parse(int argc, char **argv, args *a)
{
    *a = (args){0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
        if (!strcmp(argv[i], "--quick")) { a->quick = 1; continue; }
        if (!strcmp(argv[i], "--markdown")) { a->markdown = 1; continue; }
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            char *end;
            errno = 0;
            long n = strtol(argv[++i], &end, 10);
            if (errno || *end || n < 1 || n > 100000) return -1;
            a->reps = (int)n;
            continue;
        }
        return -1;
    }
    return 0;
}

/* Rank r's in-place input: small integers (|x| < 512), exact in any summation order for any P
 * below 2^15. */
static float int_value(int r, int64_t i) { return (float)((int)((i * 7 + (int64_t)r * 131) % 1023) - 511); }

/* Rank r's ordered input j: not integers, so that the order of the sum shows in its bits. */
static float frac_value(int r, int j, int64_t i)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(r * 40503 + j * 977 + 1);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 200003u) / 1031.0f - 97.0f;
}

typedef struct bench {
    int P, p;
    crew_comm comm, fast;       /* crew's communicator, ordered, and with the fast path */
    int64_t n;                  /* floats in the buffer */
    float *buf, *pristine;      /* in place: this rank's input, kept */
    float *expect_int;          /* the exact sum of every rank's pristine */
    float *in[2], *out;         /* ordered: this rank's inputs and the output */
    float *expect_ord[2];       /* the left folds in rank order, for k = 1 and k = 2 */
} bench;

static int fail(const char *what, const char *detail)
{
    fprintf(stderr, "bench_mpi_allreduce: %s: %s\n", what, detail);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

static void setup(bench *b, int64_t n)
{
    b->n = n;
    for (int64_t i = 0; i < n; i++) {
        b->pristine[i] = int_value(b->p, i);
        float s = 0;
        for (int r = 0; r < b->P; r++) s += int_value(r, i);
        b->expect_int[i] = s;
        for (int j = 0; j < 2; j++) b->in[j][i] = frac_value(b->p, j, i);
        for (int k = 1; k <= 2; k++) {
            float acc = frac_value(0, 0, i);
            for (int r = 0; r < b->P; r++)
                for (int j = 0; j < k; j++)
                    if (r || j) acc += frac_value(r, j, i);
            b->expect_ord[k - 1][i] = acc;
        }
    }
}

/* Contestant c once: prepared and barriered outside the time, checked after. Returns seconds. */
static double run_one(bench *b, int c, int check)
{
    const size_t bytes = (size_t)b->n * sizeof(float);
    const int in_place = c < 2 || c == 4;
    if (in_place) memcpy(b->buf, b->pristine, bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    crew_status s = CREW_OK;
    double t0 = MPI_Wtime();
    if (c == 0) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, b->buf, (int)b->n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) fail("MPI_Allreduce", "failed");
    } else if (c == 1) {
        s = b->comm.ops->allreduce(b->comm.ctx, b->comm.rank, b->buf, b->n, CREW_COMM_F32, CREW_REDUCE_SUM, TIMEOUT_S);
    } else if (c == 4) {
        s = b->fast.ops->allreduce(b->fast.ctx, b->fast.rank, b->buf, b->n, CREW_COMM_F32, CREW_REDUCE_SUM, TIMEOUT_S);
    } else {
        s = b->comm.ops->allreduce_ordered(b->comm.ctx, b->comm.rank, b->in, c - 1, b->out, b->n, TIMEOUT_S);
    }
    double t = MPI_Wtime() - t0;
    if (s) fail(names[c], crew_status_message(s));
    if (!check) return t;
    const float *got = in_place ? b->buf : b->out, *want = in_place ? b->expect_int : b->expect_ord[c - 2];
    if (memcmp(got, want, bytes) != 0) {
        int64_t i = 0;
        while (i < b->n && !memcmp(got + i, want + i, sizeof(float))) i++;
        char detail[200];
        snprintf(detail, sizeof detail, "wrong result on MPI rank %d at %lld floats: element %lld is %.9g, expected %.9g",
                 b->p, (long long)b->n, (long long)i, (double)got[i], (double)want[i]);
        fail(names[c], detail);
    }
    return t;
}

static void describe_cpu(char *buf, size_t len)
{
    snprintf(buf, len, "?");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *v = strchr(line, ':');
            if (v) snprintf(buf, len, "%s", v + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    fclose(f);
}

int main(int argc, char **argv)
{
    int level = 0;
    /* as crew's command line does for --allreduce fast (tools/crew/cli_mpi.c): libnbc's ring */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &level);
    bench b = {0};
    MPI_Comm_size(MPI_COMM_WORLD, &b.P);
    MPI_Comm_rank(MPI_COMM_WORLD, &b.p);
    args a;
    int pr = parse(argc, argv, &a);
    if (pr) {
        if (b.p == 0) usage(pr > 0 ? stdout : stderr);
        MPI_Finalize();
        return pr > 0 ? 0 : 2;
    }
    if (b.P < 2 && b.p == 0) fprintf(stderr, "bench_mpi_allreduce: one process: run it under mpirun -np 2 or more\n");

    crew_process_group *g = NULL;
    crew_local_comm *lc = NULL;
    crew_mpi_comm *mc = NULL, *mf = NULL;
    crew_local_comm *lf = NULL;
    MPI_Comm world = MPI_COMM_WORLD;
    crew_status s = crew_group_open_mpi(&world, 30.0, &g);
    if (!s) s = crew_local_comm_create(1, &lc);
    if (!s) s = crew_mpi_comm_create(g, lc, 1, &mc);
    if (!s) s = crew_local_comm_create(1, &lf);
    if (!s) s = crew_mpi_comm_create(g, lf, 1, &mf);
    if (s) return fail("setting up", crew_status_message(s));
    crew_mpi_comm_set_unordered(mf, 1);
    b.comm = crew_mpi_comm_rank(mc, 0);
    b.fast = crew_mpi_comm_rank(mf, 0);

    const int64_t max_n = size_bytes[N_SIZES - 1] / (int64_t)sizeof(float);
    float **bufs[] = {&b.buf, &b.pristine, &b.expect_int, &b.in[0], &b.in[1], &b.out, &b.expect_ord[0], &b.expect_ord[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (!(*bufs[i] = malloc((size_t)max_n * sizeof(float)))) return fail("setting up", "out of memory");

    /* Every process on rank 0's host? Then /proc/stat is the machine all of them share. */
    char host[MPI_MAX_PROCESSOR_NAME] = "", *hosts = malloc((size_t)b.P * MPI_MAX_PROCESSOR_NAME);
    int len = 0;
    MPI_Get_processor_name(host, &len);
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
    int one_host = 1;
    for (int q = 1; b.p == 0 && q < b.P; q++) one_host &= !strcmp(hosts + (size_t)q * MPI_MAX_PROCESSOR_NAME, hosts);
    free(hosts);

    if (b.p == 0) {
        char cpu[128], mpi[160];
        double load[3] = {-1, -1, -1};
        describe_cpu(cpu, sizeof cpu);
        crew_mpi_describe(mpi, sizeof mpi);
        if (getloadavg(load, 3) < 0) load[0] = -1;
        printf("%d processes x 1 replica (host memory), %s; %s, %ld CPUs on %s; %s; load average %.2f before\n", b.P,
               one_host ? "all on one host" : "on several hosts", cpu, sysconf(_SC_NPROCESSORS_ONLN), host, mpi,
               load[0]);
        printf("median of %s rounds per size (paired, order reversed every other round); busbw = 2(P-1)/P * bytes / "
               "time; ratio = MPI_Allreduce time / crew time\n",
               a.reps ? "N" : a.quick ? "--quick" : "full");
        if (a.markdown)
            printf("| size | MPI_Allreduce µs | GB/s | crew allreduce µs | GB/s | ratio | ordered k=1 µs | GB/s | ratio | "
                   "ordered k=2 µs | GB/s | ratio | crew fast µs | GB/s | ratio |\n"
                   "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        else
            printf("%8s | %10s %7s | %10s %7s %6s | %10s %7s %6s | %10s %7s %6s | %10s %7s %6s | %6s\n", "size", "mpi us",
                   "GB/s", "crew us", "GB/s", "ratio", "ord1 us", "GB/s", "ratio", "ord2 us", "GB/s", "ratio", "fast us",
                   "GB/s", "ratio", "others");
        fflush(stdout);
    }

    bench_load whole;
    bench_load_start(&whole);
    for (int si = 0; si < N_SIZES; si++) {
        const int reps = a.reps ? a.reps : a.quick ? quick_reps[si] : full_reps[si];
        setup(&b, size_bytes[si] / (int64_t)sizeof(float));
        double *t = malloc((size_t)reps * N_CONTESTANTS * sizeof *t), *tmax = malloc((size_t)reps * N_CONTESTANTS * sizeof *t);
        if (!t || !tmax) return fail("timing", "out of memory");
        for (int c = 0; c < N_CONTESTANTS; c++) run_one(&b, c, 1); /* warm-up, checked */
        bench_load l;
        bench_load_start(&l);
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < N_CONTESTANTS; i++) {
                int c = r % 2 ? N_CONTESTANTS - 1 - i : i;
                t[(size_t)c * reps + r] = run_one(&b, c, 1);
            }
        /* /proc/stat's busy time, less what every process of the run used, per wall second */
        double busy = bench_busy_cpu_s() - l.busy_s, own = bench_own_cpu_s() - l.own_s, all_own = 0;
        double wall = bench_wall_s() - l.wall_s;
        MPI_Reduce(&own, &all_own, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(t, tmax, reps * N_CONTESTANTS, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (b.p == 0) {
            const double bytes = (double)size_bytes[si], bus = 2.0 * (b.P - 1) / b.P;
            double med[N_CONTESTANTS];
            for (int c = 0; c < N_CONTESTANTS; c++) med[c] = bench_median(tmax + (size_t)c * reps, reps);
            /* /proc/stat counts in ticks (10 ms): under half a second of measurement says nothing */
            double others = one_host && l.busy_s >= 0 && wall >= 0.5 ? (busy - all_own) / wall : -1;
            if (others < 0 && one_host && wall >= 0.5) others = 0;
            char label[32];
            if (size_bytes[si] >= 1 << 20)
                snprintf(label, sizeof label, "%lld MB", (long long)(size_bytes[si] >> 20));
            else
                snprintf(label, sizeof label, "%lld KB", (long long)(size_bytes[si] >> 10));
            if (a.markdown) {
                printf("| %s | %.1f | %.2f |", label, 1e6 * med[0], bus * bytes / med[0] / 1e9);
                for (int c = 1; c < N_CONTESTANTS; c++)
                    printf(" %.1f | %.2f | %.2f |", 1e6 * med[c], bus * bytes / med[c] / 1e9, med[0] / med[c]);
                printf("\n");
            } else {
                printf("%8s | %10.1f %7.2f |", label, 1e6 * med[0], bus * bytes / med[0] / 1e9);
                for (int c = 1; c < N_CONTESTANTS; c++)
                    printf(" %10.1f %7.2f %6.2f |", 1e6 * med[c], bus * bytes / med[c] / 1e9, med[0] / med[c]);
                if (others >= 0)
                    printf(" %6.2f  (%d rounds, %.1f s)\n", others, reps, wall);
                else
                    printf(" %6s  (%d rounds, %.1f s)\n", "-", reps, wall);
            }
            fflush(stdout);
        }
        free(t);
        free(tmax);
    }

    {
        double busy = bench_busy_cpu_s() - whole.busy_s, own = bench_own_cpu_s() - whole.own_s, all_own = 0;
        double wall = bench_wall_s() - whole.wall_s;
        MPI_Reduce(&own, &all_own, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (b.p == 0 && one_host && whole.busy_s >= 0 && wall > 0)
            printf("other processes used %.2f cores over the whole run (%.1f s, set-up and checks included)\n",
                   busy - all_own > 0 ? (busy - all_own) / wall : 0.0, wall);
    }

    /* The latency floor: one barrier of each kind, the median of 200 (20 with --quick). */
    {
        const int reps = a.quick ? 20 : 200;
        double *t = malloc(2 * (size_t)reps * sizeof *t), *tmax = malloc(2 * (size_t)reps * sizeof *t);
        if (!t || !tmax) return fail("timing", "out of memory");
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < 2; i++) {
                int c = r % 2 ? 1 - i : i;
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (c == 0)
                    MPI_Barrier(MPI_COMM_WORLD);
                else if ((s = b.comm.ops->barrier(b.comm.ctx, b.comm.rank, TIMEOUT_S)))
                    return fail("crew barrier", crew_status_message(s));
                t[(size_t)c * reps + r] = MPI_Wtime() - t0;
            }
        MPI_Reduce(t, tmax, 2 * reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (b.p == 0) {
            double mb = bench_median(tmax, reps), cb = bench_median(tmax + reps, reps);
            double load[3] = {-1, -1, -1};
            if (getloadavg(load, 3) < 0) load[0] = -1;
            printf("barrier (latency floor, median of %d): MPI_Barrier %.1f us, crew barrier %.1f us; load average %.2f "
                   "after\nall results checked: in place equal to the exact sum, ordered bitwise equal to the left fold "
                   "in rank order\n",
                   reps, 1e6 * mb, 1e6 * cb, load[0]);
        }
        free(t);
        free(tmax);
    }

    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(*bufs[i]);
    crew_mpi_comm_free(mc);
    crew_mpi_comm_free(mf);
    crew_local_comm_free(lf);
    crew_local_comm_free(lc);
    crew_group_close(g);
    MPI_Finalize();
    return 0; /* a wrong result ends the run in fail(): MPI_Abort, status 1 */
}
