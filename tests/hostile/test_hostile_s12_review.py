"""Review of session 12's fixes: regressions and sibling holes they left.

Each test names the commit it holds to account and the ONE function now enforcing
the rule.  Files are made by the real writer (ztensor.Writer) and laid out as
zstd's seekable format lays out other writers' tables."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import zstandard
from crafted import relaid, seek_table  # tests/ is on sys.path: conftest.py
from http_servers import raw, serving_files  # noqa: F401  (raw: a fixture)

import ztensor
from ztensor import spec
from ztensor.safe import safe_open

# ---- d21ae55 (seekable.decode_frames): a slice's work follows the frames it reads.
# decode_frames turned the WHOLE table's offsets into Python lists on every call, so
# each slice (safe_open's get_slice, every dask chunk) of a component of many frames
# cost memory and time in the table's length, not the rows read: a one-row read of a
# 200,000-frame table made 16 MB of lists and took 12 ms (reading every row one by
# one: quadratic).  Measured by memory allocated, not by time.


def test_a_slice_of_a_long_seek_table_allocates_for_its_frames_only(tmp_path):
    frames_count, row = 50_000, 64
    x = np.arange(frames_count * 16, dtype=np.float32).reshape(frames_count, 16)
    src = tmp_path / "src.zt"
    with ztensor.Writer(str(src)) as w:
        w.add("x", x, compress=True)
    values = x.astype("<f4").tobytes()  # the file's byte order on any host
    cctx = zstandard.ZstdCompressor(level=1)
    frames = [cctx.compress(values[i * row : (i + 1) * row]) for i in range(frames_count)]
    stored = b"".join(frames) + seek_table([(len(f), row) for f in frames])
    path = relaid(src, tmp_path / "many.zt", stored)
    with safe_open(str(path), "np") as f:
        piece = f.get_slice("x")
        np.testing.assert_array_equal(piece[0:1], x[0:1])  # the table parsed once
        tracemalloc.start()
        try:
            got = piece[31_337:31_339]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    np.testing.assert_array_equal(got, x[31_337:31_339])
    # two frames' worth of work; the table's lists were 50,000 x 2 x ~40 bytes
    assert peak < 512 << 10, peak


# ---- 3a3502c (Writer: a compressed component is checked with its decoded size): the
# size checked was the caller's array's, before formats' prepare widened it (sparse
# indices become u64), so int32 coordinates of 800 bytes were checked as 800 and
# written as 1,600, past the limit a default Reader holds the file to.  Now the sizes
# of the arrays written are declared (manifest_checks.Checker.check_zstd_size).


def _sparse(count):
    coords = np.arange(count, dtype=np.int32).reshape(1, count)
    return ztensor.Tensor(
        {"values": np.ones(count, np.float32), "coords": coords},
        format="sparse_coo",
        shape=(count + 100,),
    )


def test_a_compressed_sparse_object_is_checked_at_the_size_it_is_written(tmp_path, monkeypatch):
    limits = spec.Limits(max_component_size=1000)
    monkeypatch.setattr(spec, "DEFAULT_LIMITS", limits)  # what the Writer checks against
    path = tmp_path / "s.zt"
    with ztensor.Writer(str(path)) as w:
        with pytest.raises(ztensor.LimitError) as err:
            w.write("wide", _sparse(200), compress=True)  # 800 bytes as i32, 1,600 as u64
        assert (err.value.path, err.value.obj) == (str(path), "wide")
        w.write("fits", _sparse(100), compress=True)  # 800 bytes as u64: at the limit's side
    with ztensor.Reader(str(path), limits=limits) as r:
        assert list(r.keys()) == ["fits"]
        got = r.read("fits")
        np.testing.assert_array_equal(np.ravel(got.components["coords"]), np.arange(100))


# ---- 7387aea (transformers: the warning names a URL checkpoint without its
# credentials): the model from_pretrained returns kept the URL as given in its
# config's name_or_path, password and all, shown by repr(model.config) and written
# to config.json by save_pretrained.  Now the URL without secrets
# (errors.url_without_secrets), as every other place ztensor names a URL.

_SECRET = "S3CRETr7"


def test_from_pretrained_over_a_url_keeps_no_credentials_in_the_models_config(raw, tmp_path):  # noqa: F811
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import ztensor.transformers as ztf

    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=16)
    )
    folder = tmp_path / "m"
    ztf.save_pretrained(model, folder)
    weights = sorted(folder.glob("*.zt"))
    files = {f"/m/{p.name}": p.read_bytes() for p in folder.iterdir()}
    server = raw(serving_files(files))
    scheme, rest = server.url(f"/m/{weights[0].name}").split("://", 1)
    url = f"{scheme}://alice:{_SECRET}@{rest}?sig={_SECRET}"
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, url)
    assert _SECRET not in repr(loaded.config) and _SECRET not in loaded.config.name_or_path
    assert "***@127.0.0.1" in loaded.config.name_or_path
    out = tmp_path / "again"
    loaded.save_pretrained(out)
    assert _SECRET not in (out / "config.json").read_text()
