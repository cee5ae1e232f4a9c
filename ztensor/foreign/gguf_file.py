"""Read GGUF files (llama.cpp) for ``ztensor convert``.

Layout (little-endian, versions 2 and 3): ``"GGUF"``, u32 version, u64 tensor count,
u64 key/value count, the key/values (string key, u32 value type, value), the tensor
infos (string name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset
into the data section), then the data section at the next multiple of
``general.alignment`` (default 32).

Float and integer tensors become dense objects (shape outermost first, as numpy);
quantized tensors keep their blocks untouched as one ``u8`` component ``blocks`` of
an object with format ``gguf_blocks`` and attributes naming the ggml type and block
geometry.  Key/values become file attributes ``gguf.<key>``, arrays whole (a 32,000-entry
tokenizer vocabulary is a list of 32,000 strings: attribute values are plain data, and
each item takes at least a byte of the file, so the manifest grows with the file), and
their GGUF value types in the attribute ``gguf_value_types`` (``{key: type id}``, arrays
``[9, element type id]``), so ``ztensor convert m.zt m.gguf`` writes them back as they
were (ztensor/foreign/export.py).  A
tensor of a ggml type this module does not know is kept too, as the raw bytes up to the
next tensor (format ``gguf_blocks``, attribute ``ggml_type_id``), with an
:class:`UnknownGGMLTypeWarning`.

Every count, length and offset is checked against the file before use, and the
file is refused (``FormatError``) where llama.cpp and gguf-py refuse it: a key or a
tensor name given twice, ``general.alignment`` that is not a UINT32 power of two,
a tensor offset that is not a multiple of it.  Two tensors whose data overlap are
refused too: a writable view of one (torch) would change the other.  The reader's
:class:`ztensor.Limits` apply: ``max_objects`` to the tensor count, ``max_rank`` to
each tensor's dimensions, ``max_component_size`` to each tensor's bytes.
"""

from __future__ import annotations

import bisect
import math
import os
import struct
import warnings
from typing import Any, Dict, Iterator, Tuple, Union

import numpy as np

from ztensor import dtypes, spec
from ztensor.errors import FormatError, LimitError, UnsupportedError
from ztensor.foreign.names import NameTable
from ztensor.io.source import Source
from ztensor.objects import shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits, check_file_totals
from ztensor.tensor import Tensor

# ggml type id -> (name, elements per block, bytes per block, numpy dtype or None):
# the one table, in dtypes.py (its plain types are rows of the dtype table)
GGML_TYPES = dtypes.GGML_TYPES
# key/value types: id -> struct format of one scalar (strings and arrays apart)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING, ARRAY = 8, 9
# the file attribute holding each key's GGUF value type (ids as above; arrays as
# [9, element type]), so a .gguf written back has the types it was read with
VALUE_TYPES = "gguf_value_types"
MAX_COUNT = 1 << 24  # tensors or key/values in one file
MAX_DIMS = 8
MAX_ARRAY_DEPTH = 8  # arrays of arrays
# items of every key/value array of one file together.  Each becomes a Python object
# when the file is opened (9-11 bytes of memory per byte of a numeric array, more in
# a conversion): 25 million items of one array, 100 MB of file, held 1.1 GB for an
# `ls` that never shows them.  The largest real arrays are a tokenizer's vocabulary,
# scores, types and merges: about 10**6 items in all for a 262,144-token vocabulary.
MAX_ARRAY_ITEMS = 1 << 23
_UINT32 = 4


class UnknownGGMLTypeWarning(UserWarning):
    """A GGUF tensor has a ggml type this version does not know; it is kept as its
    raw bytes (format ``gguf_blocks``).  The message names the file and the tensor."""


_NUMPY_SCALARS = {
    0: "u1",
    1: "i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


class _Cursor:
    """Bounds-checked little-endian reads from the file's bytes."""

    def __init__(self, data, path):
        self.data, self.pos, self.path = data, 0, path
        self.items_left = MAX_ARRAY_ITEMS  # of every array together

    def take(self, n, what):
        if n < 0 or self.pos + n > len(self.data):
            raise FormatError(
                f"GGUF {what} runs past the end of the file (at byte {self.pos}, needs {n})",
                path=self.path,
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        n = self.unpack("<Q", what)
        try:
            return bytes(self.take(n, what)).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"GGUF {what} is not UTF-8", path=self.path) from None

    def value(self, vtype, what, depth=0):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY and depth >= MAX_ARRAY_DEPTH:
            raise FormatError(
                f"GGUF {what}: arrays nested more than {MAX_ARRAY_DEPTH} deep", path=self.path
            )
        if vtype == ARRAY:
            etype, count = self.unpack("<I", what), self.unpack("<Q", what)
            if count > len(self.data) - self.pos:  # every item takes at least a byte
                raise FormatError(f"GGUF {what}: array of {count} items cannot fit", path=self.path)
            self.items_left -= count
            if self.items_left < 0:
                raise LimitError(
                    f"GGUF {what}: the key/value arrays hold more than {MAX_ARRAY_ITEMS} "
                    "items in all (a tokenizer's arrays hold about a million)",
                    path=self.path,
                )
            if etype in _NUMPY_SCALARS:  # numbers: one read, not a loop
                dtype = np.dtype(_NUMPY_SCALARS[etype])
                raw = self.take(count * dtype.itemsize, what)
                return np.frombuffer(raw, dtype).tolist()
            return [self.value(etype, what, depth + 1) for _ in range(count)]
        raise FormatError(f"GGUF {what}: unknown value type {vtype}", path=self.path)


def open_gguf(
    path: Union[str, "os.PathLike[str]"], limits: Limits = DEFAULT_LIMITS, *, mmap: bool = True
) -> Tuple[Dict[str, Any], Iterator[Tuple[str, Tensor]]]:
    """(attributes, iterator of (name, Tensor)) for a GGUF file; ``mmap=False`` reads
    it with ``pread`` (arrays are copies) instead of mapping it."""
    name = os.fspath(path)
    source = Source(name, mmap=mmap)  # the one home of bounds checks
    size = source.size
    data = source.view(0, size, "file")
    cur = _Cursor(data, name)
    if bytes(cur.take(4, "magic")) != spec.MAGIC_GGUF:
        raise FormatError("not a GGUF file (magic)", path=name)
    version = cur.unpack("<I", "version")
    if version not in (2, 3):
        raise UnsupportedError(
            f"GGUF version {version} (little-endian v2 and v3 are read)", path=name
        )
    n_tensors, n_kv = cur.unpack("<Q", "tensor count"), cur.unpack("<Q", "key/value count")
    if n_tensors > MAX_COUNT or n_kv > MAX_COUNT:
        raise LimitError(
            f"GGUF declares {n_tensors} tensors and {n_kv} key/values (limit {MAX_COUNT})",
            path=name,
        )
    check_file_totals(name, limits, n_tensors)
    attributes: Dict[str, Any] = {}
    value_types: Dict[str, Any] = {}
    keys = NameTable(name, "key")  # llama.cpp and gguf-py refuse a key given twice
    for i in range(n_kv):
        key = cur.string("key")
        keys.claim(key, f"key/value #{i}")
        vtype = cur.unpack("<I", f"type of {key}")
        if vtype == ARRAY and cur.pos + 4 <= len(cur.data):  # [ARRAY, element type]
            value_types[key] = [ARRAY, struct.unpack("<I", cur.data[cur.pos : cur.pos + 4])[0]]
        else:
            value_types[key] = vtype
        attributes[f"gguf.{key}"] = cur.value(vtype, key)
    if value_types:  # GGUF's value types, which plain attribute values do not carry
        attributes[VALUE_TYPES] = value_types
    names = NameTable(name, "tensor")
    infos = []
    for i in range(n_tensors):
        info = _tensor_info(cur, name, limits)
        names.claim(info[0], f"tensor info #{i}")
        infos.append(info)
    alignment = _alignment(attributes, value_types, name)
    start = -(-cur.pos // alignment) * alignment
    if start > size and infos:
        raise FormatError("the data section starts past the end of the file", path=name)
    # an unknown type's size is unknown: its bytes run to the next tensor's offset
    ends = sorted({offset for _, _, _, offset in infos} | {size - start})
    unknown_length = {}
    extents = []
    for tname, dims, gtype, offset in infos:
        if offset % alignment:
            raise FormatError(
                f"data offset {offset} is not a multiple of general.alignment {alignment}",
                path=name,
                obj=tname,
            )
        if gtype in GGML_TYPES:
            nbytes = _check_extent(name, tname, dims, gtype, offset, start, size)
        else:
            if start + offset > size:
                raise FormatError(
                    f"data at {offset} lies past the end of the file", path=name, obj=tname
                )
            end = _next_offset(ends, offset, size - start)
            # no element, no block: a tensor of none holds no bytes whatever its type
            # (one the writer left at the next tensor's offset read as that tensor's
            # bytes, and the two overlapped)
            empty = any(d == 0 for d in dims)
            nbytes = unknown_length[tname] = 0 if empty else max(end - offset, 0)
            warnings.warn(
                f"{name}: tensor {tname!r} has ggml type {gtype}, which this "
                "version does not know: kept as its raw bytes (format gguf_blocks)",
                UnknownGGMLTypeWarning,
                stacklevel=2,
            )
        if nbytes > limits.max_component_size:
            raise LimitError(
                f"{nbytes} bytes of data (limit max_component_size={limits.max_component_size})",
                path=name,
                obj=tname,
            )
        extents.append((offset, nbytes, tname))
    _check_disjoint(name, extents)

    def tensors():
        for tname, dims, gtype, offset in infos:
            if tname in unknown_length:
                blocks = np.frombuffer(
                    source.view(start + offset, unknown_length[tname], "tensor data", obj=tname),
                    np.uint8,
                )
                yield (
                    tname,
                    Tensor(
                        {"blocks": blocks},
                        shape=tuple(reversed(dims)),
                        format="gguf_blocks",
                        attributes={"ggml_type_id": gtype},
                    ),
                )
                continue
            yield tname, _tensor(data, tname, dims, gtype, start + offset)

    return attributes, tensors()


def _next_offset(ends, offset, data_size):
    """Where the bytes of an unknown-type tensor at ``offset`` end: the next larger
    tensor offset in ``ends`` (sorted, the data section's size included), never past
    the data section (offsets are claims).  A binary search: a scan per tensor made
    a file of many unknown-type tensors quadratic (100,000 of them, 7 MB, took
    minutes)."""
    i = bisect.bisect_right(ends, offset)
    return min(ends[i] if i < len(ends) else data_size, data_size)


def _alignment(attributes, value_types, path):
    """``general.alignment``: absent (32), or a UINT32 power of two, as llama.cpp
    and gguf-py require (another type is refused by both)."""
    if "gguf.general.alignment" not in attributes:
        return 32
    alignment = attributes["gguf.general.alignment"]
    if value_types.get("general.alignment") != _UINT32:
        raise FormatError(
            f"general.alignment has GGUF type "
            f"{value_types.get('general.alignment')!r}, not UINT32 (4)",
            path=path,
        )
    if alignment <= 0 or alignment & (alignment - 1):
        raise FormatError(f"general.alignment {alignment!r} is not a power of two", path=path)
    return alignment


def _check_disjoint(path, extents):
    """No byte of the data section belongs to two tensors: a reader handing out
    writable views (torch) would otherwise alias one tensor with another.  Empty
    tensors take no bytes."""
    previous = None
    for offset, nbytes, tname in sorted(e for e in extents if e[1]):
        if previous is not None and offset < previous[0] + previous[1]:
            raise FormatError(
                f"data at {offset} (+{nbytes} bytes) overlaps tensor "
                f"{previous[2]!r} at {previous[0]} (+{previous[1]} bytes)",
                path=path,
                obj=tname,
            )
        previous = (offset, nbytes, tname)


def _tensor_info(cur, path, limits):
    tname = cur.string("tensor name")
    n_dims = cur.unpack("<I", f"dims of {tname}")
    if n_dims > MAX_DIMS:
        raise FormatError(f"{n_dims} dimensions (at most {MAX_DIMS})", path=path, obj=tname)
    if n_dims > limits.max_rank:
        raise LimitError(
            f"{n_dims} dimensions (limit max_rank={limits.max_rank})", path=path, obj=tname
        )
    dims = [cur.unpack("<Q", f"dims of {tname}") for _ in range(n_dims)]
    gtype, offset = cur.unpack("<I", f"type of {tname}"), cur.unpack("<Q", f"offset of {tname}")
    if gtype not in GGML_TYPES:  # a known type's shape is checked with its block size
        problem = shape_problem(dims, 1)  # no shape a real tensor could have
        if problem:
            raise FormatError(problem, path=path, obj=tname)
    return tname, dims, gtype, offset


def _check_extent(path, tname, dims, gtype, offset, start, size):
    _, block, block_bytes, _ = GGML_TYPES[gtype]
    problem = shape_problem(dims, block_bytes)
    if problem:
        raise FormatError(problem, path=path, obj=tname)
    count = math.prod(dims)
    if dims and dims[0] % block:
        raise FormatError(
            f"innermost dimension {dims[0]} is not a multiple of the {block}-element block",
            path=path,
            obj=tname,
        )
    nbytes = count // block * block_bytes
    if start + offset + nbytes > size:
        raise FormatError(
            f"data at {offset} (+{nbytes} bytes) runs past the end of the file",
            path=path,
            obj=tname,
        )
    return nbytes


def _tensor(data, tname, dims, gtype, at):
    type_name, block, block_bytes, np_dtype = GGML_TYPES[gtype]
    shape = tuple(reversed(dims))  # ggml lists the innermost dimension first
    count = math.prod(dims)
    if np_dtype is not None:
        arr = np.frombuffer(data, np_dtype, count, at).reshape(shape)
        return Tensor(
            {"data": arr}, shape=shape, types={"data": "bf16"} if type_name == "BF16" else None
        )
    blocks = np.frombuffer(data, np.uint8, count // block * block_bytes, at)
    return Tensor(
        {"blocks": blocks},
        shape=shape,
        format="gguf_blocks",
        attributes={
            "ggml_type": type_name,
            "ggml_type_id": gtype,
            "block_elements": block,
            "block_bytes": block_bytes,
        },
    )
