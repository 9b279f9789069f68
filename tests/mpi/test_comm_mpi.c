/* test_comm_mpi.c — every collective of the MPI communicator, and its point-to-point messages,
 * run under mpirun (tests/CMakeLists.txt: 3 processes of 2 threads each, and 2 of 1), against
 * what one process computes alone; at the same time the same checks on a second communicator
 * over some of the processes (crew_mpi_comm_create_subset).
 *
 * Each global rank g fills its inputs with values it and every other rank can compute (so each
 * checks the result without talking), chosen so that the order of a float sum matters: a sum in
 * any order but global rank order (then each rank's inputs in order) would differ in the last bits,
 * and the check is bitwise. Sizes: 1 value (fewer than the processes: empty chunks), an odd 1001,
 * and 70 000 (several blocks). */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "thread_check.h"
#include "comm/comm_mpi.h"
#include "core/status.h"

#define T_MAX 4
#define TIMEOUT_S 60.0

static int T, P, p;

/* Input j of global rank g, element i: magnitudes spread over 1e-3..1e3 so sums round. */
static float value(int g, int j, int64_t i)
{
    return (float)((double)(g * 7 + j * 3 + 1) * pow(10.0, (double)((i + g) % 7) - 3.0) / 3.0);
}

typedef struct worker {
    crew_comm comm;
    int local;
} worker;

static void check_sizes(crew_comm *c, int64_t n)
{
    const int g = c->rank, size = c->size;
    float *buf = malloc((size_t)n * sizeof *buf), *want = malloc((size_t)n * sizeof *want);
    float *in[2] = {malloc((size_t)n * sizeof(float)), malloc((size_t)n * sizeof(float))};
    float *all = malloc((size_t)n * (size_t)size * sizeof *all), *rs = malloc((size_t)n * sizeof *rs);
    double *d = malloc((size_t)n * sizeof *d);

    /* allreduce, sum, f32: Σ over ranks in order */
    for (int64_t i = 0; i < n; i++) {
        buf[i] = value(g, 0, i);
        float acc = value(0, 0, i);
        for (int q = 1; q < size; q++) acc += value(q, 0, i);
        want[i] = acc;
    }
    EXPECT_OK(crew_allreduce(c, buf, n, CREW_COMM_F32, CREW_REDUCE_SUM, TIMEOUT_S));
    EXPECT(memcmp(buf, want, (size_t)n * sizeof *buf) == 0, "rank %d: all-reduce of %lld floats is not the sum in rank order", g, (long long)n);

    /* allreduce, mean, f64 */
    for (int64_t i = 0; i < n; i++) d[i] = (double)value(g, 1, i) * 1.1;
    EXPECT_OK(crew_allreduce(c, d, n, CREW_COMM_F64, CREW_REDUCE_AVG, TIMEOUT_S));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        double acc = (double)value(0, 1, i) * 1.1;
        for (int q = 1; q < size; q++) acc += (double)value(q, 1, i) * 1.1;
        ok &= d[i] == acc * (1.0 / (double)size);
    }
    EXPECT(ok, "rank %d: the f64 mean of %lld values differs", g, (long long)n);

    /* ordered, k = 2: Σ over ranks, then over each rank's two inputs; out is in[1] */
    for (int64_t i = 0; i < n; i++) {
        in[0][i] = value(g, 0, i);
        in[1][i] = value(g, 1, i);
        float acc = value(0, 0, i);
        for (int q = 0; q < size; q++)
            for (int j = q == 0 ? 1 : 0; j < 2; j++) acc += value(q, j, i);
        want[i] = acc;
    }
    EXPECT_OK(c->ops->allreduce_ordered(c->ctx, g, in, 2, in[1], n, TIMEOUT_S));
    EXPECT(memcmp(in[1], want, (size_t)n * sizeof *want) == 0, "rank %d: ordered all-reduce (k = 2) of %lld floats", g, (long long)n);

    /* broadcast from the last rank (another process's thread for most) */
    for (int64_t i = 0; i < n; i++) buf[i] = g == size - 1 ? value(g, 2, i) : -1.0f;
    EXPECT_OK(crew_broadcast(c, buf, n, CREW_COMM_F32, size - 1, TIMEOUT_S));
    ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= buf[i] == value(size - 1, 2, i);
    EXPECT(ok, "rank %d: broadcast from rank %d", g, size - 1);

    /* allgather: rank q's n values at q·n */
    for (int64_t i = 0; i < n; i++) buf[i] = value(g, 3, i);
    EXPECT_OK(c->ops->allgather(c->ctx, g, buf, all, n, CREW_COMM_F32, TIMEOUT_S));
    ok = 1;
    for (int q = 0; q < size; q++)
        for (int64_t i = 0; i < n; i++) ok &= all[(size_t)q * n + i] == value(q, 3, i);
    EXPECT(ok, "rank %d: all-gather of %lld floats", g, (long long)n);

    /* reduce-scatter: rank g gets Σ over ranks of their chunk g */
    for (int q = 0; q < size; q++)
        for (int64_t i = 0; i < n; i++) all[(size_t)q * n + i] = value(g, 4, (int64_t)q * n + i);
    EXPECT_OK(c->ops->reduce_scatter(c->ctx, g, all, rs, n, CREW_COMM_F32, CREW_REDUCE_SUM, TIMEOUT_S));
    ok = 1;
    for (int64_t i = 0; i < n; i++) {
        float acc = value(0, 4, (int64_t)g * n + i);
        for (int q = 1; q < size; q++) acc += value(q, 4, (int64_t)g * n + i);
        ok &= rs[i] == acc;
    }
    EXPECT(ok, "rank %d: reduce-scatter of %lld floats per rank", g, (long long)n);

    EXPECT_OK(crew_barrier(c, TIMEOUT_S));
    free(buf), free(want), free(in[0]), free(in[1]), free(all), free(rs), free(d);
}

/* Point to point: every rank sends two messages to the next rank (round the ring) and one to the
 * previous, before receiving any (sends never wait for their receive), then takes them in the
 * order sent: between threads of one process and across processes alike. */
static void check_p2p(crew_comm *c, int64_t n)
{
    const int g = c->rank, size = c->size;
    if (size < 2) return;
    const int next = (g + 1) % size, prev = (g + size - 1) % size;
    float *buf = malloc((size_t)n * sizeof *buf);
    for (int j = 0; j < 2; j++) {
        for (int64_t i = 0; i < n; i++) buf[i] = value(g, 5 + j, i);
        EXPECT_OK(crew_send(c, buf, n, CREW_COMM_F32, next, 7 + j, TIMEOUT_S));
    }
    for (int64_t i = 0; i < n; i++) buf[i] = value(g, 8, i);
    EXPECT_OK(crew_send(c, buf, n, CREW_COMM_F32, prev, 9, TIMEOUT_S));
    memset(buf, 0, (size_t)n * sizeof *buf); /* the sends copied it */
    for (int j = 0; j < 2; j++) {
        EXPECT_OK(crew_recv(c, buf, n, CREW_COMM_F32, prev, 7 + j, TIMEOUT_S));
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= buf[i] == value(prev, 5 + j, i);
        EXPECT(ok, "rank %d: message %d of %lld floats from rank %d", g, 7 + j, (long long)n, prev);
    }
    if (size > 2 || next != prev) {
        EXPECT_OK(crew_recv(c, buf, n, CREW_COMM_F32, next, 9, TIMEOUT_S));
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= buf[i] == value(next, 8, i);
        EXPECT(ok, "rank %d: message 9 of %lld floats from rank %d", g, (long long)n, next);
    } else { /* two ranks: the previous rank is the next one, and its message 9 came after 7 and 8 */
        EXPECT_OK(crew_recv(c, buf, n, CREW_COMM_F32, next, 9, TIMEOUT_S));
    }
    EXPECT_OK(crew_barrier(c, TIMEOUT_S));
    free(buf);
}

static void *run(void *arg)
{
    worker *w = arg;
    static const int64_t sizes[] = {1, 1001, 70000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        check_sizes(&w->comm, sizes[i]);
        check_p2p(&w->comm, sizes[i]);
    }
    check_p2p(&w->comm, 0); /* an empty message: the header alone */
    return NULL;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    T = argc > 1 ? atoi(argv[1]) : 2;
    if (T < 1 || T > T_MAX) T = 2;
    MPI_Comm world = MPI_COMM_WORLD;
    crew_process_group *g = NULL;
    crew_local_comm *lc = NULL, *sub_lc = NULL;
    crew_mpi_comm *mc = NULL, *sub = NULL;
    CHECK_OK(crew_group_open_mpi(&world, TIMEOUT_S, &g));
    /* A second communicator over some of the processes (all but MPI rank 1 when there are 3 or
     * more, as a pipeline stage's), whose ranks run the same checks at the same time as the
     * first's, on threads of their own: the two never meet each other's messages. */
    int members[8], n_members = 0;
    if (g) {
        P = crew_group_size(g);
        p = crew_group_rank(g);
        CHECK_OK(crew_local_comm_create(T, &lc));
        if (lc) CHECK_OK(crew_mpi_comm_create(g, lc, T, &mc));
        for (int q = 0; q < P && n_members < 8; q++)
            if (P < 3 || q != 1) members[n_members++] = q;
        if (P < 3 || p != 1) {
            CHECK_OK(crew_local_comm_create(T, &sub_lc));
            if (sub_lc) CHECK_OK(crew_mpi_comm_create_subset(g, sub_lc, T, members, n_members, 1, &sub));
        }
    }
    if (mc) {
        pthread_t th[2 * T_MAX];
        worker w[2 * T_MAX];
        int n = 0;
        for (int t = 0; t < T; t++) w[n++] = (worker){crew_mpi_comm_rank(mc, t), t};
        for (int t = 0; sub && t < T; t++) w[n++] = (worker){crew_mpi_comm_rank(sub, t), t};
        for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, run, &w[i]);
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    }
    crew_mpi_comm_free(sub);
    crew_local_comm_free(sub_lc);
    crew_mpi_comm_free(mc);
    crew_local_comm_free(lc);
    crew_group_close(g);
    CHECK_MSG(atomic_load(&thread_failures) == 0, "%d checks failed in the ranks' threads", atomic_load(&thread_failures));
    int failed = check_report() != 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (p == 0) printf("%d processes x %d threads: %s\n", P, T, any ? "FAILED" : "every collective as one process computes it, and every message in order");
    MPI_Finalize();
    return any;
}
