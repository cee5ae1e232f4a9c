"""Checkpoints transformers saved under the names of a model's published design
(a mixture of experts' one tensor an expert, GPT-NeoX's ``embed_out``, ViT's
``attention.attention.query``), converted to ``.zt``, load through
``ztensor.transformers.from_pretrained`` as transformers' own loading gives them
(its renames and merges applied); ``save_pretrained`` writes those names back.
Real tiny models built from config; values compared bit for bit with transformers'
own safetensors loading."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import ztensor

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.conversion_mapping")
import ztensor.transformers as ztf  # noqa: E402
from ztensor.torch import load_file, save_file  # noqa: E402

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=128,
    max_position_embeddings=64,
)
FAMILIES = {
    "mixtral": lambda: transformers.MixtralForCausalLM(
        transformers.MixtralConfig(
            **SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
        )
    ),
    "qwen2_moe": lambda: transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            **SMALL,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    ),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)),
    "vit": lambda: transformers.ViTModel(
        transformers.ViTConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
        )
    ),
}
# a name only transformers' conversions give the model, so the test cannot pass
# by loading names as they are
RENAMED = {
    "mixtral": "block_sparse_moe.experts.0.w1.weight",
    "qwen2_moe": "mlp.experts.0.gate_proj.weight",
    "gpt_neox": "embed_out.weight",
    "vit": "attention.attention.query.weight",
}


def _inputs(model):
    if isinstance(model, transformers.ViTModel):
        return {"pixel_values": torch.linspace(-1, 1, 2 * 3 * 32 * 32).reshape(2, 3, 32, 32)}
    return {"input_ids": torch.tensor([[1, 5, 9, 100, 3], [127, 64, 2, 8, 90]])}


def _outputs(model):
    with torch.no_grad():
        out = model(**_inputs(model))
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _publish(family, root):
    """(family, transformers' safetensors folder, the .zt folder `ztensor convert`
    made of it, transformers' own load of the safetensors)."""
    torch.manual_seed(7)
    model = FAMILIES[family]().eval()
    model.save_pretrained(root / "st")
    proc = subprocess.run(
        [sys.executable, "-m", "ztensor", "convert", str(root / "st"), str(root / "zt")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    reference = type(model).from_pretrained(root / "st").eval()
    return family, root / "st", root / "zt", reference


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def published(request, tmp_path_factory):
    return _publish(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return _publish("mixtral", tmp_path_factory.mktemp("mixtral-rules"))


def test_the_published_names_are_what_the_checkpoint_holds(published):
    family, _, zt, _ = published
    names = ztensor.open_sharded(zt).keys()
    assert any(n.endswith(RENAMED[family]) for n in names), sorted(names)[:8]


def test_a_converted_checkpoint_loads_as_transformers_loads_it(published):
    family, _, zt, reference = published
    for cls in (
        type(reference),
        transformers.AutoModel if family == "vit" else transformers.AutoModelForCausalLM,
    ):
        model = ztf.from_pretrained(cls, zt)
        assert type(model) is type(reference)
        assert not model.training
        assert _same_weights(model, reference)
        assert torch.equal(_outputs(model), _outputs(reference))
        assert not any(p.device.type == "meta" for p in model.parameters())


def test_save_pretrained_writes_transformers_names_and_layout(published, tmp_path):
    family, st, _, reference = published
    files = ztf.save_pretrained(reference, tmp_path / "ours")
    ours = ztensor.open_sharded(tmp_path / "ours")
    with ztensor.Reader(st / "model.safetensors") as theirs:
        assert set(ours.keys()) == set(theirs.keys())
        for name in theirs.keys():
            assert (ours.read_numpy(name) == theirs.read_numpy(name)).all(), name
    assert files == ["model-00001-of-00001.zt"]
    again = ztf.from_pretrained(type(reference), tmp_path / "ours")
    assert _same_weights(again, reference)


def test_save_pretrained_can_keep_the_models_own_names(published, tmp_path):
    _, _, _, reference = published
    ztf.save_pretrained(reference, tmp_path / "own", save_original_format=False)
    names = set(ztensor.open_sharded(tmp_path / "own").keys())
    assert names == set(reference.state_dict().keys())
    again = ztf.from_pretrained(type(reference), tmp_path / "own")
    assert _same_weights(again, reference)


def test_transformers_load_report_stays_off_the_terminal(published, capfd):
    _, _, zt, reference = published
    capfd.readouterr()
    ztf.from_pretrained(type(reference), zt)
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "Loading weights" not in err


OWNS_ITS_MEMORY = textwrap.dedent("""
    import os, sys, torch, transformers, ztensor.transformers as ztf
    folder = sys.argv[1]
    model = ztf.from_pretrained(transformers.MixtralForCausalLM, folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for name in os.listdir(folder):
        if name.endswith(".zt"):
            # truncated in place: a weight still mapped from the file would be SIGBUS
            open(os.path.join(folder, name), "r+b").truncate(0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    print("owned")
""")


def test_the_model_owns_its_memory_once_loaded(mixtral, tmp_path):
    _, _, zt, _ = mixtral
    shutil.copytree(zt, tmp_path / "zt")
    proc = subprocess.run(
        [sys.executable, "-c", OWNS_ITS_MEMORY, str(tmp_path / "zt")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "owned" in proc.stdout, proc.stderr[-2000:]


# ------------------------------------------------------------------ refusals
def _mixtral_with(mixtral, tmp_path, change):
    _, st, zt, _ = mixtral
    state = load_file(zt, copy=True)
    change(state)
    os.makedirs(tmp_path / "bad")
    save_file(state, tmp_path / "bad" / "model.zt")
    shutil.copy(st / "config.json", tmp_path / "bad")
    return tmp_path / "bad" / "model.zt"


EXPERT = "model.layers.1.block_sparse_moe.experts.2.w1.weight"


def test_an_expert_of_another_shape_is_a_format_error_naming_the_weight(mixtral, tmp_path):
    path = _mixtral_with(mixtral, tmp_path, lambda s: s.__setitem__(EXPERT, torch.zeros(3, 32)))
    with pytest.raises(ztensor.FormatError, match="cannot convert") as err:
        ztf.from_pretrained(transformers.MixtralForCausalLM, path)
    assert err.value.obj == "model.layers.1.mlp.experts.gate_up_proj"
    assert err.value.path == str(path)


def test_a_missing_expert_is_refused(mixtral, tmp_path):
    path = _mixtral_with(mixtral, tmp_path, lambda s: s.pop(EXPERT))
    with pytest.raises(ztensor.ZTensorError) as err:
        ztf.from_pretrained(transformers.MixtralForCausalLM, path)
    assert "gate_up_proj" in str(err.value)


def test_a_missing_weight_is_an_error_naming_it(mixtral, tmp_path):
    path = _mixtral_with(mixtral, tmp_path, lambda s: s.pop("model.norm.weight"))
    with pytest.raises(ztensor.ObjectNotFoundError) as err:
        ztf.from_pretrained(transformers.MixtralForCausalLM, path)
    assert err.value.obj == "model.norm.weight"


def test_a_weight_of_another_shape_is_a_format_error(mixtral, tmp_path):
    path = _mixtral_with(
        mixtral, tmp_path, lambda s: s.__setitem__("model.norm.weight", torch.ones(3))
    )
    with pytest.raises(ztensor.FormatError, match="another shape") as err:
        ztf.from_pretrained(transformers.MixtralForCausalLM, path)
    assert err.value.obj == "model.norm.weight"


def test_a_complex_expert_is_refused_not_cast(mixtral, tmp_path):
    path = _mixtral_with(
        mixtral,
        tmp_path,
        lambda s: s.__setitem__(EXPERT, torch.ones(64, 32, dtype=torch.complex64)),
    )
    with pytest.raises(ztensor.FormatError, match="imaginary part") as err:
        ztf.from_pretrained(transformers.MixtralForCausalLM, path)
    assert err.value.obj == EXPERT


def test_a_checkpoint_that_merely_lacks_a_weight_takes_the_direct_path(mixtral, tmp_path,
                                                                      monkeypatch):
    """transformers._needs_conversion: a checkpoint holding no name the model lacks
    has nothing a conversion could rename; it is refused without transformers'
    loader, which would first build and initialise every missing weight."""
    _, _, _, reference = mixtral
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    state.pop("model.layers.1.mlp.experts.gate_up_proj")
    os.makedirs(tmp_path / "own")
    save_file(state, tmp_path / "own" / "model.zt")
    reference.config.save_pretrained(tmp_path / "own")

    def not_here(*args, **kwargs):
        raise AssertionError("transformers' loader was asked")

    monkeypatch.setattr(ztf, "_load_converted", not_here)
    with pytest.raises(ztensor.ObjectNotFoundError) as err:
        ztf.from_pretrained(transformers.MixtralForCausalLM, tmp_path / "own" / "model.zt")
    assert err.value.obj == "model.layers.1.mlp.experts.gate_up_proj"
