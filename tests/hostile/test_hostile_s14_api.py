"""Session 14: the compatibility surfaces, tried by a user porting code and by odd
arguments (a read-only probe round).  Each test names the one function that keeps
its rule."""
import numpy as np
import pytest

import ztensor


@pytest.fixture
def model(tmp_path):
    path = str(tmp_path / "m.zt")
    with ztensor.Writer(path, attributes={"k": "v"}) as w:
        w.write("a", np.arange(6, dtype=np.float32).reshape(2, 3))
        w.write("b", np.ones(3, np.uint8))
    return path


def test_a_closed_reader_answers_nothing(model):
    """A closed single-file Reader still answered keys(), len(), ``in``, iteration,
    metadata() and its attributes while a closed ShardedReader refused them: code
    written for one kind of checkpoint broke on the other.  One rule now, safetensors'
    safe_open's: once closed, every method but close raises ClosedError.  Kept by
    ``reader.Reader._require_open``."""
    r = ztensor.Reader(model)
    r.close()
    calls = {
        "keys": lambda: r.keys(), "len": lambda: len(r), "in": lambda: "a" in r,
        "iter": lambda: list(r), "attributes": lambda: r.attributes,
        "metadata": lambda: r.metadata("a"), "getitem": lambda: r["a"],
        "read_numpy": lambda: r.read_numpy("a"),
    }
    for what, call in calls.items():
        with pytest.raises(ztensor.ClosedError, match="m.zt"):
            call()
    r.close()  # twice is fine


def test_a_reader_left_by_its_with_block_is_closed(model):
    """The reference's Reader stays usable after its ``with`` block (its __exit__
    closes nothing); ours closes, as a file does (docs/migrating.md says so).  Arrays
    read inside the block stay valid."""
    with ztensor.Reader(model) as r:
        a = r.read_numpy("a")
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ztensor.ClosedError):
        r.keys()


def test_metadata_takes_a_list_of_names(model):
    """The reference's ``metadata`` takes a name or a list of names (a list of
    TensorMetadata back); a list was an ObjectNotFoundError naming ``<list>``."""
    with ztensor.Reader(model) as r:
        specs = r.metadata(["b", "a"])
        assert [s.name for s in specs] == ["b", "a"]
        assert specs[1].shape == (2, 3) and r.metadata([]) == []
        with pytest.raises(ztensor.ObjectNotFoundError, match="'zz'"):
            r.metadata(["a", "zz"])


def test_a_refusal_quoting_another_library_is_one_line(tmp_path):
    """from_pretrained on a config transformers' validators refuse gave a FormatError
    whose text held transformers' own line breaks ("Class validation error for
    validator ...:\\n    ValueError: ..."): a refusal is one line, whatever it
    quotes.  Kept by ``errors.ZTensorError._render``."""
    err = ztensor.FormatError("refused: Error for validator:\n    ValueError: bad\n",
                              path="cfg.json")
    assert str(err) == "cfg.json: refused: Error for validator: ValueError: bad"
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

    import ztensor.transformers as ztf
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 16, "num_attention_heads": 3,
        "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 8}))
    import ztensor.numpy as ztnp

    ztnp.save_file({"x": np.zeros(1, np.float32)}, str(folder / "model.zt"))
    with pytest.raises(ztensor.FormatError, match="transformers refuses the config") as exc:
        ztf.from_pretrained(AutoModelForCausalLM, str(folder))
    assert "\n" not in str(exc.value) and "attention heads" in str(exc.value)


def test_a_name_that_is_no_str_is_a_type_error_everywhere(tmp_path):
    """The Writer made a non-str name a TypeError (as the reference and safetensors
    do) while save_sharded made it a FormatError: one rule for a name a caller
    gives, ``attributes.caller_name``; nothing is written."""
    with pytest.raises(TypeError, match="tensor names are strings, not int"):
        ztensor.save_sharded({"a": np.ones(2), 1: np.ones(2)}, str(tmp_path / "c"))
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    with ztensor.Writer(str(tmp_path / "w.zt")) as w:
        with pytest.raises(TypeError, match="object names are strings, not bytes"):
            w.write(b"a", np.ones(1))
        with pytest.raises(ztensor.FormatError, match="non-empty"):
            w.write("", np.ones(1))


def test_a_closed_reader_is_still_true(model):
    """``if self.reader: self.reader.close()`` ran twice in cleanup code raised
    ClosedError once len() refused a closed Reader: a handle is true, open or
    closed (``reader.Reader.__bool__``), as a ShardedReader is."""
    r = ztensor.Reader(model)
    r.close()
    assert bool(r)
    if r:
        r.close()
