"""``gguf_blocks``: a GGUF (llama.cpp) quantized tensor, its blocks kept as stored.

``ztensor convert model.gguf out.zt`` keeps quantized tensors lossless: one ``u8``
component ``blocks`` holding the ggml blocks untouched, the tensor's shape, and
attributes ``ggml_type`` (name), ``ggml_type_id``, ``block_elements`` and
``block_bytes``.  :func:`dequantize` decodes the common block types in C
(csrc/ggml_blocks.c: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K..Q6_K),
bit-identical to gguf-py's own dequantization; other types stay raw blocks.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ztensor import kernels
from ztensor._native import contract as _contract
from ztensor.attributes import show
from ztensor.dtypes import GGML_TYPES
from ztensor.errors import FormatError, UnsupportedError
from ztensor.io import floats

ROLES = ("blocks",)


def check_entry(checker, name, shape, comps):
    """Nothing beyond the generic checks at open: the block geometry lives in the
    attributes and is checked by :func:`validate` when the object is read, written
    or dequantized (files from other tools may carry types this version does not
    know)."""


def prepare(fmt, shape, prepared, **where):
    return prepared


def assemble(spec, arrays, **where):
    """Read side: the blocks as stored, once :func:`validate` holds."""
    validate(spec.shape, spec.attributes, arrays, obj=spec.name, **where)
    return arrays


def check_attributes(shape, attributes, **where):
    """THE rule for a gguf_blocks object's attributes (used by :func:`validate`, so by
    every read, ``verify``, the writer and :func:`dequantize`).  Returns the block
    geometry ``(type id, elements, bytes)``.

    FormatError: ``ggml_type_id`` is not an integer in [0, 2**32) (GGUF's field is a
    u32), or ``ggml_type`` (the name, either case) / ``block_elements`` /
    ``block_bytes`` contradict a type this version knows.  UnsupportedError: a type
    this version does not decode (the object is valid and kept as raw blocks; only
    dequantize refuses it)."""
    gtype = attributes.get("ggml_type_id")
    label = attributes.get("ggml_type", gtype)
    if type(gtype) is not int or not 0 <= gtype < 1 << 32:
        raise FormatError(
            f"ggml_type_id must be an integer in [0, 2**32), got {show(gtype)}", **where
        )
    if gtype not in _contract.GGML_BLOCKS:
        raise UnsupportedError(
            f"ggml type {show(label)} cannot be dequantized here (Q4_0, "
            "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K can); it is kept as raw "
            "blocks",
            **where,
        )
    elements, nbytes = _contract.GGML_BLOCKS[gtype]
    type_name = GGML_TYPES[gtype][0]
    # the name is shown to people (ztensor ls) and the id decoded: they must agree
    if "ggml_type" in attributes and (type(label) is not str or label.upper() != type_name):
        raise FormatError(
            f"ggml_type={show(label)} contradicts ggml_type_id={gtype} ({type_name})", **where
        )
    for key, want in (("block_elements", elements), ("block_bytes", nbytes)):
        got = attributes.get(key, want)
        if type(got) is not int or got != want:
            raise FormatError(
                f"{key}={show(got)} contradicts ggml type {show(label)} ({key}={want})", **where
            )
    return gtype, elements, nbytes


def validate(shape, attributes, arrays, types=None, **where):
    """Everything a read refuses in a gguf_blocks object: its attributes, then, for a
    type this version knows, ``blocks`` as u8 holding exactly the shape's blocks, each
    row (the innermost dimension) whole blocks.
    Returns (type id, elements, bytes, flat blocks), or None for a type it does not
    know (kept as stored)."""
    try:
        gtype, elements, nbytes = check_attributes(shape, attributes, **where)
    except UnsupportedError:
        return None
    label = attributes.get("ggml_type", gtype)
    blocks = arrays.get("blocks")
    if blocks is None:
        raise FormatError("gguf_blocks object has no 'blocks' component", **where)
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8:
        raise FormatError(f"gguf_blocks needs u8 'blocks', got {blocks.dtype}", **where)
    blocks = blocks.reshape(-1)
    count = math.prod(shape)
    # ggml stores a tensor row by row, each row whole blocks (gguf-py and llama.cpp
    # refuse an innermost dimension that is not): a block that straddles two rows
    # has no meaning, even when the total count happens to divide.
    if shape and shape[-1] % elements:
        raise FormatError(
            f"the innermost dimension {shape[-1]} of shape {list(shape)} is not whole "
            f"{show(label)} blocks of {elements} elements",
            **where,
        )
    if count % elements or blocks.size != count // elements * nbytes:
        raise FormatError(
            f"{blocks.size} bytes of {show(label)} blocks do not hold the "
            f"{count} elements of shape {list(shape)}",
            **where,
        )
    return gtype, elements, nbytes, blocks


def dequantize(obj: Any, *, dtype: Any = np.float32, threads: Optional[int] = None):
    """The float values of a ``gguf_blocks`` object, in its shape: float32, or float16
    / bfloat16 (converted from the exact float32 values)."""

    check_attributes(obj.shape, obj.attributes)  # UnsupportedError for unknown types
    gtype, elements, nbytes, blocks = validate(obj.shape, obj.attributes, obj.components)
    count = math.prod(obj.shape)
    out = np.empty(count, np.float32)
    nblocks = count // elements
    parts = max(1, min(threads or kernels.cpu_threads(), nblocks // 1024 or 1))
    bounds = [nblocks * i // parts for i in range(parts + 1)]

    def run(i):
        lo, hi = bounds[i], bounds[i + 1]
        kernels.ggml_dequant(
            gtype,
            blocks[lo * nbytes : hi * nbytes],
            out[lo * elements : hi * elements].view(np.uint8),
        )

    kernels.each(run, range(parts), parts)
    out = out.reshape(obj.shape)
    code, out_dtype = kernels.output_type(dtype)
    if code == kernels.F32:
        return out
    if code == kernels.F16:
        return out.astype(np.float16)
    bits = floats.float32_to_bf16(out)
    return bits.view(out_dtype) if out_dtype != np.uint16 else bits


__all__ = ["dequantize"]
