"""``Reader.read_into``: decode or copy one dense object straight into memory the
caller owns (a numpy array, or a torch tensor on any device).

The destination must have the object's shape and element type; its memory is
used as it is: raw data is copied in once (byte-swapped on the way on big-endian
hosts), zstd data is decoded into it directly when it is contiguous.  A torch
tensor on another device is filled in host memory and copied over through the
process's staging buffer for that device (staging.py: pinned for CUDA, reused by
every call)."""

from __future__ import annotations

from typing import Any, Callable, Tuple

import numpy as np

from ztensor import dtypes, kernels
from ztensor.errors import UnsupportedError, ZTensorError
from ztensor.frameworks import staging, torch_bridge
from ztensor.io import components
from ztensor.io import values as logical

# logical/storage type -> the numpy dtypes whose memory holds its elements exactly
_BITS = dtypes.BITS_DTYPES


def read_into(reader: Any, name: str, dst: Any) -> None:
    obj = reader.metadata(name)
    if obj.format != "dense":
        raise UnsupportedError(
            f"read_into fills dense objects; this one is {obj.format!r}", path=reader.path, obj=name
        )
    comp = obj.components["data"]
    target, finish = _as_numpy(dst)
    if tuple(target.shape) != tuple(obj.shape):
        raise ValueError(
            f"{reader.path}: object {name!r}: destination has shape "
            f"{tuple(target.shape)}, the object is {tuple(obj.shape)}"
        )
    key = comp.type or comp.dtype
    elements = _element_dtype(comp)
    bits = _BITS.get(key)
    ok = (
        target.dtype.newbyteorder("=") == elements.newbyteorder("=")
        or (bits is not None and target.dtype == bits)
        or (
            dtypes.is_ml_dtype(target.dtype)
            and bits is not None
            and target.dtype.itemsize == bits.itemsize
            and dtypes.ml_dtype(_ML_NAMES.get(key, "")) == target.dtype
        )
    )
    if not ok:
        raise ValueError(
            f"{reader.path}: object {name!r}: destination dtype {target.dtype} "
            f"does not hold {key} elements (expected {elements}"
            + (f" or {bits}" if bits is not None else "")
            + ")"
        )
    flat = target.reshape(-1) if target.flags.c_contiguous else None
    internals = reader.internals  # the Reader's source, verify and limits (reader.py)
    zt = internals.foreign is None
    if (
        zt
        and comp.encoding == "zstd"
        and flat is not None
        and target.dtype.isnative
        and comp.byteorder == "<"
    ):
        # decoded straight into dst, through the function every read path uses: it
        # refuses what may not be decoded, checks the digest over the bytes it
        # covers (stored for v1, decoded for v2) and the size the stream yields
        internals.require_open()
        raw = flat.view(np.uint8)
        where = {"path": reader.path, "obj": name, "component": "data"}
        try:
            components.read_component(
                internals.source,
                comp,
                verify=internals.verify,
                limits=internals.limits,
                out=raw,
                **where,
            )
            # the element rules (a bool byte is 0 or 1), as on every other path
            logical.as_elements(
                raw.view(components.storage_dtype(comp)), comp.dtype, comp.type, **where
            )
        except ZTensorError:
            # the caller's memory holds what a refused stream decoded to (a short or
            # long stream fills it before its size is judged) or refused bool bytes:
            # a torch bool tensor holding 0x02 misbehaves as a numpy one does, so
            # nothing refused is left in it
            raw.fill(0)
            raise
        width = dtypes.swap_width(target.dtype)  # 0 on little-endian hosts
        if width:  # little-endian bytes -> native order, in place
            kernels.bswap(raw, raw, width)
    else:
        source = reader.read(name).components["data"]
        source = np.asarray(source)
        if (
            source.dtype != target.dtype
            and source.dtype.itemsize == target.dtype.itemsize
            and source.dtype.newbyteorder("=") != target.dtype.newbyteorder("=")
        ):
            source = source.view(
                target.dtype.newbyteorder(source.dtype.byteorder)
                if source.dtype.byteorder in "<>"
                else target.dtype
            )
        np.copyto(
            target,
            source.reshape(target.shape),
            casting="unsafe" if source.dtype.kind == target.dtype.kind else "same_kind",
        )
    finish()


_ML_NAMES = dtypes.ML_NAMES


def _element_dtype(comp) -> np.dtype:
    arr = np.empty(0, components.storage_dtype(comp))
    return logical.as_elements(arr, comp.dtype, comp.type).dtype


def _as_numpy(dst: Any) -> Tuple[np.ndarray, Callable[[], None]]:
    """(writable numpy array over the destination's memory, or a staging buffer,
    and what to run afterwards)."""
    if isinstance(dst, np.ndarray):
        if not dst.flags.writeable:
            raise ValueError("read_into: the destination array is read-only")
        _require_distinct_elements(dst.shape, dst.strides, dst.itemsize)
        return dst, lambda: None
    module = type(dst).__module__
    if module.startswith("torch"):
        return _torch_target(dst)
    raise TypeError(
        f"read_into: dst must be a numpy array or a torch tensor, not {type(dst).__name__}"
    )


def require_separate(dsts: Any) -> None:
    """Refuse a ``{name: destination}`` fill in which two destinations share memory:
    they are filled in threads at once, so one would hold whichever finished last.
    numpy arrays (and CPU torch tensors, through their numpy view) are compared
    exactly where their bounds meet (``np.shares_memory``: two column slices of one
    matrix are separate); other tensors by their address ranges."""
    spans = []
    for name, dst in dsts.items():
        if _is_torch(dst):
            _require_plain_memory(dst)
        arr = dst if isinstance(dst, np.ndarray) else _cpu_numpy(dst)
        if arr is not None:
            where = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.itemsize)
        elif hasattr(dst, "data_ptr"):
            size = dst.element_size()
            where = (dst.data_ptr(), dst.shape, [st * size for st in dst.stride()], size)
        else:
            continue  # not a destination at all: read_into says so for that name
        start, shape, strides, itemsize = where
        if 0 in tuple(shape):
            continue
        lo = start + sum(st * (n - 1) for st, n in zip(strides, shape) if st < 0)
        hi = start + itemsize + sum(st * (n - 1) for st, n in zip(strides, shape) if st > 0)
        spans.append((lo, hi, name, arr))
    spans.sort(key=lambda span: span[0])
    active: list = []  # spans whose memory reaches past the current one's start
    for lo, hi, name, arr in spans:
        active = [span for span in active if span[1] > lo]
        for _, _, other, other_arr in active:
            if not (arr is not None and other_arr is not None and _apart(arr, other_arr)):
                raise ValueError(
                    f"read_into: the destinations of {other!r} and {name!r} share memory"
                )
        active.append((lo, hi, name, arr))


def _apart(a: np.ndarray, b: np.ndarray) -> bool:
    """True when no byte of ``a`` is a byte of ``b`` (False where numpy cannot tell
    within a bounded effort: refused rather than risked)."""
    try:
        # a bounded effort: numpy takes any positive max_work, its stubs only -1 and 0
        return not np.shares_memory(a, b, max_work=1 << 20)  # type: ignore[arg-type]
    except Exception:  # numpy's TooHardError (its home moved between versions)
        return False


def _is_torch(dst: Any) -> bool:
    return type(dst).__module__.startswith("torch")


def _require_plain_memory(dst: Any) -> None:
    """Refuse a torch destination with no plain strided memory to fill: on the meta
    device (the fill would vanish without a word), sparse or nested (no one data
    pointer and strides: torch raised a bare RuntimeError on asking)."""
    if dst.device.type == "meta":
        raise ValueError("read_into: a tensor on the meta device has no memory to fill")
    if getattr(dst, "is_nested", False) or str(dst.layout) != "torch.strided":
        raise ValueError(
            f"read_into: a {'nested' if getattr(dst, 'is_nested', False) else str(dst.layout)}"
            " tensor has no plain strided memory to fill: fill a dense tensor"
        )


def _cpu_numpy(dst: Any):
    """A CPU torch tensor's memory as numpy (None for anything else)."""
    if not _is_torch(dst) or dst.device.type != "cpu":
        return None
    try:
        return dst.detach().numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bf16): by address instead
        return None


def _require_distinct_elements(shape, strides, itemsize) -> None:
    """Refuse a destination two of whose elements share memory (a stride-0
    ``np.broadcast_to`` made writable, ``as_strided``, ``torch.expand``): the fill
    wrote one element over another and returned as if filled, the values wrong.
    Sufficient test, over the axes of more than one element ordered by stride:
    each stride spans everything the smaller ones reach, so no two elements meet
    (a destination interleaved in some other way is refused too)."""
    if 0 in shape:
        return
    reach = itemsize
    for stride, n in sorted((abs(s), n) for s, n in zip(strides, shape) if n > 1):
        if stride < reach:
            raise ValueError(
                "read_into: the destination's elements share memory (a stride-0 or "
                "overlapping view): fill a copy of it"
            )
        reach += stride * (n - 1)


def _torch_target(dst):
    import torch

    _require_plain_memory(dst)
    size = dst.element_size()
    _require_distinct_elements(dst.shape, [s * size for s in dst.stride()], size)
    # a parameter (requires_grad) is filled as load_state_dict fills it, through its
    # memory: .numpy() and copy_ on it raised a bare RuntimeError
    dst = dst.detach()
    bits = torch_bridge.torch_bits_dtype(dst.dtype)  # bf16/float8: fill their bits
    on_cpu = torch_bridge.is_cpu(dst.device)
    # a negative or conjugate view (x._neg_view(), x.conj()) shows its memory negated
    # or conjugated: only copy_ fills it so that it shows the object's values (its
    # memory filled directly would show them negated; .numpy() refused it outright)
    plain = dst.is_contiguous() and not dst.is_neg() and not dst.is_conj()
    if on_cpu and plain:
        view = dst.view(bits[0]) if bits else dst
        arr = view.numpy()
        return (arr.view(bits[1]) if bits else arr), lambda: None
    # another device, or a strided or negative/conjugate CPU view: filled in host
    # memory first
    host = torch.empty(dst.shape, dtype=dst.dtype, device="cpu")
    view = host.view(bits[0]) if bits else host
    arr = view.numpy()
    arr = arr.view(bits[1]) if bits else arr
    if on_cpu:
        return arr, lambda: dst.copy_(host)

    def finish():
        buffer = staging.for_device(dst.device)  # the one staging buffer (pinned for CUDA)
        if plain:
            buffer.fill(arr, dst)
        else:
            dst.copy_(buffer.put(arr, dst.dtype, dst.shape))
        buffer.sync()

    return arr, finish
