"""READ 0: byte access to a file or an in-memory buffer, always bounds-checked.

Two ways to read a file:

* mapped (the default): the file is memory-mapped read-only and zero-copy views
  are handed out.  The descriptor is closed as soon as the mapping exists (the
  mapping keeps what it needs), and arrays handed out keep the mapping alive, so
  :meth:`Source.close` is safe while they live.  A file truncated by another
  process while mapped makes the *next touch* of a vanished page a SIGBUS: the
  kernel's rule for every mapping, ``copy=True`` included, since the copy reads
  the mapping.
* ``mmap=False``: every read is a ``pread`` into a fresh buffer.  No views, no
  SIGBUS: a file that shrinks under the reader gives a clean FormatError.  For
  files on network filesystems, or written by other processes while read.

Every access takes a lock shared with :meth:`close`, so a ``close()`` racing a read
either happens before it (the read raises "closed") or after it (the read holds
its own reference to the mapping): never an empty or swapped view.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import io
import mmap as _mmap
import os
import re
import stat
import sys
import threading
from typing import Iterator, Optional, Tuple

import numpy as np

from ztensor import kernels
from ztensor.errors import (
    ClosedError,
    FormatError,
    NetworkConnectionError,
    NetworkError,
    NetworkNotFoundError,
    NetworkPermissionError,
    NetworkTimeoutError,
    NotAFileError,
    ReadError,
    UnsupportedError,
    ZTensorError,
)


def is_url(path) -> bool:
    """True for a string naming an fsspec URL (``https://``, ``s3://``...), and so
    for ``file://`` too: it is refused as a URL (url_filesystem: give the path).
    Taken as a plain path, ``file:///tmp/m.zt`` was the relative path
    ``./file:/tmp/m.zt``, read and written in the current folder."""
    return isinstance(path, str) and "://" in path


class ShrinkCheckedFile(io.RawIOBase):
    """A file from :func:`open_local_input`, for a library that reads it through
    Python calls (h5py): a read that comes back short of bytes the file held when it
    was checked raises ``OSError`` ("it shrank while open").  h5py pads a short read
    with zeros, so a file truncated by another process would otherwise read as wrong
    values, silently.  Reads past the size at open pass as the OS gives them (a
    library may probe past the end).  Closing it closes ``raw``."""

    def __init__(self, raw, name):
        super().__init__()
        self.raw, self.name = raw, name
        self.size = os.fstat(raw.fileno()).st_size

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        return self.raw.seek(offset, whence)

    def tell(self):
        return self.raw.tell()

    def readinto(self, buffer):
        start = self.raw.tell()
        n = self.raw.readinto(buffer)
        want = min(start + len(buffer), self.size)
        if start + (n or 0) < want:
            raise OSError(
                f"the file ends at byte {start + (n or 0)}, before {want} (it shrank while open)"
            )
        return n

    def fileno(self):
        return self.raw.fileno()

    def close(self):
        try:
            self.raw.close()
        finally:
            super().close()


# (name, device, inode) of the one file a name must lead to while pinned_file() holds
_PINNED_FILE: contextvars.ContextVar[Optional[Tuple[str, int, int]]] = contextvars.ContextVar(
    "ztensor_pinned_file", default=None
)


@contextlib.contextmanager
def pinned_file(name: str, device: int, inode: int) -> Iterator[None]:
    """While active (in this thread or task), :func:`open_local_input` opens ``name``
    only if the descriptor it opened is the file (``device``, ``inode``), else an
    UnsupportedError naming it.  For a caller that proved a name leads to a file it
    holds (safe_open_handle, by its handle's descriptor) and then has readers open it
    by name: the proof is checked again on each descriptor those readers read, so a
    file swapped in between is refused rather than read."""
    token = _PINNED_FILE.set((name, device, inode))
    try:
        yield
    finally:
        _PINNED_FILE.reset(token)


def _check_pinned(label: str, st: os.stat_result) -> None:
    pinned = _PINNED_FILE.get()
    if pinned is not None and pinned[0] == label and (st.st_dev, st.st_ino) != pinned[1:]:
        raise UnsupportedError(
            "this name no longer leads to the handle's file (renamed, replaced or "
            "deleted since it was opened)",
            path=label,
        )


def open_local_input(path) -> io.BufferedReader:
    """Open the local file at ``path`` for reading as input: the one gate every
    local reader passes (``Source``, ``foreign.sniff``, ``importers.open_any``, the
    HDF5 reader, sharded indexes).

    The file is opened without blocking (``O_NONBLOCK``: a FIFO must not wait for a
    writer) and checked on the open descriptor (``fstat``, so a path swapped after
    the check cannot matter): only a regular file passes.  A directory is a
    :class:`NotAFileError` (also an ``IsADirectoryError``); a FIFO, socket or
    device (``/dev/zero``, a symlink to a FIFO) is a FormatError naming the path; a
    name the OS cannot take (an embedded NUL) is a FormatError.  A missing or
    unreadable file stays the ``OSError`` the OS gave.  Returns a buffered binary
    file the caller closes; hand it on (zipfile, h5py take file objects) rather than
    opening the path again.
    """
    name = os.fspath(path)
    label = os.fsdecode(name)
    # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below);
    # on a regular file it changes nothing
    flags = (
        os.O_RDONLY
        | getattr(os, "O_BINARY", 0)
        | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_NONBLOCK", 0)
    )
    try:
        fd = os.open(name, flags)
    except ValueError as exc:  # "embedded null byte": no file has such a name
        raise FormatError(f"not a file name: {exc}", path=repr(label)) from None
    except IsADirectoryError:  # systems that refuse to open a directory at all
        raise NotAFileError("is a directory, not a tensor file", path=label) from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        _check_pinned(label, st)
        if stat.S_ISDIR(mode):
            raise NotAFileError("is a directory, not a tensor file", path=label)
        if not stat.S_ISREG(mode):
            raise FormatError(
                "not a regular file (a FIFO, socket or device cannot be read as a tensor file)",
                path=label,
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def refuse_unchecked_file(f, name) -> None:
    """An UnsupportedError for an fsspec file object the caller opened outside ztensor
    whose reads ztensor cannot hold to what it promises of a URL's:

    * one of fsspec's HTTP(S) filesystem (``fsspec.open("https://...")``): ztensor
      checks an HTTP(S) reply only in the session it makes itself (url_options), so
      such a file's replies are read as fsspec reads them: a 206 without end was read
      whole into memory (gigabytes for a 4 KB tensor) and its first bytes taken as
      the tensor, and no request was held to one version of the file;
    * one whose store records a version that its reads do not carry (gcsfs's
      generation, adlfs's ETag, an s3fs file opened with ``size=``), or whose cache
      fetches or keeps blocks outside the file's own reads (a ``blockcache::`` file):
      an object replaced between two reads was read as one object's manifest over
      the other's bytes.  The rule is :func:`open_url`'s for a URL (:func:`_version_held`); a
      file object has no ``storage_options`` to opt in with, so the caller gives
      the URL with ``storage_options={"ztensor_allow_unversioned": True}``.

    Every other file object passes (a local file, ``io.BytesIO``, an s3fs file that
    sends its ETag, a store recording no version: ``memory://``)."""
    protocols = getattr(getattr(f, "fs", None), "protocol", ())
    protocols = {protocols} if isinstance(protocols, str) else set(protocols or ())
    if protocols & {"http", "https"}:
        raise UnsupportedError(
            "an HTTP(S) file opened by fsspec outside ztensor is not read: its "
            "replies would not be checked against the range asked for, nor held to "
            "one version of the file. Give its URL (and storage_options) instead",
            path=name,
        )
    if getattr(f, "fs", None) is not None and not _version_held(f, None):
        raise UnsupportedError(
            f"a file of {type(f.fs).__name__} opened outside ztensor is not read: its "
            "reads cannot be held to the version opened, and an object replaced while "
            "read would mix two objects' bytes. Give its URL instead, with "
            f"storage_options={{{UNVERSIONED_OPTION!r}: True}} to read it anyway",
            path=name,
        )


class Source:
    """Read-only bytes of one file or buffer.

    Parameters
    ----------
    source : str, os.PathLike, bytes, bytearray or memoryview
        A path to read, or a buffer to read from.
    copy_on_write : bool
        Map a file privately and writably: views can be written, the writes go to
        private copies of the touched pages and never reach the file.
    mmap : bool
        False: read a file with ``pread`` instead of mapping it (see the module doc).
    """

    def __init__(self, source, copy_on_write=False, mmap=True, storage_options=None):
        self._lock = threading.Lock()
        self._closed = False
        self._copy_on_write = copy_on_write
        self._fd = None
        self._identity = None  # a mapped local file's (device, inode): see reading()
        self._map = None
        self._view = None
        self._file = None
        self._url = None
        if is_url(source):
            self._url = source
            source = open_url(source, storage_options)  # fsspec: s3://, https://, ...
        if hasattr(source, "seek") and (hasattr(source, "readinto") or hasattr(source, "read")):
            try:
                with network_errors(self._url):
                    self._open_fileobj(source)
            except BaseException:
                if self._url is not None:  # ours to close: its connection too
                    with contextlib.suppress(Exception):
                        source.close()
                raise
            if self._url is not None:
                self.name = self._url  # the user's URL, not fsspec's inner path
            return
        if isinstance(source, (str, os.PathLike)):
            self.name = os.fspath(source)
            self._open_file(self.name, mmap)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self.name = "<bytes>"
            view = memoryview(source)
            if not view.c_contiguous:
                raise TypeError("a buffer source must be C-contiguous")
            self._view = view.cast("B").toreadonly()
            self.size = len(self._view)
        else:
            raise TypeError(f"expected a path or a bytes-like object, got {type(source).__name__}")

    def _open_file(self, path: str, use_mmap: bool) -> None:
        f = open_local_input(path)
        try:
            self.size = os.fstat(f.fileno()).st_size
            if not use_mmap:
                self._fd = os.dup(f.fileno())
                return
            if self.size:
                access = _mmap.ACCESS_COPY if self._copy_on_write else _mmap.ACCESS_READ
                extra = {"trackfd": False} if sys.version_info >= (3, 13) else {}
                try:
                    self._map = _mmap.mmap(f.fileno(), 0, access=access, **extra)
                except OSError:
                    # a filesystem that cannot map files (sysfs, some FUSE and
                    # network mounts) still reads: by pread, as mmap=False does
                    self._fd = os.dup(f.fileno())
                    return
                ask_for_large_folios(self._map, self.size)
                self._view = memoryview(self._map)
                if not self._copy_on_write:  # the file's bytes are the mapping's
                    st = os.fstat(f.fileno())
                    self._identity = (path, st.st_dev, st.st_ino)
            else:
                self._view = memoryview(b"")
        finally:
            f.close()  # the mapping needs no descriptor of ours

    def _open_fileobj(self, f) -> None:
        """A seekable binary file object (an open file, io.BytesIO, an fsspec file):
        read with seek + read under the lock; only what is asked for is fetched."""
        if hasattr(f, "seekable") and not f.seekable():
            raise TypeError("a file object source must be seekable")
        if hasattr(f, "mode") and "b" not in str(getattr(f, "mode", "b")):
            raise TypeError("a file object source must be opened in binary mode")
        label = getattr(f, "path", None) or getattr(f, "name", None)
        self.name = os.fspath(label) if isinstance(label, (str, os.PathLike)) else "<file object>"
        if self._url is None:
            refuse_unchecked_file(f, self.name)
        self._file = f
        if getattr(f, "fs", None) is not None and self._url is None:
            self._url = self.name  # an fsspec file handed in: its failures are network ones
        try:
            end = f.seek(0, os.SEEK_END)
            # mmap.mmap's seek returns None: its tell() says where it is
            self.size = end if isinstance(end, int) else f.tell()
        except (ValueError, OSError) as exc:
            if self._url is None:
                raise TypeError(f"a file object source must be seekable ({exc})") from None
            # fsspec hands out a streaming file when a server states no length (or
            # a length of 0): nothing can be read from it by range
            raise FormatError(
                "the server gives no length for this URL (none, or only that of a "
                "compressed Content-Encoding), so its bytes cannot be read by range "
                f"({exc})",
                path=self.name,
            ) from None

    @property
    def copy_on_write(self) -> bool:
        return self._copy_on_write

    @property
    def mapped(self) -> bool:
        """True when views are zero-copy slices of memory (a mapping or a buffer)."""
        return self._fd is None and self._file is None

    def _check(self, offset, length, what, where):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(
                f"{what}: bytes {offset}..{offset + length} lie outside the "
                f"file of {self.size} bytes",
                path=self.name,
                **where,
            )

    def view(self, offset: int, length: int, what: str, **where):
        """``length`` bytes at ``offset``: a zero-copy view (mapped) or a fresh
        read-only buffer (pread); FormatError when they are not all in the source."""
        self._check(offset, length, what, where)
        with self._lock:
            self._require_open()
            if self._file is None and self._fd is None:
                return self._view[offset : offset + length]
        return memoryview(self._read_fresh(offset, length, what, where)).toreadonly()

    def _read_fresh(self, offset, length, what, where):
        """A new bytearray of ``length`` bytes at ``offset`` (unmapped sources)."""
        with self._lock:
            self._require_open()
            if self._file is not None:
                with network_errors(self._url):
                    return _read_exactly(self._file, offset, length, self.name, what, where)
            # pread under the lock: close() cannot hand the descriptor number to
            # another file between the check and the read
            return _pread_exactly(self._fd, offset, length, self.name, what, where)

    def read_ranges(self, ranges, threads=1, wheres=None):
        """The bytes of each ``(offset, length)`` in ``ranges``, for sources that are
        not mapped: neighbours closer than _GAP are fetched as one range (at most
        _GROUP bytes), and the fetches run concurrently: fsspec's ``cat_ranges`` for its
        files (parallel HTTP range requests), ``threads`` preads for a descriptor,
        one after another for other file objects.  Every range is checked against the
        source's size first, and a short answer is a FormatError naming the object
        the range belongs to (``wheres``: one ``obj=``/``component=`` dict per range)."""
        wheres = [{}] * len(ranges) if wheres is None else wheres
        for (offset, length), where in zip(ranges, wheres):
            self._check(offset, length, "component", where)
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        groups = []  # [start, end, [index...]]
        for i in order:
            offset, length = ranges[i]
            if (
                groups
                and offset - groups[-1][1] <= _GAP
                and max(groups[-1][1], offset + length) - groups[-1][0] <= _GROUP
            ):
                groups[-1][1] = max(groups[-1][1], offset + length)
                groups[-1][2].append(i)
            else:
                groups.append([offset, offset + length, [i]])
        try:
            blobs = self._fetch([(start, end - start) for start, end, _ in groups], threads)
        except FormatError as exc:
            if exc.obj is not None or not any(wheres):
                raise
            # a fetch covers several objects, so its error names none: read the ranges
            # one by one, in file order, and the first that fails says whose it is
            for i in order:
                self.view(*ranges[i], "component", **wheres[i])
            raise
        out = [None] * len(ranges)
        for (start, _, members), blob in zip(groups, blobs):
            view = memoryview(blob)
            for i in members:
                offset, length = ranges[i]
                out[i] = view[offset - start : offset - start + length]
        return out

    def _fetch(self, spans, threads):
        with self._lock:
            self._require_open()
            f, fd = self._file, self._fd
        fs, path = getattr(f, "fs", None), getattr(f, "path", None)
        if (
            f is not None
            and fs is not None
            and hasattr(fs, "cat_ranges")
            and spans
            and _pin_travels(f, self._url)
        ):
            with network_errors(self._url):
                blobs = self._cat_ranges(fs, path, spans, _request_options(f))
                for (start, length), blob in zip(spans, blobs):
                    if isinstance(blob, BaseException):
                        raise blob
                    if len(blob) != length:
                        raise FormatError(
                            f"component: the source returned {len(blob)} bytes "
                            f"for {start}..{start + length}",
                            path=self.name,
                        )
                    check_range_reply(blob, self.size, self.name)
            return blobs
        if fd is not None and threads > 1 and len(spans) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(threads, len(spans))) as pool:
                return list(pool.map(lambda span: self.view(span[0], span[1], "component"), spans))
        return [self.view(start, length, "component") for start, length in spans]

    @staticmethod
    def _cat_ranges(fs, path, spans, extra):
        """fsspec's ``cat_ranges`` of ``spans``, each request with ``extra`` (the
        file's version pin, :func:`_request_options`: requests made by path do not
        carry what the file was opened with, and read another version of a file
        replaced meanwhile)."""
        starts, ends = [s for s, _ in spans], [s + n for s, n in spans]
        try:
            return fs.cat_ranges([path] * len(spans), starts, ends, on_error="raise", **extra)
        except TypeError:  # an older fsspec without on_error
            return fs.cat_ranges([path] * len(spans), starts, ends, **extra)

    def array(self, dtype: np.dtype, count: int, offset: int, **where) -> np.ndarray:
        """``count`` elements of ``dtype`` at ``offset`` (already bounds-checked by the
        caller's manifest checks): a read-only view when mapped, a fresh writable
        array otherwise.  ``where`` (``obj=``, ``component=``) is named by the error
        when the bytes are not there (a file that shrank while open)."""
        nbytes = count * dtype.itemsize
        if not self.mapped:  # a fresh buffer of our own: writable, like a copy
            self._check(offset, nbytes, "component", where)
            return np.frombuffer(self._read_fresh(offset, nbytes, "component", where), dtype, count)
        self._check(offset, nbytes, "component", where)
        with self._lock:
            self._require_open()
            return np.frombuffer(
                self._map if self._map is not None else self._view, dtype, count, offset
            )

    @contextlib.contextmanager
    def reading(self):
        """A ``read_into(offset, out)`` that fills ``out`` (a writable uint8 array)
        with the bytes at ``offset`` (bounds-checked), for many large reads at once
        (batch.py), from any thread.

        For a mapped local file, a piece whose pages are all in the page cache
        (``kernels.range_resident``, one ``mincore``) is copied from the mapping: a
        large page-cache folio maps in one fault, and the copy runs at about 1.5x
        ``pread``'s rate (bench/bench_container.py).  Any other piece is ``pread`` on
        a descriptor opened for the duration (the same file: its device and inode are
        checked; a replaced file falls back to the mapping): from a cold page cache,
        faulting a mapping in reads the file in readahead-sized pieces
        (bench/bench_cold.py: 0.4x ``cat``'s rate), while ``pread`` of large pieces,
        with the sequential hint, reads ahead as ``cat`` does.  A copy-on-write
        mapping (its pages may hold the caller's writes), a buffer or an unmapped
        source is copied from as ``view`` would."""
        fd = self._open_same_file()
        try:

            def read_into(offset, out, what="component", **where):
                n = out.nbytes
                self._check(offset, n, what, where)
                if self.mapped:
                    with self._lock:  # the view keeps the mapping alive for the copy
                        self._require_open()
                        src = np.frombuffer(
                            self._map if self._map is not None else self._view, np.uint8, n, offset
                        )
                    # cached pages copy fastest from the mapping; pread only when some
                    # are not (or the platform cannot tell), where its readahead wins
                    if fd is None or kernels.range_resident(src) is True:
                        out[:] = src
                        return
                    del src
                    _pread_exactly_into(
                        fd, memoryview(out).cast("B"), offset, self.name, what, where
                    )
                else:
                    out[:] = np.frombuffer(self._read_fresh(offset, n, what, where), np.uint8)

            yield read_into
        finally:
            if fd is not None:
                os.close(fd)

    def _open_same_file(self):
        """A read-only descriptor of the mapped file when it is still the same file,
        else None (then reading() copies from the mapping)."""
        if self._identity is None:
            return None
        path, dev, ino = self._identity
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (dev, ino) or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        if hasattr(os, "posix_fadvise"):  # read ahead as far as for a sequential read
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def all_bytes(self) -> np.ndarray:
        """The whole mapped file as a read-only uint8 array (mapped sources only)."""
        with self._lock:
            self._require_open()
            return np.frombuffer(self._map if self._map is not None else self._view, np.uint8)

    def _require_open(self):
        if self._closed:
            raise ClosedError("reader is closed", path=self.name)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the file.  Views already handed out stay valid."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._view = None
            fd, self._fd = self._fd, None
            mapping, self._map = self._map, None
            self._file = None  # the caller's file object: theirs to close
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # arrays still use the mapping: it is unmapped when they go
        if fd is not None:
            os.close(fd)


# read_ranges: neighbours this close are fetched together (a range request costs a
# round trip; 256 KiB is a few milliseconds of transfer); no fetch above _GROUP bytes,
# so large reads still spread over parallel requests
_GAP = 256 << 10
_GROUP = 4 << 20


def _pread_exactly(fd, offset, length, name, what, where):
    out = bytearray(length)
    _pread_exactly_into(fd, memoryview(out), offset, name, what, where)
    return out


def _pread_exactly_into(fd, view, offset, name, what, where):
    """Fill ``view`` with the bytes at ``offset``; a file that ends first (it shrank
    while open) is a FormatError, never a short result."""
    length, done = len(view), 0
    while done < length:
        try:
            n = (
                os.preadv(fd, [view[done:]], offset + done)
                if hasattr(os, "preadv")
                else _pread_into(fd, view[done:], offset + done)
            )
        except InterruptedError:
            continue
        except OSError as exc:  # EIO, or a /proc file that refuses reads by offset
            raise ReadError(
                f"{what}: the system refused to read it: {exc.strerror or exc}",
                errno=exc.errno,
                path=name,
                **where,
            ) from None
        if n == 0:
            raise FormatError(
                f"{what}: the file ends at byte {offset + done}, before "
                f"{offset + length} (it shrank while open)",
                path=name,
                **where,
            )
        done += n


def _read_exactly(f, offset, length, name, what, where):
    """``length`` bytes at ``offset`` of a file object; a short read (the file
    shrank, a server cut the response) or a long one (a server that sends more than
    the range asked for) is a FormatError, never other bytes."""
    f.seek(offset)
    out = bytearray(length)
    view = memoryview(out)
    done = 0
    # At most _PIECE bytes a read: over a URL each read is one request, and each
    # request must finish within URL_DEADLINE.  fsspec's readinto copies whatever its
    # read returned into the buffer (a reply longer than asked would fail there as a
    # bare ValueError), so fsspec's files are read with read() and the reply checked.
    use_readinto = hasattr(f, "readinto") and getattr(f, "fs", None) is None
    while done < length:
        want = min(length - done, _PIECE)
        if use_readinto:
            n = f.readinto(view[done : done + want])
            if n is not None and n > want:
                raise FormatError(
                    f"{what}: the source claims {n} bytes read into a buffer of {want}",
                    path=name,
                    **where,
                )
        else:
            chunk = f.read(want)
            check_range_reply(chunk, getattr(f, "size", None), name)
            n = len(chunk) if chunk else 0
            if 0 < n < want and not use_readinto:
                # a server's reply holding part of the range asked for: taken piece
                # by piece, one request each, a 64 MiB read of 1-byte replies was 67
                # million requests, each inside the deadline (the batch path, and
                # docs/remote.md, already refused it)
                raise FormatError(
                    f"{what}: the source returned {n} bytes for the {want} asked for "
                    f"at {offset + done}",
                    path=name,
                    **where,
                )
            if n > want:
                raise FormatError(
                    f"{what}: the source returned {n} bytes for the {want} "
                    f"asked for at {offset + done}",
                    path=name,
                    **where,
                )
            view[done : done + n] = chunk or b""
        if not n:
            raise FormatError(
                f"{what}: the source ends at byte {offset + done}, before {offset + length}",
                path=name,
                **where,
            )
        done += n
    return out


# ---------------------------------------------------------------- URLs

# seconds to connect, and to wait for each read of a reply, before a URL read fails
# as a timeout
URL_TIMEOUT = 60.0
# seconds one HTTP(S) request may take in all (connecting, redirects, the headers
# and the whole body): a server that trickles a byte at a time resets the per-read
# timeout with every byte, and would hold a read for ever.  No request asks for more
# than _PIECE bytes (read_ranges' groups are smaller still), so the deadline asks a
# link for at least 64 MiB in 600 s (~110 KB/s)
URL_DEADLINE = 600.0
_PIECE = 64 << 20
# what an error reply's body may cost us: it is never used
_ERROR_BODY = 64 << 10


def read_small_file(path, limit, what, storage_options=None) -> bytes:
    """The bytes of a small file beside the tensors (a sharded index, a model's
    config), a local path or an fsspec URL: at most ``limit`` of them, a FormatError
    naming ``what`` past that.  Read in 64 KiB pieces, so memory follows the bytes
    the file holds (one read of ``limit`` bytes would allocate them all at once);
    over a URL each reply is held to the size opened (:func:`check_range_reply`: a
    file replaced on a server naming no version would be read spliced).  A missing
    file is a FileNotFoundError (NetworkNotFoundError over a URL)."""
    if is_url(path):
        f = open_url(path, storage_options)
        with f, network_errors(path):
            return _read_bounded(f, limit, what, path)
    with open_local_input(path) as f:
        return _read_bounded(f, limit, what, path)


def _read_bounded(f, limit, what, path) -> bytes:
    size = getattr(f, "size", None)  # a URL's: the size opened
    if size is None:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            size = os.fstat(f.fileno()).st_size
    if isinstance(size, int) and size > limit:
        # refused before a byte is read: a server whose HEAD says a terabyte was
        # asked for 64 KiB pieces until the bound, a thousand requests
        raise FormatError(f"the {what} is larger than {limit} bytes ({size})", path=path)
    parts: "list[bytes]" = []
    held = 0
    while True:
        part = f.read(1 << 16)
        check_range_reply(part, size, path)
        if not part:
            return b"".join(parts)
        held += len(part)
        if held > limit:  # a file that grew, or a size no one said
            raise FormatError(f"the {what} is larger than {limit} bytes", path=path)
        parts.append(part)


class _OwnPosition(io.RawIOBase):
    """A ``memory://`` file with a position of its own.  fsspec's memory filesystem
    hands every opener the one file object it stores, so two Readers of one URL
    moved each other's position between a seek and a read (threads got another
    tensor's bytes, or the manifest's, as values).  Reads slice the stored bytes of
    the version opened; the shared object's position is never used."""

    def __init__(self, shared: io.BytesIO) -> None:
        super().__init__()
        self._shared = shared
        self._pos = 0
        self.fs = getattr(shared, "fs", None)
        self.path = getattr(shared, "path", None)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _size(self) -> int:
        with self._shared.getbuffer() as buf:
            return len(buf)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size()}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        with self._shared.getbuffer() as buf:
            end = len(buf) if size is None or size < 0 else min(len(buf), self._pos + size)
            data = bytes(buf[self._pos : end]) if end > self._pos else b""
        self._pos += len(data)
        return data


def open_url(url, storage_options=None):
    """An fsspec URL as a seekable file object (fsspec is optional), its failures
    translated by :func:`network_errors`.  HTTP(S) replies are checked against the
    range asked for (:class:`_CheckedResponse`) and time out after URL_TIMEOUT.
    ``storage_options``: the caller's fsspec options (credentials, endpoint)."""
    with network_errors(url):
        # no read-ahead: each read is one range request for exactly the bytes asked
        # for (fsspec's default caches multi-megabyte blocks, far more than a manifest;
        # s3fs's 50 MiB).  Given to the file's open, not to fsspec.open, whose extra
        # keywords are options of the filesystem: s3fs took cache_type there and
        # ignored it, and read whole blocks
        fs, inner = url_filesystem(url, storage_options)
        unversioned = (storage_options or {}).get(UNVERSIONED_OPTION, False)
        if not isinstance(unversioned, bool):  # "false" would read as true
            raise TypeError(
                f"storage_options[{UNVERSIONED_OPTION!r}] is True or False, not {unversioned!r}"
            )
        if _is_http(url):
            pinned = _pinned_version(fs, inner, url, unversioned)
        else:
            fs, pinned = _pinned_store(fs, inner, url), {}
        try:
            f = fs.open(inner, "rb", cache_type="none", **pinned)
        except TypeError:  # a filesystem whose files take no cache_type
            f = fs.open(inner, "rb")
        if type(fs).__name__ == "MemoryFileSystem" and isinstance(f, io.BytesIO):
            f = _OwnPosition(f)
    if not unversioned and not _version_held(f, url):
        # a store that names a version ztensor cannot hold its reads to (gcsfs's
        # generation, adlfs's ETag: neither their files nor cat_ranges send one by
        # default), so a replacement while open would go unseen: as for an HTTP(S)
        # server naming none, refused unless the caller opts in
        f.close()
        raise UnsupportedError(
            f"reads of this store ({type(fs).__name__}) cannot be held to the version "
            "opened: an object replaced while read would mix two objects' bytes. To "
            f"read it anyway: storage_options={{{UNVERSIONED_OPTION!r}: True}}",
            path=url,
        )
    return f


# fsspec protocols whose filesystem reads another one's files: a cache (the whole
# file copied first, unchecked and unbounded), an archive, a folder view, references;
# and the local file system, whose files are read by their path (open_local_input)
_NOT_A_STORE = frozenset(
    {
        "blockcache",
        "cached",
        "filecache",
        "simplecache",
        "zip",
        "tar",
        "libarchive",
        "reference",
        "dir",
        "file",
        "local",
    }
)
# an IPv6 literal host, whose "::" is no chain of URLs
_IPV6_HOST = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#\[]*)\[[^\]/?#]*\]")


# what fsspec's info() may say of a version of a file (HTTP, S3, GCS, local, memory)
_VERSION_FIELDS = (
    "ETag",
    "etag",
    "Content-MD5",
    "Digest",
    "LastModified",
    "last_modified",
    "mtime",
    "created",
    "ino",
    "VersionId",
    "generation",
)


def file_version(source: str, storage_options=None):
    """(identity, versioned): what tells one version of a file from another,
    cheaply.  For a local file its stat (a rename gives another inode; a rewrite in
    place another size or time); for a URL what the server says of it, its size
    with its version.  A server that names no version (read only with
    ``ztensor_allow_unversioned``) gives its size alone, and versioned False: a
    change of size is still seen (a chunk of another file is a ClosedError, as
    docs/remote.md promises), but nothing shows such a file unchanged, so it gets
    a fresh handle per chunk (dask's ``_Handles.acquire``).  The one rule telling
    whether a file changed, for dask's workers and a sharded checkpoint's index."""
    if not is_url(source):
        st = os.stat(source)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), True
    # a URL gone or refused since the graph was made says so (404, refused), as a
    # read of it would: fsspec's bare FileNotFoundError named no status
    with network_errors(source):
        fs, inner = url_filesystem(source, storage_options)
        info = fs.info(inner)
    marks = tuple((k, str(info[k])) for k in _VERSION_FIELDS if info.get(k) is not None)
    return (("size", str(info.get("size"))),) + marks, bool(marks)


def url_filesystem(url, storage_options=None):
    """(fsspec filesystem, path inside it) for ``url``: the one place a URL becomes a
    filesystem, for every read (open_url), write (upload), size (sharded) and
    version (dask) of one.  ``storage_options`` are the caller's (url_options adds
    the checked HTTP(S) replies).  An UnsupportedError naming the URL for:

    * a chained URL (``simplecache::https://...``, ``zip://m.zt::s3://...``) or a
      protocol whose filesystem reads another's files (a cache, an archive, a
      folder view): its outer layer reads the inner URL's bytes whole and
      unchecked, bypassing every rule of docs/remote.md (no version pin, so a server
      naming none was read without the opt-in; no bound on a reply: a body without
      end filled the cache's disk, or memory);
    * a URL of the local file system (``local://``, ``file://`` inside a chain): a
      local file is read by its path, through open_local_input (a FIFO opened
      through fsspec waited for a writer for ever);
    * a URL fsspec cannot open (an unknown protocol, ``HTTP://`` which fsspec's
      table lacks, a filesystem missing an argument): a bare ValueError or
      TypeError.

    HTTP(S) filesystems are made by protocol, the URL itself the path: fsspec's
    url_to_fs splits a URL at every ``::`` (its chains), so an IPv6 literal host
    (``http://[::1]:8080/m.zt``) was asked for as ``http://[``."""
    try:
        import fsspec
    except ImportError:
        raise UnsupportedError(
            "URLs need the 'fsspec' package (pip install fsspec, and s3fs or gcsfs "
            "for s3:// or gs://)",
            path=url,
        ) from None
    scheme = url.split("://", 1)[0].lower()
    outside_host = _IPV6_HOST.sub(r"\1", url) if _is_http(url) else url
    if scheme in ("file", "local") and "::" not in outside_host:
        raise UnsupportedError(
            f"a {scheme}:// URL is not read or written: give the local file's path",
            path=url,
        )
    if "::" in outside_host or scheme in _NOT_A_STORE:
        what = "a chained URL" if "::" in outside_host else f"a {scheme}:// URL"
        raise UnsupportedError(
            f"{what} is not read or written: its filesystem reads another one's "
            "files whole and unchecked (no version pin, no bound on a reply). Give "
            "the file's own URL, or a local file's path",
            path=url,
        )
    options = url_options(url, storage_options)
    try:
        if _is_http(url):
            return fsspec.filesystem(scheme, **options), url
        fs, inner = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError, TypeError) as exc:
        # no such protocol, its package missing, an argument it needs
        raise UnsupportedError(f"fsspec cannot open this URL: {_said(exc)}", path=url) from None
    _require_a_store(fs, url)
    return fs, inner


def _require_a_store(fs, url):
    """The filesystem a URL made, judged by what it is rather than by its protocol's
    name (a package can register any name): one of the local file system (fsspec's
    LocalFileSystem or a subclass, ``asynclocal``...) or one reading through another
    filesystem (it holds one: ``dask``, ``generic``, ``async_wrapper``, the caches)
    is refused as the named ones are."""
    from fsspec.implementations.local import LocalFileSystem

    # a wrapper holds its inner filesystem, or names the protocol it will make one of
    wraps = hasattr(fs, "target_protocol") or any(
        isinstance(getattr(fs, attr, None), _abstract_filesystem())
        for attr in ("fs", "target", "sync_fs")
    )
    if isinstance(fs, LocalFileSystem) or wraps or "local" in type(fs).__name__.lower():
        raise UnsupportedError(
            f"this URL's filesystem ({type(fs).__name__}) reads local files or another "
            "filesystem's, unchecked: give the file's own URL, or a local file's path",
            path=url,
        )


def _abstract_filesystem():
    from fsspec.spec import AbstractFileSystem

    return AbstractFileSystem


def _is_http(url):
    return url.lower().startswith(("http://", "https://"))


# the storage option by which a caller reads an HTTP(S) file whose server names no
# version anyway (_pinned_version); ztensor's, never handed to fsspec (url_options)
UNVERSIONED_OPTION = "ztensor_allow_unversioned"


def _pinned_version(fs, inner, url, unversioned=False):
    """Open arguments that hold every range request of an HTTP(S) file to the version
    of the file its first answer (HEAD) described: ``If-Match`` its strong ETag, else
    ``If-Unmodified-Since`` its Last-Modified.  A file replaced on the server between
    two reads is then a 412 (:func:`_status_error`: "changed while it was read"),
    never a manifest of one version read with the bytes of another; a reply that
    names another version than the one pinned (a server that ignores the condition)
    is refused too (:func:`_check_version`).  A weak ETag never matches (If-Match
    compares strongly), so it pins nothing.

    A server that names no version at all (no strong ETag, no Last-Modified) cannot
    be held to one, and a file replaced there by one of the same size would be read
    as one file's manifest over another's bytes (a replacement of another size is
    still seen: :func:`check_range_reply`).  RFC 9110 (15.3.7.3) lets a client combine
    partial replies only when they share a strong validator, so such a URL is an
    UnsupportedError unless the caller's ``storage_options`` hold
    ``UNVERSIONED_OPTION: True`` (its risk, taken knowingly).

    A URL that redirects is pinned the same way: the HEAD followed the redirects, so
    the version is the final host's, and aiohttp carries the condition along each
    redirect.  A redirecting host answers 3xx and so ignores the condition (RFC 9110
    13.2.1); the host that serves the bytes judges it.  A redirect whose target
    changes between two requests therefore reaches a file that must hold the pinned
    version, or the read is refused.  The HEAD's size is handed on, so the open asks
    no second time."""
    info = fs.info(inner)
    etag = _validator(url, "ETag", info.get("ETag"))
    modified = _validator(url, "Last-Modified", info.get("Last-Modified"))
    if etag and not etag.startswith("W/"):
        pin = {"If-Match": etag}
    elif modified:
        pin = {"If-Unmodified-Since": modified}
    elif unversioned:
        pin = {}
    else:
        raise UnsupportedError(
            "the server names no version of this file (no strong ETag, no "
            "Last-Modified), so its range requests cannot be held to one version: a "
            "file replaced while read would mix two files' bytes. To read it anyway: "
            f"storage_options={{{UNVERSIONED_OPTION!r}: True}}",
            path=url,
        )
    # the filesystem's own request headers (storage_options' "headers") are kept:
    # headers given to open replace them
    headers = {**(getattr(fs, "kwargs", {}).get("headers") or {}), **pin}
    # and what the HEAD named travels with each of this open's requests, never sent:
    # aiohttp hands it to the trace that checks the reply (_opened_trace).  A
    # caller's own trace_request_ctx (storage_options) is kept: a dict gets one key
    # more; anything else stays as it is, and this open's replies go unchecked by it
    mine = getattr(fs, "kwargs", {}).get("trace_request_ctx")
    options = {"size": info.get("size"), "headers": headers}
    if mine is None or isinstance(mine, dict):
        options["trace_request_ctx"] = {**(mine or {}), _OPENED: (etag, modified)}
    return options


# what no header value may hold (RFC 9110 5.5: field values are visible characters,
# spaces and tabs); aiohttp refuses to send one with a bare ValueError
_NOT_IN_HEADERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _validator(url, name, value):
    """The text of the ``ETag`` or ``Last-Modified`` a server gave (``value``), as
    _pinned_version sends it back in ``If-Match`` / ``If-Unmodified-Since``; ""
    for none.  A value holding a control character (which no header may hold, and
    aiohttp refuses to send: a bare ValueError on the first range request) is a
    FormatError naming the URL at the open: the server named no version that can
    be asked for."""
    text = "" if value is None else str(value)
    bad = _NOT_IN_HEADERS.search(text)
    if bad:
        raise FormatError(
            f"the server's {name} holds the control character {bad[0]!r}, which no "
            f"HTTP header may hold ({_said(repr(text), 80)})",
            path=url,
        )
    return text


def _pinned_store(fs, inner, url):
    """The filesystem to open an object store's file ``inner`` through, so that
    requests made by path beside the file (fsspec's ``cat_ranges``, Source._fetch's
    parallel reads) are held to the version it is opened on, as its own reads are.

    s3fs: a filesystem of the file's own (not fsspec's shared instance, which other
    files use) whose ``s3_additional_kwargs`` (s3fs's documented option for
    parameters of every S3 call) hold ``IfMatch`` the object's ETag.  s3fs hands it
    to each GetObject and HeadObject, ``cat_ranges``' too, so an object replaced
    while open is a 412 (_network_error: "changed on the server"), never one
    version's manifest over another's bytes.  Any other filesystem is returned as
    it is; :func:`_pin_travels` then decides whether its file may use ``cat_ranges``."""
    extra = getattr(fs, "s3_additional_kwargs", None)
    if not isinstance(extra, dict):
        return fs
    etag = _validator(url, "ETag", fs.info(inner).get("ETag"))
    if not etag:
        return fs
    options = {
        **fs.storage_options,
        "s3_additional_kwargs": {**extra, "IfMatch": etag},
        # one per open file, gone with it: fsspec's cache would keep one per ETag
        "skip_instance_cache": True,
    }
    return type(fs)(*fs.storage_args, **options)


def _pin_travels(f, url):
    """Whether requests made by path beside the open fsspec file ``f`` (fsspec's
    ``cat_ranges``) read the version ``f`` was opened on.  HTTP(S): yes, they carry
    its headers (:func:`_request_options`).  An s3fs file opened through
    :func:`_pinned_store`: yes, its filesystem sends ``IfMatch`` the file's ETag with
    every request.  Any other file whose open recorded a version that only its own
    requests carry (gcsfs's generation, adlfs's ETag: see docs/remote.md): no, and
    then its reads go through the file, one after another.  A file of a store that
    names no version (``memory://``): nothing to lose."""
    if url is not None and _is_http(url):
        return True
    details = getattr(f, "details", None)
    if not isinstance(details, dict):
        return True
    if not any(details.get(k) for k in _VERSION_KEYS):
        return True
    extra = getattr(getattr(f, "fs", None), "s3_additional_kwargs", None)
    return (
        isinstance(extra, dict)
        and extra.get("IfMatch") is not None
        and extra.get("IfMatch") == details.get("ETag")
    )


def _reads_held(f):
    """Whether the open fsspec file ``f``'s own reads are held to the version it was
    opened on: it records none (``memory://``: nothing to hold), or it is an s3fs
    file that sends its ETag with every read (``IfMatch``, which s3fs sets unless
    the file was opened with ``size=``) or compares it with each reply
    (``local_expiry_check``), or one opened at a version id.  gcsfs's and adlfs's
    files record a version their reads do not send (docs/remote.md)."""
    details = getattr(f, "details", None)
    if not isinstance(details, dict):
        return True
    if not any(details.get(k) for k in _VERSION_KEYS):
        return True
    etag = details.get("ETag")
    read_kw = getattr(f, "read_kw", None)
    if etag and isinstance(read_kw, dict) and read_kw.get("IfMatch") == etag:
        return True
    if etag and getattr(getattr(f, "fs", None), "local_expiry_check", False) is True:
        return True
    return bool(getattr(f, "version_id", None))


def _version_held(f, url):
    """Whether every read ztensor makes of the open fsspec file ``f`` is held to the
    version it was opened on: requests made by path carry it (:func:`_pin_travels`:
    reads in parallel), or the file's own reads do (:func:`_reads_held`: reads one
    after another, through the file).  The one rule refusing a store that cannot be
    pinned, for a URL (:func:`open_url`, unless the caller opts in) and for a file
    object the caller opened (:func:`refuse_unchecked_file`).  Whichever it is, a
    cache of the file's that fetches or keeps blocks outside its reads
    (:func:`_cache_held`) is not held."""
    return _cache_held(f) and (_pin_travels(f, url) or _reads_held(f))


def _cache_held(f):
    """Whether the open fsspec file ``f``'s cache holds only bytes of ``f``'s own
    reads (none: ztensor opens a URL with ``cache_type="none"``; fsspec's read-ahead,
    block and byte caches of a caller's file fill through the file, so its pin).
    Not so for a cache that fetches by path beside the file (a ``multi_fetcher``:
    the ``blockcache::`` filesystem's, fsspec's ``cat_ranges`` carrying none of the
    file's pin: a replacement while read mixed its blocks with the first
    version's), or that keeps its blocks in a file of its own (``location``: blocks
    saved by earlier opens, of whatever version the object was then).  Such a file
    is refused, never read with its cache dropped: the file is the caller's."""
    cache = getattr(f, "cache", None)
    return (
        getattr(cache, "multi_fetcher", None) is None and getattr(cache, "location", None) is None
    )


# what an fsspec file's details name a version by (s3fs, gcsfs, adlfs)
_VERSION_KEYS = ("ETag", "etag", "VersionId", "generation")


class _RangeBody(bytes):
    """The body of a reply to a range request (:class:`_CheckedResponse`), with
    ``total``: the size of the whole file the server answered from (Content-Range's
    total, or a 200's Content-Length), None where it did not say."""

    total: "int | None" = None


def check_range_reply(body, size, url):
    """A FormatError when ``body``, what a read of an HTTP(S) file returned (a
    :class:`_RangeBody`), came from a file of another size than ``size``, the one
    opened: the file was replaced on a server that names no version (no ETag, no
    Last-Modified, so nothing pinned it, _pinned_version), and its bytes are another
    file's.  Every read of a URL's bytes passes its replies here (Source's reads,
    the sharded index's); other bodies pass unchecked."""
    total = getattr(body, "total", None)
    if total is not None and isinstance(size, int) and total != size:
        raise FormatError(
            f"the file changed on the server while it was read (it is now {total} "
            f"bytes, opened as {size})",
            path=url,
        )


def _request_options(f):
    """What every request for the open fsspec file ``f`` must carry (the version pin
    of :func:`_pinned_version`: its headers, and the validators its HEAD named), as
    keywords for requests made by path beside the file (``cat_ranges``); empty for
    a file opened without them."""
    kwargs = getattr(f, "kwargs", None)
    if not isinstance(kwargs, dict):
        return {}
    extra = {}
    if kwargs.get("headers"):
        extra["headers"] = dict(kwargs["headers"])
    if kwargs.get("trace_request_ctx") is not None:
        extra["trace_request_ctx"] = kwargs["trace_request_ctx"]
    return extra


# the key of the validators (ETag, Last-Modified) an open's HEAD named, in the
# trace_request_ctx each of its requests carries (_pinned_version, _opened_trace)
_OPENED = "ztensor_opened_as"


def _opaque(etag):
    """An ETag's opaque part: weak comparison (RFC 9110 8.8.3.2), ``W/"x"`` is ``"x"``."""
    return etag[2:] if etag.startswith("W/") else etag


def _check_opened(url, opened, reply):
    """A FormatError when a reply names another version than its open's HEAD did,
    whichever validator its request's condition carries: the ETags (compared
    weakly) where both name one, else the Last-Modified dates where both do.  A
    weak ETag pins nothing (``If-Match`` compares strongly), so such a file's
    requests carry ``If-Unmodified-Since``, and one replaced within that second was
    seen only by its ETag; under an ``If-Match`` pin, a reply without an ETag (a
    proxy dropping it, ignoring the condition) is judged by its date."""
    etag, modified = opened
    named_etag, named_modified = reply.get("ETag"), reply.get("Last-Modified")
    if etag and named_etag:
        same = _opaque(etag) == _opaque(named_etag)
    elif modified and named_modified:
        same = _http_date(modified) == _http_date(named_modified)
    else:
        return
    if not same:
        raise FormatError(
            f"the file changed on the server while it was read (ETag "
            f"{(named_etag or '')[:80]!r}, Last-Modified {(named_modified or '')[:60]!r}; "
            f"opened as {etag[:80]!r}, {modified[:60]!r})",
            path=url,
        )


_TRACE: list = []  # the trace, once built


def _opened_trace(aiohttp):
    """An aiohttp trace that holds each reply to a request carrying its open's
    validators (``trace_request_ctx``, :func:`_pinned_version`) to them, once its
    status and headers are in and before its body is read (:func:`_check_opened`).
    Built on first use (aiohttp is optional)."""
    if _TRACE:
        return _TRACE[0]

    async def on_request_end(session, context, params):
        opened = context.trace_request_ctx
        response = params.response
        if isinstance(opened, dict) and _OPENED in opened and 200 <= response.status < 300:
            try:
                _check_opened(str(params.url), opened[_OPENED], response.headers)
            except FormatError:
                response.close()
                raise

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_request_end)
    _TRACE.append(trace)
    return trace


def _check_version(url, sent, reply):
    """A FormatError when a reply names another version of the file than the one its
    request was pinned to (``If-Match``: its ETag; ``If-Unmodified-Since``: its
    Last-Modified).  A server keeping to HTTP answers such a request 412; one that
    ignores the condition (or a redirect that now leads to another file) would hand
    over another version's bytes."""
    wanted, named = sent.get("If-Match"), reply.get("ETag")
    if wanted and named and named != wanted:
        raise FormatError(
            f"the file changed on the server while it was read (ETag {named[:80]!r}, "
            f"opened as {wanted[:80]!r})",
            path=url,
        )
    wanted, named = sent.get("If-Unmodified-Since"), reply.get("Last-Modified")
    if wanted and named and _http_date(named) != _http_date(wanted):
        raise FormatError(
            f"the file changed on the server while it was read (Last-Modified "
            f"{named[:60]!r}, opened as {wanted[:60]!r})",
            path=url,
        )


def _http_date(text):
    """An HTTP date as a comparable value (its text when it does not parse)."""
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return text.strip()


def url_options(url, storage_options=None):
    """fsspec storage options for ``url``: the caller's ``storage_options``, and for
    HTTP(S) an aiohttp session whose replies are checked against the range asked for
    and that times out.  The caller's ``client_kwargs`` headers (authorization) and
    timeout are kept; the checked response class and the identity encoding are not
    the caller's to drop.  ``UNVERSIONED_OPTION`` is ztensor's (open_url reads it)
    and is left out: every fsspec filesystem would refuse it."""
    options = dict(storage_options or {})
    options.pop(UNVERSIONED_OPTION, None)  # ztensor's (open_url), not the filesystem's
    if not _is_http(url):
        return options
    try:
        import aiohttp
    except ImportError:
        return options  # fsspec says what is missing
    client = dict(options.get("client_kwargs") or {})
    client["response_class"] = _checked_response_class(aiohttp)
    traces = list(client.get("trace_configs") or ())
    client["trace_configs"] = traces + [t for t in [_opened_trace(aiohttp)] if t not in traces]
    # a range is of the bytes as stored: no compressed encoding (one would also
    # be decompressed whole, a bomb the range checks never see)
    client["headers"] = {**(client.get("headers") or {}), "Accept-Encoding": "identity"}
    client.setdefault(
        "timeout",
        aiohttp.ClientTimeout(
            total=URL_DEADLINE,
            connect=URL_TIMEOUT,
            sock_connect=URL_TIMEOUT,
            sock_read=URL_TIMEOUT,
        ),
    )
    options["client_kwargs"] = client
    return options


_CHECKED: list[type] = []  # the response class, once built


def _checked_response_class(aiohttp):
    """aiohttp's response with a ``read`` that trusts nothing the server says about a
    range request: fsspec reads every range through it.  Built on first use (aiohttp
    is optional)."""
    if _CHECKED:
        return _CHECKED[0]

    class _CheckedResponse(aiohttp.ClientResponse):
        # (how many body bytes may come, the file's size or None) once the status
        # and headers are checked (start); None: a reply read as aiohttp reads it
        _limit = None

        async def start(self, connection):
            # judged as soon as the status and headers are in, before any consumer
            # sees the body: fsspec's HTTPFile reads a 200 to a range from byte 0
            # through ``content`` itself, never through read()
            await super().start(connection)
            try:
                self._limit = _reply_limit(
                    str(self.url), self.status, self.request_info.headers, self.headers
                )
            except FormatError:
                self.close()
                raise
            return self

        async def read(self):
            if self._limit is _REDIRECTED:  # a redirect handed on, not followed
                self.close()
                raise FormatError(
                    f"the server answered {self.status} (a redirect that was not "
                    "followed): not the file",
                    path=str(self.url),
                )
            if self._body is None and self._limit is not None:
                # read to the end (the connection goes back to the pool) or closed
                # after what may come: no super().read(), it reads it all
                self._body = await self._bounded_body(*self._limit)
                return self._body
            return await super().read()

        async def _bounded_body(self, cap, total):
            body = bytearray()
            try:
                while True:  # to the end of the body, or one byte past what may come
                    chunk = await self.content.read(min(1 << 20, cap + 1 - len(body)))
                    if not chunk:
                        break
                    body += chunk
                    if len(body) > cap:
                        break
            except BaseException:
                self.close()
                raise
            if len(body) > cap:
                self.close()
                if self.status >= 400:  # an error page: fsspec raises for the status after
                    return _range_body(body[:cap], None)
                raise FormatError(
                    f"the server sent more than the {cap} bytes of its reply to "
                    f"{self.request_info.headers.get('Range', '')[:60]}",
                    path=str(self.url),
                )
            if self.status < 300 and len(body) != cap:
                raise FormatError(
                    f"the server sent {len(body)} bytes of a reply of {cap} "
                    "(Content-Range, Content-Length)",
                    path=str(self.url),
                )
            return _range_body(body, total)

    _CHECKED.append(_CheckedResponse)
    return _CheckedResponse


def _reply_limit(url, status, sent, headers):
    """What a reply to the request with headers ``sent`` may be, judged from its
    status and headers alone: (how many body bytes may come, the size of the whole
    file it names or None) for a reply to a range request or an error page, None for
    any other (a HEAD, a whole-file GET, a redirect).  A FormatError when they already
    show it is not what was asked: another version than the one pinned
    (:func:`_check_version`), or not the range asked for (:func:`_range_reply_size`).
    :class:`_CheckedResponse` asks it of every reply, before any of its body is read."""
    asked = _asked_range(sent.get("Range"))
    if status == 416 and asked is not None:
        # fsspec reads a 416 as the end of the file (b""), so a server refusing a
        # range inside the size it gave was "the source ends at byte N": the
        # range asked for lies inside the file opened (Source._check), and the
        # server says it does not
        raise FormatError(
            f"asked for bytes {asked[0]}-{asked[1]}, the server answered 416 (Range Not "
            f"Satisfiable, Content-Range {headers.get('Content-Range', '')[:60]!r}): the "
            "file is shorter than when it was opened, or the server refuses the range",
            path=url,
        )
    if status >= 400:  # never used: fsspec raises for the status after
        return _ERROR_BODY, None
    if status < 200 or status >= 300:
        return _not_the_file(url, status, headers)
    if 200 <= status < 300:
        _check_version(url, sent, headers)
        if asked is not None:
            return _range_reply_size(url, status, headers, asked)
    return None


# the statuses aiohttp follows to their Location (ClientSession._request), and the
# limit of such a reply: its body is never the file's (_CheckedResponse.read)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_REDIRECTED = (0, None)


def _not_the_file(url, status, headers):
    """The limit of a reply whose status is neither a success nor an error (1xx,
    3xx): a redirect aiohttp follows (one of _REDIRECTS with a Location) is
    _REDIRECTED, and its body is never read; any other (a 3xx without a Location, a
    300, 304 or 305, a 101) is a FormatError at its headers.  fsspec raises only
    for statuses from 400, and took such a reply's body as the bytes asked for: a
    ``300`` carrying a ``Content-Range`` was read unchecked (no version, no bound:
    a body without end filled memory)."""
    if status in _REDIRECTS and (headers.get("Location") or headers.get("URI")):
        return _REDIRECTED
    how = "without a Location" if status in _REDIRECTS else "(not a redirect ztensor follows)"
    raise FormatError(
        f"the server answered {status} {how}: neither the file nor a redirect to it",
        path=url,
    )


def _asked_range(header):
    """(first, last) of a ``bytes=first-last`` Range header, or None."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[6:].partition("-")
    try:
        return int(first), int(last)
    except ValueError:
        return None


_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,20})-([0-9]{1,20})/([0-9]{1,20}|\*)", re.ASCII)


def _range_body(data, total):
    body = _RangeBody(data)
    body.total = total
    return body


def _range_reply_size(url, status, headers, asked):
    """(how many bytes the reply to range ``asked`` may carry, the size of the whole
    file it names or None), or a FormatError when its status and headers already
    show it is not that range."""
    first, last = asked
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise FormatError(
            f"asked for bytes {first}-{last} unencoded, the server answered "
            f"with Content-Encoding {encoding[:40]!r}",
            path=url,
        )
    length = headers.get("Content-Length")
    try:
        length = int(length) if length is not None else None
    except ValueError:
        raise FormatError(f"the server sent Content-Length {length[:40]!r}", path=url) from None
    if status == 206:
        got = headers.get("Content-Range", "")
        # RFC 9110 14.4's grammar, ASCII digits only (int() would also take "+1",
        # "1_0" and other scripts' digits)
        match = _CONTENT_RANGE.fullmatch(got)
        if match:
            start, end = int(match[1]), int(match[2])
            total = None if match[3] == "*" else int(match[3])
        else:
            start = end = total = None
        if (
            start is None
            or start != first
            or not start <= end <= last
            or (total is not None and end >= total)
        ):
            raise FormatError(
                f"asked for bytes {first}-{last}, the server answered with "
                f"Content-Range {got[:60]!r}",
                path=url,
            )
        cap = end - start + 1
    elif status == 200 and first == 0 and length == last + 1:
        # the whole file, and the range asked for was all of it: its length is the
        # file's size (check_range_reply holds it to the size opened)
        return length, length
    elif status == 200:
        # the whole file for a part of it: a server that does not answer ranges.
        # Refused before a byte of its body is read, even from byte 0 (whose first
        # bytes are the ones asked for): each read would cost the whole file, and a
        # .zt file is never read from its start alone (its footer is at its end)
        raise FormatError(
            f"asked for bytes {first}-{last}, the server sent the whole file (200, "
            f"{'no length' if length is None else f'{length} bytes'}): it does not "
            "answer range requests",
            path=url,
        )
    else:
        raise FormatError(f"asked for bytes {first}-{last}, the server answered {status}", path=url)
    if length is not None and length > cap:
        raise FormatError(
            f"asked for bytes {first}-{last}, the server announced {length} bytes (Content-Length)",
            path=url,
        )
    return cap, total


@contextlib.contextmanager
def network_errors(url):
    """Turn what fsspec and aiohttp raise while reading ``url`` into a
    :class:`NetworkError` that says what went wrong; ``url`` None: no change.
    ZTensorErrors pass, naming ``url`` as the caller gave it (:func:`_name_as_given`)."""
    if url is None:
        yield
        return
    try:
        yield
    except ZTensorError as exc:
        _name_as_given(exc, url)
        raise
    except Exception as exc:
        translated = _network_error(url, exc)
        if translated is None:
            raise
        _name_as_given(translated, url)
        raise translated from exc


def _name_as_given(exc, url):
    """Make ``exc``, an error met while reading ``url``, name ``url`` as the caller
    gave it.  The checked replies (:class:`_CheckedResponse`) know only the URL
    aiohttp asked for: the caller's respelled (``?q=a b`` as ``?q=a+b``, ``"`` as
    ``%22``), so ``err.path`` was a string the caller never gave, or after a redirect
    another host's URL, which is then said in the message."""
    named = exc.path
    if named is None or named == url or not is_url(named):
        return
    note = "" if _same_url(named, url) else f"answered by {named}"
    exc.rename(url, note)


def _same_url(one, other):
    """Whether two spellings of a URL name the same resource (aiohttp's is yarl's)."""
    try:
        import yarl

        return yarl.URL(one) == yarl.URL(other)
    except (ImportError, ValueError, TypeError):
        return one == other


def _network_error(url, exc):
    """The NetworkError (or FormatError) for ``exc`` and the causes it chains, or
    None for an exception that is not about the network."""
    import asyncio

    try:
        import aiohttp
    except ImportError:
        aiohttp = None
    seen = []
    cause = exc
    while cause is not None and len(seen) < 8:  # fsspec wraps: FileNotFoundError(url)
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    for item in seen:
        if isinstance(item, ZTensorError):
            return item
        if aiohttp is not None and isinstance(item, aiohttp.TooManyRedirects):
            # a ClientResponseError of status 0: "HTTP 0 error" said nothing
            return NetworkError(f"too many redirects ({len(item.history)})", path=url)
        if aiohttp is not None and isinstance(item, aiohttp.ClientResponseError):
            if _unparsable(item):
                # aiohttp says a reply it cannot parse as a 400 of its own
                return NetworkError(
                    f"the server's reply is not HTTP: {_said(item.message)}", path=url
                )
            return _status_error(url, item.status, item.message)
        if aiohttp is not None and isinstance(item, aiohttp.ServerTimeoutError):
            # a connect or per-read timeout (ConnectionTimeoutError, SocketTimeoutError)
            return NetworkTimeoutError(
                f"timed out (no answer within {URL_TIMEOUT:g} s)", path=url, errno=errno.ETIMEDOUT
            )
        if isinstance(item, (asyncio.TimeoutError, TimeoutError)) and not (
            aiohttp is not None and any(isinstance(i, aiohttp.ServerTimeoutError) for i in seen)
        ):
            # aiohttp's total: the whole-request deadline.  fsspec says a per-read
            # timeout as its own FSTimeoutError (a TimeoutError) caused by aiohttp's:
            # that one is said by the ServerTimeoutError further down the chain
            return NetworkTimeoutError(
                f"timed out (a request did not complete within {URL_DEADLINE:g} s, "
                "ztensor.io.source.URL_DEADLINE)",
                path=url,
                errno=errno.ETIMEDOUT,
            )
        if aiohttp is not None and isinstance(item, aiohttp.ClientConnectorError):
            reason = _said(item.os_error.strerror or item.os_error if item.os_error else item)
            if isinstance(item.os_error, ConnectionRefusedError):
                reason = "connection refused"
            return NetworkConnectionError(
                f"cannot connect to {item.host}:{item.port}: {reason}",
                path=url,
                errno=getattr(item.os_error, "errno", None),
            )
        if aiohttp is not None and isinstance(item, aiohttp.ServerDisconnectedError):
            return NetworkConnectionError("the server closed the connection", path=url)
        if aiohttp is not None and isinstance(item, aiohttp.ClientPayloadError):
            return NetworkConnectionError(f"the reply was cut short: {_said(item)}", path=url)
        if aiohttp is not None and isinstance(item, aiohttp.ClientError):
            return NetworkConnectionError(f"{type(item).__name__}: {_said(item)}", path=url)
        if isinstance(item, UnicodeError) and "idna" in str(item):
            # the resolver's IDNA encoding of a host name (a label over 63
            # characters, an empty one): the URL's, or a redirect's Location
            return NetworkConnectionError(f"cannot resolve the host name: {_said(item)}", path=url)
        if _precondition_failed(item):
            # an object store's 412 to a request carrying IfMatch (_pinned_store):
            # s3fs says it as an OSError(EINVAL) caused by botocore's ClientError
            return FormatError(
                "the file changed on the server while it was read (the object's "
                "ETag is no longer the one it was opened with: HTTP 412)",
                path=url,
            )
        if type(item).__name__ == "FileExpired":
            # s3fs's file (opened with If-Match its ETag) found the object replaced:
            # the object store's 412, said as the HTTP one is (_status_error)
            return FormatError(
                "the file changed on the server while it was read (the object's "
                "ETag is no longer the one it was opened with)",
                path=url,
            )
        if type(item).__module__.startswith("botocore"):
            return _botocore_error(url, item)
        if isinstance(item, ValueError) and "range requests" in str(item):
            return FormatError(
                "the server sent the whole file for a range request: it "
                "does not answer range requests",
                path=url,
            )
        if isinstance(item, ValueError):
            # the URL refused before any request (a port out of range, a bad IPv6
            # literal, a path s3fs cannot take): fsspec's HTTP info wraps it in a
            # FileNotFoundError, said as "not found", a 404 no server sent
            return NetworkError(f"not a URL that can be asked for: {_said(item)}", path=url)
    if isinstance(exc, FileNotFoundError):
        return NetworkNotFoundError("not found", path=url, errno=errno.ENOENT)
    if isinstance(exc, OSError) and not isinstance(exc, ZTensorError):
        return NetworkError(
            f"{type(exc).__name__}: {_said(exc.strerror or exc)}", path=url, errno=exc.errno
        )
    return None


_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError")
_NO_ENDPOINT = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError")


def botocore_reason(exc: BaseException) -> Optional[str]:
    """What a botocore error raised before or around a request means, for a reader
    (no credentials found, with where to give them; an endpoint that cannot be
    reached; anything else by its class), or None when ``exc`` (and what it was
    raised from) is no botocore error.  The one wording for reads and uploads."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__module__.startswith("botocore"):
            name = type(exc).__name__
            if name in _NO_CREDENTIALS:
                return (
                    f"no credentials for this object store ({_said(exc)}): give them in "
                    "storage_options (key=, secret=; anon=True for a public bucket) or in "
                    "the environment"
                )
            if name in _NO_ENDPOINT:
                return f"cannot reach the endpoint: {_said(exc)}"
            return f"{name}: {_said(exc)}"
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return None


def _botocore_error(url, exc):
    """What botocore raises before or around a request (s3fs passes it on as it
    is: a traceback from the command), said as a NetworkError
    (:func:`botocore_reason`)."""
    name = type(exc).__name__
    reason = botocore_reason(exc)
    if name in _NO_CREDENTIALS:
        return NetworkPermissionError(reason, path=url, errno=errno.EACCES)
    if name in _NO_ENDPOINT:
        return NetworkConnectionError(reason, path=url)
    return NetworkError(reason, path=url)


def _unparsable(exc):
    """Whether aiohttp's ClientResponseError ``exc`` is its parser's refusal of the
    reply (a bad status line, a header it refuses, too many headers, a chunk size
    out of range), not a status the server sent."""
    try:
        from aiohttp.http_exceptions import HttpProcessingError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc.__cause__, HttpProcessingError)


def _precondition_failed(exc):
    """Whether ``exc`` is botocore's ClientError for a 412 (PreconditionFailed)."""
    response = getattr(exc, "response", None)
    if type(exc).__name__ != "ClientError" or not isinstance(response, dict):
        return False
    error, meta = response.get("Error") or {}, response.get("ResponseMetadata") or {}
    return error.get("Code") in ("PreconditionFailed", "412") or meta.get("HTTPStatusCode") == 412


def _said(what, limit=200):
    """The text of ``what`` (an exception or a reason a server gave), at most
    ``limit`` characters, on one line: aiohttp repeats up to 8 KiB of a hostile
    reply's header or status line (newlines too) in its errors, and an error is one
    line."""
    text = " ".join(str(what).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _status_error(url, status, message):
    from http import HTTPStatus

    try:
        reason = message or HTTPStatus(status).phrase
    except ValueError:
        reason = message or "error"
    text = f"HTTP {status} {_said(reason)}"
    if status in (404, 410):
        return NetworkNotFoundError(text, path=url, errno=errno.ENOENT)
    if status in (401, 403):
        return NetworkPermissionError(text, path=url, errno=errno.EACCES)
    if status == 412:  # the version open_url pinned (_pinned_version) is gone
        return FormatError(f"the file changed on the server while it was read ({text})", path=url)
    return NetworkError(text, path=url)


def _pread_into(fd, view, offset):
    data = os.pread(fd, len(view), offset)
    view[: len(data)] = data
    return len(data)


_LARGE_FOLIO = 2 << 20  # a PMD: the page cache's largest folio on x86-64 and arm64


def ask_for_large_folios(mapping, size: int) -> None:
    """Advise the kernel to hold the mapped file in large folios (MADV_HUGEPAGE).
    Faulting a cold file in through a mapping otherwise reads it in small pieces and
    leaves it cached as 4 KiB pages, which every later mapping of it (a warm load, in
    any library) then faults in sixteen pages at a time: about 40% more time to load
    a model from the page cache (docs/benchmarks.md, session 13).  Only advice: a
    kernel without file huge pages, or one that refuses, reads as before."""
    advice = getattr(_mmap, "MADV_HUGEPAGE", None)
    if advice is None or size < _LARGE_FOLIO:
        return
    try:
        mapping.madvise(advice)
    except OSError:
        pass
