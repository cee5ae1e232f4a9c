"""v0.1 sparse tensors: one blob holding every part (conventions.md).

* ``sparsecsr``: ``indptr`` (rows+1 u64 LE), ``indices`` (nnz u64 LE), ``values`` (nnz)
* ``sparsecoo``: nnz records, each ``ndim`` u64 LE coordinates then one value

nnz follows from the blob size and the shape, so the split is checked at open;
the parts are cut out when the object is read, and returned as v1.2 sparse
components (COO coordinates re-laid out as structure-of-arrays).
"""
from __future__ import annotations

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, UnsupportedError

LAYOUTS = {"sparsecsr": "sparse_csr", "sparsecoo": "sparse_coo"}


def split_v01_sparse(name, obj, layout, path):
    """Turn a lifted v0.1 sparse entry into a v1.2-style object whose one component
    ``data`` is the whole blob (as bytes); remember the value dtype and layout."""
    from ztensor.manifest import LEGACY

    if layout not in LAYOUTS:
        raise UnsupportedError(f"unknown v0.1 layout {str(layout)[:40]!r}", path=path, obj=name)
    data = obj["components"]["data"]
    obj["format"] = LAYOUTS[layout]
    obj[LEGACY] = (layout, data["dtype"])
    obj["attributes"]["legacy_value_dtype"] = data["dtype"]
    data["dtype"] = "u8"


def _nnz(layout, shape, itemsize, size, **where):
    if layout == "sparsecsr":
        if len(shape) != 2:
            raise FormatError(f"v0.1 CSR needs a 2-D shape, got {list(shape)}", **where)
        head = (shape[0] + 1) * 8
        nnz, rest = divmod(size - head, 8 + itemsize) if size >= head else (-1, 0)
    else:
        nnz, rest = divmod(size, len(shape) * 8 + itemsize) if shape else (-1, 0)
    if nnz < 0 or rest:
        raise FormatError(f"v0.1 {layout} blob of {size} bytes does not fit shape "
                          f"{list(shape)}", **where)
    return nnz


def assemble(spec, blob: np.ndarray, **where):
    """Components of a v0.1 sparse object from its decoded blob (uint8 array)."""
    from ztensor.tensor import Tensor

    layout, storage = spec.legacy
    base = dtypes.STORAGE[storage].numpy
    value_dtype = base.newbyteorder(">") if spec.components["data"].byteorder == ">" else base
    u64 = np.dtype("<u8")
    nnz = _nnz(layout, spec.shape, base.itemsize, blob.size, **where)
    if layout == "sparsecsr":
        rows1 = spec.shape[0] + 1
        indptr = blob[:rows1 * 8].view(u64)
        indices = blob[rows1 * 8:(rows1 + nnz) * 8].view(u64)
        values = blob[(rows1 + nnz) * 8:].view(value_dtype)
        if indptr[-1] != nnz:
            raise FormatError(f"v0.1 CSR indptr ends at {indptr[-1]}, blob holds {nnz} values",
                              **where)
        comps = {"values": values, "indices": indices, "indptr": indptr}
    else:
        ndim = len(spec.shape)
        record = np.dtype({"names": ["coords", "value"], "formats": [(u64, (ndim,)), value_dtype],
                           "offsets": [0, ndim * 8], "itemsize": ndim * 8 + base.itemsize})
        recs = blob.view(record)
        comps = {"values": np.ascontiguousarray(recs["value"]),
                 "coords": np.ascontiguousarray(recs["coords"].T).reshape(-1)}
    from ztensor.formats import sparse

    t = Tensor(comps, shape=spec.shape, format=LAYOUTS[layout], attributes=spec.attributes)
    sparse.validate(t, **where)
    return t
