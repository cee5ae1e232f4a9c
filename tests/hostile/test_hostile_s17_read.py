"""Session 17, probe round ten on the foreign readers: a container a pickle shares
between two paths, tensors hidden in a rebuild's requires_grad or a storage's
location, an ONNX path swapped between its check and its parse, HDF5 with a user
block and attributes below the root.  Each test names the one function that keeps
its rule."""
import collections
import io
import os
import pickle
import signal
import sys
import zipfile

import numpy as np
import pytest

import ztensor


def _torch():
    return pytest.importorskip("torch")


def test_a_container_shared_by_two_paths_has_its_tensors_under_both(tmp_path):
    """Rule: pytorch._collect walks a shared container by every path reaching it, as
    torch.load gives it ({"model": sd, "ema": sd}: model.w and ema.w); the second
    path's names were dropped without a word."""
    torch = _torch()
    sd = {"w": torch.arange(4.0), "inner": {"v": torch.ones(2)}}
    path = tmp_path / "shared.pt"
    torch.save({"model": sd, "ema": sd, "n": 3}, path)
    with ztensor.Reader(str(path)) as r:
        assert sorted(r.keys()) == ["ema.inner.v", "ema.w", "model.inner.v", "model.w"]
        np.testing.assert_array_equal(r["ema.w"], np.arange(4.0))
        np.testing.assert_array_equal(r["model.inner.v"], np.ones(2))
    out = tmp_path / "shared.zt"
    ztensor.convert(str(path), str(out))
    with ztensor.Reader(str(out)) as r:
        assert sorted(r.keys()) == ["ema.inner.v", "ema.w", "model.inner.v", "model.w"]


def _pickled(payload):
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=2).dump(payload)
    return buf.getvalue()


def test_a_container_inside_itself_is_walked_once(tmp_path):
    """Rule: pytorch._collect does not enter a container it is inside (a cycle),
    and names its tensors by the first path; no hang, no LimitError."""
    torch = _torch()
    d = {"w": torch.arange(3.0)}
    d["self"] = d
    path = tmp_path / "cycle.pt"
    torch.save(d, path)
    with ztensor.Reader(str(path)) as r:
        assert r.keys() == ["w"]


def test_sharing_that_names_nothing_is_walked_once(tmp_path):
    """Rule: pytorch._collect does not walk again a container that gave nothing to
    name: [x, x] nested 60 times (2**60 paths) stays linear."""
    inner = []
    for _ in range(60):
        inner = [inner, inner]
    path = tmp_path / "share.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", _pickled({"a": inner, "n": 1}))
        z.writestr("archive/byteorder", "little")
    with ztensor.Reader(str(path)) as r:
        assert r.keys() == [] and r.attributes == {"pickle.n": 1}


def test_sharing_that_names_exponentially_many_tensors_is_a_limit_error(tmp_path):
    """Rule: pytorch._collect's walk is bounded by the pickle's bytes: a tensor under
    [x, x] nested 40 times would have 2**40 names."""
    torch = _torch()
    inner = [torch.ones(1)]
    for _ in range(40):
        inner = [inner, inner]
    path = tmp_path / "many.pt"
    torch.save({"a": inner}, path)
    with pytest.raises(ztensor.LimitError):
        ztensor.Reader(str(path))


class _Storage:
    def __init__(self, location="cpu"):
        self.location = location


class _Call:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _crafted(tmp_path, name, obj):
    """A torch.save zip whose pickle is ``obj``, with storage "0" of 8 floats."""
    torch = _torch()

    class Pickler(pickle.Pickler):
        def persistent_id(self, value):
            if isinstance(value, _Storage):
                return ("storage", torch.FloatStorage, "0", value.location, 8)
            return None

    base = tmp_path / "base.pt"
    torch.save({"x": torch.arange(8.0)}, base)
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    path = tmp_path / name
    with zipfile.ZipFile(base) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = buf.getvalue() if info.filename.endswith("data.pkl") else zin.read(info)
            zout.writestr(info.filename, data)
    return path


def _tensor(storage, offset, requires_grad=False):
    torch = _torch()
    return _Call(torch._utils._rebuild_tensor_v2,
                 (storage, offset, (4,), (1,), requires_grad, collections.OrderedDict()))


def test_a_tensor_hidden_in_requires_grad_is_refused(tmp_path):
    """Rule: pytorch._require_flag: a rebuild's requires_grad is a bool (torch.load
    refuses anything else); a tensor put there was dropped without a word."""
    path = _crafted(tmp_path, "rg.pt", {"a": _tensor(_Storage(), 0, _tensor(_Storage(), 4))})
    with pytest.raises(ztensor.FormatError, match="requires_grad"):
        ztensor.Reader(str(path))
    ok = _crafted(tmp_path, "ok.pt", {"a": _tensor(_Storage(), 0, True)})
    with ztensor.Reader(str(ok)) as r:
        np.testing.assert_array_equal(r["a"], np.arange(4.0))


def test_a_storage_location_that_is_not_text_is_refused(tmp_path):
    """Rule: pytorch._Load.storage: a storage reference's location is text, as torch
    writes it ("cpu", "cuda:0"); a tensor put there was dropped without a word."""
    path = _crafted(tmp_path, "loc.pt", {"a": _tensor(_Storage(location=_tensor(_Storage(), 4)), 0)})
    with pytest.raises(ztensor.FormatError, match="persistent reference"):
        ztensor.Reader(str(path))
    ok = _crafted(tmp_path, "cuda.pt", {"a": _tensor(_Storage(location="cuda:0"), 0)})
    with ztensor.Reader(str(ok)) as r:
        np.testing.assert_array_equal(r["a"], np.arange(4.0))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_an_onnx_path_swapped_for_a_fifo_after_its_check_is_not_opened_again(tmp_path,
                                                                            monkeypatch):
    """Rule: onnx_file.open_file parses the file it checked (open_local_input), never
    the path again: a FIFO put there in between hung the reader."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    import ztensor.foreign.onnx_file as onnx_file
    path = tmp_path / "race.onnx"
    graph = helper.make_graph([], "g", [], [],
                              initializer=[numpy_helper.from_array(np.arange(3.0), "w")])
    onnx.save(helper.make_model(graph), str(path))
    real = onnx_file.open_local_input

    def check_then_swap(name):
        f = real(name)
        if os.fspath(name) == str(path):
            os.replace(path, str(path) + ".bak")
            os.mkfifo(path)
        return f

    monkeypatch.setattr(onnx_file, "open_local_input", check_then_swap)
    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.alarm(20)  # a hang fails the test instead of the run
    try:
        ff = onnx_file.open_file(str(path))
        try:
            assert list(ff.entries) == ["w"]
        finally:
            ff.close()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_hdf5_with_a_user_block_is_read_as_hdf5(tmp_path):
    """Rule: foreign.sniff finds HDF5's signature where the HDF5 library looks for it
    (512, 1024, ... with a user block); such a file was "not a zTensor file"."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "ub.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f["w"] = np.arange(4.0)
    with ztensor.Reader(str(path)) as r:
        assert r.format == "hdf5"
        np.testing.assert_array_equal(r["w"], np.arange(4.0))


def test_hdf5_attributes_below_the_root_are_said(tmp_path):
    """Rule: hdf5_file._datasets lists each attribute of a dataset or group below the
    root (not read) in hdf5_unread_attributes: they vanished without a word."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "attrs.h5"
    with h5py.File(path, "w") as f:
        f.attrs["top"] = 1
        f["g/w"] = np.arange(4.0)
        f["g/w"].attrs["scale"] = 0.5
        f["g"].attrs["kind"] = "layer"
    with ztensor.Reader(str(path)) as r:
        assert r.attributes["hdf5.top"] == 1
        assert sorted(r.attributes["hdf5_unread_attributes"]) == ["/g/w@scale", "/g@kind"]


def test_a_dask_chunk_of_a_file_removed_since_is_a_closed_error(tmp_path):
    """Rule: dask._version_now: a chunk computed after its file was removed is a
    ClosedError naming it, as one of a file changed since (a bare
    FileNotFoundError)."""
    pytest.importorskip("dask")
    import ztensor.dask
    import ztensor.numpy
    path = tmp_path / "d.zt"
    ztensor.numpy.save_file({"a": np.arange(8.0)}, str(path))
    array = ztensor.dask.from_zt(str(path), "a")
    os.unlink(path)
    with pytest.raises(ztensor.ClosedError, match="gone") as info:
        array.compute(scheduler="sync")
    assert str(path) in str(info.value)


def test_a_config_dict_shared_by_many_layers_still_loads(tmp_path):
    """Rule: pytorch._collect walks a container without tensors once (its values
    are attributes under its first path): walked by every path, a 2.6 KB
    checkpoint with one config dict in 200 layers ran out of its step budget."""
    torch = _torch()
    cfg = {"hidden": 64, "heads": 4, "act": "gelu", "drop": 0.1, "ln": True}
    path = tmp_path / "cfg.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "layers": [cfg] * 200}, path)
    with ztensor.Reader(str(path)) as r:
        assert r.keys() == ["model.w"]
        assert r.attributes["pickle.layers.0.act"] == "gelu"


def test_a_state_dict_shared_by_a_hundred_keys_gives_every_name(tmp_path):
    """Rule: pytorch._collect's step budget is MAX_DEPTH times the pickle's bytes:
    300 tensors under 100 keys (30,000 names from 64 KB) are what torch.load gives."""
    torch = _torch()
    sd = {f"t{i}": torch.zeros(2) for i in range(300)}
    path = tmp_path / "many.pt"
    torch.save({f"k{j}": sd for j in range(100)}, path)
    with ztensor.Reader(str(path)) as r:
        assert len(r.keys()) == 30_000 and "k99.t299" in r.keys()
