"""Session 15: ztensor.transformers tried as a hostile user would.  Each test names
the one function that keeps its rule.  Tiny models built from config objects."""
import json
import os

import pytest

import ztensor

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import ztensor.torch  # noqa: E402
import ztensor.transformers as ztf  # noqa: E402


def _llama(**changes):
    config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                  max_position_embeddings=64, tie_word_embeddings=False)
    config.update(changes)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))


def test_trust_remote_code_is_refused_before_any_code_is_found(tmp_path):
    """Rule: transformers.from_pretrained refuses trust_remote_code: config.json's
    auto_map and _name_or_path chose which folder's (or Hub repo's) code ran."""
    folder = tmp_path / "ck"
    ztf.save_pretrained(_llama(), folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = tmp_path / "RAN"
    code = f"open({str(ran)!r}, 'w').write('x')\nimport transformers\n" \
           "class EvilModel(transformers.LlamaForCausalLM):\n    pass\n"
    for where in (folder, elsewhere):
        (where / "evil.py").write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
    config["_name_or_path"] = str(elsewhere)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ztensor.UnsupportedError, match="trust_remote_code"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder, trust_remote_code=True)
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert type(model) is transformers.LlamaForCausalLM and not ran.exists()
    assert model.config.name_or_path == str(folder)  # the caller's path, not the file's


def test_a_buffer_made_by_arithmetic_is_held_to_the_bound(tmp_path):
    """Rule: transformers._AllocationBound checks joins, products and broadcasts
    before they are made, and every tensor a call makes: GPT-J's rotary table
    (arange(n)[:, None] * inv_freq, then cat) passed the factory-only check, 1 GiB
    of buffers from a 138 KB checkpoint."""
    config = transformers.GPTJConfig(n_embd=32, n_layer=1, n_head=4, rotary_dim=8,
                                     vocab_size=64, n_positions=64)
    folder = tmp_path / "gptj"
    ztf.save_pretrained(transformers.GPTJForCausalLM(config), folder)
    ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)  # as saved: loads
    data = json.loads((folder / "config.json").read_text())
    data.update(n_positions=2**15, rotary_dim=2**12)
    (folder / "config.json").write_text(json.dumps(data))
    # refused by one rule or the other, whichever the build reaches first: one
    # tensor past the bound, or (session 16) the temporaries alive together
    with pytest.raises(ztensor.LimitError, match=r"134217728 (more|elements)") as info:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert str(folder / "config.json") in str(info.value)


@pytest.mark.parametrize("call, args, elements", [
    ("cat", lambda: ([torch.zeros(3), torch.zeros(4)],), 7),
    ("outer", lambda: (torch.zeros(3), torch.zeros(5)), 15),
    ("matmul", lambda: (torch.zeros(2, 3, 4), torch.zeros(4, 6)), 36),
    ("mul", lambda: (torch.zeros(7, 1), torch.zeros(9)), 63),
    ("__mul__", lambda: (torch.zeros(7, 1), torch.zeros(9)), 63),
    # two tensors, but no broadcast result: checked once made, not over-counted
    ("bucketize", lambda: (torch.zeros(7, 1), torch.zeros(9)), 0),
    ("type_as", lambda: (torch.zeros(7, 1), torch.zeros(9)), 0),
])
def test_what_a_combining_call_makes_is_counted_before_it_is_made(call, args, elements):
    from ztensor.transformers import _requested_elements
    assert _requested_elements(call, args(), {}) == elements


def test_a_sparse_decoy_does_not_lift_the_bound(tmp_path):
    """Rule: transformers._checkpoint_extent counts the bytes present: a sparse
    object's declared shape of 2**60 made every allocation allowed."""
    folder = tmp_path / "ck"
    ztf.save_pretrained(_llama(), folder)
    decoy = ztensor.Tensor({"values": torch.ones(1).numpy(),
                            "coords": torch.zeros((2, 1), dtype=torch.int64).numpy()},
                           shape=(2**40, 2**20), format="sparse_coo")
    with ztensor.Writer(str(folder / "decoy.zt")) as w:
        w.write("decoy", decoy)
    index = json.loads((folder / "model.zt.index.json").read_text())
    index["weight_map"]["decoy"] = "decoy.zt"
    (folder / "model.zt.index.json").write_text(json.dumps(index))
    data = json.loads((folder / "config.json").read_text())
    data["vocab_size"] = 2**34
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ztensor.LimitError, match="at most 67108864"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)


def test_a_failed_save_leaves_the_old_config_with_the_old_weights(tmp_path):
    """Rule: transformers.save_pretrained moves the configs in only after the weights
    (checkpoint_moves.move_staged): a save whose weights failed left the new config.json
    beside the old weights, which then loaded under it without a word."""
    folder = tmp_path / "ck"
    old = _llama()
    ztf.save_pretrained(old, folder)
    before = sorted(os.listdir(folder))
    new = _llama(rms_norm_eps=0.5)
    new.lm_head.weight = torch.nn.Parameter(torch.zeros(128, 32, device="meta"))
    with pytest.raises(ztensor.UnsupportedError, match="meta"):
        ztf.save_pretrained(new, folder)
    assert sorted(os.listdir(folder)) == before
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert loaded.config.rms_norm_eps == old.config.rms_norm_eps
    assert torch.equal(loaded.lm_head.weight, old.lm_head.weight)


def test_a_complex_weight_for_a_real_parameter_is_refused(tmp_path):
    """Rule: transformers._load_weights: Tensor.to dropped the imaginary part with
    only torch's warning (transformers refuses the file)."""
    folder = tmp_path / "ck"
    model = _llama()
    ztf.save_pretrained(model, folder)
    state = ztensor.torch.load_file(str(folder))
    state["model.norm.weight"] = torch.full((32,), complex(2, 7))
    ztensor.torch.save_file(state, str(folder / "model-00001-of-00001.zt"))
    with pytest.raises(ztensor.FormatError, match="imaginary") as info:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert info.value.obj == "model.norm.weight"


def test_the_bound_is_what_the_checkpoint_holds_together(tmp_path):
    """Rule: transformers._checkpoint_extent sums the elements present: a mixture of
    experts builds one fused parameter from a file of one tensor an expert."""
    from ztensor.transformers import _checkpoint_extent
    path = str(tmp_path / "m.zt")
    ztensor.torch.save_file({f"experts.{i}.w": torch.zeros(8, 4) for i in range(16)}, path)
    names, present = _checkpoint_extent(path, None)
    assert (len(names), present) == (16, 16 * 32)


def test_a_config_holding_infinity_as_transformers_writes_it_loads(tmp_path):
    """transformers writes an infinite float as {"__float__": "Infinity"} (Mamba2's
    time_step_limit) and decodes it reading its own file; from_pretrained refused
    the config (transformers.from_pretrained decodes it the same way)."""
    config = transformers.Mamba2Config(hidden_size=32, num_hidden_layers=1, vocab_size=64,
                                       num_heads=4, head_dim=16, state_size=8, n_groups=1,
                                       expand=2, time_step_limit=(0.0, float("inf")))
    torch.manual_seed(0)
    model = transformers.Mamba2ForCausalLM(config)
    folder = tmp_path / "mamba2"
    ztf.save_pretrained(model, folder)
    assert "__float__" in (folder / "config.json").read_text()
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert tuple(loaded.config.time_step_limit) == (0.0, float("inf"))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)
