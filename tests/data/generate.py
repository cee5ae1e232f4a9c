"""Regenerate the golden files in tests/data/.

    python tests/data/generate.py

* ``ref-<version>/`` files written by the reference implementation (PyPI ztensor
  1.2.3, 1.1.1, 0.1.4, driven through tests/reference.py), with ``expected.npz``
  holding the arrays that went in (key ``"<object>/<component>"``) and
  ``expected.json`` the formats and shapes.
* ``v0.1-handmade/``: v0.1 features the 0.1.4 Python API cannot write (big-endian
  blobs, crc32c checksums, zstd, one-blob sparse), encoded here byte by byte from
  the v0.1 spec and conventions.md.

Arrays are deterministic, with asymmetric bytes (never all zeros), so a byte-order
or offset mistake changes values.
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import cbor2
import numpy as np
import zstandard

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import reference  # noqa: E402


def ramp(n, dtype, start=1):
    """Distinct, byte-asymmetric values."""
    return (np.arange(start, start + n) * 37 % 251 + 3).astype(dtype)


def dense_cases():
    return {
        "f32": ramp(6, np.float32).reshape(2, 3) / 7,
        "f64": ramp(5, np.float64) * -1.25,
        "f16": ramp(8, np.float16).reshape(2, 2, 2),
        "i64": ramp(100, np.int64) * -1000003,
        "i32": ramp(7, np.int32) * -70001,
        "i16": ramp(9, np.int16) * -111,
        "i8": ramp(10, np.int8) - 100,
        "u64": ramp(4, np.uint64) * 0x0102030405,
        "u32": ramp(4, np.uint32) * 0x01020304 // 3,
        "u16": ramp(6, np.uint16) * 257,
        "u8": ramp(11, np.uint8),
        "bool": ramp(5, np.uint8) % 2 == 1,
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.array([2.5], np.float64),
    }


def sparse_cases():
    csr = {"values": np.array([1.5, -2.25, 3.0, 4.5], np.float32),
           "indices": np.array([0, 3, 1, 2], np.uint64),
           "indptr": np.array([0, 2, 2, 4], np.uint64)}
    coo = {"values": np.array([7.0, -8.5, 9.25], np.float32),
           "coords": np.array([0, 2, 1, 3, 0, 2], np.uint64)}  # rows then cols
    return csr, coo


class Golden:
    def __init__(self, folder: Path):
        self.folder = folder
        self.expected, self.meta = {}, {}

    def add(self, file, name, fmt, shape, arrays):
        self.meta.setdefault(file, {})[name] = {"format": fmt, "shape": list(shape)}
        for role, arr in arrays.items():
            self.expected[f"{file}/{name}/{role}"] = arr

    def save(self):
        np.savez(self.folder / "expected.npz", **self.expected)
        (self.folder / "expected.json").write_text(json.dumps(self.meta, indent=1) + "\n")


def save_arrays(tmp: Path, name: str, arrays: dict) -> dict:
    paths = {}
    for role, arr in arrays.items():
        suffix = ".bf16.npy" if arr.dtype.name == "bfloat16" else ".npy"
        path = tmp / f"{name}.{role}{suffix}"
        np.save(path, arr.view(np.uint16) if suffix == ".bf16.npy" else arr)
        paths[role] = str(path)
    return paths


def write_with_reference(version, folder, file, objects, tmp):
    payload = {"path": str(folder / file), "objects": []}
    for o in objects:
        payload["objects"].append({**o, "arrays": save_arrays(tmp, o["name"], o["arrays"])})
    reference.run(version, "write", payload, tmp)


def generate_reference(version, tmp):
    folder = HERE / f"ref-{version}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    gold = Golden(folder)
    cases = dense_cases()
    if version == "0.1.4":
        cases = {k: v for k, v in cases.items() if k not in ("empty",)}
    objects = []
    for name, arr in cases.items():
        opts = {}
        if version != "0.1.4" and name in ("i64", "f16"):
            opts["compress"] = True
        if version == "1.2.3" and name in ("i64", "u16"):
            opts["checksum"] = "crc32c"
        if version == "1.2.3" and name in ("f16", "i32"):
            opts["checksum"] = "sha256"
        objects.append({"name": name, "kind": "dense", "arrays": {"data": arr}, **opts})
        gold.add("dense.zt", name, "dense", arr.shape, {"data": arr})
    write_with_reference(version, folder, "dense.zt", objects, tmp)
    if version == "0.1.4":
        gold.save()
        return
    csr, coo = sparse_cases()
    sparse = [{"name": "csr", "kind": "sparse_csr", "shape": [3, 4], "arrays": csr}]
    if version == "1.1.1":
        coo_in = {"values": coo["values"], "coords": coo["coords"].reshape(2, -1)}
    else:
        coo_in = coo
    sparse.append({"name": "coo", "kind": "sparse_coo", "shape": [3, 4], "arrays": coo_in})
    write_with_reference(version, folder, "sparse.zt", sparse, tmp)
    gold.add("sparse.zt", "csr", "sparse_csr", [3, 4], csr)
    gold.add("sparse.zt", "coo", "sparse_coo", [3, 4], coo)
    if version == "1.2.3":
        generate_123_extras(folder, gold, tmp)
    gold.save()


def generate_123_extras(folder, gold, tmp):
    import ml_dtypes

    f8 = np.array([0x00, 0x01, 0x38, 0x7E, 0x80, 0xB8, 0xFE, 0x7F], np.uint8)  # 0x7f: NaN
    bf = ramp(6, np.float32).astype(ml_dtypes.bfloat16) / 3
    cplx = np.array([1.5, -2.0, 0.25, 8.0], np.float32)  # two complex64 values
    packed = (ramp(16, np.int64) * 0x01234567 % (1 << 32)).astype(np.uint32).view(np.int32)
    quant = {"packed_weight": packed.reshape(2, 8), "scales": ramp(8, np.float16) / 64,
             "zeros": ramp(8, np.float16) % 16}
    objects = [
        {"name": "fp8", "kind": "dense", "type": "f8_e4m3fn", "arrays": {"data": f8}},
        {"name": "bf16", "kind": "dense", "arrays": {"data": bf}},
        {"name": "complex", "kind": "dense", "type": "complex64", "shape": [2],
         "arrays": {"data": cplx}},
        {"name": "q", "kind": "quantized_group", "shape": [8, 16],
         "attributes": {"bits": 4, "group_size": 128, "packing": "8_per_i32"}, "arrays": quant},
        {"name": "empty_zstd", "kind": "dense", "compress": True,
         "arrays": {"data": np.zeros(0, np.float32)}},
    ]
    write_with_reference("1.2.3", folder, "types.zt", objects, tmp)
    gold.add("types.zt", "fp8", "dense", [8], {"data": f8})
    gold.add("types.zt", "bf16", "dense", [6], {"data": bf.view(np.uint16)})
    gold.add("types.zt", "complex", "dense", [2], {"data": cplx})
    gold.add("types.zt", "q", "quantized_group", [8, 16],
             {k: v.reshape(-1) for k, v in quant.items()})
    gold.add("types.zt", "empty_zstd", "dense", [0], {"data": np.zeros(0, np.float32)})
    # byte-exact writer test: the same arrays written by us must give these bytes
    exact = [{"name": k, "kind": "dense", "arrays": {"data": v},
              **({"checksum": "crc32c"} if k == "i16" else {}),
              **({"checksum": "sha256"} if k == "u8" else {})}
             for k, v in dense_cases().items() if k != "scalar"]
    exact.append({"name": "bf16", "kind": "dense", "arrays": {"data": bf}})
    write_with_reference("1.2.3", folder, "exact.zt", exact, tmp)


# ----------------------------------------------------------- handmade v0.1
def v01_file(entries_and_blobs):
    """Lay out v0.1: magic, 64-aligned blobs, CBOR array of indefinite maps, size."""
    out = bytearray(b"ZTEN0001")
    entries = []
    for entry, blob in entries_and_blobs:
        out += bytes(-len(out) % 64)
        entries.append({**entry, "offset": len(out), "size": len(blob)})
        out += blob
    meta = bytearray(b"\x80" if not entries else b"\x98" + bytes([len(entries)]))
    for e in entries:  # indefinite-length maps, as the 0.1.x writer emitted
        meta += b"\xbf" + b"".join(cbor2.dumps(k) + cbor2.dumps(v) for k, v in e.items()) + b"\xff"
    return bytes(out + meta + struct.pack("<Q", len(meta)))


def crc32c(data: bytes) -> int:
    from ztensor import _fallback
    return _fallback.crc32c(data)


def generate_v01_handmade():
    folder = HERE / "v0.1-handmade"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    gold = Golden(folder)
    big = ramp(6, np.float32).reshape(2, 3) / 3
    le16 = ramp(5, np.int16) * -300
    zs = ramp(50, np.int32) * 12345
    checked = ramp(7, np.uint32) * 0x01010101
    base = {"layout": "dense", "encoding": "raw"}
    blob_checked = checked.astype("<u4").tobytes()
    parts = [
        ({"name": "big_f32", "dtype": "float32", "shape": [2, 3], **base,
          "data_endianness": "big"}, big.astype(">f4").tobytes()),
        ({"name": "little_i16", "dtype": "int16", "shape": [5], **base,
          "data_endianness": "little", "note": "custom key"}, le16.astype("<i2").tobytes()),
        ({"name": "zstd_i32", "dtype": "int32", "shape": [50], "layout": "dense",
          "encoding": "zstd"}, zstandard.ZstdCompressor(level=3).compress(zs.tobytes())),
        ({"name": "checked_u32", "dtype": "uint32", "shape": [7], **base,
          "checksum": f"crc32c:0x{crc32c(blob_checked):08X}"}, blob_checked),
    ]
    # sparse CSR 3x4: indptr | indices | values, u64 LE indices
    csr_vals = np.array([1.5, -2.5, 4.0], np.float64)
    csr_idx = np.array([1, 3, 0], np.uint64)
    csr_ptr = np.array([0, 2, 2, 3], np.uint64)
    parts.append(({"name": "csr", "dtype": "float64", "shape": [3, 4], "layout": "sparsecsr",
                   "encoding": "raw"},
                  csr_ptr.astype("<u8").tobytes() + csr_idx.astype("<u8").tobytes()
                  + csr_vals.astype("<f8").tobytes()))
    # sparse COO 3x4: records of (row u64, col u64, value f32)
    rows, cols = np.array([0, 2, 1], np.uint64), np.array([3, 0, 2], np.uint64)
    coo_vals = np.array([7.0, -8.5, 9.25], np.float32)
    records = b"".join(struct.pack("<QQf", int(r), int(c), float(v))
                       for r, c, v in zip(rows, cols, coo_vals))
    parts.append(({"name": "coo", "dtype": "float32", "shape": [3, 4], "layout": "sparsecoo",
                   "encoding": "raw"}, records))
    (folder / "features.zt").write_bytes(v01_file(parts))
    gold.add("features.zt", "big_f32", "dense", [2, 3], {"data": big})
    gold.add("features.zt", "little_i16", "dense", [5], {"data": le16})
    gold.add("features.zt", "zstd_i32", "dense", [50], {"data": zs})
    gold.add("features.zt", "checked_u32", "dense", [7], {"data": checked})
    gold.add("features.zt", "csr", "sparse_csr", [3, 4],
             {"values": csr_vals, "indices": csr_idx, "indptr": csr_ptr})
    gold.add("features.zt", "coo", "sparse_coo", [3, 4],
             {"values": coo_vals, "coords": np.concatenate([rows, cols])})
    (folder / "empty.zt").write_bytes(v01_file([]))
    gold.meta["empty.zt"] = {}
    gold.save()


def generate_v2(tmp, version="2.1.2"):
    """PyPI ztensor 2.x's container (read-only for us): dense objects of every
    storage type and the logical types it writes, zstd-seekable parts, attributes,
    sparse CSR/COO, and a canonical file."""
    import ml_dtypes

    folder = HERE / f"ref-{version}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    gold = Golden(folder)
    cases = {**dense_cases(),  # (its Writer.add stores a 0-d shape as [1]: not used here)
             "c64": (ramp(6, np.float32) + 1j * ramp(6, np.float32, 9)).astype(np.complex64),
             "bf16": (ramp(10, np.float32) / 3).astype(ml_dtypes.bfloat16),
             "f8": np.array([0x00, 0x01, 0x38, 0x7E, 0x80, 0xB8, 0xFE, 0x7F], np.uint8)}
    objects = []
    for name, arr in cases.items():
        opts = {"compress": True} if name in ("i64", "f16", "u32") else {}
        if name == "f8":
            opts["type"] = "f8_e4m3fn"
        objects.append({"name": name, "kind": "dense", "arrays": {"data": arr}, **opts})
        stored = arr.view(np.uint16) if name == "bf16" else \
            arr.view(np.float32) if name == "c64" else arr  # complex: the float pairs
        gold.add("dense.zt", name, "dense", arr.shape, {"data": stored})
    payload = {"path": str(folder / "dense.zt"), "attributes": {
        "model": "golden", "layers": 3, "eps": 1e-5, "flags": [True, None, "x"],
        "nested": {"a": {"b": [1, -2, 2.5]}}}, "objects": []}
    for o in objects:
        payload["objects"].append({**o, "arrays": save_arrays(tmp, o["name"], o["arrays"])})
    reference.run(version, "write", payload, tmp)
    csr, coo = sparse_cases()
    write_with_reference(version, folder, "sparse.zt", [
        {"name": "csr", "kind": "sparse_csr", "shape": [3, 4], "arrays": csr},
        {"name": "coo", "kind": "sparse_coo", "shape": [3, 4], "arrays": coo}], tmp)
    gold.add("sparse.zt", "csr", "sparse_csr", [3, 4], csr)
    gold.add("sparse.zt", "coo", "sparse_coo", [3, 4], coo)
    canonical = {"b": ramp(4, np.int32), "w": ramp(12, np.float32).reshape(3, 4)}  # sorted
    payload = {"path": str(folder / "canonical.zt"), "canonical": True, "objects": [
        {"name": k, "kind": "dense", "arrays": save_arrays(tmp, "c_" + k, {"data": v})}
        for k, v in canonical.items()]}
    reference.run(version, "write", payload, tmp)
    for name, arr in canonical.items():
        gold.add("canonical.zt", name, "dense", arr.shape, {"data": arr})
    gold.save()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for version in reference.VERSIONS:
            generate_reference(version, Path(tmp))
        generate_v2(Path(tmp))
    generate_v01_handmade()
    print("golden files written under", HERE)
