"""HTTP servers on loopback for the remote tests, shared by tests/test_remote.py and
the hostile suites:

* :class:`RawServer` (the ``raw`` fixture): a socket server whose replies are bytes
  a function makes, for what no real server sends (lies about ranges, versions,
  a byte at a time);
* :func:`serving`: such a function serving one file by range, honestly but for what
  it is told to get wrong;
* :func:`nginx`: nginx from Debian's packages (``.ci/run`` installs it), logging
  each request's status, bytes sent and Range.
"""
import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time

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
    lower case, and its path under ``":path"``."""

    def __init__(self, reply):
        self.reply = reply
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        threading.Thread(target=self.serve, daemon=True).start()

    def url(self, path="/m.zt"):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}{path}"

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
