"""Writing other tensor formats, for ``ztensor convert IN OUT``: the output's name
says its format (``.zt``, ``.safetensors``, ``.npz``); anything else is refused.

Every exporter writes a temporary file beside the target and renames it into
place, like the zTensor writer: a failure leaves no partial file.  What a format
cannot express is a clear error naming the object, before anything is written."""
from __future__ import annotations

import json
import os
import struct
import zipfile
from typing import Any, Callable, Dict

import numpy as np

from ztensor import dtypes
from ztensor.errors import UnsupportedError, WriteError

FORMATS = {".zt": "zt", ".safetensors": "safetensors", ".npz": "npz"}


def format_for(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UnsupportedError(f"cannot write {ext or 'extensionless'} files (the output's "
                               "name says its format: .zt, .safetensors, .npz)", path=path)
    return FORMATS[ext]


def _atomic(path: str, write: Callable[[Any], None]) -> None:
    from ztensor.writer import _create_temp, _final_target
    target = _final_target(path)
    fd, tmp = _create_temp(target)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(f"cannot write the file: {exc.strerror or exc}", path=path,
                             errno=exc.errno) from exc
        raise


def _dense_specs(reader) -> Dict[str, Any]:
    specs = {}
    for name in reader.keys():
        spec = reader.metadata(name)
        if spec.format != "dense":
            raise UnsupportedError(f"a {spec.format} object cannot be expressed in this format "
                                   "(dense tensors only): dequantize or drop it first",
                                   path=reader.path, obj=name)
        specs[name] = spec
    return specs


def write_safetensors(reader, path: str, progress=None) -> int:
    """A real ``.safetensors`` file of every dense object (bf16, F8_E4M3/F8_E5M2 and
    complex64 too); the file attributes become ``__metadata__`` (strings only)."""
    specs = _dense_specs(reader)
    header: Dict[str, Any] = {}
    offset = 0
    for name, spec in specs.items():
        comp = spec.components["data"]
        key = comp.type or comp.dtype
        st_name = dtypes.SAFETENSORS_NAMES.get(key)
        if st_name is None or st_name not in dtypes.SAFETENSORS_STORAGE:
            raise UnsupportedError(f"type {key!r} has no safetensors dtype", path=reader.path,
                                   obj=name)
        nbytes = comp.decoded_length
        header[name] = {"dtype": st_name, "shape": list(spec.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    meta = {k: v for k, v in reader.attributes.items() if isinstance(v, str)}
    if len(meta) != len(reader.attributes):
        dropped = sorted(set(reader.attributes) - set(meta))
        raise UnsupportedError(f"safetensors metadata holds strings only; attributes "
                               f"{dropped[:5]} are not strings", path=reader.path)
    if meta:
        header = {"__metadata__": meta, **header}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes

    def write(f):
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, spec in specs.items():
            arr = _stored_elements(reader, name)
            f.write(arr.tobytes() if arr.size else b"")
            if progress:
                progress(arr.nbytes)
    _atomic(path, write)
    return len(specs)


def write_npz(reader, path: str, progress=None) -> int:
    """An ``.npz`` of every dense object, member by member (bf16/FP8 as their uint
    bit patterns: numpy has no such dtypes without ml_dtypes)."""
    specs = _dense_specs(reader)

    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name in specs:
                arr = np.asarray(_stored_elements(reader, name))
                if arr.dtype.kind == "V" or dtypes.is_ml_dtype(arr.dtype):
                    arr = arr.view(np.uint16 if arr.dtype.itemsize == 2 else np.uint8)
                with z.open(name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(arr, order="C"),
                                              allow_pickle=False)
                if progress:
                    progress(arr.nbytes)
    _atomic(path, write)
    return len(specs)


def _stored_elements(reader, name):
    """The object's elements, little-endian, in its shape (bits for bf16/FP8)."""
    arr = np.asarray(reader.read(name).components["data"])
    if dtypes.is_ml_dtype(arr.dtype):
        arr = arr.view(np.uint16 if arr.dtype.itemsize == 2 else np.uint8)
    if arr.dtype.itemsize > 1 and arr.dtype.byteorder not in ("<", "|") and not (
            arr.dtype.byteorder == "=" and np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.asarray(arr, order="C")  # not ascontiguousarray: a 0-d array stays 0-d
