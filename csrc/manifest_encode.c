/* The manifest's objects map, encoded from columns (see manifest_encode.h).
 *
 * Why this exists: encoding N objects through Python dicts and cbor2 builds five
 * containers per object and sorts Python strings; for a file of many small tensors
 * that was a third of the write time.  The writer keeps plain dense objects as
 * columns and this writes their entries directly; any other object arrives already
 * encoded (by cbor2) and is copied in its sorted place.  A test holds the output
 * byte-identical to cbor2's for the same dicts.
 */
#include <stdlib.h>
#include <string.h>
#include "manifest_encode.h"

typedef struct {
    uint8_t *out;
    size_t cap, pos;
    int overflow;
} sink;

static void put(sink *s, const void *p, size_t n) {
    if (s->overflow || n > s->cap - s->pos) {
        s->overflow = 1;
        return;
    }
    if (n) memcpy(s->out + s->pos, p, n);
    s->pos += n;
}

/* A minimal CBOR head (RFC 8949 section 3): major type and argument. */
static void head(sink *s, int major, uint64_t v) {
    uint8_t b[9];
    size_t n;
    const uint8_t m = (uint8_t)(major << 5);
    if (v < 24) {
        b[0] = (uint8_t)(m | v);
        n = 1;
    } else if (v <= 0xFF) {
        b[0] = m | 24;
        b[1] = (uint8_t)v;
        n = 2;
    } else if (v <= 0xFFFF) {
        b[0] = m | 25;
        n = 3;
    } else if (v <= 0xFFFFFFFFu) {
        b[0] = m | 26;
        n = 5;
    } else {
        b[0] = m | 27;
        n = 9;
    }
    for (size_t i = 1; i < n && n > 2; i++) b[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    put(s, b, n);
}

static void text(sink *s, const char *t) {
    size_t n = strlen(t);
    head(s, 3, n);
    put(s, t, n);
}

typedef struct {
    const uint8_t *name;
    uint64_t len;
} key;

static int key_less(const key *x, const key *y) {
    size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
    int c = memcmp(x->name, y->name, n);
    return c < 0 || (c == 0 && x->len < y->len);
}

/* Bottom-up merge sort of object indices by name bytes: O(n log n), no recursion. */
static int sort_by_name(const key *keys, uint32_t *idx, size_t n) {
    uint32_t *tmp = (uint32_t *)malloc((n ? n : 1) * sizeof(uint32_t));
    if (tmp == NULL) return -1;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = key_less(&keys[idx[j]], &keys[idx[i]]) ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof(uint32_t));
    }
    free(tmp);
    return 0;
}

zt_status zt_manifest_encode(const zt_mf_encode_args *a, uint8_t *out, size_t cap,
                             size_t *written) {
    if (a == NULL || written == NULL || (out == NULL && cap) || a->count > UINT32_MAX)
        return ZT_E_ARG;
    const size_t n = a->count;
    key *keys = (key *)malloc((n ? n : 1) * sizeof(key));
    uint32_t *idx = (uint32_t *)malloc((n ? n : 1) * sizeof(uint32_t));
    /* where each object's pieces start: plain row (or pre-encoded item) and dims */
    uint64_t *at = (uint64_t *)malloc((n ? n : 1) * 2 * sizeof(uint64_t));
    zt_status st = ZT_OK;
    if (keys == NULL || idx == NULL || at == NULL) {
        st = ZT_E_NOMEM;
        goto done;
    }
    uint64_t name_at = 0, plain_row = 0, dims_at = 0, pre_row = 0, pre_at = 0;
    for (size_t i = 0; i < n; i++) {
        keys[i].name = a->names + name_at;
        keys[i].len = a->name_len[i];
        name_at += a->name_len[i];
        idx[i] = (uint32_t)i;
        if (a->plain[i]) {
            at[2 * i] = plain_row++;
            at[2 * i + 1] = dims_at;
            dims_at += a->rank[at[2 * i]];
        } else {
            at[2 * i] = pre_row++;
            at[2 * i + 1] = pre_at;
            pre_at += a->pre_len[at[2 * i]];
        }
    }
    if (sort_by_name(keys, idx, n)) {
        st = ZT_E_NOMEM;
        goto done;
    }
    sink s = {out, cap, 0, 0};
    head(&s, 5, n);
    for (size_t r = 0; r < n; r++) {
        const size_t i = idx[r];
        head(&s, 3, keys[i].len);
        put(&s, keys[i].name, keys[i].len);
        if (!a->plain[i]) {
            put(&s, a->pre + at[2 * i + 1], a->pre_len[at[2 * i]]);
            continue;
        }
        const uint64_t row = at[2 * i], rank = a->rank[row];
        const char *dtype = a->dtypes.words;
        if (a->dtype[row] >= a->dtypes.count) {
            st = ZT_E_ARG;
            goto done;
        }
        for (uint64_t w = 0; w < a->dtype[row]; w++) dtype += strlen(dtype) + 1;
        head(&s, 5, 3);
        text(&s, "shape");
        head(&s, 4, rank);
        for (uint64_t d = 0; d < rank; d++) head(&s, 0, a->dims[at[2 * i + 1] + d]);
        text(&s, "format");
        text(&s, "dense");
        text(&s, "components");
        head(&s, 5, 1);
        text(&s, "data");
        head(&s, 5, 3);
        text(&s, "dtype");
        text(&s, dtype);
        text(&s, "offset");
        head(&s, 0, a->offset[row]);
        text(&s, "length");
        head(&s, 0, a->length[row]);
    }
    if (s.overflow) st = ZT_E_ARG;
    *written = s.pos;
done:
    free(keys);
    free(idx);
    free(at);
    return st;
}
