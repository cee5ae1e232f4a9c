"""Red team, hostile input round three, remote layer, second fresh round (after
16cbda1): URLs and file objects the first rounds did not try.  Each test names the
one function keeping its rule.

* A chained fsspec URL (``simplecache::``, ``blockcache::``, ``zip://m::...``) or a
  protocol whose filesystem reads another's files was opened as any URL: its outer
  layer read the inner URL's bytes whole and unchecked (a server naming no version
  read without the opt-in; a body without end filled the cache's disk, or 6 GB of
  memory and a bare IndexError; ``zip://x::file:///etc/passwd`` a bare
  BadZipFile).  ``local://`` opened a FIFO through fsspec and waited for ever.
  Refused (source.url_filesystem, the one place a URL becomes a filesystem).
* ``file://`` was taken as the relative path ``./file:/...``: ``save_sharded`` and
  ``Writer`` to ``file:///tmp/ck`` wrote into the current folder, ``Reader`` read
  from it.  Now a URL, refused with "give the path" (source.is_url, url_filesystem).
* An IPv6 literal host (``http://[::1]:8080/m.zt``) was split at its ``::`` by
  fsspec (asked for as ``http://[``, "not found"); a port out of range was "not
  found" too; ``HTTP://``, an unknown protocol, ``reference://`` and ``s3://`` were
  bare ValueError/TypeError (source.url_filesystem, source._network_error).
* A file object the caller opened with ``fsspec.open("http://...")`` was read
  without ztensor's checked replies: a 206 without end read whole into memory and
  taken as the tensor (source.refuse_unchecked_file).
* A password holding an unescaped ``@`` was shown after its first ``@``
  (errors.without_secrets).
"""
import os
import threading
import time

import numpy as np
import pytest
from http_servers import RawServer, raw, serving  # noqa: F401  (raw: a fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
import ztensor.numpy
from ztensor.errors import NetworkNotFoundError, without_secrets

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


def _file(tmp_path, n=1000):
    path = tmp_path / "m.zt"
    x = np.arange(n, dtype=np.float32)
    ztensor.numpy.save_file({"x": x}, str(path))
    return path.read_bytes(), x


# ------------------------------------------------------------------ 1. chained URLs
@pytest.mark.parametrize("layer", ["simplecache::", "blockcache::", "filecache::"])
def test_a_chained_url_is_not_read_around_the_checks(raw, tmp_path, layer):
    """A server naming no version, behind a caching layer: it was read without the
    opt-in (the cache fetched the file whole, unpinned and unchecked).  Refused
    before any request is made."""
    data, _ = _file(tmp_path)
    asked = []

    def reply(method, rng, headers):
        asked.append(method)
        return serving(data, etag=None)(method, rng, headers)
    server = raw(reply)
    with pytest.raises(ztensor.UnsupportedError, match="chained URL") as err:
        with ztensor.Reader(layer + server.url()) as r:
            r.read_numpy("x", copy=True)
    assert asked == [] and server.url() in str(err.value)


def test_a_cached_body_without_end_is_not_fetched(raw, tmp_path):
    """blockcache:: over a server whose GET never ends: 6 GB of memory, then a bare
    IndexError.  Now refused before a byte is asked for."""
    data, _ = _file(tmp_path)
    sent = []

    def reply(method, rng, headers):
        if method == "HEAD":
            return serving(data)(method, rng, headers)

        def endless():
            yield b'HTTP/1.1 200 OK\r\nETag: "v1"\r\nConnection: close\r\n\r\n'
            for _ in range(64):
                sent.append(1 << 20)
                yield bytes(1 << 20)
        return endless()
    server = raw(reply)
    with pytest.raises(ztensor.UnsupportedError):
        ztensor.Reader("blockcache::" + server.url())
    assert sum(sent) == 0


@pytest.mark.parametrize("url", ["zip://x::file:///etc/passwd", "dir::file:///etc",
                                 "reference://x", "simplecache::memory://m.zt",
                                 "tar://m.zt::memory://a.tar"])
def test_filesystems_over_other_files_are_refused(url):
    """zip:// over a local file was a bare BadZipFile, reference:// a bare
    TypeError; every one of them reads another filesystem's files unchecked."""
    with pytest.raises(ztensor.UnsupportedError, match="not read or written") as err:
        ztensor.Reader(url)
    assert url in str(err.value)


def test_a_fifo_behind_a_local_url_does_not_hang(tmp_path):
    """``local:///path/to/fifo`` went to fsspec's LocalFileSystem, which opened the
    FIFO blocking: the read waited for a writer for ever (here one comes after 3 s
    to end the wait).  A local file is read by its path (open_local_input)."""
    fifo = tmp_path / "f.zt"
    os.mkfifo(fifo)

    def writer():
        time.sleep(3)
        with open(fifo, "wb"):
            pass
    threading.Thread(target=writer, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(ztensor.UnsupportedError, match="local file's path"):
        ztensor.Reader(f"local://{fifo}")
    assert time.monotonic() - start < 2


# ------------------------------------------------------------------ 2. file:// URLs
def test_file_urls_are_not_paths_in_the_current_folder(tmp_path, monkeypatch):
    """``file:///abs/ckpt`` was the relative path ``./file:/abs/ckpt``: save_sharded
    and Writer wrote the checkpoint into the current folder, and Reader read a file
    planted there instead of the one named."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    target = tmp_path / "ck"
    with pytest.raises(ztensor.UnsupportedError, match="give the local file's path"):
        ztensor.save_sharded({"x": np.zeros(3)}, f"file://{target}")
    with pytest.raises(ztensor.UnsupportedError, match="give the local file's path"):
        ztensor.Writer(f"file://{tmp_path}/w.zt").close()
    assert os.listdir(work) == [] and not target.exists()
    # a planted ./file:/... is not what file:///... names
    real, _ = _file(tmp_path)
    planted = work / "file:" / str(tmp_path).lstrip("/")
    planted.mkdir(parents=True)
    ztensor.numpy.save_file({"planted": np.ones(2)}, str(planted / "m.zt"))
    with pytest.raises(ztensor.UnsupportedError, match="give the local file's path"):
        ztensor.Reader(f"file://{tmp_path}/m.zt")


# ------------------------------------------------------------------ 3. URL forms
def test_an_ipv6_literal_host_is_read(tmp_path):
    """fsspec's url_to_fs splits a URL at every '::' (its chains): the server at
    ``http://[::1]:port/m.zt`` was asked for ``http://[`` ("not found").  HTTP(S)
    filesystems are now made by protocol, the URL whole (source.url_filesystem)."""
    try:
        server = RawServer(serving(_file(tmp_path)[0]), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        with ztensor.Reader(server.url()) as r:
            np.testing.assert_array_equal(r.read_numpy("x", copy=True), _file(tmp_path)[1])
    finally:
        server.close()


@pytest.mark.parametrize("url,kind,said", [
    ("http://127.0.0.1:99999/m.zt", ztensor.NetworkError, "not a URL that can be asked for"),
    ("http://[zz]/m.zt", ztensor.NetworkError, "not a URL that can be asked for"),
    ("s3://", ztensor.NetworkError, "not a URL that can be asked for"),
    ("nosuchproto://x/m.zt", ztensor.UnsupportedError, "fsspec cannot open this URL"),
    ("ws://127.0.0.1:1/m.zt", ztensor.UnsupportedError, "fsspec cannot open this URL"),
])
def test_a_url_that_cannot_be_asked_for_says_so(url, kind, said):
    """A port out of range was "not found" (fsspec wraps the URL's refusal in a
    FileNotFoundError: a 404 no server sent); unknown protocols and s3fs's refusal
    of an empty key were bare ValueErrors."""
    with pytest.raises(kind, match=said) as err:
        ztensor.Reader(url)
    assert not isinstance(err.value, NetworkNotFoundError)


def test_an_upper_case_scheme_is_http(raw, tmp_path):
    """``HTTP://host/m.zt`` (schemes are case-insensitive, RFC 3986 3.1) was a bare
    ValueError "Protocol not known: HTTP"."""
    data, x = _file(tmp_path)
    url = raw(serving(data)).url().replace("http://", "HTTP://")
    with ztensor.Reader(url) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)


@pytest.mark.parametrize("url", ["simplecache::http://127.0.0.1:1/m.zt", "HTTP://127.0.0.1:1/m",
                                 "file:///etc/passwd", "zip://x::file:///etc/passwd"])
@pytest.mark.parametrize("command", ["ls", "info", "verify", "stats"])
def test_the_command_says_it_in_one_line(url, command, capsys):
    """The command's one-line error for every URL form above (BadZipFile and the
    ValueErrors were tracebacks' last lines)."""
    from ztensor.tools import cli

    assert cli.main([command, url]) in (1, 2)
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("ztensor: ") and "Traceback" not in err


# ------------------------------------------------------------------ 4. a caller's fsspec file
def test_a_callers_fsspec_http_file_is_refused(raw, tmp_path):
    """``Reader(fsspec.open(url).open())``: a file of fsspec's own session, whose
    replies ztensor's checks never see.  A 206 without end to the tensor's range
    was read whole (6 GB for a 12 MB file) and its zeros returned as the tensor."""
    import fsspec

    data, _ = _file(tmp_path, 3_000_000)
    honest = serving(data)
    sent = []

    def reply(method, rng, headers):
        if method == "GET" and rng and rng[0] > 0 and rng[1] - rng[0] > 100:
            def endless():
                yield (b'HTTP/1.1 206 P\r\nETag: "v1"\r\nContent-Range: bytes %d-%d/%d\r\n'
                       b"Connection: close\r\n\r\n" % (rng[0], rng[1], len(data)))
                for _ in range(64):
                    sent.append(1 << 20)
                    yield bytes(1 << 20)
            return endless()
        return honest(method, rng, headers)
    server = raw(reply)
    with fsspec.open(server.url(), "rb").open() as f:
        with pytest.raises(ztensor.UnsupportedError, match="opened by fsspec outside") as err:
            with ztensor.Reader(f) as r:
                r.read_numpy("x", copy=True)
    assert sum(sent) == 0 and server.url() in str(err.value)
    with ztensor.Reader(server.url()) as r:  # the URL itself: the checked reply
        with pytest.raises(ztensor.FormatError, match="more than"):
            r.read_numpy("x", copy=True)


def test_other_fsspec_files_are_still_read(tmp_path):
    """A memory:// file the caller opened is read as before."""
    import fsspec

    data, x = _file(tmp_path)
    fs = fsspec.filesystem("memory")
    fs.pipe("/s11b/m.zt", data)
    with fs.open("/s11b/m.zt", "rb") as f, ztensor.Reader(f) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)


# ------------------------------------------------------------------ 5. credentials
_PART = st.text(st.characters(min_codepoint=33, max_codepoint=126,
                              exclude_characters="/?#'\"<>:;,.)"), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(user=_PART, password=_PART)
def test_property_a_password_with_an_at_sign_is_hidden(user, password):
    """``http://alice:p@ss@host/`` (an unescaped '@': aiohttp and urllib cut the
    userinfo at the last one) was shown as ``http://***@ss@host/``."""
    password = "Q9@" + password
    text = without_secrets(f"http://{user}:{password}@host.example/m.zt: not found")
    assert text == "http://***@host.example/m.zt: not found", text
