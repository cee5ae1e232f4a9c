"""Storage elements -> logical numpy values (and back for writing).

Read rules (docs/dtypes.md):

* complex64/complex128: a numpy complex view of the float pairs (no copy).
* bf16 and FP8: with ml_dtypes, a view as its dtype (no copy); without it,
  :func:`as_values` decodes to float32 (exact: every bf16/FP8 value is a float32)
  and :func:`as_elements` keeps the bit patterns (uint16/uint8).
* an unknown logical type: the storage elements, as the spec allows.
* bool (v1.x/v0.1 storage ``bool``, v2's ``u8`` with type ``bool``): every byte is
  0x00 or 0x01, as every spec version says; any other byte is a FormatError
  (:func:`check_bools`), never a numpy bool array holding it (numpy's behaviour
  for such an array is undefined: ``a == True``, ``view(np.uint8)`` and
  ``array_equal`` disagree).  Writing, the values are made 0/1 instead
  (:func:`clean_bools`): an in-memory array is a value, whose truth is "not zero".
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


def is_bool(storage: str, ltype) -> bool:
    """Whether elements stored as ``storage`` with logical type ``ltype`` are bools,
    one byte each: v1.x/v0.1's storage ``bool``, or ``u8`` with type ``bool`` (v2)."""
    return storage == "bool" or (ltype == "bool" and storage == "u8")


def distinct(arr: np.ndarray) -> np.ndarray:
    """The elements of ``arr`` each once: an axis of stride 0 (a view another format
    made with ``expand``) collapsed to one step.  ``arr`` itself when it has none."""
    if not arr.size or 0 not in arr.strides:
        return arr
    return arr[tuple(slice(0, 1) if step == 0 else slice(None) for step in arr.strides)]


def elementwise(fn, arr: np.ndarray) -> np.ndarray:
    """``fn`` (elementwise) of ``arr``, applied to its distinct elements only and
    broadcast back to its shape (a read-only view) where it repeats elements: a
    pass over a stride-0 view of 48 stored bytes declaring 2**32 elements made a
    4 GB array (found by fuzzing, a PyTorch bool tensor)."""
    once = distinct(arr)
    if once is arr:
        return fn(arr)
    return np.broadcast_to(fn(once), arr.shape)


def check_bools(arr: np.ndarray, **where) -> None:
    """The one home of the bool rule on reading: every byte of a bool component is
    0x00 or 0x01, else FormatError naming ``where`` (path, obj, component).  One
    pass over the bytes at memory speed (uint8 ``max``, no temporary array)."""
    if arr.size and int(distinct(arr).view(np.uint8).max()) > 1:
        raise FormatError("a bool element holds a byte other than 0 or 1", **where)


def clean_bools(arr: np.ndarray) -> np.ndarray:
    """Writing: a one-byte bool array (numpy bool, or uint8 bytes given type
    ``bool``) whose every byte is 0 or 1.  ``arr`` itself when it already is (the
    common case: one scan, no copy); else a new array of its dtype and shape holding
    ``arr != 0`` (numpy and torch make bytes such as 0x02 through views; their truth
    is "not zero")."""
    raw = arr.view(np.uint8)
    if not raw.size or int(distinct(raw).max()) <= 1:
        return arr
    return elementwise(lambda b: (b != 0).view(arr.dtype), raw)


def as_elements(arr: np.ndarray, storage: str, ltype, **where) -> np.ndarray:
    """Exact stored elements in the richest lossless numpy dtype available.
    Every read path interprets elements here, so the element rules live here: a
    ``bool`` byte must be 0 or 1 (:func:`check_bools`: FormatError naming
    ``where``: path, obj, component).  The fast paths that skip this function
    (read_numpy's view table, batch reads) decline bool objects."""
    if is_bool(storage, ltype):  # bytes 0 and 1 only; still a view of ``arr``
        check_bools(arr, **where)
        return arr if arr.dtype == np.bool_ else arr.view(np.bool_)
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


def foreign_values(arr, storage: str, ltype, **where) -> np.ndarray:
    """Another format's stored elements as every read hands them out: bool bytes
    other than 0 and 1 made 1, not refused (docs/format-decisions.md: a foreign
    file's bools are read as its own reader reads them), then :func:`as_values`.
    The one rule for ``Reader.read_numpy`` and ``safe_open``'s slices of another
    format's tensors."""
    arr = np.asarray(arr)
    if is_bool(storage, ltype):
        arr = clean_bools(arr)
    return as_values(arr, storage, ltype, **where)


def as_values(arr: np.ndarray, storage: str, ltype, **where) -> np.ndarray:
    """Logical values: like :func:`as_elements`, but bf16/FP8 without ml_dtypes are
    decoded to float32 instead of kept as bits."""
    out = as_elements(arr, storage, ltype, **where)
    if out.dtype.kind != "u" or out is not arr:
        return out
    if storage == "bf16":
        return elementwise(floats.bf16_to_float32, arr)
    if ltype in dtypes.FP8_TYPES and storage == "u8":
        return elementwise(lambda a: floats.fp8_to_float(a, ltype), arr)
    return out
