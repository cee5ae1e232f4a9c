/* RFC 8949 core deterministic encoding, checked (zTensor v2 manifests).  See
 * cbor_canonical.c. */
#ifndef ZT_CBOR_CANONICAL_H
#define ZT_CBOR_CANONICAL_H

#include <stddef.h>
#include <stdint.h>
#include "cbor_scan.h"

/* Check that buf[0:len] is exactly one CBOR item in core deterministic encoding
 * (RFC 8949 section 4.2.1) with no tags and no item deeper than max_depth (the
 * root is depth 0): shortest-form heads, definite lengths, map keys in strictly
 * increasing bytewise order of their encodings (so no duplicates), floats in their
 * shortest exact form and NaN only as f9 7e00, no bytes after the item.
 * Statuses: ZT_E_CBOR_MALFORMED (out->why says which rule), ZT_E_CBOR_TAG,
 * ZT_E_CBOR_DEPTH.  O(len) work, O(max_depth) memory. */
zt_status zt_cbor_check_canonical(const uint8_t *buf, size_t len, size_t max_depth,
                                  zt_cbor_scan_result *out);

#endif
