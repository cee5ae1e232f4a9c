/* Run-time dispatch to an AVX2 build of a hot loop on x86-64 (GCC, ELF targets).
 *
 * Wheels are built for baseline x86-64 (SSE2), which lacks byte shuffles and
 * variable shifts; target_clones compiles the function twice and picks the AVX2
 * copy at load time on CPUs that have it.  Everywhere else the plain loop is used.
 * Never -march=native: a wheel must run on any CPU of its architecture.
 */
#ifndef ZT_SIMD_H
#define ZT_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ZT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ZT_CLONES
#endif

#endif
