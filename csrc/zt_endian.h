/* Host byte order and little-endian loads/stores.
 *
 * Everything on disk is little-endian.  These helpers go through bytes, so they
 * are correct on any host and at any alignment; compilers turn them into single
 * loads (plus a bswap on big-endian hosts).
 */
#ifndef ZT_ENDIAN_H
#define ZT_ENDIAN_H

#include <stdint.h>
#include <string.h>

static inline int zt_host_is_big_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 0;
}

static inline uint64_t zt_load_le64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static inline uint32_t zt_load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline void zt_store_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
