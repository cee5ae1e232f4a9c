"""PyTorch checkpoints (``torch.save``'s zip format: ``.pt``, ``.pth``, ``.bin``),
read without torch and without running the pickle's code.

A checkpoint is a zip holding ``<prefix>/data.pkl`` (the pickled object) and one
member per storage (``<prefix>/data/<key>``).  The pickle is read by
:class:`RestrictedUnpickler`:

* ``find_class`` answers from an allowlist alone: the tensor rebuild functions
  (``torch._utils._rebuild_tensor_v2``/``_v3``, ``_rebuild_parameter``), the storage
  classes and dtypes, and ``collections.OrderedDict``.  Each name maps to a function
  of this module; torch's own code is never imported or called.  Any other global
  (``os.system``, ``builtins.eval``, a model class) is a FormatError naming it.
* ``persistent_load`` maps a storage reference to a numpy view of its zip member
  (stored members are views of the mapped file; compressed ones are decompressed).

Every tensor's offset, sizes and strides are checked against its storage before a
view is made.  Tensors are then found in the unpickled object by a bounded walk:
dict keys (nested dicts joined with ``.``) and list indices name them; plain
values (numbers, strings) become attributes.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import zipfile
from collections import OrderedDict
from typing import Any, Dict, Tuple

import numpy as np

from ztensor.errors import FormatError, LimitError, UnsupportedError
from ztensor.foreign import ZIP_ERRORS, ForeignFile, eager
from ztensor.source import Source
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor.tensor import Tensor

MAX_PICKLE = 256 << 20   # data.pkl holds structure, not data: far below this in practice
MAX_RANK = 64

# storage class / dtype name -> (numpy little-endian dtype, zTensor logical type)
_DTYPES = {
    "DoubleStorage": ("<f8", None), "FloatStorage": ("<f4", None), "HalfStorage": ("<f2", None),
    "BFloat16Storage": ("<u2", "bf16"), "LongStorage": ("<i8", None),
    "IntStorage": ("<i4", None), "ShortStorage": ("<i2", None), "CharStorage": ("i1", None),
    "ByteStorage": ("u1", None), "BoolStorage": ("?", None),
    "ComplexFloatStorage": ("<c8", None), "ComplexDoubleStorage": ("<c16", None),
    "UntypedStorage": ("u1", None),
    "float64": ("<f8", None), "float32": ("<f4", None), "float16": ("<f2", None),
    "bfloat16": ("<u2", "bf16"), "int64": ("<i8", None), "int32": ("<i4", None),
    "int16": ("<i2", None), "int8": ("i1", None), "uint8": ("u1", None),
    "uint16": ("<u2", None), "uint32": ("<u4", None), "uint64": ("<u8", None),
    "bool": ("?", None), "complex64": ("<c8", None), "complex128": ("<c16", None),
    "float8_e4m3fn": ("u1", "f8_e4m3fn"), "float8_e5m2": ("u1", "f8_e5m2"),
    "float8_e4m3fnuz": ("u1", "f8_e4m3fnuz"), "float8_e5m2fnuz": ("u1", "f8_e5m2fnuz"),
}


class _DType:
    """What a storage class or dtype global unpickles to: a type marker."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _Storage:
    """A storage: its raw bytes (a numpy uint8 array) and element type."""

    __slots__ = ("raw", "dtype")

    def __init__(self, raw, dtype):
        self.raw, self.dtype = raw, dtype


class _TensorRecord:
    """A rebuilt tensor: a checked numpy view (or copy) and its logical type."""

    __slots__ = ("array", "ltype")

    def __init__(self, array, ltype):
        self.array, self.ltype = array, ltype


def _rebuild(storage, offset, size, stride, dtype_name=None):
    if not isinstance(storage, _Storage):
        raise FormatError("a tensor whose storage is not a storage reference")
    name = dtype_name or storage.dtype.name
    np_name, ltype = _DTYPES[name]
    dtype = np.dtype(np_name)
    if (not isinstance(size, (tuple, list)) or not isinstance(stride, (tuple, list))
            or len(size) != len(stride) or len(size) > MAX_RANK
            or not all(type(v) is int and 0 <= v < 1 << 62 for v in (offset, *size, *stride))):
        raise FormatError(f"malformed tensor geometry: offset {offset!r}, size {size!r}, "
                          f"stride {stride!r}")
    count = storage.raw.size // dtype.itemsize
    if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= count:
        raise FormatError(f"tensor of size {list(size)}, stride {list(stride)} at offset "
                          f"{offset} reaches past its storage of {count} elements")
    if not math.prod(size):
        return _TensorRecord(np.zeros(tuple(size), dtype), ltype)
    elements = storage.raw[:count * dtype.itemsize].view(dtype)
    view = np.lib.stride_tricks.as_strided(elements[offset:], shape=tuple(size),
                                           strides=tuple(s * dtype.itemsize for s in stride),
                                           writeable=False)
    return _TensorRecord(view, ltype)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None,
                       metadata=None):
    return _rebuild(storage, offset, size, stride)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad=False, hooks=None,
                       dtype=None, metadata=None):
    if not isinstance(dtype, _DType):
        raise FormatError("_rebuild_tensor_v3 without a known dtype")
    return _rebuild(storage, offset, size, stride, dtype.name)


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    if not isinstance(data, _TensorRecord):
        raise FormatError("a parameter that does not hold a tensor")
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can build tensors, dicts and plain values, and nothing else."""

    def __init__(self, file, storages):
        super().__init__(file)
        self._storages = storages

    def find_class(self, module, name):
        found = _ALLOWED.get((module, name))
        if found is not None:
            return found
        if module in ("torch", "torch.storage") and name in _DTYPES:
            return _DType(name)
        raise FormatError(f"refusing to load {module}.{name} from a pickle: a checkpoint may "
                          "hold tensors and plain containers only (no code is run)")

    def persistent_load(self, pid):
        if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage"
                or not isinstance(pid[1], _DType) or not isinstance(pid[2], str)):
            raise FormatError(f"unknown persistent reference {str(pid)[:80]}")
        return self._storages(pid[2], pid[1], pid[4])


def open_file(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    try:
        return _open(name)
    except FormatError:
        raise
    except ZIP_ERRORS as exc:
        raise FormatError(f"not a readable PyTorch checkpoint: {type(exc).__name__}: "
                          f"{str(exc)[:200]}", path=name) from None


def _open(name) -> ForeignFile:
    try:
        archive = zipfile.ZipFile(name)
        members = {info.filename: info for info in archive.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise FormatError(f"not a readable PyTorch checkpoint: {exc}", path=name) from None
    pkl = next((n for n in members if n == "data.pkl" or n.endswith("/data.pkl")), None)
    if pkl is None:
        archive.close()
        raise FormatError("not a PyTorch checkpoint: no data.pkl", path=name)
    prefix = pkl[:-len("data.pkl")]
    order = archive.read(prefix + "byteorder").decode("ascii", "replace").strip() \
        if prefix + "byteorder" in members else "little"
    if order not in ("little", "big"):
        archive.close()
        raise FormatError(f"byteorder {order[:20]!r}", path=name)
    source = Source(name)   # the one home of bounds checks: members are views of it
    cache: Dict[str, _Storage] = {}

    def storage(key, dtype, numel):
        member = members.get(f"{prefix}data/{key}")
        if member is None:
            raise FormatError(f"storage {key[:40]!r} is not in the archive", path=name)
        if key not in cache:
            cache[key] = _Storage(_member_bytes(archive, member, source, name), dtype)
        return cache[key]

    info = members[pkl]
    if info.file_size > MAX_PICKLE:
        archive.close()
        source.close()
        raise LimitError(f"data.pkl of {info.file_size} bytes exceeds {MAX_PICKLE}", path=name)
    try:
        raw = archive.read(pkl)
        obj = RestrictedUnpickler(io.BytesIO(raw), storage).load()
    except FormatError as exc:
        archive.close()
        source.close()
        raise FormatError(exc.message, path=name) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, OverflowError, RecursionError, zipfile.BadZipFile, OSError) as exc:
        archive.close()
        source.close()
        raise FormatError(f"not a readable PyTorch checkpoint: {type(exc).__name__}: "
                          f"{str(exc)[:200]}", path=name) from None
    archive.close()
    tensors, attributes = _collect(obj, len(raw), name)
    entries = {}
    for key, record in tensors.items():
        arr = record.array
        if order == "big" and arr.dtype.itemsize > 1:
            arr = arr.view(arr.dtype.newbyteorder(">"))  # the storages hold big-endian bytes
        tensor = Tensor({"data": arr}, shape=arr.shape,
                        types={"data": record.ltype} if record.ltype else None)
        entries[key] = eager(key, tensor)
    return ForeignFile(name, "pickle", attributes, entries, closer=source.close)


def _member_bytes(archive, info, source, path):
    """A storage member's bytes: a view of the mapped file when stored uncompressed
    (torch.save stores them so), else decompressed."""
    if info.compress_type == zipfile.ZIP_STORED and source.size:
        local = bytes(source.view(info.header_offset, 30, "zip local header"))
        if local[:4] != b"PK\x03\x04":
            raise FormatError(f"storage member {info.filename[:60]!r}: no local header",
                              path=path)
        name_len = int.from_bytes(local[26:28], "little")
        extra_len = int.from_bytes(local[28:30], "little")
        start = info.header_offset + 30 + name_len + extra_len
        return np.frombuffer(source.view(start, info.compress_size, "storage"), np.uint8)
    try:
        return np.frombuffer(archive.read(info), np.uint8)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError,
            RuntimeError) as exc:
        raise FormatError(f"cannot read storage {info.filename[:60]!r}: {exc}",
                          path=path) from None


def _collect(obj, budget, path) -> Tuple[Dict[str, _TensorRecord], Dict[str, Any]]:
    """Tensors (by dotted name) and plain values (as attributes) of the unpickled
    object.  A pickle can share one container many times (its memo); each is
    walked once and the walk stops after ``budget`` steps, so the work follows the
    pickle's bytes, never what its sharing describes."""
    tensors: Dict[str, _TensorRecord] = {}
    attributes: Dict[str, Any] = {}
    seen = set()
    stack = [("", obj, 0)]
    steps = 0
    while stack:
        prefix, value, depth = stack.pop()
        steps += 1
        if steps > budget:
            raise LimitError("the checkpoint's object graph is larger than its pickle",
                             path=path)
        if isinstance(value, _TensorRecord):
            tensors[prefix or "tensor"] = value
            continue
        if isinstance(value, (dict, list, tuple)):
            if id(value) in seen or depth > 64:
                continue
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = [(f"{prefix}.{k}" if prefix else str(k), v, depth + 1) for k, v in items]
            stack.extend(reversed(children))
            continue
        if isinstance(value, (int, float, str, bool)) and prefix and len(attributes) < 10_000:
            if isinstance(value, str):
                value = value[:4096]
            attributes[f"pickle.{prefix}"] = value
    if not tensors and obj is not None and not isinstance(obj, (dict, list, tuple)):
        raise UnsupportedError("the checkpoint holds no tensors", path=path)
    return tensors, attributes
