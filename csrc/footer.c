/* Footer validation: the first step of every read, on bytes nobody has checked.
 *
 *   v1.x  ("ZTEN1000")                      v0.1 ("ZTEN0001")
 *   0      8                 EOF-16  EOF     0      8            EOF-8  EOF
 *   |magic| blobs | manifest |size|magic|    |magic| blobs | CBOR |size|
 *
 * size is a uint64 LE.  The manifest must fit between the header and the tail, so
 * manifest_offset >= 8 and no arithmetic below can wrap.
 */
#include <string.h>
#include "footer.h"
#include "zt_endian.h"

static const uint8_t MAGIC_V1[ZT_MAGIC_LEN] = {'Z', 'T', 'E', 'N', '1', '0', '0', '0'};
static const uint8_t MAGIC_V0[ZT_MAGIC_LEN] = {'Z', 'T', 'E', 'N', '0', '0', '0', '1'};

zt_status zt_footer_parse(const uint8_t *head, size_t head_len, const uint8_t *tail,
                          size_t tail_len, uint64_t file_size, uint64_t max_manifest,
                          zt_footer *out) {
    if (head == NULL || tail == NULL || out == NULL) return ZT_E_ARG;
    if (file_size < ZT_MAGIC_LEN || head_len < ZT_MAGIC_LEN) return ZT_E_TRUNCATED;

    int family;
    uint64_t tail_size;             /* bytes after the manifest */
    if (memcmp(head, MAGIC_V1, ZT_MAGIC_LEN) == 0) {
        family = ZT_FAMILY_V1;
        tail_size = 16;
    } else if (memcmp(head, MAGIC_V0, ZT_MAGIC_LEN) == 0) {
        family = ZT_FAMILY_V0;
        tail_size = 8;
    } else {
        return ZT_E_BAD_MAGIC;
    }
    if (file_size < ZT_MAGIC_LEN + tail_size || tail_len < tail_size) return ZT_E_TRUNCATED;

    const uint8_t *t = tail + tail_len - tail_size;   /* start of the tail proper */
    if (family == ZT_FAMILY_V1 && memcmp(t + 8, MAGIC_V1, ZT_MAGIC_LEN) != 0)
        return ZT_E_BAD_FOOTER_MAGIC;

    uint64_t size = zt_load_le64(t);
    out->family = family;          /* filled early so a caller can report the numbers */
    out->manifest_size = size;
    if (size > max_manifest) return ZT_E_MANIFEST_TOO_LARGE;
    if (size > file_size - ZT_MAGIC_LEN - tail_size) return ZT_E_MANIFEST_OUT_OF_BOUNDS;

    out->manifest_offset = file_size - tail_size - size;
    out->data_end = out->manifest_offset;
    return ZT_OK;
}
