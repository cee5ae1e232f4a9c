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

import errno
import mmap as _mmap
import os
import stat
import sys
import threading

import numpy as np

from ztensor.errors import ClosedError, FormatError


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

    def __init__(self, source, copy_on_write=False, mmap=True):
        self._lock = threading.Lock()
        self._closed = False
        self._copy_on_write = copy_on_write
        self._fd = None
        self._map = None
        self._view = None
        self._file = None
        if isinstance(source, str) and "://" in source and not source.startswith("file://"):
            source = _open_url(source)       # fsspec: s3://, https://, memory://, ...
        if hasattr(source, "seek") and (hasattr(source, "readinto") or hasattr(source, "read")):
            self._open_fileobj(source)
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
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below)
        flags = (os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NONBLOCK", 0))
        fd = os.open(path, flags)
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            if not stat.S_ISREG(info.st_mode):
                raise FormatError("not a regular file (a FIFO, socket or device cannot be "
                                  "read as a tensor file)", path=path)
            self.size = info.st_size
            if not use_mmap:
                self._fd, fd = fd, None
                return
            if self.size:
                access = _mmap.ACCESS_COPY if self._copy_on_write else _mmap.ACCESS_READ
                extra = {"trackfd": False} if sys.version_info >= (3, 13) else {}
                self._map = _mmap.mmap(fd, 0, access=access, **extra)
                self._view = memoryview(self._map)
            else:
                self._view = memoryview(b"")
        finally:
            if fd is not None:
                os.close(fd)  # the mapping needs no descriptor of ours

    def _open_fileobj(self, f) -> None:
        """A seekable binary file object (an open file, io.BytesIO, an fsspec file):
        read with seek + read under the lock; only what is asked for is fetched."""
        if hasattr(f, "seekable") and not f.seekable():
            raise TypeError("a file object source must be seekable")
        if hasattr(f, "mode") and "b" not in str(getattr(f, "mode", "b")):
            raise TypeError("a file object source must be opened in binary mode")
        label = getattr(f, "path", None) or getattr(f, "name", None)
        self.name = os.fspath(label) if isinstance(label, (str, os.PathLike)) \
            else "<file object>"
        self._file = f
        self.size = f.seek(0, os.SEEK_END)

    @property
    def copy_on_write(self) -> bool:
        return self._copy_on_write

    @property
    def mapped(self) -> bool:
        """True when views are zero-copy slices of memory (a mapping or a buffer)."""
        return self._fd is None and self._file is None

    def _check(self, offset, length, what, where):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(f"{what}: bytes {offset}..{offset + length} lie outside the "
                              f"file of {self.size} bytes", path=self.name, **where)

    def view(self, offset: int, length: int, what: str, **where):
        """``length`` bytes at ``offset``: a zero-copy view (mapped) or a fresh
        read-only buffer (pread); FormatError when they are not all in the source."""
        self._check(offset, length, what, where)
        with self._lock:
            self._require_open()
            if self._file is None and self._fd is None:
                return self._view[offset:offset + length]
        return memoryview(self._read_fresh(offset, length, what, where)).toreadonly()

    def _read_fresh(self, offset, length, what, where):
        """A new bytearray of ``length`` bytes at ``offset`` (unmapped sources)."""
        with self._lock:
            self._require_open()
            if self._file is not None:
                return _read_exactly(self._file, offset, length, self.name, what, where)
            # pread under the lock: close() cannot hand the descriptor number to
            # another file between the check and the read
            return _pread_exactly(self._fd, offset, length, self.name, what, where)

    def read_ranges(self, ranges, threads=1):
        """The bytes of each ``(offset, length)`` in ``ranges``, for sources that are
        not mapped: neighbours closer than _GAP are fetched as one range (at most
        _GROUP bytes), and the fetches run concurrently: fsspec's ``cat_ranges`` for its
        files (parallel HTTP range requests), ``threads`` preads for a descriptor,
        one after another for other file objects.  Every range is checked against the
        source's size first, and a short answer is a FormatError."""
        for offset, length in ranges:
            self._check(offset, length, "component", {})
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        groups = []  # [start, end, [index...]]
        for i in order:
            offset, length = ranges[i]
            if groups and offset - groups[-1][1] <= _GAP and \
                    max(groups[-1][1], offset + length) - groups[-1][0] <= _GROUP:
                groups[-1][1] = max(groups[-1][1], offset + length)
                groups[-1][2].append(i)
            else:
                groups.append([offset, offset + length, [i]])
        blobs = self._fetch([(start, end - start) for start, end, _ in groups], threads)
        out = [None] * len(ranges)
        for (start, _, members), blob in zip(groups, blobs):
            view = memoryview(blob)
            for i in members:
                offset, length = ranges[i]
                out[i] = view[offset - start:offset - start + length]
        return out

    def _fetch(self, spans, threads):
        with self._lock:
            self._require_open()
            f, fd = self._file, self._fd
        fs, path = getattr(f, "fs", None), getattr(f, "path", None)
        if f is not None and fs is not None and hasattr(fs, "cat_ranges") and spans:
            try:
                blobs = fs.cat_ranges([path] * len(spans), [s for s, _ in spans],
                                      [s + n for s, n in spans], on_error="raise")
            except TypeError:  # an older fsspec without on_error
                blobs = fs.cat_ranges([path] * len(spans), [s for s, _ in spans],
                                      [s + n for s, n in spans])
            for (start, length), blob in zip(spans, blobs):
                if isinstance(blob, BaseException):
                    raise blob
                if len(blob) != length:
                    raise FormatError(f"component: the source returned {len(blob)} bytes for "
                                      f"{start}..{start + length}", path=self.name)
            return blobs
        if fd is not None and threads > 1 and len(spans) > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=min(threads, len(spans))) as pool:
                return list(pool.map(lambda span: self.view(span[0], span[1], "component"),
                                     spans))
        return [self.view(start, length, "component") for start, length in spans]

    def array(self, dtype: np.dtype, count: int, offset: int) -> np.ndarray:
        """``count`` elements of ``dtype`` at ``offset`` (already bounds-checked by the
        caller's manifest checks): a read-only view when mapped, a fresh writable
        array otherwise."""
        nbytes = count * dtype.itemsize
        if not self.mapped:  # a fresh buffer of our own: writable, like a copy
            self._check(offset, nbytes, "component", {})
            return np.frombuffer(self._read_fresh(offset, nbytes, "component", {}), dtype,
                                 count)
        self._check(offset, nbytes, "component", {})
        with self._lock:
            self._require_open()
            return np.frombuffer(self._map if self._map is not None else self._view,
                                 dtype, count, offset)

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
    view = memoryview(out)
    done = 0
    while done < length:
        try:
            n = os.preadv(fd, [view[done:]], offset + done) if hasattr(os, "preadv") else \
                _pread_into(fd, view[done:], offset + done)
        except InterruptedError:
            continue
        if n == 0:
            raise FormatError(f"{what}: the file ends at byte {offset + done}, before "
                              f"{offset + length} (it shrank while open)", path=name, **where)
        done += n
    return out


def _read_exactly(f, offset, length, name, what, where):
    """``length`` bytes at ``offset`` of a file object; a short read (the file
    shrank, a server cut the response) is a FormatError, never fewer bytes."""
    f.seek(offset)
    out = bytearray(length)
    view = memoryview(out)
    done = 0
    while done < length:
        if hasattr(f, "readinto"):
            n = f.readinto(view[done:])
        else:
            chunk = f.read(length - done)
            n = len(chunk) if chunk else 0
            view[done:done + n] = chunk or b""
        if not n:
            raise FormatError(f"{what}: the source ends at byte {offset + done}, before "
                              f"{offset + length}", path=name, **where)
        done += n
    return out


def _open_url(url):
    """An fsspec URL as a seekable file object (fsspec is optional)."""
    try:
        import fsspec
    except ImportError:
        from ztensor.errors import UnsupportedError
        raise UnsupportedError("reading URLs needs the 'fsspec' package (pip install fsspec)",
                               path=url) from None
    # no read-ahead: each read is one range request for exactly the bytes asked for
    # (fsspec's default caches multi-megabyte blocks, far more than a manifest)
    try:
        return fsspec.open(url, "rb", cache_type="none").open()
    except TypeError:  # a filesystem whose files take no cache_type
        return fsspec.open(url, "rb").open()


def _pread_into(fd, view, offset):
    data = os.pread(fd, len(view), offset)
    view[:len(data)] = data
    return len(data)
