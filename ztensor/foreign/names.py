"""Tensor names from files that are not zTensor: one rule for every reader and exporter.

Other formats reach a tensor by a path (nested dicts and lists in a pickle, HDF5
groups), may repeat a name (GGUF, a JSON header with duplicate keys), or can hold only
some names (``.npz`` members, safetensors' reserved ``__metadata__``).  Each of them
turns its paths into flat names through a :class:`NameTable`, which refuses a second
tensor under a name already taken and names both origins.  Nothing is ever dropped
or silently overwritten: two distinct tensors in the input are two tensors out, or
an error.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional

from ztensor.errors import FormatError


class NameTable:
    """The flat names given so far in one file, and where each came from.

    ``what`` words the error (``"tensor"``, ``"key"``, ``"member"``).
    """

    __slots__ = ("path", "what", "_origins")

    def __init__(self, path: Optional[str], what: str = "tensor") -> None:
        self.path = path
        self.what = what
        self._origins: Dict[str, Any] = {}

    def claim(self, name: str, origin: Any = None) -> str:
        """Take ``name`` for the item found at ``origin`` (its path in the input,
        for the message; the name itself when omitted), or raise FormatError naming
        both origins when another item already has it, or when the name has no
        UTF-8 form (:func:`check_unicode`)."""
        if type(name) is not str:  # ONNX (proto2) gives a name that is not UTF-8 as bytes
            raise FormatError(
                f"{self.what} name {_show(name)} is not text: every format we read "
                "stores its names as UTF-8",
                path=self.path,
                obj=repr(name)[:80],
            )
        check_unicode(name, self.path, f"{self.what} name", obj=name)
        origin = name if origin is None else origin
        first = self._origins.get(name, _FREE)
        if first is not _FREE:
            if first == origin:
                message = f"two {self.what}s named {_show(name)}"
            else:
                message = (
                    f"two {self.what}s would both be named {_show(name)}: "
                    f"{_show(first)} and {_show(origin)}"
                )
            raise FormatError(message, path=self.path, obj=name)
        self._origins[name] = origin
        return name

    def __contains__(self, name: object) -> bool:
        return name in self._origins

    def __len__(self) -> int:
        return len(self._origins)


_FREE = object()


def check_unicode(text: Any, path: Optional[str], what: str, obj: Any = None) -> Any:
    """``text``, or FormatError naming ``path`` (and ``obj``) when it is a string
    with no UTF-8 form: a lone surrogate, which JSON spells ``"\\ud800"`` and
    Python's pickle reads from the bytes ``ED A0 80``.  THE rule for the names (and
    header strings) a foreign file gives: every format we read stores its text as
    UTF-8 (the safetensors package refuses such a header, and neither a .zt file nor
    any format we export can hold such a name), so it is refused when the file is
    opened, not when a conversion reaches it.  Applied by :meth:`NameTable.claim`
    (every foreign reader's tensor names) and :func:`json_loads_unique` (every key
    of a JSON header or index)."""
    if type(text) is str and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError(
                f"{what} {_show(text)} is not valid Unicode (a lone surrogate): it has "
                "no UTF-8 form",
                path=path,
                obj=obj,
            ) from None
    return text


def json_loads_unique(text: Any, path: Optional[str], what: str = "key") -> Any:
    """``json.loads(text)``, refusing a key given twice in any object at any level
    (``json.loads`` keeps the last silently, so a tensor, its dtype or its shard
    would be chosen by the order of the text: the safetensors package and Hugging
    Face's index readers disagree on such files), and a key with no UTF-8 form
    (:func:`check_unicode`).  Bytes must be UTF-8, strictly: ``json.loads`` would
    guess UTF-16 or UTF-32 from the first bytes and pass encoded surrogates
    through, where the safetensors package and Hugging Face's index readers take
    UTF-8 only.  Errors other than these FormatErrors are json's own (ValueError,
    UnicodeDecodeError, RecursionError) for the caller to word.  NaN and
    Infinity, which JSON does not have (Python's reader accepts them; the
    safetensors package and Rust's readers refuse them), are a ValueError too, and
    so is a number beyond a float's range (``1e999``, which Python reads as inf)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")

    def unique(pairs):
        for key, _ in pairs:
            check_unicode(key, path, what)
        found = dict(pairs)
        if len(found) != len(pairs):
            keys = NameTable(path, what)
            for key, _ in pairs:
                keys.claim(key)
        return found

    def not_json(constant):
        raise ValueError(f"{constant} is not JSON")

    def finite(number):
        # 1e999 is JSON, but Python reads it as inf, which a writer then wrote out
        # as Infinity: an index convert made that its own reader refused
        value = float(number)
        if math.isinf(value):
            raise ValueError(f"{number[:40]} is beyond the range of a float")
        return value

    return json.loads(text, object_pairs_hook=unique, parse_constant=not_json, parse_float=finite)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
