"""Red-team variants nobody listed (issue 21, round three) against what writes: the
exporters, ``ztensor convert`` (files and checkpoint directories) and the torch and
transformers save paths.  Each test is a break found by trying docs/threat-model.md's
promises; each names the rule it holds and the one function keeping it.
"""
import json
import os
import struct
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ztensor
from ztensor.container import writer as zt_writer
from ztensor.foreign import export
from ztensor.tools.cli import main

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _listing(folder):
    return sorted(os.listdir(folder))


def _safetensors_header(path, tensors, metadata=None):
    """A safetensors file as an attacker writes one: its JSON header by hand (the
    safetensors package cannot be given a lone surrogate; json.dumps escapes it)."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, "<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return path


# ------------------------------------------------------------------ .zt is a target too
# Rule: an exporter checks that its format holds every name and value before a byte is
# written (export.plan_zt for .zt, as plan_safetensors/plan_npz/plan_gguf for theirs).
# .zt had no plan: a tensor named "" (safetensors and torch.save write one) or a lone
# surrogate reached the Writer mid-file, whose error named the OUTPUT and no object.


def _empty_name_inputs(tmp_path):
    torch = pytest.importorskip("torch")
    st_path = tmp_path / "in.safetensors"
    safetensors_numpy.save_file({"a": np.ones(2, np.float32), "": np.zeros(2, np.float32)}, st_path)
    pt_path = tmp_path / "in.pt"
    torch.save({"a": torch.ones(2), "": torch.zeros(2)}, pt_path)
    return {"safetensors": st_path, "pt": pt_path}


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
def test_convert_to_zt_refuses_an_empty_name_naming_the_input(tmp_path, kind, capsys):
    source = _empty_name_inputs(tmp_path)[kind]
    before = _listing(tmp_path)
    with pytest.raises(ztensor.UnsupportedError) as info:
        ztensor.convert(source, tmp_path / "out.zt")
    assert info.value.path == str(source) and info.value.obj == ""
    assert _listing(tmp_path) == before  # no output, no temporary file
    assert main(["convert", "-q", str(source), str(tmp_path / "out.zt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ztensor: {source}: object ''")
    assert _listing(tmp_path) == before


@pytest.mark.parametrize(
    "tensors, metadata, obj",
    [
        ({"a": np.ones(2), "z\udc80": np.ones(2)}, None, "z\udc80"),
        ({"a": np.ones(2)}, {"note": "\udc80"}, None),
        ({"a": np.ones(2)}, {"\udc80": "v"}, None),
    ],
    ids=["name", "metadata-value", "metadata-key"],
)
def test_convert_to_zt_refuses_lone_surrogates_naming_the_input(tmp_path, tensors, metadata, obj):
    # since session 13 refused at open (names.check_unicode), as the safetensors
    # package refuses the file: a FormatError naming the input and the string
    source = _safetensors_header(tmp_path / "in.safetensors", tensors, metadata)
    before = _listing(tmp_path)
    with pytest.raises(ztensor.FormatError, match="not valid Unicode") as info:
        ztensor.convert(source, tmp_path / "out.zt")
    assert info.value.path == str(source) and "\\udc80" in str(info.value)
    assert _listing(tmp_path) == before


# every code point, lone surrogates included (and the empty name: max_size allows it)
_NAMES = st.text(
    st.characters(exclude_categories=()) | st.sampled_from(["\udc80", "\ud800"]), max_size=6
)


@settings(max_examples=40, deadline=None)
@given(names=st.lists(_NAMES, min_size=1, max_size=4, unique=True))
def test_convert_to_zt_writes_every_name_or_nothing(tmp_path_factory, names):
    """Property: any safetensors names, converted to .zt, come back as the same
    names with the same values, or the conversion refuses naming the input, and
    leaves the folder as it was."""
    folder = tmp_path_factory.mktemp("names")
    tensors = {name: np.full(2, i, np.float32) for i, name in enumerate(names)}
    source = _safetensors_header(folder / "in.safetensors", tensors)
    out = folder / "out.zt"
    try:
        ztensor.convert(source, out)
    except ztensor.ZTensorError as exc:
        assert exc.path == str(source)
        assert _listing(folder) == ["in.safetensors"]
        return
    with ztensor.Reader(out) as r:
        assert sorted(r.keys()) == sorted(names)
        for i, name in enumerate(names):
            assert np.array_equal(r.read_numpy(name), tensors[name])


def _checkpoint(tmp_path, second):
    """A two-shard safetensors checkpoint (Hugging Face's layout), written by the
    safetensors package; ``second``: the tensors of shard 2."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {"a": np.ones(3, np.float32)},
        "model-00002-of-00002.safetensors": second,
    }
    weight_map = {}
    for file, tensors in shards.items():
        safetensors_numpy.save_file(tensors, folder / file)
        weight_map.update({name: file for name in tensors})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text("{}")
    return folder


@pytest.mark.parametrize("out", ["out", "one.zt"])
def test_checkpoint_to_zt_refuses_before_any_shard_is_written(tmp_path, out):
    """convert._check_shards_fit plans every shard for .zt too (it said a .zt shard
    holds everything a Reader gives): shard 1 was written, then shard 2's empty
    name refused, leaving an output directory with one shard and no index."""
    folder = _checkpoint(tmp_path, {"": np.zeros(2, np.float32)})
    with pytest.raises(ztensor.UnsupportedError) as info:
        ztensor.convert(folder, tmp_path / out)
    assert info.value.obj == ""
    assert _listing(tmp_path) == ["ckpt"]  # no directory, no file


def test_shard_outputs_differing_only_in_case_are_refused(tmp_path):
    """convert._plan_checkpoint: on macOS and Windows ``Part.zt`` and ``part.zt``
    are one file, the second shard written over the first under an index naming
    both; the plan compares output names as those file systems do."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    safetensors_numpy.save_file({"a": np.ones(2, np.float32)}, folder / "Part.safetensors")
    safetensors_numpy.save_file({"b": np.ones(2, np.float32)}, folder / "part.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "Part.safetensors", "b": "part.safetensors"}})
    )
    with pytest.raises(ztensor.FormatError, match="Part.safetensors.*part.safetensors"):
        ztensor.convert(folder, tmp_path / "out")
    assert _listing(tmp_path) == ["ckpt"]
    # Hugging Face's numbered names, and one merged file, have no such collision
    assert ztensor.convert(folder, tmp_path / "st", format="safetensors") == 2
    assert ztensor.convert(folder, tmp_path / "one.zt") == 2


def test_a_link_at_the_output_is_an_existing_output(tmp_path):
    """convert.convert: a link whose target does not exist yet is still an output
    there (the file written goes where it points): --force, as for any output."""
    source = tmp_path / "in.npy"
    np.save(source, np.arange(3.0))
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "out.zt"
    link.symlink_to(tmp_path / "elsewhere" / "x.zt")
    with pytest.raises(ztensor.ZTensorError, match="force"):
        ztensor.convert(source, link)
    assert _listing(tmp_path / "elsewhere") == []
    ztensor.convert(source, link, force=True)  # the link kept, its target written
    assert link.is_symlink() and _listing(tmp_path / "elsewhere") == ["x.zt"]


# ------------------------------------------------------------------ failing part way
# Rule: a checkpoint conversion that fails after it has started writing (a full disk,
# an interrupt) removes the files it added and the folder it made
# (convert._convert_checkpoint); before, the shards written stayed, with no index.


def _fail_on_second_shard(monkeypatch, exc):
    calls = []
    write, stored = zt_writer.Writer.write, export._stored_view

    def writer_write(self, name, *args, **kwargs):
        calls.append(name)
        if name == "b":
            raise exc
        return write(self, name, *args, **kwargs)

    def stored_elements(reader, name):
        calls.append(name)
        if name == "b":
            raise exc
        return stored(reader, name)

    monkeypatch.setattr(zt_writer.Writer, "write", writer_write)
    monkeypatch.setattr(export, "_stored_view", stored_elements)
    return calls


@pytest.mark.parametrize("fmt", ["zt", "safetensors"])
@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_checkpoint_conversion_failing_part_way_leaves_nothing(tmp_path, monkeypatch, fmt, exc):
    folder = _checkpoint(tmp_path, {"b": np.zeros(2, np.float32)})
    calls = _fail_on_second_shard(monkeypatch, exc)
    with pytest.raises(type(exc)):
        ztensor.convert(folder, tmp_path / "out", format=fmt)
    assert "a" in calls and "b" in calls  # shard 1 was written before shard 2 failed
    assert _listing(tmp_path) == ["ckpt"]


def test_a_failed_conversion_into_an_existing_folder_keeps_what_was_there(tmp_path, monkeypatch):
    folder = _checkpoint(tmp_path, {"b": np.zeros(2, np.float32)})
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _fail_on_second_shard(monkeypatch, OSError(28, "No space left on device"))
    with pytest.raises(OSError):
        ztensor.convert(folder, out)
    assert _listing(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------ GGUF and llama.cpp
# Rule: plan_gguf refuses what llama.cpp cannot read.  Its reader (gguf.cpp) divides
# INT64_MAX by every dimension but the innermost: a 0 there crashes it (SIGFPE).


def test_gguf_refuses_a_zero_dimension_llama_cpp_divides_by(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    source = tmp_path / "in.npy"
    np.save(source, np.zeros((0, 3), np.float32))
    before = _listing(tmp_path)
    with pytest.raises(ztensor.UnsupportedError, match="dimension of 0") as info:
        ztensor.convert(source, tmp_path / "out.gguf")
    assert info.value.path == str(source) and info.value.obj == "in"
    assert _listing(tmp_path) == before
    # a zero innermost dimension (GGUF's ne[0]) is an empty tensor llama.cpp reads
    np.save(source, np.zeros((3, 0), np.float32))
    ztensor.convert(source, tmp_path / "out.gguf")
    (tensor,) = gguf.GGUFReader(str(tmp_path / "out.gguf")).tensors
    assert tensor.name == "in" and int(np.prod(tensor.shape)) == 0


# ------------------------------------------------------------------ torch save paths
# Rule: the elements stored are the ones the tensor shows, or a ZTensorError naming it
# (frameworks/torch_bridge.to_numpy_for_writing, used by every torch write path).


def test_conjugate_and_negative_views_store_the_values_they_show(tmp_path):
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt

    c = torch.tensor([1 + 2j, 3 - 4j])
    x = torch.arange(4.0)
    tensors = {"conj": c.conj(), "neg": torch.conj_physical(c).imag.conj()}
    tensors["neg_view"] = torch.ops.aten._neg_view(x)
    assert tensors["conj"].is_conj() and tensors["neg_view"].is_neg()
    zt.save_file(tensors, tmp_path / "m.zt")
    back = zt.load_file(tmp_path / "m.zt")
    for name, t in tensors.items():
        assert torch.equal(back[name], t.resolve_conj().resolve_neg()), name


@pytest.mark.parametrize("kind", ["meta", "nested"])
def test_tensors_without_dense_elements_are_a_clean_error(tmp_path, kind):
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt

    if kind == "meta":
        t = torch.empty(3, device="meta")
    else:
        with warnings.catch_warnings():  # torch: the strided layout is a prototype
            warnings.simplefilter("ignore", UserWarning)
            t = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
        assert t.layout == torch.strided  # not caught as sparse: it reached torch's numpy()
    with pytest.raises(ztensor.UnsupportedError) as info:
        zt.save_file({"ok": torch.ones(2), "t": t}, tmp_path / "m.zt")
    assert info.value.obj == "t"
    assert _listing(tmp_path) == []


# ------------------------------------------------------------------ transformers
# Rule: save_pretrained writes only what from_pretrained loads back
# (transformers._check_sharing_is_tied): memory two parameters share is stored once,
# and only a declared tie gives the second name back on loading.


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=8, bos_token_id=0, eos_token_id=0
    )
    return transformers, transformers.GPT2LMHeadModel(config).eval()


def test_save_pretrained_refuses_sharing_the_model_does_not_declare(tmp_path):
    pytest.importorskip("torch")
    transformers, model = _tiny_gpt2()
    from ztensor.transformers import from_pretrained, save_pretrained

    model.transformer.h[1].mlp.c_fc.weight = model.transformer.h[0].mlp.c_fc.weight
    with pytest.raises(ztensor.FormatError, match="share memory") as info:
        save_pretrained(model, tmp_path / "m")
    assert "transformer.h.1.mlp.c_fc.weight" in str(info.value)
    assert not (tmp_path / "m").exists()  # nothing written, not even config.json
    # the declared tie (lm_head <- wte) still saves once and loads back tied
    _, model = _tiny_gpt2()
    save_pretrained(model, tmp_path / "tied")
    back = from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "tied")
    assert back.lm_head.weight is back.transformer.wte.weight
