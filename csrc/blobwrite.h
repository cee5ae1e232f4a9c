/* Append blobs to a file descriptor at 64-byte aligned offsets.  See blobwrite.c. */
#ifndef ZT_BLOBWRITE_H
#define ZT_BLOBWRITE_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

/* the alignment writes aim for: one transparent huge page on common hosts */
#define ZT_BW_EXTENT ((size_t)2 << 20)

typedef struct {
    int fd;           /* open for writing, positioned at `pos` */
    uint64_t pos;     /* logical end of file: bytes written plus bytes staged */
    uint8_t *buf;     /* staging buffer, cap bytes */
    size_t cap;
    size_t used;      /* staged bytes not yet handed to write(2) */
    int err;          /* errno of the last failed write, 0 if none */
    size_t extent;    /* writes end on multiples of this (a power of two <= cap / 2) */
    int reserve;      /* reserve a large write's blocks before it (blobwrite.c) */
} zt_blobwriter;

zt_status zt_bw_init(zt_blobwriter *bw, int fd, uint64_t pos, size_t cap);
/* Zero-fill up to the next multiple of alignment (a power of two). */
zt_status zt_bw_pad(zt_blobwriter *bw, uint64_t alignment);
/* Append len bytes. */
zt_status zt_bw_write(zt_blobwriter *bw, const void *data, size_t len);
zt_status zt_bw_flush(zt_blobwriter *bw);
void zt_bw_free(zt_blobwriter *bw);

/* Reserve the blocks of bytes [0, len) of fd without changing its size, on ext4 only
 * (blobwrite.c says why): 1 if reserved, 0 if not.  Only ever a hint, never an error;
 * errno is kept.  The caller truncates the file to its final length when done. */
int zt_reserve_ahead(int fd, uint64_t len);

#endif
