"""safetensors-style functions for numpy: switching is a one-line change.

>>> from ztensor.numpy import save_file, load_file   # was: from safetensors.numpy ...
>>> save_file({"w": np.zeros((2, 3), np.float32)}, "model.zt", metadata={"step": "10"})
>>> load_file("model.zt")["w"].shape
(2, 3)

``metadata`` (str -> str) is stored as the file's attributes and read back by
``ztensor.safe_open(...).metadata()`` or ``Reader(...).attributes``.
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict, Optional

import numpy as np

from ztensor.reader import Reader
from ztensor.writer import Writer

__all__ = ["save_file", "load_file", "save", "load"]


def _check_metadata(metadata):
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("metadata must be a dict of str to str (as in safetensors)")
    return metadata


def save_file(tensors: Dict[str, np.ndarray], filename, metadata: Optional[Dict[str, str]] = None,
              *, compression=False, checksum=None) -> None:
    """Write ``tensors`` (name -> array) to ``filename`` as a zTensor file.

    Parameters
    ----------
    tensors : dict of str to numpy.ndarray
    filename : str or os.PathLike
    metadata : dict of str to str, optional
        Kept as file attributes.
    compression : bool or int
        zstd for every tensor (True: level 3; an int: that level).
    checksum : None, "crc32c" or "sha256"
    """
    with Writer(filename, attributes=_check_metadata(metadata)) as w:
        for name, array in tensors.items():
            w.write_numpy(name, array, compress=compression, checksum=checksum)


def load_file(filename, *, copy: bool = False) -> Dict[str, np.ndarray]:
    """name -> array for every dense object.  ``copy=False`` gives zero-copy
    read-only views of the memory-mapped file (they keep it mapped)."""
    with Reader(filename) as r:
        return {name: r.read_numpy(name, copy=copy) for name in r.keys()}


def save(tensors: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None, *,
         compression=False, checksum=None) -> bytes:
    """The zTensor file for ``tensors``, as bytes."""
    return file_bytes(save_file, tensors, metadata, compression=compression, checksum=checksum)


def file_bytes(save_file_function, *args, **kwargs) -> bytes:
    """Run a ``save_file(tensors, path, ...)`` into a temporary file and return its
    bytes (the Writer writes files: that is what makes it atomic)."""
    fd, path = tempfile.mkstemp(suffix=".zt")
    os.close(fd)
    try:
        save_file_function(args[0], path, *args[1:], **kwargs)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def load(data: bytes) -> Dict[str, np.ndarray]:
    """name -> array from a zTensor file's bytes (owned copies)."""
    with Reader(data) as r:
        return {name: r.read_numpy(name, copy=True) for name in r.keys()}
