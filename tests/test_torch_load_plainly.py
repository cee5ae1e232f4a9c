"""``ztensor.torch.load_model`` copies straight into a model that loads plainly.

When no module changes how it loads (hooks, ``_load_from_state_dict`` overrides,
extra state, special tensors), load_model copies each tensor into the model's own
tensor of that name instead of walking the module tree once per shard.  Every test
here holds that shortcut to safetensors' ``load_model`` (which is
``load_state_dict``) on a real ``.safetensors`` file of the same tensors: the same
returned names, the same model state, the same error text; and models that do not
load plainly still go through ``load_state_dict``, their hooks and overrides seen.
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
zt = pytest.importorskip("ztensor.torch")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
        self.register_buffer("scale", torch.ones(()))
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        with torch.no_grad():  # the same start in every model: what is not loaded compares
            for t in self.parameters():
                t.fill_(0.5)


def _state(model):
    return {k: t.clone() for k, t in model.state_dict().items()}


def _outcome(load, model, path, strict):
    try:
        missing, unexpected = load(model, path, strict=strict)
        return sorted(missing), sorted(unexpected)
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"


def _both(tmp_path, make, tensors, strict=False):
    """(safetensors' outcome, ours) of loading ``tensors`` into fresh ``make()``s."""
    ref_path, our_path = str(tmp_path / "m.safetensors"), str(tmp_path / "m.zt")
    st.save_file(tensors, ref_path)
    zt.save_file(tensors, our_path)
    ref_model, our_model = make(), make()
    ref = _outcome(st.load_model, ref_model, ref_path, strict)
    ours = _outcome(zt.load_model, our_model, our_path, strict)
    assert ours == ref
    a, b = _state(our_model), _state(ref_model)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    return ours, our_model


def _full(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(t.shape, generator=g).to(t.dtype) for k, t in Net().state_dict().items()}


def test_a_whole_state_dict_is_copied_in(tmp_path):
    tensors = _full()
    got, model = _both(tmp_path, Net, tensors, strict=True)
    assert got == ([], [])
    assert torch.equal(model.block[0].weight, tensors["block.0.weight"])
    assert model.cache.tolist() == [0.0, 0.0]  # not persistent: untouched


def test_missing_and_unexpected_names_as_torch_reports_them(tmp_path):
    tensors = _full()
    del tensors["block.1.bias"]
    # a name past a parameter and a name that is a module torch does not report;
    # a name in no module and a non-persistent buffer's name it does
    for extra in ("block.0.weight.x", "block", "nowhere.w", "cache", "block.7.w"):
        tensors[extra] = torch.ones(1)
    got, _ = _both(tmp_path, Net, tensors)
    assert got[0] == ["block.1.bias"] and "nowhere.w" in got[1] and "cache" in got[1]


def test_a_size_mismatch_is_torchs_error_after_the_rest_is_copied(tmp_path):
    tensors = _full()
    tensors["block.0.weight"] = torch.ones(5, 4)
    tensors["embed.weight"] = torch.ones(10, 5)
    got, model = _both(tmp_path, Net, tensors)
    assert "size mismatch for embed.weight" in got and "size mismatch for block.0.weight" in got
    assert torch.equal(model.block[1].weight, tensors["block.1.weight"])


def test_dtypes_are_converted_and_old_one_element_scalars_accepted(tmp_path):
    tensors = {k: t.half() for k, t in _full().items()}
    tensors["scale"] = torch.tensor([3.0])  # a 0-d buffer saved as shape (1,)
    got, model = _both(tmp_path, Net, tensors, strict=True)
    assert got == ([], []) and float(model.scale) == 3.0
    assert model.embed.weight.dtype == torch.float32


def test_tied_weights_stay_tied(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(6, 3)
            self.head = torch.nn.Linear(3, 6, bias=False)
            self.head.weight = self.embed.weight

    tensors = {"embed.weight": torch.arange(18.0).reshape(6, 3)}
    got, model = _both(tmp_path, Tied, tensors, strict=True)
    assert got == ([], []) and model.head.weight is model.embed.weight
    assert torch.equal(model.head.weight, tensors["embed.weight"])


def test_a_sharded_checkpoint_fills_the_model_shard_by_shard(tmp_path):
    tensors = _full(1)
    out = tmp_path / "ckpt"
    out.mkdir()
    zt.save_model(Net(), str(out / "unused.zt"))  # a file the index does not name
    names = sorted(tensors)
    halves = {"a.zt": names[: len(names) // 2], "b.zt": names[len(names) // 2:]}
    for file, part in halves.items():
        zt.save_file({k: tensors[k] for k in part}, str(out / file))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (out / "model.zt.index.json").write_text(json.dumps(index))
    model = Net()
    assert zt.load_model(model, str(out)) == ([], [])
    for k, t in model.state_dict().items():
        if k in tensors:
            assert torch.equal(t, tensors[k]), k


# ------------------------------------------------------------- not loaded plainly
class Versioned(Net):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)  # overrides _load_from_state_dict


def test_a_module_with_its_own_loading_goes_through_torch(tmp_path):
    tensors = {k: t for k, t in Versioned().state_dict().items() if "num_batches" not in k}
    got, model = _both(tmp_path, Versioned, tensors)
    # BatchNorm fills in a counter an old file lacks: a plain copy would call it missing
    assert got == ([], [])


def test_load_hooks_run(tmp_path):
    seen = []

    def make():
        model = Net()
        model.register_load_state_dict_post_hook(lambda module, keys: seen.append(len(keys.missing_keys)))
        return model

    _both(tmp_path, make, _full())
    assert len(seen) == 2  # safetensors' load and ours each ran the hook


def test_pre_hooks_that_rename_keys_are_honoured(tmp_path):
    def make():
        model = Net()

        def rename(state_dict, prefix, *args):
            if prefix + "old_scale" in state_dict:
                state_dict[prefix + "scale"] = state_dict.pop(prefix + "old_scale")

        model._register_load_state_dict_pre_hook(rename)
        return model

    tensors = _full()
    tensors["old_scale"] = tensors.pop("scale") + 5
    _, model = _both(tmp_path, make, tensors)
    assert float(model.scale) == float(tensors["old_scale"])


def test_inference_tensors_are_left_to_torch(tmp_path):
    def make():
        with torch.inference_mode():
            return Net()

    got, _ = _both(tmp_path, make, _full())
    assert "RuntimeError" in got and "inference" in got.lower()


class Big(torch.nn.Module):
    """Tensors past 1 MiB of every kind of dtype: load_model copies these with the
    streaming copy kernel (frameworks.torch_bridge.copy_into), not torch's copy_."""

    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.bool,
              torch.complex64, torch.float8_e4m3fn)

    def __init__(self):
        super().__init__()
        for i, dtype in enumerate(self.DTYPES):
            self.register_buffer(f"b{i}", torch.zeros(600_001 + i, dtype=dtype))


def test_large_tensors_are_copied_bit_for_bit_by_the_streaming_kernel(tmp_path):
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for i, dtype in enumerate(Big.DTYPES):  # random bits: NaN payloads and all
        bits = torch.randint(0, 256, (Big().get_buffer(f"b{i}").nbytes,), generator=g,
                             dtype=torch.uint8)
        tensors[f"b{i}"] = bits.view(dtype) if dtype != torch.bool else bits.bool()
    path = str(tmp_path / "big.zt")
    zt.save_file(tensors, path)
    model = Big()
    assert zt.load_model(model, path) == ([], [])
    for name, want in tensors.items():
        got = model.get_buffer(name)
        assert got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name


def test_copy_into_falls_back_to_torch_where_the_kernel_cannot_go():
    from ztensor.frameworks.torch_bridge import copy_into

    src = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB
    cases = {
        "non-contiguous target": (torch.zeros(2 << 19)[::2], src),
        "non-contiguous value": (torch.zeros(1 << 19), torch.arange(2 << 19, dtype=torch.float32)[::2]),
        "dtype conversion": (torch.zeros(1 << 19, dtype=torch.float64), src),
        "broadcast": (torch.zeros(4, 1 << 17), torch.arange(1 << 17, dtype=torch.float32)),
    }
    for label, (target, value) in cases.items():
        want = target.clone().copy_(value)
        copy_into(target, value)
        assert torch.equal(target, want), label
    def overlapping(copy):  # two views of one buffer: whatever copy_ does, we do
        whole = torch.arange(1 << 20, dtype=torch.float32)
        try:
            copy(whole[: 1 << 19], whole[1 << 18 : (1 << 18) + (1 << 19)])
        except RuntimeError as exc:
            return str(exc)
        return whole

    ours, torchs = overlapping(copy_into), overlapping(torch.Tensor.copy_)
    assert type(ours) is type(torchs)
    assert ours == torchs if isinstance(torchs, str) else torch.equal(ours, torchs)


def test_a_large_copy_split_between_threads_is_bit_for_bit(monkeypatch):
    """frameworks.torch_bridge._streamed splits a copy of PARALLEL_COPY_BYTES or more
    into pieces on 4 KiB boundaries, one a thread (one core's non-temporal stores
    did not reach the memory's bandwidth: docs/benchmarks.md, session 16); every
    byte lands, at odd sizes and offsets too, and a piece that fails is raised."""
    from ztensor.frameworks import torch_bridge
    monkeypatch.setattr(torch_bridge, "PARALLEL_COPY_BYTES", 1 << 16)
    monkeypatch.setattr(torch_bridge.kernels, "cpu_threads", lambda: 4)
    g = torch.Generator().manual_seed(5)
    for size in (1 << 18, (1 << 18) + 4093, 3 * (1 << 16) + 1, (1 << 16) * 9 - 7):
        for offset in (0, 1, 63):
            whole = torch.randint(0, 256, (size + offset,), generator=g, dtype=torch.uint8)
            value = whole[offset:]
            target = torch.zeros(size + 5, dtype=torch.uint8)[5:]
            torch_bridge.copy_into(target, value)
            assert torch.equal(target, value), (size, offset)
    seen = []
    real = torch_bridge.kernels.copy

    def failing(src, dst):
        seen.append(src.nbytes)
        if len(seen) == 2:
            raise ValueError("piece two")
        real(src, dst)

    monkeypatch.setattr(torch_bridge.kernels, "copy", failing)
    with pytest.raises(ValueError, match="piece two"):
        torch_bridge.copy_into(torch.zeros(1 << 18), torch.ones(1 << 18))
    assert len(seen) == 4 and sum(seen) == 1 << 20
