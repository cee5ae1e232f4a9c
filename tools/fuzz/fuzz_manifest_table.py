"""Fuzz target 8: the manifest's fast path against the general path (the oracle).

Manifests in the shape real writers produce, with any field replaced by a value of
another kind or size, in any CBOR encoding (definite or indefinite containers,
minimal or wide integer heads): csrc/manifest_scan.c + ztensor/container/manifest_table.py
must give the same verdict, message and specs as cbor2 + manifest.Checker, and the
scanner on raw fuzz bytes must return without a sanitizer report, taking only bytes
the plain-CBOR scan (csrc/cbor_scan.c) accepts to their end."""
import os
import sys

from common import LIMITS, run

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from crafted import decode_both_ways, encode, v1_file  # noqa: E402

from ztensor import kernels  # noqa: E402
from ztensor.container import manifest_table

POOL = [0, 1, 2, 63, 64, 128, 1 << 32, 1 << 63, (1 << 64) - 1, -1, True, None, 1.5, "",
        "f32", "u8", "f16", "bf16", "complex64", "float32", "f8_e4m3fn", "zstd", "raw",
        "dense", "sparse_csr", "data", "values", "crc32c:0x1", [], {}, [1], {"k": 1},
        "\u00e9", 1 << 64, {1: "k"}, {"k": {b"b": 1}}, [[[[[[[[1]]]]]]]]]


def manifest(fdp):
    def value(valid):
        return POOL[fdp.ConsumeIntInRange(0, len(POOL) - 1)] if fdp.ConsumeIntInRange(0, 7) == 0 \
            else valid

    def key(valid):  # object and role names (other map keys come from the POOL)
        names = ["", "data", "scales", "t0", "\u00e9", "x" * 40]
        return names[fdp.ConsumeIntInRange(0, len(names) - 1)] \
            if fdp.ConsumeIntInRange(0, 7) == 0 else valid

    objects, offset = {}, 64
    for i in range(fdp.ConsumeIntInRange(0, 5)):
        shape = [fdp.ConsumeIntInRange(0, 5) for _ in range(fdp.ConsumeIntInRange(0, 3))]
        dtype, itemsize = [("f32", 4), ("u8", 1), ("f16", 2), ("complex64", 8)][
            fdp.ConsumeIntInRange(0, 3)]
        numel = 1
        for d in shape:
            numel *= d
        comp = {"dtype": value(dtype), "offset": value(offset),
                "length": value(numel * itemsize)}
        for field in ("type", "encoding", "uncompressed_length", "digest", "other"):
            if fdp.ConsumeIntInRange(0, 5) == 0:
                comp[field] = value(POOL[fdp.ConsumeIntInRange(0, len(POOL) - 1)])
        comps = {key("data"): comp}
        if fdp.ConsumeIntInRange(0, 4) == 0:
            comps[key("scales")] = dict(comp, offset=value(offset + 64))
        obj = {"shape": value(shape), "format": value("dense"), "components": value(comps)}
        if fdp.ConsumeIntInRange(0, 4) == 0:
            obj["attributes"] = value({"k": [i, "x"]})
        objects[key(f"t{i}")] = obj
        offset += 64 * (1 + numel * itemsize // 64)
    root = {"version": value("1.2.0"), "objects": value(objects)}
    if fdp.ConsumeIntInRange(0, 4) == 0:
        root["attributes"] = value({"f": 1})
    return root, offset


def test_one_input(data: bytes):
    import atheris
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeIntInRange(0, 9) == 0:  # raw bytes straight into the scanner
        raw = fdp.ConsumeBytes(4096)
        scanned = kernels.manifest_scan(raw, manifest_table.VOCABULARIES, 72, 64)
        if scanned[0] is not None:  # taken: the plain-CBOR scan must accept it too
            assert kernels.cbor_scan(raw, 72)[0] == len(raw), raw
        return
    m, end = manifest(fdp)
    raw = encode(m, lambda options: options[fdp.ConsumeIntInRange(0, len(options) - 1)])
    fast, general, _ = decode_both_ways(v1_file(None, bytes(end), raw=raw), LIMITS)
    assert fast == general, (fast, general)


if __name__ == "__main__":
    run(test_one_input)
