"""safetensors' low-level functions: ``serialize``, ``serialize_file`` and
``deserialize``, over zTensor files.

A tensor is given as ``{"dtype": str, "shape": [int], "data": bytes}``, or as
safetensors 0.8's :class:`TensorSpec` (dtype, shape, a raw address and length).  The
dtype is torch's name without ``torch.`` (``"float32"``, ``"bfloat16"``) or
safetensors' (``"F32"``); the bytes are the elements, little-endian, row-major.
``deserialize`` reads zTensor and safetensors bytes alike."""

from __future__ import annotations

import ctypes
import math
import operator
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ztensor import _save, dtypes
from ztensor.arguments import caller_shape
from ztensor.attributes import show
from ztensor.container.reader import open_bytes
from ztensor.container.writer import Writer
from ztensor.errors import FormatError, SafetensorError, UnsupportedError
from ztensor.objects import shape_problem
from ztensor.tensor import Tensor

# torch-style names -> (numpy little-endian storage, logical type), and the names of
# the types numpy holds as bits: both from the one dtype table (dtypes.ROWS);
# safetensors' names come from dtypes.SAFETENSORS_STORAGE
_TORCH_NAMES = dtypes.TORCH_KINDS
_NAME_OF = dtypes.ML_NAMES


def _kind_of(dtype_name: Any):
    """(numpy storage, logical type) of a dtype by torch's or safetensors' name, or None."""
    if not isinstance(dtype_name, str):
        return None
    return _TORCH_NAMES.get(dtype_name) or dtypes.SAFETENSORS_STORAGE.get(dtype_name)


class TensorSpec:
    """One tensor for :func:`serialize` / :func:`serialize_file`, as safetensors 0.8
    describes it: ``TensorSpec(dtype=, shape=, data_ptr=, data_len=)`` (keywords only,
    as there), ``data_ptr`` the address of ``data_len`` bytes of elements
    (little-endian, row-major).  ``dtype`` is torch's name for it (``"float32"``,
    ``"bfloat16"``), as safetensors takes it (its own ``"F32"`` is refused there
    and here); ``.dtype`` is safetensors' name, as safetensors reports it.  The
    dtype is checked here (an unknown one is a SafetensorError, as in safetensors;
    float4 and float8_e8m0, which zTensor's dtype table lacks, say so); the rest
    when it is serialized.

    Unsafe as safetensors' is: the address is the caller's word.  The memory must
    stay alive, unchanged, through every call that is given the spec; nothing can
    check that an address is valid.  The dict form (``{"dtype", "shape", "data"}``)
    holds its bytes and needs no such care."""

    __slots__ = ("dtype", "shape", "data_ptr", "data_len")

    def __init__(self, *, dtype: str, shape: Any, data_ptr: int, data_len: int) -> None:
        if not isinstance(dtype, str):  # as safetensors: the argument's type is wrong
            raise TypeError(f"argument 'dtype': a str, not {type(dtype).__name__}")
        if dtype not in _TORCH_NAMES:
            if dtype in dtypes.SAFETENSORS_ONLY:
                raise SafetensorError(
                    f"dtype {dtype} is not in zTensor's dtype table (docs/dtypes.md): "
                    "serialize cannot write it"
                )
            # torch's names only, as safetensors 0.8 takes them (its "F32" is refused)
            known = ", ".join(n for n in _TORCH_NAMES if n in dtypes.TORCH_TO_SAFETENSORS)
            hint = ""
            if dtype in dtypes.SAFETENSORS_STORAGE:
                torch_name = next(t for t, st in dtypes.TORCH_TO_SAFETENSORS.items() if st == dtype)
                hint = f" (safetensors' name in a file; a TensorSpec takes {torch_name!r})"
            raise SafetensorError(f"unknown dtype {show(dtype)}{hint}; supported dtypes: {known}")
        self.dtype = dtypes.TORCH_TO_SAFETENSORS.get(dtype, dtype)
        self.shape = list(caller_shape(shape))
        self.data_ptr = _address_field("data_ptr", data_ptr)
        self.data_len = _address_field("data_len", data_len)

    def __repr__(self) -> str:
        return (
            f"TensorSpec(dtype={self.dtype!r}, shape={self.shape}, "
            f"data_ptr={self.data_ptr:#x}, data_len={self.data_len})"
        )


def _address_field(what: str, value: Any) -> int:
    """A TensorSpec's ``data_ptr`` or ``data_len``: an integer (numpy's too) from 0
    to the largest address, else a TypeError or ValueError naming it."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None
    if not 0 <= number <= sys.maxsize:
        raise ValueError(f"{what} must be from 0 to {sys.maxsize}, not {number}")
    return number


def _spec_dict(spec: TensorSpec, name: str, path: Any) -> Dict[str, Any]:
    """A TensorSpec as the dict form: its bytes a view of the memory it points to,
    once its length is the one its dtype and shape need (checked first: the fields
    can be changed after the spec was made, and no memory is looked at for a length
    that does not fit)."""
    address = _address_field("data_ptr", spec.data_ptr)
    length = _address_field("data_len", spec.data_len)
    kind = _kind_of(spec.dtype)
    shape = caller_shape(spec.shape)
    if kind is not None and not shape_problem(shape, np.dtype(kind[0]).itemsize):
        needed = math.prod(shape) * np.dtype(kind[0]).itemsize
        if length != needed:
            raise FormatError(
                f"data_len {length}: shape {list(shape)} of {spec.dtype} needs {needed} bytes",
                path=path,
                obj=name,
            )
    if not length:
        return {"dtype": spec.dtype, "shape": spec.shape, "data": b""}
    if not address:
        raise TypeError(f"tensor {show(name)}: a TensorSpec with data_len > 0 needs a data_ptr")
    data = (ctypes.c_char * length).from_address(address)
    return {"dtype": spec.dtype, "shape": spec.shape, "data": memoryview(data).cast("B")}


def _arrays(tensor_dict: Any, path: Any):
    """(name, array, logical type) of each dtype/shape/bytes dict, every field checked
    first: any bad value is a FormatError naming the tensor and ``path`` (the file
    being written: ``serialize`` names its bytes, ``_save.named_as_bytes``), never
    numpy's error."""
    if not isinstance(tensor_dict, dict):
        raise SafetensorError(
            f"expected a dict of tensors, got {type(tensor_dict).__name__}", path=path
        )
    for name, info in _save.canonical_order(tensor_dict):  # one order: same tensors, same bytes
        if isinstance(info, TensorSpec):
            info = _spec_dict(info, name, path)
        elif isinstance(info, dict) and "data_ptr" in info and "data" not in info:
            raise TypeError(
                f"tensor {show(name)}: a raw address is given as a TensorSpec, not a dict"
            )
        if not isinstance(info, dict) or not {"dtype", "shape", "data"} <= set(info):
            raise FormatError(
                "a tensor needs 'dtype', 'shape' and 'data' (or is a TensorSpec)",
                path=path,
                obj=name,
            )
        dtype_name = info["dtype"]
        kind = _kind_of(dtype_name)
        if kind is None:
            raise FormatError(f"unknown dtype {show(dtype_name)}", path=path, obj=name)
        # the one rule for a caller's shape (numpy integers taken, bools and
        # negatives refused), its TypeError a FormatError naming the tensor here
        try:
            shape = caller_shape(info["shape"])
        except (TypeError, FormatError) as exc:
            raise FormatError(
                f"shape must be a list of sizes: {exc}",
                path=path,
                obj=name,
            ) from None
        dtype = np.dtype(kind[0])
        # numpy's own limits (a dimension or an extent of 2**63 or more), as the reader
        # states them (objects.shape_problem), before numpy is asked
        problem = shape_problem(shape, dtype.itemsize)
        if problem:
            raise FormatError(f"shape: {problem}", path=path, obj=name)
        try:
            data = memoryview(info["data"]).cast("B")
        except (TypeError, ValueError) as exc:
            raise FormatError(f"'data' must be bytes-like: {exc}", path=path, obj=name) from None
        if len(data) != math.prod(shape) * dtype.itemsize:
            raise FormatError(
                f"{len(data)} bytes of data, shape {list(shape)} of "
                f"{dtype_name} needs {math.prod(shape) * dtype.itemsize}",
                path=path,
                obj=name,
            )
        yield name, np.frombuffer(data, dtype).reshape(shape), kind[1]


def serialize_file(
    tensor_dict: Dict[str, Dict[str, Any]], filename: Any, metadata: Optional[Dict[str, str]] = None
) -> None:
    """Write tensors given as dtype/shape/bytes dicts to a zTensor file."""

    with Writer(filename, attributes=_save.str_metadata(metadata)) as w:
        for name, arr, ltype in _arrays(tensor_dict, filename):
            w.write(name, Tensor({"data": arr}, types={"data": ltype} if ltype else None))


def serialize(
    tensor_dict: Dict[str, Dict[str, Any]], metadata: Optional[Dict[str, str]] = None
) -> bytes:
    """The zTensor file of tensors given as dtype/shape/bytes dicts, as bytes."""
    return _save.to_bytes(serialize_file, tensor_dict, metadata)


def deserialize(data: bytes) -> List[Tuple[str, Dict[str, Any]]]:
    """[(name, {"dtype", "shape", "data"})] of a zTensor or safetensors file's bytes,
    in file order, as safetensors gives them: ``dtype`` safetensors' name (``"F32"``;
    zTensor's for a type safetensors lacks), ``data`` a bytearray."""

    out = []
    with open_bytes(data) as r:
        for name in r.keys():
            meta = r.metadata(name)
            if meta.format != "dense":  # a dtype/shape/bytes dict holds dense tensors only
                raise UnsupportedError(
                    f"deserialize returns dense tensors; this object is "
                    f"{meta.format!r}: read it with ztensor.Reader(...)"
                    ".read()",
                    path=r.path,
                    obj=name,
                )
            comp = meta.components["data"]
            arr = np.ascontiguousarray(r.read(name).components["data"])
            if arr.dtype.itemsize > 1 and not arr.dtype.isnative or arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            # safetensors' name ("F32", "BF16", "BOOL") and a bytearray, as safetensors'
            # deserialize gives them (safetensors.torch.load maps those names); a type
            # safetensors has no name for keeps zTensor's
            key = comp.type or comp.dtype
            name_of = dtypes.SAFETENSORS_NAMES.get(key)
            if name_of is None:
                name_of = _NAME_OF.get(key) or dtypes.REFERENCE_NAMES.get(comp.dtype, comp.dtype)
                if comp.type in ("complex64", "complex128"):
                    name_of = comp.type
            out.append(
                (
                    name,
                    {"dtype": name_of, "shape": list(meta.shape), "data": bytearray(arr.tobytes())},
                )
            )
    return out
