"""ztensor/foreign: Reader (and convert) on files written by the real libraries,
told by their bytes; hostile foreign files, and a malicious PyTorch pickle."""
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import ztensor

RNG = np.random.default_rng(7)
VALUES = {"w": RNG.standard_normal((33, 17)).astype(np.float32),
          "b": np.arange(-5, 12, dtype=np.int64),
          "h": np.linspace(-2, 2, 40, dtype=np.float16).reshape(5, 8),
          "m": np.array([True, False, True])}


def check_reader(path, fmt, expected, **names):
    with ztensor.Reader(path) as r:
        assert r.format == fmt and r.version is None
        assert set(r.keys()) == set(expected)
        for name, want in expected.items():
            got = r.read_numpy(name)
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype and r.metadata(name).dtype == str(want.dtype)
            assert r.read(name).components["data"].shape == want.shape
            dst = np.empty_like(want)
            r.read_into(name, dst)
            np.testing.assert_array_equal(dst, want)
            copy = r.read_numpy(name, copy=True)
            assert copy.flags.writeable and not np.shares_memory(copy, got)
        assert r.verify() == 0


def test_safetensors_written_by_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "model.safetensors"
    st.save_file(VALUES, str(path), metadata={"format": "np"})
    check_reader(path, "safetensors", VALUES)
    with ztensor.Reader(path) as r:
        assert r.attributes == {"format": "np"}
        assert not r["w"].flags.owndata  # zero-copy view of the mapped file


def test_the_extension_does_not_decide(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "weights.bin"     # a safetensors file under another name
    st.save_file(VALUES, str(path))
    check_reader(path, "safetensors", VALUES)
    zt = tmp_path / "model.safetensors"  # a zTensor file under a safetensors name
    with ztensor.Writer(zt) as w:
        w.write_numpy("x", np.arange(3))
    with ztensor.Reader(zt) as r:
        assert r.format == "zt" and r["x"].tolist() == [0, 1, 2]


def test_npy_and_npz_written_by_numpy(tmp_path):
    np.save(tmp_path / "one.npy", VALUES["w"])
    check_reader(tmp_path / "one.npy", "npy", {"one": VALUES["w"]})
    np.savez(tmp_path / "many.npz", **VALUES)
    check_reader(tmp_path / "many.npz", "npz", VALUES)
    np.savez_compressed(tmp_path / "packed.npz", **VALUES)
    check_reader(tmp_path / "packed.npz", "npz", VALUES)


def test_torch_save_checkpoints_without_running_torch_code(tmp_path):
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(4, 3)
    state = {"model": lin.state_dict(), "step": 7, "name": "run-1",
             "bf": torch.arange(6, dtype=torch.float32).to(torch.bfloat16),
             "view": torch.arange(20.0).reshape(4, 5)[1:3, ::2],
             "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn)}
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    with ztensor.Reader(path) as r:
        assert r.format == "pickle"
        assert set(r.keys()) == {"model.weight", "model.bias", "bf", "view", "f8"}
        np.testing.assert_array_equal(r["model.weight"], lin.weight.detach().numpy())
        np.testing.assert_array_equal(r["view"], state["view"].numpy())  # strided view
        assert r.attributes["pickle.step"] == 7 and r.attributes["pickle.name"] == "run-1"
        assert r.read_torch("bf").dtype == torch.bfloat16
        assert torch.equal(r.read_torch("bf"), state["bf"])
        assert r.read_torch("f8").dtype == torch.float8_e4m3fn
        assert torch.equal(r.read_torch("f8").float(), state["f8"].float())
        dst = torch.empty(3, 4)
        r.read_into("model.weight", dst)
        assert torch.equal(dst, lin.weight.detach())


class Evil:
    """Pickles to a call of os.system: what a malicious checkpoint does."""

    def __reduce__(self):
        return os.system, ("touch pwned",)


def malicious_checkpoint(path, payload):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3")


@pytest.mark.parametrize("payload", [Evil(), {"weights": Evil()}, [1, 2, Evil()]])
def test_a_malicious_pickle_is_an_error_not_code(tmp_path, payload):
    path = tmp_path / "evil.pt"
    malicious_checkpoint(path, payload)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ztensor.FormatError, match=r"refusing to load posix\.system|"
                                                      r"refusing to load os\.system"):
            ztensor.Reader(path)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("module,name", [("builtins", "eval"), ("subprocess", "Popen"),
                                         ("torch", "load"), ("numpy.core.multiarray",
                                                             "_reconstruct")])
def test_only_allowlisted_globals(tmp_path, module, name):
    body = (b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n"
            + b"q\x00.")
    path = tmp_path / "g.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a/data.pkl", body)
    with pytest.raises(ztensor.FormatError, match=f"refusing to load {module}.{name}"):
        ztensor.Reader(path)


def test_a_tensor_reaching_past_its_storage_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "t.pt"
    torch.save({"t": torch.arange(10.0)}, path)
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in members if n.endswith("data.pkl"))
    # the storage shrinks to 4 floats while the tensor still claims 10
    storage = next(n for n in members if "/data/" in n)
    members[storage] = members[storage][:16]
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    assert pkl
    with pytest.raises(ztensor.FormatError, match="holds 16 bytes, not the 40"):
        ztensor.Reader(path)


def test_pickle_sharing_cannot_blow_up_the_walk(tmp_path):
    # [x, x] nested through the memo: 2**60 paths in a few hundred bytes
    inner = []
    for _ in range(60):
        inner = [inner, inner]
    import time
    path = tmp_path / "share.pt"
    malicious_checkpoint(path, {"a": inner, "n": 1})
    start = time.monotonic()
    with ztensor.Reader(path) as r:   # each shared list is walked once
        assert r.keys() == [] and r.attributes == {"pickle.n": 1}
    assert time.monotonic() - start < 30  # the unshared walk: 2**60 steps, never ends


def test_gguf_written_by_gguf(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("tok", VALUES["w"])
    w.add_tensor("norm", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with ztensor.Reader(path) as r:
        assert r.format == "gguf"
        np.testing.assert_array_equal(r["tok"], VALUES["w"])
        np.testing.assert_array_equal(r["norm"], np.arange(8, dtype=np.float32))
        assert r.attributes["gguf.general.architecture"] == "llama"


def test_hdf5_written_by_h5py(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("layer/w", data=VALUES["w"])
        f.create_dataset("b", data=VALUES["b"])
        f.create_dataset("text", data="not a tensor")
        f.attrs["epoch"] = 3
    check_reader(path, "hdf5", {"layer.w": VALUES["w"], "b": VALUES["b"]})
    with ztensor.Reader(path) as r:
        assert r.attributes["hdf5.epoch"] == 3


def test_onnx_written_by_onnx(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(VALUES["w"], "w"), numpy_helper.from_array(VALUES["b"], "b")]
    graph = helper.make_graph([], "g", [], [], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path)
    check_reader(path, "onnx", {"w": VALUES["w"], "b": VALUES["b"]})


def test_missing_optional_package_is_named(tmp_path):
    path = tmp_path / "m.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))
    code = ("import sys; sys.modules['h5py'] = None\nimport ztensor\n"
            f"try:\n    ztensor.Reader({str(path)!r})\n"
            "except ztensor.UnsupportedError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert "needs the 'h5py' package" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("maker", ["safetensors", "npz", "torch"])
def test_convert_takes_every_format_and_round_trips(tmp_path, maker):
    from ztensor.tools.cli import main
    src = tmp_path / "src.bin"
    if maker == "safetensors":
        pytest.importorskip("safetensors.numpy").save_file(VALUES, str(src))
    elif maker == "npz":
        src = tmp_path / "src.npz"
        np.savez(src, **VALUES)
    else:
        torch = pytest.importorskip("torch")
        torch.save({k: torch.from_numpy(v) for k, v in VALUES.items()}, src)
    out = tmp_path / "out.zt"
    assert main(["convert", "-q", str(src), str(out)]) == 0
    with ztensor.Reader(out) as r:
        assert r.format == "zt"
        for name, want in VALUES.items():
            np.testing.assert_array_equal(r[name], want)


def test_hostile_safetensors_overlap_is_refused(tmp_path):
    header = (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
              b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}')
    path = tmp_path / "o.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    with pytest.raises(ztensor.FormatError, match="overlaps"):
        ztensor.Reader(path)


@pytest.mark.parametrize("arr", [np.asfortranarray(np.arange(12, dtype=">f4").reshape(3, 4)),
                                 np.arange(5, dtype=np.int16), np.zeros((0, 3)),
                                 np.array(3.5), np.arange(6, dtype=np.complex64)])
def test_npy_is_read_from_the_checked_mapping(tmp_path, arr):
    """.npy elements are a view of the file the Reader checked (no second open by
    numpy), in either order and any byte order; a file shorter than its header
    declares is a FormatError naming it."""
    path = tmp_path / "a.npy"
    np.save(path, arr)
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r.read_numpy("a", copy=True), arr)
        assert r.read_numpy("a").shape == arr.shape
    if arr.nbytes:
        path.write_bytes(path.read_bytes()[:-1])
        with pytest.raises(ztensor.FormatError, match="a.npy"):
            ztensor.Reader(path)
