/* Byte swap.  memcpy in and out keeps the loops alignment-safe; GCC and Clang turn
 * each loop into vector shuffles (pshufb / vperm) at -O3; on x86-64 the shuffle
 * needs more than baseline SSE2, hence the AVX2 clones (zt_simd.h).
 *
 * Large buffers on AVX2 CPUs take a streaming path: ordinary stores first read
 * every destination line into the cache (a third more memory traffic than the
 * copy itself), non-temporal stores do not, which is how memcpy moves large
 * buffers; below ZT_STREAM_BYTES the destination is better left in the cache. */
#include <stdint.h>
#include <string.h>
#include "byteswap.h"
#include "copy.h"
#include "zt_simd.h"

#if defined(_MSC_VER) && !defined(__clang__)
#include <stdlib.h>
#define zt_bswap32_one(v) _byteswap_ulong(v)
#define zt_bswap64_one(v) _byteswap_uint64(v)
#else
#define zt_bswap32_one(v) __builtin_bswap32(v)
#define zt_bswap64_one(v) __builtin_bswap64(v)
#endif

ZT_CLONES static void swap16(const uint8_t *s, uint8_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, s + 2 * i, 2);
        v = (uint16_t)((v >> 8) | (v << 8));
        memcpy(d + 2 * i, &v, 2);
    }
}

ZT_CLONES static void swap32(const uint8_t *s, uint8_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, s + 4 * i, 4);
        v = zt_bswap32_one(v);
        memcpy(d + 4 * i, &v, 4);
    }
}

ZT_CLONES static void swap64(const uint8_t *s, uint8_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, s + 8 * i, 8);
        v = zt_bswap64_one(v);
        memcpy(d + 8 * i, &v, 8);
    }
}

static void swap_portable(const uint8_t *s, uint8_t *d, size_t count, size_t width) {
    switch (width) {
    case 2: swap16(s, d, count); break;
    case 4: swap32(s, d, count); break;
    default: swap64(s, d, count); break;
    }
}

#ifdef ZT_X86_AVX2
#include <immintrin.h>

enum { ZT_STREAM_BYTES = 4 << 20 };

/* Whole 32-byte blocks shuffled and streamed to a 32-byte-aligned destination;
 * the unaligned head and the tail go through the portable loop. */
ZT_TARGET_AVX2
static void swap_stream_avx2(const uint8_t *s, uint8_t *d, size_t count, size_t width) {
    static const int8_t masks[3][16] = {
        {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
        {3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12},
        {7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8}};
    const __m256i mask = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)masks[width == 2 ? 0 : width == 4 ? 1 : 2]));
    const size_t nbytes = count * width;
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;  /* a multiple of width: d is aligned */
    if (head > nbytes) head = nbytes - nbytes % width;
    swap_portable(s, d, head / width, width);
    size_t i = head;
    for (; i + 32 <= nbytes; i += 32) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(s + i));
        _mm256_stream_si256((__m256i *)(d + i), _mm256_shuffle_epi8(x, mask));
    }
    _mm_sfence();  /* streamed stores are weakly ordered: visible before we return */
    swap_portable(s + i, d + i, (nbytes - i) / width, width);
}
#endif

zt_status zt_bswap(const void *src, void *dst, size_t count, size_t width) {
    if ((src == NULL || dst == NULL) && count != 0) return ZT_E_ARG;
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
#ifdef ZT_X86_AVX2
    if ((width == 2 || width == 4 || width == 8) && count >= ZT_STREAM_BYTES / width &&
        (uintptr_t)d % width == 0 && zt_use_avx2()) {
        swap_stream_avx2(s, d, count, width);
        return ZT_OK;
    }
#endif
    switch (width) {
    case 1: return zt_copy(s, d, count);
    case 2:
    case 4:
    case 8: swap_portable(s, d, count, width); return ZT_OK;
    default: return ZT_E_ARG;
    }
}
