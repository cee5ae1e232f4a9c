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


# ------------------------------------------------------------------ helper 14's probe
def _qwen2_vl_config(transformers):
    return transformers.Qwen2VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                         max_position_embeddings=64,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2,
                           patch_size=2, temporal_patch_size=2, in_channels=3,
                           spatial_merge_size=1))


def test_a_config_s_fusion_config_is_refused_and_changes_no_class(tf, tmp_path):
    """Rule: transformers._refuse_loading_choices: a config.json's fusion_config made
    transformers' from_pretrained (the path of a checkpoint under older names)
    monkey-patch Qwen2-VL for the whole process: every later model of the type, of
    plain transformers too, was built with the file's patch embedding."""
    import json

    import ztensor
    torch, transformers, ztf = tf
    config = _qwen2_vl_config(transformers)
    model = transformers.Qwen2VLForConditionalGeneration(config)
    before = type(transformers.Qwen2VLForConditionalGeneration(config).model.visual.patch_embed)
    # older names (visual.*): the load would go through transformers' own loader
    import ztensor.torch as zt_torch
    zt_torch.save_file({k.replace("model.visual.", "visual.", 1): v.detach().clone()
                        for k, v in model.state_dict().items()}, str(tmp_path / "model.zt"))
    for where in ("top", "text_config"):
        as_dict = model.config.to_dict()
        (as_dict if where == "top" else as_dict["text_config"])["fusion_config"] = {
            "patch_embeddings": True}
        (tmp_path / "config.json").write_text(json.dumps(as_dict))
        with pytest.raises(ztensor.UnsupportedError, match="fusion_config") as info:
            ztf.from_pretrained(transformers.AutoModelForImageTextToText, tmp_path)
        assert "config.json" in str(info.value)
    after = type(transformers.Qwen2VLForConditionalGeneration(config).model.visual.patch_embed)
    assert after is before


@pytest.mark.parametrize("given", [False, True])
def test_a_sub_config_s_quantization_config_is_refused(tf, tmp_path, given):
    """Rule: transformers._refuse_loading_choices looks in every sub-config, of
    config.json and of a config= given: transformers asks the text config for a
    quantization_config too, and a text_config's started its quantizer (importing
    its integration) where only a top-level one was refused."""
    import json
    import sys

    import ztensor
    torch, transformers, ztf = tf
    config = _qwen2_vl_config(transformers)
    model = transformers.Qwen2VLForConditionalGeneration(config)
    ztf.save_pretrained(model, tmp_path)
    as_dict = json.loads((tmp_path / "config.json").read_text())
    as_dict["text_config"]["quantization_config"] = {"quant_method": "metal", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(as_dict))
    kwargs = {}
    if given:
        kwargs["config"] = transformers.Qwen2VLConfig.from_dict(as_dict)
        kwargs["config"].text_config.quantization_config = {"quant_method": "metal"}
    loaded_before = set(sys.modules)
    with pytest.raises(ztensor.UnsupportedError, match="quantization_config") as info:
        ztf.from_pretrained(transformers.AutoModelForImageTextToText, tmp_path, **kwargs)
    assert ("the config given" if given else "config.json") in str(info.value)
    assert not [m for m in set(sys.modules) - loaded_before if "quant" in m]


def _pt_with_pickle(path, pickle_bytes):
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")


def test_a_pickle_s_bytearray8_is_refused_before_its_declared_length_is_allocated(tmp_path):
    """Rule: foreign/pytorch._dispatch refuses BYTEARRAY8: Python's handler made a
    bytearray of the length the opcode declares before reading (a 12-byte pickle,
    4 GiB of memory; 2**40 a LimitError blaming memory)."""
    import struct

    import ztensor
    path = tmp_path / "x.pt"
    _pt_with_pickle(path, b"\x80\x05\x96" + struct.pack("<Q", 1 << 40) + b".")
    with pytest.raises(ztensor.FormatError, match="BYTEARRAY8") as info:
        ztensor.Reader(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("header", [
    b"{'descr': '<f4', b'fortran_order': False, 'shape': (3, 4), }",  # keys str and bytes
    b"{'descr': '<f4', 'fortran_order': False, 'shape': " + b"(" * 3000 + b")" * 3000
    + b"}",  # nested past literal_eval's stack
])
def test_a_npy_header_numpy_cannot_parse_is_a_format_error_naming_the_input(tmp_path, header):
    """Rule: foreign/numpy_files._read_header maps every error of numpy's header
    parser (a TypeError, a RecursionError escaped as themselves)."""
    import subprocess
    import sys
    import zipfile

    import ztensor
    header = header + b" " * (-(len(header) + 11) % 64) + b"\n"
    npy = b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header + bytes(48)
    (tmp_path / "bad.npy").write_bytes(npy)
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as z:
        z.writestr("a.npy", npy)
    for name in ("bad.npy", "bad.npz"):
        with pytest.raises(ztensor.FormatError, match="array header") as info:
            ztensor.Reader(str(tmp_path / name))
        assert str(tmp_path / name) in str(info.value)
    run = subprocess.run([sys.executable, "-m", "ztensor", "ls", str(tmp_path / "bad.npy")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1


def test_convert_blames_the_input_for_a_gguf_block_tensor_its_blocks_cannot_hold(tmp_path):
    """Rule: convert_inputs.open_any reads every format through Reader.read, which
    applies each object format's rules (gguf_blocks.validate): a Q4_0 tensor without
    dimensions (one element, 0 bytes of blocks) was refused only by the .zt Writer,
    naming the output.  The file still opens and its other tensors read (the
    tensor is refused on read: test_hostile_verify_differential)."""
    import struct
    import subprocess
    import sys

    def text(x):
        return struct.pack("<Q", len(x)) + x.encode()

    head = b"GGUF" + struct.pack("<IQQ", 3, 2, 0)
    head += text("q") + struct.pack("<I", 0) + struct.pack("<IQ", 2, 0)  # Q4_0, no dims
    head += text("f") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 32)
    head += b"\0" * (-len(head) % 32)
    path = tmp_path / "scalar.gguf"
    path.write_bytes(head + bytes(48))
    out = tmp_path / "out.zt"
    run = subprocess.run([sys.executable, "-m", "ztensor", "convert", str(path), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"ztensor: {path}: object 'q'"), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()


# ------------------------------------------------------------------ helper 13's probe
# checkpoint saves killed or crafted (checkpoint_moves)
from killed_saves import killed_save as _killed_save  # noqa: E402


def _read_all(folder):
    import ztensor
    with ztensor.open_sharded(str(folder)) as ck:
        return {k: float(ck.read_numpy(k)[0]) for k in sorted(ck.keys())}


def _hf_cache_layout(root):
    """A checkpoint whose shards are links to ../blobs (a Hugging Face cache's
    snapshot folder), its index a file."""
    import os

    import numpy as np

    import ztensor
    snap, blobs = root / "snap", root / "blobs"
    ztensor.save_sharded({k: np.full(4, 1.0, "f4") for k in "abc"}, str(snap),
                         max_shard_size=16)
    blobs.mkdir()
    for name in sorted(os.listdir(snap)):
        if name.endswith(".zt"):
            os.rename(snap / name, blobs / name)
            os.symlink(os.path.join("..", "blobs", name), snap / name)
    return snap, blobs


def test_a_save_through_links_out_of_the_folder_replaces_the_links_not_their_files(tmp_path):
    """Rule: checkpoint_moves._destination: a link of the folder that leads out of
    it is itself replaced by the new file; the file it points to (a cache's shared
    blob) is left as it was, and every move stays in the folder's record."""
    import os

    import numpy as np

    import ztensor
    snap, blobs = _hf_cache_layout(tmp_path)
    before = {n: (blobs / n).read_bytes() for n in os.listdir(blobs)}
    ztensor.save_sharded({k: np.full(4, 2.0, "f4") for k in "abc"}, str(snap),
                         max_shard_size=16)
    assert _read_all(snap) == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert {n: (blobs / n).read_bytes() for n in os.listdir(blobs)} == before
    assert not any(os.path.islink(snap / n) for n in os.listdir(snap))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="kills a child process")
def test_a_killed_save_through_links_out_of_the_folder_is_undone_whole(tmp_path):
    """Rule: checkpoint_moves._destination keeps every move in the folder, where the
    record holds it: a save killed after two of three shards moved through links to
    ../blobs was undone only in the folder, and the next save's recovery put the old
    index back over two new shards and an old one (read without an error)."""
    import os

    from ztensor.io import checkpoint_moves
    snap, blobs = _hf_cache_layout(tmp_path)
    # out of the staging folder (a shard's own Writer renames within it)
    rule = '".ztensor-staging-" in src and ".ztensor-staging-" not in dst and dst.endswith(".zt")'
    assert _killed_save(snap, 2.0, rule, 3) == 9
    with checkpoint_moves.staged(str(snap)):  # the next save's first step: recovery
        pass
    assert _read_all(snap) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert sorted(os.listdir(blobs)) == sorted(n for n in os.listdir(snap) if n.endswith(".zt"))
    assert all(os.path.islink(snap / n) for n in os.listdir(snap) if n.endswith(".zt"))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="kills a child process")
def test_a_save_killed_after_its_last_move_keeps_the_new_checkpoint(tmp_path):
    """Rule: checkpoint_moves._recover takes a record still saying "moving" whose
    every new file (``placed``) is in place for moves that were all done: a save
    killed after its index moved in, before its record said so, left the new
    checkpoint whole, and the next (refused) save turned it back into the old one.
    The record's temporary file the kill left goes too."""
    import os

    import numpy as np

    import ztensor
    from ztensor.io import checkpoint_moves
    folder = tmp_path / "ck"
    ztensor.save_sharded({k: np.full(4, 1.0, "f4") for k in "abc"}, str(folder),
                         max_shard_size=16)
    rule = 'os.path.basename(dst) == ".ztensor-moving.json"'
    assert _killed_save(folder, 2.0, rule, 2) == 9  # at the record of complete moves
    assert _read_all(folder) == {"a": 2.0, "b": 2.0, "c": 2.0}
    with checkpoint_moves.staged(str(folder)):  # the next save's first step: recovery
        pass
    assert _read_all(folder) == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert [n for n in os.listdir(folder) if n.startswith(".")] == []


def test_a_fifo_at_the_record_s_name_blocks_neither_a_save_nor_a_read(tmp_path):
    """Rule: checkpoint_moves._read_journal opens without blocking: a FIFO named
    .ztensor-moving.json hung every save into the folder (holding its lock) and
    the no-index error of every read."""
    import os
    import subprocess
    import sys
    import textwrap
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    folder = tmp_path / "ck"
    folder.mkdir()
    os.mkfifo(folder / ".ztensor-moving.json")
    code = textwrap.dedent(f"""
        import numpy as np, ztensor
        try:
            ztensor.open_sharded({str(folder)!r})
        except ztensor.ZTensorError as exc:
            print("refused", "no index" in str(exc))
        ztensor.save_sharded({{"a": np.ones(2, "f4")}}, {str(folder)!r})
        print("saved")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert run.stdout.split() == ["refused", "True", "saved"], run.stderr
    assert _read_all(folder) == {"a": 1.0}


def test_a_record_naming_a_file_the_system_cannot_name_is_not_acted_on(tmp_path):
    """Rule: checkpoint_moves._read_journal takes only names the system can encode:
    a record naming "\\ud800x" (a JSON escape) made every later save into the folder
    fail with a bare UnicodeEncodeError, for good."""
    import json

    import numpy as np

    import ztensor
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / ".ztensor-moving.json").write_text(json.dumps(
        {"state": "moving", "aside": [], "new": [["\ud800x", 1, 2]]}))
    for _ in range(2):
        ztensor.save_sharded({"a": np.ones(2, "f4")}, str(folder))
    assert _read_all(folder) == {"a": 1.0}
