"""A checkpoint's files replaced together: a save of several files into one folder
(shards, their index, a model's configs) is written whole into a hidden staging
folder inside it (:func:`staged`), then moved into place all or none under the
folder's lock (:func:`move_staged`), with a record of the moves in progress that
the next save uses to finish the job of a process killed on the way
(:func:`_recover`).

The one home of the rule, used by ``sharded.save_sharded``, ``transformers.save_pretrained``
and the converter (``tools/convert.py``).  A single file is replaced by
:mod:`ztensor.io.atomic`, whose checks this module uses for each destination.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from ztensor.errors import WriteError, ZTensorError
from ztensor.io.atomic import final_target

__all__ = [
    "staged",
    "move_staged",
    "staged_as_target",
    "interrupted_save",
]


# not the ".ztensor-staged-" of versions before the lock: their folders, unlocked
# while alive, are never taken for dead
_STAGING_PREFIX = ".ztensor-staging-"
# the record of a checkpoint's moves in progress, in the folder they move into: a
# process killed part way (SIGKILL, a power cut of the process) left the old files
# under hidden names and no index; the next save into the folder puts them back
_JOURNAL = ".ztensor-moving.json"
_JOURNAL_MAX_BYTES = 1 << 22
_ASIDE_NAME = re.compile(r"\.[0-9a-f]{12}\.old")


@contextlib.contextmanager
def staged(target: str) -> Iterator[str]:
    """A new hidden folder inside the folder ``target``, where a set of files that
    must replace their namesakes together (a checkpoint's shards, copies and index)
    is written whole before any is moved (:func:`move_staged`): the same filesystem,
    so each move is a rename.  Removed, with whatever is left in it, on leaving.

    While it lives it holds a lock of its own, so that the next save into
    ``target`` can tell it from the folder of a process that was killed (whose
    partial shards would stay for ever, as big as the checkpoint): every such dead
    folder is removed first, and the moves a killed process left part way are
    undone (:func:`_recover`).  Both under the lock on ``target``, so a folder is
    never seen between its making and its locking; where the folder cannot be
    locked (no fcntl, NFS refusing it) no record is acted on, since another save
    may be alive and part way."""
    with _folder_locked(target) as held_folder:
        if held_folder:  # without the lock a live save looks like a dead one
            _recover(target)
            _remove_dead_staging(target)
        try:
            path = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=target)
        except OSError as exc:
            raise _failed("cannot create a folder for the new files", exc, target) from None
        held = _lock(path, wait=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if held is not None:
            os.close(held)


def _lock(folder: str, wait: bool) -> Optional[int]:
    """A descriptor of ``folder`` holding an exclusive flock on it (waiting for it
    with ``wait``); None where none can be had: no fcntl, a folder that cannot be
    opened or locked, or, without ``wait``, one another descriptor holds."""
    try:
        import fcntl
    except ImportError:
        return None
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(folder, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_dead_staging(target: str) -> None:
    """Remove each staging folder in ``target`` whose lock nobody holds: its
    process was killed before it could remove it (:func:`staged`).  Where folders
    cannot be locked at all, none is taken for dead."""
    try:
        import fcntl  # noqa: F401  (no locks: no way to tell the dead from the living)
    except ImportError:
        return
    try:
        names = [n for n in os.listdir(target) if n.startswith(_STAGING_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(target, name)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        fd = _lock(path, wait=False)
        if fd is None:
            continue  # alive (or not lockable: left alone either way)
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def interrupted_save(folder: str) -> bool:
    """Whether ``folder`` holds the record of a checkpoint save whose moves were
    left part way (its process killed): its old files are under hidden names until
    the next save into the folder puts them back (:func:`_recover`).  Said in the
    error of a read that finds no index there; a read never acts on the record
    (a folder from elsewhere may hold one made to remove or rename its files)."""
    entry = _read_journal(folder)
    return entry is not None and entry["state"] == "moving"


def _write_journal(target: str, state: str, aside, new, gone=(), placed=()) -> None:
    """The record :func:`_recover` reads: ``aside`` the [name, name of its old
    file's link, device, inode of that old file] of each file a move replaces, the
    old index last; ``new`` the [name, device, inode of the new file] of each that
    replaces nothing (a rename keeps the inode); ``gone`` (once the moves are
    complete) the [name, device, inode] of each old file the new checkpoint lacks,
    which the clean-up removes: a process killed during it left them for ever;
    ``placed`` (while moving) the [name, device, inode] of every new file, the index
    included, by which :func:`_recover` tells moves all done from moves part way.  The
    identities are what lets the record act only on the files it was written for: a
    record that came with a folder (a clone, an archive) or outlived its files names
    others.  Written beside its name and renamed onto it: a link placed at the name
    is replaced, never followed (replace_atomically follows links, and a link there
    made the record replace a file outside the folder)."""
    entry = {
        "state": state,
        "aside": [list(r) for r in aside],
        "new": [list(r) for r in new],
        "gone": [list(r) for r in gone],
        "placed": [list(r) for r in placed],
    }
    record = os.path.join(target, _JOURNAL)
    try:
        fd, temp = tempfile.mkstemp(prefix=_JOURNAL + ".", suffix=".tmp", dir=target)
    except OSError as exc:
        raise _failed("cannot write the record of this save's moves", exc, record) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(entry).encode("utf-8"))
        os.replace(temp, record)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):  # a folder at its name (from a clone): said so
            raise _failed("cannot write the record of this save's moves", exc, record) from None
        raise


def _read_journal(target: str) -> Any:
    """The record of moves left part way in ``target``, or None: none there, or
    one this process must not act on (not a regular file of this user's, too big,
    or not of the shape :func:`_write_journal` gives; a name in it that is not one
    plain file name in ``target``, or a link name not of :func:`_link_aside`'s
    form).  A record it cannot trust is left as it is."""
    path = os.path.join(target, _JOURNAL)
    try:
        # never blocking: a FIFO at the name hung every save and read of the folder
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        owner = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_size > _JOURNAL_MAX_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            entry = json.loads(f.read(_JOURNAL_MAX_BYTES + 1))
    except (OSError, ValueError, RecursionError):  # deep nesting: not ours either
        return None
    finally:
        os.close(fd)

    def plain(name):
        return (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and os.path.basename(name) == name
            and "/" not in name
            and "\0" not in name
            and _encodable(name)
        )

    def number(value):
        return type(value) is int and value >= 0

    if not (
        isinstance(entry, dict)
        and entry.get("state") in ("moving", "moved")
        and isinstance(entry.get("aside"), list)
        and isinstance(entry.get("new"), list)
        and all(
            isinstance(row, list)
            and len(row) == 4
            and plain(row[0])
            and isinstance(row[1], str)
            and _ASIDE_NAME.fullmatch(row[1])
            and number(row[2])
            and number(row[3])
            for row in entry["aside"]
        )
        and isinstance(entry.get("gone", []), list)
        and isinstance(entry.get("placed", []), list)
        and all(
            isinstance(row, list)
            and len(row) == 3
            and plain(row[0])
            and number(row[1])
            and number(row[2])
            for row in entry["new"] + entry.get("gone", []) + entry.get("placed", [])
        )
    ):
        return None
    return entry


def _encodable(name: str) -> bool:
    """Whether the system can take ``name`` as a file name (a lone surrogate from a
    JSON escape cannot: every later save failed on it with a bare UnicodeEncodeError)."""
    try:
        os.fsencode(name)
    except UnicodeError:
        return False
    return True


def _recover(target: str) -> None:
    """Finish what a process killed during :func:`_replace_all` left in ``target``
    (its record: :func:`_read_journal`): moves left part way are undone (each new
    file without an old one removed, each old file renamed back from its link, the
    old index last), so the folder holds the old checkpoint again; moves that were
    complete (as the record says, or as every new file it lists in place shows)
    lose only their links aside and the old files the new checkpoint lacks.  Best
    effort, under the folder's lock."""
    _remove_dead_journal_temps(target)
    entry = _read_journal(target)
    if entry is None:
        return
    placed = entry.get("placed", [])
    if (
        entry["state"] == "moving"
        and placed
        and all(_is_that_entry(os.path.join(target, name), dev, ino) for name, dev, ino in placed)
    ):
        # every new file in place, the index too: the process was killed after its
        # last move, before its record said so; the new checkpoint is whole and stays
        entry = {**entry, "state": "moved"}
    if entry["state"] == "moving":
        for name, dev, ino in entry["new"]:
            path = os.path.join(target, name)
            if _is_that_entry(path, dev, ino):  # the new file itself, nothing else
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for name, link, dev, ino in entry["aside"]:
            if _is_that_entry(os.path.join(target, link), dev, ino):
                _restore(os.path.join(target, name), os.path.join(target, link))
    else:
        leftovers = [(link, dev, ino) for _, link, dev, ino in entry["aside"]]
        for name, dev, ino in leftovers + [tuple(row) for row in entry.get("gone", [])]:
            path = os.path.join(target, name)
            if _is_that_entry(path, dev, ino):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(target, _JOURNAL))


def _is_that_entry(path: str, dev: int, ino: int) -> bool:
    """Whether ``path`` is (never followed) the regular file or the link of that
    device and inode: a link of the folder that led out of it was moved as a link
    (:func:`_destination`), and is put back as one."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):  # ValueError: a name the system cannot take
        return False
    return (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) and (
        st.st_dev,
        st.st_ino,
    ) == (dev, ino)


def _remove_dead_journal_temps(target: str) -> None:
    """Remove the temporary files of records (:func:`_write_journal`) that a killed
    process left in ``target``: called under the folder's lock, which every record
    is written under, so none of them is a live save's."""
    try:
        names = os.listdir(target)
    except OSError:
        return
    for name in names:
        if name.startswith(_JOURNAL + ".") and name.endswith(".tmp"):
            path = os.path.join(target, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            owner = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
            if stat.S_ISREG(st.st_mode) and st.st_uid == owner:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _restore(destination: str, link: str) -> None:
    """The old file at ``link`` back at ``destination`` (best effort).  Where both
    are still one file (linked aside, never replaced) the link just goes: a rename
    of one name of a file onto another does nothing, and the link would stay.
    Compared unfollowed: an old link out of the folder is linked aside as a link."""
    with contextlib.suppress(OSError):
        if not os.path.lexists(link):
            return
        if os.path.lexists(destination) and _identity_of(destination) == _identity_of(link):
            os.unlink(link)
        else:
            os.replace(link, destination)


def move_staged(
    staging: str,
    target: str,
    index: Optional[str],
    replaced: Callable[[], Iterable[str]] = tuple,
) -> None:
    """Every file of ``staging`` renamed to its name in the folder ``target``: the
    new files of a checkpoint (``index`` the name of its index) replacing the old.

    First nothing in ``target`` changes: every destination is checked (a directory,
    a loop of links there is a WriteError: :func:`final_target`) and each staged
    file is given the permission bits of the file it replaces.  A link in the folder
    is followed to its file when that lies in the folder too; a link out of it is
    itself replaced by the new file, and what it points to is left as it was (a
    Hugging Face cache's shared blobs, another disk): every move then stays in the
    folder, where the record of moves can finish or undo it (a killed save's moves
    through links out of the folder were in no record, and the next save put back
    the old index over a mix of new and old shards).  A failure so far leaves
    ``target`` as it was.
    Then the old index is removed (from here on a crash of the process leaves no
    index, never one naming a mix; a failure or interruption puts the old
    checkpoint back), each file renamed into place, the new index last, and the files
    ``replaced()`` names (the old index's shards, asked under the lock before the
    moves) that the new checkpoint lacks removed:
    they belonged to the checkpoint replaced, as does the one whole file the new
    index's name implies (``model.zt`` for ``model.zt.index.json``).  The moves are
    all or none (:func:`_replace_all`) and hold a lock on ``target``
    (:func:`_folder_locked`).  ``index`` None: files with no index among them (a
    model's config files), each simply replaced."""
    names = sorted(os.listdir(staging), key=lambda n: (n == index, n))
    home = os.path.realpath(target)
    # the checkpoint replaced may have been one whole file (model.zt beside the new
    # model.zt.index.json): transformers loads that one first, so it goes too
    whole = index[: -len(".index.json")] if index and index.endswith(".index.json") else None
    with _folder_locked(target) as held:
        if held:
            _recover(target)  # a save killed since this one's staging folder was made
        # (what to rename, its destination): all checked before anything moves, under
        # the lock and after the recovery, so that they are the files moved onto (a
        # file swapped for a folder between a check outside the lock and the moves was
        # renamed aside and left there for good)
        # asked under the lock, before the moves: the old checkpoint's files as they
        # are now (asked before the lock, a save that moved in meanwhile lost its)
        old_files = set(replaced())
        # a link to another file of the old checkpoint (one it replaces or removes)
        # is itself replaced: written through, the new index landed in the old whole
        # model.zt, which then read as an index
        others = (old_files | ({whole} if whole else set())) - set(names)
        ready = [
            _ready_to_move(os.path.join(staging, n), target, home, n, avoid=others) for n in names
        ]
        _require_distinct(ready, names, target)
        old_index = None if index is None else _destination(target, home, index, others)
        # never a file a new one is moved onto
        onto = {os.path.basename(destination) for _, destination in ready}
        gone = sorted((old_files | ({whole} if whole else set())) - set(names) - {index} - onto)
        links = _replace_all(ready, old_index, target, home, gone)
        # under the lock too: a save moving in after this one released it lost a
        # shard this one removed as "replaced"; and despite an interrupt (the new
        # checkpoint is in place: its clean-up is finished, then the interrupt
        # raised), the record last (a process killed before it goes leaves it
        # saying the moves were complete, and what goes: the next save removes the rest)
        _unlink_all(
            links + [os.path.join(target, name) for name in gone] + [os.path.join(target, _JOURNAL)]
        )


def _unlink_all(paths) -> None:
    """Remove each of ``paths`` that is there (what cannot be removed stays: gone
    already, or not ours to remove).  An interrupt on the way (Ctrl-C) is raised
    only once all are tried: the files named are the leftovers of a move that is
    complete, which an interrupt must not leave behind (a whole old shard each)."""
    interrupted: Optional[BaseException] = None
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
        except BaseException as exc:  # noqa: B902 (re-raised below)
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _require_distinct(ready, names, target: str) -> None:
    """A WriteError unless every staged file has a destination of its own: two
    names of the folder that are links to one file (a shard linked to another, or
    to the index) made the second rename replace the first file, and the save
    succeeded with a checkpoint its reader refuses."""
    seen: dict = {}
    for (_, destination), name in zip(ready, names):
        if destination in seen:
            raise WriteError(
                f"is a link to the same file as {seen[destination]!r} ({destination}): "
                "each file of the checkpoint needs a file of its own, so nothing was moved",
                path=os.path.join(target, name),
            )
        seen[destination] = name


def _replace_all(ready, old_index: Optional[str], target: str, home: str, gone=()) -> List[str]:
    """The moves of :func:`move_staged`, all or none: each file a move replaces is
    first linked aside (a hidden name beside it), the old index removed, every new
    file renamed into place, the index last.  A failure or an interruption at any
    step (a rename refused, an immutable file, Ctrl-C) puts every replaced file
    back and removes the new ones, the old index last: the folder is as it was.
    Once all are in place the old files' links are returned, for the caller to
    remove with the rest of the clean-up (with the files ``gone`` names, in
    ``target``, that the new checkpoint lacks).  A record of the moves in ``target``
    (:func:`_write_journal`) lets the next save finish the job of a process killed
    on the way (:func:`_recover`).  Every destination is a file of ``home`` (the
    folder, resolved: :func:`_destination`), so the record holds every move."""
    links = {}  # destination -> where its old file is linked aside
    for _, destination in ready:
        if destination != old_index and os.path.lexists(destination):
            links[destination] = _aside_name(destination)
    if old_index is not None and os.path.lexists(old_index):
        links[old_index] = _aside_name(old_index)  # last: put back last
    recorded = [
        (os.path.basename(d), os.path.basename(link), *_identity_of(d)) for d, link in links.items()
    ]
    new = [(os.path.basename(d), *_identity_of(source)) for source, d in ready if d not in links]
    # every new file, for telling moves that were all done from moves part way: a
    # process killed after its last rename, before its record said so, left the new
    # checkpoint whole, which the next save put back to the old one
    placed = [(os.path.basename(d), *_identity_of(source)) for source, d in ready]
    kept = []  # (destination, the old file's link aside)
    moved = []  # (destination, its old file's link aside or None, the staged file)
    step = target
    journal = False
    try:
        # what goes once the moves are done is known now: a process killed after its
        # last rename, before the "moved" record, left the old checkpoint's extra
        # shards beside the new index for good (or an old model.zt, and a folder
        # refused as holding two checkpoints)
        _write_journal(target, "moving", recorded, new, _file_entries(target, gone), placed)
        journal = True
        for destination, link in links.items():
            step = destination
            _link_aside(destination, link)
            kept.append((destination, link))
            if destination == old_index and os.path.lexists(destination):
                os.unlink(destination)  # linked aside, not renamed there
        for source, destination in ready:
            step = os.path.join(target, os.path.basename(destination))
            # recorded first: an interruption right after the rename still undoes it
            moved.append((destination, links.get(destination), source))
            os.replace(source, destination)
        _write_journal(target, "moved", recorded, new, _file_entries(target, gone))
    except BaseException as exc:
        _put_back(moved, kept)
        if journal:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(target, _JOURNAL))
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise _failed("cannot move the new file into place", exc, step) from None
        raise
    return [link for _, link in kept]


def _file_entries(target: str, names) -> List[Tuple[str, int, int]]:
    """[name, device, inode] of each of ``names`` that is a regular file or a link
    in ``target`` (never followed: a link there is removed, its file never)."""
    rows = []
    for name in names:
        if os.path.basename(name) != name:
            continue  # not in ``target`` itself: no record acts outside it
        try:
            st = os.lstat(os.path.join(target, name))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            rows.append((name, st.st_dev, st.st_ino))
    return rows


def _identity_of(path: str) -> Tuple[int, int]:
    """(device, inode) of the file at ``path`` (not through a link)."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def _aside_name(path: str) -> str:
    """A free hidden name beside ``path`` for :func:`_link_aside`."""
    folder = os.path.dirname(path)
    for _ in range(100):
        link = os.path.join(folder, f".{secrets.token_hex(6)}.old")
        if not os.path.lexists(link):
            return link
    raise FileExistsError(errno.EEXIST, "no free name for a link aside", folder)


def _link_aside(path: str, link: str) -> None:
    """``link`` a second name for the file at ``path`` (same folder, same
    filesystem): a hard link; where none can be made (a filesystem without them,
    protected_hardlinks and another owner's file) the file itself is renamed there,
    never copied (a copy of every shard needed the checkpoint's size again)."""
    try:
        os.link(path, link, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(link):
            raise
        if stat.S_ISDIR(os.lstat(path).st_mode):  # a folder swapped in: never moved aside
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path) from None
        os.rename(path, link)  # the destination is absent until the new file comes


def _put_back(placed, kept) -> None:
    """Undo :func:`_replace_all`'s moves: each new file removed or its old one
    renamed back over it, the old index last (best effort: what cannot be put back
    stays, and the error raised says the move failed)."""
    for destination, link, source in reversed(placed):
        if os.path.lexists(source):
            continue  # interrupted before its rename: nothing of it is in place
        if link is None:
            with contextlib.suppress(OSError):
                os.unlink(destination)
    for destination, link in kept:
        _restore(destination, link)


@contextlib.contextmanager
def _folder_locked(folder: str) -> Iterator[bool]:
    """An exclusive advisory lock (flock) on ``folder`` while a checkpoint's files
    move into it: two saves into one folder move one after the other, each whole
    (interleaved, one's index named the other's shards).  Yields whether the lock is
    held: where folders cannot be locked (no fcntl, a filesystem refusing it),
    nothing is."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = True
        except OSError:
            held = False  # a filesystem without locks: the moves are still all or none
        yield held
    finally:
        os.close(fd)


def _destination(target: str, home: str, name: str, avoid=frozenset()) -> str:
    """Where the file ``name`` of the folder ``target`` (``home`` resolved) is
    renamed to: through a link, the file it leads to when that lies in the folder,
    else the link itself (:func:`move_staged`); the link itself too when it leads to
    one of ``avoid`` (another file of the checkpoint replaced) or to a name of this
    module's own.  What is there must be a regular file, a link or nothing
    (:func:`final_target`'s checks)."""
    final = os.path.join(target, name)
    destination = final_target(final)
    led_to = os.path.basename(destination)
    if (
        os.path.dirname(destination) != home
        or _reserved(led_to)
        or (led_to != name and led_to in avoid)
    ):
        return os.path.join(home, name)
    return destination


def _reserved(name: str) -> bool:
    """Whether ``name`` is one this module gives its own files in a checkpoint's
    folder (the record, its temporary files, staging folders, links aside).  A
    checkpoint file that is a link to one is replaced by the new file, never written
    through: an index written through a link to the record was overwritten by the
    record and removed with it (the save said OK, the checkpoint had no index), and
    one through a link to a record's temporary name was removed by the next save."""
    return (
        name == _JOURNAL
        or name.startswith(_JOURNAL + ".")
        or name.startswith(_STAGING_PREFIX)
        or _ASIDE_NAME.fullmatch(name) is not None
    )


def _ready_to_move(
    staged: str, target: str, home: str, name: str, avoid=frozenset()
) -> Tuple[str, str]:
    """(path to rename, destination) for moving ``staged`` to ``name`` in ``target``
    (see :func:`move_staged`; ``avoid``: :func:`_destination`), the staged file given
    the mode of the file it replaces; nothing in ``target`` changes."""
    final = os.path.join(target, name)
    try:
        destination = _destination(target, home, name, avoid)
        try:
            mode: Optional[int] = stat.S_IMODE(os.stat(final).st_mode)
        except FileNotFoundError:
            mode = None  # a new file (or a dangling link): the mode it was made with
        if mode is not None:
            os.chmod(staged, mode)
        return staged, destination
    except WriteError as exc:
        if exc.path is not None:  # named as the caller will know it
            exc.replace_path(os.fspath(exc.path), final)
        raise
    except OSError as exc:
        raise _failed("cannot move the new file into place", exc, final) from None


@contextlib.contextmanager
def staged_as_target(staging: str, target: str) -> Iterator[None]:
    """Errors raised while files are written into ``staging`` name them where they
    will be, in ``target``: the hidden folder is no name the caller knows."""
    try:
        yield
    except ZTensorError as exc:
        if exc.path is not None and os.fspath(exc.path).startswith(staging + os.sep):
            inside = os.fspath(exc.path)[len(staging) + 1 :]
            exc.replace_path(os.fspath(exc.path), os.path.join(target, inside))
        exc.replace_path(staging, target)
        raise


def _failed(what: str, exc: OSError, path: str) -> WriteError:
    """The WriteError for an OSError of the step ``what`` on ``path``."""
    return WriteError(f"{what}: {exc.strerror or exc}", path=path, errno=exc.errno)
