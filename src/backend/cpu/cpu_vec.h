/* cpu_vec.h — one vector register of floats, in GCC's and Clang's vector extension, which compiles
 * to whatever the target has where intrinsics would tie a file to one ISA.
 *
 * As many floats as one register holds: 16 with AVX-512, 8 with AVX2, 4 with SSE or NEON. A loop
 * that keeps values in registers sizes its groups by it (a vector of 16 on AVX2 is two registers,
 * and a group that fit AVX-512's 32 spilled there). aligned(4): loads and stores may start at any
 * float. Macros, not functions: a function taking or returning a 64-byte vector has another ABI
 * with and without AVX-512 (gcc's -Wpsabi), and the sanitizer builds are not built for this
 * machine. */
#ifndef CREW_BACKEND_CPU_VEC_H
#define CREW_BACKEND_CPU_VEC_H

#if defined(__AVX512F__)
#define CPU_VEC_LANES 16
#elif defined(__AVX__)
#define CPU_VEC_LANES 8
#else
#define CPU_VEC_LANES 4
#endif
typedef float cpu_vec __attribute__((vector_size(CPU_VEC_LANES * sizeof(float)), aligned(sizeof(float))));

#define cpu_vec_load(p) (*(const cpu_vec *)(p))
#define cpu_vec_store(p, v) (*(cpu_vec *)(p) = (v))
#define CPU_VEC_ZERO ((cpu_vec){0})

#endif
