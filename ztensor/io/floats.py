"""Array-level FP8 / bf16 conversions over the kernels (csrc/floatconv.c).

Results match ml_dtypes' ``astype`` bit for bit (round to nearest even, its
overflow and NaN rules); ml_dtypes is not needed.  Inputs may be in any byte order
and layout; outputs are new native arrays.
"""

from __future__ import annotations

import numpy as np

from ztensor import kernels


def _kind(name: str) -> int:
    try:
        return kernels.FP8_KINDS.index(name)
    except ValueError:
        raise ValueError(
            f"unknown FP8 type {name!r}; expected one of {', '.join(kernels.FP8_KINDS)}"
        ) from None


def _native(arr: np.ndarray, dtype) -> np.ndarray:
    return np.asarray(arr, dtype=np.dtype(dtype).newbyteorder("="), order="C")  # 0-d stays 0-d


def fp8_to_float(codes: np.ndarray, fp8_type: str, dtype=np.float32) -> np.ndarray:
    """Decode FP8 codes (uint8) to float32 or float16, keeping the shape."""
    out_type = kernels.FLOAT_CODES.get(np.dtype(dtype))
    if out_type is None:
        raise ValueError(f"FP8 decodes to float32 or float16, not {np.dtype(dtype)}")
    codes = np.asarray(codes, order="C").view(np.uint8)
    out = np.empty(codes.shape, dtype)
    kernels.fp8_decode(codes.reshape(-1), out.reshape(-1).view(np.uint8), _kind(fp8_type), out_type)
    return out


def float_to_fp8(values: np.ndarray, fp8_type: str) -> np.ndarray:
    """Encode float32/float16 values (others go through float32) as FP8 codes."""
    values = np.asarray(values)
    in_dtype = np.float16 if values.dtype == np.float16 else np.float32
    src = _native(values, in_dtype)
    out = np.empty(src.shape, np.uint8)
    kernels.fp8_encode(
        src.reshape(-1).view(np.uint8),
        out.reshape(-1),
        _kind(fp8_type),
        kernels.FLOAT_CODES[np.dtype(in_dtype)],
    )
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Decode bf16 bit patterns (uint16, any byte order) to float32, exactly."""
    src = _native(bits, np.uint16)
    out = np.empty(src.shape, np.float32)
    kernels.bf16_decode(src.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8))
    return out


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Encode float32 values as bf16 bit patterns (uint16), round to nearest even."""
    src = _native(values, np.float32)
    out = np.empty(src.shape, np.uint16)
    kernels.bf16_encode(src.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8))
    return out
