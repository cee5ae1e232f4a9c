"""PyTorch checkpoints (``torch.save``'s zip format: ``.pt``, ``.pth``, ``.bin``),
read without torch and without running the pickle's code.

A checkpoint is a zip holding ``<prefix>/data.pkl`` (the pickled object) and one
member per storage (``<prefix>/data/<key>``).  The zip is read through
:class:`~ztensor.foreign.zip_members.ZipArchive` (the one home of the zip-member
rules: encryption, duplicate and overlapping members, sizes, limits).

The pickle is read by :class:`RestrictedUnpickler`, Python's own pure-Python
unpickler with a dispatch table of our own.  A pickle is a program for a stack
machine; this one runs only the instructions a checkpoint needs, and each on the
objects it may touch (see :func:`_dispatch`):

* a global (GLOBAL, STACK_GLOBAL) is answered from an allowlist alone
  (``torch._utils._rebuild_tensor_v2``/``_v3``, ``_rebuild_parameter``, the storage
  classes and dtypes, ``collections.OrderedDict``, and ``_codecs.encode``, which
  protocol 2 writes a non-empty bytes value with, taking only the arguments it is
  written with, as torch.load's ``weights_only`` does), each by a fresh object made for
  this load: a :class:`_Global` wrapping a function of this module, or a
  :class:`_DType` marker.  torch's own code is never imported or called; any other
  global (``os.system``, a model class) is a FormatError naming it;
* REDUCE calls only a :class:`_Global`.  INST, OBJ, NEWOBJ(_EX), the EXT opcodes
  (copyreg's global registry) and out-of-band buffers are refused;
* BUILD (set an object's state) is accepted in the one shape ``torch.save`` writes: a
  state dict's ``_metadata`` on an OrderedDict this load made.  SETITEM(S), DICT,
  APPEND(S), ADDITEMS and FROZENSET act only on the plain containers the pickle built,
  with plain keys, each key once.  So nothing a file holds can change an object that
  outlives the read: module functions, classes, markers, earlier checkpoints;
* the memo is a dict and every counted length is read from the bytes present, so a
  declared size or memo index costs nothing (the C unpickler allocates both first);
* ``persistent_load`` maps a storage reference to a :class:`_StorageRef`: its member,
  element type and element count.  No byte of a storage is read while unpickling.

Every tensor's offset, sizes and strides are checked against its storage's element
count as it is rebuilt.  Tensors are then named by a bounded walk (:func:`_collect`):
dict keys and list indices joined with ``.``, through one
:class:`~ztensor.foreign.names.NameTable`, so two tensors that would print alike are an
error naming both paths, never one dropped.  Plain values (numbers, strings) become
``pickle.*`` attributes.  Only then are the storages' sizes held to the file's members
and the :class:`~ztensor.spec.Limits`, and their members read: stored ones are views
of the mapped file, deflated ones decoded (bounded); a big-endian checkpoint's
storages are swapped to little-endian once each.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import struct
from collections import OrderedDict
from typing import Any, Dict, List, Tuple

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError, UnsupportedError, ZTensorError
from ztensor.foreign.base import Entry, ForeignFile, check_held_size, eager, spec_of
from ztensor.foreign.names import NameTable
from ztensor.foreign.zip_members import ZipArchive
from ztensor.io import values
from ztensor.objects import shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits, check_file_totals, check_visits
from ztensor.tensor import Tensor

MAX_PICKLE = 256 << 20  # data.pkl holds structure, not data: far below this in practice
MAX_DEPTH = 64  # containers a tensor may be nested in
MAX_ATTRIBUTES = 10_000  # plain values kept as attributes (metadata, not tensors)

# legacy typed storage classes -> the torch dtype whose elements they hold
_STORAGE_CLASSES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "UntypedStorage": "uint8",
}
# storage class / dtype name -> (numpy little-endian dtype, zTensor logical type):
# torch's names from the one dtype table (dtypes.TORCH_KINDS)
_DTYPES = {
    **{cls: dtypes.TORCH_KINDS[name] for cls, name in _STORAGE_CLASSES.items()},
    **dtypes.TORCH_KINDS,
}

# the types a dict key or set item may have: hashing a deeply nested tuple recurses in C
# without a guard, and a tensor under a key would have no name
_KEY_TYPES = (str, int, float, bool, type(None), bytes)


# torch dtypes a checkpoint may name that zTensor has no type for (quantized, sub-byte,
# complex32, bit containers): a valid file refused as unsupported, not as code
_OTHER_TORCH_DTYPES = frozenset(
    ["complex32", "chalf", "float8_e8m0fnu", "float4_e2m1fn_x2", "quint8", "qint8", "qint32"]
    + ["quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"]
    + [f"{kind}{n}" for kind in ("int", "uint") for n in range(1, 8)]
)


class _DType:
    """What a storage class or dtype global unpickles to: a type marker, made afresh
    for each global the pickle names."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _Global:
    """What an allowed function global unpickles to: made afresh per load, callable by
    REDUCE only."""

    __slots__ = ("qualname", "fn")

    def __init__(self, qualname, fn):
        self.qualname, self.fn = qualname, fn


class _StateDict(OrderedDict):
    """An OrderedDict the pickle made (``collections.OrderedDict()``, as a state dict
    is written): the one object BUILD may set the state of."""


class _StorageRef:
    """A storage as the pickle describes it: its member, element type and element
    count (one object, shared by every tensor that references the storage)."""

    __slots__ = ("member", "dtype", "numel")

    def __init__(self, member, dtype, numel):
        self.member, self.dtype, self.numel = member, dtype, numel

    @property
    def itemsize(self) -> int:
        return np.dtype(_DTYPES[self.dtype.name][0]).itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


class _TensorRecord:
    """A rebuilt tensor: its storage, checked geometry, element type (``torch``: the
    name torch gives it) and torch's lazy bits (``bits``: ``"conj"``, ``"neg"``, see
    :func:`_lazy_bits`); its array is made once the storages are read."""

    __slots__ = ("storage", "offset", "size", "stride", "dtype", "ltype", "torch", "bits")

    def __init__(self, storage, offset, size, stride, dtype, ltype, torch="", bits=()):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.dtype, self.ltype, self.torch, self.bits = dtype, ltype, torch, bits


# torch's lazy bits (torch._utils.get_tensor_metadata, the metadata argument of the
# rebuild functions): a tensor saved with its conjugate or negative bit set holds the
# storage's values conjugated or negated, and torch.load gives them so.  Bit -> the
# torch types torch resolves it for (resolve_conj, resolve_neg; others fail there)
_LAZY_BITS = {
    "conj": frozenset({"complex64", "complex128"}),
    "neg": frozenset(
        {"float64", "float32", "float16", "bfloat16", "complex64", "complex128"}
        | {"int8", "int16", "int32", "int64", "uint8"}
    ),
}


def _lazy_bits(metadata) -> tuple:
    """The lazy bits a rebuild function's ``metadata`` sets: None or a dict, as
    torch.save writes it (``{"conj": True}``, ``{"neg": True}``; other keys torch
    ignores).  torch.load sets a bit whenever its key is there, whatever the value,
    so a value other than True (``{"conj": False}``) is a FormatError: another reader
    would take it at its word.  Dropping the bits read a conjugated tensor as its
    conjugate's values."""
    if metadata is None:
        return ()
    if not isinstance(metadata, dict):
        raise FormatError(f"a tensor's metadata is {_kind(metadata)}, not a dict")
    bits = []
    for bit in _LAZY_BITS:
        if bit in metadata:
            if metadata[bit] is not True:
                raise FormatError(
                    f"a tensor's metadata gives {bit!r} as {_show(metadata[bit])}: "
                    "torch.save writes True, and torch.load sets the bit whatever the value"
                )
            bits.append(bit)
    return tuple(bits)


def _kind(value) -> str:
    """What an object of the pickle is, for a message (never its repr: it may be huge
    or nested past the recursion limit)."""
    if isinstance(value, _Global):
        return f"the function {value.qualname}"
    return {
        _TensorRecord: "a tensor",
        _StorageRef: "a storage",
        _DType: "a dtype",
        _StateDict: "an OrderedDict",
    }.get(type(value), f"a {type(value).__name__}")


def _show(value) -> str:
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int of over 4,300 digits; deep nesting
        return f"<{_kind(value)} too large to show>"
    return text if len(text) <= 80 else text[:77] + "..."


# a key is part of a tensor's name: an integer key has a decimal form (str() of one
# above about 14,000 bits is a ValueError), and a real one is an index, far below this
MAX_KEY_BITS = 1024


def _check_key(key, what="dict key"):
    """The one rule for dict keys and set items: plain values (or tuples of them),
    each with a printable name."""
    parts = key if type(key) is tuple else (key,)
    if type(key) is tuple and not all(type(k) in _KEY_TYPES for k in key):
        raise FormatError(f"a {what} that is a tuple of anything but plain values")
    if type(key) is not tuple and type(key) not in _KEY_TYPES:
        raise FormatError(f"a {what} that is {_kind(key)}, not a plain value")
    for part in parts:
        if type(part) is int and part.bit_length() > MAX_KEY_BITS:
            raise FormatError(
                f"a {what} that is an integer of {part.bit_length()} bits "
                f"(at most {MAX_KEY_BITS}: a key names a tensor)"
            )


class _Load:
    """The state of one load: its archive, limits, and what the rebuild functions
    and BUILD set aside (the ignored arguments, walked later for stray tensors)."""

    def __init__(self, archive, prefix, limits, pickle_size=0):
        self.archive, self.prefix, self.limits = archive, prefix, limits
        # the bytes values _codecs.encode may still make: each is a copy of text the
        # pickle holds, and the memo lets one text be passed to a thousand calls
        self.encode_left = pickle_size
        self.ignored: List[Tuple[str, Any]] = []
        self.storages: Dict[str, _StorageRef] = {}  # key -> its first reference

    # ---- the functions the allowlist maps to (torch._utils' signatures)
    def rebuild(self, storage, offset, size, stride, dtype_name=None, bits=()) -> _TensorRecord:
        if not isinstance(storage, _StorageRef):
            raise FormatError(
                f"a tensor whose storage is {_kind(storage)}, not a storage reference"
            )
        name = dtype_name or storage.dtype.name
        np_name, ltype = _DTYPES[name]
        dtype = np.dtype(np_name)
        if (
            type(size) not in (tuple, list)
            or type(stride) not in (tuple, list)
            or len(size) != len(stride)
            or not all(type(v) is int and 0 <= v < 1 << 62 for v in (offset, *size, *stride))
        ):
            raise FormatError(
                "malformed tensor geometry: "
                f"offset {_show(offset)}, size {_show(size)}, stride {_show(stride)}"
            )
        if len(size) > self.limits.max_rank:
            raise LimitError(f"a tensor of rank {len(size)}, above max_rank {self.limits.max_rank}")
        # a shape of no element is not held to the sizes below, but numpy must still
        # be able to make it ((0, 2**61) float64 was its bare ValueError)
        problem = shape_problem(size, dtype.itemsize)
        if problem is not None:
            raise FormatError(f"a tensor of size {list(size)}: {problem}")
        # what a copy of the tensor takes: a stride-0 view (expand) is cheap to read, but
        # a caller may ask for a copy, so its size is held to the limit too
        if math.prod(size) * dtype.itemsize > self.limits.max_component_size:
            raise LimitError(
                f"a tensor of size {list(size)} ({math.prod(size) * dtype.itemsize} "
                f"bytes) is above max_component_size "
                f"{self.limits.max_component_size}"
            )
        count = storage.nbytes // dtype.itemsize
        if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= count:
            raise FormatError(
                f"tensor of size {list(size)}, stride {list(stride)} at offset "
                f"{offset} reaches past its storage of {count} elements"
            )
        # a dimension of one element never moves: its stride is never used
        stride = tuple(s if n > 1 else 0 for n, s in zip(size, stride))
        torch_name = _STORAGE_CLASSES.get(name, name)
        return _TensorRecord(storage, offset, tuple(size), stride, dtype, ltype, torch_name, bits)

    def rebuild_tensor_v2(
        self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None
    ):
        _require_flag(requires_grad)
        self.ignored.append(("a tensor's hooks or metadata", (hooks, metadata)))
        return self.rebuild(storage, offset, size, stride, bits=_lazy_bits(metadata))

    def rebuild_tensor_v3(
        self,
        storage,
        offset,
        size,
        stride,
        requires_grad=False,
        hooks=None,
        dtype=None,
        metadata=None,
    ):
        if not isinstance(dtype, _DType):
            raise FormatError("_rebuild_tensor_v3 without a known dtype")
        _require_flag(requires_grad)
        self.ignored.append(("a tensor's hooks or metadata", (hooks, metadata)))
        return self.rebuild(storage, offset, size, stride, dtype.name, _lazy_bits(metadata))

    def rebuild_parameter(self, data, requires_grad=False, hooks=None, state=None):
        if not isinstance(data, _TensorRecord):
            raise FormatError(f"a parameter that holds {_kind(data)}, not a tensor")
        _require_flag(requires_grad)
        self.ignored.append(("a parameter's hooks or state", (hooks, state)))
        return data

    def ordered_dict(self, *args):
        if args:  # OrderedDict pickles as OrderedDict() and then its items
            raise FormatError("collections.OrderedDict called with arguments")
        return _StateDict()

    def encode(self, text, encoding):
        """``_codecs.encode``, as pickle protocol 2 (``torch.save``'s) writes a
        non-empty ``bytes`` value: ``encode(<its bytes as latin-1 text>, "latin1")``,
        and no other call, making no more bytes in all than the pickle holds.
        torch.load's ``weights_only`` reads it too (not ``b""``, written as a call of
        ``bytes``, which both refuse)."""
        if type(text) is not str or encoding != "latin1":
            raise FormatError(
                f"_codecs.encode called with {_kind(text)}, {_show(encoding)}: only "
                "a bytes value's (latin-1 text, 'latin1') is read"
            )
        # in all, no more bytes than the pickle's own: a pickle writes each bytes value
        # once, and a text shared through the memo would otherwise be copied per call
        # (86 KB made 128 MB in 2,000 calls)
        self.encode_left -= len(text)
        if self.encode_left < 0:
            raise LimitError(
                "the pickle's bytes values add up to more than the pickle: one text "
                "is encoded again and again"
            )
        try:
            return text.encode("latin1")
        except UnicodeEncodeError:
            raise FormatError(
                "_codecs.encode called with text that is not latin-1: not a bytes value"
            ) from None

    def globals(self):
        return {
            ("_codecs", "encode"): self.encode,
            ("collections", "OrderedDict"): self.ordered_dict,
            ("torch._utils", "_rebuild_tensor_v2"): self.rebuild_tensor_v2,
            ("torch._utils", "_rebuild_tensor_v3"): self.rebuild_tensor_v3,
            ("torch._utils", "_rebuild_parameter"): self.rebuild_parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): self.rebuild_parameter,
        }

    def storage(self, pid) -> _StorageRef:
        if (
            type(pid) is not tuple
            or len(pid) != 5
            or pid[0] != "storage"
            or not isinstance(pid[1], _DType)
            # a storage class (torch.save writes one, UntypedStorage for the newer
            # dtypes); torch.load fails on a dtype global there
            or pid[1].name not in _STORAGE_CLASSES
            or type(pid[2]) is not str
            or type(pid[3]) is not str  # the location torch writes ("cpu", "cuda:0")
            or type(pid[4]) is not int
            or not 0 <= pid[4] < 1 << 62
        ):
            raise FormatError(f"a persistent reference that is not a storage: {_kind(pid)}")
        member = f"{self.prefix}data/{pid[2]}"
        if member not in self.archive.members:
            raise FormatError(f"storage {pid[2][:40]!r} is not in the archive")
        # one storage, one type and size: torch.save writes each storage once (it
        # refuses views of one storage as two types), and torch.load reads every later
        # reference as the first's type and size, so a reference naming another would
        # give elements torch never gives (float bits passed off as int32)
        first = self.storages.setdefault(pid[2], _StorageRef(member, pid[1], pid[4]))
        if (first.dtype.name, first.numel) != (pid[1].name, pid[4]):
            raise FormatError(
                f"storage {pid[2][:40]!r} is referred to as {first.numel} "
                f"{first.dtype.name} elements and as {pid[4]} {pid[1].name} elements"
            )
        return first


def _require_flag(requires_grad) -> None:
    """A rebuild's ``requires_grad`` is a bool, as torch writes it and torch.load
    requires it: anything else (a tensor hidden there) is a FormatError, never
    dropped."""
    if type(requires_grad) is not bool:
        raise FormatError(f"a tensor's requires_grad is {_kind(requires_grad)}, not a bool")


# ---- the instructions that differ from Python's unpickler (each refuses what a
# ---- checkpoint never does, so a file cannot reach an object it did not make)
def _op_reduce(self):
    args = self.stack.pop()
    func = self.stack[-1]
    if type(func) is not _Global:
        raise FormatError(
            f"the pickle calls {_kind(func)}: only the allowlisted rebuild functions can be called"
        )
    if type(args) is not tuple:
        raise FormatError(f"the arguments of {func.qualname} are {_kind(args)}, not a tuple")
    self.stack[-1] = func.fn(*args)


def _op_build(self):
    state = self.stack.pop()
    inst = self.stack[-1]
    # torch.save writes BUILD once: a state dict's `_metadata` (per-module versions)
    if (
        type(inst) is not _StateDict
        or type(state) is not dict
        or set(state) != {"_metadata"}
        or not isinstance(state["_metadata"], dict)
    ):
        raise FormatError(
            f"the pickle sets the state of {_kind(inst)} to {_kind(state)}: "
            "only a state dict's _metadata is accepted"
        )
    self.context.ignored.append(("a state dict's _metadata", state))


def _set_items(target, pairs):
    if type(target) not in (dict, _StateDict):
        raise FormatError(f"the pickle sets items of {_kind(target)}")
    for key, value in pairs:
        _check_key(key)
        if key in target:
            raise FormatError(f"the pickle sets dict key {_show(key)} twice")
        target[key] = value


def _op_setitem(self):
    value = self.stack.pop()
    key = self.stack.pop()
    _set_items(self.stack[-1], ((key, value),))


def _op_setitems(self):
    items = self.pop_mark()
    if len(items) % 2:
        raise FormatError("SETITEMS with a key and no value")
    _set_items(self.stack[-1], zip(items[::2], items[1::2]))


def _op_dict(self):
    items = self.pop_mark()
    if len(items) % 2:
        raise FormatError("DICT with a key and no value")
    target = {}
    _set_items(target, zip(items[::2], items[1::2]))
    self.append(target)


def _op_append(self):
    value = self.stack.pop()
    if type(self.stack[-1]) is not list:
        raise FormatError(f"the pickle appends to {_kind(self.stack[-1])}")
    self.stack[-1].append(value)


def _op_appends(self):
    items = self.pop_mark()
    if type(self.stack[-1]) is not list:
        raise FormatError(f"the pickle appends to {_kind(self.stack[-1])}")
    self.stack[-1].extend(items)


def _op_additems(self):
    items = self.pop_mark()
    if type(self.stack[-1]) is not set:
        raise FormatError(f"the pickle adds set items to {_kind(self.stack[-1])}")
    for item in items:
        _check_key(item, "set item")
    self.stack[-1].update(items)


def _op_frozenset(self):
    items = self.pop_mark()
    for item in items:
        _check_key(item, "set item")
    self.append(frozenset(items))


_OPCODE_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
# values, containers, the memo, framing and globals: Python's own code, unchanged
_PLAIN = (
    "PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 "
    "BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE "
    "BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 "
    "EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST LIST EMPTY_DICT "
    "EMPTY_SET GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE GLOBAL "
    "STACK_GLOBAL PERSID BINPERSID"
).split()
_OURS = {
    "REDUCE": _op_reduce,
    "BUILD": _op_build,
    "SETITEM": _op_setitem,
    "SETITEMS": _op_setitems,
    "DICT": _op_dict,
    "APPEND": _op_append,
    "APPENDS": _op_appends,
    "ADDITEMS": _op_additems,
    "FROZENSET": _op_frozenset,
}


def _refuser(name):
    def refuse(self):
        raise FormatError(f"the pickle uses the {name} instruction, which a checkpoint never needs")

    return refuse


# the stdlib's pure-Python unpickler, the one private name this package takes from
# outside it (house rule 2, tests/test_architecture.py): restricting the opcodes needs its
# dispatch table (opcode -> handler); the C unpickler has none to replace
_PythonUnpickler = pickle._Unpickler


def _dispatch():
    """The unpickler's instruction table: every opcode not named here is refused
    (INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER, and any byte
    that is no opcode).  BYTEARRAY8 too: torch.save never writes it, and Python's
    handler allocates the length it declares before reading (a 12-byte pickle made
    a 4 GiB allocation); every other length-prefixed opcode reads what is there."""
    base = _PythonUnpickler.dispatch
    codes = {name: code for code, name in _OPCODE_NAMES.items()}
    table = {
        code: _refuser(_OPCODE_NAMES.get(code, f"unknown opcode {code:#04x}"))
        for code in range(256)
    }
    for name in _PLAIN:
        table[codes[name]] = base[codes[name]]
    for name, fn in _OURS.items():
        table[codes[name]] = fn
    return table


class RestrictedUnpickler(_PythonUnpickler):  # the Python one: its dispatch is a table
    """An unpickler that can build tensors, dicts and plain values, and nothing else
    (see the module doc)."""

    dispatch = _dispatch()

    def __init__(self, file, context: _Load):
        super().__init__(file)
        self.context = context
        self._globals = context.globals()

    def find_class(self, module, name):
        found = self._globals.get((module, name))
        if found is not None:
            return _Global(f"{module}.{name}", found)
        if module in ("torch", "torch.storage") and name in _DTYPES:
            return _DType(name)
        if module in ("torch", "torch.storage") and (
            name in _OTHER_TORCH_DTYPES or name.endswith("Storage")
        ):
            # a valid checkpoint of a dtype zTensor has no type for: said as such
            raise UnsupportedError(
                f"the checkpoint holds torch.{name[:100]} tensors, a dtype zTensor does not store"
            )
        raise FormatError(
            f"refusing to load {module[:100]}.{name[:100]} from a pickle: a "
            "checkpoint may hold tensors and plain containers only (no code "
            "is run)"
        )

    def persistent_load(self, pid):
        return self.context.storage(pid)


def open_file(path, limits: Limits = DEFAULT_LIMITS, *, mmap: bool = True) -> ForeignFile:
    name = os.fspath(path)
    archive = ZipArchive(name, limits, "PyTorch checkpoint", mmap=mmap)
    try:
        return _open(name, archive, limits)
    except ZTensorError as exc:
        archive.close()
        exc.locate(name)  # raised inside the unpickler, which knows no path
        raise
    except MemoryError:
        archive.close()
        raise LimitError("not enough memory to read the checkpoint", path=name) from None
    except BaseException:
        archive.close()
        raise


def _open(name, archive, limits) -> ForeignFile:
    members = archive.members
    pickles = [n for n in members if n == "data.pkl" or n.endswith("/data.pkl")]
    if not pickles:
        raise FormatError("not a PyTorch checkpoint: no data.pkl", path=name)
    if len(pickles) > 1:  # which one torch.load would take depends on its version
        raise FormatError(
            f"two pickles, {pickles[0][:80]!r} and {pickles[1][:80]!r}: which is the checkpoint?",
            path=name,
        )
    pkl = pickles[0]
    prefix = pkl[: -len("data.pkl")]
    order = "little"
    if prefix + "byteorder" in members:
        if members[prefix + "byteorder"].size > 16:
            raise FormatError("the byteorder member is not 'little' or 'big'", path=name)
        # exactly the word: torch.load refuses any other bytes (" big\n" too), so
        # reading one as big-endian would give values torch never gives
        word = bytes(archive.read(prefix + "byteorder"))
        if word not in (b"little", b"big"):
            raise FormatError(
                f"the byteorder member holds {word[:20]!r}, not b'little' or b'big'", path=name
            )
        order = word.decode("ascii")
    if members[pkl].size > MAX_PICKLE:
        raise LimitError(f"data.pkl of {members[pkl].size} bytes exceeds {MAX_PICKLE}", path=name)
    raw = bytes(archive.read(pkl, obj=None))
    load = _Load(archive, prefix, limits, len(raw))
    try:
        obj = RestrictedUnpickler(io.BytesIO(raw), load).load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        OverflowError,
        RecursionError,
        struct.error,
    ) as exc:
        if isinstance(exc, ZTensorError):
            raise
        raise FormatError(
            f"not a readable PyTorch checkpoint: {type(exc).__name__}: {str(exc)[:200]}", path=name
        ) from None
    tensors, attributes = _collect(obj, len(raw), name, limits)
    _check_ignored(load.ignored, tensors, len(raw), name)
    arrays = _read_storages(archive, tensors, name)
    _check_visits(archive, tensors, name, limits)
    entries = {key: _entry(arrays, record, order, name, key) for key, record in tensors.items()}
    return ForeignFile(name, "pickle", attributes, entries, closer=archive.close)


def _check_visits(archive, tensors, path, limits) -> None:
    """The bytes the file's named tensors make a read visit, held by the one rule for
    bytes read under many names (spec.check_visits) to the bytes their storages decode
    to plus a multiple of the bytes those members take in the file (each storage read
    and held to its size first: :func:`_read_storages`).  A stride-0 axis (``expand``)
    repeats one element and every reader collapses it, so it costs nothing; any other
    axis is visited element by element, and views that overlap (``as_strided`` with
    strides (1, 1)) visit the same bytes again and again: four such views of a 128 KB
    storage, 133 KB of file, made ``stats`` read 4 GB for 21 s.  Counted per name, as
    each is read (one view under many names of a shared container is read once per
    name), over the storages named tensors use only (a bare reference declaring 2**40
    elements of a 4-byte member lifted the budget), and against the members'
    compressed sizes (a deflated 128 MiB storage of zeros, 131 KB of file, lifted it
    to 8 GiB)."""
    stored = {record.storage.member: record.storage.nbytes for record in tensors.values()}
    present = sum(archive.members[member].present for member in stored)
    visited = 0
    for record in tensors.values():
        if math.prod(record.size):
            steps = (n for n, s in zip(record.size, record.stride) if s)
            visited += math.prod(steps) * record.dtype.itemsize
    check_visits(path, visited, sum(stored.values()), present, limits)


def _read_storages(archive, tensors, path) -> Dict[str, np.ndarray]:
    """The bytes of every storage a named tensor uses, once each storage's member has
    been held to the size the pickle declares for it (exactly: fewer or more bytes are
    a FormatError) and the members' decoded sizes to the limits: nothing is decoded or
    allocated for a size the pickle or the zip merely declares."""
    users: Dict[str, str] = {}
    for key, record in tensors.items():
        ref = record.storage
        # torch.save writes each storage's numel * element size bytes, and torch.load
        # (mmap=False, its default) refuses a record of another size
        check_held_size(
            archive.members[ref.member].size,
            ref.nbytes,
            f"storage member {ref.member[:80]!r}",
            f"the pickle's {ref.dtype.name} of {ref.numel} elements",
            path=path,
            obj=key,
        )
        users.setdefault(ref.member, key)
    archive.check_decoded(users, users.get)
    arrays = {}
    for member, key in users.items():
        raw = np.frombuffer(archive.read(member, obj=key), np.uint8)
        # torch.save aligns storages to 64 bytes; a zip made otherwise may not, and
        # numpy views of misaligned elements trouble other libraries: copy those
        if raw.ctypes.data % 16:
            raw = raw.copy()
            raw.flags.writeable = False
        arrays[member] = raw
    return arrays


def _entry(arrays, record, order, path, key) -> Entry:
    """The tensor's entry: a read-only view of its storage's elements, at hand; or, for
    a big-endian checkpoint's elements of more than a byte and for a tensor saved with
    torch's lazy bits (:func:`_lazy_bits`), an entry each load of which swaps or
    resolves (conjugates, negates, as torch.load does) the elements that view reaches,
    each once (a stride-0 view of a few bytes stays a few bytes: io/values.elementwise).
    Nothing is copied at open: one copy of a storage per dtype and lazy bits, made
    eagerly, let 23 one-element views of a 128 MiB storage hold 3.5 GB before a
    tensor was read."""
    dtype = record.dtype
    raw = arrays[record.storage.member]
    count = record.storage.nbytes // dtype.itemsize
    stored = _view(raw[: count * dtype.itemsize].view(dtype), record, path, key)
    types = {"data": record.ltype} if record.ltype else None
    # torch.load swaps a big-endian storage as the elements its reference names (an
    # UntypedStorage's bytes: not at all), then views it as the tensor's type
    width = record.storage.itemsize
    swap = order == "big" and dtype.itemsize > 1 and width > 1
    if swap and width != dtype.itemsize:
        raise FormatError(
            f"a big-endian checkpoint's {record.torch} tensor views a storage of "
            f"{record.storage.dtype.name} elements: torch.save writes a storage's tensors "
            "in its own type, and swapping one width as another gives no value torch gives",
            path=path,
            obj=key,
        )
    if not swap and not record.bits:
        return eager(key, Tensor({"data": stored}, shape=stored.shape, types=types))
    for bit in record.bits:
        if record.torch not in _LAZY_BITS[bit]:
            raise UnsupportedError(
                f"a {record.torch} tensor saved with torch's lazy {bit!r} bit, which "
                "torch resolves for none of that type",
                path=path,
                obj=key,
            )

    def elements(arr: np.ndarray) -> np.ndarray:
        out = arr.byteswap() if swap else arr
        if "conj" in record.bits:
            out = np.conjugate(out)
        if "neg" in record.bits and record.ltype:  # bfloat16, kept as its bits: the sign bit
            out = out ^ np.array(1 << (8 * dtype.itemsize - 1), dtype)
        elif "neg" in record.bits:
            out = np.negative(out)
        out.flags.writeable = False
        return out

    def load() -> Tensor:
        arr = values.elementwise(elements, stored)
        return Tensor({"data": arr}, shape=arr.shape, types=types)

    def read_rows(start: int, end: int) -> np.ndarray:  # a part: its rows' elements only
        return values.elementwise(elements, stored[start:end])

    # the spec from the stored view: the same dtype, shape and size as what load gives
    spec = spec_of(key, Tensor({"data": stored}, shape=stored.shape, types=types))
    return Entry(spec, load, whole=True, read_rows=read_rows if stored.ndim else None)


def _view(elements, record, path, key):
    """The tensor as a read-only numpy view of its storage's elements (geometry
    checked at rebuild); a tensor of no elements is an empty array."""
    dtype = record.dtype
    if not math.prod(record.size):
        return np.zeros(record.size, dtype)
    try:
        return np.lib.stride_tricks.as_strided(
            elements[record.offset :],
            shape=record.size,
            strides=tuple(s * dtype.itemsize for s in record.stride),
            writeable=False,
        )
    except (ValueError, OverflowError) as exc:
        raise FormatError(f"tensor geometry numpy cannot view: {exc}", path=path, obj=key) from None


class _Node:
    """A place in the unpickled object: its parent and key (the path is built only
    for a tensor's name, so the walk stays linear however deep it goes)."""

    __slots__ = ("parent", "key", "depth")

    def __init__(self, parent, key):
        self.parent, self.key = parent, key
        self.depth = 0 if parent is None else parent.depth + 1

    def keys(self) -> tuple:
        out, node = [], self
        while node is not None and node.parent is not None:
            out.append(node.key)
            node = node.parent
        return tuple(reversed(out))


def _containers(value):
    """The children of a container the walk enters, else None."""
    kind = type(value)
    if kind in (dict, _StateDict):
        return value.items()
    if kind in (list, tuple):
        return enumerate(value)
    return None


def _collect(obj, budget, path, limits) -> Tuple[Dict[str, _TensorRecord], Dict[str, Any]]:
    """Tensors (by dotted name) and plain values (as attributes) of the unpickled
    object.

    * Names go through one NameTable: ``{"a.b": t, "a": {"b": u}}`` or
      ``{1: t, "1": u}`` is a FormatError naming both paths, never a tensor dropped.
    * A tensor nested deeper than MAX_DEPTH containers is a LimitError (the walk goes
      on past that depth to look for one, within its budget).
    * A pickle can share one container many times (its memo), as ``torch.save``
      writes ``{"model": sd, "ema": sd}``: it is walked by every path that reaches
      it, so each of its tensors has a name under each (``model.w`` and ``ema.w``,
      as ``torch.load`` gives them; one tensor, two names).  A container inside
      itself (a cycle) is not entered again: its tensors are named by the path that
      first reached it, and one that held no tensor is not walked again (its plain
      values are attributes under the first path only).  The walk stops after
      MAX_DEPTH times ``budget`` steps (a LimitError), so the work follows the
      pickle's bytes, never what its sharing describes.
    * A pickle can also share one long key at every level of a deep nesting, so the
      names it makes (a path's keys joined) can be far larger than its bytes: the
      tensors' names, and apart from them the attributes' names and values, are each
      held to :func:`_text_budget`.  A tensor's name past it is a LimitError; a plain
      value past it (or past MAX_ATTRIBUTES values, or deeper than MAX_DEPTH) is not
      kept, and the attribute ``pickle.omitted_attributes`` counts those not kept, so
      no amount of attribute text can make a tensor's name fail.
    * Plain values (int, float, str, bool) are kept whole: a string is never cut.
      Any other value (bytes, None, a complex number) has no attribute to hold it
      and is counted in ``pickle.omitted_attributes`` too: nothing goes unsaid.
    """
    names = NameTable(path, "tensor")
    attribute_names = NameTable(path, "attribute")
    tensors: Dict[str, _TensorRecord] = {}
    attributes: Dict[str, Any] = {}
    names_left = attributes_left = _text_budget(budget, limits)
    omitted = 0
    on_path = set()  # the containers the walk is inside
    # containers walked whole that held no tensor: none is walked again (a config
    # dict shared by 200 layers names its values once, under its first path)
    tensorless = set()
    stack: List[Any] = [(_Node(None, None), obj)]
    steps = 0
    while stack:
        node, value = stack.pop()
        if node is None:  # the walk leaves a container: (its id, the tensors on entry)
            left, count = value
            on_path.discard(left)
            if count == len(tensors):
                tensorless.add(left)
            continue
        steps += 1
        if steps > MAX_DEPTH * budget:
            raise LimitError("the checkpoint's object graph is larger than its pickle", path=path)
        if type(value) is _TensorRecord:
            keys = node.keys()
            if len(keys) > MAX_DEPTH:
                raise LimitError(
                    f"a tensor nested {len(keys)} containers deep (at most {MAX_DEPTH})",
                    path=path,
                    obj=".".join(_show(k) for k in keys[:8]) + "...",
                )
            parts = [str(k) for k in keys]
            names_left -= _text_size(parts)
            if names_left < 0:
                raise LimitError(
                    "the checkpoint's tensor names total more than "
                    f"{_text_budget(budget, limits)} characters ({MAX_DEPTH} times its "
                    "pickle's size, at most max_manifest_size): its keys are shared "
                    "far more often than a checkpoint shares them",
                    path=path,
                )
            name = ".".join(parts) if keys else "tensor"
            tensors[names.claim(name, keys or "the whole checkpoint")] = value
            check_file_totals(path, limits, len(tensors))
            continue
        children = _containers(value)
        if children is not None:
            if id(value) in on_path or id(value) in tensorless:
                continue  # a cycle (inside itself), or no tensor in it to name
            on_path.add(id(value))
            stack.append((None, (id(value), len(tensors))))
            stack.extend(reversed([(_Node(node, k), v) for k, v in children]))
            continue
        if type(value) in (int, float, str, bool) and node.parent is not None:
            full = len(attributes) >= MAX_ATTRIBUTES or attributes_left <= 0
            if node.depth > MAX_DEPTH or full:
                omitted += 1
                continue
            parts = [str(k) for k in node.keys()]
            size = _text_size(parts) + _text_size([value])
            if size > attributes_left:
                omitted += 1
                continue
            attributes_left -= size
            keys = node.keys()
            name = attribute_names.claim("pickle." + ".".join(parts), keys)
            attributes[name] = value
        elif node.parent is not None:
            omitted += 1  # bytes, None, complex...: no attribute holds them, counted
    if omitted:  # said, not dropped without a word
        name = attribute_names.claim(OMITTED_ATTRIBUTES, "the count of values not kept")
        attributes[name] = omitted
    if not tensors and obj is not None and _containers(obj) is None:
        raise UnsupportedError("the checkpoint holds no tensors", path=path)
    return tensors, attributes


# the attribute that counts the plain values _collect did not keep
OMITTED_ATTRIBUTES = "pickle.omitted_attributes"


def _text_budget(pickle_size: int, limits: Limits) -> int:
    """How much text one checkpoint's walk may make of tensor names (and, apart, of
    attribute names and values): MAX_DEPTH times its pickle's size, and never more
    than ``limits.max_manifest_size``, the most a file's names and attributes may
    take once converted.  A real checkpoint stays far below it: every tensor's
    record takes pickle bytes of its own (its rebuild call, its storage), which a
    name of ordinary length does not outgrow by MAX_DEPTH times even when a shared
    prefix key is counted in every name below it.  Only one long key shared at many
    levels through the pickle's memo makes more."""
    return min(MAX_DEPTH * pickle_size, limits.max_manifest_size)


def _text_size(values) -> int:
    """The characters a name's parts or an attribute value count against the budget
    (a number: its bytes, at least 8)."""
    return sum(
        len(v) if type(v) is str else max(8, (v.bit_length() + 7) // 8) if type(v) is int else 8
        for v in values
    )


def _check_ignored(ignored, tensors, budget, path) -> None:
    """The arguments the rebuild functions drop (hooks, metadata, a parameter's state)
    and a state dict's ``_metadata`` hold no tensor that has no name: torch.save
    writes none there, and one found would otherwise vanish from the conversion."""
    named = {id(record) for record in tensors.values()}
    seen = set()
    stack = [(where, value) for where, value in ignored]
    steps = 0
    while stack:
        where, value = stack.pop()
        steps += 1
        if steps > budget + len(ignored):
            raise LimitError("the checkpoint's object graph is larger than its pickle", path=path)
        if type(value) is _TensorRecord:
            if id(value) not in named:
                raise UnsupportedError(
                    f"a tensor kept in {where} (not a place a "
                    "checkpoint keeps tensors) would not be read",
                    path=path,
                )
            continue
        children = _containers(value)
        if children is not None and id(value) not in seen:
            seen.add(id(value))
            stack.extend((where, v) for _, v in children)
