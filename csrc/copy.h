/* Copy a byte range, streaming large ones past the cache. */
#ifndef ZT_COPY_H
#define ZT_COPY_H

#include <stddef.h>
#include "zt_status.h"

/* Copy n bytes from src to dst (the ranges must not overlap; neither pointer needs
 * any alignment).  Under glibc this is memcpy, which streams large copies itself;
 * under other C libraries copies of ZT_COPY_STREAM_BYTES and more take non-temporal
 * stores on AVX2 CPUs (copy.c says why). */
enum { ZT_COPY_STREAM_BYTES = 1 << 20 };
zt_status zt_copy(const void *src, void *dst, size_t n);

#endif
