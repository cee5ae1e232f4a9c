/* CRC-32C (Castagnoli), as used by zTensor digests "crc32c:0x%08X". */
#ifndef ZT_CRC32C_H
#define ZT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Pick the implementation for this CPU and build the software tables.  Call once
 * before any other crc32c function (the extension does so at import). */
void zt_crc32c_init(void);

/* Continue a CRC: crc is the value returned for the bytes so far (0 to start). */
uint32_t zt_crc32c_update(uint32_t crc, const void *data, size_t len);

/* 1 when the hardware instruction is in use, 0 for the table fallback. */
int zt_crc32c_hardware(void);

/* The portable path alone, so tests can compare it with the hardware path. */
uint32_t zt_crc32c_update_sw(uint32_t crc, const void *data, size_t len);

#endif
