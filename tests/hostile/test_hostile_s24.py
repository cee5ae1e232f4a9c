"""Session 24's hostile-input tests: each failed on the code before it."""

import os

import numpy as np
import pytest

import ztensor
import ztensor.numpy
import ztensor.safe


def _write(kind, path, value):
    """A file of format ``kind`` holding one tensor equal to ``value``."""
    if kind == "zt":
        with ztensor.Writer(str(path)) as w:
            w.write_numpy("x", value)
    elif kind == "safetensors":
        safetensors_numpy = pytest.importorskip("safetensors.numpy")
        safetensors_numpy.save_file({"x": value}, str(path))
    else:
        np.save(str(path), value)


@pytest.mark.parametrize("kind", ["zt", "safetensors", "npy"])
def test_safe_open_handle_refuses_a_file_swapped_in_after_its_check(tmp_path, monkeypatch, kind):
    """safe_open_handle proves the handle's name leads to the handle's file, then
    opens it by name.  A file renamed over that name between the proof and the open
    was read: the tensor came from a file the handle never held.  Now the proof is
    pinned (io.source.pinned_file) and checked on the descriptor the reader opens."""
    ext = "." + kind
    path, other = tmp_path / ("model" + ext), tmp_path / ("other" + ext)
    _write(kind, path, np.zeros(4, np.float32))
    _write(kind, other, np.full(4, 7, np.float32))
    proven = ztensor.safe.handle_file

    def proof_then_swap(f):
        found = proven(f)
        os.replace(other, path)  # the race: after the check, before the open
        return found

    monkeypatch.setattr(ztensor.safe, "handle_file", proof_then_swap)
    with open(path, "rb") as f:
        with pytest.raises(ztensor.UnsupportedError, match="no longer leads to the handle"):
            ztensor._safe_open_handle(f, framework="np")


@pytest.mark.parametrize("kind", ["zt", "safetensors", "npy"])
def test_safe_open_handle_reads_its_own_file(tmp_path, kind):
    """The pin refuses nothing that is the handle's file."""
    path = tmp_path / ("model." + kind)
    _write(kind, path, np.arange(4, dtype=np.float32))
    with open(path, "rb") as f, ztensor._safe_open_handle(f, framework="np") as g:
        (name,) = g.keys()  # an .npy's one array is named by the reader
        np.testing.assert_array_equal(g.get_tensor(name), np.arange(4, dtype=np.float32))
    # the pin lasts only while the handle's file is opened: the name opens freely after
    os.replace(path, tmp_path / "moved")
    _write(kind, path, np.ones(4, np.float32))
    with ztensor.safe_open(str(path), framework="np") as g:
        np.testing.assert_array_equal(g.get_tensor(name), np.ones(4, np.float32))
