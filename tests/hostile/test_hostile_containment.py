"""Containment and input checks (issue 21, round three): a file makes the library read
that file's bytes and nothing else.

* HDF5 datasets whose data lives elsewhere (external raw storage, virtual datasets)
  are refused; names that collide are refused; declared sizes are bounded.
* A shard name in an index is one plain file name (sharded.check_shard_name), for
  local paths and URLs: percent-encoded separators never reach a server.
* Every local input goes through source.open_local_input: a FIFO, a directory or a
  device is a clean error, never a hang, through every entry point and the command.
* An HTTP server that lies about a range, or fails, gives an error saying what
  happened, never wrong bytes or a bare ValueError.

Every hostile file here is made by the real writer (h5py, ztensor, json); the HTTP
server is a small one of our own on 127.0.0.1, in a thread (tests/http_servers.py).
"""
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest
from http_servers import LoopbackHTTP, free_port, send
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from ztensor import sharded
from ztensor.tools import convert_inputs
from ztensor.io import source
from ztensor.foreign import sniff


# ---------------------------------------------------------------- HDF5

try:
    import h5py
except ImportError:  # the other sections still run (the clean-wheel job has no h5py)
    h5py = None
needs_h5py = pytest.mark.skipif(h5py is None, reason="h5py is not installed")


@pytest.fixture
def secret(tmp_path):
    """A file outside the model's folder, with bytes a leak would show."""
    path = tmp_path / "secret.bin"
    path.write_bytes(b"TOPSECRET" * 8)
    (tmp_path / "model").mkdir()
    return path


@needs_h5py
@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_hdf5_external_storage_is_refused(secret, where):
    model = secret.parent / "model" / "m.h5"
    target = str(secret) if where == "absolute" else "../secret.bin"
    with h5py.File(model, "w") as f:
        f.create_dataset("w", shape=(72,), dtype="u1", external=[(target, 0, 72)])
        f["fine"] = np.arange(4.0)
    cwd = os.getcwd()
    os.chdir(model.parent)  # where HDF5 would resolve "../secret.bin" from
    try:
        with pytest.raises(ztensor.FormatError, match="stored outside the file") as exc:
            ztensor.Reader(model)
        assert exc.value.obj == "w" and exc.value.path == str(model)
        with pytest.raises(ztensor.FormatError, match="stored outside the file"):
            ztensor.convert(model, secret.parent / "out.zt")
        # the documented opt-in still reads them (what the refusal protects against)
        from ztensor.foreign import hdf5_file
        opened = hdf5_file.open_file(model, unsafe_allow_external=True)
        try:
            assert bytes(opened.entries["w"].load().components["data"][:9]) == b"TOPSECRET"
        finally:
            opened.close()
    finally:
        os.chdir(cwd)


@needs_h5py
def test_hdf5_virtual_dataset_is_refused(secret):
    other = secret.parent / "other.h5"
    with h5py.File(other, "w") as f:
        f["src"] = np.arange(10.0)
    layout = h5py.VirtualLayout(shape=(10,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(other), "src", shape=(10,))
    model = secret.parent / "model" / "v.h5"
    with h5py.File(model, "w") as f:
        f.create_virtual_dataset("v", layout)
    with pytest.raises(ztensor.FormatError, match="virtual dataset") as exc:
        ztensor.Reader(model)
    assert exc.value.obj == "v" and str(other) in str(exc.value)


@needs_h5py
def test_hdf5_links_out_of_the_file_are_not_followed(secret):
    other = secret.parent / "other.h5"
    with h5py.File(other, "w") as f:
        f["src"] = np.arange(10.0)
    model = secret.parent / "model" / "l.h5"
    with h5py.File(model, "w") as f:
        f["ok"] = np.arange(3.0)
        f["ext"] = h5py.ExternalLink(str(other), "src")
        f["soft"] = h5py.SoftLink("/ok")
    with ztensor.Reader(model) as r:
        assert r.keys() == ["ok"]
        np.testing.assert_array_equal(r["ok"], np.arange(3.0))


@needs_h5py
def test_hdf5_names_that_collide_are_refused(tmp_path):
    path = tmp_path / "n.h5"
    with h5py.File(path, "w") as f:
        f["a.b"] = np.zeros(2)
        f["a/b"] = np.ones(2)
    with pytest.raises(ztensor.FormatError, match="both be named 'a.b'") as exc:
        ztensor.Reader(path)
    assert "/a/b" in str(exc.value) and "/a.b" in str(exc.value)


@needs_h5py
def test_hdf5_an_empty_dataset_is_not_a_tensor(tmp_path):
    path = tmp_path / "e.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("e", data=h5py.Empty("f4"))
        f["ok"] = np.ones(2, np.float32)
    with ztensor.Reader(path) as r:
        assert r.keys() == ["ok"]


@needs_h5py
def test_hdf5_limits_apply(tmp_path):
    path = tmp_path / "l.h5"
    with h5py.File(path, "w") as f:
        for i in range(5):
            f[f"t{i}"] = np.zeros((2, 2, 2), np.float32)
    with pytest.raises(ztensor.LimitError, match="max_objects"):
        ztensor.Reader(path, limits=ztensor.DEFAULT_LIMITS.with_(max_objects=4))
    with pytest.raises(ztensor.LimitError, match="rank 3"):
        ztensor.Reader(path, limits=ztensor.DEFAULT_LIMITS.with_(max_rank=2))
    with pytest.raises(ztensor.LimitError, match="max_component_size"):
        ztensor.Reader(path, limits=ztensor.DEFAULT_LIMITS.with_(max_component_size=16))
    with ztensor.Reader(path, limits=ztensor.DEFAULT_LIMITS.with_(max_objects=5)) as r:
        assert len(r) == 5


@needs_h5py
def test_hdf5_a_declared_size_the_file_does_not_hold_is_refused(tmp_path):
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:   # 128 GiB declared, no chunk ever written
        f.create_dataset("huge", shape=(1 << 20, 1 << 15), dtype="f4", chunks=(1024, 1024))
        f.create_dataset("big_chunk", shape=(4,), maxshape=(None,), dtype="f8",
                         chunks=(1 << 27,))   # 32 bytes of data in one 1 GiB chunk
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ztensor.LimitError, match="declares") as exc:
        ztensor.Reader(path)
    assert exc.value.obj in ("huge", "big_chunk")
    with h5py.File(path, "a") as f:
        del f["huge"]
    with pytest.raises(ztensor.LimitError, match="one chunk declares") as exc:
        ztensor.Reader(path)
    assert exc.value.obj == "big_chunk"


@needs_h5py
def test_hdf5_honest_compression_and_fill_values_still_read(tmp_path):
    path = tmp_path / "ok.h5"
    data = np.zeros(1 << 24, np.uint8)
    data[::4096] = 7
    with h5py.File(path, "w") as f:
        f.create_dataset("z", data=data, chunks=(1 << 20,), compression="gzip",
                         compression_opts=9)
        part = f.create_dataset("part", shape=(1000, 100), dtype="f4", chunks=(10, 100),
                                fillvalue=1.5)
        part[:10] = 2.0   # one chunk written, the rest is the fill value
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r["z"], data)
        part = r["part"]
        assert (part[:10] == 2.0).all() and (part[10:] == 1.5).all()


@needs_h5py
def test_hdf5_reader_is_handed_the_checked_file(tmp_path):
    fifo = tmp_path / "x.h5"
    os.mkfifo(fifo)
    from ztensor.foreign import hdf5_file
    with fifo_guard(fifo) as fired:
        with pytest.raises(ztensor.FormatError, match="not a regular file"):
            hdf5_file.open_file(fifo)
    assert not fired


# ---------------------------------------------------------------- local inputs

@contextlib.contextmanager
def fifo_guard(fifo, seconds=3):
    """Turns a hang on ``fifo`` into a failure: after ``seconds`` a writer opens and
    closes it (and keeps doing so), so a reader blocked in open() wakes up and the
    test fails on ``fired``, never a stuck suite."""
    fired = []
    done = threading.Event()

    def rescue():
        if done.wait(seconds):
            return
        fired.append(True)
        while not done.wait(0.2):  # again and again: a reader may open it once more
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    thread = threading.Thread(target=rescue, daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        done.set()
        thread.join()


def _inputs(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    link = tmp_path / "link.zt"
    link.symlink_to(fifo)
    folder = tmp_path / "folder.zt"
    folder.mkdir()
    return {"fifo": fifo, "symlink to a fifo": link, "char device": "/dev/zero",
            "directory": folder}


OPENERS = {
    "Reader": lambda p: ztensor.Reader(p),
    "ztensor.open": lambda p: ztensor.open(p),
    "Reader(mmap=False)": lambda p: ztensor.Reader(p, mmap=False),
    "open_any": lambda p: convert_inputs.open_any(p),
    "sniff": lambda p: sniff(os.fspath(p)),
    "convert": lambda p: ztensor.convert(p, os.path.join(os.path.dirname(os.fspath(p)) or
                                                         ".", "never.zt"), force=True),
    "safe_open": lambda p: ztensor.safe_open(p, framework="np"),
}


@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_non_regular_inputs_are_clean_errors(tmp_path, opener):
    for kind, path in _inputs(tmp_path).items():
        with fifo_guard(tmp_path / "pipe.safetensors") as fired:
            with pytest.raises(ztensor.ZTensorError) as exc:
                OPENERS[opener](path)
        assert not fired, f"{opener} blocked on a {kind}"
        assert os.fspath(path) in str(exc.value), (kind, str(exc.value))
        if kind == "directory":  # convert takes a directory as a checkpoint
            assert isinstance(exc.value, IsADirectoryError) or opener == "convert"
        else:
            assert "not a regular file" in str(exc.value), (kind, str(exc.value))
    assert not (tmp_path / "never.zt").exists()


def test_a_nul_byte_in_a_path_is_a_format_error(tmp_path):
    for opener in ("Reader", "open_any", "convert"):
        with pytest.raises(ztensor.FormatError, match="not a file name"):
            OPENERS[opener](str(tmp_path / "a\0b.zt"))


def test_open_local_input_gives_the_checked_file(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"hello")
    with source.open_local_input(path) as f:
        assert f.read() == b"hello"
    with pytest.raises(FileNotFoundError):
        source.open_local_input(tmp_path / "missing")


@pytest.mark.parametrize("args", [["convert", "{fifo}", "{out}"], ["ls", "{fifo}"],
                                  ["info", "{link}"], ["convert", "{folder}/", "{out}"],
                                  ["verify", "/dev/zero"]])
def test_the_command_on_non_regular_inputs(tmp_path, args):
    inputs = _inputs(tmp_path)
    names = {"fifo": inputs["fifo"], "link": inputs["symlink to a fifo"],
             "folder": inputs["directory"], "out": tmp_path / "out.zt"}
    argv = [a.format(**names) for a in args]
    try:
        # run from here: the s390x job imports ztensor from the source folder it built
        out = subprocess.run([sys.executable, "-m", "ztensor", *argv], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ztensor {' '.join(argv)} hung")
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("ztensor: "), out.stderr
    assert not (tmp_path / "out.zt").exists()


# ---------------------------------------------------------------- shard names

BAD_SHARD_NAMES = ["../secret.zt", "..%2fsecret.zt", "%2e%2e%2fsecret.zt", "..%5csecret.zt",
                   "%2e%2e", "..", ".", "", "/etc/passwd", "sub/x.zt", "..\\secret.zt",
                   "a\0b.zt", "a\nb.zt", "a\x7fb.zt", "a\x85b.zt", "C:secret.zt",
                   "%252e%252e%252fsecret.zt", "\ud800.zt", "a\udcffb.zt"]


@pytest.mark.parametrize("name", BAD_SHARD_NAMES)
def test_bad_shard_names_are_refused_locally(tmp_path, name):
    ztensor.save_sharded({"a": np.arange(4.0)}, tmp_path / "ckpt")
    (tmp_path / "secret.zt").write_bytes((tmp_path / "ckpt" /
                                          "model-00001-of-00001.zt").read_bytes())
    (tmp_path / "ckpt" / "model.zt.index.json").write_text(json.dumps(
        {"weight_map": {"a": name}}))
    with pytest.raises(ztensor.FormatError, match="shard") as exc:
        with ztensor.open_sharded(tmp_path / "ckpt") as r:
            r["a"]
    assert exc.value.path.endswith("model.zt.index.json")


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=()), min_size=1, max_size=12))
def test_a_shard_name_is_one_plain_file_name(name):
    """Whatever passes names one file beside the index, before and after
    percent-decoding, on POSIX and Windows alike."""
    try:
        sharded.check_shard_name(name, "index.json")
    except ztensor.FormatError:
        return
    for decoded in (name, urllib.parse.unquote(name), urllib.parse.unquote(
            urllib.parse.unquote(name))):
        assert decoded not in (".", "..") and not any(c in decoded for c in "/\\\0:")
        assert os.path.basename(decoded) == decoded
        assert os.path.normpath(os.path.join("dir", decoded)) == os.path.join("dir", decoded)
    assert all(ord(c) >= 0x20 and not 0x7f <= ord(c) <= 0x9f for c in name)
    name.encode("utf-8")   # no lone surrogate (fuzz_remote: quote() raised on one)


# ---------------------------------------------------------------- a hostile server

class Hostile(LoopbackHTTP):
    """Serves ``files`` (path -> bytes) with range requests, misbehaving as
    ``mode["how"]`` says.  Every path asked for is recorded in ``asked``."""

    def __init__(self):
        self.files, self.mode, self.asked = {}, {"how": "honest"}, []
        super().__init__()

    @staticmethod
    def _send(h, status, body, headers=(), head=False):
        # a version (ztensor reads no URL whose server names none): one fixed time
        send(h, status, body, [*headers, ("Last-Modified", "Sat, 09 Sep 2001 01:46:40 GMT")],
             head)

    def answer(self, h, head):
        how = self.mode["how"]
        path = urllib.parse.unquote(h.path)
        self.asked.append(h.path)
        if how == "slow":
            time.sleep(3)
        if how in ("403", "404", "500"):
            return self._send(h, int(how), b"no", [("Content-Length", "2")], head)
        data = self.files.get(path)
        if data is None:
            return self._send(h, 404, b"", [("Content-Length", "0")], head)
        size = len(data)
        if head:
            claimed = 1 << 50 if how == "huge-size" else size
            return self._send(h, 200, b"", [("Content-Length", str(claimed)),
                                            ("Accept-Ranges", "bytes")], head)
        asked = h.headers.get("Range")
        if not asked:
            return self._send(h, 200, data, [("Content-Length", str(size))])
        first, last = (int(x) for x in asked[6:].split("-"))
        last = min(last, size - 1)
        if first >= size and how != "huge-size":
            return self._send(h, 416, b"", [("Content-Range", f"bytes */{size}"),
                                            ("Content-Length", "0")])
        body = data[first:last + 1]
        rng = f"bytes {first}-{last}/{size}"
        if how == "whole":
            return self._send(h, 200, data, [("Content-Length", str(size))])
        if how == "more":
            body += b"X" * 4096
        elif how == "more-unannounced":       # no length: the body ends at the close
            return send(h, 206, body + b"X" * 4096, [("Content-Range", rng)])
        elif how == "endless":
            h.send_response(206)
            h.send_header("Content-Range", rng)
            h.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(64):           # 64 MiB at most: bounded either way
                    h.wfile.write(b"\0" * (1 << 20))
            return
        elif how == "huge-length":
            return send(h, 206, body, [("Content-Range", rng), ("Content-Length", str(1 << 45))])
        elif how == "fewer":
            return self._send(h, 206, body[:len(body) // 2],
                              [("Content-Range", rng),
                               ("Content-Length", str(len(body) // 2))])
        elif how == "gzip":   # other bytes of the right length, compressed: a range
            import gzip       # is of the stored bytes, so any encoding is refused
            body = gzip.compress(b"\0" * len(body))
            return self._send(h, 206, body, [("Content-Range", rng), ("Content-Encoding", "gzip"),
                                             ("Content-Length", str(len(body)))])
        elif how == "wrong-range":
            other = max(0, first - 64)
            body = data[other:other + len(body)]
            rng = f"bytes {other}-{other + len(body) - 1}/{size}"
        self._send(h, 206, body, [("Content-Range", rng), ("Content-Length", str(len(body)))])


@pytest.fixture
def hostile(tmp_path):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    server = Hostile()
    yield server.url(), server
    server.close()


def _model_bytes(tmp_path):
    path = tmp_path / "m.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("a", np.arange(1000, dtype=np.float32))
        w.write_numpy("b", np.arange(1000, 2000, dtype=np.float32))
    return path.read_bytes()


def test_an_honest_server_reads(hostile, tmp_path):
    url, server = hostile
    server.files["/m.zt"] = _model_bytes(tmp_path)
    with ztensor.Reader(f"{url}/m.zt") as r:
        np.testing.assert_array_equal(r["a"], np.arange(1000, dtype=np.float32))
        got = r.read_numpy(["a", "b"], copy=True)
        np.testing.assert_array_equal(got["b"], np.arange(1000, 2000, dtype=np.float32))


@pytest.mark.parametrize("how", ["more", "more-unannounced", "endless", "huge-length",
                                 "fewer", "wrong-range", "whole", "gzip"])
def test_a_server_that_lies_about_a_range_is_a_format_error(hostile, tmp_path, how):
    url, server = hostile
    server.files["/m.zt"] = _model_bytes(tmp_path)
    server.mode["how"] = how
    with pytest.raises(ztensor.FormatError) as exc:
        with ztensor.Reader(f"{url}/m.zt") as r:
            r.read_numpy(["a", "b"], copy=True)  # the batched path (cat_ranges)
            r["a"]
    assert exc.value.path.startswith(url), str(exc.value)


@pytest.mark.parametrize("how", ["more", "wrong-range", "endless", "gzip"])
def test_a_lying_server_through_each_read_path(hostile, tmp_path, how):
    url, server = hostile
    server.files["/m.zt"] = _model_bytes(tmp_path)
    with ztensor.Reader(f"{url}/m.zt") as r:    # opened honestly, then the lies start
        server.mode["how"] = how
        for read in (lambda: r["a"], lambda: r.read_numpy(["a", "b"], copy=True),
                     lambda: ztensor.safe_open(f"{url}/m.zt", framework="np")
                     .get_slice("a")[10:20]):
            with pytest.raises(ztensor.FormatError):
                read()


def test_a_server_that_claims_a_huge_file(hostile, tmp_path):
    url, server = hostile
    server.files["/m.zt"] = _model_bytes(tmp_path)
    server.mode["how"] = "huge-size"
    with pytest.raises(ztensor.ZTensorError):
        ztensor.Reader(f"{url}/m.zt")


@pytest.mark.parametrize("how,words,builtin", [
    ("404", "404 Not Found", FileNotFoundError),
    ("403", "403 Forbidden", PermissionError),
    ("500", "500 Internal Server Error", OSError),
    ("refused", "connection refused", ConnectionError),
    ("slow", "timed out", TimeoutError),
])
def test_network_failures_say_what_went_wrong(hostile, tmp_path, monkeypatch, how, words,
                                              builtin):
    url, server = hostile
    server.files["/m.zt"] = _model_bytes(tmp_path)
    monkeypatch.setattr(source, "URL_TIMEOUT", 1.0)
    if how == "refused":
        url = f"http://127.0.0.1:{free_port()}"
    else:
        server.mode["how"] = how
    with pytest.raises(ztensor.ZTensorError, match=words) as exc:
        ztensor.Reader(f"{url}/m.zt")
    assert isinstance(exc.value, builtin) and exc.value.path == f"{url}/m.zt"
    # the command says it in one line
    code = subprocess.run(
        [sys.executable, "-c", "import sys, ztensor.io.source as s, ztensor.tools.cli as c; "
         "s.URL_TIMEOUT = 1.0; sys.exit(c.main(sys.argv[1:]))", "ls", f"{url}/m.zt"],
        capture_output=True, text=True, timeout=60)
    assert code.returncode == 2 and words in code.stderr and "Traceback" not in code.stderr
    assert code.stderr.count("\n") == 1, code.stderr


def test_a_failure_in_the_middle_of_reading(hostile, tmp_path):
    url, server = hostile
    server.files["/m.zt"] = _model_bytes(tmp_path)
    with ztensor.Reader(f"{url}/m.zt") as r:
        server.mode["how"] = "403"
        with pytest.raises(ztensor.ZTensorError, match="403") as exc:
            r["a"]
        assert isinstance(exc.value, PermissionError)


def _sharded_on_server(server, tmp_path, name):
    ztensor.save_sharded({"a": np.arange(4.0)}, tmp_path / "ckpt")
    shard = (tmp_path / "ckpt" / "model-00001-of-00001.zt").read_bytes()
    server.files["/secret.zt"] = shard                 # outside the checkpoint's folder
    server.files["/ckpt/model.zt.index.json"] = json.dumps(
        {"weight_map": {"a": name}}).encode()
    server.files["/ckpt/" + name] = shard


@pytest.mark.parametrize("name", ["..%2fsecret.zt", "%2e%2e%2fsecret.zt", "..%2Fsecret.zt",
                                  "%2e%2e/secret.zt", "a\0b.zt", "..", "%00.zt", "\ud800.zt"])
def test_shard_names_never_leave_the_folder_over_http(hostile, tmp_path, name):
    url, server = hostile
    _sharded_on_server(server, tmp_path, name)
    with pytest.raises(ztensor.FormatError, match="shard"):
        with ztensor.open_sharded(f"{url}/ckpt/model.zt.index.json") as r:
            r["a"]
    assert all(urllib.parse.unquote(p).startswith("/ckpt/") for p in server.asked), \
        server.asked


def test_shard_names_are_quoted_in_urls(hostile, tmp_path):
    url, server = hostile
    name = "model 1=2 é&a.zt"  # legal file name; unquoted, ' ', '&', '=' change the URL
    # ('?' and '#' are refused by sharded.check_shard_name: an object store's
    # filesystem reads them as a version; ';' too: a server stripping path
    # parameters reads '..;' as '..')
    _sharded_on_server(server, tmp_path, name)
    with ztensor.open_sharded(f"{url}/ckpt/model.zt.index.json") as r:
        np.testing.assert_array_equal(r["a"], np.arange(4.0))
        assert r.verify() == 0
    assert f"/ckpt/{name}" in {urllib.parse.unquote(p) for p in server.asked}


def test_an_index_that_is_a_fifo(tmp_path):
    (tmp_path / "ckpt").mkdir()
    fifo = tmp_path / "ckpt" / "model.zt.index.json"
    os.mkfifo(fifo)
    with fifo_guard(fifo) as fired:
        with pytest.raises(ztensor.FormatError, match="not a regular file"):
            ztensor.open_sharded(tmp_path / "ckpt")
    assert not fired
