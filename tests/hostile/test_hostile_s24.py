"""Session 24's hostile-input tests: each failed on the code before it."""

import os

import numpy as np
import pytest

import ztensor
import ztensor.numpy
import ztensor.safe


def _write(kind, path, value):
    """A file of format ``kind`` holding one tensor equal to ``value``."""
    if kind == "zt":
        with ztensor.Writer(str(path)) as w:
            w.write_numpy("x", value)
    elif kind == "safetensors":
        safetensors_numpy = pytest.importorskip("safetensors.numpy")
        safetensors_numpy.save_file({"x": value}, str(path))
    elif kind == "pt":
        torch = pytest.importorskip("torch")
        torch.save({"x": torch.from_numpy(value)}, str(path))
    elif kind == "npz":
        np.savez(str(path), x=value)
    else:
        np.save(str(path), value)


@pytest.mark.parametrize("kind", ["zt", "safetensors", "npy", "npz", "pt"])
def test_safe_open_handle_refuses_a_file_swapped_in_after_its_check(tmp_path, monkeypatch, kind):
    """safe_open_handle proves the handle's name leads to the handle's file, then
    opens it by name.  A file renamed over that name between the proof and the open
    was read: the tensor came from a file the handle never held.  Now the proof is
    pinned (io.source.pinned_file) and checked on the descriptor the reader opens."""
    ext = "." + kind
    path, other = tmp_path / ("model" + ext), tmp_path / ("other" + ext)
    _write(kind, path, np.zeros(4, np.float32))
    _write(kind, other, np.full(4, 7, np.float32))
    proven = ztensor.safe.handle_file

    def proof_then_swap(f):
        found = proven(f)
        os.replace(other, path)  # the race: after the check, before the open
        return found

    monkeypatch.setattr(ztensor.safe, "handle_file", proof_then_swap)
    with open(path, "rb") as f:
        with pytest.raises(ztensor.UnsupportedError, match="no longer leads to the handle"):
            ztensor._safe_open_handle(f, framework="np")


@pytest.mark.parametrize("kind", ["zt", "safetensors", "npy", "npz", "pt"])
def test_safe_open_handle_reads_its_own_file(tmp_path, kind):
    """The pin refuses nothing that is the handle's file."""
    path = tmp_path / ("model." + kind)
    _write(kind, path, np.arange(4, dtype=np.float32))
    with open(path, "rb") as f, ztensor._safe_open_handle(f, framework="np") as g:
        (name,) = g.keys()  # an .npy's one array is named by the reader
        np.testing.assert_array_equal(g.get_tensor(name), np.arange(4, dtype=np.float32))
    # the pin lasts only while the handle's file is opened: the name opens freely after
    os.replace(path, tmp_path / "moved")
    _write(kind, path, np.ones(4, np.float32))
    with ztensor.safe_open(str(path), framework="np") as g:
        np.testing.assert_array_equal(g.get_tensor(name), np.ones(4, np.float32))


# ------------------------------------------------- an edit never launders corruption
DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")


def _corrupt_copy(src, dst, name):
    """``src`` copied to ``dst`` with one bit of object ``name``'s first checked
    component flipped (found from its manifest entry, not a hard-coded offset)."""
    with ztensor.Reader(src) as r:
        comp = next(c for c in r.metadata(name).components.values() if c.digest is not None)
        where = comp.offset + comp.length // 2
    data = bytearray(open(src, "rb").read())
    data[where] ^= 0x01
    dst.write_bytes(bytes(data))
    with ztensor.Reader(str(dst)) as r, pytest.raises(ztensor.ChecksumError):
        r.verify()  # the corruption is there to be found
    return str(dst)


def _checked_object(path):
    with ztensor.Reader(path) as r:
        return next(n for n in r.keys() if any(
            c.digest is not None for c in r.metadata(n).components.values()))


@pytest.mark.parametrize("src", ["v0.1-handmade/features.zt", "ref-2.1.2/dense.zt"])
def test_an_edit_of_a_legacy_file_does_not_vouch_for_corrupt_bytes(tmp_path, src):
    """copy_from re-encodes v0.1, v1.1 and v2 objects with fresh digests computed
    over what it read, and read without checking the old ones: after an append of an
    unrelated object to a v0.1 file with a flipped bit, or a copy out of a corrupt v2
    file, verify() said OK and the corruption could no longer be found.  Now the old
    digests are checked first: a ChecksumError, and the file is left as it was."""
    src = os.path.join(DATA, src)
    name = _checked_object(src)
    path = _corrupt_copy(src, tmp_path / "corrupt.zt", name)
    if not src.endswith("ref-2.1.2/dense.zt"):  # v2 files are read-only: no append
        before = open(path, "rb").read()
        with pytest.raises(ztensor.ChecksumError, match=name):
            with ztensor.Writer.append(path) as w:
                w.write_numpy("added", np.arange(3))
        assert open(path, "rb").read() == before
    with ztensor.Reader(path) as r, ztensor.Writer(str(tmp_path / "copy.zt")) as w:
        with pytest.raises(ztensor.ChecksumError, match=name):
            w.copy_from(r, name)
        for other in r.keys():  # the intact objects still copy, and check out
            if other != name:
                w.copy_from(r, other)
    with ztensor.Reader(str(tmp_path / "copy.zt")) as r:
        assert name not in r.keys()
        r.verify()


@pytest.mark.parametrize("src", ["v0.1-handmade/features.zt", "ref-2.1.2/dense.zt"])
def test_an_edit_of_an_intact_legacy_file_keeps_every_check(tmp_path, src):
    """The check refuses nothing intact: every object copies, and every copied
    digest checks out against the bytes read."""
    src = os.path.join(DATA, src)
    with ztensor.Reader(src) as r, ztensor.Writer(str(tmp_path / "copy.zt")) as w:
        names = list(r.keys())
        for name in names:
            w.copy_from(r, name)
    with ztensor.Reader(src) as a, ztensor.Reader(str(tmp_path / "copy.zt")) as b:
        assert sorted(b.keys()) == sorted(names)
        assert b.verify() >= a.check_digests(_checked_object(src)) > 0
        for name in names:
            x, y = a.read(name), b.read(name)
            for role in x.components:
                np.testing.assert_array_equal(np.asarray(x.components[role]),
                                              np.asarray(y.components[role]))


# ------------------------------------------------------------------ dask
def _one_frame_file(path, rows=512, cols=1024):
    """Two float32 tensors of ``rows`` x ``cols``, each one zstd frame without a seek
    table, as v1.1 files and other writers store them (a manifest written by hand: this
    package's writer makes seekable streams of large tensors)."""
    import struct

    import cbor2
    import zstandard

    values = [np.full((rows, cols), i + 1, np.float32) for i in range(2)]
    body = bytearray(b"ZTEN1000")
    objects = {}
    for name, value in zip("ab", values):
        body += bytes(-len(body) % 64)
        payload = zstandard.ZstdCompressor().compress(value.tobytes())
        objects[name] = {"shape": [rows, cols], "format": "dense", "components": {"data": {
            "dtype": "f32", "offset": len(body), "length": len(payload),
            "uncompressed_length": value.nbytes, "encoding": "zstd"}}}
        body += payload
    manifest = cbor2.dumps({"version": "1.2.0", "objects": objects})
    path.write_bytes(bytes(body) + manifest + struct.pack("<Q", len(manifest)) + b"ZTEN1000")
    return values


def test_dask_decodes_a_stream_without_seek_table_once_per_compute(tmp_path, monkeypatch):
    """A zstd stream without a seek table was chunked by rows: every chunk decoded the
    whole stream unless the worker's handle still held it, and it holds one tensor, so
    (a + b) decoded a whole tensor for nearly every chunk (125 decodes of 64 MiB for
    a 4.5 KB file).  Now such a tensor is read whole, once, and rechunked."""
    dask = pytest.importorskip("dask")
    import ztensor.dask
    from ztensor.io import zstd_stream

    a, b = _one_frame_file(tmp_path / "two.zt")
    decodes = []
    real = zstd_stream.zstd_decode

    def counting(*args, **kwargs):
        decodes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(zstd_stream, "zstd_decode", counting)
    arrays = ztensor.dask.from_zt_all(str(tmp_path / "two.zt"), chunk_bytes=64 << 10)
    assert arrays["a"].numblocks[0] > 1  # the chunks asked for, still
    with dask.config.set(scheduler="threads", num_workers=2):
        total, first = dask.compute((arrays["a"] + arrays["b"]).sum(), arrays["a"][:3])
    assert total == (a + b).sum()
    np.testing.assert_array_equal(first, a[:3])
    assert 2 <= len(decodes) <= 4  # each stream once per compute (a[:3] reads a again)


def test_dask_of_a_checkpoint_missing_a_shard_names_the_index(tmp_path):
    """from_zt_all took each shard's identity with a bare os.stat before the checked
    open: a shard the index names but that is missing (or a symlink loop) was a bare
    FileNotFoundError (OSError), where open_sharded says it as a FormatError."""
    pytest.importorskip("dask")
    import json

    import ztensor.dask

    ztensor.numpy.save_file({"a": np.zeros(3, np.float32)}, str(tmp_path / "s1.zt"))
    os.symlink("loop.zt", tmp_path / "loop.zt")
    for missing in ("s2.zt", "loop.zt"):
        (tmp_path / "model.zt.index.json").write_text(
            json.dumps({"weight_map": {"a": "s1.zt", "b": missing}}))
        with pytest.raises(ztensor.FormatError, match=f"names shard '{missing}'"):
            ztensor.dask.from_zt_all(str(tmp_path))
        with pytest.raises(ztensor.FormatError, match=f"names shard '{missing}'"):
            ztensor.dask.from_zt(str(tmp_path), "b")


def test_safe_open_handle_of_a_local_name_that_looks_like_a_url_reads_the_local_file(
        tmp_path, monkeypatch):
    """A handle's name is a local file's (it has a descriptor), but a name holding
    "://" (a file under a folder named "http:") was handed on as a URL, and the
    server's tensor was read instead of the handle's file."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "http:" / "127.0.0.1:1"
    folder.mkdir(parents=True)
    ztensor.numpy.save_file({"x": np.arange(3, dtype=np.float32)}, str(folder / "m.zt"))
    with open("http://127.0.0.1:1/m.zt", "rb") as f, ztensor._safe_open_handle(f) as g:
        np.testing.assert_array_equal(g.get_tensor("x"), np.arange(3, dtype=np.float32))


# ---------------------------------------- a reply names the version its open saw
def _versions():
    import ztensor.numpy as zn

    out = []
    for value in (1.0, 2.0):
        buf = zn.save({"w": np.full(4, value, np.float32)})
        out.append(bytes(buf))
    assert len(out[0]) == len(out[1])  # a replacement of the same size
    return out


def _version_server(state):
    """A server answering HEAD and ranges of ``state["data"]``, naming ``state["hdr"]``
    (its version headers) in every reply, and honouring no condition: as a proxy
    that ignores If-Match / If-Unmodified-Since would."""
    from http_servers import RawServer

    def reply(method, asked, headers):
        data = state["data"]
        common = b"Connection: close\r\nAccept-Ranges: bytes\r\n" + state["hdr"]
        if method == "HEAD" or asked is None:
            return (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(data) + common + b"\r\n"
                    + (b"" if method == "HEAD" else data))
        a, b = asked[0], min(asked[1], len(data) - 1)
        return (b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n"
                b"Content-Length: %d\r\n" % (a, b, len(data), b - a + 1)
                + common + b"\r\n" + data[a:b + 1])

    return RawServer(reply)


MONDAY = b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
TUESDAY = b"Last-Modified: Tue, 02 Jan 2024 00:00:00 GMT\r\n"


@pytest.mark.parametrize("opened, replaced", [
    # a weak ETag pins nothing (If-Match compares strongly), so the requests carry
    # If-Unmodified-Since; a file replaced within that second was seen only by its
    # ETag, which no reply was compared with
    (b'ETag: W/"one"\r\n' + MONDAY, b'ETag: W/"two"\r\n' + MONDAY),
    # a strong ETag pins with If-Match; a reply without an ETag (a proxy dropping it)
    # naming a later Last-Modified than the open saw was taken
    (b'ETag: "one"\r\n' + MONDAY, TUESDAY),
], ids=["weak etag changed", "etag dropped, last-modified changed"])
def test_a_reply_naming_another_version_than_the_open_saw_is_refused(opened, replaced):
    pytest.importorskip("aiohttp")
    pytest.importorskip("fsspec")
    v1, v2 = _versions()
    state = {"data": v1, "hdr": opened}
    server = _version_server(state)
    with ztensor.Reader(server.url()) as r:
        state.update(data=v2, hdr=replaced)  # replaced on the server while open
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            r.read_numpy("w", copy=True)


@pytest.mark.parametrize("opened, later", [
    (b'ETag: W/"one"\r\n' + MONDAY, b'ETag: W/"one"\r\n' + MONDAY),
    (b'ETag: W/"one"\r\n' + MONDAY, b'ETag: "one"\r\n' + MONDAY),  # weakly equal
    (b'ETag: "one"\r\n' + MONDAY, b'ETag: "one"\r\n'),  # a validator left out
    (MONDAY, MONDAY),
    # the same strong ETag is the same bytes, whatever date a reply is stamped with
    (b'ETag: "one"\r\n' + MONDAY, b'ETag: "one"\r\n' + TUESDAY),
], ids=["same", "weak then strong", "one left out", "dates only", "strong etag, new date"])
def test_a_reply_naming_the_version_opened_is_read(opened, later):
    pytest.importorskip("aiohttp")
    pytest.importorskip("fsspec")
    v1, _ = _versions()
    state = {"data": v1, "hdr": opened}
    server = _version_server(state)
    with ztensor.Reader(server.url()) as r:
        state["hdr"] = later
        np.testing.assert_array_equal(r.read_numpy("w", copy=True), np.ones(4, np.float32))


def test_another_open_of_the_url_does_not_vouch_for_a_replaced_file():
    """Each open's replies are held to what its own HEAD named: a later open of the
    replaced file (a dask task, another reader) is no reason to take its bytes
    under the first open's manifest."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("fsspec")
    v1, v2 = _versions()
    state = {"data": v1, "hdr": b'ETag: W/"one"\r\n' + MONDAY}
    server = _version_server(state)
    with ztensor.Reader(server.url()) as first:
        state.update(data=v2, hdr=b'ETag: W/"two"\r\n' + MONDAY)
        with ztensor.Reader(server.url()) as second:
            np.testing.assert_array_equal(second.read_numpy("w", copy=True),
                                          np.full(4, 2, np.float32))
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            first.read_numpy("w", copy=True)


def test_a_callers_own_trace_context_still_reaches_its_traces():
    """The open's validators travel in aiohttp's trace_request_ctx: a caller's own
    (storage_options, with a trace of their own in client_kwargs) reached their trace
    on the HEAD only, replaced by ours on every range request."""
    aiohttp = pytest.importorskip("aiohttp")
    pytest.importorskip("fsspec")
    v1, _ = _versions()
    server = _version_server({"data": v1, "hdr": b'ETag: "one"\r\n' + MONDAY})
    seen = []

    async def on_request_end(session, context, params):
        seen.append((params.method, dict(context.trace_request_ctx or {}).get("caller")))

    mine = aiohttp.TraceConfig()
    mine.on_request_end.append(on_request_end)
    options = {"client_kwargs": {"trace_configs": [mine]}, "trace_request_ctx": {"caller": 1}}
    with ztensor.Reader(server.url(), storage_options=options) as r:
        np.testing.assert_array_equal(r.read_numpy("w", copy=True), np.ones(4, np.float32))
    assert len(seen) >= 3 and all(caller == 1 for _, caller in seen)
    assert any(method == "GET" for method, _ in seen)
