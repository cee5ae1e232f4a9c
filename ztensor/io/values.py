"""Storage elements -> logical numpy values (and back for writing).

Read rules (docs/dtypes.md):

* complex64/complex128: a numpy complex view of the float pairs (no copy).
* bf16 and FP8: with ml_dtypes, a view as its dtype (no copy); without it,
  :func:`as_values` decodes to float32 (exact: every bf16/FP8 value is a float32)
  and :func:`as_elements` keeps the bit patterns (uint16/uint8).
* an unknown logical type: the storage elements, as the spec allows.
"""

from __future__ import annotations

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError
from ztensor.io import floats
from ztensor.io.components import to_native

_COMPLEX: dict[str, np.dtype] = {"complex64": np.dtype("<c8"), "complex128": np.dtype("<c16")}


def _ml_view(arr: np.ndarray, ml_name: str):
    """View little-endian storage as an ml_dtypes dtype, or None without ml_dtypes.
    ml_dtypes types are native-order only, so a big-endian host copies and swaps."""
    target = dtypes.ml_dtype(ml_name)
    if target is None:
        return None
    if arr.dtype.itemsize > 1 and not arr.dtype.isnative:
        arr = to_native(arr)
    return arr.view(target)


def as_elements(arr: np.ndarray, storage: str, ltype, **where) -> np.ndarray:
    """Exact stored elements in the richest lossless numpy dtype available.
    Every read path interprets elements here, so the element rules live here: a
    v2 ``bool`` byte must be 0 or 1 (FormatError naming ``where``: path, obj,
    component)."""
    if ltype == "bool" and storage == "u8":  # v2's bool: bytes 0 and 1 only
        if arr.size and int(arr.max()) > 1:
            raise FormatError("a bool element holds a byte other than 0 or 1", **where)
        return arr.view(np.bool_)
    if ltype in _COMPLEX and dtypes.logical_known(storage, ltype):
        return arr.view(_COMPLEX[ltype].newbyteorder(arr.dtype.byteorder))
    ml_name = (
        "bfloat16"
        if storage == "bf16"
        else dtypes.LOGICAL[ltype].ml_name
        if dtypes.logical_known(storage, ltype)
        else ""
    )
    if ml_name:
        viewed = _ml_view(arr, ml_name)
        if viewed is not None:
            return viewed
    return arr


def as_values(arr: np.ndarray, storage: str, ltype, **where) -> np.ndarray:
    """Logical values: like :func:`as_elements`, but bf16/FP8 without ml_dtypes are
    decoded to float32 instead of kept as bits."""
    out = as_elements(arr, storage, ltype, **where)
    if out.dtype.kind != "u" or out is not arr:
        return out
    if storage == "bf16":
        return floats.bf16_to_float32(arr)
    if ltype in dtypes.FP8_TYPES and storage == "u8":
        return floats.fp8_to_float(arr, ltype)
    return out
