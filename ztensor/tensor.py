"""The in-memory form of one zTensor object: shape, format, attributes and named
component arrays.  ``Reader.read`` returns one; ``Writer.write`` takes one."""

from __future__ import annotations

import operator
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ztensor import spec
from ztensor.errors import FormatError


def caller_shape(shape: Any) -> tuple:
    """A shape a caller gives (``Tensor``, ``Writer.stream``, ``Writer.write``,
    ``serialize``) as a tuple of non-negative Python ints: the one rule every path
    that takes a shape from a caller applies.  ``operator.index``, not ``int``, so a
    dimension of 2.5, 2.0 or ``"3"`` (or a shape given as the string ``"12"``) is a
    TypeError, never truncated or parsed into a shape the caller did not give
    (``(0.9, 3)`` was written as ``(0, 3)``); numpy integers are taken.  A bool is a
    TypeError too (``operator.index(True)`` is 1: ``shape=(True,)`` was written as
    ``(1,)``), and a negative dimension a FormatError (a ValueError), which numpy
    would read as "whatever is left"."""
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"a shape is a sequence of integers, not {type(shape).__name__}")
    try:
        dims = list(shape)
    except TypeError:
        raise TypeError(f"a shape is a sequence of integers, not {type(shape).__name__}") from None
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)):
            raise TypeError(f"a shape's dimensions are integers, not a bool ({d!r})")
        d = operator.index(d)
        if d < 0:
            raise FormatError(f"a shape's dimensions are not negative, got {d}")
        out.append(d)
    return tuple(out)


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
            role = spec.PRIMARY_ROLES.get(format, next(iter(self.components), "data"))
            self.types[role] = type

    def numpy(self) -> np.ndarray:
        """The dense array (dense objects only)."""
        if self.format != "dense":
            raise TypeError(f"numpy() needs a dense object, this one is {self.format!r}")
        return self.components["data"]

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
