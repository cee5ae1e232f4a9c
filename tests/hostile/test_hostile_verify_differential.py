"""Issue 21, round three, class 6: ``verify`` means everything a read could refuse, on
every read path, and no two read paths disagree about one object.

The differential harness reads each object of a file through every path ztensor
has (``Reader.read`` with and without ``verify=True``, ``read_numpy`` zero-copy and
owned, the batch read, ``read_torch``, ``read_into``, ``read_numpy(dtype=)``,
``dequantize``, ``stats``, ``safe_open``, the numpy and torch loaders, ``convert``)
and holds them to two rules:

* a path that refuses an object (a ``ZTensorError``) has ``verify`` refuse it too:
  ``Reader.verify`` names the object and ``ztensor verify`` exits 1.  Refusals that
  say a valid object cannot take this path's form (``UnsupportedError``: another
  quantization convention, a sparse object for a flat loader, a safetensors output)
  are documented and exempt, but only on the paths that change an object's form;
* every path that returns an object's values returns the same values.

Any other exception, anywhere, is a finding.  Inputs: files made by ztensor.Writer,
the reference implementation's golden files (v0.1, v1.1, v1.2, v2), v2 files built
from the spec (tests/v2files.py), GGUF files written by the ``gguf`` package, and
their manifests edited or bytes changed (what the writer refuses to write).
"""
import contextlib
import io
import json
import math
import random
import struct
import warnings

import cbor2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ztensor
import ztensor.numpy
from conftest import DATA
from ztensor.tools import cli, stats

torch = pytest.importorskip("torch")
import ztensor.torch  # noqa: E402 - after torch is known to be there
ml_dtypes = pytest.importorskip("ml_dtypes")
scipy_sparse = pytest.importorskip("scipy.sparse")

BASE_PATHS = ("verify_read", "read", "read_copy", "read_numpy", "read_numpy_copy", "batch",
              "read_torch", "read_torch_copy", "read_into", "read_f32")
# these change an object's form; their UnsupportedError says the form cannot hold a
# valid object (documented), not that the object is broken
FORM_PATHS = ("dequantize", "stats", "safe_open", "np_load", "np_load_copy", "torch_load",
              "convert")


# ------------------------------------------------------------------ the harness
def _fingerprint(value):
    """Shape, element width and bytes of an array or tensor (bf16/FP8 as bits)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16 or value.dtype.itemsize == 1 and value.is_floating_point():
            value = value.view(torch.int16 if value.dtype.itemsize == 2 else torch.uint8)
        value = value.numpy()
    arr = np.ascontiguousarray(np.asarray(value))
    if ml_dtypes is not None and arr.dtype.type.__module__.startswith("ml_dtypes"):
        arr = arr.view(np.uint8 if arr.dtype.itemsize == 1 else np.uint16)
    native = arr.astype(arr.dtype.newbyteorder("="))
    return native.shape, native.dtype.itemsize, native.tobytes()


class Verdict:
    def __init__(self, kind, value=None, exc=None):
        self.kind, self.value, self.exc = kind, value, exc

    def __repr__(self):
        return f"{self.kind}: {self.exc!r}" if self.exc is not None else self.kind


def attempt(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GGUF types this version does not know
            return Verdict("ok", fn())
    except ztensor.ZTensorError as exc:
        return Verdict("refused", exc=exc)
    except Exception as exc:  # noqa: BLE001 - exactly what the harness looks for
        return Verdict("crash", exc=exc)


def run_verify(path):
    """(exit status of ``ztensor verify``, its output)."""
    out = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["verify", str(path)], out)
    return code, out.getvalue()


def per_object(path, r, name):
    """path name -> Verdict, for one object of an open Reader ``r``."""
    meta = r.metadata(name)
    got = {}

    def verified():
        with ztensor.Reader(path, verify=True) as rv:
            return {k: _fingerprint(v) for k, v in rv.read(name).components.items()}

    got["verify_read"] = attempt(verified)
    got["read"] = attempt(lambda: {k: _fingerprint(v) for k, v in r.read(name).components.items()})
    got["read_copy"] = attempt(
        lambda: {k: _fingerprint(v) for k, v in r.read(name, copy=True).components.items()})
    if meta.format == "dense":
        got["read_numpy"] = attempt(lambda: _fingerprint(r.read_numpy(name)))
        got["read_numpy_copy"] = attempt(lambda: _fingerprint(r.read_numpy(name, copy=True)))
        got["batch"] = attempt(lambda: _fingerprint(r.read_numpy([name], copy=True)[name]))
        got["read_torch"] = attempt(lambda: _fingerprint(r.read_torch(name)))
        got["read_torch_copy"] = attempt(lambda: _fingerprint(r.read_torch(name, copy=True)))

        def into():
            like = np.asarray(r.read(name).components["data"])
            dst = np.empty(meta.shape, like.dtype.newbyteorder("="))
            r.read_into(name, dst)
            return _fingerprint(dst)

        got["read_into"] = attempt(into)
        got["read_f32"] = attempt(lambda: r.read_numpy(name, dtype=np.float32))
    if meta.format in ("quantized_group", "gguf_blocks"):
        got["dequantize"] = attempt(lambda: ztensor.dequantize(r.read(name), dtype=np.float32))
    got["stats"] = attempt(lambda: stats.tensor_stats(r, name)["count"])

    def opened():
        with ztensor.safe_open(path, "np") as f:
            return f.get_tensor(name)

    got["safe_open"] = attempt(opened)
    return got


def whole_file(path, r, tmp):
    names = [n for n in r.keys() if r.metadata(n).format == "dense"]
    got = {
        "batch_all": attempt(lambda: {k: _fingerprint(v)
                                      for k, v in r.read_numpy(names, copy=True).items()}),
        "np_load": attempt(lambda: ztensor.numpy.load_file(path)),
        "np_load_copy": attempt(lambda: ztensor.numpy.load_file(path, copy=True)),
        "torch_load": attempt(lambda: ztensor.torch.load_file(path)),
    }
    out = tmp / "out.safetensors"
    got["convert"] = attempt(lambda: ztensor.convert(path, out, force=True))
    return got


def check_file(path, tmp):
    """Every rule of this module over one file; returns the verdicts (for tests that
    look closer).  Raises AssertionError naming the path, object and rule broken."""
    code, output = run_verify(path)
    opened = attempt(lambda: ztensor.Reader(path))
    if opened.kind != "ok":
        assert opened.kind == "refused", (path, opened)
        assert code == 2, (path, "cannot be opened, yet verify said", code, output)
        return None
    with opened.value as r:
        problems = []
        r.verify(errors=problems)
        flagged = {exc.obj for exc in problems}
        objects = {name: per_object(path, r, name) for name in r.keys()}
        formats = {name: r.metadata(name).format for name in r.keys()}
        files = whole_file(path, r, tmp)
    assert (code == 0) == (not problems), (path, code, problems)
    for name, got in objects.items():
        for where, v in got.items():
            assert v.kind != "crash", (path, name, where, v.exc)
            if v.kind != "refused" or name in flagged:
                continue
            # (a digest refused by a verify=True read is verify's to report too)
            exempt = where in FORM_PATHS and isinstance(v.exc, ztensor.UnsupportedError)
            assert exempt, (path, name, where, "refused, yet verify says OK:", v.exc)
        values = {where: got[where].value for where in BASE_PATHS[3:9]
                  if where in got and got[where].kind == "ok"}
        if got["read"].kind == "ok" and "data" in got["read"].value and \
                formats[name] == "dense":
            values["read"] = got["read"].value["data"]
        assert len({repr(v) for v in values.values()}) <= 1, (path, name, "values differ",
                                                             sorted(values))
    for where, v in files.items():
        assert v.kind != "crash", (path, where, v.exc)
        if v.kind == "refused" and not problems:
            assert isinstance(v.exc, ztensor.UnsupportedError), (path, where, v.exc)
    return objects, files, flagged


# ------------------------------------------------------------------ inputs
def writer_file(path, compress=False, checksum=None):
    """One object of every format and logical type, by ztensor.Writer."""
    rng = np.random.default_rng(0)
    kw = dict(compress=compress, checksum=checksum)
    with ztensor.Writer(path) as w:
        w.write_numpy("f32", rng.standard_normal((3, 4)).astype(np.float32), **kw)
        w.write_numpy("bool", np.array([[True, False, True], [False, True, True]]), **kw)
        w.write_numpy("bf16", rng.standard_normal((2, 4)).astype(ml_dtypes.bfloat16), **kw)
        w.write_numpy("fp8", rng.standard_normal((2, 4)).astype(ml_dtypes.float8_e4m3fn), **kw)
        w.write_numpy("c64", (rng.standard_normal((2, 3)) + 1j).astype(np.complex64), **kw)
        w.write_numpy("i16", np.arange(-6, 6, dtype=np.int16).reshape(3, 4), **kw)
        matrix = np.array([[0, 1.5, 0], [2.0, 0, 3.0]], np.float32)
        w.write("csr", scipy_sparse.csr_array(matrix), **kw)
        w.write("coo", scipy_sparse.coo_array(matrix), **kw)
        w.write("q4", ztensor.quantize(rng.standard_normal((16, 64)).astype(np.float32),
                                       bits=4, group_size=32), **kw)
        w.write("q3", ztensor.quantize(rng.standard_normal((8, 64)).astype(np.float32),
                                       bits=3, group_size=32), **kw)
        w.write("q2", ztensor.quantize(rng.standard_normal((16, 32)).astype(np.float32),
                                       bits=2, group_size=-1, sym=True), **kw)
        q8 = ztensor.quantize(rng.standard_normal((8, 32)).astype(np.float32), bits=8,
                              group_size=16)
        act_order = (np.arange(32) // 16).astype(np.int32)[::-1].copy()
        w.write("q8g", ztensor.Tensor({**q8.components, "g_idx": act_order}, shape=q8.shape,
                                      format="quantized_group", attributes=q8.attributes), **kw)
        blocks = np.zeros(68, np.uint8)
        blocks[:2] = np.array([0.5], np.float16).view(np.uint8)
        blocks[2:34] = np.arange(32, dtype=np.int8).view(np.uint8)
        w.write("q8_0", ztensor.Tensor({"blocks": blocks}, shape=(2, 32), format="gguf_blocks",
                                       attributes={"ggml_type": "Q8_0", "ggml_type_id": 8,
                                                   "block_elements": 32, "block_bytes": 34}),
                **kw)
        w.write("unknown_type", ztensor.Tensor({"blocks": np.arange(10, dtype=np.uint8)},
                                               shape=(7,), format="gguf_blocks",
                                               attributes={"ggml_type_id": 99}), **kw)


def edit_file(path, edit=None, pokes=()):
    """Rewrite a file's manifest (``edit(manifest)``) and set bytes of its data
    (``pokes``: (file offset, byte)): what the writer refuses to write."""
    data = bytearray(path.read_bytes())
    size = struct.unpack("<Q", data[-16:-8])[0]
    manifest = cbor2.loads(bytes(data[-16 - size:-16]))
    for at, value in pokes:
        data[at] = value
    if edit is not None:
        edit(manifest)
    raw = cbor2.dumps(manifest)
    path.write_bytes(bytes(data[:-16 - size]) + raw + struct.pack("<Q", len(raw)) + b"ZTEN1000")


def manifest_of(path):
    data = path.read_bytes()
    size = struct.unpack("<Q", data[-16:-8])[0]
    return cbor2.loads(data[-16 - size:-16])


GOLDEN = sorted(p for p in DATA.glob("*/*.zt"))


# ------------------------------------------------------------------ the differential
@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_read_path_agrees_on_the_golden_files(path, tmp_path):
    """Files of every version the reference wrote (and the fuzz regressions): every
    path agrees with verify and with every other path.  (v0.1's big-endian matrix
    read as a torch tensor was a ValueError from the byte-swap kernel.)"""
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    check_file(copy, tmp_path)


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "zstd"])
def test_every_read_path_agrees_on_a_file_of_every_format(compress, tmp_path):
    path = tmp_path / "all.zt"
    writer_file(path, compress=compress, checksum="crc32c")
    objects, files, flagged = check_file(path, tmp_path)
    assert not flagged
    assert objects["q8_0"]["dequantize"].kind == "ok"
    assert all(objects[n]["read_torch"].kind == "ok" for n in ("bool", "bf16", "fp8", "c64"))
    assert "no flat tensor form" in str(files["np_load"].exc)   # the sparse objects


# the edits a hostile manifest may make, over the fields every format reads
POOL = {
    "dtype": ["f32", "f16", "bf16", "u8", "i8", "i16", "u16", "i32", "u32", "i64", "u64",
              "bool", "f64", "f8_e4m3", "complex64"],
    "type": [None, "bool", "f8_e4m3fn", "f8_e5m2", "complex64", "complex128", "f8_e4m3fnuz"],
    "bits": [2, 3, 4, 8, 5, 1, 32, 0, -1, "4", 4.0, True],
    "group_size": [-1, 1, 16, 32, 64, 128, 0, -2, 2**63, True],
    "ggml_type_id": [0, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 99, True, -1],
    "block_elements": [32, 256, 16, 1],
    "block_bytes": [34, 18, 20, 22, 24, 144, 210, 1],
    "packing": ["8_per_i32", "16_per_i32", "4_per_i32", "32_per_3_i32", "x"],
    "format": ["dense", "sparse_csr", "sparse_coo", "quantized_group", "gguf_blocks", "acme"],
}


def mutate(manifest, rnd):
    """One hostile edit of one object; (edit applied, bytes to set)."""
    objects = manifest["objects"]
    name = rnd.choice(sorted(objects))
    obj = objects[name]
    comps = obj["components"]
    role = rnd.choice(sorted(comps))
    what = rnd.choice(["dtype", "type", "attribute", "shape", "poke", "format", "drop", "swap",
                       "length"])
    if what in ("dtype", "type"):
        value = rnd.choice(POOL[what])
        if value is None:
            comps[role].pop(what, None)
        else:
            comps[role][what] = value
    elif what == "attribute":
        key = rnd.choice(["bits", "group_size", "ggml_type_id", "block_elements", "block_bytes",
                          "packing"])
        obj.setdefault("attributes", {})[key] = rnd.choice(POOL[key])
    elif what == "shape":
        shape = list(obj["shape"])
        obj["shape"] = rnd.choice([shape[::-1], [math.prod(shape)], shape + [1], shape[1:],
                                   [0] + shape[1:], [2 * shape[0]] + shape[1:] if shape else []])
    elif what == "format":
        obj["format"] = rnd.choice(POOL["format"])
    elif what == "drop" and len(comps) > 1:
        del comps[role]
    elif what == "swap" and len(comps) > 1:
        other = rnd.choice(sorted(set(comps) - {role}))
        comps[role], comps[other] = comps[other], comps[role]
    elif what == "length":
        comps[role]["length"] = max(0, comps[role]["length"] - rnd.choice([1, 2, 4, 8]))
    elif what == "poke" and comps[role]["length"]:
        at = comps[role]["offset"] + rnd.randrange(comps[role]["length"])
        return (name, what), [(at, rnd.randrange(256))]
    return (name, what), []


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeds")
    out = []
    for compress in (False, True):
        path = folder / f"seed-{compress}.zt"
        writer_file(path, compress=compress)     # no digests: a changed byte must read
        out.append((path.read_bytes(), manifest_of(path)))
    return out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 1), seed=st.integers(0, 2**32 - 1), edits=st.integers(1, 3))
def test_hostile_edits_keep_verify_and_every_read_path_in_agreement(seeds, tmp_path, which,
                                                                    seed, edits):
    """Property: whatever a manifest or a data byte says, each read path refuses an
    object only when verify does, none raises anything but a ZTensorError, and every
    path that returns values returns the same values."""
    data, manifest = seeds[which]
    manifest = cbor2.loads(cbor2.dumps(manifest))
    rnd = random.Random(seed)
    pokes = []
    for _ in range(edits):
        pokes += mutate(manifest, rnd)[1]
    path = tmp_path / f"edited-{seed}.zt"
    path.write_bytes(data)
    edit_file(path, lambda m: m.update(manifest), pokes)
    check_file(path, tmp_path)


def test_v2_files_every_read_path_agrees(tmp_path):
    """v2 files from the spec: bool bytes (shared and not), seekable zstd, decoded
    digests, GGUF layouts, complex and FP8."""
    from v2files import build, dense
    from ztensor.io import seekable
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    obj, blob = dense(a, 4096)

    def flags(offset, n, **part):
        return {"shape": [n], "layout": "dense",
                "parts": {"data": {"dtype": "u8", "type": "bool", "blob": [offset, n], **part}}}

    frames = seekable.FrameWriter(3)
    stream = b"".join(frames.write(b"\x00\x02\x01\x01") + frames.finish())
    gguf = {"shape": [2, 32], "layout": "gguf.q8_0/1",
            "attributes": {"elems_per_block": 32, "block_bytes": 34},
            "parts": {"data": {"dtype": "u8", "blob": [12288, 68]}}}
    files = {
        "bool-2": build({"a": obj, "b": flags(8192, 3)}, [blob, (8192, b"\x00\x02\x01")]),
        "bool-2-tied": build({"a": obj, "b": flags(8192, 3), "c": flags(8192, 3)},
                             [blob, (8192, b"\x00\x02\x01")]),
        "bool-2-seekable": build(
            {"b": flags(8192, len(stream), encoding="zt.zstd-seekable/1", decoded_length=4)
             | {"shape": [4]}}, [(8192, stream)]),
        "digest": build({"a": {**obj, "parts": {"data": {**obj["parts"]["data"],
                                                          "digest": "xxh3:" + "1" * 16}}}},
                        [blob]),
        "gguf": build({"a": obj, "g": gguf}, [blob, (12288, bytes(68))]),
    }
    for name, data in files.items():
        path = tmp_path / f"{name}.zt"
        path.write_bytes(data)
        check_file(path, tmp_path)
    objects, _, flagged = check_file(tmp_path / "bool-2-tied.zt", tmp_path)
    assert flagged == {"b", "c"}


# ------------------------------------------------------------------ the findings, one by one
def test_a_big_endian_matrix_reads_as_a_torch_tensor():
    """v0.1 big-endian data in its 2-D shape reached the byte-swap kernel, which takes
    flat bytes: read_torch and safe_open(framework="pt") raised a ValueError
    (components.to_native)."""
    path = DATA / "v0.1-handmade" / "features.zt"
    with ztensor.Reader(path) as r:
        want = r.read_numpy("big_f32")
        assert want.shape == (2, 3)
        for copy in (False, True):
            np.testing.assert_array_equal(r.read_torch("big_f32", copy=copy).numpy(), want)
    with ztensor.safe_open(path, "pt") as f:
        np.testing.assert_array_equal(f.get_tensor("big_f32").numpy(), want)


def test_read_numpy_with_a_dtype_reads_other_formats(tmp_path):
    """read_numpy(name, dtype=np.float32) of a safetensors or GGUF tensor was an
    AttributeError: the conversion read the zTensor component of a file that has
    none (Reader._read_converted)."""
    from safetensors.torch import save_file
    values = torch.linspace(-3, 3, 12).reshape(3, 4)
    path = tmp_path / "m.safetensors"
    save_file({"h": values.half(), "b": values.bfloat16(), "f": values}, str(path))
    with ztensor.Reader(path) as r:
        for name, t in (("h", values.half()), ("b", values.bfloat16()), ("f", values)):
            for dtype in (np.float32, np.float16):
                got = r.read_numpy(name, dtype=dtype)
                assert got.dtype == dtype
                np.testing.assert_array_equal(got, t.float().numpy().astype(dtype))
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("h", values.half().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r.read_numpy("h", dtype=np.float32),
                                      values.half().float().numpy())
    check_file(path, tmp_path)


def _gguf_with_a_dimensionless_q8_0(path):
    """A GGUF file (written by the gguf package) whose Q8_0 tensor is then given no
    dimensions: its info loses the one u64 dimension, and a string key/value gains 8
    bytes, so the header and every data offset stay where they were."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("pad", "x" * 8)
    blocks = np.zeros(34, np.uint8)                        # one block: 32 elements
    blocks[:2] = np.array([0.5], np.float16).view(np.uint8)
    w.add_tensor("q", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("norm", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(path.read_bytes())
    info = data.index(struct.pack("<Q", 1) + b"q" + struct.pack("<I", 1))
    at = info + 8 + 1                                      # n_dims of "q"
    assert struct.unpack_from("<IQ", data, at) == (1, 32)
    data[at:at + 12] = struct.pack("<I", 0)                # no dimensions, 8 bytes fewer
    key = data.index(b"pad") + 3 + 4                       # the value's u64 length
    assert struct.unpack_from("<Q", data, key)[0] == 8
    data[key:key + 16] = struct.pack("<Q", 16) + b"x" * 16  # 8 bytes more
    path.write_bytes(bytes(data))


def test_verify_refuses_a_gguf_tensor_dequantize_refuses(tmp_path):
    """A GGUF Q8_0 tensor with no dimensions (one element, which no block holds) was
    read and verified OK, while dequantize and stats refused it: reads of other
    formats did not apply the gguf_blocks rule (Reader.read)."""
    path = tmp_path / "m.gguf"
    _gguf_with_a_dimensionless_q8_0(path)
    with ztensor.Reader(path) as r:
        assert r.metadata("q").format == "gguf_blocks" and r.metadata("q").shape == ()
        np.testing.assert_array_equal(r.read_numpy("norm"), np.arange(4, dtype=np.float32))
        with pytest.raises(ztensor.FormatError, match="do not hold") as exc:
            r.read("q")
        assert exc.value.obj == "q" and exc.value.path == str(path)
        problems = []
        r.verify(errors=problems)
        assert [p.obj for p in problems] == ["q"]
    code, out = run_verify(path)
    assert code == 1 and "FAILED (1 problems)" in out
    check_file(path, tmp_path)


@pytest.mark.parametrize("edit", [{"packing": "4_per_i32"}, {"pack_order": "msb_first"}],
                         ids=["packing", "pack_order"])
def test_another_conventions_object_is_unsupported_whatever_its_shape(tmp_path, edit):
    """A quantized_group object in a convention ztensor does not implement is valid
    and read as stored; dequantize said FormatError for it (its shape is not 2-D, it
    lacks scales), which no read or verify reports.  The attribute rule comes first
    (quantized._Layout.from_tensor, _from_tensor)."""
    path = tmp_path / "q.zt"
    with ztensor.Writer(path) as w:
        w.write("q", ztensor.quantize(np.ones((16, 64), np.float32), group_size=32))

    def edit_manifest(m):
        obj = m["objects"]["q"]
        obj["attributes"].update(edit)
        obj["shape"] = [16, 64, 1]
        del obj["components"]["scales"]
    edit_file(path, edit_manifest)
    with ztensor.Reader(path) as r:
        t = r.read("q")
        r.verify()
        with pytest.raises(ztensor.UnsupportedError, match="convention"):
            ztensor.dequantize(t)
    assert run_verify(path)[0] == 0
    check_file(path, tmp_path)
    # in our own convention, the same shape is a FormatError on every path
    path = tmp_path / "ours.zt"
    with ztensor.Writer(path) as w:
        w.write("q", ztensor.quantize(np.ones((16, 64), np.float32), group_size=32))
    edit_file(path, lambda m: m["objects"]["q"].update(shape=[16, 64, 1]))
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.FormatError, match="2-D"):
            r.read("q")
    assert run_verify(path)[0] == 1


def test_sharded_verify_reports_what_loading_a_shard_refuses(tmp_path):
    """A shard holding a tensor the index places in another shard, or does not list:
    every load of that shard refuses it (sharded._open_checked), and verify said OK.
    One rule now (ShardedReader._misplaced), refused by the one and reported by the
    other."""
    tensors = {f"t{i}": np.full(4000, i, np.float32) for i in range(3)}
    files = ztensor.save_sharded(tensors, tmp_path, max_shard_size="20kB")
    assert len(files) == 3
    with ztensor.Writer(tmp_path / files[1]) as w:      # t0 again, the index says shard 1
        w.write_numpy("t1", tensors["t1"])
        w.write_numpy("t0", np.full(4000, 99, np.float32))
    with ztensor.Writer(tmp_path / files[2]) as w:      # a tensor the index does not list
        w.write_numpy("t2", tensors["t2"])
        w.write_numpy("unlisted", np.ones(3, np.float32))
    with pytest.raises(ztensor.FormatError, match="places in"):
        ztensor.torch.load_file(tmp_path)
    with ztensor.open_sharded(tmp_path) as s:
        with pytest.raises(ztensor.FormatError, match="places in"):
            s.read_numpy("t1")
        with pytest.raises(ztensor.FormatError, match="does not list"):
            s.read_numpy("t2")
        problems = []
        s.verify(errors=problems)
        assert sorted(p.obj for p in problems) == ["t0", "unlisted"]
        with pytest.raises(ztensor.FormatError):
            s.verify()
    code, out = run_verify(tmp_path)
    assert code == 1 and "FAILED (2 problems)" in out
    index = json.loads((tmp_path / "model.zt.index.json").read_text())
    assert "unlisted" not in index["weight_map"]
