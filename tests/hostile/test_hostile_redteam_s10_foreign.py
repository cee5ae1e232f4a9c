"""Red team, session 10 (issue 21, closing round): the other-format readers and the
exporters.  Files are made by the real writers (torch.save, safetensors, numpy) and
then changed where a hostile author would.  Each test names the promise of
docs/threat-model.md it holds and the one function that keeps it."""

import json
import struct

import numpy as np
import pytest

import ztensor
import ztensor.numpy
from ztensor.foreign import export
from ztensor.foreign.base import spec_of
from ztensor.tensor import Tensor


def _safetensors_with(tmp_path, change, tensors=None):
    """A real safetensors file (safetensors.numpy.save_file, with metadata), its
    header then rewritten by ``change``."""
    sf = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "m.safetensors"
    sf.save_file(tensors or {"w": np.arange(4, dtype=np.float32)}, path, metadata={"k": "v"})
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return path


# ---- safetensors: __metadata__ is a map of string to string
# (Clean: safetensors_file.check_metadata)


@pytest.mark.parametrize("value", [1, 1.5, True, None, ["a"], {"b": "c"}])
def test_safetensors_metadata_value_that_is_not_a_string_is_refused(tmp_path, value):
    sf = pytest.importorskip("safetensors.numpy")
    path = _safetensors_with(tmp_path, lambda h: h["__metadata__"].__setitem__("n", value))
    with pytest.raises(Exception):  # the reference reader refuses such a file
        sf.load_file(path)
    with pytest.raises(ztensor.FormatError, match="__metadata__") as err:
        ztensor.Reader(path)
    assert str(path) in str(err.value) and "'n'" in str(err.value)
    # bytes in memory name the caller's input, not a temporary file
    with pytest.raises(ztensor.FormatError, match="__metadata__") as err:
        ztensor.numpy.load(path.read_bytes())
    assert "<bytes>" in str(err.value)


def test_safetensors_string_metadata_and_null_metadata_are_read(tmp_path):
    path = _safetensors_with(tmp_path, lambda h: None)
    with ztensor.Reader(path) as r:
        assert r.attributes == {"k": "v"}
    path = _safetensors_with(tmp_path, lambda h: h.__setitem__("__metadata__", None))
    with ztensor.Reader(path) as r:
        assert r.attributes == {}


# ---- torch.save: plain values kept whole; nothing dropped without a word
# (Clean, Bounded: pytorch._collect, pytorch._text_budget)


def test_pickle_string_attribute_is_kept_whole(tmp_path):
    torch = pytest.importorskip("torch")
    note = "".join(chr(0x41 + i % 26) for i in range(50_000)) + "\u00e9 end"
    torch.save({"w": torch.ones(2), "note": note, "cfg": {"name": "x" * 5000}}, tmp_path / "m.pt")
    with ztensor.Reader(tmp_path / "m.pt") as r:
        assert r.attributes["pickle.note"] == note  # was cut to 4,096 characters
        assert r.attributes["pickle.cfg.name"] == "x" * 5000
        assert "pickle.omitted_attributes" not in r.attributes


def test_pickle_values_past_the_attribute_bound_are_counted_not_dropped(tmp_path):
    torch = pytest.importorskip("torch")
    cfg = {f"k{i}": i for i in range(10_005)}
    torch.save({"w": torch.ones(2), "cfg": cfg}, tmp_path / "m.pt")
    with ztensor.Reader(tmp_path / "m.pt") as r:
        kept = [k for k in r.attributes if k.startswith("pickle.cfg.")]
        assert len(kept) == 10_000
        assert r.attributes["pickle.omitted_attributes"] == 5
        np.testing.assert_array_equal(r.read_numpy("w"), [1, 1])


def test_pickle_names_made_from_a_shared_key_are_bounded(tmp_path):
    # one 100,000-character key, memoised once, at 60 levels of nesting: every
    # tensor's name was 6 MB, so a 100 KB file made gigabytes of names (30 tensors:
    # 180 MB; 3,000 of them: 18 GB) before anything was refused
    torch = pytest.importorskip("torch")
    key, t = "k" * 100_000, torch.zeros(1)
    nested = {i: t for i in range(30)}
    for _ in range(60):
        nested = {key: nested}
    path = tmp_path / "blow.pt"
    torch.save(nested, path)
    assert path.stat().st_size < 200_000
    with pytest.raises(ztensor.LimitError, match="names total") as err:
        ztensor.Reader(path)
    assert str(path) in str(err.value)


def test_pickle_shared_key_attributes_are_bounded_and_counted(tmp_path):
    torch = pytest.importorskip("torch")
    key = "k" * 100_000
    nested = {i: i for i in range(2_000)}  # plain values: attributes, not tensors
    for _ in range(60):
        nested = {key: nested}
    torch.save({"w": torch.ones(1), "cfg": nested}, tmp_path / "m.pt")
    with ztensor.Reader(tmp_path / "m.pt") as r:
        size = sum(len(k) for k in r.attributes)
        assert size <= 64 * (tmp_path / "m.pt").stat().st_size
        assert r.attributes["pickle.omitted_attributes"] > 0


# ---- torch and numpy agree on an unknown logical type: the storage elements
# (torch_bridge.torch_bits_for)


def test_torch_reads_an_unknown_logical_type_as_numpy_does(tmp_path):
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt_torch

    path = str(tmp_path / "u.zt")
    with ztensor.Writer(path) as w:
        w.write("x", Tensor({"data": np.arange(6, dtype=np.uint16)}, types={"data": "acme.u16"}))
    with ztensor.Reader(path) as r:
        want = r.read_numpy("x")
        assert want.dtype == np.uint16
        got = [r.read_torch("x"), r.read_torch("x", copy=True)]
    got.append(zt_torch.load_file(path)["x"])
    got.append(zt_torch.load(open(path, "rb").read())["x"])
    with ztensor.safe_open(path, framework="pt") as f:
        got += [f.get_tensor("x"), f.get_slice("x")[0:6]]
    for t in got:  # were UnsupportedError, where numpy and a slice gave the elements
        assert t.dtype == torch.uint16
        np.testing.assert_array_equal(t.numpy(), want)


# ---- every exporter writes bool bytes 0 or 1 (export._as_stored, values.clean_bools)


class _ArraysReader:
    """The part of the Reader API the exporters use, over arrays in memory."""

    def __init__(self, path, arrays):
        self.path, self.attributes, self._arrays = path, {}, arrays

    def keys(self):
        return list(self._arrays)

    def metadata(self, name):
        return spec_of(name, Tensor({"data": self._arrays[name]}))

    def read(self, name):
        return Tensor({"data": self._arrays[name]})


def _bool_with_byte(value):
    arr = np.array([True, False, True, True])
    arr.view(np.uint8)[0] = value
    return arr


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
def test_export_writes_bool_bytes_zero_or_one(tmp_path, ext):
    reader = _ArraysReader(str(tmp_path / "in"), {"b": _bool_with_byte(2)})
    out = str(tmp_path / ("o" + ext))
    export.writer_for(export.format_for(out))(reader, out)
    if ext == ".npz":
        stored = np.load(out)["b"]
    else:
        stored = pytest.importorskip("safetensors.numpy").load_file(out)["b"]
    assert stored.view(np.uint8).tolist() == [1, 0, 1, 1]


@pytest.mark.parametrize("ext", [".npz", ".safetensors", ".zt"])
def test_convert_of_a_safetensors_bool_byte_two_writes_one(tmp_path, ext):
    path = _safetensors_with(tmp_path, lambda h: None, {"b": np.array([True, False, True])})
    raw = bytearray(path.read_bytes())
    raw[8 + struct.unpack("<Q", raw[:8])[0]] = 2
    path.write_bytes(bytes(raw))
    out = tmp_path / ("o" + ext)
    ztensor.convert(str(path), str(out), drop_attributes=ext == ".npz")  # npz: arrays only
    with ztensor.Reader(out) as r:
        assert np.asarray(r.read("b").components["data"]).view(np.uint8).tolist() == [1, 0, 1]


# ---- HDF5: nothing dropped or changed without a word (hdf5_file._spec, hdf5_file._plain)


def test_hdf5_empty_dataset_is_listed_not_dropped(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "e.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("g/e", data=h5py.Empty("f4"))
        f["ok"] = np.ones(2, np.float32)
    with ztensor.Reader(path) as r:
        assert r.keys() == ["ok"]
        assert r.attributes["hdf5_skipped_datasets"] == ["/g/e"]  # was dropped silently


def test_hdf5_byte_string_attribute_keeps_its_bytes(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["ok"] = np.ones(2, np.float32)
        f.attrs["raw"] = np.bytes_(b"\xff\xfe\x00x")
        f.attrs["text"] = np.bytes_("caf\u00e9".encode())
    with ztensor.Reader(path) as r:
        # the bytes were decoded with U+FFFD replacing what is not UTF-8
        assert r.attributes["hdf5.raw"] == b"\xff\xfe\x00x"
        assert type(r.attributes["hdf5.raw"]) is bytes
        assert r.attributes["hdf5.text"] == "caf\u00e9"
    out = tmp_path / "a.zt"
    ztensor.convert(str(path), str(out))
    with ztensor.Reader(out) as r:
        assert r.attributes["hdf5.raw"] == b"\xff\xfe\x00x"
