"""Byte access to a file or an in-memory buffer, always bounds-checked.

A path is memory-mapped read-only; arrays handed out as zero-copy views keep the
mapping alive through their buffer, so :meth:`Source.close` is safe while they
live (the mapping goes away with the last of them).
"""
from __future__ import annotations

import mmap
import os

from ztensor.errors import FormatError


class Source:
    """Read-only bytes of one file or buffer.

    Parameters
    ----------
    source : str, os.PathLike, bytes, bytearray or memoryview
        A path to memory-map, or a buffer to read from.
    copy_on_write : bool
        Map a file privately and writably: views can be written, the writes go to
        private copies of the touched pages and never reach the file.
    """

    def __init__(self, source, copy_on_write=False):
        self._copy_on_write = copy_on_write
        self._fd = None
        self._map = None
        if isinstance(source, (str, os.PathLike)):
            self.name = os.fspath(source)
            self._open_file(self.name)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self.name = "<bytes>"
            view = memoryview(source)
            if not view.c_contiguous:
                raise TypeError("a buffer source must be C-contiguous")
            self._view = view.cast("B").toreadonly()
        else:
            raise TypeError(f"expected a path or a bytes-like object, got {type(source).__name__}")
        self.size = len(self._view)

    def _open_file(self, path: str) -> None:
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(path, flags)
        try:
            size = os.fstat(self._fd).st_size
            if size:
                access = mmap.ACCESS_COPY if self._copy_on_write else mmap.ACCESS_READ
                self._map = mmap.mmap(self._fd, 0, access=access)
                self._view = memoryview(self._map)
            else:
                self._view = memoryview(b"")
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def view(self, offset: int, length: int, what: str, **where) -> memoryview:
        """Zero-copy view of ``length`` bytes at ``offset``; raises FormatError when
        they are not all inside the source."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(f"{what}: bytes {offset}..{offset + length} lie outside the "
                              f"file of {self.size} bytes", path=self.name, **where)
        return self._view[offset:offset + length]

    @property
    def buffer(self):
        """The whole source as one buffer (the mapping itself, for a file), for
        ``numpy.frombuffer`` at offsets already checked against :attr:`size`."""
        return self._map if self._map is not None else self._view

    def close(self) -> None:
        """Release the file.  Views already handed out stay valid."""
        self._view = memoryview(b"")
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # arrays still use the mapping: it is unmapped when they go
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
