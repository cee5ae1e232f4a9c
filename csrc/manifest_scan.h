/* The v1 manifest as compact tables: one row per object, one per component.
 * See manifest_scan.c. */
#ifndef ZT_MANIFEST_SCAN_H
#define ZT_MANIFEST_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

#define ZT_MF_NONE UINT64_MAX  /* an absent optional field, or a word not in its vocabulary */

/* A vocabulary: `count` NUL-terminated words stored back to back.  A field's
 * value is reported as its index in the vocabulary. */
typedef struct {
    const char *words;
    size_t count;
} zt_vocab;

/* The fields of one row.  Every field is a uint64; the tables the caller passes are
 * column-major uint64 arrays (fields, capacity): field f of row r at [f * cap + r]. */
typedef struct {
    uint64_t name_off, name_len;     /* the object's name: bytes of the manifest */
    uint64_t format;                 /* index in the format vocabulary */
    uint64_t attrs_off, attrs_len;   /* the attributes map item; attrs_len 0: absent */
    uint64_t dims_start, rank;       /* its shape: dims[dims_start .. + rank] */
    uint64_t comps_start, ncomps;    /* its components: rows [comps_start .. + ncomps] */
    uint64_t numel;                  /* product of the dims (meaningful when extent_ok) */
    uint64_t extent_ok;              /* 16 x the product of the non-zero dims < 2^63 */
} zt_mf_object;
#define ZT_MF_OBJECT_FIELDS 11

typedef struct {
    uint64_t role_off, role_len;     /* the component's name: bytes of the manifest */
    uint64_t role;                   /* index in the role vocabulary, or ZT_MF_NONE */
    uint64_t dtype;                  /* index in the dtype vocabulary */
    uint64_t type;                   /* index in the type vocabulary; ZT_MF_NONE: absent */
    uint64_t offset, length;
    uint64_t encoding;               /* index in the encoding vocabulary (raw: absent -> 0) */
    uint64_t ulen;                   /* uncompressed_length, ZT_MF_NONE: absent */
    uint64_t digest_off, digest_len; /* digest_off 0: absent (0 is the root's head) */
    uint64_t object;                 /* row of the owning object */
} zt_mf_component;
#define ZT_MF_COMPONENT_FIELDS 12

typedef struct {
    zt_vocab formats, dtypes, types, encodings, roles;
    size_t max_depth;       /* nesting limit for values skipped or spanned */
    size_t max_components;  /* per object; more -> not on the fast path */
    int text_checked;       /* 1: a count pass over these bytes returned fast, so a
                               fill pass need not check their UTF-8 again */
} zt_mf_config;

typedef struct {
    int fast;                         /* 1: the tables describe the manifest exactly */
    int full;                         /* fast == 0 only because a table was too small:
                                         count, then fill tables of those sizes */
    const char *why;                  /* fast == 0: the construct that left the fast path */
    size_t pos;                       /* ... and where it is */
    uint64_t version_off, version_len;
    uint64_t attrs_off, attrs_len;    /* file attributes map; attrs_len 0: absent */
    size_t nobjects, ncomponents, ndims;
} zt_mf_result;

/* Scan the manifest `buf` (one CBOR item) in the shape every known writer
 * produces: a root map with
 * "version" (text), "objects" (map of name -> {"shape": [uint...], "format": text,
 * "attributes": map, "components": map of role -> {"dtype", "type", "encoding",
 * "digest": text; "offset", "length", "uncompressed_length": uint}}) and optional
 * "attributes"; unknown keys are skipped.  Text is checked to be valid UTF-8.
 * Returning fast means zt_cbor_scan (with config->max_depth) accepts the bytes
 * too: they are well-formed, end where the item ends, nest no deeper, carry no
 * tag and key every map with text, so a caller need not scan them again.
 *
 * Tables NULL: count only (out->nobjects/ncomponents/ndims are the row counts to
 * allocate).  Otherwise the caller passes column-major tables with their capacities
 * (rows), filled in the same pass; a manifest that needs more rows sets out->full
 * (and fast = 0).  So a caller may fill tables sized from the byte count in one
 * pass and count only when they were too small; config->text_checked then skips
 * the second UTF-8 check.
 *
 * Anything outside that shape (a duplicate key, a tag, a negative or bignum
 * integer, a null, a word not in its vocabulary, an empty name, indefinite
 * strings...) sets out->fast = 0 and returns ZT_OK: the caller then decodes the
 * manifest the general way, which reports any error in full.  Work is O(len). */
zt_status zt_manifest_scan(const uint8_t *buf, size_t len, const zt_mf_config *config,
                           uint64_t *objects, size_t cap_objects,
                           uint64_t *components, size_t cap_components,
                           uint64_t *dims, size_t cap_dims, zt_mf_result *out);

#endif
