/* Byte-swap runs of 2-, 4- or 8-byte elements (little <-> big endian). */
#ifndef ZT_BYTESWAP_H
#define ZT_BYTESWAP_H

#include <stddef.h>
#include "zt_status.h"

/* Swap count elements of width bytes from src into dst.  src == dst is allowed
 * (in place); partial overlap is not.  Neither pointer needs any alignment. */
zt_status zt_bswap(const void *src, void *dst, size_t count, size_t width);

#endif
