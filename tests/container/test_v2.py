"""zTensor v2 (PyPI ztensor 2.x's container), read-only: files built from the v2
spec in tests/v2files.py, every rule of its validation summary refused with a
clear error, the deterministic-CBOR check (C and numpy twins against each other),
XXH3-64 against the xxhash package and known answers.  Files written by ztensor
2.1.2 itself are in tests/data/ref-2.1.2 (test_golden.py) and, live, below."""
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from backends import MODULES
from conftest import DATA
from v2files import build, dense, encode

A = np.arange(12, dtype=np.float32).reshape(3, 4)


def open_v2(tmp_path, data, name="f.zt"):
    (tmp_path / name).write_bytes(data)
    return ztensor.Reader(tmp_path / name)


def minimal(**extra):
    obj, blob = dense(A, 4096)
    return build({"a": {**obj, **extra}}, [blob])


# ------------------------------------------------------------------ valid files
def test_minimal_and_the_mapping(tmp_path):
    with open_v2(tmp_path, minimal()) as r:
        assert r.version == "2.0" and r.keys() == ["a"]
        np.testing.assert_array_equal(r.read_numpy("a"), A)
        assert r.metadata("a").components["data"].offset == 4096
        r.verify()


def test_valid_corner_cases(tmp_path):
    scalar, b1 = dense(np.array(2.5, np.float64), 4096)
    empty = {"shape": [0, 5], "layout": "dense", "parts": {"data": {"dtype": "f32",
                                                                   "blob": [8192, 0]}}}
    tied_a, b2 = dense(A, 12288)
    tied_b = {**tied_a}  # the same blob twice: weight tying is allowed
    flags = {"shape": [4], "layout": "dense",
             "parts": {"data": {"dtype": "u8", "type": "bool", "blob": [16384, 4]}}}
    data = build({"s": scalar, "e": empty, "t1": tied_a, "t2": tied_b, "flags": flags},
                 [b1, b2, (16384, bytes([0, 1, 1, 0]))],
                 attributes={"k": [1, -2, 2.5, None, True, b"\x00", {"x": "y"}]}, reserved=7)
    with open_v2(tmp_path, data) as r:
        assert r.read_numpy("s").shape == () and r.read_numpy("s") == 2.5
        assert r.read_numpy("e").shape == (0, 5)
        np.testing.assert_array_equal(r.read_numpy("t2"), A)
        np.testing.assert_array_equal(r.read_numpy("flags"), [False, True, True, False])
        assert r.attributes["k"][-1] == {"x": "y"}


def test_empty_objects_and_data_shards(tmp_path):
    with open_v2(tmp_path, build({})) as r:
        assert r.keys() == []
    shard = b"\x89ZT2\r\n\x1a\n" + bytes(4088) + b"\x01" * 16 + \
        struct.pack("<QQQII", 0, 0, 0, 2, 0) + b"\x89ZT2\r\n\x1a\n"
    with open_v2(tmp_path, shard, "shard.zt") as r:
        assert r.keys() == []


def test_structural_only_objects_refuse_to_decode(tmp_path):
    odd = {"shape": [3], "layout": "dense",
           "parts": {"data": {"dtype": "u8", "type": "f4_e2m1", "blob": [4096, 2]}}}
    unknown_type = {"shape": [2], "layout": "dense",
                    "parts": {"data": {"dtype": "u8", "type": "acme.u3/1", "blob": [8192, 2]}}}
    unknown_layout = {"shape": [2], "layout": "acme.paged/1",
                      "parts": {"pages": {"dtype": "u8", "blob": [12288, 2]}}}
    encoded = {"shape": [2], "layout": "dense",
               "parts": {"data": {"dtype": "u8", "blob": [16384, 2],
                                  "encoding": "acme.lz/1", "decoded_length": 2}}}
    local, foreign = {"shape": [2], "layout": "dense",
                      "parts": {"data": {"dtype": "u8", "blob": [20480, 2]}}}, \
        {"shape": [2], "layout": "dense",
         "parts": {"data": {"dtype": "u8", "blob": [4096, 2], "shard": "00002"}}}
    data = build({"odd": odd, "unk": unknown_type, "layout": unknown_layout, "enc": encoded,
                  "local": local, "foreign": foreign},
                 [(4096, b"\x21\x03"), (8192, b"ab"), (12288, b"cd"), (16384, b"ef"),
                  (20480, b"gh")], shards={"00002": {"size": 9000, "digest": "xxh3:" + "0" * 16}})
    with open_v2(tmp_path, data) as r:
        for name, match in (("odd", "f4_e2m1"), ("unk", "acme.u3/1"), ("enc", "acme.lz/1"),
                            ("foreign", "shard '00002'")):
            with pytest.raises(ztensor.UnsupportedError, match=match) as err:
                r.read_numpy(name)
            assert name in str(err.value)
        assert r.metadata("layout").format == "acme.paged/1"
        assert bytes(r.read("layout").components["pages"]) == b"cd"  # structural access
        np.testing.assert_array_equal(r.read_numpy("local"), [ord("g"), ord("h")])


def test_zstd_seekable_parts_and_decoded_digests(tmp_path):
    from ztensor.io import seekable
    raw = (np.arange(300_000) % 251).astype(np.uint16)
    fw = seekable.FrameWriter(3)
    stored = raw.astype("<u2").tobytes()  # what a file holds: little-endian
    stream = b"".join(fw.write(stored) + fw.finish())
    from v2files import xxh3
    part = {"dtype": "u16", "blob": [4096, len(stream)], "encoding": "zt.zstd-seekable/1",
            "decoded_length": raw.nbytes, "digest": f"xxh3:{xxh3(stored):016x}"}
    data = build({"z": {"shape": [300_000], "layout": "dense", "parts": {"data": part}}},
                 [(4096, stream)])
    with open_v2(tmp_path, data) as r:
        np.testing.assert_array_equal(r.read_numpy("z"), raw)
        assert r.verify() == 1
    with ztensor.safe_open(tmp_path / "f.zt", framework="np") as f:
        np.testing.assert_array_equal(f.get_slice("z")[1000:1010], raw[1000:1010])
    bad = dict(part, digest="xxh3:" + "1" * 16)
    data = build({"z": {"shape": [300_000], "layout": "dense", "parts": {"data": bad}}},
                 [(4096, stream)])
    with open_v2(tmp_path, data, "bad.zt") as r:
        with pytest.raises(ztensor.ChecksumError, match="xxh3"):
            r.verify()


# ------------------------------------------------------------------ refused files
def obj_with(**part):
    obj, _ = dense(A, 4096)
    obj["parts"]["data"].update(part)
    return obj


REJECT = {
    # container
    "file-too-small": lambda: b"\x89ZT2\r\n\x1a\n" * 5,
    "header-magic": lambda: b"\x89ZT3" + minimal()[4:],
    "footer-magic": lambda: minimal()[:-1] + b"\x00",
    "version-unsupported": lambda: build({}, version=3),
    "manifest-hash-mismatch": lambda: build({}, hash_fix=1),
    "manifest-misaligned": lambda: build({}, manifest_at=4100),
    "manifest-out-of-bounds": lambda: minimal()[:-40] + struct.pack(
        "<QQQII", 4096, 1 << 20, 0, 2, 0) + b"\x89ZT2\r\n\x1a\n",
    "manifest-too-large": lambda: minimal()[:-40] + struct.pack(
        "<QQQII", 4096, (1 << 30) + 1, 0, 2, 0) + b"\x89ZT2\r\n\x1a\n",
    "data-shard-nonzero-offset": lambda: b"\x89ZT2\r\n\x1a\n" + bytes(4088) +
    struct.pack("<QQQII", 4096, 0, 0, 2, 0) + b"\x89ZT2\r\n\x1a\n",
    # CBOR
    "cbor-indefinite": lambda: build(raw_manifest=b"\xbf\x67objects\xa0\xff"),
    "cbor-non-shortest": lambda: build(raw_manifest=b"\xb8\x01\x67objects\xa0"),
    "cbor-unsorted-keys": lambda: build(raw_manifest=b"\xa2\x67zzzzzzz\xa0\x67objects\xa0"),
    "cbor-duplicate-key": lambda: build(raw_manifest=b"\xa2\x67objects\xa0\x67objects\xa0"),
    "cbor-tag": lambda: build(raw_manifest=b"\xa1\x67objects\xc0\xa0"),
    "cbor-trailing-bytes": lambda: build(raw_manifest=encode({"objects": {}}) + b"\x00"),
    "cbor-depth": lambda: build(raw_manifest=b"\xa2\x6aattributes\xa1\x61k" + b"\x81" * 40 +
                                b"\x00\x67objects\xa0"),
    "cbor-float-wide": lambda: build(raw_manifest=b"\xa2\x6aattributes\xa1\x61k\xfb" +
                                     struct.pack(">d", 1.5) + b"\x67objects\xa0"),
    "cbor-nan-payload": lambda: build(raw_manifest=b"\xa2\x6aattributes\xa1\x61k\xf9\x7e\x01"
                                      b"\x67objects\xa0"),
    # schema
    "schema-missing-objects": lambda: build(manifest={"attributes": {}}),
    "attributes-not-a-map": lambda: build({}, attributes=[1]),
    "attribute-key-empty": lambda: build({}, attributes={"": 1}),
    "attribute-key-nul": lambda: build({}, attributes={"a\0b": 1}),
    "attribute-key-not-text": lambda: build({}, attributes={1: 1}),
    "object-attributes-not-a-map": lambda: build({"a": {**obj_with(), "attributes": 3}},
                                                 [dense(A, 4096)[1]]),
    "name-empty": lambda: build({"": obj_with()}, [dense(A, 4096)[1]]),
    "name-nul": lambda: build({"a\0": obj_with()}, [dense(A, 4096)[1]]),
    "name-too-long": lambda: build({"n" * 1025: obj_with()}, [dense(A, 4096)[1]]),
    "schema-unknown-dtype": lambda: build({"a": obj_with(dtype="f128")}, [dense(A, 4096)[1]]),
    "schema-ltype-dtype-mismatch": lambda: build({"a": obj_with(dtype="u32",
                                                                type="complex64")},
                                                 [dense(A, 4096)[1]]),
    "schema-blob-arity": lambda: build({"a": obj_with(blob=[4096, 48, 0])},
                                       [dense(A, 4096)[1]]),
    "schema-encoding-without-decoded-length": lambda: build(
        {"a": obj_with(encoding="zt.zstd-seekable/1")}, [dense(A, 4096)[1]]),
    "schema-digest-uppercase-hex": lambda: build({"a": obj_with(digest="xxh3:" + "A" * 16)},
                                                 [dense(A, 4096)[1]]),
    "blob-misaligned": lambda: build({"a": obj_with(blob=[4100, 48])}, [(4100, bytes(48))]),
    "blob-offset-zero": lambda: build({"a": obj_with(blob=[0, 48])}, []),
    "blob-out-of-bounds": lambda: build({"a": obj_with(blob=[4096, 1 << 20])},
                                        [dense(A, 4096)[1]]),
    "blob-partial-overlap": lambda: build({"a": obj_with(blob=[4096, 48]),
                         "b": {"shape": [2], "layout": "dense",
                               "parts": {"data": {"dtype": "f32", "blob": [4096, 8]}}}},
                        [dense(A, 4096)[1]]),
    "dense-extra-part": lambda: build({"a": {**obj_with(), "parts": {
        "data": obj_with()["parts"]["data"], "more": obj_with()["parts"]["data"]}}},
        [dense(A, 4096)[1]]),
    "dense-size-mismatch": lambda: build({"a": {**obj_with(), "shape": [3, 5]}},
                                         [dense(A, 4096)[1]]),
    "dense-f4-size-mismatch": lambda: build({"a": {"shape": [3], "layout": "dense", "parts": {
        "data": {"dtype": "u8", "type": "f4_e2m1", "blob": [4096, 3]}}}}, [(4096, b"abc")]),
    "shape-rank-65": lambda: build({"a": {**obj_with(), "shape": [1] * 65}},
                                   [dense(A, 4096)[1]]),
    "shape-product-overflow": lambda: build({"a": {**obj_with(), "shape": [1 << 33] * 2}},
                                            [dense(A, 4096)[1]]),
    "shard-ref-not-in-table": lambda: build({"a": obj_with(shard="00001")}, []),
    "shard-name-traversal": lambda: build({}, shards={"../x": {"size": 1, "digest": "xxh3:" +
                                                               "0" * 16}}),
    "shard-name-leading-dot": lambda: build({}, shards={".x": {"size": 1, "digest": "xxh3:" +
                                                              "0" * 16}}),
    "shard-name-separator": lambda: build({}, shards={"a/b": {"size": 1, "digest": "xxh3:" +
                                                             "0" * 16}}),
    "shard-name-empty": lambda: build({}, shards={"": {"size": 1, "digest": "xxh3:" + "0" * 16}}),
    "shard-table-key-not-text": lambda: build({}, shards={1: {"size": 1, "digest": "xxh3:" +
                                                             "0" * 16}}),
    "shard-blob-partial-overlap": lambda: build(
        {"a": obj_with(shard="s"), "b": {"shape": [2], "layout": "dense", "parts": {"data": {
            "dtype": "f32", "blob": [4096, 8], "shard": "s"}}}},
        [], shards={"s": {"size": 1 << 20, "digest": "xxh3:" + "0" * 16}}),
}

# what each refusal must say (a fragment of the message)
WHY = {"file-too-small": "at least 48 bytes", "header-magic": "magic",
       "footer-magic": "footer magic", "version-unsupported": "version 3",
       "manifest-hash-mismatch": "XXH3-64", "manifest-misaligned": "4096-aligned",
       "manifest-out-of-bounds": "inside the file", "manifest-too-large": "exceeds the limit",
       "data-shard-nonzero-offset": "data shard", "cbor-indefinite": "indefinite",
       "cbor-non-shortest": "shortest form", "cbor-unsorted-keys": "increasing order",
       "cbor-duplicate-key": "increasing order", "cbor-tag": "tag",
       "cbor-trailing-bytes": "bytes after", "cbor-depth": "deeper than 32",
       "cbor-float-wide": "float not in its shortest", "cbor-nan-payload": "float not in",
       "schema-missing-objects": "'objects'", "attributes-not-a-map": "must be a map",
       "attribute-key-empty": "attribute key", "attribute-key-nul": "attribute key",
       "attribute-key-not-text": "attribute key", "object-attributes-not-a-map": "must be a map",
       "name-empty": "object name", "name-nul": "object name", "name-too-long": "object name",
       "schema-unknown-dtype": "unknown storage dtype", "schema-ltype-dtype-mismatch": "needs dtype",
       "schema-blob-arity": "[offset, length]", "schema-encoding-without-decoded-length":
       "decoded_length", "schema-digest-uppercase-hex": "lowercase hex",
       "blob-misaligned": "multiple of 4096", "blob-offset-zero": "multiple of 4096",
       "blob-out-of-bounds": "runs past", "blob-partial-overlap": "partly overlap",
       "dense-extra-part": "exactly one part", "dense-size-mismatch": "needs 60",
       "dense-f4-size-mismatch": "needs 2", "shape-rank-65": "at most 64",
       "shape-product-overflow": "2**64", "shard-ref-not-in-table": "does not declare",
       "shard-name-traversal": "shard name", "shard-name-leading-dot": "shard name",
       "shard-name-separator": "shard name", "shard-name-empty": "shard name",
       "shard-table-key-not-text": "shard name", "shard-blob-partial-overlap": "in shard 's'"}


@pytest.mark.parametrize("case", sorted(REJECT))
def test_every_rule_is_refused_cleanly(tmp_path, case):
    data = REJECT[case]()
    with pytest.raises(ztensor.ZTensorError) as err:
        with open_v2(tmp_path, data) as r:
            for name in r.keys():  # rules checked when decoding (f4 size needs none)
                r.read(name)
    assert "f.zt" in str(err.value) and WHY[case] in str(err.value)


def test_bool_bytes_must_be_0_or_1(tmp_path):
    flags = {"shape": [3], "layout": "dense",
             "parts": {"data": {"dtype": "u8", "type": "bool", "blob": [4096, 3]}}}
    with open_v2(tmp_path, build({"b": flags}, [(4096, b"\x00\x02\x01")])) as r:
        with pytest.raises(ztensor.FormatError, match="0 or 1"):
            r.read_numpy("b")


# ------------------------------------------------------------------ the kernels
@pytest.mark.parametrize("impl", MODULES, ids=lambda m: m.__name__)
def test_xxh3_matches_xxhash(impl):
    xxhash = pytest.importorskip("xxhash")
    rng = np.random.default_rng(0)
    for n in list(range(0, 300)) + [1023, 1024, 1025, 2048, 4097, 65536 + 17, 1 << 20]:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert impl.xxh3_64(data) == xxhash.xxh3_64_intdigest(data.tobytes()), n


# XXH3-64 of bytes((i * 31 + 7) & 255 for i in range(n)), from the xxhash package:
# one length per path of the algorithm (0, 1-3, 4-8, 9-16, 17-128, 129-240, larger)
KNOWN = {0: 0x2D06800538D394C2, 1: 0x4C5CCA45D0F4811F, 3: 0x15F7093B173D005C,
         4: 0xDCA012F95811B6B9, 8: 0xDEC6A9A43575982E, 9: 0xCBE393399F17FFBD,
         16: 0x7E484C18D74895D0, 17: 0x208BDE5EE2BED407, 128: 0xF92B70EAA21A6288,
         129: 0xF8F76713F2BB60FA, 240: 0xCCC7375172C41F03, 241: 0x0B3B630948CE4A00,
         1024: 0x23BC880EBF0D29C6, 1025: 0xC09FDFBC398C7D82, 4096: 0xA3C19F8174CDE0BB}


@pytest.mark.parametrize("impl", MODULES, ids=lambda m: m.__name__)
def test_xxh3_known_answers(impl):
    """Where xxhash is not installed (the clean venv, s390x), its answers for every
    path, little-endian reads included."""
    for n, want in KNOWN.items():
        data = np.array([(i * 31 + 7) & 255 for i in range(n)], np.uint8)
        assert impl.xxh3_64(data) == want, n


@settings(max_examples=200)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**64 + 1, 2**64 - 1)
                    | st.floats() | st.text(max_size=5) | st.binary(max_size=5),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=20),
       st.integers(0, 10**6))
def test_canonical_check_accepts_deterministic_and_agrees_on_mutations(value, seed):
    raw = encode(value)  # deterministic by construction (tests/v2files.py)
    for impl in MODULES:
        impl.cbor_check_canonical(np.frombuffer(raw, np.uint8), 32)
    rng = np.random.default_rng(seed)
    mutated = bytearray(raw)
    if mutated:
        mutated[rng.integers(len(mutated))] = rng.integers(256)
    verdicts = set()
    for impl in MODULES:
        try:
            impl.cbor_check_canonical(np.frombuffer(bytes(mutated), np.uint8), 32)
            verdicts.add("ok")
        except ztensor.FormatError as exc:
            verdicts.add(str(exc))
    assert len(verdicts) == 1, verdicts


# ------------------------------------------------------------------ live: ztensor 2.1.2
@pytest.mark.reference
def test_files_fresh_from_ztensor_2(tmp_path):
    from reference import run
    rng = np.random.default_rng(5)
    arrays = {"w": rng.standard_normal((64, 300)).astype(np.float32),
              "ids": np.arange(100_000, dtype=np.int64)}
    paths = {}
    for name, arr in arrays.items():
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], arr)
    run("2.1.2", "write", {"path": str(tmp_path / "m.zt"), "attributes": {"k": "v"},
                           "objects": [{"name": "w", "kind": "dense", "arrays": {"data": paths["w"]}},
                                       {"name": "ids", "kind": "dense", "compress": True,
                                        "arrays": {"data": paths["ids"]}}]}, tmp_path)
    with ztensor.Reader(tmp_path / "m.zt", verify=True) as r:
        assert r.attributes == {"k": "v"} and r.verify() == 2
        for name, arr in arrays.items():
            np.testing.assert_array_equal(r.read_numpy(name), arr)


# ------------------------------------------------------------------ around the reader
GOLDEN = DATA / "ref-2.1.2"


def test_cli_reads_v2_and_convert_makes_v12(tmp_path, capsys):
    from ztensor.tools.cli import main
    for command in ("ls", "info", "verify", "stats"):
        assert main([command, str(GOLDEN / "dense.zt")]) == 0
    assert "2.0" in capsys.readouterr().out
    assert main(["convert", "-q", str(GOLDEN / "dense.zt"), str(tmp_path / "v12.zt")]) == 0
    with ztensor.Reader(GOLDEN / "dense.zt") as a, ztensor.Reader(tmp_path / "v12.zt") as b:
        assert b.version == "1.2.0" and sorted(a.keys()) == sorted(b.keys())
        assert a.attributes == b.attributes
        for name in a.keys():
            x, y = a.read_numpy(name), b.read_numpy(name)
            if x.dtype.kind == "V" or "float8" in x.dtype.name or "bfloat" in x.dtype.name:
                x, y = x.view(f"u{x.dtype.itemsize}"), y.view(f"u{y.dtype.itemsize}")  # NaNs
            np.testing.assert_array_equal(x, y)
            assert a.metadata(name).dtype == b.metadata(name).dtype
    assert main(["diff", str(GOLDEN / "dense.zt"), str(tmp_path / "v12.zt")]) == 0


def test_v2_files_are_not_edited_in_place(tmp_path):
    import shutil
    shutil.copy(GOLDEN / "canonical.zt", tmp_path / "c.zt")
    before = (tmp_path / "c.zt").read_bytes()
    for edit in (lambda: ztensor.Writer.append(tmp_path / "c.zt"),
                 lambda: ztensor.remove_tensors(tmp_path / "c.zt", ["b"]),
                 lambda: ztensor.replace_tensor(tmp_path / "c.zt", "b", np.zeros(4, np.int32))):
        with pytest.raises(ztensor.UnsupportedError, match="convert"):
            edit()
    assert (tmp_path / "c.zt").read_bytes() == before
