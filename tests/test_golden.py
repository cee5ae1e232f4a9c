"""Files real users have: written by the reference implementation (1.2.3, 1.1.1,
0.1.4) and hand-encoded v0.1 features; compared value by value to the inputs."""
import json
from pathlib import Path

import numpy as np
import pytest

import ztensor

DATA = Path(__file__).parent / "data"
FOLDERS = ["ref-2.1.2", "ref-1.2.3", "ref-1.1.1", "ref-0.1.4", "v0.1-handmade"]


def golden_objects():
    for folder in FOLDERS:
        meta = json.loads((DATA / folder / "expected.json").read_text())
        for file, objects in meta.items():
            for name, info in objects.items():
                yield pytest.param(folder, file, name, info, id=f"{folder}/{file}/{name}")


@pytest.fixture(scope="module")
def expected():
    cache = {}

    def get(folder):
        if folder not in cache:
            with np.load(DATA / folder / "expected.npz") as npz:
                cache[folder] = dict(npz)
        return cache[folder]
    return get


@pytest.mark.parametrize("folder,file,name,info", list(golden_objects()))
def test_golden_object_reads_exactly(folder, file, name, info, expected):
    want = {k.split("/")[-1]: v for k, v in expected(folder).items()
            if k.startswith(f"{file}/{name}/")}
    with ztensor.Reader(DATA / folder / file, verify=True) as reader:
        obj = reader.read(name)
        assert obj.format == info["format"]
        assert list(obj.shape) == info["shape"]
        assert set(obj.components) == set(want)
        for role, arr in want.items():
            got = obj.components[role]
            if got.dtype.name == "bfloat16":
                got = got.view(np.uint16)
            if got.dtype.kind == "c":  # compare the stored float pairs, any host order
                got = np.stack([got.real, got.imag], axis=-1).reshape(-1)
            if got.dtype.kind == "V" or got.dtype.name.startswith("float8"):
                got = got.view(np.uint8)
            np.testing.assert_array_equal(got.reshape(arr.shape), arr, strict=False)
            assert got.dtype.newbyteorder("=") == arr.dtype.newbyteorder("=") or \
                arr.dtype.kind == got.dtype.kind


@pytest.mark.parametrize("folder", FOLDERS)
def test_golden_files_list_and_verify(folder):
    meta = json.loads((DATA / folder / "expected.json").read_text())
    for file, objects in meta.items():
        with ztensor.Reader(DATA / folder / file) as reader:
            assert sorted(reader.keys()) == sorted(objects)
            reader.verify()


def test_versions_are_reported():
    versions = {}
    for folder in FOLDERS:
        for path in (DATA / folder).glob("*.zt"):
            with ztensor.Reader(path) as r:
                versions.setdefault(folder, set()).add(r.version)
    assert versions == {"ref-2.1.2": {"2.0"}, "ref-1.2.3": {"1.2.0"}, "ref-1.1.1": {"1.1.0"},
                        "ref-0.1.4": {"0.1.0"}, "v0.1-handmade": {"0.1.0"}}


def test_reference_wrote_digests_and_we_check_them():
    with ztensor.Reader(DATA / "ref-1.2.3" / "dense.zt") as r:
        digests = {n: r.metadata(n).components["data"].digest for n in r}
        assert digests["i64"].startswith("crc32c:0x")
        assert digests["f16"].startswith("sha256:")
        assert r.verify() == 4


def test_v01_big_endian_blob_gives_native_values():
    with ztensor.Reader(DATA / "v0.1-handmade" / "features.zt") as r:
        view = r.read_numpy("big_f32")
        assert view.dtype == np.dtype(">f4")           # zero-copy view keeps disk order
        owned = r.read_numpy("big_f32", copy=True)
        assert owned.dtype.isnative and owned.flags.writeable
        np.testing.assert_array_equal(owned, view)
        assert r.metadata("little_i16").attributes == {"note": "custom key"}


def test_fp8_and_complex_values_from_reference_file():
    with ztensor.Reader(DATA / "ref-1.2.3" / "types.zt") as r:
        values = r.read_numpy("fp8", dtype=np.float32)
        assert values[:4].tolist() == [0.0, 2.0 ** -9, 1.0, 448.0]
        assert np.isnan(values[7])
        c = r.read_numpy("complex")
        assert c.tolist() == [1.5 - 2.0j, 0.25 + 8.0j]
