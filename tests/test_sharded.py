"""ztensor/sharded.py: sharded checkpoints in the Hugging Face convention."""
import json
import os

import numpy as np
import pytest

import ztensor

TENSORS = {f"layers.{i}.weight": np.full((64, 64), i, np.float32) for i in range(10)}
TENSORS["embed"] = np.arange(1000, dtype=np.float32)


def test_save_sharded_splits_and_indexes(tmp_path):
    seen = []
    files = ztensor.save_sharded(TENSORS, tmp_path, max_shard_size="40kB", metadata={"k": "v"},
                                 progress=lambda done, total: seen.append((done, total)))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.zt"
    index = json.loads((tmp_path / "model.zt.index.json").read_text())
    total = sum(a.nbytes for a in TENSORS.values())
    assert index["metadata"] == {"total_size": total}
    assert set(index["weight_map"]) == set(TENSORS)
    assert seen[-1] == (total, total)
    for file in files:
        assert os.path.getsize(tmp_path / file) <= 40_000 + 4096 or \
            len(ztensor.Reader(tmp_path / file)) == 1
    with ztensor.open_sharded(tmp_path) as r:
        assert sorted(r.keys()) == sorted(TENSORS) and len(r.shards) == len(files)
        for name, arr in TENSORS.items():
            np.testing.assert_array_equal(r[name], arr)
        assert r.metadata("embed").dtype == "float32"
        dst = np.empty((64, 64), np.float32)
        r.read_into("layers.3.weight", dst)
        assert (dst == 3).all()
        np.testing.assert_array_equal(r.get_slice("embed")[10:20], TENSORS["embed"][10:20])
        assert r.verify() == 0
    with ztensor.open_sharded(tmp_path / "model.zt.index.json") as r:
        assert len(r) == len(TENSORS)


def test_a_tensor_larger_than_a_shard_goes_alone(tmp_path):
    files = ztensor.save_sharded({"big": np.zeros(10_000, np.float32), "s": np.zeros(3)},
                                 tmp_path, max_shard_size=1000)
    assert len(files) == 2


def test_safetensors_shards_are_read_through_their_index(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    st.save_file({"a": TENSORS["embed"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    st.save_file({"b": TENSORS["layers.1.weight"]},
                 str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {"total_size": 1}, "weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with ztensor.open_sharded(tmp_path) as r:
        np.testing.assert_array_equal(r["b"], TENSORS["layers.1.weight"])


@pytest.mark.parametrize("index,words", [
    ({"weight_map": {"a": "../../etc/passwd"}}, "not a file beside the index"),
    ({"weight_map": ["a"]}, "weight_map"),
    ({"weight_map": {"x": "model-00001-of-00001.zt"}}, "does not hold"),
])
def test_lying_indexes_are_refused(tmp_path, index, words):
    ztensor.save_sharded({"a": np.zeros(2)}, tmp_path)
    (tmp_path / "model.zt.index.json").write_text(json.dumps(index))
    with pytest.raises(ztensor.FormatError, match=words):
        with ztensor.open_sharded(tmp_path) as r:
            for name in r.keys():
                r[name]


def test_a_resave_that_fails_part_way_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    """save_sharded writes the new checkpoint whole into a hidden folder, then moves
    it into place (checkpoint_moves.move_staged): a failure in any shard leaves the old one as
    it was, index and all (removing the old index first left no checkpoint)."""
    ztensor.save_sharded(TENSORS, tmp_path, max_shard_size="40kB")
    before = sorted(os.listdir(tmp_path))
    from ztensor.container import writer

    real_close, closed = writer.Writer.close, []

    def crash_on_second(self):
        closed.append(self)
        if len(closed) == 2:
            raise OSError("disk died")
        return real_close(self)
    monkeypatch.setattr(writer.Writer, "close", crash_on_second)
    with pytest.raises(OSError):
        ztensor.save_sharded({k: v + 1 for k, v in TENSORS.items()}, tmp_path,
                             max_shard_size="40kB")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before  # nothing staged is left behind
    with ztensor.open_sharded(tmp_path) as r:
        for name, value in TENSORS.items():
            np.testing.assert_array_equal(r[name], value)


def test_torch_save_model_sharded_and_load_model_from_the_directory(tmp_path):
    torch = pytest.importorskip("torch")
    from ztensor.torch import load_model, save_model
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    save_model(model, tmp_path / "ckpt", max_shard_size="10kB")
    assert len([f for f in os.listdir(tmp_path / "ckpt") if f.endswith(".zt")]) > 1
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    assert load_model(fresh, tmp_path / "ckpt") == ([], [])
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def test_the_command_on_a_checkpoint_directory(tmp_path, capsys):
    from ztensor.tools.cli import main
    ztensor.save_sharded(TENSORS, tmp_path, max_shard_size="40kB")
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "layers.9.weight" in out and "embed" in out
    assert main(["info", "--json", str(tmp_path / "model.zt.index.json")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["objects"] == len(TENSORS) and info["format"] == "sharded"
    assert main(["verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out  # one summary over every shard
    assert out.count("OK") == 1 and f"{len(TENSORS)} objects in" in out and "shards" in out


def test_a_directory_with_two_indexes_of_one_kind_is_refused(tmp_path):
    """Which index a directory means must not depend on listing order: two of the
    kind that would be picked is an error naming them; a .zt index beside a
    .safetensors one (a converted checkpoint) picks the .zt one."""
    ztensor.save_sharded({"a": np.ones(3, np.float32)}, tmp_path)
    index = next(tmp_path.glob("*.zt.index.json"))
    (tmp_path / "model.safetensors.index.json").write_text(index.read_text())
    with ztensor.open_sharded(tmp_path) as r:
        np.testing.assert_array_equal(r["a"], np.ones(3, np.float32))
    (tmp_path / "other.zt.index.json").write_text(index.read_text())
    with pytest.raises(ztensor.FormatError, match="more than one index"):
        ztensor.open_sharded(tmp_path)
