/* registry.c — the device kinds built into this library, chosen by name (`--devices KIND:N`).
 *
 * A kind is a name, a line about it, how many devices of it this process may use, and how to open
 * one as a backend instance. Adding a GPU is adding a row (behind its build option), nothing else:
 * everything above opens devices through crew_device_open. The table is constant: there is no
 * registration at run time and so no global state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/cpu.h"
#include "core/status.h"

static int cpu_available(void) { return crew_cpu_cores(); }

static int blas_threads(const crew_device_options *o) { return o && o->blas_threads > 0 ? o->blas_threads : 1; }

/* CPU devices are interchangeable: the index names a replica, not a core (more replicas than
 * cores is allowed, and the operating system places the threads). */
static crew_status open_cpu(int index, const crew_device_options *o, crew_backend *out)
{
    (void)index;
#ifdef CREW_GUARD
    /* make guard: the whole test suite on device memory that traps host access. */
    return crew_cpu_guarded_backend_create(blas_threads(o), out);
#else
    return crew_cpu_backend_create(blas_threads(o), out);
#endif
}

static crew_status open_cpu_guarded(int index, const crew_device_options *o, crew_backend *out)
{
    (void)index;
    return crew_cpu_guarded_backend_create(blas_threads(o), out);
}

static crew_status open_cpu_remote(int index, const crew_device_options *o, crew_backend *out)
{
    (void)index;
    return crew_cpu_remote_backend_create(blas_threads(o), out);
}

#ifdef CREW_HAVE_CUDA
#ifdef CREW_HAVE_NCCL
#define CUDA_NCCL 1
#define CUDA_COMM ", NCCL between them"
#else
#define CUDA_NCCL 0
#define CUDA_COMM ", replicas talk through the host (no NCCL in this build)"
#endif
#ifdef CREW_HAVE_CUDNN
#define CUDA_CUDNN "cuDNN"
#define CUDA_CONV_AUTO 1
#else
#define CUDA_CUDNN NULL
#define CUDA_CONV_AUTO 0
#endif

static crew_status open_cuda(int index, const crew_device_options *o, crew_backend *out)
{
    (void)o;
    return crew_cuda_backend_create(index, out);
}
#endif

/* the build's GEMM library (CMakeLists.txt, CREW_GEMM) */
#if CREW_GEMM_ONEDNN
#define CPU_GEMM_LIBRARY "oneDNN"
#else
#define CPU_GEMM_LIBRARY "OpenBLAS"
#endif

static const crew_device_kind kinds[] = {
    {"cpu", "CPU cores: one replica per core, GEMMs by " CPU_GEMM_LIBRARY, cpu_available, open_cpu, NULL, 0, NULL, 0,
     1},
    {"cpu-guarded", "the CPU backend with device memory that traps any access from host code (a test "
                    "of the device seam; slower)", cpu_available, open_cpu_guarded, NULL, 0, NULL, 0, 1},
    {"cpu-remote", "the guarded CPU backend as a device the host cannot reach, as a GPU: its replicas talk "
                   "through host copies, and direct sums stand in for a convolution library (a test of the GPU's "
                   "paths)", cpu_available, open_cpu_remote, NULL, 0, "direct sums (a test stand-in)", 0, 1},
#ifdef CREW_HAVE_CUDA
    {"cuda", "NVIDIA GPUs: one replica per GPU, GEMMs by cuBLAS (fp32, or bf16 tensor cores)" CUDA_COMM,
     crew_cuda_device_count, open_cuda, crew_cuda_device_memory, CUDA_NCCL, CUDA_CUDNN, CUDA_CONV_AUTO, 0},
#endif
};

const crew_device_kind *crew_device_kinds(int *n)
{
    *n = (int)(sizeof kinds / sizeof kinds[0]);
    return kinds;
}

const crew_device_kind *crew_device_kind_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kinds[i].name, name) == 0) return &kinds[i];
    return NULL;
}

crew_status crew_device_kind_check(const char *name)
{
    if (crew_device_kind_find(name)) return CREW_OK;
    char list[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", kinds[i].name);
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "unknown device kind '%.40s': this build of crew has %s",
                       name ? name : "", list);
}

crew_status crew_device_open(const char *kind, int index, const crew_device_options *o, crew_backend *out)
{
    memset(out, 0, sizeof *out);
    const char *name = kind && *kind ? kind : "cpu";
    CREW_TRY(crew_device_kind_check(name));
    const crew_device_kind *k = crew_device_kind_find(name);
    if (index < 0) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "device %s:%d: the index must be >= 0", name, index);
    crew_status s = k->open(index, o, out);
    if (!s && o && (o->precision != CREW_PRECISION_FP32 || o->conv_library || o->sum_block)) {
        if (out->ops->configure)
            s = out->ops->configure(out->ctx, o);
        else
            s = crew_errorf(CREW_CODE_INVALID_ARGUMENT, "this device kind computes in fp32 only, with no convolution "
                            "library and whole GEMMs");
        if (s) crew_device_close(out);
    }
    return s ? crew_error_prefix(s, "device %s:%d: ", name, index) : CREW_OK;
}

void crew_device_close(crew_backend *be)
{
    if (be && be->ops && be->ops->destroy) be->ops->destroy(be->ctx);
    if (be) memset(be, 0, sizeof *be);
}

/* Through a host buffer in slices of 256 KiB, so that a model of any size needs only that much
 * host memory on top (the memory planner does not count it). */
#define TRANSFER_SLICE ((int64_t)1 << 16)

crew_status crew_dev_transfer_f32(const crew_backend *dst_be, float *dst, const crew_backend *src_be,
                                  const float *src, int64_t n)
{
    if (n <= 0) return CREW_OK;
    int64_t slice = n < TRANSFER_SLICE ? n : TRANSFER_SLICE;
    void *host = NULL;
    CREW_TRY(src_be->ops->host_alloc(src_be->ctx, CREW_DT_F32, slice, &host));
    crew_status s = CREW_OK;
    for (int64_t at = 0; at < n && !s; at += slice) {
        int64_t m = n - at < slice ? n - at : slice;
        s = crew_dev_download_f32(src_be, host, src + at, m);
        if (!s) s = crew_dev_upload_f32(dst_be, dst + at, host, m); /* the compute queue: synchronous enough */
        if (!s) s = dst_be->ops->sync(dst_be->ctx, NULL);        /* host is reused for the next slice */
    }
    src_be->ops->host_free(src_be->ctx, host);
    return s;
}

/* ---- the public side (crew.h) */

#ifndef CREW_HAVE_CUDA
void crew_cuda_describe(char *buf, size_t len)
{
    if (len) snprintf(buf, len, "not in this build (configured without the CUDA toolkit, or with -DCREW_CUDA=OFF)");
}
#endif

const char *crew_device_kind_name(int i, const char **about)
{
    int n;
    const crew_device_kind *k = crew_device_kinds(&n);
    if (i < 0 || i >= n) return NULL;
    if (about) *about = k[i].about;
    return k[i].name;
}

crew_status crew_device_kind_about(const char *kind, int *available, int *own_memory)
{
    CREW_TRY(crew_device_kind_check(kind));
    const crew_device_kind *k = crew_device_kind_find(kind);
    if (available) *available = k->available();
    if (own_memory) *own_memory = k->memory_bytes != NULL;
    return CREW_OK;
}

const char *crew_device_kind_conv_library(const char *kind, int *measured)
{
    const crew_device_kind *k = crew_device_kind_find(kind);
    if (measured) *measured = k && k->conv_library && k->conv_auto;
    return k ? k->conv_library : NULL;
}

crew_status crew_devices_parse(const char *text, char *kind, size_t kind_len, int *count)
{
    const char *colon = text ? strchr(text, ':') : NULL;
    size_t len = text ? (colon ? (size_t)(colon - text) : strlen(text)) : 0;
    char name[32];
    if (len == 0 || len >= sizeof name || len >= kind_len)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--devices takes KIND or KIND:N (e.g. cpu:4), got '%.40s'",
                           text ? text : "");
    memcpy(name, text, len);
    name[len] = '\0';
    CREW_TRY(crew_device_kind_check(name));
    const crew_device_kind *k = crew_device_kind_find(name);
    int n = k->available();
    if (colon) {
        char *end = NULL;
        long v = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || v < 1 || v > 1024)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--devices %s:N takes N in [1, 1024], got '%.20s'", name,
                               colon + 1);
        n = (int)v;
    }
    if (n < 1) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--devices %s: no device of that kind is available", name);
    memcpy(kind, name, len + 1);
    *count = n;
    return CREW_OK;
}
