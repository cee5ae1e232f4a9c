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
class DType:
    """One row of :data:`ROWS`: a spec type and every other name it goes by."""

    spec: str  # the spec's name: a storage dtype ("f32") or a logical type
    storage: str  # the storage dtype that holds it (itself for storage rows)
    numpy: str  # little-endian numpy dtype of one element (bf16/FP8: its bits)
    bits: bool = False  # numpy holds only the bits (bf16, FP8): the spec name says more
    ml_dtypes: str = ""  # ml_dtypes' name, when the element's numpy dtype lives there
    torch: str = ""  # torch's name (torch.<name>)
    safetensors: str = ""  # safetensors' name, reported by safe_open's get_dtype()
    safetensors_file: bool = True  # ztensor reads and writes it in .safetensors files
    # (not C128, which safetensors lacks; the FNUZ names are safetensors 0.8's, which
    # writes and reads them: an older safetensors refuses such a file, as it refuses
    # what 0.8 writes)
    reference: str = ""  # the reference implementation's name (= v0.1's dtype name)
    gguf: int = -1  # GGUF's ggml type id, for the types GGUF stores plainly


# THE dtype table: every other mapping in this module (and the torch, safetensors,
# GGUF, v0.1 and reference name tables elsewhere) is derived from it.  Row order is
# the manifest scanner's vocabulary order (storage rows, then logical rows): do not
# reorder.  The four FP8 rows are in csrc/floatconv.h's zt_fp8_kind order.
ROWS = (
    DType("f64", "f64", "<f8", torch="float64", safetensors="F64", reference="float64", gguf=28),
    DType("f32", "f32", "<f4", torch="float32", safetensors="F32", reference="float32", gguf=0),
    DType("f16", "f16", "<f2", torch="float16", safetensors="F16", reference="float16", gguf=1),
    DType(
        "bf16",
        "bf16",
        "<u2",
        bits=True,
        ml_dtypes="bfloat16",
        torch="bfloat16",
        safetensors="BF16",
        reference="bfloat16",
        gguf=30,
    ),
    DType("i64", "i64", "<i8", torch="int64", safetensors="I64", reference="int64", gguf=27),
    DType("i32", "i32", "<i4", torch="int32", safetensors="I32", reference="int32", gguf=26),
    DType("i16", "i16", "<i2", torch="int16", safetensors="I16", reference="int16", gguf=25),
    DType("i8", "i8", "i1", torch="int8", safetensors="I8", reference="int8", gguf=24),
    DType("u64", "u64", "<u8", torch="uint64", safetensors="U64", reference="uint64"),
    DType("u32", "u32", "<u4", torch="uint32", safetensors="U32", reference="uint32"),
    DType("u16", "u16", "<u2", torch="uint16", safetensors="U16", reference="uint16"),
    DType("u8", "u8", "u1", torch="uint8", safetensors="U8", reference="uint8"),
    DType("bool", "bool", "?", torch="bool", safetensors="BOOL", reference="bool"),
    DType(
        "f8_e4m3fn",
        "u8",
        "u1",
        bits=True,
        ml_dtypes="float8_e4m3fn",
        torch="float8_e4m3fn",
        safetensors="F8_E4M3",
    ),
    DType(
        "f8_e5m2",
        "u8",
        "u1",
        bits=True,
        ml_dtypes="float8_e5m2",
        torch="float8_e5m2",
        safetensors="F8_E5M2",
    ),
    DType(
        "f8_e4m3fnuz",
        "u8",
        "u1",
        bits=True,
        ml_dtypes="float8_e4m3fnuz",
        torch="float8_e4m3fnuz",
        safetensors="F8_E4M3FNUZ",
    ),
    DType(
        "f8_e5m2fnuz",
        "u8",
        "u1",
        bits=True,
        ml_dtypes="float8_e5m2fnuz",
        torch="float8_e5m2fnuz",
        safetensors="F8_E5M2FNUZ",
    ),
    DType("complex64", "f32", "<c8", torch="complex64", safetensors="C64"),
    DType(
        "complex128", "f64", "<c16", torch="complex128", safetensors="C128", safetensors_file=False
    ),
)
BY_SPEC = {row.spec: row for row in ROWS}


@dataclass(frozen=True)
class StorageType:
    name: str  # spec name, e.g. "f32"
    numpy: np.dtype  # little-endian numpy dtype of the stored elements
    itemsize: int


STORAGE = {
    row.spec: StorageType(row.spec, np.dtype(row.numpy), np.dtype(row.numpy).itemsize)
    for row in ROWS
    if row.storage == row.spec
}


@dataclass(frozen=True)
class LogicalType:
    name: str
    storage: str  # required storage dtype
    ratio: int  # storage elements per logical element
    ml_name: str = ""  # ml_dtypes attribute, if the numpy dtype lives there


LOGICAL = {
    row.spec: LogicalType(
        row.spec,
        row.storage,
        np.dtype(row.numpy).itemsize // STORAGE[row.storage].itemsize,
        row.ml_dtypes,
    )
    for row in ROWS
    if row.storage != row.spec
}
FP8_TYPES = tuple(name for name in LOGICAL if name.startswith("f8_"))

# storage types never handed out as a plain view of the file's bytes: bf16 (numpy
# has no such type: ml_dtypes' or its bits, chosen on the way out) and bool (each
# byte must be checked to be 0 or 1).  One rule for every fast path that hands out
# views (formats/dense.view_plan, manifest_table's view table, foreign plain views).
NOT_PLAIN_VIEWS = ("bf16", "bool")

# v1.1 listed these as storage dtypes; they are lifted to (storage, type).
V11_DTYPE_ALIASES = {
    "f8_e4m3": ("u8", "f8_e4m3fn"),
    "f8_e5m2": ("u8", "f8_e5m2"),
    "complex64": ("f32", "complex64"),
    "complex128": ("f64", "complex128"),
}
# v1.1 also used the short name for a logical type; read it as e4m3fn (conventions.md).
TYPE_ALIASES = {"f8_e4m3": "f8_e4m3fn"}

# The names the reference implementation (PyPI ztensor 1.2.3) reports as an object's
# dtype, which code written against it compares with: numpy's names, bf16 as
# "bfloat16" (ml_dtypes').  ObjectSpec.dtype uses them; the spec's own names ("f32")
# stay in ObjectSpec.storage_dtype and in every ComponentSpec.dtype (docs/migrating.md).
REFERENCE_NAMES = {row.spec: row.reference for row in ROWS if row.reference}
# v0.1 dtype names: the same names, read the other way.
V01_DTYPES = {row.reference: row.spec for row in ROWS if row.reference}

# the types numpy holds as its own dtypes (a logical type outside them, bf16, FP8
# or one the table lacks such as f8_e8m0fnu, is bits to numpy)
NUMPY_NATIVE = frozenset(row.spec for row in ROWS if not row.bits)
# spec type (bf16 or FP8) -> ml_dtypes' name for it
ML_NAMES = {row.spec: row.ml_dtypes for row in ROWS if row.ml_dtypes}
# spec type (bf16 or FP8) -> the numpy dtype (native order) whose memory holds its bits
BITS_DTYPES = {row.spec: np.dtype(row.numpy).newbyteorder("=") for row in ROWS if row.bits}


def _foreign_kind(row: DType):
    """(numpy little-endian dtype code, spec type or None): how the other formats'
    readers hold an element: bf16 and FP8 as their bits with the spec type beside
    them, everything else as numpy's own dtype (complex as complex)."""
    return row.numpy, (row.spec if row.bits else None)


# torch's dtype names (without "torch.") -> (numpy storage, logical type)
TORCH_KINDS = {row.torch: _foreign_kind(row) for row in ROWS if row.torch}

# safetensors' dtype names <-> zTensor (numpy little-endian storage, logical type);
# the one table for reading .safetensors, writing them, and safe_open's get_dtype().
SAFETENSORS_STORAGE = {
    row.safetensors: _foreign_kind(row) for row in ROWS if row.safetensors and row.safetensors_file
}
# spec dtype (or logical type) -> safetensors' name
SAFETENSORS_NAMES = {row.spec: row.safetensors for row in ROWS if row.safetensors}
# torch's dtype name -> safetensors' name (a safetensors 0.8 TensorSpec takes the one
# and reports the other)
TORCH_TO_SAFETENSORS = {row.torch: row.safetensors for row in ROWS if row.torch and row.safetensors}
# dtypes safetensors 0.8 names that zTensor has no type for
SAFETENSORS_ONLY = ("float8_e8m0fnu", "float4_e2m1fn_x2", "F8_E8M0", "F4")

# spec type -> numpy dtype code of the types GGUF stores plainly (bf16 as its bits)
GGUF_NUMPY = {row.spec: row.numpy for row in ROWS if row.gguf >= 0}
# ggml type id -> (name, elements per block, bytes per block, numpy dtype or None):
# the plain types from ROWS (GGUF names them as safetensors does), the quantized
# block types below.  gguf.py reads with it, container_v2 maps v2's names to ids,
# and _contract.GGML_BLOCKS is the part of it csrc/ggml_blocks.c decodes.
_GGML_QUANTIZED = {
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    29: ("IQ1_M", 256, 56),
}
GGML_TYPES = dict(
    sorted(
        [
            (row.gguf, (row.safetensors, 1, np.dtype(row.numpy).itemsize, row.numpy))
            for row in ROWS
            if row.gguf >= 0
        ]
        + [(i, (name, per, nbytes, None)) for i, (name, per, nbytes) in _GGML_QUANTIZED.items()]
    )
)


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
# (numpy kind, itemsize) -> storage dtype, for the types numpy holds itself
_NUMPY_KIND_TO_STORAGE = {
    (np.dtype(row.numpy).kind, np.dtype(row.numpy).itemsize): row.spec
    for row in ROWS
    if row.storage == row.spec and not row.bits
}
# complex itemsize -> (storage, logical type)
_COMPLEX = {
    np.dtype(row.numpy).itemsize: (row.storage, row.spec)
    for row in ROWS
    if np.dtype(row.numpy).kind == "c"
}
# ml_dtypes' name -> (storage, logical type or None)
_ML_NAMES = {
    row.ml_dtypes: (row.storage, None if row.storage == row.spec else row.spec)
    for row in ROWS
    if row.ml_dtypes
}


@functools.lru_cache(maxsize=256)  # asked once per tensor when a foreign file opens
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


def _bits_and_meaning(storage: str, ltype):
    # bf16 is a storage dtype in v1.2 and a logical type over uint16 bits elsewhere
    # (torch's bits, an older file's u16 + "bf16"): one spelling for comparing
    return ("u16", "bf16") if storage == "bf16" else (storage, ltype)


def elements_fit(given, given_type, storage: str, ltype, *, codes_declared: bool) -> bool:
    """Whether elements a caller gives may become an object stored as ``storage``
    with logical type ``ltype``: ``given`` is :func:`spec_types_for` of their numpy
    dtype, ``given_type`` the logical type of bit patterns (a torch bf16 or FP8
    tensor's, which arrive as uint16/uint8 bits), else None.  The bits must be the
    object's, and a logical type, when the elements carry one, its own: uint8 codes
    are an FP8 object's codes, but a float8_e5m2 tensor's are not an f8_e4m3fn
    object's (its 1.0 read back as 1.5).  Plain integers are taken as a bf16 or
    FP8 object's codes only where the caller declared codes (``codes_declared``: a
    stream made with a uint dtype and ``type=``); elsewhere ``np.full(4, 2,
    np.uint16)`` could as well mean the value 2, and is refused.  The one rule for
    a stream's chunks and a replaced tensor's data."""
    if given is None:
        return False
    bits, meaning = _bits_and_meaning(*given)
    if given_type is not None:
        meaning = given_type
    want_bits, want_meaning = _bits_and_meaning(storage, ltype)
    coded = want_meaning == "bf16" or want_meaning in FP8_TYPES  # codes are not values
    if meaning is None and coded and not codes_declared:
        return False
    return bits == want_bits and meaning in (None, want_meaning)


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


# logical types a reader decodes (None: the storage type itself); a v2 part whose
# digest covers decoded values and whose type is not here is refused, not reinterpreted
DECODED_TYPES = frozenset({None, "bool", *LOGICAL})
