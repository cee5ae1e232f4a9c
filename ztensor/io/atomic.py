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
from typing import Any, Callable

from ztensor.errors import WriteError


def final_target(path):
    """The file the rename replaces: a symlink's target (so the link stays a link
    to the new file), else ``path`` itself.  What is there must be a regular file,
    or nothing: a rename over a FIFO, socket or device (``/dev/null``, which root
    may rename over) would replace it with a regular file, and over a directory it
    fails only once the whole file is written, so either is a WriteError naming
    ``path`` before a byte is written.  So is a name no file can have: empty, with
    a NUL (``os`` raised a bare ValueError), or ending in a separator (a folder's
    name: the rename failed only once the whole file was written).  The one check
    for every file this package writes (the Writer, the exporters, indexes, a
    checkpoint's copied files)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"a path to write is a str or os.PathLike[str], not {type(text).__name__}")
    if not text or "\0" in text or text.endswith((os.sep, os.altsep or os.sep)):
        raise WriteError("is not a file name: a file cannot be written there", path=path)
    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        mode = os.stat(target).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the rename would replace the link itself
            raise WriteError("is a loop of symbolic links", path=path, errno=exc.errno) from None
        return target  # nothing there yet, or no way to look: creating it will say
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        raise WriteError(f"is {kind}, not a file: a file written here would replace it", path=path)
    return target


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


def create_temp(path, mode=None, label=None):
    """A new hidden file beside ``path``, as ``(fd, temporary path)``.  When ``path``
    exists, the new file gets its permission bits (re-saving a 0600 file keeps it
    0600); otherwise ``mode`` (the bits of a file removed before it was replaced),
    else the umask's.  The name fits the folder's name limit however long
    ``path``'s is.  A failure is a WriteError naming ``label`` (the caller's path,
    when ``path`` is the target of its link), else ``path``."""
    label = path if label is None else label
    folder, base = os.path.split(os.path.abspath(path))
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
        return fd, tmp
    raise WriteError("cannot find a free temporary name", path=label)


def replace_atomically(
    path: str, write: Callable[[Any], None], *, by_name: bool = False, mode=None
) -> None:
    """``write(file object)`` (or ``write(temporary path)`` with ``by_name``, for
    writers that open the file themselves) into a temporary file beside ``path``'s
    final target, renamed into place once complete (with ``path``'s permission bits,
    else ``mode``: see :func:`create_temp`).  On any failure the temporary file is
    removed and ``path`` is untouched; an OSError becomes a WriteError naming
    ``path``."""
    target = final_target(path)
    fd, tmp = create_temp(target, mode, label=path)
    try:
        if by_name:
            os.close(fd)
            write(tmp)
        else:
            with os.fdopen(fd, "wb") as f:
                write(f)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(
                f"cannot write the file: {exc.strerror or exc}", path=path, errno=exc.errno
            ) from exc
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
    "create_temp",
    "replace_atomically",
    "write_json_atomically",
]
