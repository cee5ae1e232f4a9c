"""``ztensor._safe_open_handle(f, framework, device)``: safetensors' entry point for an
open file handle (ztensor/safe.py).  It opens the handle's file by name, as safetensors
does, after proving the name still leads to the handle's file, and is then exactly
``safe_open`` for that file: zTensor and .safetensors files, binary and text-mode
handles, numpy and torch."""
import io
import json
import os
import struct

import numpy as np
import pytest

import ztensor
import ztensor.numpy as znp
from ztensor import safe


@pytest.fixture
def zt_file(tmp_path):
    path = tmp_path / "model.zt"
    znp.save_file({"b": np.arange(12, dtype=np.float32).reshape(4, 3),
                   "a": np.array([1, -2, 3], np.int8),
                   "c": np.arange(6, dtype=np.uint16).reshape(2, 3)}, path,
                  metadata={"framework": "np"})
    return path


@pytest.fixture
def st_file(tmp_path):
    """A real safetensors file, written by safetensors."""
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "model.safetensors"
    st.save_file({"b": np.arange(12, dtype=np.float32).reshape(4, 3),
                  "a": np.array([1, -2, 3], np.int8)}, str(path), metadata={"k": "v"})
    return path


def _read_all(g):
    return {"keys": g.keys(), "offset_keys": g.offset_keys(), "metadata": g.metadata(),
            "tensors": {k: np.asarray(g.get_tensor(k)) for k in g.keys()},
            "slices": {k: (g.get_slice(k).get_shape(), g.get_slice(k).get_dtype(),
                           np.asarray(g.get_slice(k)[1:])) for k in g.keys()}}


def _same(x, y):
    assert x.keys() == y.keys()
    for field in ("keys", "offset_keys", "metadata"):
        assert x[field] == y[field], field
    for name in x["tensors"]:
        np.testing.assert_array_equal(x["tensors"][name], y["tensors"][name])
        assert x["tensors"][name].dtype == y["tensors"][name].dtype
        shape, dtype, part = x["slices"][name]
        assert (shape, dtype) == y["slices"][name][:2]
        np.testing.assert_array_equal(part, y["slices"][name][2])


# ------------------------------------------------------------ safetensors' own tests
def test_numpy_example_text_mode(tmp_path):
    """safetensors' tests/test_handle.py test_numpy_example, ported: the handle is
    opened in text mode ("r")."""
    tensors = {"a": np.zeros((2, 2)), "b": np.zeros((2, 3), dtype=np.uint8)}
    znp.save_file(tensors, tmp_path / "out_np.zt")
    loaded = {}
    with open(tmp_path / "out_np.zt", "r") as f:
        with ztensor._safe_open_handle(f, framework="np", device="cpu") as g:
            for key in g.keys():
                loaded[key] = g.get_tensor(key)
    assert tensors.keys() == loaded.keys()
    for k, v in tensors.items():
        assert np.allclose(v, loaded[k])


def test_fsspec(tmp_path):
    """safetensors' test_fsspec, ported: a handle from fsspec's local filesystem."""
    fsspec = pytest.importorskip("fsspec")
    tensors = {"a": np.zeros((2, 2)), "b": np.zeros((2, 3), dtype=np.uint8)}
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "fs.zt")
    with fs.open(path, "wb") as f:
        f.write(znp.save(tensors))
    loaded = {}
    with fs.open(path, "rb") as f:
        with ztensor._safe_open_handle(f, framework="np", device="cpu") as g:
            for key in g.keys():
                loaded[key] = g.get_tensor(key)
    assert tensors.keys() == loaded.keys()
    for k, v in tensors.items():
        assert np.allclose(v, loaded[k])


# ------------------------------------------------------------ exactly safe_open
@pytest.mark.parametrize("mode", ["rb", "r", "r+b"])
@pytest.mark.parametrize("framework", ["np", "numpy"])
def test_same_as_safe_open_zt(zt_file, mode, framework):
    with ztensor.safe_open(zt_file, framework=framework) as g:
        expected = _read_all(g)
    with open(zt_file, mode) as f:
        with ztensor._safe_open_handle(f, framework=framework) as g:
            _same(_read_all(g), expected)
    assert expected["keys"] == ["a", "b", "c"]


@pytest.mark.parametrize("mode", ["rb", "r"])
def test_same_as_safe_open_safetensors(st_file, mode):
    with ztensor.safe_open(st_file, framework="np") as g:
        expected = _read_all(g)
    with open(st_file, mode) as f, ztensor._safe_open_handle(f, "np") as g:
        _same(_read_all(g), expected)


@pytest.mark.parametrize("framework", ["pt", "torch"])
def test_same_as_safe_open_torch(zt_file, st_file, framework):
    torch = pytest.importorskip("torch")
    for path in (zt_file, st_file):
        with ztensor.safe_open(path, framework=framework, device="cpu") as g:
            expected = {k: g.get_tensor(k) for k in g.keys()}
            rows = {k: g.get_slice(k)[1:] for k in g.keys()}
        with open(path, "rb") as f, \
                ztensor._safe_open_handle(f, framework=framework, device="cpu") as g:
            got = {k: g.get_tensor(k) for k in g.keys()}
            assert {k: g.get_slice(k)[1:] for k in g.keys()}.keys() == rows.keys()
            for k, t in got.items():
                assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
                assert torch.equal(t, expected[k])
                assert torch.equal(g.get_slice(k)[1:], rows[k])


def test_matches_safetensors_own_handle(st_file):
    """The same file through safetensors' _safe_open_handle and ours: one answer."""
    safetensors = pytest.importorskip("safetensors")
    with open(st_file, "rb") as f, safetensors._safe_open_handle(f, framework="np") as g:
        theirs = {"keys": g.keys(), "metadata": g.metadata(),
                  "tensors": {k: g.get_tensor(k) for k in g.keys()}}
    with open(st_file, "rb") as f, ztensor._safe_open_handle(f, framework="np") as g:
        ours = {"keys": g.keys(), "metadata": g.metadata(),
                "tensors": {k: g.get_tensor(k) for k in g.keys()}}
    assert ours["keys"] == theirs["keys"] and ours["metadata"] == theirs["metadata"]
    for k in theirs["tensors"]:
        np.testing.assert_array_equal(ours["tensors"][k], theirs["tensors"][k])


def test_keys_are_sorted_as_safetensors_sorts_them(tmp_path):
    """A safetensors header may list names in any order; safetensors' keys() sorts
    them (and offset_keys() gives the bytes' order).  safe_open and the handle do
    the same."""
    header = json.dumps({"b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                         "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                         "B": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})
    path = tmp_path / "unsorted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(12))
    with ztensor.safe_open(path) as g:
        assert g.keys() == ["B", "a", "b"] and g.offset_keys() == ["b", "a", "B"]
    with open(path, "rb") as f, ztensor._safe_open_handle(f) as g:
        assert g.keys() == ["B", "a", "b"] and g.offset_keys() == ["b", "a", "B"]
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(path), "np") as g:
        assert g.keys() == ["B", "a", "b"] and g.offset_keys() == ["b", "a", "B"]


def test_the_handle_is_left_as_it_was(zt_file):
    """The file is opened again by name: f's position is not moved, and closing f
    does not close what _safe_open_handle opened (as in safetensors)."""
    f = open(zt_file, "rb")
    f.seek(5)
    g = ztensor._safe_open_handle(f, framework="np")
    assert f.tell() == 5
    f.close()
    np.testing.assert_array_equal(g.get_tensor("a"), [1, -2, 3])
    g.close()


def test_closed_after_with_block(zt_file):
    with open(zt_file, "rb") as f:
        with ztensor._safe_open_handle(f, framework="np") as g:
            pass
        with pytest.raises(ztensor.ClosedError):
            g.get_tensor("a")
        with pytest.raises(ztensor.ClosedError):
            g.keys()


def test_names_it_exports():
    """safetensors' spelling, from the package and from ztensor.safe, and ours are one
    class."""
    assert ztensor._safe_open_handle is safe._safe_open_handle is ztensor.safe_open_handle
    assert safe.safe_open_handle is ztensor.safe_open_handle
    assert "safe_open_handle" in ztensor.__all__
    assert issubclass(ztensor._safe_open_handle, ztensor.safe_open)


def test_bad_framework(zt_file):
    with open(zt_file, "rb") as f, pytest.raises(ValueError):
        ztensor._safe_open_handle(f, framework="tf")


# ------------------------------------------------------------ handles it refuses
@pytest.mark.parametrize("handle", [io.BytesIO(b"ZTEN1000"), "model.zt", None, 3,
                                    io.StringIO("x")])
def test_no_descriptor_is_a_clean_error(handle):
    with pytest.raises(ztensor.UnsupportedError) as exc:
        ztensor._safe_open_handle(handle, framework="np")
    assert "Reader(f)" in str(exc.value)


def test_closed_handle(zt_file):
    f = open(zt_file, "rb")
    f.close()
    with pytest.raises(ztensor.ClosedError):
        ztensor._safe_open_handle(f, framework="np")


def test_descriptor_without_a_name(zt_file):
    """A file made from a bare descriptor is named by its number: there is no path
    to open it by."""
    with open(os.open(zt_file, os.O_RDONLY), "rb") as f:
        with pytest.raises(ztensor.UnsupportedError, match="no file name"):
            ztensor._safe_open_handle(f, framework="np")


def test_a_handle_whose_attributes_raise():
    class Hostile:
        def fileno(self):
            raise RuntimeError("no")

        @property
        def name(self):
            raise RuntimeError("no")

    with pytest.raises(ztensor.UnsupportedError, match="no file descriptor"):
        ztensor._safe_open_handle(Hostile(), framework="np")

    class NoName:
        def fileno(self):
            return 0

        @property
        def name(self):
            raise RuntimeError("no")

    with pytest.raises(ztensor.UnsupportedError, match="no file name"):
        ztensor._safe_open_handle(NoName(), framework="np")


def test_a_replaced_file_is_not_read(tmp_path, zt_file):
    """The name now leads to another file (an atomic save replaced it): reading it
    would answer for a file the handle does not hold."""
    with open(zt_file, "rb") as f:
        znp.save_file({"other": np.zeros(1)}, zt_file)  # renamed over the old one
        with pytest.raises(ztensor.UnsupportedError, match="no longer") as exc:
            ztensor._safe_open_handle(f, framework="np")
        assert exc.value.path == str(zt_file)


def test_a_deleted_or_renamed_file(tmp_path, zt_file):
    with open(zt_file, "rb") as f:
        os.rename(zt_file, tmp_path / "moved.zt")
        with pytest.raises(ztensor.UnsupportedError, match="no longer"):
            ztensor._safe_open_handle(f, framework="np")


def test_a_relative_name_after_chdir(tmp_path, zt_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = open("model.zt", "rb")
    try:
        other = tmp_path / "elsewhere"
        other.mkdir()
        monkeypatch.chdir(other)
        with pytest.raises(ztensor.UnsupportedError, match="no longer"):
            ztensor._safe_open_handle(f, framework="np")
        znp.save_file({"impostor": np.zeros(1)}, other / "model.zt")  # a different file
        with pytest.raises(ztensor.UnsupportedError, match="no longer"):
            ztensor._safe_open_handle(f, framework="np")
        monkeypatch.chdir(tmp_path)
        with ztensor._safe_open_handle(f, framework="np") as g:
            assert g.keys() == ["a", "b", "c"]
    finally:
        f.close()
