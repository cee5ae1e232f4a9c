"""Session 12: what this round's red teams found outside their own files."""
from __future__ import annotations

import numpy as np
import pytest

import ztensor
import ztensor.numpy as ztnp


@pytest.mark.parametrize("limits", [0, 7, {"max_objects": 3}, "strict"])
@pytest.mark.parametrize("suffix", [".zt", ".npy"])
def test_limits_of_the_wrong_type_are_a_type_error(tmp_path, limits, suffix):
    """``limits=`` given an int or a dict reached the first check as a bare
    AttributeError ('int' object has no attribute 'max_manifest_size')."""
    path = tmp_path / f"m{suffix}"
    if suffix == ".zt":
        ztnp.save_file({"a": np.ones(3)}, str(path))
    else:
        np.save(path, np.ones(3))
    with pytest.raises(TypeError, match="limits must be a ztensor.Limits"):
        ztensor.Reader(str(path), limits=limits)
    with ztensor.Reader(str(path), limits=None) as r:  # None: the defaults
        assert len(r.keys()) == 1
    with ztensor.Reader(str(path), limits=ztensor.Limits(max_objects=5)) as r:
        assert len(r.keys()) == 1


@pytest.mark.parametrize("blocker", ["x", "f/x"])
def test_a_sharded_save_onto_a_file_is_a_write_error(tmp_path, blocker):
    """A file at the checkpoint's name (or at one of its parents) raised a bare
    FileExistsError / NotADirectoryError from makedirs."""
    (tmp_path / "f").write_text("mine")
    if blocker == "x":
        (tmp_path / "x").write_text("mine too")
    target = tmp_path / blocker
    with pytest.raises(ztensor.WriteError, match="cannot make the checkpoint's folder") as err:
        ztensor.save_sharded({"a": np.ones(3)}, str(target), max_shard_size=10)
    assert err.value.path == str(target)
    assert (tmp_path / "f").read_text() == "mine"
