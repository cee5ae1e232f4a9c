"""Session 18: what a user's usual keywords and a killed save still tripped over.
Each test names the one function that keeps its rule."""
import pytest


@pytest.fixture(scope="module")
def tf():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    return torch, transformers, ztf


def _tiny(torch, transformers):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))


@pytest.mark.parametrize("strategy", ["auto", "balanced", "sequential"])
def test_a_placement_strategy_without_an_accelerator_loads_onto_the_cpu(
        tf, tmp_path, monkeypatch, strategy):
    """Rule: transformers._is_cpu_map: accelerate's strategies put every module on
    the CPU where torch sees no accelerator, so device_map="auto" (in most users'
    scripts) loads there as transformers does; it was refused on every machine."""
    torch, transformers, ztf = tf
    model = _tiny(torch, transformers)
    ztf.save_pretrained(model, tmp_path)
    monkeypatch.setattr(ztf, "_has_accelerator", lambda: False)
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path,
                                 device_map=strategy)
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)


def test_a_placement_strategy_with_an_accelerator_is_refused_naming_it(
        tf, tmp_path, monkeypatch):
    """Rule: transformers._is_cpu_map: where an accelerator is there, "auto" would
    place modules on it, which this loader does not do: an UnsupportedError naming
    the keyword, before anything is read."""
    import ztensor
    torch, transformers, ztf = tf
    ztf.save_pretrained(_tiny(torch, transformers), tmp_path)
    monkeypatch.setattr(ztf, "_has_accelerator", lambda: True)
    with pytest.raises(ztensor.UnsupportedError, match="device_map='auto'"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path, device_map="auto")


def test_the_accelerator_check_agrees_with_torch(tf):
    """Rule: transformers._has_accelerator asks torch (CUDA, MPS, XPU ...)."""
    torch, _, ztf = tf
    accelerator = getattr(torch, "accelerator", None)
    expected = (accelerator.is_available() if accelerator is not None
                else torch.cuda.is_available())
    assert ztf._has_accelerator() == expected
