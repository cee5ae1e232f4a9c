"""Issue 21, class 3 (silent loss and wrong values): a ``bool`` byte is 0x00 or 0x01.

Every zTensor spec version says so (v1.2 and v1.1: "1 byte, 0x00 false, 0x01 true";
v0.1 stores numpy's bool bytes).  A numpy bool array holding another byte (0x02,
0xff) has undefined behaviour: ``a == True``, ``a.view(np.uint8)``,
``np.array_equal`` and torch's ``sum`` disagree about it.  So:

* reading: a ``.zt`` (v0.1, v1.1, v1.2) bool component holding another byte is a
  FormatError naming the file and the object, on every read path, and ``verify``
  reports it (the one rule: ``io/values.check_bools``, through ``as_elements``; the
  fast paths decline bool objects, and the general path still hands out views);
* writing: the writer never stores such a byte; bool values are written as
  ``value != 0`` (``io/values.clean_bools``), whatever path they come by (numpy,
  torch, Tensor, streams, serialize, convert from safetensors, npy or torch.save
  files whose bool bytes are 2);
* other formats' bool bytes (safetensors, npy, ...) are read as ``!= 0`` too: those
  formats store a framework's memory and say nothing of the bytes.
"""
import contextlib
import io
import os
import shutil
import struct

import cbor2
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings, strategies as st

import ztensor
import ztensor.numpy
from conftest import DATA
from ztensor.safe import safe_open
from ztensor.tools import cli, stats
from ztensor.tools.convert import convert

torch = pytest.importorskip("torch")
import ztensor.torch  # noqa: E402 - after torch is known to be there

MESSAGE = "a bool element holds a byte other than 0 or 1"
BAD = np.array([0, 1, 2, 0xFF, 1, 0], np.uint8)  # what a view-made bool array holds


def _raw_bool(values=BAD):
    """A numpy bool array whose bytes are ``values``, made as numpy lets one be made."""
    return np.asarray(values, np.uint8).view(np.bool_)


# ------------------------------------------------------------------ crafted files
def _patch(path, name, payload):
    """Overwrite object ``name``'s raw data bytes in ``path`` with ``payload``."""
    with ztensor.Reader(path) as r:
        comp = r.metadata(name).components["data"]
        assert comp.encoding == "raw" and comp.length == len(payload)
        offset = comp.offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(payload)


def v12_file(tmp_path, payload=BAD.tobytes()):
    """A v1.2 file from ztensor.Writer: bool object 'mask' (bytes patched to
    ``payload``) beside a float object 'w'."""
    path = tmp_path / "v12.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("mask", np.zeros(len(payload), np.bool_).reshape(2, -1))
        w.write_numpy("w", np.arange(6, dtype=np.float32))
    _patch(path, "mask", payload)
    return path


def v12_zstd_file(tmp_path, payload=BAD.tobytes()):
    """A v1.2 file whose bool object is zstd-compressed (the stream decodes to 2s)."""
    blob = zstandard.ZstdCompressor().compress(payload)
    body = b"ZTEN1000"
    body += bytes(-len(body) % 64)
    offset = len(body)
    body += blob
    manifest = {"version": "1.2.0", "objects": {"mask": {
        "shape": [2, len(payload) // 2], "format": "dense",
        "components": {"data": {"dtype": "bool", "offset": offset, "length": len(blob),
                                "encoding": "zstd", "uncompressed_length": len(payload)}}}}}
    raw = cbor2.dumps(manifest)
    path = tmp_path / "v12z.zt"
    path.write_bytes(body + raw + struct.pack("<Q", len(raw)) + b"ZTEN1000")
    return path


def golden_file(tmp_path, version):
    """The reference implementation's own file (0.1.4 or 1.1.1) with its 'bool'
    object's bytes patched: 2 where a true was, 0xff where the last false was."""
    path = tmp_path / f"ref-{version}.zt"
    shutil.copy(DATA / f"ref-{version}" / "dense.zt", path)
    with ztensor.Reader(str(path)) as r:
        good = r.read_numpy("bool", copy=True).view(np.uint8)
    bad = np.where(good == 1, 2, good).astype(np.uint8)
    bad[np.flatnonzero(good == 0)[-1]] = 0xFF
    _patch(path, "bool", bad.tobytes())
    return path


def v01_sparse_file(tmp_path):
    """A v0.1 one-blob CSR object of bool values (indptr, indices, values), one of
    whose values is byte 2."""
    indptr = np.array([0, 1, 3], "<u8")
    indices = np.array([2, 0, 1], "<u8")
    values = np.array([1, 2, 1], np.uint8)
    blob = indptr.tobytes() + indices.tobytes() + values.tobytes()
    out = bytearray(b"ZTEN0001")
    out += bytes(-len(out) % 64)
    entry = {"name": "mask", "offset": len(out), "size": len(blob), "dtype": "bool",
             "shape": [2, 3], "layout": "sparsecsr", "encoding": "raw"}
    out += blob
    meta = cbor2.dumps([entry])
    path = tmp_path / "v01sparse.zt"
    path.write_bytes(bytes(out + meta + struct.pack("<Q", len(meta))))
    return path


@pytest.fixture(params=["v1.2", "v1.2-zstd", "v1.1", "v0.1"])
def bad_file(request, tmp_path):
    """(path, name of the bool object whose bytes are not 0/1)."""
    if request.param == "v1.2":
        return v12_file(tmp_path), "mask"
    if request.param == "v1.2-zstd":
        return v12_zstd_file(tmp_path), "mask"
    return golden_file(tmp_path, {"v1.1": "1.1.1", "v0.1": "0.1.4"}[request.param]), "bool"


def refuses(fn, path, name):
    with pytest.raises(ztensor.FormatError) as info:
        fn()
    exc = info.value
    assert MESSAGE in str(exc)
    assert exc.obj == name
    assert os.fspath(exc.path) == os.fspath(path)
    return exc


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(list(argv), out)
    return code, out.getvalue() + err.getvalue()


# ------------------------------------------------------------------ every read path refuses
READ_PATHS = {
    "read_numpy": lambda r, n: r.read_numpy(n),
    "read_numpy_copy": lambda r, n: r.read_numpy(n, copy=True),
    "read_numpy_f32": lambda r, n: r.read_numpy(n, dtype=np.float32),
    "getitem": lambda r, n: r[n],
    "batch": lambda r, n: r.read_numpy([n, *[k for k in r.keys() if k != n]], copy=True),
    "batch_views": lambda r, n: r.read_numpy(list(r.keys())),
    "read": lambda r, n: r.read(n),
    "read_copy": lambda r, n: r.read(n, copy=True),
    "read_torch": lambda r, n: r.read_torch(n),
    "read_torch_copy": lambda r, n: r.read_torch(n, copy=True),
    "read_into": lambda r, n: r.read_into(n, np.empty(r.metadata(n).shape, np.bool_)),
    "read_into_dict": lambda r, n: r.read_into({n: np.empty(r.metadata(n).shape, np.bool_)}),
    "read_into_torch": lambda r, n: r.read_into(
        n, torch.empty(tuple(r.metadata(n).shape), dtype=torch.bool)),
    "verify": lambda r, n: r.verify(),
    "stats": lambda r, n: stats.tensor_stats(r, n),
}


@pytest.mark.parametrize("how", sorted(READ_PATHS))
@pytest.mark.parametrize("options", [{}, {"verify": True}, {"mmap": False},
                                     {"copy_on_write": True}], ids=str)
def test_every_reader_path_refuses(bad_file, how, options):
    path, name = bad_file
    with ztensor.Reader(str(path), **options) as r:
        # the hot path's table is made first, as by a caller reading many objects
        if "w" in r.keys():
            r.read_numpy("w")
        refuses(lambda: READ_PATHS[how](r, name), path, name)
        # refused every time, not only the first (no cached unchecked view)
        refuses(lambda: READ_PATHS[how](r, name), path, name)


def test_read_into_leaves_no_bad_bytes_in_the_destination(tmp_path):
    """zstd data is decoded straight into the caller's memory: a refusal clears it,
    so the torch bool tensor the caller holds never shows byte 2."""
    path = v12_zstd_file(tmp_path)
    dst = torch.ones((2, 3), dtype=torch.bool)
    with ztensor.Reader(str(path)) as r:
        refuses(lambda: r.read_into("mask", dst), path, "mask")
    assert dst.view(torch.uint8).max().item() <= 1


def test_the_public_loaders_refuse(bad_file):
    path, name = bad_file
    p = str(path)
    refuses(lambda: ztensor.numpy.load_file(p), path, name)
    refuses(lambda: ztensor.torch.load_file(p), path, name)
    refuses(lambda: ztensor.torch.load_file(p, copy=True), path, name)
    refuses(lambda: ztensor.torch.load(path.read_bytes()), "<bytes>", name)
    refuses(lambda: ztensor.numpy.load(path.read_bytes()), "<bytes>", name)
    refuses(lambda: ztensor.deserialize(path.read_bytes()), "<bytes>", name)
    for framework in ("np", "pt"):
        with safe_open(p, framework=framework) as f:
            refuses(lambda: f.get_tensor(name), path, name)
            # a slice is checked on the elements it returns; a slice that misses the
            # bad byte reads (test_hostile_s10_core.py); the whole one holds it
            refuses(lambda: f.get_slice(name)[:], path, name)


def test_load_model_fills_nothing(tmp_path):
    """load_model's in-place fill reads every chosen object before writing any."""
    path = v12_file(tmp_path)
    model = torch.nn.Module()
    model.register_buffer("mask", torch.zeros((2, 3), dtype=torch.bool))
    model.w = torch.nn.Parameter(torch.zeros(6))
    with pytest.raises(ztensor.FormatError, match=MESSAGE):
        ztensor.torch.load_model(model, str(path))
    assert model.mask.view(torch.uint8).max().item() == 0


def test_dask_refuses(bad_file):
    pytest.importorskip("dask")
    import ztensor.dask

    path, name = bad_file
    arr = ztensor.dask.from_zt(str(path), name)
    refuses(lambda: arr.compute(scheduler="synchronous"), path, name)


def test_verify_reports_it_and_the_command_exits_1(bad_file):
    path, name = bad_file
    with ztensor.Reader(str(path)) as r:
        errors = []
        r.verify(errors=errors)
        assert [e.obj for e in errors] == [name]
        assert MESSAGE in str(errors[0])
    code, text = run_cli("verify", str(path))
    assert code == 1
    assert MESSAGE in text and repr(name) in text


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".zt"])
def test_convert_refuses_and_leaves_no_output(bad_file, tmp_path, suffix):
    path, name = bad_file
    out = tmp_path / f"out{suffix}"
    refuses(lambda: convert(str(path), str(out)), path, name)
    assert not out.exists()
    code, text = run_cli("convert", "-q", str(path), str(out))
    assert code == 1 or code == 2
    assert MESSAGE in text and not out.exists()


def test_append_does_not_copy_bad_bytes(tmp_path):
    """Writer.append copies v1.2 objects as stored; a bool object whose bytes a read
    refuses is refused instead of carried into the new file."""
    path = v12_file(tmp_path)
    refuses(lambda: ztensor.Writer.append(str(path)), path, "mask")
    with ztensor.Reader(str(path)) as r:  # the old file is untouched
        assert set(r.keys()) == {"mask", "w"}


def test_v01_sparse_bool_values_are_checked(tmp_path):
    path = v01_sparse_file(tmp_path)
    with ztensor.Reader(str(path)) as r:
        refuses(lambda: r.read("mask"), path, "mask")
        errors = []
        r.verify(errors=errors)
        assert [e.obj for e in errors] == ["mask"]


@pytest.mark.parametrize("byte", [2, 0x80, 0xFF])
def test_one_bad_byte_anywhere(tmp_path, byte):
    """A single bad byte at the end of a large object (past any sampled prefix)."""
    payload = np.zeros(1 << 16, np.uint8)
    payload[-1] = byte
    path = v12_file(tmp_path, payload.tobytes())
    with ztensor.Reader(str(path)) as r:
        refuses(lambda: r.read_numpy("mask"), path, "mask")
        refuses(lambda: r.read_numpy(["mask", "w"], copy=True), path, "mask")


# ------------------------------------------------------------------ valid bools still work
@pytest.mark.parametrize("version", ["0.1.4", "1.1.1"])
def test_golden_bool_objects_still_read(version):
    expected = np.load(DATA / f"ref-{version}" / "expected.npz")["dense.zt/bool/data"]
    with ztensor.Reader(str(DATA / f"ref-{version}" / "dense.zt")) as r:
        assert np.array_equal(r.read_numpy("bool"), expected)
        assert r.verify() >= 0


def test_valid_bool_views_stay_zero_copy(tmp_path):
    """The general path hands out views of the file, as the plain path did: the bool
    object's array is a view of the mapping (shares memory with the file's bytes)."""
    path = tmp_path / "ok.zt"
    mask = np.array([[True, False, True], [False, False, True]])
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("mask", mask)
        w.write_numpy("w", np.arange(6, dtype=np.float32))
    with ztensor.Reader(str(path)) as r:
        a = r.read_numpy("mask")
        b = r.read_numpy("mask")
        assert np.array_equal(a, mask) and a.dtype == np.bool_
        assert not a.flags.owndata and not a.flags.writeable
        assert np.shares_memory(a, b)  # both views of the one mapping
        w = r.read_numpy("w")
        assert not w.flags.owndata
        owned = r.read_numpy(["mask", "w"], copy=True)
        assert np.array_equal(owned["mask"], mask) and owned["mask"].flags.writeable
        assert not np.shares_memory(owned["mask"], a)
    with ztensor.Reader(str(path), copy_on_write=True) as r:
        t = ztensor.torch.load_file(str(path))["mask"]
        assert torch.equal(t, torch.from_numpy(mask))


# ------------------------------------------------------------------ the writer never writes them
def _stored(path, name):
    with ztensor.Reader(str(path)) as r:
        comp = r.metadata(name).components["data"]
        assert comp.dtype == "bool"
        return np.frombuffer(r.stored_bytes(name, "data"), np.uint8).copy()


EXPECTED = (BAD != 0).astype(np.uint8)


@pytest.mark.parametrize("compress", [False, True])
def test_write_numpy_normalises(tmp_path, compress):
    path = tmp_path / "n.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("a", _raw_bool(), compress=compress)
        w.write_numpy("b", _raw_bool().reshape(2, 3).T)  # not contiguous
        w.write("c", ztensor.Tensor({"data": _raw_bool()}))
        w.add("d", _raw_bool())
    with ztensor.Reader(str(path)) as r:
        for name in "abcd":
            got = r.read_numpy(name, copy=True)
            assert got.view(np.uint8).max() <= 1
        assert np.array_equal(r.read_numpy("a").view(np.uint8), EXPECTED)
        assert np.array_equal(r.read_numpy("b"), EXPECTED.reshape(2, 3).T.astype(bool))
        assert r.verify() == 0
    if not compress:
        assert np.array_equal(_stored(path, "a"), EXPECTED)
    assert _raw_bool().view(np.uint8).max() == 0xFF  # the caller's array is left alone


def test_write_torch_and_save_file_normalise(tmp_path):
    t = torch.from_numpy(BAD.copy()).view(torch.bool)
    assert t.view(torch.uint8).max().item() == 0xFF
    path = tmp_path / "t.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_torch("a", t)
    assert np.array_equal(_stored(path, "a"), EXPECTED)
    saved = tmp_path / "s.zt"
    ztensor.torch.save_file({"a": t}, str(saved))
    assert np.array_equal(_stored(saved, "a"), EXPECTED)
    back = ztensor.torch.load_file(str(saved))["a"]
    assert back.view(torch.uint8).tolist() == EXPECTED.tolist()
    npsaved = tmp_path / "np.zt"
    ztensor.numpy.save_file({"a": _raw_bool()}, str(npsaved))
    assert np.array_equal(_stored(npsaved, "a"), EXPECTED)
    data = ztensor.numpy.save({"a": _raw_bool()})
    assert ztensor.numpy.load(data)["a"].view(np.uint8).tolist() == EXPECTED.tolist()


def test_stream_normalises(tmp_path):
    path = tmp_path / "s.zt"
    with ztensor.Writer(str(path)) as w:
        with w.stream("a", (6,), np.bool_) as s:
            s.write(_raw_bool()[:3])
            s.write(BAD[3:].tobytes())  # little-endian bytes
    assert np.array_equal(_stored(path, "a"), EXPECTED)


def test_serialize_normalises():
    data = ztensor.serialize({"a": {"dtype": "bool", "shape": [6], "data": BAD.tobytes()}})
    [(name, got)] = ztensor.deserialize(data)
    assert name == "a" and bytes(got["data"]) == EXPECTED.tobytes()


def test_convert_from_other_formats_normalises(tmp_path):
    """safetensors, npy and torch.save files holding bool byte 2 (written by their
    own libraries) convert to a .zt our reader accepts, holding ``!= 0``; reading
    them directly gives the same values."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    raw = _raw_bool()
    sources = {}
    st_path = tmp_path / "in.safetensors"
    safetensors_numpy.save_file({"a": raw}, str(st_path))
    sources["safetensors"] = st_path
    npy_path = tmp_path / "in.npy"
    np.save(npy_path, raw)
    sources["npy"] = npy_path
    pt_path = tmp_path / "in.pt"
    torch.save({"a": torch.from_numpy(BAD.copy()).view(torch.bool)}, pt_path)
    sources["pt"] = pt_path
    for kind, src in sources.items():
        # the input really holds the byte: the libraries write memory as it is
        assert b"\x02\xff" in src.read_bytes(), kind
        with ztensor.Reader(str(src)) as r:
            [name] = r.keys()
            assert r.read_numpy(name).view(np.uint8).tolist() == EXPECTED.tolist(), kind
            assert r.read(name).components["data"].view(np.uint8).tolist() == EXPECTED.tolist()
            assert r.read_torch(name).view(torch.uint8).tolist() == EXPECTED.tolist(), kind
            r.verify()
        out = tmp_path / f"{kind}.zt"
        convert(str(src), str(out))
        assert np.array_equal(_stored(out, name), EXPECTED), kind
        code, _ = run_cli("verify", str(out))
        assert code == 0


def test_convert_streams_large_bool_tensors_normalised(tmp_path, monkeypatch):
    """A tensor above convert's streaming size goes through Writer.stream."""
    from ztensor.tools import convert as convert_module

    monkeypatch.setattr(convert_module, "STREAM_CHUNK", 4)
    src = tmp_path / "in.npy"
    np.save(src, _raw_bool())
    out = tmp_path / "out.zt"
    convert(str(src), str(out))
    assert np.array_equal(_stored(out, _only_name(out)), EXPECTED)


def _only_name(path):
    with ztensor.Reader(str(path)) as r:
        [name] = r.keys()
    return name


# ------------------------------------------------------------------ property
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.integers(0, 255), max_size=200),
    compress=st.booleans(),
    how=st.sampled_from(["numpy", "torch", "tensor", "stream"]),
)
def test_any_bool_array_written_reads_back_as_nonzero(tmp_path_factory, data, compress, how):
    raw = np.array(data, np.uint8)
    arr = raw.view(np.bool_)
    path = tmp_path_factory.mktemp("prop") / "p.zt"
    with ztensor.Writer(str(path)) as w:
        if how == "numpy":
            w.write_numpy("a", arr, compress=compress)
        elif how == "torch":
            w.write_torch("a", torch.from_numpy(raw.copy()).view(torch.bool), compress=compress)
        elif how == "tensor":
            w.write("a", ztensor.Tensor({"data": arr}), compress=compress)
        else:
            with w.stream("a", arr.shape, np.bool_, compress=compress) as s:
                if raw.size:
                    s.write(arr)
    expected = raw != 0
    with ztensor.Reader(str(path)) as r:
        for got in (r.read_numpy("a"), r.read_numpy("a", copy=True),
                    r.read_numpy(["a"], copy=True)["a"], r.read("a").components["data"]):
            assert got.dtype == np.bool_
            assert np.array_equal(got.view(np.uint8), expected.view(np.uint8))
        assert r.verify() == 0
