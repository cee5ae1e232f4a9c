"""Read other tensor files one tensor at a time, for ``ztensor convert``.

:func:`open_any` returns (attributes, iterator of (name, Tensor)), so a conversion
holds one tensor at a time (and raw inputs are memory-mapped, not read whole).  The
formats themselves live in ``ztensor/foreign/`` (one module each, shared with
``Reader``); ``.zt`` files of any version come through the Reader (v0.1 and v1.1
come out as v1.2).  Tensors come in the canonical order (``_save.canonical_order``,
by name), not the input's, so a conversion gives the same ``.zt`` bytes for the
same tensors however the input file ordered them.

Every ``.zt`` input a conversion reads is read through :data:`READ_OPTIONS`: each
component's digest is checked as it is read, so a corrupted tensor stops the
conversion (a ``ChecksumError`` naming it, nothing written) instead of being
copied, its digest dropped or a new one (``--checksum``) computed over the
damaged bytes: the one moment corruption could be laundered into a file that
``ztensor verify`` then calls sound.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Tuple, Union

from ztensor import _save, foreign, spec
from ztensor.container.reader import Reader
from ztensor.errors import FormatError
from ztensor.io.source import open_local_input
from ztensor.tensor import Tensor

PathLike = Union[str, "os.PathLike[str]"]
# (file attributes, iterator of (name, Tensor)): one tensor at a time
Opened = Tuple[Dict[str, Any], Iterator[Tuple[str, Tensor]]]
# the Reader options of every input a conversion (convert, dequantize, a checkpoint's
# shards) reads tensors from: digests checked on each read (the module doc says why)
READ_OPTIONS: Dict[str, Any] = {"verify": True}


def input_reader(path: PathLike) -> Reader:
    """A Reader of a conversion's input file, with :data:`READ_OPTIONS`."""
    return Reader(path, **READ_OPTIONS)


def open_any(path: PathLike) -> Opened:
    """Open any file ``Reader`` reads, told by its bytes (see ztensor/foreign)."""
    name = os.fspath(path)
    fmt = foreign.sniff(name)  # refuses directories, FIFOs, devices (open_local_input)
    if fmt is None:
        with open_local_input(name) as f:
            head = f.read(8)
            if head[:4] != spec.MAGIC_PREFIX and head != spec.MAGIC_V2:
                raise FormatError(
                    "not a tensor file ztensor can read (zTensor, safetensors, "
                    "npy, npz, PyTorch zip, GGUF, HDF5, ONNX)",
                    path=name,
                )
    # every format through the Reader's own read, which applies each object format's
    # rules (a GGUF block tensor its blocks cannot hold was refused only by the
    # Writer, in an error naming the output instead of the input)
    return open_reader(name)


def open_reader(path: PathLike) -> Opened:
    """A file the Reader reads (``.zt`` of any version or another format), one
    tensor at a time, as :func:`Reader.read` gives it."""

    reader = input_reader(path)

    def tensors():
        with reader:
            for key in _save.canonical_names(reader.keys()):
                yield key, reader.read(key)

    return dict(reader.attributes), tensors()
