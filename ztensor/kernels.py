"""Choose the compiled kernels or their numpy twins.

``ZTENSOR_PUREPYTHON=1`` forces the numpy fallback (as msgpack's
``MSGPACK_PUREPYTHON``); otherwise the compiled extension is used and the fallback
only steps in when the extension is missing (e.g. an sdist built without a C
compiler).  :data:`backend` says which one is live: ``"c"`` or ``"python"``.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ztensor import dtypes
from ztensor._native import contract as _contract
from ztensor.errors import UnsupportedError


def cpu_threads() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one):
    the one default for every thread pool (batch reads, seekable zstd, dequantize)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


if os.environ.get("ZTENSOR_PUREPYTHON") == "1":
    from ztensor._native import fallback as _impl

    backend = "python"
else:
    try:
        # the same names as the fallback (types: _native/_kernels.pyi); mypy types
        # _impl by its first import, the fallback
        from ztensor._native import _kernels as _impl  # type: ignore[no-redef]

        backend = "c"
    except ImportError:  # no compiled extension in this install
        from ztensor._native import fallback as _impl

        backend = "python"

footer_parse = _impl.footer_parse
bswap = _impl.bswap
crc32c = _impl.crc32c
crc32c_portable = _impl.crc32c_portable
crc32c_hardware = _impl.crc32c_hardware
BlobWriter = _impl.BlobWriter
reserve_ahead = _impl.reserve_ahead
fp8_decode = _impl.fp8_decode
fp8_encode = _impl.fp8_encode
bf16_decode = _impl.bf16_decode
bf16_encode = _impl.bf16_encode
unpack_codes = _impl.unpack_codes
dequant_rows = _impl.dequant_rows
cbor_scan = _impl.cbor_scan
cbor_check_canonical = _impl.cbor_check_canonical
xxh3_64 = _impl.xxh3_64
ggml_dequant = _impl.ggml_dequant
if backend == "c":  # the numpy fallback decodes and encodes manifests through cbor2
    # attr-defined: mypy sees _impl as the fallback, which lacks these four
    manifest_scan = _impl.manifest_scan  # type: ignore[attr-defined]
    decode_spans = _impl.decode_spans  # type: ignore[attr-defined]
    manifest_encode = _impl.manifest_encode  # type: ignore[attr-defined]
    # read_numpy's zero-copy hot path over the manifest's tables
    ViewTable = _impl.ViewTable  # type: ignore[attr-defined]
copy = _impl.copy
zstd_frames = _impl.zstd_frames
copy_spans = _impl.copy_spans
range_resident = _impl.range_resident
# the hand-written AVX2 paths (compiled backend on x86-64): on/off, and whether live
set_simd = getattr(_impl, "set_simd", lambda on: False)
avx2_active = getattr(_impl, "avx2_active", lambda: False)

# codes shared with csrc/floatconv.h and csrc/quant.h (one home: _contract.py, checked
# against the headers by tests/native/test_c_constants.py)
F32: int = _contract.F32
F16: int = _contract.F16
BF16: int = _contract.BF16
ZERO_NONE, ZERO_PACKED_V1, ZERO_PACKED_V2 = (
    _contract.ZERO_NONE,
    _contract.ZERO_PACKED_V1,
    _contract.ZERO_PACKED_V2,
)
FP8_KINDS = _contract.FP8_KINDS
COPY_STREAM_BYTES: int = _contract.COPY_STREAM_BYTES  # where kernels.copy beats memcpy
# the output code of a float kernel for each numpy float dtype it writes
FLOAT_CODES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16}


def output_type(dtype):
    """(kernel output code, numpy dtype) for a dequantization's ``dtype``: float32,
    float16 or bfloat16 (a name, a numpy or ml_dtypes dtype, or torch's).  The one
    rule for what dequantizing may output, shared by quantized_group and gguf_blocks
    (formats/); UnsupportedError for anything else."""
    if type(dtype).__module__ == "torch":  # torch.float16 and friends: by their names
        dtype = str(dtype).rsplit(".", 1)[-1]
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return BF16, dtypes.ml_dtype("bfloat16") or np.dtype(np.uint16)
    dt = np.dtype(dtype)
    if dt.name == "bfloat16":
        return BF16, dt
    if dt not in FLOAT_CODES:
        raise UnsupportedError(f"dequantize outputs float32, float16 or bfloat16, not {dt}")
    return FLOAT_CODES[dt], dt


def each(fn, items, threads=None):
    """fn(item) for every item, in ``threads`` threads (default: cpu_threads()); the
    first error is raised (after the others finish), as a sequential loop would
    raise it.  The kernels release the GIL, so their calls run in parallel."""
    threads = cpu_threads() if threads is None else int(threads)
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    items = list(items)
    if threads == 1 or len(items) < 2:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
    for future in futures:
        future.result()


__all__ = [
    "backend",
    "footer_parse",
    "bswap",
    "crc32c",
    "crc32c_portable",
    "crc32c_hardware",
    "BlobWriter",
    "reserve_ahead",
    "fp8_decode",
    "fp8_encode",
    "bf16_decode",
    "bf16_encode",
    "unpack_codes",
    "dequant_rows",
    "cbor_scan",
    "cbor_check_canonical",
    "xxh3_64",
    "copy",
    "zstd_frames",
    "copy_spans",
    "ggml_dequant",
    "cpu_threads",
    "output_type",
    "each",
    "FLOAT_CODES",
]
