"""v0.1 (``ZTEN0001``): the one home of the legacy format.

The manifest is a CBOR array of per-tensor maps; :func:`lift_v01` turns it into
v1.2-shaped object entries, so nothing after ``manifest.py`` knows a file was v0.1
except through the internal keys below.

v0.1 sparse tensors are one blob holding every part (conventions.md):

* ``sparsecsr``: ``indptr`` (rows+1 u64 LE), ``indices`` (nnz u64 LE), ``values`` (nnz)
* ``sparsecoo``: nnz records, each ``ndim`` u64 LE coordinates then one value

nnz follows from the blob size and the shape, so the split is checked at open;
the parts are cut out when the object is read, and returned as v1.2 sparse
components (COO coordinates re-laid out as structure-of-arrays).
"""

from __future__ import annotations

import numpy as np

from ztensor import dtypes
from ztensor.attributes import show
from ztensor.errors import FormatError, UnsupportedError
from ztensor.formats import sparse

LAYOUTS = {"sparsecsr": "sparse_csr", "sparsecoo": "sparse_coo"}


class InternalKey:
    """Dict key for facts ztensor adds while lifting legacy entries.  No CBOR value
    decodes to one of these, so a file cannot set them."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<internal {self.name}>"


BYTEORDER = InternalKey("byteorder")  # ">" for v0.1 big-endian blobs
UNALIGNED = InternalKey("unaligned")  # parts of a v0.1 sparse blob
LEGACY = InternalKey("legacy")  # v0.1 sparse layout name

_V01_KNOWN = {
    "name",
    "offset",
    "size",
    "dtype",
    "shape",
    "encoding",
    "layout",
    "data_endianness",
    "checksum",
    "sparse_format",
}


def _kind(value) -> str:
    return "nothing" if value is None else type(value).__name__


def lift_v01(entries, path):
    """v0.1 array of per-tensor maps -> {name: v1.2-shaped object dict}."""
    if type(entries) is not list:
        raise FormatError(f"v0.1 metadata must be a CBOR array, got {_kind(entries)}", path=path)
    objects = {}
    for i, entry in enumerate(entries):
        if type(entry) is not dict:
            raise FormatError(f"v0.1 entry {i} must be a map, got {_kind(entry)}", path=path)
        name = entry.get("name")
        if type(name) is not str or not name:
            raise FormatError(f"v0.1 entry {i}: 'name' must be a non-empty string", path=path)
        if name in objects:
            raise FormatError("duplicate object name", path=path, obj=name)
        dtype = entry.get("dtype")
        storage = dtypes.V01_DTYPES.get(dtype) if type(dtype) is str else None
        if storage is None:
            raise FormatError(f"unknown v0.1 dtype {show(dtype)}", path=path, obj=name)
        order = entry.get("data_endianness", "little")
        if order not in ("little", "big"):
            raise FormatError(
                f"data_endianness must be 'little' or 'big', got {show(order)}", path=path, obj=name
            )
        layout = entry.get("layout", "dense")
        if type(layout) is not str:
            raise FormatError(
                f"v0.1 'layout' must be a string, got {_kind(layout)}", path=path, obj=name
            )
        if layout == "sparse":
            sparse_format = entry.get("sparse_format", "")
            if type(sparse_format) is not str:
                raise FormatError(
                    f"v0.1 'sparse_format' must be a string, got {_kind(sparse_format)}",
                    path=path,
                    obj=name,
                )
            layout = "sparse" + sparse_format[:40]
        data = {
            "dtype": storage,
            "offset": entry.get("offset"),
            "length": entry.get("size"),
            "encoding": entry.get("encoding", "raw"),
            "digest": entry.get("checksum"),
            BYTEORDER: ">" if order == "big" else "<",
        }
        attributes = {k: v for k, v in entry.items() if k not in _V01_KNOWN}
        obj = {
            "shape": entry.get("shape"),
            "format": "dense",
            "attributes": attributes,
            "components": {"data": data},
        }
        if layout != "dense":
            split_v01_sparse(name, obj, layout, path)
        objects[name] = obj
    return objects


def split_v01_sparse(name, obj, layout, path):
    """Turn a lifted v0.1 sparse entry into a v1.2-style object whose one component
    ``data`` is the whole blob (as bytes); remember the value dtype and layout."""
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
        raise FormatError(
            f"v0.1 {layout} blob of {size} bytes does not fit shape {list(shape)}", **where
        )
    return nnz


def assemble(spec, blob: np.ndarray, **where):
    """Components of a v0.1 sparse object (in v1.2 sparse terms, checked) from its
    decoded blob (uint8 array)."""
    layout, storage = spec.legacy
    base = dtypes.STORAGE[storage].numpy
    value_dtype = base.newbyteorder(">") if spec.components["data"].byteorder == ">" else base
    u64 = np.dtype("<u8")
    nnz = _nnz(layout, spec.shape, base.itemsize, blob.size, **where)
    if layout == "sparsecsr":
        rows1 = spec.shape[0] + 1
        indptr = blob[: rows1 * 8].view(u64)
        indices = blob[rows1 * 8 : (rows1 + nnz) * 8].view(u64)
        values = blob[(rows1 + nnz) * 8 :].view(value_dtype)
        if indptr[-1] != nnz:
            raise FormatError(
                f"v0.1 CSR indptr ends at {indptr[-1]}, blob holds {nnz} values", **where
            )
        comps = {"values": values, "indices": indices, "indptr": indptr}
    else:
        ndim = len(spec.shape)
        record = np.dtype(
            {
                "names": ["coords", "value"],
                "formats": [(u64, (ndim,)), value_dtype],
                "offsets": [0, ndim * 8],
                "itemsize": ndim * 8 + base.itemsize,
            }
        )
        recs = blob.view(record)
        comps = {
            "values": np.ascontiguousarray(recs["value"]),
            "coords": np.ascontiguousarray(recs["coords"].T).reshape(-1),
        }
    sparse.validate(sparse.Parts(LAYOUTS[layout], spec.shape, comps), **where)
    return comps
