"""Drop-in for safetensors users: ztensor.numpy, ztensor.torch, ztensor.safe_open."""
import numpy as np
import pytest

import ztensor
from conftest import asymmetric
from ztensor import numpy as znp


def test_numpy_save_load_file_and_metadata(tmp_path):
    tensors = {"a": asymmetric((3, 4), "<f4"), "b": asymmetric((5,), ">i8"), "s": np.array(2.5)}
    znp.save_file(tensors, tmp_path / "m.zt", metadata={"format": "np", "step": "7"},
                  compression=True, checksum="crc32c")
    back = znp.load_file(tmp_path / "m.zt")
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v)
    with ztensor.safe_open(tmp_path / "m.zt", framework="np") as f:
        assert f.metadata() == {"format": "np", "step": "7"}
    with pytest.raises(ValueError, match="str to str"):
        znp.save_file(tensors, tmp_path / "x.zt", metadata={"step": 7})


def test_numpy_save_load_bytes():
    data = znp.save({"x": np.arange(6, dtype=np.int16).reshape(2, 3)}, {"k": "v"})
    assert data[:8] == b"ZTEN1000"
    back = znp.load(data)
    assert back["x"].tolist() == [[0, 1, 2], [3, 4, 5]] and back["x"].flags.writeable


def test_safe_open_slices_and_dtypes(tmp_path):
    w = asymmetric((100, 8), "<f4")
    znp.save_file({"w": w, "h": np.ones(3, np.float16)}, tmp_path / "s.zt")
    with ztensor.safe_open(tmp_path / "s.zt", framework="numpy") as f:
        assert f.keys() == ["h", "w"] and f.metadata() is None
        sl = f.get_slice("w")
        assert sl.get_shape() == [100, 8] and sl.get_dtype() == "F32"
        np.testing.assert_array_equal(sl[10:20], w[10:20])
        np.testing.assert_array_equal(sl[:, 3], w[:, 3])
        assert f.get_slice("h").get_dtype() == "F16"
        np.testing.assert_array_equal(f.get_tensor("w"), w)
    with pytest.raises(ValueError, match="framework"):
        ztensor.safe_open(tmp_path / "s.zt", framework="jax")


torch = pytest.importorskip("torch")
from ztensor import torch as zt  # noqa: E402


def test_torch_round_trip_every_dtype(tmp_path):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 5, generator=g) * 3
    tensors = {
        "f64": base.double(), "f32": base, "f16": base.half(), "bf16": base.bfloat16(),
        "c64": torch.complex(base, -base), "i64": (base * 100).long(), "i32": (base * 9).int(),
        "i16": (base * 9).short(), "i8": (base * 9).char(), "u8": (base * 9).abs().byte(),
        "bool": base > 0, "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3),
        "e4m3": base.to(torch.float8_e4m3fn), "e5m2": base.to(torch.float8_e5m2),
    }
    zt.save_file(tensors, tmp_path / "t.zt", metadata={"framework": "pt"})
    back = zt.load_file(tmp_path / "t.zt")
    def bits(t):  # float8 has no torch.equal; compare its bytes
        return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(bits(back[k]), bits(v)), k
    with ztensor.Reader(tmp_path / "t.zt") as r:
        assert (r.metadata("bf16").storage_dtype, r.metadata("e4m3").type) == ("bf16", "f8_e4m3fn")


def test_torch_zero_copy_load_is_copy_on_write(tmp_path):
    zt.save_file({"w": torch.arange(10, dtype=torch.float32)}, tmp_path / "w.zt")
    before = (tmp_path / "w.zt").read_bytes()
    w = zt.load_file(tmp_path / "w.zt")["w"]
    w += 1                                      # private pages: allowed, file untouched
    assert w[0].item() == 1.0
    assert (tmp_path / "w.zt").read_bytes() == before
    assert zt.load_file(tmp_path / "w.zt")["w"][0].item() == 0.0


def test_torch_shared_memory_is_refused_like_safetensors(tmp_path):
    a = torch.zeros(10)
    with pytest.raises(RuntimeError, match="share memory"):
        zt.save_file({"a": a, "b": a[2:5]}, tmp_path / "s.zt")
    zt.save_file({"a": a, "b": a[2:5].clone()}, tmp_path / "s.zt")   # the usual fix


def test_torch_bytes_and_safe_open(tmp_path):
    data = zt.save({"x": torch.arange(6).reshape(2, 3).bfloat16()})
    back = zt.load(data)["x"]
    assert back.dtype == torch.bfloat16 and back.tolist() == [[0, 1, 2], [3, 4, 5]]
    (tmp_path / "b.zt").write_bytes(data)
    with ztensor.safe_open(tmp_path / "b.zt", framework="pt") as f:
        assert f.get_tensor("x").dtype == torch.bfloat16
        part = f.get_slice("x")[1:]
        assert part.dtype == torch.bfloat16 and part.tolist() == [[3, 4, 5]]
        assert f.get_slice("x").get_dtype() == "BF16"


# ------------------------------------------------------------------ safetensors parity
def test_save_model_dedupes_tied_weights_and_load_model_restores_them(tmp_path):
    torch = pytest.importorskip("torch")
    from ztensor.torch import load_model, save_model

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight          # tied

    model = Tied()
    path = tmp_path / "tied.zt"
    save_model(model, path)
    with ztensor.Reader(path) as r:
        assert sorted(r.keys()) == ["emb.weight"]       # one copy on disk
        assert r.attributes == {"head.weight": "emb.weight"}
    fresh = Tied()
    missing, unexpected = load_model(fresh, path)
    assert missing == [] and unexpected == []
    assert torch.equal(fresh.head.weight, model.emb.weight)

    class Untied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.extra = torch.nn.Linear(2, 2)

    with pytest.raises(RuntimeError, match="Missing key"):
        load_model(Untied(), path)
    missing, unexpected = load_model(Untied(), path, strict=False)
    assert "extra.weight" in missing


def test_storage_helpers_and_shared_detection():
    torch = pytest.importorskip("torch")
    from ztensor.torch import (_end_ptr, _find_shared_tensors, _is_complete,
                               _remove_duplicate_names, storage_ptr, storage_size)
    a = torch.zeros(10)
    head, tail = a[:4], a[4:]
    assert storage_ptr(head) == storage_ptr(a) and storage_size(tail) == 40
    assert _end_ptr(head) == head.data_ptr() + 16 and _is_complete(a)
    assert not _is_complete(head)
    # disjoint views of one storage are not shared; overlapping ones are
    assert _find_shared_tensors({"h": head, "t": tail}) == [{"h"}, {"t"}]
    assert _find_shared_tensors({"a": a, "h": head}) == [{"a", "h"}]
    assert _remove_duplicate_names({"a": a, "h": head}) == {"a": ["h"]}
    with pytest.raises(RuntimeError, match="no suitable name"):
        _remove_duplicate_names({"h": head})


def test_save_file_checks_its_argument(tmp_path):
    torch = pytest.importorskip("torch")
    from ztensor.torch import load_file, save_file
    with pytest.raises(ValueError, match="Expected a dict"):
        save_file([torch.zeros(2)], tmp_path / "x.zt")
    with pytest.raises(ValueError, match="sparse"):
        save_file({"s": torch.eye(3).to_sparse()}, tmp_path / "x.zt")
    a = torch.arange(10.0)
    with pytest.raises(ValueError, match="share memory") as exc:
        save_file({"a": a, "b": a[2:5]}, tmp_path / "x.zt")
    assert isinstance(exc.value, RuntimeError)          # safetensors' type too
    save_file({"h": a[:5], "t": a[5:]}, tmp_path / "d.zt")  # disjoint views: fine
    back = load_file(tmp_path / "d.zt")
    assert back["t"].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    nc = torch.arange(12.0).reshape(3, 4).t()            # stored (safetensors refuses)
    save_file({"nc": nc}, tmp_path / "nc.zt")
    assert torch.equal(load_file(tmp_path / "nc.zt")["nc"], nc)


def test_serialize_deserialize_round_trip():
    data = {"a": {"dtype": "float32", "shape": [2, 2],
                  "data": np.arange(4, dtype="<f4").tobytes()},
            "b": {"dtype": "BF16", "shape": [3], "data": bytes(6)}}
    blob = ztensor.serialize(data, metadata={"k": "v"})
    out = dict(ztensor.deserialize(blob))
    # as safetensors' deserialize gives them: its dtype names, the bytes a bytearray
    assert out["a"] == {**data["a"], "dtype": "F32"} and out["b"]["dtype"] == "BF16"
    assert out["b"]["shape"] == [3] and out["b"]["data"] == bytes(6)
    assert type(out["b"]["data"]) is bytearray
    assert dict(ztensor.deserialize(ztensor.serialize(out))) == out  # and back
    st = pytest.importorskip("safetensors")
    import safetensors.numpy
    raw = safetensors.numpy.save({"f": np.arange(3, dtype="f4"), "m": np.array([True]),
                                  "c": np.array([1j], dtype="c8"), "u": np.ones(2, "u2")})
    assert sorted(st.deserialize(raw)) == sorted(ztensor.deserialize(raw))
    with pytest.raises(ztensor.SafetensorError):
        ztensor.serialize({"x": {"dtype": "float32", "shape": [1]}})
    with pytest.raises(ztensor.SafetensorError):
        ztensor.serialize({"x": {"dtype": "float32", "shape": [2], "data": bytes(4)}})


def test_safe_open_slices_errors_and_lifetime(tmp_path):
    path = tmp_path / "s.zt"
    a = np.arange(50, dtype=np.float32).reshape(10, 5)
    with ztensor.Writer(path) as w:
        w.write_numpy("a", a)
    with ztensor.safe_open(path, framework="np") as f:
        s = f.get_slice("a")
        np.testing.assert_array_equal(s[2:, -1], a[2:, -1])
        assert s[3].shape == (5,) and s[tuple()].shape == (10, 5) and s[[]].shape == (0, 5)
        np.testing.assert_array_equal(s[..., 1:3], a[:, 1:3])
        np.testing.assert_array_equal(s[::3], a[::3])
        for index, words in (((slice(2, None), -6), "Invalid index -6 for dimension 1 of size 5"),
                             (([0, 1],), "Non empty lists are not implemented"),
                             ((slice(None, 20),), "index 19 out of bounds for tensor "
                                                  "dimension #0 of size 10"),
                             ((slice(None, None, -1),), "step -1"),
                             ((0, 0, 0), "too many indices")):
            with pytest.raises(ztensor.SafetensorError) as exc:
                s[index]
            assert words in str(exc.value) and exc.value.obj == "a"
        assert f.offset_keys() == ["a"]
    with pytest.raises(ztensor.SafetensorError):
        f.keys()
    with pytest.raises(FileNotFoundError, match="missing.zt"):
        ztensor.safe_open(tmp_path / "missing.zt", framework="np")


def test_quantized_objects_in_the_safetensors_style_loaders(tmp_path):
    """A GPTQ model in .zt loads the way people load models: under GPTQ checkpoint
    names that GPTQ loaders take, or dequantized on request."""
    from ztensor.formats import quantized
    from ztensor.numpy import load_file
    w = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    q = ztensor.quantize(w, bits=4, group_size=128)
    path = tmp_path / "gptq.zt"
    with ztensor.Writer(path) as out:
        out.write("layer.q_proj.weight", q)
        out.write_numpy("layer.norm.weight", np.ones(64, np.float32))
    flat = load_file(path)
    assert set(flat) == {"layer.q_proj.qweight", "layer.q_proj.qzeros", "layer.q_proj.scales",
                         "layer.q_proj.g_idx", "layer.norm.weight"}
    assert flat["layer.q_proj.qweight"].dtype == np.int32
    direct = ztensor.dequantize(q, dtype=np.float32)
    via_gptq = ztensor.dequantize({k.split(".")[-1]: v for k, v in flat.items()
                                   if k.startswith("layer.q_proj.")}, bits=4,
                                  group_size=128, checkpoint_format="gptq", dtype=np.float32)
    np.testing.assert_array_equal(via_gptq, direct)            # what a GPTQ loader computes
    assert quantized.to_gptq(q)["qzeros"].shape == (2, 64 * 4 // 32)
    deq = load_file(path, dequantize=True)
    np.testing.assert_array_equal(deq["layer.q_proj.weight"], direct.astype(np.float16))
    with ztensor.safe_open(path, framework="np") as f:
        assert "layer.q_proj.scales" in f.keys()
        np.testing.assert_array_equal(f.get_tensor("layer.q_proj.g_idx"),
                                      np.arange(256) // 128)
        assert f.get_tensor("layer.q_proj.weight").shape == (64, 256)
    torch = pytest.importorskip("torch")
    from ztensor.torch import load_file as load_pt
    pt = load_pt(path)
    assert pt["layer.q_proj.qweight"].dtype == torch.int32
    assert load_pt(path, dequantize=True)["layer.q_proj.weight"].dtype == torch.float16


@pytest.mark.parametrize("index", [3, -1, (1, 2), (1,), slice(1, 2), (slice(None), 0)])
def test_pt_slice_shapes_match_safetensors(tmp_path, index):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open as st_open
    tensors = {"v": torch.arange(10, dtype=torch.float32),
               "m": torch.arange(12, dtype=torch.float32).reshape(3, 4),
               "b": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)}
    st_torch.save_file(tensors, str(tmp_path / "a.safetensors"))
    ztensor.torch.save_file(tensors, str(tmp_path / "a.zt"))
    with st_open(str(tmp_path / "a.safetensors"), framework="pt") as theirs, \
            ztensor.safe_open(str(tmp_path / "a.zt"), framework="pt") as ours:
        for name in tensors:
            if isinstance(index, tuple) and len(index) > tensors[name].dim():
                continue
            try:
                a = theirs.get_slice(name)[index]
            except Exception:  # out of bounds for this tensor: ours refuses too
                with pytest.raises(IndexError):
                    ours.get_slice(name)[index]
                continue
            b = ours.get_slice(name)[index]
            assert a.shape == b.shape and a.dtype == b.dtype, (name, index)
            assert torch.equal(a, b)


def test_slices_of_zstd_decode_once_and_convert_only_the_selection(tmp_path, monkeypatch):
    from ztensor import dtypes
    from ztensor.io import components
    data = np.random.default_rng(2).standard_normal((400, 64)).astype(np.float32)
    with ztensor.Writer(tmp_path / "z.zt") as w:
        w.write_numpy("z", data, compress=True)
        w.write_numpy("b", data, type="bf16")
    decodes = []
    real = components.read_component
    monkeypatch.setattr(components, "read_component",
                        lambda *a, **k: decodes.append(1) or real(*a, **k))
    with ztensor.safe_open(tmp_path / "z.zt", framework="np") as f:
        for i in range(20):
            np.testing.assert_array_equal(f.get_slice("z")[i * 8:(i + 1) * 8], data[i * 8:(i + 1) * 8])
        assert len(decodes) == 1
        # bf16 without ml_dtypes: the slice alone is decoded, to float32
        monkeypatch.setenv("ZTENSOR_NO_ML_DTYPES", "1")
        dtypes.ml_dtypes_module.cache_clear()
        try:
            converted = []
            from ztensor.io import floats as floatconv
            real_bf16 = floatconv.bf16_to_float32
            monkeypatch.setattr(floatconv, "bf16_to_float32",
                                lambda a: converted.append(a.size) or real_bf16(a))
            part = f.get_slice("b")[10:12, :5]
        finally:
            monkeypatch.delenv("ZTENSOR_NO_ML_DTYPES")
            dtypes.ml_dtypes_module.cache_clear()
    assert part.dtype == np.float32 and part.shape == (2, 5) and converted == [10]
    np.testing.assert_allclose(part, data[10:12, :5], rtol=1e-2)  # bf16's precision


def test_torch_load_file_copy_reads_in_one_batch(tmp_path):
    torch = pytest.importorskip("torch")
    tensors = {"a": torch.arange(10, dtype=torch.float32),
               "b": torch.ones(3, dtype=torch.bfloat16),
               "c": torch.zeros(2, 2, dtype=torch.int64),
               "u": torch.arange(3, dtype=torch.uint8),
               "bo": torch.tensor([True, False])}
    ztensor.torch.save_file(tensors, str(tmp_path / "t.zt"))
    for threads in (1, 2):
        out = ztensor.torch.load_file(str(tmp_path / "t.zt"), copy=True, threads=threads)
        for name, t in tensors.items():
            assert out[name].dtype == t.dtype and torch.equal(out[name], t), name
        out["a"][0] = 100  # owned memory: the file and the next load are untouched
    again = ztensor.torch.load_file(str(tmp_path / "t.zt"), copy=True)
    assert again["a"][0] == 0


# ------------------------------------------------------------------ safetensors 0.8's calls
def test_get_tensors_is_every_get_tensor_in_the_order_of_the_bytes(tmp_path):
    """safe_open.get_tensors (safetensors 0.8): a dict of every tensor keys() lists,
    in offset order, as safetensors' own gives it."""
    st = pytest.importorskip("safetensors.numpy")
    from safetensors import safe_open as st_open
    tensors = {"z": np.arange(3.0), "a": np.ones((2, 2), np.float16), "m": np.array([7], np.int8)}
    path = str(tmp_path / "m.safetensors")
    st.save_file(tensors, path)
    with st_open(path, framework="np") as theirs, ztensor.safe_open(path, framework="np") as ours:
        if not hasattr(theirs, "get_tensors"):
            pytest.skip("this safetensors has no get_tensors (0.8 added it)")
        want, got = theirs.get_tensors(), ours.get_tensors()
        assert list(got) == list(want) == ours.offset_keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_array_equal(got[name], ours.get_tensor(name))


def test_tensor_spec_serializes_the_memory_it_points_to(tmp_path):
    a = np.random.default_rng(1).standard_normal((20, 30)).astype(np.float32)
    b = np.arange(5, dtype=np.int8)
    specs = {"a": ztensor.TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data,
                                     data_len=a.nbytes),
             "b": ztensor.TensorSpec(dtype="int8", shape=b.shape, data_ptr=b.ctypes.data,
                                                data_len=b.nbytes),
             "e": ztensor.TensorSpec(dtype="float32", shape=[0, 3], data_ptr=0, data_len=0)}
    got = dict(ztensor.deserialize(ztensor.serialize(specs)))
    np.testing.assert_array_equal(np.frombuffer(got["a"]["data"], np.float32).reshape(20, 30), a)
    assert got["b"] == {"dtype": "I8", "shape": [5], "data": bytes(range(5))}
    assert got["e"]["shape"] == [0, 3] and got["e"]["data"] == b""
    ztensor.serialize_file(specs, str(tmp_path / "s.zt"))
    with ztensor.safe_open(str(tmp_path / "s.zt"), framework="np") as f:
        np.testing.assert_array_equal(f.get_tensor("a"), a)
    with pytest.raises(ztensor.SafetensorError, match="nonsense"):
        ztensor.TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0)
    # torch's names only, as safetensors 0.8: its file names are refused, the torch
    # name said
    with pytest.raises(ztensor.SafetensorError, match="'int8'"):
        ztensor.TensorSpec(dtype="I8", shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(TypeError, match="'dtype'"):
        ztensor.TensorSpec(dtype=3, shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(TypeError):  # safetensors 0.8: a raw address is a TensorSpec's
        ztensor.serialize({"t": {"dtype": "float32", "shape": [1], "data_ptr": 0, "data_len": 0}})
    with pytest.raises(ztensor.FormatError, match="needs 12"):
        ztensor.serialize({"t": ztensor.TensorSpec(dtype="float32", shape=[3], data_ptr=a.ctypes.data,
                                                  data_len=8)})
    # numpy integers are taken, as safetensors takes them; a length past any address
    # is a ValueError when made, and a FormatError when changed afterwards: no
    # memory is looked at for a length the shape does not need
    spec = ztensor.TensorSpec(dtype="int8", shape=[np.int64(5)], data_ptr=np.uint64(b.ctypes.data),
                              data_len=np.int64(5))
    assert dict(ztensor.deserialize(ztensor.serialize({"b": spec})))["b"]["data"] == b.tobytes()
    with pytest.raises(ValueError):
        ztensor.TensorSpec(dtype="float32", shape=[3], data_ptr=a.ctypes.data, data_len=2**64)
    spec.data_len = 2**62
    with pytest.raises(ztensor.FormatError, match="needs 5"):
        ztensor.serialize({"b": spec})


@pytest.mark.parametrize("kind", ["float8_e4m3fnuz", "float8_e5m2fnuz"])
def test_fnuz_safetensors_files_read_and_export(tmp_path, kind):
    """safetensors 0.8 writes F8_E4M3FNUZ / F8_E5M2FNUZ: read and exported as it
    writes them (they were refused)."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    import ztensor.torch as zt
    x = torch.tensor([0.5, -1.0, 2.0, 0.0]).to(getattr(torch, kind))
    path = str(tmp_path / "f.safetensors")
    try:
        st.save_file({"x": x}, path)
    except Exception:
        pytest.skip("this safetensors cannot write FNUZ types")
    got = zt.load_file(path)["x"]
    assert got.dtype == x.dtype and torch.equal(got.view(torch.uint8), x.view(torch.uint8))
    ztensor.convert(path, str(tmp_path / "f.zt"))
    ztensor.convert(str(tmp_path / "f.zt"), str(tmp_path / "g.safetensors"))
    back = st.load_file(str(tmp_path / "g.safetensors"))["x"]
    assert back.dtype == x.dtype and torch.equal(back.view(torch.uint8), x.view(torch.uint8))


def test_a_meta_tensor_is_refused_as_safetensors_refuses_it(tmp_path):
    """safetensors' own test_meta_tensor: saving a meta tensor raises RuntimeError
    (torch's "Cannot copy out of meta tensor"); ours is an UnsupportedError, which
    is a RuntimeError too (errors.UnsupportedError), naming the file and tensor."""
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt
    path = tmp_path / "m.zt"
    with pytest.raises(RuntimeError) as info:
        zt.save_file({"a": torch.zeros(2, device="meta")}, path)
    assert isinstance(info.value, ztensor.UnsupportedError)
    assert "'a'" in str(info.value) and "m.zt" in str(info.value)
    assert not path.exists()


def test_tensor_spec_is_made_as_safetensors_makes_it():
    """safetensors 0.8's TensorSpec takes keywords only and torch's dtype names, and
    reports safetensors' name (``float32`` -> ``F32``); ours does the same (and, as
    there, refuses safetensors' own names), and says float4 and float8_e8m0 are not in zTensor's
    dtype table rather than that they are unknown."""
    a = np.arange(6, dtype=np.float32)
    fields = dict(shape=[6], data_ptr=a.ctypes.data, data_len=24)
    with pytest.raises(TypeError):
        ztensor.TensorSpec("float32", [6], a.ctypes.data, 24)
    for name, code in [("float32", "F32"), ("bfloat16", "BF16"), ("int8", "I8"),
                       ("float8_e4m3fn", "F8_E4M3"), ("bool", "BOOL"), ("float16", "F16")]:
        assert ztensor.TensorSpec(dtype=name, **fields).dtype == code
    with pytest.raises(ztensor.SafetensorError, match="'float16'"):
        ztensor.TensorSpec(dtype="F16", **fields)
    st = pytest.importorskip("safetensors")
    if hasattr(st, "TensorSpec"):
        with pytest.raises(st.SafetensorError):
            st.TensorSpec(dtype="F16", **fields)
        for name in ("float32", "bfloat16", "int8", "float8_e4m3fn", "bool", "complex64"):
            assert st.TensorSpec(dtype=name, **fields).dtype == \
                ztensor.TensorSpec(dtype=name, **fields).dtype
        with pytest.raises(TypeError):
            st.TensorSpec("float32", [6], a.ctypes.data, 24)
    for name in ("float4_e2m1fn_x2", "float8_e8m0fnu"):
        with pytest.raises(ztensor.SafetensorError, match="not in zTensor's dtype table"):
            ztensor.TensorSpec(dtype=name, **fields)
