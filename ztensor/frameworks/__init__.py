"""The one place torch is known below the public APIs: torch <-> numpy element
mapping (``torch_bridge``) and the one host -> device staging buffer (``staging``)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """An optional third-party module (torch) imported on its first attribute access:
    the core imports this package's modules at their top, and ``import ztensor``
    must still not import torch (nor fail without it)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)
