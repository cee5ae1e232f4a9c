/* One CBOR data item, checked without decoding (see cbor_scan.h).
 *
 * Why this exists: a general CBOR decoder (cbor2) implements value sharing (tags
 * 28/29: a 330-byte file can describe 2^40 nodes) and arbitrary-precision
 * arithmetic tags (decimal 4, bigfloat 5, rational 30: seconds per kilobyte), and
 * its cost then follows what the bytes describe, not the bytes.  A manifest is
 * plain data, so anything beyond plain data is refused here, in one pass over the
 * bytes, and only then handed to the decoder.
 *
 * The walk is iterative: a stack of open containers, one frame per nesting level,
 * bounded by max_depth, so hostile nesting cannot overflow the C stack.
 */
#include <stdlib.h>
#include "cbor_scan.h"

typedef struct {
    uint64_t left;   /* items still expected (definite); ignored when indefinite */
    uint64_t seen;   /* items read so far: map keys are the even ones */
    int indefinite;
    int is_map;
} frame;

static int tag_allowed(uint64_t tag) { return tag == 2 || tag == 3 || tag == 55799; }

#define FAIL(status, text)  \
    do {                    \
        out->end = pos;     \
        out->why = (text);  \
        free(stack);        \
        return (status);    \
    } while (0)

/* The argument of the head at buf[*pos] (info: its low 5 bits), or -1 when the
 * bytes end first, -2 for the reserved values 28..30.  31 (indefinite) gives 0. */
static int read_argument(const uint8_t *buf, size_t len, size_t *pos, int info,
                         uint64_t *value) {
    if (info < 24 || info == 31) {
        *value = info < 24 ? (uint64_t)info : 0;
        return 0;
    }
    if (info > 27) return -2;
    size_t n = (size_t)1 << (info - 24);
    if (len - *pos < n) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | buf[*pos + i];  /* CBOR: big-endian */
    *pos += n;
    *value = v;
    return 0;
}

zt_status zt_cbor_scan(const uint8_t *buf, size_t len, size_t max_depth,
                       zt_cbor_scan_result *out) {
    size_t pos = 0, top = 0;
    frame *stack = NULL;
    if (out == NULL || (buf == NULL && len) || max_depth == 0 || max_depth > 100000)
        return ZT_E_ARG;
    out->end = 0;
    out->items = 0;
    out->depth = 0;
    out->tag = 0;
    out->why = "";
    /* frame 0 is a pseudo-array expecting the one root item */
    stack = (frame *)malloc((max_depth + 1) * sizeof(frame));
    if (stack == NULL) return ZT_E_NOMEM;
    stack[0].left = 1;
    stack[0].seen = 0;
    stack[0].indefinite = 0;
    stack[0].is_map = 0;
    for (;;) {
        frame *f = &stack[top];
        if (!f->indefinite && f->left == 0) {  /* container complete */
            if (top == 0) break;
            top--;
            continue;
        }
        if (pos >= len) FAIL(ZT_E_CBOR_MALFORMED, "the bytes end inside an item");
        const uint8_t ib = buf[pos];
        const int major = ib >> 5, info = ib & 31;
        if (ib == 0xFF) {  /* break */
            if (!f->indefinite) FAIL(ZT_E_CBOR_MALFORMED, "a break code outside an "
                                                          "indefinite-length item");
            if (f->is_map && f->seen % 2)
                FAIL(ZT_E_CBOR_MALFORMED, "a map key without a value");
            pos++;
            top--;
            continue;
        }
        if (f->is_map && f->seen % 2 == 0 && major != 3)
            FAIL(ZT_E_CBOR_KEY, "a map key that is not a text string");
        pos++;
        if (!f->indefinite) f->left--;
        f->seen++;
        out->items++;
        uint64_t arg;
        int r = read_argument(buf, len, &pos, info, &arg);
        if (r == -1) FAIL(ZT_E_CBOR_MALFORMED, "the bytes end inside an item's head");
        if (r == -2) FAIL(ZT_E_CBOR_MALFORMED, "a reserved additional-information value");
        if (info == 31 && (major == 0 || major == 1 || major == 6))
            FAIL(ZT_E_CBOR_MALFORMED, "an indefinite length on an integer or tag");
        switch (major) {
        case 0:
        case 1:
            break;
        case 2:
        case 3:
            if (info != 31) {
                if (arg > len - pos) FAIL(ZT_E_CBOR_MALFORMED, "a string longer than the "
                                                                "bytes that remain");
                pos += (size_t)arg;
                break;
            }
            for (;;) {  /* indefinite string: definite chunks of the same type, then break */
                if (pos >= len) FAIL(ZT_E_CBOR_MALFORMED, "the bytes end inside a string");
                const uint8_t cb = buf[pos];
                if (cb == 0xFF) {
                    pos++;
                    break;
                }
                if ((cb >> 5) != major || (cb & 31) == 31)
                    FAIL(ZT_E_CBOR_MALFORMED, "an indefinite-length string chunk of the "
                                              "wrong type");
                pos++;
                out->items++;
                uint64_t n;
                r = read_argument(buf, len, &pos, cb & 31, &n);
                if (r == -1) FAIL(ZT_E_CBOR_MALFORMED, "the bytes end inside a chunk head");
                if (r == -2) FAIL(ZT_E_CBOR_MALFORMED, "a reserved additional-information "
                                                       "value");
                if (n > len - pos) FAIL(ZT_E_CBOR_MALFORMED, "a string chunk longer than "
                                                             "the bytes that remain");
                pos += (size_t)n;
            }
            break;
        case 4:
        case 5:
        case 6: {
            if (major == 6 && !tag_allowed(arg)) {
                out->tag = arg;
                FAIL(ZT_E_CBOR_TAG, "a CBOR tag that manifests may not use");
            }
            if (major == 6 && arg != 55799) {  /* a bignum holds one byte string */
                if (pos >= len || (buf[pos] >> 5) != 2)
                    FAIL(ZT_E_CBOR_MALFORMED, "a bignum tag that does not hold a byte string");
            }
            /* every item takes at least one byte: a count above what remains is a lie
             * (and must not be trusted for anything) */
            uint64_t items = major == 6 ? 1 : arg;
            if (info != 31 && items > (uint64_t)(len - pos) / (major == 5 ? 2 : 1))
                FAIL(ZT_E_CBOR_MALFORMED, "a container declaring more items than the bytes "
                                          "that remain can hold");
            if (top + 1 > max_depth) FAIL(ZT_E_CBOR_DEPTH, "nesting deeper than the limit");
            top++;
            if (top > out->depth) out->depth = top;
            stack[top].left = major == 5 ? 2 * items : items;
            stack[top].seen = 0;
            stack[top].indefinite = info == 31;
            stack[top].is_map = major == 5;
            break;
        }
        case 7:
            if (info == 24 && arg < 32)
                FAIL(ZT_E_CBOR_MALFORMED, "a two-byte simple value below 32");
            if (info == 31) FAIL(ZT_E_CBOR_MALFORMED, "a break code outside an "
                                                      "indefinite-length item");
            break;
        }
    }
    out->end = pos;
    if (out->depth == 0) out->depth = 1;
    free(stack);
    return ZT_OK;
}
