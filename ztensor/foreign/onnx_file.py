"""ONNX models (``.onnx``) through onnx (optional): every initializer, by name.
onnx parses the whole protobuf (it has no index to read from); initializers with
their data in external files are refused unless the files sit beside the model, as
onnx resolves them."""
from __future__ import annotations

import os

import numpy as np

from ztensor.errors import FormatError, LimitError
from ztensor.foreign import ForeignFile, eager, optional_import
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor.tensor import Tensor


def open_file(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    onnx = optional_import("onnx", "ONNX", name)
    numpy_helper = optional_import("onnx.numpy_helper", "ONNX", name)
    try:
        model = onnx.load(name)
    except MemoryError:
        raise LimitError("not enough memory to parse the model", path=name) from None
    except Exception as exc:  # protobuf's DecodeError and friends: not a model
        raise FormatError(f"not a readable ONNX model: {type(exc).__name__}: "
                          f"{str(exc)[:200]}", path=name) from None
    entries = {}
    for init in model.graph.initializer:
        try:
            arr = np.asarray(numpy_helper.to_array(init, base_dir=os.path.dirname(name)))
        except Exception as exc:  # a malformed initializer: onnx's own error
            raise FormatError(f"cannot read initializer: {type(exc).__name__}: "
                              f"{str(exc)[:200]}", path=name, obj=init.name) from None
        if arr.dtype.kind not in "biufc":
            continue
        entries[init.name] = eager(init.name, Tensor({"data": arr}))
    attributes = {"onnx.ir_version": int(model.ir_version),
                  "onnx.producer_name": str(model.producer_name)}
    return ForeignFile(name, "onnx", attributes, entries)
