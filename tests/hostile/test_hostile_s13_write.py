"""Round 13: the WRITE path's leftovers and a red team of its variants.

Breaks found and fixed (each test below fails without its fix):

* a stream's chunks written from two threads both passed the overrun check on the
  same count of bytes written: the overrun was seen only at ``close``, and the
  whole file was lost (``TensorStream.write`` now holds the writer's lock,
  ``writer._one_at_a_time``'s).
* a folder renamed while a file was written in it kept the temporary file: it was
  removed by its old path, which named nothing (``atomic.Temp.discard`` removes it
  through the folder's descriptor); a temporary file that cannot be removed was
  left without a word (now said in the error, with its name).
* ``serialize_file``'s errors named no file (``serialize``: ``<bytes>``).
* ``Tensor(shape=(True,))`` was a shape of ``(1,)``, ``(-1,)`` was taken until the
  writer's checks; a Tensor's shape set after it was made was not checked again;
  ``serialize`` refused numpy integers in a shape (``tensor.caller_shape``, for all).
* the reader held a manifest to ``Limits.max_manifest_size`` alone, the writer to
  that and the spec's 1 GiB ceiling: two copies of one rule, which differed
  (``manifest_checks.check_file_totals``, for both).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

import numpy as np
import pytest

import ztensor
import ztensor.numpy as ztnp
from ztensor import FormatError, LimitError, Reader, WriteError, Writer, spec
from ztensor.io import atomic

serialize_module = importlib.import_module("ztensor.serialize")


def _temps(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".tmp"))


def _names(path):
    with Reader(path) as r:
        return sorted(r.keys())


# ---------------------------------------------------------------- 1. stream threads
def test_stream_chunks_from_threads_are_held_to_the_size_at_once(tmp_path):
    """Eight threads each write one quarter of a tensor: four must be taken and four
    refused at their write (nothing of them written), the stream then closes and
    reads back whole.  Without the lock, the threads all passed the check on the
    count before any had written, and close found the tensor overrun: a
    FormatError, the file lost."""
    path = str(tmp_path / "t.zt")
    quarter = 1 << 18
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(3):
            with Writer(path) as w:
                s = w.stream("x", (4 * quarter,), np.float32, compress=True)
                start = threading.Barrier(8)
                results = []

                def work(i):
                    chunk = np.full(quarter, float(i), np.float32)
                    start.wait()
                    try:
                        s.write(chunk)
                        results.append(("ok", i))
                    except FormatError as exc:
                        assert "overrun" in str(exc) and exc.obj == "x"
                        results.append(("refused", i))

                threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                taken = sorted(i for what, i in results if what == "ok")
                assert len(taken) == 4, results
                s.close()
            with Reader(path) as r:
                got = r.read_numpy("x")
            assert sorted(set(got.reshape(4, quarter)[:, 0].tolist())) == [float(i) for i in taken]
    finally:
        sys.setswitchinterval(switch)


# ---------------------------------------------------------------- 2. temporaries
def test_a_folder_renamed_while_writing_keeps_no_temporary(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    w = Writer(str(folder / "x.zt"))
    w.write_numpy("a", np.ones(3))
    moved = tmp_path / "moved"
    os.rename(folder, moved)
    with pytest.raises(WriteError) as info:
        w.close()
    assert info.value.path == str(folder / "x.zt")
    assert os.listdir(moved) == []  # the temporary file went too


@pytest.mark.parametrize("how", ["abort", "error", "stream"])
def test_a_writer_abandoned_after_its_folder_moved_keeps_no_temporary(tmp_path, how):
    folder = tmp_path / "out"
    folder.mkdir()
    moved = tmp_path / "moved"
    with pytest.raises((RuntimeError, FormatError)) if how != "abort" else _nothing():
        with Writer(str(folder / "x.zt")) as w:
            w.write_numpy("a", np.ones(3))
            os.rename(folder, moved)
            if how == "abort":
                w.abort()
            elif how == "error":
                raise RuntimeError("the caller's")
            else:
                with w.stream("s", (10,), np.float32) as s:
                    s.write(np.ones(3, np.float32))  # closed short
    assert os.listdir(moved) == []


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_replace_atomically_keeps_no_temporary_when_the_folder_moves(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    moved = tmp_path / "moved"

    def write(f):
        f.write(b"half")
        os.rename(folder, moved)
        f.write(b"the rest")

    with pytest.raises(WriteError) as info:
        atomic.replace_atomically(str(folder / "x.safetensors"), write)
    assert info.value.path == str(folder / "x.safetensors")
    assert os.listdir(moved) == []


def _unremovable(monkeypatch):
    real = os.unlink

    def unlink(path, *args, **kwargs):
        if os.fspath(path).endswith(".tmp"):
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    return real


def test_a_temporary_that_cannot_be_removed_is_said(tmp_path, monkeypatch):
    """Each way a write ends without its file: the temporary file that stays is
    named in the error (it was left without a word)."""
    path = str(tmp_path / "x.zt")
    real = _unremovable(monkeypatch)
    w = Writer(path)
    w.write_numpy("a", np.ones(3))
    with pytest.raises(WriteError) as info:
        w.abort()
    assert info.value.path == path and "could not be removed" in str(info.value)
    [left] = _temps(tmp_path)
    assert left in str(info.value)
    # a ZTensorError raised through the writer: its message says it
    with pytest.raises(FormatError) as short:
        with Writer(path) as w2:
            with w2.stream("s", (10,), np.float32) as s:
                s.write(np.ones(3, np.float32))
    assert "could not be removed" in str(short.value) and short.value.obj == "s"
    # the caller's own error: a note on it
    with pytest.raises(RuntimeError) as mine:
        with Writer(path) as w3:
            w3.write_numpy("a", np.ones(3))
            raise RuntimeError("the caller's")
    assert any("could not be removed" in n for n in getattr(mine.value, "__notes__", []))
    # an exporter's failure
    with pytest.raises(WriteError) as export:
        atomic.replace_atomically(path, lambda f: (_ for _ in ()).throw(OSError(28, "No space")))
    assert "could not be removed" in str(export.value)
    for name in _temps(tmp_path):
        real(tmp_path / name)


# ---------------------------------------------------------------- 3. serialize errors
@pytest.mark.parametrize(
    "info",
    [
        {"dtype": "float32", "shape": [2], "data": b"123"},
        {"dtype": "float32", "shape": [2], "data": 5},
        {"dtype": "nope", "shape": [2], "data": b"12345678"},
        {"dtype": "float32", "shape": [-2], "data": b""},
        {"dtype": "float32", "shape": [True], "data": b"1234"},
        {"dtype": "float32", "shape": [2]},
    ],
)
def test_serialize_errors_name_the_tensor_and_the_file(tmp_path, info):
    path = str(tmp_path / "s.zt")
    with pytest.raises(FormatError) as to_file:
        serialize_module.serialize_file({"t": info}, path)
    assert (to_file.value.path, to_file.value.obj) == (path, "t")
    assert not os.path.exists(path) and _temps(tmp_path) == []
    with pytest.raises(FormatError) as to_bytes:
        serialize_module.serialize({"t": info})
    assert (to_bytes.value.path, to_bytes.value.obj) == ("<bytes>", "t")


def test_serialize_takes_numpy_integers_in_a_shape():
    data = np.arange(6, dtype=np.float32)
    raw = serialize_module.serialize(
        {"t": {"dtype": "float32", "shape": [np.int64(2), np.uint8(3)], "data": data.tobytes()}}
    )
    [(name, back)] = serialize_module.deserialize(raw)
    assert back["shape"] == [2, 3] and back["data"] == data.tobytes()


# ---------------------------------------------------------------- 4. shapes
@pytest.mark.parametrize(
    "shape, error",
    [
        ((True,), TypeError),
        ((np.True_, 2), TypeError),
        ((2.0,), TypeError),
        ((np.float64(2.0),), TypeError),
        ((-1,), FormatError),
        ((2, np.int64(-3)), FormatError),
        (3, TypeError),
    ],
)
def test_a_shape_is_non_negative_integers_everywhere(tmp_path, shape, error):
    with pytest.raises(error):
        ztensor.Tensor({"data": np.zeros(2)}, shape=shape)
    path = str(tmp_path / "x.zt")
    with Writer(path) as w:
        with pytest.raises(error) as streamed:
            w.stream("s", shape, np.float32)
        assert "x.zt" in str(streamed.value) and "'s'" in str(streamed.value)
        t = ztensor.Tensor({"data": np.zeros(2)})
        t.shape = shape  # a plain attribute: checked again when written
        with pytest.raises(error):
            w.write("t", t)
        w.write_numpy("ok", np.ones(2))
    assert _names(path) == ["ok"]


def test_numpy_integer_shapes_are_taken(tmp_path):
    path = str(tmp_path / "x.zt")
    t = ztensor.Tensor({"data": np.arange(6.0).reshape(2, 3)}, shape=(np.int32(2), np.uint64(3)))
    assert t.shape == (2, 3) and all(type(d) is int for d in t.shape)
    with Writer(path) as w:
        w.write("t", t)
        with w.stream("s", np.array([2, 2]), np.int8) as s:
            s.write(np.arange(4, dtype=np.int8))
    with Reader(path) as r:
        assert r.read_numpy("t").shape == (2, 3) and r.read_numpy("s").shape == (2, 2)


# ---------------------------------------------------------------- 5. file totals
def test_reader_and_writer_hold_a_manifest_to_one_ceiling(tmp_path, monkeypatch):
    """The spec's manifest ceiling (lowered here to a few hundred bytes) bounds the
    reader as it bounds the writer: the reader took any manifest up to
    ``max_manifest_size``, and a Limits raised past 1 GiB read what the spec and the
    writer refuse."""
    path = str(tmp_path / "m.zt")
    ztnp.save_file({f"t{i}": np.ones(1) for i in range(20)}, path)
    monkeypatch.setattr(spec, "SPEC_MAX_MANIFEST", 300)
    with pytest.raises(LimitError) as read:
        Reader(path, limits=spec.Limits(max_manifest_size=1 << 40))
    assert read.value.path == path
    with pytest.raises(LimitError) as write:
        ztnp.save_file({f"t{i}": np.ones(1) for i in range(20)}, path)
    assert write.value.path == path and "nothing was written" in str(write.value)
    monkeypatch.setattr(spec, "SPEC_MAX_MANIFEST", 1 << 30)
    assert len(_names(path)) == 20  # the old file kept
