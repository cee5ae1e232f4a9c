"""Anything the Writer accepts, the Reader reads back equal; anything the Reader
refuses, the Writer refuses at write() time, without losing what was written
before (hostile input, round two, class 4: one definition of valid)."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ztensor
from ztensor import formats

names = st.text(min_size=1, max_size=12)
attr_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids,
                                                               max_size=3),
    max_leaves=12)
attr_maps = st.dictionaries(st.text(max_size=6), attr_values, max_size=3)


@st.composite
def objects(draw):
    kind = draw(st.sampled_from(["dense", "csr", "coo", "quantized", "custom"]))
    if kind == "dense":
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        dtype = draw(st.sampled_from(["<f4", "<i2", "u1", "?", "<c8", ">f8"]))
        arr = np.arange(math.prod(shape), dtype=np.int64).astype(dtype).reshape(shape)
        return ztensor.Tensor({"data": arr}, attributes=draw(attr_maps))
    if kind in ("csr", "coo"):
        # shapes far beyond memory: sparse objects only hold their non-zeros
        rows, cols = draw(st.integers(1, 10**12)), draw(st.integers(1, 10**12))
        nnz = draw(st.integers(0, 3))
        r = np.sort(np.array([draw(st.integers(0, rows - 1)) for _ in range(nnz)], np.uint64))
        c = np.array([draw(st.integers(0, cols - 1)) for _ in range(nnz)], np.uint64)
        values = np.arange(nnz, dtype=np.float32)
        if kind == "coo":
            return ztensor.Tensor({"values": values, "coords": np.concatenate([r, c])},
                                  shape=(rows, cols), format="sparse_coo")
        if rows > 1000:
            rows = 1000  # CSR stores rows + 1 pointers: keep that small
            r = np.minimum(r, rows - 1)
        indptr = np.searchsorted(r, np.arange(rows + 1), side="left").astype(np.uint64)
        return ztensor.Tensor({"values": values, "indices": c, "indptr": indptr},
                              shape=(rows, cols), format="sparse_csr")
    if kind == "quantized":
        bits = draw(st.sampled_from([2, 4, 8]))
        group = draw(st.sampled_from([1, 16, 32, -1]))
        w = np.linspace(-1, 1, 4 * 32, dtype=np.float32).reshape(4, 32)
        return ztensor.quantize(w, bits=bits, group_size=group if group > 0 else 32)
    return ztensor.Tensor({draw(names): np.arange(draw(st.integers(0, 5)), dtype="<u2")},
                          shape=draw(st.lists(st.integers(0, 2**62), max_size=3)),
                          # a format this version does not know (a known one's name
                          # brings its rules, which these components need not meet)
                          format=draw(st.text(min_size=1, max_size=10).filter(
                              lambda f: f not in formats.HANDLERS)),
                          attributes=draw(attr_maps))


def equal(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(names, objects(), min_size=1, max_size=4), attr_maps,
       st.sampled_from([False, True]))
def test_whatever_the_writer_accepts_the_reader_reads_back(tmp_path, objs, file_attrs,
                                                           compress):
    path = tmp_path / "agree.zt"
    written = objs  # every generated object is valid: a refusal fails the test
    with ztensor.Writer(path, attributes=file_attrs) as w:
        for name, obj in objs.items():
            w.write(name, obj, compress=compress, checksum="crc32c")
    with ztensor.Reader(path, verify=True) as r:
        assert sorted(r.keys()) == sorted(written)
        assert equal(r.attributes, file_attrs)
        for name, obj in written.items():
            back = r.read(name)
            assert back.format == obj.format and back.shape == obj.shape
            assert equal(back.attributes, obj.attributes)
            for role, arr in obj.components.items():
                np.testing.assert_array_equal(np.asarray(back.components[role]).reshape(-1),
                                              np.asarray(arr).reshape(-1))


def test_a_billion_by_billion_sparse_matrix_round_trips(tmp_path):
    coo = ztensor.Tensor({"values": np.array([1.5, -2, 3], np.float32),
                          "coords": np.array([0, 10**9 - 1, 5, 7, 10**9 - 1, 0], np.uint64)},
                         shape=(10**9, 10**9), format="sparse_coo")
    with ztensor.Writer(tmp_path / "s.zt") as w:
        w.write("s", coo)
    with ztensor.Reader(tmp_path / "s.zt") as r:
        back = r.read("s")
        assert back.shape == (10**9, 10**9)
        np.testing.assert_array_equal(back.components["coords"], coo.components["coords"])
        scipy = pytest.importorskip("scipy.sparse")
        m = back.to_scipy()
        assert isinstance(m, scipy.coo_array) and m.nnz == 3 and m.shape == (10**9, 10**9)


def bad(format="dense", shape=(2,), arrays=None, attributes=None, types=None):
    return ztensor.Tensor(arrays or {"data": np.zeros(2, np.float32)}, shape=shape,
                          format=format, attributes=attributes, types=types)


DEEP = [0]
for _ in range(70):
    DEEP = [DEEP]


@pytest.mark.parametrize("call", [
    lambda w: w.write("f", bad(format=None)),
    lambda w: w.write("f", bad(format="")),
    lambda w: w.write("f", bad(shape=(-2,))),
    lambda w: w.write("f", bad(format="custom", shape=(2**63,))),
    lambda w: w.write("f", bad(format="custom", shape=(1,) * 65)),
    lambda w: w.write("f", bad(attributes={"deep": DEEP})),
    lambda w: w.write("f", bad(arrays={"data": np.zeros(3, np.float32)}, shape=(1,),
                               types={"data": "complex64"})),
    lambda w: w.write("f", bad(types={"data": "f8_e4m3fn"})),
    lambda w: w.write("\ud800", bad()),
    lambda w: w.write(7, bad()),
    lambda w: w.write("f", bad(format="custom", arrays={"\udfff": np.zeros(1)})),
    lambda w: w.write("f", bad(format="custom", arrays={3: np.zeros(1)})),
    lambda w: w.write("f", bad(attributes={"k\ud800": 1})),
    lambda w: w.write("f", bad(attributes={"k": {1: 2}})),
    lambda w: w.write("f", bad(attributes={"k": {1, 2}})),
    lambda w: w.write_numpy("f", np.zeros(2), attributes={"when": __import__("datetime").date(
        2026, 1, 1)}),
], ids=["format-None", "format-empty", "negative-dim", "dim-2**63", "rank-65", "depth-70",
        "odd-complex", "fp8-on-f32", "surrogate-name", "int-name", "surrogate-role",
        "int-role", "surrogate-key", "int-key", "set-value", "date-value"])
def test_the_writer_refuses_what_the_reader_would(tmp_path, call, request):
    path = tmp_path / "refused.zt"
    # a name that is no str at all is the caller's TypeError (as in the reference
    # and safetensors); everything else a file could hold is the format's refusal
    int_name = request.node.callspec.id == "int-name"
    with ztensor.Writer(path) as w:
        w.write_numpy("kept", np.arange(3))
        with pytest.raises(TypeError if int_name else ztensor.ZTensorError):
            call(w)
        w.write_numpy("after", np.arange(2))
    with ztensor.Reader(path) as r:  # nothing written before or after is lost
        assert r.keys() == ["after", "kept"] or sorted(r.keys()) == ["after", "kept"]
        assert r["kept"].tolist() == [0, 1, 2]
