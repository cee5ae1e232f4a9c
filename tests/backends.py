"""The kernel backends a test can compare: the numpy fallback always, the compiled
extension when this run has it.  One list for every test module."""
import pytest

from ztensor import kernels
from ztensor._native import fallback as _fallback

MODULES = [_fallback]
if kernels.backend == "c":
    from ztensor._native import _kernels
    MODULES.insert(0, _kernels)

# for @pytest.mark.parametrize("impl", PARAMS): ids say which backend failed
PARAMS = [pytest.param(m, id="c" if m is not _fallback else "fallback") for m in MODULES]
