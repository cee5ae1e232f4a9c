"""ONNX models (``.onnx``) through onnx (optional): every initializer, by name.
onnx parses the whole protobuf (it has no index to read from); initializers with
their data in external files are refused unless the files sit beside the model, as
onnx resolves them (each is read when its initializer is, after the checks below).
Two initializers under one name are an error naming both (protobuf keeps both; which
one a runtime uses is its own choice).  Initializers of a type zTensor has no dtype
for (strings) are listed in the ``onnx.skipped_initializers`` attribute, sparse
initializers in ``onnx.skipped_sparse_initializers`` (their dense form has the size
their ``dims`` declare, not the size of their bytes), and those of subgraphs (a node's
``If``/``Loop`` branches) and training graphs, where they are scoped, in
``onnx.skipped_subgraph_initializers``; bfloat16 and float8 ones are read.

Before an initializer's values are made (:func:`_check_initializer`): its ``dims``
are sizes numpy can make (none negative: numpy would read ``-1`` as "whatever is
left") within ``max_rank`` and ``max_component_size``; its values are in one place
only (``raw_data``, external data, or the type's own typed field: onnx reads the first
of these it finds and ignores the rest, so two would let readers disagree); and
values kept in a wider typed field (``int32_data`` for int8, bool, float16 bit
patterns) fit the type (onnx narrows them silently: 300 would become int8 44)."""

from __future__ import annotations

import math
import os

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError
from ztensor.foreign.base import ForeignFile, eager, optional_import
from ztensor.foreign.names import NameTable
from ztensor.io.source import open_local_input
from ztensor.objects import shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor.tensor import Tensor


def open_file(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    onnx = optional_import("onnx", "ONNX", name)
    numpy_helper = optional_import("onnx.numpy_helper", "ONNX", name)
    open_local_input(name).close()  # a regular file (onnx opens the path itself)
    try:
        # external data is read per initializer, after its checks (to_array below)
        model = onnx.load(name, load_external_data=False)
    except MemoryError:
        raise LimitError("not enough memory to parse the model", path=name) from None
    except Exception as exc:  # protobuf's DecodeError and friends: not a model
        raise FormatError(
            f"not a readable ONNX model: {type(exc).__name__}: {str(exc)[:200]}", path=name
        ) from None
    base_dir = os.path.dirname(os.path.abspath(name))  # where onnx resolves external data
    entries = {}
    names = NameTable(name, "initializer")
    skipped = []
    for index, init in enumerate(model.graph.initializer):
        # protobuf keeps every repeated initializer; a dict would keep the last
        names.claim(init.name, f"initializer {index}")
        if len(names) > limits.max_objects:
            raise LimitError(f"more than max_objects {limits.max_objects} initializers", path=name)
        _check_initializer(onnx, init, name, limits)
        try:
            arr = np.asarray(numpy_helper.to_array(init, base_dir=base_dir))
        except Exception as exc:  # a malformed initializer: onnx's own error
            raise FormatError(
                f"cannot read initializer: {type(exc).__name__}: {str(exc)[:200]}",
                path=name,
                obj=init.name,
            ) from None
        if dtypes.spec_types_for(arr.dtype) is None:  # strings: not a tensor we can hold
            skipped.append(init.name)
            continue
        entries[init.name] = eager(init.name, Tensor({"data": arr}))
    sparse = []
    for index, tensor in enumerate(model.graph.sparse_initializer):
        names.claim(tensor.values.name, f"sparse initializer {index}")
        if len(names) > limits.max_objects:
            raise LimitError(f"more than max_objects {limits.max_objects} initializers", path=name)
        sparse.append(tensor.values.name)
    attributes = {
        "onnx.ir_version": int(model.ir_version),
        "onnx.producer_name": str(model.producer_name),
    }
    if skipped:  # said, not dropped without a word
        attributes["onnx.skipped_initializers"] = skipped
    if sparse:
        attributes["onnx.skipped_sparse_initializers"] = sparse
    nested = _nested_initializers(onnx, model)
    if nested:
        attributes["onnx.skipped_subgraph_initializers"] = nested
    return ForeignFile(name, "onnx", attributes, entries)


def _nested_initializers(onnx, model) -> list:
    """Where each initializer outside the main graph's own list is: those of the
    subgraphs a node holds (``If``'s branches, ``Loop``'s body, at any depth) and of
    the training graphs.  They are initializers the model has, scoped to their graph
    (a name may repeat an outer one), so they are listed, never dropped without a
    word.  The walk is over the parsed model: its size is the file's."""
    found = []
    pending = [(model.graph, "")] + [
        (g, f"training_info[{i}].{part}")
        for i, info in enumerate(model.training_info)
        for part, g in (("initialization", info.initialization), ("algorithm", info.algorithm))
    ]
    for graph, where in pending:  # grows as subgraphs are found: each graph once
        if where:
            found += [f"{where}/{t.name}" for t in graph.initializer]
            found += [f"{where}/{t.values.name}" for t in graph.sparse_initializer]
        for node in graph.node:
            for attr in node.attribute:
                inner = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                owner = f"{where}/{node.name or node.op_type}.{attr.name}".lstrip("/")
                pending += [
                    (g, owner if len(inner) == 1 else f"{owner}[{i}]") for i, g in enumerate(inner)
                ]
    return found


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


def _check_initializer(onnx, init, path, limits) -> None:
    """An initializer's dims, size and where its values lie, before any is read (see
    the module doc)."""
    key = init.name
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
