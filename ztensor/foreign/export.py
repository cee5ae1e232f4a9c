"""Writing other tensor formats, for ``ztensor convert IN OUT``: the output's name
says its format (``.zt``, ``.safetensors``, ``.npz``, ``.gguf``); anything else is
refused.

Each exporter runs in two passes.  A plan (``plan_zt``, ``plan_safetensors``,
``plan_npz``, ``plan_gguf``) checks every name, type, shape and attribute against what the format
and its usual readers (the safetensors package, ``numpy.load``, llama.cpp and the
``gguf`` package) accept, and refuses the first that does not fit with one
:class:`ztensor.ZTensorError` naming it, before any file is created.  Then the
file is written to a temporary name beside the target and renamed into place, like
the zTensor writer, so a failure (a full disk) leaves no partial file either.

A name the format would store differently (a NUL in an ``.npz`` member) is refused,
never altered: a file converted to another format holds the same names, or no file
is written.  Two names the format would confuse are refused through
:class:`ztensor.foreign.names.NameTable`, naming both."""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ztensor import attributes as attrs
from ztensor import dtypes
from ztensor.errors import FormatError, UnsupportedError, memory_is_a_limit
from ztensor.foreign.base import optional_import
from ztensor.foreign.gguf_file import VALUE_TYPES
from ztensor.foreign.names import NameTable
from ztensor.foreign.safetensors_file import MAX_HEADER, METADATA_KEY
from ztensor.io import atomic, values

FORMATS = {".zt": "zt", ".safetensors": "safetensors", ".npz": "npz", ".gguf": "gguf"}

# numpy's NPY_MAXDIMS: every exporter reads its tensors through numpy
NUMPY_MAX_RANK = 64
# a zip member name is stored behind a 16-bit length
ZIP_MAX_NAME = 0xFFFF
# llama.cpp (gguf.cpp) refuses a tensor name of GGML_MAX_NAME (64) bytes or more,
# and more than GGML_MAX_DIMS (4) dimensions; the GGUF spec caps keys at 2**16 - 1
GGUF_MAX_NAME = 63
GGUF_MAX_DIMS = 4
GGUF_MAX_KEY = 0xFFFF


def _gguf_no_nul(text: str, what: str, path, **where) -> None:
    """llama.cpp takes GGUF tensor names and keys as C strings (``ggml_set_name``
    copies a name as one; keys are looked up by ``const char *``): one holding a NUL
    would be cut there, and ``a\\0b`` and ``a\\0c`` would both be ``a``.  gguf-py keeps
    them whole, so the two readers would disagree: refused, before a byte is written."""
    if "\0" in text:
        raise UnsupportedError(
            f"{what} cannot hold a NUL byte (llama.cpp reads it as a C string)",
            path=path,
            **where,
        )


def format_for(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UnsupportedError(
            f"cannot write {ext or 'extensionless'} files (the output's "
            "name says its format: .zt, .safetensors, .npz, .gguf)",
            path=path,
        )
    return FORMATS[ext]


def writer_for(kind: str) -> Callable:
    """The exporter of a format ``format_for`` named (not ``zt``: the Writer's)."""
    return {"safetensors": write_safetensors, "npz": write_npz, "gguf": write_gguf}[kind]


def _atomic(path: str, write: Callable[[Any], None], size: int, *, by_name: bool = False) -> None:
    """``write(file object)`` (or ``write(temporary path)`` with ``by_name``, for
    writers that open the file themselves) into a temporary file beside ``path``,
    renamed into place once complete (ztensor/io/atomic.py); ``size``: the bytes of
    tensor data it writes, which the disk must have room for first."""
    atomic.replace_atomically(path, write, by_name=by_name, size=size)


def data_bytes(reader, names) -> int:
    """The bytes the objects ``names`` of ``reader`` hold decoded: what an export
    of them writes, less its headers (a view's elements counted as written out)."""
    return sum(
        c.decoded_length for name in names for c in reader.metadata(name).components.values()
    )


def _utf8(text: str, what: str, path, obj=None) -> bytes:
    """``text`` as the UTF-8 every one of these formats stores, or UnsupportedError
    (a lone surrogate, which JSON escapes and Python decodes, has none)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedError(
            f"{what} is not valid Unicode (a lone surrogate) and has no UTF-8 form",
            path=path,
            obj=obj,
        ) from None


def _dense_specs(reader) -> Dict[str, Any]:
    """Every object's spec, each a dense tensor numpy can hold, or UnsupportedError
    naming the first that is not."""
    specs = {}
    for name in reader.keys():
        spec = reader.metadata(name)
        if spec.format != "dense":
            raise UnsupportedError(
                f"a {spec.format} object cannot be expressed in this format "
                "(dense tensors only): dequantize or drop it first",
                path=reader.path,
                obj=name,
            )
        _check_rank(reader, name, spec.shape, NUMPY_MAX_RANK, "numpy")
        specs[name] = spec
    return specs


def _check_rank(reader, name, shape, most, who):
    if len(shape) > most:
        raise UnsupportedError(
            f"{len(shape)} dimensions ({who} holds at most {most})", path=reader.path, obj=name
        )


# ------------------------------------------------------------------ zTensor
def plan_zt(reader) -> None:
    """Check that a ``.zt`` file can hold every object and attribute of ``reader``,
    by the Writer's own rules (ztensor/attributes.py: a name is a non-empty string
    of valid Unicode; attributes are plain data, strings of valid Unicode); nothing
    is written.  Other formats hold what ``.zt`` does not (a tensor named ``""``
    in a safetensors header, a lone surrogate its JSON escapes), and the Writer,
    refusing them only when it reaches them, would name its own output and no
    object, after writing every tensor before, or the checkpoint shards before."""
    path = reader.path
    # writing=True: the Writer's own check, a NaN with a sign or payload included
    # (valid in a pickle or a GGUF value; CBOR's canonical NaN cannot hold it)
    _zt_holds(attrs.check_map, reader.attributes, "file attributes", path=path, writing=True)
    for name in reader.keys():
        _zt_holds(attrs.check_name, name, "object names", path=path, obj=name)
        spec = reader.metadata(name)
        _zt_holds(
            attrs.check_map, spec.attributes or {}, "attributes", path=path, obj=name, writing=True
        )


def _zt_holds(check, value, what, writing: bool = False, **where) -> None:
    """``check`` (a Writer rule) on ``value``; what it refuses, an UnsupportedError
    naming the input: the input is valid in its own format, ``.zt`` cannot hold it."""
    try:
        check(value, what, **where, **({"writing": True} if writing else {}))
    except FormatError as exc:
        raise UnsupportedError(
            f"{exc.message}: a .zt file cannot hold it", path=where["path"], obj=where.get("obj")
        ) from None


def _attributes_kept(reader, fmt: str, *, file_level: bool, drop: bool, names=None) -> None:
    """Refuse, naming the object, per-object attributes (and with ``file_level``
    file attributes) that the ``fmt`` file has no place for: an export either keeps
    everything or writes nothing (a tensor's ``scale`` vanished from a
    ``.safetensors`` export, exit 0).  ``drop`` (``drop_attributes=True``,
    ``--drop-attributes``) is the caller saying to leave them out.  ``names``: the
    objects whose attributes count (default all; a gguf_blocks object's are its
    format's fields).  The one rule for the safetensors, npz and GGUF exporters."""
    if drop:
        return
    hint = "; pass drop_attributes=True (--drop-attributes) to write the file without them"
    # safetensors' {"format": "pt"} (every transformers checkpoint has it) names the
    # framework that wrote the file, which the output's own format replaces: the one
    # attribute an export leaves out unasked
    held = {k: v for k, v in reader.attributes.items() if (k, type(v)) != ("format", str)}
    if file_level and held:
        keys = ", ".join(_short(k) for k in list(held)[:3])
        raise UnsupportedError(
            f"file attributes have no place in {fmt} ({keys}){hint}", path=reader.path
        )
    for name in reader.keys() if names is None else names:
        if reader.metadata(name).attributes:
            raise UnsupportedError(
                f"per-tensor attributes have no place in {fmt}{hint}",
                path=reader.path,
                obj=name,
            )


# ------------------------------------------------------------------ safetensors
class SafetensorsPlan(NamedTuple):
    header: bytes  # the length-prefixed JSON header, padded to 8 bytes
    names: List[str]  # the tensors, in data order


def plan_safetensors(reader, drop_attributes: bool = False) -> SafetensorsPlan:
    """Check that a ``.safetensors`` file can hold every object and attribute of
    ``reader``, and make its header; nothing is written.

    * every object dense, of a type with a safetensors dtype;
    * no tensor named ``__metadata__`` (the format's key for its metadata);
    * names and metadata valid UTF-8, metadata values strings;
    * a header the safetensors package accepts (at most 100,000,000 bytes);
    * no per-tensor attributes, unless ``drop_attributes`` (then they and the
      file attributes that are not strings are left out)."""
    specs = _dense_specs(reader)
    _attributes_kept(reader, "safetensors", file_level=False, drop=drop_attributes)
    names = NameTable(reader.path, "tensor")
    header: Dict[str, Any] = {}
    offset = 0
    for name, spec in specs.items():
        if name == METADATA_KEY:
            raise UnsupportedError(
                "safetensors keeps its metadata under this name: a tensor cannot have it",
                path=reader.path,
                obj=name,
            )
        _utf8(name, "the name", reader.path, name)
        names.claim(name)
        comp = spec.components["data"]
        key = comp.type or comp.dtype
        st_name = dtypes.SAFETENSORS_NAMES.get(key)
        if st_name is None or st_name not in dtypes.SAFETENSORS_STORAGE:
            raise UnsupportedError(
                f"type {key!r} has no safetensors dtype", path=reader.path, obj=name
            )
        nbytes = comp.decoded_length
        header[name] = {
            "dtype": st_name,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    meta = {}
    for key, value in reader.attributes.items():
        if not isinstance(value, str) and drop_attributes:
            continue
        if not isinstance(value, str):
            raise UnsupportedError(
                f"safetensors metadata holds strings only; attribute "
                f"{_short(key)} is a {type(value).__name__}",
                path=reader.path,
            )
        _utf8(key, f"attribute {_short(key)}", reader.path)
        _utf8(value, f"the value of attribute {_short(key)}", reader.path)
        meta[key] = value
    if meta:
        header = {METADATA_KEY: meta, **header}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    if len(raw) > MAX_HEADER:
        raise UnsupportedError(
            f"the header would be {len(raw)} bytes; the safetensors "
            f"package reads at most {MAX_HEADER}",
            path=reader.path,
        )
    return SafetensorsPlan(struct.pack("<Q", len(raw)) + raw, list(specs))


def write_safetensors(reader, path: str, progress=None, drop_attributes: bool = False) -> int:
    """A real ``.safetensors`` file of every dense object (bf16, F8_E4M3/F8_E5M2 and
    complex64 too); the file attributes become ``__metadata__`` (strings only).
    What the format cannot hold is refused first (:func:`plan_safetensors`)."""
    plan = plan_safetensors(reader, drop_attributes)

    def write(f):
        f.write(plan.header)
        for name in plan.names:
            for piece in _stored_pieces(reader, name):
                if piece.size:  # the array's own bytes: tobytes() would hold a second copy
                    f.write(memoryview(piece).cast("B"))
                if progress:
                    progress(piece.nbytes)

    _atomic(path, write, data_bytes(reader, plan.names))
    return len(plan.names)


# ------------------------------------------------------------------ npz
def _zip_member_name(name: str) -> str:
    """The name zipfile stores for ``name``: it cuts a name at its first NUL and
    turns the platform's separator into ``/`` (zipfile.ZipInfo)."""
    stored = name.split("\0", 1)[0]
    if os.sep != "/":
        stored = stored.replace(os.sep, "/")
    return stored


def plan_npz(reader, drop_attributes: bool = False) -> List[Tuple[str, str]]:
    """(tensor name, zip member name) for every object of ``reader``, each one an
    ``.npz`` holds and ``numpy.load`` gives back under its own name; nothing is
    written.

    ``numpy.load`` answers to a member's name and to that name less ``.npy``, the
    member first, so tensors ``x`` and ``x.npy`` (members ``x.npy`` and
    ``x.npy.npy``) would both be read as ``x``'s data under ``x.npy``: every tensor
    claims both of the names it answers to, and a second claim is refused.  An
    ``.npz`` holds arrays only: attributes are refused unless ``drop_attributes``."""
    specs = _dense_specs(reader)
    _attributes_kept(reader, ".npz", file_level=True, drop=drop_attributes)
    answers = NameTable(reader.path, "npz key")
    plan = []
    for name in specs:
        member = name + ".npy"
        if _zip_member_name(member) != member:
            raise UnsupportedError(
                "a zip member name cannot hold a NUL byte (or the path "
                "separator here): numpy.load would return it under "
                f"{_short(_zip_member_name(member))}",
                path=reader.path,
                obj=name,
            )
        size = len(_utf8(member, "the name", reader.path, name))
        if size > ZIP_MAX_NAME:
            raise UnsupportedError(
                f"the member name would be {size} bytes; a zip holds at most {ZIP_MAX_NAME}",
                path=reader.path,
                obj=name,
            )
        comp = specs[name].components["data"]
        logical = "bf16" if comp.dtype == "bf16" else comp.type
        if logical is not None and logical not in dtypes.NUMPY_NATIVE:
            # bf16, FP8, a type the table lacks (f8_e8m0fnu): numpy has no such
            # dtype, so the member would hold bit patterns that numpy.load gives
            # back as plain integers, the type lost; complex and bool are numpy's own
            # the formats that do hold the type, and no other, are advised
            holders = ".safetensors or .zt" if logical in dtypes.SAFETENSORS_NAMES else ".zt"
            raise UnsupportedError(
                f"numpy has no {logical} dtype: an .npz would hold its bit patterns as "
                f"plain integers; write {holders}, or convert the values first",
                path=reader.path,
                obj=name,
            )
        answers.claim(name, name)
        answers.claim(member, name)
        plan.append((name, member))
    return plan


def write_npz(reader, path: str, progress=None, drop_attributes: bool = False) -> int:
    """An ``.npz`` of every dense object, member by member.  An ``.npz`` holds
    numpy arrays only: bf16 and FP8 (no numpy dtype) are refused, and attributes
    unless ``drop_attributes``.  What the format cannot hold is refused first
    (:func:`plan_npz`)."""
    plan = plan_npz(reader, drop_attributes)

    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, member in plan:
                view = _stored_view(reader, name)
                header = {
                    "descr": np.lib.format.dtype_to_descr(_stored_dtype(view.dtype)),
                    "fortran_order": False,
                    "shape": view.shape,
                }
                with z.open(member, "w", force_zip64=True) as out:
                    _npy_header(out, header)
                    for piece in _stored_pieces(reader, name, view):
                        if piece.size:
                            out.write(memoryview(piece).cast("B"))
                        if progress:
                            progress(piece.nbytes)

    _atomic(path, write, data_bytes(reader, [name for name, _ in plan]))
    return len(plan)


# an exporter writes a tensor's elements in pieces of about this many bytes: a view
# that shows more elements than its file holds (a stride-0 torch.save tensor: 1.4 KB
# of file, 256 GiB of elements) is copied a piece at a time, never whole
PIECE_BYTES = 64 << 20


def _npy_header(out, header) -> None:
    """An ``.npy`` header, in the first version that holds it (numpy's own choice:
    1.0, or 2.0 for a header past 64 KiB)."""
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except ValueError:
        np.lib.format.write_array_header_2_0(out, header)


def _stored_view(reader, name):
    """The object's elements as read (a view where the format allows), bf16/FP8 as
    their bits; not yet contiguous or little-endian (:func:`_as_stored`)."""
    arr = np.asarray(reader.read(name).components["data"])
    if dtypes.is_ml_dtype(arr.dtype):
        arr = arr.view(np.uint16 if arr.dtype.itemsize == 2 else np.uint8)
    return arr


def _stored_dtype(dtype: np.dtype) -> np.dtype:
    """The little-endian dtype an exporter writes elements of ``dtype`` as."""
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def _as_stored(arr):
    """``arr`` as every exporter writes it: little-endian, C-contiguous, a bool's
    bytes 0 or 1 only (values.clean_bools, the writers' rule; a reader's bool array
    may hold other bytes, true as not zero)."""
    if arr.dtype == np.bool_:
        arr = values.clean_bools(arr)
    arr = arr.astype(_stored_dtype(arr.dtype), copy=False)
    return np.asarray(arr, order="C")  # not ascontiguousarray: a 0-d array stays 0-d


def _pieces(arr, budget: Optional[int] = None):
    """Views of ``arr`` along its leading axes, each of at most ``budget`` bytes
    (default :data:`PIECE_BYTES`; or one element), that hold its elements in C order."""
    budget = PIECE_BYTES if budget is None else budget
    if arr.ndim == 0 or arr.nbytes <= budget:
        yield arr
        return
    row = arr.nbytes // arr.shape[0]
    if row > budget:
        for i in range(arr.shape[0]):
            yield from _pieces(arr[i], budget)
        return
    step = budget // row
    for start in range(0, arr.shape[0], step):
        yield arr[start : start + step]


def _stored_pieces(reader, name, view=None):
    """The object's elements (see :func:`_as_stored`; ``view``: its
    :func:`_stored_view`, when the caller has it), in C order, as contiguous
    pieces of at most :data:`PIECE_BYTES`: what the safetensors and npz exporters
    write, so memory stays at one piece whatever the view shows.  Memory that
    runs out is a LimitError naming the file and object."""
    with memory_is_a_limit(reader.path, name):
        for piece in _pieces(_stored_view(reader, name) if view is None else view):
            yield _as_stored(piece)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# ------------------------------------------------------------------ GGUF (via gguf-py)
# spec types GGUF holds, and the native numpy dtype gguf-py writes each from (bf16 as
# its bits): the dtype table's rows with a ggml type id
_GGUF_DENSE = {name: code.lstrip("<") for name, code in dtypes.GGUF_NUMPY.items()}
# GGUF value type id -> the integers it holds ([low, high)), for the integer types
_GGUF_INT_RANGES = {
    0: (0, 1 << 8),
    1: (-(1 << 7), 1 << 7),
    2: (0, 1 << 16),
    3: (-(1 << 15), 1 << 15),
    4: (0, 1 << 32),
    5: (-(1 << 31), 1 << 31),
    10: (0, 1 << 64),
    11: (-(1 << 63), 1 << 63),
}
_GGUF_FLOAT32, _GGUF_BOOL, _GGUF_FLOAT64 = 6, 7, 12


class GGUFTensor(NamedTuple):
    name: str
    load: Callable[[], Any]  # what to write: little-endian bytes (_StoredPieces, blocks)
    shape: Tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    raw: Any  # the ggml type when not told by dtype, else None


class GGUFValue(NamedTuple):
    key: str
    value: Any
    vtype: Any  # gguf.GGUFValueType
    sub: Any  # element type of an array, else None


class GGUFPlan(NamedTuple):
    tensors: List[GGUFTensor]
    values: List[GGUFValue]  # neither general.architecture nor general.alignment
    architecture: Optional[str]
    alignment: Optional[int]


def plan_gguf(reader, gguf, drop_attributes: bool = False) -> GGUFPlan:
    """Check that a ``.gguf`` file can hold every object and attribute of ``reader``
    as llama.cpp and the ``gguf`` package read it back, and plan it; nothing is
    written.  Tensors: dense of a GGUF type or ``gguf_blocks``, names of at most 63
    UTF-8 bytes, at most 4 dimensions, no name twice.  Key/values: one per key (an
    attribute ``gguf.k`` and an attribute ``k`` would both be key ``k``), every
    value within the type recorded for it (or the one its value gives)."""
    names = NameTable(reader.path, "tensor")
    tensors = []
    dense = [n for n in reader.keys() if reader.metadata(n).format == "dense"]
    _attributes_kept(reader, "GGUF", file_level=False, drop=drop_attributes, names=dense)
    for name in reader.keys():
        size = len(_utf8(name, "the name", reader.path, name))
        if size > GGUF_MAX_NAME:
            raise UnsupportedError(
                f"the name is {size} bytes; GGUF tensor names are at most "
                f"{GGUF_MAX_NAME} (llama.cpp's limit)",
                path=reader.path,
                obj=name,
            )
        _gguf_no_nul(name, "a GGUF tensor name", reader.path, obj=name)
        names.claim(name)
        tensors.append(_gguf_tensor(reader, name, gguf))
    values, architecture, alignment = [], None, None
    for item in _gguf_values(reader, gguf):
        if item.key == "general.architecture":
            architecture = item.value
        elif item.key == "general.alignment":
            alignment = item.value
        else:
            values.append(item)
    return GGUFPlan(tensors, values, architecture, alignment)


def write_gguf(reader, path: str, progress=None, drop_attributes: bool = False) -> int:
    """A ``.gguf`` file, written with llama.cpp's own ``gguf`` package (optional).

    * Dense objects of the types GGUF has (f32, f16, bf16, f64, i8-i64) become tensors
      of those ggml types; ``gguf_blocks`` objects (GGUF files read earlier) are
      written back as their blocks, with their ggml type.  Anything else (sparse,
      GPTQ, unsigned or FP8 dense) is refused, naming the object, before anything is
      written: dequantize or convert it first.
    * Attributes ``gguf.<key>`` become key/values ``<key>``, with the GGUF value types
      recorded at import (``gguf_value_types``); other attributes keep their names,
      typed from their values (str, bool, int as INT32/INT64/UINT64, float as
      FLOAT64, non-empty lists of one of those).  Maps, bytes, None, empty lists and
      lists of lists have no GGUF form here and are refused, as is a value outside
      its recorded type.
    * ``general.architecture`` is written only when the source has it.

    Everything is checked first (:func:`plan_gguf`)."""
    gguf = optional_import("gguf", "writing GGUF files", path)
    plan = plan_gguf(reader, gguf, drop_attributes)

    def write(tmp):
        w = gguf.GGUFWriter(tmp, plan.architecture or "")
        if plan.architecture is None:  # the writer adds one; the source has none
            for kv in getattr(w, "kv_data", [{}]):
                kv.pop("general.architecture", None)
        if plan.alignment is not None:  # the writer's own padding must follow it
            w.add_custom_alignment(plan.alignment)
        for item in plan.values:
            w.add_key_value(item.key, item.value, item.vtype, sub_type=item.sub)
        for t in plan.tensors:
            w.add_tensor_info(t.name, t.shape, t.dtype, t.nbytes, raw_dtype=t.raw)
        w.write_header_to_file()
        outputs = getattr(w, "fout", None)  # gguf-py opens (and truncates) the file itself
        reserved = isinstance(outputs, list) and len(outputs) == 1
        if reserved:
            atomic.reserve(outputs[0].fileno(), size)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        little = _takes_endianness(w)
        for t in plan.tensors:  # one tensor at a time, one piece of it in memory
            data = t.load()
            if little:  # the bytes are the file's already: never swapped
                w.write_tensor_data(data, tensor_endianess=gguf.GGUFEndian.LITTLE)
            else:  # an older gguf-py swaps only for a big-endian file
                w.write_tensor_data(data)
            if progress:
                progress(t.nbytes)
        w.close()
        if reserved:
            atomic.give_back_reserved(tmp)

    size = sum(t.nbytes for t in plan.tensors)
    _atomic(path, write, size, by_name=True)
    return len(plan.tensors)


class _StoredPieces:
    """A dense object's elements as gguf-py's ``GGUFWriter.write_tensor_data`` takes an
    array (its ``nbytes`` and ``tofile``), written in their stored little-endian pieces
    (:func:`_stored_pieces`): one piece in memory at a time, whatever the view shows
    (a 1.4 KB ``torch.save`` of a stride-0 view of 16 GiB was copied whole, and the
    process killed for memory)."""

    def __init__(self, reader, name: str, nbytes: int) -> None:
        self.reader, self.name, self.nbytes = reader, name, nbytes

    def tofile(self, out) -> None:
        for piece in _stored_pieces(self.reader, self.name):
            out.write(piece.reshape(-1).view(np.uint8).data)


def _takes_endianness(writer) -> bool:
    """Whether this gguf-py's ``write_tensor_data`` is told the bytes' order (0.10
    is not, and writes them as given to a little-endian file)."""
    import inspect

    try:
        return "tensor_endianess" in inspect.signature(writer.write_tensor_data).parameters
    except (TypeError, ValueError):
        return False


def _gguf_tensor(reader, name, gguf) -> GGUFTensor:
    spec = reader.metadata(name)
    _check_rank(reader, name, spec.shape, GGUF_MAX_DIMS, "GGUF (llama.cpp)")
    if 0 in tuple(spec.shape)[:-1]:
        # GGUF lists dimensions innermost first, and llama.cpp's reader (gguf.cpp)
        # divides INT64_MAX by every one but the innermost: a zero there is a
        # division by zero in llama.cpp, not an empty tensor
        raise UnsupportedError(
            f"shape {list(spec.shape)}: a dimension of 0 before the last one, which "
            "llama.cpp divides by when it reads the file",
            path=reader.path,
            obj=name,
        )
    if spec.format == "gguf_blocks":
        type_id = spec.attributes.get("ggml_type_id")
        try:
            if type(type_id) is not int:
                raise TypeError
            qtype = gguf.GGMLQuantizationType(type_id)
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError, TypeError):
            raise UnsupportedError(
                f"ggml type {type_id!r} is not one the installed gguf package writes",
                path=reader.path,
                obj=name,
            ) from None
        shape = tuple(spec.shape)
        if not shape or shape[-1] % block:
            raise UnsupportedError(
                f"shape {list(shape)} is not whole {qtype.name} blocks", path=reader.path, obj=name
            )
        byte_shape = shape[:-1] + (shape[-1] // block * block_bytes,)
        nbytes = math.prod(byte_shape)
        comp = spec.components.get("blocks")
        if comp is None or comp.dtype != "u8":  # sliced and shaped as bytes below
            raise UnsupportedError(
                "a gguf_blocks object needs a u8 component 'blocks'", path=reader.path, obj=name
            )
        held = comp.decoded_length
        # a type unknown at import was kept with the bytes up to the next tensor
        # (its size was unknown then): the padding after its blocks is dropped here
        padded = "ggml_type" not in spec.attributes and held > nbytes
        if held != nbytes and not padded:
            raise UnsupportedError(
                f"{held} bytes of blocks for a {qtype.name} tensor of "
                f"shape {list(shape)} ({nbytes} bytes)",
                path=reader.path,
                obj=name,
            )

        def load():
            blocks = np.asarray(reader.read(name).components["blocks"])
            return blocks[:nbytes].reshape(byte_shape)

        return GGUFTensor(name, load, byte_shape, np.dtype(np.uint8), nbytes, qtype)
    if spec.format != "dense":
        raise UnsupportedError(
            f"a {spec.format} object has no GGUF form: dequantize or drop it first",
            path=reader.path,
            obj=name,
        )
    comp = spec.components["data"]
    key = comp.type or comp.dtype
    if key not in _GGUF_DENSE:
        raise UnsupportedError(
            f"type {key!r} has no GGUF tensor type (GGUF holds {', '.join(_GGUF_DENSE)})",
            path=reader.path,
            obj=name,
        )
    raw = gguf.GGMLQuantizationType.BF16 if key == "bf16" else None  # bits, typed
    shape = tuple(spec.shape)

    nbytes = comp.decoded_length
    return GGUFTensor(
        name,
        lambda: _StoredPieces(reader, name, nbytes),
        shape,
        np.dtype(_GGUF_DENSE[key]),
        nbytes,
        raw,
    )


def _gguf_values(reader, gguf) -> List[GGUFValue]:
    """A GGUFValue for every attribute but ``gguf_value_types``, each checked against
    its type (:func:`_gguf_value_problem`), or UnsupportedError naming the attribute;
    a key two attributes map to is a FormatError naming both."""
    recorded = reader.attributes.get(VALUE_TYPES, {})
    if not isinstance(recorded, dict):
        raise UnsupportedError(
            f"attribute {VALUE_TYPES!r} is a {type(recorded).__name__}, "
            "not the map of key to GGUF value type it is read as",
            path=reader.path,
        )
    keys = NameTable(reader.path, "GGUF key")
    out = []
    for attr, value in reader.attributes.items():
        if attr == VALUE_TYPES:
            continue
        prefixed = attr.startswith("gguf.")
        key = attr[len("gguf.") :] if prefixed else attr
        where = f"attribute {_short(attr)}"
        size = len(_utf8(key, where, reader.path))
        if size > GGUF_MAX_KEY:
            raise UnsupportedError(
                f"{where}: a GGUF key is at most {GGUF_MAX_KEY} bytes, this one {size}",
                path=reader.path,
            )
        _gguf_no_nul(key, f"{where}: a GGUF key", reader.path)
        keys.claim(key, attr)
        known = recorded.get(key) if prefixed else None
        if known is not None:
            vtype, sub = _gguf_recorded_type(known, gguf, where, reader.path)
        else:
            vtype, sub = _gguf_type_of_value(value, gguf, where, reader.path)
        problem = _gguf_value_problem(value, int(vtype), None if sub is None else int(sub))
        if problem is None and key == "general.architecture" and vtype != gguf.GGUFValueType.STRING:
            problem = "general.architecture is a string"
        if problem is None and key == "general.alignment":
            if (
                vtype not in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32)
                or not 0 < value < 1 << 32
                or value & (value - 1)
            ):
                problem = (
                    f"general.alignment {value!r} is not a power of two in a UINT32, "
                    "as llama.cpp and gguf-py read it"
                )
        if problem is not None:
            raise UnsupportedError(f"{where}: {problem}", path=reader.path)
        out.append(GGUFValue(key, value, vtype, sub))
    return out


def _gguf_recorded_type(known, gguf, where, path):
    """(value type, element type or None) from a ``gguf_value_types`` entry: a type
    id, or ``[9, element type id]`` for an array."""
    T = gguf.GGUFValueType
    ids = {int(t) for t in T}
    if type(known) is int and known in ids and known != int(T.ARRAY):
        return T(known), None
    if (
        isinstance(known, list)
        and len(known) == 2
        and known[0] == int(T.ARRAY)
        and type(known[0]) is int
        and type(known[1]) is int
        and known[1] in ids
    ):
        if known[1] == int(T.ARRAY):
            raise UnsupportedError(
                f"{where}: an array of arrays (llama.cpp reads no such key/value)", path=path
            )
        return T.ARRAY, T(known[1])
    raise UnsupportedError(
        f"{where}: its recorded GGUF value type {_short(known)} is not "
        "a type id (or [9, element type id])",
        path=path,
    )


def _gguf_type_of_value(value, gguf, where, path):
    """(value type, element type or None) for an attribute no type was recorded for."""
    T = gguf.GGUFValueType
    vtype = _gguf_type_of(value, gguf)
    if vtype is None:
        raise UnsupportedError(
            f"{where} ({type(value).__name__}) has no GGUF value type", path=path
        )
    if vtype != T.ARRAY:
        return vtype, None
    if not value:
        raise UnsupportedError(
            f"{where}: an empty list (the gguf package writes no empty array)", path=path
        )
    subs = {_gguf_type_of(v, gguf) for v in value}
    if len(subs) > 1 and subs <= {T.INT32, T.INT64}:
        subs = {T.INT64}
    if len(subs) > 1 or None in subs or T.ARRAY in subs:
        raise UnsupportedError(
            f"{where}: a GGUF array holds values of one type (and no arrays)", path=path
        )
    return vtype, subs.pop()


def _gguf_type_of(value, gguf):
    t = gguf.GGUFValueType
    if isinstance(value, bool):
        return t.BOOL
    if isinstance(value, int):
        return (
            t.INT32
            if -(1 << 31) <= value < 1 << 31
            else t.INT64
            if -(1 << 63) <= value < 1 << 63
            else t.UINT64
            if 0 <= value < 1 << 64
            else None
        )
    if isinstance(value, float):
        return t.FLOAT64
    if isinstance(value, str):
        return t.STRING
    if isinstance(value, list):
        return t.ARRAY
    return None


def _gguf_value_problem(value, vtype: int, sub: Optional[int]) -> Optional[str]:
    """Why ``value`` cannot be written as GGUF value type ``vtype`` (ids as in
    ztensor/foreign/gguf_file.py) and read back equal, or None.  Nothing is rounded, wrapped or
    coerced: an integer out of its type's range, a float32 that is not exactly one,
    a bool that is not True or False are refused."""
    if vtype in _GGUF_INT_RANGES:
        low, high = _GGUF_INT_RANGES[vtype]
        if type(value) is not int:
            return f"{_kind(value)} is not an integer"
        if not low <= value < high:
            return f"{value} does not fit its GGUF type (integers in [{low}, {high}))"
        return None
    if vtype in (_GGUF_FLOAT32, _GGUF_FLOAT64):
        if type(value) not in (int, float):
            return f"{_kind(value)} is not a number"
        try:
            as_float = float(value)
            exact = (
                struct.unpack("<f", struct.pack("<f", as_float))[0]
                if vtype == _GGUF_FLOAT32
                else as_float
            )
        except (OverflowError, struct.error):
            return f"{_short(value)} does not fit a {'FLOAT32' if vtype == 6 else 'FLOAT64'}"
        if exact != value and value == value:  # NaN is NaN in either width
            return f"{_short(value)} is not exactly a {'FLOAT32' if vtype == 6 else 'FLOAT64'}"
        return None
    if vtype == _GGUF_BOOL:
        return None if type(value) is bool else f"{_kind(value)} is not a bool"
    if vtype == 8:  # STRING
        if type(value) is not str:
            return f"{_kind(value)} is not a string"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "the string is not valid Unicode (a lone surrogate)"
        return None
    if vtype == 9:  # ARRAY
        if type(value) is not list:
            return f"{_kind(value)} is not a list"
        if not value:
            return "an empty list (the gguf package writes no empty array)"
        if sub is None or sub == 9:
            return "an array of arrays (llama.cpp reads no such key/value)"
        for i, item in enumerate(value):
            problem = _gguf_value_problem(item, sub, None)
            if problem is not None:
                return f"item {i}: {problem}"
        return None
    return f"GGUF value type {vtype} is not one the gguf package writes"


def _kind(value) -> str:
    return f"a {type(value).__name__}"
