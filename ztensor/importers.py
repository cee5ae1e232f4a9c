"""Read other tensor files one tensor at a time, for ``ztensor convert``.

Each ``open_*`` returns (attributes, iterator of (name, Tensor)), so a conversion
holds one tensor at a time (and raw inputs are memory-mapped, not read whole).

* ``.safetensors``: the header is parsed here (8-byte LE size, JSON), every entry
  checked (dtype known, offsets inside the data, size = shape x item size); no
  safetensors dependency.
* ``.npy`` / ``.npz``: numpy's own reader with ``allow_pickle=False``.
* ``.gguf``: see ztensor/gguf.py.
* ``.zt``: any version ztensor reads (v0.1 and v1.1 come out as v1.2).
"""
from __future__ import annotations

import json
import lzma
import math
import mmap
import os
import struct
import tokenize
import zipfile
import zlib
from typing import Any, Dict, Iterator, Tuple, Union

import numpy as np

from ztensor.errors import FormatError, LimitError, UnsupportedError
from ztensor.objects import shape_problem
from ztensor.tensor import Tensor

PathLike = Union[str, "os.PathLike[str]"]
# (file attributes, iterator of (name, Tensor)): one tensor at a time
Opened = Tuple[Dict[str, Any], Iterator[Tuple[str, Tensor]]]

# safetensors dtype -> (numpy little-endian storage dtype, zTensor logical type)
_ST_DTYPES = {
    "F64": ("<f8", None), "F32": ("<f4", None), "F16": ("<f2", None), "BF16": ("<u2", "bf16"),
    "I64": ("<i8", None), "I32": ("<i4", None), "I16": ("<i2", None), "I8": ("i1", None),
    "U64": ("<u8", None), "U32": ("<u4", None), "U16": ("<u2", None), "U8": ("u1", None),
    "BOOL": ("?", None), "F8_E4M3": ("u1", "f8_e4m3fn"), "F8_E5M2": ("u1", "f8_e5m2"),
    "C64": ("<c8", None),
}
MAX_SAFETENSORS_HEADER = 100 << 20


def open_any(path: PathLike) -> Opened:
    """Dispatch on the file's extension."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    from ztensor.gguf import open_gguf

    opener = {".safetensors": open_safetensors, ".npy": open_npy, ".npz": open_npz,
              ".zt": open_zt, ".gguf": open_gguf}.get(ext)
    if opener is None:
        raise UnsupportedError(f"cannot convert {ext or 'extensionless'} files (known: "
                               ".safetensors, .npy, .npz, .gguf, .zt)", path=path)
    return opener(path)


def open_safetensors(path: PathLike) -> Opened:
    name = os.fspath(path)
    with open(name, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise FormatError("not a safetensors file: shorter than its 8-byte header size",
                              path=name)
        header_len = struct.unpack("<Q", f.read(8))[0]
        if header_len > MAX_SAFETENSORS_HEADER:
            raise LimitError(f"safetensors header of {header_len} bytes exceeds "
                             f"{MAX_SAFETENSORS_HEADER}", path=name)
        if 8 + header_len > size:
            raise FormatError("safetensors header runs past the end of the file", path=name)
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"safetensors header is not JSON: {exc}", path=name) from None
        except RecursionError:  # json nests on the C stack, bounded by the recursion limit
            raise FormatError("safetensors header nests too deeply", path=name) from None
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    if not isinstance(header, dict):
        raise FormatError("safetensors header is not a JSON object", path=name)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise FormatError("safetensors __metadata__ is not an object", path=name)
    start, data_len = 8 + header_len, size - 8 - header_len
    entries = sorted(((k, _st_entry(name, k, v, data_len)) for k, v in header.items()),
                     key=lambda kv: kv[1][2])

    def tensors():
        for key, (dtype, shape, begin, ltype) in entries:
            arr = np.frombuffer(data, dtype, math.prod(shape), start + begin).reshape(shape)
            yield key, Tensor({"data": arr}, shape=shape,
                              types={"data": ltype} if ltype else None)
    return dict(metadata), tensors()


def _st_entry(path, key, info, data_len):
    if not isinstance(info, dict):
        raise FormatError("entry is not an object", path=path, obj=key)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _ST_DTYPES:
        raise UnsupportedError(f"safetensors dtype {dtype!r} is not supported", path=path,
                               obj=key)
    if (not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int for o in offsets)):
        raise FormatError("malformed shape or data_offsets", path=path, obj=key)
    np_dtype = np.dtype(_ST_DTYPES[dtype][0])
    problem = (f"shape has {len(shape)} dimensions (at most 64)" if len(shape) > 64
               else shape_problem(shape, np_dtype.itemsize))
    if problem:
        raise FormatError(problem, path=path, obj=key)
    begin, end = offsets
    if not 0 <= begin <= end <= data_len or end - begin != math.prod(shape) * np_dtype.itemsize:
        raise FormatError(f"data_offsets {offsets} do not fit shape {shape} of {dtype} inside "
                          f"{data_len} data bytes", path=path, obj=key)
    return np_dtype, tuple(shape), begin, _ST_DTYPES[dtype][1]


# what numpy's readers raise on a malformed file: zipfile, zlib and lzma for .npz
# members (NotImplementedError: an unknown compression method; RuntimeError: an
# encrypted member); tokenize/SyntaxError from the header parser.  Found by
# tools/fuzz/fuzz_importers.py.
_NUMPY_READ_ERRORS = (ValueError, OSError, EOFError, KeyError, OverflowError, zipfile.BadZipFile,
                      zipfile.LargeZipFile, zlib.error, lzma.LZMAError, struct.error,
                      tokenize.TokenError, SyntaxError, NotImplementedError, RuntimeError)


def open_npy(path: PathLike) -> Opened:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except _NUMPY_READ_ERRORS as exc:
        raise FormatError(f"not a readable .npy file: {exc}", path=path) from None
    except MemoryError:
        raise LimitError("not enough memory to map the array", path=path) from None
    if not isinstance(arr, np.ndarray):   # np.load opens zip archives whatever the name
        if hasattr(arr, "close"):
            arr.close()
        raise FormatError("not a .npy array (an .npz archive?)", path=path)
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return {}, iter([(stem, Tensor({"data": arr}))])


def open_npz(path: PathLike) -> Opened:
    try:
        archive = np.load(path, allow_pickle=False)
    except _NUMPY_READ_ERRORS as exc:
        raise FormatError(f"not a readable .npz file: {exc}", path=path) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise FormatError("not an .npz archive (a plain .npy inside?)", path=path)

    def tensors():
        with archive:
            for key in archive.files:
                try:
                    _check_member_size(archive, key, path)
                    arr = archive[key]
                except _NUMPY_READ_ERRORS as exc:
                    raise FormatError(f"cannot read array: {exc}", path=path, obj=key) from None
                except MemoryError:
                    raise LimitError("not enough memory for the array", path=path,
                                     obj=key) from None
                yield key, Tensor({"data": arr})
    return {}, tensors()


def _check_member_size(archive, key, path):
    """numpy allocates an .npz member's declared shape before reading its data, so
    the member must really hold that many bytes.  The zip directory's sizes are
    claims too (a 1 TiB ``file_size`` costs nothing to write), so the member is
    decompressed and counted, in bounded chunks, up to what its header declares:
    work proportional to the bytes it really yields, memory constant.  A stored
    member whose bytes lie inside the archive is counted from the directory."""
    member = key if key in archive.zip.namelist() else key + ".npy"
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


def open_zt(path: PathLike) -> Opened:
    from ztensor.reader import Reader

    reader = Reader(path)

    def tensors():
        with reader:
            for key in reader.keys():
                yield key, reader.read(key)
    return dict(reader.attributes), tensors()
