"""Write the hand-made regression inputs of hostile-input round two into
tests/data/fuzz-regressions/ (each is a file an attacker could send; the README
there says what each once did).  Deterministic: running it again gives the same
bytes, so the committed files can be checked against it."""
import io
import struct
import sys
import zipfile
from pathlib import Path

import cbor2
import numpy as np
import zstandard

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/fuzz-regressions")


def v1(raw_manifest: bytes, blobs: bytes = b"") -> bytes:
    body = b"ZTEN1000" + blobs
    body += bytes(-len(body) % 64)
    return body + raw_manifest + struct.pack("<Q", len(raw_manifest)) + b"ZTEN1000"


def manifest(objects, attributes_raw=None, version="1.2.0"):
    pairs = cbor2.dumps("version") + cbor2.dumps(version)
    n = 2
    if attributes_raw is not None:
        pairs += cbor2.dumps("attributes") + attributes_raw
        n = 3
    return bytes([0xA0 + n]) + pairs + cbor2.dumps("objects") + cbor2.dumps(objects)


DENSE = {"x": {"shape": [16], "format": "dense",
               "components": {"data": {"dtype": "f32", "offset": 64, "length": 64}}}}
BLOB = bytes(56) + np.arange(16, dtype="<f4").tobytes()


def doubling(levels):
    body = b"\xd8\x1c\x82\x01\xd8\x1d\x00"
    for _ in range(levels):
        body = b"\xd8\x1c\x82" + body + b"\xd8\x1d\x00"
    return b"\xa1\x61a" + body


def quantized(**attrs):
    rng = np.random.default_rng(0)
    comps = {"packed_weight": rng.integers(0, 2**31, (8, 8), dtype=np.int64).astype("<i4"),
             "scales": np.ones((2, 8), "<f2"), "zeros": np.full((2, 8), 8, "<f2")}
    if "g_idx" in attrs:
        comps["g_idx"] = attrs.pop("g_idx")
    blob, entries, offset = b"", {}, 64
    for role, arr in comps.items():
        raw = arr.tobytes()
        entries[role] = {"dtype": {"i": "i32", "f": "f16"}[arr.dtype.kind], "offset": offset,
                         "length": len(raw)}
        blob += raw + bytes(-len(raw) % 64)
        offset += len(raw) + (-len(raw) % 64)
    a = {"bits": 4, "group_size": 32, **attrs}
    return v1(manifest({"q": {"shape": [8, 64], "format": "quantized_group", "attributes": a,
                              "components": entries}}), bytes(56) + blob)


def zstd_object(ulen, version="1.2.0", sized=True, shape=None):
    payload = zstandard.ZstdCompressor().compress(bytes(64))
    comp = {"dtype": "u8", "offset": 64, "length": len(payload), "encoding": "zstd"}
    if sized:
        comp["uncompressed_length"] = ulen
    obj = {"shape": shape or [ulen], "format": "dense", "components": {"data": comp}}
    return v1(manifest({"z": obj}, version=version), bytes(56) + payload)


FILES = {
    "shared-doubling.zt": v1(manifest(DENSE, doubling(40)), BLOB),
    "rational-bignums.zt": v1(manifest(DENSE, b"\xa1\x61a\xd8\x1e\x82\xc2\x59\x08\x00"
                                       + b"\xff" * 2048 + b"\xc2\x59\x08\x00" + b"\xfe" * 2048),
                              BLOB),
    "decimal-fraction.zt": v1(manifest(DENSE, b"\xa1\x61a\xc4\x82\x3b\x7f" + b"\xff" * 7
                                       + b"\x01"), BLOB),
    "objects-share-one-map.zt": v1(
        b"\xa2" + cbor2.dumps("version") + cbor2.dumps("1.2.0") + cbor2.dumps("objects")
        + b"\xb9\x03\xe8" + b"".join(
            cbor2.dumps(f"o{i}") + (b"\xd8\x1c" + cbor2.dumps(DENSE["x"]) if i == 0
                                    else b"\xd8\x1d\x00") for i in range(1000)), BLOB),
    "zstd-declares-3gib.zt": zstd_object(3 << 30),
    "zstd-unsized-v11.zt": zstd_object(1 << 40, version="1.1.0", sized=False),
    "quantized-gidx-out-of-range.zt": quantized(g_idx=np.full(64, 7, "<i4")),
    "quantized-gidx-negative.zt": quantized(g_idx=np.full(64, -1, "<i4")),
    "quantized-msb-first.zt": quantized(pack_order="msb_first"),
    "quantized-bits-float.zt": quantized(bits=4.0),
    "quantized-bits-bignum.zt": quantized(bits=2**20000),
    "quantized-group-size-2-64.zt": quantized(group_size=2**64),
    "quantized-group-size-1.zt": quantized(group_size=1),
    "v01-sparse-format-bignum.zt": (lambda m: b"ZTEN0001" + bytes(56) + BLOB[56:] + m
                                    + struct.pack("<Q", len(m)))(cbor2.dumps([{
                                        "name": "s", "offset": 64, "size": 64, "dtype": "float32",
                                        "shape": [4, 4], "layout": "sparse",
                                        "sparse_format": 2**20000}])),
    "coo-shape-empty.zt": v1(manifest({"c": {"shape": [], "format": "sparse_coo", "components": {
        "values": {"dtype": "f32", "offset": 64, "length": 4},
        "coords": {"dtype": "u64", "offset": 128, "length": 0}}}}), BLOB),
    "overlapping-components.zt": v1(manifest({**DENSE, "y": {
        "shape": [8], "format": "dense",
        "components": {"data": {"dtype": "f32", "offset": 96, "length": 32}}}}), BLOB),
    "name-with-terminal-escape.zt": v1(manifest({"\x1b]0;pwned\x07\x1b[2J": DENSE["x"]},
                                                cbor2.dumps({"nan": float("nan"),
                                                             "big": 2**20000, "b": b"\x00"})),
                                       BLOB),
    "deep-attributes.zt": v1(manifest(DENSE, b"\xa1\x61a" + b"\x81" * 70 + b"\x00"), BLOB),
    "integer-map-key.zt": v1(manifest(DENSE, b"\xa1\x01\x02"), BLOB),
    "version-2.zt": v1(manifest(DENSE, version="2.0.0"), BLOB),
    "md5-digest.zt": v1(manifest({"x": {**DENSE["x"], "components": {"data": {
        **DENSE["x"]["components"]["data"], "digest": "md5:" + "0" * 32}}}}), BLOB),
}


def npz_with_lying_directory():
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                               "shape": (1 << 28,)})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo("x.npy", date_time=(2026, 1, 1, 0, 0, 0))
        z.writestr(info, buf.getvalue() + bytes(64), zipfile.ZIP_DEFLATED)
    raw = bytearray(out.getvalue())
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 24:cd + 28] = (0xFFFFFFFF).to_bytes(4, "little")   # claims 4 GiB
    return bytes(raw)


def safetensors(header: bytes, data=bytes(4)):
    return struct.pack("<Q", len(header)) + header + data


# importers/*.bin: first byte picks the extension (0 .safetensors, 1 .npy, 2 .npz, 3 .gguf)
IMPORTERS = {
    "safetensors-deep-nesting.bin": b"\x00" + safetensors(b"[" * 100_000 + b"]" * 100_000),
    "safetensors-surrogate-name.bin": b"\x00" + safetensors(
        b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'),
    "npz-lying-zip-directory.bin": b"\x02" + npz_with_lying_directory(),
}

if __name__ == "__main__":
    (OUT / "importers").mkdir(parents=True, exist_ok=True)
    for name, data in FILES.items():
        (OUT / name).write_bytes(data)
    for name, data in IMPORTERS.items():
        (OUT / "importers" / name).write_bytes(data)
    print(f"{len(FILES) + len(IMPORTERS)} files in {OUT}")
