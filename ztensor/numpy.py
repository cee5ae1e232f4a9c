"""safetensors-style functions for numpy: switching is a one-line change.

>>> from ztensor.numpy import save_file, load_file   # was: from safetensors.numpy ...
>>> save_file({"w": np.zeros((2, 3), np.float32)}, "model.zt", metadata={"step": "10"})
>>> load_file("model.zt")["w"].shape
(2, 3)

``metadata`` (str -> str) is stored as the file's attributes and read back by
``ztensor.safe_open(...).metadata()`` or ``Reader(...).attributes``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ztensor import _save
from ztensor.arguments import keyword_aliases
from ztensor.container import checkpoint_keys as checkpoint
from ztensor.container.reader import Reader, open_bytes, require_file_name
from ztensor.container.writer import Writer
from ztensor.safe import mapped_for_backend

__all__ = ["save_file", "load_file", "save", "load"]


@keyword_aliases(tensor_dict="tensors")  # safetensors.numpy's keyword
def save_file(
    tensors: Dict[str, np.ndarray],
    filename: Any,
    metadata: Optional[Dict[str, str]] = None,
    compression: Any = None,
    *,
    compress: Any = None,
    checksum: Optional[str] = None,
    storage_options: Optional[Dict[str, Any]] = None,
) -> None:
    """Write ``tensors`` (name -> array) to ``filename`` as a zTensor file.

    Parameters
    ----------
    tensors : dict of str to numpy.ndarray
        (``tensor_dict=``, safetensors.numpy's keyword, is taken too)
    filename : str or os.PathLike
    metadata : dict of str to str, optional
        Kept as file attributes.
    compress : bool or int
        zstd for every tensor (True: level 3; an int: that level), the Writer's
        spelling.
    checksum : None, "crc32c" or "sha256"
    compression : bool or int
        The same as ``compress``, as the reference ztensor 1.2.3 spells it, and
        fourth positionally as there (pass one of the two: both is a TypeError).
    storage_options : dict, optional
        For an fsspec URL (``s3://...``): its filesystem's options (credentials,
        endpoint); the object appears complete or not at all (see Writer).
    """
    compression = _save.compress_option(compress, compression)
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensors)}")
    with Writer(
        filename, attributes=_save.str_metadata(metadata), storage_options=storage_options
    ) as w:
        for name, array in _save.canonical_order(tensors):  # one order: same tensors, same bytes
            if not isinstance(array, np.ndarray):
                raise ValueError(
                    f"Key `{name}` is invalid, expected np.ndarray but received {type(array)}"
                )
            w.write_numpy(name, array, compress=compression, checksum=checksum)


def load_file(
    filename: Any,
    copy: bool = False,
    *,
    dequantize: bool = False,
    threads: Optional[int] = None,
    storage_options: Optional[Dict[str, Any]] = None,
    backend: str = "mmap",
) -> Dict[str, np.ndarray]:
    """name -> array for every tensor of the file.  ``copy=False`` gives zero-copy
    read-only views of the memory-mapped file (they keep it mapped); ``copy=True``
    owned arrays, copied in ``threads`` threads (default: every core).  ``copy`` is
    second positionally, as in the reference ztensor.

    Quantized (GPTQ) objects come under GPTQ checkpoint names (``<prefix>.qweight``,
    ``.qzeros``, ``.scales``, ``.g_idx``), or dequantized under their own name with
    ``dequantize=True`` (ztensor/container/checkpoint_keys.py).  ``storage_options``: fsspec's
    options for a URL's filesystem (credentials, endpoint).  ``backend``: safetensors
    0.8's ``"mmap"`` or ``"pread"`` (read without mapping: owned arrays)."""
    require_file_name(filename, "load_file", "ztensor.numpy.load")
    mapped = mapped_for_backend(backend)
    with Reader(filename, mmap=mapped, storage_options=storage_options) as r:
        return _load_reader(r, copy, dequantize, threads)


def _load_reader(
    r: Reader, copy: bool, dequantize: bool, threads: Optional[int]
) -> Dict[str, np.ndarray]:
    """The checkpoint view of one open Reader, for :func:`load_file` and :func:`load`
    alike (a file and its bytes give the same names, dtypes and values)."""
    entries = checkpoint.entries(r, dequantize)
    if copy:  # the plain objects in one batch (ztensor/container/batch.py)
        format_of = r.internals.format_of  # no spec built per object (reader.py)
        plain = [
            name for name, role in entries.values() if role is None and format_of(name) == "dense"
        ]
        owned = r.read_numpy(plain, copy=True, threads=threads)
    else:
        owned = {}
    return {
        key: owned[name]
        if role is None and name in owned
        else checkpoint.array(r, name, role, copy=copy)
        for key, (name, role) in entries.items()
    }


@keyword_aliases(tensor_dict="tensors")  # safetensors.numpy's keyword
def save(
    tensors: Dict[str, np.ndarray],
    metadata: Optional[Dict[str, str]] = None,
    compression: Any = None,
    *,
    compress: Any = None,
    checksum: Optional[str] = None,
) -> bytes:
    """The zTensor file for ``tensors``, as bytes (``compress``/``compression``,
    ``checksum`` as for :func:`save_file`)."""
    return _save.to_bytes(
        save_file,
        tensors,
        metadata,
        compress=_save.compress_option(compress, compression),
        checksum=checksum,
    )


def load(data: bytes) -> Dict[str, np.ndarray]:
    """name -> array from a zTensor (or safetensors) file's bytes (owned copies):
    what :func:`load_file` gives for that file with ``copy=True`` (quantized objects
    under their GPTQ checkpoint names)."""
    with open_bytes(data) as r:
        return _load_reader(r, copy=True, dequantize=False, threads=None)
