"""What the save functions share (ztensor.numpy, ztensor.torch, ztensor.serialize,
ztensor.save_sharded, convert): the one order tensors are written in, the
``metadata`` rule and saving to bytes."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ztensor.errors import ZTensorError


def name_key(name: Any) -> Tuple[int, bytes]:
    """The sort key of the canonical order: a name's UTF-8 bytes, which order names
    as Unicode code points do (and as the manifest orders its ``objects`` map, so
    data offsets rise in manifest order).  A key that is not a string sorts last, in
    its given place among such keys (the sort is stable), and the Writer then refuses
    it with its own error; ``surrogatepass`` lets a lone surrogate reach that error
    too instead of failing here."""
    if isinstance(name, str):
        return (0, name.encode("utf-8", "surrogatepass"))
    return (1, b"")


def canonical_order(mapping: Mapping[Any, Any]) -> List[Tuple[Any, Any]]:
    """The (name, value) pairs of ``mapping`` in the one order every save function
    writes tensors in: by name, in Unicode code point order (docs/format-decisions.md,
    "Canonical order").  So the same tensors give the same bytes whatever order the
    dict was built in: content hashes, dedup stores and reproducible builds get one
    answer.  (safetensors sorts by dtype alignment first because its data is packed
    without padding; every zTensor blob starts at a multiple of 64, so the name alone
    decides here.)  The streaming ``Writer`` keeps call order: this is for the
    functions that are given a whole mapping."""
    return sorted(mapping.items(), key=lambda item: name_key(item[0]))


def canonical_names(names: Iterable[Any]) -> List[Any]:
    """``names`` in the canonical order (:func:`canonical_order` for a bare list)."""
    return sorted(names, key=name_key)


def str_metadata(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    """safetensors' rule: metadata is a dict of str to str (or None)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError("metadata must be a dict of str to str (as in safetensors)")
    return metadata


def to_bytes(save_file: Callable[..., None], tensors: Any, *args: Any, **kwargs: Any) -> bytes:
    """Run ``save_file(tensors, path, ...)`` into a temporary file and return its
    bytes (the Writer writes files: that is what makes it atomic)."""
    fd, path = tempfile.mkstemp(suffix=".zt")
    os.close(fd)
    try:
        with named_as_bytes(path):
            save_file(tensors, path, *args, **kwargs)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


BYTES = "<bytes>"  # how an error names an in-memory file (as Source does)


@contextlib.contextmanager
def named_as_bytes(internal: str):
    """Errors raised inside name the caller's bytes (``<bytes>``), never ``internal``,
    the temporary file they pass through: the caller never saw that name, and it is
    gone when the error arrives."""
    try:
        yield
    except ZTensorError as exc:
        exc.replace_path(internal, BYTES)
        raise
    except (TypeError, ValueError) as exc:
        # the caller's mistakes (a name that is no str) say the path in their text
        if internal not in str(exc):
            raise
        try:
            renamed = type(exc)(str(exc).replace(internal, BYTES))
        except Exception:  # a subclass made with other arguments: as it is
            raise exc from None
        raise renamed from None


def compress_option(compress: Any = None, compression: Any = None) -> Any:
    """The zstd setting of a save function: ``compress=`` (the Writer's spelling) or
    ``compression=`` (the reference implementation 1.2.3's, kept as an alias);
    both given is a TypeError, neither is no compression.  The one rule every
    safetensors-style save function (ztensor.numpy, ztensor.torch) applies."""
    if compress is not None and compression is not None:
        raise TypeError("pass compress= or compression= (its alias), not both")
    chosen = compress if compress is not None else compression
    return False if chosen is None else chosen
