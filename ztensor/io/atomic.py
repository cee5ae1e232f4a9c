"""Atomic file replacement: a file is written beside its final name and renamed into
place once complete, so the final name only ever holds a whole file (the old one, or
the new one).

The one home of the rule, used by the Writer (``.zt`` files), the exporters
(``.safetensors``, ``.npz``, ``.gguf``: :func:`replace_atomically`) and the sharded
checkpoint writers and converter (``*.index.json``: :func:`write_json_atomically`).
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
from ztensor.io.paths import resolve_folder


def final_target(path):
    """The file the rename replaces, as an absolute path: a symlink's target (so
    the link stays a link to the new file), else ``path`` itself.  What is there
    must be a regular file, or nothing: a rename over a FIFO, socket or device
    (``/dev/null``, which root may rename over) would replace it with a regular
    file, and over a directory it fails only once the whole file is written, so
    either is a WriteError naming ``path`` before a byte is written.  So is a name
    no file can have: empty, with a NUL (``os`` raised a bare ValueError), or
    ending in a separator (a folder's name: the rename failed only once the whole
    file was written).  The one check
    for every file this package writes (the Writer, the exporters, indexes, a
    checkpoint's copied files)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"a path to write is a str or os.PathLike[str], not {type(text).__name__}")
    if not text or "\0" in text or text.endswith((os.sep, os.altsep or os.sep)):
        raise WriteError("is not a file name: a file cannot be written there", path=path)
    # absolute now: a relative name means the folder current when the write began,
    # not whichever is current when the rename runs (a chdir in between replaced
    # a file in another folder), and resolved as the system resolves it
    # (paths.resolve_folder: "link/../x.zt" replaced ./x.zt, not the file a read of
    # the same name opens)
    target = os.path.realpath(text) if os.path.islink(text) else resolve_folder(text)
    try:
        mode = os.stat(target).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the rename would replace the link itself
            raise WriteError("is a loop of symbolic links", path=path, errno=exc.errno) from None
        _require_name_fits(target, path)
        return target  # nothing there yet, or no way to look: creating it will say
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        raise WriteError(f"is {kind}, not a file: a file written here would replace it", path=path)
    return target


def _require_name_fits(target: str, path) -> None:
    """A WriteError naming ``path`` when the file name of ``target`` is longer than
    its folder's filesystem allows: the rename into place failed only once the whole
    file was written."""
    folder, base = os.path.split(target)
    try:
        name_max = os.pathconf(folder or ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return  # no folder yet, or no limit to ask: creating the file will say
    length = len(os.fsencode(base))
    if length > name_max:
        raise WriteError(
            f"the file name is {length} bytes long, longer than this filesystem "
            f"allows ({name_max})",
            path=path,
            errno=errno.ENAMETOOLONG,
        )


def identity(path) -> Any:
    """What tells one version of the file at ``path`` from another: device, inode,
    size and modification time (a rename over it changes the inode, a write in
    place the size or time); None when nothing is there."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def require_unchanged(path, expected, label) -> None:
    """WriteError naming ``label`` unless ``path`` is still the version ``expected``
    (:func:`identity`): an edit built from a file that another process replaced or
    rewrote meanwhile would, renamed over it, drop that process's change without a
    word.  The one check every edit (append, replace_tensor, remove_tensors) makes
    before its rename."""
    if identity(path) != expected:
        raise WriteError(
            "the file changed while this edit was being made (another process wrote "
            "it): nothing was written, so its change is kept; make the edit again",
            path=label,
        )


class Temp:
    """A file being built beside the file it will become (:func:`create_temp`): its
    descriptor ``fd`` (None once closed), its ``path``, and a descriptor of its
    folder, by which :meth:`discard` finds it again wherever that folder went: a
    folder renamed while the file was being written left the temporary file inside
    it, removed by its old path (which named nothing)."""

    def __init__(self, fd: int, path: str, folder_fd: Any = None) -> None:
        self.fd: Any = fd
        self.path = path
        self._folder_fd = folder_fd

    def close(self) -> None:
        """Close the file's descriptor (not its folder's: :meth:`discard` may follow)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def done(self) -> None:
        """The file was renamed into place: only its folder's descriptor is left."""
        self.close()
        if self._folder_fd is not None:
            fd, self._folder_fd = self._folder_fd, None
            os.close(fd)

    def discard(self) -> Any:
        """Close and remove the file, wherever its folder now is.  None once it is
        gone; else why it could not be removed (its path included), for the error
        the caller raises or is raising: a failed write leaves the old file or
        nothing, and a temporary file it cannot remove is said, never left quietly."""
        try:
            self.close()
        except OSError:
            pass  # a descriptor that no longer closes cleanly: the removal decides
        problem = None
        try:
            if self._folder_fd is not None:
                os.unlink(os.path.basename(self.path), dir_fd=self._folder_fd)
            else:
                os.unlink(self.path)
        except FileNotFoundError:
            pass  # gone with its folder (removed whole), or never written
        except OSError as exc:
            problem = (
                f"its temporary file {self.path!r} could not be removed "
                f"({exc.strerror or exc}): delete it by hand"
            )
        self.done()
        return problem


def _folder_descriptor(folder):
    """A descriptor of ``folder`` for Temp.discard, or None where this system has no
    ``dir_fd`` removal (Windows: a folder holding an open file cannot be renamed)."""
    if os.unlink not in os.supports_dir_fd or not hasattr(os, "O_DIRECTORY"):
        return None
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None  # a folder one may write in but not read: removal by path


def create_temp(path, mode=None, label=None) -> Temp:
    """A new hidden file beside ``path``, as a :class:`Temp`.  When ``path``
    exists, the new file gets its permission bits (re-saving a 0600 file keeps it
    0600); otherwise ``mode`` (the bits of a file removed before it was replaced),
    else the umask's.  The name fits the folder's name limit however long
    ``path``'s is.  A failure is a WriteError naming ``label`` (the caller's path,
    when ``path`` is the target of its link), else ``path``."""
    label = path if label is None else label
    folder, base = os.path.split(resolve_folder(path))
    flags = (
        os.O_WRONLY
        | os.O_CREAT
        | os.O_EXCL
        | getattr(os, "O_BINARY", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        pass  # no file there: the caller's mode, if any
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    for _ in range(100):
        suffix = f".{secrets.token_hex(6)}.tmp"
        stem = "." + base
        if len(os.fsencode(stem + suffix)) > name_max:
            stem = ".zt"  # a long name: keep the temporary one short instead
        tmp = os.path.join(folder, stem + suffix)
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteError(
                f"cannot create a file in {folder!r}: {exc.strerror}", path=label, errno=exc.errno
            ) from exc
        if mode is not None:
            try:
                os.fchmod(fd, mode)
            except (OSError, AttributeError):
                pass  # a filesystem without modes: the umask's are what it has
        return Temp(fd, tmp, _folder_descriptor(folder))
    raise WriteError("cannot find a free temporary name", path=label)


def note_leftover(exc: BaseException, problem: Any) -> None:
    """Add ``problem`` (:meth:`Temp.discard`'s answer, if not None) to ``exc``, the
    error a failed write is raising: to its message when it is a ZTensorError, else
    as a note (Python 3.11+; before, the error goes as it is)."""
    if problem is None:
        return
    if isinstance(exc, ZTensorError) and exc.path is not None:
        exc.rename(exc.path, problem)  # the same path, the problem added
        return
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(problem)


def require_room(path, nbytes: int, label=None) -> None:
    """A WriteError naming ``label`` (else ``path``: the caller's name for the file,
    where ``path`` is its resolved target) when the filesystem its file would be written on
    has less room than ``nbytes``, before a byte is written: an output whose size a
    file merely declares (a stride-0 view of 1.4 KB that is 256 GiB written out)
    filled the disk for minutes, then failed.  No answer from the system: no check."""
    folder = os.path.dirname(resolve_folder(os.fspath(path))) or "."
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise WriteError(
            f"the output needs {nbytes:,} bytes and its disk has {free:,} free; nothing "
            "was written",
            path=path if label is None else label,
            errno=errno.ENOSPC,
        )


def replace_atomically(
    path: str,
    write: Callable[[Any], None],
    *,
    by_name: bool = False,
    mode=None,
    size: Optional[int] = None,
) -> None:
    """``write(file object)`` (or ``write(temporary path)`` with ``by_name``, for
    writers that open the file themselves) into a temporary file beside ``path``'s
    final target, renamed into place once complete (with ``path``'s permission bits,
    else ``mode``: see :func:`create_temp`).  On any failure the temporary file is
    removed (wherever its folder went: :meth:`Temp.discard`; one that cannot be is
    said in the error) and ``path`` is untouched; an OSError becomes a WriteError
    naming ``path``.  ``size``: the bytes it will write, when known (checked first:
    :func:`require_room`)."""
    target = final_target(path)
    if size is not None:
        require_room(target, size, label=path)
    temp = create_temp(target, mode, label=path)
    try:
        if by_name:
            temp.close()
            write(temp.path)
        else:
            fd, temp.fd = temp.fd, None
            with os.fdopen(fd, "wb") as f:
                write(f)
        os.replace(temp.path, target)
        temp.done()
    except BaseException as exc:
        problem = temp.discard()
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            error = WriteError(
                f"cannot write the file: {exc.strerror or exc}", path=path, errno=exc.errno
            )
            note_leftover(error, problem)
            raise error from exc
        note_leftover(exc, problem)
        raise


def write_json_atomically(path: str, value: Any, mode=None) -> None:
    """``value`` as indented JSON with sorted keys (a sharded checkpoint's index),
    through :func:`replace_atomically`: the same rules as every other file this
    package writes (a symlink stays a link to the new file; a failure leaves the old
    file and is a WriteError naming ``path``)."""
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    replace_atomically(path, lambda f: f.write(text.encode("utf-8")), mode=mode)


__all__ = [
    "final_target",
    "identity",
    "require_unchanged",
    "Temp",
    "create_temp",
    "note_leftover",
    "replace_atomically",
    "write_json_atomically",
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


def _write_journal(target: str, state: str, aside, new) -> None:
    """The record :func:`_recover` reads: ``aside`` the [name, name of its old
    file's link, device, inode of that old file] of each file a move replaces, the
    old index last; ``new`` the [name, device, inode of the new file] of each that
    replaces nothing (a rename keeps the inode).  The identities are what lets the
    record act only on the files it was written for: a record that came with a
    folder (a clone, an archive) or outlived its files names others.  Written beside
    its name and renamed onto it: a link placed at the name is replaced, never
    followed (replace_atomically follows links, and a link there made the record
    replace a file outside the folder)."""
    entry = {"state": state, "aside": [list(r) for r in aside], "new": [list(r) for r in new]}
    fd, temp = tempfile.mkstemp(prefix=_JOURNAL + ".", suffix=".tmp", dir=target)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(entry).encode("utf-8"))
        os.replace(temp, os.path.join(target, _JOURNAL))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _read_journal(target: str) -> Any:
    """The record of moves left part way in ``target``, or None: none there, or
    one this process must not act on (not a regular file of this user's, too big,
    or not of the shape :func:`_write_journal` gives; a name in it that is not one
    plain file name in ``target``, or a link name not of :func:`_link_aside`'s
    form).  A record it cannot trust is left as it is."""
    path = os.path.join(target, _JOURNAL)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
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
        and all(
            isinstance(row, list)
            and len(row) == 3
            and plain(row[0])
            and number(row[1])
            and number(row[2])
            for row in entry["new"]
        )
    ):
        return None
    return entry


def _recover(target: str) -> None:
    """Finish what a process killed during :func:`_replace_all` left in ``target``
    (its record: :func:`_read_journal`): moves left part way are undone (each new
    file without an old one removed, each old file renamed back from its link, the
    old index last), so the folder holds the old checkpoint again; moves that were
    complete lose only their links aside.  Best effort, under the folder's lock."""
    entry = _read_journal(target)
    if entry is None:
        return
    if entry["state"] == "moving":
        for name, dev, ino in entry["new"]:
            path = os.path.join(target, name)
            if _is_file(path, dev, ino):  # the new file itself, nothing else
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for name, link, dev, ino in entry["aside"]:
            if _is_file(os.path.join(target, link), dev, ino):
                _restore(os.path.join(target, name), os.path.join(target, link))
    else:
        for _, link, dev, ino in entry["aside"]:
            path = os.path.join(target, link)
            if _is_file(path, dev, ino):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(target, _JOURNAL))


def _is_file(path: str, dev: int, ino: int) -> bool:
    """Whether ``path`` is (not through a link) the file of that device and inode."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (dev, ino)


def _restore(destination: str, link: str) -> None:
    """The old file at ``link`` back at ``destination`` (best effort).  Where both
    are still one file (linked aside, never replaced) the link just goes: a rename
    of one name of a file onto another does nothing, and the link would stay."""
    with contextlib.suppress(OSError):
        if not os.path.lexists(link):
            return
        if os.path.lexists(destination) and os.path.samefile(destination, link):
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
    a loop of links there is a WriteError: :func:`final_target`), each staged file
    is given the permission bits of the file it replaces, and one whose destination
    is on another filesystem (a link out of the folder) is copied into a temporary
    file beside that destination.  A failure so far leaves ``target`` as it was.
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
    ready = []  # (what to rename, its destination, its Temp when a copy)
    try:
        for name in names:
            ready.append(_ready_to_move(os.path.join(staging, name), os.path.join(target, name)))
        _require_distinct(ready, names, target)
        old_index = None if index is None else final_target(os.path.join(target, index))
    except BaseException:
        for _, _, temp in ready:
            if temp is not None:
                temp.discard()
        raise
    # the checkpoint replaced may have been one whole file (model.zt beside the new
    # model.zt.index.json): transformers loads that one first, so it goes too
    whole = index[: -len(".index.json")] if index and index.endswith(".index.json") else None
    with _folder_locked(target) as held:
        if held:
            _recover(target)  # a save killed since this one's staging folder was made
        # asked under the lock, before the moves: the old checkpoint's files as they
        # are now (asked before the lock, a save that moved in meanwhile lost its)
        old_files = set(replaced())
        links = _replace_all(ready, old_index, target, names)
        # under the lock too: a save moving in after this one released it lost a
        # shard this one removed as "replaced"; and despite an interrupt (the new
        # checkpoint is in place: its clean-up is finished, then the interrupt
        # raised), the record last (a process killed before it goes leaves it
        # saying the moves were complete: the next save removes the rest)
        gone = (old_files | ({whole} if whole else set())) - set(names) - {index}
        _unlink_all(
            links
            + [os.path.join(target, name) for name in sorted(gone)]
            + [os.path.join(target, _JOURNAL)]
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
    for (_, destination, _), name in zip(ready, names):
        if destination in seen:
            raise WriteError(
                f"is a link to the same file as {seen[destination]!r} ({destination}): "
                "each file of the checkpoint needs a file of its own, so nothing was moved",
                path=os.path.join(target, name),
            )
        seen[destination] = name


def _replace_all(ready, old_index: Optional[str], target: str, names) -> List[str]:
    """The moves of :func:`move_staged`, all or none: each file a move replaces is
    first linked aside (a hidden name beside it), the old index removed, every new
    file renamed into place, the index last.  A failure or an interruption at any
    step (a rename refused, an immutable file, Ctrl-C) puts every replaced file
    back and removes the new ones, the old index last: the folder is as it was.
    Once all are in place the old files' links are returned, for the caller to
    remove with the rest of the clean-up.  A record of the moves in ``target``
    (:func:`_write_journal`) lets the next save finish the job of a process killed
    on the way (:func:`_recover`)."""
    home = os.path.realpath(target)
    links = {}  # destination -> where its old file is linked aside
    for (_, destination, _), _name in zip(ready, names):
        if destination != old_index and os.path.lexists(destination):
            links[destination] = _aside_name(destination)
    if old_index is not None and os.path.lexists(old_index):
        links[old_index] = _aside_name(old_index)  # last: put back last
    # only what lies in ``target`` itself is recorded (a destination reached through
    # a link out of the folder is put back by this process alone)
    recorded = [
        (os.path.basename(d), os.path.basename(link), *_identity_of(d))
        for d, link in links.items()
        if os.path.dirname(d) == home
    ]
    new = [
        (os.path.basename(d), *_identity_of(source))
        for source, d, _ in ready
        if d not in links and os.path.dirname(d) == home
    ]
    kept = []  # (destination, the old file's link aside)
    placed = []  # (destination, its old file's link aside or None, the staged file)
    step = target
    journal = False
    try:
        _write_journal(target, "moving", recorded, new)
        journal = True
        for destination, link in links.items():
            step = destination
            _link_aside(destination, link)
            kept.append((destination, link))
            if destination == old_index and os.path.lexists(destination):
                os.unlink(destination)  # linked aside, not renamed there
        for (source, destination, temp), name in zip(ready, names):
            step = os.path.join(target, name)
            # recorded first: an interruption right after the rename still undoes it
            placed.append((destination, links.get(destination), source))
            os.replace(source, destination)
            if temp is not None:
                temp.done()
        _write_journal(target, "moved", recorded, new)
    except BaseException as exc:
        _put_back(placed, kept)
        for _, _, temp in ready:
            if temp is not None:
                temp.discard()
        if journal:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(target, _JOURNAL))
        if isinstance(exc, OSError):
            raise _failed("cannot move the new file into place", exc, step) from None
        raise
    return [link for _, link in kept]


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


def _ready_to_move(staged: str, final: str):
    """(path to rename, destination, Temp or None) for moving ``staged`` to
    ``final`` (see :func:`move_staged`); nothing at ``final`` changes."""
    try:
        destination = final_target(final)
        try:
            mode: Optional[int] = stat.S_IMODE(os.stat(destination).st_mode)
        except FileNotFoundError:
            mode = None  # a new file: the mode it was made with
        if mode is not None:
            os.chmod(staged, mode)
        folder = os.path.dirname(destination)
        if os.stat(staged).st_dev == os.stat(folder).st_dev:
            return staged, destination, None
        # another filesystem: a rename cannot cross it, so a copy beside it first
        temp = create_temp(destination, stat.S_IMODE(os.stat(staged).st_mode), label=final)
        try:
            fd, temp.fd = temp.fd, None
            with os.fdopen(fd, "wb") as out:
                _copy_into(staged, out)
        except BaseException:
            temp.discard()
            raise
        return temp.path, destination, temp
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


def _copy_into(path: str, out) -> None:
    with open(path, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)
