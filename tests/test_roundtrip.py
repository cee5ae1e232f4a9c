"""Write then read gives the same values, for every dtype, byte order, shape,
layout, encoding and digest."""
import io

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ztensor
from conftest import asymmetric
from strategies import arrays, checksums, encodings


def same(a, b):
    assert a.shape == b.shape
    assert a.dtype.newbyteorder("=") == b.dtype.newbyteorder("=")
    np.testing.assert_array_equal(a, b)


@given(st.lists(arrays(), min_size=1, max_size=4), encodings, checksums, st.booleans())
def test_roundtrip_any_arrays(tmp_path_factory, arrs, compress, checksum, copy):
    path = tmp_path_factory.mktemp("rt") / "f.zt"
    with ztensor.Writer(path) as w:
        for i, a in enumerate(arrs):
            w.write_numpy(f"t{i}", a, compress=compress, checksum=checksum)
    with ztensor.Reader(path, verify=True) as r:
        assert r.keys() == [f"t{i}" for i in range(len(arrs))] or len(arrs) > 9
        for i, a in enumerate(arrs):
            got = r.read_numpy(f"t{i}", copy=copy)
            same(got, a)
            if copy:
                assert got.flags.writeable and got.dtype.isnative
        assert r.verify() == (len(arrs) if checksum else 0)


@pytest.mark.parametrize("dtype", ["<f4", ">f4", ">i8", ">u2", ">c16", "<c8", ">f2"])
@pytest.mark.parametrize("compress", [False, True])
def test_bytes_on_disk_are_little_endian(tmp_path, dtype, compress):
    arr = asymmetric((3, 5), dtype)
    path = tmp_path / "le.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("x", arr, compress=compress)
    with ztensor.Reader(path) as r:
        comp = r.metadata("x").components["data"]
        stored = path.read_bytes()[comp.offset:comp.offset + comp.length]
    if compress:
        import zstandard
        stored = zstandard.ZstdDecompressor().decompressobj().decompress(stored)
    assert stored == arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def test_large_big_endian_array_is_swapped_in_chunks(tmp_path):
    arr = asymmetric((3_000_000,), ">f8")  # 24 MB: several swap chunks
    with ztensor.Writer(tmp_path / "big.zt") as w:
        w.write_numpy("x", arr, checksum="crc32c")
    with ztensor.Reader(tmp_path / "big.zt", verify=True) as r:
        same(r["x"], arr)


def test_ml_dtypes_roundtrip(tmp_path):
    ml = pytest.importorskip("ml_dtypes")
    arrs = {name: asymmetric((4, 6), np.float32).astype(getattr(ml, name)) / 1000
            for name in ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                         "float8_e5m2fnuz"]}
    with ztensor.Writer(tmp_path / "ml.zt") as w:
        for name, a in arrs.items():
            w.write_numpy(name, a, compress=name.endswith("fnuz"))
    with ztensor.Reader(tmp_path / "ml.zt") as r:
        for name, a in arrs.items():
            got = r[name]
            assert got.dtype == a.dtype
            np.testing.assert_array_equal(got.view(np.uint8), a.view(np.uint8))
        assert r.metadata("bfloat16").storage_dtype == "bf16" and r.metadata("bfloat16").type is None
        assert (r.metadata("float8_e5m2").storage_dtype, r.metadata("float8_e5m2").type) == \
            ("u8", "f8_e5m2")


def test_buffer_sources_read_the_same(tmp_path):
    arr = asymmetric((7, 3), "<i4")
    with ztensor.Writer(tmp_path / "b.zt") as w:
        w.write_numpy("x", arr, compress=True)
        w.write_numpy("y", arr)
    raw = (tmp_path / "b.zt").read_bytes()
    for source in (raw, bytearray(raw), memoryview(raw)):
        with ztensor.Reader(source) as r:
            same(r["x"], arr)
            same(r["y"], arr)
            assert not r["y"].flags.writeable
            assert r.path == "<bytes>"
    with ztensor.Reader(io.BytesIO(raw)) as r:       # a file object: read as needed
        same(r["y"], arr)
        assert r.path == "<file object>"
    with pytest.raises(TypeError):
        ztensor.Reader(12345)
