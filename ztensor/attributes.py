"""Attribute values: the one definition of what a manifest's metadata may hold.

The reader checks decoded attributes with :func:`check` and the writer checks what
it is given with the same function, so a file the writer produces is always a
file the reader accepts.  Plain data only (docs/format-decisions.md, "Manifest
CBOR"):

* ``None``, ``bool``, ``int`` (any size: CBOR bignums), ``float``, ``str`` (valid
  Unicode: no lone surrogates), ``bytes``, CBOR's ``undefined`` and simple values;
* lists (tuples are written as lists) and maps whose keys are strings;
* at most :data:`MAX_DEPTH` levels of nesting below the attributes map itself.

Everything else (datetimes, decimals, fractions, sets, tags, shared references)
is refused: each needs a decoder whose cost is not bounded by the bytes it reads.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, Optional

import cbor2

from ztensor.errors import FormatError

MAX_DEPTH = 64

_SCALARS = (type(None), bool, int, float, bytes)
_CBOR_SPECIALS = tuple(
    t
    for t in (type(getattr(cbor2, "undefined", None)), getattr(cbor2, "CBORSimpleValue", None))
    if t is not None and t is not type(None)
)


def check_map(value: Any, what: str, *, writing: bool = False, **where: Any) -> Dict[str, Any]:
    """``value`` if it is a valid attributes map, else FormatError naming ``what``.
    ``writing``: the map is about to be written, so it must also read back as
    given (a NaN other than the quiet NaN would not: :func:`_check_nan`)."""
    if not isinstance(value, dict):
        raise FormatError(
            f"{what} must be a map with string keys, got {type(value).__name__}", **where
        )
    _check(value, 0, what, where, writing)
    return value


def check_optional_map(value: Optional[Any], what: str, **where: Any) -> Dict[str, Any]:
    return {} if value is None else check_map(value, what, **where)


def _check(value, depth, what, where, writing=False):
    # iterative over siblings, recursive over depth (bounded by MAX_DEPTH)
    if isinstance(value, str):
        _check_text(value, what, where)
    elif writing and isinstance(value, float) and value != value:
        _check_nan(value, what, where)
    elif isinstance(value, _SCALARS) or isinstance(value, _CBOR_SPECIALS):
        return
    elif isinstance(value, dict):
        if depth > MAX_DEPTH:
            raise FormatError(f"{what} nest deeper than {MAX_DEPTH} levels", **where)
        subclassed = False
        for k, v in value.items():
            if not isinstance(k, str):
                raise FormatError(
                    f"{what}: only string keys are allowed, got {type(k).__name__}", **where
                )
            subclassed = subclassed or type(k) is not str
            _check_text(k, what, where)
            _check(v, depth + 1, what, where, writing)
        # a str subclass may hash apart from its text: two keys of one text, which
        # the manifest cannot hold (the reader refused the whole file)
        if subclassed and len({str.__str__(k) for k in value}) != len(value):
            raise FormatError(f"{what}: a key is given twice", **where)
    elif isinstance(value, (list, tuple)):
        if depth > MAX_DEPTH:
            raise FormatError(f"{what} nest deeper than {MAX_DEPTH} levels", **where)
        for v in value:
            _check(v, depth + 1, what, where, writing)
    else:
        kind = type(value).__name__
        if type(value).__module__ == "numpy":
            # numpy.bool is no bool (its float and str are subclasses, taken)
            kind = f"numpy.{kind} (give its Python value: bool(x), int(x))"
        raise FormatError(
            f"{what}: {kind} values cannot be stored (plain "
            "data only: None, bool, int, float, str, bytes, lists, maps)",
            **where,
        )


# the one NaN a written manifest holds: canonical CBOR writes every NaN as f9 7e00
_QUIET_NAN = struct.pack("<d", float("nan"))


def _check_nan(value, what, where):
    """A NaN attribute to write is the quiet NaN: canonical CBOR stores every NaN as
    that one value, so a sign or payload (``-nan``, a signalling NaN) would read
    back as another float than the one written.  (Files are read as they are.)"""
    if struct.pack("<d", value) != _QUIET_NAN:
        bits = struct.pack(">d", value).hex()
        raise FormatError(
            f"{what}: a NaN with a sign or payload (bits {bits}) cannot be stored: "
            "every NaN reads back as float('nan')",
            **where,
        )


def _check_text(text, what, where):
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError(
                f"{what}: a string that is not valid Unicode (lone surrogate)", **where
            ) from None


def caller_name(name: Any, what: str, path: Any) -> str:
    """A name a caller gives to be written (``Writer``, ``save_sharded``): one that
    is no str is a TypeError, as in the reference and safetensors (a caller's
    mistake, not a malformed file, which :func:`check_name` refuses with a
    FormatError); then :func:`check_name`."""
    if not isinstance(name, str):
        raise TypeError(f"{path}: {what} are strings, not {type(name).__name__} ({show(name)})")
    return check_name(name, what, path=path)


def check_name(name: Any, what: str, **where: Any) -> str:
    """An object or component name: a non-empty string of valid Unicode, returned
    as a plain str (a subclass may hash apart from its text, and a duplicate name
    then passed every ``in`` check: the reader refused the whole file)."""
    if not isinstance(name, str) or not name:
        raise FormatError(f"{what} must be non-empty strings, got {show(name)}", **where)
    _check_text(name, what, where)
    return name if type(name) is str else str.__str__(name)


def show(value: Any) -> str:
    """repr() for messages, safe on hostile values: Python refuses to print integers
    of over 4300 digits, and a long string would drown the message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (list, dict, tuple)):
        return type(value).__name__
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__, or an int past the digit limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."
