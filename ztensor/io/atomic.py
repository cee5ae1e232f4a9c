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
import secrets
import shutil
import stat
import tempfile
from typing import Any, Callable, Iterator, Optional

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


def staging_folder(target: str) -> str:
    """A new hidden folder inside the folder ``target``, where a set of files that
    must replace their namesakes together (a checkpoint's shards, copies and index)
    is written whole before any is moved (:func:`move_staged`): the same filesystem,
    so each move is a rename."""
    try:
        return tempfile.mkdtemp(prefix=".ztensor-staged-", dir=target)
    except OSError as exc:
        raise _failed("cannot create a folder for the new files", exc, target) from None


def move_staged(staging: str, target: str, index: Optional[str], replaced=()) -> None:
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
    of ``replaced`` (the old index's shards) that the new checkpoint lacks removed:
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
        old_index = None if index is None else final_target(os.path.join(target, index))
    except BaseException:
        for _, _, temp in ready:
            if temp is not None:
                temp.discard()
        raise
    # the checkpoint replaced may have been one whole file (model.zt beside the new
    # model.zt.index.json): transformers loads that one first, so it goes too
    whole = index[: -len(".index.json")] if index and index.endswith(".index.json") else None
    with _folder_locked(target):
        _replace_all(ready, old_index, target, names)
        # under the lock too: a save moving in after this one released it lost a
        # shard this one removed as "replaced"
        for name in (set(replaced) | ({whole} if whole else set())) - set(names) - {index}:
            try:
                os.unlink(os.path.join(target, name))
            except OSError:
                pass  # gone already, or not ours to remove: the new index does not name it


def _replace_all(ready, old_index: Optional[str], target: str, names) -> None:
    """The moves of :func:`move_staged`, all or none: each file a move replaces is
    first linked aside (a hidden name beside it), the old index removed, every new
    file renamed into place, the index last.  A failure or an interruption at any
    step (a rename refused, an immutable file, Ctrl-C) puts every replaced file
    back and removes the new ones, the old index last: the folder is as it was.
    Once all are in place the old files' links go."""
    kept = []  # (destination, the old file's link aside)
    placed = []  # (destination, its old file's link aside or None, the staged file)
    step = target
    try:
        for (_, destination, _), name in zip(ready, names):
            step = os.path.join(target, name)
            if destination != old_index and os.path.lexists(destination):
                kept.append((destination, _link_aside(destination)))
        if old_index is not None and os.path.lexists(old_index):
            step = old_index
            kept.append((old_index, _link_aside(old_index)))
            if os.path.lexists(old_index):  # linked aside, not renamed there
                os.unlink(old_index)
        aside = dict(kept)
        for (source, destination, temp), name in zip(ready, names):
            step = os.path.join(target, name)
            # recorded first: an interruption right after the rename still undoes it
            placed.append((destination, aside.get(destination), source))
            os.replace(source, destination)
            if temp is not None:
                temp.done()
    except BaseException as exc:
        _put_back(placed, kept, old_index)
        for _, _, temp in ready:
            if temp is not None:
                temp.discard()
        if isinstance(exc, OSError):
            raise _failed("cannot move the new file into place", exc, step) from None
        raise
    for _, link in kept:
        with contextlib.suppress(OSError):
            os.unlink(link)


def _link_aside(path: str) -> str:
    """A second name for the file at ``path``, hidden beside it (same folder, same
    filesystem): a hard link; where none can be made (a filesystem without them,
    protected_hardlinks and another owner's file) the file itself is renamed there,
    never copied (a copy of every shard needed the checkpoint's size again)."""
    folder = os.path.dirname(path)
    for _ in range(100):
        link = os.path.join(folder, f".{secrets.token_hex(6)}.old")
        try:
            os.link(path, link, follow_symlinks=False)
            return link
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise
            if os.path.lexists(link):
                continue
            os.rename(path, link)  # the destination is absent until the new file comes
            return link
    raise FileExistsError(errno.EEXIST, "no free name for a link aside", folder)


def _put_back(placed, kept, old_index: Optional[str]) -> None:
    """Undo :func:`_replace_all`'s moves: each new file removed or its old one
    renamed back over it, the old index last (best effort: what cannot be put back
    stays, and the error raised says the move failed)."""
    for destination, link, source in reversed(placed):
        if os.path.lexists(source):
            continue  # interrupted before its rename: nothing of it is in place
        with contextlib.suppress(OSError):
            if link is None:
                os.unlink(destination)
            else:
                os.replace(link, destination)
    restored = {destination for destination, _, source in placed if not os.path.lexists(source)}
    for destination, link in kept:
        if destination in restored:
            continue
        with contextlib.suppress(OSError):
            if os.path.lexists(destination):
                # never replaced: the link and the file are one (a rename of one
                # onto the other does nothing, and the link would stay)
                os.unlink(link)
            else:  # the old index, removed before the moves
                os.replace(link, destination)


@contextlib.contextmanager
def _folder_locked(folder: str) -> Iterator[None]:
    """An exclusive advisory lock (flock) on ``folder`` while a checkpoint's files
    move into it: two saves into one folder move one after the other, each whole
    (interleaved, one's index named the other's shards).  Where folders cannot be
    locked (no fcntl, a filesystem refusing it), nothing is held."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without locks: the moves are still all or none
        yield
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
