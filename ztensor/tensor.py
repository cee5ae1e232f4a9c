"""The in-memory form of one zTensor object: shape, format, attributes and named
component arrays.  ``Reader.read`` returns one; ``Writer.write`` takes one."""

from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ztensor import dtypes
from ztensor.arguments import caller_dtype, caller_shape
from ztensor.errors import UnsupportedError
from ztensor.objects import primary_role, reference_dtype_name


def refuse_masked(array: Any, name: Any) -> Any:
    """``array``, unless it is a numpy masked array: ``np.asarray`` drops the mask,
    and the values it hides would be written as data.  A tensor file has no place
    for a mask (write ``array.filled(value)``, and the mask as a tensor of its own)."""
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(
            f"{name!r}: a masked array has no place for its mask in a tensor file; "
            "write array.filled(value) (and the mask as a tensor of its own)"
        )
    return array


class Tensor:
    """A composite tensor object.

    Parameters
    ----------
    components : dict of str to numpy.ndarray
        Role name -> array (``{"data": a}`` for dense; ``values``/``indices``/``indptr``
        for sparse_csr; ``packed_weight``/``scales``/``zeros`` for quantized_group).
    shape : sequence of int, optional
        Logical shape; for a dense object it defaults to the shape of ``data``.
    format : str
        ``"dense"``, ``"sparse_csr"``, ``"sparse_coo"``, ``"quantized_group"`` or any
        other name (readers keep unknown formats as plain components).
    attributes : dict, optional
        Per-object metadata (CBOR-encodable values).
    types : dict of str to str, optional
        Logical type per component where the array's dtype does not say it
        (e.g. ``{"data": "f8_e4m3fn"}`` for uint8 codes).  ml_dtypes bf16/FP8 arrays
        and complex arrays carry their type themselves.
    type : str, optional
        Shorthand for the primary component's logical type (``data`` for dense,
        ``values`` for sparse), as the reference implementation's ``Tensor`` takes it.
    dtype : numpy dtype, torch dtype or name, optional
        The primary component's element type, as the reference's ``Tensor`` takes it
        (any spelling :func:`caller_dtype` takes).  A declaration, checked: it must be
        the type that component holds (its storage type or its logical type), else a
        ValueError; the reference kept it as given and wrote the array's own dtype.

    Notes
    -----
    Components read from a file hold the stored elements exactly: complex types as
    numpy complex, bf16/FP8 as ml_dtypes arrays when ml_dtypes is installed, else as
    their uint16/uint8 bit patterns with the type kept in :attr:`types`.  Writing such
    a Tensor back reproduces the same bytes.
    """

    __slots__ = ("components", "shape", "format", "attributes", "types")

    def __init__(
        self,
        components: Dict[str, Any],
        *,
        shape: Optional[Sequence[int]] = None,
        format: str = "dense",
        attributes: Optional[Dict[str, Any]] = None,
        types: Optional[Dict[str, str]] = None,
        type: Optional[str] = None,
        dtype: Any = None,
    ) -> None:
        if not isinstance(components, dict):
            raise TypeError("components must be a dict of role name -> array")
        self.components = {role: refuse_masked(array, role) for role, array in components.items()}
        if shape is None:
            if format != "dense" or "data" not in self.components:
                raise ValueError("shape is required unless a dense object has 'data'")
            shape = np.shape(self.components["data"])
        self.shape = caller_shape(shape)
        self.format = format
        self.attributes = dict(attributes) if attributes else {}
        self.types = dict(types) if types else {}
        if type is not None:
            self.types[self.primary_role] = type
        if dtype is not None:
            self._check_declared_dtype(caller_dtype(dtype), dtype)

    def _check_declared_dtype(self, declared: np.dtype, given: Any) -> None:
        role = self.primary_role
        if role not in self.components:
            raise ValueError(f"dtype={given!r} describes the {role!r} component, which is missing")
        wanted = dtypes.spec_types_for(declared)
        held = self.spec_types(role)
        # the storage type alone matches too: it is what .dtype reports (FP8 codes
        # are "uint8" with type "f8_e4m3fn", as the reference reports them)
        if wanted is None or held is None or wanted not in (held, (held[0], None)):
            raise ValueError(
                f"dtype={given!r} ({declared}), but component {role!r} holds "
                f"{self.dtype if held else np.asarray(self.components[role]).dtype}"
                + (f" of type {held[1]!r}" if held and held[1] else "")
            )

    @property
    def primary_role(self) -> str:
        """The component whose element type :attr:`dtype` and :attr:`type` report:
        ``data`` for dense, ``values`` for sparse, ``packed_weight`` for
        quantized_group (:func:`ztensor.objects.primary_role`, as for ObjectSpec)."""
        return primary_role(self.format, self.components)

    def spec_types(self, role: str) -> Optional[Tuple[str, Optional[str]]]:
        """(storage type, logical type or None) of component ``role`` by the spec's
        names, as the Writer stores it: the array's dtype, with the logical type
        :attr:`types` gives it (``"bf16"`` over uint16 bits is the bf16 storage
        type); None for a dtype zTensor cannot store."""
        found = dtypes.spec_types_for(np.asarray(self.components[role]).dtype)
        if found is None:
            return None
        storage, ltype = found
        ltype = self.types.get(role, ltype)
        return ("bf16", None) if ltype == "bf16" else (storage, ltype)

    @property
    def dtype(self) -> Optional[str]:
        """The primary component's storage type by numpy's name (``"float32"``,
        ``"bfloat16"``; ``"uint8"`` for FP8 codes), as the reference reports it and
        as ``Reader.metadata(name).dtype`` says for the stored object; numpy's name
        for a dtype zTensor cannot store; None without that component."""
        role = self.primary_role
        if role not in self.components:
            return None
        found = self.spec_types(role)
        if found is None:
            return str(np.asarray(self.components[role]).dtype)
        return reference_dtype_name(*found)

    @property
    def storage_dtype(self) -> Optional[str]:
        """The primary component's storage type by the spec's name (``"f32"``), as
        ``ObjectSpec.storage_dtype``."""
        role = self.primary_role
        found = self.spec_types(role) if role in self.components else None
        return None if found is None else found[0]

    @property
    def type(self) -> Optional[str]:
        """The primary component's logical type (``"f8_e4m3fn"``, ``"complex64"``),
        or None: given by :attr:`types` or carried by the array's dtype."""
        role = self.primary_role
        found = self.spec_types(role) if role in self.components else None
        return None if found is None else found[1]

    def numpy(self) -> np.ndarray:
        """The dense array (dense objects only)."""
        if self.format != "dense":
            raise TypeError(f"numpy() needs a dense object, this one is {self.format!r}")
        return self.components["data"]

    def torch(self, *, device: Any = "cpu") -> Any:
        """The dense array as a ``torch.Tensor`` (a copy) on ``device``, as the
        reference's ``Tensor.torch(device=)``; bf16 and the FP8 types become torch's
        own dtypes, whichever form the array holds them in (ml_dtypes values, or bits
        with :attr:`types`).  Needs torch."""
        torch = importlib.import_module("torch")  # optional: imported on use
        arr = np.asarray(self.numpy())
        native = np.array(arr, dtype=arr.dtype.newbyteorder("="))  # torch's order, owned
        row = dtypes.BY_SPEC.get(self.type or self.storage_dtype or "")
        if row is not None and row.bits:  # numpy has no such type: pass the bits
            target = getattr(torch, row.torch, None)
            if target is None:
                raise UnsupportedError(
                    f"logical type {row.spec!r} has no dtype in this torch ({torch.__version__})"
                )
            bits = native.view(np.int16 if native.dtype.itemsize == 2 else np.uint8)
            t = torch.from_numpy(bits).view(target)
        else:
            t = torch.from_numpy(native)
        return t if device is None or str(device) == "cpu" else t.to(device)

    def to_scipy(self) -> Any:
        """A checked sparse_csr/sparse_coo object as a scipy.sparse array (needs scipy)."""
        # at call time: formats (which holds the sparse rules) imports this module
        from ztensor.formats import sparse

        return sparse.to_scipy(self)

    @classmethod
    def from_scipy(cls, matrix: Any, *, attributes: Optional[Dict[str, Any]] = None) -> "Tensor":
        """A sparse_coo (COO input) or sparse_csr (any other layout) object from a
        scipy.sparse matrix or array."""
        from ztensor.formats import sparse  # at call time, as in to_scipy

        fmt, shape, comps = sparse.from_scipy(matrix)
        return cls(comps, shape=shape, format=fmt, attributes=attributes)

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{k}: {getattr(v, 'dtype', '?')}{list(np.shape(v))}"
            for k, v in self.components.items()
        )
        return f"<ztensor.Tensor format={self.format!r} shape={list(self.shape)} {{{parts}}}>"
