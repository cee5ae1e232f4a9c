/* WRITE 2: the manifest's objects map in one pass, without per-object containers.
 * See manifest_encode.c. */
#ifndef ZT_MANIFEST_ENCODE_H
#define ZT_MANIFEST_ENCODE_H

#include <stddef.h>
#include <stdint.h>
#include "manifest_scan.h"
#include "zt_status.h"

typedef struct {
    size_t count;                 /* objects */
    const uint8_t *names;         /* every name's UTF-8 bytes, back to back, in order */
    const uint64_t *name_len;     /* per object */
    const uint8_t *plain;         /* per object: 1 plain dense (columns below), 0 pre-encoded */
    /* plain objects, in their order among the plain ones */
    const uint64_t *rank, *dims;  /* dims: every plain object's dims, back to back */
    const uint64_t *dtype;        /* index in `dtypes` */
    const uint64_t *offset, *length;
    /* the other objects: their CBOR map items, back to back, in their order */
    const uint8_t *pre;
    const uint64_t *pre_len;
    zt_vocab dtypes;
} zt_mf_encode_args;

/* Writes the CBOR map of name -> object, sorted by the names' UTF-8 bytes, into
 * out (capacity cap); a plain object is {"shape": [...], "format": "dense",
 * "components": {"data": {"dtype", "offset", "length"}}}, keys in that order, every
 * head minimal: the bytes cbor2 gives for the same dicts (the reference's layout).
 * *written: bytes written.  ZT_E_ARG when cap is too small or an index is out of
 * range; ZT_E_NOMEM when the sort's scratch cannot be allocated. */
zt_status zt_manifest_encode(const zt_mf_encode_args *a, uint8_t *out, size_t cap,
                             size_t *written);

#endif
