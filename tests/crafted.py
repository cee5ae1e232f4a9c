"""Hand-made files for the hostile suites: a v1 container around any manifest (or
raw manifest bytes), zstd components, and the "open, read everything" oracle."""
import struct

import cbor2
import numpy as np
import zstandard

import ztensor


def read_everything(source, **kw):
    """Open, read every object (both APIs, copy and not) and verify."""
    with ztensor.Reader(source, verify=True, **kw) as r:
        for name in r.keys():
            r.read(name)
            r.read(name, copy=True)
            if r.metadata(name).format == "dense":
                r.read_numpy(name)
        r.verify()


def outcome(source, **kw):
    try:
        read_everything(source, **kw)
    except ztensor.ZTensorError as exc:
        return exc
    return None


def v1_file(manifest, blobs=b"", raw=None):
    body = b"ZTEN1000" + blobs
    body += bytes(-len(body) % 64)
    m = raw if raw is not None else cbor2.dumps(manifest)
    return body + m + struct.pack("<Q", len(m)) + b"ZTEN1000"


BLOB = np.arange(16, dtype="<f4").tobytes()  # 64 bytes at offset 64


def good_manifest():
    return {"version": "1.2.0", "objects": {"x": {
        "shape": [4, 4], "format": "dense",
        "components": {"data": {"dtype": "f32", "offset": 64, "length": 64}}}}}


def zstd_file(payload: bytes, ulen, shape=None):
    itemsize = 4
    shape = shape if shape is not None else [ulen // itemsize]
    m = {"version": "1.2.0", "objects": {"z": {"shape": shape, "format": "dense",
         "components": {"data": {"dtype": "f32", "offset": 64, "length": len(payload),
                                 "uncompressed_length": ulen, "encoding": "zstd"}}}}}
    return v1_file(m, bytes(56) + payload)


RAW = np.arange(1000, dtype="<f4").tobytes()


def streamed(data, **kw):
    c = zstandard.ZstdCompressor(**kw).compressobj()
    return c.compress(data) + c.flush()
