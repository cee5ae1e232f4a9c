"""The last probe of the write path (s13): an ndarray subclass, a relative name
and a chdir, append's attributes.

* ``np.matrix`` stays 2-D through ``reshape(-1)``: compressed, its bytes were
  counted as rows and the file was written with a wrong decoded size (no Reader
  opened it, every other tensor lost with it); raw, a bare ValueError failed the
  writer.  ``writer.array_of`` makes any subclass the plain array of its memory.
* A relative name was resolved at close: a chdir in between replaced a file of
  that name in another folder (``atomic.final_target`` is absolute).
* ``Writer.append(path, attributes=...)`` was a bare TypeError (given twice);
  the given keys now update the file's attributes."""
import os

import numpy as np
import pytest

import ztensor
import ztensor.numpy as znp
from ztensor import Reader, Tensor, Writer

pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")

with pytest.warns(PendingDeprecationWarning):  # numpy's note on np.matrix itself
    M = np.matrix([[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("options", [{}, {"compress": True}, {"checksum": "sha256"},
                                     {"compress": 3, "checksum": "crc32c"}])
def test_a_matrix_is_written_as_its_array(tmp_path, options):
    path = str(tmp_path / "m.zt")
    with Writer(path) as w:
        w.write_numpy("keep", np.arange(3.0))
        w.write_numpy("m", M, **options)
        w.write("t", Tensor({"data": M}))
    with Reader(path, verify=True) as r:
        for name in ("m", "t"):
            got = r.read_numpy(name)
            assert type(got) is np.ndarray and got.shape == (2, 2)
            assert np.array_equal(got, np.asarray(M))
        assert np.array_equal(r.read_numpy("keep"), np.arange(3.0))
        r.verify()


def test_a_matrix_through_every_saving_call(tmp_path):
    path = str(tmp_path / "s.zt")
    znp.save_file({"m": M}, path)
    assert np.array_equal(znp.load_file(path)["m"], np.asarray(M))
    ztensor.replace_tensor(path, "m", M * 2)
    assert np.array_equal(znp.load_file(path)["m"], np.asarray(M) * 2)
    ztensor.save_sharded({"m": M}, str(tmp_path / "ck"))
    with ztensor.open_sharded(str(tmp_path / "ck")) as r:
        assert np.array_equal(r.read_numpy("m"), np.asarray(M))


def test_a_relative_name_means_the_folder_current_when_the_write_began(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    znp.save_file({"unrelated": np.zeros(1)}, str(second / "x.zt"))
    monkeypatch.chdir(first)
    w = Writer("x.zt")
    w.write_numpy("a", np.ones(2))
    monkeypatch.chdir(second)
    w.close()
    with Reader(str(first / "x.zt")) as r:
        assert list(r.keys()) == ["a"]
    with Reader(str(second / "x.zt")) as r:  # the other folder's file untouched
        assert list(r.keys()) == ["unrelated"]


def test_append_updates_the_files_attributes(tmp_path):
    path = str(tmp_path / "a.zt")
    with Writer(path, attributes={"keep": 1, "change": "old"}) as w:
        w.write_numpy("a", np.ones(2))
    with Writer.append(path, attributes={"change": "new", "add": [1, 2]}) as w:
        w.write_numpy("b", np.zeros(2))
    with Reader(path) as r:
        assert r.attributes == {"keep": 1, "change": "new", "add": [1, 2]}
        assert sorted(r.keys()) == ["a", "b"]
    with pytest.raises(TypeError, match="attributes must be a dict"):
        Writer.append(path, attributes=[("k", 1)])
    with Reader(path) as r:  # refused before anything was written
        assert sorted(r.keys()) == ["a", "b"] and r.attributes["change"] == "new"
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


@pytest.mark.parametrize("bad, error", [
    ({"a": np.full(100, 7, np.float32), "b": np.array(["x"], object)}, ztensor.UnsupportedError),
    ({"a": np.full(3, 7.0), 5: np.zeros(2)}, TypeError),  # attributes.caller_name
])
def test_rewriting_a_checkpoint_refuses_what_it_can_before_a_byte(tmp_path, bad, error):
    """save_sharded removes the old index before writing; an object array or an
    int name found while writing shard two left no checkpoint at all, and shard one
    already rewritten (sharded._check_before_writing)."""
    folder = str(tmp_path / "ck")
    ztensor.save_sharded({"a": np.zeros(100, np.float32), "b": np.ones(100, np.float32)},
                         folder, max_shard_size=400)
    with pytest.raises(error) as info:
        ztensor.save_sharded(bad, folder, max_shard_size=400)
    assert getattr(info.value, "path", folder) == folder and folder in str(info.value)
    with ztensor.open_sharded(folder) as r:  # the old checkpoint, whole
        assert np.array_equal(r.read_numpy("a"), np.zeros(100, np.float32))
        assert np.array_equal(r.read_numpy("b"), np.ones(100, np.float32))
    with pytest.raises(ValueError, match="dict of str to str"):  # as save_file says it
        ztensor.save_sharded({"a": np.zeros(2)}, folder, metadata={"k": [1, 2]})


def test_replace_tensor_holds_an_unknown_logical_type_to_its_storage(tmp_path):
    """An object of a logical type this library does not decode ("weird": another
    writer's name) had no element check: an f64 array replaced u8 data and changed
    the storage under the type (container/edit.replace_tensor)."""
    path = str(tmp_path / "r.zt")
    with Writer(path) as w:
        w.write("weird", Tensor({"data": np.array([1, 2], np.uint8)}, types={"data": "weird"}))
    with pytest.raises(ztensor.FormatError, match="uint8"):
        ztensor.replace_tensor(path, "weird", np.array([3.0, 4.0]))
    ztensor.replace_tensor(path, "weird", np.array([3, 4], np.uint8))
    with Reader(path) as r:
        comp = r.metadata("weird").components["data"]
        assert (comp.dtype, comp.type) == ("u8", "weird")
        assert r.read("weird").components["data"].tolist() == [3, 4]


class _OddHash(str):
    """A str subclass hashing apart from its text: equal to "a", in no set with it."""

    def __hash__(self):
        return 12345

    __eq__ = str.__eq__


def test_a_name_or_key_given_twice_through_a_str_subclass_is_refused(tmp_path):
    """A name whose type hashes apart from its text passed the writer's duplicate
    check and put one key twice in the manifest: the reader refused the whole file.
    Names are stored as plain str (attributes.check_name); a map holding one key
    text twice is refused (attributes._check)."""
    path = str(tmp_path / "n.zt")
    with pytest.raises(ztensor.FormatError, match="already written"):
        with Writer(path) as w:
            w.write_numpy("a", np.zeros(1, np.float32))
            w.write_numpy(_OddHash("a"), np.ones(1, np.float32))
    with pytest.raises(ztensor.FormatError, match="given twice"):
        Writer(path, attributes={"a": 1, _OddHash("a"): 2})
    with pytest.raises(ztensor.FormatError):
        znp.save_file({"a": np.zeros(1), _OddHash("a"): np.ones(1)}, path)
    with Writer(path) as w:  # a subclass alone is simply its text
        w.write_numpy(_OddHash("b"), np.ones(1, np.float32))
    with Reader(path) as r:
        assert list(r.keys()) == ["b"] and type(list(r.keys())[0]) is str


@pytest.mark.parametrize("bits", ["fff8000000000000", "7ff8000000000001", "7ff0000000000001"])
def test_an_attribute_nan_that_would_not_read_back_is_refused(tmp_path, bits):
    """Canonical CBOR writes every NaN as the quiet NaN: -nan or a payload was
    accepted and read back as float('nan'), another float than the one written.
    The quiet NaN itself still round-trips; files are read as they are."""
    import struct

    nan = struct.unpack(">d", bytes.fromhex(bits))[0]
    path = str(tmp_path / "n.zt")
    for attributes in ({"n": nan}, {"l": [{"deep": nan}]}):
        with pytest.raises(ztensor.FormatError, match="NaN with a sign or payload"):
            Writer(path, attributes=attributes)
    with pytest.raises(ztensor.FormatError, match="NaN with a sign or payload"):
        with Writer(path) as w:
            w.write_numpy("x", np.zeros(1), attributes={"n": nan})
    with Writer(path, attributes={"n": float("nan")}) as w:
        w.write_numpy("x", np.zeros(1))
    with Reader(path) as r:
        assert struct.pack(">d", r.attributes["n"]).hex() == "7ff8000000000000"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_dropping_the_writer_leaves_the_parents_file(tmp_path):
    """A child process that dropped its inherited copy of an open Writer ran its
    clean-up and removed the parent's temporary file: the parent's close then failed
    and nothing was written (Writer.__del__ acts in the process that made it)."""
    path = str(tmp_path / "f.zt")
    w = Writer(path)
    w.write_numpy("a", np.arange(4.0))
    pid = os.fork()
    if pid == 0:  # the child: drop the inherited writer, as any exiting code would
        import gc
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            del w
            gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    w.write_numpy("b", np.ones(2))
    w.close()
    with Reader(path) as r:
        assert sorted(r.keys()) == ["a", "b"]
        assert np.array_equal(r.read_numpy("a"), np.arange(4.0))


def test_stats_of_a_whole_file_skips_formats_without_statistics(tmp_path):
    """``ztensor stats FILE`` exited 2 on a valid file holding an object of a format
    it takes no statistics of; over the whole file such objects are skipped and
    said (text and --json), asked by name they are still an error."""
    import json
    import subprocess
    import sys

    path = str(tmp_path / "u.zt")
    with Writer(path) as w:
        w.write_numpy("a", np.arange(4.0))
        w.write("odd", Tensor({"data": np.zeros(3, np.uint8)}, format="my_fmt", shape=(3,)))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ztensor", "stats", *args],
                              capture_output=True, text=True, timeout=600)

    text = run(path)
    assert text.returncode == 0 and "skipped 1 objects" in text.stdout and "odd" in text.stdout
    listed = run("--json", path)
    got = json.loads(listed.stdout)
    assert [r["name"] for r in got["tensors"]] == ["a"]
    assert got["skipped"] == [{"name": "odd", "format": "my_fmt"}]
    named = run(path, "odd")
    assert named.returncode == 2 and "no statistics for format" in named.stderr



def test_tensors_sharing_memory_are_refused_naming_the_file(tmp_path):
    """safetensors' words, and now the file they were to be written to."""
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt

    t = torch.zeros(4)
    target = str(tmp_path / "s.zt")
    with pytest.raises(ztensor.FormatError, match="share memory") as info:
        zt.save_file({"a": t, "b": t}, target)
    assert info.value.path == target and not os.path.exists(target)
