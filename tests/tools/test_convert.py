"""ztensor.convert / `ztensor convert`: files and Hugging Face checkpoint directories
(safetensors shards + index) converted shard by shard, the index written last."""
import json
import os

import numpy as np
import pytest

import ztensor
from ztensor.tools import convert as conversion
from ztensor.tools.cli import main

safetensors_numpy = pytest.importorskip("safetensors.numpy")
RNG = np.random.default_rng(3)


def hf_checkpoint(folder, shards=2):
    """A checkpoint as transformers saves it: shards and model.safetensors.index.json."""
    os.makedirs(folder, exist_ok=True)
    tensors, weight_map = {}, {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {f"layers.{s}.{k}": RNG.standard_normal((8, 4 + s)).astype(np.float32)
                for k in ("q", "k")}
        part[f"layers.{s}.n"] = np.arange(5, dtype=np.int64)
        safetensors_numpy.save_file(part, os.path.join(folder, file), metadata={"format": "pt"})
        tensors.update(part)
        weight_map.update({name: file for name in part})
    total = sum(a.nbytes for a in tensors.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return tensors


def test_checkpoint_directory(tmp_path):
    tensors = hf_checkpoint(tmp_path / "hf")
    calls = []
    count = ztensor.convert(tmp_path / "hf", tmp_path / "out",
                            progress=lambda done, total: calls.append((done, total)))
    assert count == len(tensors)
    assert sorted(os.listdir(tmp_path / "out")) == [
        "model-00001-of-00002.zt", "model-00002-of-00002.zt", "model.zt.index.json"]
    index = json.loads((tmp_path / "out" / "model.zt.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    assert index["weight_map"]["layers.1.q"] == "model-00002-of-00002.zt"
    with ztensor.open_sharded(tmp_path / "out") as r:
        assert sorted(r.keys()) == sorted(tensors)
        for name, arr in tensors.items():
            np.testing.assert_array_equal(r.read_numpy(name), arr)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and calls[-1][0] == calls[-1][1] and len(calls) > 2


def test_index_is_written_last(tmp_path, monkeypatch):
    hf_checkpoint(tmp_path / "hf", shards=3)
    real, seen = conversion._convert_file, []

    def failing(source, *args):
        seen.append(source)
        if len(seen) == 2:
            raise OSError("disk full")
        return real(source, *args)
    monkeypatch.setattr(conversion, "_convert_file", failing)
    with pytest.raises(OSError):
        ztensor.convert(tmp_path / "hf", tmp_path / "out")
    # no index naming shards not written; nor the shards written, nor the folder it made
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force(tmp_path):
    hf_checkpoint(tmp_path / "hf")
    ztensor.convert(tmp_path / "hf", tmp_path / "out")
    with pytest.raises(ztensor.ZTensorError, match="force"):
        ztensor.convert(tmp_path / "hf", tmp_path / "out")
    ztensor.convert(tmp_path / "hf", tmp_path / "out", force=True, compress=True)
    with ztensor.open_sharded(tmp_path / "out" / "model.zt.index.json") as r:
        assert r.metadata("layers.0.q").components["data"].encoding == "zstd"


def test_single_file_directory_and_files(tmp_path):
    arr = RNG.standard_normal(10).astype(np.float32)
    os.makedirs(tmp_path / "one")
    safetensors_numpy.save_file({"w": arr}, str(tmp_path / "one" / "model.safetensors"))
    assert ztensor.convert(tmp_path / "one", tmp_path / "out") == 1
    assert os.listdir(tmp_path / "out") == ["model.zt"]  # no index for one file
    ztensor.convert(tmp_path / "out" / "model.zt", tmp_path / "back.safetensors")
    np.testing.assert_array_equal(safetensors_numpy.load_file(
        str(tmp_path / "back.safetensors"))["w"], arr)


def test_command_on_a_directory(tmp_path, capsys):
    tensors = hf_checkpoint(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--checksum",
                 "crc32c"]) == 0
    assert main(["verify", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert main(["ls", "--json", str(tmp_path / "out")]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(row["name"] for row in listed) == sorted(tensors)
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "out")]) == 2
    assert "force" in capsys.readouterr().err


def test_verify_and_read_all_report_progress(tmp_path):
    tensors = hf_checkpoint(tmp_path / "hf")
    ztensor.convert(tmp_path / "hf", tmp_path / "out", checksum="sha256")
    for_file, for_shards, for_read = [], [], []
    first = tmp_path / "out" / "model-00001-of-00002.zt"
    with ztensor.Reader(str(first)) as r:
        assert r.verify(progress=lambda d, t: for_file.append((d, t))) == 3
    assert for_file[-1][0] == for_file[-1][1] > 0 and len(for_file) == 3
    with ztensor.open_sharded(tmp_path / "out") as r:
        assert r.verify(progress=lambda d, t: for_shards.append((d, t))) == 6
        everything = r.read_all(progress=lambda d, t: for_read.append((d, t)))
    for calls in (for_shards, for_read):
        dones = [d for d, _ in calls]
        assert dones == sorted(dones) and calls[-1][0] == calls[-1][1]
    assert sorted(everything) == sorted(tensors)
    for name, arr in tensors.items():
        np.testing.assert_array_equal(everything[name], arr)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".zt"])
def test_scalars_stay_scalars_through_every_output(tmp_path, suffix):
    src = tmp_path / "s.zt"
    with ztensor.Writer(str(src)) as w:
        w.write_numpy("s", np.float32(2.5))
        if suffix != ".npz":  # numpy has no FP8 dtype: refused for .npz (test_export)
            w.write_numpy("f8", np.float32(0.5), type="f8_e4m3fn")
        w.write_numpy("v", np.arange(3, dtype=np.int16))
    out = tmp_path / ("out" + suffix)
    ztensor.convert(src, out)
    with ztensor.Reader(str(out)) as r:
        assert r.read_numpy("s").shape == () and float(r.read_numpy("s")) == 2.5
        assert r.read_numpy("v").shape == (3,)
        assert suffix == ".npz" or r.metadata("f8").shape == ()
