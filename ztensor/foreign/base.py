"""What every foreign reader shares: the per-tensor :class:`Entry`, the
:class:`ForeignFile` each reader returns, ``spec_of``/``eager`` for formats read
whole, the errors a malformed zip raises, ``check_held_size`` (a piece holds exactly
the bytes another part declares for it), and ``optional_import`` for the optional
packages (h5py, onnx) a reader needs.  The dispatcher (``foreign/__init__``) and
every reader import this module; it imports none of them."""

from __future__ import annotations

import importlib
import lzma
import struct
import zipfile
import zlib
from typing import Any, Callable, Dict, Optional

import numpy as np

from ztensor.errors import FormatError, UnsupportedError
from ztensor.objects import ComponentSpec, ObjectSpec
from ztensor.tensor import Tensor

# what zipfile (and the decompressors behind it) raise on a malformed archive: found
# by tools/fuzz/fuzz_importers.py (an unknown zip version is a NotImplementedError)
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    NotImplementedError,
    RuntimeError,
    zlib.error,
    lzma.LZMAError,
    struct.error,
    KeyError,
    IndexError,
    OverflowError,
    UnicodeDecodeError,
)


class Entry:
    """One tensor of a foreign file: its spec, how to get it, and what reading part
    of it costs, so the readers of parts (``safe_open.get_slice``, ``ztensor.dask``)
    make work follow what the caller asked for (docs/threat-model.md, "Bounded"):

    * ``whole``: each ``load()`` makes the whole tensor anew (a deflated zip member
      is decoded from its start, an HDF5 dataset read from its chunks), where most
      entries are a view at hand.  A part read through ``load()`` costs the tensor.
    * ``read_rows(start, end)``: where the format can, the rows ``start:end`` of the
      first axis as ``load()`` would give them, reading only the storage that holds
      them (an HDF5 hyperslab); None where it cannot (a deflate stream has no
      middle to start from).
    * ``row_block``: the rows ``read_rows`` decodes together (an HDF5 chunk's
      first extent): parts made of whole blocks never decode a piece twice."""

    __slots__ = ("spec", "load", "whole", "read_rows", "row_block")

    def __init__(
        self,
        spec: ObjectSpec,
        load: Callable[[], Tensor],
        *,
        whole: bool = False,
        read_rows: Optional[Callable[[int, int], np.ndarray]] = None,
        row_block: int = 1,
    ) -> None:
        self.spec = spec
        self.load = load
        self.whole = whole
        self.read_rows = read_rows
        self.row_block = row_block


class ForeignFile:
    """A foreign file opened for reading."""

    def __init__(
        self,
        path: str,
        format: str,
        attributes: Dict[str, Any],
        entries: Dict[str, Entry],
        closer: Optional[Callable[[], None]] = None,
    ):
        self.path = path
        self.format = format
        self.attributes = attributes
        self.entries = entries
        self._closer = closer

    def close(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            closer()


def spec_of(name: str, tensor: Tensor, offset: int = 0) -> ObjectSpec:
    """The ObjectSpec a loaded Tensor has (components at ``offset`` when the format
    places them in the file, else 0)."""
    comps = {}
    for role, arr in tensor.components.items():
        arr = np.asarray(arr)
        found = tensor.spec_types(role)  # the Writer's rule, so the spec matches what it stores
        if found is None:
            raise UnsupportedError(
                f"numpy dtype {arr.dtype} has no zTensor type", obj=name, component=role
            )
        storage, ltype = found
        comps[role] = ComponentSpec(role, storage, ltype, offset, arr.nbytes)
    return ObjectSpec(name, tensor.shape, tensor.format, tensor.attributes, comps)


def eager(name: str, tensor: Tensor, offset: int = 0) -> Entry:
    """An entry whose tensor is already at hand (a view: nothing to load)."""
    return Entry(spec_of(name, tensor, offset), lambda: tensor)


def optional_import(module: str, purpose: str, path: str):
    """Import an optional package, or say which one ``purpose`` ("reading HDF5
    files") needs."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UnsupportedError(
            f"{purpose} needs the '{module}' package (pip install {module})", path=path
        ) from None


def check_held_size(held: int, declared: int, holder: str, declarer: str, **where) -> None:
    """THE rule for a piece of a file whose size another part declares (a ``torch.save``
    storage member and its pickle, an ``.npy`` array and its header, in a file or an
    ``.npz`` member): it holds exactly the declared bytes.  Fewer would read past
    it; more are bytes no tensor shows (the writers write exactly the declared size;
    a second array appended to an ``.npy`` would be dropped without a word), so
    either is a FormatError naming ``where`` (``path=``, ``obj=``)."""
    if held != declared:
        raise FormatError(
            f"{holder} holds {held} bytes, not the {declared} of {declarer}"
            + (": bytes no tensor shows" if held > declared else ""),
            **where,
        )
