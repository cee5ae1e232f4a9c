"""Spec type names <-> numpy dtypes, with the byte order always explicit.

Storage types (``dtype``) are the spec's 13 fixed primitives; every numpy dtype
here says ``'<'`` because every multi-byte value on disk is little-endian.
Logical types (``type``) give meaning to storage bytes: FP8 in ``u8``, complex as
interleaved float pairs.  bf16 and FP8 have no numpy dtype of their own; when
``ml_dtypes`` is installed they map to its dtypes, otherwise they are decoded to
float32 on read (see docs/dtypes.md).  ``ml_dtypes`` is imported only through
:func:`ml_dtypes_module`.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

HOST_IS_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True)
class StorageType:
    name: str        # spec name, e.g. "f32"
    numpy: np.dtype  # little-endian numpy dtype of the stored elements
    itemsize: int


_STORAGE_NUMPY = {
    "f64": "<f8", "f32": "<f4", "f16": "<f2", "bf16": "<u2",  # bf16: raw bits
    "i64": "<i8", "i32": "<i4", "i16": "<i2", "i8": "i1",
    "u64": "<u8", "u32": "<u4", "u16": "<u2", "u8": "u1",
    "bool": "?",
}
STORAGE = {name: StorageType(name, np.dtype(code), np.dtype(code).itemsize)
           for name, code in _STORAGE_NUMPY.items()}


@dataclass(frozen=True)
class LogicalType:
    name: str
    storage: str     # required storage dtype
    ratio: int       # storage elements per logical element
    ml_name: str = ""  # ml_dtypes attribute, if the numpy dtype lives there


FP8_TYPES = ("f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz")
LOGICAL = {
    "f8_e4m3fn": LogicalType("f8_e4m3fn", "u8", 1, "float8_e4m3fn"),
    "f8_e5m2": LogicalType("f8_e5m2", "u8", 1, "float8_e5m2"),
    "f8_e4m3fnuz": LogicalType("f8_e4m3fnuz", "u8", 1, "float8_e4m3fnuz"),
    "f8_e5m2fnuz": LogicalType("f8_e5m2fnuz", "u8", 1, "float8_e5m2fnuz"),
    "complex64": LogicalType("complex64", "f32", 2),
    "complex128": LogicalType("complex128", "f64", 2),
}

# v1.1 listed these as storage dtypes; they are lifted to (storage, type).
V11_DTYPE_ALIASES = {
    "f8_e4m3": ("u8", "f8_e4m3fn"),
    "f8_e5m2": ("u8", "f8_e5m2"),
    "complex64": ("f32", "complex64"),
    "complex128": ("f64", "complex128"),
}
# v1.1 also used the short name for a logical type; read it as e4m3fn (conventions.md).
TYPE_ALIASES = {"f8_e4m3": "f8_e4m3fn"}

# v0.1 dtype names.
V01_DTYPES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "bool",
}


@functools.lru_cache(maxsize=None)
def ml_dtypes_module():
    """The ml_dtypes module, or None when it is missing or ZTENSOR_NO_ML_DTYPES=1."""
    if os.environ.get("ZTENSOR_NO_ML_DTYPES") == "1":
        return None
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def ml_dtype(ml_name: str):
    """numpy dtype of an ml_dtypes type (e.g. "bfloat16"), or None without ml_dtypes."""
    mod = ml_dtypes_module()
    return None if mod is None else np.dtype(getattr(mod, ml_name))


def element_ratio(storage: str, type_name) -> int:
    """Storage elements per logical element (2 for complex, else 1)."""
    lt = LOGICAL.get(type_name) if type_name else None
    return lt.ratio if lt is not None and lt.storage == storage else 1


def logical_known(storage: str, type_name) -> bool:
    """True when type_name is a logical type we decode for this storage dtype."""
    lt = LOGICAL.get(type_name)
    return lt is not None and lt.storage == storage


# ------------------------------------------------------------------- writing side
_NUMPY_KIND_TO_STORAGE = {
    ("f", 8): "f64", ("f", 4): "f32", ("f", 2): "f16",
    ("i", 8): "i64", ("i", 4): "i32", ("i", 2): "i16", ("i", 1): "i8",
    ("u", 8): "u64", ("u", 4): "u32", ("u", 2): "u16", ("u", 1): "u8",
    ("b", 1): "bool",
}
_COMPLEX = {8: ("f32", "complex64"), 16: ("f64", "complex128")}
_ML_NAMES = {"bfloat16": ("bf16", None), "float8_e4m3fn": ("u8", "f8_e4m3fn"),
             "float8_e5m2": ("u8", "f8_e5m2"), "float8_e4m3fnuz": ("u8", "f8_e4m3fnuz"),
             "float8_e5m2fnuz": ("u8", "f8_e5m2fnuz")}


@functools.lru_cache(maxsize=256)
def spec_types_for(dtype: np.dtype):
    """(storage dtype, logical type or None) for a numpy dtype, or None if unsupported."""
    if dtype.names is not None or dtype.subdtype is not None:
        return None
    if is_ml_dtype(dtype):
        return _ML_NAMES.get(dtype.name)
    if dtype.kind == "c":
        return _COMPLEX.get(dtype.itemsize)
    storage = _NUMPY_KIND_TO_STORAGE.get((dtype.kind, dtype.itemsize))
    return None if storage is None else (storage, None)


def is_ml_dtype(dtype: np.dtype) -> bool:
    """True for ml_dtypes' types (bfloat16, float8_*): they report kind 'V' or 'f'
    and are always in native byte order."""
    return getattr(dtype.type, "__module__", "").startswith("ml_dtypes")


@functools.lru_cache(maxsize=256)
def swap_width(dtype: np.dtype) -> int:
    """Element width to byte-swap when this array's bytes are not little-endian
    (complex swaps each float half), else 0."""
    if dtype.itemsize == 1:
        return 0
    if is_ml_dtype(dtype):  # byteorder '=' always: native
        return 0 if HOST_IS_LITTLE else dtype.itemsize
    if dtype.byteorder == "<" or (dtype.byteorder in "=|" and HOST_IS_LITTLE):
        return 0
    return dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize


# The names the reference implementation (PyPI ztensor 1.2.3) reports as an object's
# dtype, which code written against it compares with: numpy's names, bf16 as
# "bfloat16" (ml_dtypes').  ObjectSpec.dtype uses them; the spec's own names ("f32")
# stay in ObjectSpec.storage_dtype and in every ComponentSpec.dtype (docs/migrating.md).
REFERENCE_NAMES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
    "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool",
}


# safetensors' dtype names <-> zTensor (numpy little-endian storage, logical type);
# the one table for reading .safetensors, writing them, and safe_open's get_dtype().
SAFETENSORS_STORAGE = {
    "F64": ("<f8", None), "F32": ("<f4", None), "F16": ("<f2", None), "BF16": ("<u2", "bf16"),
    "I64": ("<i8", None), "I32": ("<i4", None), "I16": ("<i2", None), "I8": ("i1", None),
    "U64": ("<u8", None), "U32": ("<u4", None), "U16": ("<u2", None), "U8": ("u1", None),
    "BOOL": ("?", None), "F8_E4M3": ("u1", "f8_e4m3fn"), "F8_E5M2": ("u1", "f8_e5m2"),
    "C64": ("<c8", None),
}
# spec dtype (or logical type) -> safetensors' name
SAFETENSORS_NAMES = {
    "f64": "F64", "f32": "F32", "f16": "F16", "bf16": "BF16", "i64": "I64", "i32": "I32",
    "i16": "I16", "i8": "I8", "u64": "U64", "u32": "U32", "u16": "U16", "u8": "U8",
    "bool": "BOOL", "f8_e4m3fn": "F8_E4M3", "f8_e5m2": "F8_E5M2", "complex64": "C64",
    "complex128": "C128", "f8_e4m3fnuz": "F8_E4M3FNUZ", "f8_e5m2fnuz": "F8_E5M2FNUZ",
}
