"""torch <-> numpy for the core: the one place that knows how torch tensors map to
stored elements (bf16 and the float8 types as bit patterns with their spec type,
complex as float pairs).  Used by Reader.read_torch, Writer.write_torch,
read_into, ztensor.torch and safe_open(framework="pt"); torch itself is imported
on first use (frameworks.LazyModule), so importing this module costs nothing."""

from __future__ import annotations

import functools
import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ztensor import dtypes, kernels
from ztensor.errors import UnsupportedError, memory_is_a_limit
from ztensor.frameworks import LazyModule, staging
from ztensor.io import components

if TYPE_CHECKING:  # the real module's types for the annotations (torch ships py.typed)
    import torch
else:
    torch = LazyModule("torch")

# logical types whose elements come as a numpy dtype torch has (v2's bool as np.bool_)
_NUMPY_TYPES = ("complex64", "complex128", "bool")


@functools.lru_cache(maxsize=None)
def _bit_types():
    """(torch dtype -> (bits torch dtype, bits numpy dtype, spec type), spec type ->
    (torch dtype, bits torch dtype)) for the torch dtypes numpy cannot hold, stored as
    bit patterns with their spec type: bf16, the four spec FP8 types, and torch's
    newer 8-bit types the spec does not name (stored as u8 bits with torch's name as
    the logical type, which the spec allows and every reader keeps: they come back
    as the same torch dtype)."""
    bits = {torch.bfloat16: (torch.int16, np.uint16, "bf16")}
    for name, spec in [(dtypes.BY_SPEC[t].torch, t) for t in dtypes.FP8_TYPES] + [
        ("float8_e8m0fnu", "f8_e8m0fnu"),
        ("float4_e2m1fn_x2", "f4_e2m1fn_x2"),
    ]:
        if hasattr(torch, name):
            bits[getattr(torch, name)] = (torch.uint8, np.uint8, spec)
    from_spec = {spec: (dt, bits_torch) for dt, (bits_torch, _, spec) in bits.items()}
    return bits, from_spec


def to_numpy_for_writing(t: torch.Tensor, name: str, path: Any = None):
    """(numpy array, spec type or None) holding exactly the tensor's elements.  A
    tensor that cannot be stored is an UnsupportedError naming ``path`` (the file
    being written) and the object."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_nested or t.layout != torch.strided:
        layout = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise UnsupportedError(
            f"a {layout} tensor is not stored: make it dense first", path=path, obj=name
        )
    if t.device.type == "meta":
        raise UnsupportedError(
            "a tensor on the meta device holds no data to store", path=path, obj=name
        )
    # a conjugate or negative view (x.conj(), x.imag of one) shows values its
    # memory does not hold: resolved, the elements stored are the ones it shows.
    # Strides are kept (numpy holds any torch strides), so a CPU tensor is not copied
    # here: Writer._prepare makes the contiguous copy, where memory it lacks is a
    # LimitError naming the object (torch's own copy raised a bare RuntimeError from
    # its allocator).  A tensor on another device is copied to the host by .cpu().
    t = t.detach().cpu().resolve_conj().resolve_neg()
    bits = _bit_types()[0]
    if t.dtype in bits:
        bits_torch, bits_np, spec = bits[t.dtype]
        return t.view(bits_torch).numpy().view(bits_np), spec
    try:
        return t.numpy(), None
    except TypeError:
        raise UnsupportedError(
            f"torch dtype {t.dtype} cannot be stored", path=path, obj=name
        ) from None


def is_cpu(device) -> bool:
    # staging.torch_device: the one rule for a caller's device (None is the CPU; one
    # torch cannot use is an UnsupportedError, not torch's own error mid-read)
    return staging.torch_device(device).type == "cpu"


def torch_bits_for(spec, arr, **where):
    """The one rule for which torch dtype an object's elements become, used by every
    torch read path (``Reader.read_torch``, ``ztensor.torch.load_file``/``load``,
    ``safe_open(framework="pt")`` whole and sliced): ``(torch dtype, bits torch
    dtype)`` when its logical type ``spec`` is one torch holds as bit patterns (bf16,
    float8) and ``arr`` holds elements of that width, else None: the elements as they
    are (``arr``'s own dtype).

    So an object read through torch is what ``read_numpy`` gives through numpy
    (docs/dtypes.md): an unknown logical type (``"acme.u3"``, or one this torch lacks
    a dtype for and the spec does not name) gives the storage elements, as the spec
    allows and as numpy gives them; a type the spec names whose values numpy has but
    this torch lacks (an FP8 type in an older torch) is an UnsupportedError naming
    ``where`` (path, obj), never its bit patterns passed off as integers."""
    from_spec = _bit_types()[1]
    if spec in from_spec:
        target, bits_torch = from_spec[spec]
        if arr.dtype.itemsize == (2 if bits_torch is torch.int16 else 1):
            return target, bits_torch
        return None  # a known type on other storage: numpy gives the storage too
    row = dtypes.BY_SPEC.get(spec) if spec not in _NUMPY_TYPES else None
    if row is not None and row.bits:  # values numpy has (ml_dtypes, float32); torch not
        if arr.dtype.itemsize == np.dtype(row.numpy).itemsize:
            raise UnsupportedError(
                f"logical type {spec!r} has no dtype in this torch ({torch.__version__})",
                **where,
            )
    if dtypes.is_ml_dtype(arr.dtype):
        # the elements as numpy holds them are an ml_dtypes type (bf16 storage under
        # an unknown logical type, which is read as its storage): torch's own dtype
        # of them, as numpy's own dtype is for every other storage
        own = dtypes.spec_types_for(arr.dtype)
        named = None if own is None else (own[1] or own[0])
        if named is not None and named != spec:
            return torch_bits_for(named, arr, **where)
    return None


def object_to_torch(reader, name, copy, device, sync=True):
    """Dense object ``name`` as a torch tensor on ``device``.  Off the CPU it goes
    through the device's staging buffer (ztensor/frameworks/staging.py) straight from the
    file's mapping (or the decoded array): no host copy of its own.  ``sync=False``
    leaves the last copies in flight; the caller syncs the staging buffer.  Its
    torch dtype: :func:`torch_bits_for`.

    A copy memory cannot hold (torch has no read-only tensors, so a read-only view
    is copied: a 2 MB ``torch.save`` of an overlapping ``as_strided`` view is 1 TiB
    of elements) is a LimitError naming the object, never a bare MemoryError: this
    is the one function every torch read path goes through (``Reader.read_torch``,
    ``load_file``, ``safe_open(framework="pt")``)."""
    where = {"path": reader.path, "obj": name}
    with memory_is_a_limit(**where):
        return _object_to_torch(reader, name, copy, device, sync, where)


def _object_to_torch(reader, name, copy, device, sync, where):
    on_cpu = is_cpu(device)
    obj = reader.read(name, copy=copy and on_cpu)
    if obj.format != "dense":
        raise UnsupportedError(
            f"torch tensors come from dense objects; this one is {obj.format!r}", **where
        )
    arr = obj.components["data"]
    bits = torch_bits_for(obj.types.get("data"), arr, **where)
    if not on_cpu:
        target = bits[0] if bits else torch_dtype_of(arr.dtype, **where)
        return to_device(arr, target, obj.shape, device, sync)
    if bits:  # bits -> torch's own bf16 / float8 dtype
        target, bits_torch = bits
        raw = _native(arr.view(np.uint16 if bits_torch is torch.int16 else np.uint8), copy)
        return torch.from_numpy(raw.view(np.int16) if bits_torch is torch.int16 else raw).view(
            target
        )
    return _from_numpy(_native(arr, copy), **where)


def to_device(arr, dtype, shape, device, sync=True):
    """A tensor of ``dtype``/``shape`` on a non-CPU ``device`` holding ``arr``'s
    elements (any byte order; bf16/float8 as bits), through the staging buffer."""
    buffer = staging.for_device(device)
    out = buffer.put(arr, dtype, shape)
    if sync:
        buffer.sync()
    return out


def _placed(t, device):
    """A CPU tensor ``t`` (native order, contiguous) moved to ``device``."""
    if is_cpu(device):
        return t
    t = t.contiguous()
    return to_device(t.reshape(-1).view(torch.uint8).numpy(), t.dtype, t.shape, device)


_TORCH_DTYPES: dict = {}


def torch_dtype_of(np_dtype, **where):
    """The torch dtype holding numpy ``np_dtype``'s values (any byte order), or
    UnsupportedError naming ``where`` (path, obj)."""
    key = np_dtype.newbyteorder("=") if np_dtype.itemsize > 1 else np_dtype
    found = _TORCH_DTYPES.get(key)
    if found is None:
        try:
            found = _TORCH_DTYPES[key] = _from_numpy(np.empty(0, key)).dtype
        except TypeError:
            raise UnsupportedError(f"numpy dtype {np_dtype} has no torch dtype", **where) from None
    return found


def _native(arr, copy):
    """torch needs native byte order and writable memory (a read-only buffer, e.g.
    bytes, is copied: torch has no read-only tensors)."""
    if arr.dtype.itemsize > 1 and not arr.dtype.isnative:
        return components.to_native(arr)
    if not arr.flags.writeable:
        return arr.copy()
    return arr


def _from_numpy(arr, **where):
    """``torch.from_numpy``, silent (a read-only array warns), or UnsupportedError
    naming ``where`` for a numpy dtype torch lacks (uint16 before torch 2.3)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.from_numpy(arr)
        except TypeError:
            raise UnsupportedError(f"numpy dtype {arr.dtype} has no torch dtype", **where) from None


def numpy_to_torch(arr, meta, device, path=None):
    """A slice read through safe_open(framework="pt") as a torch tensor of the
    object's dtype (bf16/FP8 slices arrive as ml_dtypes or float32 values); the
    dtype by :func:`torch_bits_for`, as for the whole tensor.  ``path`` names the
    file in errors."""
    # an unknown logical type is read as its storage (bf16 storage under "acme.x"
    # is bf16), as the whole tensor is (torch_bits_for's ml_dtypes rule)
    row = dtypes.BY_SPEC.get(meta.type) if meta.type else None
    known = row is not None and (row.bits or dtypes.logical_known(meta.storage_dtype, meta.type))
    key = meta.type if known else meta.storage_dtype
    where = {"path": path, "obj": meta.name}
    # the slice arrives as values: the rule is asked of the stored element's width
    storage = dtypes.STORAGE.get(meta.storage_dtype)
    stored = arr if storage is None else np.empty(0, storage.numpy)
    bits = torch_bits_for(key, stored, **where)
    if bits:
        target = bits[0]
        if dtypes.is_ml_dtype(arr.dtype):
            width = np.uint16 if arr.dtype.itemsize == 2 else np.uint8
            return _reader_bits(arr.view(width), target, device)
        # np.asarray, not ascontiguousarray: that one turns a 0-d slice ([3] of a
        # vector) into shape (1,), where safetensors gives shape ()
        t = torch.from_numpy(np.asarray(arr, np.float32, order="C")).to(target)
    else:
        t = _from_numpy(_native(np.asarray(arr, order="C"), True), **where)
    return _placed(t, device)


def _reader_bits(bits, target, device):
    t = torch.from_numpy(bits.view(np.int16) if bits.dtype.itemsize == 2 else bits).view(target)
    return _placed(t, device)


def torch_bits_dtype(dtype):
    """(torch integer dtype, numpy dtype) that hold a torch dtype numpy lacks
    (bf16, float8) bit for bit, or None."""
    found = _bit_types()[0].get(dtype)
    return None if found is None else (found[0], found[1])


def numpy_to_torch_plain(arr, device, sync=True):
    """A torch tensor owning a copy of a plain numpy array (native order)."""
    if not is_cpu(device):
        return to_device(arr, torch_dtype_of(arr.dtype), arr.shape, device, sync)
    return _from_numpy(
        np.array(arr, dtype=arr.dtype.newbyteorder("=") if arr.dtype.itemsize > 1 else arr.dtype)
    )


def copy_into(target: torch.Tensor, value: torch.Tensor) -> None:
    """``target.copy_(value)``.  A large copy between contiguous CPU tensors of one
    dtype and shape is the copy kernel's (``kernels.copy``), split between threads,
    whose non-temporal stores skip reading the destination into the cache first
    (torch's ``copy_`` never streams): loading a checkpoint into a model is mostly
    this copy (docs/benchmarks.md, sessions 13 and 21).  Anything else, and tensors
    sharing memory, go through ``copy_``."""
    if (
        # below it the kernel is a plain memcpy: torch's copy_ is as fast, and cheaper
        # to call
        target.nbytes >= kernels.COPY_STREAM_BYTES
        and target.device.type == "cpu"
        and value.device.type == "cpu"
        and target.dtype == value.dtype
        and target.shape == value.shape
        and target.is_contiguous()
        and value.is_contiguous()
        and not (target.requires_grad or value.requires_grad)
        and not (target.is_conj() or target.is_neg() or value.is_conj() or value.is_neg())
        and type(target) is torch.Tensor
        and type(value) is torch.Tensor
    ):
        src, dst = _bytes_of(value), _bytes_of(target)
        if not np.may_share_memory(src, dst):
            _streamed(src, dst)
            return
    target.copy_(value)


# from here up a copy is split between threads: one core's non-temporal stores do not
# reach the memory's bandwidth on every machine (docs/benchmarks.md, session 16: 6 GB/s
# on one thread, 11 on two, torch's copy_ 7), and a thread costs ~0.1 ms to start
PARALLEL_COPY_BYTES = 8 << 20
_MOST_COPY_THREADS = 4


def _streamed(src: np.ndarray, dst: np.ndarray) -> None:
    """``kernels.copy(src, dst)``, a large one in up to four pieces at once (each
    on a 4 KiB boundary: no two threads write one cache line or page)."""
    threads = min(kernels.cpu_threads(), _MOST_COPY_THREADS, src.nbytes // PARALLEL_COPY_BYTES)
    if threads < 2:
        kernels.copy(src, dst)
        return
    step = -(-src.nbytes // threads) + 4095 & ~4095
    pieces = [slice(at, min(at + step, src.nbytes)) for at in range(0, src.nbytes, step)]
    failed: list = []

    def run(piece: slice) -> None:
        try:
            kernels.copy(src[piece], dst[piece])
        except BaseException as exc:  # said by the caller, as one thread's would be
            failed.append(exc)

    # the calling thread copies the first piece: a pool would leave it waiting
    helpers = [threading.Thread(target=run, args=(piece,), daemon=True) for piece in pieces[1:]]
    for helper in helpers:
        helper.start()
    run(pieces[0])
    for helper in helpers:
        helper.join()
    if failed:
        raise failed[0]


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's bytes as a flat uint8 array over its memory."""
    return t.reshape(-1).view(torch.uint8).numpy()
