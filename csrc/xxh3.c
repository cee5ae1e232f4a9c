/* XXH3-64 with seed 0 and the default 192-byte secret; see xxh3.h.  Inputs of 0-16,
 * 17-128, 129-240 and more bytes take the four paths the description defines. */
#include "xxh3.h"
#include "zt_endian.h"

#define P32_1 0x9E3779B1ULL
#define P32_2 0x85EBCA77ULL
#define P32_3 0xC2B2AE3DULL
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define MX1 0x165667919E3779F9ULL
#define MX2 0x9FB21C651E98DF25ULL

enum { SECRET_LEN = 192, STRIPE = 64, STRIPES_PER_BLOCK = (SECRET_LEN - 64) / 8,
       BLOCK = STRIPE * STRIPES_PER_BLOCK };

static const uint8_t SECRET[SECRET_LEN] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t rd64(const uint8_t *p) { return zt_load_le64(p); }
static inline uint64_t rd32(const uint8_t *p) { return zt_load_le32(p); }
static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t bswap64(uint64_t x) {
    x = ((x & 0x00FF00FF00FF00FFULL) << 8) | ((x >> 8) & 0x00FF00FF00FF00FFULL);
    x = ((x & 0x0000FFFF0000FFFFULL) << 16) | ((x >> 16) & 0x0000FFFF0000FFFFULL);
    return (x << 32) | (x >> 32);
}

/* (lo ^ hi) of the full 128-bit product a * b, from 32-bit halves (no __int128
 * needed, the same on every compiler) */
static inline uint64_t mul128_fold(uint64_t a, uint64_t b) {
    const uint64_t al = a & 0xFFFFFFFFULL, ah = a >> 32, bl = b & 0xFFFFFFFFULL, bh = b >> 32;
    const uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    const uint64_t cross = (ll >> 32) + (lh & 0xFFFFFFFFULL) + hl;
    const uint64_t hi = hh + (lh >> 32) + (cross >> 32);
    const uint64_t lo = (cross << 32) | (ll & 0xFFFFFFFFULL);
    return lo ^ hi;
}

static inline uint64_t avalanche(uint64_t x) {
    x ^= x >> 37;
    x *= MX1;
    return x ^ (x >> 32);
}

static inline uint64_t avalanche_xxh64(uint64_t x) {
    x ^= x >> 33;
    x *= P64_2;
    x ^= x >> 29;
    x *= P64_3;
    return x ^ (x >> 32);
}

static uint64_t len_0to16(const uint8_t *p, size_t len) {
    if (len > 8) {
        const uint64_t lo = (rd64(SECRET + 24) ^ rd64(SECRET + 32)) ^ rd64(p);
        const uint64_t hi = (rd64(SECRET + 40) ^ rd64(SECRET + 48)) ^ rd64(p + len - 8);
        return avalanche(len + bswap64(lo) + hi + mul128_fold(lo, hi));
    }
    if (len >= 4) {
        const uint64_t first = rd32(p), last = rd32(p + len - 4);
        uint64_t v = (rd64(SECRET + 8) ^ rd64(SECRET + 16)) ^ (last | (first << 32));
        v ^= rotl64(v, 49) ^ rotl64(v, 24);
        v *= MX2;
        v ^= (v >> 35) + len;
        v *= MX2;
        return v ^ (v >> 28);
    }
    if (len > 0) {
        const uint32_t combined = (uint32_t)p[len - 1] | ((uint32_t)len << 8) |
                                  ((uint32_t)p[0] << 16) | ((uint32_t)p[len >> 1] << 24);
        const uint64_t v = (rd32(SECRET) ^ rd32(SECRET + 4)) ^ (uint64_t)combined;
        return avalanche_xxh64(v);
    }
    return avalanche_xxh64(rd64(SECRET + 56) ^ rd64(SECRET + 64));
}

static inline uint64_t mix16(const uint8_t *p, const uint8_t *s) {
    return mul128_fold(rd64(p) ^ rd64(s), rd64(p + 8) ^ rd64(s + 8));
}

static uint64_t len_17to128(const uint8_t *p, size_t len) {
    uint64_t acc = len * P64_1;
    const size_t rounds = ((len - 1) >> 5) + 1;
    for (size_t i = rounds; i-- > 0;) {
        acc += mix16(p + 16 * i, SECRET + 32 * i);
        acc += mix16(p + len - 16 * i - 16, SECRET + 32 * i + 16);
    }
    return avalanche(acc);
}

static uint64_t len_129to240(const uint8_t *p, size_t len) {
    uint64_t acc = len * P64_1;
    const size_t chunks = len >> 4;
    for (size_t i = 0; i < 8; i++) acc += mix16(p + 16 * i, SECRET + 16 * i);
    acc = avalanche(acc);
    for (size_t i = 8; i < chunks; i++) acc += mix16(p + 16 * i, SECRET + 16 * (i - 8) + 3);
    acc += mix16(p + len - 16, SECRET + 119);
    return avalanche(acc);
}

static inline void accumulate(uint64_t acc[8], const uint8_t *stripe, const uint8_t *s) {
    for (int i = 0; i < 8; i++) {
        const uint64_t lane = rd64(stripe + 8 * i), v = lane ^ rd64(s + 8 * i);
        acc[i ^ 1] += lane;
        acc[i] += (v & 0xFFFFFFFFULL) * (v >> 32);
    }
}

static inline void scramble(uint64_t acc[8]) {
    const uint8_t *s = SECRET + SECRET_LEN - 64;
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= rd64(s + 8 * i);
        acc[i] = a * P32_1;
    }
}

static uint64_t len_large(const uint8_t *p, size_t len) {
    uint64_t acc[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    const size_t blocks = (len - 1) / BLOCK;  /* the last block, even if full, waits */
    for (size_t b = 0; b < blocks; b++) {
        const uint8_t *block = p + b * BLOCK;
        for (size_t n = 0; n < STRIPES_PER_BLOCK; n++)
            accumulate(acc, block + n * STRIPE, SECRET + 8 * n);
        scramble(acc);
    }
    const uint8_t *last = p + blocks * BLOCK;
    const size_t last_len = len - blocks * BLOCK;
    for (size_t n = 0; n < (last_len - 1) / STRIPE; n++)
        accumulate(acc, last + n * STRIPE, SECRET + 8 * n);
    accumulate(acc, p + len - STRIPE, SECRET + SECRET_LEN - 71);
    uint64_t result = len * P64_1;
    for (int i = 0; i < 4; i++)
        result += mul128_fold(acc[2 * i] ^ rd64(SECRET + 11 + 16 * i),
                              acc[2 * i + 1] ^ rd64(SECRET + 11 + 16 * i + 8));
    return avalanche(result);
}

uint64_t zt_xxh3_64(const uint8_t *data, size_t len) {
    if (len <= 16) return len_0to16(data, len);
    if (len <= 128) return len_17to128(data, len);
    if (len <= 240) return len_129to240(data, len);
    return len_large(data, len);
}
