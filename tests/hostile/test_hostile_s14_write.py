"""Session 14: the write side, tried as a hostile user would (a read-only probe round).
Each test names the one function that keeps its rule."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ztensor
import ztensor.numpy as ztnp


@pytest.fixture
def linked(tmp_path, monkeypatch):
    """``lk`` is a link to ``real/sub``: ``lk/../x.zt`` is ``real/x.zt`` to the
    system, and ``./x.zt`` to string rules (abspath)."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    os.symlink(os.path.join("real", "sub"), tmp_path / "lk")
    monkeypatch.chdir(tmp_path)
    ztnp.save_file({"victim": np.arange(3.0)}, "x.zt")
    return tmp_path


@pytest.mark.parametrize("how", ["writer", "save_file", "torch"])
def test_a_write_through_link_dotdot_lands_where_a_read_looks(linked, how):
    """The writer computed its target with abspath, which drops ``lk/..`` by string
    rules: ``lk/../x.zt`` replaced the unrelated ``./x.zt`` and the file could not
    be read back by the name it was written under.  Kept by
    ``paths.resolve_folder`` (through ``atomic.final_target``)."""
    new = {"new": np.ones(2)}
    if how == "writer":
        with ztensor.Writer("lk/../x.zt") as w:
            w.write("new", new["new"])
    elif how == "save_file":
        ztnp.save_file(new, "lk/../x.zt")
    else:
        torch = pytest.importorskip("torch")
        import ztensor.torch as ztt

        ztt.save_file({"new": torch.ones(2)}, "lk/../x.zt")
    with ztensor.Reader("x.zt") as r:
        assert r.keys() == ["victim"]  # untouched
    with ztensor.Reader("lk/../x.zt") as r:
        assert r.keys() == ["new"]
    assert os.path.exists(linked / "real" / "x.zt")
    assert sorted(os.listdir(linked / "real")) == ["sub", "x.zt"]  # no temp left


def test_convert_through_link_dotdot_keeps_force_meaning(linked):
    """``convert in.zt lk/../x.zt`` replaced ./x.zt without --force, and a second
    run succeeded too: the existence check and the rename named other files."""
    ztnp.save_file({"new": np.ones(2)}, "in.zt")
    cmd = [sys.executable, "-m", "ztensor", "convert", "in.zt", "lk/../x.zt"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(cmd, capture_output=True, text=True)
    assert second.returncode == 2 and "exists" in second.stderr
    with ztensor.Reader("x.zt") as r:
        assert r.keys() == ["victim"]


def test_edits_through_link_dotdot_edit_the_file_read(linked):
    """replace_tensor and Writer.append on ``lk/../x.zt`` refused with "the file
    changed while this edit was being made": the file read and the file checked
    before the rename were different files."""
    ztnp.save_file({"w": np.zeros(2)}, "lk/../x.zt")
    ztensor.replace_tensor("lk/../x.zt", "w", np.full(2, 7.0))
    with ztensor.Writer.append("lk/../x.zt") as w:
        w.write("z", np.ones(1))
    with ztensor.Reader(str(linked / "real" / "x.zt")) as r:
        assert r.keys() == ["w", "z"] and r["w"].tolist() == [7.0, 7.0]
    with ztensor.Reader("x.zt") as r:
        assert r.keys() == ["victim"]


def test_a_symlinked_output_stays_a_link(tmp_path):
    """The last name is kept as given: a link there is followed to its target, and
    stays a link (the other half of ``atomic.final_target``)."""
    target = tmp_path / "t.zt"
    ztnp.save_file({"a": np.zeros(1)}, str(target))
    os.symlink("t.zt", tmp_path / "l.zt")
    ztnp.save_file({"b": np.ones(1)}, str(tmp_path / "l.zt"))
    assert os.path.islink(tmp_path / "l.zt")
    with ztensor.Reader(str(target)) as r:
        assert r.keys() == ["b"]


# ---------------------------------------------------------------- torch logical types
def _fp8_cases():
    torch = pytest.importorskip("torch")
    return torch


def test_a_stream_refuses_a_torch_tensor_of_another_logical_type(tmp_path):
    """A torch float8_e5m2 chunk in an f8_e4m3fn stream was written as its raw
    bits (1.0 read back as 1.5), and a torch bf16 chunk in a plain uint16 stream
    became integers: the tensor's type was dropped and only its bits compared.
    The same chunks as ml_dtypes arrays were refused.  Kept by
    ``dtypes.elements_fit`` (``stream.TensorStream._array_of``)."""
    torch = _fp8_cases()
    import ztensor.torch as ztt

    path = str(tmp_path / "s.zt")
    wrong = [
        (np.uint8, "f8_e4m3fn", torch.tensor([1.0, 2.0]).to(torch.float8_e5m2)),
        (np.uint16, None, torch.tensor([1.0, 2.0]).bfloat16()),
        (np.uint8, "f8_e5m2", torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)),
    ]
    for dtype, kind, chunk in wrong:
        with pytest.raises(ztensor.FormatError, match="chunk has dtype"):
            with ztensor.Writer(path) as w:
                with w.stream("a", (2,), dtype, type=kind) as s:
                    s.write(chunk)
        assert not os.path.exists(path)
    right = [
        (np.uint8, "f8_e4m3fn", torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)),
        (np.uint16, "bf16", torch.tensor([1.0, 2.0]).bfloat16()),
        (np.uint8, "f8_e4m3fn", torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn).view(torch.uint8)),
    ]
    for dtype, kind, chunk in right:
        with ztensor.Writer(path) as w:
            with w.stream("a", (2,), dtype, type=kind) as s:
                s.write(chunk)
        got = ztt.load_file(path)["a"]
        assert got.float().tolist() == [1.0, 2.0]


def test_replace_tensor_takes_torch_bf16_and_refuses_another_fp8(tmp_path):
    """replace_tensor refused a torch bf16 tensor for a bf16 object ("the new data is
    uint16[4], the object is bfloat16[4]") and took a float8_e5m2 tensor for an
    f8_e4m3fn object as raw codes.  Kept by ``dtypes.elements_fit``
    (``edit.replace_tensor``)."""
    torch = _fp8_cases()
    import ztensor.torch as ztt

    path = str(tmp_path / "r.zt")
    with ztensor.Writer(path) as w:
        w.write_torch("bf", torch.arange(4.0).bfloat16())
        w.write_torch("f8", torch.ones(4).to(torch.float8_e4m3fn))
    ztensor.replace_tensor(path, "bf", torch.full((4,), 3.0).bfloat16())
    assert ztt.load_file(path)["bf"].tolist() == [3.0] * 4
    with pytest.raises(ztensor.FormatError, match="f8_e5m2.*f8_e4m3fn"):
        ztensor.replace_tensor(path, "f8", torch.ones(4).to(torch.float8_e5m2))
    ztensor.replace_tensor(path, "f8", torch.full((4,), 2.0).to(torch.float8_e4m3fn))
    got = ztt.load_file(path)
    assert got["f8"].dtype == torch.float8_e4m3fn and got["f8"].float().tolist() == [2.0] * 4
    assert got["bf"].dtype == torch.bfloat16


# ---------------------------------------------------------------- exports keep or refuse
@pytest.fixture
def with_attributes(tmp_path):
    path = str(tmp_path / "a.zt")
    with ztensor.Writer(path, attributes={"k": "v"}) as w:
        w.write_numpy("d", np.zeros(2, np.float32), attributes={"scale": 0.5})
    return path


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".gguf"])
def test_an_export_refuses_attributes_it_cannot_hold(tmp_path, with_attributes, suffix):
    """``convert a.zt o.safetensors`` and ``o.npz`` exited 0 with the tensor's
    ``scale`` gone (and the npz with the file's ``k`` gone too), where GGUF refused:
    an export keeps everything or writes nothing, unless the caller asks to drop
    what the format has no place for.  Kept by ``export._attributes_kept``."""
    if suffix == ".gguf":
        pytest.importorskip("gguf")
    out = tmp_path / ("o" + suffix)
    with pytest.raises(ztensor.UnsupportedError, match="drop_attributes") as err:
        ztensor.convert(with_attributes, str(out))
    assert err.value.obj == (None if suffix == ".npz" else "d") and not out.exists()
    cli = [sys.executable, "-m", "ztensor", "convert", with_attributes, str(out)]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 2 and "--drop-attributes" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
    done = subprocess.run(cli + ["--drop-attributes"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with ztensor.Reader(str(out)) as r:
        assert r["d"].tolist() == [0.0, 0.0] and r.metadata("d").attributes == {}
        if suffix == ".safetensors":
            assert r.attributes == {"k": "v"}  # the strings safetensors holds are kept


def test_an_npz_export_refuses_file_attributes(tmp_path):
    """An .npz holds arrays only: file attributes alone are refused too, but for
    safetensors' framework marker {"format": "pt"}, which every transformers
    checkpoint carries and the output's format replaces."""
    plain = str(tmp_path / "p.zt")
    ztnp.save_file({"a": np.ones(2)}, plain, metadata={"format": "pt"})
    ztensor.convert(plain, str(tmp_path / "p.npz"))
    assert np.load(tmp_path / "p.npz")["a"].tolist() == [1.0, 1.0]
    src = str(tmp_path / "f.zt")
    ztnp.save_file({"a": np.ones(2)}, src, metadata={"format": "np", "note": "kept?"})
    with pytest.raises(ztensor.UnsupportedError, match="file attributes.*'note'"):
        ztensor.convert(src, str(tmp_path / "o.npz"))
    assert not (tmp_path / "o.npz").exists()
    ztensor.convert(src, str(tmp_path / "o.npz"), drop_attributes=True)
    assert np.load(tmp_path / "o.npz")["a"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("name", ["o.safetensors", "o.npz", "o.gguf", "o.bin"])
def test_dequantize_writes_only_a_zt_name(tmp_path, name):
    """``ztensor dequantize IN out.safetensors`` wrote a .zt file under that name
    and exited 0 (the safetensors package then said "header too large").  Refused,
    one line, exit 2, nothing written (``cli.cmd_dequantize`` by
    ``export.format_for``, the rule convert follows)."""
    src = str(tmp_path / "q.zt")
    ztnp.save_file({"a": np.ones(2, np.float32)}, src)
    out = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "ztensor", "dequantize", src, str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and not out.exists()
    assert len(done.stderr.strip().splitlines()) == 1 and "ztensor convert" in done.stderr


# ---------------------------------------------------------------- one checkpoint per folder
def _st_file(path, tensors):
    st = pytest.importorskip("safetensors.numpy")
    st.save_file(tensors, str(path))


def test_a_folder_of_two_indexes_naming_different_tensors_is_refused(tmp_path):
    """A folder with model.safetensors.index.json (tensor a) and model.zt.index.json
    (tensor b): ls, verify and convert saw b alone, exit 0, and a was lost without a
    word.  Refused, naming both indexes; opened by its path, an index is read.
    Kept by ``sharded._require_one_checkpoint``."""
    import json

    _st_file(tmp_path / "s1.safetensors", {"a": np.ones(1, np.float32)})
    _st_file(tmp_path / "s2.safetensors", {"b": np.ones(1, np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    (tmp_path / "model.zt.index.json").write_text(
        json.dumps({"weight_map": {"b": "s2.safetensors"}}))
    with pytest.raises(ztensor.FormatError, match="two checkpoints.*model.safetensors.index"):
        ztensor.open_sharded(str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "ztensor", "verify", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "two checkpoints" in done.stderr
    with ztensor.open_sharded(str(tmp_path / "model.safetensors.index.json")) as r:
        assert r.keys() == ["a"]
    # the same tensors in both (a PyTorch index beside a safetensors one): one checkpoint
    (tmp_path / "model.zt.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    with ztensor.open_sharded(str(tmp_path)) as r:
        assert r.keys() == ["a"]


def test_a_whole_checkpoint_file_beside_its_index_must_agree(tmp_path):
    """model.safetensors (tensor b) beside model.safetensors.index.json (tensor a):
    ztensor read a, transformers (which looks for model.safetensors first) loads b.
    Refused when they differ; a consolidated copy of the same tensors is fine."""
    import json

    _st_file(tmp_path / "s1.safetensors", {"a": np.ones(1, np.float32)})
    _st_file(tmp_path / "model.safetensors", {"b": np.ones(1, np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    with pytest.raises(ztensor.FormatError, match="'model.safetensors' name different"):
        ztensor.open_sharded(str(tmp_path))
    _st_file(tmp_path / "model.safetensors", {"a": np.ones(1, np.float32)})
    with ztensor.open_sharded(str(tmp_path)) as r:
        assert r.keys() == ["a"]


@pytest.mark.parametrize("kind", ["bf16", "f8_e4m3fn", "f8_e5m2"])
def test_an_npz_export_refuses_types_numpy_lacks(tmp_path, kind):
    """An .npz export wrote bf16 and FP8 tensors as their bit patterns, which
    numpy.load gives back as plain uint16/uint8 integers (and a conversion back as
    u16/u8 objects): the type was lost.  Refused, naming the object, no file
    (``export.plan_npz``)."""
    src = str(tmp_path / "t.zt")
    with ztensor.Writer(src) as w:
        codes = np.zeros(2, np.uint16 if kind == "bf16" else np.uint8)
        w.write("x", ztensor.Tensor({"data": codes}, types={"data": kind}))
        w.write_numpy("ok", np.ones(2, np.float32))
    out = tmp_path / "o.npz"
    with pytest.raises(ztensor.UnsupportedError, match=f"no {kind} dtype") as err:
        ztensor.convert(src, str(out))
    assert err.value.obj == "x" and not out.exists()


def test_dequantize_takes_a_checkpoint_directory(tmp_path):
    """``ztensor dequantize DIR out.zt`` said "open a checkpoint directory with
    ztensor.open_sharded(path)" (the Python API's words, in a command).  A
    checkpoint is read as one file, its shards merged, digests checked
    (``convert.checkpoint_as_one``, the reader ``convert DIR out.zt`` uses)."""
    import json

    q = ztensor.quantize(np.linspace(-1, 1, 64 * 128, dtype=np.float32).reshape(64, 128),
                         group_size=64)
    folder = tmp_path / "ck"
    folder.mkdir()
    with ztensor.Writer(str(folder / "s1.zt")) as w:
        w.write("proj", q, checksum="crc32c")
    ztnp.save_file({"bias": np.ones(64, np.float32)}, str(folder / "s2.zt"))
    (folder / "model.zt.index.json").write_text(json.dumps(
        {"weight_map": {"proj": "s1.zt", "bias": "s2.zt"}}))
    out = tmp_path / "d.zt"
    done = subprocess.run([sys.executable, "-m", "ztensor", "dequantize", "--json", "--dtype",
                           "float32", str(folder),
                           str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dequantized"] == 1
    with ztensor.Reader(str(out)) as r:
        assert sorted(r.keys()) == ["bias", "proj"]
        np.testing.assert_array_equal(r["proj"], ztensor.dequantize(q, dtype=np.float32))
    # a damaged shard stops it, nothing written
    raw = bytearray((folder / "s1.zt").read_bytes())
    raw[200] ^= 0xFF
    (folder / "s1.zt").write_bytes(bytes(raw))
    out.unlink()
    done = subprocess.run([sys.executable, "-m", "ztensor", "dequantize", str(folder), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and not out.exists()
    assert len(done.stderr.strip().splitlines()) == 1


def test_plain_integers_are_codes_only_where_codes_were_declared(tmp_path):
    """After dtypes.elements_fit first landed, a stream made with ml_dtypes'
    bfloat16 took a uint16 chunk as bit patterns (1, 2, 3 read back as 9e-41...)
    and replace_tensor took np.full(4, 2, np.uint16) for a bf16 object: both had
    been refused, since the integers may as well mean values.  Codes are taken only
    from a stream made with a uint dtype and ``type=``."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    path = str(tmp_path / "c.zt")
    with pytest.raises(ztensor.FormatError, match="chunk has dtype uint16"):
        with ztensor.Writer(path) as w:
            with w.stream("s", (3,), ml_dtypes.bfloat16) as s:
                s.write(np.array([1, 2, 3], np.uint16))
    with ztensor.Writer(path) as w:
        with w.stream("s", (3,), np.uint16, type="bf16") as s:  # codes, declared
            s.write(np.array([1.0, 2.0, 3.0], np.float32).astype(ml_dtypes.bfloat16)
                    .view(np.uint16))
        w.write_numpy("b", np.ones(4, np.float32).astype(ml_dtypes.bfloat16))
    with ztensor.Reader(path) as r:
        assert r["s"].astype(np.float32).tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ztensor.FormatError, match="uint16"):
        ztensor.replace_tensor(path, "b", np.full(4, 2, np.uint16))
    ztensor.replace_tensor(path, "b", np.full(4, 2, np.float32).astype(ml_dtypes.bfloat16))
    with ztensor.Reader(path) as r:
        assert r["b"].astype(np.float32).tolist() == [2.0] * 4


def test_a_pytorch_index_with_a_tied_head_is_not_a_second_checkpoint(tmp_path):
    """Hub repositories hold model.safetensors.index.json beside
    pytorch_model.bin.index.json, and older transformers kept a tied lm_head in the
    .bin shards that the safetensors ones leave out: the folder was refused as two
    checkpoints (``sharded._require_one_checkpoint`` compares zTensor and
    safetensors checkpoints only; transformers ignores the .bin index there too)."""
    import json

    _st_file(tmp_path / "model-00001-of-00001.safetensors", {"wte": np.ones(2, np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"wte": "model-00001-of-00001.safetensors"}}))
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {"wte": "pytorch_model-00001.bin", "lm_head": "pytorch_model-00001.bin"}}))
    with ztensor.open_sharded(str(tmp_path)) as r:
        assert r.keys() == ["wte"]
