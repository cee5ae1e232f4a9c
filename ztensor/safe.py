"""``safe_open``: safetensors' lazy-loading API over a zTensor file.

>>> with ztensor.safe_open("model.zt", framework="np") as f:
...     f.keys(), f.metadata()
...     w = f.get_tensor("embed.weight")
...     rows = f.get_slice("embed.weight")[10:20]   # reads only those rows' bytes
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

import numpy as np

from ztensor import dtypes
from ztensor.errors import UnsupportedError
from ztensor.reader import Reader

FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt"}


class safe_open:  # noqa: N801 - the name safetensors users know
    """Open a zTensor file lazily, with safetensors' ``safe_open`` interface.

    Parameters
    ----------
    filename : str or os.PathLike
    framework : "np" or "pt"
        What ``get_tensor`` returns: numpy arrays, or torch tensors (torch needed).
    device : str
        torch device for ``framework="pt"``.
    """

    def __init__(self, filename: Union[str, "os.PathLike[str]"], framework: str = "np",
                 device: str = "cpu") -> None:
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework must be 'np' or 'pt', got {framework!r}")
        self._framework = FRAMEWORKS[framework]
        self._device = device
        self._reader = Reader(filename, copy_on_write=self._framework == "pt")

    def keys(self) -> List[str]:
        """Object names, in file order."""
        return self._reader.keys()

    def metadata(self) -> Optional[Dict[str, Any]]:
        """The file's attributes (safetensors' ``__metadata__``), or None if empty."""
        return dict(self._reader.attributes) or None

    def get_tensor(self, name: str) -> Any:
        """The whole dense object ``name``."""
        if self._framework == "pt":
            from ztensor.torch_bridge import object_to_torch
            return object_to_torch(self._reader, name, copy=False, device=self._device)
        return self._reader.read_numpy(name)

    def get_slice(self, name: str) -> "_Slice":
        """A lazy handle: ``[...]`` reads only what the index selects (for raw objects
        the bytes of other rows are never touched)."""
        return _Slice(self, name)

    def close(self) -> None:
        self._reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Slice:
    def __init__(self, owner, name):
        self._owner = owner
        self._name = name
        self._meta = owner._reader.metadata(name)
        if self._meta.format != "dense":
            raise UnsupportedError(f"get_slice reads dense objects, this one is "
                                   f"{self._meta.format!r}", obj=name)

    def get_shape(self) -> List[int]:
        return list(self._meta.shape)

    def get_dtype(self) -> str:
        key = self._meta.type or self._meta.storage_dtype
        return dtypes.SAFETENSORS_NAMES.get(key, key.upper())

    def __getitem__(self, index: Any) -> Any:
        view = self._owner._reader.read_numpy(self._name)   # zero-copy for raw data
        part = np.array(view[index])                        # touches only those pages
        if self._owner._framework == "pt":
            from ztensor.torch_bridge import numpy_to_torch
            return numpy_to_torch(part, self._meta, self._owner._device)
        return part
