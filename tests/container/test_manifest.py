"""ztensor/container/manifest.py and csrc/cbor_scan.c: a manifest is plain CBOR, checked
before any decoder runs, so its cost follows its bytes (issue: hostile input,
round two, class 1).  Run on both backends (ZTENSOR_PUREPYTHON=1 runs the twin)."""
import time

import cbor2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from crafted import BLOB, good_manifest, outcome, v1_file
from ztensor import kernels

MAP1 = bytes.fromhex("a1")


def with_attributes(raw_attributes: bytes) -> bytes:
    """A valid one-object file whose file attributes are the given CBOR bytes."""
    head = cbor2.dumps({"version": "1.2.0"})[1:]  # the pair "version": "1.2.0"
    objects = cbor2.dumps(good_manifest()["objects"])
    raw = (b"\xa3" + head + cbor2.dumps("attributes") + raw_attributes
           + cbor2.dumps("objects") + objects)
    return v1_file(None, bytes(56) + BLOB, raw=raw)


def test_plain_attributes_open():
    data = with_attributes(cbor2.dumps({"a": [1, 2.5, None, True, b"x", "y", 2**70]}))
    with ztensor.Reader(data) as r:
        assert r.attributes == {"a": [1, 2.5, None, True, b"x", "y", 2**70]}


def shared_doubling(levels):
    """40 levels of [x, x] through value sharing: 2**levels nodes in ~10 bytes/level."""
    body = b"\xd8\x1c\x82\x01\xd8\x1d\x00"  # shareable([1, sharedref(0)])
    for _ in range(levels):
        body = b"\xd8\x1c\x82" + body + b"\xd8\x1d\x00"
    return b"\xa1\x61a" + body


@pytest.mark.parametrize("raw,tag", [
    (shared_doubling(40), 28),                                     # 2**40 nodes: the hang
    (b"\xa1\x61a\xd8\x1e\x82\x01\x02", 30),                        # rational
    (b"\xa1\x61a\xc4\x82\x21\x19\x6a\xb3", 4),                     # decimal fraction
    (b"\xa1\x61a\xc5\x82\x20\x03", 5),                             # bigfloat
    (b"\xa1\x61a\xd9\x01\x02\x81\x01", 258),                       # set
    (b"\xa1\x61a\xd8\x23\x61x", 35),                               # regular expression
    (b"\xa1\x61a\xc0\x74" + b"2013-03-21T20:04:00Z", 0),           # datetime
    (b"\xa1\x61a\xd9\x01\x00\xa0", 256),                           # stringref namespace
])
def test_tags_beyond_plain_data_are_refused_at_once(raw, tag):
    start = time.monotonic()
    err = outcome(with_attributes(raw))
    assert isinstance(err, ztensor.FormatError) and f"CBOR tag {tag}" in str(err)
    assert time.monotonic() - start < 30  # decoding the tag: 2**40 steps, or never


def test_megabyte_of_arithmetic_tags_is_refused_in_linear_time():
    # ~1 MB of rationals with bignum parts: seconds per kilobyte in a decoder
    big = b"\xc2\x59\x10\x00" + b"\xff" * 4096
    item = b"\xd8\x1e\x82" + big + big
    raw = b"\xa1\x61a\x99" + (250).to_bytes(2, "big") + item * 250
    start = time.monotonic()
    assert isinstance(outcome(with_attributes(raw)), ztensor.FormatError)
    assert time.monotonic() - start < 60  # a decoder: seconds per kilobyte, ~1000 s


def test_bignums_are_plain_data():
    data = with_attributes(b"\xa1\x61n\xc2\x49" + b"\x01" + bytes(8))
    with ztensor.Reader(data) as r:
        assert r.attributes["n"] == 2**64


@pytest.mark.parametrize("raw,words", [
    (b"\xa1\x01\x02", "not a text string"),            # integer key at the top
    (b"\xa1\x61a\xa1\x41k\x00", "not a text string"),  # byte-string key inside
    (b"\xa1\x61a" + b"\x81" * 80 + b"\x00", "nesting deeper than"),
    (b"\xa1\x61a" + b"\x81" * 66 + b"\x00", "deeper than 64"),
])
def test_attribute_shape_is_bounded(raw, words):
    err = outcome(with_attributes(raw))
    assert isinstance(err, ztensor.FormatError) and words in str(err), err


def test_sixty_four_levels_are_allowed():
    raw = b"\xa1\x61a" + b"\x81" * 63 + b"\x00"
    with ztensor.Reader(with_attributes(raw)) as r:
        value, depth = r.attributes["a"], 0
        while isinstance(value, list):
            value, depth = value[0], depth + 1
        assert depth == 63


def test_many_objects_sharing_one_map_is_refused_before_decoding():
    # the 18 MiB "two million objects share one map" file, at a size a test can build
    entry = cbor2.dumps(good_manifest()["objects"]["x"])
    names = b"".join(cbor2.dumps(f"o{i}") + (b"\xd8\x1c" + entry if i == 0 else b"\xd8\x1d\x00")
                     for i in range(200_000))
    raw = (b"\xa2" + cbor2.dumps("version") + cbor2.dumps("1.2.0") + cbor2.dumps("objects")
           + b"\xba" + (200_000).to_bytes(4, "big") + names)
    start = time.monotonic()
    err = outcome(v1_file(None, bytes(56) + BLOB, raw=raw))
    assert isinstance(err, ztensor.FormatError) and "CBOR tag 28" in str(err)
    assert time.monotonic() - start < 60  # decoding the shared map: 2e5 copies of it


@settings(max_examples=200)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text() | st.binary(),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=5), kids, max_size=4), max_leaves=30))
def test_scanner_accepts_what_cbor2_writes_for_plain_values(value):
    raw = cbor2.dumps(value)
    end, items, depth = kernels.cbor_scan(raw, 100)
    assert end == len(raw) and items >= 1 and depth >= 1
    assert cbor2.loads(raw) == value


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_scanner_never_fails_other_than_cleanly(raw):
    try:
        end, _, _ = kernels.cbor_scan(raw, 16)
    except ztensor.FormatError:
        return
    assert 0 < end <= len(raw)
    # anything the scanner passes, cbor2 decodes without a tag it would compute
    try:
        cbor2.loads(raw[:end])
    except (cbor2.CBORDecodeError, ValueError, UnicodeDecodeError):
        pass  # invalid UTF-8 and the like: cbor2's own clean verdict


def test_scanner_and_fallback_agree_on_verdicts():
    from ztensor._native import fallback as _fallback
    cases = [b"\xa0", b"\x9f\x01\xff", b"\xd8\x1c\xa0", b"\xa1\x01\x02", b"\x81" * 9 + b"\x00",
             b"\x7f\x61a\x41b\xff", b"\xf8\x01", b"\x5a\xff\xff\xff\xff\x00", b"",
             b"\x7f\x79\x00"]  # a chunk head cut short (found by fuzz_manifest)
    for raw in cases:
        assert verdict(kernels.cbor_scan, raw) == verdict(_fallback.cbor_scan, raw), raw


def verdict(scan, raw):
    """What a scanner says of ``raw``: its result, or its error's words."""
    try:
        return scan(raw, 8)
    except ztensor.FormatError as exc:
        return str(exc)


def test_overlapping_components_are_refused():
    m = good_manifest()
    m["objects"]["y"] = {"shape": [8], "format": "dense",
                         "components": {"data": {"dtype": "f32", "offset": 64, "length": 32}}}
    err = outcome(v1_file(m, bytes(56) + BLOB))
    assert isinstance(err, ztensor.FormatError) and "overlaps" in str(err)


def test_empty_components_may_share_an_offset():
    m = good_manifest()
    for name in ("e1", "e2"):
        m["objects"][name] = {"shape": [0], "format": "dense",
                              "components": {"data": {"dtype": "f32", "offset": 128,
                                                      "length": 0}}}
    with ztensor.Reader(v1_file(m, bytes(56) + BLOB)) as r:
        assert r["e1"].shape == (0,) and r["x"].sum() == np.arange(16).sum()
