"""``sparse_csr`` and ``sparse_coo``: components checked before anyone indexes with them.

* CSR: ``values`` (nnz), ``indices`` (nnz column numbers), ``indptr`` (rows + 1 row
  starts): indptr starts at 0, never decreases, ends at nnz; every index is below the
  number of columns.
* COO: ``values`` (nnz), ``coords`` (ndim * nnz, structure of arrays: all row numbers,
  then all column numbers, ...): every coordinate inside the shape.

Index components are written as ``u64`` (the v1.2 MUST); any integer dtype is read.
With scipy installed, :func:`to_scipy` turns a checked object into a scipy.sparse array.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ztensor.errors import FormatError
from ztensor.tensor import Tensor

FORMATS = ("sparse_csr", "sparse_coo")
ROLES = {"sparse_csr": ("values", "indices", "indptr"), "sparse_coo": ("values", "coords")}


def _index(arr, role, where):
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu":
        raise FormatError(f"{role} must hold integers, not {arr.dtype}", component=role, **where)
    return arr.reshape(-1)


def validate(t: Tensor, **where: Any) -> None:
    """Raise FormatError unless the sparse object's components fit each other and
    its shape.  ``where`` (path, obj) names the object in the error."""
    missing = [r for r in ROLES[t.format] if r not in t.components]
    if missing:
        raise FormatError(f"{t.format} object lacks {', '.join(missing)}", **where)
    nnz = np.asarray(t.components["values"]).size
    if t.format == "sparse_csr":
        _validate_csr(t, nnz, where)
    else:
        _validate_coo(t, nnz, where)


def _validate_csr(t, nnz, where):
    if len(t.shape) != 2:
        raise FormatError(f"sparse_csr needs a 2-D shape, got {list(t.shape)}", **where)
    rows, cols = t.shape
    indptr = _index(t.components["indptr"], "indptr", where)
    indices = _index(t.components["indices"], "indices", where)
    if indptr.size != rows + 1:
        raise FormatError(f"indptr has {indptr.size} entries, {rows} rows need {rows + 1}",
                          component="indptr", **where)
    if indices.size != nnz:
        raise FormatError(f"indices has {indices.size} entries, values has {nnz}",
                          component="indices", **where)
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise FormatError(f"indptr must run from 0 to nnz={nnz}, runs from {indptr[0]} to "
                          f"{indptr[-1]}", component="indptr", **where)
    if (indptr[1:] < indptr[:-1]).any():
        raise FormatError("indptr decreases", component="indptr", **where)
    if nnz and (indices.min() < 0 or indices.max() >= cols):
        raise FormatError(f"indices must lie in [0, {cols})", component="indices", **where)


def _validate_coo(t, nnz, where):
    ndim = len(t.shape)
    coords = _index(t.components["coords"], "coords", where)
    if coords.size != ndim * nnz:
        raise FormatError(f"coords has {coords.size} entries, {ndim} dims x {nnz} values need "
                          f"{ndim * nnz}", component="coords", **where)
    if nnz:
        per_dim = coords.reshape(ndim, nnz)
        for axis, size in enumerate(t.shape):
            column = per_dim[axis]
            if column.min() < 0 or column.max() >= size:
                raise FormatError(f"coords of axis {axis} must lie in [0, {size})",
                                  component="coords", **where)


def assemble(spec, arrays):
    """Read side: the components, checked."""
    from ztensor.formats import types_of

    t = Tensor(arrays, shape=spec.shape, format=spec.format, attributes=spec.attributes,
               types=types_of(spec))
    validate(t, obj=spec.name)
    return t


def from_scipy(matrix: Any) -> Tensor:
    """A sparse_csr (CSR/CSC/other inputs converted) or sparse_coo (COO input) object
    from a scipy.sparse matrix or array."""
    if matrix.format == "coo":
        coo = matrix
        coords = np.concatenate([np.asarray(coo.row), np.asarray(coo.col)]).astype("<u8")
        return Tensor({"values": np.asarray(coo.data), "coords": coords}, shape=coo.shape,
                      format="sparse_coo")
    csr = matrix.tocsr()
    return Tensor({"values": np.asarray(csr.data), "indices": np.asarray(csr.indices),
                   "indptr": np.asarray(csr.indptr)}, shape=csr.shape, format="sparse_csr")


def to_scipy(t: Tensor) -> Any:
    """A checked sparse object as a scipy.sparse array (scipy required)."""
    import scipy.sparse

    validate(t)
    values = np.asarray(t.components["values"])
    # scipy.sparse takes native byte order only; file views are little-endian, which on a
    # big-endian host means a (native) copy
    values = values.astype(values.dtype.newbyteorder("="), copy=False)
    if t.format == "sparse_csr":
        return scipy.sparse.csr_array(
            (values, _as_intp(t.components["indices"]),
             _as_intp(t.components["indptr"])), shape=t.shape)
    ndim = len(t.shape)
    coords = _as_intp(t.components["coords"]).reshape(ndim, -1)
    return scipy.sparse.coo_array((values, tuple(coords)), shape=t.shape)


def _as_intp(arr):
    return np.asarray(arr).astype(np.intp, copy=False)
