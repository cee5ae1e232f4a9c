# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/: take buffers, release the GIL, call C, map the status.

Nothing here decides anything about the file format; callers in ztensor/*.py check
sizes, offsets and types before a pointer reaches C.
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from ztensor import _status, errors

zt_crc32c_init()

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
