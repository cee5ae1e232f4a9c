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
  ``serialize`` refused numpy integers in a shape (``arguments.caller_shape``, for all).
* the reader held a manifest to ``Limits.max_manifest_size`` alone, the writer to
  that and the spec's 1 GiB ceiling: two copies of one rule, which differed
  (``manifest_checks.check_file_totals``, for both).

Red team of the write path (variants nobody listed):

* a writer dropped with a stream open (state "streaming") kept its temporary file:
  ``Writer.__del__`` cleaned up an "open" writer only.
* a stream chunk of no bytes (a list, a str, None, a strided memoryview) was a bare
  TypeError (``TensorStream._array_of``: a FormatError naming the file and stream).
* a ragged list given to write_numpy, write or replace_tensor was numpy's bare
  ValueError (``writer.array_of``, the one conversion).
* replace_tensor's shape/type mismatch was a bare ValueError (now a FormatError,
  still a ValueError, naming the file and object).
* ``write_numpy(type="bf16")`` of complex or bool values, or of uint16 bits, was an
  error naming no file or object (``writer._encode_as``).
* a Tensor whose ``types`` was set to a non-dict was a bare AttributeError.
* ``compress=np.int64(5)`` was refused: a numpy int is a level (``writer._zstd_level``).
* checked, not broken: a full disk (RLIMIT_FSIZE) in save_file, a stream and an
  append leaves the old file, its mode and no temporary file
  (test_a_full_disk_leaves_the_old_file_its_mode_and_no_temporary).
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


# ---------------------------------------------------------------- red team, round 13
def test_a_writer_dropped_with_its_stream_open_keeps_no_temporary(tmp_path):
    """A stream never closed holds its writer; both dropped together left the
    temporary file (``__del__`` cleaned up an "open" writer only, not a
    "streaming" one), and said nothing."""
    import gc
    import warnings

    def dropped():
        w = Writer(str(tmp_path / "x.zt"))
        s = w.stream("s", (4,), np.float32)
        s.write(np.ones(2, np.float32))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dropped()
        gc.collect()
    assert _temps(tmp_path) == [] and os.listdir(tmp_path) == []
    assert any("never closed" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "chunk",
    [[1.0, 2.0], "abcdefgh", None, memoryview(np.ones((4, 2), np.float32))[::2]],
    ids=["list", "str", "None", "strided-memoryview"],
)
def test_a_chunk_of_no_bytes_is_an_error_naming_the_stream(tmp_path, chunk):
    path = str(tmp_path / "x.zt")
    with Writer(path) as w:
        with w.stream("s", (2,), np.float32) as s:
            with pytest.raises(FormatError) as info:
                s.write(chunk)
            assert (info.value.path, info.value.obj) == (path, "s")
            s.write(np.array([1.0, 2.0], np.float32))  # nothing of it was written
    with Reader(path) as r:
        assert r.read_numpy("s").tolist() == [1.0, 2.0]


def test_a_value_numpy_cannot_make_one_array_of_names_the_object(tmp_path):
    """A ragged list was numpy's bare ValueError, from write_numpy, write and
    replace_tensor alike (writer.array_of, for all)."""
    path = str(tmp_path / "x.zt")
    ztnp.save_file({"a": np.ones(2)}, path)
    ragged = [[1.0], [1.0, 2.0]]
    with pytest.raises(FormatError) as edit:
        ztensor.replace_tensor(path, "a", ragged)
    assert (edit.value.path, edit.value.obj) == (path, "a")
    with Writer(path) as w:
        with pytest.raises(FormatError) as direct:
            w.write_numpy("r", ragged)
        assert (direct.value.path, direct.value.obj) == (path, "r")
        with pytest.raises(FormatError) as composite:
            w.write("q", ztensor.Tensor({"x": ragged}, shape=(2,), format="mine"))
        assert (composite.value.path, composite.value.obj) == (path, "q")
        w.write_numpy("ok", [1.0, 2.0])  # a list numpy takes is still fine
    assert _names(path) == ["ok"]


def test_replace_tensor_of_another_shape_or_type_names_the_object(tmp_path):
    path = str(tmp_path / "x.zt")
    ztnp.save_file({"a": np.ones(2)}, path)
    for data in (np.ones(3), np.ones(2, np.float32)):
        with pytest.raises(FormatError) as info:  # a ValueError still
            ztensor.replace_tensor(path, "a", data)
        assert (info.value.path, info.value.obj) == (path, "a")
    assert ztnp.load_file(path)["a"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", [np.complex64, np.bool_])
def test_an_encoding_refused_names_the_file_and_object(tmp_path, dtype):
    path = str(tmp_path / "x.zt")
    with Writer(path) as w:
        with pytest.raises(ztensor.UnsupportedError) as info:
            w.write_numpy("a", np.ones(3, dtype), type="bf16")
        assert (info.value.path, info.value.obj) == (path, "a")
        with pytest.raises(FormatError) as bits:
            w.write_numpy("b", np.ones(3, np.uint16), type="bf16")
        assert (bits.value.path, bits.value.obj) == (path, "b")


def test_a_tensors_types_set_to_no_dict_is_refused(tmp_path):
    path = str(tmp_path / "x.zt")
    t = ztensor.Tensor({"data": np.ones(2)})
    t.types = 5  # a plain attribute: was a bare AttributeError inside the writer
    with Writer(path) as w:
        with pytest.raises(FormatError) as info:
            w.write("t", t)
        assert (info.value.path, info.value.obj) == (path, "t")


def test_a_numpy_integer_is_a_zstd_level(tmp_path):
    path = str(tmp_path / "x.zt")
    with Writer(path) as w:
        w.write_numpy("a", np.zeros(1000), compress=np.int64(5))
        with w.stream("s", (1000,), np.float64, compress=np.int32(1)) as s:
            s.write(np.zeros(1000))
    with Reader(path) as r:
        assert r.metadata("a").components["data"].encoding == "zstd"
        assert r.metadata("s").components["data"].encoding == "zstd"
        assert r.read_numpy("a").tolist() == [0.0] * 1000


_FULL_DISK = """
import os, resource, signal, sys
import numpy as np, ztensor, ztensor.numpy as ztnp
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit is EFBIG
path = sys.argv[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
def streamed():
    with ztensor.Writer(path) as w:
        with w.stream("s", (1 << 16,), np.float64, checksum="sha256") as s:
            for i in range(16):
                s.write(np.random.rand(1 << 12))
def appended():
    with ztensor.Writer.append(path) as w:
        w.write_numpy("more", np.ones(1 << 16))
for how in (lambda: ztnp.save_file({"big": np.random.rand(1 << 16)}, path, compress=True),
            streamed, appended):
    try:
        how()
        print("no error")
    except ztensor.WriteError as e:
        assert e.path == path, e
        print("WriteError")
"""


def test_a_full_disk_leaves_the_old_file_its_mode_and_no_temporary(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: every write past 64 KiB fails."""
    import subprocess

    path = str(tmp_path / "x.zt")
    ztnp.save_file({"old": np.arange(4.0)}, path)
    os.chmod(path, 0o640)
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, path], capture_output=True, text=True, timeout=600
    )
    assert proc.stdout.split() == ["WriteError"] * 3, proc.stderr[-2000:]
    assert os.listdir(tmp_path) == ["x.zt"]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o640)
    assert ztnp.load_file(path)["old"].tolist() == [0.0, 1.0, 2.0, 3.0]
