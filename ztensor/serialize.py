"""safetensors' low-level functions: ``serialize``, ``serialize_file`` and
``deserialize``, over zTensor files.

A tensor is given as ``{"dtype": str, "shape": [int], "data": bytes}`` (the dtype
by torch's name without ``torch.``, e.g. ``"float32"``, ``"bfloat16"``, or by
safetensors', e.g. ``"F32"``); the bytes are the elements, little-endian, row-major.
``deserialize`` reads zTensor and safetensors bytes alike."""

from __future__ import annotations

import math
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
        if not isinstance(info, dict) or not {"dtype", "shape", "data"} <= set(info):
            raise FormatError("a tensor needs 'dtype', 'shape' and 'data'", path=path, obj=name)
        dtype_name = info["dtype"]
        kind = (
            _TORCH_NAMES.get(dtype_name) or dtypes.SAFETENSORS_STORAGE.get(dtype_name)
            if isinstance(dtype_name, str)
            else None
        )
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
    in file order."""

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
            name_of = _NAME_OF.get(comp.type or comp.dtype) or dtypes.REFERENCE_NAMES.get(
                comp.dtype, comp.dtype
            )
            if comp.type in ("complex64", "complex128"):
                name_of = comp.type
            out.append((name, {"dtype": name_of, "shape": list(meta.shape), "data": arr.tobytes()}))
    return out
