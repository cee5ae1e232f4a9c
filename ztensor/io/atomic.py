"""Atomic file replacement: a file is written beside its final name and renamed into
place once complete, so the final name only ever holds a whole file (the old one, or
the new one).

The one home of the rule, used by the Writer (``.zt`` files), the exporters
(``.safetensors``, ``.npz``, ``.gguf``: :func:`replace_atomically`) and the sharded
checkpoint writers and converter (``*.index.json``: :func:`write_json_atomically`).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from typing import Any, Callable, Optional, Union

from ztensor import kernels
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


def replace_if_unchanged(source: str, target: str, expected, label) -> None:
    """Rename ``source`` over ``target`` only while ``target`` is still the version
    ``expected`` (:func:`require_unchanged`), the check and the rename made under an
    exclusive lock on ``target``'s folder: without it two editors could both pass
    the check, and the second rename dropped the first edit without a word (each
    returned normally).  The lock is advisory (flock) and held only for the check
    and the rename; where the system has none (no ``fcntl``), or the folder cannot
    be locked (some network filesystems), the check is made unlocked, as before.
    OSError from the rename is the caller's to word."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        fcntl = None  # type: ignore[assignment]
    folder_fd = None
    if fcntl is not None:
        try:
            folder_fd = os.open(os.path.dirname(target) or ".", os.O_RDONLY)
            fcntl.flock(folder_fd, fcntl.LOCK_EX)
        except OSError:
            if folder_fd is not None:
                os.close(folder_fd)
            folder_fd = None  # no lock to take here: the unlocked check follows
    try:
        require_unchanged(target, expected, label)
        os.replace(source, target)
    finally:
        if folder_fd is not None:
            os.close(folder_fd)  # closing the last descriptor releases the lock


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
    owner = None
    try:
        st = os.stat(path)
        mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
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
        if owner is not None:
            _keep_owner(fd, *owner)
        if mode is not None:
            try:
                os.fchmod(fd, mode)
            except (OSError, AttributeError):
                pass  # a filesystem without modes: the umask's are what it has
        return Temp(fd, tmp, _folder_descriptor(folder))
    raise WriteError("cannot find a free temporary name", path=label)


def _keep_owner(fd: int, uid: int, gid: int) -> None:
    """The replaced file's owner and group on its replacement, as far as this process
    may give them: a file shared through its group (mode 660, group ``team``) stayed
    writable to the group only while an edit kept the group.  Root keeps both; anyone
    else keeps the group where they belong to it; where neither is allowed, the new
    file is the editor's, as any new file is."""
    for owner in ((uid, gid), (-1, gid)):
        try:
            os.fchown(fd, *owner)
            return
        except (OSError, AttributeError):
            continue


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


def reserve(fd: int, size: int) -> None:
    """Reserve the disk blocks of a file of ``size`` bytes of data and headers of an
    unknown length, ahead of writing it (:func:`ztensor.kernels.reserve_ahead`; ext4
    only, else nothing).  On ext4 a rename over an old file writes the whole new file
    back inside the rename if any of its blocks was left unchosen (csrc/blobwrite.c:
    300 ms for 512 MB here), so a few headers past the reservation cost as much as
    none.  The unused rest is given back by :func:`give_back_reserved` once the file
    is complete; every reservation must be followed by it."""
    kernels.reserve_ahead(fd, size + max(1 << 20, size // 16))


def give_back_reserved(file: Union[int, str]) -> None:
    """Free the blocks :func:`reserve` kept past the end of a complete file (a
    descriptor, or the path of a closed file), and those a reservation that failed
    part way kept."""
    if isinstance(file, int):
        os.ftruncate(file, os.fstat(file).st_size)
    else:
        os.truncate(file, os.stat(file).st_size)


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
    :func:`require_room`; and, for a file object, reserved on the disk ahead:
    :func:`reserve`.  A writer by name reserves its own, once it has opened the
    file, as the GGUF exporter does)."""
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
                if size is not None:
                    reserve(fd, size)
                write(f)
                if size is not None:
                    f.flush()
                    give_back_reserved(fd)
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
    file and is a WriteError naming ``path``).  NaN and infinities, which JSON has
    no word for, are a ValueError naming ``path`` before anything is written: what
    this package writes, its readers read."""
    try:
        text = json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"
    except ValueError as exc:
        raise ValueError(f"{path}: cannot be written as JSON: {exc}") from None
    replace_atomically(path, lambda f: f.write(text.encode("utf-8")), mode=mode)


__all__ = [
    "final_target",
    "identity",
    "require_unchanged",
    "replace_if_unchanged",
    "Temp",
    "create_temp",
    "note_leftover",
    "reserve",
    "give_back_reserved",
    "replace_atomically",
    "write_json_atomically",
]
