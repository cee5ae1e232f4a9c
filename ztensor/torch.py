"""safetensors-style functions for torch (this module imports torch; nothing else in
ztensor does).

>>> from ztensor.torch import save_file, load_file   # was: from safetensors.torch ...

Supported dtypes, both ways: float64/32/16, bfloat16, the four float8 types,
complex64/128, int64/32/16/8, uint8 (and uint16/32/64 where torch has them), bool.
Loaded tensors are zero-copy over a private (copy-on-write) mapping of the file when
the bytes allow it: writing to one changes neither the file nor other processes.
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional

import numpy as np
import torch

from ztensor import components, dtypes
from ztensor.errors import UnsupportedError
from ztensor.reader import Reader
from ztensor.tensor import Tensor
from ztensor.writer import Writer

__all__ = ["save_file", "load_file", "save", "load"]

# torch dtypes numpy cannot hold: stored as bit patterns with their spec type
_BITS = {torch.bfloat16: (torch.int16, np.uint16, "bf16")}
for _name, _spec in (("float8_e4m3fn", "f8_e4m3fn"), ("float8_e5m2", "f8_e5m2"),
                     ("float8_e4m3fnuz", "f8_e4m3fnuz"), ("float8_e5m2fnuz", "f8_e5m2fnuz")):
    if hasattr(torch, _name):
        _BITS[getattr(torch, _name)] = (torch.uint8, np.uint8, _spec)
_FROM_SPEC = {spec: (dt, bits_torch) for dt, (bits_torch, _, spec) in _BITS.items()}


def _to_numpy(t: torch.Tensor, name: str):
    """(numpy array, types) holding exactly the tensor's elements."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    t = t.detach().cpu().contiguous()
    if t.dtype in _BITS:
        bits_torch, bits_np, spec = _BITS[t.dtype]
        return t.view(bits_torch).numpy().view(bits_np), {"data": spec}
    try:
        return t.numpy(), {}
    except TypeError:
        raise UnsupportedError(f"torch dtype {t.dtype} cannot be stored", obj=name) from None


def _check_shared(tensors):
    """As safetensors: tensors sharing storage would be written twice and come back
    as separate tensors, so they are refused."""
    seen = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
            continue
        key = (t.device, t.untyped_storage().data_ptr())
        if key in seen:
            raise RuntimeError(
                f"Some tensors share memory: {seen[key]!r} and {name!r}. This would store "
                "the memory twice and load them back as separate tensors; pass clones "
                "(t.clone()) of the ones you want to keep, as with safetensors.")
        seen[key] = name


def save_file(tensors: Dict[str, torch.Tensor], filename,
              metadata: Optional[Dict[str, str]] = None, *, compression=False,
              checksum=None) -> None:
    """Write ``tensors`` (name -> torch.Tensor) as a zTensor file (see
    :func:`ztensor.numpy.save_file` for the parameters)."""
    from ztensor.numpy import _check_metadata

    _check_shared(tensors)
    with Writer(filename, attributes=_check_metadata(metadata)) as w:
        for name, t in tensors.items():
            arr, types = _to_numpy(t, name)
            w.write(name, Tensor({"data": arr}, shape=tuple(t.shape), types=types),
                    compress=compression, checksum=checksum)


def load_file(filename, device="cpu", *, copy: bool = False) -> Dict[str, torch.Tensor]:
    """name -> torch.Tensor for every dense object of a file."""
    with Reader(filename, copy_on_write=True) as r:
        return {name: _reader_to_torch(r, name, copy=copy, device=device) for name in r.keys()}


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None, *,
         compression=False, checksum=None) -> bytes:
    """The zTensor file for ``tensors``, as bytes."""
    from ztensor.numpy import file_bytes

    return file_bytes(save_file, tensors, metadata, compression=compression, checksum=checksum)


def load(data: bytes, device="cpu") -> Dict[str, torch.Tensor]:
    """name -> torch.Tensor from a zTensor file's bytes."""
    with Reader(data) as r:
        return {name: _reader_to_torch(r, name, copy=True, device=device) for name in r.keys()}


def _reader_to_torch(reader, name, copy, device):
    obj = reader.read(name, copy=copy)
    if obj.format != "dense":
        raise UnsupportedError(f"torch tensors come from dense objects; this one is "
                               f"{obj.format!r}", path=reader.path, obj=name)
    arr = obj.components["data"]
    spec = obj.types.get("data")
    if spec in _FROM_SPEC:                     # bits -> torch's own bf16 / float8 dtype
        target, bits_torch = _FROM_SPEC[spec]
        bits = _native(arr.view(np.uint16 if bits_torch is torch.int16 else np.uint8), copy)
        t = torch.from_numpy(bits.view(np.int16) if bits_torch is torch.int16 else bits)
        t = t.view(target)
    elif spec is not None and spec not in ("complex64", "complex128"):
        raise UnsupportedError(f"logical type {spec!r} has no torch dtype", path=reader.path,
                               obj=name)
    else:
        t = _from_numpy(_native(arr, copy))
    return t if device == "cpu" else t.to(device)


def _native(arr, copy):
    """torch needs native byte order and writable memory (a read-only buffer, e.g.
    bytes, is copied: torch has no read-only tensors)."""
    if arr.dtype.itemsize > 1 and not arr.dtype.isnative:
        return components.to_native(arr)
    if not arr.flags.writeable:
        return arr.copy()
    return arr


def _from_numpy(arr):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.from_numpy(arr)


def _numpy_to_torch(arr, meta, device):
    """A slice read through safe_open(framework="pt") as a torch tensor of the
    object's dtype (bf16/FP8 slices arrive as ml_dtypes or float32 values)."""
    key = meta.type or meta.dtype
    if key in _FROM_SPEC:
        target, _ = _FROM_SPEC[key]
        if dtypes.is_ml_dtype(arr.dtype):
            width = np.uint16 if arr.dtype.itemsize == 2 else np.uint8
            return _reader_bits(arr.view(width), target, device)
        t = torch.from_numpy(np.ascontiguousarray(arr, np.float32)).to(target)
    else:
        t = _from_numpy(_native(np.ascontiguousarray(arr), True))
    return t if device == "cpu" else t.to(device)


def _reader_bits(bits, target, device):
    t = torch.from_numpy(bits.view(np.int16) if bits.dtype.itemsize == 2 else bits).view(target)
    return t if device == "cpu" else t.to(device)
