"""Every file is hostile until checked: each broken file must raise a ZTensorError
(never another exception, a crash, a hang or a giant allocation)."""
import copy
import struct

import cbor2
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from conftest import DATA
from crafted import (BLOB, RAW, good_manifest, outcome, streamed,
                     v1_file, zstd_file)

GOLDEN = sorted(p for p in DATA.glob("*/*.zt") if p.parent.name != "fuzz-regressions")  # valid files


def boundaries(data: bytes):
    """Offsets where a file's structure changes: header, every blob's start and end,
    the manifest's start and end, the footer fields."""
    size = len(data)
    cuts = {0, 1, 7, 8, 9, size - 1, size - 8, size - 9, size - 16, size - 17}
    with ztensor.Reader(data) as r:
        for name in r.keys():
            for c in r.metadata(name).components.values():
                cuts |= {c.offset - 1, c.offset, c.offset + 1, c.offset + c.length,
                         c.offset + c.length - 1}
        tail = 16 if r.version != "0.1.0" else 8
        size_field = struct.unpack("<Q", data[size - tail:size - tail + 8])[0]
        start = size - tail - size_field
        cuts |= {start - 1, start, start + 1, start + size_field // 2}
    return sorted(c for c in cuts if 0 <= c < size)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_truncation_at_every_structural_boundary_is_an_error(path):
    data = path.read_bytes()
    assert outcome(data) is None
    for cut in boundaries(data):
        err = outcome(data[:cut])
        assert err is not None, f"prefix of {cut} bytes was accepted"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_flipped_bytes_in_footer_and_manifest_raise_cleanly(path):
    data = path.read_bytes()
    with ztensor.Reader(data) as r:
        tail = 16 if r.version != "0.1.0" else 8
    size_field = struct.unpack("<Q", data[len(data) - tail:][:8])[0]
    start = len(data) - tail - size_field
    for pos in range(start, len(data)):
        for mask in (0x01, 0x80, 0xFF):
            broken = bytearray(data)
            broken[pos] ^= mask
            outcome(bytes(broken))  # a result or a ZTensorError; anything else fails


@given(st.sampled_from(GOLDEN), st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                                         min_size=1, max_size=6))
@settings(max_examples=200)
def test_random_byte_flips_anywhere(path, flips):
    data = bytearray(path.read_bytes())
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    outcome(bytes(data))


# ------------------------------------------------------------ lying manifests
def test_good_manifest_is_good():
    with ztensor.Reader(v1_file(good_manifest(), bytes(56) + BLOB)) as r:
        assert r["x"][3, 3] == 15


def mutate(path, value):
    def apply(m):
        node = m
        for key in path[:-1]:
            node = node[key]
        if value is DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return m
    return apply


DELETE = object()
C = ("objects", "x", "components", "data")
O = ("objects", "x")
LIES = {
    "offset-unaligned": mutate(C + ("offset",), 65),
    "offset-in-header": mutate(C + ("offset",), 0),
    "offset-past-data": mutate(C + ("offset",), 128),
    "offset-u64-max": mutate(C + ("offset",), 2**64 - 64),
    "offset-negative": mutate(C + ("offset",), -64),
    "offset-bool": mutate(C + ("offset",), True),
    "offset-float": mutate(C + ("offset",), 64.0),
    "offset-string": mutate(C + ("offset",), "64"),
    "offset-missing": mutate(C + ("offset",), DELETE),
    "offset-bignum": mutate(C + ("offset",), 2**70),
    "offset-giant-bignum": mutate(C + ("offset",), 1 << 100000),
    "shape-giant-bignum": mutate(O + ("shape",), [1 << 100000]),
    "version-long": mutate(("version",), "1." * 10000),
    "length-short": mutate(C + ("length",), 60),
    "length-long": mutate(C + ("length",), 68),
    "length-huge": mutate(C + ("length",), 2**64 - 1),
    "length-bool": mutate(C + ("length",), False),
    "shape-negative": mutate(O + ("shape",), [-4, -4]),
    "shape-bool": mutate(O + ("shape",), [True, 16]),
    "shape-float": mutate(O + ("shape",), [4.0, 4]),
    "shape-string": mutate(O + ("shape",), "4x4"),
    "shape-nested": mutate(O + ("shape",), [[4], 4]),
    "shape-overflow": mutate(O + ("shape",), [2**62, 2**62, 16]),
    "shape-rank": mutate(O + ("shape",), [1] * 65),
    "shape-zero-but-huge": mutate(O + ("shape",), [2**62, 2**62, 0]),
    "shape-missing": mutate(O + ("shape",), DELETE),
    "shape-wrong": mutate(O + ("shape",), [4, 5]),
    "dtype-unknown": mutate(C + ("dtype",), "f128"),
    "dtype-int": mutate(C + ("dtype",), 4),
    "dtype-missing": mutate(C + ("dtype",), DELETE),
    "type-wrong-storage": mutate(C + ("type",), "f8_e4m3fn"),
    "type-int": mutate(C + ("type",), 7),
    "encoding-unknown": mutate(C + ("encoding",), "lz4"),
    "encoding-int": mutate(C + ("encoding",), 1),
    "raw-uncompressed-length-lies": mutate(C + ("uncompressed_length",), 32),
    "ulen-bool": mutate(C + ("uncompressed_length",), True),
    "digest-malformed": mutate(C + ("digest",), "sha256:zz"),
    "digest-crc-malformed": mutate(C + ("digest",), "crc32c:0xGGGG"),
    "digest-int": mutate(C + ("digest",), 12),
    "digest-wrong": mutate(C + ("digest",), "crc32c:0x00000000"),
    "digest-unknown-algorithm": mutate(C + ("digest",), "md5:0123"),
    "version-missing": mutate(("version",), DELETE),
    "version-int": mutate(("version",), 1),
    "version-2": mutate(("version",), "2.0.0"),
    "version-garbage": mutate(("version",), "one.two"),
    "objects-list": mutate(("objects",), [1, 2]),
    "objects-missing": mutate(("objects",), DELETE),
    "object-not-map": mutate(O, [1]),
    "object-name-int": lambda m: {**m, "objects": {5: m["objects"]["x"]}},
    "object-name-empty": lambda m: {**m, "objects": {"": m["objects"]["x"]}},
    "components-list": mutate(O + ("components",), []),
    "component-not-map": mutate(C, "data"),
    "component-role-int": mutate(O + ("components",), {1: {"dtype": "f32"}}),
    "dense-without-data": mutate(O + ("components",), {}),
    "format-int": mutate(O + ("format",), 3),
    "format-missing": mutate(O + ("format",), DELETE),
    "attributes-list": mutate(O + ("attributes",), [1]),
    "file-attributes-str": mutate(("attributes",), "x"),
    "attributes-deep": mutate(O + ("attributes",), {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
        ]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
    "root-list": lambda m: [m],
    "zstd-without-length-in-1.2": mutate(C + ("encoding",), "zstd"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_lying_manifest_raises(lie):
    manifest = LIES[lie](copy.deepcopy(good_manifest()))
    err = outcome(v1_file(manifest, bytes(56) + BLOB))
    assert isinstance(err, ztensor.ZTensorError), f"{lie} accepted"
    assert "<bytes>" in str(err)


@pytest.mark.parametrize("raw,words", [
    (b"\xff\xff\xff", ""),   # cbor2 < 5.7 decodes a lone break, then trailing bytes
    (cbor2.dumps(good_manifest()) + b"\x00", "after its CBOR item"),
    (b"\x9b" + b"\xff" * 8, "not valid CBOR"),                     # huge declared array
    (b"\x81" * 100000 + b"\x00", "nesting deeper than"),            # deep nesting
    (b"\x5b\x00\x00\x00\xff\xff\xff\xff\xff", "not valid CBOR"),    # huge byte string
    (b"\xc2\x5a\x00\x10\x00\x00" + b"\xff" * 0x100000, "root must be a map"),  # bignum
    (bytes.fromhex("a2 6776657273696f6e 65312e322e30 676f626a65637473"
                   " a1 6178 d81c a1 6161 d81d 00".replace(" ", "")), ""),  # shared-ref cycle
])
def test_hostile_cbor(raw, words):
    err = outcome(v1_file(None, raw=raw))
    assert isinstance(err, ztensor.ZTensorError)
    assert words in str(err)


def test_cyclic_attributes_are_refused():
    # {"version": "1.2.0", "attributes": shareable({"a": sharedref(0)}), "objects": {}}
    raw = bytes.fromhex("a3 6776657273696f6e 65312e322e30 6a61747472696275746573"
                        " d81c a1 6161 d81d 00 676f626a65637473 a0".replace(" ", ""))
    err = outcome(v1_file(None, raw=raw))
    assert isinstance(err, ztensor.FormatError) and "CBOR tag 28" in str(err)


def test_manifest_size_pointing_into_data_region():
    data = bytearray(v1_file(good_manifest(), bytes(56) + BLOB))
    data[-16:-8] = struct.pack("<Q", len(data) - 24)
    assert isinstance(outcome(bytes(data)), ztensor.FormatError)


# ------------------------------------------------------------ zstd lies
@pytest.mark.parametrize("payload", [
    streamed(RAW),                                             # no content size, as reference
    zstandard.ZstdCompressor().compress(RAW),                   # content size in header
    streamed(RAW[:1000]) + streamed(RAW[1000:]),                # two frames
    struct.pack("<II", 0x184D2A50, 5) + b"skip!" + streamed(RAW),  # skippable frame first
], ids=["streamed", "sized", "two-frames", "skippable"])
def test_valid_zstd_variants_decode(payload):
    with ztensor.Reader(zstd_file(payload, len(RAW))) as r:
        np.testing.assert_array_equal(r["z"], np.arange(1000, dtype=np.float32))


@pytest.mark.parametrize("payload,ulen,words", [
    (streamed(RAW), len(RAW) - 4, "yields more"),
    (streamed(RAW), len(RAW) + 4, "ends after 4000"),
    (zstandard.ZstdCompressor().compress(RAW), len(RAW) - 400, "yields more"),
    (b"\x00" * 64, len(RAW), "zstd"),
    (streamed(RAW)[:-5], len(RAW), "zstd"),
    (streamed(bytes(1 << 24)), 4000, "yields more"),           # a bomb stays bounded
])
def test_lying_zstd_raises(payload, ulen, words):
    err = outcome(zstd_file(payload, ulen))
    assert isinstance(err, ztensor.FormatError) and words in str(err), err


def test_uncompressed_length_above_limit_is_refused_before_decoding():
    data = zstd_file(streamed(RAW), 1 << 50, shape=[1 << 48])
    err = outcome(data)
    assert isinstance(err, ztensor.LimitError) and str(1 << 50) in str(err)
    err = outcome(zstd_file(streamed(RAW), len(RAW)), limits=ztensor.Limits(
        max_total_decompressed=100))
    assert isinstance(err, ztensor.LimitError) and "per-file" in str(err)


# ------------------------------------------------------------ v0.1 lies
def v01(entries, blob=b""):
    body = b"ZTEN0001" + bytes(56) + blob
    m = cbor2.dumps(entries)
    return body + m + struct.pack("<Q", len(m))


V01_GOOD = {"name": "a", "offset": 64, "size": 64, "dtype": "float32", "shape": [16],
            "encoding": "raw", "layout": "dense"}


@pytest.mark.parametrize("change", [
    {"dtype": "float128"}, {"size": 60}, {"data_endianness": "middle"}, {"name": ""},
    {"layout": "sparsecsr", "shape": [100, 2]}, {"layout": "sparsexyz"}, {"offset": 0},
    {"shape": [3, -1]}, {"encoding": "gzip"}, {"layout": ["sparsecsr"]}, {"layout": 7},
    {"encoding": ["raw"]}, {"data_endianness": ["big"]}, {"layout": "sparse", "sparse_format": [1]},
])
def test_v01_lies(change):
    assert outcome(v01([V01_GOOD], BLOB)) is None
    err = outcome(v01([{**V01_GOOD, **change}], BLOB))
    assert isinstance(err, ztensor.ZTensorError), change


def test_v01_structure_lies():
    for entries in ({"a": 1}, [1], [V01_GOOD, V01_GOOD]):
        assert isinstance(outcome(v01(entries, BLOB)), ztensor.FormatError)


def test_v01_csr_with_lying_indptr():
    indptr = np.array([0, 1, 9], "<u8").tobytes()  # claims 9 values, blob holds 2
    blob = indptr + np.array([0, 1], "<u8").tobytes() + np.ones(2, "<f4").tobytes()
    entry = {"name": "s", "offset": 64, "size": len(blob), "dtype": "float32", "shape": [2, 2],
             "encoding": "raw", "layout": "sparsecsr"}
    err = outcome(v01([entry], blob))
    assert isinstance(err, ztensor.FormatError) and "indptr" in str(err)


def test_v11_sparse_zstd_without_size_is_bounded_by_the_limit():
    """v1.1 files need no uncompressed_length; for non-dense objects the size is
    unknown, so the stream may only grow to the per-component limit."""
    values = np.arange(300, dtype="<f4")
    payload = streamed(values.tobytes())
    indices = np.arange(300, dtype="<u8").tobytes()
    indptr = np.array([0, 300], dtype="<u8").tobytes()
    blob = payload + bytes(-len(payload) % 64)
    m = {"version": "1.1.0", "objects": {"s": {"shape": [1, 300], "format": "sparse_csr",
         "components": {
             "values": {"dtype": "f32", "offset": 64, "length": len(payload), "encoding": "zstd"},
             "indices": {"dtype": "u64", "offset": 64 + len(blob), "length": len(indices)},
             "indptr": {"dtype": "u64", "offset": 64 + len(blob) + 2432, "length": 16}}}}}
    data = v1_file(m, bytes(56) + blob + indices + bytes(2432 - len(indices)) + indptr)
    with ztensor.Reader(data) as r:
        np.testing.assert_array_equal(r.read("s").components["values"], values)
    err = outcome(data, limits=ztensor.Limits(max_component_size=1000))
    assert isinstance(err, ztensor.LimitError) and "per-component limit of 1000" in str(err)


def test_compound_type_lengths_are_whole_elements():
    m = good_manifest()
    comp = m["objects"]["x"]["components"]["data"]
    m["objects"]["x"]["format"] = "mystery"          # not dense: no shape rule applies
    comp.update(type="complex64", length=20)          # 5 floats: 2.5 complex values
    err = outcome(v1_file(m, bytes(56) + BLOB))
    assert isinstance(err, ztensor.FormatError) and "complex64 elements" in str(err)
