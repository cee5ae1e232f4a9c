"""The one dtype table (ztensor/dtypes.py ROWS) against the libraries whose names it
holds (numpy, ml_dtypes, torch, safetensors, gguf), and the tables elsewhere
against it: each is the table itself or derived from it, never a second copy."""
import importlib
import json
import pathlib
import re
import struct

import numpy as np
import pytest

from ztensor import dtypes, spec

ROWS = dtypes.ROWS
PACKAGE = pathlib.Path(dtypes.__file__).parent


def test_rows_are_unique_in_every_name():
    for field in ("spec", "ml_dtypes", "torch", "safetensors", "reference"):
        names = [getattr(r, field) for r in ROWS if getattr(r, field)]
        assert len(names) == len(set(names)), field
    ids = [r.gguf for r in ROWS if r.gguf >= 0]
    assert len(ids) == len(set(ids))


def test_storage_order_is_the_scanner_vocabulary():
    # manifest_table's DTYPE_WORDS / TYPE_WORDS index these dicts: storage rows first
    assert list(dtypes.STORAGE) == ["f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8",
                                    "u64", "u32", "u16", "u8", "bool"]
    assert list(dtypes.LOGICAL) == ["f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz",
                                    "complex64", "complex128"]


def test_numpy_and_reference_names():
    for row in ROWS:
        dt = np.dtype(row.numpy)
        assert row.numpy.startswith("<") or dt.itemsize == 1, row.spec  # little-endian
        if not row.bits:
            assert dtypes.spec_types_for(dt.newbyteorder("=")) == (
                row.storage, None if row.storage == row.spec else row.spec)
            if row.reference:
                assert dt.name == row.reference
    assert dtypes.V01_DTYPES == {v: k for k, v in dtypes.REFERENCE_NAMES.items()}


def test_ml_dtypes_names():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for row in ROWS:
        if row.ml_dtypes:
            dt = np.dtype(getattr(ml_dtypes, row.ml_dtypes))
            assert dt.itemsize == np.dtype(row.numpy).itemsize
            assert dtypes.spec_types_for(dt) == (
                row.storage, None if row.storage == row.spec else row.spec)
            assert dtypes.BITS_DTYPES[row.spec].itemsize == dt.itemsize


def test_torch_names():
    torch = pytest.importorskip("torch")
    for row in ROWS:
        if not row.torch:
            continue
        dtype = getattr(torch, row.torch)
        assert torch.empty(0, dtype=dtype).element_size() == np.dtype(row.numpy).itemsize
        if not row.bits:  # numpy holds it: torch agrees on which dtype that is
            assert torch.from_numpy(np.zeros(1, row.numpy).astype(
                np.dtype(row.numpy).newbyteorder("="))).dtype == dtype


def test_safetensors_names():
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    for row in ROWS:
        try:
            blob = st.save({"x": torch.zeros(2, dtype=getattr(torch, row.torch))})
        except Exception:  # a dtype this safetensors cannot write (complex128)
            assert not row.safetensors_file, row.spec
            continue
        size = struct.unpack("<Q", blob[:8])[0]
        assert json.loads(blob[8:8 + size])["x"]["dtype"] == row.safetensors, row.spec
    assert set(dtypes.SAFETENSORS_STORAGE) <= set(dtypes.SAFETENSORS_NAMES.values())


def test_gguf_types():
    gguf = pytest.importorskip("gguf")
    for gtype, (name, per, nbytes, code) in dtypes.GGML_TYPES.items():
        kind = gguf.GGMLQuantizationType(gtype)
        assert kind.name == name
        assert gguf.GGML_QUANT_SIZES[kind] == (per, nbytes)
        if code is not None:
            assert np.dtype(code).itemsize == nbytes
    for row in ROWS:
        if row.gguf >= 0:
            assert dtypes.GGML_TYPES[row.gguf][3] == row.numpy == dtypes.GGUF_NUMPY[row.spec]


def test_copies_elsewhere_are_the_table():
    from ztensor import kernels
    from ztensor._native import contract as _contract
    # modules by path: the package exports functions of the same names
    gguf, into, serialize, pytorch = (importlib.import_module(f"ztensor.{name}") for name in
                                      ("foreign.gguf_file", "container.into", "serialize",
                                       "foreign.pytorch"))
    assert serialize._TORCH_NAMES is dtypes.TORCH_KINDS
    assert serialize._NAME_OF is dtypes.ML_NAMES
    assert into._ML_NAMES is dtypes.ML_NAMES and into._BITS is dtypes.BITS_DTYPES
    assert gguf.GGML_TYPES is dtypes.GGML_TYPES
    assert kernels.FP8_KINDS is _contract.FP8_KINDS is dtypes.FP8_TYPES
    assert {k: v for k, v in pytorch._DTYPES.items() if k in dtypes.TORCH_KINDS} \
        == dtypes.TORCH_KINDS
    assert all(v in dtypes.TORCH_KINDS.values() for v in pytorch._DTYPES.values())
    assert set(_contract.GGML_BLOCKS) <= set(dtypes.GGML_TYPES)


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_magic_bytes_are_spelled_only_in_spec():
    spelled = re.compile(r'b"(ZTEN|GGUF|PK\\x0[35]|\\x93NUMPY|\\x89HDF|\\x89ZT2)')
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in _sources() if p.name != "spec.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert found == []
    assert set(spec.MAGICS.values()) >= {spec.MAGIC_V1, spec.MAGIC_V0, spec.MAGIC_V2}


def test_thread_count_is_asked_in_one_place():
    found = [str(p.relative_to(PACKAGE)) for p in _sources()
             if re.search(r"cpu_count\(|sched_getaffinity\(", p.read_text())]
    assert found == ["kernels.py"]


def test_rank_ceiling_is_one_constant():
    from ztensor.container import v2
    assert spec.Limits().max_rank == spec.MAX_RANK == v2.MAX_RANK
