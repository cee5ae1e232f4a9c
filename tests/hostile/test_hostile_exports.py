"""Hostile input, round three: what ``ztensor convert`` writes.

* Every exporter (.safetensors, .npz, .gguf) plans first: a name, type, shape or
  attribute its format (or the format's usual reader) cannot hold is one
  ``ZTensorError`` naming it, and no file is left, not even a temporary one.  What
  is written is read back by the real peers (the safetensors package, numpy.load,
  gguf-py's GGUFReader) equal to the input: a property test draws files for all three.
* A checkpoint directory converts only when every shard has its own output name and
  every tensor one shard, and the index written lists exactly the shards' tensors.
* GGUF reading refuses what llama.cpp and gguf-py refuse (a key or tensor name
  given twice, a misaligned offset, an alignment that is not a UINT32 power of two)
  and tensors sharing bytes, and applies the reader's Limits.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ztensor
from ztensor.foreign import gguf_file as zgguf
from ztensor.tools.cli import main

safetensors_numpy = pytest.importorskip("safetensors.numpy")
gguf = pytest.importorskip("gguf")


def make_zt(path, tensors, attributes=None):
    with ztensor.Writer(str(path), attributes=attributes) as w:
        for name, arr in tensors.items():
            w.write_numpy(name, arr)
    return path


def refused(tmp_path, source, out, error=ztensor.ZTensorError, match=None):
    """convert refuses (the error given), and the folder holds what it held before."""
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(error, match=match) as info:
        ztensor.convert(source, out)
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary file
    return info.value


def cli_refuses(tmp_path, source, out, capsys):
    before = sorted(os.listdir(tmp_path))
    assert main(["convert", "-q", str(source), str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("ztensor: "), err
    assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == before
    return err


# ------------------------------------------------------------------ safetensors
def test_a_tensor_named_metadata_is_refused_for_safetensors(tmp_path, capsys):
    src = make_zt(tmp_path / "m.zt", {"__metadata__": np.ones(2, np.float32),
                                      "w": np.zeros(3, np.float32)}, {"format": "pt"})
    err = refused(tmp_path, src, tmp_path / "m.safetensors", ztensor.UnsupportedError,
                  "__metadata__")
    assert err.obj == "__metadata__" and err.path == str(src)
    cli_refuses(tmp_path, src, tmp_path / "m.safetensors", capsys)
    # every other output holds it
    ztensor.convert(src, tmp_path / "m.npz")
    np.testing.assert_array_equal(np.load(tmp_path / "m.npz")["__metadata__"], [1, 1])


def test_long_names_and_metadata_reach_the_safetensors_package(tmp_path):
    long = "x" * 70_000
    tensors = {long: np.arange(3, dtype=np.float32), "é\0名": np.ones((2, 2), np.int64)}
    src = make_zt(tmp_path / "l.zt", tensors, {"note": "ünïcode \0 value"})
    ztensor.convert(src, tmp_path / "l.safetensors")
    back = safetensors_numpy.load_file(str(tmp_path / "l.safetensors"))
    assert sorted(back) == sorted(tensors)
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name], arr)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "l.safetensors"), "np") as f:
        assert f.metadata() == {"note": "ünïcode \0 value"}


def test_non_string_metadata_is_refused_for_safetensors(tmp_path):
    src = make_zt(tmp_path / "m.zt", {"w": np.ones(2, np.float32)}, {"layers": 3})
    refused(tmp_path, src, tmp_path / "m.safetensors", ztensor.UnsupportedError, "'layers'")


# ------------------------------------------------------------------ npz
def test_npz_names_numpy_would_change_or_confuse_are_refused(tmp_path, capsys):
    nul = make_zt(tmp_path / "nul.zt", {"a\0b": np.ones(2, np.float32),
                                        "a\0c": np.zeros(2, np.float32)})
    err = refused(tmp_path, nul, tmp_path / "nul.npz", ztensor.UnsupportedError, "NUL")
    assert err.obj == "a\0b"
    cli_refuses(tmp_path, nul, tmp_path / "nul.npz", capsys)
    # numpy.load answers to "x.npy" with member "x.npy", which is tensor "x"
    twin = make_zt(tmp_path / "twin.zt", {"x": np.ones(2, np.float32),
                                          "x.npy": np.zeros(2, np.float32)})
    err = refused(tmp_path, twin, tmp_path / "twin.npz", ztensor.FormatError, "'x.npy'")
    assert "'x'" in str(err)
    long = make_zt(tmp_path / "long.zt", {"y" * 70_000: np.ones(2, np.float32)})
    refused(tmp_path, long, tmp_path / "long.npz", ztensor.UnsupportedError, "65535")
    cli_refuses(tmp_path, long, tmp_path / "long.npz", capsys)


def test_npz_names_numpy_keeps_are_written(tmp_path):
    tensors = {"x.npy": np.ones(2, np.float32), "a/b": np.arange(3),
               "y" * 60_000: np.zeros(1, np.int8), "é": np.float64(2.5)}
    ztensor.convert(make_zt(tmp_path / "ok.zt", tensors), tmp_path / "ok.npz")
    with np.load(tmp_path / "ok.npz") as back:
        assert sorted(back.files) == sorted(tensors)
        for name, arr in tensors.items():
            np.testing.assert_array_equal(back[name], arr)


# ------------------------------------------------------------------ GGUF
def gguf_source(tmp_path, attributes, name="v.zt"):
    return make_zt(tmp_path / name, {"e": np.ones(2, np.float32)}, attributes)


@pytest.mark.parametrize("attributes,match", [
    ({"gguf_value_types": {"k": 0}, "gguf.k": 300}, r"300 does not fit"),
    ({"gguf_value_types": {"k": 1}, "gguf.k": -200}, r"-200 does not fit"),
    ({"gguf_value_types": {"k": 10}, "gguf.k": -1}, r"does not fit"),
    ({"gguf_value_types": {"k": [9, 5]}, "gguf.k": ["a", "b"]}, r"item 0: a str"),
    ({"gguf_value_types": {"k": [9, 0]}, "gguf.k": [1, 256]}, r"item 1: 256"),
    ({"gguf_value_types": {"k": 6}, "gguf.k": 0.1}, r"not exactly a FLOAT32"),
    ({"gguf_value_types": {"k": 6}, "gguf.k": 1e300}, r"FLOAT32"),
    ({"gguf_value_types": {"k": 7}, "gguf.k": 1}, r"not a bool"),
    ({"gguf_value_types": {"k": 8}, "gguf.k": 5}, r"not a string"),
    ({"gguf_value_types": {"k": 4}, "gguf.k": [1]}, r"not an integer"),
    ({"gguf_value_types": {"k": True}, "gguf.k": 1}, r"recorded GGUF value type True"),
    ({"gguf_value_types": {"k": 99}, "gguf.k": 1}, r"recorded GGUF value type 99"),
    ({"gguf_value_types": {"k": [9, 9]}, "gguf.k": [[1]]}, r"array of arrays"),
    ({"gguf_value_types": "u8", "gguf.k": 1}, r"gguf_value_types"),
    ({"gguf_value_types": {"general.alignment": 4}, "gguf.general.alignment": 0},
     r"alignment 0"),
    ({"gguf_value_types": {"general.alignment": 4}, "gguf.general.alignment": 48},
     r"alignment 48"),
    ({"gguf_value_types": {"general.alignment": 12}, "gguf.general.alignment": 64},
     r"alignment 64"),
    ({"gguf.general.architecture": 7}, r"architecture"),
    ({"k": []}, r"empty list"),
    ({"k": [[1], [2]]}, r"one type"),
    ({"k": 1 << 64}, r"no GGUF value type"),
])
def test_lying_or_unwritable_gguf_values_are_refused(tmp_path, attributes, match):
    src = gguf_source(tmp_path, attributes)
    err = refused(tmp_path, src, tmp_path / "v.gguf", ztensor.UnsupportedError, match)
    assert err.path == str(src)


def test_two_attributes_for_one_gguf_key_are_refused(tmp_path, capsys):
    src = gguf_source(tmp_path, {"gguf.llama.context_length": 4096,
                                 "llama.context_length": 2048})
    err = refused(tmp_path, src, tmp_path / "v.gguf", ztensor.FormatError,
                  "llama.context_length")
    assert "'gguf.llama.context_length'" in str(err)
    cli_refuses(tmp_path, src, tmp_path / "v.gguf", capsys)


def test_gguf_tensor_names_and_ranks_llama_cpp_refuses(tmp_path, capsys):
    at_most = {"n" * 63: np.ones(2, np.float32), "r4": np.ones((1, 2, 1, 2), np.float32)}
    ztensor.convert(make_zt(tmp_path / "ok.zt", at_most), tmp_path / "ok.gguf")
    back = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "ok.gguf")).tensors}
    assert sorted(back) == sorted(at_most)
    for label, tensors, match in [
            ("name64", {"n" * 64: np.ones(2, np.float32)}, "64 bytes"),
            ("name70k", {"n" * 70_000: np.ones(2, np.float32)}, "70000 bytes"),
            ("utf8", {"é" * 32: np.ones(2, np.float32)}, "64 bytes"),
            ("rank5", {"r": np.ones((1, 1, 1, 1, 2), np.float32)}, "5 dimensions")]:
        src = make_zt(tmp_path / f"{label}.zt", tensors)
        refused(tmp_path, src, tmp_path / f"{label}.gguf", ztensor.UnsupportedError, match)
    cli_refuses(tmp_path, tmp_path / "name70k.zt", tmp_path / "x.gguf", capsys)


def test_recorded_types_that_hold_their_values_reach_gguf_py(tmp_path):
    attributes = {"gguf_value_types": {"a": 0, "b": 1, "c": 6, "d": 10, "e": [9, 3],
                                       "general.alignment": 4},
                  "gguf.a": 255, "gguf.b": -128, "gguf.c": 0.5, "gguf.d": (1 << 64) - 1,
                  "gguf.e": [-32768, 32767], "gguf.general.alignment": 64}
    ztensor.convert(gguf_source(tmp_path, attributes), tmp_path / "v.gguf")
    r = gguf.GGUFReader(str(tmp_path / "v.gguf"))
    T = gguf.GGUFValueType
    got = {f.name: (list(f.types), f.contents()) for f in r.fields.values()
           if not f.name.startswith("GGUF.")}
    assert got == {"a": ([T.UINT8], 255), "b": ([T.INT8], -128), "c": ([T.FLOAT32], 0.5),
                   "d": ([T.UINT64], (1 << 64) - 1), "e": ([T.ARRAY, T.INT16], [-32768, 32767]),
                   "general.alignment": ([T.UINT32], 64)}
    assert r.alignment == 64


# ------------------------------------------------------------------ every export
names = st.one_of(
    st.sampled_from(["__metadata__", "x", "x.npy", "a\0b", "a\0c", "é" * 40, "n" * 63,
                     "n" * 64, "a/b", "GGUF"]),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12))
dtype_codes = st.sampled_from(["<f4", "<f2", "<f8", "<i8", "<i4", "i1", "u1", "?"])
attribute_values = st.one_of(st.text(max_size=8), st.integers(-(1 << 65), 1 << 65),
                             st.floats(allow_nan=False), st.booleans(),
                             st.lists(st.integers(-5, 5), max_size=3))


@st.composite
def sources(draw):
    # half the files keep to what every format holds, so that writes are common too
    plain = draw(st.booleans())
    tensors = {}
    for name in draw(st.lists(names, min_size=1, max_size=5, unique=True)):
        dtype = np.dtype(draw(st.sampled_from(["<f4", "<f2", "<i8", "i1"]) if plain
                              else dtype_codes))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=4 if plain else 5, min_side=0,
                                      max_side=3))
        tensors[name] = draw(hnp.arrays(dtype, shape))
    attributes = draw(st.dictionaries(
        st.sampled_from(["k", "gguf.k", "gguf.general.alignment", "note", "general.name"]),
        st.text(max_size=8) if plain else attribute_values, max_size=3))
    if not plain and draw(st.booleans()):
        attributes["gguf_value_types"] = draw(st.dictionaries(
            st.sampled_from(["k", "general.alignment"]),
            st.one_of(st.integers(0, 13), st.lists(st.integers(0, 12), min_size=2,
                                                   max_size=2)), max_size=2))
    return tensors, attributes


def peer_read(kind, path):
    """(name -> array, attributes as the peer sees them) read by the format's own package."""
    if kind == "safetensors":
        from safetensors import safe_open
        with safe_open(path, "np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    if kind == "npz":
        with np.load(path) as z:
            return {k: z[k] for k in z.files}, {}
    r = gguf.GGUFReader(path)
    fields = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    return {t.name: np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)])
            for t in r.tensors}, fields


@settings(max_examples=60, deadline=None)
@given(sources(), st.sampled_from(["safetensors", "npz", "gguf"]))
def test_every_export_round_trips_or_writes_nothing(source, kind):
    tensors, attributes = source
    with tempfile.TemporaryDirectory() as tmp:
        try:
            src = make_zt(os.path.join(tmp, "in.zt"), tensors, attributes)
        except ztensor.ZTensorError:
            event("not a zTensor file")
            return  # not a zTensor file either: nothing to export
        out = os.path.join(tmp, "out." + kind)
        try:
            ztensor.convert(src, out)
        except ztensor.ZTensorError as exc:
            event(f"{kind}: refused")
            assert os.listdir(tmp) == ["in.zt"], exc  # no output, no temporary file
            return
        event(f"{kind}: written")
        assert sorted(os.listdir(tmp)) == ["in.zt", "out." + kind]
        back, meta = peer_read(kind, out)
        assert sorted(back) == sorted(tensors)
        for name, arr in tensors.items():
            got = back[name]
            assert got.shape == arr.shape, name
            np.testing.assert_array_equal(got.view(arr.dtype) if kind == "gguf" else got, arr)
        if kind == "safetensors":
            assert meta == attributes
        if kind == "gguf":
            written = {k[len("gguf."):] if k.startswith("gguf.") else k: v
                       for k, v in attributes.items() if k != "gguf_value_types"}
            meta = {k: v for k, v in meta.items() if k in written}
            assert meta == written


# ------------------------------------------------------------------ checkpoint directories
def write_index(folder, weight_map):
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_two_shards_with_one_stem_are_refused(tmp_path, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()
    safetensors_numpy.save_file({"a": np.ones(2, np.float32)}, str(ck / "part.safetensors"))
    make_zt(ck / "part.zt", {"b": np.zeros(3, np.float32)})
    write_index(ck, {"a": "part.safetensors", "b": "part.zt"})
    with pytest.raises(ztensor.FormatError, match="part.zt") as info:
        ztensor.convert(ck, tmp_path / "out")
    assert "'part.safetensors'" in str(info.value)
    assert not (tmp_path / "out").exists()
    err = cli_refuses(tmp_path, ck, tmp_path / "out", capsys)
    assert "part.safetensors" in err
    r = subprocess.run([sys.executable, "-m", "ztensor", "convert", "-q", str(ck),
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    safetensors_numpy.save_file({"x": np.ones(2, np.float32), "y": np.ones(1, np.float32)},
                                str(ck / "a.safetensors"))
    safetensors_numpy.save_file({"y": np.zeros(1, np.float32)}, str(ck / "b.safetensors"))
    write_index(ck, {"x": "a.safetensors", "y": "b.safetensors"})
    with pytest.raises(ztensor.FormatError, match="a.safetensors.*b.safetensors"):
        ztensor.convert(ck, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_index_naming_a_missing_tensor_is_refused_before_writing(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    safetensors_numpy.save_file({"x": np.ones(2, np.float32)}, str(ck / "a.safetensors"))
    safetensors_numpy.save_file({"y": np.ones(2, np.float32)}, str(ck / "b.safetensors"))
    write_index(ck, {"x": "a.safetensors", "y": "b.safetensors", "z": "b.safetensors"})
    with pytest.raises(ztensor.FormatError, match="'z'"):
        ztensor.convert(ck, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_index_written_lists_what_the_shards_hold(tmp_path):
    """A shard may hold a tensor its index does not list: it is converted, so the
    index written lists it."""
    ck = tmp_path / "ck"
    ck.mkdir()
    safetensors_numpy.save_file({"x": np.ones(2, np.float32), "extra": np.arange(3.0)},
                                str(ck / "a.safetensors"))
    safetensors_numpy.save_file({"y": np.ones(2, np.float32)}, str(ck / "b.safetensors"))
    write_index(ck, {"x": "a.safetensors", "y": "b.safetensors"})
    assert ztensor.convert(ck, tmp_path / "out") == 3
    index = json.loads((tmp_path / "out" / "model.zt.index.json").read_text())
    for shard in ("a.zt", "b.zt"):
        with ztensor.Reader(str(tmp_path / "out" / shard)) as r:
            assert sorted(r.keys()) == sorted(n for n, f in index["weight_map"].items()
                                              if f == shard)
    with ztensor.open_sharded(tmp_path / "out") as r:
        np.testing.assert_array_equal(r["extra"], np.arange(3.0))


def test_converting_a_checkpoint_onto_its_own_files_is_refused(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    make_zt(ck / "a.zt", {"x": np.ones(2, np.float32)})
    make_zt(ck / "b.zt", {"y": np.ones(2, np.float32)})
    with open(ck / "model.zt.index.json", "w") as f:
        json.dump({"weight_map": {"x": "a.zt", "y": "b.zt"}}, f)
    before = {p: (ck / p).read_bytes() for p in os.listdir(ck)}
    with pytest.raises(ztensor.FormatError, match="replace this input"):
        ztensor.convert(ck, ck, force=True)
    assert {p: (ck / p).read_bytes() for p in os.listdir(ck)} == before


# ------------------------------------------------------------------ GGUF reading
def write_gguf(path, tensors, kv=()):
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in kv:
        w.add_string(key, value)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def offset_field(data, name):
    """Where the tensor info of ``name`` keeps its data offset."""
    raw = name.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return at + 4 + 8 * n_dims + 4


def patched(tmp_path, data, label):
    p = tmp_path / f"{label}.gguf"
    p.write_bytes(bytes(data))
    return p


def peer_refuses(path):
    with pytest.raises((ValueError, KeyError)):
        gguf.GGUFReader(str(path))


def test_duplicate_gguf_tensor_names_and_keys_are_refused(tmp_path, capsys):
    base = write_gguf(tmp_path / "b.gguf", {"t1": np.ones(8, np.float32),
                                            "t2": np.zeros(8, np.float32)},
                      [("k.a", "x"), ("k.b", "y")])
    data = base.read_bytes()
    dup_tensor = patched(tmp_path, data.replace(b"t2", b"t1"), "dup_tensor")
    dup_key = patched(tmp_path, data.replace(b"k.b", b"k.a"), "dup_key")
    for path, match in [(dup_tensor, "'t1'.*tensor info #0.*tensor info #1"),
                        (dup_key, "'k.a'.*key/value #")]:
        peer_refuses(path)
        with pytest.raises(ztensor.FormatError, match=match) as info:
            ztensor.Reader(str(path))
        assert info.value.path == str(path)
        cli_refuses(tmp_path, path, tmp_path / "o.zt", capsys)


def test_gguf_tensor_data_must_be_aligned_and_disjoint(tmp_path, capsys):
    base = write_gguf(tmp_path / "b.gguf", {"t1": np.ones(8, np.float32),
                                            "t2": np.zeros(8, np.float32)})
    data = bytearray(base.read_bytes())
    at = offset_field(data, "t2")
    assert struct.unpack_from("<Q", data, at)[0] == 32
    overlap, unaligned = bytearray(data), bytearray(data)
    struct.pack_into("<Q", overlap, at, 0)
    struct.pack_into("<Q", unaligned, at, 36)
    cases = [(patched(tmp_path, overlap, "overlap"), "overlaps tensor 't1'"),
             (patched(tmp_path, unaligned, "unaligned"), "not a multiple of general.alignment")]
    for path, match in cases:
        with pytest.raises(ztensor.FormatError, match=match):
            ztensor.Reader(str(path))
        cli_refuses(tmp_path, path, tmp_path / "o.zt", capsys)


@pytest.mark.parametrize("vtype,value,match", [
    (gguf.GGUFValueType.INT32, 64, "not UINT32"),
    (gguf.GGUFValueType.UINT32, 0, "not a power of two"),
    (gguf.GGUFValueType.UINT32, 48, "not a power of two"),
])
def test_gguf_alignment_on_read(tmp_path, vtype, value, match):
    path = tmp_path / "a.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("general.alignment", value, vtype)
    w.add_tensor("t", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    peer_refuses(path)
    with pytest.raises(ztensor.FormatError, match=match):
        ztensor.Reader(str(path))


def test_gguf_reading_applies_the_limits(tmp_path):
    path = write_gguf(tmp_path / "l.gguf", {"a": np.ones((4, 16), np.float32),
                                            "b": np.ones(4, np.float32)})
    for limits, match in [(ztensor.Limits(max_objects=1), "limit of 1 \\(Limits.max_objects\\)"),
                          (ztensor.Limits(max_rank=1), "max_rank=1"),
                          (ztensor.Limits(max_component_size=128), "max_component_size=128")]:
        with pytest.raises(ztensor.LimitError, match=match):
            ztensor.Reader(str(path), limits=limits)
    with ztensor.Reader(str(path), limits=ztensor.Limits(max_objects=2, max_rank=2,
                                                         max_component_size=256)) as r:
        assert sorted(r.keys()) == ["a", "b"]


def hand_made_gguf(kv_bytes, n_kv=1):
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kv_bytes


def gguf_string(text):
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_gguf_strings_past_the_file_and_deep_arrays(tmp_path):
    past = hand_made_gguf(struct.pack("<Q", 1 << 62) + b"key")
    deep = hand_made_gguf(gguf_string("k") + struct.pack("<I", 9)
                          + struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 0, 0))
    shallow = hand_made_gguf(gguf_string("k") + struct.pack("<I", 9)
                             + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 2) + b"\x01\x02")
    for label, data, match in [("past", past, "runs past the end"),
                               ("deep", deep, "nested more than 8 deep")]:
        with pytest.raises(ztensor.FormatError, match=match):
            ztensor.Reader(str(patched(tmp_path, data, label)))
    with ztensor.Reader(str(patched(tmp_path, shallow, "shallow"))) as r:
        assert r.attributes["gguf.k"] == [[1, 2]]


def test_unknown_ggml_type_warning_has_its_own_category(tmp_path):
    base = write_gguf(tmp_path / "b.gguf", {"tok": np.ones(32, np.float32)})
    data = bytearray(base.read_bytes())
    struct.pack_into("<I", data, offset_field(data, "tok") - 4, 77)
    path = patched(tmp_path, data, "unknown")
    with pytest.warns(zgguf.UnknownGGMLTypeWarning) as record:
        reader = ztensor.Reader(str(path))
    assert issubclass(zgguf.UnknownGGMLTypeWarning, UserWarning)
    message = str(record[0].message)
    assert str(path) in message and "'tok'" in message and "ggml type 77" in message
    with reader:  # its raw bytes are no dense array: read() has them, read_numpy says so
        with pytest.raises(ztensor.UnsupportedError, match="gguf_blocks"):
            reader.read_numpy("tok")
        assert reader.read("tok").format == "gguf_blocks"


@pytest.mark.parametrize("components", [
    {"blocks": np.zeros(33, np.uint16)},    # 66 bytes of IQ2_XXS, but not as bytes
    {"other": np.zeros(66, np.uint8)},
])
def test_gguf_blocks_without_byte_blocks_are_refused(tmp_path, components):
    """A type gguf-py writes but ztensor does not decode (IQ2_XXS) is kept as stored,
    so only the export can tell its blocks are not bytes."""
    src = tmp_path / "q.zt"
    with ztensor.Writer(str(src)) as w:
        w.write("q", ztensor.Tensor(components, shape=(1, 256), format="gguf_blocks",
                                    attributes={"ggml_type_id": 16}))
    refused(tmp_path, src, tmp_path / "q.gguf", ztensor.UnsupportedError, "u8 component")
