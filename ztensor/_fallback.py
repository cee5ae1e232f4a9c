"""numpy implementations of every kernel in csrc/.

Used when the compiled extension is missing or ``ZTENSOR_PUREPYTHON=1``, and by
the tests as an oracle for the C code.  Same signatures, same errors.
"""
from __future__ import annotations

import os

import numpy as np

from ztensor import _status, errors

# ------------------------------------------------------------------- footer
_V1 = b"ZTEN1000"
_V0 = b"ZTEN0001"


def footer_parse(head, tail, file_size, max_manifest, path=None):
    """Return (family, manifest_offset, manifest_size); see csrc/footer.c."""
    head, tail = bytes(head), bytes(tail)
    what = "reading the footer"
    if file_size < 8 or len(head) < 8:
        _status.raise_for_status(_status.TRUNCATED, what, path)
    if head[:8] == _V1:
        family, tail_size = 1, 16
    elif head[:8] == _V0:
        family, tail_size = 0, 8
    else:
        _status.raise_for_status(_status.BAD_MAGIC, what, path)
    if file_size < 8 + tail_size or len(tail) < tail_size:
        _status.raise_for_status(_status.TRUNCATED, what, path)
    t = tail[len(tail) - tail_size:]
    if family == 1 and t[8:16] != _V1:
        _status.raise_for_status(_status.BAD_FOOTER_MAGIC, what, path)
    size = int.from_bytes(t[:8], "little")
    what = _status.footer_context(size, file_size, max_manifest)
    if size > max_manifest:
        _status.raise_for_status(_status.MANIFEST_TOO_LARGE, what, path)
    if size > file_size - 8 - tail_size:
        _status.raise_for_status(_status.MANIFEST_OUT_OF_BOUNDS, what, path)
    return family, file_size - tail_size - size, size


# ------------------------------------------------------------------- byte swap
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bswap(src, dst, width):
    """Byte-swap width-byte elements of src into dst."""
    src = np.frombuffer(src, np.uint8)
    dst = np.frombuffer(dst, np.uint8)  # raises for a read-only dst, as C's wrapper does
    if dst.size != src.size or width not in _UINT or src.size % width:
        raise ValueError("bswap: buffers must have equal length, a multiple of width")
    if src.size:
        dst.view(_UINT[width])[...] = src.view(_UINT[width]).byteswap()


# ------------------------------------------------------------------- crc32c
def _crc_table():
    poly = 0x82F63B78
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (poly if c & 1 else 0)
        table[i] = c
    return table.tolist()


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    """CRC-32C of data, continuing from crc (bytewise; slow but exact)."""
    table = _CRC_TABLE
    c = crc ^ 0xFFFFFFFF
    for byte in bytes(memoryview(data).cast("B")):
        c = table[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


crc32c_portable = crc32c


def crc32c_hardware():
    return False


# ------------------------------------------------------------------- blob writer
class BlobWriter:
    """Python twin of csrc/blobwrite.c: stage small writes, pad with zeros."""

    def __init__(self, fd, pos, capacity=1 << 20, path=None):
        self._fd = fd
        self._pos = pos
        self._buf = bytearray()
        self._cap = capacity
        self._path = path
        self._open = True

    @property
    def pos(self):
        return self._pos

    def pad(self, alignment):
        self._require()
        n = -self._pos % alignment
        if n:
            self._stage(bytes(n))

    def write(self, data):
        self._require()
        data = memoryview(data).cast("B")
        if len(data) >= self._cap // 2:
            self.flush()
            self._write_all(data)
            self._pos += len(data)
        else:
            self._stage(data)

    def _stage(self, data):
        self._buf += data
        self._pos += len(data)
        if len(self._buf) >= self._cap:
            self.flush()

    def flush(self):
        self._require()
        if self._buf:
            self._write_all(memoryview(self._buf))
            self._buf = bytearray()

    def _write_all(self, view):
        try:
            while len(view):
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            raise errors.WriteError(f"write failed: {exc.strerror}", path=self._path,
                                    errno=exc.errno) from None

    def close(self):
        self._open = False
        self._buf = bytearray()

    def _require(self):
        if not self._open:
            raise errors.ZTensorError("blob writer is closed", path=self._path)


# ------------------------------------------------------------------- fp8 / bf16
# (exponent bits, mantissa bits, bias, "fn" = no infinities, "uz" = only 0x80 is NaN)
FP8_FORMATS = {
    "f8_e4m3fn": (4, 3, 7, True, False),
    "f8_e5m2": (5, 2, 15, False, False),
    "f8_e4m3fnuz": (4, 3, 8, True, True),
    "f8_e5m2fnuz": (5, 2, 16, True, True),
}


def fp8_table(name: str) -> np.ndarray:
    """float32 value of each of the 256 bytes of an FP8 format (conventions.md)."""
    ebits, mbits, bias, finite, uz = FP8_FORMATS[name]
    out = np.empty(256, dtype=np.float32)
    emax = (1 << ebits) - 1
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> mbits) & emax
        m = b & ((1 << mbits) - 1)
        if uz and b == 0x80:
            value = float("nan")
        elif e == emax and not finite:
            value = sign * float("inf") if m == 0 else float("nan")
        elif e == emax and not uz and m == (1 << mbits) - 1:
            value = float("nan")  # e4m3fn: S.1111.111
        elif e == 0:
            value = sign * m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            value = sign * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        out[b] = value
    return out


def fp8_decode(codes: np.ndarray, name: str) -> np.ndarray:
    """Decode uint8 FP8 codes to float32."""
    return fp8_table(name)[codes]


def bf16_decode(bits: np.ndarray) -> np.ndarray:
    """Decode bf16 bit patterns (any-endian uint16 array) to float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
