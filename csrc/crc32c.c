/* CRC-32C: SSE4.2 `crc32` instruction when the CPU has it (checked at run time, so
 * wheels built for baseline x86-64 still use it), slicing-by-8 tables otherwise.
 *
 * The table path reads input bytes one at a time or as explicit little-endian
 * words, so it gives the same result on big-endian hosts (s390x, ppc64). */
#include "crc32c.h"
#include <string.h>
#include "zt_endian.h"

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static uint32_t (*impl)(uint32_t, const uint8_t *, size_t);

uint32_t zt_crc32c_update_sw(uint32_t crc, const void *data, size_t len) {
    const uint8_t *p = (const uint8_t *)data;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) { c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8); len--; }
    while (len >= 8) {
        uint64_t w = zt_load_le64(p) ^ c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
            table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
            table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t len) {
    return zt_crc32c_update_sw(crc, p, len);
}

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define ZT_HAVE_SSE42_PATH 1
/* Raw CRC state (no inversions) advanced over n zero bytes, 8 at a time. */
static uint32_t shift_zeros_sw(uint32_t c, size_t n) {
    for (; n >= 8; n -= 8)
        c = table[7][c & 0xff] ^ table[6][(c >> 8) & 0xff] ^ table[5][(c >> 16) & 0xff] ^
            table[4][c >> 24];
    while (n--) c = table[0][c & 0xff] ^ (c >> 8);
    return c;
}

/* CRC is linear over GF(2): advancing a state over L zero bytes is a fixed 32x32 bit
 * matrix, applied here byte by byte through four 256-entry tables. */
typedef struct { uint32_t t[4][256]; } shift_table;

static void shift_table_build(shift_table *st, size_t nbytes) {
    uint32_t bit[32];
    for (int i = 0; i < 32; i++) bit[i] = shift_zeros_sw(1u << i, nbytes);
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++)
                if (b & (1 << j)) v ^= bit[8 * k + j];
            st->t[k][b] = v;
        }
}

static inline uint32_t shift_apply(const shift_table *st, uint32_t c) {
    return st->t[0][c & 0xff] ^ st->t[1][(c >> 8) & 0xff] ^ st->t[2][(c >> 16) & 0xff] ^
           st->t[3][c >> 24];
}

#define STRIPE 4096 /* bytes per stream and round; 3 streams hide the 3-cycle latency */
static shift_table shift_one, shift_two; /* over STRIPE and 2 * STRIPE zero bytes */

__attribute__((target("sse4.2")))
static uint32_t crc_sse42(uint32_t crc, const uint8_t *p, size_t len) {
    uint64_t c = (uint32_t)~crc;
    while (len && ((uintptr_t)p & 7)) { c = __builtin_ia32_crc32qi((uint32_t)c, *p++); len--; }
    while (len >= 3 * STRIPE) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < STRIPE; i += 8) {
            uint64_t a, b, d;
            memcpy(&a, p + i, 8);
            memcpy(&b, p + STRIPE + i, 8);
            memcpy(&d, p + 2 * STRIPE + i, 8);
            c = __builtin_ia32_crc32di(c, a);
            c1 = __builtin_ia32_crc32di(c1, b);
            c2 = __builtin_ia32_crc32di(c2, d);
        }
        c = shift_apply(&shift_two, (uint32_t)c) ^ shift_apply(&shift_one, (uint32_t)c1) ^
            (uint32_t)c2;
        p += 3 * STRIPE;
        len -= 3 * STRIPE;
    }
    while (len >= 8) { uint64_t w; memcpy(&w, p, 8); c = __builtin_ia32_crc32di(c, w); p += 8; len -= 8; }
    while (len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

void zt_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    impl = crc_sw;
#ifdef ZT_HAVE_SSE42_PATH
    shift_table_build(&shift_one, STRIPE);
    shift_table_build(&shift_two, 2 * STRIPE);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) impl = crc_sse42;
#endif
}

uint32_t zt_crc32c_update(uint32_t crc, const void *data, size_t len) {
    return impl(crc, (const uint8_t *)data, len);
}

int zt_crc32c_hardware(void) { return impl != crc_sw; }
