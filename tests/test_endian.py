"""Byte order, asserted for the host the suite runs on.  On little-endian hosts
these pin the no-swap paths; on s390x (tools/s390x-test.sh) they pin the swaps:
native arrays are swapped on write, reads give the right values, copies are native."""
import struct
import sys

import numpy as np

import ztensor

BIG_HOST = sys.byteorder == "big"
VALUES = [0x01020304, -0x0A0B0C0D, 0x7F6E5D4C]  # no two bytes alike


def stored_bytes(path, name):
    with ztensor.Reader(path) as r:
        c = r.metadata(name).components["data"]
    return path.read_bytes()[c.offset:c.offset + c.length]


def test_native_arrays_reach_disk_little_endian(tmp_path):
    native = np.array(VALUES, dtype=np.int32)            # '>i4' on s390x, '<i4' on x86
    assert native.dtype.isnative
    with ztensor.Writer(tmp_path / "n.zt") as w:
        w.write_numpy("x", native)
        w.write_numpy("h", np.array([1.5, -2.25], dtype=np.float16))
        w.write_numpy("c", np.array([1 + 2j], dtype=np.complex64))
    assert stored_bytes(tmp_path / "n.zt", "x") == struct.pack("<3i", *VALUES)
    assert stored_bytes(tmp_path / "n.zt", "h") == bytes.fromhex("003e80c0")
    assert stored_bytes(tmp_path / "n.zt", "c") == struct.pack("<2f", 1.0, 2.0)


def test_views_keep_disk_order_copies_are_native(tmp_path):
    with ztensor.Writer(tmp_path / "v.zt") as w:
        w.write_numpy("x", np.array(VALUES, dtype=np.int32))
    with ztensor.Reader(tmp_path / "v.zt") as r:
        view = r["x"]
        owned = r.read_numpy("x", copy=True)
    assert view.tolist() == VALUES and owned.tolist() == VALUES
    assert view.dtype == np.dtype("<i4")                  # zero-copy: the bytes on disk
    assert view.dtype.isnative == (not BIG_HOST)
    assert owned.dtype.isnative and owned.dtype == np.dtype("=i4")


def test_big_endian_input_is_swapped_on_any_host(tmp_path):
    with ztensor.Writer(tmp_path / "b.zt") as w:
        w.write_numpy("x", np.array(VALUES, dtype=">i4"), checksum="crc32c")
    assert stored_bytes(tmp_path / "b.zt", "x") == struct.pack("<3i", *VALUES)
    with ztensor.Reader(tmp_path / "b.zt", verify=True) as r:
        assert r["x"].tolist() == VALUES


def test_crc32c_digest_is_host_independent(tmp_path):
    # digest of the little-endian bytes of VALUES, computed once on x86 and fixed here
    with ztensor.Writer(tmp_path / "d.zt") as w:
        w.write_numpy("x", np.array(VALUES, dtype=np.int32), checksum="crc32c")
    with ztensor.Reader(tmp_path / "d.zt") as r:
        digest = r.metadata("x").components["data"].digest
    from ztensor._native import fallback as _fallback
    assert digest == f"crc32c:0x{_fallback.crc32c(struct.pack('<3i', *VALUES)):08X}"
    assert ztensor.kernels.crc32c(struct.pack("<3i", *VALUES)) == \
        _fallback.crc32c(struct.pack("<3i", *VALUES))


def test_gptq_words_decode_from_file_bytes():
    """The worked example's packed word 0x87654321 as the bytes a file holds."""
    words = np.frombuffer(bytes.fromhex("21436587"), dtype="<i4").reshape(1, 1)
    t = ztensor.Tensor({"packed_weight": np.repeat(words, 1, axis=1),
                        "scales": np.array([[1.0]], np.float16)},
                       shape=(1, 8), format="quantized_group",
                       attributes={"bits": 4, "group_size": 8})
    # symmetric: zero point 8, so W = code - 8 for codes 1..8
    assert ztensor.dequantize(t, dtype=np.float32).tolist() == [[-7, -6, -5, -4, -3, -2, -1, 0]]
