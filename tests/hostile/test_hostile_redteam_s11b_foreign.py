"""Red team, session 11 (second round on foreign formats and their objects).

Each test is an input that got through, made with the real writers (numpy, the
package's own quantize / to_gptq), and fails without its fix."""

import numpy as np
import pytest

import ztensor
from ztensor.formats.quantized import to_gptq


def _gptq():
    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    t = ztensor.quantize(w, bits=4, group_size=128)
    tensors = to_gptq(t)
    ref = ztensor.dequantize(tensors, bits=4, group_size=128, checkpoint_format="gptq")
    return t, tensors, ref


@pytest.mark.parametrize("role", ["scales", "qzeros", "g_idx"])
def test_gptq_tensor_of_another_shape_is_refused_not_reshaped(role):
    # scales [G, N] and qzeros [G, N*bits/32] given transposed hold the right number of
    # values: they were reshaped to [G, N] and dequantized to other weights without a
    # word (quantized._Layout.shaped: the layout's shape or flat, nothing else)
    _, tensors, ref = _gptq()
    arr = tensors[role]
    bad = np.ascontiguousarray(arr.T) if arr.ndim == 2 else arr.reshape(2, -1)
    assert bad.size == arr.size and bad.shape != arr.shape
    mapping = dict(tensors, **{role: bad})
    with pytest.raises(ztensor.FormatError, match=f"{role} holds .* needs"):
        ztensor.dequantize(mapping, bits=4, group_size=128, checkpoint_format="gptq")
    with pytest.raises(ztensor.FormatError, match=f"{role} holds"):
        ztensor.from_gptq(**mapping, bits=4, group_size=128)
    # the layout's own shape, and flat as a file stores it, still read
    flat = dict(tensors, **{role: arr.reshape(-1)})
    out = ztensor.dequantize(flat, bits=4, group_size=128, checkpoint_format="gptq")
    assert np.array_equal(out, ref)


def test_quantized_object_with_transposed_scales_is_not_written(tmp_path):
    # the writer runs the read's rule (formats.check_object -> quantized.validate):
    # an object whose scales are [N, G] is refused before a byte is written, not
    # stored and dequantized as [G, N]
    t, _, _ = _gptq()
    comps = dict(t.components)
    comps["scales"] = np.ascontiguousarray(np.asarray(comps["scales"]).reshape(2, 64).T)
    bad = ztensor.Tensor(comps, shape=t.shape, format="quantized_group", attributes=t.attributes)
    with pytest.raises(ztensor.FormatError, match="scales holds"):
        ztensor.dequantize(bad)
    path = tmp_path / "q.zt"
    with pytest.raises(ztensor.FormatError, match="scales holds"):
        with ztensor.Writer(path) as w:
            w.write("w", bad)


@pytest.mark.parametrize(
    "extra",
    [
        {"_attn_implementation": "kernels-community/flash-attn2"},
        {"attn_implementation": "msa|someone/evil@main"},
        {"experts_implementation": "org/repo:fn"},
        {"text_config": {"_attn_implementation": {"": "eager", "vision": "org/evil"}}},
        # a built-in name that falls back to a Hub kernel (kernels installed, no
        # flash_attn), and names that load kernels
        {"_attn_implementation": "flash_attention_2"},
        {"experts_implementation": "deepgemm"},
        {"_attn_implementation": ["eager"]},
    ],
)
def test_config_naming_a_hub_kernel_is_refused_before_anything_is_built(tmp_path, extra):
    # transformers reads an attention/experts implementation "org/repo" (or
    # "msa|org/repo", loaded from ANY repository) as a Hub kernel to download and import
    # (when the `kernels` package is installed): a config.json must not make a load
    # fetch and run code (transformers._refuse_hub_code)
    transformers = pytest.importorskip("transformers")
    import json

    import ztensor.torch as zt
    from ztensor.transformers import from_pretrained

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(cfg)
    zt.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                 str(tmp_path / "model.zt"))
    (tmp_path / "config.json").write_text(json.dumps({**cfg.to_dict(), **extra}))
    with pytest.raises(ztensor.FormatError, match="not torch's own code") as info:
        from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    assert "config.json" in str(info.value)
    # a built-in implementation's name still loads
    (tmp_path / "config.json").write_text(
        json.dumps({**cfg.to_dict(), "_attn_implementation": "eager"}))
    loaded = from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    assert type(loaded).__name__ == "LlamaForCausalLM"
