"""Value statistics of tensors: min/max/mean/std, NaN/Inf/zero counts, a histogram.

Checkpoints with NaNs or Infs are a common bug (an overflowing fp16 cast, a diverged
run); ``ztensor stats`` and :func:`tensor_stats` find them without loading a model.
Values are streamed in chunks from the (memory-mapped) file, so memory stays at one
chunk whatever the tensor's size; the histogram takes a second pass over the same
bytes.  A zstd-compressed dense object is decoded a chunk at a time on each pass
(io/components.py read_component_chunks), never whole, under a read's own rules: it
must decode to exactly the size the manifest declares (a FormatError naming the file
and object otherwise), and a Reader opened with ``verify=True`` has its digest
checked on the first pass (a v2 xxh3 digest over decoded bytes is the one case
decoded whole first: the C kernel hashes one buffer).  bf16 and FP8 decode in C, a
chunk at a time; complex values are summarised by magnitude.

Sparse objects are summarised by their stored values and quantized_group and
gguf_blocks objects are dequantized; these are read whole (``reader.read``, then
dequantized), compressed or not, so memory follows their stored values, or for the
quantized formats their dense float32 size: bounded by the reader's limits on
decoded components and by ``max_elements``, checked before anything is
dequantized.

Work follows the elements a file really holds, never the size a view declares:

* an axis along which a view repeats one element (stride 0: ``torch.save`` of
  ``x.expand(...)``, a 1.5 KB file that declares 2**34 elements) is summarised once
  and its counts weighted by the repeat: exact, and instant (:func:`distinct`);
* what is left must hold at most ``max_elements`` elements (default
  :data:`DEFAULT_MAX_ELEMENTS`, 2**32): a view whose strides overlap can still declare
  far more elements than its bytes, and is refused with a ``LimitError`` that names
  the limit and how to raise it (``tensor_stats(max_elements=...)``,
  ``ztensor stats --max-elements N``).

Sums never overflow: values are scaled by a power of two no smaller than the largest
magnitude (exact), so a valid float64 tensor of +-1.7e308 has its figures too.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator, Tuple

import numpy as np

from ztensor import dtypes
from ztensor.container.reader import Reader
from ztensor.errors import LimitError, UnsupportedError
from ztensor.formats import quantized
from ztensor.io import components, floats
from ztensor.io import values as logical
from ztensor.sharded import ShardedReader

_CHUNK = 1 << 20  # elements per pass step
DEFAULT_MAX_ELEMENTS = 1 << 32  # distinct elements one tensor's statistics may walk
MAX_BINS = 1000  # histogram bins (a figure of a distribution, not a copy of it)


def tensor_stats(
    reader: Any, name: str, *, bins: int = 10, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> Dict[str, Any]:
    """Statistics of object ``name`` of an open reader.

    Returns a dict: ``count``, ``nan``, ``posinf``, ``neginf``, ``zeros``, and over the
    finite values ``min``, ``max``, ``mean``, ``std`` (None when there are none) and
    ``histogram`` (``bins`` counts over ``[min, max]``, with its ``edges``); ``of`` says
    what was summarised ("values", "magnitude", "stored values", "dequantized").

    Raises LimitError when the tensor holds more than ``max_elements`` distinct
    elements (elements a stride-0 view repeats count once)."""
    if type(max_elements) is not int or max_elements < 1:
        raise ValueError(f"max_elements must be a positive integer, got {max_elements!r}")
    check_bins(bins)
    count, repeat, passes, storage, ltype, of = _values(reader, name, max_elements)
    nan = posinf = neginf = zeros = finite = 0
    lo, hi = math.inf, -math.inf
    for part in _floats(passes(True), storage, ltype):
        isnan = np.isnan(part)
        isinf = np.isinf(part)
        nan += int(isnan.sum())
        posinf += int((isinf & (part > 0)).sum())
        neginf += int((isinf & (part < 0)).sum())
        zeros += int((part == 0).sum())
        good = part[~(isnan | isinf)]
        if good.size:
            finite += good.size
            lo, hi = min(lo, float(good.min())), max(hi, float(good.max()))
    out = {
        "name": name,
        "of": of,
        "count": count,
        "nan": nan * repeat,
        "posinf": posinf * repeat,
        "neginf": neginf * repeat,
        "zeros": zeros * repeat,
        "min": None,
        "max": None,
        "mean": None,
        "std": None,
        "histogram": [],
        "edges": [],
    }
    if not finite:
        return out
    # a power of two within a factor 2 of the largest magnitude (2**1023 at most, so it
    # is finite): x / scale is exact and in (-2, 2), so no sum below can overflow
    # however large the values
    top = max(abs(lo), abs(hi))
    scale = math.ldexp(1.0, math.frexp(top)[1] - 1) if top else 1.0
    edges = _edges(lo, hi, bins)
    hist = np.zeros(len(edges) - 1, np.int64)
    n, mean, m2 = 0, 0.0, 0.0  # running count, mean, sum of squared deviations (scaled)
    for part in _floats(passes(False), storage, ltype):  # second pass: spread, histogram
        good = part[np.isfinite(part)]
        if not good.size:
            continue
        scaled = good / scale
        k = good.size
        part_mean = float(scaled.mean())
        np.subtract(scaled, part_mean, out=scaled)  # in place: one chunk of scratch
        part_m2 = float(np.square(scaled, out=scaled).sum())
        delta = part_mean - mean
        total = n + k
        mean += delta * k / total  # Chan et al.'s pairwise combination
        m2 += part_m2 + delta * delta * n * k / total
        n = total
        hist += np.histogram(good, edges)[0]
    out.update(
        min=lo,
        max=hi,
        mean=mean * scale,
        std=math.sqrt(m2 / n) * scale,
        histogram=(hist * repeat).tolist(),
        edges=edges.tolist(),
    )
    return out


def check_bins(bins) -> int:
    """``bins`` if it is a whole number from 1 to :data:`MAX_BINS`, else ValueError
    (0 or a negative count gave numpy's bare errors or an empty histogram, 10**12 a
    7 TiB allocation).  The one home of the rule: ``ztensor stats --bins`` too."""
    if type(bins) is not int or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be a whole number from 1 to {MAX_BINS}, got {bins!r}")
    return bins


def _too_many(size, limit, reader, name):
    return LimitError(
        f"{size} elements to summarise, more than the limit of {limit}: raise "
        "it with --max-elements N (tensor_stats(..., max_elements=N))",
        path=getattr(reader, "path", None),
        obj=name,
    )


def _edges(lo, hi, bins):
    """``bins + 1`` histogram edges over [lo, hi] (numpy's linspace, which the figures
    are compared with), computed without overflow when hi - lo exceeds float64."""
    if not hi > lo:
        return np.array([lo, lo + 1.0])
    if math.isfinite(hi - lo):
        return np.linspace(lo, hi, bins + 1)
    t = np.arange(bins + 1) / bins
    edges = np.maximum.accumulate(lo * (1 - t) + hi * t)  # each term is finite
    edges[0], edges[-1] = lo, hi
    return edges


def distinct(arr: np.ndarray) -> Tuple[np.ndarray, int]:
    """(the array without its repeating axes, how many times each element repeats).
    An axis of stride 0 holds one element over and over (numpy's broadcast_to, torch's
    expand): keeping one index of it loses nothing a count-weighted summary needs."""
    arr = np.asarray(arr)
    once = logical.distinct(arr)  # the one home of the rule (io/values.py)
    return (arr, 1) if once is arr else (once, arr.size // once.size)


def chunks(arr: np.ndarray, n: int = _CHUNK) -> Iterator[np.ndarray]:
    """C-order, contiguous 1-D pieces of ``arr`` of about ``n`` elements each, without
    ever copying more than a piece (``reshape(-1)`` of a strided view copies it all)."""
    if arr.size == 0:
        return
    if arr.ndim == 0:
        yield arr.reshape(1)
        return
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)
        for start in range(0, flat.size, n):
            yield flat[start : start + n]
        return
    inner = math.prod(arr.shape[1:])
    if inner <= n:
        rows = max(1, n // inner)
        for start in range(0, arr.shape[0], rows):
            yield np.ascontiguousarray(arr[start : start + rows]).reshape(-1)
        return
    for i in range(arr.shape[0]):
        yield from chunks(arr[i], n)


def _floats(pieces, storage, ltype):
    for part in pieces:
        yield _as_float(part, storage, ltype)


# the object formats statistics are taken of (any other: UnsupportedError)
SUMMARISED_FORMATS = ("dense", "sparse_csr", "sparse_coo", "quantized_group", "gguf_blocks")


def _values(reader, name, max_elements):
    """(elements the tensor declares, how often each element walked repeats, passes,
    storage dtype, logical type, what they are).  ``passes(first)`` yields the
    distinct elements as stored, in contiguous 1-D pieces of about ``_CHUNK``; it is
    called once per pass, ``first`` on the first.  Nothing is decoded or copied
    here: views stay views (their declared size costs nothing), and a zstd dense
    object is decoded by its passes, a piece at a time (:func:`_streamed`)."""
    meta = reader.metadata(name)
    if meta.format == "dense":
        comp = meta.components["data"]
        of = "magnitude" if comp.type in ("complex64", "complex128") else "values"
        streamed = _streamed(reader, name, meta, comp, max_elements)
        if streamed is not None:
            return (*streamed, comp.dtype, comp.type, of)
        return (
            *_in_memory(reader.read(name).components["data"], reader, name, max_elements),
            comp.dtype,
            comp.type,
            of,
        )
    if meta.format in ("sparse_csr", "sparse_coo"):
        tensor = reader.read(name)  # the read checks its layout first
        # a v0.1 sparse object is one blob in the manifest: its values' storage type
        # is the one the lifted spec remembers (bf16 bits need decoding without
        # ml_dtypes, which _as_float knows by the storage type)
        comp = meta.components.get("values")
        return (
            *_in_memory(tensor.components["values"], reader, name, max_elements),
            comp.dtype if comp is not None else meta.legacy[1],
            comp.type if comp is not None else None,
            "stored values",
        )
    if meta.format in ("quantized_group", "gguf_blocks"):
        if math.prod(meta.shape) > max_elements:  # before the dense output is made
            raise _too_many(math.prod(meta.shape), max_elements, reader, name)
        dense = quantized.dequantize_read(reader.read(name), reader.path, name, dtype=np.float32)
        return (*_in_memory(dense, reader, name, max_elements), "f32", None, "dequantized")
    raise UnsupportedError(f"no statistics for format {meta.format!r}", path=reader.path, obj=name)


def _in_memory(values, reader, name, max_elements):
    """(count, repeat, passes) over an array: a view of the file, or a read's result."""
    values = np.asarray(values)
    count = values.size
    values, repeat = distinct(values)
    if values.size > max_elements:
        raise _too_many(values.size, max_elements, reader, name)
    return count, repeat, lambda first: chunks(values, _CHUNK)


def _streamed(reader, name, meta, comp, max_elements):
    """(count, 1, passes) decoding a zstd dense object of a zTensor file a piece at a
    time on each pass, or None where it is read otherwise (raw: a view already; other
    formats; a v1.1 part that declares no size, which the read counts against the
    per-file limit).  The decoded length, the digest (first pass, when the Reader
    verifies) and the element rules are the read's own (read_component_chunks,
    values.as_elements)."""
    if isinstance(reader, ShardedReader):
        reader = reader.reader_of(name)
    if not isinstance(reader, Reader) or comp.encoding != "zstd":
        return None
    internals = reader.internals  # the Reader's source, verify and limits (reader.py)
    if internals.source is None or comp.uncompressed_length is None:
        return None
    count = math.prod(meta.shape)
    if count > max_elements:  # before anything is decoded
        raise _too_many(count, max_elements, reader, name)
    where = {"path": reader.path, "obj": name, "component": "data"}
    chunk_bytes = _CHUNK * components.storage_dtype(comp).itemsize
    chunk_bytes *= dtypes.element_ratio(comp.dtype, comp.type)

    def passes(first):
        internals.require_open()
        for piece in components.read_component_chunks(
            internals.source,
            comp,
            verify=internals.verify and first,  # the same stored bytes on the second
            limits=internals.limits,
            chunk_bytes=chunk_bytes,
            **where,
        ):
            yield logical.as_elements(piece, comp.dtype, comp.type, **where)

    return count, 1, passes


def _as_float(part, storage=None, ltype=None):
    """float64 values of one contiguous chunk: complex by magnitude, bf16 and FP8 bit
    patterns (how they read without ml_dtypes, and from foreign files) decoded."""
    if part.dtype.kind == "c":
        with np.errstate(over="ignore"):  # a magnitude beyond float64 is an infinity
            return np.abs(part.astype(np.complex128, copy=False))
    if part.dtype.kind == "u" and storage == "bf16":
        return floats.bf16_to_float32(part).astype(np.float64)
    if part.dtype.kind == "u" and storage == "u8" and ltype in dtypes.FP8_TYPES:
        return floats.fp8_to_float(part, ltype).astype(np.float64)
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


__all__ = [
    "tensor_stats",
    "sparkline",
    "distinct",
    "chunks",
    "check_bins",
    "DEFAULT_MAX_ELEMENTS",
    "MAX_BINS",
]
