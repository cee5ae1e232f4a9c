"""numpy implementations of the kernels in csrc/, except the manifest's.

Used when the compiled extension is missing or ``ZTENSOR_PUREPYTHON=1``, and by
the tests as an oracle for the C code.  Same signatures, same errors.  Not here:
``manifest_scan``, ``decode_spans``, ``manifest_encode`` and ``ViewTable`` (the
manifest's fast paths): without them ``kernels.py`` leaves those names unset, and
the manifest is read and written the general way (cbor2 + ``manifest_checks.Checker``).
The kernels' numbers (float and FP8 codes, zero types, footer families, ggml block
sizes) come from ``_contract.py``, their one Python home.
"""

from __future__ import annotations

import math
import os

import numpy as np

from ztensor import errors, spec
from ztensor._native import contract as _contract
from ztensor._native import status as _status

# ------------------------------------------------------------------- footer
# header magic -> (family, the version row with its tail size); v1.1 and v1.2 share both
_FAMILIES = {
    spec.MAGIC_V1: (_contract.FAMILY_V1, spec.VERSIONS["1.2"]),
    spec.MAGIC_V0: (_contract.FAMILY_V0, spec.VERSIONS["0.1"]),
}


def footer_parse(head, tail, file_size, max_manifest, path=None):
    """Return (family, manifest_offset, manifest_size); see csrc/footer.c."""
    head, tail = bytes(head), bytes(tail)
    what = "reading the footer"
    magic_size = spec.MAGIC_SIZE
    if file_size < magic_size or len(head) < magic_size:
        _status.raise_for_status(_status.TRUNCATED, what, path)
    found = _FAMILIES.get(head[:magic_size])
    if found is None:
        _status.raise_for_status(_status.BAD_MAGIC, what, path)
    family, info = found
    tail_size = info.tail_size
    if file_size < magic_size + tail_size or len(tail) < tail_size:
        _status.raise_for_status(_status.TRUNCATED, what, path)
    t = tail[len(tail) - tail_size :]
    if family == _contract.FAMILY_V1 and t[8:] != info.magic:  # v1 ends with its magic
        _status.raise_for_status(_status.BAD_FOOTER_MAGIC, what, path)
    size = int.from_bytes(t[:8], "little")
    what = _status.footer_context(size, file_size, max_manifest)
    if size > max_manifest:
        _status.raise_for_status(_status.MANIFEST_TOO_LARGE, what, path)
    if size > file_size - magic_size - tail_size:
        _status.raise_for_status(_status.MANIFEST_OUT_OF_BOUNDS, what, path)
    return family, file_size - tail_size - size, size


# ------------------------------------------------------------------- byte swap
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SWAP_CHUNK = 1 << 18


def bswap(src, dst, width):
    """Byte-swap width-byte elements of src into dst."""
    src = np.frombuffer(src, np.uint8)
    dst = np.frombuffer(dst, np.uint8)  # raises for a read-only dst, as C's wrapper does
    _contract.bswap(src.size, dst.size, width)
    # in chunks: the temporaries stay small however large the buffer (and src may
    # be dst: each chunk is read whole before it is written back)
    step = _SWAP_CHUNK - _SWAP_CHUNK % width
    for start in range(0, src.size, step):
        part = src[start : start + step].view(_UINT[width])
        dst[start : start + step].view(_UINT[width])[...] = part.byteswap()


def range_resident(buf):
    """Whether ``buf``'s pages are in the page cache: the numpy twin cannot ask the
    kernel, so it says it does not know (None), and readers take their general path."""
    return True if len(memoryview(buf)) == 0 else None


def copy(src, dst):
    """dst[:] = src (one length; the buffers must not overlap)."""
    src = np.frombuffer(src, np.uint8)
    dst = np.frombuffer(dst, np.uint8)  # raises for a read-only dst, as C's wrapper does
    _contract.copy(src.size, dst.size, src.ctypes.data, dst.ctypes.data)
    np.copyto(dst, src)


def zstd_frames(data):
    """(verdict, at, frames) as csrc/zstd_frames.c computes them: whether ``data`` is
    whole zstd frames, walked by their frame and block headers (RFC 8878)."""
    p = memoryview(data).cast("B")
    n, pos, count = len(p), 0, 0
    while pos < n:
        left = n - pos
        if left < 4:
            return 1, pos, count
        magic = int.from_bytes(p[pos : pos + 4], "little")
        if magic == 0xFD2FB528:
            length = _zstd_frame_length(p, pos, n)
            if length < 0:
                return -length, pos, count
        elif magic & 0xFFFFFFF0 == 0x184D2A50:
            if left < 8 or left - 8 < int.from_bytes(p[pos + 4 : pos + 8], "little"):
                return 1, pos, count
            length = 8 + int.from_bytes(p[pos + 4 : pos + 8], "little")
        else:
            return 2, pos, count
        pos += length
        count += 1
    return 0, n, count


def _zstd_frame_length(p, start, n) -> int:
    """The zstd frame at p[start:]'s length, or minus its verdict (1 cut, 3 bad)."""
    if n - start < 5:
        return -1
    fhd = p[start + 4]
    if fhd & 0x08:  # the reserved bit
        return -3
    single = (fhd >> 5) & 1
    fcs = (0, 2, 4, 8)[fhd >> 6] if (fhd >> 6) or not single else 1
    pos = start + 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + fcs
    while True:
        if pos > n or n - pos < 3:
            return -1
        h = p[pos] | p[pos + 1] << 8 | p[pos + 2] << 16
        kind, size = (h >> 1) & 3, h >> 3
        pos += 3
        if kind == 3:
            return -3
        body = 1 if kind == 1 else size
        if n - pos < body:
            return -1
        pos += body
        if h & 1:
            break
    if fhd & 0x04:
        if n - pos < 4:
            return -1
        pos += 4
    return pos - start


def copy_spans(src, dst, src_offsets, dst_offsets, lengths):
    """dst[d:d+n] = src[s:s+n] for each span."""
    src = np.frombuffer(src, np.uint8)
    dst = np.frombuffer(dst, np.uint8)
    src_offsets, dst_offsets, lengths = _contract.copy_spans(
        src.size, dst.size, src_offsets, dst_offsets, lengths
    )
    for s, d, n in zip(src_offsets.tolist(), dst_offsets.tolist(), lengths.tolist()):
        dst[d : d + n] = src[s : s + n]


# ------------------------------------------------------------------- ggml blocks
def ggml_dequant(ggml_type, blocks, out):
    """numpy twin of csrc/ggml_blocks.c: the same element order, the same float32
    roundings (one per numpy operation, as in C)."""
    blocks = np.frombuffer(blocks, np.uint8)
    out = np.frombuffer(out, np.uint8)  # raises for a read-only out, as C's wrapper does
    n = _contract.ggml_dequant(ggml_type, blocks.size, out.size)
    elements, nbytes = _contract.GGML_BLOCKS[ggml_type]
    b = blocks.reshape(n, nbytes)
    out.view(np.float32).reshape(n, elements)[...] = _GGML[ggml_type](b)


def _half(b, at):
    return b[:, at : at + 2].copy().view("<f2").astype(np.float32)  # (n, 1)


def _q4_q5(b, has_min, five):
    d = _half(b, 0)
    m = _half(b, 2) if has_min else None
    p = 4 if has_min else 2
    j = np.arange(32)
    qs = b[:, p + (4 if five else 0) :]
    q = np.where(j < 16, qs[:, j % 16] & 0x0F, qs[:, j % 16] >> 4).astype(np.int32)
    if five:
        qh = b[:, p : p + 4].copy().view("<u4").astype(np.int64)  # (n, 1)
        q = q | (((qh >> j) & 1) << 4).astype(np.int32)
    if has_min:
        return (d * q.astype(np.float32)) + m
    return d * (q - (16 if five else 8)).astype(np.float32)


def _q8_0(b):
    return b[:, 2:].view(np.int8).astype(np.float32) * _half(b, 0)


_E = np.arange(256)


def _q2_k(b):
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _half(b, 80), _half(b, 82)
    q = (qs[:, (_E // 128) * 32 + _E % 32] >> (2 * ((_E % 128) // 32))) & 3
    sc = scales[:, _E // 16]
    dl = d * (sc & 0x0F).astype(np.float32)
    ml = dmin * (sc >> 4).astype(np.float32)
    return dl * q.astype(np.float32) - ml


def _q3_k(b):
    hmask, qs, s = b[:, :32], b[:, 32:96], b[:, 96:108]
    d = _half(b, 108)
    i = np.arange(16)
    low = np.where(i < 8, s[:, i % 8], s[:, i % 8] >> 4) & 0x0F
    high = (s[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    dl = d * ((low | (high << 4)).astype(np.int8).astype(np.int32) - 32).astype(np.float32)
    ql = (qs[:, (_E // 128) * 32 + _E % 32] >> (2 * ((_E % 128) // 32))) & 3
    qh = ((hmask[:, _E % 32] >> (_E // 32)) & 1) ^ 1
    q = ql.astype(np.int32) - (qh.astype(np.int32) << 2)
    return dl[:, _E // 16] * q.astype(np.float32)


def _scale_min_k4(s):
    j = np.arange(4)
    sc = np.concatenate([s[:, j] & 63, (s[:, 8 + j] & 0x0F) | ((s[:, j] >> 2) & 0x30)], axis=1)
    mn = np.concatenate(
        [s[:, 4 + j] & 63, (s[:, 8 + j] >> 4) | ((s[:, 4 + j] >> 2) & 0x30)], axis=1
    )
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_q5_k(b, five):
    d, dmin = _half(b, 0), _half(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    qs = b[:, 48:] if five else b[:, 16:]
    sub = _E // 32
    q = ((qs[:, (_E // 64) * 32 + _E % 32] >> (4 * ((_E % 64) // 32))) & 0x0F).astype(np.int32)
    if five:
        q = q | (((b[:, 16:48][:, _E % 32] >> sub) & 1).astype(np.int32) << 4)
    dl, ml = d * sc[:, sub], dmin * mn[:, sub]
    return dl * q.astype(np.float32) - ml


def _q6_k(b):
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208]
    d = _half(b, 208)
    half, i = _E // 128, _E % 128
    low = (ql[:, half * 64 + i % 64] >> (4 * (i // 64))) & 0x0F
    high = (qh[:, half * 32 + i % 32] >> (2 * (i // 32))) & 3
    dl = d * scales[:, _E // 16].view(np.int8).astype(np.float32)
    return dl * ((low | (high << 4)).astype(np.int32) - 32).astype(np.float32)


_GGML = {
    2: lambda b: _q4_q5(b, False, False),
    3: lambda b: _q4_q5(b, True, False),
    6: lambda b: _q4_q5(b, False, True),
    7: lambda b: _q4_q5(b, True, True),
    8: _q8_0,
    10: _q2_k,
    11: _q3_k,
    12: lambda b: _q4_q5_k(b, False),
    13: lambda b: _q4_q5_k(b, True),
    14: _q6_k,
}


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
EXTENT = _contract.BLOB_EXTENT  # csrc/blobwrite.h ZT_BW_EXTENT


def reserve_ahead(fd, nbytes):
    """The compiled reservation is a hint only (csrc/blobwrite.c); Python cannot tell
    ext4 from a filesystem where fallocate would write zeros, so it is not made."""
    _contract.reserve_ahead(fd, nbytes)
    return False


class BlobWriter:
    """Python twin of csrc/blobwrite.c: stage small writes, pad with zeros, and end
    every write(2) but the last on an extent boundary (the C file says why)."""

    def __init__(self, fd, pos, capacity=4 << 20, path=None):
        self._fd = fd
        self._pos = pos
        self._buf = bytearray()
        self._cap = capacity
        self._extent = EXTENT
        while self._extent > capacity // 2:
            self._extent //= 2
        self._path = path
        self._open = True

    @property
    def pos(self):
        return self._pos

    def pad(self, alignment):
        self._require()
        n = -self._pos % alignment
        if n:
            self._stage(memoryview(bytes(n)))

    def write(self, data):
        self._require()
        data = memoryview(data).cast("B")
        while len(data):
            if not self._buf and self._pos % self._extent == 0 and len(data) >= self._cap:
                direct = len(data) - len(data) % self._extent  # whole extents, no copy
                self._write_all(data[:direct])
                self._pos += direct
                data = data[direct:]
                continue
            room = self._room()
            if room == 0:  # handed over, so the rest of a large blob goes direct
                self.flush()
                continue
            n = min(len(data), room)
            self._stage(data[:n])
            data = data[n:]

    def _room(self):
        start = self._pos - len(self._buf)
        return (start + self._cap) // self._extent * self._extent - self._pos

    def _stage(self, data):
        while len(data):
            room = self._room()
            if room == 0:
                self.flush()
                continue
            self._buf += data[:room]
            self._pos += min(room, len(data))
            data = data[room:]

    def flush(self):
        self._require()
        if self._buf:
            self._write_all(memoryview(self._buf))
            self._buf = bytearray()

    def _write_all(self, view):
        try:
            while len(view):  # one extent a call at most (csrc/blobwrite.c: why)
                view = view[os.write(self._fd, view[:EXTENT]) :]
        except OSError as exc:
            raise errors.WriteError(
                f"write failed: {exc.strerror}", path=self._path, errno=exc.errno
            ) from None

    def close(self):
        self._open = False
        self._buf = bytearray()

    def _require(self):
        if not self._open:
            raise errors.ZTensorError("blob writer is closed", path=self._path)


# ------------------------------------------------------------------- fp8 / bf16 / f16
# codes shared with csrc/floatconv.h
F32, F16, BF16 = _contract.F32, _contract.F16, _contract.BF16
FP8_KINDS = _contract.FP8_KINDS
_FLOAT_NP = {F32: np.dtype(np.float32), F16: np.dtype(np.float16)}

# name: (exponent bits, mantissa bits, bias, no infinities, fnuz, max finite code, NaN code)
FP8_FORMATS = {
    "f8_e4m3fn": (4, 3, 7, True, False, 0x7E, 0x7F),
    "f8_e5m2": (5, 2, 15, False, False, 0x7B, 0x7E),
    "f8_e4m3fnuz": (4, 3, 8, True, True, 0x7F, 0x80),
    "f8_e5m2fnuz": (5, 2, 16, True, True, 0x7F, 0x80),
}


def fp8_table(name: str) -> np.ndarray:
    """float32 value of each of the 256 codes of an FP8 format, NaNs as ml_dtypes
    gives them (quiet, with the code's sign; fnuz's 0x80 is -NaN)."""
    ebits, mbits, bias, finite, uz = FP8_FORMATS[name][:5]
    out = np.empty(256, dtype=np.float32)
    emax = (1 << ebits) - 1
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> mbits) & emax
        m = b & ((1 << mbits) - 1)
        if uz and b == 0x80:
            value = math.copysign(math.nan, -1.0)
        elif e == emax and not finite:
            value = sign * math.inf if m == 0 else math.copysign(math.nan, sign)
        elif e == emax and not uz and m == (1 << mbits) - 1:
            value = math.copysign(math.nan, sign)  # e4m3fn: S.1111.111
        elif e == 0:
            value = sign * m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            value = sign * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        out[b] = value
    return out


_TABLES: dict[str, np.ndarray] = {}  # FP8 type name -> its decode table


def _table(name):
    if name not in _TABLES:
        _TABLES[name] = fp8_table(name)
    return _TABLES[name]


def fp8_decode(src, dst, kind, dst_type):
    """FP8 codes -> float32 (dst_type 0) or float16 (1), written into dst's bytes."""
    codes = np.frombuffer(src, np.uint8)
    _contract.fp8("fp8_decode", codes.size, memoryview(dst).nbytes, kind, dst_type)
    values = _table(FP8_KINDS[kind])[codes]
    out = np.frombuffer(dst, _FLOAT_NP[dst_type])
    out[...] = values if dst_type == F32 else _f32_to_f16(values)


def _f32_to_f16(values):
    with np.errstate(over="ignore", invalid="ignore"):
        half = values.astype(np.float16)
    bits = half.view(np.uint16)
    nan = np.isnan(values)
    bits[nan] = 0x7E00 | ((values[nan].view(np.uint32) >> 16) & 0x8000).astype(np.uint16)
    return half


def fp8_encode(src, dst, kind, src_type):
    """float32 (0) or float16 (1) values -> FP8 codes with ml_dtypes' rules."""
    out = np.frombuffer(dst, np.uint8)
    _contract.fp8("fp8_encode", out.size, memoryview(src).nbytes, kind, src_type)
    x = np.frombuffer(src, _FLOAT_NP[src_type]).astype(np.float32)
    _, mbits, bias, _, uz, max_code, nan_code = FP8_FORMATS[FP8_KINDS[kind]]
    has_inf = FP8_KINDS[kind] == "f8_e5m2"
    bits = x.view(np.uint32).astype(np.int64)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    drop = 23 - mbits
    r = a - ((127 - bias) << 23)
    normal_code = (r + ((1 << (drop - 1)) - 1) + ((r >> drop) & 1)) >> drop
    normal = (a >> 23) >= 128 - bias
    tiny = np.where(normal, 0, a).astype(np.uint32).view(np.float32)  # FP8-subnormal lanes only
    scaled = np.rint(tiny * np.float32(2.0 ** (bias - 1 + mbits))).astype(np.int64)
    code = np.where(normal, normal_code, scaled)
    nan = np.full_like(sign, 0x80) if uz else sign | nan_code
    overflow = sign | 0x7C if has_inf else nan
    result = np.where(code > max_code, overflow, code | sign)
    if uz:
        result = np.where(code == 0, 0, result)
    result = np.where(a == 0x7F800000, overflow, result)
    result = np.where(a > 0x7F800000, nan, result)
    out[...] = result.astype(np.uint8)


def bf16_decode(src, dst):
    """bf16 bits (native uint16) -> float32 (native)."""
    _contract.bf16("bf16_decode", memoryview(src).nbytes, memoryview(dst).nbytes)
    out = np.frombuffer(dst, np.float32)
    out[...] = bf16_to_f32(np.frombuffer(src, np.uint16))


def bf16_encode(src, dst):
    """float32 -> bf16 bits, round to nearest even; NaN -> 0x7fc0 with its sign."""
    _contract.bf16("bf16_encode", memoryview(dst).nbytes, memoryview(src).nbytes)
    np.frombuffer(dst, np.uint16)[...] = f32_to_bf16(np.frombuffer(src, np.float32))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode bf16 bit patterns (any-endian uint16 array) to float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((x >> 16) & 0x8000).astype(np.uint16) | 0x7FC0, rounded)


# ------------------------------------------------------------------- group dequantization
ZERO_NONE, ZERO_PACKED_V1, ZERO_PACKED_V2 = (
    _contract.ZERO_NONE,
    _contract.ZERO_PACKED_V1,
    _contract.ZERO_PACKED_V2,
)


def stream_codes(words, bits):
    """The codes of LSB-first bit streams running down axis 0 of ``words`` (uint32,
    [whole blocks of words, columns]): [codes, columns].  Code j of a block sits at
    bit j*bits of the block's words; 3-bit codes may straddle two words."""
    per, width = _contract.block_codes(bits), 3 if bits == 3 else 1
    blocks = words.reshape(words.shape[0] // width, width, -1).astype(np.uint64)
    codes = np.empty((blocks.shape[0], per, blocks.shape[2]), np.uint8)
    for j in range(per):
        w, shift = divmod(j * bits, 32)
        v = blocks[:, w] >> np.uint64(shift)
        if shift + bits > 32:
            v |= blocks[:, w + 1] << np.uint64(32 - shift)
        codes[:, j] = v & np.uint64((1 << bits) - 1)
    return codes.reshape(-1, words.shape[1])


def unpack_codes(words, count, bits, out):
    """Unpack count LSB-first codes from little-endian int32 words."""
    _contract.unpack_codes(memoryview(words).nbytes, count, bits, memoryview(out).nbytes)
    blocks = -(-count // _contract.block_codes(bits))
    w = np.zeros(_contract.stream_words(blocks * _contract.block_codes(bits), bits), np.uint32)
    held = np.frombuffer(words, "<u4")[: w.size]
    w[: held.size] = held
    np.frombuffer(out, np.uint8)[...] = stream_codes(w[:, None], bits)[:count, 0]


def _floats(buf, ftype, shape):
    if ftype == BF16:
        return bf16_to_f32(np.frombuffer(buf, "<u2")).reshape(shape)
    return np.frombuffer(buf, "<f4" if ftype == F32 else "<f2").astype(np.float32).reshape(shape)


def dequant_rows(
    qweight,
    scales,
    zeros,
    g_idx,
    K,
    N,
    G,
    group_size,
    bits,
    scale_type,
    zero_type,
    out_type,
    out,
    row_begin,
    row_end,
):
    """numpy twin of csrc/quant.c: W[n, k] = s[g, n] * (code(k, n) - z[g, n])."""
    no_zeros = zero_type == ZERO_NONE or zeros is None
    _contract.dequant(
        memoryview(qweight).nbytes,
        memoryview(scales).nbytes,
        None if no_zeros else memoryview(zeros).nbytes,
        None if g_idx is None else memoryview(g_idx).nbytes,
        K,
        N,
        G,
        group_size,
        bits,
        scale_type,
        zero_type,
        out_type,
        memoryview(out).nbytes,
        row_begin,
        row_end,
    )
    if g_idx is not None and K:
        groups = np.frombuffer(g_idx, "<i4").view("<u4")
        if groups.max() >= G:
            _status.raise_for_status(_status.GROUP_INDEX, "dequantize")
    if K == 0 or N == 0 or row_begin == row_end:
        return
    rows = slice(row_begin, row_end)
    words = np.frombuffer(qweight, "<u4").reshape(_contract.stream_words(K, bits), N)[:, rows]
    codes = stream_codes(words, bits)
    s = _floats(scales, scale_type, (G, N))[:, rows]
    if zero_type == ZERO_NONE:
        z = np.full_like(s, 2.0 ** (bits - 1))
    elif zero_type in (ZERO_PACKED_V1, ZERO_PACKED_V2):
        packed = np.frombuffer(zeros, "<u4").reshape(G, _contract.stream_words(N, bits))
        unpacked = stream_codes(np.ascontiguousarray(packed.T), bits).T.astype(np.int64)
        if zero_type == ZERO_PACKED_V1:  # stored zero - 1; AutoGPTQ: (stored + 1) & mask
            unpacked = (unpacked + 1) & ((1 << bits) - 1)
        z = unpacked[:, rows].astype(np.float32)
    else:
        z = _floats(zeros, zero_type, (G, N))[:, rows]
    g = (
        np.frombuffer(g_idx, "<u4").astype(np.intp)
        if g_idx is not None
        else np.arange(K) // group_size
    )
    w = ((codes.astype(np.float32) - z[g]) * s[g]).T
    target = np.frombuffer(out, {F32: np.float32, F16: np.float16, BF16: np.uint16}[out_type])
    target = target.reshape(N, K)[rows]
    if out_type == F32:
        target[...] = w
    elif out_type == F16:
        target[...] = _f32_to_f16(np.ascontiguousarray(w))
    else:
        target[...] = f32_to_bf16(w)


# ------------------------------------------------------------------- manifest scan
_ALLOWED_TAGS = (2, 3, 55799)


def cbor_scan(data, max_depth, path=None):
    """Python twin of csrc/cbor_scan.c: (end, items, depth) or FormatError."""
    _contract.integers("cbor_scan", max_depth=max_depth)
    if not 1 <= max_depth <= 100000:
        _contract.fail("cbor_scan", f"max_depth must be in [1, 100000], got {max_depth}")
    buf = bytes(data)
    n = len(buf)
    pos = items = depth = 0
    # frames: [left, seen, indefinite, is_map]; frame 0 expects the root item
    stack = [[1, 0, False, False]]

    def fail(status, why, tag=0):
        _status.raise_cbor(status, why, pos, tag, max_depth, path)

    def argument(info, head="an item's head"):
        nonlocal pos
        if info < 24 or info == 31:
            return info if info < 24 else 0
        if info > 27:
            fail(_status.CBOR_MALFORMED, "a reserved additional-information value")
        size = 1 << (info - 24)
        if n - pos < size:
            fail(_status.CBOR_MALFORMED, f"the bytes end inside {head}")
        value = int.from_bytes(buf[pos : pos + size], "big")
        pos += size
        return value

    while True:
        f = stack[-1]
        if not f[2] and f[0] == 0:
            if len(stack) == 1:
                break
            stack.pop()
            continue
        if pos >= n:
            fail(_status.CBOR_MALFORMED, "the bytes end inside an item")
        ib = buf[pos]
        major, info = ib >> 5, ib & 31
        if ib == 0xFF:
            if not f[2]:
                fail(_status.CBOR_MALFORMED, "a break code outside an indefinite-length item")
            if f[3] and f[1] % 2:
                fail(_status.CBOR_MALFORMED, "a map key without a value")
            pos += 1
            stack.pop()
            continue
        if f[3] and f[1] % 2 == 0 and major != 3:
            fail(_status.CBOR_KEY, "a map key that is not a text string")
        pos += 1
        if not f[2]:
            f[0] -= 1
        f[1] += 1
        items += 1
        arg = argument(info)
        if info == 31 and major in (0, 1, 6):
            fail(_status.CBOR_MALFORMED, "an indefinite length on an integer or tag")
        if major in (2, 3):
            if info != 31:
                if arg > n - pos:
                    fail(_status.CBOR_MALFORMED, "a string longer than the bytes that remain")
                pos += arg
                continue
            while True:
                if pos >= n:
                    fail(_status.CBOR_MALFORMED, "the bytes end inside a string")
                cb = buf[pos]
                if cb == 0xFF:
                    pos += 1
                    break
                if cb >> 5 != major or cb & 31 == 31:
                    fail(
                        _status.CBOR_MALFORMED,
                        "an indefinite-length string chunk of the wrong type",
                    )
                pos += 1
                items += 1
                size = argument(cb & 31, "a chunk head")
                if size > n - pos:
                    fail(_status.CBOR_MALFORMED, "a string chunk longer than the bytes that remain")
                pos += size
        elif major in (4, 5, 6):
            if major == 6 and arg not in _ALLOWED_TAGS:
                fail(_status.CBOR_TAG, "", arg)
            if major == 6 and arg != 55799 and (pos >= n or buf[pos] >> 5 != 2):
                fail(_status.CBOR_MALFORMED, "a bignum tag that does not hold a byte string")
            count = 1 if major == 6 else arg
            if info != 31 and count > (n - pos) // (2 if major == 5 else 1):
                fail(
                    _status.CBOR_MALFORMED,
                    "a container declaring more items than the bytes that remain can hold",
                )
            if len(stack) > max_depth:
                fail(_status.CBOR_DEPTH, "")
            stack.append([2 * count if major == 5 else count, 0, info == 31, major == 5])
            depth = max(depth, len(stack) - 1)
        elif major == 7:
            if info == 24 and arg < 32:
                fail(_status.CBOR_MALFORMED, "a two-byte simple value below 32")
    return pos, items, max(depth, 1)


# ------------------------------------------------------------------ v2 container
def cbor_check_canonical(data, max_depth, path=None):
    """Python twin of csrc/cbor_canonical.c: None, or FormatError."""
    _contract.cbor_canonical(max_depth)
    buf = bytes(data)
    n = len(buf)
    pos = 0
    stack = []  # frames: [left, seen, start, key_start, key_end, is_map]

    def fail(status, why):
        _status.raise_canonical(status, why, pos, max_depth, path)

    while True:
        item_start, depth = pos, len(stack)
        if depth > max_depth:
            fail(_status.CBOR_DEPTH, "nesting deeper than the limit")
        if pos >= n:
            fail(_status.CBOR_MALFORMED, "the bytes end inside an item")
        ib = buf[pos]
        pos += 1
        major, info = ib >> 5, ib & 31
        arg = info
        if info == 31:
            fail(_status.CBOR_MALFORMED, "an indefinite length")
        if info >= 28:
            fail(_status.CBOR_MALFORMED, "a reserved head value")
        if info >= 24:
            size = 1 << (info - 24)
            if n - pos < size:
                fail(_status.CBOR_MALFORMED, "the bytes end inside a head")
            arg = int.from_bytes(buf[pos : pos + size], "big")
            pos += size
            if major != 7 and arg < (24, 0x100, 0x10000, 0x100000000)[info - 24]:
                fail(_status.CBOR_MALFORMED, "a head not in shortest form")
        opens = False
        if major in (2, 3):
            if arg > n - pos:
                fail(_status.CBOR_MALFORMED, "a string longer than the bytes left")
            pos += arg
        elif major in (4, 5):
            if major == 5 and arg > (n - pos) // 2:
                fail(_status.CBOR_MALFORMED, "a map longer than the bytes left")
            if arg > n - pos:
                fail(_status.CBOR_MALFORMED, "an array longer than the bytes left")
            if arg:
                if depth + 1 > max_depth:
                    fail(_status.CBOR_DEPTH, "nesting deeper than the limit")
                stack.append([2 * arg if major == 5 else arg, 0, item_start, 0, 0, major == 5])
                opens = True
        elif major == 6:
            fail(_status.CBOR_TAG, "a CBOR tag")
        elif major == 7:
            if info == 24 and arg < 32:
                fail(_status.CBOR_MALFORMED, "a simple value in two bytes")
            if 25 <= info <= 27 and not _float_canonical(info, buf[pos - (2 << (info - 25)) : pos]):
                fail(_status.CBOR_MALFORMED, "a float not in its shortest form")
        if opens:
            continue
        child = item_start
        while stack:
            f = stack[-1]
            if f[5] and f[1] % 2 == 0:
                if f[1] > 0 and buf[f[3] : f[4]] >= buf[child:pos]:
                    fail(_status.CBOR_MALFORMED, "map keys not in strictly increasing order")
                f[3], f[4] = child, pos
            f[1] += 1
            f[0] -= 1
            if f[0]:
                break
            child = f[2]
            stack.pop()
        if not stack:
            break
    if pos != n:
        fail(_status.CBOR_MALFORMED, "bytes after the manifest's item")


def _float_canonical(info, raw):
    if info == 25:
        bits = int.from_bytes(raw, "big")
        return not ((bits & 0x7C00) == 0x7C00 and bits & 0x3FF) or bits == 0x7E00
    value = np.frombuffer(raw, ">f4" if info == 26 else ">f8")[0]
    if value != value:
        return False
    narrower = np.float16 if info == 26 else np.float32
    with np.errstate(over="ignore"):
        return float(value.astype(narrower)) != float(value)


_XXH_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_M64 = (1 << 64) - 1
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_MX1, _MX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25


def _r64(b, at):
    return int.from_bytes(b[at : at + 8], "little")


def _fold(a, b):
    p = a * b
    return (p & _M64) ^ (p >> 64)


def _avalanche(x):
    x ^= x >> 37
    x = (x * _MX1) & _M64
    return x ^ (x >> 32)


def _mix16(p, at, s_at):
    return _fold(
        _r64(p, at) ^ _r64(_XXH_SECRET, s_at), _r64(p, at + 8) ^ _r64(_XXH_SECRET, s_at + 8)
    )


def xxh3_64(data):
    """Python twin of csrc/xxh3.c (XXH3-64, seed 0); large inputs are summed per block
    with numpy (the accumulation within a block does not depend on the accumulators)."""
    p = memoryview(data).cast("B")
    n = len(p)
    s = _XXH_SECRET
    if n <= 16:
        b = bytes(p)
        if n > 8:
            lo = (_r64(s, 24) ^ _r64(s, 32)) ^ _r64(b, 0)
            hi = (_r64(s, 40) ^ _r64(s, 48)) ^ _r64(b, n - 8)
            swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
            return _avalanche((n + swapped + hi + _fold(lo, hi)) & _M64)
        if n >= 4:
            first = int.from_bytes(b[:4], "little")
            last = int.from_bytes(b[n - 4 :], "little")
            v = (_r64(s, 8) ^ _r64(s, 16)) ^ (last | (first << 32))
            rot = lambda x, r: ((x << r) | (x >> (64 - r))) & _M64  # noqa: E731
            v ^= rot(v, 49) ^ rot(v, 24)
            v = (v * _MX2) & _M64
            v ^= ((v >> 35) + n) & _M64
            v = (v * _MX2) & _M64
            return v ^ (v >> 28)
        if n:
            combined = b[n - 1] | (n << 8) | (b[0] << 16) | (b[n >> 1] << 24)
            v = (int.from_bytes(s[0:4], "little") ^ int.from_bytes(s[4:8], "little")) ^ combined
        else:
            v = _r64(s, 56) ^ _r64(s, 64)
        v ^= v >> 33
        v = (v * _P64_2) & _M64
        v ^= v >> 29
        v = (v * _P64_3) & _M64
        return v ^ (v >> 32)
    if n <= 240:
        b = bytes(p)
        acc = (n * _P64_1) & _M64
        if n <= 128:
            for i in range(((n - 1) >> 5), -1, -1):
                acc += _mix16(b, 16 * i, 32 * i) + _mix16(b, n - 16 * i - 16, 32 * i + 16)
            return _avalanche(acc & _M64)
        for i in range(8):
            acc += _mix16(b, 16 * i, 16 * i)
        acc = _avalanche(acc & _M64)
        for i in range(8, n >> 4):
            acc += _mix16(b, 16 * i, 16 * (i - 8) + 3)
        acc += _mix16(b, n - 16, 119)
        return _avalanche(acc & _M64)
    acc = np.array([_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1], np.uint64)
    windows = np.array([np.frombuffer(s, "<u8", 8, 8 * k) for k in range(16)], np.uint64)
    swap = np.arange(8) ^ 1
    blocks = (n - 1) // 1024
    full = np.frombuffer(p[: blocks * 1024], "<u8").reshape(blocks, 16, 8).astype(np.uint64)
    scramble = np.frombuffer(s, "<u8", 8, 128).astype(np.uint64)
    lo32 = np.uint64(0xFFFFFFFF)
    with np.errstate(over="ignore"):
        for start in range(0, blocks, 4096):  # bounded temporaries
            part = full[start : start + 4096]
            v = part ^ windows[None]
            sums = ((v & lo32) * (v >> np.uint64(32))).sum(axis=1, dtype=np.uint64) + part.sum(
                axis=1, dtype=np.uint64
            )[:, swap]
            for row in sums:
                acc += row
                acc ^= acc >> np.uint64(47)
                acc ^= scramble
                acc *= np.uint64(_P32_1)
        last = bytes(p[blocks * 1024 :])
        stripes = [np.frombuffer(last, "<u8", 8, 64 * k) for k in range((len(last) - 1) // 64)]
        stripes.append(np.frombuffer(bytes(p[n - 64 :]), "<u8"))
        offsets = [8 * k for k in range(len(stripes) - 1)] + [192 - 71]
        for stripe, off in zip(stripes, offsets):
            stripe = stripe.astype(np.uint64)
            v = stripe ^ np.frombuffer(s, "<u8", 8, off).astype(np.uint64)
            acc += stripe[swap]
            acc += (v & lo32) * (v >> np.uint64(32))
    a = [int(x) for x in acc]
    result = (n * _P64_1) & _M64
    for i in range(4):
        result += _fold(a[2 * i] ^ _r64(s, 11 + 16 * i), a[2 * i + 1] ^ _r64(s, 19 + 16 * i))
    return _avalanche(result & _M64)
