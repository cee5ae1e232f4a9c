"""Other tensor files, read-only: the one home of every foreign format.

``Reader(path)`` and ``ztensor convert`` open files that are not zTensor through
this package.  The format is told by the file's bytes, not its name (an
extension only breaks the tie for ONNX, whose protobuf has no magic):

| format        | module            | how it is told                          |
|---------------|-------------------|-----------------------------------------|
| ``safetensors`` | safetensors_file  | 8-byte LE header size, then ``{``        |
| ``npy``       | numpy_files       | ``\\x93NUMPY``                            |
| ``npz``       | numpy_files       | a zip of ``.npy`` members                |
| ``pickle``    | pytorch           | a zip holding ``data.pkl`` (torch.save)  |
| ``gguf``      | gguf (ztensor/foreign/gguf_file.py) | ``GGUF``                           |
| ``hdf5``      | hdf5_file (h5py)  | ``\\x89HDF\\r\\n\\x1a\\n``                    |
| ``onnx``      | onnx_file (onnx)  | a ``.onnx`` name                         |

Each module returns a :class:`ForeignFile`: the format's name (as the reference
implementation reports it in ``Reader.format``), file attributes, and per tensor
a validated :class:`~ztensor.objects.ObjectSpec` and a loader giving the
:class:`~ztensor.tensor.Tensor` (views of the mapped file where the format allows).
Every offset, size and shape is checked before use, as for zTensor files.
"""

from __future__ import annotations

import os
import zipfile
from typing import Optional

from ztensor import spec
from ztensor.errors import FormatError, ReadError, UnsupportedError
from ztensor.foreign import gguf_file as gguf
from ztensor.foreign import hdf5_file, numpy_files, onnx_file, pytorch, safetensors_file
from ztensor.foreign.base import ZIP_ERRORS, Entry, ForeignFile, eager, optional_import, spec_of  # noqa: F401,E501  (the package's names)
from ztensor.io.source import open_local_input
from ztensor.spec import Limits, limits_given

FORMATS = ("safetensors", "npy", "npz", "pickle", "gguf", "hdf5", "onnx")
# torch.save's legacy (non-zip) format begins by pickling its magic number
# 0x1950a86a20f9469cfc6c (protocol 2, LONG1 of 10 bytes), whatever the file's name
LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def sniff(path: str) -> Optional[str]:
    """The foreign format of the file at ``path``, or None (zTensor, or unknown).

    The file is opened through :func:`ztensor.io.source.open_local_input`: a directory,
    FIFO, socket or device is refused there, without blocking, before any reader
    (zipfile, h5py, onnx, numpy) is handed the path."""

    with open_local_input(path) as f:
        try:
            head = f.read(16)
        except OSError as exc:  # EIO, or a /proc file that cannot be read so
            raise ReadError(
                f"the system refused to read it: {exc.strerror or exc}", errno=exc.errno, path=path
            ) from None
        size = os.fstat(f.fileno()).st_size
        if head.startswith((spec.MAGIC_PREFIX, spec.MAGIC_V2)):
            return None  # zTensor's (v2's bytes after its magic are no other's to sniff)
        if head.startswith(spec.MAGIC_NPY):
            return "npy"
        if head.startswith(spec.MAGIC_GGUF):
            return "gguf"
        if head.startswith(spec.MAGIC_HDF5):
            return "hdf5"
        if head.startswith((spec.MAGIC_ZIP, spec.MAGIC_ZIP_EMPTY)):
            try:  # the file already open and checked, not its path again
                with zipfile.ZipFile(f) as z:
                    names = z.namelist()
            except ZIP_ERRORS:
                return None
            if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                return "pickle"
            return "npz"
    if len(head) >= 9 and head[8:9] == b"{":
        header_len = int.from_bytes(head[:8], "little")
        if 2 <= header_len <= size - 8:
            return "safetensors"
    if head.startswith(LEGACY_TORCH_MAGIC):
        return "legacy-pickle"
    if head[:1] == b"\x80" and os.path.splitext(path)[1].lower() in (
        ".pt",
        ".pth",
        ".bin",
        ".pkl",
        ".ckpt",
    ):
        return "legacy-pickle"
    if os.path.splitext(path)[1].lower() == ".onnx":
        return "onnx"
    if _hdf5_after_user_block(path, size):
        return "hdf5"
    return None


def _hdf5_after_user_block(path: str, size: int) -> bool:
    """Whether the file has HDF5's signature at 512, 1024, 2048, ... (the offsets
    the HDF5 library searches: a file with a user block): a read per doubling."""
    offset = 512
    with open_local_input(path) as f:
        while offset + len(spec.MAGIC_HDF5) <= size:
            f.seek(offset)
            if f.read(len(spec.MAGIC_HDF5)) == spec.MAGIC_HDF5:
                return True
            offset *= 2
    return False


def open_foreign(
    path: str,
    fmt: str,
    limits: Optional[Limits] = None,
    *,
    copy_on_write: bool = False,
    mmap: bool = True,
) -> ForeignFile:
    """Open ``path`` as foreign format ``fmt`` (from :func:`sniff`), within ``limits``
    (:data:`ztensor.DEFAULT_LIMITS` when omitted): every reader applies the same
    :class:`ztensor.Limits` as a ``.zt`` file gets.

    ``copy_on_write``: a reader that maps the file maps it privately and writably
    (``Reader(path, copy_on_write=True)``), so its views can become torch tensors
    without a copy; writes to them reach private pages, never the file.  Readers
    that do not map the file ignore it (their arrays are their own).

    ``mmap=False`` (``Reader(path, mmap=False)``): no reader maps the file; every read
    is a ``pread``, so a file truncated while open is a FormatError, never a SIGBUS.
    This is the one place the option reaches every reader's Source."""
    limits = limits_given(limits)
    if fmt == "safetensors":
        return safetensors_file.open_file(path, limits, copy_on_write=copy_on_write, mmap=mmap)
    if fmt in ("npy", "npz"):
        return (
            numpy_files.open_npy(path, limits, mmap=mmap)
            if fmt == "npy"
            else numpy_files.open_npz(path, limits, mmap=mmap)
        )
    if fmt == "pickle":
        return pytorch.open_file(path, limits, mmap=mmap)
    if fmt == "gguf":
        attributes, tensors = gguf.open_gguf(path, limits=limits, mmap=mmap)
        return ForeignFile(path, "gguf", attributes, {name: eager(name, t) for name, t in tensors})
    if fmt == "hdf5":
        return hdf5_file.open_file(path, limits)
    if fmt == "onnx":
        return onnx_file.open_file(path, limits)
    if fmt == "legacy-pickle":
        raise UnsupportedError(
            "a legacy (pre-1.6, non-zip) PyTorch pickle: only torch.save's "
            "zip format is read (re-save it with a current torch)",
            path=path,
        )
    raise FormatError(f"unknown foreign format {fmt!r}", path=path)
