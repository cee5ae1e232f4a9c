"""Red team, session 13: the public APIs (ztensor.torch, ztensor.numpy, safe_open,
sharded) called the way a careless user, or one coming from safetensors or the
reference ztensor, calls them."""

from __future__ import annotations

import numpy as np
import pytest

import ztensor
from ztensor import safe_open
from ztensor.errors import FormatError, UnsupportedError
from ztensor.sharded import parse_size

torch = pytest.importorskip("torch")
zt_torch = pytest.importorskip("ztensor.torch")
zt_numpy = pytest.importorskip("ztensor.numpy")


def _unusable_devices():
    """Devices torch names but cannot put a tensor on here."""
    out = ["bogus", "xla", -1]
    if not torch.cuda.is_available():
        out += ["cuda", "cuda:0", torch.device("cuda")]
    return out


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.zt"
    zt_torch.save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, path)
    return path


# ------------------------------------------------------------------ device=
@pytest.mark.parametrize("device", _unusable_devices(), ids=repr)
def test_a_device_torch_cannot_use_is_refused_naming_the_file(small, device):
    """``device="cuda"`` on a machine without CUDA (or ``"xla"``, ``"bogus"``) was
    torch's own AssertionError / NotImplementedError / RuntimeError about pinned
    memory from the middle of a load; it is an UnsupportedError naming the file
    and the device (staging.torch_device), before anything is read."""
    calls = {
        "load_file": lambda: zt_torch.load_file(small, device=device),
        "load": lambda: zt_torch.load(small.read_bytes(), device=device),
        "load_model": lambda: zt_torch.load_model(torch.nn.Linear(3, 2), small, device=device),
        "safe_open": lambda: safe_open(small, framework="pt", device=device).get_tensor("w"),
        "read_torch": lambda: ztensor.Reader(small).read_torch("w", device=device),
    }
    for name, call in calls.items():
        with pytest.raises(UnsupportedError) as info:
            call()
        assert "device" in str(info.value), name
        if name not in ("load", "read_torch"):
            assert info.value.path == str(small), name


def test_device_none_is_the_cpu_as_in_safetensors(small):
    st_torch = pytest.importorskip("safetensors.torch")
    safetensors = pytest.importorskip("safetensors")
    st = small.with_suffix(".safetensors")
    st_torch.save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, st)
    want = st_torch.load_file(st, device=None)["w"]
    with safetensors.safe_open(st, framework="pt", device=None) as f:
        assert torch.equal(f.get_tensor("w"), want)
    for path in (small, st):
        got = zt_torch.load_file(path, device=None)["w"]
        assert got.device.type == "cpu" and torch.equal(got, want)
        with safe_open(path, framework="pt", device=None) as f:
            assert torch.equal(f.get_tensor("w"), want)
            assert torch.equal(f.get_slice("w")[1:], want[1:])
    assert torch.equal(zt_torch.load(small.read_bytes(), device=None)["w"], want)


@pytest.mark.parametrize("device", ["cuda", "meta", 0, "bogus"], ids=repr)
def test_numpy_safe_open_refuses_a_device_it_cannot_honour(small, device):
    """``framework="np"`` gave CPU arrays whatever ``device`` asked for (silently);
    safetensors refuses a non-CPU device for numpy, and so does this."""
    with pytest.raises(UnsupportedError, match="framework numpy"):
        safe_open(small, framework="np", device=device)
    with safe_open(small, framework="np", device="cpu") as f:
        assert f.get_tensor("w").shape == (2, 3)


# ------------------------------------------------------------------ shared memory
class _Overlapping(torch.nn.Module):
    """Two buffers overlapping in one storage, neither covering all of it."""

    def __init__(self):
        super().__init__()
        base = torch.arange(10.0)
        self.register_buffer("x", base[:6])
        self.register_buffer("y", base[4:])


def test_a_shared_group_no_tensor_covers_is_a_format_error(tmp_path):
    """The module's promise: shared-memory refusals are a FormatError (the
    RuntimeError safetensors raises, and a ZTensorError).  _names_to_remove raised a
    bare RuntimeError for save_model and load_model."""
    with pytest.raises(FormatError, match="None is covering the entire storage") as info:
        zt_torch.save_model(_Overlapping(), tmp_path / "m.zt")
    assert isinstance(info.value, RuntimeError)
    assert not (tmp_path / "m.zt").exists()
    zt_torch.save_file({"x": torch.ones(6), "y": torch.ones(6)}, tmp_path / "f.zt")
    with pytest.raises(FormatError, match="None is covering"):
        zt_torch.load_model(_Overlapping(), tmp_path / "f.zt")


# ------------------------------------------------------------------ save_model
@pytest.mark.parametrize("size", [0, False, "0", "0.1"], ids=repr)
def test_save_model_refuses_a_shard_size_of_nothing(tmp_path, size):
    """``max_shard_size=0`` (or False) was taken as "5GB" (``size or "5GB"``) and a
    checkpoint written; save_sharded and save_pretrained refuse it."""
    with pytest.raises(ValueError, match="max_shard_size"):
        zt_torch.save_model(torch.nn.Linear(2, 2), tmp_path / "ck", max_shard_size=size)
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


def test_save_model_leaves_the_callers_metadata_alone(tmp_path):
    """save_model added ``dropped -> kept`` names of tied weights into the caller's
    own dict: reused for another model, it carried this one's names along."""

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2)
            self.b = torch.nn.Linear(2, 2)
            self.b.weight = self.a.weight

    metadata = {"note": "mine"}
    zt_torch.save_model(Tied(), tmp_path / "t.zt", metadata=metadata)
    assert metadata == {"note": "mine"}
    with ztensor.Reader(tmp_path / "t.zt") as r:
        assert r.attributes["note"] == "mine" and r.attributes["b.weight"] == "a.weight"


# ------------------------------------------------------------------ parse_size
@pytest.mark.parametrize(
    "text, want",
    [("9" * 400 + "GB", int("9" * 400) * 10**9), ("1.1GB", 1_100_000_000), ("0.3MB", 300_000)],
)
def test_shard_sizes_are_parsed_exactly(text, want):
    """A long number of digits was an OverflowError (a float's infinity made int);
    the decimal is now exact."""
    assert parse_size(text) == want


def test_a_shard_size_past_the_digit_limit_is_a_value_error():
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size("9" * 5000)


# ------------------------------------------------------------------ reference calls
def test_the_reference_positional_arguments_are_taken(tmp_path):
    """The reference ztensor's signatures: ``save_file(tensors, filename, metadata,
    compression)``, ``save(tensors, metadata, compression)``, ``load_file(filename,
    device, copy)`` (numpy: ``load_file(filename, copy)``) and ``load_model(model,
    filename, strict, device, copy)``; each was a TypeError here."""
    t = {"w": torch.arange(64, dtype=torch.float32)}
    zt_torch.save_file(t, tmp_path / "c.zt", None, True)
    with ztensor.Reader(tmp_path / "c.zt") as r:
        assert r.metadata("w").components["data"].encoding == "zstd"
    data = zt_torch.save(t, None, 5)
    assert torch.equal(zt_torch.load(data)["w"], t["w"])
    loaded = zt_torch.load_file(tmp_path / "c.zt", "cpu", True)
    assert torch.equal(loaded["w"], t["w"])

    model = torch.nn.Linear(4, 2)
    zt_torch.save_model(model, tmp_path / "m.zt")
    other = torch.nn.Linear(4, 2)
    assert zt_torch.load_model(other, tmp_path / "m.zt", True, "cpu", True) == ([], [])
    assert torch.equal(other.weight, model.weight)
    other = torch.nn.Linear(4, 2)
    zt_torch.load_model(other, tmp_path / "m.zt", copy=False)
    assert torch.equal(other.weight, model.weight)

    a = {"x": np.arange(64.0)}
    zt_numpy.save_file(a, tmp_path / "n.zt", None, 3)
    with ztensor.Reader(tmp_path / "n.zt") as r:
        assert r.metadata("x").components["data"].encoding == "zstd"
    owned = zt_numpy.load_file(tmp_path / "n.zt", True)["x"]
    assert owned.flags.owndata or owned.base is None or owned.flags.writeable
    np.testing.assert_array_equal(owned, a["x"])
    np.testing.assert_array_equal(zt_numpy.load(zt_numpy.save(a, None, True))["x"], a["x"])
