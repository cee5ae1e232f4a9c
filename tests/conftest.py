"""Shared fixtures: hypothesis profiles, the array matrix, backend facts, the suite's
folders, GPTQ tensors."""
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import ztensor

settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("qemu", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

STORAGE_DTYPES = ["<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "i1", "<u8", "<u4", "<u2", "u1", "?"]


def asymmetric(shape, dtype, seed=0):
    """Values whose bytes differ within each element (a swap or shift shows)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    base = (np.arange(n, dtype=np.int64) * 2654435761 + seed * 97 + 0x0102) % 65521
    if dtype.kind == "b":
        return (base % 3 == 0).reshape(shape)
    if dtype.kind == "c":
        return (base * 0.5 - 3j * base).astype(dtype).reshape(shape)
    if dtype.kind == "f":
        return ((base - 30000) / 7.25).astype(dtype).reshape(shape)
    mixed = base.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # wraps mod 2**64
    return mixed.astype(dtype).reshape(shape)


def pytest_report_header(config):
    return (f"ztensor backend={ztensor.backend} crc32c_hardware="
            f"{ztensor.kernels.crc32c_hardware()} numpy={np.__version__}")


@pytest.fixture(scope="session", autouse=True)
def _backend_is_what_was_asked():
    # A missing extension must not silently turn the C test run into a fallback run.
    wanted = "python" if os.environ.get("ZTENSOR_PUREPYTHON") == "1" else "c"
    assert ztensor.backend == wanted, (
        f"expected the {wanted} backend, got {ztensor.backend} from {ztensor.__file__}: "
        "install the package (pip install . or pip install -e .) and run `pytest`, not "
        "`python -m pytest`, which imports the uncompiled source folder")


# The suite's folders, for test modules at any depth below tests/ (they mirror the
# package's subpackages): the data files, and the root the docs/ they check sit in (a
# wheel's test run copies tests/ and docs/ side by side, without the package's source).
TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
ROOT = TESTS.parent


def random_gptq(rng, N, K, bits, group_size, act_order):
    """A GPTQ checkpoint's tensors (qweight, qzeros, scales, g_idx) of random values."""
    per = 32 // bits
    G = -(-K // group_size)
    qweight = rng.integers(0, 2**32, (K // per, N), dtype=np.uint64).astype(np.uint32).view(np.int32)
    qzeros = rng.integers(0, 2**32, (G, N // per), dtype=np.uint64).astype(np.uint32).view(np.int32)
    scales = (rng.random((G, N)) * 0.02 + 1e-3).astype(np.float16)
    g_idx = (rng.permutation(K) // group_size).astype(np.int32) if act_order else \
        (np.arange(K) // group_size).astype(np.int32)
    return qweight, qzeros, scales, g_idx


@pytest.fixture
def no_ml_dtypes(monkeypatch):
    """The package as it behaves where ml_dtypes is not installed."""
    from ztensor import dtypes

    monkeypatch.setenv("ZTENSOR_NO_ML_DTYPES", "1")
    dtypes.ml_dtypes_module.cache_clear()
    yield
    monkeypatch.delenv("ZTENSOR_NO_ML_DTYPES")
    dtypes.ml_dtypes_module.cache_clear()
