"""Value statistics of tensors: min/max/mean/std, NaN/Inf/zero counts, a histogram.

Checkpoints with NaNs or Infs are a common bug (an overflowing fp16 cast, a diverged
run); ``ztensor stats`` and :func:`tensor_stats` find them without loading a model.
Values are streamed in chunks from the (memory-mapped) file, so memory stays at one
chunk whatever the tensor's size; the histogram takes a second pass over the same
bytes.  bf16 and FP8 decode in C; complex values are summarised by magnitude;
sparse objects by their stored values; quantized_group objects are dequantized.
"""
from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np

from ztensor.errors import UnsupportedError

_CHUNK = 1 << 20  # elements per pass step


def tensor_stats(reader: Any, name: str, *, bins: int = 10) -> Dict[str, Any]:
    """Statistics of object ``name`` of an open reader.

    Returns a dict: ``count``, ``nan``, ``posinf``, ``neginf``, ``zeros``, and over the
    finite values ``min``, ``max``, ``mean``, ``std`` (None when there are none) and
    ``histogram`` (``bins`` counts over ``[min, max]``, with its ``edges``); ``of`` says
    what was summarised ("values", "magnitude", "stored values", "dequantized")."""
    values, of = _values(reader, name)
    flat = values.reshape(-1)
    count = flat.size
    nan = posinf = neginf = zeros = finite = 0
    total = 0.0
    lo, hi = math.inf, -math.inf
    for start in range(0, count, _CHUNK):
        part = _as_float(flat[start:start + _CHUNK])
        isnan = np.isnan(part)
        isinf = np.isinf(part)
        nan += int(isnan.sum())
        posinf += int((isinf & (part > 0)).sum())
        neginf += int((isinf & (part < 0)).sum())
        zeros += int((part == 0).sum())
        good = part[~(isnan | isinf)]
        if good.size:
            finite += good.size
            total += float(good.sum())
            lo, hi = min(lo, float(good.min())), max(hi, float(good.max()))
    out = {"name": name, "of": of, "count": count, "nan": nan, "posinf": posinf,
           "neginf": neginf, "zeros": zeros, "min": None, "max": None, "mean": None,
           "std": None, "histogram": [], "edges": []}
    if not finite:
        return out
    mean = total / finite
    squares = 0.0
    edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.array([lo, lo + 1.0])
    hist = np.zeros(len(edges) - 1, np.int64)
    for start in range(0, count, _CHUNK):  # second pass: spread, histogram
        part = _as_float(flat[start:start + _CHUNK])
        good = part[np.isfinite(part)]
        squares += float(np.square(good - mean).sum())
        hist += np.histogram(good, edges)[0]
    out.update(min=lo, max=hi, mean=mean, std=math.sqrt(squares / finite),
               histogram=hist.tolist(), edges=edges.tolist())
    return out


def _values(reader, name):
    meta = reader.metadata(name)
    if meta.format == "dense":
        comp = meta.components["data"]
        if comp.type is not None or comp.dtype == "bf16":
            if comp.type in ("complex64", "complex128"):
                return np.abs(reader.read_numpy(name)), "magnitude"
            return reader.read_numpy(name, dtype=np.float32), "values"  # decoded in C
        values = reader.read_numpy(name)
        return values, "values"
    if meta.format in ("sparse_csr", "sparse_coo"):
        return np.asarray(reader.read(name).components["values"]), "stored values"
    if meta.format == "quantized_group":
        from ztensor.formats import quantized
        return quantized.dequantize(reader.read(name), dtype=np.float32), "dequantized"
    raise UnsupportedError(f"no statistics for format {meta.format!r}", path=reader.path,
                           obj=name)


def _as_float(part):
    if part.dtype.kind == "c":
        return np.abs(part).astype(np.float64)
    if part.dtype.kind == "f" and part.dtype.itemsize >= 4:
        return part.astype(np.float64, copy=False)
    return part.astype(np.float64)


SPARK = " ▁▂▃▄▅▆▇█"


def sparkline(counts) -> str:
    """A histogram as one line of block characters."""
    top = max(counts, default=0)
    if not top:
        return ""
    return "".join(SPARK[0 if not c else 1 + (len(SPARK) - 2) * c // top] for c in counts)


__all__ = ["tensor_stats", "sparkline"]
