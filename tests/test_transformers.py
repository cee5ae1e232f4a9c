"""Issue 22, transformers for real: ``ztensor.transformers.from_pretrained`` /
``save_pretrained`` against transformers' own safetensors loading, bit for bit.

The models are tiny and built from config objects (no download): a Llama whose head
is its own weight, and a GPT-2 whose head is tied to the token embedding.  Each is
saved by transformers itself (safetensors); transformers' ``from_pretrained`` of that
folder is the reference every ``.zt`` path must match with ``torch.equal``.

transformers and torch are imported through fixtures (``pytest.importorskip``): the
module collects, and skips, without them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest

import ztensor

IDS = [[1, 5, 9, 100, 3, 7, 42, 0], [127, 64, 2, 2, 8, 90, 11, 33]]


@pytest.fixture(scope="module")
def tf():
    """(torch, transformers, ztensor.transformers), or a skip."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    return torch, transformers, ztf


def _llama(transformers):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
        tie_word_embeddings=False))


def _gpt2(transformers):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64,
        bos_token_id=0, eos_token_id=0))


MAKERS = {"llama": _llama, "gpt2": _gpt2}


@pytest.fixture(scope="module", params=sorted(MAKERS))
def saved(request, tf, tmp_path_factory):
    """(name, folder transformers saved as safetensors, transformers' own load of it)."""
    torch, transformers, _ = tf
    torch.manual_seed(1234)
    model = MAKERS[request.param](transformers)
    model.generation_config.max_new_tokens = 7      # a value the default does not have
    folder = tmp_path_factory.mktemp(request.param) / "st"
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").exists()
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return request.param, folder, reference


def _logits(torch, model):
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def _head_is_embedding(model):
    head, embedding = model.lm_head.weight, model.get_input_embeddings().weight
    return head is embedding and head.data_ptr() == embedding.data_ptr()


def _same_weights(torch, a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------ the smooth path
def test_save_pretrained_then_from_pretrained_is_bit_for_bit(tf, saved, tmp_path):
    torch, transformers, ztf = tf
    name, _, reference = saved
    out = tmp_path / "zt"
    files = ztf.save_pretrained(reference, out)
    assert files == ["model-00001-of-00001.zt"]
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json",
                                       "model-00001-of-00001.zt", "model.zt.index.json"]
    concrete = type(reference)
    for cls in (transformers.AutoModelForCausalLM, concrete):
        model = ztf.from_pretrained(cls, out)
        assert type(model) is concrete
        assert not model.training                       # eval mode, as transformers
        assert torch.equal(_logits(torch, model), _logits(torch, reference))
        assert _same_weights(torch, model, reference)
        assert model.generation_config.max_new_tokens == 7
        assert _head_is_embedding(model) == (name == "gpt2") == _head_is_embedding(reference)
        assert not any(p.device.type == "meta" for p in model.parameters())
    # the tied weight is stored once, under the embedding's name (transformers' choice)
    stored = ztensor.open_sharded(out).keys()
    if name == "gpt2":
        assert "transformer.wte.weight" in stored and "lm_head.weight" not in stored
    # the same names as transformers' own file
    with ztensor.Reader(saved[1] / "model.safetensors") as r:
        assert set(r.keys()) == set(stored)


def test_cli_convert_of_the_transformers_folder(tf, saved, tmp_path):
    """``ztensor convert ST_DIR ZT_DIR`` copies config.json and generation_config.json
    beside the .zt shards, so the converted folder loads as it is."""
    torch, transformers, ztf = tf
    _, folder, reference = saved
    out = tmp_path / "converted"
    proc = subprocess.run([sys.executable, "-m", "ztensor", "convert", str(folder), str(out)],
                          capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stderr
    assert (out / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, out)
    assert torch.equal(_logits(torch, model), _logits(torch, reference))
    assert model.generation_config.max_new_tokens == 7
    # load_file takes the folder too: the same tensors transformers saved
    from ztensor.torch import load_file
    from safetensors.torch import load_file as st_load
    ours, theirs = load_file(out), st_load(folder / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_converted_back_to_safetensors_loads_in_transformers(tf, saved, tmp_path):
    """Our save_pretrained, converted to safetensors shards, is a folder transformers
    loads with its own from_pretrained."""
    torch, transformers, ztf = tf
    _, _, reference = saved
    ztf.save_pretrained(reference, tmp_path / "zt", max_shard_size=20_000)
    ztensor.convert(tmp_path / "zt", tmp_path / "st", format="safetensors")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "st")
    assert torch.equal(_logits(torch, model), _logits(torch, reference))
    assert _head_is_embedding(model) == _head_is_embedding(reference)


@pytest.mark.parametrize("spelling", ["torch_dtype", "dtype", "name"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_dtype_is_honoured_as_transformers_honours_it(tf, saved, tmp_path, spelling,
                                                      dtype_name):
    torch, transformers, ztf = tf
    name, folder, reference = saved
    dtype = getattr(torch, dtype_name)
    ztf.save_pretrained(reference, tmp_path / "zt")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    kwargs = {"dtype": dtype_name} if spelling == "name" else {spelling: dtype}
    ours = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "zt", **kwargs)
    assert ours.dtype == dtype and all(p.dtype == dtype for p in ours.parameters())
    assert ours.config.dtype == dtype
    assert torch.equal(_logits(torch, ours), _logits(torch, theirs))
    assert _head_is_embedding(ours) == (name == "gpt2")


def test_a_half_precision_checkpoint_loads_in_its_own_dtype_by_default(tf, saved, tmp_path):
    """dtype "auto" (the default, as in transformers 5): the config's dtype."""
    torch, transformers, ztf = tf
    _, folder, reference = saved
    half = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ztf.save_pretrained(half, tmp_path / "zt")
    assert json.loads((tmp_path / "zt" / "config.json").read_text())["dtype"] == "bfloat16"
    ours = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "zt")
    assert ours.dtype == torch.bfloat16
    assert torch.equal(_logits(torch, ours), _logits(torch, half))
    as_float = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "zt",
                                   dtype=torch.float32)
    assert as_float.dtype == torch.float32


def test_sharded_round_trip_and_a_smaller_resave(tf, saved, tmp_path):
    torch, transformers, ztf = tf
    name, _, reference = saved
    out = tmp_path / "zt"
    files = ztf.save_pretrained(reference, out, max_shard_size="20KB")
    assert len(files) >= 4
    index = json.loads((out / "model.zt.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(files)
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, out / "model.zt.index.json")
    assert torch.equal(_logits(torch, model), _logits(torch, reference))
    assert _head_is_embedding(model) == (name == "gpt2")
    # a resave in fewer shards leaves no shard of the earlier save behind
    again = ztf.save_pretrained(model, out, max_shard_size="5GB")
    assert sorted(n for n in os.listdir(out) if n.endswith(".zt")) == again
    assert torch.equal(_logits(torch, ztf.from_pretrained(
        transformers.AutoModelForCausalLM, out)), _logits(torch, reference))


def test_one_zt_file_beside_its_config(tf, saved, tmp_path):
    """A single .zt file written by ztensor.torch.save_model: the tied GPT-2 weight is
    stored there under the head's name (the first in sorted order), and still loads
    tied, into the embedding as well."""
    torch, transformers, ztf = tf
    name, folder, reference = saved
    from ztensor.torch import save_model
    save_model(reference, tmp_path / "weights.zt")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    stored = ztensor.Reader(tmp_path / "weights.zt").keys()
    if name == "gpt2":
        assert "lm_head.weight" in stored and "transformer.wte.weight" not in stored
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "weights.zt")
    assert torch.equal(_logits(torch, model), _logits(torch, reference))
    assert _head_is_embedding(model) == (name == "gpt2")


# ------------------------------------------------------------------ memory
RSS_SCRIPT = textwrap.dedent("""
    import sys
    import torch, transformers
    from ztensor.transformers import from_pretrained
    import transformers.models.llama.modeling_llama    # imported before the baseline

    def status(field):   # KiB
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))

    before = status("VmRSS")
    # the peak from here on: the imports' own peak is forgotten (a lifetime peak
    # against a resident size that swapping lowered once counted them as the load's)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    model = from_pretrained(transformers.AutoModelForCausalLM, sys.argv[1])
    after = status("VmHWM")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    print(size, (after - before) * 1024)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_weights_are_never_allocated_twice(tf, tmp_path):
    """Peak RSS of a load over the resident size before it, in a fresh process: the
    model plus one shard, well under 1.5 models (building the model with real
    weights and then loading is 2 or more: 2.1 measured)."""
    torch, transformers, ztf = tf
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1536,
                                      num_hidden_layers=8, num_attention_heads=8,
                                      vocab_size=8192, tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = transformers.LlamaForCausalLM(config)
    # the weights as a state dict of small-valued tensors, written without building
    # the model for real in this process (that would cost the time, not the test)
    state = {k: torch.full(v.shape, 0.01) for k, v in shapes.state_dict().items()}
    from ztensor.sharded import save_sharded
    save_sharded(state, tmp_path, max_shard_size="8MB")
    config.save_pretrained(tmp_path)
    model_bytes = sum(v.numel() * 4 for v in state.values())
    del state
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tmp_path)],
                          capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stderr
    size, grew = map(int, proc.stdout.split()[-2:])
    assert size == model_bytes > 100 << 20
    assert grew < 1.5 * model_bytes, (grew / model_bytes)


# ------------------------------------------------------------------ rules and errors
def _folder_with(tf, tmp_path, state_dict, config):
    from ztensor.torch import save_file
    save_file(state_dict, tmp_path / "model.zt")
    config.save_pretrained(tmp_path)
    return tmp_path / "model.zt"


def test_a_missing_weight_is_an_error_naming_it(tf, saved, tmp_path):
    torch, transformers, ztf = tf
    _, _, reference = saved
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    victim = next(k for k in state if "layers.1" in k or ".h.1." in k)
    del state[victim]
    state.pop("lm_head.weight", None) if "transformer.wte.weight" in state else None
    path = _folder_with(tf, tmp_path, state, reference.config)
    with pytest.raises(ztensor.ObjectNotFoundError) as err:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, path)
    assert err.value.obj == victim and err.value.path == str(path)
    assert isinstance(err.value, ztensor.ZTensorError)


def test_a_wrong_shape_is_a_format_error(tf, saved, tmp_path):
    torch, transformers, ztf = tf
    _, _, reference = saved
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    state.pop("lm_head.weight") if "transformer.wte.weight" in state else None
    victim = sorted(state)[-1]
    state[victim] = torch.zeros(3, 3)
    path = _folder_with(tf, tmp_path, state, reference.config)
    with pytest.raises(ztensor.FormatError, match=r"shape \[3, 3\]") as err:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, path)
    assert err.value.obj == victim


def test_unexpected_tensors_are_skipped_with_a_warning(tf, saved, tmp_path):
    torch, transformers, ztf = tf
    _, _, reference = saved
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    state.pop("lm_head.weight") if "transformer.wte.weight" in state else None
    state["extra.head.weight"] = torch.ones(2)
    path = _folder_with(tf, tmp_path, state, reference.config)
    with pytest.warns(UserWarning, match="extra.head.weight"):
        model = ztf.from_pretrained(transformers.AutoModelForCausalLM, path)
    assert torch.equal(_logits(torch, model), _logits(torch, reference))


def test_tied_names_with_different_values_load_untied(tf, tmp_path):
    """transformers' rule: both tied names present with different values means they
    are not the same weight; a warning, and each keeps its own."""
    torch, transformers, ztf = tf
    torch.manual_seed(5)
    model = _gpt2(transformers)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    path = _folder_with(tf, tmp_path, state, model.config)
    with pytest.warns(UserWarning, match="differ"):
        got = ztf.from_pretrained(transformers.AutoModelForCausalLM, path)
    assert not _head_is_embedding(got)
    assert torch.equal(got.lm_head.weight, state["lm_head.weight"])
    assert torch.equal(got.transformer.wte.weight, state["transformer.wte.weight"])


def test_the_config_must_be_there_and_be_an_object(tf, saved, tmp_path):
    torch, transformers, ztf = tf
    _, _, reference = saved
    ztf.save_pretrained(reference, tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ztensor.FormatError, match="JSON object"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ztensor.FormatError, match="not a readable config"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ztensor.FormatError, match="no config.json"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    with pytest.raises(FileNotFoundError):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "absent.zt")


def test_import_ztensor_does_not_import_transformers(tf):
    code = ("import sys, ztensor, ztensor.torch; "
            "print('ztensor.transformers' in sys.modules, 'transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


# ------------------------------------------------------------------ over HTTP
def test_from_a_url(tf, saved, tmp_path):
    """The index's URL: config.json and generation_config.json are read beside it,
    the shards with range requests (nginx on loopback, as tests/test_remote.py)."""
    torch, transformers, ztf = tf
    import test_remote
    if test_remote.NGINX is None:
        pytest.skip("nginx is not installed (.ci/run installs it)")
    _, _, reference = saved
    server = test_remote.server.__wrapped__(tmp_path)
    url, www, _ = next(server)
    try:
        ztf.save_pretrained(reference, www / "m", max_shard_size="30KB")
        model = ztf.from_pretrained(transformers.AutoModelForCausalLM,
                                    f"{url}/m/model.zt.index.json")
        assert torch.equal(_logits(torch, model), _logits(torch, reference))
        assert model.generation_config.max_new_tokens == 7
        (www / "m" / "generation_config.json").unlink()          # optional: a 404
        ztf.from_pretrained(transformers.AutoModelForCausalLM, f"{url}/m/model.zt.index.json")
        (www / "m" / "config.json").unlink()
        with pytest.raises(ztensor.FormatError, match="no config.json"):
            ztf.from_pretrained(transformers.AutoModelForCausalLM,
                                f"{url}/m/model.zt.index.json")
    finally:
        next(server, None)


def test_modules_kept_in_float32_as_transformers_keeps_them(tf, tmp_path):
    """T5 keeps its ``wo`` projections in float32 when loaded in float16
    (``_keep_in_fp32_modules``); every weight's dtype and value, and the logits,
    match transformers'."""
    torch, transformers, ztf = tf
    torch.manual_seed(3)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0))
    t5.save_pretrained(tmp_path / "st")
    ztf.save_pretrained(t5, tmp_path / "zt")
    auto = transformers.AutoModelForSeq2SeqLM
    theirs = auto.from_pretrained(tmp_path / "st", dtype=torch.float16)
    ours = ztf.from_pretrained(auto, tmp_path / "zt", dtype=torch.float16)
    mine, ref = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == ref.keys()
    assert all(mine[k].dtype == ref[k].dtype and torch.equal(mine[k], ref[k]) for k in ref)
    assert ours.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.float32
    ids = torch.tensor(IDS)
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids, decoder_input_ids=ids).logits,
                           theirs(input_ids=ids, decoder_input_ids=ids).logits)


def test_other_keywords_go_where_transformers_sends_them(tf, saved, tmp_path):
    """A config attribute updates the config; the rest goes to from_config."""
    torch, transformers, ztf = tf
    _, _, reference = saved
    ztf.save_pretrained(reference, tmp_path)
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path, use_cache=False,
                                attn_implementation="eager")
    assert model.config.use_cache is False and model.config._attn_implementation == "eager"
    assert torch.equal(model.state_dict()[sorted(model.state_dict())[0]],
                       reference.state_dict()[sorted(model.state_dict())[0]])
