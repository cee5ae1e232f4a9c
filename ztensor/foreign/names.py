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
        both origins when another item already has it."""
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


def json_loads_unique(text: Any, path: Optional[str], what: str = "key") -> Any:
    """``json.loads(text)``, refusing a key given twice in any object at any level
    (``json.loads`` keeps the last silently, so a tensor, its dtype or its shard
    would be chosen by the order of the text: the safetensors package and Hugging
    Face's index readers disagree on such files).  Errors other than a repeated key
    are json's own (ValueError, RecursionError) for the caller to word.  NaN and
    Infinity, which JSON does not have (Python's reader accepts them; the
    safetensors package and Rust's readers refuse them), are a ValueError too."""

    def unique(pairs):
        found = dict(pairs)
        if len(found) != len(pairs):
            keys = NameTable(path, what)
            for key, _ in pairs:
                keys.claim(key)
        return found

    def not_json(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, object_pairs_hook=unique, parse_constant=not_json)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
