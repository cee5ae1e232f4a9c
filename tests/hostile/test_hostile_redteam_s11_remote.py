"""Red team, hostile input round three, remote layer (after b9992e7): servers on
loopback (tests/http_servers.py) and moto's S3 server against docs/remote.md's and
docs/threat-model.md's promises.  Each test names the one function keeping its rule.

* A reply that is neither a success nor an error (a 3xx aiohttp does not follow: no
  Location, or 300/304/305/306; a 101) is not the file: fsspec raises only from 400,
  and took its body as the range asked for, unchecked (another version's bytes, or
  a body without end read whole into memory).  Refused at its headers
  (source._not_the_file, asked by source._reply_limit).
* A URL's credentials (``https://user:token@host``, a presigned URL's query) are in
  no error message and no repr (errors.without_secrets, applied by
  ZTensorError._render and the handles' reprs).
* An ETag or Last-Modified holding a control character is a FormatError at the
  open: it was pinned and sent back, and aiohttp's refusal to send it was a bare
  ValueError on the first range request (source._validator).
* A reply aiohttp cannot parse is said so, not as "HTTP 400" the server never sent
  (source._unparsable, in source._network_error).
"""
import json
import os

import numpy as np
import pytest
from http_servers import NOT_FOUND, RawServer, raw, serving  # noqa: F401  (raw: a fixture)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hostile_redteam_dist import two_versions

import ztensor
from ztensor.errors import without_secrets


def _served_as(status, body, first, last, size, etag=b'"v1"', location=None):
    head = (b"HTTP/1.1 %d X\r\nConnection: close\r\nContent-Range: bytes %d-%d/%d\r\n"
            b"Content-Length: %d\r\nETag: %s\r\n" % (status, first, last, size, len(body), etag))
    if location is not None:
        head += b"Location: " + location + b"\r\n"
    return head + b"\r\n" + body


# ------------------------------------------------------------------ 1. 3xx is not the file
@pytest.mark.parametrize("status,location", [(300, None), (302, None), (302, b""), (305, None),
                                             (306, None), (399, None)])
def test_a_3xx_that_is_not_followed_is_not_the_file(raw, tmp_path, status, location):
    """The manifest's range answered with a 3xx aiohttp does not follow, carrying
    another version's bytes under the range's own Content-Range and another ETag:
    fsspec (which raises only from 400) read it as the range, and the reader gave
    the other file's values.  Now a FormatError at its headers, naming the URL."""
    one, two, _ = two_versions(tmp_path)
    honest = serving(one)

    def reply(method, asked, headers):
        if method == "GET" and asked and asked[0] > 0:
            first, last = asked
            return _served_as(status, two[first:last + 1], first, last, len(two),
                              etag=b'"v2"', location=location)
        return honest(method, asked, headers)
    server = raw(reply)
    with pytest.raises(ztensor.FormatError, match=f"answered {status}.*neither the file") as err:
        with ztensor.Reader(server.url()) as r:
            r.read_numpy("x", copy=True)
    assert server.url() in str(err.value) and "\n" not in str(err.value)


def test_a_3xx_body_without_end_is_not_read(raw, tmp_path):
    """A 300 carrying a Content-Range and a body without end: its body was read
    whole (aiohttp's read, never bounded) for a 16-byte footer.  Now refused at
    its headers, a few socket buffers sent at most."""
    one, _, _ = two_versions(tmp_path)
    honest = serving(one)
    sent = []

    def reply(method, asked, headers):
        if method == "GET" and asked and asked[0] > 0:
            def endless():
                yield (b"HTTP/1.1 300 X\r\nConnection: close\r\nContent-Range: bytes %d-%d/%d\r\n"
                       b'ETag: "v1"\r\n\r\n' % (asked[0], asked[1], len(one)))
                for _ in range(256):
                    sent.append(1 << 20)
                    yield bytes(1 << 20)
            return endless()
        return honest(method, asked, headers)
    server = raw(reply)
    with pytest.raises(ztensor.FormatError, match="answered 300"):
        ztensor.Reader(server.url())
    assert sum(sent) < 64 << 20


def test_a_redirect_handed_on_unfollowed_is_not_the_file(raw, tmp_path):
    """A caller who turns redirects off (storage_options allow_redirects=False)
    gets a 302 with a Location handed to fsspec: its body is still not the file
    (source._CheckedResponse.read refuses a redirect's body)."""
    one, two, _ = two_versions(tmp_path)
    honest = serving(one)

    def reply(method, asked, headers):
        if method == "GET" and asked and asked[0] > 0:
            first, last = asked
            return _served_as(302, two[first:last + 1], first, last, len(two),
                              location=b"/elsewhere.zt")
        return honest(method, asked, headers)
    server = raw(reply)
    with pytest.raises(ztensor.FormatError, match="302.*not followed"):
        with ztensor.Reader(server.url(), storage_options={"allow_redirects": False}) as r:
            r.read_numpy("x", copy=True)


def test_an_honest_redirect_still_reads(raw, tmp_path):
    """A 302 to the file (a hub's answer) is followed as before."""
    one, _, x = two_versions(tmp_path)
    target = raw(serving(one))
    hub = raw(lambda method, asked, headers: (
        b"HTTP/1.1 302 Found\r\nLocation: " + target.url().encode() +
        b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
    with ztensor.Reader(hub.url()) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)


# ------------------------------------------------------------------ 2. credentials
SECRET = "s3cr3tT0ken"


def _not_found(method, asked, headers):
    return NOT_FOUND


def _lying(data):
    honest = serving(data)

    def reply(method, asked, headers):
        if method == "GET":
            return serving(data, content_range=lambda a, b, n: b"bytes 5-6/%d" % n)(
                method, asked, headers)
        return honest(method, asked, headers)
    return reply


@pytest.mark.parametrize("where", ["userinfo", "user only", "query"])
@pytest.mark.parametrize("failure", ["refused", "404", "lying reply"])
def test_credentials_in_a_url_are_in_no_error(raw, tmp_path, where, failure):
    """A URL carrying credentials (``user:token@``, a bare token as user, a
    presigned query) named itself whole in every error about it: the secret was
    printed by the command, logged by every caller.  Now shown as ``***``."""
    one, _, _ = two_versions(tmp_path)
    if failure == "refused":
        base = "http://127.0.0.1:1/m.zt"
    else:
        base = raw(_not_found if failure == "404" else _lying(one)).url()
    scheme, rest = base.split("://", 1)
    url = {"userinfo": f"{scheme}://alice:{SECRET}@{rest}",
           "user only": f"{scheme}://{SECRET}@{rest}",
           "query": f"{base}?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}"}[where]
    with pytest.raises(ztensor.ZTensorError) as err:
        with ztensor.Reader(url) as r:
            r.read_numpy("x", copy=True)
    text = str(err.value)
    assert SECRET not in text and "127.0.0.1" in text, text
    assert SECRET not in repr(err.value)


def test_credentials_are_in_no_repr_or_closed_error(raw, tmp_path):
    """The Reader's and ShardedReader's repr (and so the ResourceWarning of an
    unclosed one) and a read after close named the URL with its password."""
    one, _, _ = two_versions(tmp_path)
    index = json.dumps({"weight_map": {"x": "m.zt", "y": "m.zt"}}).encode()
    files = {"/m.zt": serving(one), "/m.zt.index.json": serving(index)}
    server = raw(lambda method, asked, headers: files[headers[":path"]](method, asked, headers))
    scheme, rest = server.url().split("://", 1)
    url = f"{scheme}://alice:{SECRET}@{rest}"
    r = ztensor.Reader(url)
    assert SECRET not in repr(r) and "***@127.0.0.1" in repr(r)
    r.close()
    with pytest.raises(ztensor.ClosedError) as err:
        r.read_numpy("x")
    assert SECRET not in str(err.value)
    with ztensor.open_sharded(url + ".index.json") as s:
        assert SECRET not in repr(s)
        assert s.read_numpy("x").shape == (1000,)


# a secret: "Q9" (in no other part of the messages below), then any characters a
# URL's userinfo or query value may hold
_URL_TEXT = st.text(st.characters(min_codepoint=33, max_codepoint=126,
                                  exclude_characters="/?#@'\"<>&=:;,.)"),
                    max_size=30).map(lambda text: "Q9" + text)


@settings(max_examples=300, deadline=None)
@given(user=_URL_TEXT, password=_URL_TEXT, value=_URL_TEXT,
       scheme=st.sampled_from(["http", "https", "s3", "gs", "hf"]))
def test_property_no_secret_survives_rendering(user, password, value, scheme):
    """Any user, password or query value in any URL an error names is absent from
    the message (errors.without_secrets through ZTensorError._render)."""
    url = f"{scheme}://{user}:{password}@host.example:8080/dir/m.zt?token={value}&x=1"
    for err in (ztensor.NetworkError("HTTP 404", path=url),
                ztensor.FormatError(f"see {url}: bad", path="local.zt", obj="w")):
        text = str(err)
        for secret in (user, password, value):
            assert secret not in text
        assert "host.example:8080/dir/m.zt" in text
    assert without_secrets("model.zt: object 'a?b=c@d': bad") == "model.zt: object 'a?b=c@d': bad"


# ------------------------------------------------------------------ 3. validators
@pytest.mark.parametrize("header,value", [("ETag", b'"a\x01b"'), ("ETag", b'"a\x7fb"'),
                                          ("Last-Modified", b"Mon, 01 Jan 2024\x0100:00:00 GMT")])
def test_a_version_no_header_may_hold_is_refused_at_the_open(raw, tmp_path, header, value):
    """The version a server names is sent back with every range request; one
    holding a control character made aiohttp refuse to send the request, a bare
    ValueError ("Forbidden control character") on the first read."""
    one, _, _ = two_versions(tmp_path)
    honest = serving(one, etag=None)
    asked = []

    def reply(method, rng, headers):
        asked.append(method)
        return honest(method, rng, headers).replace(
            b"\r\n\r\n", b"\r\n" + header.encode() + b": " + value + b"\r\n\r\n", 1)
    server = raw(reply)
    with pytest.raises(ztensor.FormatError, match=f"{header} holds the control character") as err:
        ztensor.Reader(server.url())
    assert server.url() in str(err.value) and "\n" not in str(err.value)
    assert "GET" not in asked or asked.index("GET") > 0  # refused from the HEAD's answer


# ------------------------------------------------------------------ 4. unparsable replies
def test_a_reply_aiohttp_cannot_parse_is_not_called_a_400(raw, tmp_path):
    """A NUL in a header line: aiohttp's parser refuses the reply and says so as a
    ClientResponseError of status 400, which the error repeated as "HTTP 400", a
    status the server never sent."""
    one, _, _ = two_versions(tmp_path)
    honest = serving(one)

    def reply(method, asked, headers):
        return honest(method, asked, headers).replace(b"\r\n\r\n", b"\r\nX-A: a\x00b\r\n\r\n", 1)
    server = raw(reply)
    with pytest.raises(ztensor.NetworkError, match="reply is not HTTP") as err:
        ztensor.Reader(server.url())
    assert "HTTP 400" not in str(err.value) and server.url() in str(err.value)


# ------------------------------------------------------------------ 5. interrupted upload
try:  # moto's S3 server on loopback, as tests/test_object_store.py starts it
    from test_object_store import bucket, moto_server  # noqa: F401  (fixtures)
except ImportError:  # pragma: no cover
    pass


def test_an_interrupted_upload_stops_and_leaves_nothing(bucket, tmp_path, monkeypatch):
    """Ctrl-C (or the command's SIGTERM) during an S3 multipart upload: fsspec's
    put_file ended its wait with the KeyboardInterrupt, but the upload went on in
    fsspec's loop thread, and the object appeared seconds after the caller was told
    the write failed (it could land over a retry's newer object).  Now the upload
    is cancelled and its multipart upload aborted: nothing, then or later
    (upload.Upload._put)."""
    import asyncio
    import signal
    import threading
    import time

    import s3fs
    import s3fs.core
    from test_object_store import keys

    name, opts, client = bucket
    monkeypatch.setattr(s3fs.core, "calculate_chunksize", lambda size, chunksize=None: 5 << 20)
    real = s3fs.S3FileSystem._call_s3
    parts = threading.Event()

    async def slow(self, method, *args, **kwargs):
        if method == "upload_part":
            parts.set()
            await asyncio.sleep(1.5)
        return await real(self, method, *args, **kwargs)
    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", slow)
    armed = [True]

    def interrupt(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
    previous = signal.signal(signal.SIGUSR1, interrupt)
    pid = os.getpid()
    threading.Thread(target=lambda: parts.wait(30) and os.kill(pid, signal.SIGUSR1),
                     daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with ztensor.Writer(f"s3://{name}/m.zt", storage_options=opts) as w:
                w.write_numpy("x", np.random.default_rng(0).random(12 << 17))  # 12 MiB
    finally:
        armed[0] = False
        signal.signal(signal.SIGUSR1, previous)
    time.sleep(5)   # the parts' uploads would be done and the object complete by now
    assert keys(client, name) == []


@pytest.mark.parametrize("command", ["info", "verify"])
def test_the_command_prints_no_credentials(raw, tmp_path, command):
    """``ztensor info`` and ``verify`` echoed the URL with its password on success
    (``file: http://alice:...@host``), into terminals and CI logs alike: every text
    the command prints passes cli._printable, which now shows ``***``."""
    import io

    from ztensor.tools import cli

    one, _, _ = two_versions(tmp_path)
    scheme, rest = raw(serving(one)).url().split("://", 1)
    out = io.StringIO()
    assert cli.main([command, f"{scheme}://alice:{SECRET}@{rest}"], out=out) == 0
    assert SECRET not in out.getvalue() and "***@127.0.0.1" in out.getvalue()
