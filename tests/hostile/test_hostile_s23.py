"""Session 23's hostile-input and integrity tests: each failed on the code before it."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import tiny_llama  # tests/ is on sys.path: conftest.py

import ztensor
import ztensor.numpy

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")

# ------------------------------------------------------------------ two edits at once
def test_two_processes_appending_lose_no_update(tmp_path):
    """atomic.replace_if_unchanged: the check that the file is still the edit's
    source and the rename over it happen under a lock on its folder, so of two
    editors' appends each either lands or is a WriteError.  Before, both passed the
    check and the second rename dropped the first edit: appends that returned
    normally were missing from the file."""
    path = tmp_path / "race.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("init", np.zeros(1))
    child = (
        "import sys, numpy as np, ztensor\n"
        "ok = []\n"
        "for i in range(300):\n"
        "    try:\n"
        "        with ztensor.Writer.append(sys.argv[1]) as w:\n"
        "            w.write_numpy(f'{sys.argv[2]}{i}', np.zeros(1))\n"
        "        ok.append(f'{sys.argv[2]}{i}')\n"
        "    except ztensor.WriteError:\n"
        "        pass\n"
        "print(' '.join(ok))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", child, str(path), tag], stdout=subprocess.PIPE, text=True
        )
        for tag in "AB"
    ]
    claimed = [k for p in procs for k in p.communicate(timeout=300)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    with ztensor.Reader(str(path)) as r:
        have = set(r.keys())
    assert claimed, "no append landed"
    assert [k for k in claimed if k not in have] == []
    assert have == set(claimed) | {"init"}


def test_an_edit_waits_for_the_lock_and_then_sees_the_other_change(tmp_path):
    """The same rule made deterministic: while another editor holds the folder's
    lock (between its check and its rename), an edit's close waits; the other
    editor's rename lands, and the waiting edit is then a WriteError, the other
    change kept.  Before, the edit did not wait: it renamed over the file and the
    other editor's rename, which had passed its check, dropped it."""
    import fcntl
    import os
    import threading
    import time

    path = tmp_path / "m.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("init", np.zeros(1))
    other = tmp_path / "other.zt"
    with ztensor.Writer(str(other)) as w:
        w.write_numpy("init", np.zeros(1))
        w.write_numpy("theirs", np.ones(2))
    edit = ztensor.Writer.append(str(path))
    edit.write_numpy("mine", np.zeros(3))
    outcome = []

    def finish():
        try:
            edit.close()
            outcome.append("closed")
        except ztensor.WriteError as exc:
            outcome.append(exc)

    folder = os.open(str(tmp_path), os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # the other editor, between check and rename
        thread = threading.Thread(target=finish)
        thread.start()
        time.sleep(0.5)
        os.replace(other, path)  # its rename lands
    finally:
        os.close(folder)  # and its lock goes
    thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], ztensor.WriteError), outcome
    assert "changed while this edit was being made" in str(outcome[0])
    with ztensor.Reader(str(path)) as r:
        assert sorted(r.keys()) == ["init", "theirs"]
    assert sorted(os.listdir(tmp_path)) == ["m.zt"]  # no temporary file left


# ------------------------------------------------------------------ legacy edits
LEGACY = ["v0.1-handmade/features.zt", "ref-1.1.1/dense.zt", "ref-2.1.2/dense.zt"]


def _encodings(reader):
    """Per object, the (encoding, digest algorithm) of its components: a legacy
    sparse object's one blob becomes several v1.2 components, all alike."""
    return {
        name: {
            (c.encoding, None if c.digest is None else c.digest.split(":")[0])
            for c in reader.metadata(name).components.values()
        }
        for name in reader.keys()
    }


def _dense_values(reader):
    return {n: reader.read_numpy(n) for n in reader.keys() if reader.metadata(n).format == "dense"}


@pytest.mark.parametrize("source", LEGACY)
def test_copying_a_legacy_object_keeps_its_encoding_and_check(tmp_path, source):
    """Writer.copy_from re-encodes v0.1, v1.1 and v2 objects (writer._kept_encoding):
    each component keeps its zstd and its digest (xxh3, which this writer does not
    make, becomes crc32c).  Before, every such object was rewritten raw and
    unchecked: an append to a v0.1 file silently dropped every other object's
    compression and checksums."""
    out = tmp_path / "copy.zt"
    with ztensor.Reader(os.path.join(DATA, source)) as old:
        before, values = _encodings(old), _dense_values(old)
        with ztensor.Writer(str(out)) as w:
            for name in old.keys():
                w.copy_from(old, name)
    assert any(enc == "zstd" for encs in before.values() for enc, _ in encs)
    with ztensor.Reader(str(out)) as r:
        after = _encodings(r)
        for name, value in _dense_values(r).items():
            np.testing.assert_array_equal(value, values[name])
        r.verify()
    kept = {"crc32c": "crc32c", "sha256": "sha256", None: None}
    want = {n: {(enc, kept.get(check, "crc32c")) for enc, check in e} for n, e in before.items()}
    assert after == want


def test_an_append_to_a_v01_file_keeps_the_others_zstd_and_checksum(tmp_path):
    """The edit the finding was about: appending to a v0.1 file (features.zt: a
    zstd object and a crc32c-checked one) keeps both."""
    path = tmp_path / "features.zt"
    shutil.copy(os.path.join(DATA, "v0.1-handmade", "features.zt"), path)
    with ztensor.Writer.append(str(path)) as w:
        w.write_numpy("added", np.arange(3))
    with ztensor.Reader(str(path)) as r:
        assert r.metadata("zstd_i32").components["data"].encoding == "zstd"
        assert r.metadata("checked_u32").components["data"].digest.startswith("crc32c:")
        r.verify()


# ------------------------------------------------------------------ safetensors' spellings
def test_safe_open_takes_safetensors_framework_spellings(tmp_path):
    """safetensors takes "pytorch" as well as "pt" and "torch": code written against
    it got a ValueError here.  Its other frameworks are an UnsupportedError (a
    ZTensorError saying what is read into), not a typo's ValueError."""
    path = str(tmp_path / "x.zt")
    ztensor.numpy.save_file({"a": np.arange(3.0)}, path)
    with ztensor.safe_open(path, framework="numpy") as f:
        np.testing.assert_array_equal(f.get_tensor("a"), np.arange(3.0))
    for other in ("tf", "jax", "flax", "mlx", "paddle"):
        with pytest.raises(ztensor.UnsupportedError, match="not one ztensor reads into"):
            ztensor.safe_open(path, framework=other)
    with pytest.raises(ValueError, match="framework must be"):
        ztensor.safe_open(path, framework="nump")
    torch = pytest.importorskip("torch")
    with ztensor.safe_open(path, framework="pytorch") as f:
        assert torch.equal(f.get_tensor("a"), torch.arange(3.0, dtype=torch.float64))


def test_safe_open_of_a_bytes_path_is_a_type_error(tmp_path):
    """A bytes path went to the Reader as a file's contents ("not a zTensor file:
    unknown magic", naming <bytes>); safetensors raises TypeError, as now here,
    pointing to the call that loads bytes."""
    path = str(tmp_path / "x.zt")
    ztensor.numpy.save_file({"a": np.arange(3.0)}, path)
    with pytest.raises(TypeError, match=r"not bytes.*ztensor\.numpy\.load"):
        ztensor.safe_open(os.fsencode(path), framework="np")


# ------------------------------------------------------------------ save_pretrained
def test_save_pretrained_saves_a_parameter_that_is_a_slice_of_a_larger_tensor(tmp_path):
    """A parameter over part of its memory, sharing it with no other name (a slice
    of a larger tensor): transformers' save_pretrained saves it; ours refused the
    model with safetensors' save_model rule ("None is covering the entire
    storage"), naming no folder.  Now it is saved as itself and loads back equal,
    with the same logits as transformers' own save and load."""
    torch = pytest.importorskip("torch")
    model = tiny_llama(0)
    from ztensor import transformers as ztf

    bigger = torch.randn(128, 16)
    model.lm_head.weight = torch.nn.Parameter(bigger[32:96])
    ztf.save_pretrained(model, tmp_path / "zt")
    model.save_pretrained(tmp_path / "hf")
    ours = ztf.from_pretrained(type(model), tmp_path / "zt")
    theirs = type(model).from_pretrained(tmp_path / "hf").eval()
    assert torch.equal(ours.lm_head.weight, bigger[32:96])
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_save_pretrained_saves_tied_weights_that_are_a_slice_of_a_larger_tensor(tmp_path):
    """A tied embedding and head, both a slice of a larger tensor: transformers
    saves the embedding once and loads the model tied; ours refused it ("None is
    covering the entire storage", naming no folder).  Now stored once, as the
    slice, and loaded tied, with transformers' logits."""
    torch = pytest.importorskip("torch")
    model = tiny_llama(0, tied=True)
    from ztensor import transformers as ztf

    base = torch.randn(160, 16)
    model.model.embed_tokens.weight = torch.nn.Parameter(base[0:64])
    model.lm_head.weight = model.model.embed_tokens.weight
    ztf.save_pretrained(model, tmp_path / "zt")
    model.save_pretrained(tmp_path / "hf")
    with ztensor.open_sharded(str(tmp_path / "zt")) as stored:
        assert "lm_head.weight" not in stored.keys()
    ours = ztf.from_pretrained(type(model), tmp_path / "zt")
    theirs = type(model).from_pretrained(tmp_path / "hf").eval()
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert torch.equal(ours.lm_head.weight, base[0:64])
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_load_model_onto_the_meta_device_is_refused_before_reading(tmp_path):
    """Meta tensors hold no values to copy into a model: load_model(device="meta")
    failed in load_state_dict with torch's bare RuntimeError (safetensors refuses
    the device too).  Now an UnsupportedError naming the file, the model unchanged."""
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt

    path = tmp_path / "lin.zt"
    zt.save_model(torch.nn.Linear(2, 2), path)
    model = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ztensor.UnsupportedError, match="device 'meta' holds none") as caught:
        zt.load_model(model, path, device="meta")
    assert str(path) in str(caught.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
