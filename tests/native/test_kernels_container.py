"""The container's compiled kernels against known answers and the numpy fallback."""
import os
import socket
import struct
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from backends import PARAMS
from ztensor import kernels
from ztensor._native import fallback as _fallback

IMPLS = PARAMS


# ------------------------------------------------------------------ crc32c
# RFC 3720 (iSCSI) appendix B.4 test vectors, plus the standard check value.
CRC_VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"", 0),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("data,want", CRC_VECTORS)
def test_crc32c_known_vectors(impl, data, want):
    assert impl.crc32c(data) == want


@given(st.binary(max_size=30000), st.integers(0, 64))
def test_crc32c_c_matches_portable_and_chains(data, cut):
    cut = min(cut, len(data))
    whole = kernels.crc32c(data)
    assert whole == kernels.crc32c_portable(data) == _fallback.crc32c(data)
    assert kernels.crc32c(data[cut:], kernels.crc32c(data[:cut])) == whole


def test_crc32c_long_unaligned_buffers_take_the_striped_path():
    data = np.random.default_rng(1).integers(0, 256, 3 * 4096 * 3 + 77, np.uint8)
    for start in range(9):
        view = data[start:]
        assert kernels.crc32c(view) == kernels.crc32c_portable(view)


# ------------------------------------------------------------------ byte swap
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("width,fmt", [(2, "H"), (4, "I"), (8, "Q")])
def test_bswap_known_bytes(impl, width, fmt):
    values = [0x0102030405060708 & ((1 << (8 * width)) - 1), 0xA1B2C3D4E5F60718 >> (64 - 8 * width)]
    src = struct.pack("<" + fmt * 2, *values)
    dst = bytearray(len(src))
    impl.bswap(src, dst, width)
    assert bytes(dst) == struct.pack(">" + fmt * 2, *values)


@given(st.sampled_from([1, 2, 4, 8]), st.integers(0, 600), st.integers(0, 7))
def test_bswap_matches_numpy_at_any_alignment(width, count, shift):
    raw = np.random.default_rng(count).integers(0, 256, count * width + shift, np.uint8)
    src = raw[shift:]
    dtype = np.dtype(f"<u{width}")
    dst = np.empty(count * width, np.uint8)
    kernels.bswap(src, dst, width)
    np.testing.assert_array_equal(dst.view(dtype), src.view(dtype).byteswap())


@pytest.mark.parametrize("impl", IMPLS)
def test_bswap_in_place_and_bad_sizes(impl):
    buf = np.arange(8, dtype="<u4")
    view = buf.view(np.uint8)
    impl.bswap(view, view, 4)
    np.testing.assert_array_equal(buf, np.arange(8, dtype=">u4").view("<u4"))
    with pytest.raises(ValueError):
        impl.bswap(bytes(6), bytearray(6), 4)
    with pytest.raises(ValueError):
        impl.bswap(bytes(8), bytearray(4), 2)


# ------------------------------------------------------------------ footer
def v1_file(manifest: bytes, blobs: bytes = b""):
    return b"ZTEN1000" + blobs + manifest + struct.pack("<Q", len(manifest)) + b"ZTEN1000"


def parse(impl, data, limit=1 << 30):
    return impl.footer_parse(data[:8], data[-16:], len(data), limit)


@pytest.mark.parametrize("impl", IMPLS)
def test_footer_locates_manifest(impl):
    data = v1_file(b"M" * 24, bytes(56))
    assert parse(impl, data) == (1, 64, 24)
    v0 = b"ZTEN0001" + bytes(56) + b"\x80" + struct.pack("<Q", 1)
    assert parse(impl, v0) == (0, 64, 1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("data,error,words", [
    (b"", ztensor.FormatError, "truncated"),
    (b"ZTEN100", ztensor.FormatError, "truncated"),
    (b"ZTEN1000" + bytes(15), ztensor.FormatError, "truncated"),
    (b"NOTAZTEN" + bytes(16), ztensor.FormatError, "magic"),
    (b"ZTEN1000" + bytes(8) + b"ZTEN1001", ztensor.FormatError, "footer magic"),
    (b"ZTEN1000" + struct.pack("<Q", 9) + b"ZTEN1000", ztensor.FormatError, "larger than the file"),
    (b"ZTEN1000" + struct.pack("<Q", 2**64 - 1) + b"ZTEN1000", ztensor.LimitError, "limit"),
    (b"ZTEN0001" + struct.pack("<Q", 1), ztensor.FormatError, "larger than the file"),
])
def test_footer_rejects(impl, data, error, words):
    with pytest.raises(error, match=words):
        parse(impl, data)


@given(st.binary(max_size=64), st.integers(0, 2**64 - 1), st.integers(0, 40))
def test_footer_c_and_fallback_agree(prefix, size, limit_shift):
    data = b"ZTEN1000" + prefix + struct.pack("<Q", size) + b"ZTEN1000"
    results = []
    for impl in [p.values[0] for p in IMPLS]:
        try:
            results.append(parse(impl, data, 1 << limit_shift))
        except ztensor.ZTensorError as exc:
            results.append((type(exc), exc.message))
    assert all(r == results[0] for r in results)


# ------------------------------------------------------------------ blob writer
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("capacity", [64, 1 << 20])
def test_blob_writer_pads_with_zeros_and_tracks_position(impl, tmp_path, capacity):
    path = tmp_path / "blobs"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        bw = impl.BlobWriter(fd, 0, capacity)
        bw.write(b"ZTEN1000")
        bw.pad(64)
        assert bw.pos == 64
        bw.write(b"\x01\x02\x03")
        bw.pad(64)
        bw.pad(64)  # already aligned: no-op
        big = bytes(range(256)) * 40
        bw.write(big)
        bw.pad(64)
        bw.write(b"")
        assert bw.pos == 128 + len(big) + (-len(big) % 64)
        bw.flush()
        bw.close()
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data[:8] == b"ZTEN1000" and data[8:64] == bytes(56)
    assert data[64:67] == b"\x01\x02\x03" and data[67:128] == bytes(61)
    assert data[128:128 + len(big)] == big and len(data) == 128 + len(big) + (-len(big) % 64)


def _extent(capacity):
    extent = 2 << 20  # csrc/blobwrite.h ZT_BW_EXTENT
    while extent > capacity // 2:
        extent //= 2
    return extent


@pytest.mark.skipif(not hasattr(socket, "SOCK_SEQPACKET") or sys.platform != "linux",
                    reason="write(2) boundaries are observed through a SOCK_SEQPACKET pair")
@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=60, deadline=None)
@given(capacity=st.sampled_from([64, 100, 256, 1000, 4096]),
       ops=st.lists(st.one_of(st.integers(0, 9000).map(lambda n: ("write", n)),
                              st.sampled_from([("pad", 64), ("pad", 32), ("pad", 1)])),
                    max_size=12))
def test_blob_writer_writes_end_on_extent_boundaries(impl, capacity, ops):
    """Every write(2) but the last ends on an extent boundary and the ones longer
    than the buffer start on one (so the page cache makes whole huge folios), and
    the bytes are exactly what was written and padded."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    messages, expected = [], bytearray()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        bw = impl.BlobWriter(ours.fileno(), 0, capacity)
        rng = np.random.default_rng(len(ops))
        for kind, n in ops:
            if kind == "write":
                data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                bw.write(data)
                expected += data
            else:
                bw.pad(n)
                expected += bytes(-len(expected) % n)
            assert bw.pos == len(expected)
        bw.flush()
        bw.close()
        ours.shutdown(socket.SHUT_WR)
        while True:
            message = theirs.recv(1 << 20)
            if not message:
                break
            messages.append(message)
    assert b"".join(messages) == bytes(expected)
    extent, pos = _extent(capacity), 0
    for i, message in enumerate(messages):
        if len(message) >= capacity:
            assert pos % extent == 0, (i, pos, len(message))
        pos += len(message)
        if i < len(messages) - 1:
            assert pos % extent == 0, (i, pos)


@pytest.mark.skipif(not hasattr(socket, "SOCK_SEQPACKET") or sys.platform != "linux",
                    reason="write(2) boundaries are observed through a SOCK_SEQPACKET pair")
@pytest.mark.parametrize("impl", IMPLS)
def test_blob_writer_hands_a_large_blob_over_without_copying_it(impl):
    """A blob much larger than the buffer goes to write(2) from the caller's memory
    from the first extent boundary on: after a small blob, the buffer is handed over
    at the boundary and the rest goes direct (it was refilled instead, and every
    byte of every large blob was copied through the buffer, in buffer-sized writes:
    a third of a 512 MB write's time)."""
    capacity = 4096
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        bw = impl.BlobWriter(ours.fileno(), 0, capacity)
        bw.write(b"ZTEN1000")
        bw.pad(64)
        bw.write(bytes(range(256)) * 400)  # 102,400 bytes
        bw.flush()
        bw.close()
        ours.shutdown(socket.SHUT_WR)
        sizes = []
        while True:
            message = theirs.recv(1 << 20)
            if not message:
                break
            sizes.append(len(message))
    assert sum(sizes) == 64 + 102_400
    extent = _extent(capacity)
    # one buffer up to the boundary, one direct write of whole extents, the tail
    assert sizes[0] == capacity and sizes[1] == (64 + 102_400 - capacity) // extent * extent
    assert len(sizes) == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_blob_writer_reports_write_failure(impl, tmp_path):
    path = tmp_path / "ro"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # write(2) fails with EBADF
    try:
        bw = impl.BlobWriter(fd, 0, 64, path=str(path))
        with pytest.raises(ztensor.WriteError) as info:
            bw.write(bytes(1000))
            bw.flush()
        assert info.value.errno is not None and str(path) in str(info.value)
    finally:
        os.close(fd)


def test_crc_hardware_is_used_on_x86_64():
    import platform
    if kernels.backend == "c" and platform.machine() in ("x86_64", "AMD64"):
        assert kernels.crc32c_hardware()
