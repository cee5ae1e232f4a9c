"""`ztensor convert` of a whole Hugging Face checkpoint folder: the output directory is a
complete checkpoint (every file that is not weights copied byte for byte), a file output
merges every shard into that one file, and ``--format safetensors`` writes the shards,
names and index transformers' own ``from_pretrained`` loads.  Hostile folders (a link
out of the folder, a FIFO) are refused before anything is written."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ztensor
from ztensor.tools.cli import main

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

# the files beside the weights that make a checkpoint loadable, with real-looking bytes
CONFIG_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 8}\n',
    "generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2}\n',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}',
    "tokenizer_config.json": b'{"model_max_length": 2048, "chat_template": "{{ x }}"}',
    "special_tokens_map.json": b'{"bos_token": "<s>", "eos_token": "</s>"}',
    "vocab.json": b'{"<s>": 0, "</s>": 1, "a": 2}',
    "merges.txt": b"#version: 0.2\na b\n",
    "tokenizer.model": bytes(range(256)) * 3,   # sentencepiece: binary, not weights
    "chat_template.jinja": "{% for m in messages %}{{ m['content'] }}\u00e9{% endfor %}"
                           .encode("utf-8"),
    "README.md": b"# tiny\n\nA model card.\n",
    ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
}


def _tensors(shards):
    g = torch.Generator().manual_seed(7)
    parts = []
    for s in range(shards):
        parts.append({
            f"model.layers.{s}.q.weight": torch.randn(6, 4, generator=g),
            f"model.layers.{s}.k.weight": torch.randn(6, 4, generator=g).to(torch.bfloat16),
            f"model.layers.{s}.norm": torch.randn(5, generator=g).to(torch.float16),
            f"model.layers.{s}.ids": torch.arange(5 + s, dtype=torch.int64) - 2,
        })
    return parts


def hf_folder(folder, shards=3, extra=CONFIG_FILES, keep=None):
    """A checkpoint as transformers saves it: safetensors shards written by the
    safetensors package, model.safetensors.index.json, and its config/tokenizer files
    (only the tensors ``keep`` takes, when given).  Returns every tensor by name."""
    os.makedirs(folder, exist_ok=True)
    tensors, weight_map = {}, {}
    for s, part in enumerate(_tensors(shards)):
        part = {n: t for n, t in part.items() if keep is None or keep(t)}
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        st_torch.save_file(part, os.path.join(folder, file), metadata={"format": "pt"})
        tensors.update(part)
        weight_map.update({name: file for name in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    for name, data in extra.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return tensors


def assert_same(got, want):
    """Value by value and bit by bit (bf16 and f16 compared as their bits)."""
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    if want.dtype in (torch.bfloat16, torch.float16):
        got, want = got.view(torch.int16), want.view(torch.int16)
    assert torch.equal(got, want)


def assert_copied(src, out, names=CONFIG_FILES):
    for name in names:
        with open(os.path.join(src, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            assert a.read() == b.read(), name
        assert not os.path.islink(os.path.join(out, name))


def _as_torch(arr):
    arr = np.array(arr)
    if arr.dtype.itemsize == 2 and arr.dtype.kind not in "iuf":  # ml_dtypes' bfloat16
        arr = arr.view(np.uint16)
    return torch.from_numpy(arr)


def run_cli(*argv, timeout=60):
    """The command in a child process: a hang is a failure, not a stuck suite."""
    try:
        out = subprocess.run([sys.executable, "-m", "ztensor", *map(str, argv)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ztensor {' '.join(map(str, argv))} hung")
    return out


def assert_refused(code, err):
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("ztensor: ") and "Traceback" not in err, err


# ------------------------------------------------------------------ directory, .zt
def test_zt_directory_is_a_complete_checkpoint(tmp_path):
    tensors = hf_folder(tmp_path / "hf")
    assert ztensor.convert(tmp_path / "hf", tmp_path / "out") == len(tensors)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        [f"model-{i:05d}-of-00003.zt" for i in (1, 2, 3)] + ["model.zt.index.json"]
        + list(CONFIG_FILES))
    assert_copied(tmp_path / "hf", tmp_path / "out")
    with ztensor.open_sharded(tmp_path / "out") as r:
        assert sorted(r.keys()) == sorted(tensors)
        for name, want in tensors.items():
            assert_same(r.read_torch(name), want)


# ------------------------------------------------------------------ --format safetensors
def test_safetensors_directory_follows_hugging_face(tmp_path, capsys):
    tensors = hf_folder(tmp_path / "hf")
    assert main(["convert", "-q", str(tmp_path / "hf"), str(tmp_path / "zt")]) == 0
    # .zt shards back to safetensors: HF's names, HF's index, the config files again
    assert main(["convert", "-q", "--format", "safetensors", str(tmp_path / "zt"),
                 str(tmp_path / "st")]) == 0
    shards = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(os.listdir(tmp_path / "st")) == sorted(
        shards + ["model.safetensors.index.json"] + list(CONFIG_FILES))
    assert_copied(tmp_path / "hf", tmp_path / "st")
    index = json.loads((tmp_path / "st" / "model.safetensors.index.json").read_text())
    assert set(index) == {"metadata", "weight_map"}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size()
                                                  for t in tensors.values())
    assert sorted(index["weight_map"]) == sorted(tensors)
    loaded = {}
    for shard in shards:
        part = st_torch.load_file(str(tmp_path / "st" / shard))
        assert all(index["weight_map"][name] == shard for name in part)
        loaded.update(part)
    assert sorted(loaded) == sorted(tensors)
    for name, want in tensors.items():
        assert_same(loaded[name], want)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "st" / shards[0]), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}  # transformers requires it when present


def test_one_shard_is_model_safetensors_without_an_index(tmp_path):
    (tmp_path / "one").mkdir()
    with ztensor.Writer(str(tmp_path / "one" / "w.zt")) as w:
        w.write_numpy("w", np.arange(6, dtype=np.float32))
    (tmp_path / "one" / "config.json").write_bytes(CONFIG_FILES["config.json"])
    ztensor.convert(tmp_path / "one", tmp_path / "out", format="safetensors")
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors"]
    np.testing.assert_array_equal(
        st_torch.load_file(str(tmp_path / "out" / "model.safetensors"))["w"].numpy(),
        np.arange(6, dtype=np.float32))
    # an indexed checkpoint of one shard: HF writes no index either
    hf_folder(tmp_path / "hf1", shards=1, extra={})
    ztensor.convert(tmp_path / "hf1", tmp_path / "out1", format="safetensors")
    assert os.listdir(tmp_path / "out1") == ["model.safetensors"]


def test_transformers_loads_the_converted_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "hf", max_shard_size="50KB")
    written = sorted(os.listdir(tmp_path / "hf"))
    assert "model.safetensors.index.json" in written
    assert len([n for n in written if n.endswith(".safetensors")]) > 1
    ids = torch.tensor([[1, 5, 9, 33, 2, 63]])
    with torch.no_grad():
        want = model(ids).logits
    assert main(["convert", "-q", str(tmp_path / "hf"), str(tmp_path / "zt")]) == 0
    assert main(["convert", "-q", "--format", "safetensors", str(tmp_path / "zt"),
                 str(tmp_path / "st")]) == 0
    others = [n for n in written if not n.endswith((".safetensors", ".index.json"))]
    assert "config.json" in others and "generation_config.json" in others
    assert_copied(tmp_path / "hf", tmp_path / "st", others)
    for folder in ("hf", "st"):  # the input too: the comparison is of like with like
        again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / folder))
        with torch.no_grad():
            got = again.eval()(ids).logits
        assert torch.equal(got, want), folder


# ------------------------------------------------------------------ one output file
@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".gguf", ".zt"])
def test_a_checkpoint_into_one_file(tmp_path, suffix):
    if suffix == ".gguf":
        pytest.importorskip("gguf")
    # numpy has no bf16: an .npz export refuses such a tensor (test_hostile_s14_write)
    keep = (lambda t: t.dtype != torch.bfloat16) if suffix == ".npz" else None
    tensors = hf_folder(tmp_path / "hf", keep=keep)
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / ("merged" + suffix)
    assert main(["convert", "-q", str(tmp_path / "hf"), str(target)]) == 0
    assert os.listdir(tmp_path / "out") == [target.name]  # one file, nothing beside it
    if suffix == ".safetensors":
        loaded = st_torch.load_file(str(target))
    else:
        with ztensor.Reader(str(target)) as r:
            loaded = {name: _as_torch(r.read_numpy(name)) for name in r}
    assert sorted(loaded) == sorted(tensors)
    for name, want in tensors.items():
        got = loaded[name]
        if want.dtype == torch.bfloat16:  # GGUF keeps bf16 as its bits
            got = got.view(torch.bfloat16)
        assert_same(got, want)
    if suffix in (".safetensors", ".zt"):  # the shards' attributes are the file's
        with ztensor.Reader(str(target)) as r:
            assert r.attributes == {"format": "pt"}


def test_a_file_output_that_cannot_be_written_is_refused_and_absent(tmp_path, capsys):
    hf_folder(tmp_path / "hf", extra={})
    # uint8 has no GGUF tensor type; tensors x and x.npy would both answer to "x.npy"
    st_torch.save_file({"u": torch.arange(3, dtype=torch.uint8), "x": torch.ones(2)},
                       str(tmp_path / "hf" / "model-00001-of-00003.safetensors"))
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if "layers.0" not in n}
    index["weight_map"].update({"u": "model-00001-of-00003.safetensors",
                                "x": "model-00001-of-00003.safetensors"})
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    st_torch.save_file({"x.npy": torch.zeros(2)}, str(tmp_path / "hf" / "extra.safetensors"))
    index["weight_map"]["x.npy"] = "extra.safetensors"
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "out").mkdir()
    cases = [("a.npz", "x.npy"), ("a.safetensors --format zt", "format"),
             ("a.bin.zt --format safetensors", "format")]
    try:
        import gguf  # noqa: F401
        cases.append(("a.gguf", "'u'"))
    except ImportError:
        pass
    for target, says in cases:
        name, *flags = target.split()
        assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "out" / name),
                     *flags]) == 2
        err = capsys.readouterr().err
        assert_refused(2, err)
        assert says in err, err
        assert os.listdir(tmp_path / "out") == [], target


def test_shards_that_disagree_on_an_attribute_do_not_merge(tmp_path, capsys):
    hf_folder(tmp_path / "hf", extra={})
    part = st_torch.load_file(str(tmp_path / "hf" / "model-00002-of-00003.safetensors"))
    st_torch.save_file(part, str(tmp_path / "hf" / "model-00002-of-00003.safetensors"),
                       metadata={"format": "tf"})
    code = main(["convert", str(tmp_path / "hf"), str(tmp_path / "m.safetensors")])
    assert_refused(code, capsys.readouterr().err)
    assert not (tmp_path / "m.safetensors").exists()
    # shard by shard, each keeps its own
    ztensor.convert(tmp_path / "hf", tmp_path / "dir")
    with ztensor.Reader(str(tmp_path / "dir" / "model-00002-of-00003.zt")) as r:
        assert r.attributes == {"format": "tf"}


def test_an_existing_output_file_needs_force(tmp_path, capsys):
    tensors = hf_folder(tmp_path / "hf", extra={})
    (tmp_path / "m.safetensors").write_bytes(b"mine")
    assert_refused(main(["convert", str(tmp_path / "hf"), str(tmp_path / "m.safetensors")]),
                   capsys.readouterr().err)
    assert (tmp_path / "m.safetensors").read_bytes() == b"mine"
    assert main(["convert", "-q", "--force", str(tmp_path / "hf"),
                 str(tmp_path / "m.safetensors")]) == 0
    assert sorted(st_torch.load_file(str(tmp_path / "m.safetensors"))) == sorted(tensors)


def test_a_single_file_checkpoint_never_merges_onto_itself(tmp_path, capsys):
    (tmp_path / "one").mkdir()
    with ztensor.Writer(str(tmp_path / "one" / "model.zt")) as w:
        w.write_numpy("w", np.ones(3, np.float32))
    before = (tmp_path / "one" / "model.zt").read_bytes()
    code = main(["convert", "--force", str(tmp_path / "one"),
                 str(tmp_path / "one" / "model.zt")])
    assert_refused(code, capsys.readouterr().err)
    assert (tmp_path / "one" / "model.zt").read_bytes() == before


# ------------------------------------------------------------------ what is copied
def test_weights_of_other_formats_and_subfolders_are_not_copied(tmp_path, capsys):
    hf_folder(tmp_path / "hf", extra={"config.json": b"{}"})
    torch.save({"w": torch.ones(2)}, tmp_path / "hf" / "pytorch_model.bin")
    # a PyTorch index beside the safetensors one names the same tensors, as in
    # Hugging Face repositories (two indexes naming different ones are refused)
    names = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    (tmp_path / "hf" / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {n: "pytorch_model.bin" for n in names["weight_map"]}}))
    (tmp_path / "hf" / "original").mkdir()
    (tmp_path / "hf" / "original" / "params.json").write_text("{}")
    with pytest.warns(UserWarning, match="pytorch_model.bin.*original"):
        ztensor.convert(tmp_path / "hf", tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        ["config.json", "model.zt.index.json"]
        + [f"model-{i:05d}-of-00003.zt" for i in (1, 2, 3)])
    # the command folds the warning into one line
    assert main(["convert", "--force", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("ztensor: warning:") and err.count("\n") == 1, err


def test_links_inside_the_folder_are_copied_as_files(tmp_path):
    hf_folder(tmp_path / "hf", extra={})
    (tmp_path / "hf" / "real").mkdir()
    (tmp_path / "hf" / "real" / "tok.json").write_bytes(b'{"t": 1}')
    os.symlink("real/tok.json", tmp_path / "hf" / "tokenizer.json")
    with pytest.warns(UserWarning, match="subfolders: 'real'"):
        ztensor.convert(tmp_path / "hf", tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == b'{"t": 1}'
    assert not os.path.islink(tmp_path / "out" / "tokenizer.json")


def test_the_hugging_face_cache_layout_is_copied(tmp_path):
    """<repo>/snapshots/<rev>/ links every file to <repo>/blobs/: that is inside."""
    repo = tmp_path / "models--tiny"
    snap = repo / "snapshots" / "abc123"
    hf_folder(tmp_path / "plain", extra=CONFIG_FILES)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, name in enumerate(sorted(os.listdir(tmp_path / "plain"))):
        os.replace(tmp_path / "plain" / name, repo / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / name)
    tensors = {}
    ztensor.convert(snap, tmp_path / "out", format="safetensors")
    for name, data in CONFIG_FILES.items():
        assert (tmp_path / "out" / name).read_bytes() == data
    for shard in (f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)):
        tensors.update(st_torch.load_file(str(tmp_path / "out" / shard)))
    for name, want in _tensors_by_name(3).items():
        assert_same(tensors[name], want)


def _tensors_by_name(shards):
    return {name: t for part in _tensors(shards) for name, t in part.items()}


def test_copies_are_atomic(tmp_path, monkeypatch):
    import shutil
    hf_folder(tmp_path / "hf")
    real = shutil.copyfileobj

    def half_then_fail(src, dst, length=0):
        dst.write(src.read(3))
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(shutil, "copyfileobj", half_then_fail)
    with pytest.raises(ztensor.WriteError, match="No space"):
        ztensor.convert(tmp_path / "hf", tmp_path / "out")
    monkeypatch.setattr(shutil, "copyfileobj", real)
    # no partial copy, no temporary file, no index naming a checkpoint not whole, and
    # nothing else this conversion wrote: not its shards, nor the folder it made
    assert not (tmp_path / "out").exists()


def test_the_input_folder_is_never_the_output(tmp_path, capsys):
    hf_folder(tmp_path / "hf")
    before = sorted(os.listdir(tmp_path / "hf"))
    for target in (tmp_path / "hf", tmp_path / "hf" / ".", tmp_path / "link"):
        if target.name == "link":
            os.symlink(tmp_path / "hf", target)
        code = main(["convert", "--force", str(tmp_path / "hf"), str(target)])
        assert_refused(code, capsys.readouterr().err)
        assert sorted(os.listdir(tmp_path / "hf")) == before


# ------------------------------------------------------------------ hostile folders
def test_a_link_out_of_the_folder_is_refused_and_nothing_leaks(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"SECRET-4f1c")
    for target, name in ((secret, "config.json"), ("/etc/passwd", "tokenizer_config.json")):
        folder = tmp_path / f"hf-{name}"
        hf_folder(folder, extra={"README.md": b"hi"})
        os.symlink(target, folder / name)
        for fmt in ("zt", "safetensors"):
            out = run_cli("convert", "--format", fmt, folder, tmp_path / "out")
            assert_refused(out.returncode, out.stderr)
            assert name in out.stderr and "outside" in out.stderr
            assert not (tmp_path / "out").exists()   # refused before anything is written
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()
              and p != secret and b"SECRET-4f1c" in p.read_bytes()]
    assert leaked == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_device_in_the_folder_is_refused_without_hanging(tmp_path):
    hf_folder(tmp_path / "hf", extra={"config.json": b"{}"})
    os.mkfifo(tmp_path / "hf" / "tokenizer.json")
    out = run_cli("convert", tmp_path / "hf", tmp_path / "out")
    assert_refused(out.returncode, out.stderr)
    assert "tokenizer.json" in out.stderr and "regular file" in out.stderr
    assert not (tmp_path / "out").exists()
    os.unlink(tmp_path / "hf" / "tokenizer.json")
    os.symlink("/dev/zero", tmp_path / "hf" / "tokenizer.json")  # outside, and endless
    out = run_cli("convert", tmp_path / "hf", tmp_path / "out")
    assert_refused(out.returncode, out.stderr)
    assert not (tmp_path / "out").exists()
    os.unlink(tmp_path / "hf" / "tokenizer.json")
    os.symlink("tokenizer.fifo", tmp_path / "hf" / "tokenizer.json")  # inside, to a FIFO
    os.mkfifo(tmp_path / "hf" / "tokenizer.fifo")
    out = run_cli("convert", tmp_path / "hf", tmp_path / "out")
    assert_refused(out.returncode, out.stderr)
    assert not (tmp_path / "out").exists()


def test_a_broken_link_is_refused(tmp_path, capsys):
    hf_folder(tmp_path / "hf", extra={})
    os.symlink("missing.json", tmp_path / "hf" / "config.json")
    assert_refused(main(["convert", str(tmp_path / "hf"), str(tmp_path / "out")]),
                   capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_a_refused_safetensors_shard_leaves_no_directory(tmp_path, capsys):
    """--format safetensors checks every shard before the first is written."""
    (tmp_path / "zt").mkdir()
    with ztensor.Writer(str(tmp_path / "zt" / "a.zt")) as w:
        w.write_numpy("a", np.ones(2, np.float32))
    with ztensor.Writer(str(tmp_path / "zt" / "b.zt"), attributes={"step": 3}) as w:
        w.write_numpy("b", np.ones(2, np.float32))
    (tmp_path / "zt" / "model.zt.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "a.zt", "b": "b.zt"}}))
    code = main(["convert", "--format", "safetensors", str(tmp_path / "zt"),
                 str(tmp_path / "st")])
    err = capsys.readouterr().err
    assert_refused(code, err)
    assert "'step'" in err and "b.zt" in err
    assert not (tmp_path / "st").exists()


def test_a_pytorch_bin_checkpoint_by_its_index(tmp_path):
    """pytorch_model.bin shards (torch.save) through their index: the shards are read
    as tensors, the .bin index replaced, the config copied."""
    folder = tmp_path / "hf"
    folder.mkdir()
    parts = _tensors(2)
    weight_map = {}
    for i, part in enumerate(parts):
        file = f"pytorch_model-{i + 1:05d}-of-00002.bin"
        torch.save(part, folder / file)
        weight_map.update({name: file for name in part})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1}, "weight_map": weight_map}))
    (folder / "config.json").write_bytes(CONFIG_FILES["config.json"])
    ztensor.convert(folder / "pytorch_model.bin.index.json", tmp_path / "st",
                    format="safetensors")
    assert sorted(os.listdir(tmp_path / "st")) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"]
    loaded = {}
    for i in (1, 2):
        loaded.update(st_torch.load_file(str(tmp_path / "st" / f"model-{i:05d}-of-00002"
                                             ".safetensors")))
    for name, want in _tensors_by_name(2).items():
        assert_same(loaded[name], want)
