/* Whether a byte string is whole zstd frames: the structure only, nothing decoded. */
#ifndef ZT_ZSTD_FRAMES_H
#define ZT_ZSTD_FRAMES_H

#include <stddef.h>
#include "zt_status.h"

typedef enum {
    ZT_FRAMES_WHOLE = 0,     /* the bytes are whole frames, nothing after the last */
    ZT_FRAMES_CUT = 1,       /* the bytes end inside the frame that starts at *at */
    ZT_FRAMES_NOT_ZSTD = 2,  /* no zstd or skippable frame magic at *at */
    ZT_FRAMES_BAD_BLOCK = 3, /* the frame at *at has a reserved header bit or block type */
} zt_frames_verdict;

/* Walk the frames of p[0..n) by their headers (RFC 8878): zstd frames block by
 * block, skippable frames by their size.  *verdict says what was found, *at where
 * the frame it concerns starts, *frames how many whole frames came before it.
 * Work is one step per block header; nothing is read past p + n. */
zt_status zt_zstd_frames(const void *p, size_t n, int *verdict, size_t *at, size_t *frames);

#endif
