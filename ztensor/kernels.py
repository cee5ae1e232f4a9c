"""Choose the compiled kernels or their numpy twins.

``ZTENSOR_PUREPYTHON=1`` forces the numpy fallback (as msgpack's
``MSGPACK_PUREPYTHON``); otherwise the compiled extension is used and the fallback
only steps in when the extension is missing (e.g. an sdist built without a C
compiler).  :data:`backend` says which one is live: ``"c"`` or ``"python"``.
"""
import os

from ztensor._native import contract as _contract


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
        from ztensor._native import _kernels as _impl
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
    manifest_scan = _impl.manifest_scan
    decode_spans = _impl.decode_spans
    manifest_encode = _impl.manifest_encode
    ViewTable = _impl.ViewTable  # read_numpy's zero-copy hot path over the manifest's tables
copy_spans = _impl.copy_spans
# the hand-written AVX2 paths (compiled backend on x86-64): on/off, and whether live
set_simd = getattr(_impl, "set_simd", lambda on: False)
avx2_active = getattr(_impl, "avx2_active", lambda: False)

# codes shared with csrc/floatconv.h and csrc/quant.h (one home: _contract.py, checked
# against the headers by tests/test_c_constants.py)
F32: int = _contract.F32
F16: int = _contract.F16
BF16: int = _contract.BF16
ZERO_NONE, ZERO_PACKED_V1, ZERO_PACKED_V2 = (_contract.ZERO_NONE, _contract.ZERO_PACKED_V1,
                                             _contract.ZERO_PACKED_V2)
FP8_KINDS = _contract.FP8_KINDS

__all__ = ["backend", "footer_parse", "bswap", "crc32c", "crc32c_portable",
           "crc32c_hardware", "BlobWriter", "fp8_decode", "fp8_encode", "bf16_decode",
           "bf16_encode", "unpack_codes", "dequant_rows", "cbor_scan", "cbor_check_canonical", "xxh3_64", "copy_spans", "ggml_dequant",
           "cpu_threads"]
