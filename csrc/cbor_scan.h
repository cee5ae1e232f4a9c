/* Well-formedness and shape check of one CBOR data item, before any decoder runs.
 * See cbor_scan.c. */
#ifndef ZT_CBOR_SCAN_H
#define ZT_CBOR_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

typedef struct {
    size_t end;        /* ZT_OK: offset just past the item; else where the problem is */
    size_t items;      /* data items seen (tags and chunks of indefinite strings count) */
    size_t depth;      /* deepest nesting seen (the root item is depth 1) */
    uint64_t tag;      /* ZT_E_CBOR_TAG: the tag that was refused */
    const char *why;   /* static text naming the problem, "" on ZT_OK */
} zt_cbor_scan_result;

/* Walk the CBOR item starting at buf[0] without decoding it.  Refuses (with a
 * status and out->why): bytes that are not well-formed CBOR (RFC 8949 section
 * 3 and appendix F), nesting deeper than max_depth, a tag other than 2 and 3
 * (bignums, whose cost is linear in their bytes) and 55799 (self-described CBOR),
 * and a map key that is not a text string.  Work is O(len) and memory O(max_depth):
 * every item takes at least one byte, and nothing is shared or expanded.
 * Trailing bytes after the item are not an error here (out->end says where it
 * ended). */
zt_status zt_cbor_scan(const uint8_t *buf, size_t len, size_t max_depth,
                       zt_cbor_scan_result *out);

#endif
