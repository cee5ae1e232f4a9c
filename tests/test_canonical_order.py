"""The same tensors give the same bytes (docs/format-decisions.md, "Canonical order").

Every function that takes a whole mapping writes its tensors in one order, by name in
code point order (``ztensor._save.canonical_order``), and every attribute map, nested
ones included, is encoded with its keys sorted (``manifest._sorted_map``).  So a dict
built in another order, or metadata given in another order, changes nothing: the
properties below compare bytes over permutations of names, dtypes and metadata for
``ztensor.numpy``, ``ztensor.torch``, ``serialize`` and ``save_sharded``.

``test_golden_bytes`` pins the bytes themselves to tests/data/canonical/golden.zt
(made once by tools/make_golden.py from :func:`golden_tensors`).  It needs numpy
alone (no torch, no ml_dtypes), so the s390x big-endian job runs it too, on the C
kernels and the pure-Python fallback: that is how "the same bytes on every host" is
proven.  Nothing host- or time-dependent is written (the manifest's ``version`` is
the format's, "1.2.0", never the library's; no timestamps, no host names).
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
import ztensor.numpy as znp
from ztensor import _save
from ztensor.container.reader import open_bytes

GOLDEN = Path(__file__).parent / "data" / "canonical" / "golden.zt"

GOLDEN_METADATA = {"zeta": "last", "format": "np", "alpha": "\u00e9t\u00e9"}


def golden_tensors():
    """The golden file's tensors, deliberately not in name order: numpy dtypes only
    (bool, int8, uint16, float16, float32, float64, int64), a big-endian input, a
    transposed view, a 0-d and an empty array, names whose code point order differs
    from a case-insensitive or locale order ("Z" < "a" < "\u00e9")."""
    nan32 = np.array([0x7FC00000], np.uint32).view(np.float32)[0]  # one NaN bit pattern
    return {
        "weight": (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1),
        "\u00e9t\u00e9.bias": np.array([1.5, -2.25, 1e300, -0.0], np.float64),
        "half": np.array([0.0, -0.0, 1.5, 65504.0, np.inf], np.float16),
        "mask": np.array([[True, False], [False, True]]),
        "count": np.array([0, 1, 258, 65535, 4660], np.uint16),
        "delta": np.array([-128, 0, 127], np.int8),
        "scalar": np.array(-(2 ** 40), np.int64),
        "empty": np.zeros((0, 4), np.float32),
        "Z.big_endian": np.array([1, 0x01020304, -2], ">i4"),
        "a.transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
        "a.nan": np.array([nan32, 1.0], np.float32),
    }


def test_golden_bytes(tmp_path):
    """A fixed set of tensors gives, byte for byte, the committed file: on this host
    and on a big-endian one, with either backend."""
    tensors = golden_tensors()
    path = tmp_path / "golden.zt"
    znp.save_file(dict(reversed(list(tensors.items()))), path,
                  metadata=dict(reversed(list(GOLDEN_METADATA.items()))))
    assert path.read_bytes() == GOLDEN.read_bytes()
    assert znp.save(tensors, metadata=GOLDEN_METADATA) == GOLDEN.read_bytes()
    back = znp.load_file(GOLDEN)
    assert list(back) == sorted(tensors)  # code point order: "Z" < "a" < "\u00e9"
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name], arr)
        # the same type (a view of the little-endian bytes may be '<' on a big-endian host)
        assert back[name].dtype.newbyteorder("=") == arr.dtype.newbyteorder("=")


def test_golden_file_holds_nothing_host_or_time_dependent():
    """The manifest holds the format's version and what was given, nothing else:
    no library version (the golden bytes would change with every release), no
    timestamp, no host."""
    import cbor2
    raw = GOLDEN.read_bytes()
    size = int.from_bytes(raw[-16:-8], "little")
    root = cbor2.loads(raw[-16 - size:-16])
    assert list(root) == ["version", "attributes", "objects"]
    assert root["version"] == "1.2.0"  # the format's version, not ztensor's
    assert root["attributes"] == GOLDEN_METADATA
    for obj in root["objects"].values():
        assert set(obj) == {"shape", "format", "components"}
        assert set(obj["components"]["data"]) <= {"dtype", "type", "offset", "length"}


def test_data_offsets_rise_in_name_order():
    """The bytes are laid out in the order the manifest lists the names, so
    ``offset_keys()`` and ``keys()`` agree for what the save functions write."""
    with ztensor.safe_open(GOLDEN) as f:
        assert f.offset_keys() == f.keys() == sorted(golden_tensors())


# ------------------------------------------------------------ safetensors' own test
def test_serialization_order_invariant():
    """safetensors' test_serialization_order_invariant, ported."""
    data = np.zeros((2, 2), dtype=np.int32)
    out1 = znp.save({"test1": data, "test2": data})
    out2 = znp.save({"test2": data, "test1": data})
    assert out1 == out2


def test_serialization_order_invariant_mixed_dtypes():
    """safetensors' test_serialization_forces_alignment, the part that applies: two
    dtypes in either order give one file, and every blob is 64-byte aligned (so
    the alignment-first sort safetensors needs buys nothing here)."""
    data, data2 = np.zeros((2, 2), dtype=np.int32), np.zeros((2, 2), dtype=np.float16)
    out1 = znp.save({"test1": data, "test2": data2})
    out2 = znp.save({"test2": data2, "test1": data})
    assert out1 == out2
    with open_bytes(out1) as r:
        offsets = [r.metadata(n).components["data"].offset for n in r.keys()]
    assert offsets == sorted(offsets) and all(o % 64 == 0 for o in offsets)


# ------------------------------------------------------------ properties
NUMPY_DTYPES = ["?", "i1", "u1", "i2", "<u2", ">u2", "<i4", "f2", "<f4", ">f4", "<f8", "i8",
                "c8"]
names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)
metadata = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=5)


@st.composite
def tensor_dicts(draw, dtypes=NUMPY_DTYPES):
    keys = draw(st.lists(names, min_size=0, max_size=6, unique=True))
    out = {}
    for i, key in enumerate(keys):
        dtype = np.dtype(draw(st.sampled_from(dtypes)))
        shape = draw(st.sampled_from([(), (0,), (3,), (2, 2), (1, 3, 2)]))
        out[key] = (np.arange(int(np.prod(shape)), dtype=np.int64) + i).astype(dtype) \
            .reshape(shape)
    return out


def shuffled(draw, mapping):
    return dict(draw(st.permutations(list(mapping.items()))))


@settings(max_examples=40)
@given(st.data(), tensor_dicts(), metadata)
def test_numpy_save_ignores_dict_order(data, tensors, meta):
    expected = znp.save(tensors, metadata=meta or None)
    again = znp.save(shuffled(data.draw, tensors), metadata=shuffled(data.draw, meta) or None)
    assert again == expected
    with open_bytes(expected) as r:  # the bytes are in the manifest's (name) order
        offsets = [r.metadata(n).components["data"].offset for n in r.keys()]
    assert offsets == sorted(offsets)


@settings(max_examples=25)
@given(st.data(), tensor_dicts(), metadata)
def test_numpy_save_file_ignores_dict_order_compressed(tmp_path_factory, data, tensors, meta):
    folder = tmp_path_factory.mktemp("zstd")
    znp.save_file(tensors, folder / "1.zt", metadata=meta, compress=True, checksum="crc32c")
    znp.save_file(shuffled(data.draw, tensors), folder / "2.zt",
                  metadata=shuffled(data.draw, meta), compress=True, checksum="crc32c")
    assert (folder / "1.zt").read_bytes() == (folder / "2.zt").read_bytes()


@settings(max_examples=25)
@given(st.data(), tensor_dicts(dtypes=["?", "i1", "u1", "<i2", "<i4", "<i8", "<f2", "<f4",
                                       "<f8"]), metadata)
def test_torch_save_ignores_dict_order(data, tensors, meta):
    torch = pytest.importorskip("torch")
    pt = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    import ztensor.torch as zt
    expected = zt.save(pt, metadata=meta or None)
    assert zt.save(shuffled(data.draw, pt), metadata=shuffled(data.draw, meta) or None) \
        == expected
    # the same values through numpy give the same file: one rule for both
    assert znp.save(tensors, metadata=meta or None) == expected


def test_torch_save_model_ignores_state_dict_order(tmp_path):
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt

    class Net(torch.nn.Module):
        def __init__(self, first):
            super().__init__()
            # registration order is the state dict's order
            layers = [("b_layer", torch.nn.Linear(3, 2)), ("a_layer", torch.nn.Linear(2, 3))]
            for name, layer in (layers if first == "b" else layers[::-1]):
                self.add_module(name, layer)

    one, two = Net("b"), Net("a")
    two.load_state_dict(one.state_dict())
    assert list(one.state_dict()) != list(two.state_dict())
    zt.save_model(one, tmp_path / "1.zt")
    zt.save_model(two, tmp_path / "2.zt")
    assert (tmp_path / "1.zt").read_bytes() == (tmp_path / "2.zt").read_bytes()


SERIALIZE_DTYPES = {"float32": "<f4", "F64": "<f8", "int8": "i1", "U16": "<u2", "bool": "?",
                    "bfloat16": "<u2", "I64": "<i8"}


@settings(max_examples=40)
@given(st.data(), tensor_dicts(dtypes=["i1"]), metadata)
def test_serialize_ignores_dict_order(data, tensors, meta):
    specs = {}
    for name, arr in tensors.items():
        dtype = data.draw(st.sampled_from(sorted(SERIALIZE_DTYPES)))
        values = arr.astype(SERIALIZE_DTYPES[dtype])
        specs[name] = {"dtype": dtype, "shape": list(values.shape), "data": values.tobytes()}
    expected = ztensor.serialize(specs, metadata=meta or None)
    again = ztensor.serialize(shuffled(data.draw, {k: shuffled(data.draw, v)
                                                   for k, v in specs.items()}),
                              metadata=shuffled(data.draw, meta) or None)
    assert again == expected


@settings(max_examples=25)
@given(st.data(), tensor_dicts(), metadata, st.sampled_from([1, 40, 100, 10 ** 6]))
def test_save_sharded_ignores_dict_order(tmp_path_factory, data, tensors, meta, limit):
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    files1 = ztensor.save_sharded(tensors, one, max_shard_size=limit, metadata=meta)
    files2 = ztensor.save_sharded(shuffled(data.draw, tensors), two, max_shard_size=limit,
                                  metadata=shuffled(data.draw, meta))
    assert files1 == files2  # the same assignment of tensors to shards
    assert sorted(os.listdir(one)) == sorted(os.listdir(two))
    for file in os.listdir(one):  # every shard and the index, byte for byte
        assert (one / file).read_bytes() == (two / file).read_bytes(), file
    weight_map = json.loads((one / "model.zt.index.json").read_text())["weight_map"]
    assert [weight_map[n] for n in _save.canonical_names(tensors)] == \
        sorted(weight_map[n] for n in tensors)  # shards hold consecutive runs of names


# ------------------------------------------------------------ attribute maps
nested = st.recursive(st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none()),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.text(max_size=3), inner,
                                                              max_size=4)),
                      max_leaves=12)


def reorder(draw, value):
    """``value`` with every map's keys, at every depth, in a drawn order."""
    if isinstance(value, dict):
        return {k: reorder(draw, v) for k, v in draw(st.permutations(list(value.items())))}
    if isinstance(value, list):
        return [reorder(draw, v) for v in value]
    return value


@settings(max_examples=40)
@given(st.data(), st.dictionaries(st.text(max_size=4), nested, max_size=4))
def test_nested_attribute_maps_encode_in_one_order(tmp_path_factory, data, attributes):
    """The Writer keeps its call order for objects, but attribute maps (the file's
    and an object's, nested ones too) are one encoding whatever their key order."""
    folder = tmp_path_factory.mktemp("attrs")
    out = []
    for i, attrs in enumerate((attributes, reorder(data.draw, attributes))):
        with ztensor.Writer(folder / f"{i}.zt", attributes=attrs) as w:
            w.write_numpy("x", np.arange(3, dtype=np.int8), attributes=attrs or None)
        out.append((folder / f"{i}.zt").read_bytes())
    assert out[0] == out[1]
    with ztensor.Reader(folder / "0.zt") as r:
        assert r.attributes == attributes


def test_the_writer_keeps_call_order(tmp_path):
    """The streaming Writer is not reordered: its data follows the calls (the
    manifest lists names sorted either way)."""
    for order in (["b", "a"], ["a", "b"]):
        with ztensor.Writer(tmp_path / f"{''.join(order)}.zt") as w:
            for name in order:
                w.write_numpy(name, np.full(3, ord(name), np.uint8))
    with ztensor.Reader(tmp_path / "ba.zt") as r:
        assert r.keys() == ["a", "b"]
        assert r.metadata("b").components["data"].offset < r.metadata("a").components["data"].offset
    assert (tmp_path / "ba.zt").read_bytes() != (tmp_path / "ab.zt").read_bytes()


# ------------------------------------------------------------ convert
def test_convert_writes_in_canonical_order(tmp_path):
    """A file converted to .zt is written in name order, not its input's: two npz
    files holding the same arrays in other orders give one .zt file."""
    arrays = {"b": np.arange(4, dtype=np.int16), "a": np.ones((2, 2)), "C": np.zeros(3, "?")}
    np.savez(tmp_path / "1.npz", **arrays)
    np.savez(tmp_path / "2.npz", **dict(reversed(list(arrays.items()))))
    for i in (1, 2):
        ztensor.convert(tmp_path / f"{i}.npz", tmp_path / f"{i}.zt")
    assert (tmp_path / "1.zt").read_bytes() == (tmp_path / "2.zt").read_bytes()
    assert (tmp_path / "1.zt").read_bytes() == znp.save(arrays)


def test_canonical_order_is_code_point_order():
    names = ["b", "a", "B", "\u00e9", "\U0001F600", "\uffff", "a.b", "a0", ""]
    got = [k for k, _ in _save.canonical_order({n: None for n in names})]
    assert got == sorted(names)  # Python's str order is code point order
    assert got == sorted(names, key=lambda n: n.encode("utf-8"))  # = UTF-8 byte order
    # keys that are not strings go last, for the Writer to refuse with its own error
    assert [k for k, _ in _save.canonical_order({1: 0, "b": 0, None: 0, "a": 0})] == \
        ["a", "b", 1, None]
    with pytest.raises(TypeError):  # a name that is no str: the caller's TypeError
        znp.save({"b": np.zeros(1), 1: np.zeros(1)})
