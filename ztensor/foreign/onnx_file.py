"""ONNX models (``.onnx``) through onnx (optional): every initializer, by name, and
every ``Constant`` node of the main graph, by its output's name (a graph may hold
weights there instead of in initializers).
onnx parses the whole protobuf (it has no index to read from); tensors with
their data in external files are refused unless the files sit in the model's folder
(no ``..``, no absolute path, no symbolic link: :class:`_ExternalData`, which reads
them itself, so the rule does not depend on onnx's version); each is read when its
tensor is, after the checks below and once every tensor's external range is
placed (no external byte serves two tensors).
Two initializers or constants under one name are an error naming both (protobuf keeps
both; which one a runtime uses is its own choice).  Initializers of a type zTensor
has no dtype for (strings; the packed 4- and 2-bit types INT4, UINT4, FLOAT4E2M1, INT2,
UINT2) are listed in the ``onnx.skipped_initializers`` attribute,
sparse initializers in ``onnx.skipped_sparse_initializers`` (their dense form has the
size their ``dims`` declare, not the size of their bytes), and those of subgraphs (a
node's ``If``/``Loop`` branches) and training graphs, where they are scoped, in
``onnx.skipped_subgraph_initializers``; bfloat16 and float8 ones are read.

A Constant node's ``value`` tensor is read as an initializer is; ``value_float`` /
``value_int`` are the float32 / int64 scalars and ``value_floats`` / ``value_ints``
the 1-D tensors the operator's spec makes of them.  String and sparse constants
(``value_string(s)``, ``sparse_value``, a string ``value``) are listed in
``onnx.skipped_constants``; Constant nodes of subgraphs, training graphs and local
functions in ``onnx.skipped_subgraph_constants``.  A node that is not one valid
Constant (other than one output, other than one value attribute, an attribute whose
type is not the one its name says: onnx reads by the type, another reader by the
name) is a FormatError.

Before a tensor's values are made (:func:`_check_initializer`): its ``dims``
are sizes numpy can make (none negative: numpy would read ``-1`` as "whatever is
left") within ``max_rank`` and ``max_component_size``; its values are in one place
only (``raw_data``, external data, or the type's own typed field: onnx reads the first
of these it finds and ignores the rest, so two would let readers disagree); and
values kept in a wider typed field (``int32_data`` for int8, bool, float16 bit
patterns) fit the type (onnx narrows them silently: 300 would become int8 44)."""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError, ZTensorError
from ztensor.foreign.base import ForeignFile, eager, optional_import
from ztensor.foreign.names import NameTable
from ztensor.io.paths import folder_of
from ztensor.io.source import open_local_input
from ztensor.objects import shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits, check_file_totals
from ztensor.tensor import Tensor


def open_file(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    onnx = optional_import("onnx", "reading ONNX files", name)
    numpy_helper = optional_import("onnx.numpy_helper", "reading ONNX files", name)
    # the file checked (a regular file, opened without blocking) is the one parsed:
    # onnx given the path opened it again, and a FIFO put there in between hung it
    checked = open_local_input(name)
    try:
        # external data is read per initializer, after its checks (to_array below)
        with checked:
            model = onnx.load_model_from_string(checked.read())
    except MemoryError:
        raise LimitError("not enough memory to parse the model", path=name) from None
    except Exception as exc:  # protobuf's DecodeError and friends: not a model
        raise FormatError(
            f"not a readable ONNX model: {type(exc).__name__}: {str(exc)[:200]}", path=name
        ) from None
    base_dir = folder_of(name)  # where the system resolves the model's neighbours
    names = NameTable(name, "initializer")

    def claim(key, origin):
        # protobuf keeps every repeated initializer; a dict would keep the last
        names.claim(key, origin)
        check_file_totals(name, limits, len(names))

    # first every tensor is checked and its external range placed, and no external
    # byte may serve two tensors (_ExternalData.check_disjoint), before any is read:
    # a data file shared by many tensors is refused, not read once for each
    plan = []  # (key, tensor, what, external place or None), in the model's order
    with _ExternalData(base_dir, name) as external:

        def place(tensor, key, what):
            declared = _check_initializer(onnx, tensor, name, limits, key)
            spot = None
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                spot = external.place(tensor, key, declared)
            plan.append((key, tensor, what, spot))

        for index, init in enumerate(model.graph.initializer):
            claim(init.name, f"initializer {index}")
            place(init, init.name, "initializer")
        sparse = []
        for index, tensor in enumerate(model.graph.sparse_initializer):
            claim(tensor.values.name, f"sparse initializer {index}")
            sparse.append(tensor.values.name)
        for index, node in enumerate(model.graph.node):
            if not _is_constant(node):
                continue
            key, tensor = _constant_tensor(onnx, node, name)
            claim(key, f"Constant node {index}" + (f" ({node.name[:80]!r})" if node.name else ""))
            if tensor is None:  # a string or sparse constant: listed, in node order
                plan.append((key, None, "Constant node", None))
                continue
            place(tensor, key, "Constant node")
        external.check_disjoint()
        entries = {}
        skipped: list = []
        skipped_constants: list = []
        for key, tensor, what, spot in plan:
            if tensor is None:
                skipped_constants.append(key)
                continue
            if spot is not None:
                # its bytes read here, under ztensor's rules, never by onnx's loader
                # (whose checks depend on its version: 1.14 joined any path given)
                inline = onnx.TensorProto()
                inline.CopyFrom(tensor)
                inline.ClearField("external_data")
                inline.data_location = onnx.TensorProto.DEFAULT
                inline.raw_data = external.read(spot, key)
                tensor = inline
            try:
                arr = np.asarray(numpy_helper.to_array(tensor))
            except Exception as exc:  # a malformed tensor: onnx's own error
                raise FormatError(
                    f"cannot read {what}: {type(exc).__name__}: {str(exc)[:200]}",
                    path=name,
                    obj=key,
                ) from None
            if dtypes.spec_types_for(arr.dtype) is None:  # strings: not a tensor we hold
                (skipped if what == "initializer" else skipped_constants).append(key)
                continue
            entries[key] = eager(key, Tensor({"data": arr}))
    attributes = {
        "onnx.ir_version": int(model.ir_version),
        "onnx.producer_name": _text(model.producer_name, name, "producer_name"),
    }
    if skipped:  # said, not dropped without a word
        attributes["onnx.skipped_initializers"] = skipped
    if sparse:
        attributes["onnx.skipped_sparse_initializers"] = sparse
    if skipped_constants:
        attributes["onnx.skipped_constants"] = skipped_constants
    nested, nested_constants = _nested(onnx, model, name)
    if nested:
        attributes["onnx.skipped_subgraph_initializers"] = nested
    if nested_constants:
        attributes["onnx.skipped_subgraph_constants"] = nested_constants
    return ForeignFile(name, "onnx", attributes, entries)


def _text(value, path, field: str) -> str:
    """A string field of the model as text: protobuf gives a proto2 string that is not
    UTF-8 as bytes, which is refused (it was stored as ``"b'...'"``)."""
    if type(value) is not str:
        raise FormatError(f"the model's {field} {value[:80]!r} is not UTF-8 text", path=path)
    return value


def _is_constant(node) -> bool:
    """An ONNX ``Constant`` node (the default domain: another domain's ``Constant``
    is another operator)."""
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


# a Constant node's value attributes: AttributeProto type, and for the plain ones
# the TensorProto type they stand for (the ONNX operator spec: a float is a float32
# scalar, floats a 1-D float32 tensor, an int an int64 scalar, ints 1-D int64)
_CONSTANT_VALUES = {
    "value": ("TENSOR", None),
    "value_float": ("FLOAT", "FLOAT"),
    "value_floats": ("FLOATS", "FLOAT"),
    "value_int": ("INT", "INT64"),
    "value_ints": ("INTS", "INT64"),
    "value_string": ("STRING", None),
    "value_strings": ("STRINGS", None),
    "sparse_value": ("SPARSE_TENSOR", None),
}


def _constant_tensor(onnx, node, path):
    """(output name, TensorProto) of a ``Constant`` node of the main graph: its
    ``value`` tensor as given, a plain number or list made the tensor the operator
    spec says it is, or None for a string or sparse value (listed, not read).  A
    node that is not one Constant (not exactly one output, not exactly one value
    attribute, an attribute of another type than its name says: onnx reads by the
    type, another reader by the name) is a FormatError."""
    outputs = list(node.output)
    if len(outputs) != 1 or not outputs[0]:
        raise FormatError(
            f"a Constant node ({node.name[:80]!r}) with outputs {outputs[:4]!r:.120}: "
            "it has exactly one, named",
            path=path,
        )
    key = outputs[0]
    where = {"path": path, "obj": key}
    attrs = list(node.attribute)
    if len(attrs) != 1 or attrs[0].name not in _CONSTANT_VALUES:
        raise FormatError(
            f"a Constant node holds one of {', '.join(_CONSTANT_VALUES)}; this one has "
            f"{[a.name[:40] for a in attrs[:8]]!r}",
            **where,
        )
    attr = attrs[0]
    kind, elements = _CONSTANT_VALUES[attr.name]
    if attr.ref_attr_name:  # a function's attribute: no value outside a function
        raise FormatError(
            f"Constant attribute {attr.name!r} refers to a function attribute", **where
        )
    if attr.type != getattr(onnx.AttributeProto, kind):
        types = onnx.AttributeProto.AttributeType
        given = types.Name(attr.type) if attr.type in types.values() else attr.type
        raise FormatError(
            f"Constant attribute {attr.name!r} is of type {given}, not {kind}", **where
        )
    if attr.name == "value":
        return key, attr.t
    if elements is None:
        return key, None
    data_type = getattr(onnx.TensorProto, elements)
    field = "float_data" if elements == "FLOAT" else "int64_data"
    if kind in ("FLOAT", "INT"):  # a scalar
        values = [attr.f if kind == "FLOAT" else attr.i]
        return key, onnx.TensorProto(data_type=data_type, dims=[], **{field: values})
    values = attr.floats if kind == "FLOATS" else attr.ints
    return key, onnx.TensorProto(data_type=data_type, dims=[len(values)], **{field: values})


def _nested(onnx, model, path) -> tuple:
    """(initializers, Constant nodes) outside the main graph's own: where each is, in
    the subgraphs a node holds (``If``'s branches, ``Loop``'s body, at any depth), the
    training graphs and the model's local functions (which have Constant nodes but no
    initializers).  They are weights the model has, scoped to their graph (a name may
    repeat an outer one), so they are listed, never dropped without a word.  The walk
    is over the parsed model: its size is the file's."""
    found, constants = [], []
    pending = (
        [(model.graph, "")]
        + [
            (g, f"training_info[{i}].{part}")
            for i, info in enumerate(model.training_info)
            for part, g in (("initialization", info.initialization), ("algorithm", info.algorithm))
        ]
        + [(f, f"functions[{i}]:{f.domain}.{f.name}") for i, f in enumerate(model.functions)]
    )
    for graph, where in pending:  # grows as subgraphs are found: each graph once
        if where:
            found += [
                f"{where}/{_text(t.name, path, 'initializer name')}"
                for t in getattr(graph, "initializer", ())
            ]
            found += [
                f"{where}/{_text(t.values.name, path, 'initializer name')}"
                for t in getattr(graph, "sparse_initializer", ())
            ]
            constants += [
                f"{where}/{','.join(_text(out, path, 'node output') for out in node.output)}"
                for node in graph.node
                if _is_constant(node)
            ]
        for node in graph.node:
            for attr in node.attribute:
                inner = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                node_name = f"{node.name or node.op_type}.{attr.name}"
                # torch exports name nodes "/model/If": that first "/" is the name's own
                owner = f"{where}/{node_name}" if where else node_name
                pending += [
                    (g, owner if len(inner) == 1 else f"{owner}[{i}]") for i, g in enumerate(inner)
                ]
    return found, constants


# the keys of a tensor's external_data entries that say where its bytes are
# (onnx.external_data_helper.ExternalDataInfo reads these and ignores others)
_EXTERNAL_KEYS = ("location", "offset", "length", "checksum", "basepath")


class _ExternalData:
    """The external data files of one open model (``data_location=EXTERNAL``), read
    under ztensor's own rules whatever onnx's version (before 1.16 onnx's loader
    joined any location to the model's folder: ``../secret``, ``/etc/passwd``):

    * the location is a relative path inside the model's folder: no ``..`` part, not
      absolute, no NUL, not a symbolic link, and resolving (through any linked folder)
      to a place inside the folder (onnx's current loader refuses the same);
    * the file opened is the one checked (:func:`open_local_input`: a regular file,
      never a FIFO or device, opened without blocking), and stays the one checked:
      a later open that finds another file there is refused;
    * ``offset`` and ``length`` are decimal digits, each key given once (onnx keeps
      the last of a repeated key), and the range lies inside the file;
    * no more than ``declared``, the tensor's size (``_check_initializer`` held it to
      the limits), is read, so a model's tensor cannot take a whole data file;
    * no byte of a file is read for two tensors (:meth:`check_disjoint`, before any
      is read): onnx's writer gives each its own range, and ranges shared by
      thousands of initializers of a few bytes each made one data file gigabytes of
      tensors.

    Each location is checked and stat'ed once per model, and a few files are kept
    open between reads (not one per location: a model may name thousands), so a
    tensor costs a seek and a read, and the overlap check is one sort."""

    _OPEN_AT_ONCE = 8

    def __init__(self, base_dir: str, path: str) -> None:
        self.base_dir, self.root, self.path = base_dir, os.path.realpath(base_dir), path
        self.files: dict = {}  # location -> (full path, (device, inode), size)
        self.ranges: dict = {}  # (device, inode) -> [(offset, end, tensor, location)]
        self.handles: OrderedDict = OrderedDict()  # location -> open file, last used last

    def __enter__(self) -> "_ExternalData":
        return self

    def __exit__(self, *exc) -> None:
        while self.handles:
            self.handles.popitem()[1].close()

    def place(self, tensor, key: str, declared: int) -> tuple:
        """(location, offset, length) of a tensor's external bytes, once checked."""
        where = {"path": self.path, "obj": key}
        info = {}
        for entry in tensor.external_data:
            if not isinstance(entry.key, str) or not isinstance(entry.value, str):
                # protobuf hands a proto2 string field that is not UTF-8 out as bytes
                raise FormatError(
                    f"external data entry {entry.key[:40]!r} is not UTF-8 text", **where
                )
            if entry.key in info:
                raise FormatError(
                    f"external data key {entry.key[:40]!r} given twice: readers differ "
                    "on which one counts",
                    **where,
                )
            info[entry.key] = entry.value
        location = info.get("location", "")
        numbers = {}
        for name in ("offset", "length"):
            text = info.get(name)
            if text is not None and not (text.isascii() and text.isdigit()):
                raise FormatError(f"external data {name} {text[:40]!r} is not a number", **where)
            numbers[name] = None if text is None else int(text)
        file = self.files.get(location)
        if file is None:
            file = self.files[location] = self._check_file(location, where)
        size = file[2]
        offset = numbers["offset"] or 0
        length = size - offset if numbers["length"] is None else numbers["length"]
        if offset > size or length > size - offset:
            raise FormatError(
                f"external data [{offset}, +{length}) runs past the end of "
                f"{location[:200]!r} ({size} bytes)",
                **where,
            )
        if length > declared:
            raise FormatError(
                f"external data of {length} bytes in {location[:200]!r} for a tensor of {declared}",
                **where,
            )
        if length:
            self.ranges.setdefault(file[1], []).append((offset, offset + length, key, location))
        return location, offset, length

    def _check_file(self, location: str, where: dict) -> tuple:
        parts = location.replace("\\", "/").split("/")
        if (
            not location
            or "\0" in location
            or os.path.isabs(location)
            or os.path.splitdrive(location)[0]
            or ".." in parts
        ):
            raise FormatError(
                f"external data location {location[:200]!r} is not a file name inside "
                "the model's folder",
                **where,
            )
        full = os.path.join(self.base_dir, location)
        if (
            os.path.islink(full)
            or os.path.commonpath([self.root, os.path.realpath(full)]) != self.root
        ):
            raise FormatError(
                f"external data location {location[:200]!r} is a symbolic link or leads "
                "outside the model's folder",
                **where,
            )
        with self._open(full, location, where) as f:
            stat = os.fstat(f.fileno())
            return full, (stat.st_dev, stat.st_ino), stat.st_size

    def _open(self, full: str, location: str, where: dict, ident=None):
        """The file at ``full``, opened as :func:`open_local_input` opens one, and the
        file that path names (not a link put there since), and when ``ident`` is
        given the very file checked before."""
        try:
            f = open_local_input(full)
        except ZTensorError as exc:  # a FIFO, a device, a folder: said for the model
            raise FormatError(f"external data {location[:200]!r}: {exc.message}", **where) from None
        except OSError as exc:
            raise FormatError(
                f"cannot read external data {location[:200]!r}: {exc.strerror or exc}", **where
            ) from None
        stat = os.fstat(f.fileno())
        try:
            linked = os.lstat(full)
        except OSError:  # gone since it was opened
            linked = None
        found = (stat.st_dev, stat.st_ino)
        if linked is None or found != (linked.st_dev, linked.st_ino) or found != (ident or found):
            f.close()
            raise FormatError(f"external data file {location[:200]!r} changed", **where)
        return f

    def check_disjoint(self) -> None:
        """No byte of an external file serves two tensors: each file's ranges sorted
        once, and each compared with the one before it (ranges sorted by start, the
        first overlap there is always lies between neighbours)."""
        for spans in self.ranges.values():
            spans.sort()
            for before, (offset, end, key, location) in zip(spans, spans[1:]):
                if offset < before[1]:
                    raise FormatError(
                        f"external data [{offset}, +{end - offset}) of {location[:200]!r} "
                        f"overlaps the bytes of {before[2][:80]!r}: each tensor has its own",
                        path=self.path,
                        obj=key,
                    )

    def read(self, spot: tuple, key: str) -> bytes:
        """The bytes :meth:`place` gave, from the file it checked."""
        location, offset, length = spot
        where = {"path": self.path, "obj": key}
        f = self.handles.pop(location, None)
        if f is None:
            full, ident, _ = self.files[location]
            f = self._open(full, location, where, ident)
            if len(self.handles) >= self._OPEN_AT_ONCE:
                self.handles.popitem(last=False)[1].close()
        self.handles[location] = f
        try:
            f.seek(offset)
            data = f.read(length)
        except OSError as exc:
            raise FormatError(
                f"cannot read external data {location[:200]!r}: {exc.strerror or exc}", **where
            ) from None
        if len(data) != length:
            raise FormatError(f"external data {location[:200]!r} shrank while read", **where)
        return data


# where a TensorProto may keep its values; onnx's to_array reads raw_data (or external
# data) if present and else the type's own field, ignoring every other
_TYPED_FIELDS = (
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)
# element types kept in a wider typed field -> the values that field may hold: a
# number the type holds, or for float16/bfloat16/float8 a bit pattern of its width
# (read as signed or unsigned, as writers differ)
_FIELD_RANGES = {
    "BOOL": (0, 1),
    "UINT8": (0, (1 << 8) - 1),
    "INT8": (-(1 << 7), (1 << 7) - 1),
    "UINT16": (0, (1 << 16) - 1),
    "INT16": (-(1 << 15), (1 << 15) - 1),
    "UINT32": (0, (1 << 32) - 1),
    "FLOAT16": (-(1 << 15), (1 << 16) - 1),
    "BFLOAT16": (-(1 << 15), (1 << 16) - 1),
    "FLOAT8E4M3FN": (-(1 << 7), (1 << 8) - 1),
    "FLOAT8E4M3FNUZ": (-(1 << 7), (1 << 8) - 1),
    "FLOAT8E5M2": (-(1 << 7), (1 << 8) - 1),
    "FLOAT8E5M2FNUZ": (-(1 << 7), (1 << 8) - 1),
    "FLOAT8E8M0": (-(1 << 7), (1 << 8) - 1),
}


def _check_initializer(onnx, init, path, limits, key) -> int:
    """An initializer's (or a Constant node's tensor's, named ``key``) dims, size and
    where its values lie, before any is read (see the module doc); returns its size
    in bytes as numpy holds it."""
    try:
        type_name = onnx.TensorProto.DataType.Name(init.data_type)
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        field = onnx.helper.tensor_dtype_to_field(init.data_type)
    except (KeyError, ValueError, TypeError):
        raise FormatError(
            f"ONNX element type {init.data_type} is not one onnx knows", path=path, obj=key
        ) from None
    dims = tuple(init.dims)
    if len(dims) > limits.max_rank:
        raise LimitError(
            f"rank {len(dims)} is above max_rank {limits.max_rank}", path=path, obj=key
        )
    problem = shape_problem(dims, itemsize)
    if problem:
        raise FormatError(problem, path=path, obj=key)
    nbytes = math.prod(dims) * itemsize
    if nbytes > limits.max_component_size:
        raise LimitError(
            f"{type_name} initializer of shape {list(dims)} ({nbytes} bytes) is above "
            f"max_component_size {limits.max_component_size}",
            path=path,
            obj=key,
        )
    places = [f for f in _TYPED_FIELDS if len(getattr(init, f))]
    if init.HasField("raw_data"):
        places.append("raw_data")
    if init.data_location == onnx.TensorProto.EXTERNAL:
        places.append("external data")
    if len(places) > 1:
        raise FormatError(
            f"the initializer keeps its values in both {places[0]} and {places[1]}: "
            "onnx reads one and ignores the other",
            path=path,
            obj=key,
        )
    if places and places[0] in _TYPED_FIELDS and places[0] != field:
        raise FormatError(
            f"a {type_name} initializer keeps its values in {places[0]}, which onnx "
            f"ignores for that type ({field} holds them)",
            path=path,
            obj=key,
        )
    bounds = _FIELD_RANGES.get(type_name)
    if bounds is not None and places == [field]:
        values = np.asarray(getattr(init, field))
        if values.size and (values.min() < bounds[0] or values.max() > bounds[1]):
            raise FormatError(
                f"{field} holds {int(values.min())}..{int(values.max())}, outside what a "
                f"{type_name} holds ({bounds[0]}..{bounds[1]}): onnx would narrow it silently",
                path=path,
                obj=key,
            )
    return nbytes
