/* XXH3-64 (seed 0, default secret): the manifest hash of zTensor v2 footers and the
 * "xxh3:" part digest.  Written from the algorithm description in xxHash's
 * doc/xxhash_spec.md (v0.2.0); every multi-byte read is little-endian, so the result
 * is the same on every host. */
#ifndef ZT_XXH3_H
#define ZT_XXH3_H

#include <stddef.h>
#include <stdint.h>

uint64_t zt_xxh3_64(const uint8_t *data, size_t len);

#endif
