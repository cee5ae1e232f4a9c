"""Issue 21, last red-team round on the core: the container readers (v1.2, v2), the
checkpoint loaders and the write side.  Each test builds a real file (the Writer,
or tests/v2files.py's byte-exact v2 builder) and mutates it as a hostile user would;
each fails without its fix."""
import json
import os
import struct

import cbor2
import numpy as np
import pytest
from v2files import build, dense  # tests/ is on sys.path: conftest.py

import ztensor
import ztensor.numpy
from ztensor.io import atomic

REF = os.path.join(os.path.dirname(__file__), "..", "data", "ref-1.2.3", "types.zt")


# ---------------------------------------------------------------- v2 manifest values
def _v2_with_part(**changes):
    obj, blob = dense(np.arange(4, dtype=np.float32), 4096)
    obj["parts"]["data"].update(changes)
    return build({"x": obj}, [blob])


@pytest.mark.parametrize(
    "changes",
    [
        {"dtype": ["f32"]},  # a CBOR array where text belongs: unhashable
        {"dtype": {"f32": 1}},  # a CBOR map
        {"shard": ["s"]},
        {"shard": {"s": 1}},
        {"dtype": 4},  # a number is no dtype either (and must not match a key)
    ],
)
def test_v2_part_lookups_take_text_only(tmp_path, changes):
    """A v2 part's ``dtype`` or ``shard`` given as a CBOR list or map raised
    ``TypeError: unhashable type`` out of ``Reader`` (and every loader over it):
    looking a manifest value up in a table is only done for text."""
    path = tmp_path / "v2.zt"
    path.write_bytes(_v2_with_part(**changes))
    with pytest.raises(ztensor.FormatError) as exc:
        ztensor.Reader(str(path))
    assert exc.value.path == str(path) and exc.value.obj == "x"
    with pytest.raises(ztensor.FormatError):
        ztensor.deserialize(path.read_bytes())
    with pytest.raises(ztensor.FormatError):
        ztensor.safe_open(str(path), "np")


# ---------------------------------------------------------------- checkpoint loaders
def _quantized_with(tmp_path, **attributes):
    """The reference implementation's quantized object (tests/data/ref-1.2.3), its
    attributes changed in the manifest: a valid file in a convention ztensor does
    not implement, which read() keeps as stored and only dequantize refuses."""
    data = open(REF, "rb").read()
    n = struct.unpack("<Q", data[-16:-8])[0]
    manifest = cbor2.loads(data[-16 - n : -16])
    manifest["objects"]["q"]["attributes"].update(attributes)
    raw = cbor2.dumps(manifest)
    path = tmp_path / "q.zt"
    path.write_bytes(data[: -16 - n] + raw + struct.pack("<Q", len(raw)) + data[-8:])
    return path


@pytest.mark.parametrize("attributes", [{"packing": 255}, {"pack_order": "msb_first"}])
def test_checkpoint_loaders_name_the_file_and_object(tmp_path, attributes):
    """``ztensor.numpy.load_file``/``torch.load_file``/``safe_open`` hand a quantized
    object out under its GPTQ names (or dequantized): a convention they cannot
    convert was an UnsupportedError naming neither the file nor the object (the
    Tensor given to to_gptq/dequantize knows no file)."""
    path = _quantized_with(tmp_path, **attributes)
    with ztensor.Reader(str(path)) as r:
        r.verify()  # a valid object, in a convention only dequantize refuses
    calls = [
        lambda: ztensor.numpy.load_file(str(path)),
        lambda: ztensor.numpy.load_file(str(path), dequantize=True),
    ]
    with ztensor.safe_open(str(path), "np") as f:
        calls.append(lambda: f.get_tensor("q.qweight"))
        calls.append(lambda: f.get_tensor("q"))
        for call in calls:
            with pytest.raises(ztensor.UnsupportedError) as exc:
                call()
            assert exc.value.path == str(path) and exc.value.obj == "q"
            assert str(exc.value).startswith(f"{path}: object 'q': ")


def test_torch_load_file_names_the_file_and_object(tmp_path):
    torch_api = pytest.importorskip("ztensor.torch")
    path = _quantized_with(tmp_path, packing=255)
    for kwargs in ({}, {"dequantize": True}):
        with pytest.raises(ztensor.UnsupportedError) as exc:
            torch_api.load_file(str(path), **kwargs)
        assert exc.value.path == str(path) and exc.value.obj == "q"
    with pytest.raises(ztensor.UnsupportedError) as exc:
        torch_api.load(path.read_bytes())
    assert exc.value.path == "<bytes>" and exc.value.obj == "q"


# ---------------------------------------------------------------- atomic JSON writes
def test_index_write_over_a_directory_is_a_write_error(tmp_path):
    """A directory where the index goes: ``save_sharded`` raised a bare
    IsADirectoryError (every other file this package writes gives a WriteError
    naming the path), and the directory is left as it was."""
    (tmp_path / "model.zt.index.json").mkdir()
    with pytest.raises(ztensor.WriteError) as exc:
        atomic.write_json_atomically(str(tmp_path / "model.zt.index.json"), {"a": 1})
    assert exc.value.path == str(tmp_path / "model.zt.index.json")
    assert (tmp_path / "model.zt.index.json").is_dir()
    assert sorted(os.listdir(tmp_path)) == ["model.zt.index.json"]  # no temporary left


def test_save_sharded_over_an_index_directory_is_a_write_error(tmp_path):
    (tmp_path / "model.zt.index.json").mkdir()
    tensors = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
    with pytest.raises(ztensor.WriteError, match="not a file"):
        ztensor.save_sharded(tensors, str(tmp_path), max_shard_size=12)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.zt.index.json"]  # no shard


def test_save_sharded_replaces_an_index_linked_out_of_the_folder_keeping_its_mode(tmp_path):
    """Re-saving a checkpoint whose index is a symlink out of its folder (a dataset
    tool's layout: DVC's or git-annex's cache, a Hugging Face snapshot) replaces the
    link with the new index, with the permission bits of the file it pointed to,
    and leaves that file as it was (a cache's object, which writing through the
    link corrupted; and a move out of the folder was in no record of moves, so a
    killed save could not be undone: checkpoint_moves._destination).  A link to a
    file of the folder stays a link (test_index_written_through_a_symlink_keeps_the_link)."""
    import os
    import stat

    real = tmp_path / "store" / "model.zt.index.json"
    real.parent.mkdir()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tensors = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
    ztensor.save_sharded(tensors, str(ckpt), max_shard_size=12)
    (ckpt / "model.zt.index.json").rename(real)
    os.chmod(real, 0o640)
    (ckpt / "model.zt.index.json").symlink_to(real)
    old = real.read_bytes()
    tensors["a"] = np.full(3, 7, np.float32)
    ztensor.save_sharded(tensors, str(ckpt), max_shard_size=12)
    assert not (ckpt / "model.zt.index.json").is_symlink()
    assert stat.S_IMODE(os.stat(ckpt / "model.zt.index.json").st_mode) == 0o640
    assert real.read_bytes() == old
    with ztensor.open_sharded(str(ckpt)) as r:
        np.testing.assert_array_equal(r.read_numpy("a"), tensors["a"])


def test_index_written_through_a_symlink_keeps_the_link(tmp_path):
    """As for ``.zt`` files and exports (atomic.final_target): a symlinked index
    stays a link, to the new index, with the target's mode; it was replaced by a
    regular file and the link's target kept the old index."""
    (tmp_path / "real.json").write_text("{}")
    os.symlink("real.json", tmp_path / "model.zt.index.json")
    os.chmod(tmp_path / "real.json", 0o640)
    index = {"metadata": {}, "weight_map": {"a": "x.zt"}}
    atomic.write_json_atomically(str(tmp_path / "model.zt.index.json"), index)
    assert os.path.islink(tmp_path / "model.zt.index.json")
    assert json.loads((tmp_path / "real.json").read_text()) == index
    assert os.stat(tmp_path / "real.json").st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["model.zt.index.json", "real.json"]


# ---------------------------------------------------------------- checkpoint names
def _colliding_file(tmp_path, names):
    """Quantized objects (the reference's ``q``) and dense ones under ``names``
    (name -> "q" or a dense array), written by the Writer."""
    with ztensor.Reader(REF) as r:
        q = r.read("q", copy=True)
    path = tmp_path / "collide.zt"
    with ztensor.Writer(str(path)) as w:
        for name, value in names.items():
            w.write(name, q if isinstance(value, str) else value)
    return path


@pytest.mark.parametrize(
    "names, taken",
    [
        ({"a.weight": "q", "a.scales": np.arange(3, dtype=np.float32)}, "a.scales"),
        ({"a.weight": "q", "a": "q"}, "a.qweight"),
        ({"b.weight": "q", "b.g_idx": np.zeros(2, np.int32)}, "b.g_idx"),
    ],
)
def test_checkpoint_names_that_meet_are_refused(tmp_path, names, taken):
    """The flat checkpoint view hands a quantized ``a.weight`` out as ``a.qweight``,
    ``a.qzeros``, ``a.scales``, ``a.g_idx``: a dense ``a.scales`` beside it, or a
    quantized ``a``, gave one dict entry for two tensors, the other dropped without
    a word (load_file returned 4 tensors for 6).  Now a FormatError naming both;
    ``dequantize=True`` (each object under its own name) still loads them all."""
    path = _colliding_file(tmp_path, names)
    with pytest.raises(ztensor.FormatError) as exc:
        ztensor.numpy.load_file(str(path))
    assert exc.value.path == str(path) and exc.value.obj == taken
    assert "two tensors would both be named" in str(exc.value)
    with ztensor.safe_open(str(path), "np") as f:
        with pytest.raises(ztensor.FormatError):
            f.keys()
    assert sorted(ztensor.numpy.load_file(str(path), dequantize=True)) == sorted(names)


def test_torch_load_file_refuses_checkpoint_names_that_meet(tmp_path):
    torch_api = pytest.importorskip("ztensor.torch")
    path = _colliding_file(tmp_path, {"a.weight": "q", "a.qzeros": np.zeros(2, np.int32)})
    with pytest.raises(ztensor.FormatError) as exc:
        torch_api.load_file(str(path))
    assert exc.value.obj == "a.qzeros"


# ---------------------------------------------------------------- Tensor shapes
@pytest.mark.parametrize("dim", [2.5, "2", np.float64(2.0)])
def test_tensor_shape_is_integers_not_truncated(tmp_path, dim):
    """``Tensor(shape=(2.5,))`` became shape (2,) through ``int()``, and the Writer
    wrote it: a shape the caller never gave, silently.  A dimension that is not an
    integer is a TypeError (numpy ints still are integers)."""
    with pytest.raises(TypeError):
        ztensor.Tensor({"data": np.zeros(2, np.float32)}, shape=(dim,))
    assert ztensor.Tensor({"data": np.zeros(2, np.float32)}, shape=(np.int32(2),)).shape == (2,)


def test_read_into_a_meta_tensor_is_refused(tmp_path):
    """``read_into(name, torch.empty(..., device="meta"))`` returned as if it had
    filled it: a meta tensor has no memory, so the values went nowhere."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "a.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("a", np.arange(6, dtype=np.float32), compress=True)
        w.write_numpy("b", np.arange(6, dtype=np.float32))
    with ztensor.Reader(str(path)) as r:
        for name in ("a", "b"):
            with pytest.raises(ValueError, match="meta"):
                r.read_into(name, torch.empty(6, device="meta"))
