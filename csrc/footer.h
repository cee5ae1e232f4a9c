/* Locate the manifest from a file's first 8 and last 16 bytes.  See footer.c. */
#ifndef ZT_FOOTER_H
#define ZT_FOOTER_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

#define ZT_MAGIC_LEN 8
#define ZT_TAIL_LEN 16

enum { ZT_FAMILY_V0 = 0, ZT_FAMILY_V1 = 1 };

typedef struct {
    int family;                /* ZT_FAMILY_V0 ("ZTEN0001") or ZT_FAMILY_V1 ("ZTEN1000") */
    uint64_t manifest_offset;  /* absolute offset of the CBOR manifest */
    uint64_t manifest_size;    /* its length in bytes */
    uint64_t data_end;         /* first byte past the blob region (== manifest_offset) */
} zt_footer;

/* head: the file's first min(8, file_size) bytes; tail: its last min(16, file_size)
 * bytes (tail_len of them).  Checks magics and that the manifest fits the file and
 * max_manifest.  *out is complete on ZT_OK; after a size error, family and
 * manifest_size are set so the caller can report them. */
zt_status zt_footer_parse(const uint8_t *head, size_t head_len, const uint8_t *tail,
                          size_t tail_len, uint64_t file_size, uint64_t max_manifest,
                          zt_footer *out);

#endif
