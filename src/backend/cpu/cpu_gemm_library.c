/* cpu_gemm_library.c — which GEMM library the CPU backend runs (CMakeLists.txt's CREW_GEMM:
 * oneDNN's sgemm on x86-64, OpenBLAS's elsewhere): its thread setting, its one-line identity for
 * run lines and bug reports, and the check that it runs kernels as new as the CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#if CREW_GEMM_ONEDNN
#include <dnnl.h>
#else
#include <cblas.h>
#endif

#include "backend/cpu/cpu_ops.h"

/* What the CPU offers, in the two families a GEMM's speed depends on. */
static int cpu_has_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static int cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

#if CREW_GEMM_ONEDNN

void cpu_gemm_library_threads(int threads)
{
    (void)threads; /* per thread, set before each sgemm (cpu_gemm.c) */
}

/* oneDNN's names for the instruction sets its kernels are generated for (DNNL_MAX_CPU_ISA's values) */
static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE41";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2_VNNI";
    case dnnl_cpu_isa_avx512_mic: return "AVX512_MIC";
    case dnnl_cpu_isa_avx512_mic_4ops: return "AVX512_MIC_4OPS";
    case dnnl_cpu_isa_avx512_core: return "AVX512_CORE";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX512_CORE_VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX512_CORE_BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX512_CORE_AMX";
    default: return "ALL";
    }
}

void crew_blas_describe(char *buf, size_t len)
{
    /* The version, and the newest instruction set oneDNN generates kernels for on this CPU (lowered
     * by DNNL_MAX_CPU_ISA): its sgemm's speed and last bits follow from the two. */
    const dnnl_version_t *v = dnnl_version();
    if (len)
        snprintf(buf, len, "oneDNN %d.%d.%d sgemm, instruction sets up to %s", v->major, v->minor, v->patch,
                 isa_name(dnnl_get_effective_cpu_isa()));
}

int crew_blas_check(char *buf, size_t len)
{
    if (len) buf[0] = '\0';
    /* oneDNN reads the CPU's features, not its model, so only DNNL_MAX_CPU_ISA holds it back */
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    const int avx512 = cpu_has_avx512(), avx2 = cpu_has_avx2();
    const unsigned want = avx512 ? (unsigned)dnnl_cpu_isa_avx512_core : avx2 ? (unsigned)dnnl_cpu_isa_avx2 : 0;
    if (!want || isa == (unsigned)dnnl_cpu_isa_all || (isa & want) == want) return 0;
    const char *forced = getenv("DNNL_MAX_CPU_ISA");
    if (len)
        snprintf(buf, len, "oneDNN generates %s kernels%s%s%s, older than this CPU (it has AVX2%s): matrix products "
                 "may be several times slower than they could be; unset DNNL_MAX_CPU_ISA or set it to %s",
                 isa_name((dnnl_cpu_isa_t)isa), forced ? ", as DNNL_MAX_CPU_ISA=" : "", forced ? forced : "",
                 forced ? " asks" : "", avx512 ? " and AVX-512" : "", avx512 ? "AVX512_CORE" : "AVX2");
    return 1;
}

#else /* OpenBLAS */

void cpu_gemm_library_threads(int threads)
{
    /* OpenBLAS keeps one process-wide thread count; every rank asks for the same value. */
    openblas_set_num_threads(threads);
}

void crew_blas_describe(char *buf, size_t len)
{
    /* Which OpenBLAS build, and which of its kernels it picked for this CPU (DYNAMIC_ARCH builds
     * choose at load time): what a speed figure or a bug report needs to be read. */
    if (len) snprintf(buf, len, "%s, kernels for %s", openblas_get_config(), openblas_get_corename());
}

/* OpenBLAS kernel families (DYNAMIC_ARCH core names) that predate AVX2 and FMA. A build that does
 * not know a newer CPU model falls back to one of these: Debian 12's OpenBLAS 0.3.21 gives an Intel
 * Xeon of family 6 model 207 (Emerald Rapids) its Prescott (SSE3) kernels, and crew then trained
 * the example MLP 7.6x and the CNN 1.75x slower than with OPENBLAS_CORETYPE=SkylakeX (measured;
 * docs/PERFORMANCE.md). */
static const char *const pre_avx2_cores[] = {
    "Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Core2", "Penryn", "Dunnington", "Nehalem",
    "Sandybridge", "Atom", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Bulldozer",
    "Piledriver", "Steamroller", "Nano", "Unknown",
};

int crew_blas_check(char *buf, size_t len)
{
    if (len) buf[0] = '\0';
    const char *core = openblas_get_corename();
    if (!core || !cpu_has_avx2()) return 0;
    int old = 0;
    for (size_t i = 0; i < sizeof pre_avx2_cores / sizeof pre_avx2_cores[0]; i++)
        old |= strcasecmp(core, pre_avx2_cores[i]) == 0;
    if (!old) return 0;
    const int avx512 = cpu_has_avx512();
    const char *want = avx512 ? "SkylakeX" : "Haswell", *forced = getenv("OPENBLAS_CORETYPE");
    if (len && forced && *forced)
        snprintf(buf, len, "OpenBLAS runs its %s kernels, as OPENBLAS_CORETYPE=%s asks, older than this CPU (it has "
                 "AVX2%s): matrix products may be several times slower than they could be; set "
                 "OPENBLAS_CORETYPE=%s or unset it", core, forced, avx512 ? " and AVX-512" : "", want);
    else if (len)
        snprintf(buf, len, "OpenBLAS runs its %s kernels, older than this CPU (it has AVX2%s): matrix products may "
                 "be several times slower than they could be. This OpenBLAS does not know the CPU model; set "
                 "OPENBLAS_CORETYPE=%s before starting crew", core, avx512 ? " and AVX-512" : "", want);
    return 1;
}

#endif
