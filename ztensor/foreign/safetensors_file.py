"""``.safetensors``: an 8-byte LE header size, a JSON header, the data; read zero-copy.

The header is parsed here (no safetensors dependency) and every entry is checked:
dtype known, shape of non-negative integers that numpy can make, data_offsets
inside the data section and exactly shape x item size, no two tensors overlapping
(safetensors itself refuses overlaps), no key given twice in any JSON object of
the header (``json`` would keep the last silently), ``__metadata__`` a map of
string to string (:func:`check_metadata`), every key and metadata value valid
Unicode (a lone surrogate, ``"\\ud800"``, has no UTF-8 form: the safetensors
package refuses the file; :func:`ztensor.foreign.names.check_unicode`).  The file
is memory-mapped; tensors are views of it."""

from __future__ import annotations

import math
import os
import struct
from typing import Any, Dict, Optional

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError, UnsupportedError
from ztensor.foreign.base import ForeignFile, eager
from ztensor.foreign.names import check_unicode, json_loads_unique
from ztensor.io.source import Source
from ztensor.objects import shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits, check_file_totals
from ztensor.tensor import Tensor

# the safetensors package reads no larger header (its MAX_HEADER_SIZE): one bound for
# reading and for export.py writing
MAX_HEADER = 100_000_000
METADATA_KEY = "__metadata__"  # the header's one key that is not a tensor


def check_metadata(metadata, path) -> dict:
    """The one rule for a safetensors header's ``__metadata__``: absent or ``null``
    (what safetensors writes for none) is no metadata; otherwise a JSON object whose
    every value is a string, as the format says (a map of string to string) and as
    the safetensors package enforces: it refuses a file whose metadata holds a
    number, a list, an object or null.  Anything else is a FormatError naming the
    file and the first key that breaks the rule."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise FormatError(
            f"safetensors {METADATA_KEY} is {_json_kind(metadata)}, not an object", path=path
        )
    for key, value in metadata.items():
        if type(value) is not str:
            raise FormatError(
                f"safetensors {METADATA_KEY} maps {_shown_key(key)} to {_json_kind(value)}: "
                "its values are strings only (the safetensors package refuses the file)",
                path=path,
            )
        check_unicode(value, path, f"safetensors {METADATA_KEY} value of {_shown_key(key)}")
    return metadata


def _shown_key(key) -> str:
    """A header key as a message shows it: its repr, cut to 80 characters."""
    return repr(key if len(key) <= 80 else key[:77] + "...")


def _json_kind(value) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else kinds.get(type(value), "a number")


class SafetensorsFile(ForeignFile):
    """A ``.safetensors`` file opened for reading.  ``attributes`` is its
    ``__metadata__`` as a dict (empty for none, as every format's attributes);
    ``header_metadata`` keeps what ``safetensors.safe_open(...).metadata()`` tells
    apart: None when the header has no ``__metadata__`` (or ``null``), else the
    dict, an empty one included (``ztensor.safe_open`` reports it so)."""

    def __init__(self, *args: Any, header_metadata: Optional[Dict[str, str]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.header_metadata = header_metadata


def open_file(
    path, limits: Limits = DEFAULT_LIMITS, *, copy_on_write: bool = False, mmap: bool = True
) -> ForeignFile:
    """``copy_on_write``: map the file privately and writably, so the tensors are
    writable views (torch has no read-only tensors) whose writes stay in private
    pages; otherwise the views are read-only."""
    name = os.fspath(path)
    # the one home of bounds checks: every view below is checked
    source = Source(name, copy_on_write=copy_on_write, mmap=mmap)
    try:
        return _parse(source, name, limits)
    except BaseException:
        source.close()
        raise


def _parse(source, name, limits) -> ForeignFile:
    size = source.size
    if size < 8:
        raise FormatError("not a safetensors file: shorter than its 8-byte header size", path=name)
    header_len = struct.unpack("<Q", source.view(0, 8, "header size"))[0]
    # the header is this format's manifest: names, shapes and metadata
    check_file_totals(name, limits, manifest_size=header_len, ceiling=MAX_HEADER)
    if 8 + header_len > size:
        raise FormatError("safetensors header runs past the end of the file", path=name)
    try:
        header = json_loads_unique(bytes(source.view(8, header_len, "header")), name, "header key")
    except FormatError:  # a key given twice (a ValueError too)
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"safetensors header is not JSON: {exc}", path=name) from None
    except RecursionError:  # json nests on the C stack, bounded by the recursion limit
        raise FormatError("safetensors header nests too deeply", path=name) from None
    if not isinstance(header, dict):
        raise FormatError("safetensors header is not a JSON object", path=name)
    declared = header.pop(METADATA_KEY, None)
    metadata = check_metadata(declared, name)
    start, data_len = 8 + header_len, size - 8 - header_len
    check_file_totals(name, limits, len(header))
    parsed = sorted(
        ((k, _entry(name, k, v, data_len, limits)) for k, v in header.items()),
        key=lambda kv: (kv[1][2], kv[1][4]),  # (begin, end): an empty tensor first
    )
    # the safetensors package's rule: the tensors tile the data section, in offset
    # order, with no byte between, before or after them (bytes no tensor owns could
    # hide anything, and other readers refuse such files)
    end = 0
    for key, (_, _, begin, _, stop) in parsed:
        if begin != end:
            raise FormatError(
                f"tensor starts at data byte {begin}, not where the one before it ends "
                f"({end}): {'it overlaps it' if begin < end else 'bytes lie between them'}",
                path=name,
                obj=key,
            )
        end = stop
    if end != data_len:
        raise FormatError(
            f"the tensors end at data byte {end}, and {data_len - end} bytes follow them",
            path=name,
        )
    entries = {}
    for key, (np_dtype, shape, begin, ltype, stop) in parsed:
        raw = source.view(start + begin, stop - begin, "tensor", obj=key)
        arr = np.frombuffer(raw, np_dtype, math.prod(shape)).reshape(shape)
        tensor = Tensor({"data": arr}, shape=shape, types={"data": ltype} if ltype else None)
        entries[key] = eager(key, tensor, start + begin)
    return SafetensorsFile(
        name,
        "safetensors",
        dict(metadata),
        entries,
        closer=source.close,
        header_metadata=None if declared is None else dict(metadata),
    )


def _entry(path, key, info, data_len, limits):
    if not isinstance(info, dict):
        raise FormatError("entry is not an object", path=path, obj=key)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    # a string first: a JSON list or object here is unhashable (a TypeError)
    if type(dtype) is not str or dtype not in dtypes.SAFETENSORS_STORAGE:
        raise UnsupportedError(f"safetensors dtype {dtype!r} is not supported", path=path, obj=key)
    if (
        not isinstance(shape, list)
        or not all(type(d) is int and d >= 0 for d in shape)
        or not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
    ):
        raise FormatError("malformed shape or data_offsets", path=path, obj=key)
    if len(shape) > limits.max_rank:
        raise LimitError(
            f"rank {len(shape)} is above max_rank {limits.max_rank}", path=path, obj=key
        )
    storage, ltype = dtypes.SAFETENSORS_STORAGE[dtype]
    np_dtype = np.dtype(storage)
    problem = (
        f"shape has {len(shape)} dimensions (at most 64)"
        if len(shape) > 64
        else shape_problem(shape, np_dtype.itemsize)
    )
    if problem:
        raise FormatError(problem, path=path, obj=key)
    begin, end = offsets
    if not 0 <= begin <= end <= data_len or end - begin != math.prod(shape) * np_dtype.itemsize:
        raise FormatError(
            f"data_offsets {offsets} do not fit shape {shape} of {dtype} inside "
            f"{data_len} data bytes",
            path=path,
            obj=key,
        )
    return np_dtype, tuple(shape), begin, ltype, end
