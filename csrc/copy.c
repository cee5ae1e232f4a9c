/* Large copies: filling a model's tensors from a mapped file, spans of a batch read.
 *
 * An ordinary store first reads its destination line into the cache (read for
 * ownership), so a copy moves three bytes over the memory bus for every byte it
 * copies; a non-temporal store writes the line without reading it (two).  For a
 * copy much larger than the cache the destination would be evicted before anyone
 * reads it anyway, so streaming loses nothing; below ZT_COPY_STREAM_BYTES the
 * destination is better left in the cache and memcpy runs.
 *
 * glibc's memcpy makes that choice itself, from the cache sizes it reads at start-up,
 * and its streaming loop reads four pages at a time: it measured 1.4-1.9x this file's
 * loop on the benchmark machine (docs/benchmarks.md, session 21), so under glibc
 * every copy is memcpy's.  Other C libraries' memcpy (musl's) never streams; there
 * copy_stream_avx2 runs (docs/benchmarks.md, session 13). */
#include <stdint.h>
#include <string.h>
#include "copy.h"
#include "zt_simd.h"

/* ZT_COPY_TEST_OWN_STREAM: tools/c-kernel-tests.sh's build that tests the loop under
 * glibc too */
#if defined(ZT_X86_AVX2) && (!defined(__GLIBC__) || defined(ZT_COPY_TEST_OWN_STREAM))
#define ZT_COPY_OWN_STREAM 1
#include <immintrin.h>

/* Four 32-byte loads, four streamed stores to a 32-byte-aligned destination; the
 * unaligned head and the tail are memcpy's. */
ZT_TARGET_AVX2
static void copy_stream_avx2(const uint8_t *s, uint8_t *d, size_t n) {
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head > n) head = n;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 128 <= n; i += 128) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        const __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    _mm_sfence();  /* streamed stores are weakly ordered: visible before we return */
    memcpy(d + i, s + i, n - i);
}
#endif

zt_status zt_copy(const void *src, void *dst, size_t n) {
    if (n == 0) return ZT_OK;
    if (src == NULL || dst == NULL) return ZT_E_ARG;
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    /* overlapping ranges are the caller's bug: refuse rather than copy garbage */
    if ((s < d && d < s + n) || (d < s && s < d + n)) return ZT_E_ARG;
#ifdef ZT_COPY_OWN_STREAM
    if (n >= ZT_COPY_STREAM_BYTES && zt_use_avx2()) {
        copy_stream_avx2(s, d, n);
        return ZT_OK;
    }
#endif
    if (s != d) memcpy(d, s, n);
    return ZT_OK;
}
