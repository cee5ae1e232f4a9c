"""Red team, session 10 (issue 21, closing round): remote reads, sharded indexes,
dask and the command, each test a break found by trying docs/threat-model.md's
promises with crafted files and servers on loopback.  Each test names the one
function that now keeps the rule.

* One version per read: every request for an HTTP(S) file carries the version pin
  of source._pinned_version (cat_ranges too: source.Source._cat_ranges), a URL that
  redirects is pinned like any other, and a reply naming another version than the
  one pinned is refused (source._check_version).
* A whole-request deadline (source.URL_DEADLINE): a server trickling one byte at a
  time no longer holds a read for ever.
"""
import email.utils
import os
import time

import numpy as np
import pytest

import ztensor
from ztensor.errors import NetworkTimeoutError
from ztensor.io import source as src

from test_hostile_redteam_dist import two_versions

from http_servers import RawServer, VersionedFiles, nginx, web  # noqa: F401  (web: a fixture)


def _redirect(to):
    def answer(h):
        h.send_response(302)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return answer


# ----------------------------------------------------------------- one version per read
def test_many_tensors_of_a_replaced_file_are_refused(web, tmp_path):
    """read_numpy([...], copy=True) fetches through fsspec's cat_ranges, whose requests
    are made by path and did not carry the If-Match the file was opened with: the
    manifest of v1 was read with v2's bytes (x came back as sevens), silently."""
    one, two, _ = two_versions(tmp_path)
    server = web()
    server.files["/m.zt"], server.tags["/m.zt"] = one, '"v1"'
    with ztensor.Reader(server.url("/m.zt")) as r:
        server.files["/m.zt"], server.tags["/m.zt"] = two, '"v2"'
        with pytest.raises(ztensor.FormatError, match="changed on the server") as err:
            r.read_numpy(["x", "y"], copy=True)
    assert server.url("/m.zt") in str(err.value)


def test_a_redirected_url_is_pinned(web, tmp_path):
    """A URL that redirects was read unpinned: the file behind it replaced while
    open gave v1's manifest over v2's bytes.  The pin travels along the redirect and
    the host serving the bytes judges it."""
    one, two, x = two_versions(tmp_path)
    server = web()
    server.files["/blob/m.zt"], server.tags["/blob/m.zt"] = one, '"v1"'
    server.routes["/r.zt"] = _redirect("/blob/m.zt")
    url = server.url("/r.zt")
    with ztensor.Reader(url) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)   # pinned, and fine
        server.files["/blob/m.zt"], server.tags["/blob/m.zt"] = two, '"v2"'
        with pytest.raises(ztensor.FormatError, match="changed on the server") as err:
            r.read_numpy("x", copy=True)
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            r.read_numpy(["x", "y"], copy=True)
    assert url in str(err.value)


def test_a_redirect_that_changes_target_is_caught(web, tmp_path):
    """The redirect now leads to another file (a hub's 'main' moved to a new blob):
    refused; led to a copy of the same version, the bytes are the same and read."""
    one, two, x = two_versions(tmp_path)
    server = web()
    server.files["/blob/1"], server.tags["/blob/1"] = one, '"v1"'
    server.files["/blob/2"], server.tags["/blob/2"] = two, '"v2"'
    server.files["/mirror/1"], server.tags["/mirror/1"] = one, '"v1"'
    server.routes["/main.zt"] = _redirect("/blob/1")
    with ztensor.Reader(server.url("/main.zt")) as r:
        server.routes["/main.zt"] = _redirect("/mirror/1")
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)
        server.routes["/main.zt"] = _redirect("/blob/2")
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            r.read_numpy("x", copy=True)


def test_a_server_ignoring_if_match_is_still_held_to_the_version(web, tmp_path):
    """A server (or a redirect target) that ignores If-Match and answers 206 with
    another ETag handed over another version's bytes: now source._check_version
    refuses the reply."""
    one, two, _ = two_versions(tmp_path)
    server = web()
    server.files["/m.zt"], server.tags["/m.zt"] = one, '"v1"'
    answer = VersionedFiles.answer

    def careless(self, h, head):       # ignores the condition, names its version
        del h.headers["If-Match"]
        return answer(self, h, head)
    with ztensor.Reader(server.url("/m.zt")) as r:
        server.files["/m.zt"], server.tags["/m.zt"] = two, '"v2"'
        server.answer = careless.__get__(server)
        with pytest.raises(ztensor.FormatError, match="ETag") as err:
            r.read_numpy("x", copy=True)
        with pytest.raises(ztensor.FormatError, match="ETag"):
            r.read_numpy(["x", "y"], copy=True)
    assert "changed on the server" in str(err.value)


def test_last_modified_pin_catches_an_older_copy(web, tmp_path):
    """A server naming only Last-Modified is pinned with If-Unmodified-Since, which
    a replacement carrying an *older* time passes (``cp -p``, ``rsync -t``): the old
    manifest was read over the new bytes.  The reply's Last-Modified is now held to
    the one pinned."""
    one, two, _ = two_versions(tmp_path)
    server = web(versioned=False)   # no ETag: Last-Modified alone
    stamp = {"/m.zt": email.utils.formatdate(2_000_000_000, usegmt=True)}
    answer = VersionedFiles.answer

    class Dated:  # the handler's send_header, adding the file's Last-Modified
        def __init__(self, h):
            self.h = h

        def __getattr__(self, name):
            return getattr(self.h, name)

        def end_headers(self):
            self.h.send_header("Last-Modified", stamp["/m.zt"])
            self.h.end_headers()
    server.answer = lambda h, head: answer(server, Dated(h), head)
    server.files["/m.zt"] = one
    with ztensor.Reader(server.url("/m.zt")) as r:
        server.files["/m.zt"] = two
        stamp["/m.zt"] = email.utils.formatdate(1_000_000_000, usegmt=True)
        with pytest.raises(ztensor.FormatError, match="Last-Modified"):
            r.read_numpy("x", copy=True)


@pytest.fixture
def nginx_redirect(tmp_path):
    """nginx on loopback (tests/http_servers.py) with /r.zt answering 302 to /m.zt."""
    with nginx(tmp_path, "location = /r.zt { return 302 /m.zt; }") as served:
        yield served


def test_nginx_redirected_url_is_pinned(nginx_redirect, tmp_path):
    """The same against nginx: its 302 carries the If-Match along, its 206 judges it."""
    url, www, log = nginx_redirect
    one, two, x = two_versions(tmp_path)
    (www / "m.zt").write_bytes(one)
    os.utime(www / "m.zt", (1_000_000_000, 1_000_000_000))
    with ztensor.Reader(f"{url}/r.zt") as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)
        (www / "next.zt").write_bytes(two)
        os.replace(www / "next.zt", www / "m.zt")
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            r.read_numpy(["x", "y"], copy=True)
    statuses = [line.split()[2] for line in log.read_text().splitlines()]
    assert "302" in statuses and "412" in statuses


# ----------------------------------------------------------------- a whole-request deadline
def trickle(phase, gap=0.3):
    """A reply for tests/http_servers.RawServer sent one byte at a time, a byte every
    ``gap`` seconds: each byte resets a per-read timeout.  ``phase``: "headers" (the
    status line and headers trickle) or "body" (headers at once, then the body)."""
    def reply(method, asked, headers):
        first, last = asked or (0, 99999)
        head = (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {last - first + 1}\r\n"
                f"Content-Range: bytes {first}-{last}/100000\r\n"
                "Accept-Ranges: bytes\r\nETag: \"t\"\r\n").encode()
        if phase == "body":
            yield head + b"\r\n"
            head = b"\0" * (last - first + 1)
        else:
            head += b"X-Pad: " + b"a" * 4000
        for i in range(len(head)):
            yield head[i:i + 1]
            time.sleep(gap)
    return reply


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_trickling_server_meets_the_deadline(monkeypatch, phase):
    """A server sending a byte every 300 ms never trips the per-read timeout: the
    read ran for ever.  Now each request has URL_DEADLINE seconds in all, and its end
    is a NetworkTimeoutError (a TimeoutError) naming the URL."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    monkeypatch.setattr(src, "URL_DEADLINE", 1.0)
    server = RawServer(trickle(phase))
    url = server.url(f"/{phase}.zt")
    started = time.monotonic()
    try:
        with pytest.raises(NetworkTimeoutError, match="URL_DEADLINE") as err:
            ztensor.Reader(url)
    finally:
        server.close()
    assert time.monotonic() - started < 20
    assert url in str(err.value) and isinstance(err.value, TimeoutError)


def test_the_deadline_is_a_default_the_caller_may_replace():
    """url_options gives every HTTP(S) session the deadline; a caller's own
    client_kwargs timeout is kept."""
    aiohttp = pytest.importorskip("aiohttp")
    options = src.url_options("https://host/m.zt")
    assert options["client_kwargs"]["timeout"].total == src.URL_DEADLINE
    mine = aiohttp.ClientTimeout(total=5)
    options = src.url_options("https://host/m.zt", {"client_kwargs": {"timeout": mine}})
    assert options["client_kwargs"]["timeout"] is mine


# ----------------------------------------------------------------- the command
@pytest.mark.parametrize("command", ["ls", "info", "stats", "verify"])
@pytest.mark.parametrize("path", ["", "/proc/self/mem"])
def test_an_os_error_naming_no_file_names_the_input(capsys, command, path):
    """The OS names no file for an EIO while reading (/proc/self/mem at offset 0) or
    for an empty name: the one line said 'ztensor: Input/output error', naming
    nothing.  A command of one input now names it (tools.cli._run)."""
    if path and not os.path.exists(path):
        pytest.skip("no /proc on this system")
    from ztensor.tools import cli
    assert cli.main([command, path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"ztensor: {path or repr(path)}: "), err
