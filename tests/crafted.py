"""Hand-made files for the hostile suites: a v1 container around any manifest (or
raw manifest bytes), zstd components, seek tables and files re-laid around them,
and the "open, read everything" oracle."""
import struct

import cbor2
import numpy as np
import zstandard

import ztensor
from ztensor import spec
from ztensor.container import manifest
from ztensor.container import manifest_table
from ztensor.container.footer import read_footer
from ztensor.io.source import Source


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


# ------------------------------------------------------------------ seek tables
SKIPPABLE, SEEKABLE = 0x184D2A5E, 0x8F92EAB1  # zstd's seekable format: frame, footer magic


def seek_table(entries, checksums=None):
    """A seek table's skippable frame, as zstd's seekable format lays it out
    (little-endian on any host): (compressed, decoded) sizes per frame, and with
    ``checksums`` the descriptor's checksum flag and a u32 after each entry."""
    body = b""
    for i, (c, d) in enumerate(entries):
        body += struct.pack("<II", c, d)
        if checksums is not None:
            body += struct.pack("<I", checksums[i])
    flag = 0x80 if checksums is not None else 0
    body += struct.pack("<IBI", len(entries), flag, SEEKABLE)
    return struct.pack("<II", SKIPPABLE, len(body)) + body


def relaid(src, dst, stored, name="x"):
    """Writes ``dst``: ``src`` (a v1.2 file whose last-written object is ``name``)
    with that object's data component's stored bytes replaced by ``stored`` (frames
    and a :func:`seek_table`, say; values in them little-endian, as a file holds
    them: ``x.astype("<f4").tobytes()``, never the host's order).  Returns ``dst``."""
    whole = src.read_bytes()
    size = struct.unpack("<Q", whole[-16:-8])[0]
    m = cbor2.loads(whole[-16 - size : -16])
    comp = m["objects"][name]["components"]["data"]
    body = whole[: comp["offset"]] + stored
    body += bytes(-len(body) % 64)
    comp["length"] = len(stored)
    encoded = cbor2.dumps(m)
    dst.write_bytes(body + encoded + struct.pack("<Q", len(encoded)) + b"ZTEN1000")
    return dst


# ------------------------------------------------------------------ the two manifest paths
def describe(m: manifest.Manifest):
    """Everything a manifest says, comparable (canonical CBOR: a NaN equals itself)."""
    objects = []
    for name in m.names():
        o = m.get(name)
        objects.append((name, cbor2.dumps(o.to_dict(), canonical=True), o.legacy,
                        [(c.byteorder, c.aligned) for c in o.components.values()]))
    return m.version, cbor2.dumps(m.attributes, canonical=True), objects, len(m)


def decode_manifest(data, general=False, limits=spec.DEFAULT_LIMITS):
    """(described manifest or (error class, message), whether the fast path answered);
    ``general``: as if the fast path declined every manifest."""
    taken = []
    original = manifest_table.decode

    def spy(*args, **kw):
        result = None if general else original(*args, **kw)
        taken.append(result is not None)
        return result

    manifest_table.decode = spy
    try:
        source = Source(data)
        try:
            footer = read_footer(source, limits)
            raw = bytes(source.view(footer.manifest_offset, footer.manifest_size, "m"))
            result = describe(manifest.decode_manifest(raw, footer, path="f", limits=limits))
        finally:
            source.close()
    except ztensor.ZTensorError as exc:
        result = (type(exc).__name__, str(exc))
    finally:
        manifest_table.decode = original
    return result, any(taken)


def decode_both_ways(data, limits=spec.DEFAULT_LIMITS):
    """(fast path's result, general path's result, whether the fast path answered)."""
    fast, taken = decode_manifest(data, limits=limits)
    general, _ = decode_manifest(data, general=True, limits=limits)
    return fast, general, taken


def encode(value, choose):
    """CBOR of ``value`` with containers definite or indefinite and integer heads
    minimal or wide, as other writers may choose: ``choose(options)`` picks one."""
    def head(major, n):
        widths = [w for w, cap in ((0, 24), (1, 1 << 8), (2, 1 << 16), (4, 1 << 32),
                                   (8, 1 << 64)) if n < cap]
        w = choose(widths)
        if w == 0:
            return bytes([major << 5 | n])
        info = {1: 24, 2: 25, 4: 26, 8: 27}[w]
        return bytes([major << 5 | info]) + n.to_bytes(w, "big")

    if isinstance(value, bool) or value is None or isinstance(value, float):
        return cbor2.dumps(value)
    if isinstance(value, int):
        return head(0, value) if 0 <= value < 1 << 64 else cbor2.dumps(value)
    if isinstance(value, str):
        b = value.encode("utf-8", "surrogatepass")
        return head(3, len(b)) + b
    if isinstance(value, (list, tuple)):
        body = b"".join(encode(v, choose) for v in value)
        if choose((False, True)):
            return b"\x9f" + body + b"\xff"
        return head(4, len(value)) + body
    if isinstance(value, dict):
        body = b"".join(encode(k, choose) + encode(v, choose) for k, v in value.items())
        if choose((False, True)):
            return b"\xbf" + body + b"\xff"
        return head(5, len(value)) + body
    return cbor2.dumps(value)
