"""``.npy`` and ``.npz``: numpy's own readers, with ``allow_pickle=False``.

A ``.npy`` is memory-mapped.  An ``.npz`` member is loaded when asked for, after its
header is parsed and the bytes it really holds are counted: numpy allocates a
member's declared shape before reading it, and the zip directory's sizes are claims
too (see _check_member_size)."""
from __future__ import annotations

import lzma
import math
import os
import struct
import tokenize
import zipfile
import zlib

import numpy as np

from ztensor.errors import FormatError, LimitError
from ztensor.foreign import Entry, ForeignFile, eager
from ztensor.objects import ComponentSpec, ObjectSpec, shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits
from ztensor import dtypes
from ztensor.tensor import Tensor

# what numpy's readers raise on a malformed file: zipfile, zlib and lzma for .npz
# members (NotImplementedError: an unknown compression method; RuntimeError: an
# encrypted member); tokenize/SyntaxError from the header parser.  Found by
# tools/fuzz/fuzz_importers.py.
READ_ERRORS = (ValueError, OSError, EOFError, KeyError, OverflowError, zipfile.BadZipFile,
               zipfile.LargeZipFile, zlib.error, lzma.LZMAError, struct.error,
               tokenize.TokenError, SyntaxError, NotImplementedError, RuntimeError)


def open_npy(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    try:
        arr = np.load(name, mmap_mode="r", allow_pickle=False)
    except READ_ERRORS as exc:
        raise FormatError(f"not a readable .npy file: {exc}", path=name) from None
    except MemoryError:
        raise LimitError("not enough memory to map the array", path=name) from None
    if not isinstance(arr, np.ndarray):   # np.load opens zip archives whatever the name
        if hasattr(arr, "close"):
            arr.close()
        raise FormatError("not a .npy array (an .npz archive?)", path=name)
    stem = os.path.splitext(os.path.basename(name))[0]
    return ForeignFile(name, "npy", {}, {stem: eager(stem, Tensor({"data": arr}))})


def open_npz(path, limits: Limits = DEFAULT_LIMITS) -> ForeignFile:
    name = os.fspath(path)
    try:
        archive = np.load(name, allow_pickle=False)
    except READ_ERRORS as exc:
        raise FormatError(f"not a readable .npz file: {exc}", path=name) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise FormatError("not an .npz archive (a plain .npy inside?)", path=name)
    entries = {}
    try:
        for key in archive.files:
            try:
                shape, dtype = _member_header(archive, key)
            except READ_ERRORS as exc:
                raise FormatError(f"cannot read the array header: {exc}", path=name,
                                  obj=key) from None
            entries[key] = Entry(_header_spec(name, key, shape, dtype),
                                 lambda key=key: _load_member(archive, key, name))
    except BaseException:
        archive.close()
        raise
    return ForeignFile(name, "npz", {}, entries, closer=archive.close)


def _member(archive, key):
    return key if key in archive.zip.namelist() else key + ".npy"


def _member_header(archive, key):
    with archive.zip.open(_member(archive, key)) as fp:
        version = np.lib.format.read_magic(fp)
        reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
        shape, _, dtype = reader(fp)
    return shape, dtype


def _header_spec(path, key, shape, dtype):
    found = dtypes.spec_types_for(dtype)
    if found is None:
        raise FormatError(f"numpy dtype {dtype} has no zTensor type", path=path, obj=key)
    problem = shape_problem(shape, dtype.itemsize)
    if problem:
        raise FormatError(problem, path=path, obj=key)
    storage, ltype = found
    nbytes = math.prod(shape) * dtype.itemsize
    return ObjectSpec(key, shape, "dense", {}, {"data": ComponentSpec("data", storage, ltype, 0,
                                                                      nbytes)})


def _load_member(archive, key, path):
    try:
        _check_member_size(archive, key, path)
        arr = archive[key]
    except READ_ERRORS as exc:
        raise FormatError(f"cannot read array: {exc}", path=path, obj=key) from None
    except MemoryError:
        raise LimitError("not enough memory for the array", path=path, obj=key) from None
    return Tensor({"data": arr})


def _check_member_size(archive, key, path):
    """numpy allocates an .npz member's declared shape before reading its data, so
    the member must really hold that many bytes.  The zip directory's sizes are
    claims too (a 1 TiB ``file_size`` costs nothing to write), so the member is
    decompressed and counted, in bounded chunks, up to what its header declares:
    work proportional to the bytes it really yields, memory constant.  A stored
    member whose bytes lie inside the archive is counted from the directory."""
    member = _member(archive, key)
    info = archive.zip.getinfo(member)
    with archive.zip.open(member) as fp:
        version = np.lib.format.read_magic(fp)
        reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
        shape, _, dtype = reader(fp)
        declared = math.prod(shape) * dtype.itemsize
        archive_size = os.path.getsize(path)
        if (info.compress_type == zipfile.ZIP_STORED and info.compress_size == info.file_size
                and info.header_offset + info.compress_size <= archive_size):
            present = info.file_size - fp.tell()
        else:
            present = 0
            while present < declared:
                chunk = fp.read(min(1 << 20, declared - present))
                if not chunk:
                    break
                present += len(chunk)
    if declared > present:
        raise FormatError(f"header declares {declared} bytes of data, the member holds "
                          f"{present}", path=path, obj=key)
