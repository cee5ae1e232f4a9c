"""Red team, session 10, the last round (issue 21): fresh hostile inputs made by the
real writers (torch.save, numpy, gguf, onnx, h5py, safetensors) and then changed
where a hostile author would, through the foreign readers, the exporters, sharded
checkpoints and the command.  Each test names the promise of docs/threat-model.md it
holds and the one function that keeps it."""

import zipfile

import numpy as np
import pytest

import ztensor
import ztensor.numpy


def _rewrite_member(path, member_suffix, change):
    """Rewrite the zip at ``path`` with the member ending in ``member_suffix`` passed
    through ``change`` (bytes -> bytes), every other member as it was."""
    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for info, data in members:
            z.writestr(info, change(data) if info.filename.endswith(member_suffix) else data)


# ---- PyTorch zip: one storage, one type and size
# (Clean / wrong values: pytorch._Load.storage)


def _torch_two_storages(tmp_path, second):
    """torch.save of x (float32) and y (``second``), then y's storage reference
    pointed at x's storage '0' (torch.save never writes that: it refuses to save views
    of one storage as two types)."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.pt"
    torch.save({"x": torch.arange(4, dtype=torch.float32), "y": second}, path)
    key = b"X\x01\x00\x00\x001"  # BINUNICODE '1': y's storage key
    _rewrite_member(path, "data.pkl", lambda d: d.replace(key, b"X\x01\x00\x00\x000"))
    return torch, path


@pytest.mark.parametrize(
    "second",
    [
        "int32",  # the same bytes as another type: torch reads float bits as y
        "float64",  # another type and size
        "float32-short",  # the same type, another element count
    ],
)
def test_a_storage_referred_to_as_two_types_is_refused(tmp_path, second):
    torch = pytest.importorskip("torch")
    value = {
        "int32": torch.arange(4, dtype=torch.int32),
        "float64": torch.arange(2, dtype=torch.float64),
        "float32-short": torch.arange(2, dtype=torch.float32),
    }[second]
    torch, path = _torch_two_storages(tmp_path, value)
    # the second reference really names storage '0' now
    with zipfile.ZipFile(path) as z:
        assert b"X\x01\x00\x00\x001" not in next(
            z.read(n) for n in z.namelist() if n.endswith("data.pkl")
        )
    with pytest.raises(ztensor.FormatError, match="storage '0' is referred to as") as err:
        ztensor.Reader(path)
    assert str(path) in str(err.value)


def test_a_storage_two_tensors_share_as_one_type_still_reads(tmp_path):
    torch = pytest.importorskip("torch")
    w = torch.arange(6, dtype=torch.float32)
    path = tmp_path / "tied.pt"
    torch.save({"a": w, "b": w[2:], "c": w.view(2, 3)}, path)
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r.read_numpy("b"), np.arange(2, 6, dtype=np.float32))
        np.testing.assert_array_equal(r.read_numpy("c"), np.arange(6, dtype=np.float32).reshape(2, 3))


# ---- ONNX: initializers of subgraphs and training graphs are listed, not dropped
# (Clean: onnx_file._nested, through onnx_file.open_file)


def _tensor(onnx, name, values):
    return onnx.helper.make_tensor(name, onnx.TensorProto.FLOAT, [len(values)], values)


def test_onnx_subgraph_and_training_initializers_are_listed(tmp_path):
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    out = h.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [1])
    inner = h.make_graph(
        [h.make_node("Identity", ["w"], ["o"])], "inner", [], [out], [_tensor(onnx, "w", [5.0])]
    )
    # an If whose then-branch holds a Loop whose body holds its own initializer
    body = h.make_graph(
        [h.make_node("Identity", ["v"], ["o"])], "body", [], [out], [_tensor(onnx, "v", [6.0])]
    )
    then = h.make_graph(
        [h.make_node("Loop", ["n", "c"], ["o"], name="loop", body=body)],
        "then",
        [],
        [out],
        [_tensor(onnx, "t", [7.0])],
    )
    node = h.make_node("If", ["c"], ["o"], name="branch", then_branch=then, else_branch=inner)
    graph = h.make_graph([node], "g", [], [out], [_tensor(onnx, "top", [1.0])])
    model = h.make_model(graph)
    info = onnx.TrainingInfoProto()
    info.initialization.CopyFrom(
        h.make_graph([], "init", [], [], [_tensor(onnx, "seed", [2.0])])
    )
    model.training_info.append(info)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with ztensor.Reader(path) as r:
        assert r.keys() == ["top"]
        assert sorted(r.attributes["onnx.skipped_subgraph_initializers"]) == [
            "branch.else_branch/w",
            "branch.then_branch/loop.body/v",
            "branch.then_branch/t",
            "training_info[0].initialization/seed",
        ]


def test_onnx_without_subgraphs_lists_nothing_more(tmp_path):
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    graph = h.make_graph([], "g", [], [], [_tensor(onnx, "top", [1.0])])
    path = tmp_path / "m.onnx"
    onnx.save(h.make_model(graph), path)
    with ztensor.Reader(path) as r:
        assert "onnx.skipped_subgraph_initializers" not in r.attributes


# ---- open_sharded of a path that is neither a folder nor an index
# (Contained / Clean: source.open_local_input, reached through sharded.ShardedReader._single_file)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_open_sharded_of_a_fifo_or_device_is_a_format_error(tmp_path, kind):
    import os

    if kind == "fifo":
        path = str(tmp_path / "ckpt")
        os.mkfifo(path)
    else:
        path = os.devnull
    with pytest.raises(ztensor.FormatError, match="not a regular file") as err:
        ztensor.open_sharded(path)  # os.listdir's NotADirectoryError before
    assert path in str(err.value)


def test_open_sharded_of_one_file_still_reads(tmp_path):
    path = tmp_path / "m.zt"
    ztensor.numpy.save_file({"a": np.arange(3, dtype=np.float32)}, str(path))
    with ztensor.open_sharded(path) as r:
        np.testing.assert_array_equal(r.read_numpy("a"), np.arange(3, dtype=np.float32))


# ---- transformers: generation_config.json is held to what transformers accepts
# (Clean: transformers._config_refusals, now around GenerationConfig.from_dict too)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from ztensor.transformers import save_pretrained

    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    folder = tmp_path_factory.mktemp("llama")
    save_pretrained(transformers.LlamaForCausalLM(config), folder)
    assert (folder / "generation_config.json").exists()
    return transformers, folder


@pytest.mark.parametrize(
    "generation",
    [
        {"watermarking_config": 5},  # AttributeError inside transformers
        {"cache_implementation": "nope"},  # ValueError
        {"pad_token_id": [[1]]},  # TypeError
        {"num_return_sequences": 4, "num_beams": 2},
    ],
)
def test_a_generation_config_transformers_refuses_is_a_format_error(tiny_llama, generation):
    import json

    from ztensor.transformers import from_pretrained

    transformers, folder = tiny_llama
    path = folder / "generation_config.json"
    kept = path.read_text()
    try:
        path.write_text(json.dumps(generation))
        with pytest.raises(ztensor.FormatError, match="generation config") as err:
            from_pretrained(transformers.AutoModelForCausalLM, folder)
        assert str(path) in str(err.value)
    finally:
        path.write_text(kept)
    model = from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert model.generation_config.eos_token_id == 2


# ---- zip: one archive per file
# (Clean / no silent drop: zip_members._end_records, applied by zip_members.ZipArchive)


def _hide_an_end_record(path):
    """Give the zip at ``path`` a comment that is itself an end record of an empty
    archive closing the file: Python's zipfile takes that one (it reads the last 22
    bytes first) and sees no member at all."""
    with zipfile.ZipFile(path, "a") as z:
        z.comment = b"PK\x05\x06" + bytes(18)
    with zipfile.ZipFile(path) as z:
        assert z.namelist() == []  # what a reader using zipfile alone sees


def test_a_checkpoint_with_a_second_end_record_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(4, dtype=torch.float32)}, path)
    _hide_an_end_record(path)
    # was read as an empty .npz: 0 tensors, and `convert` wrote an empty file, exit 0
    with pytest.raises(ztensor.FormatError, match="two end-of-archive records") as err:
        ztensor.Reader(path)
    assert str(path) in str(err.value)
    out = tmp_path / "out.safetensors"
    from ztensor.tools import cli

    assert cli.main(["convert", "-q", str(path), str(out)]) == 2
    assert not out.exists()


def test_an_npz_with_a_second_end_record_is_refused(tmp_path):
    path = tmp_path / "m.npz"
    np.savez(path, a=np.arange(3))
    _hide_an_end_record(path)
    with pytest.raises(ztensor.FormatError, match="two end-of-archive records"):
        ztensor.Reader(path)


def test_zips_with_comments_and_zip64_records_still_read(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(4, dtype=torch.float32)}, path)
    with zipfile.ZipFile(path) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members:
            with z.open(name, "w", force_zip64=True) as w:
                w.write(data)
        z.comment = b"a comment made by hand"
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r.read_numpy("w"), np.arange(4, dtype=np.float32))


def test_a_checkpoint_with_an_archive_appended_is_refused(tmp_path):
    # zipfile finds the appended .npz (the last end record) and shifts its offsets
    # past the checkpoint: read as the npz's 'evil', the checkpoint's tensors gone
    torch = pytest.importorskip("torch")
    ckpt, extra = tmp_path / "m.pt", tmp_path / "x.npz"
    torch.save({"w": torch.arange(4, dtype=torch.float32)}, ckpt)
    np.savez(extra, evil=np.arange(3))
    path = tmp_path / "both.pt"
    path.write_bytes(ckpt.read_bytes() + extra.read_bytes())
    with pytest.raises(ztensor.FormatError, match="bytes before the archive"):
        ztensor.Reader(path)
    # and bytes after an archive: no end record closes the file
    path.write_bytes(ckpt.read_bytes() + b"trailing bytes")
    with pytest.raises(ztensor.FormatError, match="no end-of-archive record"):
        ztensor.Reader(path)


def test_an_empty_npz_still_reads(tmp_path):
    path = tmp_path / "e.npz"
    np.savez(path)
    with ztensor.Reader(path) as r:
        assert r.keys() == []
