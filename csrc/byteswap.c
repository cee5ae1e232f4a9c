/* Byte swap.  memcpy in and out keeps the loops alignment-safe; GCC and Clang turn
 * each loop into vector shuffles (pshufb / vperm) at -O3; on x86-64 the shuffle
 * needs more than baseline SSE2, hence the AVX2 clones (zt_simd.h). */
#include <stdint.h>
#include <string.h>
#include "byteswap.h"
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

zt_status zt_bswap(const void *src, void *dst, size_t count, size_t width) {
    if ((src == NULL || dst == NULL) && count != 0) return ZT_E_ARG;
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    switch (width) {
    case 1: if (s != d && count) memcpy(d, s, count); return ZT_OK;
    case 2: swap16(s, d, count); return ZT_OK;
    case 4: swap32(s, d, count); return ZT_OK;
    case 8: swap64(s, d, count); return ZT_OK;
    default: return ZT_E_ARG;
    }
}
