/* The v1 manifest as compact tables (see manifest_scan.h).
 *
 * Why this exists: decoding a manifest of N objects with a general CBOR decoder
 * builds ~15 Python containers per object, which is most of the cost of opening
 * a file with many small tensors.  Every writer we know produces the same plain
 * shape, so this walks that shape once and records offsets, lengths, dims and
 * vocabulary indices in flat tables; the Python side checks the tables with
 * array operations and builds an object's spec only when it is asked for.
 *
 * It decides nothing about validity beyond the shape: anything unusual returns
 * fast = 0 and the general decoder (cbor2, the oracle) handles the manifest,
 * errors included.  So a construct this scanner misreads can only make a valid
 * file slow, never make a bad one pass; a differential fuzz target holds both
 * paths to the same verdict and values.
 *
 * It is also at least as strict as zt_cbor_scan (well-formed, depth-limited,
 * text keys, no tags at all, nothing after the item), so the reader runs that
 * scan only on manifests this one declines.  Every read is bounds-checked and
 * recursion is depth-limited: the bytes are hostile, and this function is
 * public and fuzzed on its own.
 */
#include <string.h>
#include "manifest_scan.h"

/* A vocabulary and the last word found in it (see lookup). */
typedef struct {
    const zt_vocab *vocab;
    const char *word;  /* NULL: nothing found yet */
    size_t len;
    uint64_t index;
} vocab_cache;

typedef struct {
    const uint8_t *buf;
    size_t len, pos;
    const zt_mf_config *cfg;
    vocab_cache formats, dtypes, types, encodings, roles;
    uint64_t *objects;            /* column-major tables; NULL: count only */
    uint64_t *components;
    uint64_t *dims;
    size_t nobj, ncomp, ndims;
    size_t cap_obj, cap_comp, cap_dims;
    const char *why;
    int full;                     /* a table was too small (see zt_mf_result.full) */
} scanner;

typedef struct {
    int major, info;
    uint64_t arg;
} head;

#define SLOW(s, text) ((s)->why = (text), -1)
/* a table is too small: not slow, the caller counts and fills again */
#define FULL(s, text) ((s)->full = 1, SLOW(s, text))

/* Row `row` of a column-major table: field f of every row is contiguous, so the
 * checks over one column read only that column. */
static void put_row(uint64_t *table, size_t cap, size_t row, const void *record,
                    size_t fields) {
    uint64_t v[ZT_MF_COMPONENT_FIELDS > ZT_MF_OBJECT_FIELDS ? ZT_MF_COMPONENT_FIELDS
                                                            : ZT_MF_OBJECT_FIELDS];
    memcpy(v, record, fields * sizeof(uint64_t));
    for (size_t f = 0; f < fields; f++) table[f * cap + row] = v[f];
}

/* The head at s->pos; -1 (slow) when the bytes end or the head is reserved.
 * Inlined: heads are most of what the scanner reads. */
static inline int read_head(scanner *s, head *h) {
    if (s->pos >= s->len) return SLOW(s, "the bytes end inside an item");
    const uint8_t ib = s->buf[s->pos++];
    h->major = ib >> 5;
    h->info = ib & 31;
    if (h->info < 24) {
        h->arg = (uint64_t)h->info;
        return 0;
    }
    if (h->info == 31) {
        h->arg = 0;
        return 0;
    }
    if (h->info > 27) return SLOW(s, "a reserved head");
    size_t n = (size_t)1 << (h->info - 24);
    if (s->len - s->pos < n) return SLOW(s, "the bytes end inside a head");
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | s->buf[s->pos + i];  /* big-endian */
    s->pos += n;
    h->arg = v;
    return 0;
}

/* Strict UTF-8 as Python decodes it: no overlong forms, no surrogates, <= U+10FFFF. */
static int utf8_valid(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {  /* names and keys are mostly ASCII: eight bytes per step */
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        const uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            need = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            need = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            need = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i <= need) return 0;
        for (size_t k = 1; k <= need; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

/* Whether buf[off .. off+n] is UTF-8 (-1, slow, if not).  A fill after a count
 * pass reads bytes that pass has validated. */
static int check_utf8(scanner *s, uint64_t off, uint64_t n) {
    if (!(s->objects != NULL && s->cfg->text_checked) &&
        !utf8_valid(s->buf + off, (size_t)n))
        return SLOW(s, "text that is not UTF-8");
    return 0;
}

/* A definite text string's bytes (after its head h) -> *off, *n; not yet checked
 * as UTF-8: a text equal to a key or vocabulary word (both ASCII/UTF-8) needs no
 * check, so callers check only the others (check_utf8). */
static int text_span(scanner *s, const head *h, uint64_t *off, uint64_t *n) {
    if (h->major != 3) return SLOW(s, "a field that is not a text string");
    if (h->info == 31) return SLOW(s, "an indefinite-length text string");
    if (h->arg > s->len - s->pos) return SLOW(s, "a string longer than the bytes left");
    *off = s->pos;
    *n = h->arg;
    s->pos += (size_t)h->arg;
    return 0;
}

/* A definite text string's bytes (after its head h) -> *off, *n; validated. */
static int text_body(scanner *s, const head *h, uint64_t *off, uint64_t *n) {
    if (text_span(s, h, off, n)) return -1;
    return check_utf8(s, *off, *n);
}

static int read_text(scanner *s, uint64_t *off, uint64_t *n) {
    head h;
    if (read_head(s, &h)) return -1;
    return text_body(s, &h, off, n);
}

/* A text to look up in a vocabulary: a word found is valid UTF-8 already. */
static int read_word(scanner *s, uint64_t *off, uint64_t *n) {
    head h;
    if (read_head(s, &h)) return -1;
    return text_span(s, &h, off, n);
}

static int read_uint(scanner *s, uint64_t *value) {
    head h;
    if (read_head(s, &h)) return -1;
    if (h.major != 0 || h.info == 31) return SLOW(s, "a field that is not an unsigned integer");
    *value = h.arg;
    return 0;
}

/* Index of the text at buf[off .. off+n] in vocabulary v, or ZT_MF_NONE.  The
 * last word found is remembered: the same dtype and format repeat object after
 * object, so most lookups are one compare. */
static uint64_t lookup(vocab_cache *c, const uint8_t *text, uint64_t n) {
    if (c->word != NULL && c->len == n && memcmp(c->word, text, n) == 0) return c->index;
    const char *w = c->vocab->words;
    for (size_t i = 0; i < c->vocab->count; i++) {
        size_t wn = strlen(w);
        if (wn == n && memcmp(w, text, wn) == 0) {
            c->word = w;
            c->len = wn;
            c->index = i;
            return i;
        }
        w += wn + 1;
    }
    return ZT_MF_NONE;
}

/* Whether the key at buf[off .. off+n] is the literal `word`: the length from the
 * literal's size, so the compare is a few loads, not a call. */
#define KEY_IS(s, off, n, word) \
    ((n) == sizeof(word) - 1 && memcmp((s)->buf + (off), (word), sizeof(word) - 1) == 0)

/* Skip one item of any kind, checking its text; depth bounds the recursion. */
static int skip_item(scanner *s, size_t depth) {
    head h;
    if (depth > s->cfg->max_depth) return SLOW(s, "nesting deeper than the limit");
    if (read_head(s, &h)) return -1;
    switch (h.major) {
    case 0:
    case 1:
        return h.info == 31 ? SLOW(s, "an indefinite integer") : 0;
    case 2:
        if (h.info == 31) return SLOW(s, "an indefinite-length byte string");
        if (h.arg > s->len - s->pos) return SLOW(s, "a string longer than the bytes left");
        s->pos += (size_t)h.arg;
        return 0;
    case 3: {
        uint64_t off, n;
        return text_body(s, &h, &off, &n);
    }
    case 4:
    case 5: {
        const uint64_t per = h.major == 5 ? 2 : 1;
        if (h.info != 31 && h.arg > (s->len - s->pos) / per)
            return SLOW(s, "a container larger than the bytes");
        for (uint64_t i = 0;; i++) {
            if (h.info != 31) {
                if (i == h.arg * per) return 0;
            } else {
                if (s->pos >= s->len) return SLOW(s, "the bytes end inside a container");
                if (s->buf[s->pos] == 0xFF) {
                    s->pos++;
                    return (i % per) ? SLOW(s, "a map key without a value") : 0;
                }
            }
            /* cbor_scan's rule: every map key is text */
            if (per == 2 && i % 2 == 0 && (s->pos >= s->len || (s->buf[s->pos] >> 5) != 3))
                return SLOW(s, "a map key that is not text");
            if (skip_item(s, depth + 1)) return -1;
        }
    }
    case 6:
        return SLOW(s, "a tag");
    default:
        /* simple values and floats: their head is their whole size; as cbor_scan,
         * a two-byte simple value below 32 is not well-formed */
        if (h.info == 24 && h.arg < 32) return SLOW(s, "a two-byte simple value below 32");
        return h.info == 31 ? SLOW(s, "a stray break") : 0;
    }
}

/* Map iteration: after the map's head, call next_entry until it returns 0. */
typedef struct {
    int indefinite;
    uint64_t left;
} map_iter;

static int open_map(scanner *s, map_iter *it) {
    head h;
    if (read_head(s, &h)) return -1;
    if (h.major != 5) return SLOW(s, "a field that is not a map");
    it->indefinite = h.info == 31;
    it->left = h.arg;
    if (!it->indefinite && h.arg > (s->len - s->pos) / 2)
        return SLOW(s, "a map larger than the bytes");
    return 0;
}

/* 1: a key follows (its text: *off, *n; the value not yet read); 0: map done. */
static int next_key(scanner *s, map_iter *it, uint64_t *off, uint64_t *n) {
    if (it->indefinite) {
        if (s->pos >= s->len) return SLOW(s, "the bytes end inside a map");
        if (s->buf[s->pos] == 0xFF) {
            s->pos++;
            return 0;
        }
    } else {
        if (it->left == 0) return 0;
        it->left--;
    }
    if (read_word(s, off, n)) return -1;  /* unchecked: see the callers */
    return 1;
}

/* A key none of the scanner's literals matched: checked as UTF-8 (cbor_scan's rule
 * for all text), then its value skipped. */
static int skip_entry(scanner *s, uint64_t key_off, uint64_t key_n, size_t depth) {
    if (check_utf8(s, key_off, key_n)) return -1;
    return skip_item(s, depth);
}

#define SEEN(bit)                                                   \
    do {                                                            \
        if (seen & (bit)) return SLOW(s, "a duplicate key");        \
        seen |= (bit);                                              \
    } while (0)

static int scan_component(scanner *s, uint64_t role_off, uint64_t role_len, size_t obj) {
    zt_mf_component c;
    map_iter it;
    uint64_t off, n;
    unsigned seen = 0;
    int r;
    memset(&c, 0, sizeof c);  /* dtype, offset, length: set before the row is put (seen) */
    c.role_off = role_off;
    c.role_len = role_len;
    c.role = lookup(&s->roles, s->buf + role_off, role_len);
    c.type = ZT_MF_NONE;
    c.encoding = 0;  /* absent: raw */
    c.ulen = ZT_MF_NONE;
    c.digest_off = 0;
    c.digest_len = 0;
    c.object = obj;
    if (open_map(s, &it)) return -1;
    while ((r = next_key(s, &it, &off, &n)) == 1) {
        uint64_t toff, tn;
        if (KEY_IS(s, off, n, "dtype")) {
            SEEN(1);
            if (read_word(s, &toff, &tn)) return -1;
            c.dtype = lookup(&s->dtypes, s->buf + toff, tn);
            if (c.dtype == ZT_MF_NONE) return SLOW(s, "a dtype not in the vocabulary");
        } else if (KEY_IS(s, off, n, "type")) {
            SEEN(2);
            if (read_word(s, &toff, &tn)) return -1;
            c.type = lookup(&s->types, s->buf + toff, tn);
            if (c.type == ZT_MF_NONE) return SLOW(s, "a type not in the vocabulary");
        } else if (KEY_IS(s, off, n, "offset")) {
            SEEN(4);
            if (read_uint(s, &c.offset)) return -1;
        } else if (KEY_IS(s, off, n, "length")) {
            SEEN(8);
            if (read_uint(s, &c.length)) return -1;
        } else if (KEY_IS(s, off, n, "encoding")) {
            SEEN(16);
            if (read_word(s, &toff, &tn)) return -1;
            c.encoding = lookup(&s->encodings, s->buf + toff, tn);
            if (c.encoding == ZT_MF_NONE) return SLOW(s, "an encoding not in the vocabulary");
        } else if (KEY_IS(s, off, n, "uncompressed_length")) {
            SEEN(32);
            if (read_uint(s, &c.ulen)) return -1;
            if (c.ulen == ZT_MF_NONE) return SLOW(s, "an uncompressed_length of 2^64-1");
        } else if (KEY_IS(s, off, n, "digest")) {
            SEEN(64);
            if (read_text(s, &c.digest_off, &c.digest_len)) return -1;
        } else if (skip_entry(s, off, n, 6)) {
            return -1;
        }
    }
    if (r < 0) return -1;
    if ((seen & (1 | 4 | 8)) != (1 | 4 | 8)) return SLOW(s, "a component without dtype, offset or length");
    if (s->components != NULL) {
        if (s->ncomp >= s->cap_comp) return FULL(s, "more components than the table holds");
        put_row(s->components, s->cap_comp, s->ncomp, &c, ZT_MF_COMPONENT_FIELDS);
    }
    s->ncomp++;
    return 0;
}

static int scan_shape(scanner *s, zt_mf_object *o) {
    head h;
    uint64_t numel = 1, extent = 16;  /* 16: the widest element (complex128) */
    int extent_ok = 1;
    if (read_head(s, &h)) return -1;
    if (h.major != 4) return SLOW(s, "a shape that is not an array");
    o->dims_start = s->ndims;
    o->rank = 0;
    for (uint64_t i = 0;; i++) {
        if (h.info == 31) {
            if (s->pos >= s->len) return SLOW(s, "the bytes end inside a shape");
            if (s->buf[s->pos] == 0xFF) {
                s->pos++;
                break;
            }
        } else if (i == h.arg) {
            break;
        }
        uint64_t dim;
        if (read_uint(s, &dim)) return -1;
        if (dim >> 63) return SLOW(s, "a dimension of 2^63 or more");
        if (s->dims != NULL) {
            if (s->ndims >= s->cap_dims) return FULL(s, "more dims than the table holds");
            s->dims[s->ndims] = dim;
        }
        s->ndims++;
        o->rank++;
        /* same rule as objects.shape_problem(): numpy multiplies every dimension */
        numel = dim == 0 ? 0 : numel * dim;
        if (dim && extent_ok) {
            if (extent > (UINT64_C(1) << 63) / dim) extent_ok = 0;
            else extent *= dim;
        }
    }
    if (extent_ok && extent >= (UINT64_C(1) << 63)) extent_ok = 0;
    o->numel = numel;
    o->extent_ok = (uint64_t)extent_ok;
    return 0;
}

static int scan_object(scanner *s, uint64_t name_off, uint64_t name_len) {
    zt_mf_object o;
    map_iter it, cit;
    uint64_t off, n;
    unsigned seen = 0;
    int r;
    if (name_len == 0) return SLOW(s, "an empty object name");
    if (check_utf8(s, name_off, name_len)) return -1;
    memset(&o, 0, sizeof o);  /* every field is set before the row is put (seen) */
    o.name_off = name_off;
    o.name_len = name_len;
    o.attrs_off = 0;
    o.attrs_len = 0;
    o.comps_start = s->ncomp;
    o.ncomps = 0;
    if (open_map(s, &it)) return -1;
    while ((r = next_key(s, &it, &off, &n)) == 1) {
        if (KEY_IS(s, off, n, "shape")) {
            SEEN(1);
            if (scan_shape(s, &o)) return -1;
        } else if (KEY_IS(s, off, n, "format")) {
            uint64_t toff, tn;
            SEEN(2);
            if (read_word(s, &toff, &tn)) return -1;
            o.format = lookup(&s->formats, s->buf + toff, tn);
            if (o.format == ZT_MF_NONE) return SLOW(s, "a format not in the vocabulary");
        } else if (KEY_IS(s, off, n, "attributes")) {
            SEEN(4);
            if (s->pos >= s->len || (s->buf[s->pos] >> 5) != 5)
                return SLOW(s, "attributes that are not a map");
            o.attrs_off = s->pos;
            if (skip_item(s, 4)) return -1;
            o.attrs_len = s->pos - o.attrs_off;
        } else if (KEY_IS(s, off, n, "components")) {
            SEEN(8);
            o.comps_start = s->ncomp;
            if (open_map(s, &cit)) return -1;
            uint64_t roff, rn;
            while ((r = next_key(s, &cit, &roff, &rn)) == 1) {
                if (rn == 0) return SLOW(s, "an empty component name");
                if (check_utf8(s, roff, rn)) return -1;
                if (s->ncomp - o.comps_start >= s->cfg->max_components)
                    return SLOW(s, "more components in one object than the fast path takes");
                if (s->components != NULL) {  /* a repeated role: cbor2 keeps the last */
                    const uint64_t *offs = s->components, *lens = s->components + s->cap_comp;
                    for (size_t k = (size_t)o.comps_start; k < s->ncomp; k++)
                        if (lens[k] == rn && memcmp(s->buf + offs[k], s->buf + roff, rn) == 0)
                            return SLOW(s, "a duplicate component name");
                }
                if (scan_component(s, roff, rn, s->nobj)) return -1;
            }
            if (r < 0) return -1;
            o.ncomps = s->ncomp - o.comps_start;
        } else if (skip_entry(s, off, n, 4)) {
            return -1;
        }
    }
    if (r < 0) return -1;
    if ((seen & (1 | 2 | 8)) != (1 | 2 | 8))
        return SLOW(s, "an object without shape, format or components");
    if (s->objects != NULL) {
        if (s->nobj >= s->cap_obj) return FULL(s, "more objects than the table holds");
        put_row(s->objects, s->cap_obj, s->nobj, &o, ZT_MF_OBJECT_FIELDS);
    }
    s->nobj++;
    return 0;
}

static int scan_root(scanner *s, zt_mf_result *out) {
    map_iter it, oit;
    uint64_t off, n;
    unsigned seen = 0;
    int r;
    if (open_map(s, &it)) return -1;
    while ((r = next_key(s, &it, &off, &n)) == 1) {
        if (KEY_IS(s, off, n, "version")) {
            SEEN(1);
            if (read_text(s, &out->version_off, &out->version_len)) return -1;
        } else if (KEY_IS(s, off, n, "attributes")) {
            SEEN(2);
            if (s->pos >= s->len || (s->buf[s->pos] >> 5) != 5)
                return SLOW(s, "file attributes that are not a map");
            out->attrs_off = s->pos;
            if (skip_item(s, 2)) return -1;
            out->attrs_len = s->pos - out->attrs_off;
        } else if (KEY_IS(s, off, n, "objects")) {
            SEEN(4);
            if (open_map(s, &oit)) return -1;
            uint64_t noff, nn;
            while ((r = next_key(s, &oit, &noff, &nn)) == 1)
                if (scan_object(s, noff, nn)) return -1;
            if (r < 0) return -1;
        } else if (skip_entry(s, off, n, 2)) {
            return -1;
        }
    }
    if (r < 0) return -1;
    if ((seen & (1 | 4)) != (1 | 4)) return SLOW(s, "a root without version or objects");
    if (s->pos != s->len) return SLOW(s, "bytes after the manifest");
    return 0;
}

zt_status zt_manifest_scan(const uint8_t *buf, size_t len, const zt_mf_config *config,
                           uint64_t *objects, size_t cap_objects,
                           uint64_t *components, size_t cap_components,
                           uint64_t *dims, size_t cap_dims, zt_mf_result *out) {
    scanner s;
    if (out == NULL || config == NULL || (buf == NULL && len) || config->max_depth == 0)
        return ZT_E_ARG;
    if ((objects == NULL) != (components == NULL) || (objects == NULL) != (dims == NULL))
        return ZT_E_ARG;  /* count mode passes no tables, fill mode all three */
    memset(out, 0, sizeof *out);
    memset(&s, 0, sizeof s);
    s.buf = buf;
    s.len = len;
    s.cfg = config;
    s.formats.vocab = &config->formats;
    s.dtypes.vocab = &config->dtypes;
    s.types.vocab = &config->types;
    s.encodings.vocab = &config->encodings;
    s.roles.vocab = &config->roles;
    s.objects = objects;
    s.components = components;
    s.dims = dims;
    s.cap_obj = cap_objects;
    s.cap_comp = cap_components;
    s.cap_dims = cap_dims;
    s.why = "";
    /* the fixed structure nests five deep (root, objects, object, components,
     * component): a smaller limit is cbor_scan's to refuse */
    if (config->max_depth < 5) {
        s.why = "a nesting limit below the manifest's own depth";
        out->fast = 0;
        out->why = s.why;
        return ZT_OK;
    }
    if (scan_root(&s, out)) {
        out->fast = 0;
        out->full = s.full;
        out->why = s.why;
        out->pos = s.pos;
        return ZT_OK;
    }
    out->fast = 1;
    out->why = "";
    out->pos = s.pos;
    out->nobjects = s.nobj;
    out->ncomponents = s.ncomp;
    out->ndims = s.ndims;
    return ZT_OK;
}
