"""Session 17, probe round ten on session 16's changes: a save_pretrained whose
config move was refused, links that make two shards one file, an interrupt in the
clean-up after the moves, an old index naming files that are no shards, transformers'
loading keywords.  Each test names the one function that keeps its rule."""
import errno
import os

import numpy as np
import pytest

import ztensor
from ztensor.io import atomic, checkpoint_moves


def _values(folder):
    with ztensor.open_sharded(str(folder)) as ck:
        return {k: ck.read_numpy(k).tolist() for k in sorted(ck.keys())}


def _save(folder, value, names=("a", "b"), **kwargs):
    ztensor.save_sharded({k: np.full(4, value, "f4") for k in names}, str(folder),
                         max_shard_size=16, **kwargs)


@pytest.fixture(scope="module")
def tf():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    return torch, transformers, ztf


def _tiny(torch, transformers, seed, eps):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
        rms_norm_eps=eps))


def test_save_pretrained_moves_its_config_with_its_weights_all_or_none(tf, tmp_path,
                                                                       monkeypatch):
    """Rule: the configs are staged with the shards and move in the same all-or-none
    step (sharded.save_sharded's write_beside, checkpoint_moves.move_staged): a refused move
    of config.json left the new weights beside the old config, which loaded."""
    torch, transformers, ztf = tf
    old, new = _tiny(torch, transformers, 0, 1e-6), _tiny(torch, transformers, 1, 0.5)
    ztf.save_pretrained(old, tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    real = os.replace

    def replace(src, dst):
        if ".ztensor-staging-" in str(src) and str(dst).endswith("config.json"):
            raise PermissionError(errno.EPERM, "Operation not permitted", dst)
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(ztensor.WriteError, match="config.json"):
        ztf.save_pretrained(new, tmp_path)
    monkeypatch.undo()
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    assert loaded.config.rms_norm_eps == 1e-6
    assert torch.equal(loaded.model.embed_tokens.weight, old.model.embed_tokens.weight)


def test_two_shard_names_linked_to_one_file_are_refused_before_a_move(tmp_path):
    """Rule: every staged file needs a destination of its own
    (checkpoint_moves._require_distinct): shard 2's rename through the link replaced shard 1,
    the save succeeded and its checkpoint was refused by the reader."""
    _save(tmp_path, 1.0)
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".zt"))
    os.unlink(tmp_path / shards[0])
    os.symlink(shards[1], tmp_path / shards[0])
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(ztensor.WriteError, match="link to the same file"):
        _save(tmp_path, 7.0)
    assert sorted(os.listdir(tmp_path)) == listing


def test_a_shard_name_linked_to_the_index_is_refused(tmp_path):
    """Rule: checkpoint_moves._require_distinct, for a shard and the index."""
    _save(tmp_path, 1.0)
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".zt"))
    os.unlink(tmp_path / shards[0])
    os.symlink("model.zt.index.json", tmp_path / shards[0])
    with pytest.raises(ztensor.WriteError, match="link to the same file"):
        _save(tmp_path, 7.0)


def test_an_interrupt_in_the_clean_up_still_finishes_it(tmp_path, monkeypatch):
    """Rule: once the new checkpoint is in place its clean-up (the old files' links
    aside, the old shards it does not name, the record) is finished despite Ctrl-C,
    which is raised after (checkpoint_moves._unlink_all)."""
    _save(tmp_path, 1.0, names=("a", "b", "c"))
    real = os.unlink
    hits = []

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".old") and not hits:
            hits.append(path)
            real(path, *args, **kwargs)
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "unlink", unlink)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2.0, names=("a", "b"))  # 2 shards replace 3
    monkeypatch.undo()
    assert hits
    assert sorted(os.listdir(tmp_path)) == [
        "model-00001-of-00002.zt", "model-00002-of-00002.zt", "model.zt.index.json"]
    assert _values(tmp_path) == {"a": [2.0] * 4, "b": [2.0] * 4}


def test_an_old_index_naming_files_that_are_no_weights_does_not_remove_them(tmp_path):
    """Rule: sharded.old_shards gives only names of weight files
    (sharded.WEIGHT_SUFFIXES): an index naming tokenizer.json as a shard had the next
    save remove it."""
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "README.md").write_text("mine")
    (tmp_path / "old.zt").write_bytes(b"")
    (tmp_path / "model.zt.index.json").write_text(
        '{"weight_map": {"a": "tokenizer.json", "b": "README.md", "c": "old.zt"}}')
    _save(tmp_path, 1.0)
    assert (tmp_path / "tokenizer.json").read_text() == "{}"
    assert (tmp_path / "README.md").read_text() == "mine"
    assert not (tmp_path / "old.zt").exists()  # the old checkpoint's shard goes


def test_a_refused_save_removes_every_folder_it_made(tmp_path):
    """Rule: sharded.save_sharded removes the folders it made, parents too, when it
    refuses (only those: an existing folder stays)."""
    torch = pytest.importorskip("torch")
    target = tmp_path / "deep" / "er" / "ck"
    with pytest.raises(ztensor.ZTensorError):
        ztensor.save_sharded({"a": np.ones(2), "m": torch.empty(2, device="meta")},
                             str(target))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("keyword,value,error,match", [
    ("device_map", "cuda:0", ztensor.UnsupportedError, "device_map"),
    ("revision", "v2", ztensor.UnsupportedError, "revision"),
    ("token", "hf_x", ztensor.UnsupportedError, "storage_options"),
    ("variant", "fp16", ztensor.UnsupportedError, "variant"),
    ("gguf_file", "x.gguf", ztensor.UnsupportedError, "gguf_file"),
    ("key_mapping", {"a": "b"}, ztensor.UnsupportedError, "key_mapping"),
    ("ignore_mismatched_sizes", True, ztensor.UnsupportedError, "ignore_mismatched_sizes"),
    ("config", "tfbase", TypeError, "PretrainedConfig"),
    ("generation_config", {}, TypeError, "GenerationConfig"),
    ("no_such_option", 1, TypeError, "no_such_option"),
    ("attn_implementation", "kernels-community/flash-attn", ztensor.UnsupportedError,
     "attn_implementation="),
])
def test_loading_keywords_that_fail_name_the_keyword_not_config_json(
        tf, tmp_path, keyword, value, error, match):
    """Rule: transformers.from_pretrained's keywords are the caller's
    (transformers._loading_keywords, _refuse_model_keywords,
    _caller_choice_refusals): a refusal names the keyword, never config.json."""
    torch, transformers, ztf = tf
    ztf.save_pretrained(_tiny(torch, transformers, 0, 1e-6), tmp_path)
    with pytest.raises(error, match=match) as info:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path, **{keyword: value})
    assert "config.json" not in str(info.value) or keyword == "config"


def test_loading_keywords_transformers_users_pass_work(tf, tmp_path):
    """Rule: transformers._loading_keywords takes what transformers takes:
    the Hub's caching keywords change nothing, device_map on the CPU, config= and
    generation_config= objects instead of the files, subfolder, output_loading_info."""
    torch, transformers, ztf = tf
    model = _tiny(torch, transformers, 0, 1e-6)
    ztf.save_pretrained(model, tmp_path / "sub")
    auto = transformers.AutoModelForCausalLM
    plain = ztf.from_pretrained(auto, tmp_path / "sub", local_files_only=True,
                                low_cpu_mem_usage=True, revision="main", device_map="cpu",
                                cache_dir=str(tmp_path / "cache"), use_safetensors=None)
    assert torch.equal(plain.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert not (tmp_path / "cache").exists()
    other = transformers.LlamaConfig.from_pretrained(tmp_path / "sub")
    other.rms_norm_eps = 0.25
    given = ztf.from_pretrained(auto, tmp_path, subfolder="sub", config=other,
                                generation_config=transformers.GenerationConfig(max_length=5))
    assert given.config.rms_norm_eps == 0.25 and given.generation_config.max_length == 5
    assert torch.equal(given.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert other.rms_norm_eps == 0.25  # the caller's object is not changed
    loaded, info = ztf.from_pretrained(auto, tmp_path / "sub", output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                    "error_msgs": []}


# ------------------------------------------------------------------ round eleven


def test_a_save_removes_an_earlier_save_s_own_shards_under_the_lock(tmp_path, monkeypatch):
    """Rule: sharded.save_sharded asks for the old checkpoint's files under the
    folder's lock, before the moves (checkpoint_moves.move_staged's ``replaced``), and they
    include its own shard names without an index (sharded._own_shards):
    save_pretrained swept stale shards after the lock was released, and a save that
    moved in between lost its shard."""
    pytest.importorskip("fcntl")
    _save(tmp_path, 1.0, names=("a", "b", "c"))
    os.unlink(tmp_path / "model.zt.index.json")  # an earlier save whose index is gone
    asked = []
    real = checkpoint_moves._replace_all

    def spy(*args):
        asked.append("moves")
        return real(*args)

    monkeypatch.setattr(checkpoint_moves, "_replace_all", spy)
    real_old = ztensor.sharded.old_shards

    def old(path):
        import fcntl
        fd = os.open(tmp_path, os.O_RDONLY)
        try:  # the folder's lock is held (by this process, through another descriptor)
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        asked.append("asked")
        return real_old(path)

    monkeypatch.setattr(ztensor.sharded, "old_shards", old)
    _save(tmp_path, 2.0, names=("a",))
    assert asked == ["asked", "moves"]
    assert sorted(os.listdir(tmp_path)) == ["model-00001-of-00001.zt", "model.zt.index.json"]


def test_save_pretrained_to_a_url_is_refused_before_anything_is_made(tf, tmp_path,
                                                                     monkeypatch):
    """Rule: transformers.save_pretrained writes a local folder: a URL was a bare
    ValueError after os.makedirs made ./s3:/bucket/ckpt."""
    torch, transformers, ztf = tf
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ztensor.UnsupportedError, match="local folder"):
        ztf.save_pretrained(_tiny(torch, transformers, 0, 1e-6), "s3://bucket/ckpt")
    assert os.listdir(tmp_path) == []


def test_a_per_sub_config_attn_implementation_is_the_caller_s(tf, tmp_path):
    """Rule: transformers._caller_choice_refusals takes transformers' per-sub-config
    dict (it hashed the value: a TypeError blamed on config.json)."""
    torch, transformers, ztf = tf
    model = _tiny(torch, transformers, 0, 1e-6)
    ztf.save_pretrained(model, tmp_path)
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path,
                                 attn_implementation={"": "eager"})
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
