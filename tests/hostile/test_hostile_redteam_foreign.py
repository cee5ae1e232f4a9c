"""Red-team variants of issue 21 for the other-format readers (round three): files
made by the real writers, then changed where a hostile author would.  Each test names
the promise of docs/threat-model.md it holds and the one function that keeps it."""

import json
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
import ztensor.numpy


def _read_all(path, **kwargs):
    with ztensor.Reader(path, **kwargs) as reader:
        return {k: reader.read(k).components["data"] for k in reader.keys()}, dict(
            reader.attributes
        )


def _refused(path, cls=ztensor.ZTensorError, **kwargs):
    with pytest.raises(cls) as info:
        _read_all(path, **kwargs)
    assert str(path) in str(info.value)
    return info.value


# ---- safetensors: a dtype that is not a string (Clean: safetensors_file._entry)


def _safetensors_with(tmp_path, change):
    sf = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "m.safetensors"
    sf.save_file({"w": np.arange(4, dtype=np.float32)}, path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return path


@pytest.mark.parametrize("dtype", [["F32"], {"F32": 1}])
def test_safetensors_dtype_of_another_json_type_is_refused(tmp_path, dtype):
    # was a TypeError (unhashable type) from the dtype table lookup
    path = _safetensors_with(tmp_path, lambda h: h["w"].__setitem__("dtype", dtype))
    _refused(path)


@pytest.mark.parametrize("metadata", [[], False, "", 0])
def test_safetensors_metadata_that_is_not_an_object_is_refused(tmp_path, metadata):
    # `... or {}` turned these into "no metadata" without a word; only null means none
    path = _safetensors_with(tmp_path, lambda h: h.__setitem__("__metadata__", metadata))
    _refused(path, ztensor.FormatError)


def test_safetensors_null_metadata_reads(tmp_path):
    path = _safetensors_with(tmp_path, lambda h: h.__setitem__("__metadata__", None))
    arrays, _ = _read_all(path)
    assert arrays["w"].tolist() == [0, 1, 2, 3]


# ---- npy / npz: negative dimensions (Bounded + Clean: objects.shape_problem)


def _npy_bytes(shape, data, header=None):
    import io

    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, header or {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    return out.getvalue() + data


@pytest.mark.parametrize("shape", [(-1,), (-2, -3), (-1, 2), (3, -2)])
@pytest.mark.parametrize("kind", ["npy", "npz-stored", "npz-deflated"])
def test_npy_negative_dimension_is_refused(tmp_path, shape, kind):
    # numpy reads -1 as "whatever is left": an npz member came back as an array of
    # another shape than its spec, and (-2, -3) was a bare ValueError from reshape
    member = _npy_bytes(shape, np.arange(6, dtype="<f4").tobytes())
    if kind == "npy":
        path = tmp_path / "a.npy"
        path.write_bytes(member)
    else:
        path = tmp_path / "a.npz"
        method = zipfile.ZIP_STORED if kind == "npz-stored" else zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(path, "w", method) as z:
            z.writestr("a.npy", member)
    error = _refused(path, ztensor.FormatError)
    assert "negative" in str(error)
    with pytest.raises(ztensor.ZTensorError):
        ztensor.numpy.load_file(path)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=4).filter(
        lambda s: any(d < 0 for d in s)
    )
)
def test_npz_any_negative_dimension_is_a_ztensor_error(tmp_path_factory, shape):
    path = tmp_path_factory.mktemp("neg") / "a.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", _npy_bytes(tuple(shape), b"\x00" * 64))
    with pytest.raises(ztensor.ZTensorError):
        _read_all(path)


# ---- npy: the header dict and its version (Clean: numpy_files._read_header)


def test_npy_header_giving_a_key_twice_is_refused(tmp_path):
    # numpy keeps the last 'descr' (float64 here); a reader keeping the first reads
    # float32: the same bytes, two different tensors
    path = tmp_path / "a.npy"
    np.save(path, np.arange(4, dtype="<f8"))
    raw = path.read_bytes()
    old = b"'descr': '<f8', "
    assert old in raw
    new = b"'descr': '<f4', 'descr': '<f8', "
    header_len = struct.unpack("<H", raw[8:10])[0]
    header = raw[10 : 10 + header_len].replace(old, new)
    header = header.rstrip(b"\n ")
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    path.write_bytes(raw[:8] + struct.pack("<H", len(header)) + header + raw[10 + header_len :])
    assert np.load(path).dtype == np.dtype("<f8")  # numpy reads it: the last wins (any host)
    error = _refused(path, ztensor.FormatError)
    assert "'descr' twice" in str(error)


def test_npy_unknown_format_version_is_refused(tmp_path):
    # numpy's header-2.0 reader took any version; np.load refuses all but 1, 2, 3
    path = tmp_path / "a.npy"
    np.save(path, np.arange(4, dtype="<f4"))
    raw = bytearray(path.read_bytes())
    raw[6:8] = b"\x09\x00"
    path.write_bytes(bytes(raw))
    assert "9.0" in str(_refused(path, ztensor.FormatError))


def test_npy_versions_numpy_writes_still_read(tmp_path):
    for version in [(1, 0), (2, 0), (3, 0)]:
        path = tmp_path / f"v{version[0]}.npy"
        arr = np.arange(6, dtype="<f4").reshape(2, 3)
        with open(path, "wb") as f:
            np.lib.format.write_array(f, arr, version=version)
        arrays, _ = _read_all(path)
        assert arrays[path.stem].tolist() == arr.tolist()


# ---- GGUF: an unknown type's shape (Bounded: gguf_file._tensor_info)


def _gguf_unknown_type(path, dims):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raw = bytearray(path.read_bytes())
    # the tensor info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64)
    at = raw.index(b"\x01\x00\x00\x00\x00\x00\x00\x00t") + 9
    assert struct.unpack_from("<I", raw, at)[0] == 1
    info = struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    info += struct.pack("<I", 99)  # a ggml type no version knows
    end = at + 4 + 8 + 4
    raw[at:end] = info
    path.write_bytes(bytes(raw))


def test_gguf_unknown_type_with_a_shape_no_tensor_has_is_refused(tmp_path):
    # each dimension was held below 2**63, their product not: a 16-byte tensor of
    # 2**186 elements became a .zt object
    path = tmp_path / "m.gguf"
    _gguf_unknown_type(path, [2**62, 2**62, 2**62])
    error = _refused(path, ztensor.FormatError)
    assert "too large" in str(error)


def test_gguf_unknown_type_with_a_plain_shape_is_kept(tmp_path):
    path = tmp_path / "m.gguf"
    _gguf_unknown_type(path, [4])
    with pytest.warns(UserWarning, match="ggml type 99"):
        with ztensor.Reader(path) as reader:
            t = reader.read("t")
    assert t.shape == (4,) and t.format == "gguf_blocks"


# ---- ONNX (onnx_file._check_initializer)


def _onnx_model(tmp_path, initializers, sparse=()):
    onnx = pytest.importorskip("onnx")
    graph = onnx.helper.make_graph(
        [], "g", [], [], initializer=list(initializers), sparse_initializer=list(sparse)
    )
    path = tmp_path / "m.onnx"
    # the protobuf as built: onnx.save_model would move raw_data into external files
    path.write_bytes(onnx.helper.make_model(graph).SerializeToString())
    return path


def test_onnx_sparse_initializer_is_listed_not_dropped(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0], np.float32), "s"),
        numpy_helper.from_array(np.array([1], np.int64), "s_indices"),
        [4],
    )
    dense = numpy_helper.from_array(np.arange(2, dtype=np.float32), "d")
    path = _onnx_model(tmp_path, [dense], [sparse])
    assert len(onnx.load(path).graph.sparse_initializer) == 1
    arrays, attributes = _read_all(path)
    assert list(arrays) == ["d"]
    assert attributes["onnx.skipped_sparse_initializers"] == ["s"]


def test_onnx_sparse_and_dense_initializer_of_one_name_are_refused(tmp_path):
    pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0], np.float32), "w"),
        numpy_helper.from_array(np.array([1], np.int64), "w_indices"),
        [4],
    )
    path = _onnx_model(tmp_path, [numpy_helper.from_array(np.ones(4, np.float32), "w")], [sparse])
    assert "'w'" in str(_refused(path, ztensor.FormatError))


def test_onnx_values_in_two_places_are_refused(tmp_path):
    # onnx reads raw_data and ignores float_data: another runtime may not
    pytest.importorskip("onnx")
    from onnx import numpy_helper

    tensor = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    tensor.float_data.extend([9.0] * 4)
    path = _onnx_model(tmp_path, [tensor])
    assert "float_data" in str(_refused(path, ztensor.FormatError))


def test_onnx_values_in_another_types_field_are_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    tensor = onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.int64_data.extend([7, 8])
    del tensor.float_data[:]
    path = _onnx_model(tmp_path, [tensor])
    assert "int64_data" in str(_refused(path, ztensor.FormatError))


@pytest.mark.parametrize(
    "type_name, values",
    [("INT8", [300, -300]), ("UINT8", [256]), ("BOOL", [2, 7]), ("INT16", [1 << 15])],
)
def test_onnx_typed_values_that_do_not_fit_the_type_are_refused(tmp_path, type_name, values):
    # onnx narrows int32_data to the element type: int8 300 became 44, bool 2 a
    # numpy bool whose byte is 2
    onnx = pytest.importorskip("onnx")
    tensor = onnx.TensorProto(name="w", data_type=getattr(onnx.TensorProto, type_name))
    tensor.dims.append(len(values))
    tensor.int32_data.extend(values)
    path = _onnx_model(tmp_path, [tensor])
    assert "outside" in str(_refused(path, ztensor.FormatError))


def test_onnx_typed_values_that_fit_read_as_written(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    path = _onnx_model(
        tmp_path,
        [
            helper.make_tensor("i8", TensorProto.INT8, [2], [-128, 127]),
            helper.make_tensor("b", TensorProto.BOOL, [2], [True, False]),
            helper.make_tensor("h", TensorProto.FLOAT16, [2], np.array([1, -2], np.float16)),
            helper.make_tensor("u32", TensorProto.UINT32, [1], [2**32 - 1]),
        ],
    )
    arrays, _ = _read_all(path)
    assert arrays["i8"].tolist() == [-128, 127]
    assert arrays["b"].tolist() == [True, False]
    assert arrays["h"].tolist() == [1.0, -2.0]
    assert arrays["u32"].tolist() == [2**32 - 1]


def test_onnx_negative_dimension_is_refused(tmp_path):
    # numpy's reshape read -1 as "whatever is left": dims [-1] came back as shape (2,)
    onnx = pytest.importorskip("onnx")
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[-1])
    tensor.raw_data = np.zeros(2, np.float32).tobytes()
    path = _onnx_model(tmp_path, [tensor])
    assert "negative" in str(_refused(path, ztensor.FormatError))


def test_onnx_initializer_above_max_component_size_is_a_limit_error(tmp_path):
    # the Limits a Reader is given applied to ONNX's rank and count only
    pytest.importorskip("onnx")
    from onnx import numpy_helper

    path = _onnx_model(tmp_path, [numpy_helper.from_array(np.ones(1024, np.float32), "w")])
    _refused(path, ztensor.LimitError, limits=ztensor.Limits(max_component_size=1024))
    arrays, _ = _read_all(path, limits=ztensor.Limits(max_component_size=4096))
    assert arrays["w"].shape == (1024,)


def test_onnx_raw_data_beside_external_data_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    tensor = numpy_helper.from_array(np.full(4, 7, np.float32), "w")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "w.bin"
    path = _onnx_model(tmp_path, [tensor])
    assert "external data" in str(_refused(path, ztensor.FormatError))


def test_onnx_external_data_beside_the_model_still_reads(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        [], "g", [], [], initializer=[numpy_helper.from_array(np.arange(64, dtype=np.float32), "w")]
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(
        helper.make_model(graph),
        path,
        save_as_external_data=True,
        location="w.data",
        size_threshold=0,
    )
    arrays, _ = _read_all(path)
    assert arrays["w"].tolist() == list(range(64))


# ---- HDF5: datasets that hold no tensor are said, not dropped (hdf5_file._entries)


def test_hdf5_datasets_of_other_types_are_listed(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f["ok"] = np.arange(2.0)
        f["g/cmp"] = np.zeros(2, dtype=[("x", "f4"), ("y", "i4")])
        f["s"] = b"hello"
        f["ld"] = np.arange(3, dtype=np.longdouble)
        f.attrs["skipped_datasets"] = "the file's own attribute"
    arrays, attributes = _read_all(path)
    assert list(arrays) == ["ok"]
    assert sorted(attributes["hdf5_skipped_datasets"]) == ["/g/cmp", "/ld", "/s"]
    assert attributes["hdf5.skipped_datasets"] == "the file's own attribute"


# ---- PyTorch pickles (pytorch._check_key, pytorch._show)


def _checkpoint(path, obj):
    torch = pytest.importorskip("torch")
    torch.save(obj, path)


def test_pickle_integer_key_with_no_decimal_form_is_refused(tmp_path):
    # a tensor under the key 10**5000: str() of its name was a bare ValueError (int
    # string conversion limit), raised from ztensor.Reader and every command
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.pt"
    _checkpoint(path, {10**5000: torch.ones(2)})
    assert "bits" in str(_refused(path, ztensor.FormatError))
    done = subprocess.run(
        [sys.executable, "-m", "ztensor", "ls", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_pickle_integer_values_of_any_size_stay_attributes(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.pt"
    _checkpoint(path, {"w": torch.ones(2), "n": 10**5000, 7: torch.zeros(1)})
    arrays, attributes = _read_all(path)
    assert sorted(arrays) == ["7", "w"]
    assert attributes["pickle.n"] == 10**5000


def test_pickle_huge_geometry_is_shown_not_raised(tmp_path):
    # the message about a malformed offset repr()'d it: an int of 5000 digits made
    # the FormatError's own text a ValueError
    torch = pytest.importorskip("torch")
    import pickletools

    path = tmp_path / "m.pt"
    _checkpoint(path, {"w": torch.ones(2)})
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in members if n.endswith("/data.pkl"))
    ops = list(pickletools.genops(members[pkl]))
    # the storage offset is the first integer after the persistent id
    at = next(pos for op, arg, pos in ops if op.name == "BINPERSID")
    offset_op = next((op, pos) for op, arg, pos in ops if pos > at and op.name.startswith("BININT"))
    op, pos = offset_op
    width = {"BININT1": 1, "BININT2": 2, "BININT": 4}[op.name]
    big = (10**5000).to_bytes(((10**5000).bit_length() + 8) // 8, "little")
    raw = members[pkl]
    members[pkl] = raw[:pos] + b"\x8b" + struct.pack("<I", len(big)) + big + raw[pos + 1 + width :]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    error = _refused(path, ztensor.FormatError)
    assert "too large to show" in str(error)


def test_legacy_torch_file_under_any_name_is_said_to_be_one(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "weights.model"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    error = _refused(path, ztensor.UnsupportedError)
    assert "legacy" in str(error)
