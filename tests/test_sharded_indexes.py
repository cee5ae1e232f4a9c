"""Which index a checkpoint folder is opened by (sharded.find_index): ours, then
safetensors', then PyTorch's (``pytorch_model.bin.index.json``), and a folder holding
one PyTorch checkpoint alone; each read back value for value."""
from __future__ import annotations

import json

import numpy as np
import pytest

import ztensor
from ztensor import sharded


def _bin_checkpoint(torch, folder, tensors, shards=2):
    """A Hugging Face PyTorch checkpoint: torch.save shards and their index."""
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: torch.from_numpy(tensors[n]) for n in names[i::shards]}
        torch.save(part, folder / file)
        weight_map.update({n: file for n in part})
    (folder / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))


TENSORS = {f"layer.{i}.weight": np.arange(12, dtype=np.float32).reshape(3, 4) * i
           for i in range(4)}


def test_a_folder_with_only_a_pytorch_index_opens(tmp_path):
    torch = pytest.importorskip("torch")
    _bin_checkpoint(torch, tmp_path, TENSORS)
    assert sharded.find_index(tmp_path) == str(tmp_path / "pytorch_model.bin.index.json")
    assert sharded.is_checkpoint(tmp_path)
    with ztensor.open_sharded(tmp_path) as ckpt:
        assert sorted(ckpt.keys()) == sorted(TENSORS)
        for name, value in TENSORS.items():
            np.testing.assert_array_equal(ckpt.read_numpy(name), value)


def test_safetensors_index_is_preferred_to_the_pytorch_one(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file
    _bin_checkpoint(torch, tmp_path, {k: v + 100 for k, v in TENSORS.items()})
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: "model.safetensors" for n in TENSORS}}))
    assert sharded.find_index(tmp_path).endswith("model.safetensors.index.json")
    with ztensor.open_sharded(tmp_path) as ckpt:
        np.testing.assert_array_equal(ckpt.read_numpy("layer.2.weight"),
                                      TENSORS["layer.2.weight"])


def test_two_pytorch_indexes_are_refused(tmp_path):
    for name in ("a.bin.index.json", "b.bin.index.json"):
        (tmp_path / name).write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ztensor.FormatError, match="more than one index"):
        sharded.find_index(tmp_path)


def test_a_single_pytorch_checkpoint_in_a_folder_converts(tmp_path):
    torch = pytest.importorskip("torch")
    (tmp_path / "in").mkdir()
    torch.save({n: torch.from_numpy(v) for n, v in TENSORS.items()},
               tmp_path / "in" / "pytorch_model.bin")
    ztensor.convert(tmp_path / "in", tmp_path / "out.zt")
    with ztensor.Reader(tmp_path / "out.zt") as r:
        for name, value in TENSORS.items():
            np.testing.assert_array_equal(r.read_numpy(name), value)
