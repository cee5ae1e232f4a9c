"""Session 13 (b): foreign readers' shared rules, and the sharded index over HTTP.

* One rule for file totals: ``spec.check_file_totals`` (``max_objects``, and the
  manifest's size: a safetensors header is its file's manifest) is called by the
  .zt reader and writer, the v2 reader and every foreign reader.  Each foreign
  reader had its own check, worded its own way ("GGUF declares ... (limit
  max_objects=...)", "more than max_objects ... arrays"), and the safetensors
  header's size ignored ``Limits.max_manifest_size``.
* One rule for foreign text with no UTF-8 form: ``names.check_unicode``.  A
  safetensors header key holding a lone surrogate (JSON ``"\\ud800"``), which the
  safetensors package refuses, was read, and refused only on conversion.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import ztensor
from ztensor.errors import FormatError, LimitError

from v2files import build, dense  # tests/ is on sys.path (conftest.py)

N = 3  # tensors per file (an .npy holds one)


# ---------------------------------------------------------------- one rule for totals


def _values(n):
    return {f"t{i}": np.arange(4, dtype=np.float32) + i for i in range(n)}


def _zt(path, values):
    with ztensor.Writer(path) as w:
        for k, v in values.items():
            w.write_numpy(k, v)


def _v2(path, values):
    objects, blobs = {}, []
    for i, (k, v) in enumerate(values.items()):
        objects[k], blob = dense(v, 4096 * (i + 1))
        blobs.append(blob)
    path.write_bytes(build(objects, blobs))


def _safetensors(path, values):
    save_file = pytest.importorskip("safetensors.numpy").save_file

    save_file(values, str(path))


def _gguf(path, values):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in values.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _onnx(path, values):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(v, k) for k, v in values.items()]
    onnx.save(helper.make_model(helper.make_graph([], "g", [], [], initializer=inits)), path)


def _npy(path, values):
    (value,) = values.values()
    np.save(path, value)


def _npz(path, values):
    np.savez(path, **values)


def _pytorch(path, values):
    torch = pytest.importorskip("torch")
    torch.save({k: torch.from_numpy(v) for k, v in values.items()}, path)


def _hdf5(path, values):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        for k, v in values.items():
            f.create_dataset(k, data=v)


KINDS = {
    "zt": (_zt, ".zt"),
    "v2": (_v2, ".zt"),
    "safetensors": (_safetensors, ".safetensors"),
    "gguf": (_gguf, ".gguf"),
    "onnx": (_onnx, ".onnx"),
    "npy": (_npy, ".npy"),
    "npz": (_npz, ".npz"),
    "pytorch": (_pytorch, ".pt"),
    "hdf5": (_hdf5, ".h5"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_max_objects_is_one_rule_for_every_input(tmp_path, kind):
    """A file of exactly ``max_objects`` tensors reads, one more is refused: the
    same LimitError, in the same words, naming the file, whatever the input."""
    make, suffix = KINDS[kind]
    n = 1 if kind == "npy" else N
    values = {"m": np.arange(4, dtype=np.float32)} if kind == "npy" else _values(n)
    path = tmp_path / f"m{suffix}"
    make(path, values)
    with ztensor.Reader(path, limits=ztensor.Limits(max_objects=n)) as r:
        assert sorted(r.keys()) == sorted(values)
        for k, v in values.items():
            np.testing.assert_array_equal(r[k], v)
    with pytest.raises(LimitError) as info:
        ztensor.Reader(path, limits=ztensor.Limits(max_objects=n - 1))
    assert info.value.path == str(path)
    assert f"{n} objects exceed the limit of {n - 1}" in str(info.value)


@pytest.mark.parametrize("kind", ["v2", "safetensors"])
def test_manifest_size_is_one_rule_for_manifests_and_headers(tmp_path, kind):
    """``max_manifest_size`` bounds a safetensors header as it bounds a v2 manifest
    (the header was held only to the package's 100 MB), in the same words.  (A .zt
    manifest's size is refused earlier, by the footer's kernel, before it is read.)"""
    make, suffix = KINDS[kind]
    path = tmp_path / f"m{suffix}"
    make(path, _values(N))
    with pytest.raises(LimitError) as info:
        ztensor.Reader(path, limits=ztensor.Limits(max_manifest_size=16))
    assert info.value.path == str(path)
    assert "bytes exceeds the limit of 16" in str(info.value)
    assert "a manifest (names, shapes, attributes) of" in str(info.value)


def test_hdf5_links_count_as_objects(tmp_path):
    """A soft link not followed is named (``hdf5_skipped_links``), so it counts."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=np.ones(2, np.float32))
        f["b"] = h5py.SoftLink("/a")
    with ztensor.Reader(path, limits=ztensor.Limits(max_objects=2)) as r:
        assert r.keys() == ["a"] and r.attributes["hdf5_skipped_links"] == ["/b"]
    with pytest.raises(LimitError, match="2 objects exceed the limit of 1") as info:
        ztensor.Reader(path, limits=ztensor.Limits(max_objects=1))
    assert info.value.path == str(path)


# ---------------------------------------------------------------- names with no UTF-8 form


def _raw_safetensors(path, header: bytes, data=bytes(4)):
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


_ENTRY = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'


def _package_refuses(path):
    load_file = pytest.importorskip("safetensors.numpy").load_file

    with pytest.raises(Exception):
        load_file(str(path))


@pytest.mark.parametrize(
    "header",
    [
        b'{"\\ud800": ' + _ENTRY.encode() + b"}",  # a tensor name
        b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "\\udfff": 1}}',
        b'{"__metadata__": {"\\udc80": "v"}, "x": ' + _ENTRY.encode() + b"}",
        b'{"__metadata__": {"k": "a\\ud800b"}, "x": ' + _ENTRY.encode() + b"}",
    ],
    ids=["tensor-name", "entry-key", "metadata-key", "metadata-value"],
)
def test_safetensors_lone_surrogate_is_refused_at_open(tmp_path, header):
    """The safetensors package refuses these headers; we read them and refused only
    when a conversion reached the name.  Now refused at open (names.check_unicode)."""
    path = _raw_safetensors(tmp_path / "m.safetensors", header)
    _package_refuses(path)
    with pytest.raises(FormatError, match="not valid Unicode") as info:
        ztensor.Reader(path)
    assert info.value.path == str(path)


@pytest.mark.parametrize(
    "header",
    [
        # a surrogate's own UTF-8-like bytes (CESU): json.loads(bytes) decoded them
        ('{"x\udc80": ' + _ENTRY + "}").encode("utf-8", "surrogatepass"),
        # UTF-16: json.loads(bytes) guessed the encoding from the first bytes
        ('{"x": ' + _ENTRY + "}").encode("utf-16-le"),
    ],
    ids=["encoded-surrogate", "utf-16"],
)
def test_safetensors_header_bytes_must_be_utf8(tmp_path, header):
    path = _raw_safetensors(tmp_path / "m.safetensors", header)
    _package_refuses(path)
    with pytest.raises(FormatError, match="not JSON") as info:
        ztensor.Reader(path)
    assert info.value.path == str(path)


def test_pickle_tensor_name_with_a_lone_surrogate_is_refused_at_open(tmp_path):
    """pickle reads ``"\\ud800"`` (it writes str with surrogatepass): one rule with
    every other format's names (NameTable.claim)."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.pt"
    torch.save({"\ud800": torch.ones(1), "ok": torch.ones(1)}, path)
    with pytest.raises(FormatError, match="not valid Unicode") as info:
        ztensor.Reader(path)
    assert info.value.path == str(path) and info.value.obj == "\ud800"


def test_index_weight_map_name_with_a_lone_surrogate_is_refused(tmp_path):
    save_file = pytest.importorskip("safetensors.numpy").save_file

    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "s1.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "\ud800": "s1.safetensors"}}))
    with pytest.raises(FormatError, match="not valid Unicode") as info:
        ztensor.open_sharded(index)
    assert info.value.path == str(index)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:

    @settings(max_examples=60, deadline=None)
    @given(
        names=st.lists(
            # st.text leaves lone surrogates out whatever its alphabet: joined by hand
            st.lists(st.characters() | st.sampled_from(["\ud800", "\udfff"]),
                     min_size=1, max_size=4).map("".join),
            min_size=1, max_size=3, unique=True,
        )
    )
    def test_safetensors_names_read_exactly_when_the_package_reads_them(tmp_path_factory, names):
        """Property: any tensor names, escaped as json.dumps escapes them, are read by
        us exactly when the safetensors package reads the file, and to the same names."""
        load_file = pytest.importorskip("safetensors.numpy").load_file

        path = tmp_path_factory.mktemp("names") / "m.safetensors"
        header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                  for i, n in enumerate(names) if n != "__metadata__"}
        if not header:
            return
        text = json.dumps(header).encode()
        _raw_safetensors(path, text, bytes(4 * len(names)))
        try:
            theirs = sorted(load_file(str(path)))
        except Exception:
            theirs = None
        try:
            with ztensor.Reader(path) as r:
                ours = sorted(r.keys())
        except FormatError as exc:
            assert exc.path == str(path)
            ours = None
        assert ours == theirs


# ---------------------------------------------------------------- the sharded index over HTTP
# (tests/hostile/test_hostile_containment.py holds the shard names' containment and a
# lying server's .zt reads; these hold the index's own reads)


@pytest.fixture
def index_server(tmp_path):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from test_hostile_containment import Hostile

    ztensor.save_sharded({"a": np.arange(4.0)}, tmp_path / "ckpt")
    server = Hostile()
    server.files["/ckpt/model-00001-of-00001.zt"] = (
        tmp_path / "ckpt" / "model-00001-of-00001.zt"
    ).read_bytes()
    index = {"metadata": {"pad": "x" * 200_000},  # several 64 KiB reads
             "weight_map": {"a": "model-00001-of-00001.zt"}}
    server.files["/ckpt/model.zt.index.json"] = json.dumps(index).encode()
    yield server, server.url() + "/ckpt/model.zt.index.json"
    server.close()


def test_an_index_over_http_reads(index_server):
    server, url = index_server
    with ztensor.open_sharded(url) as r:
        np.testing.assert_array_equal(r["a"], np.arange(4.0))


@pytest.mark.parametrize(
    "how", ["more", "more-unannounced", "endless", "huge-length", "fewer", "wrong-range",
            "whole", "gzip"]
)
def test_an_index_served_by_a_lying_server_is_a_format_error(index_server, how):
    """Each of the index's range reads is held to its range as a .zt file's are:
    a lying Content-Length, a 200 for a range, another range's bytes."""
    server, url = index_server
    server.mode["how"] = how
    with pytest.raises(FormatError) as info:
        with ztensor.open_sharded(url) as r:
            r["a"]
    assert info.value.path == url


def test_an_index_whose_server_claims_a_huge_size_is_refused_before_it_is_read(index_server):
    """A HEAD saying 1 PiB: refused at once (it was read in 64 KiB range requests,
    a thousand of them, up to the index's bound)."""
    server, url = index_server
    server.mode["how"] = "huge-size"
    with pytest.raises(FormatError, match="larger than") as info:
        ztensor.open_sharded(url)
    assert info.value.path == url
    # its version (sharded.ShardedReader._version_now, session 16), then the open's
    # HEAD that refuses it: never a range of its body
    assert [p for p in server.asked if p.endswith(".json")] == ["/ckpt/model.zt.index.json"] * 2


@pytest.mark.parametrize("nesting", [b"[", b'{"x":'], ids=["lists", "objects"])
def test_a_deeply_nested_index_over_http_is_a_format_error(index_server, nesting):
    server, url = index_server
    close = b"]" if nesting == b"[" else b"}"
    server.files["/ckpt/model.zt.index.json"] = nesting * 100_000 + b"1" + close * 100_000
    with pytest.raises(FormatError, match="not a readable index") as info:
        ztensor.open_sharded(url)
    assert info.value.path == url


def test_a_shard_answered_with_another_files_bytes_is_refused(index_server, tmp_path):
    """A server answering the shard's URL with another checkpoint's shard (its own
    ETag, another tensor): the index's names are held to the shard's."""
    server, url = index_server
    ztensor.save_sharded({"b": np.arange(4.0)}, tmp_path / "other")
    server.files["/ckpt/model-00001-of-00001.zt"] = (
        tmp_path / "other" / "model-00001-of-00001.zt"
    ).read_bytes()
    with pytest.raises(FormatError, match="does not hold it") as info:
        with ztensor.open_sharded(url) as r:
            r["a"]
    assert info.value.path == url
