"""Live interoperability with the reference implementation (PyPI ztensor 1.2.3,
1.1.1, 0.1.4), each installed in its own folder and run in a subprocess.

These need PyPI (first run) and x86-64/aarch64 wheels; the emulated s390x run
deselects them with ``-m "not reference"``.
"""
import numpy as np
import pytest

import ztensor
from conftest import asymmetric
from reference import run

pytestmark = pytest.mark.reference

DENSE = {
    "f32": asymmetric((3, 4), "<f4"), "f64_be": asymmetric((5,), ">f8"),
    "f16": asymmetric((2, 2, 2), "<f2"), "i64": asymmetric((40,), "<i8"),
    "i32_strided": asymmetric((6, 6), "<i4")[::2, 1::2], "i16": asymmetric((3,), ">i2"),
    "i8": asymmetric((9,), "i1"), "u64": asymmetric((2,), "<u8"), "u32": asymmetric((4,), "<u4"),
    "u16": asymmetric((4,), "<u2"), "u8": asymmetric((10,), "u1"), "bool": asymmetric((7,), "?"),
    "empty": np.zeros((0, 4), np.float32), "scalar": np.array(7.25),
}


def write_ours(path):
    with ztensor.Writer(path, attributes={"source": "ours"}) as w:
        for i, (name, arr) in enumerate(DENSE.items()):
            w.write_numpy(name, arr, compress=(i % 3 == 1), checksum=[None, "crc32c", "sha256"][i % 3])
        w.write("csr", ztensor.Tensor({"values": np.array([1.5, 2.5], np.float32),
                                       "indices": np.array([1, 0]), "indptr": np.array([0, 1, 2])},
                                      shape=(2, 3), format="sparse_csr"))
        w.write("fp8", ztensor.Tensor({"data": np.array([0x38, 0x40, 0x7E], np.uint8)},
                                      types={"data": "f8_e4m3fn"}))
        # over FRAME_BYTES: zstd frames plus a seek table in a skippable frame
        w.write_numpy("framed", FRAMED, compress=True, checksum="crc32c")


FRAMED = asymmetric((700, 1000), "<f4", seed=9)  # 2.8 MB: three frames


@pytest.mark.parametrize("version", ["1.2.3", "1.1.1"])
def test_reference_reads_our_files(tmp_path, version):
    write_ours(tmp_path / "ours.zt")
    reply = run(version, "read", {"path": str(tmp_path / "ours.zt"), "out": str(tmp_path / "o.npz")},
                tmp_path)
    got = np.load(tmp_path / "o.npz")
    for name, arr in DENSE.items():
        if version == "1.1.1" and name == "empty":
            continue
        theirs = got[f"{name}/data"]
        np.testing.assert_array_equal(theirs.reshape(-1), arr.reshape(-1))
        assert theirs.dtype.newbyteorder("=") == arr.dtype.newbyteorder("=")
        want_shape = list(arr.shape) if arr.shape else [1]  # the reference reshapes [] to [1]
        assert reply["objects"][name]["shape"] in (list(arr.shape), want_shape)
    np.testing.assert_array_equal(got["framed/data"].reshape(FRAMED.shape), FRAMED)
    if version == "1.2.3":
        np.testing.assert_array_equal(got["csr/indices"], [1, 0])
        np.testing.assert_array_equal(got["fp8/data"], [0x38, 0x40, 0x7E])
        assert reply["objects"]["csr"]["format"] == "sparse_csr"


@pytest.mark.parametrize("version", ["1.2.3", "1.1.1", "0.1.4"])
def test_we_read_fresh_reference_files(tmp_path, version):
    arrays = {"w": asymmetric((17, 5), "<f4", seed=3), "b": asymmetric((33,), "<i8", seed=4),
              "h": asymmetric((8,), "<f2", seed=5)}
    objects = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
        opts = {"compress": True} if name == "b" and version != "0.1.4" else {}
        if version == "1.2.3" and name == "h":
            opts["checksum"] = "sha256"
        objects.append({"name": name, "kind": "dense", "arrays": {"data": str(tmp_path / f"{name}.npy")},
                        **opts})
    run(version, "write", {"path": str(tmp_path / "ref.zt"), "objects": objects}, tmp_path)
    with ztensor.Reader(tmp_path / "ref.zt", verify=True) as r:
        assert sorted(r.keys()) == sorted(arrays)
        for name, arr in arrays.items():
            np.testing.assert_array_equal(r[name], arr)
        assert r.verify() == (1 if version == "1.2.3" else 0)
