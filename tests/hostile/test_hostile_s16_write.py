"""Session 16: a probe round on checkpoint writes.  Each test names the one
function that keeps its rule."""
import errno
import os
import threading
import time

import numpy as np
import pytest

import ztensor
import ztensor.numpy
from ztensor.io import atomic, checkpoint_moves


def _values(folder):
    with ztensor.open_sharded(str(folder)) as ck:
        return {k: ck.read_numpy(k).tolist() for k in sorted(ck.keys())}


def _refuse_move_into(monkeypatch, ending, failure):
    """os.replace, for atomic's moves out of the staging folder onto a name ending in
    ``ending``, raising ``failure``; returns the real os.replace."""
    real = os.replace

    def replace(src, dst):
        # the move out of the staging folder, not a shard's own rename inside it
        if ".ztensor-staging-" in src and ".ztensor-staging-" not in dst and dst.endswith(ending):
            raise failure
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    return real


def _save(folder, value, shards=2):
    ztensor.save_sharded({"a": np.full(4, value, "f4"), "b": np.full(4, value, "f4")},
                         str(folder), max_shard_size=16 if shards == 2 else 1 << 20)


# ------------------------------------------------------------------ all or none
# Rule: checkpoint_moves._replace_all links each replaced file aside before the moves and puts
# them back on any failure or interruption; the old index was unlinked first, so a
# rename refused in shard two (EPERM, an immutable file) or Ctrl-C left new shard
# one beside old shard two and no index.


@pytest.mark.parametrize("failure", [PermissionError(errno.EPERM, "Operation not permitted"),
                                     KeyboardInterrupt()])
def test_a_move_failing_half_way_puts_the_old_checkpoint_back(tmp_path, monkeypatch, failure):
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    os.chmod(folder / "model.zt.index.json", 0o600)
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    real = _refuse_move_into(monkeypatch, "model-00002-of-00002.zt", failure)
    expected = ztensor.WriteError if isinstance(failure, OSError) else KeyboardInterrupt
    with pytest.raises(expected) as err:
        _save(folder, 2.0)
    monkeypatch.setattr(atomic.os, "replace", real)
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before
    assert _values(folder) == {"a": [1.0] * 4, "b": [1.0] * 4}
    assert os.stat(folder / "model.zt.index.json").st_mode & 0o777 == 0o600
    if isinstance(failure, OSError):
        # named where the caller's folder names it, not a resolved absolute path
        assert err.value.path == os.path.join(str(folder), "model-00002-of-00002.zt")
    _save(folder, 3.0)  # nothing left behind that blocks the next save
    assert _values(folder) == {"a": [3.0] * 4, "b": [3.0] * 4}
    assert not [n for n in os.listdir(folder) if n.startswith(".")]


def test_a_move_failing_at_the_index_puts_every_shard_back(tmp_path, monkeypatch):
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    real = _refuse_move_into(monkeypatch, ".index.json", OSError(errno.EIO, "I/O error"))
    with pytest.raises(ztensor.WriteError):
        _save(folder, 2.0)
    monkeypatch.setattr(atomic.os, "replace", real)
    assert _values(folder) == {"a": [1.0] * 4, "b": [1.0] * 4}
    assert not [n for n in os.listdir(folder) if n.startswith(".")]


# ------------------------------------------------------------------ one checkpoint
# Rule: checkpoint_moves.move_staged removes the whole file the new index's name implies
# (model.zt beside model.zt.index.json): a one-file checkpoint replaced by shards
# stayed, and transformers loads model.safetensors before any index.


def test_a_one_file_checkpoint_replaced_by_shards_is_gone(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    one = tmp_path / "one"
    st.save_file({"a": np.full(4, 1.0, "f4"), "b": np.full(4, 1.0, "f4")},
                 str(tmp_path / "one.safetensors"))
    os.makedirs(one)
    os.replace(tmp_path / "one.safetensors", one / "model.safetensors")
    out = tmp_path / "out"
    ztensor.convert(str(one), str(out), format="safetensors")
    assert sorted(os.listdir(out)) == ["model.safetensors"]
    sharded = tmp_path / "sharded"
    _save(sharded, 2.0)
    ztensor.convert(str(sharded), str(out), format="safetensors", force=True)
    assert "model.safetensors" not in os.listdir(out)
    assert "model.safetensors.index.json" in os.listdir(out)
    assert _values(out) == {"a": [2.0] * 4, "b": [2.0] * 4}
    # the .zt layout the same way
    zt_out = tmp_path / "zt"
    os.makedirs(zt_out)
    ztensor.numpy.save_file({"a": np.zeros(4, "f4"), "b": np.zeros(4, "f4")},
                            str(zt_out / "model.zt"))
    _save(zt_out, 2.0)
    assert "model.zt" not in os.listdir(zt_out)
    assert _values(zt_out) == {"a": [2.0] * 4, "b": [2.0] * 4}


# ------------------------------------------------------------------ one at a time
# Rule: checkpoint_moves._folder_locked holds an exclusive flock on the folder while a
# checkpoint's files move in: two saves into one folder interleaved their moves and
# left one's index naming the other's shards.


def test_two_saves_into_one_folder_move_one_after_the_other(tmp_path, monkeypatch):
    folder = tmp_path / "ck"
    _save(folder, 0.0)
    real = checkpoint_moves._replace_all
    inside = threading.Event()
    release = threading.Event()

    def slow(ready, old_index, target, names, *rest):
        if threading.current_thread().name == "first":
            inside.set()
            release.wait(10)
        return real(ready, old_index, target, names, *rest)

    failures = []

    def save(value):
        try:
            _save(folder, value)
        except BaseException as exc:  # a thread's error fails the test
            failures.append(exc)

    monkeypatch.setattr(checkpoint_moves, "_replace_all", slow)
    first = threading.Thread(target=save, args=(1.0,), name="first")
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=save, args=(2.0,), name="second")
    second.start()
    time.sleep(0.5)
    assert second.is_alive()  # waits for the first's moves
    release.set()
    first.join(10)
    second.join(10)
    assert failures == []
    assert _values(folder) == {"a": [2.0] * 4, "b": [2.0] * 4}
    assert not [n for n in os.listdir(folder) if n.startswith(".")]


# ------------------------------------------------------------------ impossible names
# Rule: atomic.final_target refuses a file name longer than its filesystem allows
# before a byte is written; the rename into place failed once the file was whole.


@pytest.mark.parametrize("how", ["writer", "export", "shards"])
def test_a_name_too_long_is_refused_before_anything_is_written(tmp_path, how):
    name = "x" * 300
    if how == "writer":
        path = tmp_path / (name + ".zt")
        with pytest.raises(ztensor.WriteError, match="longer than this filesystem allows"):
            ztensor.Writer(str(path))
    elif how == "export":
        src = tmp_path / "a.npy"
        np.save(src, np.zeros(3))
        with pytest.raises(ztensor.WriteError, match="longer than this filesystem allows"):
            ztensor.convert(str(src), str(tmp_path / (name + ".safetensors")))
    else:
        with pytest.raises(ztensor.WriteError, match="longer than this filesystem allows"):
            ztensor.save_sharded({"a": np.zeros(3)}, str(tmp_path / "ck"), prefix=name)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


# ------------------------------------------------------------------ what numpy holds
# Rule: export.plan_npz refuses every logical type numpy has no dtype for
# (dtypes.NUMPY_NATIVE), not only bf16 and FP8: torch's float8_e8m0fnu and
# float4_e2m1fn_x2 were written as plain uint8 members, their type lost.


@pytest.mark.parametrize("dtype", ["float8_e8m0fnu", "float4_e2m1fn_x2"])
def test_an_npz_export_refuses_a_type_numpy_lacks(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, dtype):
        pytest.skip(f"this torch has no {dtype}")
    import ztensor.torch as zt
    src = str(tmp_path / "f.zt")
    zt.save_file({"e": torch.arange(0, 250, 10, dtype=torch.uint8).view(getattr(torch, dtype))},
                 src)
    with pytest.raises(ztensor.UnsupportedError, match="numpy has no") as err:
        ztensor.convert(src, str(tmp_path / "f.npz"))
    assert err.value.obj == "e"
    # the advice names only formats that hold the type (session 17: it named
    # .safetensors, which refuses these two too)
    assert "write .zt," in str(err.value)
    with pytest.raises(ztensor.UnsupportedError):
        ztensor.convert(src, str(tmp_path / "f.safetensors"))
    assert not (tmp_path / "f.npz").exists()
    # complex and bool stay numpy's own
    ztensor.numpy.save_file({"c": np.arange(3) * 1j, "b": np.array([True, False])},
                            str(tmp_path / "n.zt"))
    ztensor.convert(str(tmp_path / "n.zt"), str(tmp_path / "n.npz"))
    with np.load(tmp_path / "n.npz") as z:
        assert z["c"].tolist() == [0j, 1j, 2j] and z["b"].tolist() == [True, False]


# ------------------------------------------------------------------ room on the disk
# Rule: convert.require_room_for_zt, before every raw .zt that convert and dequantize
# write: a checkpoint merged into one .zt and dequantize's output were begun without
# it (a 1.8 KB stride-0 .bin shard wrote a terabyte until the disk was full).


class _TinyDisk:
    f_bavail, f_frsize = 10, 1


@pytest.mark.parametrize("how", ["merged", "dequantize", "dequantize-checkpoint"])
def test_a_zt_output_larger_than_the_disk_is_refused_before_a_byte(tmp_path, monkeypatch, how,
                                                                  capsys):
    from ztensor.tools import cli
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    out = tmp_path / "out.zt"
    monkeypatch.setattr(atomic.os, "statvfs", lambda path: _TinyDisk())
    if how == "merged":
        with pytest.raises(ztensor.WriteError, match="needs 32 bytes and its disk has 10"):
            ztensor.convert(str(folder), str(out))
    else:
        source = folder if how == "dequantize-checkpoint" else tmp_path / "one.zt"
        if how == "dequantize":
            ztensor.numpy.save_file({"a": np.zeros(4, "f4")}, str(source))
        code = cli.main(["dequantize", str(source), str(out), "-q"])
        err = capsys.readouterr().err
        assert code != 0 and "and its disk has 10 free" in err, err
    assert not out.exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


# ------------------------------------------------------------------ names in errors
# Rule: _save.named_as_bytes renames the internal temporary file in the caller's own
# TypeErrors and ValueErrors too (a name that is no str): serialize and torch.save
# said "/tmp/tmpXXXX.zt: object names are strings".


def test_a_to_bytes_mistake_names_the_callers_bytes(tmp_path):
    calls = [lambda: ztensor.serialize({1: {"dtype": "float32", "shape": [1], "data": b"1234"}})]
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt
    calls.append(lambda: zt.save({1: torch.ones(1)}))
    for call in calls:
        with pytest.raises(TypeError, match=r"^<bytes>: object names are strings") as err:
            call()
        assert "/tmp" not in str(err.value) and ".zt" not in str(err.value)


# ------------------------------------------------------------------ smaller things
def test_save_sharded_refuses_an_empty_or_hidden_prefix_and_leaves_no_folder(tmp_path):
    """Rule: sharded.save_sharded checks the prefix before the folder is made
    (prefix "" wrote the hidden index ".zt.index.json"), and a refusal after it is
    made removes the folder it made (a sparse tensor left an empty folder)."""
    for prefix in ("", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="prefix"):
            ztensor.save_sharded({"a": np.zeros(2)}, str(tmp_path / "p"), prefix=prefix)
        assert not (tmp_path / "p").exists()
    torch = pytest.importorskip("torch")
    with pytest.raises(ztensor.ZTensorError):
        ztensor.save_sharded({"a": torch.zeros(2).to_sparse()}, str(tmp_path / "s"))
    assert not (tmp_path / "s").exists()
    os.makedirs(tmp_path / "kept")  # a folder the caller made stays
    with pytest.raises(ztensor.ZTensorError):
        ztensor.save_sharded({"a": torch.zeros(2).to_sparse()}, str(tmp_path / "kept"))
    assert (tmp_path / "kept").is_dir()


def test_an_empty_checkpoint_converts_to_its_index(tmp_path):
    """Rule: convert._write_checkpoint writes the index of a checkpoint of no tensors
    (a safetensors conversion left an empty folder no command opened)."""
    ztensor.save_sharded({}, str(tmp_path / "ck"))
    with pytest.warns(UserWarning, match="not copied"):
        ztensor.convert(str(tmp_path / "ck"), str(tmp_path / "out"), format="safetensors")
    assert os.listdir(tmp_path / "out") == ["model.safetensors.index.json"]
    with ztensor.open_sharded(str(tmp_path / "out")) as ck:
        assert ck.keys() == []


def test_a_numpy_bool_attribute_is_refused_saying_what_it_is(tmp_path):
    """Rule: attributes._check names a numpy scalar as numpy's (it said "bool values
    cannot be stored (plain data only: None, bool, ...)")."""
    with pytest.raises(ztensor.FormatError, match=r"numpy\.bool_? .*bool\(x\)"):
        ztensor.Writer(str(tmp_path / "q.zt"), attributes={"x": np.bool_(True)}).close()


def test_a_full_disk_names_the_output_as_the_caller_gave_it(tmp_path, monkeypatch):
    """Rule: atomic.require_room names the caller's path (``label``), not the
    resolved target: an export said /abs/path/s.safetensors where .zt said s.zt."""
    monkeypatch.chdir(tmp_path)
    np.save("a.npy", np.zeros(100))
    monkeypatch.setattr(atomic.os, "statvfs", lambda path: _TinyDisk())
    for out in ("s.safetensors", "s.npz", "s.zt"):
        with pytest.raises(ztensor.WriteError, match="its disk has 10 free") as err:
            ztensor.convert("a.npy", out)
        assert err.value.path == out


def test_a_save_moving_in_after_another_keeps_every_shard_its_index_names(tmp_path,
                                                                          monkeypatch):
    """Rule: checkpoint_moves.move_staged removes the replaced shards under the folder's lock:
    save A (shards renamed) removed, after releasing the lock, a shard that save B
    had just moved in, and B's index named a missing shard."""
    folder = tmp_path / "ck"
    ztensor.save_sharded({"w": np.zeros(4, "f4")}, str(folder), prefix="x")
    real = checkpoint_moves._replace_all
    moved = threading.Event()
    release = threading.Event()

    def paused(ready, old_index, target, names, *rest):
        links = real(ready, old_index, target, names, *rest)
        if threading.current_thread().name == "A":
            moved.set()
            release.wait(10)
        return links

    monkeypatch.setattr(checkpoint_moves, "_replace_all", paused)

    def save_a():  # shards of another name: the old ones are "replaced"
        ztensor.save_sharded({"w": np.ones(4, "f4"), "v": np.ones(4, "f4")}, str(folder),
                             prefix="x", max_shard_size=16)

    def save_b():
        ztensor.save_sharded({"w": np.full(4, 2.0, "f4")}, str(folder), prefix="x")

    a = threading.Thread(target=save_a, name="A")
    a.start()
    assert moved.wait(10)
    b = threading.Thread(target=save_b, name="B")
    b.start()
    time.sleep(0.3)
    release.set()
    a.join(10)
    b.join(10)
    with ztensor.open_sharded(str(folder)) as ck:
        assert ck.read_numpy("w").tolist() == [2.0] * 4
        for shard in set(ck.file_of(n) for n in ck.keys()):
            assert (folder / shard).exists()
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # each save finished


def test_without_hard_links_the_old_files_are_renamed_aside_not_copied(tmp_path, monkeypatch):
    """Rule: checkpoint_moves._link_aside renames a file where no hard link can be made
    (protected_hardlinks, another owner's file): a copy of every shard needed the
    checkpoint's size again on its disk.  A failure still puts everything back."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)

    def no_links(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "link", no_links)
    monkeypatch.setattr(checkpoint_moves.shutil, "copy2", lambda *a, **k: pytest.fail("copied"))
    real = _refuse_move_into(monkeypatch, "model-00002-of-00002.zt",
                             OSError(errno.EIO, "I/O error"))
    with pytest.raises(ztensor.WriteError):
        _save(folder, 2.0)
    monkeypatch.setattr(atomic.os, "replace", real)
    assert _values(folder) == {"a": [1.0] * 4, "b": [1.0] * 4}
    assert not [n for n in os.listdir(folder) if n.startswith(".")]
    _save(folder, 3.0)
    assert _values(folder) == {"a": [3.0] * 4, "b": [3.0] * 4}
    assert not [n for n in os.listdir(folder) if n.startswith(".")]
