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

from ztensor import _contract, kernels
from ztensor.errors import FormatError, UnsupportedError

ROLES = ("blocks",)


def check_entry(checker, name, shape, comps):
    """Nothing beyond the generic checks at open: the block geometry lives in the
    attributes and is checked by :func:`dequantize` before any kernel runs (files
    from other tools may carry types this version does not know)."""


def prepare(fmt, shape, prepared, **where):
    return prepared


def assemble(spec, arrays, **where):
    return arrays


def dequantize(obj: Any, *, dtype: Any = np.float32, threads: Optional[int] = None):
    """The float values of a ``gguf_blocks`` object, in its shape: float32, or float16
    / bfloat16 (converted from the exact float32 values)."""
    from ztensor import batch
    from ztensor.formats.quantized import _output_type

    gtype = obj.attributes.get("ggml_type_id")
    label = obj.attributes.get("ggml_type", gtype)
    if type(gtype) is not int or gtype not in _contract.GGML_BLOCKS:
        raise UnsupportedError(f"ggml type {label!r} cannot be dequantized here (Q4_0, Q4_1, "
                               "Q5_0, Q5_1, Q8_0, Q2_K..Q6_K can); it is kept as raw blocks")
    elements, nbytes = _contract.GGML_BLOCKS[gtype]
    blocks = np.asarray(obj.components.get("blocks"))
    if blocks.dtype != np.uint8:
        raise FormatError(f"gguf_blocks needs u8 'blocks', got {blocks.dtype}")
    blocks = blocks.reshape(-1)
    count = math.prod(obj.shape)
    if count % elements or blocks.size != count // elements * nbytes:
        raise FormatError(f"{blocks.size} bytes of {label} blocks do not hold the "
                          f"{count} elements of shape {list(obj.shape)}")
    out = np.empty(count, np.float32)
    nblocks = count // elements
    parts = max(1, min(threads or batch.default_threads(), nblocks // 1024 or 1))
    bounds = [nblocks * i // parts for i in range(parts + 1)]

    def run(i):
        lo, hi = bounds[i], bounds[i + 1]
        kernels.ggml_dequant(gtype, blocks[lo * nbytes:hi * nbytes],
                             out[lo * elements:hi * elements].view(np.uint8))
    batch.each(run, range(parts), parts)
    out = out.reshape(obj.shape)
    code, out_dtype = _output_type(dtype)
    if code == kernels.F32:
        return out
    if code == kernels.F16:
        return out.astype(np.float16)
    from ztensor import floatconv
    bits = floatconv.float32_to_bf16(out)
    return bits.view(out_dtype) if out_dtype != np.uint16 else bits


__all__ = ["dequantize"]
