/* peak.c — one device's measured GEMM rate (crew_measure_peak in crew.h): the ceiling a training
 * step's FLOP rate is measured against. */
#include "advise/peak_cache.h"
#include "backend/backend.h"
#include "core/status.h"
#include "core/timer.h"

/* Square GEMMs of two sizes, the best rate of either: a BLAS's blocking suits some sizes better
 * than others, and one size alone can miss its best kernels. oneDNN's AVX2 sgemm on an AMD EPYC
 * ran 512 at 72 GFLOP/s and 1024 at 91 (the example models' large GEMMs at 85-95), so a demo CNN
 * measured against 512 alone read 98% of a peak it was not near. 12 MB in all. */
static const int64_t peak_sizes[] = {CREW_PEAK_SIZES};
#define PEAK_SIZES (sizeof peak_sizes / sizeof peak_sizes[0])

crew_status crew_measure_peak(const char *device_kind, int threads_per_device, double seconds, double *gflops)
{
    if (!gflops) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_measure_peak: NULL argument");
    if (threads_per_device < 1 || !(seconds > 0.0 && seconds <= 60.0))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                           "crew_measure_peak: threads must be >= 1 and seconds in (0, 60], got %d and %g",
                           threads_per_device, seconds);
    crew_device_options o = {.blas_threads = threads_per_device};
    crew_backend be = {0};
    CREW_TRY(crew_device_open(device_kind, 0, &o, &be));
    int64_t largest = 0;
    for (size_t i = 0; i < PEAK_SIZES; i++) largest = peak_sizes[i] > largest ? peak_sizes[i] : largest;
    const int64_t values = largest * largest;
    float *a = NULL, *b = NULL, *c = NULL;
    crew_status s = crew_dev_alloc_f32(&be, values, &a);
    if (!s) s = crew_dev_alloc_f32(&be, values, &b);
    if (!s) s = crew_dev_alloc_f32(&be, values, &c);
    double best = 0.0;
    if (!s) {
        be.ops->fill(be.ctx, a, 0.5f, values);
        be.ops->fill(be.ctx, b, 0.25f, values);
        for (size_t i = 0; i < PEAK_SIZES; i++) { /* warm: pages, kernels, threads */
            const int64_t n = peak_sizes[i];
            be.ops->gemm(be.ctx, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        }
        s = be.ops->sync(be.ctx, NULL);
    }
    /* the sizes in turn, at least three of each */
    const double until = crew_now() + seconds;
    for (int rep = 0; !s && (rep < 3 * (int)PEAK_SIZES || crew_now() < until); rep++) {
        const int64_t n = peak_sizes[(size_t)rep % PEAK_SIZES];
        const double flops = 2.0 * (double)n * (double)n * (double)n, t0 = crew_now();
        be.ops->gemm(be.ctx, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        s = be.ops->sync(be.ctx, NULL);
        double dt = crew_now() - t0;
        if (!s && dt > 0.0 && flops / dt > best) best = flops / dt;
    }
    crew_dev_free(&be, a);
    crew_dev_free(&be, b);
    crew_dev_free(&be, c);
    crew_device_close(&be);
    if (s) return crew_error_prefix(s, "measuring the GEMM peak of %s: ", device_kind ? device_kind : "cpu");
    *gflops = best / 1e9;
    return CREW_OK;
}
