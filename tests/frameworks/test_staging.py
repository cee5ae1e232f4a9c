"""device= loads: tensors reach the device through one staging buffer (pinned for
CUDA), straight from the file's mapping.  Here the staging path is driven with the
CPU as its target (the same code a GPU gets, minus the pinning), plus meta; the
CUDA case runs where a GPU is present."""
import tracemalloc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ztensor  # noqa: E402
import ztensor.torch as zt_torch  # noqa: E402
from ztensor.frameworks import staging  # noqa: E402
from ztensor.frameworks import torch_bridge
from ztensor.frameworks.staging import Staging  # noqa: E402

RNG = np.random.default_rng(5)


@pytest.fixture
def staged_cpu(monkeypatch):
    """Route 'cpu' through the device path, with a small buffer so tensors take
    many chunks: what a load onto an accelerator runs, observable on this machine."""
    buffer = Staging("cpu", capacity=4096)
    monkeypatch.setattr(torch_bridge, "is_cpu", lambda device: False)
    monkeypatch.setattr(zt_torch, "is_cpu", lambda device: False)
    monkeypatch.setattr(staging, "for_device", lambda device: buffer)
    monkeypatch.setattr(zt_torch, "staging_for", lambda device: buffer)
    return buffer


CASES = [
    (np.arange(3000, dtype=np.float32) * 0.5, torch.float32),
    (np.arange(3000, dtype=">f4") * 0.25, torch.float32),      # stored big-endian (v0.1)
    (RNG.standard_normal(1001).astype(">f8"), torch.float64),
    ((RNG.standard_normal(777) + 1j).astype(">c8"), torch.complex64),
    (RNG.integers(-9, 9, (40, 33)).astype("<i2"), torch.int16),
    (RNG.integers(0, 2, 5000).astype(bool), torch.bool),
    (np.array(7.5, dtype="<f8"), torch.float64),                # 0-d
    (np.zeros((0, 4), np.float32), torch.float32),              # empty
]


@pytest.mark.parametrize("arr,dtype", CASES, ids=lambda c: str(getattr(c, "dtype", c)))
def test_put_matches_the_values_in_any_byte_order(arr, dtype):
    buffer = Staging("cpu", capacity=1024)  # 512-byte halves: most cases take many chunks
    out = buffer.put(arr, dtype, arr.shape)
    buffer.sync()
    assert out.dtype == dtype and tuple(out.shape) == arr.shape
    np.testing.assert_array_equal(out.numpy(), arr.astype(arr.dtype.newbyteorder("=")))


def test_bits_become_bf16_and_float8():
    bits16 = RNG.integers(0, 2**16, 3001, dtype=np.uint16)
    bits16[bits16 & 0x7F80 == 0x7F80] = 0  # no NaN patterns: compare by value below
    want = torch.from_numpy(bits16.view(np.int16)).view(torch.bfloat16)
    for order in ("<", ">"):
        out = Staging("cpu", capacity=512).put(bits16.astype(f"{order}u2"), torch.bfloat16,
                                                (3001,))
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    codes = RNG.integers(0, 256, 999, dtype=np.uint8)
    out = Staging("cpu", capacity=256).put(codes, torch.float8_e4m3fn, (999,))
    assert torch.equal(out.view(torch.uint8), torch.from_numpy(codes))


def test_one_buffer_for_many_tensors():
    buffer = Staging("cpu", capacity=1 << 16)
    buffer.reserve(20_000)  # the largest below: 5000 float32
    for n in (10, 5000, 2500, 1):
        buffer.put(np.ones(n, np.float32), torch.float32, (n,))
    assert buffer.allocations == 1 and buffer.nbytes <= 1 << 16
    buffer.put(np.ones(1 << 20, np.float32), torch.float32, (1 << 20,))  # grows to the cap
    assert buffer.allocations == 2 and buffer.nbytes == 1 << 16


def test_a_wrong_size_is_refused():
    with pytest.raises(ValueError):
        Staging("cpu").put(np.ones(3, np.float32), torch.float32, (4,))


def checkpoint_file(tmp_path):
    tensors = {
        "w": torch.randn(64, 48),
        "h": torch.randn(300).to(torch.bfloat16),
        "f8": torch.randn(200).to(torch.float8_e5m2),
        "i": torch.arange(1000, dtype=torch.int64),
        "c": torch.randn(10, dtype=torch.complex64),
        "s": torch.tensor(3.0),
    }
    zt_torch.save_file(tensors, tmp_path / "m.zt")
    zt_torch.save_file(tensors, tmp_path / "mz.zt", compression=True)
    return tensors


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.itemsize == 1 and a.dtype.is_floating_point:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("file", ["m.zt", "mz.zt"])
def test_load_file_through_the_staging_path(tmp_path, staged_cpu, file):
    tensors = checkpoint_file(tmp_path)
    loaded = zt_torch.load_file(tmp_path / file, device="cpu")
    assert loaded.keys() == tensors.keys()
    assert all(same(loaded[k], tensors[k]) for k in tensors)
    assert staged_cpu.allocations == 1  # reserved once for the largest tensor
    with ztensor.Reader(tmp_path / file) as r:
        assert same(r.read_torch("w", device="cpu"), tensors["w"])
        got = r.read_torch(["h", "s"], device="cpu", copy=True)
        assert same(got["h"], tensors["h"]) and same(got["s"], tensors["s"])


def test_no_host_copy_of_a_raw_tensor(tmp_path, staged_cpu):
    """A 32 MiB raw tensor goes from the mapping through the 4 KiB buffer: numpy
    allocates nothing the size of the tensor (tracemalloc sees numpy's buffers; the
    staging buffer and the result are torch's)."""
    zt_torch.save_file({"big": torch.randn(8 << 20)}, tmp_path / "big.zt")
    tracemalloc.start()
    try:
        loaded = zt_torch.load_file(tmp_path / "big.zt", device="cpu")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    with ztensor.Reader(tmp_path / "big.zt") as r:
        assert torch.equal(loaded["big"], torch.from_numpy(r.read_numpy("big", copy=True)))


def test_dequantized_and_gptq_names_reach_the_device(tmp_path, staged_cpu):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    with ztensor.Writer(tmp_path / "q.zt") as wr:
        wr.write("layer", ztensor.quantize(w, bits=4, group_size=32))
        wr.write_numpy("bias", np.ones(64, np.float16))
    with ztensor.Reader(tmp_path / "q.zt") as r:
        want = ztensor.dequantize(r.read("layer"))
    staged = zt_torch.load_file(tmp_path / "q.zt", device="cpu", dequantize=True)
    np.testing.assert_array_equal(staged["layer"].numpy(), want.astype(np.float16))
    names = zt_torch.load_file(tmp_path / "q.zt", device="cpu")
    assert {"layer.qweight", "layer.scales", "bias"} <= names.keys()


def test_load_model_and_safe_open_take_the_device(tmp_path, staged_cpu):
    model = torch.nn.Linear(16, 8)
    zt_torch.save_model(model, tmp_path / "lin.zt")
    fresh = torch.nn.Linear(16, 8)
    assert zt_torch.load_model(fresh, tmp_path / "lin.zt", device="cpu") == ([], [])
    assert torch.equal(fresh.weight, model.weight)
    with ztensor.safe_open(tmp_path / "lin.zt", framework="pt", device="cpu") as f:
        assert torch.equal(f.get_tensor("bias"), model.bias.detach())
        assert torch.equal(f.get_slice("weight")[2:5], model.weight.detach()[2:5])


def test_meta_device_gives_shapes_and_dtypes(tmp_path):
    tensors = checkpoint_file(tmp_path)
    loaded = zt_torch.load_file(tmp_path / "m.zt", device="meta")
    for k, t in tensors.items():
        assert loaded[k].device.type == "meta"
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape
    with ztensor.Reader(tmp_path / "mz.zt") as r:
        assert r.read_torch("w", device="meta").shape == (64, 48)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_load_is_exact_and_pinned(tmp_path):
    tensors = checkpoint_file(tmp_path)
    zt_torch.save_file({"big": torch.randn(40 << 20)}, tmp_path / "big.zt")
    for file in ("m.zt", "mz.zt"):
        loaded = zt_torch.load_file(tmp_path / file, device="cuda")
        assert all(loaded[k].device.type == "cuda" and same(loaded[k].cpu(), tensors[k])
                   for k in tensors)
    big = zt_torch.load_file(tmp_path / "big.zt", device="cuda:0")["big"]  # 160 MiB: chunks
    with ztensor.Reader(tmp_path / "big.zt") as r:
        assert torch.equal(big.cpu(), torch.from_numpy(r.read_numpy("big", copy=True)))
    buffer = staging.for_device("cuda:0")
    assert buffer.pinned and buffer._halves[0].is_pinned()
    assert buffer.nbytes <= staging.CAPACITY
    staging.release()


def test_read_into_a_device_tensor_goes_through_the_staging_buffer(tmp_path, staged_cpu):
    """read_into's destination on a device is filled through the process's staging
    buffer (staging.for_device), not a pinned buffer of its own per call."""
    w = torch.from_numpy(RNG.standard_normal((64, 48)).astype(np.float32))
    b = torch.randn(3000).to(torch.bfloat16)
    zt_torch.save_file({"w": w, "b": b}, tmp_path / "into.zt")
    with ztensor.Reader(tmp_path / "into.zt") as r:
        dst = torch.empty(64, 48)
        r.read_into("w", dst)
        assert torch.equal(dst, w)
        strided = torch.empty(48, 64).t()  # not contiguous: staged, then copied in
        r.read_into("w", strided)
        assert torch.equal(strided, w)
        bits = torch.empty(3000, dtype=torch.bfloat16)
        r.read_into("b", bits)
        assert torch.equal(bits.view(torch.int16), b.view(torch.int16))
    assert staged_cpu.allocations == 1  # one buffer, reused by every call
