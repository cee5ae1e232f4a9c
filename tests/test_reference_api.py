"""The reference implementation's (PyPI ztensor 1.2.3) Python API on our package:
the calls its users' code makes, with the behaviour its documentation states."""
import os
import signal
import stat
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import ztensor

W = np.arange(24, dtype=np.float32).reshape(4, 6)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.zt"
    with ztensor.Writer(path) as w:
        w.add("w", W)
        w.add("z", np.linspace(0, 1, 1 << 20, dtype=np.float32), compress=True,
              checksum="crc32c")
        w.add("i", np.arange(5, dtype=np.int16), checksum="none")
    return path


def test_writer_add_finish_and_errors(tmp_path):
    w = ztensor.Writer(tmp_path / "a.zt")
    w.add("t", np.ones(3, np.float32))
    size = w.finish()
    assert size == os.path.getsize(tmp_path / "a.zt")
    assert "finished" in repr(w)
    with pytest.raises(RuntimeError):          # the reference's error for a finished writer
        w.add("u", np.ones(1))
    with pytest.raises(ztensor.ClosedError):
        w.write_numpy("u", np.ones(1))


def test_corrupt_and_missing_files_raise_what_reference_users_catch(tmp_path):
    bad = tmp_path / "bad.zt"
    bad.write_bytes(b"GARBAGE_DATA_NOT_ZTENSOR")
    with pytest.raises(RuntimeError):
        ztensor.Reader(bad)
    with pytest.raises(ValueError):
        ztensor.Reader(bad)
    with pytest.raises(OSError):
        ztensor.Reader(tmp_path / "nope.zt")


def test_metadata_dtype_names_and_format(model):
    with ztensor.open(model) as r:
        assert r.format == "zt" and isinstance(r, ztensor.Reader)
        meta = r.metadata("w")
        assert isinstance(meta, ztensor.TensorMetadata)
        assert (meta.name, list(meta.shape), meta.dtype, meta.format) == \
            ("w", [4, 6], "float32", "dense")
        assert meta.storage_dtype == "f32" and meta.components["data"].dtype == "f32"
        assert "1 tensor" not in repr(r) and "3 tensor(s)" in repr(r)


def test_a_shape_equals_the_list_the_reference_reported(model, tmp_path):
    """The reference's metadata shape was a list (``meta.shape == [4, 6]`` in its
    users' code); ours is a tuple, as numpy's, and equal to that list too, for a
    small file (one spec per object) and a large one (manifest_table's shared
    shapes), and through safetensors."""
    import pickle

    big = tmp_path / "big.zt"
    with ztensor.Writer(big) as w:
        for i in range(100):
            w.add(f"t{i}", np.zeros((2, 3 + i % 2), np.float32))
    st = tmp_path / "m.safetensors"
    ztensor.convert(model, st)
    for path, name, want in [(model, "w", [4, 6]), (big, "t1", [2, 4]), (st, "w", [4, 6])]:
        with ztensor.open(path) as r:
            shape = r.metadata(name).shape
        assert shape == want and want == shape and not shape != want
        assert shape == tuple(want) and hash(shape) == hash(tuple(want))
        assert shape != want[::-1] and shape != want + [1] and shape != "x"
        assert isinstance(shape, tuple) and np.zeros(shape).shape == tuple(want)
        assert pickle.loads(pickle.dumps(shape)) == want
        assert shape[:1] == want[:1] and shape[-1] == want[-1]  # a slice is a Shape too


def test_read_tensors_and_read_torch(model):
    torch = pytest.importorskip("torch")
    with ztensor.Reader(model) as r:
        got = r.read_tensors(["w", "i"])
        np.testing.assert_array_equal(got["w"], W)
        t = r.read_torch("w")
        assert isinstance(t, torch.Tensor) and torch.equal(t, torch.from_numpy(W))
        many = r.read_torch(["w", "z"], copy=True)
        assert set(many) == {"w", "z"} and many["z"].shape == (1 << 20,)
    with ztensor.Reader(model, copy_on_write=True) as r:
        view = r.read_torch("w")
        view += 1                                 # private pages: the file is untouched
    with ztensor.Reader(model) as r:
        np.testing.assert_array_equal(r["w"], W)


def test_read_into_numpy_and_torch(model):
    torch = pytest.importorskip("torch")
    with ztensor.Reader(model) as r:
        dst = np.full((4, 6), -1, np.float32)
        r.read_into("w", dst)
        np.testing.assert_array_equal(dst, W)
        arena = torch.empty(4 * 6 * 4 + 5 * 2, dtype=torch.uint8)
        views = {"w": arena[:96].view(torch.float32).reshape(4, 6),
                 "i": arena[96:].view(torch.int16)}
        r.read_into(views)
        assert torch.equal(views["w"], torch.from_numpy(W))
        assert views["i"].tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(TypeError):
            r.read_into("w")
        with pytest.raises(ValueError, match="shape"):
            r.read_into("w", np.empty((5, 5), np.float32))
        with pytest.raises(ValueError, match="dtype"):
            r.read_into("w", np.empty((4, 6), np.float64))


def test_read_into_decodes_zstd_into_the_callers_memory(model):
    """No intermediate array: the traced peak stays far below the tensor's size
    (digests are not asked for: the numpy fallback's CRC-32C makes temporaries)."""
    with ztensor.Reader(model) as r:
        dst = np.empty(1 << 20, np.float32)
        tracemalloc.start()
        r.read_into("z", dst)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        np.testing.assert_array_equal(dst, np.linspace(0, 1, 1 << 20, dtype=np.float32))
        assert peak < dst.nbytes // 8


def test_append_adds_and_keeps_everything(model, tmp_path):
    os.chmod(model, 0o640)
    before = {n: ztensor.Reader(model).read_numpy(n, copy=True) for n in ("w", "z", "i")}
    with ztensor.Writer.append(model) as w:
        w.add("new", np.arange(3))
    assert stat.S_IMODE(os.stat(model).st_mode) == 0o640
    with ztensor.Reader(model, verify=True) as r:
        assert r.keys() == ["i", "new", "w", "z"] or sorted(r.keys()) == ["i", "new", "w", "z"]
        for name, arr in before.items():
            np.testing.assert_array_equal(r[name], arr)
        assert r.metadata("z").components["data"].encoding == "zstd"  # copied as stored
        assert r.verify() == 1
        with pytest.raises(ztensor.FormatError, match="already written"):
            with ztensor.Writer.append(model) as w2:
                w2.add("w", W)


def test_remove_and_replace(model, tmp_path):
    out = tmp_path / "out.zt"
    ztensor.remove_tensors(model, out, ["i"])          # the reference's form
    with ztensor.Reader(out) as r:
        assert sorted(r.keys()) == ["w", "z"]
    ztensor.remove_tensors(model, ["w"])               # in place
    with ztensor.Reader(model) as r:
        assert sorted(r.keys()) == ["i", "z"]
    with pytest.raises(KeyError):
        ztensor.remove_tensors(model, ["nope"])
    ztensor.replace_tensor(model, "i", np.array([9, 8, 7, 6, 5], np.int16))
    with ztensor.Reader(model, verify=True) as r:
        assert r["i"].tolist() == [9, 8, 7, 6, 5] and r.verify() == 1
    with pytest.raises(ValueError, match="new data"):
        ztensor.replace_tensor(model, "i", np.zeros(4, np.int16))


APPEND = textwrap.dedent(r"""
import sys, numpy as np, ztensor
path = sys.argv[1]
with ztensor.Writer.append(path) as w:
    for i in range(300):
        w.add(f"extra{i}", np.full(20000, i, np.float32))
print("done", flush=True)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_an_append_killed_at_any_moment_leaves_the_old_or_the_new_file(tmp_path):
    import time
    path = tmp_path / "big.zt"
    with ztensor.Writer(path) as w:
        for i in range(50):
            w.add(f"base{i}", np.full(20000, i, np.float32))
    rng = np.random.default_rng(1)
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", APPEND, str(path)],
                                stdout=subprocess.PIPE)
        time.sleep(float(rng.uniform(0.05, 0.5)))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        with ztensor.Reader(path, verify=True) as r:
            names = set(r.keys())
            base = {f"base{i}" for i in range(50)}
            assert base <= names
            extra = names - base
            # old (no extras) or new (every extra of one append), never a mix
            assert not extra or extra == {f"extra{i}" for i in range(300)}
            if extra:
                break


def test_write_torch_and_dtypes_by_their_torch_names(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "t.zt"
    tensors = {"bf": torch.randn(3, 4).to(torch.bfloat16), "f8": torch.randn(5).to(
        torch.float8_e5m2), "c": torch.randn(2, dtype=torch.complex64),
        "nc": torch.arange(12.0).reshape(3, 4).t()}
    with ztensor.Writer(path) as w:
        for name, t in tensors.items():
            w.write_torch(name, t, compress=name == "bf")
    with ztensor.Reader(path) as r:
        assert r.metadata("bf").dtype == "bfloat16" and r.metadata("f8").type == "f8_e5m2"
        for name, t in tensors.items():
            back = r.read_torch(name)
            assert back.dtype == t.dtype and back.shape == t.shape
            assert torch.equal(back.view(torch.uint8) if t.element_size() == 1 else back,
                               t.contiguous().view(torch.uint8) if t.element_size() == 1
                               else t.contiguous())
