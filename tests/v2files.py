"""zTensor v2 files built byte by byte for tests, from the v2 spec alone: a
deterministic CBOR encoder (RFC 8949 section 4.2.1: shortest heads, keys sorted by
their encoded bytes) and the container (magic, 4096-aligned blobs, 40-byte footer
with the manifest's XXH3-64).  ``build`` takes the manifest as plain data, so a
test can state any manifest, valid or not; ``raw_manifest`` bypasses the encoder."""
import struct

import numpy as np

MAGIC = b"\x89ZT2\r\n\x1a\n"


def xxh3(data: bytes) -> int:
    try:
        import xxhash
        return xxhash.xxh3_64_intdigest(data)
    except ImportError:  # checked against xxhash and known answers in container/test_v2
        from ztensor import kernels
        return kernels.xxh3_64(np.frombuffer(data, np.uint8))


def head(major, arg):
    if arg < 24:
        return bytes([major << 5 | arg])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if arg < 1 << (8 * size):
            return bytes([major << 5 | info]) + arg.to_bytes(size, "big")
    raise ValueError(arg)


def encode(v) -> bytes:
    if v is None:
        return b"\xf6"
    if v is True or v is False:
        return b"\xf5" if v else b"\xf4"
    if isinstance(v, int):
        return head(0, v) if v >= 0 else head(1, -1 - v)
    if isinstance(v, float):
        if v != v:
            return b"\xf9\x7e\x00"  # the one NaN deterministic encoding allows
        for fmt, ib in (("e", 0xF9), ("f", 0xFA)):
            try:
                packed = struct.pack(">" + fmt, v)
            except OverflowError:
                continue
            if struct.unpack(">" + fmt, packed)[0] == v:
                return bytes([ib]) + packed
        return b"\xfb" + struct.pack(">d", v)
    if isinstance(v, bytes):
        return head(2, len(v)) + v
    if isinstance(v, str):
        b = v.encode("utf-8")
        return head(3, len(b)) + b
    if isinstance(v, list):
        return head(4, len(v)) + b"".join(encode(x) for x in v)
    if isinstance(v, dict):
        items = sorted((encode(k), encode(x)) for k, x in v.items())
        return head(5, len(items)) + b"".join(k + x for k, x in items)
    raise TypeError(type(v))


def build(objects=None, blobs=(), attributes=None, shards=None, *, manifest=None,
          raw_manifest=None, version=2, reserved=0, manifest_at=None, hash_fix=0):
    """A v2 file: ``blobs`` are (offset, bytes) placed at those offsets (zeros
    between), then the manifest blob at the next multiple of 4096 (or
    ``manifest_at``), then the footer."""
    if manifest is None:
        manifest = {"objects": objects if objects is not None else {}}
        if attributes is not None:
            manifest["attributes"] = attributes
        if shards is not None:
            manifest["shards"] = shards
    raw = raw_manifest if raw_manifest is not None else encode(manifest)
    body = bytearray(MAGIC)
    for offset, data in sorted(blobs):
        body += bytes(offset - len(body))
        body += data
    at = manifest_at if manifest_at is not None else -(-max(len(body), 4096) // 4096) * 4096
    body += bytes(at - len(body))
    body += raw
    footer = struct.pack("<QQQII", at, len(raw), (xxh3(raw) + hash_fix) % (1 << 64), version,
                         reserved) + MAGIC
    return bytes(body) + footer


def dense(arr, offset, **extra):
    """(object, blob) for a raw dense array at ``offset``."""
    arr = np.asarray(arr, order="C")  # not ascontiguousarray: 0-d stays 0-d
    storage = {"f": "f", "i": "i", "u": "u", "b": "u"}[arr.dtype.kind] + str(8 * arr.dtype.itemsize)
    part = {"dtype": storage, "blob": [offset, arr.nbytes], **extra.pop("part", {})}
    obj = {"shape": list(arr.shape), "layout": "dense", "parts": {"data": part}, **extra}
    return obj, (offset, arr.astype(arr.dtype.newbyteorder("<")).tobytes())
