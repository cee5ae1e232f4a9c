/* Deterministic-encoding check (see cbor_canonical.h).
 *
 * Why in C: the v2 manifest must be refused when it is not deterministic, which
 * means comparing every map key's encoding with the previous one and every head
 * with its shortest form, one pass over up to a gigabyte; cbor2 decodes without
 * telling us any of that.  The walk is iterative with one frame per open
 * container, like cbor_scan.c.
 */
#include <stdlib.h>
#include <string.h>
#include "cbor_canonical.h"
#include "floatconv.h"

typedef struct {
    uint64_t left;       /* items still expected in this container */
    uint64_t seen;       /* items read so far (map keys are the even ones) */
    size_t start;        /* offset of this container's head */
    size_t key_start;    /* the map's previous key: [key_start, key_end) */
    size_t key_end;
    int is_map;
} frame;

#define FAIL(status, text)  \
    do {                    \
        out->end = pos;     \
        out->why = (text);  \
        free(stack);        \
        return (status);    \
    } while (0)

/* Is the float of `width` bytes (big-endian bits in `bits`) in its shortest exact
 * form?  NaN is only ever f9 7e00. */
static int float_canonical(int width, uint64_t bits) {
    if (width == 2) {
        const int nan = (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF);
        return !nan || bits == 0x7E00;
    }
    if (width == 4) {
        uint32_t u = (uint32_t)bits;
        float f;
        memcpy(&f, &u, 4);
        if (f != f) return 0;                                 /* NaN: only as half */
        return zt_f16_to_f32(zt_f32_to_f16(f)) != f;         /* not exact in half */
    }
    double d;
    memcpy(&d, &bits, 8);
    if (d != d) return 0;
    const float f = (float)d;
    return (double)f != d;                                   /* not exact in single */
}

/* compare encodings a and b bytewise, the shorter first when one is a prefix */
static int key_order(const uint8_t *buf, size_t a0, size_t a1, size_t b0, size_t b1) {
    const size_t na = a1 - a0, nb = b1 - b0, n = na < nb ? na : nb;
    const int c = memcmp(buf + a0, buf + b0, n);
    if (c) return c;
    return na < nb ? -1 : na > nb ? 1 : 0;
}

zt_status zt_cbor_check_canonical(const uint8_t *buf, size_t len, size_t max_depth,
                                  zt_cbor_scan_result *out) {
    size_t pos = 0, top = 0;
    frame *stack = NULL;
    if (out == NULL || (buf == NULL && len) || max_depth > 100000) return ZT_E_ARG;
    out->end = 0;
    out->items = 0;
    out->depth = 0;
    out->tag = 0;
    out->why = "";
    stack = (frame *)malloc((max_depth + 1) * sizeof(frame));
    if (stack == NULL) return ZT_E_NOMEM;
    int done = 0;
    while (!done) {
        const size_t item_start = pos, depth = top;  /* this item's nesting depth */
        if (depth > max_depth) FAIL(ZT_E_CBOR_DEPTH, "nesting deeper than the limit");
        if (pos >= len) FAIL(ZT_E_CBOR_MALFORMED, "the bytes end inside an item");
        const uint8_t ib = buf[pos++];
        const int major = ib >> 5, info = ib & 31;
        uint64_t arg = info;
        if (info == 31) FAIL(ZT_E_CBOR_MALFORMED, "an indefinite length");
        if (info >= 28) FAIL(ZT_E_CBOR_MALFORMED, "a reserved head value");
        if (info >= 24) {
            const size_t n = (size_t)1 << (info - 24);
            if (len - pos < n) FAIL(ZT_E_CBOR_MALFORMED, "the bytes end inside a head");
            arg = 0;
            for (size_t i = 0; i < n; i++) arg = (arg << 8) | buf[pos + i];
            pos += n;
            if (major != 7) {
                static const uint64_t floor[4] = {24, 0x100, 0x10000, 0x100000000ULL};
                if (arg < floor[info - 24]) FAIL(ZT_E_CBOR_MALFORMED, "a head not in shortest form");
            }
        }
        out->items++;
        if (depth + 1 > out->depth) out->depth = depth + 1;
        int opens = 0;
        switch (major) {
        case 0: case 1:
            break;
        case 2: case 3:
            if (arg > len - pos) FAIL(ZT_E_CBOR_MALFORMED, "a string longer than the bytes left");
            pos += (size_t)arg;
            break;
        case 4: case 5:
            if (major == 5 && arg > (len - pos) / 2) FAIL(ZT_E_CBOR_MALFORMED, "a map longer than the bytes left");
            if (arg > len - pos) FAIL(ZT_E_CBOR_MALFORMED, "an array longer than the bytes left");
            if (arg) {
                if (depth + 1 > max_depth) FAIL(ZT_E_CBOR_DEPTH, "nesting deeper than the limit");
                frame *f = &stack[top++];
                f->left = major == 5 ? 2 * arg : arg;
                f->seen = 0;
                f->start = item_start;
                f->key_start = f->key_end = 0;
                f->is_map = major == 5;
                opens = 1;
            }
            break;
        case 6:
            out->tag = arg;
            FAIL(ZT_E_CBOR_TAG, "a CBOR tag");
        default: /* 7 */
            if (info == 24 && arg < 32) FAIL(ZT_E_CBOR_MALFORMED, "a simple value in two bytes");
            if (info >= 25 && info <= 27 && !float_canonical(2 << (info - 25), arg))
                FAIL(ZT_E_CBOR_MALFORMED, "a float not in its shortest form");
            break;
        }
        if (opens) continue;
        /* the item [item_start, pos) is complete: close every container it completes */
        size_t child_start = item_start;
        for (;;) {
            if (top == 0) {
                done = 1;
                break;
            }
            frame *f = &stack[top - 1];
            if (f->is_map && f->seen % 2 == 0) {  /* child was a key */
                if (f->seen > 0 && key_order(buf, f->key_start, f->key_end, child_start, pos) >= 0)
                    FAIL(ZT_E_CBOR_MALFORMED, "map keys not in strictly increasing order");
                f->key_start = child_start;
                f->key_end = pos;
            }
            f->seen++;
            if (--f->left) break;
            child_start = f->start;  /* the container itself completes */
            top--;
        }
    }
    if (pos != len) FAIL(ZT_E_CBOR_MALFORMED, "bytes after the manifest's item");
    out->end = pos;
    free(stack);
    return ZT_OK;
}
