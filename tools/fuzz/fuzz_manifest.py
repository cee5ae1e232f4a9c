"""Fuzz target 5: hostile CBOR in every position of a valid manifest.

A valid one-object manifest is re-encoded with one value replaced by a fragment:
value sharing (tags 28/29, nested to multiply nodes), arithmetic tags (4, 5, 30
with bignum parts), other semantic tags, deep nesting, indefinite containers, or
raw fuzz bytes.  The reader must answer with a result or a ZTensorError within the
harness's time and memory limits (-timeout, -rss_limit_mb), and the C scanner and
its Python twin must give the same verdict on every manifest."""
import struct

from common import LIMITS, only_ztensor_errors, run, ztensor
from ztensor import kernels
from ztensor._native import fallback as _fallback

import cbor2

BLOB = bytes(range(64))


def text(s):
    return cbor2.dumps(s)


def fragment(fdp):
    """One CBOR data item, hostile or not."""
    kind = fdp.ConsumeIntInRange(0, 9)
    n = fdp.ConsumeIntInRange(0, 40)
    if kind == 0:   # doubling through value sharing
        body = b"\xd8\x1c\x82\x01\xd8\x1d\x00"
        for _ in range(n):
            body = b"\xd8\x1c\x82" + body + b"\xd8\x1d\x00"
        return body
    if kind == 1:   # shared reference cycle
        return b"\xd8\x1c\x81\xd8\x1d" + bytes([fdp.ConsumeIntInRange(0, 23)])
    if kind == 2:   # arithmetic tags with bignum parts
        tag = fdp.PickValueInList([b"\xc4", b"\xc5", b"\xd8\x1e"])
        big = b"\xc2\x59" + struct.pack(">H", 64 * n) + b"\xff" * (64 * n)
        return tag + b"\x82" + big + big
    if kind == 3:   # any tag around any value
        return (b"\xda" + struct.pack(">I", fdp.ConsumeIntInRange(0, 70000))
                + cbor2.dumps(fdp.ConsumeIntInRange(-5, 5)))
    if kind == 4:   # deep nesting
        return b"\x81" * (n * 3) + b"\x00"
    if kind == 5:   # indefinite containers and strings
        return b"\x9f\xbf\x61a\x7f\x61b\x61c\xff\xff\xff"
    if kind == 6:   # bignum where an integer is expected
        return b"\xc2\x48" + fdp.ConsumeBytes(8).ljust(8, b"\x01")
    if kind == 7:   # non-text map key
        return b"\xa1" + cbor2.dumps(fdp.ConsumeIntInRange(0, 9)) + b"\x00"
    if kind == 8:   # floats and simple values
        return fdp.PickValueInList([b"\xf9\x7e\x00", b"\xfb" + bytes(8), b"\xf7", b"\xf8\x20"])
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)) or b"\x00"


def manifest(fdp, hole, frag):
    """The valid manifest's bytes with position ``hole`` replaced by ``frag``."""
    def at(i, valid):
        return frag if i == hole else valid
    comp = (b"\xa3" + text("dtype") + at(1, text("u8")) + text("offset") + at(2, cbor2.dumps(64))
            + text("length") + at(3, cbor2.dumps(64)))
    obj = (b"\xa4" + text("shape") + at(4, cbor2.dumps([64])) + text("format")
           + at(5, text("dense")) + text("attributes") + at(6, cbor2.dumps({"k": 1}))
           + text("components") + b"\xa1" + text("data") + at(7, comp))
    root = (b"\xa3" + text("version") + at(8, text("1.2.0")) + text("attributes")
            + at(9, cbor2.dumps({"a": [1, "x"]})) + text("objects") + b"\xa1" + text("x")
            + at(10, obj))
    return at(0, root)


def test_one_input(data: bytes):
    import atheris
    fdp = atheris.FuzzedDataProvider(data)
    hole = fdp.ConsumeIntInRange(0, 10)
    raw = manifest(fdp, hole, fragment(fdp))
    verdicts = []
    for scan in (kernels.cbor_scan, _fallback.cbor_scan):
        try:
            verdicts.append(scan(raw, 72))
        except ztensor.FormatError as exc:
            verdicts.append(str(exc))
    assert verdicts[0] == verdicts[1], verdicts
    body = b"ZTEN1000" + bytes(56) + BLOB
    file = body + raw + struct.pack("<Q", len(raw)) + b"ZTEN1000"
    with only_ztensor_errors():
        with ztensor.Reader(file, limits=LIMITS) as r:
            for name in r.keys():
                r.read(name)
            r.attributes  # noqa: B018


if __name__ == "__main__":
    run(test_one_input)
