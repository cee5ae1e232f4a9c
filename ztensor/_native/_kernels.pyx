# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/: take buffers, release the GIL, call C, map the status.

The wrappers check buffer sizes and arguments (the shared contract, _contract.py)
and callers in ztensor/*.py check offsets and types before a pointer reaches C.
Format decisions are made in C, not here: csrc/footer.c reads the magics and the
footer, csrc/manifest_scan.c decides which manifests take the fast path (and
ViewTable below serves read_numpy's plain views from its tables: a fast path
that may only decline, held to formats/dense.py by differential tests).
:data:`HEADER_CONSTANTS` exports the headers' numbers for the test that checks
the Python copies (tests/test_c_constants.py).
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from cpython.unicode cimport PyUnicode_DecodeUTF8

import numpy as np

from ztensor import errors
from ztensor._native import contract as _contract
from ztensor._native import status as _status

zt_crc32c_init()
zt_floatconv_init()

# csrc/zt_status.h's numbers, for the test that checks _status.py against them
STATUS_CODES = {
    "OK": ZT_OK, "ARG": ZT_E_ARG, "TRUNCATED": ZT_E_TRUNCATED, "BAD_MAGIC": ZT_E_BAD_MAGIC,
    "BAD_FOOTER_MAGIC": ZT_E_BAD_FOOTER_MAGIC, "MANIFEST_TOO_LARGE": ZT_E_MANIFEST_TOO_LARGE,
    "MANIFEST_OUT_OF_BOUNDS": ZT_E_MANIFEST_OUT_OF_BOUNDS, "IO": ZT_E_IO,
    "NOMEM": ZT_E_NOMEM, "CBOR_MALFORMED": ZT_E_CBOR_MALFORMED, "CBOR_TAG": ZT_E_CBOR_TAG,
    "CBOR_DEPTH": ZT_E_CBOR_DEPTH, "CBOR_KEY": ZT_E_CBOR_KEY,
    "GROUP_INDEX": ZT_E_GROUP_INDEX,
}



cdef dict _columns(const char *row, dict fields):
    # name -> address of that field: its column is its index among the row's uint64s
    return {name: (<size_t>address - <size_t>row) // sizeof(uint64_t)
            for name, address in fields.items()}


cdef dict _table_columns():
    cdef zt_mf_object o
    cdef zt_mf_component c
    objects = _columns(<const char *>&o, {
        "NAME_OFF": <size_t>&o.name_off, "NAME_LEN": <size_t>&o.name_len,
        "FORMAT": <size_t>&o.format, "ATTRS_OFF": <size_t>&o.attrs_off,
        "ATTRS_LEN": <size_t>&o.attrs_len, "DIMS_START": <size_t>&o.dims_start,
        "RANK": <size_t>&o.rank, "COMPS_START": <size_t>&o.comps_start,
        "NCOMPS": <size_t>&o.ncomps, "NUMEL": <size_t>&o.numel,
        "EXTENT_OK": <size_t>&o.extent_ok})
    components = _columns(<const char *>&c, {
        "ROLE_OFF": <size_t>&c.role_off, "ROLE_LEN": <size_t>&c.role_len,
        "ROLE": <size_t>&c.role, "DTYPE": <size_t>&c.dtype, "TYPE": <size_t>&c.type_,
        "OFFSET": <size_t>&c.offset, "LENGTH": <size_t>&c.length,
        "ENCODING": <size_t>&c.encoding, "ULEN": <size_t>&c.ulen,
        "DIGEST_OFF": <size_t>&c.digest_off, "DIGEST_LEN": <size_t>&c.digest_len,
        "OBJECT": <size_t>&c.object_})
    return {"object_columns": objects, "component_columns": components,
            "object_row_bytes": sizeof(zt_mf_object),
            "component_row_bytes": sizeof(zt_mf_component)}


cdef dict _ggml_blocks():
    cdef int t
    return {t: (zt_ggml_block_elements(t), zt_ggml_block_bytes(t)) for t in range(256)
            if zt_ggml_block_elements(t)}


# csrc/'s other numbers, as the headers define them, for the test that checks the
# Python homes (_contract.py, manifest_table.py) against them
HEADER_CONSTANTS = {
    "float_types": {"F32": ZT_F32, "F16": ZT_F16, "BF16": ZT_BF16},
    "fp8_kinds": {"f8_e4m3fn": ZT_FP8_E4M3FN, "f8_e5m2": ZT_FP8_E5M2,
                  "f8_e4m3fnuz": ZT_FP8_E4M3FNUZ, "f8_e5m2fnuz": ZT_FP8_E5M2FNUZ},
    "zero_types": {"ZERO_NONE": ZT_ZERO_NONE, "ZERO_PACKED_V1": ZT_ZERO_PACKED_V1,
                   "ZERO_PACKED_V2": ZT_ZERO_PACKED_V2},
    "families": {"FAMILY_V0": ZT_FAMILY_V0, "FAMILY_V1": ZT_FAMILY_V1},
    "magic_len": ZT_MAGIC_LEN,
    "tail_len": ZT_TAIL_LEN,
    "blob_extent": ZT_BW_EXTENT,
    "copy_stream_bytes": ZT_COPY_STREAM_BYTES,
    "object_fields": ZT_MF_OBJECT_FIELDS,
    "component_fields": ZT_MF_COMPONENT_FIELDS,
    "mf_none": ZT_MF_NONE,
    "ggml_blocks": _ggml_blocks(),
    **_table_columns(),
}


cdef int _raise_for_status(zt_status status, str what, path=None) except -1:
    # the status -> exception table lives in _status.py, shared with _fallback.py
    if status != ZT_OK:
        _status.raise_for_status(<int>status, what, path)
    return 0


def footer_parse(const uint8_t[::1] head, const uint8_t[::1] tail, uint64_t file_size,
                 uint64_t max_manifest, path=None):
    """Return (family, manifest_offset, manifest_size) or raise; see csrc/footer.c."""
    cdef zt_footer out
    cdef zt_status st
    out.manifest_size = 0
    cdef uint8_t dummy = 0
    st = zt_footer_parse(&head[0] if head.shape[0] else &dummy, head.shape[0],
                         &tail[0] if tail.shape[0] else &dummy, tail.shape[0],
                         file_size, max_manifest, &out)
    if st == ZT_E_MANIFEST_TOO_LARGE or st == ZT_E_MANIFEST_OUT_OF_BOUNDS:
        _raise_for_status(st, _status.footer_context(out.manifest_size, file_size,
                                                     max_manifest), path)
    _raise_for_status(st, "reading the footer", path)
    return out.family, out.manifest_offset, out.manifest_size


def bswap(const uint8_t[::1] src, uint8_t[::1] dst, width):
    """Byte-swap width-byte elements of src into dst (same length; may be the same buffer)."""
    cdef size_t n = src.shape[0]
    cdef zt_status st
    _contract.bswap(src.shape[0], dst.shape[0], width)
    cdef size_t w = width
    if n == 0:
        return
    with nogil:
        st = zt_bswap(&src[0], &dst[0], n // w, w)
    _raise_for_status(st, "byte swap")


def crc32c(const uint8_t[::1] data, uint32_t crc=0):
    """CRC-32C of data, continuing from crc (0 to start)."""
    cdef size_t n = data.shape[0]
    if n == 0:
        return crc
    with nogil:
        crc = zt_crc32c_update(crc, &data[0], n)
    return crc


def crc32c_portable(const uint8_t[::1] data, uint32_t crc=0):
    """The table-driven path alone (for tests comparing it with the hardware path)."""
    cdef size_t n = data.shape[0]
    if n == 0:
        return crc
    with nogil:
        crc = zt_crc32c_update_sw(crc, &data[0], n)
    return crc


def crc32c_hardware():
    """True when CRC-32C runs on the CPU's crc32 instruction."""
    return bool(zt_crc32c_hardware())


def reserve_ahead(fd, nbytes):
    """Reserve the blocks of the first ``nbytes`` of ``fd`` without changing its size
    (ext4 only; csrc/blobwrite.c says why): True if reserved.  A hint, never an error;
    the caller truncates the file to its length when done."""
    _contract.reserve_ahead(fd, nbytes)
    cdef int cfd = fd
    cdef uint64_t n = nbytes
    cdef int ok
    with nogil:
        ok = zt_reserve_ahead(cfd, n)
    return bool(ok)


cdef class BlobWriter:
    """Stage and write blobs to an open file descriptor (see csrc/blobwrite.c)."""
    cdef zt_blobwriter bw
    cdef bint ready
    cdef object path

    def __cinit__(self, int fd, uint64_t pos, size_t capacity=4 << 20, path=None):
        self.ready = False
        self.path = path
        _raise_for_status(zt_bw_init(&self.bw, fd, pos, capacity), "blob writer")
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            zt_bw_free(&self.bw)

    @property
    def pos(self):
        """Bytes written or staged so far: the offset the next byte lands at."""
        return self.bw.pos

    cdef int _check(self, zt_status st) except -1:
        if st == ZT_E_IO:
            raise errors.WriteError(f"write failed: {errors.strerror(self.bw.err)}",
                                    path=self.path, errno=self.bw.err)
        return _raise_for_status(st, "blob writer", self.path)

    def pad(self, uint64_t alignment):
        """Zero-fill up to the next multiple of alignment."""
        self._require()
        cdef zt_status st
        with nogil:
            st = zt_bw_pad(&self.bw, alignment)
        self._check(st)

    def write(self, const uint8_t[::1] data):
        """Append data."""
        self._require()
        cdef size_t n = data.shape[0]
        cdef zt_status st
        if n == 0:
            return
        with nogil:
            st = zt_bw_write(&self.bw, &data[0], n)
        self._check(st)

    def flush(self):
        """Hand every staged byte to the operating system."""
        self._require()
        cdef zt_status st
        with nogil:
            st = zt_bw_flush(&self.bw)
        self._check(st)

    def close(self):
        """Free the staging buffer (without flushing)."""
        if self.ready:
            zt_bw_free(&self.bw)
            self.ready = False

    cdef int _require(self) except -1:
        if not self.ready:
            raise errors.ZTensorError("blob writer is closed", path=self.path)
        return 0


def cbor_scan(const uint8_t[::1] data, size_t max_depth, path=None):
    """(end offset, items, depth) of the CBOR item at the start of data, or raise
    FormatError; see csrc/cbor_scan.h for what is refused."""
    cdef zt_cbor_scan_result r
    cdef zt_status st
    cdef uint8_t dummy = 0
    if max_depth == 0 or max_depth > 100000:
        _contract.fail("cbor_scan", f"max_depth must be in [1, 100000], got {max_depth}")
    with nogil:
        st = zt_cbor_scan(&data[0] if data.shape[0] else &dummy, data.shape[0], max_depth, &r)
    if st != ZT_OK:
        _status.raise_cbor(<int>st, r.why.decode("ascii"), r.end, r.tag, max_depth, path)
    return r.end, r.items, r.depth


def cbor_check_canonical(const uint8_t[::1] data, size_t max_depth, path=None):
    """None when data is one CBOR item in core deterministic encoding, no tags, no
    item deeper than max_depth (root: 0); else FormatError (csrc/cbor_canonical.h)."""
    cdef zt_cbor_scan_result r
    cdef zt_status st
    cdef uint8_t dummy = 0
    _contract.cbor_canonical(max_depth)
    with nogil:
        st = zt_cbor_check_canonical(&data[0] if data.shape[0] else &dummy, data.shape[0],
                                     max_depth, &r)
    if st != ZT_OK:
        _status.raise_canonical(<int>st, r.why.decode("ascii"), r.end, max_depth, path)


def xxh3_64(const uint8_t[::1] data):
    """XXH3-64 (seed 0) of data, as an int (csrc/xxh3.h)."""
    cdef size_t n = data.shape[0]
    cdef uint8_t dummy = 0
    cdef uint64_t h
    with nogil:
        h = zt_xxh3_64(&data[0] if n else &dummy, n)
    return h


OBJECT_FIELDS = ZT_MF_OBJECT_FIELDS
COMPONENT_FIELDS = ZT_MF_COMPONENT_FIELDS


cdef zt_vocab _vocab(bytes words, size_t count):
    cdef zt_vocab v
    v.words = words
    v.count = count
    return v


def manifest_scan(const uint8_t[::1] data, vocabularies, size_t max_depth,
                  size_t max_components):
    """The manifest as tables (csrc/manifest_scan.h): (version span, file attributes
    span, objects (OBJECT_FIELDS, n), components (COMPONENT_FIELDS, m), dims), all
    uint64, column-major (``objects[FIELD]`` is one field of every object); or
    (None, why) when the manifest is not in the shape the scanner reads.
    ``vocabularies``: five sequences of words (formats, dtypes, types, encodings,
    roles); fields are reported as indices into them."""
    cdef zt_mf_config cfg
    cdef zt_mf_result r
    cdef zt_status st
    cdef uint8_t dummy = 0
    cdef const uint8_t *buf = &data[0] if data.shape[0] else &dummy
    cdef size_t n = data.shape[0]
    if max_depth == 0:
        _contract.fail("manifest_scan", "max_depth must be at least 1")
    # the joined words must outlive the scan: held in this list
    joined = [b"".join(w.encode("utf-8") + b"\0" for w in words) for words in vocabularies]
    if len(joined) != 5:
        _contract.fail("manifest_scan", "five vocabularies are needed")
    counts = [len(words) for words in vocabularies]
    cfg.formats = _vocab(joined[0], counts[0])
    cfg.dtypes = _vocab(joined[1], counts[1])
    cfg.types = _vocab(joined[2], counts[2])
    cfg.encodings = _vocab(joined[3], counts[3])
    cfg.roles = _vocab(joined[4], counts[4])
    cfg.max_depth = max_depth
    cfg.max_components = max_components
    cfg.text_checked = 0
    # One pass into tables sized from the byte count: an object takes at least 30
    # bytes (name and its three required keys), a component 26, a dim 1.  Only
    # when they were too small (over 4 dims per object on average) is there a
    # count pass, then a fill of exactly that many rows.
    tables = _scan_into(buf, n, &cfg, n // 30 + 1, n // 26 + 1, min(n, 4 * (n // 30 + 1)) + 1,
                        &r)
    if not r.fast and r.full:
        with nogil:
            st = zt_manifest_scan(buf, n, &cfg, NULL, 0, NULL, 0, NULL, 0, &r)
        _raise_for_status(st, "manifest scan")
        if r.fast:
            cfg.text_checked = 1
            tables = _scan_into(buf, n, &cfg, r.nobjects, r.ncomponents, r.ndims, &r)
            if r.full:
                return None, "the second pass disagreed with the first"
    if not r.fast:
        return None, r.why.decode("ascii")
    objects, components, dims = tables
    # rows past the ones filled are dropped: what the reader keeps is what is there
    return ((r.version_off, r.version_len), (r.attrs_off, r.attrs_len),
            np.ascontiguousarray(objects[:, :r.nobjects]),
            np.ascontiguousarray(components[:, :r.ncomponents]), dims[:r.ndims].copy())


cdef tuple _scan_into(const uint8_t *buf, size_t n, const zt_mf_config *cfg, size_t no,
                      size_t nc, size_t nd, zt_mf_result *r):
    """zt_manifest_scan filling tables of no objects, nc components and nd dims."""
    cdef zt_status st
    objects = np.empty((ZT_MF_OBJECT_FIELDS, no), np.uint64)
    components = np.empty((ZT_MF_COMPONENT_FIELDS, nc), np.uint64)
    dims = np.empty(nd, np.uint64)
    cdef uint64_t[:, ::1] ov = objects
    cdef uint64_t[:, ::1] cv = components
    cdef uint64_t[::1] dv = dims
    cdef uint64_t spare[16]
    cdef uint64_t *op = &ov[0, 0] if no else &spare[0]
    cdef uint64_t *cp = &cv[0, 0] if nc else &spare[0]
    cdef uint64_t *dp = &dv[0] if nd else &spare[0]
    with nogil:
        st = zt_manifest_scan(buf, n, cfg, op, no, cp, nc, dp, nd, r)
    _raise_for_status(st, "manifest scan")
    return objects, components, dims


cdef class ViewTable:
    """read_numpy's zero-copy hot path (ztensor/container/reader.py): per object row, a slice
    of the mapping typed as the object's dtype, shaped as the object.  Made once per
    reader from the manifest's columns (manifest_table.TableSpecs.view_table); the
    per-row values stay in those uint64 columns, so making it builds no Python object
    per row.  A name that is not a plain view of the file's bytes gets None.

    ``index``: name -> row.  ``typed``: the mapping as an array of each dtype used.
    Per row: ``which`` (index into ``typed``, or -1), the element span
    [``starts``, ``stops``), and the shape ``dims[dims_start:dims_start + ranks]``."""
    cdef dict index
    cdef list typed
    cdef const int64_t[::1] which
    cdef const uint64_t[::1] starts
    cdef const uint64_t[::1] stops
    cdef const uint64_t[::1] dims_start
    cdef const uint64_t[::1] ranks
    cdef const uint64_t[::1] dims
    cdef Py_ssize_t rows

    def __init__(self, dict index not None, list typed not None,
                 const int64_t[::1] which, const uint64_t[::1] starts,
                 const uint64_t[::1] stops, const uint64_t[::1] dims_start,
                 const uint64_t[::1] ranks, const uint64_t[::1] dims):
        cdef Py_ssize_t row, rows = which.shape[0]
        cdef int64_t kinds = len(typed)
        cdef uint64_t ndims = dims.shape[0]
        cdef int64_t w
        if (starts.shape[0] != rows or stops.shape[0] != rows
                or dims_start.shape[0] != rows or ranks.shape[0] != rows):
            _contract.fail("ViewTable", "the per-row columns differ in length")
        lengths = np.array([len(t) for t in typed] or [0], np.uint64)
        cdef const uint64_t[::1] length = lengths
        for row in range(rows):  # every span and shape inside what it indexes
            w = which[row]
            if w >= kinds or (w >= 0 and (starts[row] > stops[row]
                                          or stops[row] > length[w])):
                _contract.fail("ViewTable", f"row {row}: span outside its typed array")
            if dims_start[row] > ndims or ranks[row] > ndims - dims_start[row]:
                _contract.fail("ViewTable", f"row {row}: shape outside the dims")
        self.index, self.typed, self.which = index, typed, which
        self.starts, self.stops = starts, stops
        self.dims_start, self.ranks, self.dims = dims_start, ranks, dims
        self.rows = rows

    def view(self, name):
        """The object's zero-copy array, or None."""
        found = self.index.get(name)
        if found is None:
            return None
        cdef Py_ssize_t row = found
        if row < 0 or row >= self.rows:
            _contract.fail("ViewTable", f"index gives row {row} of {self.rows}")
        cdef int64_t w = self.which[row]
        if w < 0:
            return None
        arr = self.typed[w][<Py_ssize_t>self.starts[row]:<Py_ssize_t>self.stops[row]]
        cdef uint64_t rank = self.ranks[row]
        if rank == 1:
            return arr
        cdef uint64_t axis, first = self.dims_start[row]
        shape = []
        for axis in range(rank):
            shape.append(self.dims[first + axis])
        return arr.reshape(tuple(shape))


def decode_spans(const uint8_t[::1] data, const uint64_t[:] offsets,
                 const uint64_t[:] lengths):
    """[data[o:o+n].decode("utf-8") ...] for each span, as a list of str."""
    cdef Py_ssize_t i, count = offsets.shape[0]
    cdef uint64_t off, ln, size = data.shape[0]
    if lengths.shape[0] != count:
        _contract.fail("decode_spans", "offsets and lengths differ in length")
    out = [None] * count
    for i in range(count):
        off = offsets[i]
        ln = lengths[i]
        if off > size or ln > size - off:
            _contract.fail("decode_spans", f"span {i} runs past the data")
        out[i] = PyUnicode_DecodeUTF8(<const char *>&data[off], ln, NULL) if ln else ""
    return out


def range_resident(const uint8_t[::1] buf):
    """Whether every page under ``buf`` (a view of a file mapping) is in the page
    cache: True, False, or None where the platform cannot say (csrc/residency.c)."""
    cdef size_t n = buf.shape[0]
    if n == 0:
        return True
    cdef int r
    with nogil:
        r = zt_range_resident(&buf[0], n)
    return None if r < 0 else bool(r)


def copy_spans(const uint8_t[::1] src, uint8_t[::1] dst, src_offsets, dst_offsets, lengths):
    """dst[d:d+n] = src[s:s+n] for each span, with the GIL released (callers run
    several at once in threads: copies into fresh pages fault in parallel)."""
    so, do, ln = _contract.copy_spans(src.shape[0], dst.shape[0], src_offsets, dst_offsets,
                                      lengths)
    cdef const uint64_t[::1] s = so
    cdef const uint64_t[::1] d = do
    cdef const uint64_t[::1] n = ln
    cdef Py_ssize_t i, count = n.shape[0]
    if count == 0:
        return
    cdef const uint8_t *sp = &src[0] if src.shape[0] else NULL
    cdef uint8_t *dp = &dst[0] if dst.shape[0] else NULL
    cdef zt_status st = ZT_OK
    with nogil:
        for i in range(count):
            if n[i]:
                st = zt_copy(sp + s[i], dp + d[i], n[i])
                if st != ZT_OK:
                    break
    _raise_for_status(st, "copy_spans")


def copy(const uint8_t[::1] src, uint8_t[::1] dst):
    """dst[:] = src, the GIL released; large copies stream past the cache
    (csrc/copy.c).  The buffers have one length and must not overlap."""
    cdef size_t n = src.shape[0]
    if n == 0 or dst.shape[0] == 0:
        _contract.copy(n, dst.shape[0], 0, 0)
        return
    _contract.copy(n, dst.shape[0], <size_t>&src[0], <size_t>&dst[0])
    cdef zt_status st
    with nogil:
        st = zt_copy(&src[0], &dst[0], n)
    _raise_for_status(st, "copy")



def zstd_frames(const uint8_t[::1] data):
    """(verdict, at, frames): whether ``data`` is whole zstd frames, by their headers
    alone (csrc/zstd_frames.c).  verdict 0: whole frames; 1: the bytes end inside
    the frame starting at ``at``; 2: no frame magic at ``at``; 3: a reserved bit or
    block type in the frame at ``at``.  ``frames``: whole frames before ``at``."""
    cdef int verdict = 0
    cdef size_t at = 0, frames = 0
    cdef uint8_t dummy = 0
    cdef const uint8_t *p = &data[0] if data.shape[0] else &dummy
    cdef size_t n = data.shape[0]
    cdef zt_status st
    with nogil:
        st = zt_zstd_frames(p, n, &verdict, &at, &frames)
    _raise_for_status(st, "zstd_frames")
    return verdict, at, frames

def set_simd(bint on):
    """Allow (True) or forbid (False) the hand-written AVX2 paths; returns the old
    setting.  Tests and benchmarks run the portable loops on the same machine."""
    return bool(zt_simd_enable(on))


def avx2_active():
    """True when the hand-written AVX2 paths run (x86-64 CPU with AVX2, allowed)."""
    return bool(zt_use_avx2())


def manifest_encode(bytes names, name_len, plain, rank, dims, dtype, offset, length,
                    bytes pre, pre_len, dtype_words):
    """The CBOR objects map (csrc/manifest_encode.h): plain dense objects from columns,
    the others copied from their pre-encoded items (``pre``), sorted by name."""
    cols = _contract.manifest_encode(len(names), name_len, plain, rank, dims, dtype,
                                     offset, length, len(pre), pre_len, len(dtype_words))
    cdef const uint64_t[::1] c_name_len = cols[0]
    cdef const uint8_t[::1] c_plain = cols[1]
    cdef const uint64_t[::1] c_rank = cols[2]
    cdef const uint64_t[::1] c_dims = cols[3]
    cdef const uint64_t[::1] c_dtype = cols[4]
    cdef const uint64_t[::1] c_offset = cols[5]
    cdef const uint64_t[::1] c_length = cols[6]
    cdef const uint64_t[::1] c_pre_len = cols[7]
    cdef uint64_t spare[1]
    cdef uint8_t spare8[1]
    joined = b"".join(w.encode("utf-8") + b"\0" for w in dtype_words)
    cdef zt_mf_encode_args a
    a.count = c_name_len.shape[0]
    a.names = names
    a.name_len = &c_name_len[0] if a.count else &spare[0]
    a.plain = &c_plain[0] if a.count else &spare8[0]
    a.rank = &c_rank[0] if c_rank.shape[0] else &spare[0]
    a.dims = &c_dims[0] if c_dims.shape[0] else &spare[0]
    a.dtype = &c_dtype[0] if c_dtype.shape[0] else &spare[0]
    a.offset = &c_offset[0] if c_offset.shape[0] else &spare[0]
    a.length = &c_length[0] if c_length.shape[0] else &spare[0]
    a.pre = pre
    a.pre_len = &c_pre_len[0] if c_pre_len.shape[0] else &spare[0]
    a.dtypes = _vocab(joined, len(dtype_words))
    cap = cols[8]
    out = bytearray(cap)
    cdef uint8_t[::1] o = out
    cdef size_t written = 0, c_cap = cap
    cdef zt_status st
    with nogil:
        st = zt_manifest_encode(&a, &o[0], c_cap, &written)
    _raise_for_status(st, "manifest encode")
    return bytes(o[:written])


def ggml_dequant(ggml_type, const uint8_t[::1] blocks, uint8_t[::1] out):
    """GGUF quantized blocks -> float32 values (out holds their bytes); see
    csrc/ggml_blocks.h for the types."""
    nblocks = _contract.ggml_dequant(ggml_type, blocks.shape[0], out.shape[0])
    cdef size_t n = nblocks
    cdef int t = ggml_type
    cdef zt_status st
    if n == 0:
        return
    with nogil:
        st = zt_ggml_dequant(t, &blocks[0], n, <float *>&out[0])
    _raise_for_status(st, "ggml dequantization")


# ------------------------------------------------------------------ conversions
def fp8_decode(const uint8_t[::1] src, uint8_t[::1] dst, kind, dst_type):
    """FP8 codes -> float32 (dst_type 0) or float16 bits (1); dst holds the bytes."""
    cdef size_t n = src.shape[0]
    cdef zt_status st
    _contract.fp8("fp8_decode", src.shape[0], dst.shape[0], kind, dst_type)
    cdef int k = kind, ft = dst_type
    if n == 0:
        return
    with nogil:
        st = zt_fp8_decode(&src[0], &dst[0], n, k, ft)
    _raise_for_status(st, "fp8 decode")


def fp8_encode(const uint8_t[::1] src, uint8_t[::1] dst, kind, src_type):
    """float32 (src_type 0) or float16 (1) bytes -> FP8 codes."""
    cdef size_t n = dst.shape[0]
    cdef zt_status st
    _contract.fp8("fp8_encode", dst.shape[0], src.shape[0], kind, src_type)
    cdef int k = kind, ft = src_type
    if n == 0:
        return
    with nogil:
        st = zt_fp8_encode(&src[0], &dst[0], n, k, ft)
    _raise_for_status(st, "fp8 encode")


def bf16_decode(const uint8_t[::1] src, uint8_t[::1] dst):
    """bf16 bits (native uint16) -> float32 (native)."""
    cdef size_t n = src.shape[0] // 2
    _contract.bf16("bf16_decode", src.shape[0], dst.shape[0])
    if n:
        with nogil:
            zt_bf16_decode(<const uint16_t *>&src[0], <float *>&dst[0], n)


def bf16_encode(const uint8_t[::1] src, uint8_t[::1] dst):
    """float32 (native) -> bf16 bits (native uint16), round to nearest even."""
    cdef size_t n = src.shape[0] // 4
    _contract.bf16("bf16_encode", dst.shape[0], src.shape[0])
    if n:
        with nogil:
            zt_bf16_encode(<const float *>&src[0], <uint16_t *>&dst[0], n)


# ------------------------------------------------------------------ group dequantization
def unpack_codes(const uint8_t[::1] words, count, bits, uint8_t[::1] out):
    """Unpack count LSB-first codes from little-endian int32 words."""
    cdef zt_status st
    _contract.unpack_codes(words.shape[0], count, bits, out.shape[0])
    cdef size_t c = count
    cdef int b = bits
    if c == 0:
        return
    with nogil:
        st = zt_unpack_codes(&words[0], c, b, &out[0])
    _raise_for_status(st, "unpack codes")


def dequant_rows(const uint8_t[::1] qweight, const uint8_t[::1] scales, zeros, g_idx,
                 K, N, G, group_size, bits, scale_type, zero_type, out_type,
                 uint8_t[::1] out, row_begin, row_end):
    """Dequantize rows [row_begin, row_end); see csrc/quant.h.  Every length is checked
    against K, N and G in Python integers (ztensor/_native/contract.py) before a pointer is
    taken, and the C kernel checks every g_idx value, so no call can make C read
    past a buffer."""
    cdef zt_dequant_args a
    cdef const uint8_t[::1] zv
    cdef const uint8_t[::1] gv
    cdef zt_status st
    if zero_type != _contract.ZERO_NONE and zeros is not None:
        zv = zeros
    if g_idx is not None:
        gv = g_idx
    _contract.dequant(qweight.shape[0], scales.shape[0],
                      None if zero_type == _contract.ZERO_NONE or zeros is None
                      else zv.shape[0],
                      None if g_idx is None else gv.shape[0], K, N, G, group_size, bits,
                      scale_type, zero_type, out_type, out.shape[0], row_begin, row_end)
    a.zeros = NULL
    a.g_idx = NULL
    if zero_type != _contract.ZERO_NONE and zv.shape[0]:
        a.zeros = &zv[0]
    if g_idx is not None and K:
        a.g_idx = &gv[0]
    if K == 0 or N == 0 or row_begin == row_end:
        return
    cdef size_t begin = row_begin, end = row_end
    a.qweight = &qweight[0]
    a.scales = &scales[0]
    a.K, a.N, a.G, a.group_size = K, N, G, group_size
    a.bits, a.scale_type, a.zero_type, a.out_type = bits, scale_type, zero_type, out_type
    a.out = &out[0]
    with nogil:
        st = zt_dequant_rows(&a, begin, end)
    _raise_for_status(st, "dequantize")
