"""Hostile input, round three: the leftovers (session 11).  Each test builds its input
with the real writer (onnx.helper, torch.save, numpy, ztensor.Writer, the v2 spec's
byte layout) and names the promise of docs/threat-model.md it holds and the one
function that keeps it."""

import os
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
import ztensor.numpy

# ---- the checkpoint loaders give the same dict for a file and for its bytes
# (Clean: numpy._load_reader / torch._load_reader, used by load_file and load)


def _gptq_file(tmp_path):
    w = np.random.default_rng(11).standard_normal((64, 256)).astype(np.float32)
    path = tmp_path / "gptq.zt"
    with ztensor.Writer(path) as out:
        out.write("layer.q_proj.weight", ztensor.quantize(w, bits=4, group_size=128))
        out.write_numpy("layer.norm.weight", np.linspace(0, 1, 64, dtype=np.float32))
        out.write_numpy("big", np.arange(300_000, dtype=np.int16))
    return path


def _same_arrays(a, b):
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key])


def test_numpy_load_of_bytes_gives_what_load_file_gives(tmp_path):
    """load(bytes) refused the quantized object (read_numpy reads dense objects)
    while load_file handed it out under its GPTQ names: one file, two answers."""
    path = _gptq_file(tmp_path)
    from_file = ztensor.numpy.load_file(path, copy=True)
    assert "layer.q_proj.qweight" in from_file
    from_bytes = ztensor.numpy.load(path.read_bytes())
    _same_arrays(from_file, from_bytes)
    for arr in [*from_file.values(), *from_bytes.values()]:  # owned, as both promise
        assert arr.flags.writeable


def test_torch_load_of_bytes_gives_what_load_file_gives(tmp_path):
    torch = pytest.importorskip("torch")
    import ztensor.torch

    path = _gptq_file(tmp_path)
    from_file = ztensor.torch.load_file(path, copy=True)
    from_bytes = ztensor.torch.load(path.read_bytes())
    assert list(from_file) == list(from_bytes)
    for key in from_file:
        assert from_file[key].dtype == from_bytes[key].dtype, key
        assert torch.equal(from_file[key], from_bytes[key]), key


def test_numpy_load_of_safetensors_bytes_matches_load_file(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int8)}, path)
    _same_arrays(ztensor.numpy.load_file(path, copy=True), ztensor.numpy.load(path.read_bytes()))


# ---- a file that shrinks while open (mmap=False) is an error naming the object
# (Clean: source.Source.array and source.Source.read_ranges hand the object to
# source._pread_exactly_into)


def _plain_file(tmp_path, sizes):
    path = tmp_path / "m.zt"
    with ztensor.Writer(path) as w:
        for name, n in sizes.items():
            w.write_numpy(name, np.arange(n, dtype=np.float32))
    return path


_READS = {
    "read_numpy": lambda r, n: r.read_numpy(n),
    "read_numpy copy": lambda r, n: r.read_numpy(n, copy=True),
    "getitem": lambda r, n: r[n],
    "read": lambda r, n: r.read(n),
    "read_into": lambda r, n: r.read_into(n, np.empty(r.metadata(n).shape, np.float32)),
    "batch": lambda r, n: r.read_numpy(["a", n], copy=True),
    "batch read_into": lambda r, n: r.read_into({n: np.empty(r.metadata(n).shape, np.float32)}),
}


@pytest.mark.parametrize("how", list(_READS))
@pytest.mark.parametrize("size", [1024, 400_000])  # shared fetches; one of its own
def test_a_file_truncated_while_open_names_the_object(tmp_path, how, size):
    path = _plain_file(tmp_path, {"a": 16, "b": size, "c": 16})
    with ztensor.Reader(path, mmap=False) as r:
        start = r.metadata("b").components["data"].offset
        os.truncate(path, start + 100)  # b is cut; a lies before the cut
        with pytest.raises(ztensor.FormatError) as err:
            _READS[how](r, "b")
    assert err.value.obj == "b", str(err.value)
    assert err.value.path == str(path)
    assert "shrank while open" in str(err.value)


def test_a_batch_read_names_the_object_a_shared_fetch_reaches(tmp_path):
    """Small neighbours are fetched as one range; the error of that fetch named no
    object.  The cut lies in c, after b's bytes: c is named, not b."""
    path = _plain_file(tmp_path, {"a": 16, "b": 64, "c": 64, "d": 16})
    with ztensor.Reader(path, mmap=False) as r:
        comp = r.metadata("c").components["data"]
        os.truncate(path, comp.offset + 8)
        assert r.read_numpy("b").tolist() == list(range(64))
        with pytest.raises(ztensor.FormatError) as err:
            r.read_numpy(["a", "b", "c", "d"], copy=True)
    assert err.value.obj == "c", str(err.value)


# ---- a storage member holds exactly what the pickle declares; an .npy array exactly
# what its header declares (Clean: foreign.base.check_held_size, applied by
# pytorch._read_storages, numpy_files.open_npy and numpy_files._open_npz)


def _rewrite_member(path, member_suffix, change):
    """The zip at ``path`` with the member ending in ``member_suffix`` passed through
    ``change`` (bytes -> bytes), every other member as it was."""
    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for info, data in members:
            z.writestr(info, change(data) if info.filename.endswith(member_suffix) else data)


def _torch_file(tmp_path, delta):
    torch = pytest.importorskip("torch")
    path = tmp_path / f"m{delta}.pt"
    torch.save({"x": torch.arange(4, dtype=torch.float32), "y": torch.ones(2)}, path)
    if delta > 0:
        _rewrite_member(path, "/data/0", lambda d: d + bytes(range(delta)))
    elif delta < 0:
        _rewrite_member(path, "/data/0", lambda d: d[:delta])
    return path


@pytest.mark.parametrize("delta", [8, 1, -4])
def test_a_storage_member_of_another_size_than_declared_is_refused(tmp_path, delta):
    """torch.save writes numel x element size bytes per storage.  torch.load (its
    default, mmap=False) refuses a record of any other size: RuntimeError "record size
    (24 bytes) does not match expected size (16 bytes = 16 elements * 1
    bytes/element)" (PyTorchStreamReader, through get_storage_from_record in
    torch/serialization.py's load_tensor).  With mmap=True it slices the declared
    bytes out of the mapped file and says nothing: a longer member's extra bytes are
    never seen, a shorter one's tensor takes the bytes of whatever record follows.
    Here both were read silently as the declared elements: more bytes (hidden from
    every tensor) were accepted."""
    torch = pytest.importorskip("torch")
    path = _torch_file(tmp_path, delta)
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(path, weights_only=True)
    with pytest.raises(ztensor.FormatError, match=f"holds {16 + delta} bytes, not the 16") as err:
        ztensor.Reader(path)
    assert err.value.path == str(path)
    assert err.value.obj == "x"
    assert "data/0" in str(err.value)


def test_a_storage_member_of_the_declared_size_reads(tmp_path):
    path = _torch_file(tmp_path, 0)
    with ztensor.Reader(path) as r:
        assert r.read_numpy("x").tolist() == [0.0, 1.0, 2.0, 3.0]


@given(st.integers(-16, 64))
@settings(max_examples=20, deadline=None)
def test_any_storage_size_but_the_declared_one_is_refused(tmp_path_factory, delta):
    path = _torch_file(tmp_path_factory.mktemp("pt"), delta)
    if delta == 0:
        with ztensor.Reader(path) as r:
            assert r.read_numpy("x").tolist() == [0.0, 1.0, 2.0, 3.0]
    else:
        with pytest.raises(ztensor.FormatError, match="storage member"):
            ztensor.Reader(path)


def test_a_second_array_saved_to_one_npy_file_is_refused(tmp_path):
    """np.save twice to one file: np.load reads the first array a call, so the file
    holds two; a Reader listing one dropped the second without a word."""
    path = tmp_path / "two.npy"
    with open(path, "wb") as f:
        np.save(f, np.arange(4))
        np.save(f, np.arange(3))
    with open(path, "rb") as f:  # numpy reads both, one a call
        assert np.load(f).tolist() == [0, 1, 2, 3]
        assert np.load(f).tolist() == [0, 1, 2]
    with pytest.raises(ztensor.FormatError, match="bytes no tensor shows") as err:
        ztensor.Reader(path)
    assert err.value.obj == "two" and err.value.path == str(path)


def test_an_npy_file_of_exactly_its_array_reads(tmp_path):
    path = tmp_path / "one.npy"
    np.save(path, np.arange(4))
    with ztensor.Reader(path) as r:
        assert r.read_numpy("one").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("delta", [8, -8])
def test_an_npz_member_of_another_size_than_its_header_is_refused(tmp_path, delta):
    """np.load of the .npz reads the declared elements and ignores more bytes."""
    path = tmp_path / "m.npz"
    np.savez(path, a=np.arange(4.0), b=np.ones(2))
    _rewrite_member(path, "a.npy", lambda d: d + bytes(delta) if delta > 0 else d[:delta])
    if delta > 0:
        assert np.load(path)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ztensor.FormatError, match=f"holds {32 + delta} bytes, not the 32") as err:
        ztensor.Reader(path)
    assert err.value.obj == "a" and err.value.path == str(path)


# ---- a v2 gguf.* object's own ggml_type / ggml_type_id / block_* say what its layout
# says (Clean: v2._Schema.gguf); a gguf_blocks object's ggml_type names its id's type
# (Clean: gguf_blocks.check_attributes)


def _q8_blocks():
    """Two rows of 32 values as Q8_0 blocks, made by the gguf package, and its
    dequantization of them."""
    gguf = pytest.importorskip("gguf")
    values = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    return blocks, gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)


def _v2_q8(tmp_path, **extra):
    """A v2 file of one gguf.q8_0/1 object (the reference profile's attributes,
    elems_per_block and block_bytes, plus ``extra``)."""
    import v2files

    blocks, _ = _q8_blocks()
    raw = np.ascontiguousarray(blocks).tobytes()
    obj = {
        "shape": [2, 32],
        "layout": "gguf.q8_0/1",
        "attributes": {"elems_per_block": 32, "block_bytes": 34, **extra},
        "parts": {"data": {"dtype": "u8", "blob": [4096, len(raw)]}},
    }
    path = tmp_path / "q.zt"
    path.write_bytes(v2files.build({"w": obj}, [(4096, raw)]))
    return path


@pytest.mark.parametrize(
    "extra",
    [
        {"ggml_type_id": 2},  # Q4_0's id on a Q8_0 layout
        {"ggml_type_id": True},  # 1 as a bool
        {"block_elements": 16},
        {"block_elements": 32.0},
        {"ggml_type": "Q4_0"},
        {"ggml_type": 8},
    ],
)
def test_a_v2_gguf_attribute_contradicting_its_layout_is_refused(tmp_path, extra):
    """They were replaced by the layout's without a word: a reader of the file's
    own attributes would see another type than the one read."""
    path = _v2_q8(tmp_path, **extra)
    with pytest.raises(ztensor.FormatError, match="contradicts the layout") as err:
        ztensor.Reader(path)
    assert err.value.obj == "w" and err.value.path == str(path)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"ggml_type_id": 8, "block_elements": 32},
        {"ggml_type": "Q8_0"},
        {"ggml_type": "q8_0", "block_bytes": 34},
    ],
)
def test_a_v2_gguf_attribute_agreeing_with_its_layout_reads(tmp_path, extra):
    _, want = _q8_blocks()
    with ztensor.Reader(_v2_q8(tmp_path, **extra)) as r:
        obj = r.read("w")
        assert obj.format == "gguf_blocks"
        assert obj.attributes["ggml_type"] == "Q8_0" and obj.attributes["ggml_type_id"] == 8
        np.testing.assert_array_equal(ztensor.dequantize(obj, dtype=np.float32), want)


def _zt_q8(tmp_path):
    """A .zt file holding the Q8_0 tensor of a GGUF file the gguf package wrote."""
    gguf = pytest.importorskip("gguf")
    blocks, _ = _q8_blocks()
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("w", blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with ztensor.Reader(src) as r:
        obj = r.read("w")
    path = tmp_path / "q.zt"
    with ztensor.Writer(path) as out:
        out.write("w", obj)
    return obj, path


def test_a_gguf_blocks_type_name_contradicting_its_id_is_refused(tmp_path):
    """ggml_type said Q4_0 (what `ztensor ls` shows) while ggml_type_id 8 (Q8_0)
    decoded: the id won without a word.  The writer refuses it, and so does every
    read of a file that holds it."""
    obj, path = _zt_q8(tmp_path)
    assert obj.attributes["ggml_type"] == "Q8_0"
    bad = ztensor.Tensor(
        dict(obj.components),
        shape=obj.shape,
        format="gguf_blocks",
        attributes={**obj.attributes, "ggml_type": "Q4_0"},
    )
    with pytest.raises(ztensor.FormatError, match="contradicts ggml_type_id=8"):
        with ztensor.Writer(tmp_path / "bad.zt") as out:
            out.write("w", bad)
    raw = path.read_bytes()
    assert raw.count(b"Q8_0") == 1  # the name in the manifest, nowhere else
    path.write_bytes(raw.replace(b"Q8_0", b"Q4_0"))
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.FormatError, match="contradicts ggml_type_id=8") as err:
            r.read("w")
        assert err.value.obj == "w"
        with pytest.raises(ztensor.FormatError):
            r.verify()
