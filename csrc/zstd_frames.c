/* The structure of a zstd stream, checked before it is decoded.
 *
 * A zstd decoder fed a stream that stops inside a frame (its checksum cut off,
 * its last block missing) stops without a word once its input runs out; when the
 * bytes it did produce match the size a file declares, a damaged component would
 * read as whole.  Walking the frame and block headers says whether the stored
 * bytes are exactly whole frames, at the cost of one step per block.
 *
 * Layouts (RFC 8878, all fields little-endian):
 *   zstd frame:      magic 0xFD2FB528, frame header descriptor, [window
 *                    descriptor], [dictionary id], [content size], blocks,
 *                    [4-byte content checksum]
 *   block:           3-byte header: bit 0 last block, bits 1-2 type (raw, RLE,
 *                    compressed, reserved), bits 3-23 size; then size bytes (raw,
 *                    compressed) or one byte (RLE)
 *   skippable frame: magic 0x184D2A50-5F, 4-byte size, that many bytes */
#include <stdint.h>
#include "zstd_frames.h"

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The length of the zstd frame at p[0..n), or 0 with *verdict set. */
static size_t zstd_frame(const uint8_t *p, size_t n, int *verdict) {
    static const size_t did_bytes[4] = {0, 1, 2, 4};
    static const size_t fcs_bytes[4] = {0, 2, 4, 8};
    if (n < 5) { *verdict = ZT_FRAMES_CUT; return 0; }
    const uint8_t fhd = p[4];
    if (fhd & 0x08) { *verdict = ZT_FRAMES_BAD_BLOCK; return 0; }  /* reserved bit */
    const int single_segment = (fhd >> 5) & 1;
    size_t pos = 5 + (single_segment ? 0 : 1) + did_bytes[fhd & 3] +
                 (single_segment && (fhd >> 6) == 0 ? 1 : fcs_bytes[fhd >> 6]);
    for (;;) {
        if (pos > n || n - pos < 3) { *verdict = ZT_FRAMES_CUT; return 0; }
        const uint32_t h = (uint32_t)p[pos] | (uint32_t)p[pos + 1] << 8 |
                           (uint32_t)p[pos + 2] << 16;
        const uint32_t type = (h >> 1) & 3, size = h >> 3;
        pos += 3;
        size_t body;
        switch (type) {
        case 0: body = size; break;   /* raw */
        case 1: body = 1; break;      /* RLE: one byte repeated size times */
        case 2: body = size; break;   /* compressed */
        default: *verdict = ZT_FRAMES_BAD_BLOCK; return 0;
        }
        if (n - pos < body) { *verdict = ZT_FRAMES_CUT; return 0; }
        pos += body;
        if (h & 1) break;  /* the last block */
    }
    if (fhd & 0x04) {  /* a content checksum follows the last block */
        if (n - pos < 4) { *verdict = ZT_FRAMES_CUT; return 0; }
        pos += 4;
    }
    return pos;
}

zt_status zt_zstd_frames(const void *data, size_t n, int *verdict, size_t *at, size_t *frames) {
    if ((data == NULL && n != 0) || verdict == NULL || at == NULL || frames == NULL)
        return ZT_E_ARG;
    const uint8_t *p = (const uint8_t *)data;
    size_t pos = 0, count = 0;
    *verdict = ZT_FRAMES_WHOLE;
    while (pos < n) {
        const size_t left = n - pos;
        size_t len;
        *at = pos;
        if (left < 4) { *verdict = ZT_FRAMES_CUT; break; }
        const uint32_t magic = le32(p + pos);
        if (magic == 0xFD2FB528u) {
            len = zstd_frame(p + pos, left, verdict);
            if (len == 0) break;
        } else if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) {
            if (left < 8 || left - 8 < le32(p + pos + 4)) { *verdict = ZT_FRAMES_CUT; break; }
            len = 8 + (size_t)le32(p + pos + 4);
        } else {
            *verdict = ZT_FRAMES_NOT_ZSTD;
            break;
        }
        pos += len;
        count++;
    }
    if (*verdict == ZT_FRAMES_WHOLE) *at = n;
    *frames = count;
    return ZT_OK;
}
