"""Hostile input, round three: the leftovers (session 11).  Each test builds its input
with the real writer (onnx.helper, torch.save, numpy, ztensor.Writer, the v2 spec's
byte layout) and names the promise of docs/threat-model.md it holds and the one
function that keeps it."""

import os
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
import ztensor.numpy

# ---- the checkpoint loaders give the same dict for a file and for its bytes
# (Clean: numpy._load_reader / torch._load_reader, used by load_file and load)


def _gptq_file(tmp_path):
    w = np.random.default_rng(11).standard_normal((64, 256)).astype(np.float32)
    path = tmp_path / "gptq.zt"
    with ztensor.Writer(path) as out:
        out.write("layer.q_proj.weight", ztensor.quantize(w, bits=4, group_size=128))
        out.write_numpy("layer.norm.weight", np.linspace(0, 1, 64, dtype=np.float32))
        out.write_numpy("big", np.arange(300_000, dtype=np.int16))
    return path


def _same_arrays(a, b):
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key])


def test_numpy_load_of_bytes_gives_what_load_file_gives(tmp_path):
    """load(bytes) refused the quantized object (read_numpy reads dense objects)
    while load_file handed it out under its GPTQ names: one file, two answers."""
    path = _gptq_file(tmp_path)
    from_file = ztensor.numpy.load_file(path, copy=True)
    assert "layer.q_proj.qweight" in from_file
    from_bytes = ztensor.numpy.load(path.read_bytes())
    _same_arrays(from_file, from_bytes)
    for arr in [*from_file.values(), *from_bytes.values()]:  # owned, as both promise
        assert arr.flags.writeable


def test_torch_load_of_bytes_gives_what_load_file_gives(tmp_path):
    torch = pytest.importorskip("torch")
    import ztensor.torch

    path = _gptq_file(tmp_path)
    from_file = ztensor.torch.load_file(path, copy=True)
    from_bytes = ztensor.torch.load(path.read_bytes())
    assert list(from_file) == list(from_bytes)
    for key in from_file:
        assert from_file[key].dtype == from_bytes[key].dtype, key
        assert torch.equal(from_file[key], from_bytes[key]), key


def test_numpy_load_of_safetensors_bytes_matches_load_file(tmp_path):
    save_file = pytest.importorskip("safetensors.numpy").save_file

    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int8)}, path)
    _same_arrays(ztensor.numpy.load_file(path, copy=True), ztensor.numpy.load(path.read_bytes()))


# ---- a file that shrinks while open (mmap=False) is an error naming the object
# (Clean: source.Source.array and source.Source.read_ranges hand the object to
# source._pread_exactly_into)


def _plain_file(tmp_path, sizes):
    path = tmp_path / "m.zt"
    with ztensor.Writer(path) as w:
        for name, n in sizes.items():
            w.write_numpy(name, np.arange(n, dtype=np.float32))
    return path


_READS = {
    "read_numpy": lambda r, n: r.read_numpy(n),
    "read_numpy copy": lambda r, n: r.read_numpy(n, copy=True),
    "getitem": lambda r, n: r[n],
    "read": lambda r, n: r.read(n),
    "read_into": lambda r, n: r.read_into(n, np.empty(r.metadata(n).shape, np.float32)),
    "batch": lambda r, n: r.read_numpy(["a", n], copy=True),
    "batch read_into": lambda r, n: r.read_into({n: np.empty(r.metadata(n).shape, np.float32)}),
}


@pytest.mark.parametrize("how", list(_READS))
@pytest.mark.parametrize("size", [1024, 400_000])  # shared fetches; one of its own
def test_a_file_truncated_while_open_names_the_object(tmp_path, how, size):
    path = _plain_file(tmp_path, {"a": 16, "b": size, "c": 16})
    with ztensor.Reader(path, mmap=False) as r:
        start = r.metadata("b").components["data"].offset
        os.truncate(path, start + 100)  # b is cut; a lies before the cut
        with pytest.raises(ztensor.FormatError) as err:
            _READS[how](r, "b")
    assert err.value.obj == "b", str(err.value)
    assert err.value.path == str(path)
    assert "shrank while open" in str(err.value)


def test_a_batch_read_names_the_object_a_shared_fetch_reaches(tmp_path):
    """Small neighbours are fetched as one range; the error of that fetch named no
    object.  The cut lies in c, after b's bytes: c is named, not b."""
    path = _plain_file(tmp_path, {"a": 16, "b": 64, "c": 64, "d": 16})
    with ztensor.Reader(path, mmap=False) as r:
        comp = r.metadata("c").components["data"]
        os.truncate(path, comp.offset + 8)
        assert r.read_numpy("b").tolist() == list(range(64))
        with pytest.raises(ztensor.FormatError) as err:
            r.read_numpy(["a", "b", "c", "d"], copy=True)
    assert err.value.obj == "c", str(err.value)


# ---- a storage member holds exactly what the pickle declares; an .npy array exactly
# what its header declares (Clean: foreign.base.check_held_size, applied by
# pytorch._read_storages, numpy_files.open_npy and numpy_files._open_npz)


def _rewrite_member(path, member_suffix, change):
    """The zip at ``path`` with the member ending in ``member_suffix`` passed through
    ``change`` (bytes -> bytes), every other member as it was."""
    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for info, data in members:
            z.writestr(info, change(data) if info.filename.endswith(member_suffix) else data)


def _torch_file(tmp_path, delta):
    torch = pytest.importorskip("torch")
    path = tmp_path / f"m{delta}.pt"
    torch.save({"x": torch.arange(4, dtype=torch.float32), "y": torch.ones(2)}, path)
    if delta > 0:
        _rewrite_member(path, "/data/0", lambda d: d + bytes(range(delta)))
    elif delta < 0:
        _rewrite_member(path, "/data/0", lambda d: d[:delta])
    return path


@pytest.mark.parametrize("delta", [8, 1, -4])
def test_a_storage_member_of_another_size_than_declared_is_refused(tmp_path, delta):
    """torch.save writes numel x element size bytes per storage.  torch.load (its
    default, mmap=False) refuses a record of any other size: RuntimeError "record size
    (24 bytes) does not match expected size (16 bytes = 16 elements * 1
    bytes/element)" (PyTorchStreamReader, through get_storage_from_record in
    torch/serialization.py's load_tensor).  With mmap=True it slices the declared
    bytes out of the mapped file and says nothing: a longer member's extra bytes are
    never seen, a shorter one's tensor takes the bytes of whatever record follows.
    Here both were read silently as the declared elements: more bytes (hidden from
    every tensor) were accepted."""
    torch = pytest.importorskip("torch")
    path = _torch_file(tmp_path, delta)
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(path, weights_only=True)
    with pytest.raises(ztensor.FormatError, match=f"holds {16 + delta} bytes, not the 16") as err:
        ztensor.Reader(path)
    assert err.value.path == str(path)
    assert err.value.obj == "x"
    assert "data/0" in str(err.value)


def test_a_storage_member_of_the_declared_size_reads(tmp_path):
    path = _torch_file(tmp_path, 0)
    with ztensor.Reader(path) as r:
        assert r.read_numpy("x").tolist() == [0.0, 1.0, 2.0, 3.0]


@given(st.integers(-16, 64))
@settings(max_examples=20, deadline=None)
def test_any_storage_size_but_the_declared_one_is_refused(tmp_path_factory, delta):
    path = _torch_file(tmp_path_factory.mktemp("pt"), delta)
    if delta == 0:
        with ztensor.Reader(path) as r:
            assert r.read_numpy("x").tolist() == [0.0, 1.0, 2.0, 3.0]
    else:
        with pytest.raises(ztensor.FormatError, match="storage member"):
            ztensor.Reader(path)


def test_a_second_array_saved_to_one_npy_file_is_refused(tmp_path):
    """np.save twice to one file: np.load reads the first array a call, so the file
    holds two; a Reader listing one dropped the second without a word."""
    path = tmp_path / "two.npy"
    with open(path, "wb") as f:
        np.save(f, np.arange(4))
        np.save(f, np.arange(3))
    with open(path, "rb") as f:  # numpy reads both, one a call
        assert np.load(f).tolist() == [0, 1, 2, 3]
        assert np.load(f).tolist() == [0, 1, 2]
    with pytest.raises(ztensor.FormatError, match="bytes no tensor shows") as err:
        ztensor.Reader(path)
    assert err.value.obj == "two" and err.value.path == str(path)


def test_an_npy_file_of_exactly_its_array_reads(tmp_path):
    path = tmp_path / "one.npy"
    np.save(path, np.arange(4))
    with ztensor.Reader(path) as r:
        assert r.read_numpy("one").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("delta", [8, -8])
def test_an_npz_member_of_another_size_than_its_header_is_refused(tmp_path, delta):
    """np.load of the .npz reads the declared elements and ignores more bytes."""
    path = tmp_path / "m.npz"
    np.savez(path, a=np.arange(4.0), b=np.ones(2))
    _rewrite_member(path, "a.npy", lambda d: d + bytes(delta) if delta > 0 else d[:delta])
    if delta > 0:
        assert np.load(path)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ztensor.FormatError, match=f"holds {32 + delta} bytes, not the 32") as err:
        ztensor.Reader(path)
    assert err.value.obj == "a" and err.value.path == str(path)


# ---- a v2 gguf.* object's own ggml_type / ggml_type_id / block_* say what its layout
# says (Clean: v2._Schema.gguf); a gguf_blocks object's ggml_type names its id's type
# (Clean: gguf_blocks.check_attributes)


def _q8_blocks():
    """Two rows of 32 values as Q8_0 blocks, made by the gguf package, and its
    dequantization of them."""
    gguf = pytest.importorskip("gguf")
    values = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    return blocks, gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)


def _v2_q8(tmp_path, **extra):
    """A v2 file of one gguf.q8_0/1 object (the reference profile's attributes,
    elems_per_block and block_bytes, plus ``extra``)."""
    import v2files

    blocks, _ = _q8_blocks()
    raw = np.ascontiguousarray(blocks).tobytes()
    obj = {
        "shape": [2, 32],
        "layout": "gguf.q8_0/1",
        "attributes": {"elems_per_block": 32, "block_bytes": 34, **extra},
        "parts": {"data": {"dtype": "u8", "blob": [4096, len(raw)]}},
    }
    path = tmp_path / "q.zt"
    path.write_bytes(v2files.build({"w": obj}, [(4096, raw)]))
    return path


@pytest.mark.parametrize(
    "extra",
    [
        {"ggml_type_id": 2},  # Q4_0's id on a Q8_0 layout
        {"ggml_type_id": True},  # 1 as a bool
        {"block_elements": 16},
        {"block_elements": 32.0},
        {"ggml_type": "Q4_0"},
        {"ggml_type": 8},
    ],
)
def test_a_v2_gguf_attribute_contradicting_its_layout_is_refused(tmp_path, extra):
    """They were replaced by the layout's without a word: a reader of the file's
    own attributes would see another type than the one read."""
    path = _v2_q8(tmp_path, **extra)
    with pytest.raises(ztensor.FormatError, match="contradicts the layout") as err:
        ztensor.Reader(path)
    assert err.value.obj == "w" and err.value.path == str(path)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"ggml_type_id": 8, "block_elements": 32},
        {"ggml_type": "Q8_0"},
        {"ggml_type": "q8_0", "block_bytes": 34},
    ],
)
def test_a_v2_gguf_attribute_agreeing_with_its_layout_reads(tmp_path, extra):
    _, want = _q8_blocks()
    with ztensor.Reader(_v2_q8(tmp_path, **extra)) as r:
        obj = r.read("w")
        assert obj.format == "gguf_blocks"
        assert obj.attributes["ggml_type"] == "Q8_0" and obj.attributes["ggml_type_id"] == 8
        np.testing.assert_array_equal(ztensor.dequantize(obj, dtype=np.float32), want)


def _zt_q8(tmp_path):
    """A .zt file holding the Q8_0 tensor of a GGUF file the gguf package wrote."""
    gguf = pytest.importorskip("gguf")
    blocks, _ = _q8_blocks()
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("w", blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with ztensor.Reader(src) as r:
        obj = r.read("w")
    path = tmp_path / "q.zt"
    with ztensor.Writer(path) as out:
        out.write("w", obj)
    return obj, path


def test_a_gguf_blocks_type_name_contradicting_its_id_is_refused(tmp_path):
    """ggml_type said Q4_0 (what `ztensor ls` shows) while ggml_type_id 8 (Q8_0)
    decoded: the id won without a word.  The writer refuses it, and so does every
    read of a file that holds it."""
    obj, path = _zt_q8(tmp_path)
    assert obj.attributes["ggml_type"] == "Q8_0"
    bad = ztensor.Tensor(
        dict(obj.components),
        shape=obj.shape,
        format="gguf_blocks",
        attributes={**obj.attributes, "ggml_type": "Q4_0"},
    )
    with pytest.raises(ztensor.FormatError, match="contradicts ggml_type_id=8"):
        with ztensor.Writer(tmp_path / "bad.zt") as out:
            out.write("w", bad)
    raw = path.read_bytes()
    assert raw.count(b"Q8_0") == 1  # the name in the manifest, nowhere else
    path.write_bytes(raw.replace(b"Q8_0", b"Q4_0"))
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.FormatError, match="contradicts ggml_type_id=8") as err:
            r.read("w")
        assert err.value.obj == "w"
        with pytest.raises(ztensor.FormatError):
            r.verify()


# ---- ONNX Constant nodes are weights too: listed, read and checked as initializers
# (Clean / Bounded / Contained: onnx_file.open_file through onnx_file._constant_tensor
# and onnx_file._check_initializer; subgraphs and functions: onnx_file._nested)


def _onnx(tmp_path, nodes, initializers=(), functions=(), name="m.onnx", output="y"):
    """The protobuf onnx.helper builds (onnx.save_model would move raw data out)."""
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    out = h.make_tensor_value_info(output, onnx.TensorProto.FLOAT, [1])
    graph = h.make_graph(nodes, "g", [], [out], initializer=list(initializers))
    model = h.make_model(graph, functions=list(functions))
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


def test_onnx_constant_nodes_are_read_with_their_values(tmp_path):
    """A Constant node's tensor was not listed at all: a model whose weights sit in
    Constant nodes opened with no tensors."""
    onnx = pytest.importorskip("onnx")
    h, numpy_helper = onnx.helper, onnx.numpy_helper
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    nodes = [
        h.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weight, "ignored")),
        h.make_node(
            "Constant", [], ["half"], value=numpy_helper.from_array(np.ones(3, np.float16))
        ),
        h.make_node("Constant", [], ["f"], value_float=2.5),
        h.make_node("Constant", [], ["fs"], value_floats=[1.0, -2.0]),
        h.make_node("Constant", [], ["i"], value_int=-7),
        h.make_node("Constant", [], ["is"], value_ints=[3, 1 << 40]),
        h.make_node("Constant", [], ["s"], value_string="text"),
        h.make_node("Constant", [], ["ss"], value_strings=["a", "b"]),
        h.make_node("MatMul", ["w", "w"], ["y"]),
    ]
    path = _onnx(tmp_path, nodes, [numpy_helper.from_array(np.zeros(2, np.int8), "init")])
    onnx.checker.check_model(onnx.load(path))  # a valid model
    with ztensor.Reader(path) as r:
        assert sorted(r.keys()) == ["f", "fs", "half", "i", "init", "is", "w"]
        np.testing.assert_array_equal(r.read_numpy("w"), weight)
        assert r.read_numpy("half").dtype == np.float16
        for key, want in [("f", np.float32(2.5)), ("i", np.int64(-7))]:
            got = r.read_numpy(key)
            assert got.shape == () and got.dtype == want.dtype and got == want
        assert r.read_numpy("fs").tolist() == [1.0, -2.0]
        assert r.read_numpy("fs").dtype == np.float32
        assert r.read_numpy("is").tolist() == [3, 1 << 40] and r.read_numpy("is").dtype == np.int64
        assert r.attributes["onnx.skipped_constants"] == ["s", "ss"]


def test_onnx_constant_values_agree_with_onnx_reference_evaluator(tmp_path):
    """What onnx itself computes for each Constant is what the Reader reads."""
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    h = onnx.helper
    nodes = [
        h.make_node("Constant", [], ["a"], value_floats=[0.5, 1.5]),
        h.make_node("Constant", [], ["b"], value_int=4),
        h.make_node("Cast", ["b"], ["bf"], to=onnx.TensorProto.FLOAT),
        h.make_node("Mul", ["a", "bf"], ["y"]),
    ]
    path = _onnx(tmp_path, nodes)
    a, b = ReferenceEvaluator(str(path)).run(["a", "b"], {})
    with ztensor.Reader(path) as r:
        for key, want in (("a", a), ("b", b)):
            got = r.read_numpy(key)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_onnx_constant_and_initializer_of_one_name_are_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    h, numpy_helper = onnx.helper, onnx.numpy_helper
    init = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    nodes = [h.make_node("Constant", [], ["w"], value_floats=[1.0], name="c")]
    path = _onnx(tmp_path, nodes, [init])
    with pytest.raises(
        ztensor.FormatError, match="'initializer 0' and \"Constant node 0 \\('c'\\)\""
    ):
        ztensor.Reader(path)
    two = [
        h.make_node("Constant", [], ["k"], value_int=1),
        h.make_node("Constant", [], ["k"], value_int=2),
    ]
    with pytest.raises(ztensor.FormatError, match="'k'") as err:
        ztensor.Reader(_onnx(tmp_path, two, name="two.onnx"))
    assert err.value.obj == "k"


def test_onnx_constant_above_the_limits_is_a_limit_error(tmp_path):
    onnx = pytest.importorskip("onnx")
    h, numpy_helper = onnx.helper, onnx.numpy_helper
    big = numpy_helper.from_array(np.ones(1024, np.float32))
    path = _onnx(tmp_path, [h.make_node("Constant", [], ["big"], value=big)])
    with pytest.raises(ztensor.LimitError, match="max_component_size") as err:
        ztensor.Reader(path, limits=ztensor.Limits(max_component_size=1000))
    assert err.value.obj == "big"
    floats = _onnx(
        tmp_path, [h.make_node("Constant", [], ["fs"], value_floats=[1.0] * 300)], name="f.onnx"
    )
    with pytest.raises(ztensor.LimitError, match="max_component_size"):
        ztensor.Reader(floats, limits=ztensor.Limits(max_component_size=1000))
    many = [h.make_node("Constant", [], [f"c{i}"], value_int=i) for i in range(5)]
    with pytest.raises(ztensor.LimitError, match="max_objects"):
        ztensor.Reader(
            _onnx(tmp_path, many, name="many.onnx"), limits=ztensor.Limits(max_objects=4)
        )


def test_onnx_constant_with_a_negative_dimension_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    tensor = onnx.TensorProto(data_type=onnx.TensorProto.FLOAT, dims=[-1], float_data=[1.0])
    path = _onnx(tmp_path, [onnx.helper.make_node("Constant", [], ["w"], value=tensor)])
    with pytest.raises(ztensor.FormatError) as err:
        ztensor.Reader(path)
    assert err.value.obj == "w"


def test_onnx_constant_external_data_must_sit_beside_the_model(tmp_path):
    """onnx resolves a Constant's external data as an initializer's (its loader walks
    node attributes too); a location outside the model's folder is refused by the
    same path, and one beside it reads."""
    onnx = pytest.importorskip("onnx")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes() * 2)

    def constant(location):
        tensor = onnx.TensorProto(data_type=onnx.TensorProto.FLOAT, dims=[4])
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "16"), ("length", "16")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return onnx.helper.make_node("Constant", [], ["w"], value=tensor)

    inside = _onnx(model_dir, [constant("w.bin")])
    with ztensor.Reader(inside) as r:
        assert r.read_numpy("w").tolist() == [0.0, 1.0, 2.0, 3.0]
    for location in ("../secret.bin", str(secret)):
        path = _onnx(model_dir, [constant(location)], name="out.onnx")
        with pytest.raises(ztensor.ZTensorError) as err:
            ztensor.Reader(path)
        assert err.value.obj == "w" and err.value.path == str(path)


@pytest.mark.parametrize(
    "node, match",
    [
        ("two values", "holds one of"),
        ("no value", "holds one of"),
        ("two outputs", "exactly one"),
        ("wrong type", "is of type FLOATS, not FLOAT"),
        ("unknown attribute", "holds one of"),
    ],
)
def test_onnx_constant_node_that_is_not_one_constant_is_refused(tmp_path, node, match):
    """onnx.checker refuses each (with shape inference: "One and only one of the
    attributes 'value', 'value_*' or 'sparse_value' must be specified").  The
    mistyped one: onnx's ReferenceEvaluator reads value_float typed FLOATS as the
    list [1., 2.] (by its type), a reader by its name as the scalar 1.0."""
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    made = {
        "two values": lambda: h.make_node("Constant", [], ["c"], value_float=1.0, value_int=2),
        "no value": lambda: h.make_node("Constant", [], ["c"]),
        "two outputs": lambda: h.make_node("Constant", [], ["c", "d"], value_int=2),
        "wrong type": lambda: h.make_node("Constant", [], ["c"], value_float=1.0),
        "unknown attribute": lambda: h.make_node("Constant", [], ["c"], alpha=1.0),
    }[node]()
    if node == "wrong type":  # value_float holding a list, typed FLOATS
        made.attribute[0].floats.extend([1.0, 2.0])
        made.attribute[0].type = onnx.AttributeProto.FLOATS
    path = _onnx(tmp_path, [made], output="c")
    good = h.make_node("Constant", [], ["c"], value_floats=[1.0])
    onnx.checker.check_model(onnx.load(_onnx(tmp_path, [good], name="ok.onnx", output="c")), True)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(onnx.load(path), full_check=True)
    with pytest.raises(ztensor.FormatError, match=match) as err:
        ztensor.Reader(path)
    assert err.value.path == str(path)


def test_onnx_constants_of_subgraphs_and_functions_are_listed(tmp_path):
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    out = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    branch = h.make_graph(
        [h.make_node("Constant", [], ["y"], value_floats=[5.0])], "then", [], [out]
    )
    other = h.make_graph(
        [h.make_node("Constant", [], ["y"], value_floats=[6.0])], "else", [], [out]
    )
    function = h.make_function(
        "local",
        "f",
        [],
        ["z"],
        [h.make_node("Constant", [], ["z"], value_float=3.0)],
        [h.make_opsetid("", 21)],
    )
    nodes = [
        h.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.array(True))),
        h.make_node("If", ["c"], ["y"], name="branch", then_branch=branch, else_branch=other),
        h.make_node("Constant", [], ["top"], value_floats=[1.0]),
    ]
    path = _onnx(tmp_path, nodes, functions=[function])
    with ztensor.Reader(path) as r:
        assert sorted(r.keys()) == ["c", "top"]
        assert sorted(r.attributes["onnx.skipped_subgraph_constants"]) == [
            "branch.else_branch/y",
            "branch.then_branch/y",
            "functions[0]:local.f/z",
        ]
        assert "onnx.skipped_subgraph_initializers" not in r.attributes
