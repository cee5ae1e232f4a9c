"""ONNX models (``.onnx``) through onnx (optional): every initializer, by name.
onnx parses the whole protobuf (it has no index to read from); initializers with
their data in external files are refused unless the files sit beside the model, as
onnx resolves them.  Two initializers under one name are an error naming both
(protobuf keeps both; which one a runtime uses is its own choice).  Initializers
of a type zTensor has no dtype for (strings) are listed in the
``onnx.skipped_initializers`` attribute; bfloat16 and float8 ones are read."""

from __future__ import annotations

import os

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError
from ztensor.foreign.base import ForeignFile, eager, optional_import
from ztensor.foreign.names import NameTable
from ztensor.io.source import open_local_input
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor.tensor import Tensor


def open_file(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    onnx = optional_import("onnx", "ONNX", name)
    numpy_helper = optional_import("onnx.numpy_helper", "ONNX", name)
    open_local_input(name).close()  # a regular file (onnx opens the path itself)
    try:
        model = onnx.load(name)
    except MemoryError:
        raise LimitError("not enough memory to parse the model", path=name) from None
    except Exception as exc:  # protobuf's DecodeError and friends: not a model
        raise FormatError(
            f"not a readable ONNX model: {type(exc).__name__}: {str(exc)[:200]}", path=name
        ) from None
    entries = {}
    names = NameTable(name, "initializer")
    skipped = []
    for index, init in enumerate(model.graph.initializer):
        # protobuf keeps every repeated initializer; a dict would keep the last
        names.claim(init.name, f"initializer {index}")
        if len(names) > limits.max_objects:
            raise LimitError(f"more than max_objects {limits.max_objects} initializers", path=name)
        if len(init.dims) > limits.max_rank:
            raise LimitError(
                f"rank {len(init.dims)} is above max_rank {limits.max_rank}",
                path=name,
                obj=init.name,
            )
        try:
            arr = np.asarray(numpy_helper.to_array(init, base_dir=os.path.dirname(name)))
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
    attributes = {
        "onnx.ir_version": int(model.ir_version),
        "onnx.producer_name": str(model.producer_name),
    }
    if skipped:  # said, not dropped without a word
        attributes["onnx.skipped_initializers"] = skipped
    return ForeignFile(name, "onnx", attributes, entries)
