"""Choose the compiled kernels or their numpy twins.

``ZTENSOR_PUREPYTHON=1`` forces the numpy fallback (as msgpack's
``MSGPACK_PUREPYTHON``); otherwise the compiled extension is used and the fallback
only steps in when the extension is missing (e.g. an sdist built without a C
compiler).  :data:`backend` says which one is live: ``"c"`` or ``"python"``.
"""
import os

if os.environ.get("ZTENSOR_PUREPYTHON") == "1":
    from ztensor import _fallback as _impl
    backend = "python"
else:
    try:
        from ztensor import _kernels as _impl
        backend = "c"
    except ImportError:  # no compiled extension in this install
        from ztensor import _fallback as _impl
        backend = "python"

footer_parse = _impl.footer_parse
bswap = _impl.bswap
crc32c = _impl.crc32c
crc32c_portable = _impl.crc32c_portable
crc32c_hardware = _impl.crc32c_hardware
BlobWriter = _impl.BlobWriter

__all__ = ["backend", "footer_parse", "bswap", "crc32c", "crc32c_portable",
           "crc32c_hardware", "BlobWriter"]
