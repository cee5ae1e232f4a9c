"""Dask arrays over zTensor tensors: ``ztensor.dask.from_zt(path_or_url, name)``.

For tensors larger than one machine, or work spread over a cluster: the array is
chunked along its first axis and each chunk is read where it is computed, as the
rows it covers (``safe_open(...).get_slice(name)[r0:r1]``): a view of the mapping on
a local file, one range request on a URL.  Nothing is read until dask computes; the
graph holds only the path and the row ranges, so it pickles to worker processes.
Needs ``pip install dask`` (and ``distributed`` for a cluster).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Dict, Optional

import numpy as np

_DEFAULT_CHUNK_BYTES = 64 << 20


def from_zt(source: Any, name: str, *, chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
            rows: Optional[int] = None):
    """A lazily read ``dask.array.Array`` over dense object ``name`` of ``source``
    (a path or an fsspec URL).  Chunks span ``rows`` rows of the first axis (default:
    about ``chunk_bytes`` each) and the whole of the other axes."""
    import dask.array as da

    source = os.fspath(source)
    from ztensor.safe import safe_open
    with safe_open(source, framework="np") as f:
        piece = f.get_slice(name)
        shape = tuple(piece.get_shape())
        dtype = _dtype_of(f._reader.metadata(name))
    if not shape:
        return da.from_delayed(_delayed_scalar(source, name), shape=(), dtype=dtype)
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)
    step = rows if rows is not None else max(1, chunk_bytes // row_bytes)
    if step < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    starts = list(range(0, shape[0], step)) or [0]
    chunks = (tuple(min(step, shape[0] - s) for s in starts) if shape[0] else (0,),) + \
        tuple((d,) for d in shape[1:])
    # (map_blocks keeps name= for the graph key: the tensor's name travels as tensor=)
    return da.map_blocks(_read_rows, dtype=dtype, chunks=chunks, source=source, tensor=name,
                         meta=np.empty((0,) * len(shape), dtype))


def from_zt_all(source: Any, **kwargs: Any) -> Dict[str, Any]:
    """name -> dask array for every dense object of ``source``."""
    from ztensor.reader import Reader
    with Reader(os.fspath(source)) as r:
        names = [n for n in r.keys() if r.metadata(n).format == "dense"]
    return {n: from_zt(source, n, **kwargs) for n in names}


def _dtype_of(meta) -> np.dtype:
    from ztensor import components, logical
    comp = meta.components["data"]
    empty = np.empty(0, components.storage_dtype(comp))
    return logical.as_values(empty, comp.dtype, comp.type).dtype


@functools.lru_cache(maxsize=16)
def _open(source):
    """One handle per file per worker process, reused by every chunk it computes."""
    from ztensor.safe import safe_open
    return safe_open(source, framework="np")


def _read_rows(block_info=None, *, source, tensor):
    r0, r1 = block_info[None]["array-location"][0]
    return _open(source).get_slice(tensor)[r0:r1]


def _delayed_scalar(source, name):
    import dask
    return dask.delayed(lambda: _open(source).get_tensor(name))()


__all__ = ["from_zt", "from_zt_all"]
