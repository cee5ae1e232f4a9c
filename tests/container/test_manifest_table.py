"""The manifest's fast path (csrc/manifest_scan.c + ztensor/container/manifest_table.py) against
the general path (cbor2 + manifest.Checker), which is the oracle: on every manifest
both give the same verdict, the same message and the same specs; and the fast path
is really taken for the files real writers produce."""
import math

import cbor2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ztensor
from conftest import DATA
from crafted import decode_both_ways, encode, v1_file
from ztensor import kernels, spec
from ztensor.container.manifest import MAX_CBOR_DEPTH
from ztensor.container.manifest_table import VOCABULARIES
from ztensor.formats import dense

pytestmark = pytest.mark.skipif(kernels.backend != "c",
                                reason="the numpy fallback has no fast path: every "
                                       "manifest goes the general way there")


def assert_agree(data, limits=spec.DEFAULT_LIMITS):
    fast, general, taken = decode_both_ways(data, limits)
    assert fast == general
    return taken, fast


def written(tmp_path, build):
    path = tmp_path / "w.zt"
    with ztensor.Writer(str(path)) as w:
        build(w)
    return path.read_bytes()


# ------------------------------------------------------------------ files real writers make
def csr(values, indices, indptr, shape):
    """A sparse_csr object without scipy (the clean-venv run has none)."""
    return ztensor.Tensor({"values": np.asarray(values, np.float64),
                           "indices": np.asarray(indices, np.uint64),
                           "indptr": np.asarray(indptr, np.uint64)},
                          shape=shape, format="sparse_csr")


def _sparse(w):
    w.write("c", csr([1.0, 2.0, 3.0], [0, 2, 2], [0, 2, 3], (2, 3)))
    w.write("o", ztensor.Tensor({"values": np.array([4.0, 5.0]),
                                 "coords": np.array([0, 1, 1, 0], np.uint64)},
                                shape=(2, 2), format="sparse_coo"))


WRITERS = {
    "dense": lambda w: [w.add(f"t{i}", np.ones(i * 3, dtype=dt).reshape(i, 3))
                        for i, dt in enumerate(["f4", "f8", "i2", "u1", "c8", "?", "f2"])],
    "zstd+digests": lambda w: [w.write_numpy(f"z{i}", np.arange(1000 + i, dtype="f4"),
                                             compress=True, checksum="crc32c")
                               for i in range(3)],
    "sha256": lambda w: w.write_numpy("s", np.ones((2, 2)), checksum="sha256"),
    "attributes": lambda w: w.write_numpy("a", np.zeros(3), attributes={"k": [1, "x", 2.5]}),
    "scalar+empty": lambda w: (w.add("s", np.float32(3)), w.add("e", np.zeros((0, 5)))),
    "fp8": lambda w: w.write_numpy("f", np.linspace(-1, 1, 16, dtype="f4"), type="f8_e4m3fn"),
    "sparse": _sparse,
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_our_files_take_the_fast_path_and_agree(tmp_path, kind):
    taken, fast = assert_agree(written(tmp_path, WRITERS[kind]))
    assert taken, "the fast path declined a file our writer made"
    assert isinstance(fast[2], list) and fast[2]


def test_quantized_files_take_the_fast_path(tmp_path):
    from ztensor.formats import quantized

    w_ = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    q = quantized.quantize(w_, bits=4, group_size=128)
    taken, _ = assert_agree(written(tmp_path, lambda w: w.write("q", q)))
    assert taken


@pytest.mark.parametrize("path", sorted(str(p.relative_to(DATA)) for p in DATA.glob("ref-1.*/*.zt")))
def test_reference_files_take_the_fast_path_and_agree(path):
    taken, _ = assert_agree((DATA / path).read_bytes())
    assert taken, f"the fast path declined {path}, written by the reference"


@pytest.mark.parametrize("path", sorted(str(p.relative_to(DATA)) for p in
                                        DATA.glob("fuzz-regressions/*.zt")))
def test_hostile_regressions_agree(path):
    assert_agree((DATA / path).read_bytes())


def test_v01_files_go_the_general_way():
    taken, _ = assert_agree((DATA / "ref-0.1.4" / "dense.zt").read_bytes())
    assert not taken


def test_many_objects_agree(tmp_path):
    def build(w):
        for i in range(3000):
            w.add(f"layer.{i}.w", np.full((i % 7, 2), i, dtype="f4"))
    taken, fast = assert_agree(written(tmp_path, build))
    assert taken and len(fast[2]) == 3000


def test_deep_shapes_take_the_counted_pass(tmp_path):
    # tables are first sized from the byte count (4 dims per 30 bytes); rank-32
    # shapes (numpy 1.x's most) overflow that, so the scanner counts and fills again
    def build(w):
        for i in range(200):
            w.add(f"d{i}", np.zeros((1,) * 31 + (i % 3 + 1,), "f4"))
    data = written(tmp_path, build)
    taken, fast = assert_agree(data)
    assert taken and len(fast[2]) == 200
    with ztensor.Reader(data) as r:
        assert {n: r.metadata(n).shape for n in r.keys()} == {
            f"d{i}": (1,) * 31 + (i % 3 + 1,) for i in range(200)}
    from ztensor.container.footer import read_footer
    from ztensor.io.source import Source
    source = Source(data)
    footer = read_footer(source, spec.DEFAULT_LIMITS)
    raw = bytes(source.view(footer.manifest_offset, footer.manifest_size, "m"))
    source.close()
    assert 200 * 32 > 4 * (len(raw) // 30 + 1)  # more dims than the first tables hold
    scanned = kernels.manifest_scan(raw, VOCABULARIES, 64, 64)
    last = {f"d{i}": i % 3 + 1 for i in range(200)}
    assert scanned[4].tolist() == [d for n in sorted(last) for d in (1,) * 31 + (last[n],)]


# ------------------------------------------------------------------ crafted manifests
def entry(dtype="f32", offset=64, length=64, **extra):
    return {"dtype": dtype, "offset": offset, "length": length, **extra}


def one(shape=(4, 4), fmt="dense", comps=None, version="1.2.0", **obj_extra):
    obj = {"shape": list(shape), "format": fmt,
           "components": comps if comps is not None else {"data": entry()}, **obj_extra}
    return {"version": version, "objects": {"x": obj}}


BLOBS = bytes(56) + bytes(range(256)) * 2


@pytest.mark.parametrize("m,slow", [
    (one(), False),
    (one(comps={"data": entry(offset=96)}), True),                        # misaligned
    (one(comps={"data": entry(length=60)}), True),                        # wrong size
    (one(comps={"data": entry(offset=0)}), True),                         # into header
    (one(comps={"data": entry(length=1 << 40)}), True),                   # past the data
    (one(comps={"data": entry(offset=(1 << 64) - 64)}), True),            # wraps around
    (one(comps={"data": entry(dtype="f33")}), True),                      # unknown dtype
    (one(comps={"data": entry(type="f8_e5m2")}), True),                   # needs u8
    (one(comps={"data": entry(type="mystery")}), True),                   # unknown type
    (one(comps={"data": entry(encoding="lz4")}), True),
    (one(comps={"data": entry(digest="crc32c:0xZZ")}), True),
    (one(comps={"data": entry(digest="sha256:" + "0" * 64)}), False),
    (one(comps={"data": entry(uncompressed_length=64)}), False),           # raw, consistent
    (one(comps={"data": entry(uncompressed_length=65)}), True),
    (one(comps={"data": entry(encoding="zstd", uncompressed_length=64)}), False),
    (one(comps={"data": entry(encoding="zstd")}), True),                   # 1.2 needs it
    (one(comps={"data": entry(encoding="zstd")}, version="1.1.0"), False),  # from shape
    (one(comps={"data": entry(encoding="zstd"), "aux": entry(offset=128, encoding="zstd")},
         version="1.1.0"), True),                                          # not derivable
    (one(comps={"data": entry(encoding="zstd", length=1, uncompressed_length=64)}), False),
    (one(shape=(40000,), comps={"data": entry(dtype="u8", encoding="zstd", length=1,
                                              uncompressed_length=40000)}), True),  # ratio
    (one(comps={"data": entry(offset=-64)}), True),
    (one(comps={"data": entry(offset=True)}), True),
    (one(comps={"data": entry(offset=None)}), True),
    (one(comps={"data": entry(offset=64.0)}), True),
    (one(comps={"data": entry(type=None)}), True),
    (one(comps={"data": entry(), "extra": entry(offset=128)}), True),  # dense: data alone
    (one(comps={"data": entry(), "extra": entry(offset=96, length=64)}), True),  # overlaps
    (one(comps={"values": entry()}), True),                               # dense w/o data
    (one(comps={}), True),
    (one(shape=(2 ** 62, 2)), True),
    (one(shape=(-1, 4)), True),
    (one(shape=[4.0, 4]), True),
    (one(shape=(0, 1 << 62)), True),                                       # numpy refuses
    (one(fmt="holographic"), True),                                        # generic: general
    (one(fmt=""), True),
    (one(version="2.0.0"), True),
    (one(version="1.9.0"), False),
    (one(version=1), True),
    (one(attributes={"a": 1}), False),
    (one(attributes={"a": {1: 2}}), True),
    (one(attributes=None), True),
    (one(extra_key={"ignored": [1, 2]}), False),
    ({"version": "1.2.0", "objects": {}}, False),
    ({"version": "1.2.0", "objects": {}, "attributes": {"f": "x"}, "zzz": 1}, False),
    ({"version": "1.2.0", "objects": {"": one()["objects"]["x"]}}, True),
    ({"version": "1.2.0"}, True),
    ({"version": "1.2.0", "objects": []}, True),
    ([1, 2], True),
])
def test_crafted_manifests_agree(m, slow):
    taken, _ = assert_agree(v1_file(m, BLOBS))
    assert taken == (not slow)


def _with_raw_field(raw_value: bytes):
    """A one-object manifest whose unknown field 'zz' holds ``raw_value`` as is."""
    raw = cbor2.dumps(one(zz="@@@@"))
    assert raw.count(b"\x64@@@@") == 1
    return raw.replace(b"\x64@@@@", raw_value)


@pytest.mark.parametrize("raw_value,plain", [
    (b"\xa1\x01\x02", False),                       # a map key that is not text
    (b"\xf8\x10", False),                            # a two-byte simple value below 32
    (b"\x81" * (2 + MAX_CBOR_DEPTH) + b"\x01", False),  # deeper than the CBOR limit
    (b"\xd9\xd9\xf7\x01", True),                    # self-described CBOR: a tag
    (b"\xf8\x20", True),                             # a two-byte simple value of 32
    (b"\xbf\x61k\x9f\xff\xff", True),               # indefinite containers
])
def test_what_the_cbor_scan_refuses_the_tables_decline(raw_value, plain):
    # the fast path is trusted to prove the bytes plain CBOR (the general path's
    # first check is skipped when it answers): it must decline all the scan refuses
    raw = _with_raw_field(raw_value)
    scanned = kernels.manifest_scan(raw, VOCABULARIES, MAX_CBOR_DEPTH, 64)
    if plain:
        assert kernels.cbor_scan(raw, MAX_CBOR_DEPTH)[0] == len(raw)
    else:
        assert scanned[0] is None
        with pytest.raises(ztensor.FormatError):
            kernels.cbor_scan(raw, MAX_CBOR_DEPTH)
    taken, fast = assert_agree(v1_file(None, BLOBS, raw=raw))
    if not plain:
        assert not taken and fast[0] == "FormatError"


def test_limits_agree():
    data = v1_file(one(comps={"data": entry(encoding="zstd", length=64,
                                            uncompressed_length=64)}), BLOBS)
    for limits in (spec.Limits(max_component_size=63), spec.Limits(max_total_decompressed=63),
                   spec.Limits(max_rank=1), spec.Limits(max_objects=0)):
        taken, fast = assert_agree(data, limits)
        assert not taken and fast[0] == "LimitError"


def test_duplicates_go_the_general_way():
    # a repeated key: cbor2 would keep the last value (in the first one's place), so
    # the general path refuses it (manifest_checks.refuse_repeated_keys)
    head = cbor2.dumps("x") + cbor2.dumps(one()["objects"]["x"])
    raw = (b"\xa2" + cbor2.dumps("version") + cbor2.dumps("1.2.0") + cbor2.dumps("objects")
           + b"\xa2" + head + head)
    taken, fast = assert_agree(v1_file(None, BLOBS, raw=raw))
    assert not taken and fast[0] == "FormatError"


def _named(m, name="@@"):
    """m with its one object renamed."""
    m["objects"] = {name: m["objects"]["x"]}
    return m


@pytest.mark.parametrize("m", [
    one(extra_key="@@"),                                        # an unknown field's value
    one(**{"@@": 1}),                                           # an unknown object key
    one(comps={"data": entry(**{"@@": 1})}),                    # an unknown component key
    one(comps={"data": entry(dtype="@@")}),                     # a vocabulary word
    one(comps={"data": entry(digest="@@")}),                    # a digest
    one(comps={"data": entry(), "@@": entry(offset=128)}),      # a component role
    one(attributes={"@@": "@@"}),                               # attributes
    one(version="@@"),                                          # the version
    _named(one()),                                              # an object name
    dict(one(), **{"@@": 1}),                                   # an unknown root key
], ids=["value", "object-key", "component-key", "dtype", "digest", "role", "attributes",
        "version", "name", "root-key"])
def test_invalid_utf8_anywhere_agrees(m):
    # the scanner checks text as UTF-8 only where no key or vocabulary word matched:
    # every other place must still decline it
    raw = cbor2.dumps(m)
    assert b"@@" in raw
    raw = raw.replace(b"@@", b"\xed\xa0")  # a UTF-8-encoded surrogate half
    assert kernels.manifest_scan(raw, VOCABULARIES, MAX_CBOR_DEPTH, 64)[0] is None
    taken, fast = assert_agree(v1_file(None, BLOBS, raw=raw))
    assert not taken and fast[0] == "FormatError"


# ------------------------------------------------------------------ property: any encoding
WEIRD = st.sampled_from([0, 1, 63, 64, 128, 192, 1 << 63, (1 << 64) - 1, -1, True, None, 2.0,
                         "", "f32", "zstd", "raw", "u8", "f8_e4m3fn", "complex64", "bf16",
                         "float32", [], {}, [4], 2 ** 64, "crc32c:0x1"])


@st.composite
def manifests(draw):
    def maybe(valid):
        return draw(WEIRD) if draw(st.integers(0, 9)) == 0 else valid

    objects = {}
    offset = 64
    for i in range(draw(st.integers(0, 4))):
        rank = draw(st.integers(0, 3))
        shape = [draw(st.integers(0, 4)) for _ in range(rank)]
        dtype, itemsize = draw(st.sampled_from([("f32", 4), ("u8", 1), ("f16", 2),
                                                ("bf16", 2), ("complex64", 8)]))
        length = math.prod(shape) * itemsize
        comp = {"dtype": maybe(dtype), "offset": maybe(offset), "length": maybe(length)}
        if draw(st.booleans()):
            comp["type"] = maybe(draw(st.sampled_from(["f8_e5m2", "complex64", "bf16"])))
        if draw(st.booleans()):
            comp["encoding"] = maybe("raw")
        if draw(st.integers(0, 4)) == 0:
            comp["uncompressed_length"] = maybe(length)
        obj = {"shape": maybe(shape), "format": maybe("dense"), "components": {"data": comp}}
        if draw(st.integers(0, 3)) == 0:
            obj["attributes"] = maybe({"k": i})
        name = draw(st.sampled_from([f"t{i}", "t0", "é", "x"]))
        objects[name] = obj
        offset += -(-max(length, 1) // 64) * 64
    return {"version": maybe("1.2.0"), "objects": maybe(objects)}, offset


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.data())
def test_any_encoding_of_any_manifest_agrees(generated, data):
    m, end = generated
    raw = encode(m, lambda options: data.draw(st.sampled_from(options)))
    assert_agree(v1_file(None, bytes(end), raw=raw))


def test_walking_many_mixed_objects_agrees(tmp_path):
    # listing every spec reads shapes and dtypes from per-object lists made in one
    # pass over the columns: they must be what the general path reports
    def build(w):
        for i in range(150):
            kind = i % 6
            if kind == 0:
                w.write_numpy(f"f{i}", np.ones((i % 5, 3), np.float32))
            elif kind == 1:
                w.write_numpy(f"c{i}", np.ones(4, np.complex64))
            elif kind == 2:
                w.write_numpy(f"b{i}", np.ones(4, np.float32), type="bf16")
            elif kind == 3:
                w.write_numpy(f"e{i}", np.ones(4, np.float32), type="f8_e5m2")
            elif kind == 4:
                w.write_numpy(f"z{i}", np.arange(100, dtype=np.int16), compress=True,
                              attributes={"i": i})
            else:
                w.write(f"s{i}", csr([1.0, 1.0, 1.0], [0, 1, 2], [0, 1, 2, 3], (3, 3)))
    data = written(tmp_path, build)
    taken, fast = assert_agree(data)
    assert taken and len(fast[2]) == 150
    with ztensor.Reader(data) as r:  # shapes and dtypes only, as a listing asks
        listed = [(m.shape, m.dtype, m.storage_dtype, m.type) for m in map(r.metadata, r.keys())]
        for name in r.keys():  # reads plan views from the table specs as from built ones
            r.read_numpy(name) if r.metadata(name).format == "dense" else r.read(name)
            m = r.metadata(name)
            assert m.plan == dense.view_plan(m) or m.plan is None, m.name
    with ztensor.Reader(data) as r:
        for name, row in zip(r.keys(), listed):
            m = r.metadata(name)
            _ = m.components  # built first: the properties then come from the components
            assert row == (m.shape, m.dtype, m.storage_dtype, m.type), name


def test_threads_listing_one_reader_agree(tmp_path):
    """Specs are made lazily (columns on first use, the rest after 64): threads sharing
    a Reader must all see whole specs, one per name."""
    import sys
    import threading
    path = tmp_path / "many.zt"
    with ztensor.Writer(path) as w:
        for i in range(300):
            w.write_numpy(f"t{i}", np.zeros((i % 7, 2), np.float32 if i % 2 else np.int16))
    want = {f"t{i}": ((i % 7, 2), "float32" if i % 2 else "int16") for i in range(300)}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            r = ztensor.Reader(path)
            seen, bad = [], []
            start = threading.Barrier(4)

            def walk():
                start.wait()
                try:
                    got = {n: r.metadata(n) for n in r.keys()}
                    seen.append(got)
                    for n, m in got.items():
                        if (m.shape, m.dtype) != want[n]:
                            bad.append((n, m.shape, m.dtype))
                except Exception as exc:  # noqa: BLE001 - any error is the bug
                    bad.append(repr(exc))
            threads = [threading.Thread(target=walk) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not bad, bad[:3]
            # one spec object per name, whichever thread made it
            assert all(seen[0][n] is r.metadata(n) for n in r.keys())
            r.close()
    finally:
        sys.setswitchinterval(old)


def _plain_shapes(starts, ranks, dims):
    return [tuple(int(d) for d in dims[s:s + k]) for s, k in zip(starts, ranks)]


def _shape_columns(shapes):
    ranks = np.array([len(s) for s in shapes], np.uint64)
    starts = np.concatenate([[0], np.cumsum(ranks)[:-1]]).astype(np.uint64)
    dims = np.array([d for s in shapes for d in s], np.uint64)
    return starts, ranks, dims


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=10), min_size=0, max_size=400))
def test_shared_shapes_are_the_shapes(shapes):
    from ztensor.container.manifest_table import _shape_list
    starts, ranks, dims = _shape_columns([tuple(s) for s in shapes])
    got = _shape_list(starts, ranks, dims)
    assert got == [tuple(s) for s in shapes]
    assert all(type(d) is int for s in got for d in s)


def test_shared_shapes_survive_a_hash_collision():
    # (x,) and (a, b) built to hash alike: every row is still compared with its
    # group's first, so both keep their own shape
    from ztensor.container.manifest_table import _shape_list
    k, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1

    def key(shape):
        h = 0
        for column in (len(shape), *shape, *[0] * (2 - len(shape))):
            h = ((h ^ column) * k) & mask
        return h
    x, a = 7, 3
    for a in range(3, 1000):  # a second dim below 2**63, as the scanner allows
        b = ((((2 * k) & mask) ^ a) * k & mask) ^ (((k ^ x) * k) & mask)
        if b < (1 << 63):
            break
    assert key((x,)) == key((a, b))
    shapes = [(x,), (a, b)] * 40
    starts, ranks, dims = _shape_columns(shapes)
    assert _shape_list(starts, ranks, dims) == shapes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.data())
def test_whatever_the_tables_take_is_plain_cbor(generated, data):
    # one byte of a manifest changed anywhere: if the scanner still takes it, the
    # plain-CBOR scan accepts it to its last byte
    m, _ = generated
    raw = bytearray(encode(m, lambda options: data.draw(st.sampled_from(options))))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] = data.draw(st.integers(0, 255))
    raw = bytes(raw)
    if kernels.manifest_scan(raw, VOCABULARIES, MAX_CBOR_DEPTH, 64)[0] is not None:
        assert kernels.cbor_scan(raw, MAX_CBOR_DEPTH)[0] == len(raw)


def view_table_args(**over):
    """A valid ViewTable over 64 bytes typed as u1 and <u4: 'a' is u1[0:8] as 2x4,
    'b' is <u4[4:6] (rank 1), 'c' has no view; then the override."""
    base = np.arange(64, dtype=np.uint8)
    args = dict(index={"a": 0, "b": 1, "c": 2},
                typed=[base, np.frombuffer(base, "<u4")],
                which=np.array([0, 1, -1], np.int64),
                starts=np.array([0, 4, 0], np.uint64), stops=np.array([8, 6, 0], np.uint64),
                dims_start=np.array([0, 2, 3], np.uint64), ranks=np.array([2, 1, 0], np.uint64),
                dims=np.array([2, 4, 2], np.uint64))
    args.update(over)
    return args


def test_view_table_slices_and_shapes():
    table = kernels.ViewTable(**view_table_args())
    base = np.arange(64, dtype=np.uint8)
    np.testing.assert_array_equal(table.view("a"), base[:8].reshape(2, 4))
    np.testing.assert_array_equal(table.view("b"), base.view("<u4")[4:6])
    assert table.view("b").dtype == np.dtype("<u4")
    assert table.view("c") is None and table.view("missing") is None
    rank0 = kernels.ViewTable(**view_table_args(ranks=np.array([0, 1, 0], np.uint64),
                                                stops=np.array([1, 6, 0], np.uint64)))
    assert rank0.view("a").shape == () and rank0.view("a")[()] == 0


@pytest.mark.parametrize("over", [
    dict(which=np.array([0, 2, -1], np.int64)),            # no third typed array
    dict(stops=np.array([65, 6, 0], np.uint64)),           # past the u1 array's end
    dict(stops=np.array([8, 17, 0], np.uint64)),           # past the <u4 array's 16
    dict(starts=np.array([9, 4, 0], np.uint64)),           # start after stop
    dict(dims_start=np.array([2, 2, 3], np.uint64)),       # rank 2 from dims[2:]: 1 left
    dict(ranks=np.array([2, 1, 1 << 63], np.uint64)),      # a rank that wraps
    dict(dims_start=np.array([0, 2, 4], np.uint64)),       # a start past the dims
    dict(stops=np.array([8, 6], np.uint64)),               # columns of other lengths
], ids=["kind", "u1-end", "u4-end", "start-after-stop", "dims-short", "rank-wraps",
        "dims-start", "lengths"])
def test_view_table_refuses_rows_outside_what_they_index(over):
    with pytest.raises(ztensor.KernelArgumentError, match="ViewTable"):
        kernels.ViewTable(**view_table_args(**over))


def test_view_table_refuses_an_index_past_its_rows():
    table = kernels.ViewTable(**view_table_args(index={"a": 0, "far": 3, "neg": -1}))
    for name in ("far", "neg"):
        with pytest.raises(ztensor.KernelArgumentError, match="row"):
            table.view(name)


def test_a_batch_view_table_takes_only_plain_rows(tmp_path):
    path = tmp_path / "m.zt"
    with ztensor.Writer(str(path)) as w:
        # one byte per element: a plain view on big-endian hosts too
        w.write_numpy("plain", np.arange(6, dtype=np.uint8).reshape(2, 3))
        w.write_numpy("packed", np.arange(64, dtype=np.float32), compress=True)
    with ztensor.Reader(str(path)) as r:
        specs = r.internals.specs
        buf = np.zeros(128, np.uint8)
        plain, packed = specs.index["plain"], specs.index["packed"]
        table = specs.view_table(buf, np.array([plain]), np.array([64], np.uint64))
        got = table.view("plain")
        assert got.shape == (2, 3) and np.shares_memory(got, buf[64:70])
        assert table.view("packed") is None
        with pytest.raises(ValueError, match="plain"):
            specs.view_table(buf, np.array([packed]), np.array([0], np.uint64))
