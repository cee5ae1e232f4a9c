"""``sparse_csr`` and ``sparse_coo``: components checked before anyone indexes with them.

* CSR: ``values`` (nnz), ``indices`` (nnz column numbers), ``indptr`` (rows + 1 row
  starts): indptr starts at 0, never decreases, ends at nnz; every index is below the
  number of columns.
* COO: ``values`` (nnz), ``coords`` (ndim * nnz, structure of arrays: all row numbers,
  then all column numbers, ...): every coordinate inside the shape.

Index components are written as ``u64`` (the v1.2 MUST); any integer dtype is read.
With scipy installed, :func:`to_scipy` turns a checked object into a scipy.sparse array.

The one home of the sparse rules: the reader checks what it assembles with
:func:`validate`, the writer prepares index components with :func:`prepare` (which
validates too).  Objects are anything with ``format``, ``shape`` and
``components`` (a :class:`ztensor.Tensor`), so this module needs no Tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, UnsupportedError

FORMATS = ("sparse_csr", "sparse_coo")
ROLES = {"sparse_csr": ("values", "indices", "indptr"), "sparse_coo": ("values", "coords")}
INDEX_ROLES = {"sparse_csr": ("indices", "indptr"), "sparse_coo": ("coords",)}


def check_entry(checker, name, shape, comps):
    """Manifest check at open: nothing beyond the generic checks (any shape whose
    dimensions are below 2**63; the data is checked when read)."""


def prepare(fmt, shape, prepared, **where):
    """Write side: index components become ``u64`` (non-negative integers only),
    then the whole object is validated.  ``prepared``: [(role, array, storage, type)]."""
    out = []
    for role, arr, storage, ltype in prepared:
        if role in INDEX_ROLES[fmt] and storage != "u64":
            if arr.dtype.kind not in "iu" or (arr.size and arr.min() < 0):
                raise FormatError(
                    "sparse index components must hold non-negative integers",
                    component=role,
                    **where,
                )
            arr, storage = arr.astype("<u8"), "u64"
        out.append((role, arr, storage, ltype))
    validate(Parts(fmt, shape, {role: arr for role, arr, _, _ in out}), **where)
    return out


class Parts:
    """What :func:`validate` checks: a sparse object's format, shape and components
    (role -> array), for callers holding arrays rather than a Tensor (:func:`prepare`
    on the write side, the read side here, and legacy.py for v0.1 sparse blobs)."""

    __slots__ = ("format", "shape", "components")

    def __init__(self, fmt, shape, components):
        self.format, self.shape, self.components = fmt, tuple(shape), components


def _index(arr, role, where):
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu":
        raise FormatError(f"{role} must hold integers, not {arr.dtype}", component=role, **where)
    return arr.reshape(-1)


def validate(t: Any, **where: Any) -> None:
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
        raise FormatError(
            f"indptr has {indptr.size} entries, {rows} rows need {rows + 1}",
            component="indptr",
            **where,
        )
    if indices.size != nnz:
        raise FormatError(
            f"indices has {indices.size} entries, values has {nnz}", component="indices", **where
        )
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise FormatError(
            f"indptr must run from 0 to nnz={nnz}, runs from {indptr[0]} to {indptr[-1]}",
            component="indptr",
            **where,
        )
    if (indptr[1:] < indptr[:-1]).any():
        raise FormatError("indptr decreases", component="indptr", **where)
    if nnz and (indices.min() < 0 or indices.max() >= cols):
        raise FormatError(f"indices must lie in [0, {cols})", component="indices", **where)


def _validate_coo(t, nnz, where):
    ndim = len(t.shape)
    if ndim == 0:
        raise FormatError("sparse_coo needs at least one dimension, got shape []", **where)
    coords = _index(t.components["coords"], "coords", where)
    if coords.size != ndim * nnz:
        raise FormatError(
            f"coords has {coords.size} entries, {ndim} dims x {nnz} values need {ndim * nnz}",
            component="coords",
            **where,
        )
    if nnz:
        per_dim = coords.reshape(ndim, nnz)
        for axis, size in enumerate(t.shape):
            column = per_dim[axis]
            if column.min() < 0 or column.max() >= size:
                raise FormatError(
                    f"coords of axis {axis} must lie in [0, {size})", component="coords", **where
                )


def assemble(spec, arrays, **where):
    """Read side: the components, checked."""
    validate(Parts(spec.format, spec.shape, arrays), obj=spec.name, **where)
    return arrays


def from_scipy(matrix: Any):
    """(format, shape, components) of a scipy.sparse matrix or array: sparse_coo for
    COO input, else sparse_csr (CSC and other layouts converted)."""
    if matrix.format == "coo":
        coo = matrix
        coords = np.concatenate([np.asarray(coo.row), np.asarray(coo.col)]).astype("<u8")
        return "sparse_coo", coo.shape, {"values": np.asarray(coo.data), "coords": coords}
    csr = matrix.tocsr()
    return (
        "sparse_csr",
        csr.shape,
        {
            "values": np.asarray(csr.data),
            "indices": np.asarray(csr.indices),
            "indptr": np.asarray(csr.indptr),
        },
    )


def to_scipy(t: Any, **where: Any) -> Any:
    """A checked sparse object as a scipy.sparse array (scipy required).
    UnsupportedError (a ValueError, as scipy's own refusal is) naming ``where``
    (path, obj) when its values are of a type scipy.sparse cannot hold
    (:func:`scipy_values`)."""
    import scipy.sparse

    validate(t, **where)
    values = scipy_values(t, **where)
    # scipy.sparse takes native byte order only; file views are little-endian, which on a
    # big-endian host means a (native) copy
    values = values.astype(values.dtype.newbyteorder("="), copy=False)
    if t.format == "sparse_csr":
        return scipy.sparse.csr_array(
            (values, _as_intp(t.components["indices"]), _as_intp(t.components["indptr"])),
            shape=t.shape,
        )
    ndim = len(t.shape)
    coords = _as_intp(t.components["coords"]).reshape(ndim, -1)
    return scipy.sparse.coo_array((values, tuple(coords)), shape=t.shape)


def scipy_values(t: Any, **where: Any) -> np.ndarray:
    """THE rule for which sparse values have a scipy form: ``values`` unless they
    are f16, bf16 or FP8 (scipy.sparse holds bool, integers, float32/float64 and
    complex only).  Those are an UnsupportedError naming ``where``, never scipy's
    bare ValueError, and never, without ml_dtypes, their bit patterns (uint16 or
    uint8, the type kept in ``t.types``) handed to scipy as if they were values."""
    values = np.asarray(t.components["values"])
    ltype = t.types.get("values") if isinstance(getattr(t, "types", None), dict) else None
    kind, size = values.dtype.kind, values.dtype.itemsize
    if ltype in dtypes.BITS_DTYPES or not (kind in "biuc" or (kind == "f" and size >= 4)):
        raise UnsupportedError(
            f"scipy.sparse cannot hold {ltype or values.dtype} values: read the "
            "object with Reader.read() (its components as arrays)",
            **where,
        )
    return values


def _as_intp(arr):
    return np.asarray(arr).astype(np.intp, copy=False)
