# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/: take buffers, release the GIL, call C, map the status.

Nothing here decides anything about the file format; callers in ztensor/*.py check
sizes, offsets and types before a pointer reaches C.
"""
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

from ztensor import _status, errors

zt_crc32c_init()
zt_floatconv_init()

# element sizes of zt_float_type (csrc/floatconv.h): f32, f16, bf16
cdef size_t _WIDTH[3]
_WIDTH[:] = [4, 2, 2]

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


def bswap(const uint8_t[::1] src, uint8_t[::1] dst, size_t width):
    """Byte-swap width-byte elements of src into dst (same length; may be the same buffer)."""
    cdef size_t n = src.shape[0]
    cdef zt_status st
    if dst.shape[0] != n or width == 0 or n % width:
        raise ValueError("bswap: buffers must have equal length, a multiple of width")
    if n == 0:
        return
    with nogil:
        st = zt_bswap(&src[0], &dst[0], n // width, width)
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


cdef class BlobWriter:
    """Stage and write blobs to an open file descriptor (see csrc/blobwrite.c)."""
    cdef zt_blobwriter bw
    cdef bint ready
    cdef object path

    def __cinit__(self, int fd, uint64_t pos, size_t capacity=1 << 20, path=None):
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


# ------------------------------------------------------------------ conversions
cdef int _check_float_type(int t) except -1:
    if t < 0 or t > 2:
        raise ValueError(f"unknown float type code {t}")
    return 0


def fp8_decode(const uint8_t[::1] src, uint8_t[::1] dst, int kind, int dst_type):
    """FP8 codes -> float32 (dst_type 0) or float16 bits (1); dst holds the bytes."""
    cdef size_t n = src.shape[0]
    cdef zt_status st
    _check_float_type(dst_type)
    if dst_type == 2 or dst.shape[0] != n * _WIDTH[dst_type]:
        raise ValueError("fp8_decode: dst must hold n float32 or float16 values")
    if n == 0:
        return
    with nogil:
        st = zt_fp8_decode(&src[0], &dst[0], n, kind, dst_type)
    _raise_for_status(st, "fp8 decode")


def fp8_encode(const uint8_t[::1] src, uint8_t[::1] dst, int kind, int src_type):
    """float32 (src_type 0) or float16 (1) bytes -> FP8 codes."""
    cdef size_t n = dst.shape[0]
    cdef zt_status st
    _check_float_type(src_type)
    if src_type == 2 or src.shape[0] != n * _WIDTH[src_type]:
        raise ValueError("fp8_encode: src must hold n float32 or float16 values")
    if n == 0:
        return
    with nogil:
        st = zt_fp8_encode(&src[0], &dst[0], n, kind, src_type)
    _raise_for_status(st, "fp8 encode")


def bf16_decode(const uint8_t[::1] src, uint8_t[::1] dst):
    """bf16 bits (native uint16) -> float32 (native)."""
    cdef size_t n = src.shape[0] // 2
    if src.shape[0] % 2 or dst.shape[0] != 4 * n:
        raise ValueError("bf16_decode: dst must hold one float32 per bf16")
    if n:
        with nogil:
            zt_bf16_decode(<const uint16_t *>&src[0], <float *>&dst[0], n)


def bf16_encode(const uint8_t[::1] src, uint8_t[::1] dst):
    """float32 (native) -> bf16 bits (native uint16), round to nearest even."""
    cdef size_t n = src.shape[0] // 4
    if src.shape[0] % 4 or dst.shape[0] != 2 * n:
        raise ValueError("bf16_encode: dst must hold one bf16 per float32")
    if n:
        with nogil:
            zt_bf16_encode(<const float *>&src[0], <uint16_t *>&dst[0], n)


# ------------------------------------------------------------------ group dequantization
def unpack_codes(const uint8_t[::1] words, size_t count, int bits, uint8_t[::1] out):
    """Unpack count LSB-first codes from little-endian int32 words."""
    cdef zt_status st
    if bits not in (2, 4, 8) or out.shape[0] != count or \
            words.shape[0] * 8 < count * <size_t>bits:
        raise ValueError("unpack_codes: sizes do not match")
    if count == 0:
        return
    with nogil:
        st = zt_unpack_codes(&words[0], count, bits, &out[0])
    _raise_for_status(st, "unpack codes")


def dequant_rows(const uint8_t[::1] qweight, const uint8_t[::1] scales, zeros, g_idx,
                 size_t K, size_t N, size_t G, size_t group_size, int bits, int scale_type,
                 int zero_type, int out_type, uint8_t[::1] out, size_t row_begin,
                 size_t row_end):
    """Dequantize rows [row_begin, row_end); see csrc/quant.h.  Every size was checked
    by ztensor/formats/quantized.py; the lengths are checked again here so that no
    call can make C read past a buffer."""
    cdef zt_dequant_args a
    cdef const uint8_t[::1] zv
    cdef const uint8_t[::1] gv
    cdef zt_status st
    cdef size_t per
    if bits not in (2, 4, 8) or row_end > N or row_begin > row_end:
        raise ValueError("dequant_rows: bad bits or row range")
    _check_float_type(scale_type)
    _check_float_type(out_type)
    per = 32 // bits
    if K % per or qweight.shape[0] != K // per * N * 4 or \
            scales.shape[0] != G * N * _WIDTH[scale_type] or \
            out.shape[0] != N * K * _WIDTH[out_type] or (K and (G == 0 or group_size == 0)):
        raise ValueError("dequant_rows: buffer sizes do not match K, N, G")
    a.zeros = NULL
    a.g_idx = NULL
    if zero_type == 16:
        pass
    elif zero_type in (17, 18):
        zv = zeros
        if N % per or zv.shape[0] != G * (N // per) * 4:
            raise ValueError("dequant_rows: packed zeros do not match G, N")
        a.zeros = &zv[0] if zv.shape[0] else NULL
    else:
        _check_float_type(zero_type)
        zv = zeros
        if zv.shape[0] != G * N * _WIDTH[zero_type]:
            raise ValueError("dequant_rows: zeros do not match G, N")
        a.zeros = &zv[0] if zv.shape[0] else NULL
    if g_idx is not None:
        gv = g_idx
        if gv.shape[0] != K * 4:
            raise ValueError("dequant_rows: g_idx must hold K int32 values")
        a.g_idx = &gv[0] if K else NULL
    if K == 0 or N == 0 or row_begin == row_end:
        return
    a.qweight = &qweight[0]
    a.scales = &scales[0]
    a.K, a.N, a.G, a.group_size = K, N, G, group_size
    a.bits, a.scale_type, a.zero_type, a.out_type = bits, scale_type, zero_type, out_type
    a.out = &out[0]
    with nogil:
        st = zt_dequant_rows(&a, row_begin, row_end)
    _raise_for_status(st, "dequantize")
