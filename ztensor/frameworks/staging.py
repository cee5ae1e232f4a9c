"""Host -> device copies through one staging buffer (``device=`` loads).

A tensor bound for an accelerator is read from the file (a view of the mapping for
raw objects, a decoded array for zstd ones) and copied to the device through one
host buffer, pinned when the device is CUDA, in two halves: while the device pulls
one half, the next chunk is copied (and byte-swapped, on big-endian hosts) into the
other.  So a raw tensor costs no host copy of its own, whatever its size: the file's
pages, one staging buffer of at most ``CAPACITY`` bytes, and the device tensor.

One buffer per device for the process (``for_device``), grown on demand up to
``CAPACITY`` and guarded by a lock, since pinned allocations are slow enough that
one per call would cost more than the copy; :func:`release` frees them.  Each public
call ends with :meth:`Staging.sync`, so a returned tensor is complete on every stream,
as after ``tensor.to(device)``.  ``meta`` tensors get their shape and dtype only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict

import numpy as np

from ztensor.errors import UnsupportedError
from ztensor.frameworks import LazyModule

if TYPE_CHECKING:  # the real module's types for the annotations (torch ships py.typed)
    import torch
else:
    torch = LazyModule("torch")  # imported on first use: importing this module costs nothing

CAPACITY = 64 << 20  # the most one device's staging buffer grows to
_ALIGN = 64  # chunk sizes are multiples of this: whole elements, up to complex128

_lock = threading.Lock()
_by_device: Dict[torch.device, "Staging"] = {}
_reachable: set = set()  # devices torch allocated on once (checked once per process)


def torch_device(device: Any, path: Any = None) -> "torch.device":
    """THE rule for a caller's ``device=`` argument: the ``torch.device`` it names,
    one torch can put tensors on, else an UnsupportedError naming ``path`` and the
    device, before any byte is read.  None is the CPU, as safetensors takes it.

    ``"cuda"`` on a machine without CUDA, ``"mps"`` or ``"xla"`` without their
    backends, ``1`` without an accelerator or ``"bogus"`` were each torch's own error
    from the middle of a load (an AssertionError, a NotImplementedError, a
    RuntimeError about pinned memory), after the file was opened.  ``meta`` is taken:
    its tensors get their shape and dtype only."""
    if device is None:
        device = "cpu"
    if isinstance(device, bytes):  # torch.device takes b"cpu" too; the message shows text
        device = device.decode("utf-8", "replace")
    try:
        found = device if isinstance(device, torch.device) else torch.device(device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise UnsupportedError(
            f"device {device!r} is not a torch device: {str(exc).splitlines()[0]}", path=path
        ) from None
    if found.type in ("cpu", "meta") or found in _reachable:
        return found
    try:
        if found.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device here")
        torch.empty(0, device=found)
    except Exception as exc:  # torch's refusals come as several classes
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsupportedError(
            f"device {str(found)!r} is not available: {said}", path=path
        ) from None
    _reachable.add(found)
    return found


def for_device(device: Any) -> "Staging":
    """The process's staging buffer for ``device`` (checked by :func:`torch_device`)."""
    device = torch_device(device)
    with _lock:
        found = _by_device.get(device)
        if found is None:
            found = _by_device[device] = Staging(device)
        return found


def release() -> None:
    """Free every staging buffer (the next device load allocates again)."""
    with _lock:
        for staging in _by_device.values():
            staging.sync()
        _by_device.clear()


class Staging:
    """One host buffer (two halves) through which arrays reach ``device``."""

    def __init__(self, device: Any, capacity: int = CAPACITY) -> None:
        self.device = torch.device(device)
        self.capacity = max(2 * _ALIGN, capacity // (2 * _ALIGN) * (2 * _ALIGN))
        self.pinned = self.device.type == "cuda"
        self.allocations = 0  # how many buffers were allocated (tests read it)
        self._halves: list = []
        self._views: list = []
        self._events: list = [None, None]
        self._turn = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return sum(h.numel() for h in self._halves)

    def put(self, arr: np.ndarray, dtype: torch.dtype, shape: Any) -> torch.Tensor:
        """A new tensor of ``dtype`` and ``shape`` on the device holding ``arr``'s
        elements: ``arr`` has the same element width (bf16/float8 as their bits) in
        any byte order."""
        out = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        self.fill(arr, out)
        return out

    def fill(self, arr: np.ndarray, out: torch.Tensor) -> None:
        """Copy ``arr``'s elements into ``out``, a contiguous tensor on the device with
        as many bytes (same element width, bf16/float8 as their bits, any byte
        order); call :meth:`sync` before reading ``out`` on another stream."""
        if self.device.type == "meta" or out.numel() == 0:
            return
        if not out.is_contiguous():
            raise ValueError("the staging buffer fills contiguous tensors only")
        src, unit = _host_units(arr)
        dst = out.reshape(-1).view(torch.uint8)
        if src.nbytes != dst.numel():
            raise ValueError(f"{src.nbytes} bytes for a {dst.numel()}-byte tensor")
        with self._lock:
            self._grow(src.nbytes)
            per_chunk = self._halves[0].numel() // unit
            for first in range(0, src.size, per_chunk):
                part = src[first : first + per_chunk]
                half = self._turn
                self._turn ^= 1
                if self._events[half] is not None:  # the device still reads this half
                    self._events[half].synchronize()
                    self._events[half] = None
                staged = self._views[half][: part.nbytes].view(part.dtype.newbyteorder("="))
                np.copyto(staged, part)  # the byte-order swap, if any, happens here
                dst[first * unit : first * unit + part.nbytes].copy_(
                    self._halves[half][: part.nbytes], non_blocking=self.pinned
                )
                if self.pinned:
                    self._events[half] = torch.cuda.Event()
                    self._events[half].record(torch.cuda.current_stream(self.device))

    def reserve(self, nbytes: int) -> None:
        """Size the buffer for chunks of ``nbytes`` (the largest tensor a call will
        move, up to ``CAPACITY``), so it is allocated once, not grown step by step."""
        with self._lock:
            self._grow(nbytes)

    def sync(self) -> None:
        """Wait until every copy issued so far has reached the device."""
        with self._lock:
            for half, event in enumerate(self._events):
                if event is not None:
                    event.synchronize()
                    self._events[half] = None

    def _grow(self, need: int) -> None:
        want = min(self.capacity, -(-need // (2 * _ALIGN)) * (2 * _ALIGN) * 2)
        if self._halves and self.nbytes >= want:
            return
        for event in self._events:  # the old halves may still be read
            if event is not None:
                event.synchronize()
        self._events = [None, None]
        buf = torch.empty(want, dtype=torch.uint8, pin_memory=self.pinned)
        half = want // 2
        self._halves = [buf[:half], buf[half:]]
        self._views = [h.numpy() for h in self._halves]
        self.allocations += 1


def _host_units(arr: np.ndarray):
    """(flat array of unsigned units in the stored byte order, unit width): copying
    it into a native-order view of the same width swaps bytes where needed.  Complex
    numbers swap each float half."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    flat = arr.reshape(-1)
    width = arr.dtype.itemsize
    unit = width // 2 if arr.dtype.kind == "c" else width
    order = arr.dtype.byteorder if unit > 1 and arr.dtype.byteorder in "<>" else "="
    units = (
        flat.view(np.dtype(f"u{unit}").newbyteorder(order))
        if unit in (1, 2, 4, 8)
        else flat.view(np.uint8)
    )
    return units, units.dtype.itemsize


__all__ = ["Staging", "for_device", "release", "torch_device", "CAPACITY"]
