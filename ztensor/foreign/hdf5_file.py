"""HDF5 (``.h5``/``.hdf5``) through h5py (optional): every numeric dataset, named
by its path with ``/`` turned into ``.`` (``layer1/weight`` -> ``layer1.weight``,
the reference implementation's names, which are also state-dict names).  Datasets are read when
asked for; their shape and dtype come from the file's metadata.  File and dataset
attributes that are plain values become attributes."""
from __future__ import annotations

import math
import os

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError
from ztensor.foreign import Entry, ForeignFile, optional_import
from ztensor.objects import ComponentSpec, ObjectSpec, shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor.tensor import Tensor

MAX_DATASETS = 1_000_000


def open_file(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    h5py = optional_import("h5py", "HDF5", name)
    try:
        handle = h5py.File(name, "r")
    except (OSError, ValueError, RuntimeError) as exc:
        raise FormatError(f"not a readable HDF5 file: {exc}", path=name) from None
    entries = {}
    try:
        found = []
        handle.visititems(lambda key, item: found.append((key, item))
                          if isinstance(item, h5py.Dataset) and len(found) <= MAX_DATASETS
                          else None)
        if len(found) > MAX_DATASETS:
            raise LimitError(f"more than {MAX_DATASETS} datasets", path=name)
        for key, dataset in found:
            spec = _spec(name, key, dataset)
            if spec is not None:
                dotted = key.replace("/", ".")
                spec.name = dotted
                entries[dotted] = Entry(spec, lambda d=dataset, k=dotted: _load(name, k, d))
        attributes = {f"hdf5.{k}": _plain(v) for k, v in handle.attrs.items()
                      if _plain(v) is not None}
    except BaseException:
        handle.close()
        raise
    return ForeignFile(name, "hdf5", attributes, entries, closer=handle.close)


def _spec(path, key, dataset):
    dtype = dataset.dtype
    found = dtypes.spec_types_for(dtype) if dtype.kind in "biufc" else None
    if found is None:
        return None  # strings, compounds, references: not tensors
    shape = tuple(int(d) for d in dataset.shape)
    problem = shape_problem(shape, dtype.itemsize)
    if problem:
        raise FormatError(problem, path=path, obj=key)
    storage, ltype = found
    return ObjectSpec(key, shape, "dense", {}, {"data": ComponentSpec(
        "data", storage, ltype, 0, math.prod(shape) * dtype.itemsize)})


def _load(path, key, dataset):
    try:
        arr = np.asarray(dataset[()])
    except (OSError, ValueError, RuntimeError, TypeError) as exc:
        raise FormatError(f"cannot read dataset: {exc}", path=path, obj=key) from None
    except MemoryError:
        raise LimitError("not enough memory for the dataset", path=path, obj=key) from None
    return Tensor({"data": arr})


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    return None
