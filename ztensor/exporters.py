"""Writing other tensor formats, for ``ztensor convert IN OUT``: the output's name
says its format (``.zt``, ``.safetensors``, ``.npz``, ``.gguf``); anything else is
refused.

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

FORMATS = {".zt": "zt", ".safetensors": "safetensors", ".npz": "npz", ".gguf": "gguf"}


def format_for(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UnsupportedError(f"cannot write {ext or 'extensionless'} files (the output's "
                               "name says its format: .zt, .safetensors, .npz, .gguf)",
                               path=path)
    return FORMATS[ext]


def writer_for(kind: str) -> Callable:
    """The exporter of a format ``format_for`` named (not ``zt``: the Writer's)."""
    return {"safetensors": write_safetensors, "npz": write_npz, "gguf": write_gguf}[kind]


def _atomic(path: str, write: Callable[[Any], None], *, by_name: bool = False) -> None:
    """``write(file object)`` (or ``write(temporary path)`` with ``by_name``, for
    writers that open the file themselves) into a temporary file beside ``path``,
    renamed into place once complete."""
    from ztensor.writer import _create_temp, _final_target
    target = _final_target(path)
    fd, tmp = _create_temp(target)
    try:
        if by_name:
            os.close(fd)
            write(tmp)
        else:
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


# ------------------------------------------------------------------ GGUF (via gguf-py)
# spec types GGUF holds, and ggml type names for them (bf16 is written as its bits)
_GGUF_DENSE = {"f32": "f4", "f16": "f2", "f64": "f8", "bf16": "u2", "i8": "i1", "i16": "i2",
               "i32": "i4", "i64": "i8"}


def write_gguf(reader, path: str, progress=None) -> int:
    """A ``.gguf`` file, written with llama.cpp's own ``gguf`` package (optional).

    * Dense objects of the types GGUF has (f32, f16, bf16, f64, i8-i64) become tensors
      of those ggml types; ``gguf_blocks`` objects (GGUF files read earlier) are
      written back as their blocks, with their ggml type.  Anything else (sparse,
      GPTQ, unsigned or FP8 dense) is refused, naming the object, before anything is
      written: dequantize or convert it first.
    * Attributes ``gguf.<key>`` become key/values ``<key>``, with the GGUF value types
      recorded at import (``gguf_value_types``); other attributes keep their names,
      typed from their values (str, bool, int as INT32/INT64, float as FLOAT64, lists
      of one of those).  Maps, bytes and None have no GGUF type and are refused.
    * ``general.architecture`` is written only when the source has it.
    """
    from ztensor.foreign import optional_import
    gguf = optional_import("gguf", "writing GGUF", path)
    plan = [_gguf_tensor(reader, name, gguf) for name in reader.keys()]
    values = _gguf_values(reader, gguf)
    arch = reader.attributes.get("gguf.general.architecture")

    def write(tmp):
        w = gguf.GGUFWriter(tmp, arch if isinstance(arch, str) else "")
        if not isinstance(arch, str):  # the writer adds one; the source has none
            for kv in getattr(w, "kv_data", [{}]):
                kv.pop("general.architecture", None)
        for key, value, vtype, sub in values:
            if key == "general.architecture":
                continue
            if key == "general.alignment":  # the writer's own padding must follow it
                w.add_custom_alignment(int(value))
                continue
            w.add_key_value(key, value, vtype, sub_type=sub)
        for name, load, shape, dtype, nbytes, raw in plan:
            w.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name, load, *_ in plan:  # one tensor at a time
            arr = load()
            w.write_tensor_data(arr)
            if progress:
                progress(arr.nbytes)
        w.close()
    _atomic(path, write, by_name=True)
    return len(plan)


def _gguf_tensor(reader, name, gguf):
    """(name, loader of the native-order array, shape, dtype, bytes, raw ggml type)."""
    spec = reader.metadata(name)
    if spec.format == "gguf_blocks":
        type_id = spec.attributes.get("ggml_type_id")
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError, TypeError):
            raise UnsupportedError(f"ggml type {type_id!r} is not one the installed gguf "
                                   "package writes", path=reader.path, obj=name) from None
        shape = tuple(spec.shape)
        if not shape or shape[-1] % block:
            raise UnsupportedError(f"shape {list(shape)} is not whole {qtype.name} blocks",
                                   path=reader.path, obj=name)
        byte_shape = shape[:-1] + (shape[-1] // block * block_bytes,)
        nbytes = int(np.prod(byte_shape, dtype=np.int64))
        held = spec.components["blocks"].decoded_length
        # a type unknown at import was kept with the bytes up to the next tensor
        # (its size was unknown then): the padding after its blocks is dropped here
        padded = "ggml_type" not in spec.attributes and held > nbytes
        if held != nbytes and not padded:
            raise UnsupportedError(f"{spec.components['blocks'].decoded_length} bytes of "
                                   f"blocks for a {qtype.name} tensor of shape "
                                   f"{list(shape)} ({nbytes} bytes)", path=reader.path,
                                   obj=name)

        def load():
            blocks = np.asarray(reader.read(name).components["blocks"])
            return blocks[:nbytes].reshape(byte_shape)
        return name, load, byte_shape, np.dtype(np.uint8), nbytes, qtype
    if spec.format != "dense":
        raise UnsupportedError(f"a {spec.format} object has no GGUF form: dequantize or "
                               "drop it first", path=reader.path, obj=name)
    comp = spec.components["data"]
    key = comp.type or comp.dtype
    if key not in _GGUF_DENSE:
        raise UnsupportedError(f"type {key!r} has no GGUF tensor type (GGUF holds "
                               f"{', '.join(_GGUF_DENSE)})", path=reader.path, obj=name)
    if spec.attributes:
        raise UnsupportedError("per-tensor attributes have no place in GGUF",
                               path=reader.path, obj=name)
    raw = gguf.GGMLQuantizationType.BF16 if key == "bf16" else None  # bits, typed
    shape = tuple(spec.shape)

    def load():  # native order: gguf-py swaps native arrays to the file's little-endian
        arr = _stored_elements(reader, name)
        return arr.astype(arr.dtype.newbyteorder("=")) if arr.dtype.itemsize > 1 else arr
    return name, load, shape, np.dtype(_GGUF_DENSE[key]), comp.decoded_length, raw


def _gguf_values(reader, gguf):
    """(key, value, GGUFValueType, element type or None) for every attribute."""
    from ztensor.gguf import ARRAY, VALUE_TYPES
    recorded = reader.attributes.get(VALUE_TYPES)
    recorded = recorded if isinstance(recorded, dict) else {}
    out = []
    for attr, value in reader.attributes.items():
        if attr == VALUE_TYPES:
            continue
        key = attr[len("gguf."):] if attr.startswith("gguf.") else attr
        known = recorded.get(key) if attr.startswith("gguf.") else None
        try:
            if isinstance(known, int) and known != ARRAY:
                out.append((key, value, gguf.GGUFValueType(known), None))
                continue
            if isinstance(known, list) and len(known) == 2 and isinstance(value, list):
                out.append((key, value, gguf.GGUFValueType.ARRAY,
                            gguf.GGUFValueType(known[1])))
                continue
        except ValueError:
            pass  # a recorded type the package does not know: typed from the value
        vtype = _gguf_type_of(value, gguf)
        if vtype is None:
            raise UnsupportedError(f"attribute {attr!r} ({type(value).__name__}) has no GGUF "
                                   "value type", path=reader.path)
        sub = None
        if vtype == gguf.GGUFValueType.ARRAY:
            subs = {_gguf_type_of(v, gguf) for v in value}
            if len(subs) > 1 and subs <= {gguf.GGUFValueType.INT32, gguf.GGUFValueType.INT64}:
                subs = {gguf.GGUFValueType.INT64}
            if len(subs) > 1 or None in subs or gguf.GGUFValueType.ARRAY in subs:
                raise UnsupportedError(f"attribute {attr!r}: a GGUF array holds values of "
                                       "one type", path=reader.path)
            sub = subs.pop() if subs else gguf.GGUFValueType.INT32
        out.append((key, value, vtype, sub))
    return out


def _gguf_type_of(value, gguf):
    t = gguf.GGUFValueType
    if isinstance(value, bool):
        return t.BOOL
    if isinstance(value, int):
        return t.INT32 if -(1 << 31) <= value < 1 << 31 else \
            t.INT64 if -(1 << 63) <= value < 1 << 63 else t.UINT64 if value < 1 << 64 else None
    if isinstance(value, float):
        return t.FLOAT64
    if isinstance(value, str):
        return t.STRING
    if isinstance(value, list):
        return t.ARRAY
    return None
