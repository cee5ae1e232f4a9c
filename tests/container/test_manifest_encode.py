"""The manifest's objects map written from columns (csrc/manifest_encode.c) gives the
bytes cbor2 gives for the same dicts (the fallback's encoder, and the reference's
layout), for any names, shapes and mixes of plain and other objects."""
import cbor2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ztensor import dtypes, kernels
from ztensor.container import manifest
from ztensor.objects import ComponentSpec, ObjectSpec

pytestmark = pytest.mark.skipif(not hasattr(kernels, "manifest_encode"),
                                reason="the numpy fallback encodes through cbor2 only")


def with_cbor2(objects, attributes):
    """The fallback's bytes: everything through dicts and cbor2."""
    saved = kernels.manifest_encode
    del kernels.manifest_encode
    try:
        return manifest.encode_manifest(objects, attributes)
    finally:
        kernels.manifest_encode = saved


names = st.text(min_size=1, max_size=12).map(
    lambda s: s.encode("utf-8", "replace").decode("utf-8", "replace"))
ints = st.one_of(st.integers(0, 30), st.integers(0, 2**64 - 1))


@st.composite
def entries(draw):
    shape = tuple(draw(st.lists(ints, max_size=4)))
    storage = draw(st.sampled_from(sorted(dtypes.STORAGE)))
    offset, length = draw(ints), draw(ints)
    if draw(st.booleans()):
        return (shape, storage, offset, length)
    comps = {"data": ComponentSpec("data", storage, None, offset, length, "zstd", 7,
                                   "crc32c:0x1")}
    return ObjectSpec("x", shape, "dense", draw(st.sampled_from([{}, {"k": [1, "v"]}])), comps)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(names, entries(), max_size=12),
       st.sampled_from([{}, {"framework": "numpy", "n": 3}]))
def test_columns_give_cbor2s_bytes(objects, attributes):
    fast = manifest.encode_manifest(objects, attributes)
    assert fast == with_cbor2(objects, attributes)
    decoded = cbor2.loads(fast)
    assert list(decoded["objects"]) == sorted(objects, key=lambda n: n.encode("utf-8"))


def test_many_plain_objects():
    objects = {f"layer.{i}.weight": ((i % 3, 2**40 + i), "f16", 64 * i, i) for i in range(5000)}
    assert manifest.encode_manifest(objects, {}) == with_cbor2(objects, {})


def test_contract():
    with pytest.raises(ValueError):  # KernelArgumentError: columns that do not fit
        kernels.manifest_encode(b"ab", [1], [1], [1], [], [0], [0], [0], b"", [], ("f32",))
    with pytest.raises(ValueError):  # a dtype index past the vocabulary
        kernels.manifest_encode(b"a", [1], [1], [0], [], [5], [0], [0], b"", [], ("f32",))
    assert cbor2.loads(kernels.manifest_encode(b"", [], [], [], [], [], [], [], b"", [],
                                               ("f32",))) == {}
    np.testing.assert_equal(cbor2.loads(kernels.manifest_encode(
        b"a", [1], [1], [1], [3], [0], [64], [12], b"", [], ("f32",))),
        {"a": {"shape": [3], "format": "dense", "components": {"data": {
            "dtype": "f32", "offset": 64, "length": 12}}}})
