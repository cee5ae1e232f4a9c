"""Session 15: a probe round on the exporters, conversions and checkpoints.  Each
test names the one function that keeps its rule."""
import json
import math
import os
import tracemalloc

import numpy as np
import pytest

import ztensor
import ztensor.numpy
from ztensor.foreign import export

torch = pytest.importorskip("torch")


def _expanded(tmp_path, n, dtype=None):
    """A legitimate torch.save file of about 1.4 KB whose one tensor is a stride-0
    view of ``n`` elements."""
    path = str(tmp_path / "expanded.pt")
    torch.save({"w": torch.full((1,), 3, dtype=dtype or torch.float32).expand(n)}, path)
    return path


# ------------------------------------------------------------------ a view written out
# Rule: an exporter writes a tensor in pieces (export._stored_pieces), so memory stays
# at one piece whatever a view shows; before, a stride-0 view was copied whole (a bare
# MemoryError naming nothing, or all of the machine's memory).


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_an_export_of_a_stride_0_view_holds_one_piece_at_a_time(tmp_path, monkeypatch, suffix):
    n = 1 << 24  # 64 MiB written out, from a 1.4 KB file
    source = _expanded(tmp_path, n)
    monkeypatch.setattr(export, "PIECE_BYTES", 1 << 20)
    out = str(tmp_path / f"out{suffix}")
    tracemalloc.start()
    try:
        ztensor.convert(source, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # a whole copy is 64 MiB
    with ztensor.Reader(out) as r:
        got = r.read_numpy("w")
    assert got.shape == (n,) and got.dtype == np.float32
    assert float(got.min()) == float(got.max()) == 3.0


def test_a_gguf_export_of_a_stride_0_view_holds_one_piece_at_a_time(tmp_path, monkeypatch):
    """gguf-py took each tensor as one array, copied whole: a 1.4 KB file of a
    16 GiB view was killed for memory.  It is handed export._StoredPieces (nbytes
    and tofile, what its write_tensor_data asks of an array), one piece at a time."""
    gguf = pytest.importorskip("gguf")
    n = 1 << 24
    source = _expanded(tmp_path, n)
    monkeypatch.setattr(export, "PIECE_BYTES", 1 << 20)
    out = str(tmp_path / "out.gguf")
    tracemalloc.start()
    try:
        ztensor.convert(source, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    (tensor,) = gguf.GGUFReader(out).tensors
    assert tensor.name == "w" and int(tensor.n_elements) == n
    assert float(tensor.data.min()) == float(tensor.data.max()) == 3.0
    # a mixed file reads back value for value (an int16 view, bf16 bits, a 0-d one)
    mixed = str(tmp_path / "mixed.pt")
    base = torch.arange(-60, 60, dtype=torch.int16).reshape(12, 10)
    torch.save({"t": base.t(), "b": torch.linspace(-2, 2, 7).to(torch.bfloat16),
                "s": torch.tensor(2.5)}, mixed)
    ztensor.convert(mixed, str(tmp_path / "mixed.gguf"))
    with ztensor.Reader(mixed) as want, ztensor.Reader(str(tmp_path / "mixed.gguf")) as got:
        for name in ("t", "b", "s"):
            assert want.read_numpy(name).tobytes() == got.read_numpy(name).tobytes(), name


def test_pieces_cover_every_element_in_order():
    """export._pieces over odd views: a transposed, a sliced and a stride-0 one, with
    a budget smaller than a row, give back exactly the C-order elements."""
    base = np.arange(7 * 5 * 3, dtype=np.int32).reshape(7, 5, 3)
    views = [base, base.transpose(2, 0, 1), base[::2, 1:, ::-1],
             np.broadcast_to(base[:1], (9, 5, 3)), base[0, 0, 0]]
    for view in views:
        for budget in (1, 8, 13, 60, 10**6):
            pieces = [export._as_stored(p) for p in export._pieces(view, budget)]
            assert all(p.flags.c_contiguous for p in pieces)
            flat = np.concatenate([p.reshape(-1) for p in pieces])
            np.testing.assert_array_equal(flat, np.ascontiguousarray(view).reshape(-1))


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".gguf", ".zt"])
def test_an_output_larger_than_the_disk_is_refused_before_a_byte(tmp_path, suffix):
    """Rule: atomic.require_room, from every exporter and from convert's raw .zt.
    A 1.4 KB file whose view is 1 TiB written out filled the disk for minutes."""
    if suffix == ".gguf":
        pytest.importorskip("gguf")
    n = 1 << 38  # 1 TiB of float32: as much as one component may hold (Limits)
    st = os.statvfs(str(tmp_path))
    if st.f_bavail * st.f_frsize >= 4 * n:
        pytest.skip("this disk has room for a TiB: nothing to refuse")
    source = _expanded(tmp_path, n)
    out = tmp_path / f"out{suffix}"
    with pytest.raises(ztensor.WriteError, match="needs 1,099,511,627,776 bytes") as info:
        ztensor.convert(source, str(out))
    assert str(out) in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["expanded.pt"]


def test_a_gguf_export_out_of_memory_is_a_limit_naming_the_object(tmp_path, monkeypatch):
    """A GGUF export's pieces come from export._stored_pieces, where memory that
    runs out is a LimitError (errors.memory_is_a_limit)."""
    pytest.importorskip("gguf")
    source = _expanded(tmp_path, 1 << 10)

    def no_memory(arr):
        raise MemoryError

    monkeypatch.setattr(export, "_as_stored", no_memory)
    with pytest.raises(ztensor.LimitError, match="'w'") as info:
        ztensor.convert(source, str(tmp_path / "out.gguf"))
    assert "expanded.pt" in str(info.value)
    assert not (tmp_path / "out.gguf").exists()


# ------------------------------------------------------------------ what .zt cannot hold
# Rule: export.plan_zt runs the Writer's own attribute check (writing=True), so a NaN
# with a sign or payload (valid in a pickle) is refused before the output exists,
# naming the input; before, the Writer refused it after the file was begun, naming
# its output, and a checkpoint conversion had replaced some shards by then.


def test_a_negative_nan_attribute_is_refused_naming_the_input(tmp_path):
    source = str(tmp_path / "run.pt")
    torch.save({"w": torch.ones(2), "loss": -float("nan")}, source)
    with pytest.raises(ztensor.UnsupportedError, match="NaN") as info:
        ztensor.convert(source, str(tmp_path / "out.zt"))
    assert "run.pt" in str(info.value) and "out.zt" not in str(info.value)
    assert not (tmp_path / "out.zt").exists()


def _pickle_checkpoint(folder, shards):
    folder.mkdir()
    weight_map = {}
    for i, tensors in enumerate(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(tensors, str(folder / name))
        weight_map.update({k: name for k, v in tensors.items() if isinstance(v, torch.Tensor)})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def _values(folder):
    with ztensor.open_sharded(str(folder)) as r:
        return {k: r.read_numpy(k).tolist() for k in r.keys()}


def test_a_checkpoint_conversion_refused_in_shard_two_keeps_the_old_output(tmp_path):
    old = _pickle_checkpoint(tmp_path / "old", [{"a": torch.ones(1)}, {"b": torch.ones(1)}])
    out = tmp_path / "out"
    ztensor.convert(str(old), str(out))
    new = _pickle_checkpoint(tmp_path / "new", [{"a": torch.full((1,), 2.0)},
                                                {"b": torch.full((1,), 2.0),
                                                 "loss": -float("nan")}])
    before = sorted(os.listdir(out))
    with pytest.raises(ztensor.UnsupportedError):
        ztensor.convert(str(new), str(out), force=True)
    assert sorted(os.listdir(out)) == before
    assert _values(out) == {"a": [1.0], "b": [1.0]}


def test_a_checkpoint_conversion_failing_while_writing_keeps_the_old_output(tmp_path):
    """Rule: convert._convert_checkpoint stages every output file (checkpoint_moves.staged,
    checkpoint_moves.move_staged); a shard whose data is found broken only while it is written
    left the new first shard beside the old second one and no index."""
    src = tmp_path / "src"
    ztensor.save_sharded({"a": np.full(64, 2.0), "b": np.full(64, 2.0)}, str(src),
                         max_shard_size=600, compress=True)
    out = tmp_path / "out"
    ztensor.save_sharded({"a": np.full(64, 1.0), "b": np.full(64, 1.0)}, str(tmp_path / "o"),
                         max_shard_size=600)
    ztensor.convert(str(tmp_path / "o"), str(out))
    os.chmod(out / "model-00002-of-00002.zt", 0o640)
    # break shard two's compressed bytes: its manifest still reads
    shard = src / "model-00002-of-00002.zt"
    with ztensor.Reader(str(shard)) as r:
        offset = r.metadata("b").components["data"].offset
    raw = bytearray(shard.read_bytes())
    raw[offset + 6: offset + 12] = b"\xff" * 6
    shard.write_bytes(bytes(raw))
    before = sorted(os.listdir(out))
    with pytest.raises(ztensor.ZTensorError):
        ztensor.convert(str(src), str(out), force=True)
    assert sorted(os.listdir(out)) == before
    assert _values(out) == {"a": [1.0] * 64, "b": [1.0] * 64}
    # and a conversion that succeeds replaces every file, each keeping its mode
    shard.unlink()
    ztensor.save_sharded({"a": np.full(64, 2.0), "b": np.full(64, 2.0)}, str(src),
                         max_shard_size=600)
    ztensor.convert(str(src), str(out), force=True)
    assert _values(out) == {"a": [2.0] * 64, "b": [2.0] * 64}
    assert os.stat(out / "model-00002-of-00002.zt").st_mode & 0o777 == 0o640
    assert not [n for n in os.listdir(out) if n.startswith(".")]


# ------------------------------------------------------------------ save_sharded
# Rule: sharded.save_sharded writes a local checkpoint whole into a staging folder,
# then moves it into place; a tensor only a shard's Writer refuses removed the old
# index first, and the old checkpoint could not be opened any more.


@pytest.mark.parametrize("bad", [
    lambda: torch.zeros(2, device="meta"),
    lambda: torch.zeros(2).to_sparse(),
])
def test_a_resave_refused_in_shard_two_keeps_the_old_checkpoint(tmp_path, bad):
    folder = str(tmp_path / "ck")
    ztensor.save_sharded({"a": np.full(2, 7.0), "b": np.full(2, 8.0)}, folder, max_shard_size=16)
    os.chmod(os.path.join(folder, "model.zt.index.json"), 0o600)
    before = sorted(os.listdir(folder))
    with pytest.raises((ztensor.ZTensorError, TypeError, ValueError)):
        ztensor.save_sharded({"a": np.ones(2), "b": bad()}, folder, max_shard_size=16)
    assert sorted(os.listdir(folder)) == before
    assert _values(folder) == {"a": [7.0, 7.0], "b": [8.0, 8.0]}
    ztensor.save_sharded({"a": np.ones(2), "b": np.ones(2)}, folder, max_shard_size=16)
    assert _values(folder) == {"a": [1.0, 1.0], "b": [1.0, 1.0]}
    assert os.stat(os.path.join(folder, "model.zt.index.json")).st_mode & 0o777 == 0o600


def test_read_all_of_an_index_naming_a_missing_shard_is_a_format_error(tmp_path):
    """Rule: ShardedReader._progress_sizes counts a shard it cannot look at as 0, and
    the shard is refused as every read refuses it (_open_checked); read_all raised a
    bare FileNotFoundError, before opening any shard."""
    folder = tmp_path / "ck"
    ztensor.save_sharded({"a": np.ones(2)}, str(folder))
    index = folder / "model.zt.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["zz"] = "missing.zt"
    index.write_text(json.dumps(data))
    for progress in (None, lambda done, total: None):
        with ztensor.open_sharded(str(folder)) as r:
            with pytest.raises(ztensor.FormatError, match="missing.zt"):
                r.read_all(progress=progress)


# ------------------------------------------------------------------ npz and complex
def test_an_npz_export_keeps_complex_values(tmp_path):
    """Rule: export.plan_npz refuses only the types numpy lacks (dtypes.ML_NAMES:
    bf16, FP8); complex64 was refused with the false reason that numpy has none."""
    values = {"c64": (np.arange(6) + 1j * np.arange(6)).astype(np.complex64),
              "c128": np.array([1 - 2j, math.pi + 0j])}
    zt = str(tmp_path / "c.zt")
    ztensor.numpy.save_file(values, zt)
    ztensor.convert(zt, str(tmp_path / "c.npz"))
    with np.load(str(tmp_path / "c.npz")) as got:
        for name, value in values.items():
            assert got[name].dtype == value.dtype
            np.testing.assert_array_equal(got[name], value)


# ------------------------------------------------------------------ dense is data alone
def test_a_dense_object_with_another_component_is_refused_on_write(tmp_path):
    """Rule: formats/dense.check_entry (run by the Writer and at open): a dense object
    holds 'data' alone.  One with a 'scale' was written, every flat read path showed
    its data alone, and replace_tensor dropped the scale without a word."""
    t = ztensor.Tensor({"data": np.arange(4, dtype=np.float32),
                        "scale": np.array([2.0], np.float32)}, shape=(4,), format="dense")
    path = tmp_path / "x.zt"
    with pytest.raises(ztensor.FormatError, match="'scale'"):
        with ztensor.Writer(str(path)) as w:
            w.write("x", t)
    assert not path.exists()


# ------------------------------------------------------------------ moving into place
# Rule: checkpoint_moves.move_staged checks every destination and readies every file (its mode,
# a copy beside a destination on another filesystem) before the old index goes;
# errors name the files where they were to be, never the hidden staging folder.


def test_a_destination_that_cannot_be_replaced_keeps_the_old_checkpoint(tmp_path):
    folder = tmp_path / "ck"
    tensors = {f"t{i}": np.full(250, float(i), np.float32) for i in range(3)}
    ztensor.save_sharded(tensors, str(folder), max_shard_size=1000)
    (folder / "model-00004-of-00004.zt").mkdir()  # in the way of the new fourth shard
    more = {**tensors, "t3": np.full(250, 3.0, np.float32)}
    with pytest.raises(ztensor.WriteError, match="is a directory") as info:
        ztensor.save_sharded({k: v + 10 for k, v in more.items()}, str(folder),
                             max_shard_size=1000)
    assert str(folder / "model-00004-of-00004.zt") in str(info.value)
    assert ".ztensor-staged" not in str(info.value)
    assert _values(folder) == {k: v.tolist() for k, v in tensors.items()}


def test_a_refusal_in_a_staged_shard_names_the_shard_where_it_was_to_be(tmp_path):
    folder = tmp_path / "ck"
    with pytest.raises(ztensor.UnsupportedError) as info:
        ztensor.save_sharded({"a": np.ones(2), "b": torch.zeros(2, dtype=torch.complex32)},
                             str(folder), max_shard_size=16)
    assert str(folder / "model-00002-of-00002.zt") in str(info.value)
    assert ".ztensor-staged" not in str(info.value)


def test_a_rewrite_keeps_the_index_mode_and_removes_the_shards_it_replaced(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    ztensor.save_sharded({f"t{i}": np.full(250, float(i), np.float32) for i in range(3)},
                         str(src), max_shard_size=1000)
    ztensor.convert(str(src), str(out))
    for name in os.listdir(out):
        os.chmod(out / name, 0o600)
    small = tmp_path / "small"
    ztensor.save_sharded({"t0": np.full(2, 5.0, np.float32), "t1": np.full(2, 6.0, np.float32)},
                         str(small))  # one shard now
    ztensor.convert(str(small), str(out), force=True)
    assert sorted(os.listdir(out)) == ["model-00001-of-00001.zt", "model.zt.index.json"]
    # the index replaced keeps its mode (it was removed first, and made anew: 0644)
    assert os.stat(out / "model.zt.index.json").st_mode & 0o777 == 0o600
    assert _values(out) == {"t0": [5.0, 5.0], "t1": [6.0, 6.0]}


def test_a_merged_file_is_not_written_into_an_indexless_checkpoint_folder(tmp_path):
    """Rule: convert.checkpoint_as_one: a folder without an index is read as its one
    checkpoint file, so a second one beside it (convert CK CK/x.zt) made a folder every
    command refused."""
    folder = tmp_path / "ck"
    folder.mkdir()
    ztensor.numpy.save_file({"a": np.ones(2)}, str(folder / "model.zt"))
    with pytest.raises(ztensor.ZTensorError, match="two checkpoint files"):
        ztensor.convert(str(folder), str(folder / "x.zt"))
    assert os.listdir(folder) == ["model.zt"]
    ztensor.convert(str(folder), str(tmp_path / "x.zt"))  # elsewhere: written
    with ztensor.Reader(str(tmp_path / "x.zt")) as r:
        assert r.read_numpy("a").tolist() == [1.0, 1.0]
