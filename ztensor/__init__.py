"""ztensor: read and write zTensor (``.zt``) tensor files.

No pickle, no code execution: a file is data and a manifest, checked before use.

>>> import numpy as np, ztensor
>>> with ztensor.Writer("model.zt") as w:
...     w.write_numpy("weight", np.arange(6, dtype=np.float32).reshape(2, 3))
>>> with ztensor.Reader("model.zt") as r:
...     r["weight"]
"""

import sys
from typing import Any

from ztensor._version import __version__
from ztensor.container.edit import remove_tensors, replace_tensor
from ztensor.container.reader import Reader
from ztensor.container.stream import TensorStream
from ztensor.container.writer import Writer
from ztensor.errors import (
    ChecksumError,
    ClosedError,
    FormatError,
    KernelArgumentError,
    LimitError,
    NetworkError,
    NotAFileError,
    ObjectNotFoundError,
    ReadError,
    SafetensorError,
    UnsupportedError,
    WriteError,
    ZTensorError,
)
from ztensor.foreign import gguf_file
from ztensor.formats.quantized import dequantize, from_gptq, quantize
from ztensor.frameworks import staging
from ztensor.io import source
from ztensor.kernels import backend
from ztensor.objects import ComponentSpec, ObjectSpec
from ztensor.safe import safe_open, safe_open_handle
from ztensor.serialize import TensorSpec, deserialize, serialize, serialize_file
from ztensor.sharded import ShardedReader, open_sharded, save_sharded
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor.tensor import Tensor
from ztensor.tools.convert import convert

# safetensors' name for safe_open over a handle, which its users' code calls
_safe_open_handle = safe_open_handle

# import paths earlier releases documented, kept (docs/architecture.md): the modules
# moved into layers; ``import ztensor.staging`` and ``ztensor.staging.release()`` still work
for _old, _module in (("staging", staging), ("gguf", gguf_file), ("source", source)):
    sys.modules.setdefault(f"{__name__}.{_old}", _module)
    globals()[_old] = _module
del _old, _module

# the reference implementation's name for what metadata() returns
TensorMetadata = ObjectSpec


def open(path: Any, **kwargs: Any) -> Reader:  # noqa: A001 - the reference's name
    """Open a tensor file of any kind Reader reads (zTensor, safetensors, PyTorch,
    npy/npz, GGUF, ONNX, HDF5), told by its bytes."""
    return Reader(path, **kwargs)


__all__ = [
    "__version__",
    "backend",
    "Reader",
    "Writer",
    "TensorStream",
    "convert",
    "Tensor",
    "Limits",
    "DEFAULT_LIMITS",
    "dequantize",
    "quantize",
    "from_gptq",
    "safe_open",
    "safe_open_handle",
    "ObjectSpec",
    "ComponentSpec",
    "ZTensorError",
    "FormatError",
    "ChecksumError",
    "LimitError",
    "UnsupportedError",
    "ObjectNotFoundError",
    "ReadError",
    "WriteError",
    "KernelArgumentError",
    "ClosedError",
    "SafetensorError",
    "NetworkError",
    "NotAFileError",
    "TensorMetadata",
    "open",
    "remove_tensors",
    "replace_tensor",
    "serialize",
    "serialize_file",
    "TensorSpec",
    "deserialize",
    "save_sharded",
    "open_sharded",
    "ShardedReader",
]
