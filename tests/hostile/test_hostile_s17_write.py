"""Session 17: a checkpoint save killed part way (SIGKILL, not an exception: no
``finally`` runs) leaves nothing the next save into the folder does not clean up or
put back.  Each test names the one function that keeps its rule."""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ztensor
from ztensor.io import atomic, checkpoint_moves

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or sys.platform == "win32", reason="kills a child process"
)

_NAMES = ("a", "b", "c")


def _save(folder, value):
    # three shards of one tensor each, and an index
    ztensor.save_sharded({k: np.full(4, value, "f4") for k in _NAMES}, str(folder),
                         max_shard_size=16)


def _values(folder):
    with ztensor.open_sharded(str(folder)) as ck:
        return {k: ck.read_numpy(k).tolist() for k in sorted(ck.keys())}


def _killed_save(folder, value, kill_at):
    """A child process saving ``value`` into ``folder`` that dies (os._exit, no
    cleanup) on its ``kill_at``-th rename out of the staging folder."""
    code = textwrap.dedent(f"""
        import os, numpy as np, ztensor
        from ztensor.io import atomic
        real = os.replace
        moves = [0]
        def replace(src, dst):
            if ".ztensor-staging-" in src and ".ztensor-staging-" not in dst:
                moves[0] += 1
                if moves[0] == {kill_at}:
                    os._exit(9)
            real(src, dst)
        atomic.os.replace = replace
        ztensor.save_sharded({{k: np.full(4, {value}, "f4") for k in {_NAMES!r}}},
                             {str(folder)!r}, max_shard_size=16)
        os._exit(0)
    """)
    return subprocess.run([sys.executable, "-c", code], timeout=120).returncode


def _leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4])
def test_a_save_killed_during_its_moves_is_undone_by_the_next(tmp_path, kill_at):
    """Rule: checkpoint_moves._replace_all records its moves
    (checkpoint_moves._write_journal) and the next save into the folder undoes a
    killed one's (checkpoint_moves._recover): the old checkpoint back, index and all,
    no link aside or staging folder left."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    before = sorted(os.listdir(folder))
    assert _killed_save(folder, 2.0, kill_at) == 9
    assert _leftovers(folder)  # the killed process left its hidden files
    # the next save's staging step finds them; entered and left without a save, the
    # folder is the old checkpoint again
    with checkpoint_moves.staged(str(folder)):
        pass
    assert sorted(os.listdir(folder)) == before
    assert _values(folder) == {k: [1.0] * 4 for k in _NAMES}
    _save(folder, 3.0)
    assert sorted(os.listdir(folder)) == before
    assert _values(folder) == {k: [3.0] * 4 for k in _NAMES}


def test_a_first_save_killed_during_its_moves_leaves_nothing_after_the_next(tmp_path):
    """Rule: checkpoint_moves._recover removes new files that replaced nothing."""
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert _killed_save(folder, 2.0, 3) == 9
    with checkpoint_moves.staged(str(folder)):
        pass
    assert sorted(os.listdir(folder)) == ["notes.txt"]


def test_a_save_killed_after_its_moves_keeps_the_new_checkpoint(tmp_path, monkeypatch):
    """Rule: once every file is in place the record says so ("moved"), and the next
    save only removes the links aside (checkpoint_moves._recover)."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    real_unlink = os.unlink
    kept = []

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".old"):
            kept.append(path)  # as if the process died before removing them
            return None
        if str(path).endswith(checkpoint_moves._JOURNAL):
            return None
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "unlink", unlink)
    _save(folder, 2.0)
    monkeypatch.undo()
    assert kept and all(os.path.exists(p) for p in kept)
    with open(folder / checkpoint_moves._JOURNAL) as f:
        assert json.load(f)["state"] == "moved"
    with checkpoint_moves.staged(str(folder)):
        pass
    assert not _leftovers(folder)
    assert _values(folder) == {k: [2.0] * 4 for k in _NAMES}


@pytest.mark.parametrize("kill_at", [1, 2])
def test_a_save_killed_while_removing_the_old_shards_leaves_them_to_the_next(
    tmp_path, kill_at
):
    """Rule: the record of complete moves lists the old files the new checkpoint
    lacks (checkpoint_moves._write_journal's ``gone``), and the next save removes
    those left (checkpoint_moves._recover): before, a process killed during the
    clean-up left the old checkpoint's extra shards in the folder for ever."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)  # three shards
    (folder / "notes.txt").write_text("mine")
    old = sorted(n for n in os.listdir(folder) if n.endswith(".zt"))
    code = textwrap.dedent(f"""
        import os, numpy as np, ztensor
        real = os.unlink
        seen = [0]
        def unlink(path, *args, **kwargs):
            if os.path.basename(str(path)) in {old!r}:
                seen[0] += 1
                if seen[0] == {kill_at}:
                    os._exit(9)
            real(path, *args, **kwargs)
        os.unlink = unlink
        ztensor.save_sharded({{k: np.full(4, 2.0, "f4") for k in {_NAMES!r}}},
                             {str(folder)!r}, max_shard_size=1 << 20)
        os._exit(0)
    """)
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 9
    assert set(old) & set(os.listdir(folder))  # the killed process left old shards
    with open(folder / checkpoint_moves._JOURNAL) as f:
        entry = json.load(f)
    assert entry["state"] == "moved"
    assert sorted(row[0] for row in entry["gone"]) == old
    with checkpoint_moves.staged(str(folder)):
        pass
    assert sorted(os.listdir(folder)) == [
        "model-00001-of-00001.zt", "model.zt.index.json", "notes.txt"]
    assert _values(folder) == {k: [2.0] * 4 for k in _NAMES}


def test_a_record_of_files_gone_that_were_replaced_since_removes_nothing(tmp_path):
    """Rule: checkpoint_moves._recover removes a file ``gone`` names only while it is
    the file of the device and inode recorded: a file made since at that name (a
    new one, of another save or of the user) stays."""
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "model-00002-of-00003.zt").write_bytes(b"new, not the old shard")
    st = os.lstat(folder / "model-00002-of-00003.zt")
    checkpoint_moves._write_journal(
        str(folder), "moved", [], [], [("model-00002-of-00003.zt", st.st_dev, st.st_ino + 1)])
    with checkpoint_moves.staged(str(folder)):
        pass
    assert sorted(os.listdir(folder)) == ["model-00002-of-00003.zt"]


def test_a_save_killed_while_writing_leaves_a_staging_folder_the_next_removes(tmp_path):
    """Rule: a staging folder whose lock nobody holds is a dead process's
    (checkpoint_moves._remove_dead_staging)."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    code = textwrap.dedent(f"""
        import os, numpy as np, ztensor
        from ztensor.container import writer
        real = writer.Writer.write_numpy
        def write_numpy(self, *args, **kwargs):
            real(self, *args, **kwargs)
            os._exit(9)
        writer.Writer.write_numpy = write_numpy
        ztensor.save_sharded({{"a": np.zeros(1 << 16, "f4")}}, {str(folder)!r})
    """)
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 9
    assert any(n.startswith(".ztensor-staging-") for n in os.listdir(folder))
    _save(folder, 2.0)
    assert not _leftovers(folder)
    assert _values(folder) == {k: [2.0] * 4 for k in _NAMES}


def test_a_live_save_keeps_its_staging_folder(tmp_path):
    """Rule: a staging folder is locked for as long as its save lives
    (checkpoint_moves.staged), so another save into the folder leaves it alone."""
    folder = tmp_path / "ck"
    folder.mkdir()
    ready = tmp_path / "ready"
    code = textwrap.dedent(f"""
        import os, time
        from ztensor.io import checkpoint_moves
        with checkpoint_moves.staged({str(folder)!r}) as staging:
            open(os.path.join(staging, "part"), "w").close()
            open({str(ready)!r}, "w").write(staging)
            time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text()):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        staging = ready.read_text()
        _save(folder, 1.0)
        assert os.path.exists(os.path.join(staging, "part"))
    finally:
        child.kill()
        child.wait()
    _save(folder, 2.0)  # now dead: removed
    assert not _leftovers(folder)


@pytest.mark.parametrize("entry", [
    {"state": "moving", "aside": [["../victim.txt", ".aaaaaaaaaaaa.old"]], "new": []},
    {"state": "moving", "aside": [["victim.txt", "../planted.old"]], "new": []},
    {"state": "moving", "aside": [["victim.txt", "planted"]], "new": []},
    {"state": "moving", "aside": [], "new": ["../victim.txt"]},
    {"state": "moving", "aside": [], "new": ["sub/victim.txt"]},
    {"state": "unknown", "aside": [], "new": ["victim.txt"]},
    {"state": "moving", "aside": "victim.txt", "new": []},
    ["victim.txt"],
    "[" * 100_000 + "]" * 100_000,  # JSON nested past the parser's depth
])
def test_a_record_naming_anything_but_a_file_of_the_folder_is_not_acted_on(tmp_path, entry):
    """Rule: checkpoint_moves._read_journal trusts only a record of plain names in the folder
    and links aside of its own form: one left (or planted) otherwise renames and
    removes nothing."""
    outside = tmp_path / "victim.txt"
    outside.write_text("outside")
    folder = tmp_path / "ck"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "victim.txt").write_text("inside")
    (folder / "victim.txt").write_text("kept")
    (folder / "planted").write_text("planted")
    (tmp_path / "planted.old").write_text("planted")
    (folder / checkpoint_moves._JOURNAL).write_text(entry if isinstance(entry, str) else json.dumps(entry))
    with checkpoint_moves.staged(str(folder)):
        pass
    assert outside.read_text() == "outside"
    assert (folder / "victim.txt").read_text() == "kept"
    assert (folder / "sub" / "victim.txt").read_text() == "inside"
    assert (folder / checkpoint_moves._JOURNAL).exists()  # not ours to remove either


def test_a_record_that_is_a_link_is_not_followed(tmp_path):
    """Rule: checkpoint_moves._read_journal opens the record without following a link."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"state": "moving", "aside": [], "new": ["victim.txt"]}))
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "victim.txt").write_text("kept")
    os.symlink(elsewhere, folder / checkpoint_moves._JOURNAL)
    with checkpoint_moves.staged(str(folder)):
        pass
    assert (folder / "victim.txt").read_text() == "kept"


def test_a_staging_folder_name_that_is_a_link_is_not_followed(tmp_path):
    """Rule: checkpoint_moves._remove_dead_staging removes only real folders, never a link's
    target."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("x")
    folder = tmp_path / "ck"
    folder.mkdir()
    os.symlink(elsewhere, folder / ".ztensor-staging-planted")
    _save(folder, 1.0)
    assert (elsewhere / "precious").read_text() == "x"


def test_a_read_of_a_folder_a_killed_save_left_says_so_and_changes_nothing(tmp_path):
    """Rule: a read never acts on the record of moves (a folder from elsewhere may
    hold one made to remove its files); its error says what happened and what puts
    the old checkpoint back (sharded: checkpoint_moves.interrupted_save)."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    assert _killed_save(folder, 2.0, 2) == 9  # the old index removed, one shard moved
    listing = sorted(os.listdir(folder))
    with pytest.raises(ztensor.FormatError, match="killed part way.*next save into the folder"):
        ztensor.open_sharded(str(folder))
    assert sorted(os.listdir(folder)) == listing
    _save(folder, 3.0)
    assert _values(folder) == {k: [3.0] * 4 for k in _NAMES}



def _journal_strategy():
    from hypothesis import strategies as st
    plain = st.sampled_from(["a", "b", ".0123456789ab.old", "gone", checkpoint_moves._JOURNAL,
                             "\ud800x", "lnk"])
    escaping = st.sampled_from(["../outside", "/abs", "sub/a", "", ".", "..", "a\0b",
                                "../ck/keep"])
    # mostly plain names, so that a record is often whole but for one name that is not
    names = st.one_of(plain, plain, plain, plain, escaping, st.text(max_size=12))
    links = st.one_of(st.just(".0123456789ab.old"), st.just(".ffffffffffff.old"),
                      st.sampled_from(["../x.old", "planted", "", ".0123456789ab.old/x"]))
    ident = st.integers(min_value=0, max_value=2**40)
    good_pair = st.tuples(names, links, ident, ident).map(list)
    pair = st.one_of(good_pair, good_pair, good_pair, st.lists(names, max_size=3))
    good_new = st.tuples(names, ident, ident).map(list)
    value = st.recursive(st.none() | st.booleans() | st.integers() | names,
                         lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                         max_leaves=8)
    state = st.sampled_from(["moving", "moved"])
    entry = st.fixed_dictionaries(
        {"state": st.one_of(state, state, state, value),
         "aside": st.one_of(st.lists(pair, max_size=4), st.lists(pair, max_size=4), value),
         "new": st.one_of(st.lists(good_new, max_size=4), st.lists(names, max_size=4), value)},
        optional={"gone": st.one_of(st.lists(good_new, max_size=4), value),
                  "placed": st.one_of(st.lists(good_new, max_size=4), value)})
    # mostly of the record's own shape, where a name that escapes would be acted on
    return st.one_of(entry, entry, entry, value)


def test_any_record_touches_only_files_of_the_folder_it_names(tmp_path_factory):
    """Property (checkpoint_moves._read_journal, checkpoint_moves._recover): whatever
    record is in the folder, the next save's recovery raises nothing, changes nothing
    outside the folder, and touches only files whose plain names the record gives."""
    pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, example, given, settings

    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_journal_strategy())
    # records whole but for one name that leaves the folder
    @example({"state": "moving", "aside": [], "new": [["../outside", 0, 0]]})
    @example({"state": "moving", "aside": [["../outside", ".0123456789ab.old", 0, 0]],
              "new": []})
    @example({"state": "moving", "aside": [["keep", "../outside", 0, 0]], "new": []})
    @example({"state": "moved", "aside": [["a", "../outside", 0, 0]], "new": []})
    @example({"state": "moving", "aside": [], "new": [["keep", 0, 0]]})
    @example({"state": "moved", "aside": [], "new": [], "gone": [["../outside", 0, 0]]})
    @example({"state": "moved", "aside": [], "new": [], "gone": [["sub/a", 0, 0]]})
    @example({"state": "moving", "aside": [], "new": [], "placed": [["\ud800x", 0, 0]]})
    def check(entry):
        root = tmp_path_factory.mktemp("j")
        folder = root / "ck"
        (folder / "sub").mkdir(parents=True)
        files = {"a": "A", "b": "B", ".0123456789ab.old": "OLD", "keep": "K",
                 "sub/a": "SUB"}
        for name, text in files.items():
            (folder / name).write_text(text)
        (root / "outside").write_text("OUT")
        os.symlink(os.path.join("..", "outside"), folder / "lnk")  # never followed
        (folder / checkpoint_moves._JOURNAL).write_text(json.dumps(entry))
        with checkpoint_moves.staged(str(folder)):
            pass
        assert (root / "outside").read_text() == "OUT"
        assert (folder / "keep").read_text() == "K"
        assert (folder / "sub" / "a").read_text() == "SUB"
        named = set()
        if isinstance(entry, dict):
            for key in ("aside", "new", "gone", "placed"):
                for item in entry.get(key) if isinstance(entry.get(key), list) else []:
                    named.update(n for n in (item if isinstance(item, list) else [item])
                                 if isinstance(n, str))
        for name, text in files.items():
            if name not in named and "/" not in name:
                assert (folder / name).read_text() == text, name

    check()


# ------------------------------------------------------------------ round eleven
# (helper 12's review of this session's own changes)


def test_a_link_at_the_record_s_name_is_replaced_not_followed(tmp_path):
    """Rule: checkpoint_moves._write_journal renames the record onto its own name: a link
    placed there made the save replace the file it pointed at, outside the folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious")
    folder = tmp_path / "ck"
    folder.mkdir()
    os.symlink("../outside/victim.txt", folder / checkpoint_moves._JOURNAL)
    _save(folder, 1.0)
    assert (outside / "victim.txt").read_text() == "precious"
    assert _values(folder) == {k: [1.0] * 4 for k in _NAMES}


def test_a_record_that_came_with_the_folder_acts_on_nothing(tmp_path):
    """Rule: checkpoint_moves._recover acts only on files whose device and inode the record
    gives (checkpoint_moves._is_that_entry): a record from a clone or an archive, or one that
    outlived its files, names files by name alone, and removed and replaced them."""
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "train.py").write_text("code")
    (folder / "config.json").write_text('{"user": 1}')
    (folder / ".aaaaaaaaaaaa.old").write_text('{"evil": 1}')
    st = os.stat(folder / "train.py")
    (folder / checkpoint_moves._JOURNAL).write_text(json.dumps({
        "state": "moving",
        "aside": [["config.json", ".aaaaaaaaaaaa.old", st.st_dev, st.st_ino + 1]],
        "new": [["train.py", st.st_dev, st.st_ino + 7]]}))
    _save(folder, 1.0)
    assert (folder / "train.py").read_text() == "code"
    assert (folder / "config.json").read_text() == '{"user": 1}'


def test_without_a_lock_on_the_folder_no_record_is_acted_on(tmp_path, monkeypatch):
    """Rule: checkpoint_moves.staged and checkpoint_moves.move_staged recover only under a lock they
    hold: where the folder cannot be locked (NFS refusing it), a live save's record
    looked like a dead one's, and the second save undid the first's moves."""
    fcntl = pytest.importorskip("fcntl")
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "mine.zt").write_text("x")
    st = os.stat(folder / "mine.zt")
    (folder / checkpoint_moves._JOURNAL).write_text(json.dumps(
        {"state": "moving", "aside": [], "new": [["mine.zt", st.st_dev, st.st_ino]]}))
    real = fcntl.flock

    def flock(fd, op):
        if os.path.samefile(f"/proc/self/fd/{fd}", folder):
            raise OSError(9, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with checkpoint_moves.staged(str(folder)):
        pass
    assert (folder / "mine.zt").read_text() == "x"  # the record was a live save's
    monkeypatch.undo()
    with checkpoint_moves.staged(str(folder)):  # locked now: the record is acted on
        pass
    assert not (folder / "mine.zt").exists()
