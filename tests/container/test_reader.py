"""Reader API: mapping behaviour, metadata, copy semantics, lifetime, errors."""
import gc

import numpy as np
import pytest

import ztensor
from conftest import asymmetric


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.zt"
    arrays = {"b.bias": asymmetric((8,), "<f4"), "a.weight": asymmetric((8, 4), "<f2"),
              "c.scalar": np.array(3.5), "d.zstd": np.arange(100, dtype="<i8") * 3}
    with ztensor.Writer(path, attributes={"framework": "numpy", "n": 4}) as w:
        for name, arr in arrays.items():
            w.write_numpy(name, arr, compress=name == "d.zstd", checksum="sha256",
                          attributes={"role": name.split(".")[1]})
    return path, arrays


def test_mapping_api(model):
    path, arrays = model
    with ztensor.Reader(path) as r:
        assert r.keys() == sorted(arrays)            # manifest order: sorted names
        assert list(r) == r.keys() and len(r) == 4
        assert "a.weight" in r and "nope" not in r and 3 not in r
        assert r.version == "1.2.0"
        assert r.attributes == {"framework": "numpy", "n": 4}
        for name, arr in arrays.items():
            np.testing.assert_array_equal(r[name], arr)
        assert r["c.scalar"].shape == ()


def test_metadata_fields(model):
    path, _ = model
    with ztensor.Reader(path) as r:
        meta = r.metadata("a.weight")
        assert meta.shape == (8, 4) and meta.format == "dense"
        assert meta.dtype == "float16" and meta.storage_dtype == "f16" and meta.type is None
        assert meta.attributes == {"role": "weight"}
        comp = meta.components["data"]
        assert comp.offset % 64 == 0 and comp.length == 64 and comp.encoding == "raw"
        assert comp.uncompressed_length is None and comp.digest.startswith("sha256:")
        z = r.metadata("d.zstd").components["data"]
        assert z.encoding == "zstd" and z.uncompressed_length == 800 and z.length < 800
        assert meta.to_dict()["components"]["data"]["offset"] == comp.offset
        assert r.metadata("c.scalar").shape == ()


def test_missing_object_is_a_key_error_naming_file_and_object(model):
    path, _ = model
    with ztensor.Reader(path) as r:
        with pytest.raises(KeyError) as info:
            r["missing"]
        assert isinstance(info.value, ztensor.ObjectNotFoundError)
        assert str(path) in str(info.value) and "'missing'" in str(info.value)


def test_zero_copy_view_is_read_only_and_copy_is_owned(model):
    path, arrays = model
    with ztensor.Reader(path) as r:
        view = r.read_numpy("a.weight")
        assert not view.flags.writeable and not view.flags.owndata
        owned = r.read_numpy("a.weight", copy=True)
        assert owned.flags.writeable
        owned[0, 0] = 99
        np.testing.assert_array_equal(r["a.weight"], arrays["a.weight"])
        assert r["d.zstd"].flags.writeable        # decoded into a fresh buffer


def test_close_is_idempotent_and_safe_with_live_views(model):
    path, arrays = model
    r = ztensor.Reader(path)
    view = r["a.weight"]
    r.close()
    r.close()
    np.testing.assert_array_equal(view, arrays["a.weight"])  # mapping still alive
    with pytest.raises(ztensor.ZTensorError, match="closed"):
        r["a.weight"]
    del r
    gc.collect()
    np.testing.assert_array_equal(view, arrays["a.weight"])


def test_read_returns_components(model):
    path, arrays = model
    with ztensor.Reader(path) as r:
        t = r.read("a.weight")
        assert isinstance(t, ztensor.Tensor) and t.format == "dense"
        np.testing.assert_array_equal(t.numpy(), arrays["a.weight"])
        assert t.attributes == {"role": "weight"}


def test_non_dense_read_numpy_points_to_read(tmp_path):
    t = ztensor.Tensor({"values": np.ones(2, np.float32), "indices": np.array([0, 1]),
                        "indptr": np.array([0, 1, 2])}, shape=(2, 2), format="sparse_csr")
    with ztensor.Writer(tmp_path / "s.zt") as w:
        w.write("s", t)
    with ztensor.Reader(tmp_path / "s.zt") as r:
        with pytest.raises(ztensor.UnsupportedError, match="use read"):
            r.read_numpy("s")
        got = r.read("s")
        assert got.components["indices"].dtype == np.dtype("<u8")  # written as u64
        assert got.format == "sparse_csr" and got.shape == (2, 2)


def test_unknown_format_and_type_are_kept(tmp_path):
    t = ztensor.Tensor({"blocks": np.arange(4, dtype=np.uint8)}, shape=(8,), format="my_q4",
                       types={"blocks": "q4_custom"}, attributes={"k": [1, 2]})
    with ztensor.Writer(tmp_path / "u.zt") as w:
        w.write("u", t)
    with ztensor.Reader(tmp_path / "u.zt") as r:
        got = r.read("u")
        assert got.format == "my_q4" and got.types == {"blocks": "q4_custom"}
        np.testing.assert_array_equal(got.components["blocks"], np.arange(4))


def test_verify_on_read_catches_a_flipped_byte(model):
    path, _ = model
    with ztensor.Reader(path) as r:
        comp = r.metadata("b.bias").components["data"]
    data = bytearray(path.read_bytes())
    data[comp.offset + 3] ^= 0x10
    with ztensor.Reader(bytes(data)) as r:
        r["b.bias"]                                       # no verify: reads
        with pytest.raises(ztensor.ChecksumError, match="sha256 mismatch"):
            r.verify()
    with ztensor.Reader(bytes(data), verify=True) as r:
        r["a.weight"]
        with pytest.raises(ztensor.ChecksumError) as info:
            r["b.bias"]
        assert "'b.bias'" in str(info.value) and "'data'" in str(info.value)


def test_missing_path_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        ztensor.Reader(tmp_path / "nope.zt")


def test_limits_can_be_lowered_and_raised(model):
    path, _ = model
    with pytest.raises(ztensor.LimitError, match="per-component limit of 100"):
        ztensor.Reader(path, limits=ztensor.Limits(max_component_size=100))
    with pytest.raises(ztensor.LimitError, match="4 objects exceed the limit of 3"):
        ztensor.Reader(path, limits=ztensor.Limits(max_objects=3))
    with pytest.raises(ztensor.LimitError, match="rank 2 exceeds the limit of 1"):
        ztensor.Reader(path, limits=ztensor.DEFAULT_LIMITS.with_(max_rank=1))
    with pytest.raises(ztensor.LimitError, match="manifest"):
        ztensor.Reader(path, limits=ztensor.Limits(max_manifest_size=10))
    ztensor.Reader(path, limits=ztensor.Limits(max_manifest_size=1 << 40)).close()


def test_empty_file_has_no_objects(tmp_path):
    with ztensor.Writer(tmp_path / "e.zt"):
        pass
    assert (tmp_path / "e.zt").stat().st_size == 48   # as the reference writes it
    with ztensor.Reader(tmp_path / "e.zt") as r:
        assert len(r) == 0 and r.keys() == [] and r.verify() == 0


def test_reference_style_calls(model, tmp_path):
    path, arrays = model
    with ztensor.Reader(path) as r:
        many = r.read_numpy(["a.weight", "b.bias"], copy=True)
        assert set(many) == {"a.weight", "b.bias"}
        np.testing.assert_array_equal(many["b.bias"], arrays["b.bias"])
        assert set(r.read(["c.scalar"])) == {"c.scalar"}
    t = ztensor.Tensor({"data": np.array([0x38, 0x40], np.uint8)}, type="f8_e4m3fn")
    assert t.types == {"data": "f8_e4m3fn"}
    w = ztensor.Writer(tmp_path / "f.zt")
    w.write("f8", t)
    w.finish()
    with ztensor.Reader(tmp_path / "f.zt") as r:
        assert r.read_numpy("f8", dtype=np.float32).tolist() == [1.0, 2.0]


def test_zero_copy_views_agree_with_the_general_path(tmp_path):
    # read_numpy(name)'s hot path slices the mapping typed per dtype; every kind of
    # object must come back as the general path (verify=True takes it) gives it.
    # Views keep the file's byte order (little-endian; native copies): the dtypes
    # agree up to that
    path = tmp_path / "mixed.zt"
    arrays = {"rank0": np.array(2.5, "<f8"), "empty": np.zeros((0, 3), "<f4"),
              "vec": asymmetric((7,), "<f4"), "mat": asymmetric((3, 5), "<i2"),
              "cube": asymmetric((2, 3, 4), "<u1"), "cplx": (asymmetric((4,), "<f4")
                                                          + 1j).astype("<c8"),
              "flags": np.array([True, False, True]), "z": np.arange(9, dtype="<i4")}
    with ztensor.Writer(path) as w:
        for name, arr in arrays.items():
            w.write_numpy(name, arr, compress=name == "z")
        w.write_numpy("bf", asymmetric((6,), "<f4"), type="bf16")
    with ztensor.Reader(path, verify=True) as general:
        want = {n: general.read_numpy(n, copy=True) for n in general.keys()}
    for cow in (False, True):
        with ztensor.Reader(path, copy_on_write=cow) as r:
            for name in r.keys():
                got = r.read_numpy(name)
                assert got.shape == want[name].shape, name
                assert got.dtype.newbyteorder("=") == want[name].dtype.newbyteorder("="), name
                np.testing.assert_array_equal(got, want[name])
                if name not in ("z", "bf"):  # raw: a view of the mapping
                    assert got.flags.writeable == cow and not got.flags.owndata, name
                    assert got.base is not None
                    assert got.size == 0 or np.shares_memory(got, r.read_numpy(name)), name
        with pytest.raises(ztensor.ZTensorError, match="closed"):
            r.read_numpy("vec")
    with ztensor.Reader(path, mmap=False) as r:  # unmapped: owned reads, same values
        np.testing.assert_array_equal(r.read_numpy("mat"), arrays["mat"])
