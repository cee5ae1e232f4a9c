"""HTTP servers on loopback for the remote tests, shared by tests/test_remote.py and
the hostile suites:

* :class:`RawServer` (the ``raw`` fixture): a socket server whose replies are bytes
  a function makes, for what no real server sends (lies about ranges, versions,
  a byte at a time);
* :func:`serving`: such a function serving one file by range, honestly but for what
  it is told to get wrong; :func:`serving_files` one for several files by path;
* :class:`LoopbackHTTP`: a server on the standard library's ``http.server`` whose
  every request is answered by its ``answer(h, head)``, scripted per test (a
  subclass, or a function given), for replies that speak HTTP through the handler
  ``h``; :func:`send` sends one such reply;
* :class:`VersionedFiles` (the ``web`` fixture): files by path with ranges and an
  ETag per file, ``If-Match`` honoured as nginx does;
* :class:`HostileHTTP`: files by path whose replies follow a plan of lies (the
  hypothesis strategies of tests/hostile_strategies.py draw it);
* :func:`nginx`: nginx from Debian's packages (``.ci/run`` installs it), logging
  each request's status, bytes sent and Range.
"""
import contextlib
import hashlib
import http.server
import os
import posixpath
import shutil
import socket
import subprocess
import threading
import time
import unicodedata
from urllib.parse import unquote, urlsplit

import pytest

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                  else None)

CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
{user}
events {{ worker_connections 64; }}
http {{
    log_format bytes '$request_method $uri $status $body_bytes_sent "$http_range"';
    access_log {dir}/access.log bytes;
    client_body_temp_path {dir}/tmp;
    proxy_temp_path {dir}/tmp;
    fastcgi_temp_path {dir}/tmp;
    uwsgi_temp_path {dir}/tmp;
    scgi_temp_path {dir}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
        location / {{ }}
        {locations}
    }}
}}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port, proc, what, log=None):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    detail = log.read_text() if log is not None and log.exists() else ""
    pytest.fail(f"{what} did not start: {detail}")


@contextlib.contextmanager
def nginx(tmp_path, locations=""):
    """nginx serving ``tmp_path/www`` on a free loopback port, ``locations`` (nginx
    configuration) added to its server block: yields (its base URL,
    the www folder, its access log).  Skips where nginx or the URL packages are
    missing."""
    if NGINX is None:
        pytest.skip("nginx is not installed (.ci/run installs it: apt-get install nginx-light)")
    pytest.importorskip("aiohttp")
    pytest.importorskip("fsspec")
    (tmp_path / "www").mkdir()
    (tmp_path / "tmp").mkdir()
    port = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(CONF.format(dir=tmp_path, port=port, locations=locations,
                                user="user root;" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(port, proc, "nginx", tmp_path / "error.log")
        yield f"http://127.0.0.1:{port}", tmp_path / "www", tmp_path / "access.log"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class RawServer:
    """A loopback server answering each request (read to its blank line) with what
    ``reply(method, asked, headers)`` returns: bytes, or an iterable of byte pieces
    sent one after another (a trickle), then closing the connection.  ``asked`` is
    the Range header's (first, last) or None; ``headers`` the request's, names in
    lower case, and its path under ``":path"``.  ``host``: ``"::1"`` serves on the
    IPv6 loopback (OSError where there is none)."""

    def __init__(self, reply, host="127.0.0.1"):
        self.reply = reply
        self.stop = threading.Event()
        self.host = f"[{host}]" if ":" in host else host
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            self.sock.bind((host, 0))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(16)
        threading.Thread(target=self.serve, daemon=True).start()

    def url(self, path="/m.zt"):
        return f"http://{self.host}:{self.sock.getsockname()[1]}{path}"

    def serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.one, args=(conn,), daemon=True).start()

    def one(self, conn):
        with conn:
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    got = conn.recv(65536)
                    if not got:
                        return
                    request += got
                lines = request.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
                headers = {":path": lines[0].split()[1]}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                asked = None
                if headers.get("range", "").startswith("bytes="):
                    first, _, last = headers["range"][6:].partition("-")
                    asked = int(first), int(last)
                answer = self.reply(lines[0].split()[0], asked, headers)
                for piece in [answer] if isinstance(answer, bytes) else answer:
                    if self.stop.is_set():
                        return
                    conn.sendall(piece)
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture
def raw():
    """``raw(reply)``: a started :class:`RawServer`, closed after the test."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    made = []

    def make(reply):
        made.append(RawServer(reply))
        return made[-1]
    yield make
    for server in made:
        server.close()


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def serving(data, content_range=None, extra=b"", etag=b'"v1"'):
    """A ``reply`` for :class:`RawServer` serving ``data`` (bytes, or a function of
    no arguments giving the bytes now) by range, honestly but for ``content_range``
    (a function of first, last, size giving the header's value) and ``extra`` header
    lines; every reply names ``etag`` (None: no version at all).  The condition a
    request carries is not judged: a server that ignores it."""
    def reply(method, asked, headers):
        now = data() if callable(data) else data
        size = len(now)
        tag = b"ETag: " + etag + b"\r\n" if etag else b""
        if method == "HEAD" or asked is None:
            body = b"" if method == "HEAD" else now
            return (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nAccept-Ranges: bytes\r\n"
                    b"Connection: close\r\n" % size) + tag + extra + b"\r\n" + body
        first, last = asked[0], min(asked[1], size - 1)
        body = now[first:last + 1]
        cr = (content_range or (lambda a, b, n: b"bytes %d-%d/%d" % (a, b, n)))(first, last, size)
        return (b"HTTP/1.1 206 Partial Content\r\nConnection: close\r\nContent-Range: " + cr +
                b"\r\nContent-Length: %d\r\n" % len(body) + tag + extra + b"\r\n" + body)
    return reply


def serving_files(files, etag=b'"v1"'):
    """A ``reply`` for :class:`RawServer` serving ``files`` (request path, query
    left out -> bytes) as :func:`serving` does, and 404 for any other path."""
    replies = {path: serving(data, etag=etag) for path, data in files.items()}

    def reply(method, asked, headers):
        path = headers[":path"].split("?")[0]
        if path not in replies:
            return NOT_FOUND
        return replies[path](method, asked, headers)
    return reply


class LoopbackHTTP:
    """An ``http.server`` server on 127.0.0.1 (a thread; a thread a request) whose
    HEAD and GET requests are each answered by ``self.answer(h, head)``: ``h`` the
    request's handler (its ``path``, ``headers``, ``send_response``, ``wfile``),
    ``head`` True for HEAD.  ``answer`` is looked up at each request, so a test may
    script it per server, or replace it while the server runs.  ``protocol``:
    ``"HTTP/1.0"`` closes each connection after its reply (a body shorter than its
    Content-Length ends in an error, never a wait); ``"HTTP/1.1"`` keeps it open."""

    def __init__(self, answer=None, protocol="HTTP/1.0"):
        if answer is not None:
            self.answer = answer
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                owner.answer(self, head=True)

            def do_GET(self):
                owner.answer(self, head=False)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, h, head):
        raise NotImplementedError("a LoopbackHTTP is given its answer(h, head)")

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def request_path(h, nfkc=False):
    """The local path a naive static server maps the request of handler ``h`` to:
    percent-decoded and normalised (so ``..`` climbs out of a folder), the query
    left out; ``nfkc``: folded to NFKC first, as a server that folds Unicode does."""
    path = posixpath.normpath(unquote(urlsplit(h.path).path))
    if nfkc:
        path = posixpath.normpath(unicodedata.normalize("NFKC", path))
    return path


def send(h, status, body=b"", headers=(), head=False):
    """Reply through handler ``h``: ``status``, ``headers`` (name, value) pairs as
    given (no Content-Length unless among them), then ``body`` unless ``head``; a
    client gone before the body is no failure of the server."""
    h.send_response(status)
    for name, value in headers:
        h.send_header(name, value)
    h.end_headers()
    if not head:
        with contextlib.suppress(OSError):
            h.wfile.write(body)


class VersionedFiles(LoopbackHTTP):
    """A loopback HTTP/1.1 server serving ``files`` by path with ranges, an ``ETag``
    per file (``tags``) and ``If-Match`` honoured as RFC 9110 says (412 when the tag
    differs), like nginx; a file given no tag has one made from its bytes, unless
    ``versioned`` is False (a server naming no version, which ztensor reads only
    when told to: source._pinned_version).  ``nfkc``: it normalises the decoded path
    to NFKC before looking it up, as a server that folds Unicode does.  ``routes``:
    path -> handler(h) for anything else.  ``requests`` records each path asked."""

    def __init__(self, nfkc=False, versioned=True):
        self.files, self.tags, self.routes, self.requests = {}, {}, {}, []
        self.versioned, self.nfkc = versioned, nfkc
        super().__init__(protocol="HTTP/1.1")

    def answer(self, h, head):
        path = request_path(h, self.nfkc)
        self.requests.append(path)
        if path in self.routes:
            return self.routes[path](h)
        data, tag = self.files.get(path), self.tags.get(path)
        if tag is None and data is not None and self.versioned:
            tag = '"%s"' % hashlib.sha256(data).hexdigest()[:32]
        if data is None or (h.headers.get("If-Match") not in (None, tag)):
            h.send_response(404 if data is None else 412)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        rng = h.headers.get("Range")
        if rng:
            first, _, last = rng[6:].partition("-")
            first, last = int(first), min(int(last), len(data) - 1)
            body = data[first:last + 1]
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        else:
            body = data
            h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        if tag:
            h.send_header("ETag", tag)
        h.end_headers()
        if not head:
            h.wfile.write(body)


class HostileHTTP(LoopbackHTTP):
    """A loopback HTTP/1.0 server that serves ``files`` and answers request i by
    ``plan[i]`` (a hostile_strategies.Answer: its status, content_range, length,
    body and accept_ranges), and by ``honest()`` once the plan runs out.  Like a
    naive static server it percent-decodes and normalises the path
    (:func:`request_path`), so a request that climbs out of a folder reaches what
    lies above it; ``requests`` records every (method, raw path, Range) asked for.
    Each response closes its connection: a body shorter than its Content-Length
    ends in an error, never a wait."""

    def __init__(self, honest):
        self.honest = honest
        self.files, self.plan, self.requests = {}, [], []
        self._lock = threading.Lock()
        super().__init__()

    def reset(self, files, plan):
        with self._lock:
            self.files, self.plan, self.requests = dict(files), list(plan), []

    def answer(self, h, head):
        with self._lock:
            self.requests.append(("HEAD" if head else "GET", h.path, h.headers.get("Range")))
            plan = self.plan.pop(0) if self.plan else self.honest()
            local = request_path(h)
            data = self.files.get(local)
        if data is None:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        total = len(data)
        start, end, ranged = 0, total - 1, False
        rng = h.headers.get("Range") or ""
        if rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            try:
                start = int(a) if a else max(0, total - int(b))
                end = min(int(b), total - 1) if (a and b) else total - 1
                ranged = True
            except ValueError:
                pass
        body = data[start:end + 1] if ranged else data
        status = plan.status or (206 if ranged else 200)
        if plan.body == "truncated":
            body = body[:len(body) // 2]
        elif plan.body == "extra":
            body = body + b"\0" * 7
        elif plan.body == "empty":
            body = b""
        elif plan.body == "flipped":
            body = bytes(x ^ 0x55 for x in body)
        elif plan.body == "whole":
            body = data
        cr = {"right": f"bytes {start}-{end}/{total}", "absent": None,
              "wrong-start": f"bytes {start + 1}-{end + 1}/{total}",
              "wrong-total": f"bytes {start}-{end}/{total * 2 + 1}", "garbage": "bytes x-y/z",
              "star": f"bytes {start}-{end}/*", "huge": f"bytes 0-{1 << 62}/{1 << 62}"}
        length = {"right": len(body), "absent": None, "short": max(0, len(body) - 3),
                  "long": len(body) + 5, "huge": 1 << 40, "negative": -1}[plan.length]
        try:
            h.send_response(status if 100 <= status <= 599 else 200)
            if status == 302:
                h.send_header("Location", h.path)
            if ranged and cr[plan.content_range] is not None:
                h.send_header("Content-Range", cr[plan.content_range])
            if plan.accept_ranges:
                h.send_header("Accept-Ranges", "bytes")
            if length is not None:
                h.send_header("Content-Length", str(length))
            # a version (ztensor reads no URL whose server names none): one fixed time
            h.send_header("Last-Modified", "Sat, 09 Sep 2001 01:46:40 GMT")
            h.end_headers()
            if not head:
                h.wfile.write(body)
        except OSError:
            pass


@pytest.fixture
def web():
    """``web(nfkc=False, versioned=True)``: a started :class:`VersionedFiles`,
    closed after the test."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    made = []

    def make(**kw):
        made.append(VersionedFiles(**kw))
        return made[-1]
    yield make
    for server in made:
        server.close()
