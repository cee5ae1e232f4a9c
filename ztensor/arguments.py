"""What callers pass, taken by one rule each: shapes, dtypes, and the keyword
spellings of the peers whose code must run unchanged (the reference ztensor,
safetensors).  Every public function that takes such an argument goes through here,
so ``Writer.stream(dtype=)`` and ``read_numpy(dtype=)`` agree on what "u8" means."""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Any, Callable, Dict, Tuple, TypeVar, cast

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, UnsupportedError

F = TypeVar("F", bound=Callable[..., Any])


def keyword_aliases(**aliases: str) -> Callable[[F], F]:
    """Decorator: the function also takes each keyword of ``aliases`` as the
    parameter it names, so code written against a peer runs unchanged where the peer
    spells a parameter otherwise (the reference's ``Writer.add(name=, data=)``,
    ``Reader(path=)``, ``remove_tensors(input=, output=)``; safetensors'
    ``save_file(tensor_dict=)``).  The one rule for every such spelling: giving a
    parameter and its alias together is a TypeError naming both, never one silently
    dropped.  ``inspect.signature`` shows the function's own names."""

    def decorate(function: F) -> F:
        params = list(inspect.signature(function).parameters)
        pairs = tuple(aliases.items())

        # kept lean: Writer.add and write_numpy go through here once per tensor
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs:
                for alias, param in pairs:
                    if alias not in kwargs:
                        continue
                    if param in kwargs or params.index(param) < len(args):
                        raise TypeError(
                            f"{function.__qualname__}() got {param!r} and its alias "
                            f"{alias!r}: pass one of them"
                        )
                    kwargs[param] = kwargs.pop(alias)
            return function(*args, **kwargs)

        return cast(F, call)

    return decorate


# The spec's type names that numpy also reads, as another type: "u8" is numpy's
# uint64 (its digits count bytes) and the spec's uint8 (they count bits).  Taking
# either reading silently gave arrays of the wrong width (read_numpy(dtype="u8")).
# Spec name -> (numpy's dtype for the spelling, the spec's), from the dtype table.
def _ambiguous_spellings() -> Dict[str, Tuple[np.dtype, np.dtype]]:
    found = {}
    for row in dtypes.ROWS:
        if row.bits:  # bf16, FP8: no numpy spelling
            continue
        try:
            numpy_reading = np.dtype(row.spec)
        except TypeError:
            continue
        spec_reading = np.dtype(row.numpy)
        # by kind and width: the table's dtypes are little-endian, numpy's names
        # native, so on a big-endian host "complex64" differed only in byte order
        kinds = [(d.kind, d.itemsize) for d in (numpy_reading, spec_reading)]
        if kinds[0] != kinds[1]:
            found[row.spec] = (numpy_reading, spec_reading)
    return found


AMBIGUOUS_DTYPE_NAMES = _ambiguous_spellings()
# ml_dtypes' names ("bfloat16", "float8_e4m3fn") -> spec type: numpy knows them only
# once ml_dtypes is imported, so they are looked up here, never left to np.dtype
_ML_DTYPE_NAMES = {ml: spec_name for spec_name, ml in dtypes.ML_NAMES.items()}


def _spec_type_dtype(spec_name: str) -> np.dtype:
    """The numpy dtype of a spec type's values (native byte order); bf16 and FP8 are
    ml_dtypes' types, an UnsupportedError (a ValueError) without ml_dtypes."""
    row = dtypes.BY_SPEC[spec_name]
    if row.bits:
        found = dtypes.ml_dtype(row.ml_dtypes)
        if found is None:
            raise UnsupportedError(
                f"dtype {spec_name!r} needs the ml_dtypes package (numpy has no "
                f"{row.ml_dtypes} type of its own): pip install ml_dtypes"
            )
        return found
    return np.dtype(row.numpy).newbyteorder("=")


def caller_dtype(dtype: Any) -> np.dtype:
    """A dtype a caller gives (``Reader.read_numpy(dtype=)``, ``Tensor(dtype=)``) as
    a numpy dtype: the one rule every path that takes a dtype from a caller applies.

    Taken: numpy dtypes and scalar types (``np.float32``, ``float``), torch dtypes
    (by the dtype table's torch names; torch is not imported), numpy's names
    (``"float32"``, ``"<f4"``), ml_dtypes' names (``"bfloat16"``) and the spec's
    type names (``"f32"``, ``"bf16"``, ``"f8_e4m3fn"``, ``"complex64"``).  The spec
    names numpy reads as another type (:data:`AMBIGUOUS_DTYPE_NAMES`: ``"i8"``,
    ``"u8"``, ``"f16"``) are a ValueError naming both readings and the unambiguous
    spellings.  An unknown name is a ValueError, anything else a TypeError (None
    too: numpy would read it as float64)."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str):
        return _dtype_named(dtype)
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        name = str(dtype).replace("torch.", "", 1)
        kind = dtypes.TORCH_KINDS.get(name)
        if kind is None:
            raise ValueError(f"dtype {dtype} has no zTensor type (docs/dtypes.md)")
        numpy_code, spec_type = kind
        return _spec_type_dtype(spec_type) if spec_type else np.dtype(numpy_code)
    if dtype is None or isinstance(dtype, (bytes, bool, int, float)):
        raise TypeError(
            f"dtype must be a numpy dtype, a torch dtype or a dtype's name, not {dtype!r}"
        )
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(
            "dtype must be a numpy dtype, a torch dtype or a dtype's name, not "
            f"{type(dtype).__name__}"
        ) from None


def _dtype_named(name: str) -> np.dtype:
    if name in AMBIGUOUS_DTYPE_NAMES:
        numpy_reading, spec_reading = AMBIGUOUS_DTYPE_NAMES[name]
        raise ValueError(
            f"dtype {name!r} is ambiguous: numpy reads it as {numpy_reading.name} "
            f"({numpy_reading.itemsize} bytes), the zTensor spec as {spec_reading.name}; "
            f"write {numpy_reading.name!r} or {spec_reading.name!r}"
        )
    spec_name = dtypes.TYPE_ALIASES.get(name, name)
    spec_name = _ML_DTYPE_NAMES.get(spec_name, spec_name)
    if spec_name in dtypes.BY_SPEC:
        return _spec_type_dtype(spec_name)
    try:
        return np.dtype(name)
    except TypeError:
        raise ValueError(
            f"dtype {name!r} is neither a numpy dtype name ('float32') nor a zTensor "
            "type name ('f32', 'bf16', 'f8_e4m3fn')"
        ) from None


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
