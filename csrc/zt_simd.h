/* Run-time dispatch to AVX2 code on x86-64.
 *
 * Wheels are built for baseline x86-64 (SSE2), which lacks byte shuffles and
 * variable shifts.  Two ways in:
 *  - ZT_CLONES (GCC, ELF): target_clones compiles a plain loop twice and picks the
 *    AVX2 copy at load time on CPUs that have it;
 *  - ZT_X86_AVX2 (GCC or Clang on x86-64): hand-written intrinsics in functions
 *    marked ZT_TARGET_AVX2, called only when zt_use_avx2() says the CPU has AVX2
 *    and it has not been turned off (zt_simd_enable(0): tests run the portable
 *    loops on the same machine and compare).
 * Everywhere else the portable loops run.  Never -march=native: a wheel must run
 * on any CPU of its architecture.
 */
#ifndef ZT_SIMD_H
#define ZT_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ZT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ZT_CLONES
#endif

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define ZT_X86_AVX2 1
#define ZT_TARGET_AVX2 __attribute__((target("avx2")))
#endif

/* 1 when the hand-written AVX2 paths may run (CPU support and not turned off). */
int zt_use_avx2(void);
/* Turn the hand-written SIMD paths off (0) or back on (1); returns the old setting. */
int zt_simd_enable(int on);

#endif
