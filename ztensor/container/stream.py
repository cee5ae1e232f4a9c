"""WRITE 1, streamed: one dense tensor written chunk by chunk (:meth:`Writer.stream`).

For tensors larger than memory, or arriving in pieces (a download, a converter
reading another file, a generator): the chunks are written as they come, compressed
and digested on the way (components.ComponentSink), so memory stays at one chunk.
The sink knows the tensor's byte count from its shape and dtype and refuses a chunk
that would overrun it, or a close that falls short.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError
from ztensor.frameworks.torch_bridge import to_numpy_for_writing


class TensorStream:
    """The sink :meth:`ztensor.Writer.stream` returns.  Use as a context manager, or
    call :meth:`close`.

    Chunks are numpy arrays (any shape: taken in C order), torch tensors or
    bytes-like objects (taken as the stored little-endian bytes), in order.  An array
    chunk must have the stream's dtype; bytes chunks may split elements.

    Raises
    ------
    FormatError
        A chunk that would write past the tensor's size (nothing of it is written: a
        correct chunk may follow), or a chunk of another dtype.  Closing short raises
        too, and abandons the writer's file: its bytes are already in it, and a file
        with a torn tensor is never renamed into place.
    """

    def __init__(self, writer, name, shape, dtype, sink, finish, *, stored, guard, abandon, lock):
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self._stored = stored  # (storage dtype, logical type) of the object
        self.nbytes = math.prod(self.shape) * dtype.itemsize
        self.written = 0
        self._writer = writer
        self._sink = sink
        self._finish = finish  # records the object in the writer
        # the writer's own steps, given explicitly (writer.py): guard(fn, *args) runs a
        # step that writes bytes, abandoning the file if it fails; abandon() drops a
        # file whose tensor is torn
        self._guard = guard
        self._abandon = abandon
        # the writer's lock (writer._one_at_a_time): a chunk's overrun check, its
        # write and the count of bytes written are one step, so two threads writing
        # chunks cannot both pass the check on the same count (the overrun was seen
        # only at close, the file lost); close and abandon take it too
        self._lock = lock
        self._open = True

    def write(self, chunk: Any) -> None:
        """Append ``chunk`` (see the class doc)."""
        with self._lock:
            self._write(chunk)

    def _write(self, chunk):
        if not self._open:
            raise FormatError("this stream is closed", path=self._writer.path, obj=self.name)
        arr = self._array_of(chunk)
        size = arr.size * arr.dtype.itemsize
        # judged before any copy: a stride-0 view may show far more bytes than it
        # holds, and its contiguous copy was a bare MemoryError
        if self.written + size > self.nbytes:
            raise FormatError(
                f"chunk of {size} bytes would overrun the tensor: "
                f"{self.written} of {self.nbytes} bytes written",
                path=self._writer.path,
                obj=self.name,
            )
        data = self._little_endian_bytes(arr)
        self._guard(self._sink.write, data)
        self.written += data.size

    def _array_of(self, chunk):
        """The chunk's elements as a numpy array of the stream's dtype (any strides,
        not copied), or its bytes (raw little-endian elements) as uint8."""
        given_type = None  # a torch tensor's logical type: its bits arrive as uint
        if hasattr(chunk, "detach") and hasattr(chunk, "numpy"):  # a torch tensor
            chunk, given_type = to_numpy_for_writing(chunk, self.name, self._writer.path)
        if isinstance(chunk, np.ndarray):
            given = dtypes.spec_types_for(chunk.dtype)
            # a stream made with uint8/uint16 and type= takes raw codes; one made
            # with ml_dtypes' bfloat16 or float8 takes values of that type only
            declared = not dtypes.is_ml_dtype(self.dtype)
            if not dtypes.elements_fit(given, given_type, *self._stored, codes_declared=declared):
                shown = given_type or chunk.dtype
                raise FormatError(
                    f"chunk has dtype {shown}, the stream {self._shown_type()}",
                    path=self._writer.path,
                    obj=self.name,
                )
            return chunk
        try:
            return np.frombuffer(memoryview(chunk).cast("B"), np.uint8)
        except (TypeError, ValueError) as exc:  # not bytes-like, or not contiguous
            raise FormatError(
                "a chunk is a numpy array, a torch tensor or contiguous bytes, not "
                f"{type(chunk).__name__} ({exc})",
                path=self._writer.path,
                obj=self.name,
            ) from None

    def _shown_type(self):
        storage, ltype = self._stored
        return self.dtype if ltype is None else f"{self.dtype} holding {ltype}"

    def _little_endian_bytes(self, arr):
        """The elements of ``arr`` (within the tensor's size) as little-endian bytes."""
        try:
            arr = np.ascontiguousarray(arr).reshape(-1)
        except MemoryError:
            raise LimitError(
                f"not enough memory for the {arr.size * arr.dtype.itemsize}-byte contiguous "
                "copy of this chunk",
                path=self._writer.path,
                obj=self.name,
            ) from None
        if dtypes.swap_width(arr.dtype):  # not little-endian yet
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return arr.view(np.uint8)

    def close(self) -> None:
        """Finish the tensor; it must have received exactly its bytes."""
        with self._lock:
            self._close()

    def _close(self):
        if not self._open:
            return
        self._open = False
        if self.written != self.nbytes:
            error = FormatError(
                f"stream closed after {self.written} of {self.nbytes} bytes: "
                "the writer is abandoned",
                path=self._writer.path,
                obj=self.name,
            )
            self._abandon(error)
            raise error
        self._finish(self._guard(self._sink.finish))

    def __enter__(self) -> "TensorStream":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc_type is None:
            self.close()
            return False
        with self._lock:
            if self._open:  # the caller's error: the tensor is incomplete
                self._open = False
                self._abandon(exc)
        return False


__all__ = ["TensorStream"]
